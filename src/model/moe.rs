//! The mixture-of-experts part of a spec (Qwen3-MoE, Mixtral, Qwen2-MoE with its shared
//! expert), from GGUF metadata (llama.cpp's `expert_*` keys) or `config.json`. Layouts Kiln
//! does not run (dense layers between sparse ones, shared experts outside Qwen2-MoE, more
//! than one shared expert) are refused by name.

use serde_json::Value;

use super::ModelError;
use super::family::{Experts, Family, SWIGLU_ALPHA, SWIGLU_LIMIT, hf_swiglu, spec_err};
use super::gguf::GgufFile;
use crate::backend::{MoeAct, MoeShape};

/// The MoE shape of a GGUF file of architecture `arch`, of family `fam` (`None`: a dense
/// model). `ff` is the file's `feed_forward_length` (Mixtral's expert width).
pub fn gguf_moe(
    g: &GgufFile,
    arch: &str,
    fam: &Family,
    ff: usize,
) -> Result<Option<MoeShape>, ModelError> {
    let key = |k: &str| format!("{arch}.{k}");
    let qwen = matches!(fam.experts, Experts::Qwen { .. } | Experts::GptOss);
    let Some(n_expert) = g.meta_u64(&key("expert_count")).filter(|&n| n > 0) else {
        if qwen {
            return Err(spec_err(format!(
                "missing metadata key '{}'",
                key("expert_count")
            )));
        }
        return Ok(None);
    };
    if fam.experts == Experts::None {
        return Err(spec_err(format!(
            "{}: mixture of experts is not supported for {arch}",
            key("expert_count")
        )));
    }
    let shared = matches!(fam.experts, Experts::Qwen { shared: true, .. });
    let shared_ff = gguf_shared_ff(g, arch, shared)?;
    let top_k = g.meta_u64(&key("expert_used_count")).ok_or_else(|| {
        spec_err(format!(
            "missing metadata key '{}'",
            key("expert_used_count")
        ))
    })?;
    let expert_ff = match qwen {
        true => g
            .meta_u64(&key("expert_feed_forward_length"))
            .ok_or_else(|| {
                spec_err(format!(
                    "missing metadata key '{}'",
                    key("expert_feed_forward_length")
                ))
            })? as usize,
        _ => g
            .meta_u64(&key("expert_feed_forward_length"))
            .map_or(ff, |v| v as usize),
    };
    // llama.cpp renormalises the top-k weights of Qwen3-MoE and Mixtral (whose softmax over
    // the top logits is the same), not Qwen2-MoE's; a file may say otherwise.
    let norm_default = match fam.experts {
        Experts::Qwen { gguf_norm_topk, .. } => gguf_norm_topk,
        _ => true,
    };
    // gpt-oss: softmax over the top-k logits (llama.cpp's SOFTMAX_WEIGHT), and the clamped
    // SwiGLU at the constants llama.cpp runs it with (the files carry neither).
    let (norm_default, act) = match fam.experts {
        Experts::GptOss => (
            true,
            MoeAct::ClampedSwiglu {
                alpha: SWIGLU_ALPHA,
                limit: SWIGLU_LIMIT,
            },
        ),
        _ => (norm_default, MoeAct::Silu),
    };
    let norm_topk = g
        .meta_bool(&key("expert_weights_norm"))
        .unwrap_or(norm_default);
    if fam.experts == Experts::GptOss && !norm_topk {
        return Err(spec_err(format!(
            "{}: false is not supported for {arch}",
            key("expert_weights_norm")
        )));
    }
    if let Some(f) = g.meta_u64(&key("expert_gating_func"))
        && f != 1
    {
        return Err(spec_err(format!(
            "{}: {f} is not supported (only 1, softmax)",
            key("expert_gating_func")
        )));
    }
    Ok(Some(MoeShape {
        n_expert: n_expert as usize,
        top_k: top_k as usize,
        expert_ff,
        norm_topk,
        shared_ff,
        act,
    }))
}

/// The shared expert's width of a GGUF file (0: none): Qwen2-MoE's
/// `expert_shared_feed_forward_length`, else the rows of `blk.0.ffn_gate_shexp`; `allowed`:
/// the family has one (else one in the file is refused).
fn gguf_shared_ff(g: &GgufFile, arch: &str, allowed: bool) -> Result<usize, ModelError> {
    let key = |k: &str| format!("{arch}.{k}");
    let count = g.meta_u64(&key("expert_shared_count"));
    let has_tensors = g.tensor("blk.0.ffn_gate_inp_shexp.weight").is_some()
        || g.tensor("blk.0.ffn_gate_shexp.weight").is_some();
    if !allowed {
        if count.unwrap_or(0) > 0 || has_tensors {
            return Err(spec_err(format!(
                "{}: shared experts are not supported for {arch} (only qwen2moe)",
                key("expert_shared_count")
            )));
        }
        return Ok(0);
    }
    if let Some(c) = count.filter(|&c| c > 1) {
        return Err(spec_err(format!(
            "{}: {c} is not supported (one shared expert)",
            key("expert_shared_count")
        )));
    }
    if let Some(ff) = g.meta_u64(&key("expert_shared_feed_forward_length")) {
        return Ok(ff as usize);
    }
    Ok(g.tensor("blk.0.ffn_gate_shexp.weight")
        .and_then(|t| t.dims.get(1).copied())
        .unwrap_or(0) as usize)
}

fn get_u64(c: &Value, k: &str) -> Result<Option<u64>, ModelError> {
    match c.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| {
            spec_err(format!(
                "config.json {k}: expected a non-negative integer, got {v}"
            ))
        }),
    }
}

fn need(c: &Value, k: &str) -> Result<usize, ModelError> {
    get_u64(c, k)?
        .map(|v| v as usize)
        .ok_or_else(|| spec_err(format!("config.json {k} missing")))
}

fn get_bool(c: &Value, k: &str) -> Result<Option<bool>, ModelError> {
    match c.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_bool()
            .map(Some)
            .ok_or_else(|| spec_err(format!("config.json {k}: expected true or false, got {v}"))),
    }
}

/// The MoE shape of a `config.json` of `model_type` `arch`, of family `fam` (`None`: a
/// dense model).
pub fn hf_moe(c: &Value, arch: &str, fam: &Family) -> Result<Option<MoeShape>, ModelError> {
    match fam.experts {
        Experts::Qwen {
            shared: allowed, ..
        } => {
            if let Some(step) = get_u64(c, "decoder_sparse_step")?.filter(|&s| s != 1) {
                return Err(spec_err(format!(
                    "config.json decoder_sparse_step: {step} is not supported (only 1: every layer sparse)"
                )));
            }
            match c.get("mlp_only_layers") {
                None | Some(Value::Null) => {}
                Some(Value::Array(a)) if a.is_empty() => {}
                Some(v) => {
                    return Err(spec_err(format!(
                        "config.json mlp_only_layers: {v} is not supported (only [])"
                    )));
                }
            }
            let shared = get_u64(c, "shared_expert_intermediate_size")?.unwrap_or(0) as usize;
            if shared > 0 && !allowed {
                return Err(spec_err(format!(
                    "config.json shared_expert_intermediate_size: shared experts are not supported for {arch}"
                )));
            }
            Ok(Some(MoeShape {
                n_expert: need(c, "num_experts")?,
                top_k: need(c, "num_experts_per_tok")?,
                expert_ff: need(c, "moe_intermediate_size")?,
                norm_topk: get_bool(c, "norm_topk_prob")?.unwrap_or(false),
                shared_ff: shared,
                act: MoeAct::Silu,
            }))
        }
        Experts::Mixtral => Ok(Some(MoeShape {
            n_expert: need(c, "num_local_experts")?,
            top_k: need(c, "num_experts_per_tok")?,
            expert_ff: need(c, "intermediate_size")?,
            // Softmax over the top-k logits: the renormalised top-k probabilities.
            norm_topk: true,
            shared_ff: 0,
            act: MoeAct::Silu,
        })),
        Experts::GptOss => {
            let top_k = match get_u64(c, "num_experts_per_tok")? {
                Some(k) => k as usize,
                None => need(c, "experts_per_token")?,
            };
            if let Some(k) = get_u64(c, "experts_per_token")?
                && k as usize != top_k
            {
                return Err(spec_err(format!(
                    "config.json experts_per_token: {k} differs from num_experts_per_tok {top_k}"
                )));
            }
            let (alpha, limit) = hf_swiglu(c)?;
            Ok(Some(MoeShape {
                n_expert: need(c, "num_local_experts")?,
                top_k,
                expert_ff: need(c, "intermediate_size")?,
                norm_topk: true,
                shared_ff: 0,
                act: MoeAct::ClampedSwiglu { alpha, limit },
            }))
        }
        Experts::None | Experts::LlamaGguf => {
            for k in ["num_experts", "num_local_experts"] {
                if get_u64(c, k)?.unwrap_or(0) > 1 {
                    return Err(spec_err(format!(
                        "config.json {k}: mixture of experts is not supported for {arch}"
                    )));
                }
            }
            Ok(None)
        }
    }
}
