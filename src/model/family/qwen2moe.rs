//! Qwen2-MoE: Qwen2's block with a mixture of experts and one gated shared expert in every
//! layer; its `qkv_bias` defaults to true.

use super::desc::{Experts, Family, LLAMA_FLAGS, LLAMA_TENSORS, QkvBias, no_gguf_keys};
use super::qwen2::hf_qwen;
use crate::backend::RopeLayout;

pub static QWEN2MOE: Family = Family {
    arch: "qwen2moe",
    gguf: true,
    hf_types: &["qwen2_moe"],
    hf_wrapper: None,
    gguf_rope: RopeLayout::Half,
    gguf_rope_scalings: &["none", "llama3"],
    hf_own_rope_scaling: false,
    flags: LLAMA_FLAGS,
    // llama.cpp does not renormalise Qwen2-MoE's top-k weights.
    experts: Experts::Qwen {
        shared: true,
        gguf_norm_topk: false,
    },
    qkv_bias: QkvBias::QkvKey,
    hf_tied_default: false,
    hf_tensors: LLAMA_TENSORS,
    gguf_variant: no_gguf_keys,
    hf_variant: hf_qwen,
};
