//! A reply's parsed pieces (reasoning, text, tool calls) as Responses output items: the
//! stream's typed events as they come, and the items of the whole reply. A streamed and a
//! non-streamed reply go through the same assembler, so they agree.

use serde_json::{Value, json};

use super::convert::new_id;
use super::types::{Item, TextPart};
use crate::api::tools::Piece;

/// One stream event before its `sequence_number`: its `type` and its other fields.
pub type Event = (&'static str, Value);

/// Builds the output items of one reply from parser pieces.
#[derive(Debug, Default)]
pub struct Assembler {
    items: Vec<Item>,
    /// The last item is still being written.
    open: bool,
}

impl Assembler {
    /// Feeds pieces; returns the events they make.
    pub fn push(&mut self, pieces: Vec<Piece>) -> Vec<Event> {
        let mut out = Vec::new();
        for p in pieces {
            match p {
                Piece::Content(t) if !t.is_empty() => {
                    if !matches!(self.current(), Some(Item::Message { .. })) {
                        self.start(message_item(), &mut out);
                    }
                    self.append(&t, &mut out);
                }
                Piece::Reasoning(t) if !t.is_empty() => {
                    if !matches!(self.current(), Some(Item::Reasoning { .. })) {
                        self.start(reasoning_item(), &mut out);
                    }
                    self.append(&t, &mut out);
                }
                Piece::CallStart { id, name, .. } => {
                    let call_id = if id.starts_with("call_") {
                        id
                    } else {
                        new_id("call")
                    };
                    let item = Item::FunctionCall {
                        id: new_id("fc"),
                        call_id,
                        name,
                        arguments: String::new(),
                        status: "in_progress".into(),
                    };
                    self.start(item, &mut out);
                }
                Piece::Args { text, .. } if !text.is_empty() => {
                    if matches!(self.current(), Some(Item::FunctionCall { .. })) {
                        self.append(&text, &mut out);
                    }
                }
                Piece::Content(_) | Piece::Reasoning(_) | Piece::Args { .. } => {}
            }
        }
        out
    }

    /// Closes the open item with `status` (`completed`, or `incomplete` for a reply cut
    /// short).
    pub fn close(&mut self, status: &str) -> Vec<Event> {
        let mut out = Vec::new();
        self.stop(status, &mut out);
        out
    }

    /// The reasoning text of the reply.
    pub fn reasoning(&self) -> String {
        let mut s = String::new();
        for i in &self.items {
            if let Item::Reasoning { content, .. } = i {
                content.iter().for_each(|p| s.push_str(&p.text));
            }
        }
        s
    }

    /// The items so far.
    pub fn items(&self) -> &[Item] {
        &self.items
    }

    fn current(&self) -> Option<&Item> {
        self.items.last().filter(|_| self.open)
    }

    fn start(&mut self, item: Item, out: &mut Vec<Event>) {
        self.stop("completed", out);
        let output_index = self.items.len();
        out.push((
            "response.output_item.added",
            json!({"output_index": output_index, "item": item}),
        ));
        let part = match &item {
            Item::Message { .. } => Some(json!(TextPart::output(String::new()))),
            Item::Reasoning { .. } => Some(json!({"type": "reasoning_text", "text": ""})),
            _ => None,
        };
        if let Some(part) = part {
            out.push((
                "response.content_part.added",
                json!({"item_id": item.id(), "output_index": output_index, "content_index": 0, "part": part}),
            ));
        }
        let item = match item {
            Item::Message {
                id, role, status, ..
            } => Item::Message {
                id,
                role,
                status,
                content: vec![TextPart::output(String::new())],
            },
            Item::Reasoning {
                id,
                summary,
                status,
                ..
            } => Item::Reasoning {
                id,
                summary,
                content: vec![reasoning_part(String::new())],
                status,
            },
            other => other,
        };
        self.items.push(item);
        self.open = true;
    }

    fn append(&mut self, text: &str, out: &mut Vec<Event>) {
        let output_index = self.items.len() - 1;
        let Some(item) = self.items.last_mut() else {
            return;
        };
        let id = item.id().to_string();
        match item {
            Item::Message { content, .. } | Item::Reasoning { content, .. } => {
                let reasoning = content.first().is_some_and(|p| p.kind == "reasoning_text");
                if let Some(p) = content.first_mut() {
                    p.text.push_str(text);
                }
                let (kind, extra) = if reasoning {
                    ("response.reasoning_text.delta", None)
                } else {
                    ("response.output_text.delta", Some(json!([])))
                };
                let mut body = json!({"item_id": id, "output_index": output_index, "content_index": 0, "delta": text});
                if let Some(lp) = extra {
                    body["logprobs"] = lp;
                }
                out.push((kind, body));
            }
            Item::FunctionCall { arguments, .. } => {
                arguments.push_str(text);
                out.push((
                    "response.function_call_arguments.delta",
                    json!({"item_id": id, "output_index": output_index, "delta": text}),
                ));
            }
            Item::FunctionCallOutput { .. } => {}
        }
    }

    fn stop(&mut self, status: &str, out: &mut Vec<Event>) {
        if !self.open {
            return;
        }
        self.open = false;
        let output_index = self.items.len() - 1;
        let Some(item) = self.items.last_mut() else {
            return;
        };
        let id = item.id().to_string();
        match item {
            Item::Message {
                content, status: s, ..
            } => {
                *s = status.to_string();
                let text = content.first().map(|p| p.text.clone()).unwrap_or_default();
                out.push(("response.output_text.done", json!({"item_id": id, "output_index": output_index, "content_index": 0, "text": text, "logprobs": []})));
                out.push(("response.content_part.done", json!({"item_id": id, "output_index": output_index, "content_index": 0, "part": TextPart::output(text)})));
            }
            Item::Reasoning {
                content, status: s, ..
            } => {
                *s = status.to_string();
                let text = content.first().map(|p| p.text.clone()).unwrap_or_default();
                out.push(("response.reasoning_text.done", json!({"item_id": id, "output_index": output_index, "content_index": 0, "text": text})));
                out.push(("response.content_part.done", json!({"item_id": id, "output_index": output_index, "content_index": 0, "part": reasoning_part(text)})));
            }
            Item::FunctionCall {
                arguments,
                status: s,
                ..
            } => {
                *s = status.to_string();
                out.push((
                    "response.function_call_arguments.done",
                    json!({"item_id": id, "output_index": output_index, "arguments": arguments}),
                ));
            }
            Item::FunctionCallOutput { .. } => {}
        }
        out.push((
            "response.output_item.done",
            json!({"output_index": output_index, "item": item}),
        ));
    }
}

fn reasoning_part(text: String) -> TextPart {
    TextPart {
        kind: "reasoning_text".into(),
        text,
        annotations: None,
    }
}

fn message_item() -> Item {
    Item::Message {
        id: new_id("msg"),
        role: "assistant".into(),
        status: "in_progress".into(),
        content: Vec::new(),
    }
}

fn reasoning_item() -> Item {
    Item::Reasoning {
        id: new_id("rs"),
        summary: Vec::new(),
        content: Vec::new(),
        status: "in_progress".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_become_items_and_events_in_order() {
        let mut a = Assembler::default();
        let mut events = a.push(vec![
            Piece::Reasoning("Hmm".into()),
            Piece::Content("Let me look.".into()),
            Piece::CallStart {
                index: 0,
                id: "call_1".into(),
                name: "get_weather".into(),
            },
            Piece::Args {
                index: 0,
                text: "{\"city\": ".into(),
            },
        ]);
        events.extend(a.push(vec![Piece::Args {
            index: 0,
            text: "\"Paris\"}".into(),
        }]));
        events.extend(a.close("completed"));
        let kinds: Vec<&str> = events.iter().map(|e| e.0).collect();
        assert_eq!(
            kinds,
            [
                "response.output_item.added",
                "response.content_part.added",
                "response.reasoning_text.delta",
                "response.reasoning_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
            ]
        );
        let indexes: Vec<u64> = events
            .iter()
            .map(|e| e.1["output_index"].as_u64().unwrap())
            .collect();
        assert_eq!(indexes, [0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2]);
        assert_eq!(a.reasoning(), "Hmm");
        let items = a.items();
        assert!(matches!(&items[0], Item::Reasoning { content, status, .. }
            if content[0].text == "Hmm" && content[0].kind == "reasoning_text" && status == "completed"));
        assert!(matches!(&items[1], Item::Message { content, .. }
            if content == &vec![TextPart::output("Let me look.".into())]));
        let Item::FunctionCall {
            call_id,
            arguments,
            status,
            id,
            ..
        } = &items[2]
        else {
            panic!("{items:?}")
        };
        assert_eq!((call_id.as_str(), status.as_str()), ("call_1", "completed"));
        assert!(id.starts_with("fc_"));
        assert_eq!(arguments, "{\"city\": \"Paris\"}");
        // Each done item is the item as it ends up in the response.
        assert_eq!(
            events[16].1["item"],
            serde_json::to_value(&items[2]).unwrap()
        );
        assert!(
            a.close("completed").is_empty(),
            "closing twice sends nothing"
        );
    }
}
