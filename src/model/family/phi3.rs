//! Phi-3 (and Phi-4-mini): q/k/v in one tensor and gate/up in one, a sliding window, and
//! `longrope` scaling (per-frequency divisors with an attention factor; Phi-4-mini ropes
//! part of each head).

use serde_json::Value;

use super::super::ModelError;
use super::super::gguf::GgufFile;
use super::super::variant::Variant;
use super::desc::{Experts, Family, Flags, GgufBase, HfBase, HfTensors, LLAMA_FLAGS};
use super::desc::{LLAMA_TENSORS, QkvBias, get_f32, get_str, get_usize, spec_err};
use crate::backend::{RopeLayout, RopeSpec};

pub static PHI3: Family = Family {
    arch: "phi3",
    gguf: true,
    hf_types: &["phi3"],
    hf_wrapper: None,
    gguf_rope: RopeLayout::Half,
    gguf_rope_scalings: &["none", "llama3"],
    hf_own_rope_scaling: true,
    flags: Flags {
        fused_tensors: true,
        ..LLAMA_FLAGS
    },
    experts: Experts::None,
    qkv_bias: QkvBias::AttentionBias,
    hf_tied_default: false,
    hf_tensors: HfTensors {
        leaves: &[("ffn_up.weight", "mlp.gate_up_proj.weight")],
        ..LLAMA_TENSORS
    },
    gguf_variant: gguf_phi3,
    hf_variant: hf_phi3,
};

fn gguf_phi3(
    g: &GgufFile,
    b: &GgufBase,
    rope: &mut RopeSpec,
    v: &mut Variant,
) -> Result<(), ModelError> {
    v.window = b.window;
    if let (Some(_), Some(_)) = (
        g.tensor("rope_factors_long.weight"),
        g.tensor("rope_factors_short.weight"),
    ) {
        let key = b.key("rope.scaling.original_context_length");
        let orig = g
            .meta_u64(&key)
            .ok_or_else(|| spec_err(format!("rope factors without {key}")))?
            as usize;
        // llama.cpp's rule: the long factors when the context exceeds the original.
        let which = if b.max_position > orig {
            "long"
        } else {
            "short"
        };
        rope.freq_factors = Some(g.tensor_f32(&format!("rope_factors_{which}.weight"))?);
        rope.attn_factor = b.f32(g, "rope.scaling.attn_factor").unwrap_or(1.0);
    }
    Ok(())
}

fn hf_phi3(c: &Value, b: &HfBase, rope: &mut RopeSpec, v: &mut Variant) -> Result<(), ModelError> {
    v.window = b.window;
    if c.get("attention_bias").and_then(Value::as_bool) == Some(true) {
        return Err(spec_err(
            "config.json attention_bias: true is not supported for phi3".into(),
        ));
    }
    if let Some(p) = get_f32(c, "partial_rotary_factor")? {
        rope.dim = (b.head_dim as f32 * p) as usize;
    }
    longrope(c, b, rope)
}

/// `longrope` (`su`): per-frequency divisors, the long set when the context exceeds
/// `original_max_position_embeddings` (llama.cpp's rule; transformers switches per step),
/// and the attention factor on cos and sin (the rotated dims of q and k; with a partial
/// rope, Phi-4-mini's, the other dims keep their values).
fn longrope(c: &Value, b: &HfBase, rope: &mut RopeSpec) -> Result<(), ModelError> {
    let Some(s) = c.get("rope_scaling").filter(|s| !s.is_null()) else {
        return Ok(());
    };
    let kind = get_str(s, "rope_type").or_else(|| get_str(s, "type"));
    if !matches!(kind, Some("longrope" | "su")) {
        return Err(spec_err(format!(
            "config.json rope_scaling: type {kind:?} is not supported for phi3 (only longrope)"
        )));
    }
    let orig = get_usize(c, "original_max_position_embeddings")?
        .or(get_usize(s, "original_max_position_embeddings")?)
        .ok_or_else(|| spec_err("config.json original_max_position_embeddings missing".into()))?;
    let which = if b.max_position > orig {
        "long_factor"
    } else {
        "short_factor"
    };
    let factors: Vec<f32> = s
        .get(which)
        .and_then(Value::as_array)
        .ok_or_else(|| spec_err(format!("config.json rope_scaling.{which} missing")))?
        .iter()
        .map(|x| x.as_f64().map(|x| x as f32))
        .collect::<Option<_>>()
        .ok_or_else(|| spec_err(format!("config.json rope_scaling.{which}: not numbers")))?;
    rope.freq_factors = Some(factors);
    let scale = b.max_position as f64 / orig as f64;
    let af = match get_f32(s, "attention_factor")? {
        Some(a) => a as f64,
        None if scale > 1.0 => (1.0 + scale.ln() / (orig as f64).ln()).sqrt(),
        None => 1.0,
    };
    rope.attn_factor = af as f32;
    Ok(())
}
