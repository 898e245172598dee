//! Gemma 3: Gemma 2's block with q/k norms and no soft caps in practice; five of every six
//! layers slide, with a rope of their own; the global layers' rope may be linearly scaled.
//! Its multimodal checkpoints nest the text model's config under `text_config`.

use serde_json::Value;

use super::super::ModelError;
use super::super::gguf::GgufFile;
use super::super::variant::Variant;
use super::desc::{Experts, Family, Flags, GgufBase, HfBase, QkvBias, get_f32, get_str};
use super::desc::{get_usize, spec_err};
use super::gemma::{GEMMA_FLAGS, GEMMA_TENSORS, gguf_common, hf_common};
use crate::backend::{RopeLayout, RopeSpec};

pub static GEMMA3: Family = Family {
    arch: "gemma3",
    gguf: true,
    hf_types: &["gemma3_text"],
    hf_wrapper: Some("gemma3"),
    gguf_rope: RopeLayout::Half,
    gguf_rope_scalings: &["none", "linear"],
    hf_own_rope_scaling: true,
    flags: Flags {
        qk_norm: true,
        ..GEMMA_FLAGS
    },
    experts: Experts::None,
    qkv_bias: QkvBias::AttentionBias,
    hf_tied_default: true,
    hf_tensors: GEMMA_TENSORS,
    gguf_variant: gguf_gemma3,
    hf_variant: hf_gemma3,
};

/// Five of every six layers slide (`pattern` 0: all of them).
fn sliding(pattern: usize) -> impl Fn(usize) -> bool {
    move |l| pattern == 0 || (l + 1) % pattern != 0
}

fn gguf_gemma3(
    g: &GgufFile,
    b: &GgufBase,
    rope: &mut RopeSpec,
    v: &mut Variant,
) -> Result<(), ModelError> {
    let pattern = g
        .meta_u64(&b.key("attention.sliding_window_pattern"))
        .unwrap_or(6) as usize;
    gguf_common(g, b, v, 62, sliding(pattern));
    v.rope_local = Some(RopeSpec {
        theta: b.f32(g, "rope.freq_base_swa").unwrap_or(10000.0),
        llama3: None,
        freq_factors: None,
        ..rope.clone()
    });
    // Linear rope scaling (global layers only): every frequency divided by the factor.
    if g.meta_str(&b.key("rope.scaling.type")) == Some("linear") {
        let factor = g.meta_f64(&b.key("rope.scaling.factor")).unwrap_or(1.0) as f32;
        rope.freq_factors = Some(vec![factor; rope.dim / 2]);
    }
    Ok(())
}

fn hf_gemma3(
    c: &Value,
    b: &HfBase,
    rope: &mut RopeSpec,
    v: &mut Variant,
) -> Result<(), ModelError> {
    hf_common(c, b, v, || {
        let pattern = get_usize(c, "sliding_window_pattern")?.unwrap_or(6);
        Ok((0..b.n_layers).map(sliding(pattern)).collect())
    })?;
    hf_ropes(c, rope, v)
}

/// Global layers at `rope_theta` with linear `rope_scaling`, sliding layers at
/// `rope_local_base_freq` unscaled (or both from transformers 5 `rope_parameters`).
fn hf_ropes(c: &Value, rope: &mut RopeSpec, v: &mut Variant) -> Result<(), ModelError> {
    let params = c.get("rope_parameters").filter(|p| !p.is_null());
    let (global, local_theta) = match params.filter(|p| p.get("full_attention").is_some()) {
        Some(p) => (
            p.get("full_attention").cloned(),
            p.get("sliding_attention")
                .and_then(|s| get_f32(s, "rope_theta").transpose())
                .transpose()?,
        ),
        None => (
            c.get("rope_scaling").filter(|s| !s.is_null()).cloned(),
            get_f32(c, "rope_local_base_freq")?,
        ),
    };
    v.rope_local = Some(RopeSpec {
        theta: local_theta.unwrap_or(10000.0),
        llama3: None,
        freq_factors: None,
        ..rope.clone()
    });
    if let Some(g) = global {
        if let Some(t) = get_f32(&g, "rope_theta")? {
            rope.theta = t;
        }
        let kind = get_str(&g, "rope_type").or_else(|| get_str(&g, "type"));
        match kind {
            None | Some("default") => {}
            Some("linear") => {
                let factor = get_f32(&g, "factor")?.unwrap_or(1.0);
                rope.freq_factors = Some(vec![factor; rope.dim / 2]);
            }
            Some(other) => {
                return Err(spec_err(format!(
                    "config.json rope_scaling: type '{other}' is not supported for gemma3"
                )));
            }
        }
    }
    Ok(())
}
