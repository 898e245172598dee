//! What Gemma 2 and Gemma 3 share: GeGLU, post-norms, scaled embeddings, soft caps and
//! sliding-window layers (the families themselves are `gemma2.rs` and `gemma3.rs`).

use serde_json::Value;

use super::super::ModelError;
use super::super::gguf::GgufFile;
use super::super::variant::Variant;
use super::desc::{Flags, GgufBase, HfBase, HfTensors, LLAMA_TENSORS, get_f32, spec_err};
use crate::backend::Activation;

/// Gemma's additions to the Llama block.
pub const GEMMA_FLAGS: Flags = Flags {
    act: Activation::GeluTanh,
    qk_norm: false,
    post_norms: true,
    embed_scale: true,
    hf_norm_offset: 1.0,
    fused_tensors: false,
};

/// Gemma's FFN input norm is its `pre_feedforward_layernorm`.
pub const GEMMA_TENSORS: HfTensors = HfTensors {
    leaves: &[("ffn_norm.weight", "pre_feedforward_layernorm.weight")],
    ..LLAMA_TENSORS
};

/// The GGUF keys both Gemmas read; `big_layers` is the layer count of the family's 27B,
/// whose q·k llama.cpp scales by `1/sqrt(hidden / n_heads)` (their `query_pre_attn_scalar`,
/// recognised by layer count as llama.cpp does). `sliding(l)`: whether layer `l` slides.
pub fn gguf_common(
    g: &GgufFile,
    b: &GgufBase,
    v: &mut Variant,
    big_layers: usize,
    sliding: impl Fn(usize) -> bool,
) {
    v.attn_softcap = b.f32(g, "attn_logit_softcapping").filter(|c| *c > 0.0);
    v.final_softcap = b.f32(g, "final_logit_softcapping").filter(|c| *c > 0.0);
    let big = b.n_layers == big_layers;
    v.attn_scale = v
        .attn_scale
        .or_else(|| big.then(|| 1.0 / ((b.hidden / b.n_heads.max(1)) as f32).sqrt()));
    v.window = b.window;
    v.sliding = (0..b.n_layers).map(sliding).collect();
}

/// The `config.json` keys both Gemmas read; `default_sliding` gives which layers slide when
/// the file has no `layer_types`.
pub fn hf_common(
    c: &Value,
    b: &HfBase,
    v: &mut Variant,
    default_sliding: impl FnOnce() -> Result<Vec<bool>, ModelError>,
) -> Result<(), ModelError> {
    if !matches!(b.act, Some("gelu_pytorch_tanh" | "gelu_tanh")) {
        return Err(spec_err(format!(
            "config.json hidden_activation: {:?} is not supported (only gelu_pytorch_tanh)",
            b.act
        )));
    }
    v.attn_scale = get_f32(c, "query_pre_attn_scalar")?.map(|s| 1.0 / s.sqrt());
    v.attn_softcap = get_f32(c, "attn_logit_softcapping")?;
    v.final_softcap = get_f32(c, "final_logit_softcapping")?;
    v.window = b.window;
    v.sliding = match c.get("layer_types").and_then(Value::as_array) {
        Some(types) => types
            .iter()
            .map(|t| match t.as_str() {
                Some("sliding_attention") => Ok(true),
                Some("full_attention") => Ok(false),
                _ => Err(spec_err(format!("config.json layer_types: unknown {t}"))),
            })
            .collect::<Result<_, _>>()?,
        None => default_sliding()?,
    };
    Ok(())
}
