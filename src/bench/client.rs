//! A streaming client for OpenAI `/v1/completions` and `/v1/chat/completions` that times
//! every SSE chunk; a bad response becomes a recorded failure, never a panic.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{Map, Value, json};

use super::error::BenchError;
use super::record::{Failure, RequestRecord, SampleInfo, Timer};

/// Largest SSE line or error body read; past it the response counts as bad.
const MAX_LINE_BYTES: usize = 8 << 20;
/// Most bytes of an error body kept.
const MAX_ERROR_BODY: usize = 64 << 10;

/// Which OpenAI route to drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Endpoint {
    /// `/v1/completions` with a text prompt.
    Completions,
    /// `/v1/chat/completions` with the prompt as one user message.
    Chat,
}

impl Endpoint {
    fn path(self) -> &'static str {
        match self {
            Endpoint::Completions => "/v1/completions",
            Endpoint::Chat => "/v1/chat/completions",
        }
    }
}

/// What every request asks for besides its prompt and length.
#[derive(Debug, Clone, Default)]
pub struct RequestParams {
    pub ignore_eos: bool,
    pub temperature: f32,
    /// Merged into each request body last (it may override any field).
    pub extra_body: Map<String, Value>,
}

/// One OpenAI-compatible server and how to call it.
#[derive(Debug, Clone)]
pub struct HttpTarget {
    http: reqwest::Client,
    base_url: String,
    endpoint: Endpoint,
    model: String,
    api_key: Option<String>,
    params: RequestParams,
}

/// An HTTP client with a total per-request timeout, no proxy, and a new connection for every
/// request. Reusing idle keep-alive connections races the server closing them: llama-server
/// (cpp-httplib) drops a connection idle for 5 s, or after 100 requests, and a request sent
/// on it as it closes fails with nothing received ("error sending request"), a failure of
/// the client, not of the server under test. Locally a connection costs well under a
/// millisecond of TTFT.
pub fn http_client(timeout: Duration) -> Result<reqwest::Client, BenchError> {
    reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(Duration::from_secs(10).min(timeout))
        .pool_max_idle_per_host(0)
        .tcp_nodelay(true)
        .no_proxy()
        .build()
        .map_err(|e| BenchError::Invalid {
            flag: "--base-url",
            message: format!("cannot build an HTTP client: {e}"),
        })
}

/// The first model `GET /v1/models` lists.
pub async fn first_model(
    http: &reqwest::Client,
    base_url: &str,
    api_key: Option<&str>,
) -> Result<String, BenchError> {
    let url = format!("{base_url}/v1/models");
    let fail = |message: String| BenchError::Server {
        url: url.clone(),
        message,
    };
    let mut req = http.get(&url);
    if let Some(k) = api_key {
        req = req.bearer_auth(k);
    }
    let res = req.send().await.map_err(|e| fail(e.to_string()))?;
    let status = res.status();
    let v: Value = res
        .json()
        .await
        .map_err(|e| fail(format!("{status}: {e}")))?;
    v.pointer("/data/0/id")
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| fail(format!("{status}: no model listed; pass --model")))
}

impl HttpTarget {
    /// A target at `base_url` (no trailing slash needed).
    pub fn new(
        http: reqwest::Client,
        base_url: &str,
        endpoint: Endpoint,
        model: String,
        api_key: Option<String>,
        params: RequestParams,
    ) -> Self {
        let base_url = base_url.trim_end_matches('/').to_string();
        Self {
            http,
            base_url,
            endpoint,
            model,
            api_key,
            params,
        }
    }

    /// The JSON body of a streaming request.
    pub fn body(&self, prompt: &str, max_tokens: usize) -> Value {
        let mut body = json!({
            "model": self.model,
            "max_tokens": max_tokens,
            "temperature": self.params.temperature,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        match self.endpoint {
            Endpoint::Completions => body["prompt"] = json!(prompt),
            Endpoint::Chat => body["messages"] = json!([{"role": "user", "content": prompt}]),
        }
        if self.params.ignore_eos {
            body["ignore_eos"] = json!(true);
        }
        if let Value::Object(m) = &mut body {
            m.extend(self.params.extra_body.clone());
        }
        body
    }

    /// Sends one request and measures it; timing starts when this future is first polled.
    pub async fn send(&self, info: SampleInfo, prompt: &str, run_start: Instant) -> RequestRecord {
        let body = self.body(prompt, info.requested_output_tokens);
        let mut timer = Timer::start(run_start);
        let mut req = self
            .http
            .post(format!("{}{}", self.base_url, self.endpoint.path()))
            .json(&body);
        if let Some(k) = &self.api_key {
            req = req.bearer_auth(k);
        }
        let mut state = StreamState::default();
        let error = match req.send().await {
            Err(e) => Some(transport_failure(&e)),
            Ok(res) if !res.status().is_success() => Some(status_failure(res).await),
            Ok(res) => read_stream(res, &mut timer, &mut state).await.err(),
        };
        timer.finish(info, state.usage, error)
    }
}

/// What the stream said besides text.
#[derive(Debug, Default)]
struct StreamState {
    usage: Option<(usize, usize)>,
    done: bool,
    finished: bool,
}

fn transport_failure(e: &reqwest::Error) -> Failure {
    let kind = if e.is_timeout() {
        "timeout"
    } else if e.is_connect() {
        "connect"
    } else if e.is_body() || e.is_decode() {
        "stream_error"
    } else {
        "request"
    };
    Failure::new(kind, e.to_string())
}

async fn status_failure(res: reqwest::Response) -> Failure {
    let status = res.status();
    let mut body = Vec::new();
    let mut stream = res.bytes_stream();
    while let Some(Ok(b)) = stream.next().await {
        body.extend_from_slice(&b);
        if body.len() > MAX_ERROR_BODY {
            break;
        }
    }
    let text = String::from_utf8_lossy(&body);
    let typed = serde_json::from_str::<Value>(&text)
        .ok()
        .and_then(|v| error_type(&v));
    Failure::new(
        typed.unwrap_or_else(|| format!("http_{}", status.as_u16())),
        format!("{status}: {text}"),
    )
}

/// The OpenAI `error.type` of an error body or frame (`server_error` when untyped).
fn error_type(v: &Value) -> Option<String> {
    let e = v.get("error")?;
    let t = e
        .get("type")
        .and_then(Value::as_str)
        .or_else(|| e.get("code").and_then(Value::as_str));
    Some(t.unwrap_or("server_error").to_string())
}

async fn read_stream(
    res: reqwest::Response,
    timer: &mut Timer,
    state: &mut StreamState,
) -> Result<(), Failure> {
    let mut lines = SseLines::default();
    let mut stream = res.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| transport_failure(&e))?;
        let at = Instant::now();
        lines.push(&chunk);
        while let Some(data) = lines.next_data()? {
            on_event(&data, at, timer, state)?;
            if state.done {
                return Ok(());
            }
        }
    }
    if let Some(data) = lines.finish() {
        on_event(&data, Instant::now(), timer, state)?;
    }
    if state.done || state.finished {
        Ok(())
    } else {
        Err(Failure::new(
            "incomplete_stream",
            format!(
                "the stream ended without [DONE] after {} chunks",
                timer.chunks()
            ),
        ))
    }
}

/// Handles one `data:` payload.
fn on_event(
    data: &str,
    at: Instant,
    timer: &mut Timer,
    state: &mut StreamState,
) -> Result<(), Failure> {
    if data.trim() == "[DONE]" {
        state.done = true;
        return Ok(());
    }
    let v: Value = serde_json::from_str(data)
        .map_err(|e| Failure::new("bad_response", format!("{e}: {data}")))?;
    if let Some(kind) = error_type(&v) {
        return Err(Failure::new(kind, data));
    }
    if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
        let n = |k: &str| u.get(k).and_then(Value::as_u64).map(|n| n as usize);
        if let (Some(p), Some(c)) = (n("prompt_tokens"), n("completion_tokens")) {
            state.usage = Some((p, c));
        }
    }
    let mut has_text = false;
    for c in v
        .get("choices")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        let text = c
            .get("text")
            .or_else(|| c.pointer("/delta/content"))
            .or_else(|| c.pointer("/delta/reasoning_content"))
            .and_then(Value::as_str);
        has_text |= text.is_some_and(|t| !t.is_empty());
        state.finished |= c.get("finish_reason").is_some_and(|r| !r.is_null());
    }
    if has_text {
        timer.chunk(at);
    }
    Ok(())
}

/// Splits an SSE byte stream into `data` payloads (multi-line data joined with `\n`; comments,
/// other fields and CRLF handled), buffering partial lines and UTF-8 across network chunks.
/// Each byte is scanned once; consumed bytes are dropped when half the buffer is consumed.
#[derive(Debug, Default)]
pub struct SseLines {
    buf: Vec<u8>,
    /// Start of the unconsumed bytes.
    start: usize,
    /// Bytes before this hold no newline past `start`.
    scanned: usize,
    data: Option<String>,
}

impl SseLines {
    /// Appends received bytes.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.start > 0 && self.start * 2 >= self.buf.len() {
            self.buf.drain(..self.start);
            self.scanned -= self.start;
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete event's data, `Ok(None)` when more bytes are needed, or a failure for
    /// a line or event past the size limit.
    pub fn next_data(&mut self) -> Result<Option<String>, Failure> {
        loop {
            let from = self.scanned.max(self.start);
            let Some(nl) = self.buf[from..].iter().position(|&b| b == b'\n') else {
                self.scanned = self.buf.len();
                if self.buf.len() - self.start > MAX_LINE_BYTES {
                    return Err(too_long());
                }
                return Ok(None);
            };
            let mut end = from + nl;
            let line_start = self.start;
            self.start = end + 1;
            self.scanned = self.start;
            if end > line_start && self.buf[end - 1] == b'\r' {
                end -= 1;
            }
            if end == line_start {
                if let Some(d) = self.data.take() {
                    return Ok(Some(d));
                }
                continue;
            }
            let line = String::from_utf8_lossy(&self.buf[line_start..end]);
            if let Some(rest) = line.strip_prefix("data:") {
                let rest = rest.strip_prefix(' ').unwrap_or(rest);
                match &mut self.data {
                    Some(d) if d.len() + rest.len() > MAX_LINE_BYTES => return Err(too_long()),
                    Some(d) => {
                        d.push('\n');
                        d.push_str(rest);
                    }
                    None => self.data = Some(rest.to_string()),
                }
            }
        }
    }

    /// Data left when the stream ends without a final blank line.
    pub fn finish(&mut self) -> Option<String> {
        let rest = String::from_utf8_lossy(&self.buf[self.start..]).into_owned();
        self.buf.clear();
        (self.start, self.scanned) = (0, 0);
        if let Some(d) = rest.trim_end().strip_prefix("data:") {
            let d = d.strip_prefix(' ').unwrap_or(d);
            return Some(match self.data.take() {
                Some(prev) => format!("{prev}\n{d}"),
                None => d.to_string(),
            });
        }
        self.data.take()
    }
}

fn too_long() -> Failure {
    Failure::new(
        "bad_response",
        format!("an SSE event exceeds {MAX_LINE_BYTES} bytes"),
    )
}
