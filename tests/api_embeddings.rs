//! `POST /v1/embeddings` against a real server: vectors against transformers on a tiny random
//! Qwen3 (last-token pooling stated by its sentence-transformers files; mean and CLS on the
//! same model), the same vector alone and inside batches beside running generations, float
//! and base64 alike, `dimensions` renormalized, and every bad input a 4xx with the server
//! serving on.

mod api_support;

use api_support::*;
use kiln::model::{LoadFormat, ModelFiles, Pooling};
use serde_json::{Value, json};

/// Agreement with the float64 transformers reference (Kiln's CPU forward is float32).
const REF_TOL: f64 = 1e-4;
/// The same input alone and in any batch, on the CPU.
const BATCH_TOL: f64 = 1e-5;

const TEXT: &str = "Once upon a time, there was a little girl named Lily. She loved to play \
                    outside in the park with her friends.";

fn embed_config() -> kiln::config::Config {
    let mut cfg = test_config();
    cfg.model.embeddings = true;
    cfg
}

async fn embed(base: &str, body: &Value) -> Value {
    let (status, _, res) = post(base, "/v1/embeddings", body).await;
    assert_eq!(status, 200, "{res}");
    assert_eq!(res["object"], "list", "{res}");
    res
}

/// The vectors of a response, in `index` order (checked to be 0..n).
fn vectors(res: &Value) -> Vec<Vec<f64>> {
    let data = res["data"].as_array().expect("data");
    data.iter()
        .enumerate()
        .map(|(i, d)| {
            assert_eq!(d["object"], "embedding");
            assert_eq!(d["index"], i);
            match &d["embedding"] {
                Value::String(b64) => decode_base64_f32(b64),
                v => v
                    .as_array()
                    .expect("floats")
                    .iter()
                    .map(|x| x.as_f64().unwrap())
                    .collect(),
            }
        })
        .collect()
}

/// Little-endian f32 values of standard base64 (as the openai SDK decodes them).
fn decode_base64_f32(s: &str) -> Vec<f64> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let mut bytes = Vec::new();
    for chunk in s.as_bytes().chunks(4) {
        let n = chunk.iter().filter(|&&c| c != b'=').count();
        let mut acc = 0u32;
        for (k, &c) in chunk.iter().enumerate() {
            acc |= (if c == b'=' { 0 } else { val(c) as u32 }) << (18 - 6 * k);
        }
        bytes.extend_from_slice(&acc.to_be_bytes()[1..n]);
    }
    assert_eq!(bytes.len() % 4, 0, "whole f32 values");
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64)
        .collect()
}

fn max_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "lengths");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

fn norm(v: &[f64]) -> f64 {
    v.iter().map(|x| x * x).sum::<f64>().sqrt()
}

fn qwen3_files(pooling: Option<Pooling>) -> ModelFiles {
    let dir = kiln::config::project_root().join("tests/data/embed-qwen3");
    let mut files = ModelFiles::open(&dir, LoadFormat::Hf).expect("embed-qwen3 fixture");
    assert_eq!(
        files.spec.variant.pooling,
        Some(Pooling::Last),
        "modules.json and 1_Pooling state last-token pooling"
    );
    if pooling.is_some() {
        files.spec.variant.pooling = pooling;
    }
    files
}

#[actix_web::test]
async fn embeddings_match_transformers_on_a_tiny_qwen3() {
    let golden: Value = serde_json::from_str(
        &std::fs::read_to_string(
            kiln::config::project_root().join("tests/golden/embed-qwen3.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let inputs = golden["inputs"].as_array().unwrap();
    let texts: Vec<&str> = inputs.iter().map(|i| i["text"].as_str().unwrap()).collect();
    let ids: Vec<Value> = inputs.iter().map(|i| i["ids"].clone()).collect();
    let tokens: usize = ids.iter().map(|i| i.as_array().unwrap().len()).sum();
    for (key, pooling) in [
        ("last", None),
        ("mean", Some(Pooling::Mean)),
        ("cls", Some(Pooling::Cls)),
    ] {
        let want: Vec<Vec<f64>> = golden["embeddings"][key]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| {
                v.as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_f64().unwrap())
                    .collect()
            })
            .collect();
        let mut cfg = embed_config();
        // Small steps: the longer inputs are computed in chunks.
        cfg.engine.max_num_batched_tokens = Some(8);
        let s = start_with(qwen3_files(pooling), cfg);
        for input in [json!(texts), json!(ids)] {
            let res = embed(&s.base, &json!({"input": input})).await;
            assert_eq!(res["usage"]["prompt_tokens"], tokens, "{key}: {res}");
            assert_eq!(res["usage"]["total_tokens"], tokens, "{key}: {res}");
            for (i, (got, want)) in vectors(&res).iter().zip(&want).enumerate() {
                let d = max_diff(got, want);
                assert!(
                    d < REF_TOL,
                    "{key} pooling, input {i}: {d:e} from transformers"
                );
            }
        }
    }
}

/// Queues `n` long greedy generations straight on the engine and leaves their streams
/// unread: each computes hundreds of tokens before its buffer fills, so the requests that
/// follow share their steps.
fn running_generations(s: &TestServer, n: usize) -> Vec<kiln::engine::ResponseStream> {
    let tok = model_files().tokenizer.expect("tokenizer");
    (0..n)
        .map(|i| {
            let ids = tok
                .encode(&format!("Tom had a red ball {i}"), true)
                .unwrap();
            let mut req = kiln::engine::GenerateRequest::greedy(ids, 400);
            req.stop.ignore_eos = true;
            s.engine.client().submit(req).expect("submit")
        })
        .collect()
}

#[actix_web::test]
async fn the_same_input_alone_and_beside_generations_gives_the_same_vector() {
    for pooling in [Pooling::Last, Pooling::Mean, Pooling::Cls] {
        let mut files = model_files();
        files.spec.variant.pooling = Some(pooling);
        let mut cfg = embed_config();
        // Small steps: the input is computed in chunks beside the generations' rows.
        cfg.engine.max_num_batched_tokens = Some(16);
        cfg.engine.stream_buffer_events = 4096;
        let s = start_with(files, cfg);
        let alone = vectors(&embed(&s.base, &json!({"input": TEXT})).await).remove(0);
        assert!((norm(&alone) - 1.0).abs() < 1e-5, "normalized");
        let gens = running_generations(&s, 4);
        let other = "The dog ran to the tree and barked at the bird.";
        let batch = json!({"input": [other, TEXT, "Lily", TEXT]});
        let got = vectors(&embed(&s.base, &batch).await);
        let stats = s.engine.client().stats();
        assert!(
            stats.lanes[0].running >= 4,
            "the generations ran beside the embeddings: {stats:?}"
        );
        for i in [1, 3] {
            let d = max_diff(&got[i], &alone);
            assert!(d < BATCH_TOL, "{pooling:?}: input {i} differs by {d:e}");
        }
        // (CLS on a causal model is its first token's row: BOS's, whatever follows.)
        if pooling != Pooling::Cls {
            assert!(
                max_diff(&got[0], &alone) > 1e-3,
                "a different input differs"
            );
        }
        drop(gens);
    }
}

#[actix_web::test]
async fn float_and_base64_agree_and_dimensions_renormalize() {
    let s = start(embed_config());
    let float = vectors(&embed(&s.base, &json!({"input": [TEXT, "Lily"]})).await);
    let b64_res = embed(
        &s.base,
        &json!({"input": [TEXT, "Lily"], "encoding_format": "base64", "user": "u1"}),
    )
    .await;
    assert!(b64_res["data"][0]["embedding"].is_string(), "{b64_res}");
    let b64 = vectors(&b64_res);
    for (f, b) in float.iter().zip(&b64) {
        // Two requests may be batched differently (the CPU's sums then round differently).
        let d = max_diff(f, b);
        assert!(d < BATCH_TOL, "float and base64 differ by {d:e}");
    }
    let hidden = float[0].len();
    assert_eq!(hidden, model_files().spec.hidden);
    let d = hidden / 4;
    let cut = vectors(&embed(&s.base, &json!({"input": TEXT, "dimensions": d})).await).remove(0);
    assert_eq!(cut.len(), d);
    assert!((norm(&cut) - 1.0).abs() < 1e-5, "renormalized");
    let head = &float[0][..d];
    let want: Vec<f64> = head.iter().map(|x| x / norm(head)).collect();
    assert!(
        max_diff(&cut, &want) < BATCH_TOL,
        "the first values, renormalized"
    );
    let full = vectors(&embed(&s.base, &json!({"input": TEXT, "dimensions": hidden})).await);
    assert!(max_diff(&full[0], &float[0]) < BATCH_TOL);
}

#[actix_web::test]
async fn without_the_flag_embeddings_are_a_400_and_generation_serves_on() {
    let s = shared();
    let (status, _, body) = post(&s.base, "/v1/embeddings", &json!({"input": "hi"})).await;
    assert_error(status, &body, 400, "invalid_request_error", None);
    assert_eq!(body["error"]["code"], "embeddings_disabled");
    let msg = body["error"]["message"].as_str().unwrap();
    assert!(msg.contains("--embeddings"), "{msg}");
    let (status, _, _) = post(
        &s.base,
        "/v1/completions",
        &json!({"prompt": "Once", "max_tokens": 2}),
    )
    .await;
    assert_eq!(status, 200);
}

#[actix_web::test]
async fn bad_inputs_get_4xx_naming_the_field_and_the_server_serves_on() {
    let s = start(embed_config());
    let hidden = model_files().spec.hidden;
    let vocab = model_files().spec.vocab_size;
    let long = vec![1; 4096];
    let cases = [
        (json!({"input": []}), "input", 400),
        (json!({"input": ""}), "input[0]", 400),
        (json!({"input": ["a", ""]}), "input[1]", 400),
        (json!({"input": [[1, 2], []]}), "input[1]", 400),
        (json!({"input": 7}), "input", 400),
        (json!({"input": [vocab]}), "input", 400),
        (json!({"input": long}), "input", 400),
        (json!({"input": "x".repeat(40_000)}), "input", 400),
        (
            json!({"input": "a", "encoding_format": "int8"}),
            "encoding_format",
            400,
        ),
        (json!({"input": "a", "dimensions": 0}), "dimensions", 400),
        (
            json!({"input": "a", "dimensions": hidden + 1}),
            "dimensions",
            400,
        ),
        (json!({"input": "a", "dimensions": -1}), "dimensions", 400),
        (
            json!({"input": "a", "temperature": 0.5}),
            "temperature",
            400,
        ),
        (json!({"model": "nope", "input": "a"}), "model", 404),
    ];
    for (body, param, want) in cases {
        let (status, _, res) = post(&s.base, "/v1/embeddings", &body).await;
        let kind = if want == 404 {
            "not_found_error"
        } else {
            "invalid_request_error"
        };
        assert_error(status, &res, want, kind, Some(param));
    }
    for body in [json!({"input": long}), json!({"input": "x".repeat(40_000)})] {
        let (_, _, res) = post(&s.base, "/v1/embeddings", &body).await;
        assert_eq!(res["error"]["code"], "context_length_exceeded", "{res}");
    }
    let (status, _, res) = post(&s.base, "/v1/embeddings", &json!({"inputs": "a"})).await;
    assert_eq!(status, 400, "{res}");
    let res = embed(&s.base, &json!({"input": "still serving"})).await;
    assert_eq!(vectors(&res).len(), 1);
    // No KV is kept for an embedding: nothing runs or waits and every block is free again
    // (cached blocks count free) once the lane has published its last step.
    let start = std::time::Instant::now();
    let freed = loop {
        let st = s.engine.client().stats();
        let l = &st.lanes[0];
        let idle = l.running + l.waiting == 0 && l.kv_free_blocks == l.kv_total_blocks;
        if idle || start.elapsed().as_secs() > 5 {
            break st;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    };
    let lane = &freed.lanes[0];
    assert_eq!(lane.running + lane.waiting, 0, "{freed:?}");
    assert_eq!(lane.kv_free_blocks, lane.kv_total_blocks, "{freed:?}");
}

/// The fixture's tokenizer with a post-processor that appends `<|endoftext|>` to every input,
/// as Qwen3-Embedding's does (written to a fresh directory).
fn eos_appending_tokenizer() -> (kiln::tokenizer::Tokenizer, u32) {
    let src = kiln::config::project_root().join("tests/data/embed-qwen3");
    let mut json: Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("tokenizer.json")).unwrap())
            .unwrap();
    let eos = json["added_tokens"][0]["id"].as_u64().unwrap() as u32;
    assert_eq!(json["added_tokens"][0]["content"], "<|endoftext|>");
    let seq = json!({"Sequence": {"id": "A", "type_id": 0}});
    let end = json!({"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}});
    json["post_processor"] = json!({
        "type": "TemplateProcessing",
        "single": [seq, end],
        "pair": [seq, end, {"Sequence": {"id": "B", "type_id": 1}}, end],
        "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [eos],
            "tokens": ["<|endoftext|>"]}},
    });
    let dir = std::env::temp_dir().join(format!("kiln-eos-tok-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("tokenizer.json"), json.to_string()).unwrap();
    std::fs::copy(
        src.join("tokenizer_config.json"),
        dir.join("tokenizer_config.json"),
    )
    .unwrap();
    let tok = kiln::tokenizer::Tokenizer::from_file(
        &dir.join("tokenizer.json"),
        Some(&dir.join("tokenizer_config.json")),
    )
    .unwrap();
    (tok, eos)
}

#[actix_web::test]
async fn text_inputs_end_with_the_eos_the_models_tokenizer_appends() {
    let golden: Value = serde_json::from_str(
        &std::fs::read_to_string(
            kiln::config::project_root().join("tests/golden/embed-qwen3.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let input = &golden["inputs"][0];
    let ids: Vec<u64> = input["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    let (tok, eos) = eos_appending_tokenizer();
    assert_eq!(tok.eos_appended(), Some(eos));
    assert_eq!(qwen3_files(None).tokenizer.unwrap().eos_appended(), None);
    let mut files = qwen3_files(None);
    files.tokenizer = Some(tok);
    let s = start_with(files, embed_config());
    let text = embed(&s.base, &json!({"input": input["text"]})).await;
    assert_eq!(text["usage"]["prompt_tokens"], ids.len() + 1, "{text}");
    let mut with_eos = ids.clone();
    with_eos.push(eos as u64);
    let by_ids = embed(&s.base, &json!({"input": [with_eos, ids]})).await;
    let (text, by_ids) = (vectors(&text), vectors(&by_ids));
    assert!(
        max_diff(&text[0], &by_ids[0]) < BATCH_TOL,
        "the text is embedded with its EOS"
    );
    assert!(
        max_diff(&text[0], &by_ids[1]) > 1e-3,
        "ids are embedded as sent"
    );
    // A text that already ends with the EOS does not get a second one.
    let ended = format!("{}<|endoftext|>", input["text"].as_str().unwrap());
    let res = embed(&s.base, &json!({"input": ended})).await;
    assert_eq!(res["usage"]["prompt_tokens"], ids.len() + 1, "{res}");
}
