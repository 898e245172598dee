//! [`ModelSpec::from_hf_config`]: the spec from a Hugging Face `config.json`, the family's
//! own keys read by its descriptor's hook. Both transformers eras are read: `rope_theta`
//! with `rope_scaling` (4.x) and `rope_parameters` (5.x).

use serde::Deserialize;
use serde_json::Value;

use super::ModelError;
use super::family::{self, Family, HfBase, QkvBias, get_str, get_usize, spec_err};
use super::moe::hf_moe;
use super::spec::{Activation, Llama3Scaling, ModelSpec, RopeLayout, RopeSpec};
use super::variant::Variant;

impl ModelSpec {
    /// Reads the spec from a Hugging Face `config.json` text.
    pub fn from_hf_config(text: &str) -> Result<Self, ModelError> {
        let mut raw: Value = serde_json::from_str(text)
            .map_err(|e| ModelError::Spec(format!("config.json: {e}")))?;
        let mut arch = match raw.get("model_type").and_then(|t| t.as_str()) {
            Some(t) => t.to_string(),
            None => "llama".to_string(),
        };
        // Gemma 3's multimodal checkpoints nest the language model's config.
        if let Some(fam) = family::by_hf_wrapper(&arch)
            && let Some(text_cfg) = raw.get("text_config").filter(|t| t.is_object())
        {
            raw = text_cfg.clone();
            arch = fam.hf_types[0].into();
        }
        let c: HfConfig = serde_json::from_value(raw.clone())
            .map_err(|e| ModelError::Spec(format!("config.json: {e}")))?;
        let fam = family::by_hf_type(&arch)
            .ok_or_else(|| ModelError::Spec(format!("unsupported model_type '{arch}'")))?;
        let n_kv_heads = c.num_key_value_heads.unwrap_or(c.num_attention_heads);
        let head_dim = c
            .head_dim
            .unwrap_or(c.hidden_size / c.num_attention_heads.max(1));
        // transformers >= 5 writes `rope_parameters` (the scaling and the base together)
        // instead of `rope_scaling` and `rope_theta`.
        let rope_params = c.rope_parameters.as_ref().or(c.rope_scaling.as_ref());
        let theta = rope_params
            .and_then(|r| r.rope_theta)
            .or(c.rope_theta)
            .unwrap_or(10000.0);
        // Families with scalings of their own (Gemma 3, Phi-3) read them in their hooks.
        let llama3 = match fam.hf_own_rope_scaling {
            true => None,
            false => llama3_scaling(rope_params)?,
        };
        if c.mlp_bias == Some(true) {
            return Err(ModelError::Spec("mlp_bias is not supported".into()));
        }
        let max_position = c.max_position_embeddings.unwrap_or(2048);
        let mut rope = RopeSpec {
            theta,
            dim: head_dim,
            layout: RopeLayout::Half,
            llama3,
            freq_factors: None,
            attn_factor: 1.0,
        };
        let base = HfBase {
            arch: &arch,
            n_layers: c.num_hidden_layers,
            hidden: c.hidden_size,
            head_dim,
            max_position,
            window: get_usize(&raw, "sliding_window")?,
            act: get_str(&raw, "hidden_activation").or_else(|| get_str(&raw, "hidden_act")),
        };
        let variant = hf_variant(&raw, fam, &base, &mut rope)?;
        let family_bias = match fam.qkv_bias {
            QkvBias::AttentionBias => false,
            QkvBias::Always => true,
            QkvBias::QkvKey => c.qkv_bias.unwrap_or(true),
        };
        let spec = ModelSpec {
            qkv_bias: family_bias || c.attention_bias.unwrap_or(false),
            // llama.cpp's names: `gemma3` for `gemma3_text`, `qwen3moe` for `qwen3_moe`.
            arch: fam.arch.to_string(),
            hidden: c.hidden_size,
            intermediate: c.intermediate_size,
            n_layers: c.num_hidden_layers,
            n_heads: c.num_attention_heads,
            n_kv_heads,
            head_dim,
            vocab_size: c.vocab_size,
            max_position,
            rms_eps: c.rms_norm_eps.unwrap_or(1e-6),
            rope,
            tied_embeddings: c.tie_word_embeddings.unwrap_or(fam.hf_tied_default),
            variant,
        };
        spec.validate_as(|f| format!("config.json {}", f.hf_key()))?;
        Ok(spec)
    }
}

/// Llama 3's rope scaling from `rope_scaling` / `rope_parameters` (`None`: none or the
/// default); any other kind is refused by name.
fn llama3_scaling(params: Option<&HfRopeScaling>) -> Result<Option<Llama3Scaling>, ModelError> {
    let Some(s) = params else { return Ok(None) };
    match s.rope_type.as_deref().or(s.kind.as_deref()) {
        None | Some("default") => Ok(None),
        Some("llama3") => Ok(Some(Llama3Scaling {
            factor: s.factor.unwrap_or(8.0),
            low_freq_factor: s.low_freq_factor.unwrap_or(1.0),
            high_freq_factor: s.high_freq_factor.unwrap_or(4.0),
            original_max_position: s.original_max_position_embeddings.unwrap_or(8192.0),
        })),
        Some(kind) => Err(ModelError::Spec(format!(
            "unsupported rope_scaling type '{kind}'"
        ))),
    }
}

/// The family part of a `config.json` (`c`, the text model's config), adjusting `rope`.
fn hf_variant(
    c: &Value,
    fam: &Family,
    b: &HfBase,
    rope: &mut RopeSpec,
) -> Result<Variant, ModelError> {
    let flags = &fam.flags;
    let mut v = Variant {
        act: flags.act,
        qk_norm: flags.qk_norm,
        post_norms: flags.post_norms,
        embed_scale: flags.embed_scale.then(|| (b.hidden as f32).sqrt()),
        norm_offset: flags.hf_norm_offset,
        fused_tensors: flags.fused_tensors,
        ..Variant::default()
    };
    (fam.hf_variant)(c, b, rope, &mut v)?;
    v.moe = hf_moe(c, b.arch, fam)?;
    if flags.act == Activation::Silu
        && let Some(a) = b.act.filter(|a| *a != "silu")
    {
        return Err(spec_err(format!(
            "config.json hidden_act: '{a}' is not supported (only silu)"
        )));
    }
    Ok(v)
}

#[derive(Deserialize)]
struct HfRopeScaling {
    rope_type: Option<String>,
    #[serde(rename = "type")]
    kind: Option<String>,
    factor: Option<f32>,
    low_freq_factor: Option<f32>,
    high_freq_factor: Option<f32>,
    original_max_position_embeddings: Option<f32>,
    /// Only in transformers >= 5 `rope_parameters`.
    rope_theta: Option<f32>,
}

#[derive(Deserialize)]
struct HfConfig {
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    vocab_size: usize,
    max_position_embeddings: Option<usize>,
    rms_norm_eps: Option<f32>,
    rope_theta: Option<f32>,
    rope_scaling: Option<HfRopeScaling>,
    rope_parameters: Option<HfRopeScaling>,
    tie_word_embeddings: Option<bool>,
    attention_bias: Option<bool>,
    /// Qwen2-MoE only.
    qkv_bias: Option<bool>,
    mlp_bias: Option<bool>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transformers5_rope_parameters_carry_theta_and_scaling() {
        let base = r#""hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
            "num_attention_heads": 4, "vocab_size": 100, "model_type": "llama""#;
        let plain = format!(
            r#"{{{base}, "rope_parameters": {{"rope_theta": 500000.0, "rope_type": "default"}}}}"#
        );
        let s = ModelSpec::from_hf_config(&plain).unwrap();
        assert_eq!((s.rope.theta, s.rope.llama3), (500000.0, None));
        let scaled = format!(
            r#"{{{base}, "rope_parameters": {{"rope_theta": 500000.0, "rope_type": "llama3",
                "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}}}}"#
        );
        let s = ModelSpec::from_hf_config(&scaled).unwrap();
        assert_eq!(s.rope.theta, 500000.0);
        assert_eq!(s.rope.llama3.map(|l| l.factor), Some(32.0));
        let v4 = format!(r#"{{{base}, "rope_theta": 1000000.0}}"#);
        assert_eq!(ModelSpec::from_hf_config(&v4).unwrap().rope.theta, 1e6);
    }
}
