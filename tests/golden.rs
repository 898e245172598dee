//! The CPU forward against an independent NumPy reference (`scripts/golden.py` wrote
//! `tests/golden/*.json`): greedy ids token for token, logits within 1e-4 relative error.

mod golden_support;

use golden_support::{check, fixture, load};
use kiln::model::{LoadFormat, ModelFiles};

fn check_model(golden: &str, model: &str, min_exact: usize) {
    let files = ModelFiles::open(&fixture(model), LoadFormat::Auto).unwrap();
    check(model, &load(golden), &files, min_exact);
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
