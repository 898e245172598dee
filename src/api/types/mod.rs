//! OpenAI wire types (serde + utoipa): requests as clients send them, responses as
//! openai-python's `types/completion*.py` and `types/chat/chat_completion*.py` read them.

mod chat;
mod check;
mod completion;
mod embedding;

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

pub use chat::*;
pub use check::CheckRequest;
pub use completion::*;
pub use embedding::*;

/// `{"error": {...}}`: every error response and mid-stream error frame.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ErrorResponse {
    pub error: ErrorDetail,
}

/// OpenAI's error object; `code` is always a string.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ErrorDetail {
    pub message: String,
    /// `invalid_request_error`, `authentication_error`, `not_found_error`,
    /// `rate_limit_error`, `service_unavailable_error` or `server_error`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The request field at fault, e.g. `temperature` or `messages[0].content`.
    pub param: Option<String>,
    pub code: String,
}

/// Token counts of a response (all choices).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct UsageInfo {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    /// How the prompt tokens were served (chat and completions always send it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
}

/// `usage.prompt_tokens_details`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PromptTokensDetails {
    /// Prompt tokens whose KV came from the prefix cache (not computed again).
    pub cached_tokens: usize,
}

/// `stop`: one string or a list.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum StopSpec {
    One(String),
    Many(Vec<String>),
}

impl StopSpec {
    /// The stop strings as a list.
    pub fn to_vec(&self) -> Vec<String> {
        match self {
            StopSpec::One(s) => vec![s.clone()],
            StopSpec::Many(v) => v.clone(),
        }
    }
}

/// Streaming options.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
pub struct StreamOptions {
    /// Send a last chunk with `choices: []` and the usage.
    #[serde(default)]
    pub include_usage: Option<bool>,
}

/// Sampling fields shared by completions and chat, as the handlers pass them to validation.
#[derive(Debug, Clone, Default)]
pub struct SamplingFields<'a> {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub seed: Option<i64>,
    pub stop: Option<&'a StopSpec>,
    pub stop_token_ids: Option<&'a [u32]>,
    pub logit_bias: Option<&'a HashMap<String, f32>>,
    pub ignore_eos: Option<bool>,
    pub n: Option<u32>,
}

/// `GET /v1/models`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ModelList {
    /// Always `list`.
    pub object: String,
    pub data: Vec<ModelCard>,
}

/// One served model.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ModelCard {
    pub id: String,
    /// Always `model`.
    pub object: String,
    pub created: u64,
    pub owned_by: String,
    /// The model as given to `--model` (vLLM's `root`: what the served name stands for).
    pub root: String,
    /// The model this one derives from (always `null`: no adapters are served).
    #[schema(value_type = Option<String>)]
    pub parent: Option<String>,
    /// Prompt plus completion tokens may not exceed this.
    pub max_model_len: usize,
    /// One entry, as vLLM answers (sampling, logprobs and viewing allowed).
    pub permission: Vec<ModelPermission>,
}

/// A model's permissions, in the shape OpenAI once answered and vLLM still does.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ModelPermission {
    pub id: String,
    /// Always `model_permission`.
    pub object: String,
    pub created: u64,
    pub allow_create_engine: bool,
    pub allow_sampling: bool,
    pub allow_logprobs: bool,
    pub allow_search_indices: bool,
    pub allow_view: bool,
    pub allow_fine_tuning: bool,
    pub organization: String,
    #[schema(value_type = Option<String>)]
    pub group: Option<String>,
    pub is_blocking: bool,
}

/// `POST /tokenize`: a prompt, or chat messages rendered with the chat template.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct TokenizeRequest {
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub prompt: Option<String>,
    #[serde(default)]
    pub messages: Option<Vec<ChatMessageIn>>,
    /// Add BOS to a prompt (default: the model's setting); ignored for messages.
    #[serde(default)]
    pub add_special_tokens: Option<bool>,
    /// For messages: end with the assistant prompt (default true).
    #[serde(default)]
    pub add_generation_prompt: Option<bool>,
}

/// Token ids of a prompt.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TokenizeResponse {
    pub tokens: Vec<u32>,
    pub count: usize,
    pub max_model_len: usize,
}

/// `POST /detokenize`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct DetokenizeRequest {
    #[serde(default)]
    pub model: Option<String>,
    pub tokens: Vec<u32>,
}

/// The text of some token ids.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct DetokenizeResponse {
    pub prompt: String,
}

/// `GET /tokenizer_info` (vLLM's): the tokenizer's configuration in the keys of a
/// `tokenizer_config.json`, as lm-eval's remote tokenizer reads them.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TokenizerInfo {
    /// The `transformers` class that runs the same pipeline (`PreTrainedTokenizerFast`).
    pub tokenizer_class: String,
    #[schema(value_type = Option<String>)]
    pub bos_token: Option<String>,
    #[schema(value_type = Option<u32>)]
    pub bos_token_id: Option<u32>,
    /// The declared end of sequence (generation also stops at end-of-turn tokens).
    #[schema(value_type = Option<String>)]
    pub eos_token: Option<String>,
    #[schema(value_type = Option<u32>)]
    pub eos_token_id: Option<u32>,
    #[schema(value_type = Option<String>)]
    pub pad_token: Option<String>,
    #[schema(value_type = Option<u32>)]
    pub pad_token_id: Option<u32>,
    #[schema(value_type = Option<String>)]
    pub unk_token: Option<String>,
    /// Prompts of `/v1/completions` and `/tokenize` get BOS by default.
    pub add_bos_token: bool,
    pub add_eos_token: bool,
    /// The context: prompt plus completion tokens.
    pub model_max_length: usize,
    pub vocab_size: usize,
    /// The Jinja template chat requests are rendered with (Kiln's default when the model
    /// ships none).
    pub chat_template: String,
}

/// `GET /health`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct HealthResponse {
    /// `ok`.
    pub status: String,
}
