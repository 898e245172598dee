//! Parsed pieces as OpenAI wire shapes: stream deltas and the non-streamed message.

use super::ParsedReply;
use super::format::Piece;
use crate::api::types::{
    ChatDelta, ChatMessageOut, FunctionCall, FunctionCallDelta, ToolCall, ToolCallDelta,
};

/// The deltas for `pieces`, in order: consecutive pieces of one kind share a delta, and a
/// call's first delta carries its index, id, type and name (arguments follow).
pub fn deltas(pieces: Vec<Piece>) -> Vec<ChatDelta> {
    let mut out: Vec<ChatDelta> = Vec::new();
    for p in pieces {
        let last = out.last_mut();
        match p {
            Piece::Content(t) => match last {
                Some(ChatDelta {
                    content: Some(c), ..
                }) => c.push_str(&t),
                _ => out.push(ChatDelta {
                    content: Some(t),
                    ..ChatDelta::default()
                }),
            },
            Piece::Reasoning(t) => match last {
                Some(ChatDelta {
                    reasoning_content: Some(c),
                    ..
                }) => c.push_str(&t),
                _ => out.push(ChatDelta {
                    reasoning_content: Some(t),
                    ..ChatDelta::default()
                }),
            },
            Piece::CallStart { index, id, name } => out.push(ChatDelta {
                tool_calls: Some(vec![ToolCallDelta {
                    index,
                    id: Some(id),
                    kind: Some("function".into()),
                    function: Some(FunctionCallDelta {
                        name: Some(name),
                        arguments: Some(String::new()),
                    }),
                }]),
                ..ChatDelta::default()
            }),
            Piece::Args { index, text } => {
                let same = last.and_then(|d| d.tool_calls.as_mut()).and_then(|calls| {
                    calls
                        .last_mut()
                        .filter(|c| c.index == index)
                        .and_then(|c| c.function.as_mut())
                });
                match same {
                    Some(f) => f.arguments.get_or_insert_default().push_str(&text),
                    None => out.push(ChatDelta {
                        tool_calls: Some(vec![ToolCallDelta {
                            index,
                            function: Some(FunctionCallDelta {
                                name: None,
                                arguments: Some(text),
                            }),
                            ..ToolCallDelta::default()
                        }]),
                        ..ChatDelta::default()
                    }),
                }
            }
        }
    }
    out
}

/// The assistant message of a parsed reply: `content` null when the reply is only calls,
/// `reasoning_content` and `tool_calls` only when there are some.
pub fn message(reply: ParsedReply) -> ChatMessageOut {
    let tool_calls: Vec<ToolCall> = reply
        .calls
        .into_iter()
        .map(|(id, name, arguments)| ToolCall {
            id,
            kind: "function".into(),
            function: FunctionCall { name, arguments },
        })
        .collect();
    let content = (tool_calls.is_empty() || !reply.content.is_empty()).then_some(reply.content);
    ChatMessageOut {
        role: "assistant".into(),
        content,
        reasoning_content: (!reply.reasoning.is_empty()).then_some(reply.reasoning),
        tool_calls: (!tool_calls.is_empty()).then_some(tool_calls),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_group_into_deltas() {
        let d = deltas(vec![
            Piece::Content("a".into()),
            Piece::Content("b".into()),
            Piece::CallStart {
                index: 0,
                id: "call_1".into(),
                name: "f".into(),
            },
            Piece::Args {
                index: 0,
                text: "{\"x\"".into(),
            },
            Piece::Args {
                index: 0,
                text: ": 1}".into(),
            },
        ]);
        assert_eq!(d.len(), 2);
        assert_eq!(d[0].content.as_deref(), Some("ab"));
        let call = &d[1].tool_calls.as_ref().unwrap()[0];
        assert_eq!((call.index, call.id.as_deref()), (0, Some("call_1")));
        let f = call.function.as_ref().unwrap();
        assert_eq!(f.name.as_deref(), Some("f"));
        assert_eq!(f.arguments.as_deref(), Some("{\"x\": 1}"));
        let json = serde_json::to_value(&d[1]).unwrap();
        assert_eq!(json["tool_calls"][0]["type"], "function");
        assert!(json.get("content").is_none());
    }

    #[test]
    fn message_with_only_calls_has_null_content() {
        let m = message(ParsedReply {
            content: String::new(),
            reasoning: "r".into(),
            calls: vec![("call_1".into(), "f".into(), "{}".into())],
        });
        assert_eq!(m.content, None);
        assert_eq!(m.reasoning_content.as_deref(), Some("r"));
        assert_eq!(m.tool_calls.unwrap()[0].function.arguments, "{}");
        let m = message(ParsedReply::default());
        assert_eq!(m.content.as_deref(), Some(""));
        assert!(m.tool_calls.is_none() && m.reasoning_content.is_none());
    }
}
