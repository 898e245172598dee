//! A request as a lane holds it: what its choices share (sampling, limits, the stream their
//! events go to) and the events a lane sends to that stream.

use std::cell::Cell;
use std::time::Instant;

use tokio::sync::mpsc;

use super::constraint::Grammar;
use super::{EngineError, FinishReason, TokenInfo};
use crate::model::Pooling;
use crate::sampling::{Sampled, SamplingParams};

/// Events from a lane to one request's output processor.
#[derive(Debug)]
pub(crate) enum LaneEvent {
    /// The request got its first step, its first `cached_tokens` prompt tokens found in the
    /// prefix cache.
    Scheduled {
        at: Instant,
        cached_tokens: usize,
    },
    Token {
        choice: usize,
        info: TokenInfo,
        finish: Option<FinishReason>,
        /// The token is one of the stop ids: it ends the choice and is not shown as text
        /// (a token that completes a grammar is shown).
        stop_token: bool,
    },
    /// Log-probabilities of the next prompt tokens (prompt logprobs; choice 0 computes them
    /// for every choice), in prompt order; `complete`: the last of them.
    PromptLogprobs {
        tokens: Vec<TokenInfo>,
        complete: bool,
    },
    /// The pooled hidden state of an embedding request (its one sequence is done).
    Embedding {
        vector: Vec<f32>,
    },
    /// A choice ended without a token: `max_tokens` 0 computes the prompt only.
    Finish {
        choice: usize,
        reason: FinishReason,
    },
    Failed(EngineError),
}

/// Most events one step sends to a request of `n` choices: a token (or a finish) per
/// choice, its prompt logprobs, the `Scheduled` event and a final error. A request runs
/// only while this much room is free in its stream buffer, so no event is ever dropped for
/// want of room.
pub(crate) fn step_events(n: usize) -> usize {
    n + 3
}

/// Limits that token ids decide, owned by each sequence of a request.
#[derive(Debug, Clone)]
pub(crate) struct Limits {
    /// Tokens to generate per choice at most.
    pub max_tokens: usize,
    /// Prompt plus output may not exceed this.
    pub max_len: usize,
    /// Token ids that end a choice (EOS unless ignored, plus the request's stop ids).
    pub stop_ids: Vec<u32>,
}

/// What the `n` choices of one request share inside a lane. Lives on the lane thread only.
#[derive(Debug)]
pub(crate) struct LaneRequest {
    pub params: SamplingParams,
    /// The sampler's parameters of prompt positions: raw logits (greedy, no bias or
    /// penalty) and `params.prompt_logprobs` top alternatives.
    pub prompt_params: SamplingParams,
    pub seed: u64,
    pub limits: Limits,
    pub n: usize,
    /// The constraint's matcher in its start state; each choice runs a fork of it.
    pub grammar: Option<Grammar>,
    /// An embedding request: its prompt's hidden rows are pooled so; nothing is sampled.
    pub pooling: Option<Pooling>,
    events: mpsc::Sender<LaneEvent>,
    scheduled: Cell<bool>,
    failed: Cell<bool>,
    /// Since when the stream buffer has been too full for another step.
    paused_since: Cell<Option<Instant>>,
}

impl LaneRequest {
    pub fn new(
        params: SamplingParams,
        seed: u64,
        limits: Limits,
        n: usize,
        events: mpsc::Sender<LaneEvent>,
    ) -> Self {
        let prompt_params = SamplingParams {
            logprobs: params.prompt_logprobs,
            ..SamplingParams::greedy()
        };
        Self {
            params,
            prompt_params,
            seed,
            limits,
            n,
            grammar: None,
            pooling: None,
            events,
            scheduled: Cell::new(false),
            failed: Cell::new(false),
            paused_since: Cell::new(None),
        }
    }

    /// The request with its choices constrained by `grammar`.
    pub fn with_grammar(mut self, grammar: Option<Grammar>) -> Self {
        self.grammar = grammar;
        self
    }

    /// The request as an embedding pooled by `pooling` (`None`: a generation).
    pub fn with_pooling(mut self, pooling: Option<Pooling>) -> Self {
        self.pooling = pooling;
        self
    }

    /// Room in the stream buffer for one more step.
    pub fn has_room(&self) -> bool {
        self.events.capacity() >= step_events(self.n)
    }

    /// The client dropped its stream.
    pub fn is_abandoned(&self) -> bool {
        self.events.is_closed()
    }

    /// How long the buffer has been full (`None`: it has room); starts the clock if needed.
    pub fn paused_for(&self, now: Instant) -> Option<std::time::Duration> {
        if self.has_room() {
            self.paused_since.set(None);
            return None;
        }
        let since = self.paused_since.get().unwrap_or(now);
        self.paused_since.set(Some(since));
        Some(now.duration_since(since))
    }

    /// Sends `Scheduled` the first time the request takes part in a step, with the prompt
    /// tokens its first step found in the prefix cache.
    pub fn mark_scheduled(&self, at: Instant, cached_tokens: usize) {
        if !self.scheduled.replace(true) {
            self.emit(LaneEvent::Scheduled { at, cached_tokens });
        }
    }

    /// Ends the request with an error (once, whatever the number of its choices).
    pub fn fail(&self, e: EngineError) {
        if !self.failed.replace(true) {
            self.emit(LaneEvent::Failed(e));
        }
    }

    /// Sends an event. `has_room` gates scheduling, so the buffer cannot be full here.
    pub fn emit(&self, ev: LaneEvent) {
        if let Err(mpsc::error::TrySendError::Full(_)) = self.events.try_send(ev) {
            tracing::error!("stream buffer full: an event was lost");
        }
    }
}

/// What a step produced for one sequence: prompt logprobs, its sampled token and, when the
/// token ids decide it, why the choice ended (the sequence is then gone and its blocks are
/// free).
#[derive(Debug)]
pub(crate) struct SeqOutput {
    pub choice: usize,
    pub request: std::rc::Rc<LaneRequest>,
    /// Prompt logprobs computed this step; `Some` only for the sequence that reports them.
    pub prompt: Option<(Vec<TokenInfo>, bool)>,
    /// `None`: no token this step (a prompt chunk, or `max_tokens` 0).
    pub sampled: Option<Sampled>,
    /// `Err`: the choice's grammar failed (the sequence is gone); the token is not output.
    pub finish: Result<Option<FinishReason>, String>,
    /// The token is a stop id (not shown as text).
    pub stop_token: bool,
    /// An embedding's pooled vector (its sequence is done).
    pub embedding: Option<Vec<f32>>,
}

impl SeqOutput {
    /// Sends this output's events to its request's stream.
    pub fn emit(self) {
        let r = &self.request;
        if let Some((tokens, complete)) = self.prompt {
            r.emit(LaneEvent::PromptLogprobs { tokens, complete });
        }
        if let Some(vector) = self.embedding {
            r.emit(LaneEvent::Embedding { vector });
        }
        match (self.sampled, self.finish) {
            (_, Err(message)) => r.fail(EngineError::InvalidRequest {
                param: None,
                message: format!("the output constraint failed: {message}"),
            }),
            (Some(s), Ok(finish)) => r.emit(LaneEvent::Token {
                choice: self.choice,
                info: TokenInfo {
                    id: s.token,
                    logprob: s.logprob,
                    top: s.top,
                },
                finish,
                stop_token: self.stop_token,
            }),
            (None, Ok(Some(reason))) => r.emit(LaneEvent::Finish {
                choice: self.choice,
                reason,
            }),
            (None, Ok(None)) => {}
        }
    }
}
