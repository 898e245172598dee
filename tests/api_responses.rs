//! `POST /v1/responses` and the stored-response routes against real servers: the stories260K
//! fixture for plain text and streams, `llama-2-tiny-random.gguf` (a real vocabulary, random
//! weights) where a constraint decides the output (function calls, `text.format`), and the
//! SQLite store across a restart on the same file.

mod api_support;

use std::path::PathBuf;
use std::sync::OnceLock;

use api_support::*;
use kiln::config::Config;
use kiln::model::{LoadFormat, ModelFiles};
use serde_json::{Value, json};

/// A fresh store path under the temporary directory.
fn store_path(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "kiln-responses-{name}-{}-{:x}",
        std::process::id(),
        rand_suffix()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("responses.sqlite3")
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

fn config_at(path: &std::path::Path) -> Config {
    let mut cfg = test_config();
    cfg.responses.store_path = Some(path.to_path_buf());
    cfg
}

fn stories() -> &'static TestServer {
    static SERVER: OnceLock<TestServer> = OnceLock::new();
    SERVER.get_or_init(|| start(config_at(&store_path("stories"))))
}

fn tiny_files() -> ModelFiles {
    let path = kiln::config::project_root().join("../shared/models/llama-2-tiny-random.gguf");
    ModelFiles::open(&path, LoadFormat::Auto).expect("llama-2-tiny-random.gguf")
}

fn tiny() -> &'static TestServer {
    static SERVER: OnceLock<TestServer> = OnceLock::new();
    SERVER.get_or_init(|| start_with(tiny_files(), config_at(&store_path("tiny"))))
}

async fn get_json(base: &str, path: &str) -> (u16, Value) {
    let (status, text) = get(base, path).await;
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

async fn delete(base: &str, path: &str) -> (u16, Value) {
    let res = client()
        .delete(format!("{base}{path}"))
        .send()
        .await
        .expect("send");
    let status = res.status().as_u16();
    let text = res.text().await.expect("body");
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// The `event:` / `data:` frames of a Responses stream, checked to agree on the type.
fn events(raw: &str) -> Vec<Value> {
    raw.split("\n\n")
        .filter(|f| f.starts_with("event: "))
        .map(|f| {
            let (head, data) = f.split_once("\ndata: ").expect("data line");
            let v: Value = serde_json::from_str(data).expect("event JSON");
            assert_eq!(head.strip_prefix("event: ").unwrap(), v["type"], "{f}");
            v
        })
        .collect()
}

/// The text of every `output_text` part of a response.
fn output_text(r: &Value) -> String {
    r["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["type"] == "message")
        .flat_map(|i| i["content"].as_array().unwrap().clone())
        .map(|p| p["text"].as_str().unwrap().to_string())
        .collect()
}

fn check_usage(r: &Value) {
    let u = &r["usage"];
    let (i, o) = (
        u["input_tokens"].as_u64().unwrap(),
        u["output_tokens"].as_u64().unwrap(),
    );
    assert!(i > 0, "{r}");
    assert_eq!(u["total_tokens"].as_u64().unwrap(), i + o, "{r}");
    assert!(u["input_tokens_details"]["cached_tokens"].as_u64().unwrap() <= i);
    assert!(u["output_tokens_details"]["reasoning_tokens"].is_u64());
}

#[tokio::test]
async fn plain_response_has_the_openai_shape() {
    let body = json!({"model": "stories260K.gguf", "input": "Once upon a time", "max_output_tokens": 8,
        "temperature": 0, "instructions": "Tell a story.", "metadata": {"k": "v"}, "user": "u1"});
    let (status, _, r) = post(&stories().base, "/v1/responses", &body).await;
    assert_eq!(status, 200, "{r}");
    assert!(r["id"].as_str().unwrap().starts_with("resp_"), "{r}");
    assert_eq!(r["object"], "response");
    assert!(r["created_at"].as_u64().unwrap() > 0);
    assert_eq!(r["model"], "stories260K.gguf");
    assert_eq!(r["instructions"], "Tell a story.");
    assert_eq!(r["metadata"], json!({"k": "v"}));
    assert_eq!(r["user"], "u1");
    assert_eq!(r["max_output_tokens"], 8);
    assert_eq!(r["store"], true);
    assert_eq!(r["tool_choice"], "auto");
    assert_eq!(r["text"], json!({"format": {"type": "text"}}));
    check_usage(&r);
    let out = r["usage"]["output_tokens"].as_u64().unwrap();
    let msg = &r["output"][0];
    assert_eq!(msg["type"], "message", "{r}");
    assert!(msg["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(msg["role"], "assistant");
    assert_eq!(msg["content"][0]["type"], "output_text");
    assert_eq!(msg["content"][0]["annotations"], json!([]));
    assert!(!output_text(&r).is_empty());
    if out == 8 {
        assert_eq!(r["status"], "incomplete", "{r}");
        assert_eq!(r["incomplete_details"]["reason"], "max_output_tokens");
        assert_eq!(msg["status"], "incomplete");
    } else {
        assert_eq!(r["status"], "completed", "{r}");
        assert!(r["incomplete_details"].is_null());
    }
    // Stored: GET gives the same object back.
    let id = r["id"].as_str().unwrap();
    let (status, got) = get_json(&stories().base, &format!("/v1/responses/{id}")).await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(got, r);
}

#[tokio::test]
async fn input_items_of_every_kind_render_and_are_stored() {
    let input = json!([
        {"type": "message", "role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "input_text", "text": "Once upon"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "think"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "a time"}]},
        {"type": "function_call", "call_id": "call_9", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_9", "output": [{"type": "input_text", "text": "42"}]},
        {"role": "user", "content": "Go on."},
    ]);
    let (status, _, r) = post(
        &stories().base,
        "/v1/responses",
        &json!({"input": input, "max_output_tokens": 2}),
    )
    .await;
    assert_eq!(status, 200, "{r}");
    let id = r["id"].as_str().unwrap();
    let (_, page) = get_json(
        &stories().base,
        &format!("/v1/responses/{id}/input_items?limit=3"),
    )
    .await;
    let kinds: Vec<&str> = page["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        ["message", "function_call_output", "function_call"],
        "newest first: {page}"
    );
    assert_eq!(page["has_more"], true);
    assert_eq!(page["data"][1]["output"], "42");
    let after = page["last_id"].as_str().unwrap();
    let (_, rest) = get_json(
        &stories().base,
        &format!("/v1/responses/{id}/input_items?after={after}&limit=100"),
    )
    .await;
    let kinds: Vec<&str> = rest["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        ["message", "reasoning", "message", "message"],
        "{rest}"
    );
    assert_eq!(rest["data"][1]["id"], "rs_1");
    assert_eq!(rest["data"][3]["role"], "developer");
    assert_eq!(rest["has_more"], false);
}

#[tokio::test]
async fn stream_events_come_in_order_and_add_up() {
    let body = json!({"input": [{"role": "user", "content": "Once upon a time"}],
        "max_output_tokens": 24, "temperature": 0});
    let (_, _, whole) = post(&stories().base, "/v1/responses", &body).await;
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let sse = stream(&stories().base, "/v1/responses", &streamed).await;
    assert_eq!(sse.status, 200);
    assert!(sse.content_type.starts_with("text/event-stream"));
    let ev = events(&sse.raw);
    for (i, e) in ev.iter().enumerate() {
        assert_eq!(e["sequence_number"], i, "{e}");
    }
    let kinds: Vec<&str> = ev.iter().map(|e| e["type"].as_str().unwrap()).collect();
    let last = *kinds.last().unwrap();
    assert!(
        ["response.completed", "response.incomplete"].contains(&last),
        "{kinds:?}"
    );
    let deltas = kinds
        .iter()
        .filter(|k| **k == "response.output_text.delta")
        .count();
    let mut want = vec![
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ];
    want.extend(std::iter::repeat_n("response.output_text.delta", deltas));
    want.extend([
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        last,
    ]);
    assert_eq!(kinds, want);
    let text: String = ev
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .map(|e| e["delta"].as_str().unwrap())
        .collect();
    let done = &ev[ev.len() - 2];
    let final_r = &ev.last().unwrap()["response"];
    assert_eq!(text, output_text(&whole), "greedy stream == non-streamed");
    assert_eq!(text, output_text(final_r));
    assert_eq!(done["item"], final_r["output"][0]);
    assert_eq!(final_r["id"], ev[0]["response"]["id"]);
    assert_eq!(ev[0]["response"]["status"], "in_progress");
    assert_eq!(final_r["status"], whole["status"]);
    assert_eq!(
        final_r["usage"]["output_tokens"],
        whole["usage"]["output_tokens"]
    );
    check_usage(final_r);
    // The streamed response was stored too.
    let id = final_r["id"].as_str().unwrap();
    let (status, got) = get_json(&stories().base, &format!("/v1/responses/{id}")).await;
    assert_eq!(status, 200);
    assert_eq!(&got, final_r);
}

fn weather_tool() -> Value {
    json!({"type": "function", "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object",
            "properties": {"city": {"enum": ["Paris", "Oslo"]}},
            "required": ["city"], "additionalProperties": false},
        "strict": true})
}

#[tokio::test]
async fn function_tool_round_trip() {
    let base = &tiny().base;
    let body = json!({"input": "Weather in Paris?", "tools": [weather_tool()],
        "tool_choice": "required", "parallel_tool_calls": false, "max_output_tokens": 200, "temperature": 0});
    let (status, _, r) = post(base, "/v1/responses", &body).await;
    assert_eq!(status, 200, "{r}");
    let call = r["output"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["type"] == "function_call")
        .unwrap_or_else(|| panic!("no call in {r}"))
        .clone();
    assert_eq!(call["name"], "get_weather");
    assert!(call["id"].as_str().unwrap().starts_with("fc_"));
    assert!(call["call_id"].as_str().unwrap().starts_with("call_"));
    assert_eq!(call["status"], "completed", "{r}");
    let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert!(
        args["city"].as_str().unwrap().chars().count() <= 12,
        "{args}"
    );
    assert_eq!(r["status"], "completed");
    // Named function, streamed: the argument deltas add up to the call's arguments.
    let mut named = body.clone();
    named["tool_choice"] = json!({"type": "function", "name": "get_weather"});
    named["stream"] = json!(true);
    let ev = events(&stream(base, "/v1/responses", &named).await.raw);
    let args: String = ev
        .iter()
        .filter(|e| e["type"] == "response.function_call_arguments.delta")
        .map(|e| e["delta"].as_str().unwrap())
        .collect();
    let done = ev
        .iter()
        .find(|e| e["type"] == "response.function_call_arguments.done")
        .expect("arguments done");
    assert_eq!(done["arguments"], args);
    serde_json::from_str::<Value>(&args).expect("streamed arguments are JSON");
    // The tool's answer goes back with previous_response_id.
    let next = json!({"previous_response_id": r["id"], "tools": [weather_tool()],
        "input": [{"type": "function_call_output", "call_id": call["call_id"], "output": "Sunny, 21 C"}],
        "max_output_tokens": 4, "tool_choice": "auto"});
    let (status, _, r2) = post(base, "/v1/responses", &next).await;
    assert_eq!(status, 200, "{r2}");
    assert_eq!(r2["previous_response_id"], r["id"]);
    // The conversation grew by the first turn: more prompt tokens than the call alone.
    assert!(
        r2["usage"]["input_tokens"].as_u64().unwrap()
            > r["usage"]["input_tokens"].as_u64().unwrap(),
        "{r2}"
    );
    let id = r2["id"].as_str().unwrap();
    let (status, items) = get_json(base, &format!("/v1/responses/{id}/input_items")).await;
    assert_eq!(status, 200, "{items}");
    assert_eq!(items["object"], "list");
    assert_eq!(items["data"].as_array().unwrap().len(), 1, "{items}");
    assert_eq!(items["data"][0]["type"], "function_call_output");
    assert_eq!(items["data"][0]["output"], "Sunny, 21 C");
    assert_eq!(items["first_id"], items["data"][0]["id"]);
    assert_eq!(items["has_more"], false);
}

#[tokio::test]
async fn json_schema_format_output_fits() {
    let schema = json!({"type": "object",
        "properties": {"ok": {"type": "boolean"}, "city": {"enum": ["Oslo", "Lima"]}},
        "required": ["ok", "city"], "additionalProperties": false});
    let body = json!({"input": "Answer in JSON.", "max_output_tokens": 120, "temperature": 0,
        "text": {"format": {"type": "json_schema", "name": "answer", "schema": schema, "strict": true}}});
    let (status, _, r) = post(&tiny().base, "/v1/responses", &body).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(r["text"]["format"]["name"], "answer");
    let v: Value = serde_json::from_str(&output_text(&r)).expect("JSON output");
    assert!(v["ok"].is_boolean(), "{v}");
    assert!(
        ["Oslo", "Lima"].contains(&v["city"].as_str().unwrap()),
        "{v}"
    );
    assert_eq!(v.as_object().unwrap().len(), 2);
    let obj = json!({"input": "JSON please.", "max_output_tokens": 120, "temperature": 0,
        "text": {"format": {"type": "json_object"}}});
    let (status, _, r) = post(&tiny().base, "/v1/responses", &obj).await;
    assert_eq!(status, 200, "{r}");
    if r["status"] == "completed" {
        assert!(
            serde_json::from_str::<Value>(&output_text(&r))
                .unwrap()
                .is_object()
        );
    }
}

#[tokio::test]
async fn previous_response_survives_a_restart() {
    let path = store_path("restart");
    let first = {
        let a = start(config_at(&path));
        let (status, _, r) = post(
            &a.base,
            "/v1/responses",
            &json!({"input": "Once upon a time", "max_output_tokens": 6, "temperature": 0}),
        )
        .await;
        assert_eq!(status, 200, "{r}");
        a.server.handle().stop(true).await;
        a.engine.shutdown();
        r
    };
    let b = start(config_at(&path));
    let id = first["id"].as_str().unwrap();
    let (status, got) = get_json(&b.base, &format!("/v1/responses/{id}")).await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(got, first);
    let (status, _, r2) = post(
        &b.base,
        "/v1/responses",
        &json!({"previous_response_id": id, "input": "And then?", "max_output_tokens": 4}),
    )
    .await;
    assert_eq!(status, 200, "{r2}");
    assert!(r2["usage"]["input_tokens"].as_u64() > first["usage"]["input_tokens"].as_u64());
    // input_items: the first response's own items, newest first by default, paged.
    let (_, items) = get_json(
        &b.base,
        &format!("/v1/responses/{id}/input_items?order=asc&limit=1"),
    )
    .await;
    assert_eq!(items["data"][0]["type"], "message", "{items}");
    assert_eq!(items["data"][0]["role"], "user");
    assert_eq!(
        items["data"][0]["content"][0],
        json!({"type": "input_text", "text": "Once upon a time"})
    );
    assert_eq!(items["has_more"], false);
    // Deleted: gone, and a chain through it is a 404 naming previous_response_id.
    let (status, d) = delete(&b.base, &format!("/v1/responses/{id}")).await;
    assert_eq!(status, 200, "{d}");
    assert_eq!(d, json!({"id": id, "object": "response", "deleted": true}));
    let (status, e) = get_json(&b.base, &format!("/v1/responses/{id}")).await;
    assert_error(
        status,
        &e,
        404,
        "invalid_request_error",
        Some("response_id"),
    );
    let (status, e) = delete(&b.base, &format!("/v1/responses/{id}")).await;
    assert_error(
        status,
        &e,
        404,
        "invalid_request_error",
        Some("response_id"),
    );
    let (status, _, e) = post(
        &b.base,
        "/v1/responses",
        &json!({"previous_response_id": r2["id"], "input": "More"}),
    )
    .await;
    assert_error(
        status,
        &e,
        404,
        "invalid_request_error",
        Some("previous_response_id"),
    );
}

#[tokio::test]
async fn a_foreign_store_file_is_moved_aside() {
    let path = store_path("foreign");
    std::fs::write(&path, b"not a database, but somebody's file").unwrap();
    let s = start(config_at(&path));
    let (status, _, r) = post(
        &s.base,
        "/v1/responses",
        &json!({"input": "Hi", "max_output_tokens": 2}),
    )
    .await;
    assert_eq!(status, 200, "{r}");
    let dir = path.parent().unwrap();
    let aside: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains("unreadable"))
        .collect();
    assert_eq!(aside.len(), 1);
    assert_eq!(
        std::fs::read(aside[0].path()).unwrap(),
        b"not a database, but somebody's file"
    );
    let id = r["id"].as_str().unwrap();
    assert_eq!(
        get_json(&s.base, &format!("/v1/responses/{id}")).await.0,
        200
    );
}

#[tokio::test]
async fn store_false_keeps_nothing_and_bounds_hold() {
    let path = store_path("bounds");
    let mut cfg = config_at(&path);
    cfg.responses.max_entries = 2;
    let s = start(cfg);
    let (_, _, r) = post(
        &s.base,
        "/v1/responses",
        &json!({"input": "Hi", "max_output_tokens": 2, "store": false}),
    )
    .await;
    assert_eq!(r["store"], false);
    let (status, e) = get_json(
        &s.base,
        &format!("/v1/responses/{}", r["id"].as_str().unwrap()),
    )
    .await;
    assert_error(
        status,
        &e,
        404,
        "invalid_request_error",
        Some("response_id"),
    );
    let mut ids = Vec::new();
    for _ in 0..3 {
        let (_, _, r) = post(
            &s.base,
            "/v1/responses",
            &json!({"input": "Hi", "max_output_tokens": 2}),
        )
        .await;
        ids.push(r["id"].as_str().unwrap().to_string());
    }
    let mut found = Vec::new();
    for id in &ids {
        found.push(get_json(&s.base, &format!("/v1/responses/{id}")).await.0);
    }
    assert_eq!(found.iter().filter(|s| **s == 200).count(), 2, "{found:?}");
    assert_eq!(found[2], 200, "the newest is kept");
}

#[tokio::test]
async fn cancel_ends_an_in_flight_stream() {
    use futures_util::StreamExt;
    let base = &tiny().base;
    let res = client()
        .post(format!("{base}/v1/responses"))
        .json(
            &json!({"input": "Tell me everything.", "stream": true, "temperature": 1.0, "seed": 3}),
        )
        .send()
        .await
        .unwrap();
    let mut body = res.bytes_stream();
    let mut raw = String::new();
    while !raw.contains("response.output_text.delta") {
        raw.push_str(std::str::from_utf8(&body.next().await.unwrap().unwrap()).unwrap());
    }
    let id = events(raw.split("event: response.in_progress").next().unwrap())[0]["response"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let (status, got) = get_json(base, &format!("/v1/responses/{id}")).await;
    assert_eq!(
        (status, got["status"].as_str()),
        (200, Some("in_progress")),
        "{got}"
    );
    let (status, _, c) = post(base, &format!("/v1/responses/{id}/cancel"), &json!({})).await;
    assert_eq!(status, 200, "{c}");
    assert_eq!(c["status"], "cancelled", "{c}");
    while let Some(chunk) = body.next().await {
        raw.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
    }
    let ev = events(&raw);
    assert_eq!(ev.last().unwrap()["response"]["status"], "cancelled");
    let (status, got) = get_json(base, &format!("/v1/responses/{id}")).await;
    assert_eq!((status, &got["status"]), (200, &json!("cancelled")));
    // Not in flight any more: a 400; an unknown id: a 404.
    let (status, _, e) = post(base, &format!("/v1/responses/{id}/cancel"), &json!({})).await;
    assert_error(
        status,
        &e,
        400,
        "invalid_request_error",
        Some("response_id"),
    );
    let (status, _, e) = post(base, "/v1/responses/resp_nope/cancel", &json!({})).await;
    assert_error(
        status,
        &e,
        404,
        "invalid_request_error",
        Some("response_id"),
    );
}

#[tokio::test]
async fn bad_inputs_are_400s_naming_the_field() {
    let base = &stories().base;
    let cases = [
        (
            json!({"input": "x", "tools": [{"type": "web_search"}]}),
            "tools[0].type",
        ),
        (json!({"input": "x", "background": true}), "background"),
        (
            json!({"input": "x", "conversation": "conv_1"}),
            "conversation",
        ),
        (
            json!({"input": "x", "include": ["file_search_call.results"]}),
            "include",
        ),
        (json!({"input": "x", "frobnicate": 1}), "frobnicate"),
        (
            json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}),
            "input[0].content[0].type",
        ),
        (
            json!({"input": [{"role": "robot", "content": "x"}]}),
            "input[0].role",
        ),
        (
            json!({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}),
            "input[0].call_id",
        ),
        (
            json!({"input": "x", "reasoning": {"effort": "high"}}),
            "reasoning.effort",
        ),
        (
            json!({"input": "x", "reasoning": {"summary": "auto"}}),
            "reasoning.summary",
        ),
        (
            json!({"input": "x", "text": {"format": {"type": "xml"}}}),
            "text.format.type",
        ),
        (
            json!({"input": "x", "tool_choice": "required"}),
            "tool_choice",
        ),
        (
            json!({"input": "x", "max_output_tokens": 0}),
            "max_output_tokens",
        ),
        (json!({"input": "x", "temperature": 9}), "temperature"),
        (json!({"input": "x", "metadata": {"k": 1}}), "metadata"),
        (json!({"input": []}), "input"),
        (json!({"input": 5}), "input"),
    ];
    for (body, param) in cases {
        let (status, _, e) = post(base, "/v1/responses", &body).await;
        assert_error(status, &e, 400, "invalid_request_error", Some(param));
    }
    let (status, _, e) = post(
        base,
        "/v1/responses",
        &json!({"input": "x", "model": "gpt-9"}),
    )
    .await;
    assert_error(status, &e, 404, "not_found_error", Some("model"));
    let (status, e) = get_json(base, "/v1/responses/resp_missing/input_items").await;
    assert_error(
        status,
        &e,
        404,
        "invalid_request_error",
        Some("response_id"),
    );
    // Nothing lost: the server serves on.
    let (status, _, r) = post(
        base,
        "/v1/responses",
        &json!({"input": "Hi", "max_output_tokens": 2}),
    )
    .await;
    assert_eq!(status, 200, "{r}");
}
