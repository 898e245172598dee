//! Reply markup as Qwen tokenizers have it: `<tool_call>`, `</tool_call>`, `<think>` and
//! `</think>` as added special tokens, and a `chat_template` list with a `tool_use` entry. On
//! `llama-2-tiny-random.gguf` with its vocabulary patched (four ids turned into those tokens:
//! `markup_support`).

mod api_support;
mod markup_support;

use std::sync::OnceLock;

use api_support::*;
use kiln::config::ReasoningParser;
use kiln::tokenizer::chat::{ChatMessage, ChatTemplate, TemplateTool};
use markup_support::*;
use serde_json::{Value, json};

/// Without a reasoning parser.
fn plain() -> &'static TestServer {
    static SERVER: OnceLock<TestServer> = OnceLock::new();
    SERVER.get_or_init(|| start_patched(test_config()))
}

/// With `reasoning_parser = "think"`.
fn thinking() -> &'static TestServer {
    static SERVER: OnceLock<TestServer> = OnceLock::new();
    SERVER.get_or_init(|| {
        let mut cfg = test_config();
        cfg.model.reasoning_parser = Some(ReasoningParser::Think);
        start_patched(cfg)
    })
}

fn weather_tool() -> Value {
    json!({"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"], "additionalProperties": false}}})
}

fn question() -> Value {
    json!([{"role": "user", "content": "Weather in Paris?"}])
}

/// Prompt tokens of [`question`] rendered by `source`, with the weather tool when `tools`.
fn rendered_tokens(source: &str, tools: bool) -> usize {
    let tok = patched_tokenizer();
    let template = ChatTemplate::new(source, "<s>", "</s>").unwrap();
    let tool = TemplateTool {
        name: "get_weather".into(),
        description: None,
        parameters: weather_tool()["function"]["parameters"].clone(),
    };
    let tools = if tools { vec![tool] } else { Vec::new() };
    let msgs = [ChatMessage::new("user", "Weather in Paris?")];
    let text = template.render_with_tools(&msgs, &tools, true).unwrap();
    tok.encode(&text, false).unwrap().len()
}

#[test]
fn the_patched_vocabulary_has_the_markup_as_special_tokens() {
    let tok = patched_tokenizer();
    for (id, text) in MARKUP {
        assert_eq!(tok.token_to_id(text), Some(id), "{text}");
        assert!(tok.is_special(id), "{text}");
        assert_eq!(
            tok.decode(&[id], true).unwrap(),
            text,
            "markup is kept when special tokens are skipped"
        );
    }
    let eos = tok.eos_ids()[0];
    assert_eq!(
        tok.decode(&[eos], true).unwrap(),
        "",
        "other specials are not"
    );
    assert_eq!(tok.tool_use_template(), Some(TOOL_USE_TEMPLATE));
    assert_eq!(tok.chat_template(), Some(DEFAULT_TEMPLATE));
}

#[tokio::test]
async fn requests_with_tools_use_the_tool_use_template() {
    let s = plain();
    let with = rendered_tokens(TOOL_USE_TEMPLATE, true);
    let without = rendered_tokens(DEFAULT_TEMPLATE, false);
    assert_ne!(with, without);
    let req = json!({"messages": question(), "max_tokens": 1, "temperature": 0});
    let (status, _, body) = post(&s.base, "/v1/chat/completions", &req).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["usage"]["prompt_tokens"], without, "no tools: default");
    let mut req = req;
    req["tools"] = json!([weather_tool()]);
    let (status, _, body) = post(&s.base, "/v1/chat/completions", &req).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["usage"]["prompt_tokens"], with, "tools: `tool_use`");
}

/// Streamed deltas put together: content, reasoning, calls as `(name, arguments)`, finish.
fn accumulate(chunks: &[Value]) -> (String, String, Vec<(String, String)>, Option<String>) {
    let (mut content, mut reasoning, mut calls, mut finish) = (
        String::new(),
        String::new(),
        Vec::<(String, String)>::new(),
        None,
    );
    for c in chunks.iter().filter(|c| c["choices"][0].is_object()) {
        let choice = &c["choices"][0];
        let delta = &choice["delta"];
        content.push_str(delta["content"].as_str().unwrap_or_default());
        reasoning.push_str(delta["reasoning_content"].as_str().unwrap_or_default());
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            let i = call["index"].as_u64().unwrap() as usize;
            if let Some(name) = call["function"]["name"].as_str() {
                calls.push((name.to_string(), String::new()));
            }
            calls[i].1 += call["function"]["arguments"].as_str().unwrap_or_default();
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            finish = Some(f.to_string());
        }
    }
    (content, reasoning, calls, finish)
}

#[tokio::test]
async fn a_special_tool_call_token_is_parsed_whole_and_streamed() {
    let s = plain();
    let req = json!({"messages": question(), "tools": [weather_tool()],
                     "tool_choice": "required", "parallel_tool_calls": false,
                     "max_tokens": 120, "temperature": 0, "logprobs": true});
    let (status, _, body) = post(&s.base, "/v1/chat/completions", &req).await;
    assert_eq!(status, 200, "{body}");
    let choice = &body["choices"][0];
    let first = &choice["logprobs"]["content"][0]["token"];
    assert_eq!(
        first, "<tool_call>",
        "the grammar made the model emit the token"
    );
    assert_eq!(choice["finish_reason"], "tool_calls", "{body}");
    let call = &choice["message"]["tool_calls"][0]["function"];
    assert_eq!(call["name"], "get_weather", "{body}");
    let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert!(args["city"].is_string(), "{args}");
    let content = choice["message"]["content"].as_str().unwrap_or_default();
    assert!(!content.contains("tool_call"), "{content}");

    let mut sreq = req.clone();
    sreq["stream"] = json!(true);
    let sse = stream(&s.base, "/v1/chat/completions", &sreq).await;
    let (content, _, calls, finish) = accumulate(&sse.chunks());
    assert_eq!(finish.as_deref(), Some("tool_calls"));
    assert!(!content.contains("tool_call"), "{content}");
    let whole = (
        "get_weather".to_string(),
        call["arguments"].as_str().unwrap().to_string(),
    );
    assert_eq!(calls, vec![whole], "the stream adds up to the whole reply");
}

fn schema() -> Value {
    json!({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
           "required": ["n"], "additionalProperties": false})
}

#[tokio::test]
async fn response_format_holds_for_the_answer_after_the_thinking() {
    let s = thinking();
    // The prompt opened `<think>`; the bias makes the random model close it at once. Were the
    // schema applied from the first token, `</think>` could never come: the JSON would be
    // reasoning and the answer empty.
    let req = json!({"messages": question(), "max_tokens": 60, "temperature": 0, "logprobs": true,
                     "logit_bias": {THINK_CLOSE.to_string(): 100},
                     "response_format": {"type": "json_schema",
                                         "json_schema": {"name": "n", "schema": schema()}}});
    let (status, _, body) = post(&s.base, "/v1/chat/completions", &req).await;
    assert_eq!(status, 200, "{body}");
    let msg = &body["choices"][0]["message"];
    let answer: Value = serde_json::from_str(msg["content"].as_str().unwrap_or_default())
        .unwrap_or_else(|e| panic!("the answer is not JSON ({e}): {body}"));
    let n = answer["n"].as_i64().expect("n");
    assert!((0..=9).contains(&n), "{answer}");
    assert_eq!(body["choices"][0]["finish_reason"], "stop", "{body}");

    let mut sreq = req.clone();
    sreq["stream"] = json!(true);
    let sse = stream(&s.base, "/v1/chat/completions", &sreq).await;
    let (content, reasoning, _, _) = accumulate(&sse.chunks());
    assert_eq!(content, msg["content"].as_str().unwrap());
    assert_eq!(
        reasoning,
        msg["reasoning_content"].as_str().unwrap_or_default()
    );
}

#[tokio::test]
async fn without_a_closing_think_the_reply_stays_reasoning() {
    let s = thinking();
    // `</think>` forbidden: the constraint never starts, so the reply is all free reasoning
    // (what the thinking would be without the bias; it is not forced into JSON).
    let req = json!({"messages": question(), "max_tokens": 12, "temperature": 0,
                     "logit_bias": {THINK_CLOSE.to_string(): -100},
                     "response_format": {"type": "json_schema",
                                         "json_schema": {"name": "n", "schema": schema()}}});
    let (status, _, body) = post(&s.base, "/v1/chat/completions", &req).await;
    assert_eq!(status, 200, "{body}");
    let free = json!({"messages": question(), "max_tokens": 12, "temperature": 0,
                      "logit_bias": {THINK_CLOSE.to_string(): -100}});
    let (status, _, want) = post(&s.base, "/v1/chat/completions", &free).await;
    assert_eq!(status, 200, "{want}");
    let msg = &body["choices"][0]["message"];
    assert_eq!(
        msg["reasoning_content"], want["choices"][0]["message"]["reasoning_content"],
        "the thinking is the same as unconstrained"
    );
    assert_eq!(body["choices"][0]["finish_reason"], "length");
}

/// Streamed chunks in order: `r` reasoning, `t` a tool-call piece, `c` content; finish last.
fn kinds(chunks: &[Value]) -> String {
    let mut out = String::new();
    for c in chunks.iter().filter(|c| c["choices"][0].is_object()) {
        let delta = &c["choices"][0]["delta"];
        let said = |k: &str| delta[k].as_str().is_some_and(|t| !t.is_empty());
        if said("reasoning_content") {
            out.push('r');
        }
        if delta["tool_calls"].is_array() {
            out.push('t');
        }
        if said("content") {
            out.push('c');
        }
    }
    out
}

#[tokio::test]
async fn reasoning_then_a_constrained_tool_call_streams_in_order() {
    let s = thinking();
    let tok = patched_tokenizer();
    // The tool-use template does not open the thinking: the bias makes the model open it, think
    // `Hmm` a few times (the penalties wear `Hmm` down) until the smaller bias on `</think>`
    // wins. Then the tool grammar holds.
    let hmm = tok.token_to_id("▁Hmm").expect("in the vocabulary");
    let named = json!({"type": "function", "function": {"name": "get_weather"}});
    for tool_choice in [json!("required"), named] {
        let req = json!({"messages": question(), "tools": [weather_tool()],
                         "tool_choice": tool_choice, "max_tokens": 80, "temperature": 0,
                         "logit_bias": {THINK_OPEN.to_string(): 60, hmm.to_string(): 50,
                                        THINK_CLOSE.to_string(): 40},
                         "frequency_penalty": 2.0, "presence_penalty": 2.0});
        let (status, _, body) = post(&s.base, "/v1/chat/completions", &req).await;
        assert_eq!(status, 200, "{body}");
        let choice = &body["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls", "{body}");
        let msg = &choice["message"];
        let reasoning = msg["reasoning_content"].as_str().unwrap_or_default();
        assert!(reasoning.contains("Hmm"), "{body}");
        assert!(
            msg["content"].as_str().unwrap_or_default().is_empty(),
            "{body}"
        );
        let call = &msg["tool_calls"][0]["function"];
        assert_eq!(call["name"], "get_weather", "{body}");
        let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
        let city = args["city"].as_str().expect("a city");
        assert!(city.chars().count() <= 12, "{args}");
        assert_eq!(args.as_object().unwrap().len(), 1, "{args}");

        let mut sreq = req.clone();
        sreq["stream"] = json!(true);
        let sse = stream(&s.base, "/v1/chat/completions", &sreq).await;
        let chunks = sse.chunks();
        let order = kinds(&chunks);
        assert!(
            order.starts_with('r')
                && !order.contains('c')
                && order.trim_start_matches('r').chars().all(|k| k == 't'),
            "reasoning pieces, then tool-call pieces, no content: {order}"
        );
        let pieces: Vec<&Value> = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array())
            .flatten()
            .collect();
        let first = pieces[0];
        assert_eq!(first["index"], 0);
        assert!(
            first["id"].as_str().is_some_and(|id| !id.is_empty()),
            "{first}"
        );
        assert_eq!(first["type"], "function");
        assert_eq!(first["function"]["name"], "get_weather");
        for p in &pieces[1..] {
            assert_eq!(p["index"], 0, "{p}");
            assert!(
                p.get("id").is_none() && p["function"].get("name").is_none(),
                "{p}"
            );
        }
        let (content, streamed_reasoning, calls, finish) = accumulate(&chunks);
        assert_eq!(finish.as_deref(), Some("tool_calls"));
        assert_eq!(content, "");
        assert_eq!(
            streamed_reasoning, reasoning,
            "the stream adds up to the reply"
        );
        let whole = (
            "get_weather".to_string(),
            call["arguments"].as_str().unwrap().to_string(),
        );
        assert_eq!(calls, vec![whole]);
    }
}
