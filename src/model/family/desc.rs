//! What a model family is made of: the [`Family`] descriptor every family file fills, and
//! the small readers the family files share.

use serde_json::Value;

use super::super::ModelError;
use super::super::gguf::GgufFile;
use super::super::variant::{Activation, Variant};
use crate::backend::{RopeLayout, RopeSpec};

/// One model family: its names in both file formats, its tensor names, its rope layout,
/// what it adds to the Llama block and how its family-specific keys are read. Every other
/// part of `model` asks the family table (`family::FAMILIES`) instead of matching names.
pub struct Family {
    /// The spec's `arch`: llama.cpp's name, GGUF's `general.architecture`.
    pub arch: &'static str,
    /// GGUF files name this family by `arch` (Mixtral's files say `llama`).
    pub gguf: bool,
    /// The `config.json` `model_type`s of the family (errors name the one a file gives).
    pub hf_types: &'static [&'static str],
    /// A `model_type` whose `text_config` is this family's config (Gemma 3's multimodal
    /// checkpoints nest the language model's config).
    pub hf_wrapper: Option<&'static str>,
    /// How GGUF files lay out the rotated pairs of q and k (llama.cpp's converter permutes
    /// Llama's and Mistral's); Hugging Face checkpoints always rotate head halves.
    pub gguf_rope: RopeLayout,
    /// The GGUF `rope.scaling.type`s the family reads (others are refused by name).
    pub gguf_rope_scalings: &'static [&'static str],
    /// The family reads `config.json`'s rope scaling itself (its hook), so the common
    /// `llama3` reader leaves it alone.
    pub hf_own_rope_scaling: bool,
    /// What the family adds to the block, whatever the file says.
    pub flags: Flags,
    /// Whether and how its FFNs are mixtures of experts.
    pub experts: Experts,
    /// Where its q/k/v biases come from.
    pub qkv_bias: QkvBias,
    /// `tie_word_embeddings` when `config.json` does not say.
    pub hf_tied_default: bool,
    /// Hugging Face tensor names where they differ from Llama's.
    pub hf_tensors: HfTensors,
    /// Reads the family's own GGUF keys into the variant (and adjusts the global rope).
    pub gguf_variant: GgufHook,
    /// Reads the family's own `config.json` keys into the variant (and the global rope).
    pub hf_variant: HfHook,
}

/// The family part of a GGUF file's spec.
pub type GgufHook = fn(&GgufFile, &GgufBase, &mut RopeSpec, &mut Variant) -> Result<(), ModelError>;
/// The family part of a `config.json`'s spec.
pub type HfHook = fn(&Value, &HfBase, &mut RopeSpec, &mut Variant) -> Result<(), ModelError>;

/// The block's fixed differences from Llama's.
#[derive(Debug, Clone, Copy)]
pub struct Flags {
    /// The FFN's gate activation.
    pub act: Activation,
    /// Per-head RMSNorm of q and k before rope.
    pub qk_norm: bool,
    /// RMSNorm of the attention and FFN outputs before each residual add.
    pub post_norms: bool,
    /// The embeddings are multiplied by `sqrt(hidden)`.
    pub embed_scale: bool,
    /// Added to every RMSNorm weight of a Hugging Face checkpoint at load (Gemma stores
    /// `w` for `(1 + w)`; llama.cpp's converter already added it).
    pub hf_norm_offset: f32,
    /// q/k/v in one tensor and gate/up in one.
    pub fused_tensors: bool,
}

/// Plain Llama: nothing added.
pub const LLAMA_FLAGS: Flags = Flags {
    act: Activation::Silu,
    qk_norm: false,
    post_norms: false,
    embed_scale: false,
    hf_norm_offset: 0.0,
    fused_tensors: false,
};

/// Whether and how a family's FFNs are mixtures of experts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Experts {
    /// Dense only: expert counts in a file are refused.
    None,
    /// GGUF files may have experts (Mixtral's, under `llama`/`mistral`): the expert width
    /// defaults to `feed_forward_length`, the top-k weights are renormalised; no shared
    /// expert. `config.json`s of the family are dense (Mixtral's is a family of its own).
    LlamaGguf,
    /// Qwen-MoE: every layer sparse, the expert keys required; `shared`: a shared expert
    /// is allowed (Qwen2-MoE); `gguf_norm_topk`: whether llama.cpp renormalises the top-k
    /// weights when the file does not say.
    Qwen { shared: bool, gguf_norm_topk: bool },
    /// Mixtral's `config.json` (`num_local_experts`, experts `intermediate_size` wide).
    Mixtral,
    /// gpt-oss: every layer sparse, experts `intermediate_size` wide, softmax over the top-k
    /// router logits, router and expert biases, the clamped SwiGLU.
    GptOss,
}

/// Where a family's q/k/v biases come from (GGUF files: from the tensors present).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkvBias {
    /// `config.json` `attention_bias` (default false).
    AttentionBias,
    /// Always (Qwen2).
    Always,
    /// `config.json` `qkv_bias`, default true (Qwen2-MoE), or `attention_bias`.
    QkvKey,
}

/// A family's Hugging Face tensor names where they are not Llama's.
#[derive(Debug, Clone, Copy)]
pub struct HfTensors {
    /// GGUF leaf -> HF leaf, looked up before Llama's names.
    pub leaves: &'static [(&'static str, &'static str)],
    /// The router's HF leaf (`ffn_gate_inp.weight`).
    pub router: &'static str,
    /// The prefix of expert `e`'s matrices: `{experts}.{e}.{name}.weight`.
    pub experts: &'static str,
    /// The names of an expert's gate, up and down matrices.
    pub expert_names: [&'static str; 3],
    /// Tensors a checkpoint stores in another layout (gpt-oss's fused, transposed experts),
    /// made from the stored ones when asked for by their GGUF name.
    pub derived: Option<HfDerived>,
}

/// Makes GGUF tensor `name` of `shape` from a directory's own tensors (`None`: not one it
/// makes, read by name as usual).
pub type HfDerived = fn(
    &super::super::source::SafetensorsSource,
    &str,
    &[usize],
) -> Result<Option<crate::backend::HostTensor>, ModelError>;

/// Llama's (and Qwen-MoE's) names.
pub const LLAMA_TENSORS: HfTensors = HfTensors {
    leaves: &[],
    router: "mlp.gate.weight",
    experts: "mlp.experts",
    expert_names: ["gate_proj", "up_proj", "down_proj"],
    derived: None,
};

/// Llama's Hugging Face names of the GGUF leaves every family shares.
const LLAMA_LEAVES: &[(&str, &str)] = &[
    (
        "post_attention_norm.weight",
        "post_attention_layernorm.weight",
    ),
    ("post_ffw_norm.weight", "post_feedforward_layernorm.weight"),
    ("attn_q_norm.weight", "self_attn.q_norm.weight"),
    ("attn_k_norm.weight", "self_attn.k_norm.weight"),
    ("attn_qkv.weight", "self_attn.qkv_proj.weight"),
    ("attn_norm.weight", "input_layernorm.weight"),
    ("attn_q.weight", "self_attn.q_proj.weight"),
    ("attn_k.weight", "self_attn.k_proj.weight"),
    ("attn_v.weight", "self_attn.v_proj.weight"),
    ("attn_q.bias", "self_attn.q_proj.bias"),
    ("attn_k.bias", "self_attn.k_proj.bias"),
    ("attn_v.bias", "self_attn.v_proj.bias"),
    ("attn_output.weight", "self_attn.o_proj.weight"),
    ("ffn_norm.weight", "post_attention_layernorm.weight"),
    (
        "ffn_gate_shexp.weight",
        "mlp.shared_expert.gate_proj.weight",
    ),
    ("ffn_up_shexp.weight", "mlp.shared_expert.up_proj.weight"),
    (
        "ffn_down_shexp.weight",
        "mlp.shared_expert.down_proj.weight",
    ),
    ("ffn_gate_inp_shexp.weight", "mlp.shared_expert_gate.weight"),
    ("ffn_gate.weight", "mlp.gate_proj.weight"),
    ("ffn_up.weight", "mlp.up_proj.weight"),
    ("ffn_down.weight", "mlp.down_proj.weight"),
];

impl Family {
    /// The Hugging Face name of GGUF tensor `gguf` in this family's checkpoints.
    pub fn hf_name(&self, gguf: &str) -> String {
        match gguf {
            "token_embd.weight" => "model.embed_tokens.weight".into(),
            "output_norm.weight" => "model.norm.weight".into(),
            "output.weight" => "lm_head.weight".into(),
            _ => {
                if let Some(rest) = gguf.strip_prefix("blk.")
                    && let Some((layer, leaf)) = rest.split_once('.')
                    && let Some(hf) = self.hf_leaf(leaf)
                {
                    return format!("model.layers.{layer}.{hf}");
                }
                gguf.to_string()
            }
        }
    }

    /// The HF name of a layer's leaf: the family's, Llama's, or a mixture-of-experts one.
    fn hf_leaf(&self, leaf: &str) -> Option<String> {
        let t = &self.hf_tensors;
        let named = |(g, _): &&(&str, &str)| *g == leaf;
        if let Some((_, hf)) = t
            .leaves
            .iter()
            .find(named)
            .or(LLAMA_LEAVES.iter().find(named))
        {
            return Some(hf.to_string());
        }
        // The router and one expert's matrices (`ffn_{gate,up,down}.E`, as older GGUF
        // files name them too).
        if leaf == "ffn_gate_inp.weight" {
            return Some(t.router.into());
        }
        let (kind, rest) = leaf.strip_prefix("ffn_")?.split_once('.')?;
        let e: usize = rest.strip_suffix(".weight")?.parse().ok()?;
        let name = match kind {
            "gate" => t.expert_names[0],
            "up" => t.expert_names[1],
            "down" => t.expert_names[2],
            _ => return None,
        };
        Some(format!("{}.{e}.{name}.weight", t.experts))
    }
}

/// The shapes and values a family's GGUF hook starts from.
pub struct GgufBase<'a> {
    /// The file's `general.architecture` (the metadata keys' prefix).
    pub arch: &'a str,
    pub n_layers: usize,
    pub hidden: usize,
    pub n_heads: usize,
    pub head_dim: usize,
    pub max_position: usize,
    /// `feed_forward_length` (Mixtral's expert width).
    pub ff: usize,
    /// `attention.sliding_window` when positive.
    pub window: Option<usize>,
}

impl GgufBase<'_> {
    /// The metadata key `<arch>.k`.
    pub fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }

    /// The f32 value of `<arch>.k`.
    pub fn f32(&self, g: &GgufFile, k: &str) -> Option<f32> {
        g.meta_f64(&self.key(k)).map(|v| v as f32)
    }
}

/// The shapes and values a family's `config.json` hook starts from.
pub struct HfBase<'a> {
    /// The file's `model_type` (errors name it).
    pub arch: &'a str,
    pub n_layers: usize,
    pub hidden: usize,
    pub head_dim: usize,
    pub max_position: usize,
    /// `sliding_window`.
    pub window: Option<usize>,
    /// `hidden_activation`, else `hidden_act`.
    pub act: Option<&'a str>,
}

pub fn spec_err(m: String) -> ModelError {
    ModelError::Spec(m)
}

/// `config.json` number `k` (`None`: absent or null).
pub fn get_f32(c: &Value, k: &str) -> Result<Option<f32>, ModelError> {
    match c.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_f64()
            .map(|x| Some(x as f32))
            .ok_or_else(|| spec_err(format!("config.json {k}: expected a number, got {v}"))),
    }
}

/// `config.json` non-negative integer `k` (`None`: absent or null).
pub fn get_usize(c: &Value, k: &str) -> Result<Option<usize>, ModelError> {
    match c.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_u64().map(|x| Some(x as usize)).ok_or_else(|| {
            spec_err(format!(
                "config.json {k}: expected a non-negative integer, got {v}"
            ))
        }),
    }
}

/// `config.json` string `k`.
pub fn get_str<'a>(c: &'a Value, k: &str) -> Option<&'a str> {
    c.get(k).and_then(Value::as_str)
}

/// A hook for families without keys of their own.
pub fn no_gguf_keys(
    _: &GgufFile,
    _: &GgufBase,
    _: &mut RopeSpec,
    _: &mut Variant,
) -> Result<(), ModelError> {
    Ok(())
}

/// A `config.json` hook for families whose only key of their own is `sliding_window`.
pub fn hf_window(
    _: &Value,
    b: &HfBase,
    _: &mut RopeSpec,
    v: &mut Variant,
) -> Result<(), ModelError> {
    v.window = b.window;
    Ok(())
}
