//! Server-sent events: `data: {json}\n\n` frames ending with `data: [DONE]`, error frames,
//! and `: keep-alive` comments while nothing happens (e.g. during a long prefill).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::ops::Range;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use actix_web::HttpResponse;
use actix_web::web::Bytes;
use futures_util::stream::{Stream, StreamExt};
use serde::Serialize;
use tokio::time::{Instant, Sleep, sleep};

use super::errors::ApiError;
use super::generation::MergedStream;
use crate::engine::{FinishReason, StreamEvent, TokenInfo, Usage};

/// The comment sent after a quiet interval.
pub const KEEP_ALIVE: &[u8] = b": keep-alive\n\n";
/// The last frame of every stream.
pub const DONE: &[u8] = b"data: [DONE]\n\n";

/// `data: {json}\n\n`.
pub fn data_frame<T: Serialize>(value: &T) -> Bytes {
    let mut out = b"data: ".to_vec();
    // Serializing plain structs into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut out, value);
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

/// Turns merged engine events into one API's chunks.
pub trait ChunkWriter: Unpin + 'static {
    /// Frames before any event (chat: the role of each choice; completions: echoed prompts).
    fn begin(&mut self) -> Vec<Bytes>;
    /// The prompt logprobs of `choices` (sent before any of their deltas); nothing unless
    /// the writer shows them.
    fn prompt_logprobs(&mut self, choices: Range<usize>, tokens: Arc<[TokenInfo]>) -> Vec<Bytes> {
        let _ = (choices, tokens);
        Vec::new()
    }
    /// A delta; `None` when there is nothing to send (text held back, no logprobs).
    fn delta(&mut self, index: usize, text: String, tokens: Vec<TokenInfo>) -> Option<Bytes>;
    /// A choice's last chunk, with its finish reason.
    fn finish(&mut self, index: usize, reason: FinishReason) -> Bytes;
    /// The usage chunk, when the client asked for it.
    fn usage(&mut self, usage: Usage) -> Option<Bytes>;
    /// The stream's last frame after a success (OpenAI: `data: [DONE]`).
    fn done(&mut self) -> Option<Bytes> {
        Some(Bytes::from_static(DONE))
    }
    /// The frames of a failure after the headers (OpenAI: an error frame, then `[DONE]`).
    fn error(&mut self, e: &ApiError) -> Vec<Bytes> {
        vec![data_frame(&e.body()), Bytes::from_static(DONE)]
    }
}

/// SSE frames of a generation: everything the writer makes, then `[DONE]`; an error after
/// the headers becomes a `data: {"error": ...}` frame followed by `[DONE]`.
struct Frames<W> {
    generated: MergedStream,
    writer: W,
    queue: VecDeque<Bytes>,
    started: bool,
    ended: bool,
}

impl<W: ChunkWriter> Stream for Frames<W> {
    type Item = Bytes;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        let this = &mut *self;
        loop {
            if let Some(b) = this.queue.pop_front() {
                return Poll::Ready(Some(b));
            }
            if this.ended {
                return Poll::Ready(None);
            }
            if !this.started {
                this.started = true;
                this.queue.extend(this.writer.begin());
                continue;
            }
            match this.generated.poll_next_unpin(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => this.ended = true,
                Poll::Ready(Some(StreamEvent::Delta {
                    choice,
                    text,
                    tokens,
                })) => {
                    this.queue.extend(this.writer.delta(choice, text, tokens));
                }
                Poll::Ready(Some(StreamEvent::PromptLogprobs { choices, tokens })) => {
                    this.queue
                        .extend(this.writer.prompt_logprobs(choices, tokens));
                }
                Poll::Ready(Some(StreamEvent::Finish { choice, reason })) => {
                    this.queue.push_back(this.writer.finish(choice, reason));
                }
                Poll::Ready(Some(StreamEvent::Done { usage, .. })) => {
                    this.queue.extend(this.writer.usage(usage));
                    this.queue.extend(this.writer.done());
                    this.ended = true;
                }
                Poll::Ready(Some(StreamEvent::Error(e))) => {
                    let e = ApiError::from(e);
                    tracing::warn!(error = %e, "request failed after the stream started");
                    this.generated.state().metrics.observe_error(e.error_type());
                    this.queue.extend(this.writer.error(&e));
                    this.ended = true;
                }
            }
        }
    }
}

/// Inserts a keep-alive comment whenever `inner` is quiet for `every`.
struct KeepAlive<S> {
    inner: S,
    every: Duration,
    timer: Pin<Box<Sleep>>,
}

impl<S: Stream<Item = Bytes> + Unpin> Stream for KeepAlive<S> {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        match this.inner.poll_next_unpin(cx) {
            Poll::Ready(item) => {
                let next = Instant::now() + this.every;
                this.timer.as_mut().reset(next);
                Poll::Ready(item.map(Ok))
            }
            Poll::Pending => match this.timer.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    let next = Instant::now() + this.every;
                    this.timer.as_mut().reset(next);
                    Poll::Ready(Some(Ok(Bytes::from_static(KEEP_ALIVE))))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

/// A `text/event-stream` response streaming `generated` through `writer`. When the client goes
/// away actix drops the body, which drops `generated` and aborts the engine requests.
pub fn response<W: ChunkWriter>(
    generated: MergedStream,
    writer: W,
    keep_alive: Duration,
) -> HttpResponse {
    let frames = Frames {
        generated,
        writer,
        queue: VecDeque::new(),
        started: false,
        ended: false,
    };
    let body = KeepAlive {
        inner: frames,
        every: keep_alive,
        timer: Box::pin(sleep(keep_alive)),
    };
    HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header(("Cache-Control", "no-cache"))
        .insert_header(("X-Accel-Buffering", "no"))
        .streaming(body)
}
