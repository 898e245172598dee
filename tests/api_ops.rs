//! Operations against a real server: metrics, tokenizer routes, OpenAPI and docs, client
//! disconnects (streaming and not), keep-alive comments, many concurrent streams.

mod api_support;

use std::time::Duration;

use api_support::*;
use futures_util::StreamExt;
use serde_json::{Value, json};

const C: &str = "/v1/completions";

#[tokio::test]
async fn metrics_expose_every_kiln_metric_after_requests() {
    let s = shared();
    let (status, _, _) = post(&s.base, C, &json!({"prompt": "Once", "max_tokens": 5})).await;
    assert_eq!(status, 200);
    post(&s.base, C, &json!({"prompt": 1})).await;
    let (status, text) = get(&s.base, "/metrics").await;
    assert_eq!(status, 200);
    for name in [
        "kiln_requests_running",
        "kiln_requests_waiting",
        "kiln_kv_cache_usage_ratio",
        "kiln_prefix_cache_queries_total",
        "kiln_prefix_cache_hits_total",
        "kiln_preemptions_total",
        "kiln_prompt_tokens_total",
        "kiln_generation_tokens_total",
        "kiln_request_success_total{finished_reason=",
        "kiln_request_errors_total{type=\"invalid_request_error\"}",
        "kiln_time_to_first_token_seconds_bucket",
        "kiln_inter_token_latency_seconds_bucket",
        "kiln_e2e_request_latency_seconds_bucket",
        "kiln_request_queue_time_seconds_bucket",
        "kiln_http_requests_client_disconnected_total",
        "kiln_build_info{backends=\"cpu",
        "# TYPE kiln_time_to_first_token_seconds histogram",
        "# TYPE kiln_prompt_tokens_total counter",
    ] {
        assert!(text.contains(name), "missing {name} in\n{text}");
    }
    assert!(metric(&text, "kiln_generation_tokens_total").unwrap() >= 5.0);
    assert!(metric(&text, "kiln_prompt_tokens_total").unwrap() >= 2.0);
}

#[tokio::test]
async fn tokenize_detokenize_round_trip() {
    let s = shared();
    let text = "Once upon a time, a cat 🐈 met 猫.";
    let (status, _, plain) = post(
        &s.base,
        "/tokenize",
        &json!({"prompt": text, "add_special_tokens": false}),
    )
    .await;
    assert_eq!(status, 200, "{plain}");
    let (_, _, with_bos) = post(&s.base, "/tokenize", &json!({"prompt": text})).await;
    assert_eq!(
        with_bos["count"].as_u64().unwrap(),
        plain["count"].as_u64().unwrap() + 1,
        "BOS by default"
    );
    assert_eq!(with_bos["tokens"][0], 1);
    assert_eq!(plain["max_model_len"], 2048);
    let (status, _, back) = post(&s.base, "/detokenize", &json!({"tokens": plain["tokens"]})).await;
    assert_eq!(status, 200, "{back}");
    assert_eq!(back["prompt"], text);
}

#[tokio::test]
async fn models_lists_the_served_model() {
    let s = shared();
    let (status, text) = get(&s.base, "/v1/models").await;
    assert_eq!(status, 200);
    let body: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(body["object"], "list");
    assert_eq!(body["data"][0]["id"], "stories260K.gguf");
    assert_eq!(body["data"][0]["object"], "model");
    assert_eq!(body["data"][0]["owned_by"], "kiln");
    // What vLLM's cards carry besides OpenAI's four fields.
    let card = &body["data"][0];
    assert_eq!(card["max_model_len"], 2048);
    assert_eq!(
        card["root"], "stories260K.gguf",
        "the file's name, not its directories"
    );
    assert!(card["parent"].is_null(), "{card}");
    let perm = &card["permission"][0];
    assert_eq!(perm["object"], "model_permission");
    assert_eq!(perm["allow_sampling"], true);
    assert_eq!(perm["allow_logprobs"], true);
    assert_eq!(perm["organization"], "*");
    assert!(perm["id"].as_str().unwrap().starts_with("modelperm-"));
    assert!(card["created"].as_u64().unwrap() > 1_600_000_000);
}

#[tokio::test]
async fn openapi_is_served_and_the_committed_copy_is_up_to_date() {
    let path = kiln::config::project_root().join("openapi/openapi.json");
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == kiln::api::openapi_json(),
        "openapi/openapi.json is stale: run `cargo run --release -- openapi > openapi/openapi.json`"
    );
    let s = shared();
    let (status, text) = get(&s.base, "/openapi.json").await;
    assert_eq!(status, 200);
    let served: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(served, serde_json::from_str::<Value>(&committed).unwrap());
    for route in [
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/models",
        "/tokenize",
        "/detokenize",
        "/health",
        "/metrics",
    ] {
        assert!(served["paths"][route].is_object(), "{route} documented");
    }
    for schema in [
        "CompletionRequest",
        "ChatCompletionChunk",
        "ErrorResponse",
        "CompletionChunk",
    ] {
        assert!(
            served["components"]["schemas"][schema].is_object(),
            "{schema} documented"
        );
    }
    let (status, html) = get(&s.base, "/docs/").await;
    assert_eq!(status, 200);
    assert!(html.to_lowercase().contains("swagger"), "{html}");
    let (status, _) = get(&s.base, "/docs/swagger-ui.css").await;
    assert_eq!(status, 200, "assets are vendored");
    assert_eq!(
        get(&s.base, "/docs").await.0,
        200,
        "redirect to /docs/ is followed"
    );
}

#[test]
fn kiln_openapi_prints_the_committed_document() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
        .arg("openapi")
        .output()
        .unwrap();
    assert!(out.status.success());
    let committed =
        std::fs::read_to_string(kiln::config::project_root().join("openapi/openapi.json")).unwrap();
    assert_eq!(String::from_utf8(out.stdout).unwrap(), committed);
}

/// A server with one seat, so a long request holds it while others wait.
fn one_seat(keep_alive_s: f64) -> TestServer {
    let mut cfg = test_config();
    cfg.engine.max_num_seqs = 1;
    cfg.server.sse_keep_alive_s = keep_alive_s;
    start(cfg)
}

/// Sixteen choices of 2000 tokens one after another: far longer than any wait below.
fn holder() -> Value {
    json!({"prompt": "Once", "max_tokens": 2000, "n": 16, "ignore_eos": true, "stream": true})
}

#[tokio::test]
async fn client_disconnect_aborts_streaming_and_non_streaming_requests() {
    let s = one_seat(10.0);
    let c = client();
    let res = c
        .post(format!("{}{C}", s.base))
        .json(&holder())
        .send()
        .await
        .unwrap();
    let mut held = res.bytes_stream();
    held.next().await.unwrap().unwrap();
    let quick = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let queued = quick
        .post(format!("{}{C}", s.base))
        .json(&json!({"prompt": "Once", "max_tokens": 5}))
        .send()
        .await;
    assert!(
        queued.is_err(),
        "the non-streaming request waits behind the holder and times out"
    );
    let disconnected =
        |t: &str| metric(t, "kiln_http_requests_client_disconnected_total").unwrap_or(0.0);
    let text = wait_metrics(&s.base, Duration::from_secs(20), |t| disconnected(t) >= 1.0).await;
    assert_eq!(
        disconnected(&text),
        1.0,
        "non-streaming disconnect counted:\n{text}"
    );
    assert!(
        metric(&text, "kiln_requests_running").unwrap() >= 1.0,
        "the holder still runs"
    );
    drop(held);
    let text = wait_metrics(&s.base, Duration::from_secs(20), |t| {
        metric(t, "kiln_requests_running") == Some(0.0)
            && metric(t, "kiln_requests_waiting") == Some(0.0)
    })
    .await;
    assert_eq!(
        disconnected(&text),
        2.0,
        "streaming disconnect counted:\n{text}"
    );
    assert_eq!(metric(&text, "kiln_requests_running"), Some(0.0), "{text}");
    assert_eq!(
        metric(&text, "kiln_kv_cache_usage_ratio"),
        Some(0.0),
        "{text}"
    );
    assert!(
        metric(&text, "kiln_generation_tokens_total").unwrap_or(0.0) < 16.0 * 2000.0,
        "aborted before the holder's 32000 tokens"
    );
    assert!(
        text.contains("kiln_request_success_total{finished_reason=\"abort\"}"),
        "{text}"
    );
}

#[tokio::test]
async fn keep_alive_comments_flow_while_a_request_waits() {
    let s = one_seat(0.05);
    let c = client();
    let res = c
        .post(format!("{}{C}", s.base))
        .json(&holder())
        .send()
        .await
        .unwrap();
    let mut held = res.bytes_stream();
    held.next().await.unwrap().unwrap();
    let res = c
        .post(format!("{}{C}", s.base))
        .json(&json!({"prompt": "Once", "max_tokens": 3, "stream": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        res.status().as_u16(),
        200,
        "headers go out before the first token"
    );
    let mut waiting = res.bytes_stream();
    let mut raw = Vec::new();
    while raw.windows(13).filter(|w| w == b": keep-alive\n").count() < 2 {
        let chunk = tokio::time::timeout(Duration::from_secs(20), waiting.next()).await;
        raw.extend_from_slice(&chunk.expect("keep-alive within 20 s").unwrap().unwrap());
    }
    assert!(
        !String::from_utf8_lossy(&raw).contains("data:"),
        "no data yet: the request is queued"
    );
}

#[tokio::test]
async fn hundred_concurrent_streams_with_a_third_disconnecting() {
    let mut cfg = test_config();
    cfg.engine.max_num_seqs = 32;
    let s = start(cfg);
    let mut tasks = Vec::new();
    for i in 0..100usize {
        let base = s.base.clone();
        tasks.push(tokio::spawn(async move {
            let quitter = i % 3 == 0;
            let body = if quitter {
                json!({"prompt": "Once upon a time", "max_tokens": 2000, "ignore_eos": true, "stream": true})
            } else {
                json!({"prompt": "Once upon a time", "max_tokens": 24, "stream": true, "temperature": 0})
            };
            let res = client().post(format!("{base}{C}")).json(&body).send().await.unwrap();
            assert_eq!(res.status().as_u16(), 200);
            let mut stream = res.bytes_stream();
            let mut raw = Vec::new();
            let mut chunks = 0;
            while let Some(chunk) = stream.next().await {
                raw.extend_from_slice(&chunk.unwrap());
                chunks += 1;
                if quitter && chunks > i % 7 {
                    return None;
                }
            }
            Some(String::from_utf8(raw).unwrap())
        }));
    }
    let mut finished = Vec::new();
    for t in tasks {
        if let Some(raw) = t.await.unwrap() {
            finished.push(raw);
        }
    }
    assert_eq!(finished.len(), 66);
    let text_of = |raw: &str| -> String {
        raw.split("\n\n")
            .filter_map(|f| f.strip_prefix("data: "))
            .filter(|d| *d != "[DONE]")
            .map(|d| {
                serde_json::from_str::<Value>(d).unwrap()["choices"][0]["text"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect()
    };
    let first = text_of(&finished[0]);
    assert!(!first.is_empty());
    for raw in &finished {
        assert!(raw.ends_with("data: [DONE]\n\n"), "{raw}");
        assert!(!raw.contains("\"error\""), "{raw}");
        assert_eq!(
            text_of(raw),
            first,
            "greedy streams of one prompt agree, whatever else ran"
        );
    }
    let text = wait_metrics(&s.base, Duration::from_secs(60), |t| {
        metric(t, "kiln_requests_running") == Some(0.0)
            && metric(t, "kiln_requests_waiting") == Some(0.0)
            && metric(t, "kiln_kv_cache_usage_ratio") == Some(0.0)
    })
    .await;
    assert_eq!(
        metric(&text, "kiln_kv_cache_usage_ratio"),
        Some(0.0),
        "{text}"
    );
    assert_eq!(
        metric(&text, "kiln_http_requests_client_disconnected_total"),
        Some(34.0),
        "{text}"
    );
    assert_eq!(get(&s.base, "/health").await.0, 200);
}

#[tokio::test]
async fn cors_is_off_unless_configured() {
    let origin = "http://app.example";
    let preflight = |base: String| async move {
        client()
            .request(reqwest::Method::OPTIONS, format!("{base}{C}"))
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .header(
                "access-control-request-headers",
                "authorization, content-type",
            )
            .send()
            .await
            .unwrap()
    };
    let res = preflight(shared().base.clone()).await;
    assert!(res.headers().get("access-control-allow-origin").is_none());
    let mut cfg = test_config();
    cfg.server.cors_allowed_origins = vec![origin.into()];
    cfg.server.api_keys = vec!["sk-cors".into()];
    let s = start(cfg);
    let res = preflight(s.base.clone()).await;
    assert!(
        res.status().is_success(),
        "preflight passes before auth: {}",
        res.status()
    );
    assert_eq!(res.headers()["access-control-allow-origin"], origin);
    let res = client()
        .get(format!("{}/v1/models", s.base))
        .header("origin", "http://evil.example")
        .bearer_auth("sk-cors")
        .send()
        .await
        .unwrap();
    assert!(res.headers().get("access-control-allow-origin").is_none());
}
