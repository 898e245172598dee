//! The Responses API's wire types: the request, the `response` object, its items and
//! usage, the stream's events and the store's list and deletion bodies.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

/// `POST /v1/responses`. Fields are kept as sent and checked by `convert` (a wrong type or
/// an unsupported value is a 400 naming the field); any field not listed here is a 400.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
pub struct ResponsesRequest {
    #[serde(default)]
    pub model: Option<String>,
    /// A string (one user message) or a list of items: messages (`role` user, assistant,
    /// system or developer; string content or `input_text`/`output_text` parts),
    /// `function_call`, `function_call_output` and `reasoning` items.
    #[serde(default)]
    #[schema(value_type = Object)]
    pub input: Option<Value>,
    /// A system message put first (not carried over by `previous_response_id`).
    #[serde(default)]
    pub instructions: Option<String>,
    /// Function tools in the flat form `{"type": "function", "name", "description",
    /// "parameters", "strict"}`; built-in tools are a 400.
    #[serde(default)]
    #[schema(value_type = Option<Vec<Object>>)]
    pub tools: Option<Vec<Value>>,
    /// `auto`, `none`, `required` or `{"type": "function", "name"}`.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub tool_choice: Option<Value>,
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    /// `{"format": {"type": "text" | "json_object" | "json_schema", "name", "schema",
    /// "strict"}}`.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub text: Option<Value>,
    #[serde(default)]
    pub max_output_tokens: Option<u64>,
    #[serde(default)]
    pub temperature: Option<f32>,
    #[serde(default)]
    pub top_p: Option<f32>,
    /// `{"effort"}`: honoured where the chat template reads `reasoning_effort`, else a 400.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub reasoning: Option<Value>,
    /// Up to 16 string pairs, echoed.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Value>,
    #[serde(default)]
    pub user: Option<String>,
    /// Keep the response for `GET`, `input_items` and `previous_response_id` (default true).
    #[serde(default)]
    pub store: Option<bool>,
    /// Continue a stored response: its input and output come before this `input`.
    #[serde(default)]
    pub previous_response_id: Option<String>,
    #[serde(default)]
    pub stream: Option<bool>,
    /// Kiln extension: the sampling seed.
    #[serde(default)]
    pub seed: Option<i64>,
    /// Every other field, refused by name.
    #[serde(flatten)]
    #[schema(ignore)]
    pub extra: serde_json::Map<String, Value>,
}

/// A text part of a message item.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TextPart {
    /// `input_text`, `output_text` or `reasoning_text`.
    #[serde(rename = "type")]
    pub kind: String,
    pub text: String,
    /// `[]` on `output_text` parts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<Object>>)]
    pub annotations: Option<Vec<Value>>,
}

impl TextPart {
    /// An `output_text` part.
    pub fn output(text: String) -> Self {
        Self {
            kind: "output_text".into(),
            text,
            annotations: Some(Vec::new()),
        }
    }
}

/// An input or output item, as stored and returned.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Item {
    Message {
        id: String,
        role: String,
        status: String,
        content: Vec<TextPart>,
    },
    FunctionCall {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
        status: String,
    },
    FunctionCallOutput {
        id: String,
        call_id: String,
        output: String,
        status: String,
    },
    Reasoning {
        id: String,
        #[schema(value_type = Vec<Object>)]
        summary: Vec<Value>,
        content: Vec<TextPart>,
        status: String,
    },
}

impl Item {
    /// The item's id.
    pub fn id(&self) -> &str {
        match self {
            Item::Message { id, .. }
            | Item::FunctionCall { id, .. }
            | Item::FunctionCallOutput { id, .. }
            | Item::Reasoning { id, .. } => id,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct InputTokensDetails {
    /// Prompt tokens found in the prefix cache.
    pub cached_tokens: usize,
    pub cache_write_tokens: usize,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct OutputTokensDetails {
    /// Tokens of the reply's reasoning (counted by the tokenizer on its text).
    pub reasoning_tokens: usize,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ResponseUsage {
    pub input_tokens: usize,
    pub input_tokens_details: InputTokensDetails,
    pub output_tokens: usize,
    pub output_tokens_details: OutputTokensDetails,
    pub total_tokens: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct IncompleteDetails {
    /// `max_output_tokens`.
    pub reason: String,
}

/// The `response` object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ResponseObject {
    /// `resp_...`.
    pub id: String,
    /// Always `response`.
    pub object: String,
    pub created_at: u64,
    /// `completed`, `incomplete`, `in_progress`, `cancelled` or `failed`.
    pub status: String,
    #[schema(value_type = Option<Object>)]
    pub error: Option<Value>,
    pub incomplete_details: Option<IncompleteDetails>,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<u64>,
    pub model: String,
    pub output: Vec<Item>,
    pub parallel_tool_calls: bool,
    pub previous_response_id: Option<String>,
    /// `{"effort", "summary"}` as sent (nulls otherwise).
    #[schema(value_type = Object)]
    pub reasoning: Value,
    pub store: bool,
    pub temperature: f32,
    /// `{"format": {...}}` as sent (`{"type": "text"}` otherwise).
    #[schema(value_type = Object)]
    pub text: Value,
    #[schema(value_type = Object)]
    pub tool_choice: Value,
    #[schema(value_type = Vec<Object>)]
    pub tools: Vec<Value>,
    pub top_p: f32,
    /// Always `disabled`: a conversation that does not fit is a 400.
    pub truncation: String,
    pub background: bool,
    pub usage: Option<ResponseUsage>,
    pub user: Option<String>,
    #[schema(value_type = Object)]
    pub metadata: Value,
}

/// `GET /v1/responses/{id}/input_items`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct InputItemList {
    /// Always `list`.
    pub object: String,
    pub data: Vec<Item>,
    pub first_id: Option<String>,
    pub last_id: Option<String>,
    pub has_more: bool,
}

/// `DELETE /v1/responses/{id}`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ResponseDeleted {
    pub id: String,
    /// Always `response`.
    pub object: String,
    pub deleted: bool,
}
