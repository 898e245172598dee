//! Error classes against a real server: a table of bad inputs (each a 4xx naming the field),
//! 401, 404, 413, 429 with Retry-After, 431, and 503 before the engine is ready.

mod api_support;

use std::net::TcpListener;
use std::time::Duration;

use actix_web::web::Data;
use api_support::*;
use futures_util::StreamExt;
use kiln::api::{AppState, Server};
use kiln::engine::{Device, Engine};
use serde_json::{Value, json};

const C: &str = "/v1/completions";
const CHAT: &str = "/v1/chat/completions";

#[tokio::test]
async fn bad_inputs_are_4xx_naming_the_field() {
    let s = shared();
    let path = kiln::config::project_root().join("tests/data/api_bad_inputs.json");
    let mut table: Vec<(String, Value, u16, String, Option<String>)> =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let generated = [
        (C, json!({"prompt": vec![100; 3000]}), "prompt"),
        (C, json!({"prompt": "x", "stop": vec!["a"; 1000]}), "stop"),
        (
            C,
            json!({"prompt": "x", "stop": ["a".repeat(5000)]}),
            "stop",
        ),
        (C, json!({"prompt": vec!["x"; 1000]}), "prompt"),
        (
            CHAT,
            json!({"messages": vec![json!({"role": "user", "content": "x"}); 2000]}),
            "messages",
        ),
        (
            CHAT,
            json!({"messages": [{"role": "user", "content": "a ".repeat(3000)}]}),
            "messages",
        ),
    ];
    for (path, body, param) in generated {
        let case = (
            path.into(),
            body,
            400,
            "invalid_request_error".into(),
            Some(param.into()),
        );
        table.push(case);
    }
    for (path, body, status, kind, param) in table {
        let (got, _, res) = post(&s.base, &path, &body).await;
        println!("{path} {body} -> {got} {res}");
        assert_error(got, &res, status, &kind, param.as_deref());
    }
    let raw: Vec<(&str, u16)> = vec![
        ("{\"prompt\": ", 400),
        ("{\"prompt\": \"x\", \"temperature\": NaN}", 400),
        ("[1, 2]", 400),
        ("\"just a string\"", 400),
        ("42", 400),
        ("", 400),
        ("{\"prompt\": \"x\"} {}", 400),
    ];
    for (body, status) in raw {
        let (got, res) = post_raw(&s.base, C, body.to_string()).await;
        assert_error(got, &res, status, "invalid_request_error", None);
    }
    let (status, _, body) = post(&s.base, C, &json!({"prompt": "Once", "max_tokens": 3})).await;
    assert_eq!(status, 200, "bad requests do not disturb good ones: {body}");
    let (status, health) = get(&s.base, "/health").await;
    assert_eq!((status, health.as_str()), (200, "{\"status\":\"ok\"}"));
}

#[tokio::test]
async fn unknown_routes_are_404_with_an_openai_body() {
    let s = shared();
    let (status, text) = get(&s.base, "/v1/engines").await;
    let body: Value = serde_json::from_str(&text).unwrap();
    assert_error(status, &body, 404, "not_found_error", None);
    let (status, text) = get(&s.base, C).await;
    let body: Value = serde_json::from_str(&text).unwrap();
    assert_error(status, &body, 404, "not_found_error", None);
}

#[tokio::test]
async fn huge_header_is_431() {
    let s = shared();
    let res = client()
        .get(format!("{}/v1/models", s.base))
        .header("x-padding", "a".repeat(20_000))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 431);
    let body: Value = res.json().await.unwrap();
    assert_error(431, &body, 431, "invalid_request_error", None);
}

#[tokio::test]
async fn api_keys_guard_every_route_but_health() {
    let mut cfg = test_config();
    cfg.server.api_keys = vec!["sk-first".into(), "sk-second".into()];
    let s = start(cfg);
    let c = client();
    let url = format!("{}/v1/completions", s.base);
    let body = json!({"prompt": "Once", "max_tokens": 2});
    for auth in [
        None,
        Some("Bearer sk-wrong"),
        Some("Bearer sk-firs"),
        Some("sk-first"),
    ] {
        let mut req = c.post(&url).json(&body);
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        let res = req.send().await.unwrap();
        let status = res.status().as_u16();
        let json: Value = res.json().await.unwrap();
        assert_error(status, &json, 401, "authentication_error", None);
        assert_eq!(json["error"]["code"], "invalid_api_key");
    }
    for key in ["sk-first", "sk-second"] {
        let res = c
            .post(&url)
            .bearer_auth(key)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status().as_u16(), 200);
    }
    for path in ["/metrics", "/v1/models", "/openapi.json", "/docs/"] {
        assert_eq!(get(&s.base, path).await.0, 401, "{path} needs a key");
    }
    assert_eq!(get(&s.base, "/health").await.0, 200);
    let metrics = c
        .get(format!("{}/metrics", s.base))
        .bearer_auth("sk-second")
        .send()
        .await
        .unwrap();
    let text = metrics.text().await.unwrap();
    assert!(
        text.contains("kiln_request_errors_total{type=\"authentication_error\"}"),
        "{text}"
    );
}

#[tokio::test]
async fn oversized_bodies_are_413() {
    let mut cfg = test_config();
    cfg.server.max_body_bytes = 4096;
    let s = start(cfg);
    let big = json!({"prompt": "a ".repeat(4000), "max_tokens": 1});
    let (status, _, body) = post(&s.base, C, &big).await;
    assert_error(status, &body, 413, "invalid_request_error", None);
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        (0..10).map(|_| Ok(vec![b' '; 1000])).collect();
    let streamed = reqwest::Body::wrap_stream(futures_util::stream::iter(chunks));
    let (status, body) = post_raw(&s.base, C, streamed).await;
    assert_error(status, &body, 413, "invalid_request_error", None);
    let (status, _, _) = post(
        &s.base,
        C,
        &json!({"prompt": "a ".repeat(100), "max_tokens": 1}),
    )
    .await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn overload_is_429_with_retry_after() {
    let mut cfg = test_config();
    cfg.engine.max_num_seqs = 1;
    cfg.engine.max_waiting = 1;
    let s = start(cfg);
    let long = json!({"prompt": "Once", "max_tokens": 2000, "ignore_eos": true, "stream": true});
    let c = client();
    let first = c
        .post(format!("{}{C}", s.base))
        .json(&long)
        .send()
        .await
        .unwrap();
    let mut first_body = first.bytes_stream();
    first_body.next().await.unwrap().unwrap();
    let second = c
        .post(format!("{}{C}", s.base))
        .json(&long)
        .send()
        .await
        .unwrap();
    assert_eq!(second.status().as_u16(), 200);
    let text = wait_metrics(&s.base, Duration::from_secs(10), |t| {
        metric(t, "kiln_requests_waiting") == Some(1.0)
    })
    .await;
    assert_eq!(metric(&text, "kiln_requests_waiting"), Some(1.0), "{text}");
    let (status, headers, body) =
        post(&s.base, C, &json!({"prompt": "Once", "max_tokens": 2})).await;
    assert_error(status, &body, 429, "rate_limit_error", None);
    let retry: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(retry >= 1);
    drop(first_body);
    drop(second);
    let text = wait_metrics(&s.base, Duration::from_secs(10), |t| {
        metric(t, "kiln_requests_running") == Some(0.0)
            && metric(t, "kiln_requests_waiting") == Some(0.0)
    })
    .await;
    assert_eq!(
        metric(&text, "kiln_kv_cache_usage_ratio"),
        Some(0.0),
        "{text}"
    );
    let (status, _, _) = post(&s.base, C, &json!({"prompt": "Once", "max_tokens": 2})).await;
    assert_eq!(status, 200, "serves again once the queue drains");
}

#[tokio::test]
async fn not_ready_is_503_until_the_engine_is_set() {
    let cfg = test_config();
    let state = Data::new(AppState::new(cfg.clone()));
    let server = Server::start(state.clone(), TcpListener::bind("127.0.0.1:0").unwrap()).unwrap();
    let base = format!("http://{}", server.addr());
    let (status, text) = get(&base, "/health").await;
    assert_error(
        status,
        &serde_json::from_str(&text).unwrap(),
        503,
        "service_unavailable_error",
        None,
    );
    let (status, _, body) = post(&base, C, &json!({"prompt": "Once"})).await;
    assert_error(status, &body, 503, "service_unavailable_error", None);
    assert_eq!(
        get(&base, "/metrics").await.0,
        200,
        "metrics work while loading"
    );
    let engine = tokio::task::spawn_blocking(move || {
        Engine::start(model_files(), &[Device::Cpu], cfg.engine).unwrap()
    })
    .await
    .unwrap();
    state.set_engine(engine.client()).unwrap();
    assert_eq!(get(&base, "/health").await.0, 200);
    let (status, _, _) = post(&base, C, &json!({"prompt": "Once", "max_tokens": 2})).await;
    assert_eq!(status, 200);
}
