//! The tool-call formats Kiln parses, how one is picked, and the pieces a parsed reply is
//! made of.

use super::syntax::{self, Syntax};
use crate::config::ToolCallParser;

/// A tool-call format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    Llama3Json,
    Hermes,
    Mistral,
    /// gpt-oss's harmony messages (parsed by [`super::harmony`], reasoning included).
    Harmony,
}

impl ToolFormat {
    /// The configured parser, or the one the chat template's markers point to (harmony for
    /// `<|channel|>`; Hermes when the template names none: Kiln's default template asks for it).
    pub fn pick(configured: Option<ToolCallParser>, template: &str) -> Self {
        match configured {
            Some(ToolCallParser::Llama3Json) => ToolFormat::Llama3Json,
            Some(ToolCallParser::Hermes) => ToolFormat::Hermes,
            Some(ToolCallParser::Mistral) => ToolFormat::Mistral,
            None if template.contains("<|channel|>") => ToolFormat::Harmony,
            None if template.contains("[TOOL_CALLS]") => ToolFormat::Mistral,
            None if template.contains("<tool_call>") => ToolFormat::Hermes,
            None if template.contains("<|python_tag|>") || template.contains("ipython") => {
                ToolFormat::Llama3Json
            }
            None => ToolFormat::Hermes,
        }
    }

    pub(super) fn syntax(self) -> &'static Syntax {
        match self {
            ToolFormat::Llama3Json => &syntax::LLAMA3_JSON,
            ToolFormat::Hermes => &syntax::HERMES,
            ToolFormat::Mistral => &syntax::MISTRAL,
            ToolFormat::Harmony => &syntax::NONE,
        }
    }

    /// A fresh call id: `call_` and 24 letters or digits; Mistral's templates insist on
    /// 9 letters or digits.
    pub fn new_id(self) -> String {
        match self {
            ToolFormat::Mistral => random_alnum(9),
            _ => format!("call_{}", random_alnum(24)),
        }
    }
}

fn random_alnum(n: usize) -> String {
    const CHARS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    (0..n)
        .map(|_| CHARS[rand::random::<u32>() as usize % CHARS.len()] as char)
        .collect()
}

/// A piece of a parsed reply, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Content(String),
    Reasoning(String),
    /// A call begins: its index among the choice's calls, id and function name.
    CallStart {
        index: usize,
        id: String,
        name: String,
    },
    /// More of call `index`'s arguments (JSON text, to append).
    Args {
        index: usize,
        text: String,
    },
}
