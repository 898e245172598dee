//! `POST /v1/completions` request and response shapes.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{SamplingFields, StopSpec, StreamOptions, UsageInfo};
use crate::api::structured::StructuredFields;

/// `prompt`: text, texts, token ids, or lists of token ids.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum PromptInput {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

/// A completions request. Unknown fields are ignored; known fields of the wrong type are
/// rejected with 400 naming the field.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct CompletionRequest {
    /// The served model name (optional: the only model is used).
    #[serde(default)]
    pub model: Option<String>,
    pub prompt: PromptInput,
    /// Tokens to generate per choice (default 16).
    #[serde(default)]
    pub max_tokens: Option<u64>,
    #[serde(default)]
    pub temperature: Option<f32>,
    #[serde(default)]
    pub top_p: Option<f32>,
    /// 0 or -1: off.
    #[serde(default)]
    pub top_k: Option<i64>,
    #[serde(default)]
    pub min_p: Option<f32>,
    /// Choices per prompt.
    #[serde(default)]
    pub n: Option<u32>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub stop: Option<StopSpec>,
    /// Token ids that end a choice (not shown).
    #[serde(default)]
    pub stop_token_ids: Option<Vec<u32>>,
    #[serde(default)]
    pub seed: Option<i64>,
    #[serde(default)]
    pub presence_penalty: Option<f32>,
    #[serde(default)]
    pub frequency_penalty: Option<f32>,
    #[serde(default)]
    pub repetition_penalty: Option<f32>,
    /// Number of most likely alternatives to return per token. With `echo`, the prompt's
    /// tokens come first, each with its log-probability given the tokens before it (the
    /// model's raw distribution, as vLLM's prompt logprobs); the first has `null`.
    #[serde(default)]
    pub logprobs: Option<u32>,
    /// Return the prompt before the completion. With `echo`, `max_tokens` may be 0: the
    /// prompt alone is returned (with its logprobs when asked), `finish_reason` `length`.
    #[serde(default)]
    pub echo: Option<bool>,
    /// Token id (as a string) to a bias in [-100, 100] added to its logit.
    #[serde(default)]
    pub logit_bias: Option<HashMap<String, f32>>,
    #[serde(default)]
    pub user: Option<String>,
    /// Keep generating past end-of-sequence tokens.
    #[serde(default)]
    pub ignore_eos: Option<bool>,
    /// Not supported; must be absent or null.
    #[serde(default)]
    pub suffix: Option<String>,
    /// vLLM's prompt logprobs: not supported (400); `echo` with `logprobs` returns the
    /// prompt's logprobs in the OpenAI shape.
    #[serde(default)]
    pub prompt_logprobs: Option<i64>,
    /// Candidates to rank per choice: only absent, 1 or `n` (no ranking) is accepted.
    #[serde(default)]
    pub best_of: Option<u32>,
    /// `response_format` and vLLM's `guided_*` / `structured_outputs`: at most one constraint
    /// on the output.
    #[serde(flatten)]
    pub structured: StructuredFields,
}

impl CompletionRequest {
    /// The structured-output fields, for [`crate::api::structured`].
    pub fn structured(&self) -> &StructuredFields {
        &self.structured
    }
    /// The sampling fields, for validation.
    pub fn sampling(&self) -> SamplingFields<'_> {
        SamplingFields {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            repetition_penalty: self.repetition_penalty,
            seed: self.seed,
            stop: self.stop.as_ref(),
            stop_token_ids: self.stop_token_ids.as_deref(),
            logit_bias: self.logit_bias.as_ref(),
            ignore_eos: self.ignore_eos,
            n: self.n,
        }
    }
}

/// Legacy completions log-probabilities.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    /// Per token: its log-probability; `null` for the first token of an echoed prompt.
    pub token_logprobs: Vec<Option<f32>>,
    /// Per token: alternative token text to its log-probability (the token itself
    /// included); `null` for the first token of an echoed prompt.
    pub top_logprobs: Vec<Option<BTreeMap<String, f32>>>,
    /// Character offset of each token in the choice's text (an echoed prompt's tokens
    /// where they begin in the echoed text; the completion's from its end).
    pub text_offset: Vec<usize>,
}

/// One completion choice.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CompletionChoice {
    pub index: usize,
    pub text: String,
    pub logprobs: Option<CompletionLogprobs>,
    /// `stop` or `length`; null in stream chunks until the choice ends.
    pub finish_reason: Option<String>,
}

/// `object: "text_completion"`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CompletionResponse {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub model: String,
    /// The build, model and backend that answered (`fp_` and 10 hex digits).
    pub system_fingerprint: String,
    pub choices: Vec<CompletionChoice>,
    pub usage: UsageInfo,
}

/// One server-sent event of a streamed completion (`object: "text_completion"`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CompletionChunk {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub model: String,
    /// The build, model and backend that answered (`fp_` and 10 hex digits).
    pub system_fingerprint: String,
    pub choices: Vec<CompletionChoice>,
    /// With `stream_options.include_usage`: null, except in the last chunk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<UsageInfo>)]
    pub usage: Option<Option<UsageInfo>>,
}
