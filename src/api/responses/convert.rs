//! A Responses request as Kiln's chat pipeline takes it: `input` as normalized items (ids
//! given, as stored), the items as template messages, `tools`/`tool_choice` as a
//! [`ToolRequest`], `text.format` as a response format. Every refusal is a 400 naming the
//! field.

use serde_json::{Value, json};

use super::types::{Item, ResponsesRequest, TextPart};
use crate::api::errors::ApiError;
use crate::api::tools::{ToolChoiceMode, ToolRequest};
use crate::tokenizer::chat::{ChatMessage, TemplateTool, TemplateToolCall};

/// Fields Kiln refuses when they ask for something, with why.
const REFUSED: &[(&str, &str)] = &[
    (
        "background",
        "background responses are not supported; stream, or wait for the reply",
    ),
    (
        "conversation",
        "conversations are not supported; use `previous_response_id`",
    ),
    ("prompt", "stored prompt templates are not supported"),
    ("include", "Kiln produces no `include` values"),
    (
        "top_logprobs",
        "logprobs are not supported on /v1/responses",
    ),
    ("max_tool_calls", "`max_tool_calls` is not supported"),
    ("truncation", "only `truncation: \"disabled\"` is supported"),
];

/// Fields accepted and ignored: hints with no effect on one server.
const IGNORED: &[&str] = &[
    "service_tier",
    "prompt_cache_key",
    "prompt_cache_retention",
    "safety_identifier",
    "stream_options",
];

/// A fresh `PREFIX_<24 hex digits>` id.
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}_{:024x}", rand::random::<u128>() >> 32)
}

impl crate::api::types::CheckRequest for ResponsesRequest {
    /// Unsupported and unknown fields, `metadata`'s shape.
    fn check(&self) -> Result<(), crate::api::errors::ApiError> {
        check_fields(self)
    }
}

/// 400 for every field Kiln cannot honour (a null, `false`, empty or default value passes).
pub(super) fn check_fields(req: &ResponsesRequest) -> Result<(), ApiError> {
    for (name, value) in &req.extra {
        let unset = match value {
            Value::Null | Value::Bool(false) => true,
            Value::Array(a) => a.is_empty(),
            Value::String(s) => name == "truncation" && s == "disabled",
            _ => false,
        };
        if IGNORED.contains(&name.as_str()) || unset {
            continue;
        }
        let why = REFUSED
            .iter()
            .find(|(n, _)| n == name)
            .map_or("unknown parameter", |(_, w)| w);
        return Err(ApiError::invalid_with_code(
            Some(name.clone()),
            format!("unsupported parameter `{name}`: {why}"),
            "unsupported_parameter",
        ));
    }
    if let Some(m) = &req.metadata {
        let ok = match m {
            Value::Null => true,
            Value::Object(map) => map.len() <= 16 && map.values().all(Value::is_string),
            _ => false,
        };
        if !ok {
            return Err(ApiError::invalid(
                "metadata",
                "`metadata` is an object of at most 16 string values",
            ));
        }
    }
    Ok(())
}

/// The request's `input` as items, each with an id.
pub fn input_items(req: &ResponsesRequest) -> Result<Vec<Item>, ApiError> {
    match &req.input {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![message("user", vec![input_text(s)], None)]),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, v)| item(&format!("input[{i}]"), v))
            .collect(),
        Some(_) => Err(ApiError::invalid(
            "input",
            "`input` is a string or a list of items",
        )),
    }
}

fn input_text(s: &str) -> TextPart {
    TextPart {
        kind: "input_text".into(),
        text: s.to_string(),
        annotations: None,
    }
}

fn message(role: &str, content: Vec<TextPart>, id: Option<String>) -> Item {
    Item::Message {
        id: id.unwrap_or_else(|| new_id("msg")),
        role: role.to_string(),
        status: "completed".into(),
        content,
    }
}

fn string_field(param: &str, v: &Value, name: &str) -> Result<String, ApiError> {
    match v.get(name) {
        Some(Value::String(s)) => Ok(s.clone()),
        _ => Err(ApiError::invalid(
            format!("{param}.{name}"),
            format!("`{name}` must be a string"),
        )),
    }
}

fn opt_id(v: &Value) -> Option<String> {
    v.get("id").and_then(Value::as_str).map(str::to_string)
}

/// One input item: a message (`type` "message" or absent), `function_call`,
/// `function_call_output` or `reasoning`.
fn item(param: &str, v: &Value) -> Result<Item, ApiError> {
    if !v.is_object() {
        return Err(ApiError::invalid(param, "an input item is an object"));
    }
    let kind = v.get("type").and_then(Value::as_str).unwrap_or("message");
    match kind {
        "message" => {
            let role = string_field(param, v, "role")?;
            if !["user", "assistant", "system", "developer"].contains(&role.as_str()) {
                return Err(ApiError::invalid(
                    format!("{param}.role"),
                    format!(
                        "unsupported role {role:?} (expected user, assistant, system or developer)"
                    ),
                ));
            }
            let content = content(&format!("{param}.content"), v.get("content"), &role)?;
            Ok(message(&role, content, opt_id(v)))
        }
        "function_call" => Ok(Item::FunctionCall {
            id: opt_id(v).unwrap_or_else(|| new_id("fc")),
            call_id: string_field(param, v, "call_id")?,
            name: string_field(param, v, "name")?,
            arguments: string_field(param, v, "arguments")?,
            status: "completed".into(),
        }),
        "function_call_output" => {
            let output = match v.get("output") {
                Some(Value::String(s)) => s.clone(),
                Some(parts @ Value::Array(_)) => {
                    let parts = content(&format!("{param}.output"), Some(parts), "user")?;
                    parts
                        .into_iter()
                        .map(|p| p.text)
                        .collect::<Vec<_>>()
                        .join("\n")
                }
                _ => {
                    return Err(ApiError::invalid(
                        format!("{param}.output"),
                        "`output` must be a string or text parts",
                    ));
                }
            };
            Ok(Item::FunctionCallOutput {
                id: opt_id(v).unwrap_or_else(|| new_id("fco")),
                call_id: string_field(param, v, "call_id")?,
                output,
                status: "completed".into(),
            })
        }
        "reasoning" => {
            let content = match v.get("content") {
                None | Some(Value::Null) => Vec::new(),
                c => self::content(&format!("{param}.content"), c, "reasoning")?,
            };
            Ok(Item::Reasoning {
                id: opt_id(v).unwrap_or_else(|| new_id("rs")),
                summary: v
                    .get("summary")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default(),
                content,
                status: "completed".into(),
            })
        }
        other => Err(ApiError::invalid(
            format!("{param}.type"),
            format!(
                "unsupported input item type {other:?} (supported: message, function_call, function_call_output, reasoning)"
            ),
        )),
    }
}

/// A message's content: a string or text parts (`input_text`, `output_text`; images, files
/// and audio are a 400 naming the part).
fn content(param: &str, v: Option<&Value>, role: &str) -> Result<Vec<TextPart>, ApiError> {
    let kind = match role {
        "assistant" => "output_text",
        "reasoning" => "reasoning_text",
        _ => "input_text",
    };
    let parts = match v {
        Some(Value::String(s)) => {
            return Ok(vec![TextPart {
                kind: kind.into(),
                text: s.clone(),
                annotations: (kind == "output_text").then(Vec::new),
            }]);
        }
        Some(Value::Array(parts)) => parts,
        _ => {
            return Err(ApiError::invalid(
                param,
                "`content` must be a string or a list of parts",
            ));
        }
    };
    let mut out = Vec::with_capacity(parts.len());
    for (j, p) in parts.iter().enumerate() {
        let pp = format!("{param}[{j}]");
        match p.get("type").and_then(Value::as_str) {
            Some(t @ ("input_text" | "output_text" | "reasoning_text" | "text")) => {
                let text = string_field(&pp, p, "text")?;
                let kind = if t == "text" { kind } else { t };
                out.push(TextPart {
                    kind: kind.into(),
                    text,
                    annotations: (kind == "output_text").then(Vec::new),
                });
            }
            Some(other) => {
                return Err(ApiError::invalid(
                    format!("{pp}.type"),
                    format!(
                        "content parts of type {other:?} are not supported: Kiln serves text-only models (supported: input_text, output_text)"
                    ),
                ));
            }
            None => {
                return Err(ApiError::invalid(
                    format!("{pp}.type"),
                    "a part needs `type`",
                ));
            }
        }
    }
    Ok(out)
}

fn joined(parts: &[TextPart]) -> String {
    parts
        .iter()
        .map(|p| p.text.as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The conversation for the template: `instructions` first, then the items in order
/// (function calls join the assistant turn before them; a reasoning item's text is the next
/// assistant turn's `thinking`, which templates such as gpt-oss's render before a call and
/// the others leave out).
pub fn messages(instructions: Option<&str>, items: &[Item]) -> Vec<ChatMessage> {
    let mut out = Vec::new();
    let mut thinking: Option<String> = None;
    if let Some(i) = instructions {
        out.push(ChatMessage::new("system", i));
    }
    for it in items {
        match it {
            Item::Message { role, content, .. } => {
                let role = if role == "developer" { "system" } else { role };
                let mut m = ChatMessage::new(role, joined(content));
                if role == "assistant" {
                    m.thinking = thinking.take();
                }
                out.push(m);
            }
            Item::FunctionCall {
                call_id,
                name,
                arguments,
                ..
            } => {
                let call = TemplateToolCall {
                    id: call_id.clone(),
                    name: name.clone(),
                    arguments: serde_json::from_str(arguments)
                        .unwrap_or_else(|_| Value::String(arguments.clone())),
                };
                match out.last_mut() {
                    Some(m) if m.role == "assistant" => {
                        m.tool_calls.push(call);
                        m.thinking = m.thinking.take().or_else(|| thinking.take());
                    }
                    _ => {
                        let mut m = ChatMessage::new("assistant", "");
                        m.tool_calls.push(call);
                        m.thinking = thinking.take();
                        out.push(m);
                    }
                }
            }
            Item::FunctionCallOutput {
                call_id, output, ..
            } => {
                let mut m = ChatMessage::new("tool", output.clone());
                m.tool_call_id = Some(call_id.clone());
                out.push(m);
            }
            Item::Reasoning { content, .. } => {
                let text = joined(content);
                thinking = (!text.is_empty()).then_some(text);
            }
        }
    }
    out
}

/// `tools`, `tool_choice` and `parallel_tool_calls` as Kiln's tool request.
pub fn tools(req: &ResponsesRequest) -> Result<ToolRequest, ApiError> {
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
    let choice = match &req.tool_choice {
        None | Some(Value::Null) if tools.is_empty() => ToolChoiceMode::None,
        None | Some(Value::Null) => ToolChoiceMode::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolChoiceMode::None,
            "auto" => ToolChoiceMode::Auto,
            "required" => ToolChoiceMode::Required,
            other => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!(
                        "unknown tool_choice {other:?} (expected none, auto, required or a function)"
                    ),
                ));
            }
        },
        Some(v) => named_choice(v, &tools)?,
    };
    if tools.is_empty()
        && matches!(
            choice,
            ToolChoiceMode::Required | ToolChoiceMode::Function(_)
        )
    {
        return Err(ApiError::invalid(
            "tool_choice",
            "`tool_choice` needs `tools`",
        ));
    }
    Ok(ToolRequest {
        tools,
        choice,
        parallel: req.parallel_tool_calls.unwrap_or(true),
    })
}

fn named_choice(v: &Value, tools: &[TemplateTool]) -> Result<ToolChoiceMode, ApiError> {
    let kind = v.get("type").and_then(Value::as_str).unwrap_or_default();
    if kind != "function" {
        return Err(ApiError::invalid(
            "tool_choice.type",
            format!("unsupported tool_choice type {kind:?}: Kiln runs only function tools"),
        ));
    }
    let name = v.get("name").and_then(Value::as_str).unwrap_or_default();
    if !tools.iter().any(|t| t.name == name) {
        return Err(ApiError::invalid(
            "tool_choice.name",
            format!("tool_choice names {name:?}, which is not in `tools`"),
        ));
    }
    Ok(ToolChoiceMode::Function(name.to_string()))
}

fn tool(i: usize, t: &Value) -> Result<TemplateTool, ApiError> {
    let kind = t.get("type").and_then(Value::as_str).unwrap_or_default();
    if kind != "function" {
        return Err(ApiError::invalid(
            format!("tools[{i}].type"),
            format!(
                "tool type {kind:?} is not supported: Kiln runs only function tools (no built-in web_search, file_search, computer_use, ...)"
            ),
        ));
    }
    let name = t.get("name").and_then(Value::as_str).unwrap_or_default();
    let name_ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-".contains(c));
    if !name_ok {
        return Err(ApiError::invalid(
            format!("tools[{i}].name"),
            "a function name is 1 to 64 letters, digits, `_` or `-`",
        ));
    }
    let parameters = match t.get("parameters") {
        None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
        Some(p @ Value::Object(_)) => p.clone(),
        Some(_) => {
            return Err(ApiError::invalid(
                format!("tools[{i}].parameters"),
                "`parameters` must be a JSON Schema object",
            ));
        }
    };
    Ok(TemplateTool {
        name: name.to_string(),
        description: t
            .get("description")
            .and_then(Value::as_str)
            .map(str::to_string),
        parameters,
    })
}

/// `text.format` as a chat `response_format` value (`None` for free text).
pub fn response_format(req: &ResponsesRequest) -> Result<Option<Value>, ApiError> {
    let format = match &req.text {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(t)) => {
            if let Some(k) = t.keys().find(|k| *k != "format" && *k != "verbosity") {
                return Err(ApiError::invalid(
                    format!("text.{k}"),
                    format!("unsupported parameter `text.{k}`"),
                ));
            }
            match t.get("format") {
                None | Some(Value::Null) => return Ok(None),
                Some(f) => f,
            }
        }
        Some(_) => return Err(ApiError::invalid("text", "`text` must be an object")),
    };
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "json_object"}))),
        Some("json_schema") => {
            let name = format
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or("response");
            Ok(Some(json!({"type": "json_schema", "json_schema": {
                "name": name,
                "schema": format.get("schema").cloned().unwrap_or(Value::Null),
                "strict": format.get("strict").cloned().unwrap_or(Value::Null),
            }})))
        }
        other => Err(ApiError::invalid(
            "text.format.type",
            format!(
                "unsupported text format {other:?} (expected text, json_object or json_schema)"
            ),
        )),
    }
}

/// OpenAI's reasoning efforts.
const EFFORTS: &[&str] = &["none", "minimal", "low", "medium", "high", "xhigh"];

/// `reasoning.effort` (`None` when absent); `reasoning.summary` asks for summaries Kiln
/// does not write: a 400. Whether the template takes the effort is checked by the caller.
pub fn reasoning_effort(req: &ResponsesRequest) -> Result<Option<String>, ApiError> {
    let r = match &req.reasoning {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(r)) => r,
        Some(_) => {
            return Err(ApiError::invalid(
                "reasoning",
                "`reasoning` must be an object",
            ));
        }
    };
    for (k, v) in r {
        match (k.as_str(), v) {
            (_, Value::Null) | ("effort", Value::String(_)) => {}
            ("summary" | "generate_summary", _) => {
                return Err(ApiError::invalid(
                    format!("reasoning.{k}"),
                    "reasoning summaries are not supported (the reasoning text itself is returned)",
                ));
            }
            _ => {
                return Err(ApiError::invalid(
                    format!("reasoning.{k}"),
                    format!("unsupported parameter `reasoning.{k}`"),
                ));
            }
        }
    }
    let effort = r.get("effort").and_then(Value::as_str);
    if let Some(e) = effort.filter(|e| !EFFORTS.contains(e)) {
        return Err(ApiError::invalid(
            "reasoning.effort",
            format!("unknown reasoning effort {e:?} (expected one of {EFFORTS:?})"),
        ));
    }
    Ok(effort.map(str::to_string))
}
