//! Gemma 2: GeGLU, post-norms, scaled embeddings, soft-capped attention and output
//! logits, every even layer sliding.

use serde_json::Value;

use super::super::ModelError;
use super::super::gguf::GgufFile;
use super::super::variant::Variant;
use super::desc::{Experts, Family, GgufBase, HfBase, QkvBias};
use super::gemma::{GEMMA_FLAGS, GEMMA_TENSORS, gguf_common, hf_common};
use crate::backend::{RopeLayout, RopeSpec};

pub static GEMMA2: Family = Family {
    arch: "gemma2",
    gguf: true,
    hf_types: &["gemma2"],
    hf_wrapper: None,
    gguf_rope: RopeLayout::Half,
    gguf_rope_scalings: &["none", "llama3"],
    hf_own_rope_scaling: false,
    flags: GEMMA_FLAGS,
    experts: Experts::None,
    qkv_bias: QkvBias::AttentionBias,
    hf_tied_default: true,
    hf_tensors: GEMMA_TENSORS,
    gguf_variant: gguf_gemma2,
    hf_variant: hf_gemma2,
};

fn gguf_gemma2(
    g: &GgufFile,
    b: &GgufBase,
    _: &mut RopeSpec,
    v: &mut Variant,
) -> Result<(), ModelError> {
    gguf_common(g, b, v, 46, |l| l % 2 == 0);
    Ok(())
}

fn hf_gemma2(c: &Value, b: &HfBase, _: &mut RopeSpec, v: &mut Variant) -> Result<(), ModelError> {
    hf_common(c, b, v, || {
        Ok((0..b.n_layers).map(|l| l % 2 == 0).collect())
    })
}
