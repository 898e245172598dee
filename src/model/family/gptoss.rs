//! gpt-oss (20b, 120b): q/k/v/o biases, one learned sink logit per head, sliding-window
//! attention on alternating layers, YaRN rope, and a mixture of experts in every layer with
//! a biased router (softmax over the top-k logits), biased experts and the clamped SwiGLU.
//! GGUF arch `gpt-oss` as llama.cpp's converter writes it; `config.json` `gpt_oss` in both
//! eras (the released checkpoints' `rope_scaling`, `experts_per_token`,
//! `initial_context_length`; transformers 5's `rope_parameters`).
//!
//! Hugging Face stores the experts fused and transposed (`gate_up_proj [E, hidden, 2 ff]`,
//! gate at the even columns; `down_proj [E, ff, hidden]`): [`hf_experts`] re-lays them into
//! llama.cpp's `ffn_{gate,up,down}_exps` (`[E, ff, hidden]`, `[E, hidden, ff]`) when read.

use serde_json::Value;

use super::super::ModelError;
use super::super::gguf::GgufFile;
use super::super::source::SafetensorsSource;
use super::super::variant::Variant;
use super::desc::{Experts, Family, GgufBase, HfBase, HfTensors, LLAMA_FLAGS, QkvBias};
use super::desc::{get_f32, get_str, get_usize, spec_err};
use crate::backend::{HostTensor, RopeLayout, RopeSpec, quant::GgmlType};

pub static GPTOSS: Family = Family {
    arch: "gpt-oss",
    gguf: true,
    hf_types: &["gpt_oss"],
    hf_wrapper: None,
    gguf_rope: RopeLayout::Half,
    gguf_rope_scalings: &["none", "yarn"],
    hf_own_rope_scaling: true,
    flags: LLAMA_FLAGS,
    experts: Experts::GptOss,
    qkv_bias: QkvBias::Always,
    hf_tied_default: false,
    hf_tensors: HfTensors {
        leaves: &[
            ("attn_sinks.weight", "self_attn.sinks"),
            ("attn_output.bias", "self_attn.o_proj.bias"),
            ("ffn_gate_inp.bias", "mlp.router.bias"),
            ("ffn_down_exps.bias", "mlp.experts.down_proj_bias"),
        ],
        router: "mlp.router.weight",
        experts: "mlp.experts",
        expert_names: ["gate_proj", "up_proj", "down_proj"],
        derived: Some(hf_experts),
    },
    gguf_variant: gguf_gptoss,
    hf_variant: hf_gptoss,
};

/// The released models' clamped SwiGLU: llama.cpp fixes these (GGUF files carry neither).
pub const SWIGLU_ALPHA: f32 = 1.702;
pub const SWIGLU_LIMIT: f32 = 7.0;

/// YaRN's parameters, as both formats give them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Yarn {
    pub factor: f32,
    pub original_max_position: f32,
    pub beta_fast: f32,
    pub beta_slow: f32,
    /// Floor and ceil the correction range (transformers' default; gpt-oss: false).
    pub truncate: bool,
    /// `None`: `0.1 ln(factor) + 1`.
    pub attention_factor: Option<f32>,
}

impl Yarn {
    /// Writes YaRN into `rope` as per-frequency divisors (each frequency blended between
    /// itself and itself / factor by the ramp over the correction range) and the
    /// attention factor on cos and sin.
    pub fn apply(&self, rope: &mut RopeSpec) -> Result<(), String> {
        let ok = [
            self.factor,
            self.original_max_position,
            self.beta_fast,
            self.beta_slow,
        ]
        .iter()
        .all(|v| v.is_finite() && *v > 0.0);
        if !ok || self.factor < 1.0 || self.beta_fast <= self.beta_slow {
            return Err(format!(
                "{self:?}: factor >= 1, original context, beta_fast > beta_slow > 0 expected"
            ));
        }
        let dim = rope.dim as f64;
        let base = (rope.theta as f64).ln();
        let corr = |rot: f32| {
            let ratio =
                self.original_max_position as f64 / (rot as f64 * 2.0 * std::f64::consts::PI);
            dim * ratio.ln() / (2.0 * base)
        };
        let (mut low, mut high) = (corr(self.beta_fast), corr(self.beta_slow));
        if self.truncate {
            (low, high) = (low.floor(), high.ceil());
        }
        let (low, mut high) = (low.max(0.0), high.min(dim - 1.0));
        if low == high {
            high += 0.001;
        }
        let factor = self.factor as f64;
        rope.freq_factors = Some(
            (0..rope.dim / 2)
                .map(|i| {
                    let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                    // f' = f / factor * ramp + f * (1 - ramp) = f / divisor
                    (1.0 / (ramp / factor + 1.0 - ramp)) as f32
                })
                .collect(),
        );
        let af = match self.attention_factor {
            Some(a) => a,
            None => (0.1 * factor.ln() + 1.0) as f32,
        };
        if !(af.is_finite() && af > 0.0) {
            return Err(format!(
                "attention_factor {af}: expected a finite number > 0"
            ));
        }
        rope.attn_factor *= af;
        Ok(())
    }
}

/// Layers alternate sliding (even) and full (odd) attention, as llama.cpp's swa pattern 2.
fn alternating(n_layers: usize) -> Vec<bool> {
    (0..n_layers).map(|l| l % 2 == 0).collect()
}

fn gguf_gptoss(
    g: &GgufFile,
    b: &GgufBase,
    rope: &mut RopeSpec,
    v: &mut Variant,
) -> Result<(), ModelError> {
    let window_key = b.key("attention.sliding_window");
    v.window = Some(
        b.window
            .ok_or_else(|| spec_err(format!("missing metadata key '{window_key}'")))?,
    );
    if let Some(p) = g.meta_u64(&b.key("attention.sliding_window_pattern"))
        && p != 2
    {
        return Err(spec_err(format!(
            "{}: {p} is not supported for gpt-oss (only 2: alternating layers)",
            b.key("attention.sliding_window_pattern")
        )));
    }
    v.sliding = alternating(b.n_layers);
    v.sinks = true;
    v.out_bias = true;
    v.moe_bias = true;
    for k in [
        "rope.scaling.yarn_ext_factor",
        "rope.scaling.yarn_attn_factor",
        "rope.scaling.yarn_log_multiplier",
        "rope.freq_base_swa",
    ] {
        if g.meta_f64(&b.key(k)).is_some() {
            return Err(spec_err(format!("{}: not supported for gpt-oss", b.key(k))));
        }
    }
    if g.meta_str(&b.key("rope.scaling.type")) == Some("yarn") {
        let f = |k: &str| b.f32(g, k);
        let orig = g
            .meta_u64(&b.key("rope.scaling.original_context_length"))
            .ok_or_else(|| {
                spec_err(format!(
                    "missing metadata key '{}'",
                    b.key("rope.scaling.original_context_length")
                ))
            })?;
        let yarn = Yarn {
            factor: f("rope.scaling.factor").unwrap_or(1.0),
            original_max_position: orig as f32,
            beta_fast: f("rope.scaling.yarn_beta_fast").unwrap_or(32.0),
            beta_slow: f("rope.scaling.yarn_beta_slow").unwrap_or(1.0),
            // GGUF has no key for it: gpt-oss was trained without the floor and ceil
            // (its config's `truncate: false`; llama.cpp always floors and ceils).
            truncate: false,
            attention_factor: None,
        };
        rope.attn_factor = f("rope.scaling.attn_factor").unwrap_or(1.0);
        yarn.apply(rope)
            .map_err(|e| spec_err(format!("{}: {e}", b.key("rope.scaling"))))?;
    }
    Ok(())
}

fn hf_gptoss(
    c: &Value,
    b: &HfBase,
    rope: &mut RopeSpec,
    v: &mut Variant,
) -> Result<(), ModelError> {
    if c.get("attention_bias").and_then(Value::as_bool) == Some(false) {
        return Err(spec_err(
            "config.json attention_bias: false is not supported for gpt_oss".into(),
        ));
    }
    // The released checkpoints' MXFP4 experts are read as they are (`hf_mxfp4`).
    if let Some(q) = c.get("quantization_config").filter(|q| !q.is_null())
        && get_str(q, "quant_method") != Some("mxfp4")
    {
        return Err(spec_err(format!(
            "config.json quantization_config: {} is not supported for gpt_oss (only mxfp4)",
            get_str(q, "quant_method").unwrap_or("?")
        )));
    }
    if let Some(a) = get_f32(c, "attention_dropout")?.filter(|&a| a != 0.0) {
        return Err(spec_err(format!(
            "config.json attention_dropout: {a} is not supported (only 0)"
        )));
    }
    v.window = b.window;
    v.sliding = match c.get("layer_types") {
        None | Some(Value::Null) => alternating(b.n_layers),
        Some(Value::Array(a)) => a
            .iter()
            .map(|t| match t.as_str() {
                Some("sliding_attention") => Ok(true),
                Some("full_attention") => Ok(false),
                _ => Err(spec_err(format!(
                    "config.json layer_types: {t} is not supported (sliding_attention or full_attention)"
                ))),
            })
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return Err(spec_err(format!(
                "config.json layer_types: expected a list, got {other}"
            )));
        }
    };
    if v.window.is_none() && v.sliding.iter().any(|&s| s) {
        return Err(spec_err(
            "config.json sliding_window: missing, but layer_types has sliding layers".into(),
        ));
    }
    v.sinks = true;
    v.out_bias = true;
    v.moe_bias = true;
    hf_rope(c, b, rope)
}

/// gpt-oss's rope: `rope_theta` (default 150000) and YaRN from `rope_scaling` or
/// `rope_parameters` (default: transformers' gpt-oss YaRN, factor 32 over 4096).
fn hf_rope(c: &Value, b: &HfBase, rope: &mut RopeSpec) -> Result<(), ModelError> {
    let params = c
        .get("rope_parameters")
        .filter(|p| !p.is_null())
        .or(c.get("rope_scaling").filter(|p| !p.is_null()));
    let theta = match params
        .map(|p| get_f32(p, "rope_theta"))
        .transpose()?
        .flatten()
    {
        Some(t) => Some(t),
        None => get_f32(c, "rope_theta")?,
    };
    rope.theta = theta.unwrap_or(150000.0);
    let Some(p) = params else {
        let yarn = Yarn {
            factor: 32.0,
            original_max_position: 4096.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            truncate: false,
            attention_factor: None,
        };
        return yarn.apply(rope).map_err(spec_err);
    };
    match get_str(p, "rope_type").or_else(|| get_str(p, "type")) {
        None | Some("default") => return Ok(()),
        Some("yarn") => {}
        Some(other) => {
            return Err(spec_err(format!(
                "config.json rope_scaling: type '{other}' is not supported for gpt_oss (default or yarn)"
            )));
        }
    }
    for k in ["mscale", "mscale_all_dim", "extrapolation_factor"] {
        if p.get(k).is_some_and(|x| !x.is_null()) {
            return Err(spec_err(format!(
                "config.json rope_scaling.{k}: not supported for gpt_oss"
            )));
        }
    }
    let orig = match get_usize(p, "original_max_position_embeddings")? {
        Some(o) => o,
        None => get_usize(c, "initial_context_length")?.unwrap_or(b.max_position),
    };
    let truncate = match p.get("truncate") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(t)) => *t,
        Some(other) => {
            return Err(spec_err(format!(
                "config.json rope_scaling.truncate: expected true or false, got {other}"
            )));
        }
    };
    let factor = get_f32(p, "factor")?.unwrap_or(b.max_position as f32 / orig.max(1) as f32);
    let yarn = Yarn {
        factor,
        original_max_position: orig as f32,
        beta_fast: get_f32(p, "beta_fast")?.unwrap_or(32.0),
        beta_slow: get_f32(p, "beta_slow")?.unwrap_or(1.0),
        truncate,
        attention_factor: get_f32(p, "attention_factor")?,
    };
    yarn.apply(rope)
        .map_err(|e| spec_err(format!("config.json rope_scaling: {e}")))
}

/// The clamped SwiGLU of a `config.json` (`swiglu_limit`, `swiglu_alpha`).
pub fn hf_swiglu(c: &Value) -> Result<(f32, f32), ModelError> {
    let alpha = get_f32(c, "swiglu_alpha")?.unwrap_or(SWIGLU_ALPHA);
    let limit = get_f32(c, "swiglu_limit")?.unwrap_or(SWIGLU_LIMIT);
    for (k, v) in [("swiglu_alpha", alpha), ("swiglu_limit", limit)] {
        if !(v.is_finite() && v > 0.0) {
            return Err(spec_err(format!(
                "config.json {k}: {v} is not supported (a finite number > 0)"
            )));
        }
    }
    Ok((alpha, limit))
}

/// The experts of a Hugging Face gpt-oss checkpoint in llama.cpp's layout, when `name` is
/// one of them: `ffn_{gate,up}_exps.weight` `[E, ff, hidden]` from `gate_up_proj`
/// `[E, hidden, 2 ff]` (gate the even columns, up the odd), transposed;
/// `ffn_down_exps.weight` `[E, hidden, ff]` from `down_proj` `[E, ff, hidden]`;
/// `ffn_{gate,up}_exps.bias` `[E, ff]` from `gate_up_proj_bias` `[E, 2 ff]`. Elements keep
/// their type (one copy in the new order). `None`: not an expert tensor of this layout.
fn hf_experts(
    src: &SafetensorsSource,
    name: &str,
    shape: &[usize],
) -> Result<Option<HostTensor>, ModelError> {
    let Some((layer, leaf)) = name.strip_prefix("blk.").and_then(|r| r.split_once('.')) else {
        return Ok(None);
    };
    let prefix = format!("model.layers.{layer}.mlp.experts");
    let (hf, kind) = match leaf {
        "ffn_gate_exps.weight" => (format!("{prefix}.gate_up_proj"), Pick::Even),
        "ffn_up_exps.weight" => (format!("{prefix}.gate_up_proj"), Pick::Odd),
        "ffn_down_exps.weight" => (format!("{prefix}.down_proj"), Pick::All),
        "ffn_gate_exps.bias" => (format!("{prefix}.gate_up_proj_bias"), Pick::Even),
        "ffn_up_exps.bias" => (format!("{prefix}.gate_up_proj_bias"), Pick::Odd),
        _ => return Ok(None),
    };
    let bias = leaf.ends_with(".bias");
    if !bias && let Some(t) = hf_mxfp4(src, &hf, kind, shape)? {
        return Ok(Some(t));
    }
    src.hf_view(&hf, |dtype, have, bytes| {
        let (ty, size) = match dtype {
            safetensors::Dtype::F32 => (GgmlType::F32, 4),
            safetensors::Dtype::BF16 => (GgmlType::BF16, 2),
            safetensors::Dtype::F16 => (GgmlType::F16, 2),
            other => {
                return Err(ModelError::Format(format!(
                    "tensor '{hf}': unsupported dtype {other:?}"
                )));
            }
        };
        // The stored tensor as [E, rows, cols] (a bias: [E, 1, 2 ff]).
        let (e, rows, cols) = match (bias, have) {
            (true, &[e, c]) => (e, 1, c),
            (false, &[e, r, c]) => (e, r, c),
            _ => return Err(shape_mismatch(&hf, shape, have)),
        };
        // Its columns picked, then (matrices) each expert transposed: [E, cols', rows].
        let (step, first) = match kind {
            Pick::Even => (2, 0),
            Pick::Odd => (2, 1),
            Pick::All => (1, 0),
        };
        let picked = cols / step;
        let want: Vec<usize> = match bias {
            true => vec![e, picked],
            false => vec![e, picked, rows],
        };
        if want != shape || !cols.is_multiple_of(step) {
            return Err(shape_mismatch(&hf, shape, have));
        }
        let mut out = Vec::with_capacity(e * picked * rows * size);
        for x in 0..e {
            for j in 0..picked {
                let col = first + j * step;
                for r in 0..rows {
                    let at = ((x * rows + r) * cols + col) * size;
                    out.extend_from_slice(&bytes[at..at + size]);
                }
            }
        }
        let t = HostTensor::raw(shape.to_vec(), ty, out)
            .map_err(|err| ModelError::Format(format!("tensor '{hf}': {err}")))?;
        Ok(if ty == GgmlType::F32 {
            t.into_f32()?
        } else {
            t
        })
    })
}

/// The released checkpoints' MXFP4 experts (`{hf}_blocks` `[E, rows, cols/32, 16]`, two
/// E2M1 codes a byte with element `2j` in the low nibble; `{hf}_scales` `[E, rows, cols/32]`,
/// E8M0), already `[out, in]`: the rows picked (gate/up interleaved) into ggml's MXFP4
/// blocks (the scale byte, then element `j` in the low nibble and `j + 16` in the high
/// nibble of byte `j`), as llama.cpp's converter repacks them. `None`: not stored so.
fn hf_mxfp4(
    src: &SafetensorsSource,
    hf: &str,
    kind: Pick,
    shape: &[usize],
) -> Result<Option<HostTensor>, ModelError> {
    let (blocks, scales) = (format!("{hf}_blocks"), format!("{hf}_scales"));
    let u8s = |name: &str, dtype: safetensors::Dtype| match dtype {
        safetensors::Dtype::U8 => Ok(()),
        other => Err(ModelError::Format(format!(
            "tensor '{name}': dtype {other:?}, expected U8 (MXFP4)"
        ))),
    };
    let Some((sc_shape, sc)) = src.hf_view(&scales, |dtype, have, bytes| {
        u8s(&scales, dtype)?;
        Ok((have.to_vec(), bytes.to_vec()))
    })?
    else {
        return Ok(None);
    };
    let made = src.hf_view(&blocks, |dtype, have, bytes| {
        u8s(&blocks, dtype)?;
        let &[e, rows, nb, 16] = have else {
            return Err(shape_mismatch(&blocks, shape, have));
        };
        let (step, first) = match kind {
            Pick::Even => (2, 0),
            Pick::Odd => (2, 1),
            Pick::All => (1, 0),
        };
        if sc_shape != [e, rows, nb] || !rows.is_multiple_of(step) {
            return Err(shape_mismatch(&scales, &[e, rows, nb], &sc_shape));
        }
        let out_rows = rows / step;
        if shape != [e, out_rows, nb * 32] {
            return Err(shape_mismatch(&blocks, shape, have));
        }
        let mut out = Vec::with_capacity(e * out_rows * nb * 17);
        for x in 0..e {
            for j in 0..out_rows {
                let r = first + j * step;
                for k in 0..nb {
                    let at = (x * rows + r) * nb + k;
                    let b = &bytes[at * 16..at * 16 + 16];
                    let code = |m: usize| (b[m / 2] >> (4 * (m % 2))) & 15;
                    out.push(sc[at]);
                    out.extend((0..16).map(|i| code(i) | (code(i + 16) << 4)));
                }
            }
        }
        HostTensor::raw(shape.to_vec(), GgmlType::Mxfp4, out)
            .map_err(|err| ModelError::Format(format!("tensor '{blocks}': {err}")))
    })?;
    match made {
        Some(t) => Ok(Some(t)),
        None => Err(ModelError::Missing(blocks)),
    }
}

#[derive(Clone, Copy)]
enum Pick {
    Even,
    Odd,
    All,
}

fn shape_mismatch(hf: &str, want: &[usize], got: &[usize]) -> ModelError {
    ModelError::Shape(format!(
        "tensor '{hf}': does not hold gpt-oss experts of shape {want:?} (file has {got:?})"
    ))
}
