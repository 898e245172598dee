//! Hostile and careless clients (issue 14): client counts that would wrap, outputs larger than
//! a stream's buffer, and clients that never read their stream.

mod api_support;

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use api_support::*;
use serde_json::{Value, json};

const C: &str = "/v1/completions";
const CHAT: &str = "/v1/chat/completions";
const HUGE: [u64; 2] = [u64::MAX, u64::MAX - 1];

fn chat_body(field: &str, v: u64) -> Value {
    let mut body = json!({"messages": [{"role": "user", "content": "Hi"}]});
    body[field] = json!(v);
    body
}

/// Every lane idle with its whole KV pool free.
async fn wait_idle(s: &TestServer, timeout: Duration) -> bool {
    let client = s.engine.client();
    let start = std::time::Instant::now();
    while start.elapsed() < timeout {
        let st = client.stats();
        if st.running() == 0
            && st.waiting() == 0
            && st
                .lanes
                .iter()
                .all(|l| l.kv_free_blocks == l.kv_total_blocks)
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

#[tokio::test]
async fn max_tokens_near_u64_max_is_refused_on_completions_and_chat() {
    let s = shared();
    for v in HUGE {
        let (status, _, body) = post(&s.base, C, &json!({"prompt": "Once", "max_tokens": v})).await;
        assert_error(
            status,
            &body,
            400,
            "invalid_request_error",
            Some("max_tokens"),
        );
        for field in ["max_tokens", "max_completion_tokens"] {
            let (status, _, body) = post(&s.base, CHAT, &chat_body(field, v)).await;
            assert_eq!(status, 400, "{field} = {v}: {body}");
            assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
        }
    }
    let (status, _, body) = post(&s.base, C, &json!({"prompt": "Once", "max_tokens": 3})).await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test]
async fn a_pool_smaller_than_the_context_refuses_what_cannot_fit_and_keeps_serving() {
    let mut cfg = test_config();
    cfg.engine.kv_blocks = Some(64); // 1,024 tokens; the context holds 2,048
    let s = start(cfg);
    for v in HUGE {
        let (status, _, body) = post(&s.base, C, &json!({"prompt": "Once", "max_tokens": v})).await;
        assert_error(
            status,
            &body,
            400,
            "invalid_request_error",
            Some("max_tokens"),
        );
        let (status, _, body) = post(&s.base, CHAT, &chat_body("max_tokens", v)).await;
        assert_eq!(status, 400, "{body}");
    }
    let (status, _, body) = post(&s.base, C, &json!({"prompt": "Once", "max_tokens": 1500})).await;
    assert_error(
        status,
        &body,
        400,
        "invalid_request_error",
        Some("max_tokens"),
    );
    let (status, _, body) = post(&s.base, C, &json!({"prompt": "Once", "max_tokens": 8})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(get(&s.base, "/health").await.0, 200);
    assert!(
        wait_idle(&s, Duration::from_secs(10)).await,
        "nothing left waiting"
    );
}

/// Per-choice texts and the completion token count of a non-streamed response.
fn texts_of(body: &Value) -> (Vec<String>, u64) {
    let texts = body["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["text"].as_str().unwrap().to_string())
        .collect();
    (texts, body["usage"]["completion_tokens"].as_u64().unwrap())
}

#[tokio::test]
async fn outputs_larger_than_the_stream_buffer_lose_no_tokens() {
    let mut cfg = test_config();
    cfg.engine.stream_buffer_events = 4;
    let s = start(cfg);
    let (status, _, body) = post(
        &s.base,
        C,
        &json!({"prompt": "Once", "n": 16, "logprobs": 20, "max_tokens": u64::MAX}),
    )
    .await;
    assert_error(
        status,
        &body,
        400,
        "invalid_request_error",
        Some("max_tokens"),
    );
    let (n, m) = (16, 120);
    let req = json!({"prompt": "Once", "n": n, "logprobs": 20, "max_tokens": m,
                     "temperature": 1.0, "seed": 5, "ignore_eos": true});
    let (status, _, body) = post(&s.base, C, &req).await;
    assert_eq!(status, 200, "{body}");
    let (want, count) = texts_of(&body);
    assert_eq!(count, (n * m) as u64);
    let mut streamed = req.clone();
    streamed["stream"] = json!(true);
    let sse = stream(&s.base, C, &streamed).await;
    assert_eq!(sse.status, 200);
    let mut got = vec![String::new(); n];
    let mut tokens = vec![0usize; n];
    for c in sse.chunks() {
        assert!(c.get("error").is_none(), "{c}");
        for ch in c["choices"].as_array().unwrap() {
            let i = ch["index"].as_u64().unwrap() as usize;
            got[i].push_str(ch["text"].as_str().unwrap());
            tokens[i] += ch["logprobs"]["tokens"].as_array().map_or(0, Vec::len);
        }
    }
    assert_eq!(tokens, vec![m; n], "every choice streamed all its tokens");
    assert_eq!(got, want, "same seed, same text streamed or not");
}

/// Sends a streaming request on a raw socket and never reads the answer.
fn non_reading_stream(base: &str, body: &Value) -> TcpStream {
    let addr = base.trim_start_matches("http://");
    let mut sock = TcpStream::connect(addr).unwrap();
    let body = body.to_string();
    write!(
        sock,
        "POST {C} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    sock.flush().unwrap();
    sock
}

#[tokio::test]
async fn streams_whose_clients_never_read_are_aborted() {
    let mut cfg = test_config();
    cfg.engine.stream_buffer_events = 8;
    cfg.engine.stream_stall_timeout_s = 0.5;
    let s = start(cfg);
    let holder = json!({"prompt": "Once", "n": 16, "logprobs": 20, "max_tokens": 2000,
                        "ignore_eos": true, "stream": true});
    let socks: Vec<TcpStream> = (0..3)
        .map(|_| non_reading_stream(&s.base, &holder))
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(s.engine.client().stats().running() > 0, "the holders run");
    let (status, _, body) = post(&s.base, C, &json!({"prompt": "Once", "max_tokens": 8})).await;
    assert_eq!(status, 200, "a reading client is served meanwhile: {body}");
    assert!(
        wait_idle(&s, Duration::from_secs(20)).await,
        "stalled streams are aborted and their blocks freed: {:?}",
        s.engine.client().stats()
    );
    drop(socks);
    let text = wait_metrics(&s.base, Duration::from_secs(10), |t| {
        metric(t, "kiln_http_requests_client_disconnected_total").unwrap_or(0.0) >= 3.0
    })
    .await;
    assert_eq!(
        metric(&text, "kiln_http_requests_client_disconnected_total"),
        Some(3.0),
        "{text}"
    );
}

/// A model whose context is faked to 128k tokens: its byte bound lets multi-megabyte prompts
/// through, so tokenizing must stop once the count passes the context.
#[tokio::test]
async fn long_context_prompts_stop_tokenizing_past_the_limit() {
    const CONTEXT: usize = 131_072;
    let path = kiln::config::project_root().join("../shared/models/llama-2-tiny-random.gguf");
    let mut files = kiln::model::ModelFiles::open(&path, kiln::model::LoadFormat::Gguf).unwrap();
    files.spec.max_position = CONTEXT;
    let tok = files.tokenizer.clone().expect("tokenizer");
    let mut cfg = test_config();
    cfg.engine.max_model_len = Some(CONTEXT);
    let s = start_with(files, cfg);
    assert_eq!(s.engine.client().max_model_len(), CONTEXT);
    // ~1.2 M tokens in 3 MB: under the byte bound, nine times the context.
    let text = "ab ".repeat(1_000_000);
    assert!(
        text.len() <= tok.max_text_bytes(CONTEXT),
        "the byte bound ({}) lets it through",
        tok.max_text_bytes(CONTEXT)
    );
    let cases = [
        (C, json!({"prompt": text, "max_tokens": 1}), "prompt"),
        (
            CHAT,
            json!({"messages": [{"role": "user", "content": text}], "max_tokens": 1}),
            "messages",
        ),
        ("/tokenize", json!({"prompt": text}), "prompt"),
    ];
    // Tokens of "ab " repeated: what the refused count may reach.
    let per_repeat = tok.encode(&"ab ".repeat(1000), false).unwrap().len() as f64 / 1000.0;
    let most_bytes =
        (CONTEXT as f64 / per_repeat * 3.0) as u64 + 2 * kiln::tokenizer::COUNT_CHUNK_BYTES as u64;
    for (path, body, param) in &cases {
        let before = tok.bytes_tokenized();
        let (status, _, body) = post(&s.base, path, body).await;
        assert_error(status, &body, 400, "invalid_request_error", Some(param));
        assert_eq!(body["error"]["code"], "context_length_exceeded", "{path}");
        let seen = tok.bytes_tokenized() - before;
        assert!(
            seen <= most_bytes && seen < text.len() as u64 / 4,
            "{path}: the tokenizer saw {seen} bytes of {} (at most {most_bytes} expected)",
            text.len()
        );
    }
    // Within the limit: counted, then tokenized whole, the same ids as a plain encode.
    let fits = "ab ".repeat(40_000);
    let (status, _, body) = post(&s.base, "/tokenize", &json!({"prompt": fits})).await;
    assert_eq!(status, 200, "{body}");
    let want = tok.encode(&fits, tok.add_bos_default()).unwrap();
    let got: Vec<u32> = serde_json::from_value(body["tokens"].clone()).unwrap();
    assert_eq!(got, want);
}

/// Polls the in-flight gauge of `/metrics` (exempt, so reading it takes no place) until it
/// reads `want`.
async fn wait_in_flight(base: &str, want: f64) {
    let text = wait_metrics(base, Duration::from_secs(20), |t| {
        metric(t, "kiln_http_requests_in_flight") == Some(want)
    })
    .await;
    assert_eq!(
        metric(&text, "kiln_http_requests_in_flight"),
        Some(want),
        "{text}"
    );
}

#[tokio::test]
async fn past_max_in_flight_requests_get_503_at_once_and_places_free_when_streams_end() {
    let mut cfg = test_config();
    cfg.server.max_in_flight = 2;
    cfg.engine.stream_buffer_events = 8;
    cfg.engine.stream_stall_timeout_s = 120.0;
    let s = start(cfg);
    assert_eq!(s.state.in_flight.cap(), 2);
    // Two streams whose clients never read: they stay in flight until their clients leave.
    let holder = json!({"prompt": "Once", "n": 16, "logprobs": 20, "max_tokens": 2000,
                        "ignore_eos": true, "stream": true});
    let mut held: Vec<TcpStream> = (0..2)
        .map(|_| non_reading_stream(&s.base, &holder))
        .collect();
    wait_in_flight(&s.base, 2.0).await;

    let short = json!({"prompt": "Once", "max_tokens": 4});
    let t0 = std::time::Instant::now();
    let (status, headers, body) = post(&s.base, C, &short).await;
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "refused at once, not queued"
    );
    assert_error(status, &body, 503, "server_overloaded", None);
    assert_eq!(body["error"]["code"], "max_in_flight_exceeded", "{body}");
    assert_eq!(headers.get("retry-after").unwrap(), "1");
    let mut streamed = short.clone();
    streamed["stream"] = json!(true);
    let (status, headers, body) = post(
        &s.base,
        CHAT,
        &json!({
        "messages": [{"role": "user", "content": "Hi"}], "stream": true}),
    )
    .await;
    assert_error(status, &body, 503, "server_overloaded", None);
    assert!(headers.get("retry-after").is_some());
    assert_eq!(
        get(&s.base, "/v1/models").await.0,
        503,
        "every counted route"
    );
    assert_eq!(get(&s.base, "/health").await.0, 200, "monitoring is exempt");
    let (status, text) = get(&s.base, "/metrics").await;
    assert_eq!(status, 200);
    assert_eq!(
        metric(&text, "kiln_http_requests_overloaded_total"),
        Some(3.0),
        "{text}"
    );
    assert_eq!(
        metric(&text, "kiln_http_requests_in_flight"),
        Some(2.0),
        "refusals take no place"
    );

    // A client that leaves mid-stream frees its place.
    drop(held.pop());
    wait_in_flight(&s.base, 1.0).await;
    let (status, _, body) = post(&s.base, C, &short).await;
    assert_eq!(status, 200, "{body}");
    // Streams read to their end free their place before the client sees the end: one free
    // place serves request after request.
    for _ in 0..3 {
        let sse = stream(&s.base, C, &streamed).await;
        assert_eq!(sse.status, 200);
        assert_eq!(sse.data.last().map(String::as_str), Some("[DONE]"));
        let (status, _, body) = post(&s.base, C, &short).await;
        assert_eq!(status, 200, "{body}");
    }
    drop(held);
    wait_in_flight(&s.base, 0.0).await;
    let (a, b) = tokio::join!(stream(&s.base, C, &streamed), post(&s.base, C, &short));
    assert_eq!((a.status, b.0), (200, 200), "both places free again");
}

/// The body of a raw `Transfer-Encoding: chunked` response read to its close.
fn dechunk(raw: &[u8]) -> String {
    let text = String::from_utf8_lossy(raw);
    let Some((_, mut rest)) = text.split_once("\r\n\r\n") else {
        return String::new();
    };
    let mut body = String::new();
    while let Some((size, after)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || after.len() < n {
            break;
        }
        body.push_str(&after[..n]);
        rest = after[n..].strip_prefix("\r\n").unwrap_or(&after[n..]);
    }
    body
}

/// Each choice's streamed text, from an SSE body of completion chunks.
fn streamed_texts(body: &str, n: usize) -> Vec<String> {
    let mut texts = vec![String::new(); n];
    for data in body.lines().filter_map(|l| l.strip_prefix("data: ")) {
        if data == "[DONE]" {
            continue;
        }
        let chunk: Value = serde_json::from_str(data).unwrap_or_else(|e| panic!("{data}: {e}"));
        assert!(chunk.get("error").is_none(), "{chunk}");
        for ch in chunk["choices"].as_array().unwrap() {
            texts[ch["index"].as_u64().unwrap() as usize].push_str(ch["text"].as_str().unwrap());
        }
    }
    texts
}

#[tokio::test]
async fn non_reading_streams_give_their_seats_back_and_finish_correctly_when_read() {
    let mut cfg = test_config();
    cfg.engine.max_num_seqs = 8;
    cfg.engine.stream_buffer_events = 8;
    cfg.engine.stream_stall_timeout_s = 120.0;
    let s = start(cfg);
    let holder = json!({"prompt": "Once upon a time", "n": 4, "logprobs": 20, "max_tokens": 400,
                        "ignore_eos": true, "temperature": 0, "stream": true});
    let mut want_body = holder.clone();
    want_body["stream"] = json!(false);
    let (status, _, want) = post(&s.base, C, &want_body).await;
    assert_eq!(status, 200, "{want}");
    let want: Vec<String> = (0..4)
        .map(|i| want["choices"][i]["text"].as_str().unwrap().to_string())
        .collect();
    // 20 clients that read nothing ask for 80 sequences of a lane with 8 seats.
    let socks: Vec<TcpStream> = (0..20)
        .map(|_| non_reading_stream(&s.base, &holder))
        .collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let t0 = std::time::Instant::now();
    let (status, _, body) = post(&s.base, C, &json!({"prompt": "Once", "max_tokens": 8})).await;
    let waited = t0.elapsed();
    assert_eq!(status, 200, "{body}");
    assert!(
        waited < Duration::from_secs(5),
        "a reading client waited {waited:?}"
    );
    let preempted: u64 = s
        .engine
        .client()
        .stats()
        .lanes
        .iter()
        .map(|l| l.preemptions)
        .sum();
    assert!(preempted > 0, "paused streams were shed");
    // The non-readers read at last: every one gets all of its greedy output, unchanged.
    let bodies = tokio::task::spawn_blocking(move || {
        socks
            .into_iter()
            .map(|mut sock| {
                use std::io::Read;
                sock.set_read_timeout(Some(Duration::from_secs(120)))
                    .unwrap();
                let (mut raw, mut buf) = (Vec::new(), [0u8; 65536]);
                // Until the last chunk (the connection stays open for keep-alive).
                while !raw.ends_with(b"\r\n0\r\n\r\n") {
                    match sock.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => raw.extend_from_slice(&buf[..n]),
                    }
                }
                dechunk(&raw)
            })
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    for body in &bodies {
        assert!(body.trim_end().ends_with("data: [DONE]"), "complete stream");
        assert_eq!(streamed_texts(body, 4), want);
    }
    assert!(wait_idle(&s, Duration::from_secs(10)).await);
}
