//! What each model family adds to the Llama block (Qwen3's q/k norms, Gemma's GeGLU, extra
//! norms, soft-capping and sliding-window layers, Phi-3's fused tensors and longrope), read
//! from GGUF metadata (llama.cpp's keys) or a Hugging Face `config.json`. Values Kiln does
//! not implement are refused by name, never ignored.

use serde_json::Value;

use super::ModelError;
use super::gguf::GgufFile;
/// The FFN's gate activation (the backend's GLU op takes it as it is).
pub use crate::backend::Activation;
use crate::backend::{MoeShape, RopeLayout, RopeSpec};

/// The differences of a family from the plain Llama block. `Default` is plain Llama.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Variant {
    pub act: Activation,
    /// Per-head RMSNorm of q and k before rope (Qwen3, Gemma 3).
    pub qk_norm: bool,
    /// RMSNorm of the attention and FFN outputs before each residual add (Gemma 2 / 3).
    pub post_norms: bool,
    /// The embeddings are multiplied by this (Gemma: `sqrt(hidden)`); a tied output head
    /// reads the unscaled table.
    pub embed_scale: Option<f32>,
    /// Added to every RMSNorm weight at load (Hugging Face Gemma stores `w` for `(1 + w)`;
    /// llama.cpp's converter already added it).
    pub norm_offset: f32,
    /// The q·k factor (`None`: `1/sqrt(head_dim)`).
    pub attn_scale: Option<f32>,
    /// Attention logits become `cap * tanh(s / cap)` (Gemma 2).
    pub attn_softcap: Option<f32>,
    /// Output logits become `cap * tanh(l / cap)` (Gemma 2).
    pub final_softcap: Option<f32>,
    /// Sliding-window width in tokens, the query's own included.
    pub window: Option<usize>,
    /// Per layer, whether it slides (empty: every layer does when `window` is set).
    pub sliding: Vec<bool>,
    /// The rope of the sliding layers when it differs from the global one (Gemma 3).
    pub rope_local: Option<RopeSpec>,
    /// q/k/v in one tensor (`attn_qkv`) and gate/up in one (`ffn_up`), as Phi-3 stores them.
    pub fused_tensors: bool,
    /// Every layer's FFN is a mixture of experts of this shape (Qwen3-MoE, Mixtral).
    pub moe: Option<MoeShape>,
    /// How an embedding pools the hidden states, as the files state it (`None`: not
    /// stated; embeddings then take the last token's).
    pub pooling: Option<super::Pooling>,
}

impl Variant {
    /// Whether layer `l` attends within the sliding window.
    pub fn is_sliding(&self, l: usize) -> bool {
        self.window.is_some()
            && self
                .sliding
                .get(l)
                .copied()
                .unwrap_or(self.sliding.is_empty())
    }

    /// The window every one of `n_layers` layers attends within, if they all slide: a key
    /// older than it is never read again, so its KV block can be freed (`None` when any
    /// layer attends to the whole context).
    pub fn kv_window(&self, n_layers: usize) -> Option<usize> {
        self.window
            .filter(|_| (0..n_layers).all(|l| self.is_sliding(l)))
    }

    /// Checks the values against `n_layers`; the error names the field.
    pub fn check(&self, n_layers: usize) -> Result<(), String> {
        let positive = |name: &str, v: Option<f32>| match v {
            Some(x) if !(x.is_finite() && x > 0.0) => {
                Err(format!("{name}: {x} must be a finite number > 0"))
            }
            _ => Ok(()),
        };
        positive("attention scale", self.attn_scale)?;
        positive("attn_logit_softcapping", self.attn_softcap)?;
        positive("final_logit_softcapping", self.final_softcap)?;
        positive("embedding scale", self.embed_scale)?;
        if self.window == Some(0) {
            return Err("sliding_window: 0 tokens".into());
        }
        if let Some(m) = &self.moe {
            m.check()?;
        }
        if !self.sliding.is_empty() && self.sliding.len() != n_layers {
            return Err(format!(
                "layer_types: {} entries for {n_layers} layers",
                self.sliding.len()
            ));
        }
        Ok(())
    }
}

/// The rope layout of a GGUF architecture Kiln runs (`None`: not supported).
pub fn gguf_layout(arch: &str) -> Option<RopeLayout> {
    match arch {
        "llama" | "mistral" => Some(RopeLayout::Interleaved),
        "qwen2" | "qwen2moe" | "qwen3" | "qwen3moe" | "gemma2" | "gemma3" | "phi3" => {
            Some(RopeLayout::Half)
        }
        _ => None,
    }
}

/// Gemma 2 / 3 27B: llama.cpp scales q·k by `1/sqrt(hidden / n_heads)` (their
/// `query_pre_attn_scalar`), recognised by layer count as llama.cpp does.
fn gemma_27b_scale(arch: &str, n_layers: usize, hidden: usize, n_heads: usize) -> Option<f32> {
    let big = matches!((arch, n_layers), ("gemma2", 46) | ("gemma3", 62));
    big.then(|| 1.0 / ((hidden / n_heads.max(1)) as f32).sqrt())
}

/// The shapes [`gguf_variant`] needs besides the file.
pub struct Dims {
    pub n_layers: usize,
    pub hidden: usize,
    pub n_heads: usize,
    pub head_dim: usize,
    pub max_position: usize,
    /// `feed_forward_length` (Mixtral's expert width).
    pub ff: usize,
}

/// The family part of a GGUF file's spec; `rope` is the global rope, which Gemma 3's
/// linear scaling and Phi-3's longrope factors adjust.
pub fn gguf_variant(
    g: &GgufFile,
    arch: &str,
    d: &Dims,
    rope: &mut RopeSpec,
) -> Result<Variant, ModelError> {
    let key = |k: &str| format!("{arch}.{k}");
    let f = |k: &str| g.meta_f64(&key(k)).map(|v| v as f32);
    let mut v = Variant {
        attn_scale: f("attention.scale"),
        ..Variant::default()
    };
    let window = g
        .meta_u64(&key("attention.sliding_window"))
        .filter(|&w| w > 0)
        .map(|w| w as usize);
    v.moe = super::moe::gguf_moe(g, arch, d.ff)?;
    v.pooling = super::pooling::from_gguf(g, arch)?;
    match arch {
        "qwen3" | "qwen3moe" => v.qk_norm = true,
        "gemma2" | "gemma3" => {
            v.act = Activation::GeluTanh;
            v.post_norms = true;
            v.qk_norm = arch == "gemma3";
            v.embed_scale = Some((d.hidden as f32).sqrt());
            v.attn_softcap = f("attn_logit_softcapping").filter(|c| *c > 0.0);
            v.final_softcap = f("final_logit_softcapping").filter(|c| *c > 0.0);
            v.attn_scale = v
                .attn_scale
                .or_else(|| gemma_27b_scale(arch, d.n_layers, d.hidden, d.n_heads));
            v.window = window;
            let pattern = match arch {
                "gemma2" => 2,
                _ => g
                    .meta_u64(&key("attention.sliding_window_pattern"))
                    .unwrap_or(6) as usize,
            };
            // Gemma 2: even layers slide; Gemma 3: five of every six.
            v.sliding = (0..d.n_layers)
                .map(|l| match arch {
                    "gemma2" => l % 2 == 0,
                    _ => pattern == 0 || (l + 1) % pattern != 0,
                })
                .collect();
            if arch == "gemma3" {
                v.rope_local = Some(RopeSpec {
                    theta: f("rope.freq_base_swa").unwrap_or(10000.0),
                    llama3: None,
                    freq_factors: None,
                    ..rope.clone()
                });
                linear_scaling(g, arch, rope)?;
            }
        }
        "phi3" => {
            v.fused_tensors = true;
            v.window = window;
            if let (Some(_), Some(_)) = (
                g.tensor("rope_factors_long.weight"),
                g.tensor("rope_factors_short.weight"),
            ) {
                let orig = g
                    .meta_u64(&key("rope.scaling.original_context_length"))
                    .ok_or_else(|| {
                        ModelError::Spec(format!(
                            "rope factors without {}",
                            key("rope.scaling.original_context_length")
                        ))
                    })? as usize;
                // llama.cpp's rule: the long factors when the context exceeds the original.
                let which = if d.max_position > orig {
                    "long"
                } else {
                    "short"
                };
                rope.freq_factors = Some(g.tensor_f32(&format!("rope_factors_{which}.weight"))?);
                rope.attn_factor = f("rope.scaling.attn_factor").unwrap_or(1.0);
            }
        }
        _ => {}
    }
    if arch != "gemma3" {
        match g.meta_str(&key("rope.scaling.type")) {
            None | Some("none" | "llama3") => {}
            Some(other) => {
                return Err(ModelError::Spec(format!(
                    "{}: '{other}' is not supported for {arch}",
                    key("rope.scaling.type")
                )));
            }
        }
    }
    Ok(v)
}

/// Gemma 3's linear rope scaling (global layers only): every frequency divided by the factor.
fn linear_scaling(g: &GgufFile, arch: &str, rope: &mut RopeSpec) -> Result<(), ModelError> {
    let key = |k: &str| format!("{arch}.{k}");
    match g.meta_str(&key("rope.scaling.type")) {
        None | Some("none") => Ok(()),
        Some("linear") => {
            let factor = g.meta_f64(&key("rope.scaling.factor")).unwrap_or(1.0) as f32;
            rope.freq_factors = Some(vec![factor; rope.dim / 2]);
            Ok(())
        }
        Some(other) => Err(ModelError::Spec(format!(
            "{}: '{other}' is not supported for {arch}",
            key("rope.scaling.type")
        ))),
    }
}

fn spec_err(m: String) -> ModelError {
    ModelError::Spec(m)
}

fn get_f32(c: &Value, k: &str) -> Result<Option<f32>, ModelError> {
    match c.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_f64()
            .map(|x| Some(x as f32))
            .ok_or_else(|| spec_err(format!("config.json {k}: expected a number, got {v}"))),
    }
}

fn get_usize(c: &Value, k: &str) -> Result<Option<usize>, ModelError> {
    match c.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_u64().map(|x| Some(x as usize)).ok_or_else(|| {
            spec_err(format!(
                "config.json {k}: expected a non-negative integer, got {v}"
            ))
        }),
    }
}

fn get_str<'a>(c: &'a Value, k: &str) -> Option<&'a str> {
    c.get(k).and_then(Value::as_str)
}

/// The shapes and global rope [`hf_variant`] starts from.
pub struct HfBase<'a> {
    pub arch: &'a str,
    pub n_layers: usize,
    pub hidden: usize,
    pub head_dim: usize,
    pub max_position: usize,
}

/// The family part of a `config.json` (`c`, the text model's config), adjusting `rope`.
pub fn hf_variant(c: &Value, b: &HfBase, rope: &mut RopeSpec) -> Result<Variant, ModelError> {
    let mut v = Variant::default();
    let act = get_str(c, "hidden_activation").or_else(|| get_str(c, "hidden_act"));
    let window = get_usize(c, "sliding_window")?;
    match b.arch {
        "llama" | "mistral" | "mixtral" => v.window = window,
        "qwen2" | "qwen2_moe" | "qwen3" | "qwen3_moe" => {
            v.qk_norm = matches!(b.arch, "qwen3" | "qwen3_moe");
            if c.get("use_sliding_window").and_then(Value::as_bool) == Some(true) {
                return Err(spec_err(format!(
                    "config.json use_sliding_window: true is not supported for {}",
                    b.arch
                )));
            }
        }
        "gemma2" | "gemma3_text" => {
            if !matches!(act, Some("gelu_pytorch_tanh" | "gelu_tanh")) {
                return Err(spec_err(format!(
                    "config.json hidden_activation: {act:?} is not supported (only gelu_pytorch_tanh)"
                )));
            }
            v.act = Activation::GeluTanh;
            v.post_norms = true;
            v.qk_norm = b.arch == "gemma3_text";
            v.embed_scale = Some((b.hidden as f32).sqrt());
            v.norm_offset = 1.0;
            v.attn_scale = get_f32(c, "query_pre_attn_scalar")?.map(|s| 1.0 / s.sqrt());
            v.attn_softcap = get_f32(c, "attn_logit_softcapping")?;
            v.final_softcap = get_f32(c, "final_logit_softcapping")?;
            v.window = window;
            v.sliding = hf_layer_types(c, b)?;
            if b.arch == "gemma3_text" {
                gemma3_ropes(c, rope, &mut v)?;
            }
        }
        "phi3" => {
            v.fused_tensors = true;
            v.window = window;
            if c.get("attention_bias").and_then(Value::as_bool) == Some(true) {
                return Err(spec_err(
                    "config.json attention_bias: true is not supported for phi3".into(),
                ));
            }
            if let Some(p) = get_f32(c, "partial_rotary_factor")? {
                let dim = (b.head_dim as f32 * p) as usize;
                rope.dim = dim;
            }
            phi3_rope_scaling(c, b, rope)?;
        }
        other => return Err(spec_err(format!("unsupported model_type '{other}'"))),
    }
    v.moe = super::moe::hf_moe(c, b.arch)?;
    if !matches!(b.arch, "gemma2" | "gemma3_text")
        && let Some(a) = act.filter(|a| *a != "silu")
    {
        return Err(spec_err(format!(
            "config.json hidden_act: '{a}' is not supported (only silu)"
        )));
    }
    Ok(v)
}

/// Which layers slide: `layer_types` when given, else Gemma 2's every other layer or Gemma
/// 3's `sliding_window_pattern`.
fn hf_layer_types(c: &Value, b: &HfBase) -> Result<Vec<bool>, ModelError> {
    if let Some(types) = c.get("layer_types").and_then(Value::as_array) {
        return types
            .iter()
            .map(|t| match t.as_str() {
                Some("sliding_attention") => Ok(true),
                Some("full_attention") => Ok(false),
                _ => Err(spec_err(format!("config.json layer_types: unknown {t}"))),
            })
            .collect();
    }
    let pattern = match b.arch {
        "gemma2" => 2,
        _ => get_usize(c, "sliding_window_pattern")?.unwrap_or(6),
    };
    Ok((0..b.n_layers)
        .map(|l| match b.arch {
            "gemma2" => l % 2 == 0,
            _ => pattern == 0 || (l + 1) % pattern != 0,
        })
        .collect())
}

/// Gemma 3: global layers at `rope_theta` with linear `rope_scaling`, sliding layers at
/// `rope_local_base_freq` unscaled (or both from transformers 5 `rope_parameters`).
fn gemma3_ropes(c: &Value, rope: &mut RopeSpec, v: &mut Variant) -> Result<(), ModelError> {
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

/// Phi-3 `longrope` (`su`): per-frequency divisors, the long set when the context exceeds
/// `original_max_position_embeddings` (llama.cpp's rule; transformers switches per step),
/// and the attention factor on cos and sin (the rotated dims of q and k; with a partial
/// rope, Phi-4-mini's, the other dims keep their values).
fn phi3_rope_scaling(c: &Value, b: &HfBase, rope: &mut RopeSpec) -> Result<(), ModelError> {
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
