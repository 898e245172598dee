//! `POST /v1/chat/completions` request and response shapes.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{SamplingFields, StopSpec, StreamOptions, UsageInfo};
use crate::api::structured::StructuredFields;

/// A text part of a message's content.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct ContentPart {
    /// Only `text` is supported.
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

/// `content`: a string or a list of text parts.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

/// One message of the conversation.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct ChatMessageIn {
    /// `system`, `developer` (as system), `user`, `assistant` or `tool`.
    pub role: String,
    /// Text; may be null in an assistant message that has `tool_calls`.
    #[serde(default)]
    pub content: Option<MessageContent>,
    #[serde(default)]
    pub name: Option<String>,
    /// The calls an assistant message made.
    #[serde(default)]
    pub tool_calls: Option<Vec<ToolCall>>,
    /// In a `tool` message: the id of the call this answers (required there).
    #[serde(default)]
    pub tool_call_id: Option<String>,
    /// In an assistant message: its reasoning, as replies give it (templates that render
    /// earlier reasoning, such as gpt-oss's, read it as `thinking`).
    #[serde(default)]
    pub reasoning_content: Option<String>,
}

/// A function the model may call.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct FunctionDefinition {
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    /// A JSON Schema of type `object` for the arguments (default: any object).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub parameters: Option<serde_json::Value>,
    /// Accepted; with `tool_choice` `required` or a named function the arguments always fit.
    #[serde(default)]
    pub strict: Option<bool>,
}

/// An entry of `tools`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ToolDefinition {
    /// Only `function`.
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionDefinition,
}

/// `{"name": ...}` of a named tool choice.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct FunctionName {
    pub name: String,
}

/// `{"type": "function", "function": {"name": ...}}`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct NamedToolChoice {
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionName,
}

/// `tool_choice`: `none`, `auto`, `required`, or a named function.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum ToolChoice {
    Mode(String),
    Named(NamedToolChoice),
}

/// The function a tool call invokes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct FunctionCall {
    pub name: String,
    /// The arguments as a JSON text.
    pub arguments: String,
}

/// A tool call of an assistant message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ToolCall {
    pub id: String,
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionCall,
}

/// A piece of a function call in a stream chunk.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct FunctionCallDelta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
}

/// A piece of a tool call in a stream chunk: `index`, `id`, `type` and the name first, then
/// pieces of `function.arguments` to append.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ToolCallDelta {
    pub index: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<FunctionCallDelta>,
}

/// A chat completions request. Unknown fields are ignored; known fields of the wrong type
/// are rejected with 400 naming the field.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct ChatCompletionRequest {
    #[serde(default)]
    pub model: Option<String>,
    pub messages: Vec<ChatMessageIn>,
    /// Deprecated alias of `max_completion_tokens`.
    #[serde(default)]
    pub max_tokens: Option<u64>,
    /// Tokens to generate per choice (default: the rest of the context).
    #[serde(default)]
    pub max_completion_tokens: Option<u64>,
    #[serde(default)]
    pub temperature: Option<f32>,
    #[serde(default)]
    pub top_p: Option<f32>,
    #[serde(default)]
    pub top_k: Option<i64>,
    #[serde(default)]
    pub min_p: Option<f32>,
    #[serde(default)]
    pub n: Option<u32>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub stop: Option<StopSpec>,
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
    /// Return the log-probability of each output token.
    #[serde(default)]
    pub logprobs: Option<bool>,
    /// Alternatives per token (needs `logprobs: true`).
    #[serde(default)]
    pub top_logprobs: Option<u32>,
    #[serde(default)]
    pub logit_bias: Option<HashMap<String, f32>>,
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub ignore_eos: Option<bool>,
    /// End the prompt with the assistant's turn header (default true).
    #[serde(default)]
    pub add_generation_prompt: Option<bool>,
    /// Functions the model may call.
    #[serde(default)]
    pub tools: Option<Vec<ToolDefinition>>,
    /// `none`, `auto` (the default with tools), `required`, or a named function.
    #[serde(default)]
    pub tool_choice: Option<ToolChoice>,
    /// Whether the model may make several calls in one reply (default true).
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    /// `low`, `medium` or `high`: how long a reasoning model thinks, for chat templates
    /// that read `reasoning_effort` (gpt-oss); a 400 where the template does not.
    #[serde(default)]
    pub reasoning_effort: Option<String>,
    /// `response_format` and vLLM's `guided_*` / `structured_outputs`: at most one constraint
    /// on the output.
    #[serde(flatten)]
    pub structured: StructuredFields,
}

impl ChatCompletionRequest {
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

/// An alternative token.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f32,
    /// UTF-8 bytes of the token.
    pub bytes: Option<Vec<u8>>,
}

/// One output token with its alternatives.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ChatTokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Option<Vec<u8>>,
    pub top_logprobs: Vec<TopLogprob>,
}

/// Chat log-probabilities.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct ChatLogprobs {
    pub content: Option<Vec<ChatTokenLogprob>>,
}

/// The assistant's reply.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ChatMessageOut {
    /// Always `assistant`.
    pub role: String,
    /// The text; null when the reply is only tool calls.
    pub content: Option<String>,
    /// The thinking of a reasoning model (with a reasoning parser configured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// The tool calls the model made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
}

/// One chat choice.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ChatChoice {
    pub index: usize,
    pub message: ChatMessageOut,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<String>,
}

/// `object: "chat.completion"`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ChatCompletionResponse {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub model: String,
    /// The build, model and backend that answered (`fp_` and 10 hex digits).
    pub system_fingerprint: String,
    pub choices: Vec<ChatChoice>,
    pub usage: UsageInfo,
}

/// What a stream chunk adds to a choice's message.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct ChatDelta {
    /// `assistant`, in each choice's first chunk only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

/// One choice in a stream chunk.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ChatChunkChoice {
    pub index: usize,
    pub delta: ChatDelta,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<String>,
}

/// One server-sent event of a streamed chat completion (`object: "chat.completion.chunk"`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ChatCompletionChunk {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub model: String,
    /// The build, model and backend that answered (`fp_` and 10 hex digits).
    pub system_fingerprint: String,
    pub choices: Vec<ChatChunkChoice>,
    /// With `stream_options.include_usage`: null, except in the last chunk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<UsageInfo>)]
    pub usage: Option<Option<UsageInfo>>,
}
