//! Hugging Face checkpoints in bf16 on the CPU's default path, where the weights stay bf16
//! (borrowed from the file's mapping, widened inside the matmul): the same greedy ids as the
//! same files widened to f32 at load, up to the first near-tie, and logits within 1e-4.

mod golden_support;

use golden_support::{load, repo};
use kiln::backend::cpu::CpuBackend;
use kiln::generate::{GenerateOptions, SingleGenerator};
use kiln::model::{LoadFormat, ModelFiles};
use kiln::sampling::SamplingParams;

/// max |a - b| / max |b|.
fn rel_err(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    a.iter()
        .zip(b)
        .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()))
        / scale
}

/// Runs every prompt of `tests/golden/arch-<name>.json` on `tests/data/arch/<name>` both
/// ways and compares.
fn check_native_half(name: &str) {
    let dir = repo().join("tests/data/arch").join(name);
    let files = ModelFiles::open(&dir, LoadFormat::Hf).unwrap();
    let mut native = SingleGenerator::new(CpuBackend::new(), &files, 256, 7, 4).unwrap();
    let mut widened =
        SingleGenerator::new(CpuBackend::with_f32_weights(), &files, 256, 7, 4).unwrap();
    let mut compared = 0;
    for p in load(&format!("arch-{name}.json"))["prompts"]
        .as_array()
        .unwrap()
    {
        let prompt: Vec<u32> = p["prompt_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        let opts = GenerateOptions {
            max_tokens: 16,
            params: SamplingParams::greedy(),
            stop_ids: vec![],
            chunk: 7,
            block_size: 4,
            record_logits: 16,
        };
        let a = native.generate(&prompt, &opts, |_| {}).unwrap();
        let b = widened.generate(&prompt, &opts, |_| {}).unwrap();
        for (step, (la, lb)) in a.step_logits.iter().zip(&b.step_logits).enumerate() {
            let mut sorted = lb.clone();
            sorted.sort_by(|x, y| y.total_cmp(x));
            if sorted[0] - sorted[1] < 1e-3 {
                break;
            }
            assert_eq!(a.token_ids[step], b.token_ids[step], "{name}: step {step}");
            let err = rel_err(la, lb);
            assert!(err < 1e-4, "{name}: step {step} logits rel err {err}");
            compared += 1;
        }
    }
    assert!(compared >= 16, "{name}: only {compared} steps compared");
}

#[test]
fn bf16_checkpoints_compute_in_bf16_like_their_f32_widening() {
    for name in ["mistral-bf16", "qwen3", "gemma2", "qwen3moe"] {
        check_native_half(name);
    }
}
