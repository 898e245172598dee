//! Megatron-style tensor-parallel sharding of a model's weights: q/k/v by head (kv heads
//! replicated when there are fewer than shards), gate/up by output rows, o_proj and down by
//! input columns (each followed by an all-reduce in the forward), MoE experts split the same
//! way within every expert, the token embedding by vocabulary (each shard looks up its own
//! tokens, zero rows for the rest, and an all-reduce assembles them: one small collective
//! per step for 1/N of the table), the output head by vocabulary too (its logits
//! all-gathered; with tied embeddings it is the embedding's own part). Norms and the
//! router are replicated.
//! Quantized tensors keep their file's type; a column split must fall on block boundaries.

use std::ops::Range;

use crate::backend::quant::GgmlType;
use crate::backend::{HostData, HostTensor};
use crate::model::{ModelError, ModelSpec};

use super::weights::{Ffn, LayerWeights, ModelWeights, SharedFfn};

/// One shard's place in a tensor-parallel group of `size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    pub rank: usize,
    pub size: usize,
}

impl Shard {
    /// The whole model (a group of one).
    pub const WHOLE: Shard = Shard { rank: 0, size: 1 };

    /// This shard's part of `total` split evenly (`total` divisible by the size).
    fn even(&self, total: usize) -> Range<usize> {
        let part = total / self.size;
        self.rank * part..(self.rank + 1) * part
    }

    /// This shard's vocabulary rows: parts of `ceil(vocab / size)`, the last one shorter.
    pub fn vocab(&self, vocab: usize) -> Range<usize> {
        let part = vocab.div_ceil(self.size);
        (self.rank * part).min(vocab)..((self.rank + 1) * part).min(vocab)
    }
}

/// Why `spec` cannot be split `n` ways (heads, kv heads and FFN widths must divide), if so.
pub fn check(spec: &ModelSpec, n: usize) -> Result<(), String> {
    let (h, k) = (spec.n_heads, spec.n_kv_heads);
    if n == 0 {
        return Err("tensor parallel size 0: it must be at least 1".into());
    }
    let why = if !h.is_multiple_of(n) {
        Some(format!("its {h} attention heads"))
    } else if !(k.is_multiple_of(n) || n.is_multiple_of(k)) {
        Some(format!(
            "its {k} kv heads (neither divisible by {n} nor dividing it)"
        ))
    } else if spec.variant.moe.is_none() && !spec.intermediate.is_multiple_of(n) {
        Some(format!("its FFN width {}", spec.intermediate))
    } else {
        spec.variant.moe.and_then(|m| {
            if !m.expert_ff.is_multiple_of(n) {
                Some(format!("its expert FFN width {}", m.expert_ff))
            } else if !m.shared_ff.is_multiple_of(n) {
                Some(format!("its shared expert width {}", m.shared_ff))
            } else {
                None
            }
        })
    };
    match why {
        Some(what) => Err(format!(
            "tensor parallel size {n} does not divide {what} ({} model)",
            spec.arch
        )),
        None => Ok(()),
    }
}

/// Heads per shard and where this shard's kv heads start.
struct Heads {
    q: Range<usize>,
    kv: Range<usize>,
}

fn heads(spec: &ModelSpec, s: Shard) -> Heads {
    let q = s.even(spec.n_heads);
    let group = spec.n_heads / spec.n_kv_heads;
    let n_kv = (spec.n_kv_heads / s.size).max(1);
    let first = q.start / group;
    Heads {
        q,
        kv: first..first + n_kv,
    }
}

/// The spec one shard runs: its heads, FFN width and expert width. `vocab_size` stays the
/// whole vocabulary (the width of the gathered logits).
pub fn shard_spec(spec: &ModelSpec, s: Shard) -> ModelSpec {
    let hd = heads(spec, s);
    let mut out = spec.clone();
    out.n_heads = hd.q.len();
    out.n_kv_heads = hd.kv.len();
    out.intermediate = spec.intermediate / s.size;
    if let Some(m) = &mut out.variant.moe {
        m.expert_ff /= s.size;
        m.shared_ff /= s.size;
    }
    out
}

/// The tensors shard `s` holds of the whole model `w` (loaded for `spec`). Errors name the
/// tensor whose column split falls inside a quantization block.
pub fn shard_weights(
    w: &ModelWeights<HostTensor>,
    spec: &ModelSpec,
    s: Shard,
) -> Result<ModelWeights<HostTensor>, ModelError> {
    if s.size == 1 {
        return Ok(w.clone());
    }
    check(spec, s.size).map_err(ModelError::Spec)?;
    let v = &spec.variant;
    if v.sinks || v.out_bias || v.moe_bias {
        return Err(ModelError::Spec(format!(
            "tensor parallelism of {} (attention sinks, output and expert biases) is not supported yet",
            spec.arch
        )));
    }
    let hd = heads(spec, s);
    let d = spec.head_dim;
    let (q_dim, kv_dim) = (spec.q_dim(), spec.kv_dim());
    let scaled = |r: &Range<usize>, by: usize, at: usize| at + r.start * by..at + r.end * by;
    // The rows of the fused qkv matrix (and the elements of its bias) this shard keeps.
    let qkv_rows = [
        scaled(&hd.q, d, 0),
        scaled(&hd.kv, d, q_dim),
        scaled(&hd.kv, d, q_dim + kv_dim),
    ];
    let q_cols = scaled(&hd.q, d, 0);
    let mut layers = Vec::with_capacity(w.layers.len());
    for (i, l) in w.layers.iter().enumerate() {
        let name = |leaf: &str| format!("blk.{i}.{leaf}");
        let ffn = match &l.ffn {
            Ffn::Dense { w_gate_up, w_down } => {
                let (gate_up, down) = split_glu(
                    w_gate_up,
                    w_down,
                    spec.intermediate,
                    s,
                    &name("ffn_down.weight"),
                )?;
                Ffn::Dense {
                    w_gate_up: gate_up,
                    w_down: down,
                }
            }
            moe @ Ffn::Moe { .. } => shard_moe(moe, spec, s, i)?,
        };
        layers.push(LayerWeights {
            attn_norm: l.attn_norm.clone(),
            wqkv: take_rows(&l.wqkv, &qkv_rows)?,
            bqkv: l
                .bqkv
                .as_ref()
                .map(|b| take_elems(b, &qkv_rows))
                .transpose()?,
            wo: cols(&l.wo, q_cols.clone(), &name("attn_output.weight"))?,
            bo: None,
            sinks: None,
            ffn_norm: l.ffn_norm.clone(),
            ffn,
            q_norm: l.q_norm.clone(),
            k_norm: l.k_norm.clone(),
            post_attn_norm: l.post_attn_norm.clone(),
            post_ffn_norm: l.post_ffn_norm.clone(),
        });
    }
    Ok(ModelWeights {
        embed: rows(&w.embed, s.vocab(spec.vocab_size))?,
        layers,
        norm: w.norm.clone(),
        // Tied: the output head is the embedding's part, the same rows.
        output: match &w.output {
            Some(o) => Some(rows(o, s.vocab(spec.vocab_size))?),
            None => None,
        },
    })
}

/// Shard `s`'s part of layer `layer`'s mixture of experts `ffn` (loaded for `spec`).
fn shard_moe(
    ffn: &Ffn<HostTensor>,
    spec: &ModelSpec,
    s: Shard,
    layer: usize,
) -> Result<Ffn<HostTensor>, ModelError> {
    let Ffn::Moe {
        router,
        gate,
        up,
        down,
        shared,
        ..
    } = ffn
    else {
        unreachable!("shard_moe takes a mixture of experts");
    };
    let name = |leaf: &str| format!("blk.{layer}.{leaf}");
    let m = spec.variant.moe.ok_or_else(|| {
        ModelError::Spec("expert weights without a mixture-of-experts spec".into())
    })?;
    let part = s.even(m.expert_ff);
    let per_expert: Vec<Range<usize>> = (0..m.n_expert)
        .map(|e| e * m.expert_ff + part.start..e * m.expert_ff + part.end)
        .collect();
    Ok(Ffn::Moe {
        router: router.clone(),
        // Each expert's part of the rows, joined into one matrix of the file's type (one
        // host copy), as the unsharded experts are.
        gate: take_rows(gate, &per_expert)?.joined(),
        up: take_rows(up, &per_expert)?.joined(),
        down: cols(down, part, &name("ffn_down_exps.weight"))?,
        // The shared expert splits like a dense FFN; its sigmoid gate row is replicated, so
        // each shard scales its partial sum by the same factor.
        shared: match shared {
            Some(sh) => {
                let (gate_up, down) = split_glu(
                    &sh.gate_up,
                    &sh.down,
                    m.shared_ff,
                    s,
                    &name("ffn_down_shexp.weight"),
                )?;
                Some(SharedFfn {
                    gate_up,
                    down,
                    gate: sh.gate.clone(),
                })
            }
            None => None,
        },
        // Refused above (`shard_weights`): no family with expert biases splits yet.
        router_bias: None,
        bias: None,
    })
}

/// Shard `s`'s part of a gated FFN of width `ff`: the matching rows of the gate and up
/// halves of `gate_up` (`[2 * ff, hidden]`, stacked as `[gate part; up part]`) and the
/// same columns of `down` (`[hidden, ff]`, named `down_name` in errors).
fn split_glu(
    gate_up: &HostTensor,
    down: &HostTensor,
    ff: usize,
    s: Shard,
    down_name: &str,
) -> Result<(HostTensor, HostTensor), ModelError> {
    let part = s.even(ff);
    let rows = [part.clone(), ff + part.start..ff + part.end];
    Ok((take_rows(gate_up, &rows)?, cols(down, part, down_name)?))
}

fn shape_err(what: String) -> ModelError {
    ModelError::Shape(what)
}

/// Rows `r` of a `[rows, cols]` matrix in its own type (shared bytes, no copy, for raw
/// data; a stack keeps the parts the rows fall in).
pub fn rows(t: &HostTensor, r: Range<usize>) -> Result<HostTensor, ModelError> {
    let (n, c) = (t.rows(), t.cols());
    if r.start > r.end || r.end > n {
        return Err(shape_err(format!("rows {r:?} of a {n}-row tensor")));
    }
    let shape = vec![r.len(), c];
    match &t.data {
        HostData::F32(v) => Ok(HostTensor::new(shape, v[r.start * c..r.end * c].to_vec())),
        HostData::Raw { ty, bytes } => {
            let row = ty.byte_size(c as u64)? as usize;
            let part = bytes
                .slice(r.start * row..r.end * row)
                .ok_or_else(|| shape_err(format!("rows {r:?} outside the tensor's bytes")))?;
            Ok(HostTensor {
                shape,
                data: HostData::Raw {
                    ty: *ty,
                    bytes: part,
                },
            })
        }
        HostData::Stacked(parts) => {
            let mut picked = Vec::new();
            let mut at = 0;
            for p in parts {
                let here = at..at + p.rows();
                let (lo, hi) = (r.start.max(here.start), r.end.min(here.end));
                if lo < hi {
                    picked.push(rows(p, lo - at..hi - at)?);
                }
                at = here.end;
            }
            stack(picked, shape)
        }
    }
}

/// The rows of every range in `ranges`, stacked in order.
pub fn take_rows(t: &HostTensor, ranges: &[Range<usize>]) -> Result<HostTensor, ModelError> {
    let parts = ranges
        .iter()
        .map(|r| rows(t, r.clone()))
        .collect::<Result<Vec<_>, _>>()?;
    let n = ranges.iter().map(|r| r.len()).sum();
    stack(parts, vec![n, t.cols()])
}

fn stack(parts: Vec<HostTensor>, shape: Vec<usize>) -> Result<HostTensor, ModelError> {
    let mut parts = parts;
    if parts.len() == 1 {
        return Ok(parts.remove(0));
    }
    let t = HostTensor::concat_rows(parts)?;
    Ok(HostTensor { shape, ..t })
}

/// The elements of every range of a vector (f32), concatenated.
fn take_elems(t: &HostTensor, ranges: &[Range<usize>]) -> Result<HostTensor, ModelError> {
    let v = t.clone().into_f32()?;
    let v = v.values().unwrap_or_default();
    let mut out = Vec::new();
    for r in ranges {
        let part = v
            .get(r.clone())
            .ok_or_else(|| shape_err(format!("elements {r:?} of a {}-vector", v.len())))?;
        out.extend_from_slice(part);
    }
    Ok(HostTensor::new(vec![out.len()], out))
}

/// Columns `c` of every row of a `[rows, cols]` matrix `name`, in its own type; for
/// quantized data both ends must fall on block boundaries (or the split is refused).
pub fn cols(t: &HostTensor, c: Range<usize>, name: &str) -> Result<HostTensor, ModelError> {
    let (n, width) = (t.rows(), t.cols());
    if c.start > c.end || c.end > width {
        return Err(shape_err(format!("{name}: columns {c:?} of {width}")));
    }
    let shape = vec![n, c.len()];
    match &t.data {
        HostData::F32(v) => {
            let mut out = Vec::with_capacity(n * c.len());
            for row in v.chunks_exact(width.max(1)) {
                out.extend_from_slice(&row[c.clone()]);
            }
            Ok(HostTensor::new(shape, out))
        }
        HostData::Raw { ty, bytes } => {
            let block = ty.block_size().unwrap_or(1) as usize;
            if !(c.start.is_multiple_of(block) && c.end.is_multiple_of(block)) {
                return Err(ModelError::Spec(format!(
                    "tensor parallelism: {name} ({}, {width} columns) would split into parts \
                     of {} columns, not a multiple of its {block}-element blocks; use a \
                     tensor parallel size whose parts fall on block boundaries",
                    ty.name(),
                    c.len()
                )));
            }
            let row = ty.byte_size(width as u64)? as usize;
            let (lo, hi) = (block_bytes(*ty, c.start)?, block_bytes(*ty, c.end)?);
            let mut out = Vec::with_capacity(n * (hi - lo));
            for r in 0..n {
                out.extend_from_slice(&bytes[r * row + lo..r * row + hi]);
            }
            Ok(HostTensor::raw(shape, *ty, out)?)
        }
        HostData::Stacked(parts) => {
            let parts = parts
                .iter()
                .map(|p| cols(p, c.clone(), name))
                .collect::<Result<Vec<_>, _>>()?;
            stack(parts, shape)
        }
    }
}

/// Bytes of the first `n` elements of a row of `ty` (`n` on a block boundary).
fn block_bytes(ty: GgmlType, n: usize) -> Result<usize, ModelError> {
    Ok(ty.byte_size(n as u64)? as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::quant::GgmlType;

    fn f32m(rows: usize, cols: usize) -> HostTensor {
        HostTensor::new(
            vec![rows, cols],
            (0..rows * cols).map(|i| i as f32).collect(),
        )
    }

    #[test]
    fn row_and_column_slices_keep_raw_types_and_refuse_partial_blocks() {
        let m = f32m(4, 3);
        assert_eq!(
            rows(&m, 1..3).unwrap().values().unwrap(),
            &[3., 4., 5., 6., 7., 8.]
        );
        assert_eq!(
            cols(&m, 1..2, "m").unwrap().values().unwrap(),
            &[1., 4., 7., 10.]
        );
        let halves: Vec<u8> = (0..8)
            .flat_map(|i| half::f16::from_f32(i as f32).to_le_bytes())
            .collect();
        let h = HostTensor::raw(vec![2, 4], GgmlType::F16, halves).unwrap();
        let c = cols(&h, 2..4, "h").unwrap();
        assert_eq!(c.weight_type(), GgmlType::F16);
        assert_eq!(c.into_f32().unwrap().values().unwrap(), &[2., 3., 6., 7.]);
        let q8 = HostTensor::raw(vec![1, 64], GgmlType::Q8_0, vec![0; 68]).unwrap();
        assert_eq!(
            cols(&q8, 32..64, "q").unwrap().weight_type(),
            GgmlType::Q8_0
        );
        let err = cols(&q8, 16..32, "blk.0.ffn_down.weight")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("blk.0.ffn_down.weight") && err.contains("32"),
            "{err}"
        );
        let mixed =
            HostTensor::concat_rows(vec![h, HostTensor::new(vec![1, 4], vec![9.; 4])]).unwrap();
        let r = rows(&mixed, 1..3).unwrap();
        assert_eq!(r.shape, vec![2, 4]);
        assert_eq!(
            r.into_f32().unwrap().values().unwrap(),
            &[4., 5., 6., 7., 9., 9., 9., 9.]
        );
    }

    #[test]
    fn vocab_parts_cover_the_vocabulary() {
        let parts: Vec<_> = (0..3)
            .map(|rank| Shard { rank, size: 3 }.vocab(10))
            .collect();
        assert_eq!(parts, vec![0..4, 4..8, 8..10]);
    }
}
