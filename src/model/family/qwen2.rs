//! Qwen2 (and 2.5): Llama's block with q/k/v biases, rotating head halves; its sliding
//! window is refused.

use serde_json::Value;

use super::super::ModelError;
use super::super::variant::Variant;
use super::desc::{
    Experts, Family, HfBase, LLAMA_FLAGS, LLAMA_TENSORS, QkvBias, no_gguf_keys, spec_err,
};
use crate::backend::{RopeLayout, RopeSpec};

pub static QWEN2: Family = Family {
    arch: "qwen2",
    gguf: true,
    hf_types: &["qwen2"],
    hf_wrapper: None,
    gguf_rope: RopeLayout::Half,
    gguf_rope_scalings: &["none", "llama3"],
    hf_own_rope_scaling: false,
    flags: LLAMA_FLAGS,
    experts: Experts::None,
    qkv_bias: QkvBias::Always,
    hf_tied_default: false,
    hf_tensors: LLAMA_TENSORS,
    gguf_variant: no_gguf_keys,
    hf_variant: hf_qwen,
};

/// The `config.json` keys of every Qwen family: `use_sliding_window: true` is refused.
pub fn hf_qwen(c: &Value, b: &HfBase, _: &mut RopeSpec, _: &mut Variant) -> Result<(), ModelError> {
    if c.get("use_sliding_window").and_then(Value::as_bool) == Some(true) {
        return Err(spec_err(format!(
            "config.json use_sliding_window: true is not supported for {}",
            b.arch
        )));
    }
    Ok(())
}
