//! The Messages stream: `message_start`, `ping`, the content blocks' `content_block_start` /
//! `content_block_delta` / `content_block_stop`, then `message_delta` (stop reason, usage)
//! and `message_stop`, each as `event: <type>` + `data: <json>`; a failure after the headers
//! is an `error` event.

use std::sync::Arc;

use actix_web::web::Bytes;

use super::blocks::{Assembler, stop_reason};
use super::errors;
use super::types::{MessageDeltaBody, MessageStreamEvent, MessagesResponse, MessagesUsage};
use crate::api::ResponseMeta;
use crate::api::errors::ApiError;
use crate::api::sse::ChunkWriter;
use crate::api::tools::{ChoiceParser, ParseOptions};
use crate::engine::{FinishReason, TokenInfo, Usage};
use crate::tokenizer::Tokenizer;

/// `event: <type>\ndata: <json>\n\n`.
pub fn frame(event: &MessageStreamEvent) -> Bytes {
    let mut out = format!("event: {}\ndata: ", event.name()).into_bytes();
    // Serializing plain structs into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut out, event);
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

fn frames(events: Vec<MessageStreamEvent>) -> Option<Bytes> {
    let out: Vec<u8> = events.iter().flat_map(|e| frame(e).to_vec()).collect();
    (!out.is_empty()).then(|| Bytes::from(out))
}

/// Anthropic usage from Kiln's: prompt tokens found in the prefix cache are
/// `cache_read_input_tokens`, the rest `input_tokens` (nothing is written to a cache on
/// request, so `cache_creation_input_tokens` is 0).
pub fn usage(u: Usage) -> MessagesUsage {
    let cached = u.cached_tokens.min(u.prompt_tokens);
    MessagesUsage {
        input_tokens: u.prompt_tokens - cached,
        output_tokens: u.completion_tokens,
        cache_creation_input_tokens: 0,
        cache_read_input_tokens: cached,
    }
}

/// The `message` of `message_start` (and the shell of the non-streamed reply).
pub fn message(meta: &ResponseMeta, usage: MessagesUsage) -> MessagesResponse {
    MessagesResponse {
        id: meta.id.clone(),
        kind: "message".into(),
        role: "assistant".into(),
        model: meta.model.clone(),
        content: Vec::new(),
        stop_reason: None,
        stop_sequence: None,
        usage,
    }
}

/// An `error` event: how a stream ends that fails after the headers or is cut at the drain
/// limit.
pub fn cut_ending(e: &ApiError) -> Vec<Bytes> {
    vec![frame(&MessageStreamEvent::Error {
        error: errors::body(e).error,
    })]
}

/// Writes one reply's events.
pub struct MessagesWriter {
    pub meta: ResponseMeta,
    pub prompt_tokens: usize,
    pub parser: ChoiceParser,
    pub blocks: Assembler,
    pub tokenizer: Arc<Tokenizer>,
    pub stops: Vec<String>,
    /// The reply's token ids (to tell which stop sequence ended it).
    pub ids: Vec<u32>,
    /// Set by `finish`, sent with the usage in `message_delta`.
    pub stop: Option<(String, Option<String>)>,
}

impl MessagesWriter {
    /// A writer for a reply parsed with `parse`.
    pub fn new(
        meta: ResponseMeta,
        prompt_tokens: usize,
        parse: ParseOptions,
        tokenizer: Arc<Tokenizer>,
        stops: Vec<String>,
    ) -> Self {
        Self {
            meta,
            prompt_tokens,
            parser: ChoiceParser::new(parse),
            blocks: Assembler::default(),
            tokenizer,
            stops,
            ids: Vec::new(),
            stop: None,
        }
    }
}

impl ChunkWriter for MessagesWriter {
    fn begin(&mut self) -> Vec<Bytes> {
        let start = MessagesUsage {
            input_tokens: self.prompt_tokens,
            ..MessagesUsage::default()
        };
        vec![
            frame(&MessageStreamEvent::MessageStart {
                message: message(&self.meta, start),
            }),
            frame(&MessageStreamEvent::Ping),
        ]
    }

    fn delta(&mut self, _index: usize, text: String, tokens: Vec<TokenInfo>) -> Option<Bytes> {
        self.ids.extend(tokens.iter().map(|t| t.id));
        let pieces = self.parser.push(&text);
        frames(self.blocks.push(pieces))
    }

    fn finish(&mut self, _index: usize, reason: FinishReason) -> Bytes {
        let mut events = self.blocks.push(self.parser.finish_on(reason));
        events.extend(self.blocks.close());
        let full = match reason {
            FinishReason::Stop if !self.stops.is_empty() => {
                self.tokenizer.decode(&self.ids, true).unwrap_or_default()
            }
            _ => String::new(),
        };
        self.stop = Some(stop_reason(reason, self.blocks.calls(), &self.stops, &full));
        frames(events).unwrap_or_default()
    }

    fn usage(&mut self, u: Usage) -> Option<Bytes> {
        let (stop_reason, stop_sequence) = self.stop.take().unwrap_or(("end_turn".into(), None));
        frames(vec![
            MessageStreamEvent::MessageDelta {
                delta: MessageDeltaBody {
                    stop_reason: Some(stop_reason),
                    stop_sequence,
                },
                usage: usage(u),
            },
            MessageStreamEvent::MessageStop,
        ])
    }

    fn done(&mut self) -> Option<Bytes> {
        None
    }

    fn error(&mut self, e: &ApiError) -> Vec<Bytes> {
        cut_ending(e)
    }
}
