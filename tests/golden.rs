//! The CPU forward against an independent NumPy reference (`scripts/golden.py` wrote
//! `tests/golden/*.json`): greedy ids token for token, logits within 1e-4 relative error.

use std::path::{Path, PathBuf};

use kiln::backend::cpu::CpuBackend;
use kiln::generate::{GenerateOptions, SingleGenerator};
use kiln::model::{LoadFormat, ModelFiles};
use kiln::sampling::SamplingParams;
use serde_json::Value;

fn models_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/models")
}

/// max |a - b| / max |b| over the entries the reference stored.
fn rel_error(ours: &[f32], reference: &Value) -> f64 {
    let pairs: Vec<(f64, f64)> = if let Some(full) = reference.get("logits") {
        let full = full.as_array().expect("logits array");
        assert_eq!(full.len(), ours.len(), "vocab size");
        full.iter()
            .zip(ours)
            .map(|(r, &o)| (o as f64, r.as_f64().unwrap()))
            .collect()
    } else {
        let ids = reference["top_k_ids"].as_array().expect("top_k_ids");
        let vals = reference["top_k_logits"].as_array().expect("top_k_logits");
        ids.iter()
            .zip(vals)
            .map(|(i, v)| {
                (
                    ours[i.as_u64().unwrap() as usize] as f64,
                    v.as_f64().unwrap(),
                )
            })
            .collect()
    };
    let scale = pairs.iter().map(|p| p.1.abs()).fold(0.0, f64::max);
    pairs.iter().map(|(o, r)| (o - r).abs()).fold(0.0, f64::max) / scale
}

fn check_model(golden: &str, model: &str, min_exact: usize) {
    let g: Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/golden")
                .join(golden),
        )
        .unwrap(),
    )
    .unwrap();
    let files = ModelFiles::open(&models_dir().join(model), LoadFormat::Auto).unwrap();
    let mut generator = SingleGenerator::new(CpuBackend::new(), &files, 256, 7, 4).unwrap();
    for p in g["prompts"].as_array().unwrap() {
        let ids = |v: &Value| {
            v.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect::<Vec<_>>()
        };
        let prompt = ids(&p["prompt_ids"]);
        let want = ids(&p["generated_ids"]);
        let margins: Vec<f64> = p["top2_margin"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m.as_f64().unwrap())
            .collect();
        let opts = GenerateOptions {
            max_tokens: want.len(),
            params: SamplingParams::greedy(),
            stop_ids: vec![],
            chunk: 7,
            block_size: 4,
            record_logits: want.len(),
        };
        let out = generator.generate(&prompt, &opts, |_| {}).unwrap();
        // Ids must agree up to the first near-tie (where float rounding may pick either).
        let exact = margins.iter().position(|&m| m < 1e-3).unwrap_or(want.len());
        assert!(
            exact >= min_exact,
            "{model}: reference has a near-tie at step {exact}"
        );
        assert_eq!(
            out.token_ids[..exact],
            want[..exact],
            "{model}: greedy ids for {prompt:?}"
        );
        let err = rel_error(&out.step_logits[0], &p["prompt_logits_last"]);
        assert!(err < 1e-4, "{model}: prompt logits rel error {err}");
        for s in p["step_logits"].as_array().unwrap() {
            let step = s["step"].as_u64().unwrap() as usize;
            if step < exact {
                let err = rel_error(&out.step_logits[step], s);
                assert!(err < 1e-4, "{model}: step {step} logits rel error {err}");
            }
        }
    }
}

#[test]
fn stories260k_f32_matches_reference() {
    check_model("stories260K.json", "stories260K.gguf", 64);
}

#[test]
fn stories260k_hf_safetensors_matches_reference() {
    check_model("stories260K-hf.json", "stories260K-hf", 64);
}

#[test]
fn stories260k_f16_matches_reference() {
    check_model("stories260K-F16.json", "stories260K-F16.gguf", 64);
}

#[test]
fn stories260k_q8_0_matches_reference() {
    check_model("stories260K-Q8_0.json", "stories260K-Q8_0.gguf", 64);
}

#[test]
fn stories260k_q4_0_matches_reference() {
    check_model("stories260K-Q4_0.json", "stories260K-Q4_0.gguf", 64);
}

#[test]
fn llama2_tiny_random_f16_matches_reference() {
    check_model("llama-2-tiny-random.json", "llama-2-tiny-random.gguf", 20);
}
