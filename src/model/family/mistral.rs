//! Mistral: Llama's block with a sliding window in `config.json` (its GGUF files are read
//! as Llama's).

use super::desc::{Experts, Family, LLAMA_FLAGS, LLAMA_TENSORS, QkvBias, hf_window, no_gguf_keys};
use crate::backend::RopeLayout;

pub static MISTRAL: Family = Family {
    arch: "mistral",
    gguf: true,
    hf_types: &["mistral"],
    hf_wrapper: None,
    gguf_rope: RopeLayout::Interleaved,
    gguf_rope_scalings: &["none", "llama3"],
    hf_own_rope_scaling: false,
    flags: LLAMA_FLAGS,
    experts: Experts::LlamaGguf,
    qkv_bias: QkvBias::AttentionBias,
    hf_tied_default: false,
    hf_tensors: LLAMA_TENSORS,
    gguf_variant: no_gguf_keys,
    hf_variant: hf_window,
};
