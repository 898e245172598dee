//! The model spec: every shape and constant the forward pass needs, from GGUF metadata or `config.json`.

use serde::Deserialize;

use super::ModelError;
use super::gguf::GgufFile;
use super::variant::{self, Dims, HfBase};
pub use super::variant::{Activation, Variant};
use crate::backend::AttnShape;
pub use crate::backend::{Llama3Scaling, RopeLayout, RopeSpec};

/// Shapes and constants of a Llama-family decoder.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelSpec {
    /// Architecture name as the file gives it (`llama`, `mistral`, `qwen2`, ...).
    pub arch: String,
    pub hidden: usize,
    pub intermediate: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    pub max_position: usize,
    pub rms_eps: f32,
    pub rope: RopeSpec,
    /// Output projection shares the token embedding.
    pub tied_embeddings: bool,
    /// q/k/v projections carry biases (Qwen2).
    pub qkv_bias: bool,
    /// What the family adds to the Llama block (default: nothing).
    pub variant: Variant,
}

/// Upper bounds on what a model file may declare. Every size derived from metadata is
/// checked against them before anything is allocated, so products of a few of them (weight
/// element counts, KV widths) cannot overflow or ask for absurd allocations.
pub mod limits {
    /// Decoder layers.
    pub const LAYERS: usize = 1024;
    /// Residual stream width.
    pub const HIDDEN: usize = 1 << 20;
    /// FFN width.
    pub const INTERMEDIATE: usize = 1 << 22;
    /// Vocabulary size.
    pub const VOCAB: usize = 1 << 24;
    /// Query heads.
    pub const HEADS: usize = 1024;
    /// Width of one head.
    pub const HEAD_DIM: usize = 1024;
    /// Query heads per KV head (the CPU attention's per-group scratch).
    pub const GQA_GROUP: usize = 64;
    /// Context length in tokens.
    pub const CONTEXT: usize = 1 << 24;
}

/// A field of [`ModelSpec`], for naming it in an error by the key its file uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecField {
    Hidden,
    Intermediate,
    Layers,
    Heads,
    KvHeads,
    HeadDim,
    Vocab,
    Context,
    RopeDim,
    RopeTheta,
    RopeScaling,
    RopeFreqs,
    RmsEps,
    /// A family-specific value (the message names it).
    Variant,
}

impl SpecField {
    /// The field's name in [`ModelSpec`].
    pub fn rust_name(self) -> String {
        use SpecField as F;
        match self {
            F::Hidden => "hidden",
            F::Intermediate => "intermediate",
            F::Layers => "n_layers",
            F::Heads => "n_heads",
            F::KvHeads => "n_kv_heads",
            F::HeadDim => "head_dim",
            F::Vocab => "vocab_size",
            F::Context => "max_position",
            F::RopeDim => "rope.dim",
            F::RopeTheta => "rope.theta",
            F::RopeScaling => "rope.llama3",
            F::RopeFreqs => "rope.freq_factors",
            F::RmsEps => "rms_eps",
            F::Variant => "variant",
        }
        .to_string()
    }

    /// The GGUF metadata key (or tensor) that sets the field, for architecture `arch`.
    pub fn gguf_key(self, arch: &str) -> String {
        use SpecField as F;
        let leaf = match self {
            F::Hidden => "embedding_length",
            F::Intermediate => "feed_forward_length",
            F::Layers => "block_count",
            F::Heads => "attention.head_count",
            F::KvHeads => "attention.head_count_kv",
            F::HeadDim => "attention.key_length",
            F::Vocab => "vocab_size",
            F::Context => "context_length",
            F::RopeDim => "rope.dimension_count",
            F::RopeTheta => "rope.freq_base",
            F::RopeScaling => "rope.scaling",
            F::RopeFreqs => return "tensor rope_freqs.weight".to_string(),
            F::RmsEps => "attention.layer_norm_rms_epsilon",
            F::Variant => "*",
        };
        format!("{arch}.{leaf}")
    }

    /// The `config.json` key that sets the field.
    pub fn hf_key(self) -> String {
        use SpecField as F;
        match self {
            F::Hidden => "hidden_size",
            F::Intermediate => "intermediate_size",
            F::Layers => "num_hidden_layers",
            F::Heads => "num_attention_heads",
            F::KvHeads => "num_key_value_heads",
            F::HeadDim | F::RopeDim => "head_dim",
            F::Vocab => "vocab_size",
            F::Context => "max_position_embeddings",
            F::RopeTheta => "rope_theta",
            F::RopeScaling | F::RopeFreqs => "rope_scaling",
            F::RmsEps => "rms_norm_eps",
            F::Variant => "*",
        }
        .to_string()
    }
}

impl ModelSpec {
    /// Width of the query projection (`n_heads * head_dim`).
    pub fn q_dim(&self) -> usize {
        self.attn_shape().q_dim()
    }
    /// Width of the key (= value) projection (`n_kv_heads * head_dim`).
    pub fn kv_dim(&self) -> usize {
        self.attn_shape().kv_dim()
    }
    /// Width of the fused qkv projection.
    pub fn qkv_dim(&self) -> usize {
        self.attn_shape().qkv_dim()
    }
    /// The head geometry and attention options of layer `l` (its window, scale, cap).
    pub fn layer_shape(&self, l: usize) -> AttnShape {
        self.attn_shape_of(self.variant.is_sliding(l))
    }

    /// The rope of layer `l` (Gemma 3's sliding layers have their own).
    pub fn layer_rope(&self, l: usize) -> &RopeSpec {
        match &self.variant.rope_local {
            Some(r) if self.variant.is_sliding(l) => r,
            _ => &self.rope,
        }
    }

    fn attn_shape_of(&self, sliding: bool) -> AttnShape {
        let v = &self.variant;
        AttnShape {
            window: if sliding { v.window } else { None },
            softcap: v.attn_softcap,
            scale: v.attn_scale,
            ..self.attn_shape()
        }
    }

    /// The head geometry the backend's attention ops take.
    pub fn attn_shape(&self) -> AttnShape {
        AttnShape::new(self.n_heads, self.n_kv_heads, self.head_dim)
    }

    /// Checks the shapes are internally consistent and within [`limits`]; errors name the
    /// field as Rust spells it (`n_layers`, ...).
    pub fn validate(&self) -> Result<(), ModelError> {
        self.validate_as(SpecField::rust_name)
    }

    /// [`ModelSpec::validate`] with errors naming each field by `name` (a file's key).
    pub fn validate_as(&self, name: impl Fn(SpecField) -> String) -> Result<(), ModelError> {
        self.check()
            .map_err(|(field, why)| ModelError::Spec(format!("{}: {why}", name(field))))
    }

    /// Every bound, in the order a reader would check them; the first failure wins.
    fn check(&self) -> Result<(), (SpecField, String)> {
        use SpecField as F;
        let range = |field: F, v: usize, lo: usize, hi: usize| {
            if (lo..=hi).contains(&v) {
                Ok(())
            } else {
                Err((
                    field,
                    format!("{v} is outside the supported range {lo}..={hi}"),
                ))
            }
        };
        range(F::Layers, self.n_layers, 1, limits::LAYERS)?;
        range(F::Hidden, self.hidden, 1, limits::HIDDEN)?;
        range(F::Intermediate, self.intermediate, 1, limits::INTERMEDIATE)?;
        range(F::Vocab, self.vocab_size, 1, limits::VOCAB)?;
        range(F::Heads, self.n_heads, 1, limits::HEADS)?;
        range(F::KvHeads, self.n_kv_heads, 1, self.n_heads)?;
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return Err((
                F::KvHeads,
                format!(
                    "n_heads {} is not a multiple of n_kv_heads {}",
                    self.n_heads, self.n_kv_heads
                ),
            ));
        }
        let group = self.n_heads / self.n_kv_heads;
        if group > limits::GQA_GROUP {
            return Err((
                F::KvHeads,
                format!(
                    "{} query heads per KV head exceeds the supported {}",
                    group,
                    limits::GQA_GROUP
                ),
            ));
        }
        range(F::HeadDim, self.head_dim, 2, limits::HEAD_DIM)?;
        if !self.head_dim.is_multiple_of(2) {
            return Err((F::HeadDim, format!("{} is odd", self.head_dim)));
        }
        range(F::Context, self.max_position, 2, limits::CONTEXT)?;
        let rope_dim = self.rope.dim;
        if rope_dim == 0 || rope_dim > self.head_dim || !rope_dim.is_multiple_of(2) {
            return Err((
                F::RopeDim,
                format!(
                    "rope dim {rope_dim} invalid for head_dim {} (must be even, 2..=head_dim)",
                    self.head_dim
                ),
            ));
        }
        if !(self.rms_eps.is_finite() && self.rms_eps > 0.0) {
            return Err((
                F::RmsEps,
                format!("{} must be a finite number > 0", self.rms_eps),
            ));
        }
        if !(self.rope.theta.is_finite() && self.rope.theta > 0.0) {
            return Err((
                F::RopeTheta,
                format!("{} must be a finite number > 0", self.rope.theta),
            ));
        }
        if let Some(s) = self.rope.llama3 {
            let positive = [
                s.factor,
                s.low_freq_factor,
                s.high_freq_factor,
                s.original_max_position,
            ]
            .iter()
            .all(|v| v.is_finite() && *v > 0.0);
            if !positive || s.low_freq_factor == s.high_freq_factor {
                return Err((
                    F::RopeScaling,
                    format!("{s:?}: factors must be finite and > 0, low and high factors distinct"),
                ));
            }
        }
        if let Some(local) = &self.variant.rope_local
            && !(local.theta.is_finite() && local.theta > 0.0 && local.dim == rope_dim)
        {
            return Err((
                F::RopeTheta,
                format!("local rope {local:?}: theta must be finite and > 0"),
            ));
        }
        self.variant
            .check(self.n_layers)
            .map_err(|why| (F::Variant, why))?;
        if let Some(f) = &self.rope.freq_factors
            && (f.len() != rope_dim / 2 || f.iter().any(|v| !(v.is_finite() && *v > 0.0)))
        {
            return Err((
                F::RopeFreqs,
                format!(
                    "{} factors (need {}, each finite and > 0)",
                    f.len(),
                    rope_dim / 2
                ),
            ));
        }
        Ok(())
    }

    /// Reads the spec from GGUF metadata (`<arch>.*` keys).
    pub fn from_gguf(g: &GgufFile) -> Result<Self, ModelError> {
        let arch = g
            .meta_str("general.architecture")
            .ok_or_else(|| ModelError::Spec("missing general.architecture".into()))?
            .to_string();
        let layout = variant::gguf_layout(&arch)
            .ok_or_else(|| ModelError::Spec(format!("unsupported architecture '{arch}'")))?;
        let key = |k: &str| format!("{arch}.{k}");
        let req = |k: &str| {
            g.meta_u64(&key(k))
                .map(|v| v as usize)
                .ok_or_else(|| ModelError::Spec(format!("missing metadata key '{}'", key(k))))
        };
        let hidden = req("embedding_length")?;
        let n_heads = req("attention.head_count")?;
        let n_kv_heads = g
            .meta_u64(&key("attention.head_count_kv"))
            .map(|v| v as usize)
            .unwrap_or(n_heads);
        let head_dim = g
            .meta_u64(&key("attention.key_length"))
            .map(|v| v as usize)
            .unwrap_or(hidden / n_heads.max(1));
        let rope_dim = g
            .meta_u64(&key("rope.dimension_count"))
            .map(|v| v as usize)
            .unwrap_or(head_dim);
        let vocab_size = match g.meta_u64(&key("vocab_size")) {
            Some(v) => v as usize,
            None => g
                .meta_str_array("tokenizer.ggml.tokens")
                .map(|t| t.len())
                .or_else(|| {
                    g.tensor("token_embd.weight")
                        .and_then(|t| t.dims.get(1))
                        .map(|&d| d as usize)
                })
                .ok_or_else(|| ModelError::Spec("cannot determine vocab size".into()))?,
        };
        let llama3 = match g.meta_str(&key("rope.scaling.type")) {
            Some("llama3") => Some(Llama3Scaling {
                factor: g.meta_f64(&key("rope.scaling.factor")).unwrap_or(8.0) as f32,
                low_freq_factor: g
                    .meta_f64(&key("rope.scaling.low_freq_factor"))
                    .unwrap_or(1.0) as f32,
                high_freq_factor: g
                    .meta_f64(&key("rope.scaling.high_freq_factor"))
                    .unwrap_or(4.0) as f32,
                original_max_position: g
                    .meta_f64(&key("rope.scaling.original_context_length"))
                    .unwrap_or(8192.0) as f32,
            }),
            _ => None,
        };
        let n_layers = req("block_count")?;
        let max_position = g
            .meta_u64(&key("context_length"))
            .map(|v| v as usize)
            .unwrap_or(2048);
        let mut spec = ModelSpec {
            hidden,
            intermediate: req("feed_forward_length")?,
            n_layers,
            n_heads,
            n_kv_heads,
            head_dim,
            vocab_size,
            max_position,
            rms_eps: g
                .meta_f64(&key("attention.layer_norm_rms_epsilon"))
                .unwrap_or(1e-5) as f32,
            rope: RopeSpec {
                theta: g.meta_f64(&key("rope.freq_base")).unwrap_or(10000.0) as f32,
                dim: rope_dim,
                layout,
                llama3,
                freq_factors: match g.tensor("rope_freqs.weight") {
                    Some(_) => Some(g.tensor_f32("rope_freqs.weight")?),
                    None => None,
                },
                attn_factor: 1.0,
            },
            tied_embeddings: g.tensor("output.weight").is_none(),
            qkv_bias: g.tensor("blk.0.attn_q.bias").is_some(),
            arch,
            variant: Variant::default(),
        };
        let dims = Dims {
            ff: spec.intermediate,
            n_layers,
            hidden,
            n_heads,
            head_dim,
            max_position,
        };
        spec.variant = variant::gguf_variant(g, &spec.arch, &dims, &mut spec.rope)?;
        spec.validate_as(|f| f.gguf_key(&spec.arch))?;
        Ok(spec)
    }

    /// Reads the spec from a Hugging Face `config.json` text.
    pub fn from_hf_config(text: &str) -> Result<Self, ModelError> {
        let mut raw: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| ModelError::Spec(format!("config.json: {e}")))?;
        let mut arch = match raw.get("model_type").and_then(|t| t.as_str()) {
            Some(t) => t.to_string(),
            None => "llama".to_string(),
        };
        // Gemma 3's multimodal checkpoints nest the language model's config.
        if arch == "gemma3"
            && let Some(text_cfg) = raw.get("text_config").filter(|t| t.is_object())
        {
            raw = text_cfg.clone();
            arch = "gemma3_text".into();
        }
        let c: HfConfig = serde_json::from_value(raw.clone())
            .map_err(|e| ModelError::Spec(format!("config.json: {e}")))?;
        if !matches!(
            arch.as_str(),
            "llama"
                | "mistral"
                | "mixtral"
                | "qwen2"
                | "qwen2_moe"
                | "qwen3"
                | "qwen3_moe"
                | "gemma2"
                | "gemma3_text"
                | "phi3"
        ) {
            return Err(ModelError::Spec(format!("unsupported model_type '{arch}'")));
        }
        let gemma = matches!(arch.as_str(), "gemma2" | "gemma3_text");
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
        // Gemma 3's and Phi-3's own scalings are read by `variant::hf_variant`.
        let own_scaling = matches!(arch.as_str(), "gemma3_text" | "phi3");
        let llama3 = match rope_params {
            _ if own_scaling => None,
            Some(s) if s.rope_type.as_deref().or(s.kind.as_deref()) == Some("llama3") => {
                Some(Llama3Scaling {
                    factor: s.factor.unwrap_or(8.0),
                    low_freq_factor: s.low_freq_factor.unwrap_or(1.0),
                    high_freq_factor: s.high_freq_factor.unwrap_or(4.0),
                    original_max_position: s.original_max_position_embeddings.unwrap_or(8192.0),
                })
            }
            Some(s)
                if !matches!(
                    s.rope_type.as_deref().or(s.kind.as_deref()),
                    None | Some("default")
                ) =>
            {
                let kind = s
                    .rope_type
                    .as_deref()
                    .or(s.kind.as_deref())
                    .unwrap_or_default();
                return Err(ModelError::Spec(format!(
                    "unsupported rope_scaling type '{kind}'"
                )));
            }
            _ => None,
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
        };
        let variant = variant::hf_variant(&raw, &base, &mut rope)?;
        let spec = ModelSpec {
            // Qwen2-MoE's `qkv_bias` (default true) is Qwen2's fixed q/k/v biases.
            qkv_bias: arch == "qwen2"
                || (arch == "qwen2_moe" && c.qkv_bias.unwrap_or(true))
                || c.attention_bias.unwrap_or(false),
            // llama.cpp's names: `gemma3` for `gemma3_text`, `qwen3moe` for `qwen3_moe`.
            arch: arch
                .strip_suffix("_text")
                .unwrap_or(&arch)
                .replace("_moe", "moe"),
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
            tied_embeddings: c.tie_word_embeddings.unwrap_or(gemma),
            variant,
        };
        spec.validate_as(|f| format!("config.json {}", f.hf_key()))?;
        Ok(spec)
    }
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
