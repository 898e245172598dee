//! The mixture-of-experts part of a spec (Qwen3-MoE, Mixtral), from GGUF metadata
//! (llama.cpp's `expert_*` keys) or `config.json`. Layouts Kiln does not run (dense layers
//! between sparse ones, shared experts) are refused by name.

use serde_json::Value;

use super::ModelError;
use super::gguf::GgufFile;
use crate::backend::MoeShape;

fn spec_err(m: String) -> ModelError {
    ModelError::Spec(m)
}

/// The MoE shape of a GGUF file of architecture `arch` (`None`: a dense model).
/// `ff` is the file's `feed_forward_length` (Mixtral's expert width).
pub fn gguf_moe(g: &GgufFile, arch: &str, ff: usize) -> Result<Option<MoeShape>, ModelError> {
    let key = |k: &str| format!("{arch}.{k}");
    let Some(n_expert) = g.meta_u64(&key("expert_count")).filter(|&n| n > 0) else {
        if arch == "qwen3moe" {
            return Err(spec_err(format!(
                "missing metadata key '{}'",
                key("expert_count")
            )));
        }
        return Ok(None);
    };
    if !matches!(arch, "llama" | "mistral" | "qwen3moe") {
        return Err(spec_err(format!(
            "{}: mixture of experts is not supported for {arch}",
            key("expert_count")
        )));
    }
    if g.meta_u64(&key("expert_shared_count")).unwrap_or(0) > 0
        || g.tensor("blk.0.ffn_gate_inp_shexp.weight").is_some()
    {
        return Err(spec_err(format!(
            "{}: shared experts are not supported",
            key("expert_shared_count")
        )));
    }
    let top_k = g.meta_u64(&key("expert_used_count")).ok_or_else(|| {
        spec_err(format!(
            "missing metadata key '{}'",
            key("expert_used_count")
        ))
    })?;
    let expert_ff = match arch {
        "qwen3moe" => g
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
    // llama.cpp renormalises the top-k weights of both families (Mixtral's softmax over the
    // top logits is the same); a file may say otherwise.
    let norm_topk = g.meta_bool(&key("expert_weights_norm")).unwrap_or(true);
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
    }))
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

/// The MoE shape of a `config.json` of `model_type` `arch` (`None`: a dense model).
pub fn hf_moe(c: &Value, arch: &str) -> Result<Option<MoeShape>, ModelError> {
    match arch {
        "qwen3_moe" => {
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
            if get_u64(c, "shared_expert_intermediate_size")?.unwrap_or(0) > 0 {
                return Err(spec_err(
                    "config.json shared_expert_intermediate_size: shared experts are not supported"
                        .into(),
                ));
            }
            Ok(Some(MoeShape {
                n_expert: need(c, "num_experts")?,
                top_k: need(c, "num_experts_per_tok")?,
                expert_ff: need(c, "moe_intermediate_size")?,
                norm_topk: get_bool(c, "norm_topk_prob")?.unwrap_or(false),
            }))
        }
        "mixtral" => Ok(Some(MoeShape {
            n_expert: need(c, "num_local_experts")?,
            top_k: need(c, "num_experts_per_tok")?,
            expert_ff: need(c, "intermediate_size")?,
            // Softmax over the top-k logits: the renormalised top-k probabilities.
            norm_topk: true,
        })),
        _ => {
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
