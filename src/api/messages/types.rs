//! Anthropic Messages wire types (serde + utoipa): requests as the `anthropic` SDK sends
//! them, responses and stream events as its `types/message*.py` and `raw_*_event.py` read them.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::api::types::CheckRequest;

/// A content block of a request message (or of a `tool_result`'s content). Read loosely so
/// that a block Kiln does not take (`image`, `document`, ...) is a 400 naming its type.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct ContentBlockParam {
    /// `text`, `tool_use`, `tool_result`, `thinking` or `redacted_thinking`.
    #[serde(rename = "type")]
    pub kind: String,
    /// `text`: the text.
    #[serde(default)]
    pub text: Option<String>,
    /// `tool_use`: the call's id.
    #[serde(default)]
    pub id: Option<String>,
    /// `tool_use`: the tool's name.
    #[serde(default)]
    pub name: Option<String>,
    /// `tool_use`: the arguments, a JSON object.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub input: Option<serde_json::Value>,
    /// `tool_result`: the id of the `tool_use` it answers.
    #[serde(default)]
    pub tool_use_id: Option<String>,
    /// `tool_result`: a string or text blocks.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub content: Option<AnthropicContent>,
    /// `tool_result`: the tool failed.
    #[serde(default)]
    pub is_error: Option<bool>,
    /// `thinking`: earlier reasoning (dropped from the prompt, as templates drop it).
    #[serde(default)]
    pub thinking: Option<String>,
}

/// `content` (and `system`): a string or a list of blocks.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum AnthropicContent {
    Text(String),
    Blocks(Vec<ContentBlockParam>),
}

/// One message of the conversation.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct AnthropicMessage {
    /// `user` or `assistant`.
    pub role: String,
    pub content: AnthropicContent,
}

/// A tool the model may call.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct AnthropicTool {
    /// Absent or `custom`; Anthropic's server tools are refused.
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    /// A JSON Schema of type `object` for the input.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub input_schema: Option<serde_json::Value>,
}

/// `tool_choice`: `{"type": "auto" | "any" | "tool" | "none", "name"?, "disable_parallel_tool_use"?}`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct AnthropicToolChoice {
    #[serde(rename = "type")]
    pub kind: String,
    /// With `tool`: the tool to call.
    #[serde(default)]
    pub name: Option<String>,
    /// At most one call in the reply.
    #[serde(default)]
    pub disable_parallel_tool_use: Option<bool>,
}

/// `thinking`: `{"type": "enabled", "budget_tokens": N}`, `{"type": "adaptive"}`,
/// `{"type": "between_tools"}` or `{"type": "disabled"}`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct ThinkingConfig {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub budget_tokens: Option<u64>,
}

/// `metadata`.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
pub struct AnthropicMetadata {
    #[serde(default)]
    pub user_id: Option<String>,
}

/// `POST /v1/messages` (and, without `max_tokens`, `/v1/messages/count_tokens`). Unknown
/// fields are ignored; known fields of the wrong type are a 400 naming the field.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct MessagesRequest {
    #[serde(default)]
    pub model: Option<String>,
    /// Required by `/v1/messages`.
    #[serde(default)]
    pub max_tokens: Option<u64>,
    pub messages: Vec<AnthropicMessage>,
    /// A string or text blocks.
    #[serde(default)]
    pub system: Option<AnthropicContent>,
    #[serde(default)]
    pub stop_sequences: Option<Vec<String>>,
    #[serde(default)]
    pub stream: Option<bool>,
    /// 0 to 1.
    #[serde(default)]
    pub temperature: Option<f32>,
    #[serde(default)]
    pub top_p: Option<f32>,
    #[serde(default)]
    pub top_k: Option<i64>,
    #[serde(default)]
    pub tools: Option<Vec<AnthropicTool>>,
    #[serde(default)]
    pub tool_choice: Option<AnthropicToolChoice>,
    #[serde(default)]
    pub thinking: Option<ThinkingConfig>,
    #[serde(default)]
    pub metadata: Option<AnthropicMetadata>,
    /// Kiln extension (as on chat): a seed for sampling.
    #[serde(default)]
    pub seed: Option<i64>,
    /// Kiln extension (as on chat).
    #[serde(default)]
    pub min_p: Option<f32>,
    /// Kiln extension (as on chat): token id -> bias.
    #[serde(default)]
    pub logit_bias: Option<HashMap<String, f32>>,
    /// Kiln extension (as on chat).
    #[serde(default)]
    pub presence_penalty: Option<f32>,
    /// Kiln extension (as on chat).
    #[serde(default)]
    pub frequency_penalty: Option<f32>,
    /// Kiln extension (as on chat).
    #[serde(default)]
    pub repetition_penalty: Option<f32>,
}

impl CheckRequest for MessagesRequest {}

/// A content block of the reply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentBlock {
    Text {
        text: String,
    },
    /// The model's reasoning (through the reasoning parser); `signature` is an opaque
    /// digest of the text, not checked when sent back.
    Thinking {
        thinking: String,
        signature: String,
    },
    ToolUse {
        id: String,
        name: String,
        #[schema(value_type = Object)]
        input: serde_json::Value,
    },
}

/// Token counts (`input_tokens` excludes `cache_read_input_tokens`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct MessagesUsage {
    pub input_tokens: usize,
    pub output_tokens: usize,
    pub cache_creation_input_tokens: usize,
    pub cache_read_input_tokens: usize,
}

/// `{"type": "message", ...}`: the reply.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct MessagesResponse {
    /// `msg_...`.
    pub id: String,
    /// Always `message`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Always `assistant`.
    pub role: String,
    pub model: String,
    pub content: Vec<ContentBlock>,
    /// `end_turn`, `max_tokens`, `stop_sequence` or `tool_use`; null in `message_start`.
    pub stop_reason: Option<String>,
    /// The stop sequence that ended the reply.
    pub stop_sequence: Option<String>,
    pub usage: MessagesUsage,
}

/// `POST /v1/messages/count_tokens`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CountTokensResponse {
    pub input_tokens: usize,
}

/// What a `content_block_delta` adds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentBlockDelta {
    TextDelta { text: String },
    ThinkingDelta { thinking: String },
    SignatureDelta { signature: String },
    InputJsonDelta { partial_json: String },
}

/// `message_delta.delta`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct MessageDeltaBody {
    pub stop_reason: Option<String>,
    pub stop_sequence: Option<String>,
}

/// One stream event, sent as `event: <type>` and `data: <json>`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum MessageStreamEvent {
    MessageStart {
        message: MessagesResponse,
    },
    ContentBlockStart {
        index: usize,
        content_block: ContentBlock,
    },
    ContentBlockDelta {
        index: usize,
        delta: ContentBlockDelta,
    },
    ContentBlockStop {
        index: usize,
    },
    MessageDelta {
        delta: MessageDeltaBody,
        usage: MessagesUsage,
    },
    MessageStop,
    Ping,
    Error {
        error: AnthropicErrorDetail,
    },
}

impl MessageStreamEvent {
    /// The SSE event name (the `type`).
    pub fn name(&self) -> &'static str {
        match self {
            MessageStreamEvent::MessageStart { .. } => "message_start",
            MessageStreamEvent::ContentBlockStart { .. } => "content_block_start",
            MessageStreamEvent::ContentBlockDelta { .. } => "content_block_delta",
            MessageStreamEvent::ContentBlockStop { .. } => "content_block_stop",
            MessageStreamEvent::MessageDelta { .. } => "message_delta",
            MessageStreamEvent::MessageStop => "message_stop",
            MessageStreamEvent::Ping => "ping",
            MessageStreamEvent::Error { .. } => "error",
        }
    }
}

/// Anthropic's `error` object.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AnthropicErrorDetail {
    /// `invalid_request_error`, `authentication_error`, `permission_error`,
    /// `not_found_error`, `request_too_large`, `rate_limit_error`, `api_error` or
    /// `overloaded_error`.
    #[serde(rename = "type")]
    pub kind: String,
    pub message: String,
}

/// `{"type": "error", "error": {...}}`: every error on the Messages routes.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AnthropicErrorResponse {
    /// Always `error`.
    #[serde(rename = "type")]
    pub kind: String,
    pub error: AnthropicErrorDetail,
}
