//! The request's `tools`, `tool_choice` and `parallel_tool_calls`, checked (400 naming the
//! field) and kept in the shapes the template and the constraint need.

use super::format::ToolFormat;
use super::grammar;
use crate::api::errors::ApiError;
use crate::api::types::{ChatCompletionRequest, ToolChoice, ToolDefinition};
use crate::engine::Constraint;
use crate::tokenizer::Tokenizer;
use crate::tokenizer::chat::TemplateTool;

/// What the client allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoiceMode {
    /// No tool calls: tools are not shown to the model and replies are not parsed.
    None,
    /// The model decides; replies are parsed.
    Auto,
    /// The reply is one or more calls (constrained).
    Required,
    /// The reply is a call of this function (constrained).
    Function(String),
}

/// The checked tool settings of a chat request.
#[derive(Debug, Clone)]
pub struct ToolRequest {
    pub tools: Vec<TemplateTool>,
    pub choice: ToolChoiceMode,
    pub parallel: bool,
}

impl ToolRequest {
    /// Checks the request's tool fields.
    pub fn from_request(req: &ChatCompletionRequest) -> Result<Self, ApiError> {
        let tools = match &req.tools {
            Some(list) => list
                .iter()
                .enumerate()
                .map(|(i, t)| tool(i, t))
                .collect::<Result<Vec<_>, _>>()?,
            None => Vec::new(),
        };
        for (i, t) in tools.iter().enumerate() {
            if tools[..i].iter().any(|u| u.name == t.name) {
                return Err(ApiError::invalid(
                    format!("tools[{i}].function.name"),
                    format!("two tools are named {:?}", t.name),
                ));
            }
        }
        let choice = match &req.tool_choice {
            None if tools.is_empty() => ToolChoiceMode::None,
            None => ToolChoiceMode::Auto,
            Some(ToolChoice::Mode(m)) => match m.as_str() {
                "none" => ToolChoiceMode::None,
                "auto" => ToolChoiceMode::Auto,
                "required" => ToolChoiceMode::Required,
                other => {
                    return Err(ApiError::invalid(
                        "tool_choice",
                        format!(
                            "unknown tool_choice {other:?} (expected \"none\", \"auto\", \"required\" or a named function)"
                        ),
                    ));
                }
            },
            Some(ToolChoice::Named(n)) => {
                if n.kind != "function" {
                    return Err(ApiError::invalid(
                        "tool_choice.type",
                        format!(
                            "unsupported tool_choice type {:?} (only \"function\")",
                            n.kind
                        ),
                    ));
                }
                if !tools.iter().any(|t| t.name == n.function.name) {
                    return Err(ApiError::invalid(
                        "tool_choice.function.name",
                        format!(
                            "tool_choice names {:?}, which is not in `tools`",
                            n.function.name
                        ),
                    ));
                }
                ToolChoiceMode::Function(n.function.name.clone())
            }
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
        Ok(Self {
            tools,
            choice,
            parallel: req.parallel_tool_calls.unwrap_or(true),
        })
    }

    /// The tools the template shows (none with `tool_choice: "none"`).
    pub fn template_tools(&self) -> &[TemplateTool] {
        match self.choice {
            ToolChoiceMode::None => &[],
            _ => &self.tools,
        }
    }

    /// Whether replies are parsed for calls.
    pub fn parses_calls(&self) -> bool {
        self.choice != ToolChoiceMode::None && !self.tools.is_empty()
    }

    /// The constraint that forces a call in `format` (`required` or a named function);
    /// markers that `tok` has as special tokens are written as those tokens.
    pub fn constraint(&self, format: ToolFormat, tok: &Tokenizer) -> Option<Constraint> {
        let only = match &self.choice {
            ToolChoiceMode::Required => None,
            ToolChoiceMode::Function(name) => Some(name.as_str()),
            ToolChoiceMode::None | ToolChoiceMode::Auto => return None,
        };
        let tools: Vec<&TemplateTool> = self
            .tools
            .iter()
            .filter(|t| only.is_none_or(|n| n == t.name))
            .collect();
        let parallel = self.parallel && only.is_none();
        let mark = |text: &str| {
            let id = tok.token_to_id(text).filter(|&id| tok.is_special(id));
            grammar::marker(text, id)
        };
        Some(Constraint::Lark(grammar::tool_calls(
            format, &tools, parallel, &mark,
        )))
    }
}

/// Tool `i`, checked.
fn tool(i: usize, t: &ToolDefinition) -> Result<TemplateTool, ApiError> {
    if t.kind != "function" {
        return Err(ApiError::invalid(
            format!("tools[{i}].type"),
            format!("unsupported tool type {:?} (only \"function\")", t.kind),
        ));
    }
    let f = &t.function;
    let name_ok = !f.name.is_empty()
        && f.name.len() <= 64
        && f.name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c));
    if !name_ok {
        return Err(ApiError::invalid(
            format!("tools[{i}].function.name"),
            "a function name is 1 to 64 letters, digits, `_`, `-` or `.`",
        ));
    }
    let parameters = match &f.parameters {
        None => serde_json::json!({"type": "object", "properties": {}}),
        Some(p @ serde_json::Value::Object(map)) => {
            if map.get("type").is_some_and(|t| t != "object") {
                return Err(ApiError::invalid(
                    format!("tools[{i}].function.parameters.type"),
                    "`parameters` must be a JSON Schema of type \"object\"",
                ));
            }
            p.clone()
        }
        Some(_) => {
            return Err(ApiError::invalid(
                format!("tools[{i}].function.parameters"),
                "`parameters` must be a JSON Schema object",
            ));
        }
    };
    Ok(TemplateTool {
        name: f.name.clone(),
        description: f.description.clone(),
        parameters,
    })
}
