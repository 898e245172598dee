//! `echo` with `logprobs` on `/v1/completions` (prompt logprobs) against a real server: the
//! prompt's logprobs equal a reference computed position by position on the CPU model,
//! whatever the chunking, the prefix cache, `n`, `max_tokens: 0` or streaming.

mod api_support;

use api_support::*;
use kiln::backend::cpu::CpuBackend;
use kiln::generate::{GenerateOptions, SingleGenerator};
use kiln::sampling::SamplingParams;
use serde_json::{Value, json};

const PROMPT: &str = "Once upon a time, there was a little girl named Lily";
const TOL: f64 = 1e-4;

/// The prompt's ids as the server tokenizes it (BOS as the model wants).
fn ids(prompt: &str) -> Vec<u32> {
    let tok = model_files().tokenizer.expect("tokenizer");
    tok.encode(prompt, tok.add_bos_default()).expect("encode")
}

/// Per prompt token after the first: its log-probability given the tokens before it and the
/// `k` best log-probabilities there, from the model's raw logits. Each position is its own
/// prefill on a single-sequence generator (the last row's logits only), so no part of the
/// prompt-logprobs path is involved.
fn reference(ids: &[u32], k: usize) -> Vec<(f64, Vec<f64>)> {
    let files = model_files();
    let mut g =
        SingleGenerator::new(CpuBackend::new(), &files, ids.len() + 1, 512, 16).expect("generator");
    let opts = GenerateOptions {
        max_tokens: 1,
        params: SamplingParams::greedy(),
        stop_ids: vec![],
        chunk: 512,
        block_size: 16,
        record_logits: 1,
    };
    (1..ids.len())
        .map(|i| {
            let out = g.generate(&ids[..i], &opts, |_| {}).expect("generate");
            let logits: Vec<f64> = out.step_logits[0].iter().map(|&v| v as f64).collect();
            let m = logits.iter().copied().fold(f64::MIN, f64::max);
            let lse = m + logits.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
            let mut sorted: Vec<f64> = logits.iter().map(|v| v - lse).collect();
            sorted.sort_by(|a, b| b.total_cmp(a));
            (logits[ids[i] as usize] - lse, sorted[..k].to_vec())
        })
        .collect()
}

async fn complete(base: &str, req: &Value) -> Value {
    let (status, _, body) = post(base, "/v1/completions", req).await;
    assert_eq!(status, 200, "{body}");
    body
}

fn floats(v: &Value) -> Vec<Option<f64>> {
    v.as_array().unwrap().iter().map(Value::as_f64).collect()
}

/// Checks the first `refs.len() + 1` entries of `lp` (the prompt's) against `refs`: the first
/// is `null`, then each logprob matches, its alternatives hold the `k` best and the token.
fn assert_prompt_matches(lp: &Value, refs: &[(f64, Vec<f64>)], k: usize) {
    let (tokens, logprobs) = (
        lp["tokens"].as_array().unwrap(),
        floats(&lp["token_logprobs"]),
    );
    assert!(tokens.len() > refs.len(), "{lp}");
    assert_eq!(logprobs[0], None, "the first prompt token has no logprob");
    assert!(lp["top_logprobs"][0].is_null());
    for (i, (want, best)) in refs.iter().enumerate() {
        let got = logprobs[i + 1].expect("a prompt logprob");
        assert!((got - want).abs() < TOL, "token {}: {got} vs {want}", i + 1);
        let top = lp["top_logprobs"][i + 1].as_object().unwrap();
        let token = tokens[i + 1].as_str().unwrap();
        assert_eq!(top[token].as_f64(), Some(got), "the token itself is listed");
        assert!((k..=k + 1).contains(&top.len()), "{top:?}");
        let mut vals: Vec<f64> = top.values().map(|v| v.as_f64().unwrap()).collect();
        vals.sort_by(|a, b| b.total_cmp(a));
        for (g, w) in vals.iter().zip(best) {
            assert!(
                (g - w).abs() < TOL,
                "top of token {}: {vals:?} vs {best:?}",
                i + 1
            );
        }
    }
}

/// Two logprobs objects with the same tokens, offsets and alternatives, and values within
/// `TOL` (a request's rows share steps with other requests', which may move the last bits).
fn assert_close(a: &Value, b: &Value) {
    for key in ["tokens", "text_offset"] {
        assert_eq!(a[key], b[key], "{key}");
    }
    let (x, y) = (floats(&a["token_logprobs"]), floats(&b["token_logprobs"]));
    assert_eq!(x.len(), y.len());
    for (i, (x, y)) in x.iter().zip(&y).enumerate() {
        assert_eq!(x.is_some(), y.is_some(), "token {i}");
        assert!(
            (x.unwrap_or(0.0) - y.unwrap_or(0.0)).abs() < TOL,
            "token {i}: {x:?} vs {y:?}"
        );
    }
    let (ta, tb) = (
        a["top_logprobs"].as_array().unwrap(),
        b["top_logprobs"].as_array().unwrap(),
    );
    assert_eq!(ta.len(), tb.len());
    for (i, (p, q)) in ta.iter().zip(tb).enumerate() {
        assert_eq!(p.is_null(), q.is_null(), "alternatives of token {i}");
        let (Some(p), Some(q)) = (p.as_object(), q.as_object()) else {
            continue;
        };
        assert_eq!(
            p.keys().collect::<Vec<_>>(),
            q.keys().collect::<Vec<_>>(),
            "token {i}"
        );
        for (k, v) in p {
            let d = (v.as_f64().unwrap() - q[k].as_f64().unwrap()).abs();
            assert!(d < TOL, "token {i} alternative {k:?}: {v} vs {}", q[k]);
        }
    }
}

#[tokio::test]
async fn echo_with_logprobs_returns_the_prompt_logprobs_then_the_completion() {
    let s = shared();
    let ids = ids(PROMPT);
    let refs = reference(&ids, 3);
    let req = json!({"prompt": PROMPT, "echo": true, "logprobs": 3, "max_tokens": 5,
                     "temperature": 0, "ignore_eos": true});
    let body = complete(&s.base, &req).await;
    let c = &body["choices"][0];
    let lp = &c["logprobs"];
    assert_prompt_matches(lp, &refs, 3);
    let tokens = lp["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), ids.len() + 5);
    let completion = greedy_reference(PROMPT, 5);
    assert_eq!(c["text"], format!("{PROMPT}{completion}"));
    let generated: String = tokens[ids.len()..]
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(generated, completion);
    let offsets: Vec<u64> = lp["text_offset"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o.as_u64().unwrap())
        .collect();
    assert_eq!(offsets[0], 0);
    assert!(offsets.windows(2).all(|w| w[0] <= w[1]), "{offsets:?}");
    // Each prompt token's offset is where it begins in the echoed text.
    let chars: Vec<char> = PROMPT.chars().collect();
    for (i, t) in tokens.iter().enumerate().take(ids.len()).skip(1) {
        let at: String = chars[offsets[i] as usize..].iter().collect();
        let t = t.as_str().unwrap();
        // (SentencePiece's leading space is not in the text at its very start.)
        let here = at.starts_with(t) || offsets[i] == 0 && at.starts_with(t.trim_start());
        assert!(here, "token {i} {t:?} at {at:?}");
    }
    assert_eq!(
        offsets[ids.len()] as usize,
        PROMPT.chars().count(),
        "the completion's tokens count from the end of the echoed prompt"
    );
    assert_eq!(body["usage"]["prompt_tokens"], ids.len());
    assert_eq!(body["usage"]["completion_tokens"], 5);
    // Without echo, the same request reports only the completion's tokens.
    let mut plain = req.clone();
    plain["echo"] = json!(false);
    let body = complete(&s.base, &plain).await;
    let plain_lp = &body["choices"][0]["logprobs"];
    assert_eq!(plain_lp["tokens"].as_array().unwrap().len(), 5);
    let (x, y) = (
        floats(&plain_lp["token_logprobs"]),
        floats(&lp["token_logprobs"]),
    );
    for (x, y) in x.iter().zip(&y[ids.len()..]) {
        assert!((x.unwrap() - y.unwrap()).abs() < TOL, "{x:?} vs {y:?}");
    }
}

#[tokio::test]
async fn max_tokens_0_with_echo_scores_the_prompt_alone() {
    let s = shared();
    let ids = ids(PROMPT);
    let refs = reference(&ids, 2);
    let req = json!({"prompt": PROMPT, "echo": true, "logprobs": 2, "max_tokens": 0});
    let body = complete(&s.base, &req).await;
    let c = &body["choices"][0];
    assert_eq!(c["text"], PROMPT);
    assert_eq!(c["finish_reason"], "length");
    assert_eq!(c["logprobs"]["tokens"].as_array().unwrap().len(), ids.len());
    assert_prompt_matches(&c["logprobs"], &refs, 2);
    assert_eq!(body["usage"]["completion_tokens"], 0);
    // Echo without logprobs: the prompt text alone.
    let body = complete(
        &s.base,
        &json!({"prompt": PROMPT, "echo": true, "max_tokens": 0}),
    )
    .await;
    assert_eq!(body["choices"][0]["text"], PROMPT);
    assert!(body["choices"][0]["logprobs"].is_null());
    // Streamed: the echo with its logprobs, then the finish.
    let mut streamed = req.clone();
    streamed["stream"] = json!(true);
    let chunks = stream(&s.base, "/v1/completions", &streamed).await.chunks();
    assert_eq!(chunks.len(), 2, "{chunks:?}");
    assert_eq!(chunks[0]["choices"][0]["text"], PROMPT);
    assert_prompt_matches(&chunks[0]["choices"][0]["logprobs"], &refs, 2);
    assert_eq!(chunks[1]["choices"][0]["finish_reason"], "length");
    // Two choices: each gets the echo with the shared logprobs before its finish.
    streamed["n"] = json!(2);
    let chunks = stream(&s.base, "/v1/completions", &streamed).await.chunks();
    let of = |i: u64| -> Vec<&Value> {
        chunks
            .iter()
            .map(|c| &c["choices"][0])
            .filter(|c| c["index"] == i)
            .collect()
    };
    let (a, b) = (of(0), of(1));
    assert_eq!((a.len(), b.len()), (2, 2), "{chunks:?}");
    assert_eq!(a[0]["text"], PROMPT);
    assert_eq!(a[0]["logprobs"], b[0]["logprobs"]);
    assert_prompt_matches(&b[0]["logprobs"], &refs, 2);
    assert_eq!(b[1]["finish_reason"], "length");
}

#[tokio::test]
async fn a_cached_prompt_is_recomputed_for_its_logprobs() {
    let s = shared();
    let prompt = "The little dog ran to the park and saw a big red ball. He";
    let refs = reference(&ids(prompt), 1);
    // A plain request first leaves the prompt's blocks in the prefix cache.
    let plain = json!({"prompt": prompt, "max_tokens": 2, "temperature": 0});
    complete(&s.base, &plain).await;
    let req =
        json!({"prompt": prompt, "echo": true, "logprobs": 1, "max_tokens": 2, "temperature": 0});
    let first = complete(&s.base, &req).await;
    let second = complete(&s.base, &req).await;
    let (a, b) = (
        &first["choices"][0]["logprobs"],
        &second["choices"][0]["logprobs"],
    );
    assert_prompt_matches(a, &refs, 1);
    assert_close(a, b); // the same prompt twice: the same logprobs
}

#[tokio::test]
async fn choices_and_prompts_each_get_their_prompt_logprobs() {
    let s = shared();
    let other = "Tom had a red car";
    let (r0, r1) = (reference(&ids(PROMPT), 2), reference(&ids(other), 2));
    let req = json!({"prompt": [PROMPT, other], "echo": true, "logprobs": 2, "max_tokens": 3,
                     "n": 2, "temperature": 0.8, "seed": 7});
    let body = complete(&s.base, &req).await;
    let choices = body["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 4);
    for (i, c) in choices.iter().enumerate() {
        let (text, refs) = if i < 2 { (PROMPT, &r0) } else { (other, &r1) };
        assert!(c["text"].as_str().unwrap().starts_with(text), "{c}");
        assert_prompt_matches(&c["logprobs"], refs, 2);
    }
    let prompt_part = |c: &Value, n: usize| floats(&c["logprobs"]["token_logprobs"])[..n].to_vec();
    let n0 = r0.len() + 1;
    assert_eq!(
        prompt_part(&choices[0], n0),
        prompt_part(&choices[1], n0),
        "the choices of one prompt share its logprobs"
    );
}

#[tokio::test]
async fn streamed_echo_with_logprobs_sends_the_prompt_first_and_equals_the_body() {
    let s = shared();
    let req = json!({"prompt": PROMPT, "echo": true, "logprobs": 2, "max_tokens": 6,
                     "temperature": 0, "ignore_eos": true});
    let body = complete(&s.base, &req).await;
    let want = &body["choices"][0]["logprobs"];
    let mut streamed = req.clone();
    streamed["stream"] = json!(true);
    let chunks = stream(&s.base, "/v1/completions", &streamed).await.chunks();
    let first = &chunks[0]["choices"][0];
    assert_eq!(first["text"], PROMPT, "the echo comes first");
    assert_eq!(
        first["logprobs"]["tokens"].as_array().unwrap().len(),
        ids(PROMPT).len()
    );
    let mut got =
        json!({"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []});
    let mut text = String::new();
    for c in &chunks {
        let choice = &c["choices"][0];
        text.push_str(choice["text"].as_str().unwrap());
        for key in ["tokens", "token_logprobs", "top_logprobs", "text_offset"] {
            if let Some(v) = choice["logprobs"][key].as_array() {
                got[key].as_array_mut().unwrap().extend(v.iter().cloned());
            }
        }
    }
    assert_eq!(text, body["choices"][0]["text"].as_str().unwrap());
    assert_close(&got, want);
}

/// A server whose steps hold few tokens and few logits rows: a long prompt's logprobs come
/// in many chunks of at most `max_num_seqs` rows, beside other requests' decodes.
#[tokio::test]
async fn a_long_prompt_in_many_small_chunks_gives_the_one_chunk_values() {
    let mut cfg = test_config();
    cfg.engine.max_num_seqs = 4;
    cfg.engine.max_num_batched_tokens = Some(24);
    let small = start(cfg);
    let long = "Once upon a time, there was a little girl named Lily. She loved to play \
                outside in the sunshine. One day, she saw a big, red ball in the park. She \
                ran to it and kicked it high into the sky.";
    let ids = ids(long);
    assert!(ids.len() > 40, "{} tokens", ids.len());
    let refs = reference(&ids, 2);
    let req = json!({"prompt": long, "echo": true, "logprobs": 2, "max_tokens": 4,
                     "temperature": 0, "ignore_eos": true});
    let decode = json!({"prompt": PROMPT, "max_tokens": 30, "temperature": 0, "ignore_eos": true});
    let (scored, d1, d2) = tokio::join!(
        complete(&small.base, &req),
        complete(&small.base, &decode),
        complete(&small.base, &decode),
    );
    assert_prompt_matches(&scored["choices"][0]["logprobs"], &refs, 2);
    let one_chunk = complete(&shared().base, &req).await;
    let (a, b) = (
        floats(&scored["choices"][0]["logprobs"]["token_logprobs"]),
        floats(&one_chunk["choices"][0]["logprobs"]["token_logprobs"]),
    );
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        assert!(
            (x.unwrap_or(0.0) - y.unwrap_or(0.0)).abs() < TOL,
            "{x:?} vs {y:?}"
        );
    }
    let text = greedy_reference(PROMPT, 30);
    assert_eq!(d1["choices"][0]["text"], text);
    assert_eq!(d2["choices"][0]["text"], text);
}
