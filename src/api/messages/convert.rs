//! An Anthropic request as Kiln's chat pipeline takes it: `system` and `messages` as template
//! messages (`tool_use` blocks as an assistant's tool calls, `tool_result` blocks as `tool`
//! messages), `tools`/`tool_choice` as a [`ToolRequest`], sampling validated. Every refusal
//! is a 400 naming the field.

use super::types::{
    AnthropicContent, AnthropicTool, AnthropicToolChoice, ContentBlockParam, MessagesRequest,
};
use crate::api::errors::ApiError;
use crate::api::tools::{ToolChoiceMode, ToolRequest};
use crate::api::types::{SamplingFields, StopSpec};
use crate::api::validate::{self, Validated};
use crate::config::LimitsConfig;
use crate::tokenizer::chat::{ChatMessage, TemplateTool, TemplateToolCall};

/// The conversation for the template, and the text of a last assistant message (a prefill
/// the reply continues), if any.
#[derive(Debug, Clone, Default)]
pub struct Conversation {
    pub messages: Vec<ChatMessage>,
    pub prefill: Option<String>,
}

const SUPPORTED: &str = "supported: text, tool_use, tool_result, thinking";

fn unsupported(param: String, kind: &str) -> ApiError {
    let why = match kind {
        "image" | "document" => {
            format!("{kind} content blocks are not supported: Kiln serves text-only models")
        }
        _ => format!("content blocks of type {kind:?} are not supported"),
    };
    ApiError::invalid(param, format!("{why} ({SUPPORTED})"))
}

/// `system` and `messages` as template messages.
pub fn conversation(
    req: &MessagesRequest,
    limits: &LimitsConfig,
) -> Result<Conversation, ApiError> {
    if req.messages.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "`messages` must not be empty",
        ));
    }
    if req.messages.len() > limits.max_messages {
        return Err(ApiError::invalid(
            "messages",
            format!(
                "at most {} messages per request, got {}",
                limits.max_messages,
                req.messages.len()
            ),
        ));
    }
    let mut out = Vec::new();
    if let Some(system) = &req.system {
        out.push(ChatMessage::new("system", text_of("system", system)?));
    }
    let last = req.messages.len() - 1;
    let mut prefill = None;
    for (i, m) in req.messages.iter().enumerate() {
        match m.role.as_str() {
            "user" => user(i, &m.content, &mut out)?,
            "assistant" => {
                let turn = assistant(i, &m.content)?;
                if i == last && i > 0 && turn.tool_calls.is_empty() {
                    prefill = Some(turn.content);
                } else {
                    out.push(turn);
                }
            }
            other => {
                return Err(ApiError::invalid(
                    format!("messages[{i}].role"),
                    format!(
                        "unsupported role {other:?} (expected user or assistant; the system prompt is the top-level `system`)"
                    ),
                ));
            }
        }
    }
    Ok(Conversation {
        messages: out,
        prefill,
    })
}

/// A string, or text blocks joined by newlines (any other block is a 400 naming it).
fn text_of(param: &str, content: &AnthropicContent) -> Result<String, ApiError> {
    match content {
        AnthropicContent::Text(t) => Ok(t.clone()),
        AnthropicContent::Blocks(blocks) => {
            let mut texts = Vec::with_capacity(blocks.len());
            for (j, b) in blocks.iter().enumerate() {
                texts.push(block_text(&format!("{param}[{j}]"), b)?);
            }
            Ok(texts.join("\n"))
        }
    }
}

fn block_text<'a>(param: &str, b: &'a ContentBlockParam) -> Result<&'a str, ApiError> {
    match (b.kind.as_str(), &b.text) {
        ("text", Some(t)) => Ok(t),
        ("text", None) => Err(ApiError::invalid(
            format!("{param}.text"),
            "a text block needs `text`",
        )),
        (kind, _) => Err(unsupported(format!("{param}.type"), kind)),
    }
}

/// A user turn: text blocks as user messages, each `tool_result` as a `tool` message, in order.
fn user(i: usize, content: &AnthropicContent, out: &mut Vec<ChatMessage>) -> Result<(), ApiError> {
    let blocks = match content {
        AnthropicContent::Text(t) => {
            out.push(ChatMessage::new("user", t.clone()));
            return Ok(());
        }
        AnthropicContent::Blocks(b) => b,
    };
    let mut texts: Vec<&str> = Vec::new();
    let flush = |texts: &mut Vec<&str>, out: &mut Vec<ChatMessage>| {
        if !texts.is_empty() {
            out.push(ChatMessage::new("user", texts.join("\n")));
            texts.clear();
        }
    };
    for (j, b) in blocks.iter().enumerate() {
        let param = format!("messages[{i}].content[{j}]");
        if b.kind != "tool_result" {
            texts.push(block_text(&param, b)?);
            continue;
        }
        flush(&mut texts, out);
        let id = match &b.tool_use_id {
            Some(id) if !id.is_empty() => id.clone(),
            _ => {
                return Err(ApiError::invalid(
                    format!("{param}.tool_use_id"),
                    "a tool_result block needs `tool_use_id`",
                ));
            }
        };
        let text = match &b.content {
            Some(c) => text_of(&format!("{param}.content"), c)?,
            None => String::new(),
        };
        let text = if b.is_error == Some(true) {
            format!("Error: {text}")
        } else {
            text
        };
        let mut m = ChatMessage::new("tool", text);
        m.tool_call_id = Some(id);
        out.push(m);
    }
    flush(&mut texts, out);
    Ok(())
}

/// An assistant turn: text, and `tool_use` blocks as its tool calls (earlier thinking is
/// dropped, as chat templates drop it).
fn assistant(i: usize, content: &AnthropicContent) -> Result<ChatMessage, ApiError> {
    let blocks = match content {
        AnthropicContent::Text(t) => return Ok(ChatMessage::new("assistant", t.clone())),
        AnthropicContent::Blocks(b) => b,
    };
    let mut texts = Vec::new();
    let mut calls = Vec::new();
    for (j, b) in blocks.iter().enumerate() {
        let param = format!("messages[{i}].content[{j}]");
        match b.kind.as_str() {
            "thinking" | "redacted_thinking" => {}
            "tool_use" => calls.push(tool_use(&param, b)?),
            _ => texts.push(block_text(&param, b)?),
        }
    }
    let mut m = ChatMessage::new("assistant", texts.join("\n"));
    m.tool_calls = calls;
    Ok(m)
}

fn tool_use(param: &str, b: &ContentBlockParam) -> Result<TemplateToolCall, ApiError> {
    let field = |name: &str, v: &Option<String>| match v {
        Some(s) if !s.is_empty() => Ok(s.clone()),
        _ => Err(ApiError::invalid(
            format!("{param}.{name}"),
            format!("a tool_use block needs `{name}`"),
        )),
    };
    let arguments = match &b.input {
        Some(v @ serde_json::Value::Object(_)) => v.clone(),
        None => serde_json::json!({}),
        Some(_) => {
            return Err(ApiError::invalid(
                format!("{param}.input"),
                "a tool_use block's `input` must be a JSON object",
            ));
        }
    };
    Ok(TemplateToolCall {
        id: field("id", &b.id)?,
        name: field("name", &b.name)?,
        arguments,
    })
}

/// `tools` and `tool_choice` as Kiln's tool request.
pub fn tools(req: &MessagesRequest) -> Result<ToolRequest, ApiError> {
    let list = req.tools.as_deref().unwrap_or_default();
    let mut tools: Vec<TemplateTool> = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let tool = tool(i, t)?;
        if tools.iter().any(|u| u.name == tool.name) {
            return Err(ApiError::invalid(
                format!("tools[{i}].name"),
                format!("two tools are named {:?}", tool.name),
            ));
        }
        tools.push(tool);
    }
    let (choice, parallel) = match &req.tool_choice {
        None if tools.is_empty() => (ToolChoiceMode::None, true),
        None => (ToolChoiceMode::Auto, true),
        Some(c) => choice(c, &tools)?,
    };
    Ok(ToolRequest {
        tools,
        choice,
        parallel,
    })
}

fn tool(i: usize, t: &AnthropicTool) -> Result<TemplateTool, ApiError> {
    if let Some(kind) = t.kind.as_deref().filter(|k| *k != "custom") {
        return Err(ApiError::invalid(
            format!("tools[{i}].type"),
            format!(
                "tool type {kind:?} is not supported: Kiln runs only client tools (`input_schema`)"
            ),
        ));
    }
    let name_ok = !t.name.is_empty()
        && t.name.len() <= 64
        && t.name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-".contains(c));
    if !name_ok {
        return Err(ApiError::invalid(
            format!("tools[{i}].name"),
            "a tool name is 1 to 64 letters, digits, `_` or `-`",
        ));
    }
    let parameters = match &t.input_schema {
        Some(p @ serde_json::Value::Object(map)) => {
            if map.get("type").is_some_and(|t| t != "object") {
                return Err(ApiError::invalid(
                    format!("tools[{i}].input_schema.type"),
                    "`input_schema` must be a JSON Schema of type \"object\"",
                ));
            }
            p.clone()
        }
        Some(_) => {
            return Err(ApiError::invalid(
                format!("tools[{i}].input_schema"),
                "`input_schema` must be a JSON Schema object",
            ));
        }
        None => {
            return Err(ApiError::invalid_with_code(
                Some(format!("tools[{i}].input_schema")),
                format!("missing required parameter `tools[{i}].input_schema`"),
                "missing_required_parameter",
            ));
        }
    };
    Ok(TemplateTool {
        name: t.name.clone(),
        description: t.description.clone(),
        parameters,
    })
}

fn choice(
    c: &AnthropicToolChoice,
    tools: &[TemplateTool],
) -> Result<(ToolChoiceMode, bool), ApiError> {
    let parallel = !c.disable_parallel_tool_use.unwrap_or(false);
    let mode = match c.kind.as_str() {
        "none" => ToolChoiceMode::None,
        "auto" => ToolChoiceMode::Auto,
        "any" => ToolChoiceMode::Required,
        "tool" => {
            let Some(name) = c.name.as_deref() else {
                return Err(ApiError::invalid(
                    "tool_choice.name",
                    "tool_choice of type \"tool\" needs `name`",
                ));
            };
            if !tools.iter().any(|t| t.name == name) {
                return Err(ApiError::invalid(
                    "tool_choice.name",
                    format!("tool_choice names {name:?}, which is not in `tools`"),
                ));
            }
            ToolChoiceMode::Function(name.to_string())
        }
        other => {
            return Err(ApiError::invalid(
                "tool_choice.type",
                format!("unknown tool_choice type {other:?} (expected auto, any, tool or none)"),
            ));
        }
    };
    if tools.is_empty() && matches!(mode, ToolChoiceMode::Required | ToolChoiceMode::Function(_)) {
        return Err(ApiError::invalid(
            "tool_choice",
            "`tool_choice` needs `tools`",
        ));
    }
    Ok((mode, parallel))
}

/// Whether the reply's reasoning is asked for (`thinking.type` "enabled", "adaptive" or
/// "between_tools") or refused ("disabled"); `None` without `thinking`. An "enabled" one's
/// `budget_tokens` must be positive and below `max_tokens` (it is not enforced: the model
/// thinks as it will).
pub fn thinking(
    req: &MessagesRequest,
    max_tokens: Option<usize>,
) -> Result<Option<bool>, ApiError> {
    let Some(t) = &req.thinking else {
        return Ok(None);
    };
    match t.kind.as_str() {
        "disabled" => Ok(Some(false)),
        "adaptive" | "between_tools" => Ok(Some(true)),
        "enabled" => match (t.budget_tokens, max_tokens) {
            (None, _) => Err(ApiError::invalid(
                "thinking.budget_tokens",
                "`thinking` of type \"enabled\" needs `budget_tokens`",
            )),
            (Some(0), _) => Err(ApiError::invalid(
                "thinking.budget_tokens",
                "`thinking.budget_tokens` must be at least 1",
            )),
            (Some(b), Some(m)) if b as usize >= m => Err(ApiError::invalid(
                "thinking.budget_tokens",
                format!("`max_tokens` must be greater than `thinking.budget_tokens` ({b})"),
            )),
            _ => Ok(Some(true)),
        },
        other => Err(ApiError::invalid(
            "thinking.type",
            format!(
                "unknown thinking type {other:?} (expected enabled, adaptive, between_tools or disabled)"
            ),
        )),
    }
}

/// `temperature` (0 to 1), `top_p`, `top_k`, `stop_sequences` and the Kiln extensions,
/// validated as chat validates them.
pub fn sampling(
    req: &MessagesRequest,
    limits: &LimitsConfig,
    vocab_size: usize,
) -> Result<Validated, ApiError> {
    if let Some(t) = req.temperature.filter(|t| !(0.0..=1.0).contains(t)) {
        return Err(ApiError::invalid(
            "temperature",
            format!("`temperature` must be between 0 and 1, got {t}"),
        ));
    }
    let stop = req.stop_sequences.clone().map(StopSpec::Many);
    let fields = SamplingFields {
        temperature: req.temperature,
        top_p: req.top_p,
        top_k: req.top_k,
        min_p: req.min_p,
        presence_penalty: req.presence_penalty,
        frequency_penalty: req.frequency_penalty,
        repetition_penalty: req.repetition_penalty,
        seed: req.seed,
        stop: stop.as_ref(),
        logit_bias: req.logit_bias.as_ref(),
        ..SamplingFields::default()
    };
    validate::sampling(&fields, limits, vocab_size, None).map_err(|e| match e {
        ApiError::InvalidRequest {
            param: Some(p),
            message,
            code,
        } if p == "stop" => ApiError::InvalidRequest {
            param: Some("stop_sequences".into()),
            message: message.replace("stop strings", "stop sequences"),
            code,
        },
        e => e,
    })
}
