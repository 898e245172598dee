//! What goes into the engine and what comes out: validated requests and token events.
//! No OpenAI types here; `api/` maps these to wire JSON.

use std::time::Duration;

use crate::sampling::SamplingParams;

/// When a choice stops.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StopCriteria {
    /// Stop when one of these tokens is sampled (the token is not shown as text).
    pub token_ids: Vec<u32>,
    /// Stop when the text contains one of these (the stop string is not shown).
    pub strings: Vec<String>,
    /// Keep going past the model's end-of-sequence tokens.
    pub ignore_eos: bool,
}

/// A generation request as a caller builds it: prompt tokens plus everything that shapes the
/// output. The engine checks it once ([`super::EngineClient::validate`]) before queueing it.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    pub prompt_ids: Vec<u32>,
    /// The wire field the prompt came from, named in errors (`prompt`, `messages`).
    pub prompt_param: &'static str,
    pub params: SamplingParams,
    /// Tokens to generate per choice at most; `None`: the room the context leaves.
    pub max_tokens: Option<usize>,
    pub stop: StopCriteria,
    /// Number of choices; they share the prompt's KV blocks through the prefix cache.
    pub n: usize,
    /// Lower runs first among waiting requests; FCFS within a priority.
    pub priority: i32,
    /// What every choice's output must fit; `None`: free text.
    pub constraint: Option<Constraint>,
}

/// A constraint on what a choice may generate (compiled by llguidance).
#[derive(Debug, Clone, PartialEq)]
pub enum Constraint {
    /// Any JSON object.
    JsonObject,
    /// JSON that fits this JSON Schema (the schema's JSON text).
    JsonSchema(String),
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// A Lark grammar (llguidance's dialect).
    Lark(String),
    /// `answer` holds after the reasoning: the reply is free text up to `</think>` (the prompt
    /// opened `<think>` when `opened`; otherwise the reply may open it or answer at once),
    /// blanks, then what `answer` allows.
    AfterReasoning {
        opened: bool,
        answer: Box<Constraint>,
    },
}

impl GenerateRequest {
    /// A greedy request for `max_tokens` tokens with default settings.
    pub fn greedy(prompt_ids: Vec<u32>, max_tokens: usize) -> Self {
        Self {
            prompt_ids,
            prompt_param: "prompt",
            params: SamplingParams::greedy(),
            max_tokens: Some(max_tokens),
            stop: StopCriteria::default(),
            n: 1,
            priority: 0,
            constraint: None,
        }
    }
}

/// Why a choice ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// EOS, a stop token or a stop string.
    Stop,
    /// `max_tokens` or the model's context length.
    Length,
    /// The client went away or the request was cancelled.
    Abort,
}

impl FinishReason {
    /// The OpenAI `finish_reason` string.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
        }
    }
}

/// One generated token with its log-probability and top alternatives (when asked).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenInfo {
    pub id: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

/// Token counts of a request (all choices).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens whose KV came from the prefix cache when the request was first
    /// scheduled (not computed again).
    pub cached_tokens: usize,
}

/// Latencies of one request, for the metrics layer.
#[derive(Debug, Clone, Default)]
pub struct RequestTimings {
    /// Submit to first scheduled.
    pub queue: Duration,
    /// Submit to first token.
    pub ttft: Duration,
    /// Gaps between consecutive tokens of a choice.
    pub inter_token: Vec<Duration>,
    /// Submit to finish.
    pub e2e: Duration,
}

/// What a response stream yields.
#[derive(Debug, Clone)]
pub enum StreamEvent {
    /// New text for a choice, with the tokens that completed it. `text` may be empty while
    /// text that could begin a stop string (or half a UTF-8 character) is held back.
    Delta {
        choice: usize,
        text: String,
        tokens: Vec<TokenInfo>,
    },
    /// The prompt's log-probabilities (asked by `SamplingParams::prompt_logprobs`), shared
    /// by `choices`: one entry per prompt token after the first (its logprob given the
    /// tokens before it, and the top alternatives there). Sent once, before any `Delta` of
    /// those choices.
    PromptLogprobs {
        choices: std::ops::Range<usize>,
        tokens: std::sync::Arc<[TokenInfo]>,
    },
    /// A choice ended.
    Finish { choice: usize, reason: FinishReason },
    /// Every choice ended; the last event of a successful stream.
    Done {
        usage: Usage,
        timings: RequestTimings,
    },
    /// The request failed; the last event of the stream.
    Error(super::EngineError),
}
