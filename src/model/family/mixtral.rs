//! Mixtral's `config.json` checkpoints: Mistral's block with a mixture of experts in every
//! layer under `block_sparse_moe` (its GGUF files are `llama` with experts).

use super::desc::{Experts, Family, HfTensors, LLAMA_FLAGS, QkvBias, hf_window, no_gguf_keys};
use crate::backend::RopeLayout;

pub static MIXTRAL: Family = Family {
    arch: "mixtral",
    gguf: false,
    hf_types: &["mixtral"],
    hf_wrapper: None,
    gguf_rope: RopeLayout::Interleaved,
    gguf_rope_scalings: &["none", "llama3"],
    hf_own_rope_scaling: false,
    flags: LLAMA_FLAGS,
    experts: Experts::Mixtral,
    qkv_bias: QkvBias::AttentionBias,
    hf_tied_default: false,
    hf_tensors: HfTensors {
        leaves: &[],
        router: "block_sparse_moe.gate.weight",
        experts: "block_sparse_moe.experts",
        expert_names: ["w1", "w3", "w2"],
        derived: None,
    },
    gguf_variant: no_gguf_keys,
    hf_variant: hf_window,
};
