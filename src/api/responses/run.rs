//! One response being generated: its shell (the echoed request fields), the assembler of its
//! output items, and what happens at its end (status, usage, the store, anyone waiting on a
//! cancel). The stream writer sends the same items as typed events with `sequence_number`s.

use std::sync::Arc;

use actix_web::web::{Bytes, Data};
use serde_json::{Value, json};
use tokio::sync::watch;

use super::items::{Assembler, Event};
use super::state::Running;
use super::store::Store;
use super::types::{IncompleteDetails, Item, ResponseObject, ResponseUsage};
use crate::api::errors::ApiError;
use crate::api::generation::Cancel;
use crate::api::sse::ChunkWriter;
use crate::api::state::AppState;
use crate::api::tools::{ChoiceParser, ParseOptions};
use crate::engine::{FinishReason, TokenInfo, Usage};
use crate::tokenizer::Tokenizer;

/// Removes the in-flight entry when the run ends, however it ends.
struct Registered {
    state: Data<AppState>,
    id: String,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.state.responses.running.remove(&self.id);
    }
}

/// One response from its first token to its end.
pub struct Run {
    pub shell: ResponseObject,
    /// This response's own input items (stored with it).
    pub input: Vec<Item>,
    pub prompt_tokens: usize,
    pub tokenizer: Arc<Tokenizer>,
    /// Where it is kept (`store: true`).
    pub store: Option<Arc<Store>>,
    cancel: Cancel,
    parser: ChoiceParser,
    items: Assembler,
    reason: Option<FinishReason>,
    done: watch::Sender<Option<ResponseObject>>,
    _registered: Registered,
}

impl Run {
    /// Registers `shell` as in flight (for `GET` and `cancel`); the returned [`Cancel`] ends it.
    pub fn start(
        state: Data<AppState>,
        shell: ResponseObject,
        input: Vec<Item>,
        prompt_tokens: usize,
        parse: ParseOptions,
        tokenizer: Arc<Tokenizer>,
        store: Option<Arc<Store>>,
    ) -> (Self, Cancel) {
        let cancel = Cancel::default();
        let (done, rx) = watch::channel(None);
        let running = Running {
            cancel: cancel.clone(),
            snapshot: shell.clone(),
            done: rx,
        };
        state.responses.running.insert(shell.id.clone(), running);
        let registered = Registered {
            state,
            id: shell.id.clone(),
        };
        let run = Self {
            shell,
            input,
            prompt_tokens,
            tokenizer,
            store,
            cancel: cancel.clone(),
            parser: ChoiceParser::new(parse),
            items: Assembler::default(),
            reason: None,
            done,
            _registered: registered,
        };
        (run, cancel)
    }

    /// Reply text in; the events it makes.
    pub fn push(&mut self, text: &str) -> Vec<Event> {
        let pieces = self.parser.push(text);
        self.items.push(pieces)
    }

    /// The reply ended for `reason`: the rest, its items closed.
    pub fn finish(&mut self, reason: FinishReason) -> Vec<Event> {
        self.reason = Some(reason);
        let mut events = self.items.push(self.parser.finish_on(reason));
        let status = match reason {
            FinishReason::Stop => "completed",
            _ => "incomplete",
        };
        events.extend(self.items.close(status));
        events
    }

    /// The finished response: status, output, usage; stored when asked, and handed to a
    /// waiting cancel.
    pub fn complete(&mut self, usage: Usage) -> ResponseObject {
        let mut r = self.shell.clone();
        let cancelled = self.cancel.is_cancelled();
        r.status = match self.reason {
            _ if cancelled => "cancelled",
            Some(FinishReason::Stop) => "completed",
            Some(FinishReason::Length) => "incomplete",
            _ => "failed",
        }
        .into();
        if self.reason == Some(FinishReason::Length) && !cancelled {
            r.incomplete_details = Some(IncompleteDetails {
                reason: "max_output_tokens".into(),
            });
        }
        r.output = self.items.items().to_vec();
        let reasoning = self.items.reasoning();
        let reasoning_tokens = match reasoning.is_empty() {
            true => 0,
            false => self
                .tokenizer
                .encode(&reasoning, false)
                .map_or(0, |t| t.len()),
        };
        let input_tokens = usage.prompt_tokens.max(self.prompt_tokens);
        r.usage = Some(ResponseUsage {
            input_tokens,
            input_tokens_details: super::types::InputTokensDetails {
                cached_tokens: usage.cached_tokens.min(input_tokens),
                cache_write_tokens: 0,
            },
            output_tokens: usage.completion_tokens,
            output_tokens_details: super::types::OutputTokensDetails {
                reasoning_tokens: reasoning_tokens.min(usage.completion_tokens),
            },
            total_tokens: input_tokens + usage.completion_tokens,
        });
        self.save(&r);
        r
    }

    /// Stores `r` (when asked) and hands it to a waiting cancel.
    fn save(&mut self, r: &ResponseObject) {
        if let Some(store) = &self.store
            && let Err(e) = store.put(r, &self.input)
        {
            tracing::warn!(error = %e, id = %r.id, "storing a response failed");
        }
        let _ = self.done.send(Some(r.clone()));
    }
}

/// `event: <type>\ndata: <json with type and sequence_number>\n\n`.
fn frame(seq: &mut usize, (kind, mut body): Event) -> Vec<u8> {
    body["type"] = Value::from(kind);
    body["sequence_number"] = Value::from(*seq);
    *seq += 1;
    let mut out = format!("event: {kind}\ndata: ").into_bytes();
    // Serializing a Value into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut out, &body);
    out.extend_from_slice(b"\n\n");
    out
}

/// Writes one response's events.
pub struct ResponsesWriter {
    pub run: Run,
    seq: usize,
}

impl ResponsesWriter {
    pub fn new(run: Run) -> Self {
        Self { run, seq: 0 }
    }

    fn frames(&mut self, events: Vec<Event>) -> Option<Bytes> {
        let mut out = Vec::new();
        for e in events {
            out.extend(frame(&mut self.seq, e));
        }
        (!out.is_empty()).then(|| Bytes::from(out))
    }
}

impl ChunkWriter for ResponsesWriter {
    fn begin(&mut self) -> Vec<Bytes> {
        let shell = json!({"response": self.run.shell});
        let events = vec![
            ("response.created", shell.clone()),
            ("response.in_progress", shell),
        ];
        self.frames(events).into_iter().collect()
    }

    fn delta(&mut self, _index: usize, text: String, _tokens: Vec<TokenInfo>) -> Option<Bytes> {
        let events = self.run.push(&text);
        self.frames(events)
    }

    fn finish(&mut self, _index: usize, reason: FinishReason) -> Bytes {
        let events = self.run.finish(reason);
        self.frames(events).unwrap_or_default()
    }

    fn usage(&mut self, usage: Usage) -> Option<Bytes> {
        let r = self.run.complete(usage);
        let kind = match r.status.as_str() {
            "incomplete" => "response.incomplete",
            "failed" => "response.failed",
            _ => "response.completed",
        };
        self.frames(vec![(kind, json!({"response": r}))])
    }

    fn done(&mut self) -> Option<Bytes> {
        None
    }

    fn error(&mut self, e: &ApiError) -> Vec<Bytes> {
        let body = e.body().error;
        let mut r = self.run.shell.clone();
        r.status = "failed".into();
        r.output = Vec::new();
        r.error = Some(json!({"code": body.code, "message": body.message}));
        self.run.save(&r);
        let events = vec![
            (
                "error",
                json!({"code": body.code, "message": body.message, "param": body.param}),
            ),
            ("response.failed", json!({"response": r})),
        ];
        self.frames(events).into_iter().collect()
    }
}
