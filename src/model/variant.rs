//! What a model family adds to the Llama block (Qwen3's q/k norms, Gemma's GeGLU, extra
//! norms, soft-capping and sliding-window layers, Phi-3's fused tensors and longrope). Each
//! family's descriptor (`family/`) says how its files set these; values Kiln does not
//! implement are refused by name, never ignored.

/// The FFN's gate activation (the backend's GLU op takes it as it is).
pub use crate::backend::Activation;
use crate::backend::{MoeShape, RopeSpec};

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
    /// The router and every expert's gate, up and down carry biases (gpt-oss).
    pub moe_bias: bool,
    /// One learned logit per query head joins each attention softmax's denominator
    /// (gpt-oss's sinks, `attn_sinks`).
    pub sinks: bool,
    /// The attention output projection has a bias (gpt-oss, `attn_output.bias`).
    pub out_bias: bool,
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
        if self.moe_bias && self.moe.is_none() {
            return Err("expert biases without a mixture of experts".into());
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
