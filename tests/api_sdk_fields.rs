//! The small things SDKs read: `GET /v1/models/{id}`, `x-request-id`, `system_fingerprint`,
//! `usage.prompt_tokens_details.cached_tokens`, OpenAI's context-length wording, vLLM's
//! `GET /tokenizer_info`, and no tool markup left in `content` when `max_tokens` cuts a call.

mod api_support;

use std::sync::OnceLock;

use api_support::*;
use kiln::model::{LoadFormat, ModelFiles};
use serde_json::{Value, json};

const C: &str = "/v1/completions";
const CHAT: &str = "/v1/chat/completions";

/// GETs `path` with extra headers; returns status, headers and the parsed body.
async fn get_with(
    base: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> (u16, reqwest::header::HeaderMap, Value) {
    let mut req = client().get(format!("{base}{path}"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let res = req.send().await.expect("send");
    let status = res.status().as_u16();
    let headers = res.headers().clone();
    let text = res.text().await.expect("body");
    let body = serde_json::from_str(&text).unwrap_or(Value::Null);
    (status, headers, body)
}

fn request_id(h: &reqwest::header::HeaderMap) -> String {
    h.get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_else(|| panic!("no x-request-id in {h:?}"))
        .to_string()
}

#[tokio::test]
async fn a_model_is_retrieved_by_id_and_an_unknown_one_is_404() {
    let s = shared();
    let (status, _, list) = get_with(&s.base, "/v1/models", &[]).await;
    assert_eq!(status, 200);
    let id = list["data"][0]["id"].as_str().unwrap().to_string();
    let (status, _, card) = get_with(&s.base, &format!("/v1/models/{id}"), &[]).await;
    assert_eq!(status, 200, "{card}");
    assert_eq!(card, list["data"][0], "the same card as the list");
    assert_eq!(card["object"], "model");
    let (status, _, body) = get_with(&s.base, "/v1/models/gpt-4o", &[]).await;
    assert_error(status, &body, 404, "not_found_error", Some("model"));
    assert_eq!(body["error"]["code"], "model_not_found");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("gpt-4o")
    );
    let (status, _, body) = get_with(&s.base, "/v1/models/org/model", &[]).await;
    assert_error(status, &body, 404, "not_found_error", Some("model"));
}

#[tokio::test]
async fn every_response_carries_a_request_id() {
    let s = shared();
    // Echoed when sane, on success, on a 404 route and on a handler's 400.
    let mine = [("x-request-id", "client-req_42.a:b")];
    let (status, h, _) = get_with(&s.base, "/v1/models", &mine).await;
    assert_eq!(status, 200);
    assert_eq!(request_id(&h), "client-req_42.a:b");
    let (status, h, _) = get_with(&s.base, "/no/such/route", &mine).await;
    assert_eq!(status, 404);
    assert_eq!(request_id(&h), "client-req_42.a:b");
    let res = client()
        .post(format!("{}{C}", s.base))
        .header("x-request-id", "bad-one")
        .json(&json!({"prompt": "x", "temperature": -1}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 400);
    assert_eq!(request_id(res.headers()), "bad-one");
    // Generated when absent, fresh each time; a bad one (too long, odd bytes) is replaced.
    let (_, h1, _) = get_with(&s.base, "/health", &[]).await;
    let (_, h2, _) = get_with(&s.base, "/health", &[]).await;
    let (a, b) = (request_id(&h1), request_id(&h2));
    assert!(
        a.len() == 32 && a.bytes().all(|c| c.is_ascii_hexdigit()),
        "{a}"
    );
    assert_ne!(a, b);
    let long = "a".repeat(129);
    for bad in [long.as_str(), "has space", "semi;colon"] {
        let (_, h, _) = get_with(&s.base, "/health", &[("x-request-id", bad)]).await;
        let got = request_id(&h);
        assert_ne!(got, bad);
        assert_eq!(got.len(), 32, "{got}");
    }
    // On a stream too.
    let res = client()
        .post(format!("{}{C}", s.base))
        .header("x-request-id", "stream-1")
        .json(&json!({"prompt": "Once", "max_tokens": 2, "stream": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 200);
    assert_eq!(request_id(res.headers()), "stream-1");
    let _ = res.text().await;
}

/// A request refused before any handler (a wrong API key) carries the id as well.
#[tokio::test]
async fn a_refused_key_still_gets_a_request_id() {
    let mut cfg = test_config();
    cfg.server.api_keys = vec!["sekrit".into()];
    let s = start(cfg);
    let (status, h, body) = get_with(&s.base, "/v1/models", &[("x-request-id", "k-1")]).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(request_id(&h), "k-1");
}

#[tokio::test]
async fn responses_and_chunks_carry_one_system_fingerprint() {
    let s = shared();
    let fp = |v: &Value| v["system_fingerprint"].as_str().map(str::to_string);
    let (_, _, a) = post(&s.base, C, &json!({"prompt": "Once", "max_tokens": 2})).await;
    let (_, _, b) = post(
        &s.base,
        CHAT,
        &json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}),
    )
    .await;
    let want = fp(&a).expect("system_fingerprint");
    assert!(
        want.len() == 13
            && want.starts_with("fp_")
            && want[3..].bytes().all(|c| c.is_ascii_hexdigit()),
        "{want}"
    );
    assert_eq!(fp(&b).as_deref(), Some(want.as_str()));
    for (path, body) in [
        (
            C,
            json!({"prompt": "Once", "max_tokens": 3, "stream": true}),
        ),
        (
            CHAT,
            json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "stream": true,
                   "stream_options": {"include_usage": true}}),
        ),
    ] {
        let chunks = stream(&s.base, path, &body).await.chunks();
        assert!(!chunks.is_empty());
        for c in &chunks {
            assert_eq!(fp(c).as_deref(), Some(want.as_str()), "{path}: {c}");
        }
    }
    // The same build, model and devices give the same fingerprint in another server.
    let other = start(test_config());
    let (_, _, c) = post(&other.base, C, &json!({"prompt": "Once", "max_tokens": 1})).await;
    assert_eq!(fp(&c), Some(want));
}

fn cached(v: &Value) -> u64 {
    v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or_else(|| panic!("no cached_tokens in {v}"))
}

/// A repeated long prompt finds its full blocks in the prefix cache: the second request says
/// so in `usage.prompt_tokens_details.cached_tokens`, whole and streamed, on both routes.
#[tokio::test]
async fn a_repeated_prompt_reports_its_cached_tokens() {
    let s = start(test_config());
    let block = s.state.config.engine.block_size as u64;
    let text = "Once upon a time there was a little dog named Max who loved to run in the park \
                with his friends every single sunny day of the long warm summer."
        .repeat(2);
    let req = json!({"prompt": text, "max_tokens": 2, "temperature": 0});
    let (status, _, first) = post(&s.base, C, &req).await;
    assert_eq!(status, 200, "{first}");
    let prompt = first["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(prompt > 2 * block, "the prompt spans blocks: {prompt}");
    assert_eq!(cached(&first), 0, "a fresh server has nothing cached");
    let (_, _, second) = post(&s.base, C, &req).await;
    let hit = cached(&second);
    assert_eq!(
        hit,
        (prompt - 1) / block * block,
        "every full block but the last token's"
    );
    assert_eq!(second["usage"]["prompt_tokens"], prompt);
    // Streamed, with the usage chunk.
    let mut sreq = req.clone();
    sreq["stream"] = json!(true);
    sreq["stream_options"] = json!({"include_usage": true});
    let chunks = stream(&s.base, C, &sreq).await.chunks();
    let usage = chunks.last().unwrap();
    assert_eq!(cached(usage), hit, "{usage}");
    // Chat: the rendered conversation is cached the same way.
    let chat = json!({"messages": [{"role": "user", "content": text}], "max_tokens": 2});
    let (_, _, c1) = post(&s.base, CHAT, &chat).await;
    assert_eq!(cached(&c1), 0);
    let (_, _, c2) = post(&s.base, CHAT, &chat).await;
    let p = c2["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(cached(&c2), (p - 1) / block * block);
    let mut schat = chat.clone();
    schat["stream"] = json!(true);
    schat["stream_options"] = json!({"include_usage": true});
    let chunks = stream(&s.base, CHAT, &schat).await.chunks();
    assert_eq!(cached(chunks.last().unwrap()), cached(&c2));
}

/// OpenAI's words for a prompt the context cannot hold (litellm matches them), code
/// `context_length_exceeded`, on both routes and however the overflow is found.
#[tokio::test]
async fn context_overflow_is_worded_as_openai_words_it() {
    let s = shared();
    let n = s.engine.client().max_model_len();
    // The prompt fits, the prompt and max_tokens do not.
    let ids: Vec<u32> = vec![100; n - 10];
    let (status, _, body) = post(&s.base, C, &json!({"prompt": ids, "max_tokens": 20})).await;
    assert_error(
        status,
        &body,
        400,
        "invalid_request_error",
        Some("max_tokens"),
    );
    assert_eq!(body["error"]["code"], "context_length_exceeded");
    assert_eq!(
        body["error"]["message"],
        format!(
            "This model's maximum context length is {n} tokens. However, you requested {} tokens ({} in the prompt, 20 in the completion). Please reduce the length of the prompt or completion.",
            n + 10,
            n - 10
        )
    );
    // The prompt alone fills the context (with the default `max_tokens` of 16).
    let ids: Vec<u32> = vec![100; n];
    let (status, _, body) = post(&s.base, C, &json!({"prompt": ids})).await;
    assert_error(status, &body, 400, "invalid_request_error", Some("prompt"));
    assert_eq!(body["error"]["code"], "context_length_exceeded");
    assert_eq!(
        body["error"]["message"],
        format!(
            "This model's maximum context length is {n} tokens. However, you requested {} tokens ({n} in the prompt, 16 in the completion). Please reduce the length of the prompt or completion.",
            n + 16
        )
    );
    // Chat messages: refused while tokenizing, in the same words.
    let long = "Once upon a time ".repeat(n);
    let chat = json!({"messages": [{"role": "user", "content": long}], "max_tokens": 4});
    let (status, _, body) = post(&s.base, CHAT, &chat).await;
    assert_error(
        status,
        &body,
        400,
        "invalid_request_error",
        Some("messages"),
    );
    assert_eq!(body["error"]["code"], "context_length_exceeded");
    let msg = body["error"]["message"].as_str().unwrap();
    assert!(
        msg.starts_with(&format!(
            "This model's maximum context length is {n} tokens. However, your messages"
        )) && msg.ends_with("Please reduce the length of the messages."),
        "{msg}"
    );
}

#[tokio::test]
async fn tokenizer_info_is_what_lm_eval_reads() {
    let s = shared();
    let (status, _, info) = get_with(&s.base, "/tokenizer_info", &[]).await;
    assert_eq!(status, 200, "{info}");
    let tok = s.engine.client().tokenizer().unwrap();
    let eos = tok.eos_ids()[0];
    assert_eq!(info["eos_token"].as_str(), tok.id_to_piece(eos).as_deref());
    assert_eq!(info["eos_token_id"], eos);
    let bos = tok.bos_id().unwrap();
    assert_eq!(info["bos_token"].as_str(), tok.id_to_piece(bos).as_deref());
    assert_eq!(info["bos_token_id"], bos);
    assert_eq!(info["add_bos_token"], tok.add_bos_default());
    assert_eq!(info["model_max_length"], s.engine.client().max_model_len());
    assert_eq!(info["vocab_size"], tok.vocab_size());
    assert_eq!(info["tokenizer_class"], "PreTrainedTokenizerFast");
    let template = info["chat_template"].as_str().unwrap();
    assert!(template.contains("messages"), "{template}");
    // lm-eval's remote tokenizer: `eos_token` present, then the id through `/tokenize`.
    let (status, _, ids) = post(
        &s.base,
        "/tokenize",
        &json!({"prompt": info["eos_token"], "add_special_tokens": false}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(ids["tokens"][0], eos);
}

fn tiny_files() -> ModelFiles {
    let path = kiln::config::project_root().join("../shared/models/llama-2-tiny-random.gguf");
    ModelFiles::open(&path, LoadFormat::Auto).expect("llama-2-tiny-random.gguf")
}

fn tiny() -> &'static TestServer {
    static SERVER: OnceLock<TestServer> = OnceLock::new();
    SERVER.get_or_init(|| start_with(tiny_files(), test_config()))
}

/// `tool_choice: "required"` forces a Hermes call (`<tool_call>\n{"name": ...`); `max_tokens`
/// cuts it at every length up to past the name: no prefix of the markup is ever content,
/// streamed or whole, and once the name is out the call is reported.
#[tokio::test]
async fn a_call_cut_by_max_tokens_leaks_no_markup() {
    let s = tiny();
    let tool = json!({"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}});
    let mut named = false;
    for max_tokens in 1..=30 {
        let req = json!({"messages": [{"role": "user", "content": "Weather in Paris?"}],
                         "tools": [tool], "tool_choice": "required",
                         "max_tokens": max_tokens, "temperature": 0});
        let (status, _, body) = post(&s.base, CHAT, &req).await;
        assert_eq!(status, 200, "{body}");
        let choice = &body["choices"][0];
        assert_eq!(choice["finish_reason"], "length", "{body}");
        let content = choice["message"]["content"].as_str().unwrap_or_default();
        assert_eq!(content, "", "max_tokens {max_tokens}: {body}");
        named |= choice["message"]["tool_calls"][0]["function"]["name"] == "get_weather";
        let mut sreq = req.clone();
        sreq["stream"] = json!(true);
        let chunks = stream(&s.base, CHAT, &sreq).await.chunks();
        let streamed: String = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(streamed, "", "max_tokens {max_tokens} streamed");
    }
    assert!(named, "some cut came after the name: the call is reported");
}
