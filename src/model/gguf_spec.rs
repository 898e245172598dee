//! [`ModelSpec::from_gguf`]: the spec from GGUF metadata (llama.cpp's `<arch>.*` keys), the
//! family's own keys read by its descriptor's hook.

use super::ModelError;
use super::family::{self, Family, GgufBase};
use super::gguf::GgufFile;
use super::moe::gguf_moe;
use super::pooling;
use super::spec::{Llama3Scaling, ModelSpec, RopeSpec};
use super::variant::Variant;

impl ModelSpec {
    /// Reads the spec from GGUF metadata (`<arch>.*` keys).
    pub fn from_gguf(g: &GgufFile) -> Result<Self, ModelError> {
        let arch = g
            .meta_str("general.architecture")
            .ok_or_else(|| ModelError::Spec("missing general.architecture".into()))?
            .to_string();
        let fam = family::by_gguf_arch(&arch)
            .ok_or_else(|| ModelError::Spec(format!("unsupported architecture '{arch}'")))?;
        let key = |k: &str| format!("{arch}.{k}");
        let req = |k: &str| {
            g.meta_u64(&key(k))
                .map(|v| v as usize)
                .ok_or_else(|| ModelError::Spec(format!("missing metadata key '{}'", key(k))))
        };
        let opt = |k: &str| g.meta_u64(&key(k)).map(|v| v as usize);
        let hidden = req("embedding_length")?;
        let n_heads = req("attention.head_count")?;
        let n_kv_heads = opt("attention.head_count_kv").unwrap_or(n_heads);
        let head_dim = opt("attention.key_length").unwrap_or(hidden / n_heads.max(1));
        let rope_dim = opt("rope.dimension_count").unwrap_or(head_dim);
        let vocab_size = match opt("vocab_size") {
            Some(v) => v,
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
        let n_layers = req("block_count")?;
        let max_position = opt("context_length").unwrap_or(2048);
        let window = opt("attention.sliding_window").filter(|&w| w > 0);
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
                layout: fam.gguf_rope,
                llama3: llama3_scaling(g, &arch),
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
        let base = GgufBase {
            arch: &spec.arch,
            ff: spec.intermediate,
            n_layers,
            hidden,
            n_heads,
            head_dim,
            max_position,
            window,
        };
        spec.variant = gguf_variant(g, fam, &base, &mut spec.rope)?;
        spec.validate_as(|f| f.gguf_key(&spec.arch))?;
        Ok(spec)
    }
}

/// Llama 3's rope scaling, when the file names it (any family may).
fn llama3_scaling(g: &GgufFile, arch: &str) -> Option<Llama3Scaling> {
    let key = |k: &str| format!("{arch}.rope.scaling.{k}");
    let f = |k: &str, default: f64| g.meta_f64(&key(k)).unwrap_or(default) as f32;
    (g.meta_str(&key("type")) == Some("llama3")).then(|| Llama3Scaling {
        factor: f("factor", 8.0),
        low_freq_factor: f("low_freq_factor", 1.0),
        high_freq_factor: f("high_freq_factor", 4.0),
        original_max_position: f("original_context_length", 8192.0),
    })
}

/// The family part of a GGUF file's spec; `rope` is the global rope, which Gemma 3's
/// linear scaling and Phi-3's longrope factors adjust.
fn gguf_variant(
    g: &GgufFile,
    fam: &Family,
    b: &GgufBase,
    rope: &mut RopeSpec,
) -> Result<Variant, ModelError> {
    let flags = &fam.flags;
    let mut v = Variant {
        attn_scale: b.f32(g, "attention.scale"),
        moe: gguf_moe(g, b.arch, fam, b.ff)?,
        pooling: pooling::from_gguf(g, b.arch)?,
        act: flags.act,
        qk_norm: flags.qk_norm,
        post_norms: flags.post_norms,
        embed_scale: flags.embed_scale.then(|| (b.hidden as f32).sqrt()),
        fused_tensors: flags.fused_tensors,
        ..Variant::default()
    };
    (fam.gguf_variant)(g, b, rope, &mut v)?;
    let key = b.key("rope.scaling.type");
    match g.meta_str(&key) {
        None => {}
        Some(kind) if fam.gguf_rope_scalings.contains(&kind) => {}
        Some(other) => {
            return Err(ModelError::Spec(format!(
                "{key}: '{other}' is not supported for {}",
                b.arch
            )));
        }
    }
    Ok(v)
}
