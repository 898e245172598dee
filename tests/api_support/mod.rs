//! Shared helpers of the `api_*` integration tests: a real server on an ephemeral port with
//! the stories260K fixture, and small HTTP/SSE clients.
#![allow(dead_code)]

use std::net::TcpListener;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use actix_web::web::Data;
use futures_util::StreamExt;
use kiln::api::{AppState, Server};
use kiln::backend::cpu::CpuBackend;
use kiln::config::Config;
use kiln::engine::{Device, Engine};
use kiln::generate::{GenerateOptions, SingleGenerator};
use kiln::model::{LoadFormat, ModelFiles};
use kiln::sampling::SamplingParams;
use kiln::tokenizer::IncrementalDecoder;
use serde_json::Value;

/// A server and the engine behind it; both stop when the process exits.
pub struct TestServer {
    pub base: String,
    pub state: Data<AppState>,
    pub server: Server,
    pub engine: Engine,
}

/// The configuration tests start from: a small KV pool, two HTTP workers.
pub fn test_config() -> Config {
    let mut cfg = Config::default();
    cfg.server.workers = 2;
    cfg.engine.kv_blocks = Some(1024);
    cfg.engine.max_num_seqs = 32;
    cfg
}

/// Opens the fixture model.
pub fn model_files() -> ModelFiles {
    ModelFiles::open(&kiln::config::default_model_path(), LoadFormat::Auto).expect("fixture model")
}

/// Starts a server with `cfg` (host and port are ignored: 127.0.0.1:0).
pub fn start(cfg: Config) -> TestServer {
    start_with(model_files(), cfg)
}

/// [`start`] serving `files`.
pub fn start_with(files: ModelFiles, cfg: Config) -> TestServer {
    let engine = Engine::start(files, &[Device::Cpu], cfg.engine.clone()).expect("engine");
    let state = Data::new(AppState::new(cfg));
    state.set_engine(engine.client()).expect("set engine");
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let server = Server::start(state.clone(), listener).expect("server");
    TestServer {
        base: format!("http://{}", server.addr()),
        state,
        server,
        engine,
    }
}

/// One server shared by the tests of a binary that need no special configuration.
pub fn shared() -> &'static TestServer {
    static SERVER: OnceLock<TestServer> = OnceLock::new();
    SERVER.get_or_init(|| start(test_config()))
}

/// A client with a generous timeout.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("client")
}

/// POSTs JSON; returns status, headers and the parsed body (Null if not JSON).
pub async fn post(
    base: &str,
    path: &str,
    body: &Value,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let res = client()
        .post(format!("{base}{path}"))
        .json(body)
        .send()
        .await
        .expect("send");
    let status = res.status().as_u16();
    let headers = res.headers().clone();
    let text = res.text().await.expect("body");
    (
        status,
        headers,
        serde_json::from_str(&text).unwrap_or(Value::Null),
    )
}

/// POSTs raw bytes with a JSON content type.
pub async fn post_raw(base: &str, path: &str, body: impl Into<reqwest::Body>) -> (u16, Value) {
    let res = client()
        .post(format!("{base}{path}"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("send");
    let status = res.status().as_u16();
    let text = res.text().await.expect("body");
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// GETs a path; returns status and the body text.
pub async fn get(base: &str, path: &str) -> (u16, String) {
    let res = client()
        .get(format!("{base}{path}"))
        .send()
        .await
        .expect("send");
    (res.status().as_u16(), res.text().await.expect("body"))
}

/// A streamed response split into its SSE frames: the `data:` payloads in order and the
/// raw text (for keep-alive comments).
pub struct Sse {
    pub status: u16,
    pub content_type: String,
    pub data: Vec<String>,
    pub raw: String,
}

impl Sse {
    /// The JSON chunks (every `data:` frame except `[DONE]`).
    pub fn chunks(&self) -> Vec<Value> {
        self.data
            .iter()
            .filter(|d| d.as_str() != "[DONE]")
            .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("bad chunk {d:?}: {e}")))
            .collect()
    }
}

/// POSTs a streaming request and reads the whole event stream.
pub async fn stream(base: &str, path: &str, body: &Value) -> Sse {
    let res = client()
        .post(format!("{base}{path}"))
        .json(body)
        .send()
        .await
        .expect("send");
    let status = res.status().as_u16();
    let content_type = res
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let mut raw = Vec::new();
    let mut body = res.bytes_stream();
    while let Some(chunk) = body.next().await {
        raw.extend_from_slice(&chunk.expect("chunk"));
    }
    let raw = String::from_utf8(raw).expect("utf-8 stream");
    let data = raw
        .split("\n\n")
        .filter_map(|frame| frame.strip_prefix("data: "))
        .map(str::to_string)
        .collect();
    Sse {
        status,
        content_type,
        data,
        raw,
    }
}

/// `kiln generate`'s greedy text for `prompt` (BOS added, EOS stops and is not shown).
pub fn greedy_reference(prompt: &str, max_tokens: usize) -> String {
    let files = model_files();
    let tok = files.tokenizer.clone().expect("tokenizer");
    let ids = tok.encode(prompt, tok.add_bos_default()).expect("encode");
    greedy_reference_ids(&files, &ids, max_tokens)
}

/// Greedy text continuing `ids`, decoded the way `kiln generate` prints it.
pub fn greedy_reference_ids(files: &ModelFiles, ids: &[u32], max_tokens: usize) -> String {
    let tok = files.tokenizer.clone().expect("tokenizer");
    let mut generator =
        SingleGenerator::new(CpuBackend::new(), files, ids.len() + max_tokens, 512, 16)
            .expect("generator");
    let opts = GenerateOptions {
        max_tokens,
        params: SamplingParams::greedy(),
        stop_ids: tok.eos_ids().to_vec(),
        chunk: 512,
        block_size: 16,
        record_logits: 0,
    };
    let out = generator.generate(ids, &opts, |_| {}).expect("generate");
    let mut decoder = IncrementalDecoder::with_prompt(&tok, ids, true);
    let mut text = String::new();
    for id in out.token_ids.iter().filter(|t| !tok.eos_ids().contains(t)) {
        text.push_str(&decoder.push(*id).expect("decode"));
    }
    text + &decoder.finish()
}

/// The value of an unlabelled sample in Prometheus text, if present.
pub fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Polls `/metrics` until `pred` holds (or `timeout` passes); returns the last text.
pub async fn wait_metrics(base: &str, timeout: Duration, pred: impl Fn(&str) -> bool) -> String {
    let start = Instant::now();
    loop {
        let (_, text) = get(base, "/metrics").await;
        if pred(&text) || start.elapsed() > timeout {
            return text;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Asserts an OpenAI error body with this status, type and param.
pub fn assert_error(
    status: u16,
    body: &Value,
    want_status: u16,
    want_type: &str,
    want_param: Option<&str>,
) {
    assert_eq!(status, want_status, "status for body {body}");
    let e = &body["error"];
    assert!(
        e["message"].as_str().is_some_and(|m| !m.is_empty()),
        "message in {body}"
    );
    assert_eq!(e["type"], want_type, "type in {body}");
    assert!(e["code"].is_string(), "string code in {body}");
    match want_param {
        Some(p) => assert_eq!(e["param"], p, "param in {body}"),
        None => assert!(e["param"].is_null(), "null param in {body}"),
    }
}
