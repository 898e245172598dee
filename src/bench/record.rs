//! What one benchmark request measured, and how it failed if it did.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// Why a request failed; `kind` is a stable label (the OpenAI `error.type` for server errors).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    /// `connect`, `timeout`, `http_<status>`, `bad_response`, `incomplete_stream`, an
    /// OpenAI `error.type` such as `invalid_request_error`, or an engine error label offline.
    pub kind: String,
    /// Human-readable detail (truncated).
    pub message: String,
}

impl Failure {
    /// Most message characters kept.
    pub const MAX_MESSAGE: usize = 500;

    /// A failure with `message` truncated to [`Failure::MAX_MESSAGE`] characters.
    pub fn new(kind: impl Into<String>, message: impl AsRef<str>) -> Self {
        let message = message.as_ref().chars().take(Self::MAX_MESSAGE).collect();
        Self {
            kind: kind.into(),
            message,
        }
    }
}

/// One request's measurements. Latencies in milliseconds; `start_ms` from the bench start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestRecord {
    /// Position in the workload.
    pub index: usize,
    /// When the request was sent, from the start of the run.
    pub start_ms: f64,
    /// Send to the first chunk carrying output; `None` when no output arrived.
    pub ttft_ms: Option<f64>,
    /// Gaps between consecutive chunks carrying output.
    pub itl_ms: Vec<f64>,
    /// (e2e − TTFT) / (output tokens − 1); `None` with fewer than two output tokens.
    pub tpot_ms: Option<f64>,
    /// Send to the end of the stream.
    pub e2e_ms: f64,
    /// From `usage`, else the workload's prompt length (0 when unknown).
    pub prompt_tokens: usize,
    /// From `usage`, else the number of chunks carrying output.
    pub output_tokens: usize,
    /// Whether the counts came from the server's (or engine's) `usage`.
    pub usage_reported: bool,
    /// The prompt length the workload measured with its tokenizer, if it did.
    pub expected_prompt_tokens: Option<usize>,
    /// `max_tokens` sent.
    pub requested_output_tokens: usize,
    /// Set when the request failed; failed requests count in no latency or throughput figure.
    pub error: Option<Failure>,
}

impl RequestRecord {
    /// Whether the request succeeded.
    pub fn ok(&self) -> bool {
        self.error.is_none()
    }

    /// Times (ms from the run start) at which output chunks arrived.
    pub fn chunk_times_ms(&self) -> Vec<f64> {
        let Some(ttft) = self.ttft_ms else {
            return Vec::new();
        };
        let mut t = self.start_ms + ttft;
        let mut out = vec![t];
        for gap in &self.itl_ms {
            t += gap;
            out.push(t);
        }
        out
    }
}

/// Collects one request's timings as chunks arrive, then builds its record.
#[derive(Debug)]
pub struct Timer {
    run_start: Instant,
    sent: Instant,
    first: Option<Instant>,
    last: Option<Instant>,
    itl_ms: Vec<f64>,
    chunks: usize,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

impl Timer {
    /// Starts timing a request sent now.
    pub fn start(run_start: Instant) -> Self {
        Self {
            run_start,
            sent: Instant::now(),
            first: None,
            last: None,
            itl_ms: Vec::new(),
            chunks: 0,
        }
    }

    /// Notes a chunk carrying output that arrived at `at`.
    pub fn chunk(&mut self, at: Instant) {
        if let Some(prev) = self.last {
            self.itl_ms.push(ms(at.saturating_duration_since(prev)));
        } else {
            self.first = Some(at);
        }
        self.last = Some(at);
        self.chunks += 1;
    }

    /// Chunks carrying output so far.
    pub fn chunks(&self) -> usize {
        self.chunks
    }

    /// The record of a request that ended now. `usage` is `(prompt, output)` tokens when the
    /// server reported them; otherwise the output count is the number of chunks.
    pub fn finish(
        self,
        sample: SampleInfo,
        usage: Option<(usize, usize)>,
        error: Option<Failure>,
    ) -> RequestRecord {
        let end = Instant::now();
        let e2e_ms = ms(end.saturating_duration_since(self.sent));
        let ttft_ms = self
            .first
            .map(|f| ms(f.saturating_duration_since(self.sent)));
        let (prompt_tokens, output_tokens) =
            usage.unwrap_or((sample.expected_prompt_tokens.unwrap_or(0), self.chunks));
        let tpot_ms = match (ttft_ms, output_tokens) {
            (Some(t), n) if n > 1 && error.is_none() => {
                Some((e2e_ms - t).max(0.0) / (n - 1) as f64)
            }
            _ => None,
        };
        RequestRecord {
            index: sample.index,
            start_ms: ms(self.sent.saturating_duration_since(self.run_start)),
            ttft_ms,
            itl_ms: self.itl_ms,
            tpot_ms,
            e2e_ms,
            prompt_tokens,
            output_tokens,
            usage_reported: usage.is_some(),
            expected_prompt_tokens: sample.expected_prompt_tokens,
            requested_output_tokens: sample.requested_output_tokens,
            error,
        }
    }
}

/// What a record needs to know about the workload item it measured.
#[derive(Debug, Clone, Copy)]
pub struct SampleInfo {
    /// Position in the workload.
    pub index: usize,
    /// Prompt tokens as the workload counted them.
    pub expected_prompt_tokens: Option<usize>,
    /// `max_tokens` to send.
    pub requested_output_tokens: usize,
}
