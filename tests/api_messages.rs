//! Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`) against real
//! servers: bodies and streams (events in Anthropic's order, adding up to the whole reply),
//! stop sequences, tools with a `tool_use` / `tool_result` round trip on the random Llama-2
//! vocabulary, thinking through the reasoning parser, and errors in Anthropic's shape.

mod api_support;
mod markup_support;

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use api_support::*;
use serde_json::{Value, json};

const M: &str = "/v1/messages";
const COUNT: &str = "/v1/messages/count_tokens";
const KEY: &str = "sk-kiln-anthropic";

/// stories260K behind an API key.
fn server() -> &'static TestServer {
    static SERVER: OnceLock<TestServer> = OnceLock::new();
    SERVER.get_or_init(|| {
        let mut cfg = test_config();
        cfg.server.api_keys = vec![KEY.into()];
        start(cfg)
    })
}

/// The random Llama-2 with `<tool_call>` / `<think>` as special tokens; no reasoning parser
/// configured (`thinking` turns it on per request). Its default template opens `<think>`.
fn markup_server() -> &'static TestServer {
    static SERVER: OnceLock<TestServer> = OnceLock::new();
    SERVER.get_or_init(|| {
        let mut cfg = test_config();
        cfg.server.api_keys = vec![KEY.into()];
        markup_support::start_patched(cfg)
    })
}

/// POSTs with `headers`; returns status and the parsed body (Null if not JSON) and raw text.
async fn send(
    base: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &Value,
) -> (u16, Value, String) {
    let mut req = client().post(format!("{base}{path}")).json(body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let res = req.send().await.expect("send");
    let status = res.status().as_u16();
    let text = res.text().await.expect("body");
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::Null),
        text,
    )
}

const AUTH: &[(&str, &str)] = &[("x-api-key", KEY), ("anthropic-version", "2023-06-01")];

async fn create(s: &TestServer, body: &Value) -> Value {
    let (status, body, _) = send(&s.base, M, AUTH, body).await;
    assert_eq!(status, 200, "{body}");
    body
}

/// The `event:` / `data:` frames of a stream, each event's name checked against its `type`.
async fn events(s: &TestServer, body: &Value) -> Vec<Value> {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let (status, _, raw) = send(&s.base, M, AUTH, &body).await;
    assert_eq!(status, 200, "{raw}");
    raw.split("\n\n")
        .filter(|f| !f.trim().is_empty() && !f.starts_with(':'))
        .map(|f| {
            let (event, data) = f.split_once('\n').unwrap_or_else(|| panic!("frame {f:?}"));
            let name = event.strip_prefix("event: ").expect("an event line");
            let data: Value = serde_json::from_str(data.strip_prefix("data: ").expect("data"))
                .unwrap_or_else(|e| panic!("{f:?}: {e}"));
            assert_eq!(data["type"], name, "{f}");
            data
        })
        .collect()
}

/// Puts a stream together as Anthropic's SDK does, asserting the order on the way:
/// `message_start`, `ping`, blocks opened, filled and closed one at a time in index order,
/// `message_delta`, `message_stop`.
fn accumulate(events: &[Value]) -> Value {
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(kinds[..2], ["message_start", "ping"], "{kinds:?}");
    assert_eq!(
        kinds[kinds.len() - 2..],
        ["message_delta", "message_stop"],
        "{kinds:?}"
    );
    let mut msg = events[0]["message"].clone();
    assert_eq!(msg["content"], json!([]));
    assert!(msg["stop_reason"].is_null());
    let mut open: Option<usize> = None;
    let mut json_bufs: Vec<String> = Vec::new();
    for e in &events[2..events.len() - 2] {
        let index = e["index"].as_u64().expect("index") as usize;
        match e["type"].as_str().unwrap() {
            "content_block_start" => {
                assert!(open.is_none(), "a block starts while another is open: {e}");
                let content = msg["content"].as_array_mut().unwrap();
                assert_eq!(index, content.len(), "blocks start in order");
                content.push(e["content_block"].clone());
                json_bufs.push(String::new());
                open = Some(index);
            }
            "content_block_delta" => {
                assert_eq!(open, Some(index), "a delta for the open block: {e}");
                let block = &mut msg["content"][index];
                let d = &e["delta"];
                match (block["type"].as_str().unwrap(), d["type"].as_str().unwrap()) {
                    ("text", "text_delta") => {
                        block["text"] = json!(
                            block["text"].as_str().unwrap().to_owned()
                                + d["text"].as_str().unwrap()
                        )
                    }
                    ("thinking", "thinking_delta") => {
                        block["thinking"] = json!(
                            block["thinking"].as_str().unwrap().to_owned()
                                + d["thinking"].as_str().unwrap()
                        )
                    }
                    ("thinking", "signature_delta") => block["signature"] = d["signature"].clone(),
                    ("tool_use", "input_json_delta") => {
                        json_bufs[index] += d["partial_json"].as_str().unwrap()
                    }
                    other => panic!("delta {other:?} in {e}"),
                }
            }
            "content_block_stop" => {
                assert_eq!(open.take(), Some(index), "{e}");
                let block = &mut msg["content"][index];
                if block["type"] == "tool_use" && !json_bufs[index].is_empty() {
                    block["input"] =
                        serde_json::from_str(&json_bufs[index]).expect("whole JSON input");
                }
            }
            other => panic!("unexpected event {other} inside the message"),
        }
    }
    assert!(open.is_none(), "every block is closed");
    let last = &events[events.len() - 2];
    msg["stop_reason"] = last["delta"]["stop_reason"].clone();
    msg["stop_sequence"] = last["delta"]["stop_sequence"].clone();
    msg["usage"] = last["usage"].clone();
    msg
}

/// A reply without its random ids (message and tool uses), its prompt counted whole (a
/// repeated prompt is read from the prefix cache: `cache_read_input_tokens` grows).
fn without_ids(mut v: Value) -> Value {
    v["id"] = Value::Null;
    let u = &v["usage"];
    let input =
        u["input_tokens"].as_u64().unwrap() + u["cache_read_input_tokens"].as_u64().unwrap();
    assert_eq!(u["cache_creation_input_tokens"], 0, "{v}");
    v["usage"] = json!({"prompt": input, "output_tokens": u["output_tokens"]});
    for b in v["content"].as_array_mut().into_iter().flatten() {
        if b["type"] == "tool_use" {
            assert!(b["id"].as_str().unwrap().starts_with("toolu_"), "{b}");
            b["id"] = Value::Null;
        }
    }
    v
}

fn story_request() -> Value {
    json!({"model": "stories260K.gguf", "max_tokens": 40, "temperature": 0,
           "system": [{"type": "text", "text": "You tell short stories."}],
           "messages": [{"role": "user", "content": [{"type": "text", "text": "Tell me about a cat."}]}],
           "metadata": {"user_id": "u-1"}})
}

#[tokio::test]
async fn a_message_and_its_stream_agree() {
    let s = server();
    let body = create(s, &story_request()).await;
    assert!(body["id"].as_str().unwrap().starts_with("msg_"), "{body}");
    assert_eq!(
        (body["type"].as_str(), body["role"].as_str()),
        (Some("message"), Some("assistant"))
    );
    assert_eq!(body["model"], "stories260K.gguf");
    let content = body["content"].as_array().unwrap();
    assert_eq!(content.len(), 1, "{body}");
    assert_eq!(content[0]["type"], "text");
    assert!(!content[0]["text"].as_str().unwrap().is_empty());
    assert!(
        ["end_turn", "max_tokens"].contains(&body["stop_reason"].as_str().unwrap()),
        "{body}"
    );
    assert!(body["stop_sequence"].is_null());
    let usage = &body["usage"];
    assert!(
        usage["input_tokens"].as_u64().unwrap()
            + usage["cache_read_input_tokens"].as_u64().unwrap()
            > 10
    );
    assert!(usage["output_tokens"].as_u64().unwrap() > 0);
    let streamed = accumulate(&events(s, &story_request()).await);
    let again = create(s, &story_request()).await;
    let cached = again["usage"]["cache_read_input_tokens"].as_u64().unwrap();
    assert!(
        cached > 0,
        "a repeated prompt is read from the prefix cache: {again}"
    );
    assert_eq!(without_ids(again), without_ids(body.clone()));
    assert_eq!(
        without_ids(streamed),
        without_ids(body.clone()),
        "the stream adds up to the message"
    );

    let (status, counted, _) = send(&s.base, COUNT, AUTH, &story_request()).await;
    assert_eq!(status, 200, "{counted}");
    let input = usage["input_tokens"].as_u64().unwrap()
        + usage["cache_read_input_tokens"].as_u64().unwrap();
    assert_eq!(counted, json!({"input_tokens": input}));
    let mut no_max = story_request();
    no_max.as_object_mut().unwrap().remove("max_tokens");
    let (status, again, _) = send(&s.base, COUNT, AUTH, &no_max).await;
    assert_eq!(
        (status, again),
        (200, counted),
        "count_tokens needs no max_tokens"
    );
}

#[tokio::test]
async fn a_stop_sequence_ends_the_reply_and_is_named() {
    let s = server();
    let whole = create(s, &story_request()).await;
    let text = whole["content"][0]["text"].as_str().unwrap().to_string();
    let words: Vec<&str> = text.split_whitespace().collect();
    assert!(words.len() > 4, "{text}");
    let stop = words[3].to_string();
    let mut req = story_request();
    req["stop_sequences"] = json!([stop, "never-in-a-story"]);
    let body = create(s, &req).await;
    assert_eq!(body["stop_reason"], "stop_sequence", "{body}");
    assert_eq!(body["stop_sequence"], stop);
    let cut = body["content"][0]["text"].as_str().unwrap();
    assert!(
        text.starts_with(cut) && !cut.contains(&stop),
        "{cut:?} of {text:?}"
    );
    let streamed = accumulate(&events(s, &req).await);
    assert_eq!(without_ids(streamed), without_ids(body));

    req["stop_sequences"] = json!(["never-in-a-story"]);
    req["max_tokens"] = json!(3);
    let body = create(s, &req).await;
    assert_eq!(
        (
            body["stop_reason"].as_str(),
            body["stop_sequence"].as_null()
        ),
        (Some("max_tokens"), Some(()))
    );
    assert_eq!(body["usage"]["output_tokens"], 3);
}

/// Asserts Anthropic's error body.
fn assert_anthropic_error(
    status: u16,
    body: &Value,
    want_status: u16,
    want_type: &str,
    mentions: &str,
) {
    assert_eq!(status, want_status, "{body}");
    assert_eq!(body["type"], "error", "{body}");
    assert_eq!(body["error"]["type"], want_type, "{body}");
    let message = body["error"]["message"].as_str().expect("a message");
    assert!(message.contains(mentions), "{mentions:?} in {body}");
    assert!(
        body.get("code").is_none() && body["error"].get("param").is_none(),
        "{body}"
    );
}

#[tokio::test]
async fn errors_are_in_anthropics_shape_and_the_server_serves_on() {
    let s = server();
    let user = json!([{"role": "user", "content": "hi"}]);
    let cases = [
        (
            json!({"messages": user}),
            400,
            "invalid_request_error",
            "max_tokens",
        ),
        (
            json!({"max_tokens": 4, "messages": [{"role": "user", "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}]}),
            400,
            "invalid_request_error",
            "image",
        ),
        (
            json!({"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "tool_result",
                "tool_use_id": "toolu_1", "content": [{"type": "document", "source": {}}]}]}]}),
            400,
            "invalid_request_error",
            "document",
        ),
        (
            json!({"max_tokens": 4, "messages": []}),
            400,
            "invalid_request_error",
            "messages",
        ),
        (
            json!({"max_tokens": 4, "messages": user, "temperature": 1.5}),
            400,
            "invalid_request_error",
            "temperature",
        ),
        (
            json!({"max_tokens": "four", "messages": user}),
            400,
            "invalid_request_error",
            "max_tokens",
        ),
        (
            json!({"max_tokens": 4, "messages": [{"role": "system", "content": "x"}]}),
            400,
            "invalid_request_error",
            "role",
        ),
        (
            json!({"max_tokens": 4, "messages": user, "tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
            400,
            "invalid_request_error",
            "web_search_20250305",
        ),
        (
            json!({"max_tokens": 4, "messages": user, "tool_choice": {"type": "tool", "name": "nope"},
                   "tools": [{"name": "f", "input_schema": {"type": "object"}}]}),
            400,
            "invalid_request_error",
            "nope",
        ),
        (
            json!({"max_tokens": 4, "messages": user, "thinking": {"type": "enabled", "budget_tokens": 8}}),
            400,
            "invalid_request_error",
            "budget_tokens",
        ),
        (
            json!({"model": "claude-nope", "max_tokens": 4, "messages": user}),
            404,
            "not_found_error",
            "claude-nope",
        ),
    ];
    for (body, status, kind, mentions) in cases {
        let (got, res, _) = send(&s.base, M, AUTH, &body).await;
        assert_anthropic_error(got, &res, status, kind, mentions);
    }
    let (got, res, _) = send(
        &s.base,
        COUNT,
        AUTH,
        &json!({"messages": [{"role": "user", "content": [{"type": "image"}]}]}),
    )
    .await;
    assert_anthropic_error(got, &res, 400, "invalid_request_error", "image");
    let (got, res, _) = send(&s.base, M, &[], &json!({"max_tokens": 4, "messages": user})).await;
    assert_anthropic_error(got, &res, 401, "authentication_error", "API key");
    let (got, res, _) = send(
        &s.base,
        M,
        &[("x-api-key", "sk-wrong")],
        &json!({"max_tokens": 4, "messages": user}),
    )
    .await;
    assert_anthropic_error(got, &res, 401, "authentication_error", "API key");
    let bearer = format!("Bearer {KEY}");
    let (got, res, _) = send(
        &s.base,
        M,
        &[("authorization", bearer.as_str())],
        &json!({"max_tokens": 4, "messages": user}),
    )
    .await;
    assert_eq!(got, 200, "a bearer token works too: {res}");
    let res = client()
        .get(format!("{}{M}", s.base))
        .header("x-api-key", KEY)
        .send()
        .await
        .unwrap();
    let status = res.status().as_u16();
    let body: Value = res.json().await.unwrap();
    assert_anthropic_error(status, &body, 404, "not_found_error", "GET");
    let (got, res, _) = send(
        &s.base,
        "/v1/chat/completions",
        &[("x-api-key", KEY)],
        &json!({"messages": user, "max_tokens": 2}),
    )
    .await;
    assert_eq!(
        got, 200,
        "x-api-key is taken on the OpenAI routes too: {res}"
    );
    let (got, res, _) = send(
        &s.base,
        "/v1/chat/completions",
        &[],
        &json!({"messages": user}),
    )
    .await;
    assert_eq!(
        (got, res["error"]["type"].as_str()),
        (401, Some("authentication_error")),
        "OpenAI routes keep OpenAI bodies: {res}"
    );
    let body = create(s, &json!({"max_tokens": 2, "messages": user})).await;
    assert_eq!(body["type"], "message", "the server serves on");
}

fn weather_tool() -> Value {
    json!({"name": "get_weather", "description": "The weather in a city",
           "input_schema": {"type": "object",
               "properties": {"city": {"type": "string", "maxLength": 12},
                              "days": {"type": "integer", "minimum": 1, "maximum": 14}},
               "required": ["city", "days"], "additionalProperties": false}})
}

fn time_tool() -> Value {
    json!({"name": "get_time", "input_schema": {"type": "object",
        "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["zone"],
        "additionalProperties": false}})
}

fn assert_weather_input(input: &Value) {
    let obj = input.as_object().expect("input is an object");
    let city = obj["city"].as_str().expect("city");
    let days = obj["days"].as_i64().expect("days");
    assert!(
        city.chars().count() <= 12 && (1..=14).contains(&days) && obj.len() == 2,
        "{input}"
    );
}

#[tokio::test]
async fn forced_tool_use_streams_and_round_trips() {
    let s = markup_server();
    let question = json!({"role": "user", "content": "Weather in Paris for 2 days?"});
    let req = json!({"max_tokens": 200, "temperature": 0, "messages": [question],
                     "tools": [weather_tool(), time_tool()],
                     "tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": true}});
    let body = create(s, &req).await;
    assert_eq!(body["stop_reason"], "tool_use", "{body}");
    let content = body["content"].as_array().unwrap();
    let call = content
        .iter()
        .find(|b| b["type"] == "tool_use")
        .expect("a tool_use block");
    assert_eq!(call["name"], "get_weather");
    assert_weather_input(&call["input"]);
    assert!(
        content
            .iter()
            .all(|b| b["type"] != "text" || !b["text"].as_str().unwrap().contains("<tool_call>"))
    );
    let streamed = accumulate(&events(s, &req).await);
    assert_eq!(
        without_ids(streamed),
        without_ids(body.clone()),
        "the stream adds up to the message"
    );

    let any = json!({"max_tokens": 200, "temperature": 0, "messages": [question],
                     "tools": [weather_tool(), time_tool()], "tool_choice": {"type": "any"}});
    let body_any = create(s, &any).await;
    assert_eq!(body_any["stop_reason"], "tool_use", "{body_any}");

    // The call and its result go back; the template renders both (the prompt grows by them).
    let id = call["id"].as_str().unwrap();
    let turns = json!([question,
        {"role": "assistant", "content": body["content"]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": id,
            "content": [{"type": "text", "text": "Sunny, 21 C"}]}]}]);
    let follow =
        json!({"max_tokens": 8, "temperature": 0, "messages": turns, "tools": [weather_tool()]});
    let reply = create(s, &follow).await;
    assert_eq!(reply["type"], "message", "{reply}");
    let (status, counted, _) = send(&s.base, COUNT, AUTH, &follow).await;
    assert_eq!(status, 200, "{counted}");
    let tok = markup_support::patched_tokenizer();
    let rendered = "Tools: get_weather. Call one as <tool_call>{json}</tool_call>.\n<|user|>Weather in Paris for 2 days?\n<|assistant|>\n<|tool|>Sunny, 21 C\n<|assistant|>";
    let want = tok.encode(rendered, false).unwrap().len();
    assert_eq!(
        counted["input_tokens"], want,
        "tool_use and tool_result reach the template"
    );
    let usage = &reply["usage"];
    assert_eq!(
        usage["input_tokens"].as_u64().unwrap()
            + usage["cache_read_input_tokens"].as_u64().unwrap(),
        want as u64
    );
    let missing = json!({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "tool_result"}]}]});
    let (status, res, _) = send(&s.base, M, AUTH, &missing).await;
    assert_anthropic_error(status, &res, 400, "invalid_request_error", "tool_use_id");
}

#[tokio::test]
async fn thinking_comes_back_as_signed_thinking_blocks() {
    let s = markup_server();
    let user = json!([{"role": "user", "content": "Why is the sky blue?"}]);
    let req = json!({"max_tokens": 12, "temperature": 0, "messages": user,
                     "thinking": {"type": "enabled", "budget_tokens": 8}});
    let body = create(s, &req).await;
    let content = body["content"].as_array().unwrap();
    assert_eq!(
        content[0]["type"], "thinking",
        "the template opened <think>: {body}"
    );
    assert!(!content[0]["thinking"].as_str().unwrap().is_empty());
    assert!(
        content[0]["signature"]
            .as_str()
            .unwrap()
            .starts_with("kiln-"),
        "{body}"
    );
    assert_eq!(body["stop_reason"], "max_tokens");
    let streamed = accumulate(&events(s, &req).await);
    assert_eq!(
        without_ids(streamed),
        without_ids(body.clone()),
        "thinking streams as thinking_delta"
    );

    // Without `thinking` (and no reasoning parser configured) the same reply is plain text.
    let plain = json!({"max_tokens": 12, "temperature": 0, "messages": user});
    let text = create(s, &plain).await;
    assert_eq!(text["content"][0]["type"], "text", "{text}");
    assert_eq!(
        text["content"][0]["text"].as_str().unwrap().trim(),
        content[0]["thinking"].as_str().unwrap()
    );

    // Thinking, then `</think>`, then a forced call: the logit bias (a Kiln extension) makes
    // the random model open the thinking, think `Hmm` a few times and close it.
    let hmm = markup_support::patched_tokenizer()
        .token_to_id("▁Hmm")
        .unwrap();
    let bias = json!({markup_support::THINK_OPEN.to_string(): 60, hmm.to_string(): 50,
                      markup_support::THINK_CLOSE.to_string(): 40});
    let req = json!({"max_tokens": 80, "temperature": 0, "messages": user,
                     "thinking": {"type": "enabled", "budget_tokens": 40},
                     "tools": [weather_tool()], "tool_choice": {"type": "any"},
                     "logit_bias": bias, "frequency_penalty": 2.0, "presence_penalty": 2.0});
    let body = create(s, &req).await;
    let kinds: Vec<&str> = body["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["type"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["thinking", "tool_use"], "{body}");
    assert_eq!(body["stop_reason"], "tool_use");
    assert_weather_input(&body["content"][1]["input"]);
    let streamed = accumulate(&events(s, &req).await);
    assert_eq!(without_ids(streamed), without_ids(body));
}

#[tokio::test]
async fn a_last_assistant_message_is_a_prefill_the_reply_continues() {
    let s = server();
    let prefill = "Once upon a time";
    let req = json!({"max_tokens": 16, "temperature": 0, "messages": [
        {"role": "user", "content": "Tell me a story."},
        {"role": "assistant", "content": [{"type": "text", "text": prefill}]}]});
    let (status, counted, _) = send(&s.base, COUNT, AUTH, &req).await;
    assert_eq!(status, 200, "{counted}");
    let tok = model_files().tokenizer.unwrap();
    let template = kiln::tokenizer::chat::ChatTemplate::for_tokenizer(&tok).unwrap();
    let user = [kiln::tokenizer::chat::ChatMessage::new(
        "user",
        "Tell me a story.",
    )];
    let text = template.render(&user, true).unwrap() + prefill;
    assert_eq!(
        counted["input_tokens"],
        tok.encode(&text, false).unwrap().len()
    );
    let body = create(s, &req).await;
    let reply = body["content"][0]["text"].as_str().unwrap();
    assert!(
        !reply.is_empty() && !reply.starts_with(prefill),
        "the continuation only: {body}"
    );
}

#[tokio::test]
async fn a_stream_cut_at_the_drain_limit_ends_with_an_error_event() {
    let mut cfg = test_config();
    cfg.server.shutdown_timeout_s = 1;
    cfg.server.sse_keep_alive_s = 0.2;
    // One sequence at a time: the chat request's 16 choices of the whole context hold the
    // engine far longer than the drain, and the message waits behind them.
    cfg.engine.max_num_seqs = 1;
    let s = start(cfg);
    let busy = json!({"messages": [{"role": "user", "content": "Once"}], "n": 16,
                      "ignore_eos": true, "stream": true});
    let chat = client()
        .post(format!("{}/v1/chat/completions", s.base))
        .json(&busy)
        .send()
        .await
        .unwrap();
    assert_eq!(chat.status().as_u16(), 200);
    let body = json!({"max_tokens": 200, "stream": true,
                      "messages": [{"role": "user", "content": "Once"}]});
    let res = client()
        .post(format!("{}{M}", s.base))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 200);
    use futures_util::StreamExt;
    let mut stream = res.bytes_stream();
    let mut raw = stream.next().await.unwrap().unwrap().to_vec();
    let started = Instant::now();
    s.server.shutdown();
    while let Some(chunk) = stream.next().await {
        raw.extend_from_slice(&chunk.expect("the transfer ends cleanly"));
    }
    let text = String::from_utf8(raw).unwrap();
    assert!(text.starts_with("event: message_start\n"), "{text}");
    let last = text.trim_end().rsplit("\n\n").next().unwrap();
    assert!(
        last.starts_with("event: error\ndata: {\"type\":\"error\""),
        "{last}"
    );
    assert!(last.contains("\"overloaded_error\""), "{last}");
    assert!(!text.contains("[DONE]"), "no OpenAI frames: {text}");
    assert!(started.elapsed() < Duration::from_secs(10));
    drop(chat);
}

/// A Qwen3-style template: `enable_thinking: false` closes an empty thinking block, otherwise
/// the generation prompt opens `<think>`.
const QWEN3_STYLE: &str = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}{% endif %}";

#[tokio::test]
async fn thinking_disabled_reaches_the_template_as_enable_thinking() {
    let base = markup_support::patched_tokenizer();
    let dir = std::env::temp_dir().join(format!("kiln-api-messages-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("tokenizer.json"),
        base.hf().to_string(false).unwrap(),
    )
    .unwrap();
    let config = json!({"bos_token": "<s>", "eos_token": "</s>", "chat_template": QWEN3_STYLE});
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
    let tok = kiln::tokenizer::Tokenizer::from_file(
        &dir.join("tokenizer.json"),
        Some(&dir.join("tokenizer_config.json")),
    )
    .unwrap();
    let mut files = markup_support::fixture();
    files.tokenizer = Some(tok.clone());
    let s = start_with(files, test_config());
    let user = json!([{"role": "user", "content": "Why is the sky blue?"}]);
    let count = |thinking: Value| {
        let mut body = json!({"messages": user});
        if !thinking.is_null() {
            body["thinking"] = thinking;
        }
        let base = s.base.clone();
        async move {
            let (status, res, _) = send(&base, COUNT, &[], &body).await;
            assert_eq!(status, 200, "{res}");
            res["input_tokens"].as_u64().unwrap() as usize
        }
    };
    let render = |tail: &str| {
        let text = format!("<|user|>Why is the sky blue?\n<|assistant|>{tail}");
        tok.encode(&text, false).unwrap().len()
    };
    assert_eq!(count(Value::Null).await, render("<think>\n"));
    let on = json!({"type": "enabled", "budget_tokens": 8});
    assert_eq!(count(on.clone()).await, render("<think>\n"));
    let off = json!({"type": "disabled"});
    assert_eq!(count(off.clone()).await, render("<think>\n\n</think>\n\n"));

    let req = |thinking: Value| json!({"max_tokens": 12, "temperature": 0, "messages": user, "thinking": thinking});
    let body = create(&s, &req(on)).await;
    assert_eq!(body["content"][0]["type"], "thinking", "{body}");
    let body = create(&s, &req(off)).await;
    let content = body["content"].as_array().unwrap();
    assert!(
        content.iter().all(|b| b["type"] == "text"),
        "the model answers at once: {body}"
    );
}
