//! Tools on `POST /v1/chat/completions` against a real server on `llama-2-tiny-random.gguf`
//! (the full Llama-2 vocabulary, random weights: free output is gibberish, so only what does
//! not depend on the model's choices is checked without constraints).

mod api_support;

use std::sync::OnceLock;

use api_support::*;
use kiln::model::{LoadFormat, ModelFiles};
use kiln::tokenizer::chat::{ChatMessage, ChatTemplate, TemplateTool, TemplateToolCall};
use serde_json::{Value, json};

fn tiny_files() -> ModelFiles {
    let path = kiln::config::project_root().join("../shared/models/llama-2-tiny-random.gguf");
    ModelFiles::open(&path, LoadFormat::Auto).expect("llama-2-tiny-random.gguf")
}

/// One server on the tiny random Llama-2 for the whole binary.
fn server() -> &'static TestServer {
    static SERVER: OnceLock<TestServer> = OnceLock::new();
    SERVER.get_or_init(|| start_with(tiny_files(), test_config()))
}

fn weather_tool() -> Value {
    json!({"type": "function", "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12},
                           "days": {"type": "integer", "minimum": 1, "maximum": 14}},
            "required": ["city", "days"], "additionalProperties": false}}})
}

fn time_tool() -> Value {
    json!({"type": "function", "function": {"name": "get_time", "parameters": {"type": "object",
        "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["zone"],
        "additionalProperties": false}}})
}

/// A question, the assistant's call (content null) and the tool's answer.
fn tool_conversation() -> Value {
    json!([
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Weather in Paris for 2 days?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_abc", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"days\": 2}"}}]},
        {"role": "tool", "tool_call_id": "call_abc", "content": "Sunny, 21 C"},
    ])
}

/// The prompt the server must render for [`tool_conversation`] with the weather tool.
fn reference_prompt_tokens() -> usize {
    let tok = tiny_files().tokenizer.unwrap();
    let template = ChatTemplate::for_tokenizer(&tok).unwrap();
    let mut call = ChatMessage::new("assistant", "");
    call.tool_calls = vec![TemplateToolCall {
        id: "call_abc".into(),
        name: "get_weather".into(),
        arguments: json!({"city": "Paris", "days": 2}),
    }];
    let mut result = ChatMessage::new("tool", "Sunny, 21 C");
    result.tool_call_id = Some("call_abc".into());
    let msgs = [
        ChatMessage::new("system", "Answer briefly."),
        ChatMessage::new("user", "Weather in Paris for 2 days?"),
        call,
        result,
    ];
    let tool = weather_tool();
    let tools = [TemplateTool {
        name: "get_weather".into(),
        description: Some("The weather in a city".into()),
        parameters: tool["function"]["parameters"].clone(),
    }];
    let text = template.render_with_tools(&msgs, &tools, true).unwrap();
    assert!(
        text.contains("<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}</tool_call>")
            && text.contains("Tool (call_abc): Sunny, 21 C")
            && text.contains("\"name\": \"get_weather\", \"description\": \"The weather in a city\""),
        "{text}"
    );
    tok.encode(&text, false).unwrap().len()
}

#[tokio::test]
async fn a_tool_conversation_round_trips() {
    let s = server();
    let req = json!({"messages": tool_conversation(), "tools": [weather_tool()],
                     "max_tokens": 8, "temperature": 0});
    let (status, _, body) = post(&s.base, "/v1/chat/completions", &req).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["usage"]["prompt_tokens"],
        reference_prompt_tokens(),
        "the template rendered the tools, the call and the tool result"
    );
    let msg = &body["choices"][0]["message"];
    assert_eq!(msg["role"], "assistant");
    // Free output of random weights: whatever it is, no markup leaks into content.
    if let Some(content) = msg["content"].as_str() {
        assert!(!content.contains("<tool_call>"), "{content}");
    }
}

#[tokio::test]
async fn tool_choice_none_gives_plain_content() {
    let s = server();
    let messages = json!([{"role": "user", "content": "What is the weather in Paris?"}]);
    let plain = json!({"messages": messages, "max_tokens": 12, "temperature": 0});
    let (status, _, want) = post(&s.base, "/v1/chat/completions", &plain).await;
    assert_eq!(status, 200, "{want}");
    let req = json!({"messages": messages, "max_tokens": 12, "temperature": 0,
                     "tools": [weather_tool()], "tool_choice": "none"});
    let (status, _, body) = post(&s.base, "/v1/chat/completions", &req).await;
    assert_eq!(status, 200, "{body}");
    let choice = &body["choices"][0];
    assert_eq!(
        choice["message"]["content"],
        want["choices"][0]["message"]["content"]
    );
    assert!(choice["message"].get("tool_calls").is_none(), "{body}");
    assert_eq!(choice["finish_reason"], want["choices"][0]["finish_reason"]);
    assert_eq!(
        body["usage"], want["usage"],
        "tools are not shown to the model"
    );
}

/// Streamed deltas put together: content, reasoning and calls by index.
fn accumulate(chunks: &[Value]) -> (String, Vec<(String, String, String)>, Option<String>) {
    let (mut content, mut calls, mut finish) = (String::new(), Vec::new(), None);
    for c in chunks
        .iter()
        .filter(|c| !c["choices"].as_array().unwrap().is_empty())
    {
        let choice = &c["choices"][0];
        let delta = &choice["delta"];
        content.push_str(delta["content"].as_str().unwrap_or_default());
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            let i = call["index"].as_u64().unwrap() as usize;
            if let Some(id) = call["id"].as_str() {
                assert_eq!(i, calls.len(), "a call's first delta has its id");
                let name = call["function"]["name"].as_str().expect("name first");
                calls.push((id.to_string(), name.to_string(), String::new()));
            }
            calls[i].2 += call["function"]["arguments"].as_str().unwrap_or_default();
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            finish = Some(f.to_string());
        }
    }
    (content, calls, finish)
}

#[tokio::test]
async fn auto_stream_adds_up_to_the_whole_reply() {
    let s = server();
    let req = json!({"messages": [{"role": "user", "content": "Weather?"}], "max_tokens": 24,
                     "temperature": 0, "tools": [weather_tool()], "tool_choice": "auto"});
    let (status, _, body) = post(&s.base, "/v1/chat/completions", &req).await;
    assert_eq!(status, 200, "{body}");
    let mut sreq = req.clone();
    sreq["stream"] = json!(true);
    let sse = stream(&s.base, "/v1/chat/completions", &sreq).await;
    assert_eq!(sse.status, 200);
    let (content, calls, finish) = accumulate(&sse.chunks());
    let msg = &body["choices"][0]["message"];
    assert_eq!(content, msg["content"].as_str().unwrap_or_default());
    assert_eq!(
        calls.len(),
        msg["tool_calls"].as_array().map_or(0, Vec::len)
    );
    assert_eq!(
        finish.as_deref(),
        body["choices"][0]["finish_reason"].as_str()
    );
}

#[tokio::test]
async fn bad_tool_input_is_a_400_naming_the_field() {
    let s = server();
    let user = json!([{"role": "user", "content": "hi"}]);
    let cases = [
        (
            json!({"messages": user, "tools": [weather_tool()],
                   "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            "tool_choice.function.name",
        ),
        (
            json!({"messages": user, "tools": [{"type": "function",
                   "function": {"name": "f", "parameters": "a string"}}]}),
            "tools[0].function.parameters",
        ),
        (
            json!({"messages": user, "tools": [{"type": "function",
                   "function": {"name": "f", "parameters": {"type": "array"}}}]}),
            "tools[0].function.parameters.type",
        ),
        (
            json!({"messages": [{"role": "user", "content": "hi"},
                                {"role": "tool", "content": "42"}]}),
            "messages[1].tool_call_id",
        ),
        (
            json!({"messages": user, "tool_choice": "required"}),
            "tool_choice",
        ),
        (
            json!({"messages": user, "tools": [weather_tool()], "tool_choice": "sometimes"}),
            "tool_choice",
        ),
        (
            json!({"messages": user, "tools": [weather_tool(), weather_tool()]}),
            "tools[1].function.name",
        ),
        (
            json!({"messages": user, "tools": [{"type": "retrieval", "function": {"name": "f"}}]}),
            "tools[0].type",
        ),
    ];
    for (req, param) in cases {
        let (status, _, body) = post(&s.base, "/v1/chat/completions", &req).await;
        assert_error(status, &body, 400, "invalid_request_error", Some(param));
    }
    let ok = json!({"messages": user, "max_tokens": 2});
    let (status, _, body) = post(&s.base, "/v1/chat/completions", &ok).await;
    assert_eq!(status, 200, "the server serves on: {body}");
}

/// Checks `args` against the weather or time tool's schema by hand.
fn assert_fits(name: &str, args: &str) {
    let v: Value = serde_json::from_str(args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
    let obj = v.as_object().expect("arguments are an object");
    match name {
        "get_weather" => {
            let city = obj["city"].as_str().expect("city is a string");
            let days = obj["days"].as_i64().expect("days is an integer");
            assert!(
                city.chars().count() <= 12 && (1..=14).contains(&days),
                "{args}"
            );
            assert_eq!(obj.len(), 2, "no other properties: {args}");
        }
        "get_time" => assert!(
            ["UTC", "CET"].contains(&obj["zone"].as_str().unwrap()),
            "{args}"
        ),
        other => panic!("unknown function {other}"),
    }
}

async fn constrained(tool_choice: Value) -> Value {
    let s = server();
    let req = json!({"messages": [{"role": "user", "content": "Weather in Paris?"}],
                     "tools": [weather_tool(), time_tool()], "tool_choice": tool_choice,
                     "parallel_tool_calls": false, "max_tokens": 200, "temperature": 0});
    let (status, _, body) = post(&s.base, "/v1/chat/completions", &req).await;
    assert_eq!(status, 200, "{body}");
    let choice = &body["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{body}");
    let calls = choice["message"]["tool_calls"]
        .as_array()
        .expect("tool_calls");
    assert!(!calls.is_empty());
    for c in calls {
        assert!(c["id"].as_str().unwrap().starts_with("call_"));
        assert_eq!(c["type"], "function");
        assert_fits(
            c["function"]["name"].as_str().unwrap(),
            c["function"]["arguments"].as_str().unwrap(),
        );
    }
    let mut sreq = req.clone();
    sreq["stream"] = json!(true);
    let sse = stream(&s.base, "/v1/chat/completions", &sreq).await;
    let (content, streamed, finish) = accumulate(&sse.chunks());
    assert_eq!(finish.as_deref(), Some("tool_calls"));
    assert_eq!(
        content,
        choice["message"]["content"].as_str().unwrap_or_default()
    );
    let whole: Vec<(String, String)> = calls
        .iter()
        .map(|c| {
            let f = &c["function"];
            (
                f["name"].as_str().unwrap().into(),
                f["arguments"].as_str().unwrap().into(),
            )
        })
        .collect();
    let streamed: Vec<(String, String)> = streamed.into_iter().map(|c| (c.1, c.2)).collect();
    assert_eq!(
        streamed, whole,
        "the stream adds up to the non-streamed calls"
    );
    body
}

#[tokio::test]
async fn required_tool_choice_gives_valid_calls() {
    constrained(json!("required")).await;
}

#[tokio::test]
async fn named_tool_choice_calls_that_function() {
    let body = constrained(json!({"type": "function", "function": {"name": "get_time"}})).await;
    let calls = body["choices"][0]["message"]["tool_calls"]
        .as_array()
        .unwrap();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0]["function"]["name"], "get_time");
}

/// A tool whose parameters are what Pydantic writes for nested models: `$defs` and
/// `#/$defs/...` references (issue 37: once nested in the tool-call grammar they named a
/// definition the call object lacked, a 400 for ordinary agent code).
#[tokio::test]
async fn pydantic_defs_in_tool_parameters_compile_and_fit() {
    let s = server();
    let tool = json!({"type": "function", "function": {"name": "book", "parameters": {
        "$defs": {
            "Place": {"type": "object", "properties": {
                "city": {"type": "string", "maxLength": 10},
                "near": {"anyOf": [{"$ref": "#/$defs/Place"}, {"type": "null"}]}},
                "required": ["city", "near"], "additionalProperties": false},
            "Seat": {"type": "string", "enum": ["aisle", "window"]}},
        "type": "object",
        "properties": {"to": {"$ref": "#/$defs/Place"}, "seat": {"$ref": "#/$defs/Seat"}},
        "required": ["to", "seat"], "additionalProperties": false}}});
    for choice in [
        json!("required"),
        json!({"type": "function", "function": {"name": "book"}}),
    ] {
        let req = json!({"messages": [{"role": "user", "content": "Book me a seat to Oslo"}],
                         "tools": [tool], "tool_choice": choice, "max_tokens": 200,
                         "temperature": 0});
        let (status, _, body) = post(&s.base, "/v1/chat/completions", &req).await;
        assert_eq!(status, 200, "{body}");
        let call = &body["choices"][0]["message"]["tool_calls"][0]["function"];
        assert_eq!(call["name"], "book", "{body}");
        if body["choices"][0]["finish_reason"] == "tool_calls" {
            let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
            assert!(
                ["aisle", "window"].contains(&args["seat"].as_str().unwrap()),
                "{args}"
            );
            assert!(args["to"]["city"].is_string(), "{args}");
        }
    }
}

/// Tool parameters nested past the depth limit are a 400 naming `tools`, and the server
/// serves on (100 `$ref`s through `anyOf`: about 300 levels, and a prompt the context holds).
#[tokio::test]
async fn tool_parameters_past_the_depth_limit_are_a_400() {
    let s = server();
    let mut defs = serde_json::Map::new();
    for i in 0..100 {
        defs.insert(
            format!("d{i}"),
            json!({"anyOf": [{"$ref": format!("#/$defs/d{}", i + 1)}, {"type": "null"}]}),
        );
    }
    defs.insert("d100".into(), json!({"type": "integer"}));
    let tool = json!({"type": "function", "function": {"name": "deep", "parameters": {
        "type": "object", "properties": {"x": {"$ref": "#/$defs/d0"}}, "$defs": defs}}});
    let req = json!({"messages": [{"role": "user", "content": "hi"}], "tools": [tool],
                     "tool_choice": "required", "max_tokens": 8});
    let (status, _, body) = post(&s.base, "/v1/chat/completions", &req).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["param"], "tools", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_depth"),
        "{body}"
    );
    let ok = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    let (status, _, body) = post(&s.base, "/v1/chat/completions", &ok).await;
    assert_eq!(status, 200, "the server serves on: {body}");
}
