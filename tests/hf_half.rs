//! Hugging Face checkpoints in bf16 on the CPU's default path, where the weights stay bf16
//! (borrowed from the file's mapping, widened inside the matmul): the same greedy ids as the
//! same files widened to f32 at load, up to the first near-tie, and logits within 1e-4; and
//! the loader hands every matrix over in the file's type, so the host holds exactly the
//! file's matrix bytes.

mod golden_support;

use golden_support::{load, repo};
use kiln::backend::cpu::CpuBackend;
use kiln::backend::quant::GgmlType;
use kiln::backend::{HostData, HostTensor};
use kiln::generate::{GenerateOptions, SingleGenerator};
use kiln::model::{LoadFormat, ModelError, ModelFiles};
use kiln::sampling::SamplingParams;
use safetensors::SafeTensors;

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

/// Every raw leaf of `t` (the parts of a stack, or `t` itself).
fn leaves(t: &HostTensor) -> Vec<&HostTensor> {
    match &t.data {
        HostData::Stacked(parts) => parts.iter().flat_map(leaves).collect(),
        _ => vec![t],
    }
}

/// Loads `tests/data/arch/<name>` as the loader hands it to a backend: every matrix in
/// the file's type, so the host holds exactly the file's matrix bytes (vectors, which
/// the loader may transform, as f32).
fn check_weights_are_the_files_bytes(name: &str, ty: GgmlType) {
    let dir = repo().join("tests/data/arch").join(name);
    let files = ModelFiles::open(&dir, LoadFormat::Hf).unwrap();
    let weights = kiln::runner::load_weights(&files, Ok::<_, ModelError>).unwrap();
    let mut loaded = Vec::new();
    weights
        .try_map(|t| {
            loaded.push(t.clone());
            Ok::<_, ModelError>(())
        })
        .unwrap();
    let (mut host_matrices, mut vector_elems) = (0, 0);
    for t in &loaded {
        if t.shape.len() == 1 {
            assert!(t.values().is_some(), "{name}: vector as {}", t.type_label());
            vector_elems += t.shape[0];
            continue;
        }
        for leaf in leaves(t) {
            assert!(
                matches!(leaf.data, HostData::Raw { ty: got, .. } if got == ty)
                    || (ty == GgmlType::F32 && leaf.values().is_some()),
                "{name}: a {:?} matrix arrived as {}",
                leaf.shape,
                leaf.type_label()
            );
        }
        host_matrices += t.byte_len();
    }
    let (mut file_matrices, mut file_vector_elems) = (0, 0);
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|x| x != "safetensors") {
            continue;
        }
        let bytes = std::fs::read(&path).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        for (_, view) in st.tensors() {
            match view.shape().len() {
                1 => file_vector_elems += view.shape()[0],
                _ => file_matrices += view.data().len(),
            }
        }
    }
    assert_eq!(host_matrices, file_matrices, "{name}: matrix bytes");
    assert_eq!(vector_elems, file_vector_elems, "{name}: vector elements");
    let host: usize = loaded.iter().map(HostTensor::byte_len).sum();
    assert_eq!(
        host,
        file_matrices + 4 * file_vector_elems,
        "{name}: host bytes"
    );
}

#[test]
fn bf16_checkpoints_load_in_the_files_bytes() {
    for name in ["mistral-bf16", "qwen3", "gemma2", "qwen3moe"] {
        check_weights_are_the_files_bytes(name, GgmlType::BF16);
    }
    // Sharded f32: values, as before, from both shards.
    check_weights_are_the_files_bytes("llama-sharded", GgmlType::F32);
}
