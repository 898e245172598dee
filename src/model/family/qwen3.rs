//! Qwen3: Qwen2's block without biases, with per-head RMSNorms of q and k.

use super::desc::{Experts, Family, Flags, LLAMA_FLAGS, LLAMA_TENSORS, QkvBias, no_gguf_keys};
use super::qwen2::hf_qwen;
use crate::backend::RopeLayout;

/// Qwen3's additions to the Llama block (its MoE shares them).
pub const QWEN3_FLAGS: Flags = Flags {
    qk_norm: true,
    ..LLAMA_FLAGS
};

pub static QWEN3: Family = Family {
    arch: "qwen3",
    gguf: true,
    hf_types: &["qwen3"],
    hf_wrapper: None,
    gguf_rope: RopeLayout::Half,
    gguf_rope_scalings: &["none", "llama3"],
    hf_own_rope_scaling: false,
    flags: QWEN3_FLAGS,
    experts: Experts::None,
    qkv_bias: QkvBias::AttentionBias,
    hf_tied_default: false,
    hf_tensors: LLAMA_TENSORS,
    gguf_variant: no_gguf_keys,
    hf_variant: hf_qwen,
};
