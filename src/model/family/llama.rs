//! Llama (1, 2, 3, 3.x): the plain block every other family starts from. Its GGUF files
//! rotate adjacent pairs (llama.cpp's converter permutes q and k) and may hold experts
//! (Mixtral's files are `llama`).

use super::desc::{Experts, Family, LLAMA_FLAGS, LLAMA_TENSORS, QkvBias, hf_window, no_gguf_keys};
use crate::backend::RopeLayout;

pub static LLAMA: Family = Family {
    arch: "llama",
    gguf: true,
    hf_types: &["llama"],
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
