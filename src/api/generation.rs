//! One API request's engine streams merged into one, with global choice indexes, metrics
//! observed as events pass, and a disconnect counted when it is dropped before the end.
//! It yields the engine's own [`StreamEvent`]s (choice = `prompt * n + choice`): one event
//! type from the engine to the wire writers.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use actix_web::web::Data;
use futures_util::stream::{SelectAll, Stream, StreamExt};

pub use super::cancel::Cancel;
use super::errors::ApiError;
use super::state::AppState;
use crate::engine::{
    EngineError, FinishReason, RequestTimings, ResponseStream, StreamEvent, TokenInfo, Usage,
};

/// One engine stream tagged with its prompt's position.
struct Tagged {
    part: usize,
    inner: ResponseStream,
}

impl Stream for Tagged {
    type Item = (usize, StreamEvent);
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let part = self.part;
        self.inner.poll_next_unpin(cx).map(|e| e.map(|e| (part, e)))
    }
}

/// The merged events of one request's engine streams (one per prompt, `n` choices each).
/// Dropping it before `Done` or `Error` aborts the engine requests and counts a disconnect.
pub struct MergedStream {
    streams: SelectAll<Tagged>,
    n: usize,
    parts_left: usize,
    open_choices: usize,
    usage: Usage,
    state: Data<AppState>,
    finished: bool,
    cancel: Option<Cancel>,
    /// Choices that finished (to end the open ones on a cancel).
    ended: Vec<bool>,
    /// Tokens generated so far (the usage of a cancelled stream).
    generated: usize,
    /// Events left to send after a cancel.
    pending: VecDeque<StreamEvent>,
}

impl MergedStream {
    /// Merges `streams` (in prompt order), each with `n` choices.
    pub fn new(streams: Vec<ResponseStream>, n: usize, state: Data<AppState>) -> Self {
        let parts = streams.len();
        let mut all = SelectAll::new();
        for (part, inner) in streams.into_iter().enumerate() {
            all.push(Tagged { part, inner });
        }
        Self {
            streams: all,
            n,
            parts_left: parts,
            open_choices: parts * n,
            usage: Usage::default(),
            state,
            finished: false,
            cancel: None,
            ended: vec![false; parts * n],
            generated: 0,
            pending: VecDeque::new(),
        }
    }

    /// The stream ends early when `cancel` is cancelled.
    pub fn with_cancel(mut self, cancel: Cancel) -> Self {
        self.cancel = Some(cancel);
        self
    }

    /// Aborts the engine requests; queues an `Abort` finish for each open choice and `Done`
    /// with the tokens generated so far.
    fn cancelled(&mut self) {
        self.finished = true;
        self.streams = SelectAll::new();
        for (choice, ended) in self.ended.iter_mut().enumerate() {
            if !*ended {
                *ended = true;
                self.state.metrics.observe_finish(FinishReason::Abort);
                self.pending.push_back(StreamEvent::Finish {
                    choice,
                    reason: FinishReason::Abort,
                });
            }
        }
        let usage = Usage {
            completion_tokens: self.generated,
            ..self.usage
        };
        self.pending.push_back(StreamEvent::Done {
            usage,
            timings: RequestTimings::default(),
        });
    }

    /// The server state (for metrics).
    pub fn state(&self) -> &Data<AppState> {
        &self.state
    }

    /// Total number of choices.
    pub fn num_choices(&self) -> usize {
        self.n * self.streams.len()
    }

    fn fail(&mut self, e: EngineError) -> StreamEvent {
        self.finished = true;
        self.streams = SelectAll::new();
        StreamEvent::Error(e)
    }
}

impl Stream for MergedStream {
    type Item = StreamEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<StreamEvent>> {
        let this = &mut *self;
        loop {
            if let Some(e) = this.pending.pop_front() {
                return Poll::Ready(Some(e));
            }
            if this.finished {
                return Poll::Ready(None);
            }
            if let Some(c) = &this.cancel {
                c.register(cx.waker());
                if c.is_cancelled() {
                    this.cancelled();
                    continue;
                }
            }
            let (part, event) = match this.streams.poll_next_unpin(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => {
                    // Each engine stream ends with `Done` or `Error`; this is a lost engine.
                    return Poll::Ready(Some(this.fail(EngineError::ShuttingDown)));
                }
                Poll::Ready(Some(x)) => x,
            };
            let index = part * this.n;
            match event {
                StreamEvent::Delta {
                    choice,
                    text,
                    tokens,
                } => {
                    this.generated += tokens.len();
                    return Poll::Ready(Some(StreamEvent::Delta {
                        choice: index + choice,
                        text,
                        tokens,
                    }));
                }
                StreamEvent::PromptLogprobs { choices, tokens } => {
                    return Poll::Ready(Some(StreamEvent::PromptLogprobs {
                        choices: index + choices.start..index + choices.end,
                        tokens,
                    }));
                }
                StreamEvent::Finish { choice, reason } => {
                    this.open_choices = this.open_choices.saturating_sub(1);
                    if let Some(e) = this.ended.get_mut(index + choice) {
                        *e = true;
                    }
                    this.state.metrics.observe_finish(reason);
                    return Poll::Ready(Some(StreamEvent::Finish {
                        choice: index + choice,
                        reason,
                    }));
                }
                StreamEvent::Done { usage, timings } => {
                    this.state.metrics.observe_done(&usage, &timings);
                    this.usage.prompt_tokens += usage.prompt_tokens;
                    this.usage.completion_tokens += usage.completion_tokens;
                    this.usage.cached_tokens += usage.cached_tokens;
                    this.parts_left -= 1;
                    if this.parts_left == 0 {
                        this.finished = true;
                        return Poll::Ready(Some(StreamEvent::Done {
                            usage: this.usage,
                            timings: RequestTimings::default(),
                        }));
                    }
                }
                StreamEvent::Error(e) => {
                    if matches!(e, EngineError::Stalled { .. }) {
                        // The engine gave up on a client that stopped reading: a disconnect.
                        this.state.metrics.observe_disconnect();
                        for _ in 0..this.open_choices {
                            this.state.metrics.observe_finish(FinishReason::Abort);
                        }
                    }
                    return Poll::Ready(Some(this.fail(e)));
                }
            }
        }
    }
}

impl Drop for MergedStream {
    fn drop(&mut self) {
        if !self.finished {
            self.state.metrics.observe_disconnect();
            for _ in 0..self.open_choices {
                self.state.metrics.observe_finish(FinishReason::Abort);
            }
        }
    }
}

/// What one choice produced, for a non-streamed response.
#[derive(Debug, Clone, Default)]
pub struct ChoiceOutput {
    /// The prompt's logprobs, when asked (shared by the choices of one prompt).
    pub prompt: Option<std::sync::Arc<[TokenInfo]>>,
    pub text: String,
    pub tokens: Vec<TokenInfo>,
    pub finish: Option<FinishReason>,
}

/// Runs `generated` to the end. If the client goes away, actix drops this future, which drops
/// `generated` and aborts the engine requests.
pub async fn collect(mut generated: MergedStream) -> Result<(Vec<ChoiceOutput>, Usage), ApiError> {
    let mut choices = vec![ChoiceOutput::default(); generated.num_choices()];
    while let Some(event) = generated.next().await {
        match event {
            StreamEvent::Delta {
                choice,
                text,
                tokens,
            } => {
                if let Some(c) = choices.get_mut(choice) {
                    c.text.push_str(&text);
                    c.tokens.extend(tokens);
                }
            }
            StreamEvent::PromptLogprobs {
                choices: range,
                tokens,
            } => {
                for c in choices.iter_mut().take(range.end).skip(range.start) {
                    c.prompt = Some(tokens.clone());
                }
            }
            StreamEvent::Finish { choice, reason } => {
                if let Some(c) = choices.get_mut(choice) {
                    c.finish = Some(reason);
                }
            }
            StreamEvent::Done { usage, .. } => return Ok((choices, usage)),
            StreamEvent::Error(e) => return Err(e.into()),
        }
    }
    Err(ApiError::Internal(
        "the response ended without a result".into(),
    ))
}
