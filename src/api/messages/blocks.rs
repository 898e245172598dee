//! A reply's parsed pieces (reasoning, text, tool calls) as Anthropic content blocks: the
//! stream's `content_block_*` events as they come, and the blocks of the whole reply. A
//! streamed and a non-streamed reply go through the same assembler, so they agree.

use std::hash::{Hash, Hasher};

use super::types::{ContentBlock, ContentBlockDelta, MessageStreamEvent};
use crate::api::tools::Piece;
use crate::engine::FinishReason;

/// One block being built: what it is and the text it has so far.
#[derive(Debug, Clone)]
enum Open {
    Text(String),
    Thinking(String),
    ToolUse {
        id: String,
        name: String,
        json: String,
    },
}

/// Builds the content blocks of one reply from parser pieces.
#[derive(Debug, Default)]
pub struct Assembler {
    /// Every block so far; the last one is open while `open` is set.
    blocks: Vec<Open>,
    open: bool,
}

/// A fresh `toolu_...` id.
pub fn tool_use_id() -> String {
    format!("toolu_{:024x}", rand::random::<u128>() >> 32)
}

/// The opaque `signature` of a thinking block: a digest of its text (Kiln does not check
/// signatures sent back; it drops earlier thinking from the prompt).
pub fn signature(thinking: &str) -> String {
    let mut h = std::hash::DefaultHasher::new();
    thinking.hash(&mut h);
    format!("kiln-{:016x}", h.finish())
}

impl Assembler {
    /// Feeds pieces; returns the stream events they make.
    pub fn push(&mut self, pieces: Vec<Piece>) -> Vec<MessageStreamEvent> {
        let mut out = Vec::new();
        for p in pieces {
            match p {
                Piece::Content(t) if !t.is_empty() => {
                    if !matches!(self.current(), Some(Open::Text(_))) {
                        self.start(Open::Text(String::new()), &mut out);
                    }
                    self.append(ContentBlockDelta::TextDelta { text: t }, &mut out);
                }
                Piece::Reasoning(t) if !t.is_empty() => {
                    if !matches!(self.current(), Some(Open::Thinking(_))) {
                        self.start(Open::Thinking(String::new()), &mut out);
                    }
                    self.append(ContentBlockDelta::ThinkingDelta { thinking: t }, &mut out);
                }
                Piece::CallStart { name, .. } => {
                    let block = Open::ToolUse {
                        id: tool_use_id(),
                        name,
                        json: String::new(),
                    };
                    self.start(block, &mut out);
                }
                Piece::Args { text, .. } if !text.is_empty() => {
                    if matches!(self.current(), Some(Open::ToolUse { .. })) {
                        self.append(
                            ContentBlockDelta::InputJsonDelta { partial_json: text },
                            &mut out,
                        );
                    }
                }
                Piece::Content(_) | Piece::Reasoning(_) | Piece::Args { .. } => {}
            }
        }
        out
    }

    /// Closes the open block (a thinking block gets its signature first).
    pub fn close(&mut self) -> Vec<MessageStreamEvent> {
        let mut out = Vec::new();
        self.stop(&mut out);
        out
    }

    /// Tool calls made so far.
    pub fn calls(&self) -> usize {
        self.blocks
            .iter()
            .filter(|b| matches!(b, Open::ToolUse { .. }))
            .count()
    }

    /// The finished blocks (tool inputs parsed; one cut short by `max_tokens` is `{}`).
    pub fn blocks(&self) -> Vec<ContentBlock> {
        self.blocks.iter().map(finished).collect()
    }

    fn current(&self) -> Option<&Open> {
        self.blocks.last().filter(|_| self.open)
    }

    fn start(&mut self, block: Open, out: &mut Vec<MessageStreamEvent>) {
        self.stop(out);
        let index = self.blocks.len();
        let content_block = match &block {
            Open::Text(_) => ContentBlock::Text {
                text: String::new(),
            },
            Open::Thinking(_) => ContentBlock::Thinking {
                thinking: String::new(),
                signature: String::new(),
            },
            Open::ToolUse { id, name, .. } => ContentBlock::ToolUse {
                id: id.clone(),
                name: name.clone(),
                input: serde_json::json!({}),
            },
        };
        self.blocks.push(block);
        self.open = true;
        out.push(MessageStreamEvent::ContentBlockStart {
            index,
            content_block,
        });
    }

    fn append(&mut self, delta: ContentBlockDelta, out: &mut Vec<MessageStreamEvent>) {
        let index = self.blocks.len() - 1;
        match (self.blocks.last_mut(), &delta) {
            (Some(Open::Text(s)), ContentBlockDelta::TextDelta { text }) => s.push_str(text),
            (Some(Open::Thinking(s)), ContentBlockDelta::ThinkingDelta { thinking }) => {
                s.push_str(thinking)
            }
            (
                Some(Open::ToolUse { json, .. }),
                ContentBlockDelta::InputJsonDelta { partial_json },
            ) => json.push_str(partial_json),
            _ => return,
        }
        out.push(MessageStreamEvent::ContentBlockDelta { index, delta });
    }

    fn stop(&mut self, out: &mut Vec<MessageStreamEvent>) {
        if !self.open {
            return;
        }
        self.open = false;
        let index = self.blocks.len() - 1;
        if let Some(Open::Thinking(t)) = self.blocks.last() {
            out.push(MessageStreamEvent::ContentBlockDelta {
                index,
                delta: ContentBlockDelta::SignatureDelta {
                    signature: signature(t),
                },
            });
        }
        out.push(MessageStreamEvent::ContentBlockStop { index });
    }
}

fn finished(b: &Open) -> ContentBlock {
    match b {
        Open::Text(text) => ContentBlock::Text { text: text.clone() },
        Open::Thinking(t) => ContentBlock::Thinking {
            thinking: t.clone(),
            signature: signature(t),
        },
        Open::ToolUse { id, name, json } => ContentBlock::ToolUse {
            id: id.clone(),
            name: name.clone(),
            input: serde_json::from_str::<serde_json::Value>(json)
                .ok()
                .filter(serde_json::Value::is_object)
                .unwrap_or_else(|| serde_json::json!({})),
        },
    }
}

/// Anthropic's `stop_reason` and `stop_sequence`: `tool_use` when a reply that stopped on
/// its own made calls; `stop_sequence` when one of `stops` ended it (the engine hides the
/// matched text, so `full`, the reply's tokens decoded whole, tells which); else `end_turn`
/// or `max_tokens`.
pub fn stop_reason(
    reason: FinishReason,
    calls: usize,
    stops: &[String],
    full: &str,
) -> (String, Option<String>) {
    match reason {
        FinishReason::Length => ("max_tokens".into(), None),
        FinishReason::Stop if calls > 0 => ("tool_use".into(), None),
        FinishReason::Stop | FinishReason::Abort => {
            let first = stops
                .iter()
                .filter_map(|s| full.find(s.as_str()).map(|p| (p, s)))
                .min_by_key(|(p, s)| (*p, std::cmp::Reverse(s.len())));
            match first {
                Some((_, s)) => ("stop_sequence".into(), Some(s.clone())),
                None => ("end_turn".into(), None),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(events: &[MessageStreamEvent]) -> Vec<&'static str> {
        events.iter().map(MessageStreamEvent::name).collect()
    }

    #[test]
    fn pieces_become_blocks_in_order() {
        let mut a = Assembler::default();
        let mut events = a.push(vec![
            Piece::Reasoning("Hmm".into()),
            Piece::Reasoning(", sun.".into()),
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
        events.extend(a.close());
        assert_eq!(
            kinds(&events),
            [
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
            ]
        );
        assert!(matches!(
            &events[3],
            MessageStreamEvent::ContentBlockDelta { index: 0, delta: ContentBlockDelta::SignatureDelta { signature } }
                if *signature == super::signature("Hmm, sun.")
        ));
        let blocks = a.blocks();
        assert_eq!(blocks.len(), 3);
        assert_eq!(
            blocks[1],
            ContentBlock::Text {
                text: "Let me look.".into()
            }
        );
        let ContentBlock::ToolUse { id, name, input } = &blocks[2] else {
            panic!("{blocks:?}")
        };
        assert!(id.starts_with("toolu_") && id.len() == 30, "{id}");
        assert_eq!(name, "get_weather");
        assert_eq!(input, &serde_json::json!({"city": "Paris"}));
        assert_eq!(a.calls(), 1);
        assert!(a.close().is_empty(), "closing twice sends nothing");
    }

    #[test]
    fn stop_reasons() {
        let stops = ["END".to_string(), "\n\n".to_string()];
        let r = |reason, calls, full: &str| stop_reason(reason, calls, &stops, full);
        assert_eq!(
            r(FinishReason::Length, 0, "a END"),
            ("max_tokens".into(), None)
        );
        assert_eq!(r(FinishReason::Stop, 1, "a END"), ("tool_use".into(), None));
        assert_eq!(
            r(FinishReason::Stop, 0, "one\n\ntwo END"),
            ("stop_sequence".into(), Some("\n\n".into()))
        );
        assert_eq!(r(FinishReason::Stop, 0, "plain"), ("end_turn".into(), None));
    }
}
