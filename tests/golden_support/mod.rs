//! Shared checker for golden-reference tests: greedy ids token for token up to the first
//! near-tie, logits within 1e-4 relative error (max |ours - ref| / max |ref|).
#![allow(dead_code)] // each test binary uses a different subset

use std::path::{Path, PathBuf};

use kiln::backend::cpu::CpuBackend;
use kiln::generate::{GenerateOptions, SingleGenerator};
use kiln::model::ModelFiles;
use kiln::sampling::SamplingParams;
use serde_json::Value;

/// The repository root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Reads `tests/golden/<name>`.
pub fn load(name: &str) -> Value {
    let p = repo().join("tests/golden").join(name);
    serde_json::from_str(
        &std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())),
    )
    .unwrap()
}

/// max |a - b| / max |b| over the entries the reference stored (full logits, or top-k).
pub fn rel_error(ours: &[f32], reference: &Value) -> f64 {
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

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// Generates greedily for every prompt of `golden` on the CPU backend (prefill in chunks of
/// 7, blocks of 4, so chunking and paging are exercised) and checks ids and logits.
/// Returns the worst relative logits error seen. The weights are dequantized to f32, as
/// the reference computes: the CPU's default path on quantized weights (8-bit activations,
/// about 1e-2 relative logits error on stories260K) is checked against this one in
/// `tests/cpu_quant.rs`.
pub fn check(label: &str, golden: &Value, files: &ModelFiles, min_exact: usize) -> f64 {
    let mut generator =
        SingleGenerator::new(CpuBackend::with_f32_weights(), files, 256, 7, 4).unwrap();
    let mut worst = 0.0f64;
    for p in golden["prompts"].as_array().unwrap() {
        let (prompt, want) = (ids(&p["prompt_ids"]), ids(&p["generated_ids"]));
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
            "{label}: reference has a near-tie at step {exact}"
        );
        let n = prompt.len();
        assert_eq!(
            out.token_ids[..exact],
            want[..exact],
            "{label}: greedy ids for the {n}-token prompt"
        );
        let err = rel_error(&out.step_logits[0], &p["prompt_logits_last"]);
        assert!(
            err < 1e-4,
            "{label}: {n}-token prompt logits rel error {err}"
        );
        worst = worst.max(err);
        for s in p["step_logits"].as_array().unwrap() {
            let step = s["step"].as_u64().unwrap() as usize;
            if step < exact {
                let err = rel_error(&out.step_logits[step], s);
                assert!(
                    err < 1e-4,
                    "{label}: {n}-token prompt, step {step} logits rel error {err}"
                );
                worst = worst.max(err);
            }
        }
    }
    eprintln!("{label}: worst logits rel error {worst:.3e}");
    worst
}

/// Path of a file in the shared fixtures directory.
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/models")
        .join(name)
}
