//! Qwen3-MoE: Qwen3's block with a mixture of experts in every layer (no shared expert).

use super::desc::{Experts, Family, LLAMA_TENSORS, QkvBias, no_gguf_keys};
use super::qwen2::hf_qwen;
use super::qwen3::QWEN3_FLAGS;
use crate::backend::RopeLayout;

pub static QWEN3MOE: Family = Family {
    arch: "qwen3moe",
    gguf: true,
    hf_types: &["qwen3_moe"],
    hf_wrapper: None,
    gguf_rope: RopeLayout::Half,
    gguf_rope_scalings: &["none", "llama3"],
    hf_own_rope_scaling: false,
    flags: QWEN3_FLAGS,
    experts: Experts::Qwen {
        shared: false,
        gguf_norm_topk: true,
    },
    qkv_bias: QkvBias::AttentionBias,
    hf_tied_default: false,
    hf_tensors: LLAMA_TENSORS,
    gguf_variant: no_gguf_keys,
    hf_variant: hf_qwen,
};
