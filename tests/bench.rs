//! `kiln bench`: timing against a deliberately slowed fake OpenAI server, bad responses as
//! recorded failures, report consistency, `--offline` on the fixture, and runs of the
//! `kiln` binary against a real in-process Kiln server.

use std::net::TcpListener;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use actix_web::dev::ServerHandle;
use actix_web::web::{self, Bytes};
use actix_web::{App, HttpResponse, HttpServer};
use futures_util::stream;
use kiln::bench::client::SseLines;
use kiln::bench::dataset::{self, DatasetSpec, LenRange, TokenCounter};
use kiln::bench::report::percentile;
use kiln::bench::{BenchArgs, Failure, Report, RequestRecord, Stats, Summary};
use serde_json::{Value, json};

// ---------------------------------------------------------------- fake server

/// Injected delays of the fake server.
const TTFT: Duration = Duration::from_millis(150);
const GAP: Duration = Duration::from_millis(60);
const CHUNKS: usize = 6;
const FAKE_PROMPT_TOKENS: usize = 7;

fn frame(v: Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

fn text_chunk(chat: bool, text: &str) -> Value {
    if chat {
        json!({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": null}]})
    } else {
        json!({"choices": [{"index": 0, "text": text, "finish_reason": null}]})
    }
}

/// What the fake server sends, by `model`: `slow` (the timed stream), `http500`, `garbage`
/// (non-JSON data), `cut` (no `[DONE]`), `midstream` (an error frame after a chunk), `hang`
/// (one chunk, then nothing for an hour).
async fn fake(body: web::Json<Value>, chat: bool) -> HttpResponse {
    let model = body["model"].as_str().unwrap_or("slow").to_string();
    if model == "http500" {
        return HttpResponse::InternalServerError()
            .json(json!({"error": {"message": "boom", "type": "server_error"}}));
    }
    // (delay before, frame) in order; the first frame carries no text, like a chat role chunk.
    let mut plan: Vec<(Duration, Bytes)> = vec![(Duration::ZERO, frame(text_chunk(chat, "")))];
    match model.as_str() {
        "garbage" => plan.push((Duration::ZERO, Bytes::from("data: {not json\n\n"))),
        "cut" => plan.push((Duration::ZERO, frame(text_chunk(chat, "a")))),
        "hang" => plan.push((Duration::from_secs(3600), frame(text_chunk(chat, "a")))),
        "midstream" => {
            plan.push((Duration::ZERO, frame(text_chunk(chat, "a"))));
            plan.push((
                Duration::ZERO,
                frame(json!({"error": {"message": "lane died", "type": "lane_failed"}})),
            ));
            plan.push((Duration::ZERO, Bytes::from("data: [DONE]\n\n")));
        }
        _ => {
            for i in 0..CHUNKS {
                let delay = if i == 0 { TTFT } else { GAP };
                plan.push((delay, frame(text_chunk(chat, &format!(" t{i}")))));
            }
            let usage = json!({"prompt_tokens": FAKE_PROMPT_TOKENS, "completion_tokens": CHUNKS, "total_tokens": FAKE_PROMPT_TOKENS + CHUNKS});
            plan.push((
                Duration::ZERO,
                frame(json!({"choices": [{"index": 0, "text": "", "finish_reason": "length"}]})),
            ));
            plan.push((
                Duration::ZERO,
                frame(json!({"choices": [], "usage": usage})),
            ));
            plan.push((Duration::ZERO, Bytes::from("data: [DONE]\n\n")));
        }
    }
    let body = stream::unfold(plan.into_iter(), |mut it| async move {
        let (delay, bytes) = it.next()?;
        actix_web::rt::time::sleep(delay).await;
        Some((Ok::<_, actix_web::Error>(bytes), it))
    });
    HttpResponse::Ok()
        .content_type("text/event-stream")
        .streaming(body)
}

/// Starts the fake server on an ephemeral port; returns its base URL and a stop handle.
fn start_fake() -> (String, ServerHandle) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        actix_web::rt::System::new().block_on(async move {
            let server = HttpServer::new(|| {
                App::new()
                    .route("/v1/completions", web::post().to(|b| fake(b, false)))
                    .route("/v1/chat/completions", web::post().to(|b| fake(b, true)))
                    .route(
                        "/v1/models",
                        web::get().to(|| async {
                            HttpResponse::Ok().json(json!({"data": [{"id": "slow"}]}))
                        }),
                    )
            })
            // The test measures the client, so the server sends each chunk at once (no Nagle).
            .on_connect(|conn, _| {
                if let Some(tcp) = conn.downcast_ref::<actix_web::rt::net::TcpStream>() {
                    let _ = tcp.set_nodelay(true);
                }
            })
            .workers(2)
            .listen(listener)
            .expect("listen")
            .run();
            tx.send(server.handle()).expect("send handle");
            server.await
        })
    });
    (base, rx.recv().expect("fake server start"))
}

fn args(items: &[&str]) -> BenchArgs {
    BenchArgs::parse_from(std::iter::once("bench").chain(items.iter().copied()))
        .expect("bench args")
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn measured_ttft_and_itl_match_injected_delays() {
    let (base, handle) = start_fake();
    for endpoint in ["completions", "chat"] {
        let a = args(&[
            "--base-url",
            &base,
            "--endpoint",
            endpoint,
            "--dataset",
            "fixed",
            "--prompt",
            "hello",
            "--num-prompts",
            "6",
            "--max-concurrency",
            "3",
            "--output-len",
            "16",
        ]);
        let report = kiln::bench::execute(&a).await.expect("bench run");
        assert_eq!(
            report.summary.completed, 6,
            "{endpoint}: {:?}",
            report.summary.failures
        );
        for r in &report.requests {
            let ttft = r.ttft_ms.expect("ttft");
            // Timing starts before the request is sent, so TTFT can only exceed the delay.
            assert!(
                ttft >= ms(TTFT) && ttft < ms(TTFT) + 120.0,
                "{endpoint}: ttft {ttft} ms"
            );
            assert_eq!(
                r.itl_ms.len(),
                CHUNKS - 1,
                "{endpoint}: one gap per text chunk after the first"
            );
            for &gap in &r.itl_ms {
                assert!(
                    gap > ms(GAP) - 15.0 && gap < ms(GAP) + 80.0,
                    "{endpoint}: itl {gap} ms"
                );
            }
            let mean = r.itl_ms.iter().sum::<f64>() / r.itl_ms.len() as f64;
            assert!(
                mean >= ms(GAP) - 2.0 && mean < ms(GAP) + 40.0,
                "{endpoint}: mean itl {mean} ms"
            );
            let tpot = r.tpot_ms.expect("tpot");
            assert!((tpot - (r.e2e_ms - ttft) / (CHUNKS - 1) as f64).abs() < 1e-9);
            assert!(
                tpot >= ms(GAP) - 2.0 && tpot < ms(GAP) + 40.0,
                "{endpoint}: tpot {tpot} ms"
            );
            assert!(r.usage_reported);
            assert_eq!(
                (r.prompt_tokens, r.output_tokens),
                (FAKE_PROMPT_TOKENS, CHUNKS)
            );
        }
        let s = &report.summary;
        assert!(s.ttft_ms.median >= ms(TTFT) && s.itl_ms.count == 6 * (CHUNKS - 1));
    }
    handle.stop(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_responses_are_recorded_failures() {
    let (base, handle) = start_fake();
    let cases = [
        ("http500", "server_error"),
        ("garbage", "bad_response"),
        ("cut", "incomplete_stream"),
        ("midstream", "lane_failed"),
    ];
    for (model, kind) in cases {
        let a = args(&[
            "--base-url",
            &base,
            "--model",
            model,
            "--dataset",
            "fixed",
            "--prompt",
            "x",
            "--num-prompts",
            "2",
        ]);
        let report = kiln::bench::execute(&a)
            .await
            .expect("a run with failed requests still reports");
        assert_eq!(report.summary.failed, 2, "{model}");
        assert_eq!(
            report.summary.failures.get(kind),
            Some(&2),
            "{model}: {:?}",
            report.summary.failures
        );
        assert_eq!(
            report.summary.total_output_tokens, 0,
            "failures count in no throughput"
        );
        assert!(report.table().contains(&format!("Failed ({kind}):")));
    }
    let refused = args(&[
        "--base-url",
        "http://127.0.0.1:9",
        "--model",
        "m",
        "--dataset",
        "fixed",
        "--prompt",
        "x",
        "--num-prompts",
        "1",
    ]);
    let report = kiln::bench::execute(&refused).await.expect("report");
    assert_eq!(report.summary.failures.get("connect"), Some(&1));
    handle.stop(false).await;
}

/// A server that stops answering does not stall the bench past `--max-duration-s`: the run
/// ends then and reports every request, those in flight or never sent as `unfinished`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_duration_ends_a_stuck_run_with_a_report() {
    let (base, handle) = start_fake();
    let a = args(&[
        "--base-url",
        &base,
        "--model",
        "hang",
        "--dataset",
        "fixed",
        "--prompt",
        "x",
        "--num-prompts",
        "3",
        "--max-concurrency",
        "2",
        "--max-duration-s",
        "1",
    ]);
    let t0 = Instant::now();
    let report = tokio::time::timeout(Duration::from_secs(60), kiln::bench::execute(&a))
        .await
        .expect("the run ends at --max-duration-s")
        .expect("report");
    assert!(t0.elapsed() < Duration::from_secs(30));
    assert_eq!(report.summary.failed, 3);
    assert_eq!(
        report.summary.failures.get("unfinished"),
        Some(&3),
        "{:?}",
        report.summary.failures
    );
    assert!(report.table().contains("Failed (unfinished):"));
    handle.stop(false).await;
}

// ---------------------------------------------------- llama-server's HTTP behaviour

/// Tokens each request of the llama-server-like fake streams.
const LLAMA_TOKENS: usize = 3;

/// Reads one HTTP/1.1 request (head and `Content-Length` body); `None` at end of stream.
fn read_request(conn: &mut std::net::TcpStream) -> Option<String> {
    use std::io::Read;
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        if conn.read(&mut byte).ok()? == 0 {
            return None;
        }
        buf.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&buf).to_ascii_lowercase();
    let len = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    conn.read_exact(&mut body).ok()?;
    Some(head)
}

/// A chunked-encoding chunk.
fn chunk(data: &str) -> String {
    format!("{:x}\r\n{data}\r\n", data.len())
}

/// Answers one request as llama-server (c392e50, cpp-httplib) does: keep-alive, chunked SSE
/// frames with `timings`, usage on the last chunk, then `data: [DONE]`.
fn llama_answer(conn: &mut std::net::TcpStream, head: &str) -> std::io::Result<()> {
    use std::io::Write;
    if head.starts_with("get /v1/models") {
        let body = r#"{"object":"list","data":[{"id":"model.gguf","object":"model","owned_by":"llamacpp"}]}"#;
        let res = format!(
            "HTTP/1.1 200 OK\r\nKeep-Alive: timeout=5, max=5\r\nContent-Type: application/json; charset=utf-8\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        return conn.write_all(res.as_bytes());
    }
    conn.write_all(
        b"HTTP/1.1 200 OK\r\nKeep-Alive: timeout=5, max=5\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n",
    )?;
    for i in 0..LLAMA_TOKENS {
        let v = json!({"choices": [{"text": format!(" t{i}"), "index": 0, "logprobs": null, "finish_reason": null}], "model": "gpt-3.5-turbo", "object": "text_completion", "id": "x"});
        conn.write_all(chunk(&format!("data: {v}\n\n")).as_bytes())?;
    }
    let last = json!({"choices": [{"text": "", "index": 0, "logprobs": null, "finish_reason": "length"}], "object": "text_completion", "usage": {"completion_tokens": LLAMA_TOKENS, "prompt_tokens": 2, "total_tokens": LLAMA_TOKENS + 2}, "timings": {"prompt_n": 2, "predicted_n": LLAMA_TOKENS}});
    let tail = format!(
        "{}{}0\r\n\r\n",
        chunk(&format!("data: {last}\n\n")),
        chunk("data: [DONE]\n\n")
    );
    conn.write_all(tail.as_bytes())
}

/// A server that speaks like llama-server and, like cpp-httplib when a keep-alive connection
/// times out or reaches its request cap, closes a connection that carries a second request
/// without answering it (the worst moment of that race, made certain). Returns the base URL.
fn start_llama_like() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            std::thread::spawn(move || {
                let Some(head) = read_request(&mut conn) else {
                    return;
                };
                if llama_answer(&mut conn, &head).is_err() {
                    return;
                }
                // The next request on this connection is read, then the connection closes.
                let _ = read_request(&mut conn);
            });
        }
    });
    base
}

/// `kiln bench` against a llama-server-like peer: every request completes even though the
/// server closes keep-alive connections under the client (the bench opens a connection per
/// request), and llama-server's stream (usage in the last chunk, `[DONE]`) is read whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llama_server_keep_alive_closes_are_not_failures() {
    let base = start_llama_like();
    for concurrency in ["1", "4"] {
        let a = args(&[
            "--base-url",
            &base,
            "--dataset",
            "fixed",
            "--prompt",
            "x",
            "--num-prompts",
            "8",
            "--max-concurrency",
            concurrency,
            "--output-len",
            "3",
            "--timeout-s",
            "30",
        ]);
        let report = tokio::time::timeout(Duration::from_secs(60), kiln::bench::execute(&a))
            .await
            .expect("the bench finishes")
            .expect("report");
        assert_eq!(
            (report.summary.completed, report.summary.failed),
            (8, 0),
            "c{concurrency}: {:?}",
            report.summary.failures
        );
        assert_eq!(report.summary.total_output_tokens, 8 * LLAMA_TOKENS);
        assert_eq!(report.summary.total_input_tokens, 8 * 2);
    }
}

// ---------------------------------------------------------------- report and parsing

fn record(i: usize, ttft: f64, gap: f64, out: usize, error: Option<&str>) -> RequestRecord {
    let e2e = ttft + gap * (out.saturating_sub(1)) as f64;
    RequestRecord {
        index: i,
        start_ms: i as f64,
        ttft_ms: Some(ttft),
        itl_ms: vec![gap; out.saturating_sub(1)],
        tpot_ms: (out > 1).then_some(gap),
        e2e_ms: e2e,
        prompt_tokens: 100 + i,
        output_tokens: out,
        usage_reported: true,
        expected_prompt_tokens: Some(100 + i),
        requested_output_tokens: out,
        error: error.map(|k| Failure::new(k, "x")),
    }
}

fn assert_ordered(name: &str, s: &Stats) {
    assert!(
        s.min <= s.median
            && s.median <= s.p90
            && s.p90 <= s.p95
            && s.p95 <= s.p99
            && s.p99 <= s.max,
        "{name}: {s:?}"
    );
    assert!(s.min <= s.mean && s.mean <= s.max, "{name}: {s:?}");
}

#[test]
fn report_is_internally_consistent() {
    let values: Vec<f64> = (1..=100).map(f64::from).collect();
    assert_eq!(percentile(&values, 50.0), 50.5);
    assert!((percentile(&values, 90.0) - 90.1).abs() < 1e-9);
    assert!((percentile(&values, 99.0) - 99.01).abs() < 1e-9);
    assert_eq!(percentile(&[], 50.0), 0.0);

    let mut records: Vec<RequestRecord> = (0..200)
        .map(|i| {
            record(
                i,
                10.0 + (i * 37 % 101) as f64,
                1.0 + (i % 13) as f64,
                1 + i % 40,
                None,
            )
        })
        .collect();
    records.push(record(200, 5.0, 1.0, 9, Some("timeout")));
    records.push(record(201, 5.0, 1.0, 9, Some("timeout")));
    records.push(record(202, 5.0, 1.0, 9, Some("server_error")));
    let duration = Duration::from_millis(12_345);
    let s = Summary::of(&records, duration);
    assert_eq!((s.completed, s.failed), (200, 3));
    assert_eq!(s.failures.get("timeout"), Some(&2));
    assert_eq!(s.failures.get("server_error"), Some(&1));
    let ok = &records[..200];
    let out: usize = ok.iter().map(|r| r.output_tokens).sum();
    let inp: usize = ok.iter().map(|r| r.prompt_tokens).sum();
    assert_eq!((s.total_output_tokens, s.total_input_tokens), (out, inp));
    let secs = 12.345;
    assert!((s.output_throughput - out as f64 / secs).abs() < 1e-9);
    assert!((s.input_throughput - inp as f64 / secs).abs() < 1e-9);
    assert!((s.total_token_throughput - (inp + out) as f64 / secs).abs() < 1e-9);
    assert!((s.request_throughput - 200.0 / secs).abs() < 1e-9);
    for (name, st) in [
        ("ttft", &s.ttft_ms),
        ("tpot", &s.tpot_ms),
        ("itl", &s.itl_ms),
        ("e2e", &s.e2e_ms),
    ] {
        assert_ordered(name, st);
    }
    assert_eq!(
        s.itl_ms.count,
        ok.iter().map(|r| r.itl_ms.len()).sum::<usize>()
    );
    assert_eq!(
        s.tpot_ms.count,
        ok.iter().filter(|r| r.output_tokens > 1).count()
    );
    assert_eq!(s.ttft_ms.min, 10.0);
    assert_eq!(s.ttft_ms.max, 110.0);

    let report = Report::new(Default::default(), records, duration);
    let back: Report = serde_json::from_str(&report.to_json()).expect("the JSON reads back");
    assert_eq!(
        (back.requests.len(), &back.summary.failures),
        (report.requests.len(), &report.summary.failures)
    );
    assert!((back.summary.e2e_ms.p99 - report.summary.e2e_ms.p99).abs() < 1e-9);
    assert!((back.summary.output_throughput - report.summary.output_throughput).abs() < 1e-9);
    let svg = kiln::bench::plot::svg(&report);
    assert!(
        svg.starts_with("<svg")
            && svg.trim_end().ends_with("</svg>")
            && svg.matches("<polyline").count() == 4
    );
}

#[test]
fn sse_lines_survive_any_split() {
    let wire =
        "data: {\"t\":\"é\"}\r\n\r\n: keep-alive\n\nevent: x\ndata: a\ndata: b\n\ndata: [DONE]\n\n"
            .as_bytes();
    let want = vec!["{\"t\":\"é\"}".to_string(), "a\nb".into(), "[DONE]".into()];
    for step in 1..wire.len() {
        let mut sse = SseLines::default();
        let mut got = Vec::new();
        for piece in wire.chunks(step) {
            sse.push(piece);
            while let Some(d) = sse.next_data().expect("small lines") {
                got.push(d);
            }
        }
        assert_eq!(got, want, "split every {step} bytes");
    }
    let mut multi = SseLines::default();
    multi.push(b"data:\ndata: b\n\n");
    assert_eq!(multi.next_data().expect("ok").as_deref(), Some("\nb"));
    let mut big = SseLines::default();
    big.push(&vec![b'x'; 9 << 20]);
    let err = big
        .next_data()
        .expect_err("a line past the limit is a failure");
    assert_eq!(err.kind, "bad_response");
    let mut tail = SseLines::default();
    tail.push(b"data: [DONE]");
    assert_eq!(tail.next_data().expect("ok"), None);
    assert_eq!(tail.finish().as_deref(), Some("[DONE]"));
}

#[test]
fn bad_flags_are_errors_not_panics() {
    for bad in [
        vec!["--input-len", "0"],
        vec!["--input-len", "9..3"],
        vec!["--request-rate", "-1"],
        vec!["--request-rate", "fast"],
    ] {
        assert!(
            BenchArgs::parse_from(std::iter::once("bench").chain(bad.iter().copied())).is_err(),
            "{bad:?}"
        );
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    for bad in [
        vec!["--dataset", "sharegpt"],
        vec!["--dataset", "fixed"],
        vec!["--dataset", "nope"],
        vec!["--num-prompts", "0"],
        vec!["--max-duration-s", "0"],
        vec!["--extra-body", "[1]"],
        vec!["--base-url", "localhost:8000"],
        vec!["--offline", "--endpoint", "chat"],
        vec![
            "--dataset",
            "sharegpt",
            "/nonexistent/sharegpt.json",
            "--offline",
        ],
    ] {
        assert!(
            rt.block_on(kiln::bench::execute(&args(&bad))).is_err(),
            "{bad:?}"
        );
    }
}

// ---------------------------------------------------------------- real model

fn fixture_tokenizer() -> kiln::tokenizer::Tokenizer {
    let files =
        kiln::model::ModelFiles::open(&kiln::config::default_model_path(), Default::default())
            .expect("fixture");
    files.tokenizer.expect("fixture tokenizer")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_prompts_are_token_exact_and_reproducible() {
    let tok = fixture_tokenizer();
    let counter = TokenCounter::Local(tok.clone());
    let spec = DatasetSpec::Random {
        input: LenRange::exact(77),
        output: "5..9".parse().expect("range"),
    };
    let a = dataset::build(&spec, 20, 3, Some(&counter))
        .await
        .expect("dataset");
    assert_eq!(
        a,
        dataset::build(&spec, 20, 3, Some(&counter))
            .await
            .expect("dataset"),
        "same seed, same workload"
    );
    assert_ne!(
        a,
        dataset::build(&spec, 20, 4, Some(&counter))
            .await
            .expect("dataset")
    );
    for s in &a {
        assert_eq!(
            tok.encode(&s.prompt, true).expect("encode").len(),
            77,
            "{:?}",
            s.prompt
        );
        assert_eq!(s.prompt_len, Some(77));
        assert!((5..=9).contains(&s.output_len));
    }
    let path =
        std::env::temp_dir().join(format!("kiln-bench-sharegpt-{}.json", std::process::id()));
    let convs: Vec<Value> = (0..6)
        .map(|i| json!({"id": i, "conversations": [{"from": "human", "value": format!("Tell me a story number {i} about a cat")}, {"from": "gpt", "value": "Once upon a time there was a cat who liked to play."}]}))
        .chain([json!({"id": "short", "conversations": [{"from": "human", "value": "hi"}]})])
        .collect();
    std::fs::write(&path, serde_json::to_string(&convs).expect("json")).expect("write");
    let sg = DatasetSpec::ShareGpt {
        path: path.clone(),
        output: None,
    };
    let samples = dataset::build(&sg, 4, 1, Some(&counter))
        .await
        .expect("sharegpt");
    std::fs::remove_file(&path).ok();
    let reply = tok
        .encode("Once upon a time there was a cat who liked to play.", false)
        .expect("encode")
        .len();
    for s in &samples {
        assert!(s.prompt.starts_with("Tell me a story"));
        assert_eq!(
            s.prompt_len,
            Some(tok.encode(&s.prompt, true).expect("encode").len())
        );
        assert_eq!(s.output_len, reply);
    }
}

fn check_report(r: &Report, n: usize) {
    let s = &r.summary;
    assert_eq!((s.completed, s.failed), (n, 0), "{:?}", s.failures);
    assert_eq!(r.requests.len(), n);
    for q in &r.requests {
        assert!(q.usage_reported);
        assert_eq!(
            q.output_tokens, q.requested_output_tokens,
            "ignore_eos makes lengths exact"
        );
        let out = q.output_tokens as f64;
        if q.output_tokens > 1 {
            let tpot = (q.e2e_ms - q.ttft_ms.expect("ttft")) / (out - 1.0);
            assert!((q.tpot_ms.expect("tpot") - tpot).abs() < 1e-9);
        }
        assert!(q.ttft_ms.expect("ttft") <= q.e2e_ms);
    }
    assert_eq!(
        s.total_output_tokens,
        r.requests
            .iter()
            .map(|q| q.requested_output_tokens)
            .sum::<usize>()
    );
    assert_eq!(
        s.total_input_tokens,
        r.requests.iter().map(|q| q.prompt_tokens).sum::<usize>()
    );
    assert!((s.output_throughput - s.total_output_tokens as f64 / s.duration_s).abs() < 1e-6);
    assert!((s.input_throughput - s.total_input_tokens as f64 / s.duration_s).abs() < 1e-6);
    let last_end = r
        .requests
        .iter()
        .map(|q| q.start_ms + q.e2e_ms)
        .fold(0.0, f64::max);
    assert!(
        last_end <= s.duration_s * 1e3 + 1.0,
        "every request ends within the run"
    );
    for (name, st) in [
        ("ttft", &s.ttft_ms),
        ("tpot", &s.tpot_ms),
        ("itl", &s.itl_ms),
        ("e2e", &s.e2e_ms),
    ] {
        assert_ordered(name, st);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offline_runs_the_fixture_through_the_engine() {
    let a = args(&[
        "--offline",
        "--num-prompts",
        "12",
        "--input-len",
        "16..48",
        "--output-len",
        "8..24",
        "--max-concurrency",
        "4",
        "--ignore-eos",
        "--seed",
        "7",
    ]);
    let r = kiln::bench::execute(&a).await.expect("offline run");
    check_report(&r, 12);
    for q in &r.requests {
        assert_eq!(
            Some(q.prompt_tokens),
            q.expected_prompt_tokens,
            "the engine saw the workload's tokens"
        );
        assert!((16..=48).contains(&q.prompt_tokens) && (8..=24).contains(&q.output_tokens));
    }
    assert_eq!(r.run.target, "offline");

    // Dummy weights without a tokenizer: the random dataset becomes random token ids.
    let dir = temp("dummy-model");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let config = kiln::config::default_model_path()
        .with_file_name("stories260K-hf")
        .join("config.json");
    std::fs::copy(&config, dir.join("config.json")).expect("copy config");
    let dir_arg = dir.to_string_lossy().into_owned();
    let a = args(&[
        "--offline",
        "--load-format",
        "dummy",
        "--model",
        &dir_arg,
        "--num-prompts",
        "6",
        "--input-len",
        "30",
        "--output-len",
        "5",
        "--ignore-eos",
    ]);
    let r = kiln::bench::execute(&a).await.expect("dummy offline run");
    std::fs::remove_dir_all(&dir).ok();
    check_report(&r, 6);
    assert!(
        r.requests
            .iter()
            .all(|q| q.prompt_tokens == 30 && q.output_tokens == 5)
    );
}

/// A real Kiln server on the fixture, on an ephemeral port.
struct KilnServer {
    base: String,
    _server: kiln::api::Server,
    _engine: kiln::engine::Engine,
}

fn start_kiln() -> KilnServer {
    let mut cfg = kiln::config::Config::default();
    cfg.server.workers = 2;
    cfg.engine.kv_blocks = Some(1024);
    cfg.engine.max_num_seqs = 32;
    let files =
        kiln::model::ModelFiles::open(&kiln::config::default_model_path(), Default::default())
            .expect("fixture");
    let engine =
        kiln::engine::Engine::start(files, &[kiln::engine::Device::Cpu], cfg.engine.clone())
            .expect("engine");
    let state = web::Data::new(kiln::api::AppState::new(cfg));
    state.set_engine(engine.client()).expect("engine ready");
    let server = kiln::api::Server::start(state, TcpListener::bind("127.0.0.1:0").expect("bind"))
        .expect("server");
    KilnServer {
        base: format!("http://{}", server.addr()),
        _server: server,
        _engine: engine,
    }
}

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("kiln-bench-{}-{name}", std::process::id()))
}

#[test]
fn kiln_bench_binary_against_a_real_kiln_server() {
    let kiln = start_kiln();
    let (json_path, svg_path) = (temp("http.json"), temp("http.svg"));
    let t0 = Instant::now();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args([
            "bench",
            "--base-url",
            &kiln.base,
            "--num-prompts",
            "16",
            "--input-len",
            "20..60",
        ])
        .args([
            "--output-len",
            "4..12",
            "--request-rate",
            "200",
            "--max-concurrency",
            "8",
            "--ignore-eos",
        ])
        .arg("--json")
        .arg(&json_path)
        .arg("--plot")
        .arg(&svg_path)
        .output()
        .expect("run kiln bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("Successful requests:") && stdout.contains("TTFT"),
        "{stdout}"
    );
    let report: Report =
        serde_json::from_str(&std::fs::read_to_string(&json_path).expect("json")).expect("report");
    check_report(&report, 16);
    assert!(report.summary.duration_s <= t0.elapsed().as_secs_f64());
    assert_eq!(
        report.summary.prompt_len_mismatches, 0,
        "/tokenize counts match usage.prompt_tokens"
    );
    for q in &report.requests {
        assert!((20..=60).contains(&q.prompt_tokens));
    }
    let svg = std::fs::read_to_string(&svg_path).expect("svg");
    assert!(svg.starts_with("<svg") && svg.matches("<polyline").count() == 4);
    std::fs::remove_file(&json_path).ok();
    std::fs::remove_file(&svg_path).ok();

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("rt");
    let chat = args(&[
        "--base-url",
        &kiln.base,
        "--endpoint",
        "chat",
        "--num-prompts",
        "4",
        "--input-len",
        "24",
        "--output-len",
        "6",
        "--ignore-eos",
    ]);
    let report = rt.block_on(kiln::bench::execute(&chat)).expect("chat run");
    check_report(&report, 4);
}
