//! `POST /v1/chat/completions` against a real server: template rendering, streaming shape,
//! content parts, logprobs, max_completion_tokens, n.

mod api_support;

use api_support::*;
use kiln::tokenizer::chat::{ChatMessage, ChatTemplate};
use serde_json::json;

fn conversation() -> serde_json::Value {
    json!([
        {"role": "system", "content": "You tell short stories."},
        {"role": "user", "content": "Tell me about a cat."},
    ])
}

/// The greedy reply computed without the server: default template, then `kiln generate`.
fn reference_reply(max_tokens: usize) -> (usize, String) {
    let files = model_files();
    let tok = files.tokenizer.clone().unwrap();
    let template = ChatTemplate::for_tokenizer(&tok).unwrap();
    assert!(
        template.is_default(),
        "stories260K has no template of its own"
    );
    let text = template
        .render(
            &[
                ChatMessage::new("system", "You tell short stories."),
                ChatMessage::new("user", "Tell me about a cat."),
            ],
            true,
        )
        .unwrap();
    assert!(
        text.starts_with("<s>") && text.ends_with("Assistant:"),
        "{text:?}"
    );
    let ids = tok.encode(&text, false).unwrap();
    assert_eq!(
        ids[0],
        tok.bos_id().unwrap(),
        "bos_token in the template becomes the BOS id"
    );
    (ids.len(), greedy_reference_ids(&files, &ids, max_tokens))
}

#[tokio::test]
async fn chat_renders_the_template_and_matches_the_reference() {
    let s = shared();
    let req = json!({"model": "stories260K.gguf", "messages": conversation(), "max_tokens": 24, "temperature": 0});
    let (status, _, body) = post(&s.base, "/v1/chat/completions", &req).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["object"], "chat.completion");
    assert!(body["id"].as_str().unwrap().starts_with("chatcmpl-"));
    let choice = &body["choices"][0];
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["message"]["role"], "assistant");
    assert!(choice["logprobs"].is_null());
    let (prompt_tokens, reply) = reference_reply(24);
    assert_eq!(choice["message"]["content"], reply);
    assert_eq!(body["usage"]["prompt_tokens"], prompt_tokens);
    let (_, _, tokens) = post(&s.base, "/tokenize", &json!({"messages": conversation()})).await;
    assert_eq!(
        tokens["count"], prompt_tokens,
        "/tokenize renders the same template"
    );
}

#[tokio::test]
async fn chat_stream_starts_with_the_role_and_ends_with_usage() {
    let s = shared();
    let req = json!({"messages": conversation(), "max_completion_tokens": 24, "temperature": 0,
                     "stream": true, "stream_options": {"include_usage": true}});
    let sse = stream(&s.base, "/v1/chat/completions", &req).await;
    assert_eq!(sse.status, 200);
    assert_eq!(sse.data.last().map(String::as_str), Some("[DONE]"));
    let chunks = sse.chunks();
    let first = &chunks[0];
    assert_eq!(first["object"], "chat.completion.chunk");
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    assert!(first["choices"][0]["finish_reason"].is_null());
    let (last, middle) = chunks.split_last().unwrap();
    assert_eq!(last["choices"], json!([]));
    let completion = last["usage"]["completion_tokens"].as_u64().unwrap();
    assert!(completion > 0 && completion <= 24);
    let mut content = String::new();
    for c in &middle[1..] {
        assert!(
            c["choices"][0]["delta"].get("role").is_none(),
            "role only in the first chunk"
        );
        assert!(c["usage"].is_null());
        content.push_str(c["choices"][0]["delta"]["content"].as_str().unwrap_or(""));
    }
    let finish = &middle.last().unwrap()["choices"][0];
    assert!(finish["finish_reason"].is_string());
    assert_eq!(finish["delta"], json!({}));
    assert_eq!(content, reference_reply(24).1);
}

#[tokio::test]
async fn content_parts_equal_plain_content() {
    let s = shared();
    let parts = json!([{"role": "user", "content": [{"type": "text", "text": "Tell me"}, {"type": "text", "text": "about a dog."}]}]);
    let plain = json!([{"role": "user", "content": "Tell me\nabout a dog."}]);
    let (_, _, a) = post(
        &s.base,
        "/v1/chat/completions",
        &json!({"messages": parts, "max_tokens": 12, "temperature": 0}),
    )
    .await;
    let (_, _, b) = post(
        &s.base,
        "/v1/chat/completions",
        &json!({"messages": plain, "max_tokens": 12, "temperature": 0}),
    )
    .await;
    assert_eq!(a["choices"][0]["message"], b["choices"][0]["message"]);
    // The same prompt: the second finds the first's blocks in the prefix cache.
    for k in ["prompt_tokens", "completion_tokens", "total_tokens"] {
        assert_eq!(a["usage"][k], b["usage"][k], "{k}");
    }
}

#[tokio::test]
async fn chat_logprobs_have_the_chat_shape() {
    let s = shared();
    let req = json!({"messages": conversation(), "max_tokens": 5, "temperature": 0, "logprobs": true, "top_logprobs": 2, "ignore_eos": true});
    let (status, _, body) = post(&s.base, "/v1/chat/completions", &req).await;
    assert_eq!(status, 200, "{body}");
    let content = body["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap();
    assert_eq!(content.len(), 5);
    let mut joined = String::new();
    for t in content {
        let token = t["token"].as_str().unwrap();
        joined.push_str(token);
        let bytes: Vec<u8> = t["bytes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_u64().unwrap() as u8)
            .collect();
        assert_eq!(bytes, token.as_bytes());
        assert!(t["logprob"].as_f64().unwrap() <= 0.0);
        let top = t["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 2);
        assert_eq!(
            top[0]["token"], t["token"],
            "greedy: the chosen token is the most likely"
        );
    }
    assert_eq!(
        joined,
        body["choices"][0]["message"]["content"].as_str().unwrap()
    );
    let no_top = json!({"messages": conversation(), "max_tokens": 3, "logprobs": true});
    let (_, _, body) = post(&s.base, "/v1/chat/completions", &no_top).await;
    assert_eq!(
        body["choices"][0]["logprobs"]["content"][0]["top_logprobs"],
        json!([])
    );
}

#[tokio::test]
async fn chat_n_2_and_default_max_tokens() {
    let s = shared();
    let req = json!({"messages": conversation(), "n": 2, "temperature": 0.9, "seed": 11, "max_tokens": 10});
    let (status, _, body) = post(&s.base, "/v1/chat/completions", &req).await;
    assert_eq!(status, 200, "{body}");
    let choices = body["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 2);
    assert_eq!(
        (choices[0]["index"].as_u64(), choices[1]["index"].as_u64()),
        (Some(0), Some(1))
    );
    let (status, _, body) = post(
        &s.base,
        "/v1/chat/completions",
        &json!({"messages": conversation(), "temperature": 0}),
    )
    .await;
    assert_eq!(
        status, 200,
        "without max_tokens the reply may use the rest of the context: {body}"
    );
    assert!(body["choices"][0]["finish_reason"].is_string());
}

#[tokio::test]
async fn assistant_turns_and_developer_role_are_accepted() {
    let s = shared();
    let msgs = json!([
        {"role": "developer", "content": "Be kind."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "A story?"},
    ]);
    let (status, _, body) = post(
        &s.base,
        "/v1/chat/completions",
        &json!({"messages": msgs, "max_tokens": 4}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
}
