//! `POST /v1/completions` against a real server: greedy parity with `kiln generate`,
//! streaming, n, several prompts, stop strings, logprobs, echo, token-id prompts.

mod api_support;

use api_support::*;
use serde_json::{Value, json};

const PROMPT: &str = "Once upon a time";

#[tokio::test]
async fn greedy_completion_equals_kiln_generate() {
    let s = shared();
    let (status, _, body) = post(&s.base, "/v1/completions", &json!({
        "model": s.state.ready().unwrap().model_name, "prompt": PROMPT, "max_tokens": 40, "temperature": 0
    }))
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["object"], "text_completion");
    assert!(body["id"].as_str().unwrap().starts_with("cmpl-"));
    assert!(body["created"].as_u64().unwrap() > 1_600_000_000);
    assert_eq!(body["model"], "stories260K.gguf");
    let choice = &body["choices"][0];
    assert_eq!(choice["index"], 0);
    assert!(choice["logprobs"].is_null());
    assert_eq!(choice["text"], greedy_reference(PROMPT, 40));
    let finish = choice["finish_reason"].as_str().unwrap();
    let usage = &body["usage"];
    assert_eq!(usage["prompt_tokens"], 5);
    let completion = usage["completion_tokens"].as_u64().unwrap();
    assert!(finish == "length" && completion == 40 || finish == "stop" && completion < 40);
    assert_eq!(usage["total_tokens"].as_u64().unwrap(), 5 + completion);
}

#[tokio::test]
async fn default_max_tokens_is_16() {
    let s = shared();
    let (status, _, body) = post(
        &s.base,
        "/v1/completions",
        &json!({"prompt": PROMPT, "temperature": 0, "ignore_eos": true}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["usage"]["completion_tokens"], 16);
    assert_eq!(body["choices"][0]["finish_reason"], "length");
}

#[tokio::test]
async fn streamed_text_equals_non_streamed_text() {
    let s = shared();
    let req = json!({"prompt": PROMPT, "max_tokens": 48, "temperature": 0, "stream": true,
                     "stream_options": {"include_usage": true}});
    let sse = stream(&s.base, "/v1/completions", &req).await;
    assert_eq!(sse.status, 200);
    assert!(
        sse.content_type.starts_with("text/event-stream"),
        "{}",
        sse.content_type
    );
    assert_eq!(sse.data.last().map(String::as_str), Some("[DONE]"));
    assert_eq!(sse.data.iter().filter(|d| *d == "[DONE]").count(), 1);
    let chunks = sse.chunks();
    let (last, deltas) = chunks.split_last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["usage"]["prompt_tokens"], 5);
    let mut text = String::new();
    let mut finishes = Vec::new();
    for c in deltas {
        assert_eq!(c["object"], "text_completion");
        assert_eq!(c["id"], chunks[0]["id"]);
        assert!(
            c["usage"].is_null(),
            "usage is null before the last chunk: {c}"
        );
        let choice = &c["choices"][0];
        text.push_str(choice["text"].as_str().unwrap());
        if !choice["finish_reason"].is_null() {
            finishes.push(choice["finish_reason"].clone());
        }
    }
    assert_eq!(
        finishes.len(),
        1,
        "exactly one chunk carries the finish reason"
    );
    assert!(deltas.last().unwrap()["choices"][0]["finish_reason"].is_string());
    let (_, _, body) = post(
        &s.base,
        "/v1/completions",
        &json!({"prompt": PROMPT, "max_tokens": 48, "temperature": 0}),
    )
    .await;
    assert_eq!(text, body["choices"][0]["text"].as_str().unwrap());
    assert_eq!(last["usage"], body["usage"]);
}

#[tokio::test]
async fn stream_without_include_usage_has_no_usage_field() {
    let s = shared();
    let sse = stream(
        &s.base,
        "/v1/completions",
        &json!({"prompt": PROMPT, "max_tokens": 4, "stream": true}),
    )
    .await;
    for c in sse.chunks() {
        assert!(c.get("usage").is_none(), "{c}");
        assert_eq!(c["choices"].as_array().unwrap().len(), 1);
    }
}

#[tokio::test]
async fn n_and_several_prompts_give_indexed_choices() {
    let s = shared();
    let req = json!({"prompt": [PROMPT, "The dog"], "n": 2, "max_tokens": 8, "temperature": 0});
    let (status, _, body) = post(&s.base, "/v1/completions", &req).await;
    assert_eq!(status, 200, "{body}");
    let choices = body["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 4);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
    }
    assert_eq!(
        choices[0]["text"], choices[1]["text"],
        "greedy choices agree"
    );
    assert_eq!(choices[0]["text"], greedy_reference(PROMPT, 8));
    assert_eq!(choices[2]["text"], greedy_reference("The dog", 8));
    let tok = model_files().tokenizer.unwrap();
    let prompt_tokens =
        tok.encode(PROMPT, true).unwrap().len() + tok.encode("The dog", true).unwrap().len();
    assert_eq!(
        body["usage"]["prompt_tokens"], prompt_tokens,
        "usage sums the prompts"
    );
}

#[tokio::test]
async fn sampled_n_2_streams_both_choices() {
    let s = shared();
    let req = json!({"prompt": PROMPT, "n": 2, "max_tokens": 12, "temperature": 1.0, "seed": 7, "stream": true});
    let sse = stream(&s.base, "/v1/completions", &req).await;
    let mut finished = [false, false];
    for c in sse.chunks() {
        let choice = &c["choices"][0];
        let i = choice["index"].as_u64().unwrap() as usize;
        if choice["finish_reason"].is_string() {
            finished[i] = true;
        }
    }
    assert_eq!(finished, [true, true]);
}

#[tokio::test]
async fn seed_makes_sampling_reproducible() {
    let s = shared();
    let req = json!({"prompt": PROMPT, "max_tokens": 20, "temperature": 1.0, "seed": 1234, "top_k": 40, "top_p": 0.9});
    let (_, _, a) = post(&s.base, "/v1/completions", &req).await;
    let (_, _, b) = post(&s.base, "/v1/completions", &req).await;
    assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"]);
}

#[tokio::test]
async fn stop_string_ends_the_choice_and_is_not_shown() {
    let s = shared();
    let full = greedy_reference(PROMPT, 30);
    let cut = full
        .find(" was")
        .expect("the reference text contains ' was'");
    let req =
        json!({"prompt": PROMPT, "max_tokens": 30, "temperature": 0, "stop": [" was", "zzz"]});
    let (status, _, body) = post(&s.base, "/v1/completions", &req).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["text"], &full[..cut]);
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    let single = json!({"prompt": PROMPT, "max_tokens": 30, "temperature": 0, "stop": " was", "stream": true});
    let sse = stream(&s.base, "/v1/completions", &single).await;
    let text: String = sse
        .chunks()
        .iter()
        .map(|c| c["choices"][0]["text"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(text, &full[..cut]);
}

#[tokio::test]
async fn logprobs_have_the_completions_shape() {
    let s = shared();
    let req = json!({"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "logprobs": 3, "ignore_eos": true});
    let (status, _, body) = post(&s.base, "/v1/completions", &req).await;
    assert_eq!(status, 200, "{body}");
    let choice = &body["choices"][0];
    let lp = &choice["logprobs"];
    let tokens = lp["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), 6);
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), 6);
    assert_eq!(lp["text_offset"].as_array().unwrap().len(), 6);
    let joined: String = tokens.iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(joined, choice["text"].as_str().unwrap());
    let mut offset = 0;
    for (i, t) in tokens.iter().enumerate() {
        assert_eq!(lp["text_offset"][i], offset);
        offset += t.as_str().unwrap().chars().count();
        let top = lp["top_logprobs"][i].as_object().unwrap();
        assert!(!top.is_empty() && top.len() <= 3, "{top:?}");
        let chosen = lp["token_logprobs"][i].as_f64().unwrap();
        assert!(chosen <= 0.0);
        let best = top
            .values()
            .map(|v| v.as_f64().unwrap())
            .fold(f64::MIN, f64::max);
        assert!(
            (best - chosen).abs() < 1e-4,
            "greedy picks the top token: {best} vs {chosen}"
        );
    }
    let sse = stream(&s.base, "/v1/completions", &json!({"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "logprobs": 3, "ignore_eos": true, "stream": true})).await;
    let streamed: Vec<Value> = sse
        .chunks()
        .iter()
        .filter_map(|c| c["choices"][0]["logprobs"]["tokens"].as_array().cloned())
        .flatten()
        .collect();
    assert_eq!(&streamed, tokens);
}

#[tokio::test]
async fn echo_prepends_the_prompt() {
    let s = shared();
    let req = json!({"prompt": PROMPT, "max_tokens": 8, "temperature": 0, "echo": true});
    let (_, _, body) = post(&s.base, "/v1/completions", &req).await;
    assert_eq!(
        body["choices"][0]["text"],
        format!("{PROMPT}{}", greedy_reference(PROMPT, 8))
    );
    let mut streamed = req.clone();
    streamed["stream"] = json!(true);
    let sse = stream(&s.base, "/v1/completions", &streamed).await;
    let text: String = sse
        .chunks()
        .iter()
        .map(|c| c["choices"][0]["text"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(text, body["choices"][0]["text"].as_str().unwrap());
}

#[tokio::test]
async fn token_id_prompts_match_text_prompts() {
    let s = shared();
    let (_, _, tokens) = post(&s.base, "/tokenize", &json!({"prompt": PROMPT})).await;
    let ids = tokens["tokens"].clone();
    let (status, _, body) = post(
        &s.base,
        "/v1/completions",
        &json!({"prompt": ids, "max_tokens": 10, "temperature": 0}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["text"], greedy_reference(PROMPT, 10));
    let (status, _, body) = post(
        &s.base,
        "/v1/completions",
        &json!({"prompt": [ids, ids], "max_tokens": 3, "temperature": 0}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"].as_array().unwrap().len(), 2);
}

#[tokio::test]
async fn emoji_and_cjk_prompts_never_stream_replacement_characters() {
    let s = shared();
    for prompt in [
        "😀 Once upon a time",
        "你好，世界。Once",
        "Ünïcödé 🎉🎉 story",
    ] {
        let req = json!({"prompt": prompt, "max_tokens": 40, "temperature": 0, "stream": true, "echo": true});
        let sse = stream(&s.base, "/v1/completions", &req).await;
        assert_eq!(sse.status, 200);
        assert!(!sse.raw.contains('\u{FFFD}'), "U+FFFD in {}", sse.raw);
        let chunks = sse.chunks();
        assert_eq!(chunks[0]["choices"][0]["text"], prompt, "echo comes first");
    }
}
