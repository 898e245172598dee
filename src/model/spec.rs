//! The model spec: every shape and constant the forward pass needs, from GGUF metadata or `config.json`.

use super::ModelError;
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
        self.check_values()
    }

    /// The bounds on the rope, the epsilon and the family's values (after the shapes).
    fn check_values(&self) -> Result<(), (SpecField, String)> {
        use SpecField as F;
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
}
