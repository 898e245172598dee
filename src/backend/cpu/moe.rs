//! The mixture-of-experts FFN on the CPU: route every row (`moe::route_row`), sort the
//! (token, expert) assignments by expert (counting sort, stable), then per expert with any
//! token: gather its rows, gate/up matmuls against that expert's slice of the stacked
//! weights (in the file's type, through `qmatmul`), the activation (`MoeAct`: SwiGLU or
//! gpt-oss's clamped SwiGLU), down matmul, and a weighted add into each token's output row.
//! With expert biases (gpt-oss) expert `e` computes
//! `y = act(x W_g^T + b_g[e], x W_u^T + b_u[e]) W_d^T + b_d[e]` before its routing weight
//! scales it. A shared expert (Qwen2-MoE) runs over every row and adds its output scaled by
//! the row's sigmoid gate.

use super::qmatmul::{self, QScratch};
use super::{CpuTensor, Kernels, check_cols, ops};
use crate::backend::moe::{MoeBias, MoeExperts, MoeShape, SharedExpert, route_row};
use crate::backend::{BackendError, HostData, HostTensor, quant};

/// Scratch of the MoE op, grown to the largest step seen (kept between calls).
#[derive(Debug, Default)]
pub struct MoeScratch {
    /// `[n * k]` (expert, weight) per assignment, token-major.
    route: Vec<(u32, f32)>,
    /// Assignment indices (`t * k + j`) sorted by expert, then by index.
    order: Vec<u32>,
    /// `[n_expert + 1]` start of each expert's run in `order`.
    starts: Vec<usize>,
    /// `[rows, hidden]` gathered inputs of one expert.
    xs: Vec<f32>,
    /// `[rows, f]` gate products (then the activations) and up products.
    g: Vec<f32>,
    u: Vec<f32>,
    /// `[rows, hidden]` expert outputs.
    y: Vec<f32>,
    /// One expert's gate, up and down bias rows (`[f]`, `[f]`, `[hidden]`).
    bias: [Vec<f32>; 3],
}

/// Rows `e * rows..(e + 1) * rows` of a stacked expert weight, as the matmuls take them.
enum ExpertRows<'a> {
    F32(&'a [f32]),
    Typed(HostTensor),
}

fn expert_rows(w: &HostTensor, e: usize, rows: usize) -> Result<ExpertRows<'_>, BackendError> {
    let cols = w.cols();
    let bad = |why: &str| {
        BackendError::InvalidBatch(format!(
            "expert weight {:?} ({}): {why}",
            w.shape,
            w.type_label()
        ))
    };
    match &w.data {
        HostData::F32(v) => v
            .get(e * rows * cols..(e + 1) * rows * cols)
            .map(ExpertRows::F32)
            .ok_or_else(|| bad("expert out of range")),
        HostData::Raw { ty, bytes } => {
            let rb = ty.byte_size(cols as u64)? as usize;
            let part = bytes
                .slice(e * rows * rb..(e + 1) * rows * rb)
                .ok_or_else(|| bad("expert out of range"))?;
            Ok(ExpertRows::Typed(HostTensor {
                shape: vec![rows, cols],
                data: HostData::Raw {
                    ty: *ty,
                    bytes: part,
                },
            }))
        }
        HostData::Stacked(parts) => {
            // Hugging Face experts arrive one part per expert.
            let p = parts
                .get(e)
                .filter(|p| parts.len() * rows == w.rows() && p.rows() == rows)
                .ok_or_else(|| bad("stacked parts are not one per expert"))?;
            match &p.data {
                HostData::F32(v) => Ok(ExpertRows::F32(v)),
                HostData::Raw { .. } => Ok(ExpertRows::Typed(p.clone())),
                HostData::Stacked(_) => Err(bad("nested stack")),
            }
        }
    }
}

/// Row `e` of a bias `w` (`[n_expert, len]`, f32 or any type the file gives) into `out`.
fn bias_row(w: &HostTensor, e: usize, out: &mut Vec<f32>) -> Result<(), BackendError> {
    out.resize(w.cols(), 0.0);
    match expert_rows(w, e, 1)? {
        ExpertRows::F32(v) => out.copy_from_slice(v),
        ExpertRows::Typed(HostTensor {
            data: HostData::Raw { ty, bytes },
            ..
        }) => quant::dequantize(ty, &bytes, out)?,
        ExpertRows::Typed(t) => {
            return Err(BackendError::InvalidBatch(format!(
                "moe expert bias {:?}: not a row of values",
                t.shape
            )));
        }
    }
    Ok(())
}

/// Adds `b` to every `b.len()`-wide row of `rows`.
fn add_rows(rows: &mut [f32], b: &[f32]) {
    for r in rows.chunks_exact_mut(b.len()) {
        r.iter_mut().zip(b).for_each(|(o, b)| *o += b);
    }
}

/// `out[rows, m] = x[rows, k] @ w^T` for one expert's rows of a stacked weight.
fn expert_matmul(
    kern: &Kernels,
    qs: &mut QScratch,
    x: &[f32],
    w: &HostTensor,
    e: usize,
    (rows, m, k): (usize, usize, usize),
    out: &mut [f32],
) -> Result<(), BackendError> {
    match expert_rows(w, e, m)? {
        ExpertRows::F32(v) => ops::matmul(x, v, None, rows, k, m, out),
        ExpertRows::Typed(t) => qmatmul::matmul(kern, qs, x, &t, rows, out)?,
    }
    Ok(())
}

/// `out[rows, m] = x[rows, k] @ w^T` for a whole weight (f32 or in the file's type).
fn dense_matmul(
    kern: &Kernels,
    qs: &mut QScratch,
    x: &[f32],
    w: &HostTensor,
    rows: usize,
    out: &mut [f32],
) -> Result<(), BackendError> {
    match w.values() {
        Some(v) => ops::matmul(x, v, None, rows, w.cols(), w.rows(), out),
        None => qmatmul::matmul(kern, qs, x, w, rows, out)?,
    }
    Ok(())
}

/// Adds the shared expert's gated output to the first `n` rows of `out`:
/// `out[t] += sigmoid(x[t] · gate) * down(silu(x[t] W_g^T) * (x[t] W_u^T))`.
#[allow(clippy::too_many_arguments)]
fn shared_expert(
    kern: &Kernels,
    qs: &mut QScratch,
    s: &mut MoeScratch,
    x: &CpuTensor,
    sh: &SharedExpert<'_, HostTensor>,
    sf: usize,
    n: usize,
    out: &mut CpuTensor,
) -> Result<(), BackendError> {
    let h = x.cols;
    let gate = sh.gate.values().ok_or_else(|| {
        BackendError::InvalidBatch("moe shared expert gate: not an f32 vector".into())
    })?;
    s.g.resize(n * 2 * sf, 0.0);
    s.u.resize(n * sf, 0.0);
    s.y.resize(n * h, 0.0);
    dense_matmul(kern, qs, &x.data[..n * h], sh.gate_up, n, &mut s.g)?;
    for (gu, a) in s.g.chunks_exact(2 * sf).zip(s.u.chunks_exact_mut(sf)) {
        ops::silu_mul_row(&gu[..sf], &gu[sf..], a);
    }
    dense_matmul(kern, qs, &s.u, sh.down, n, &mut s.y)?;
    for t in 0..n {
        let xt = &x.data[t * h..(t + 1) * h];
        let g = 1.0 / (1.0 + (-ops::dot(xt, gate)).exp());
        out.data[t * h..(t + 1) * h]
            .iter_mut()
            .zip(&s.y[t * h..(t + 1) * h])
            .for_each(|(o, v)| *o += g * v);
    }
    Ok(())
}

/// Checks the operands of [`moe_ffn`] against `shape` and `hidden`.
fn check(
    x: &CpuTensor,
    logits: &CpuTensor,
    w: &MoeExperts<'_, HostTensor>,
    shape: &MoeShape,
    out: &CpuTensor,
) -> Result<(), BackendError> {
    shape.check().map_err(BackendError::InvalidBatch)?;
    let (h, e, f) = (x.cols, shape.n_expert, shape.expert_ff);
    check_cols("moe router logits", logits.cols, e)?;
    check_cols("moe output", out.cols, h)?;
    let biases = w.bias.iter().flat_map(|b: &MoeBias<'_, HostTensor>| {
        [
            ("moe gate expert biases", b.gate, e, f),
            ("moe up expert biases", b.up, e, f),
            ("moe down expert biases", b.down, e, h),
        ]
    });
    for (what, t, rows, cols) in [
        ("moe gate experts", w.gate, e * f, h),
        ("moe up experts", w.up, e * f, h),
        ("moe down experts", w.down, e * h, f),
    ]
    .into_iter()
    .chain(biases)
    {
        if t.shape != [rows, cols] {
            return Err(BackendError::InvalidBatch(format!(
                "{what}: shape {:?}, expected [{rows}, {cols}]",
                t.shape
            )));
        }
    }
    let sf = shape.shared_ff;
    match &w.shared {
        None if sf == 0 => Ok(()),
        Some(sh) if sf > 0 => {
            for (what, t, want) in [
                ("moe shared gate/up", sh.gate_up, vec![2 * sf, h]),
                ("moe shared down", sh.down, vec![h, sf]),
                ("moe shared gate", sh.gate, vec![h]),
            ] {
                if t.shape != want {
                    return Err(BackendError::InvalidBatch(format!(
                        "{what}: shape {:?}, expected {want:?}",
                        t.shape
                    )));
                }
            }
            Ok(())
        }
        _ => Err(BackendError::InvalidBatch(format!(
            "moe shared expert: width {sf} and weights {} disagree",
            if w.shared.is_some() {
                "given"
            } else {
                "absent"
            }
        ))),
    }
}

/// The MoE FFN of `n` rows (see `Backend::moe_ffn`).
#[allow(clippy::too_many_arguments)]
pub fn moe_ffn(
    kern: &Kernels,
    qs: &mut QScratch,
    s: &mut MoeScratch,
    x: &CpuTensor,
    logits: &CpuTensor,
    w: MoeExperts<'_, HostTensor>,
    shape: &MoeShape,
    n: usize,
    out: &mut CpuTensor,
) -> Result<(), BackendError> {
    check(x, logits, &w, shape, out)?;
    let (h, ne, f, k) = (x.cols, shape.n_expert, shape.expert_ff, shape.top_k);
    s.route.resize(n * k, (0, 0.0));
    for (t, r) in s.route.chunks_exact_mut(k).enumerate() {
        route_row(&logits.data[t * ne..(t + 1) * ne], k, shape.norm_topk, r);
    }
    // Counting sort of the assignments by expert (stable: token order within an expert).
    s.starts.clear();
    s.starts.resize(ne + 1, 0);
    for &(e, _) in &s.route {
        s.starts[e as usize + 1] += 1;
    }
    for e in 0..ne {
        s.starts[e + 1] += s.starts[e];
    }
    s.order.resize(n * k, 0);
    let mut next = s.starts.clone();
    for (a, &(e, _)) in s.route.iter().enumerate() {
        s.order[next[e as usize]] = a as u32;
        next[e as usize] += 1;
    }
    out.data[..n * h].fill(0.0);
    for e in 0..ne {
        let run = s.starts[e]..s.starts[e + 1];
        let rows = run.len();
        if rows == 0 {
            continue;
        }
        s.xs.resize(rows * h, 0.0);
        for (i, &a) in s.order[run.clone()].iter().enumerate() {
            let t = a as usize / k;
            s.xs[i * h..(i + 1) * h].copy_from_slice(&x.data[t * h..(t + 1) * h]);
        }
        s.g.resize(rows * f, 0.0);
        s.u.resize(rows * f, 0.0);
        s.y.resize(rows * h, 0.0);
        expert_matmul(kern, qs, &s.xs, w.gate, e, (rows, f, h), &mut s.g)?;
        expert_matmul(kern, qs, &s.xs, w.up, e, (rows, f, h), &mut s.u)?;
        if let Some(b) = &w.bias {
            let [bg, bu, bd] = &mut s.bias;
            bias_row(b.gate, e, bg)?;
            bias_row(b.up, e, bu)?;
            bias_row(b.down, e, bd)?;
            add_rows(&mut s.g, bg);
            add_rows(&mut s.u, bu);
        }
        // act(g, u) in place (SwiGLU as `ops::silu_mul_row` computes it).
        let act = shape.act;
        for (g, &u) in s.g.iter_mut().zip(&s.u) {
            *g = act.apply(*g, u);
        }
        expert_matmul(kern, qs, &s.g, w.down, e, (rows, h, f), &mut s.y)?;
        if w.bias.is_some() {
            add_rows(&mut s.y, &s.bias[2]);
        }
        for (i, &a) in s.order[run].iter().enumerate() {
            let (t, wt) = (a as usize / k, s.route[a as usize].1);
            let y = &s.y[i * h..(i + 1) * h];
            out.data[t * h..(t + 1) * h]
                .iter_mut()
                .zip(y)
                .for_each(|(o, v)| *o += wt * v);
        }
    }
    if let Some(sh) = &w.shared {
        shared_expert(kern, qs, s, x, sh, shape.shared_ff, n, out)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
