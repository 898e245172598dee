//! Paged varlen attention on the CPU: every token of the batch (prefill chunk or decode)
//! attends causally over its own sequence's cached context.

use rayon::prelude::*;

use super::ops::dot;
use crate::backend::{BatchPlan, KvShape};

/// Work (context positions x heads) below which attention stays on the calling thread.
const PAR_MIN_WORK: usize = 1 << 14;

/// Geometry shared by every token of a call.
pub struct AttnGeom {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Row stride of the fused qkv tensor.
    pub qkv_stride: usize,
    pub kv: KvShape,
}

/// One token: `out[h] = softmax(q_h . K[0..=pos] * scale) @ V[0..=pos]` over the paged cache.
#[allow(clippy::too_many_arguments)]
fn attend_token(
    g: &AttnGeom,
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    block_table: &[u32],
    pos: usize,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let (hd, bs, w) = (g.head_dim, g.kv.block_size, g.kv.slot_width());
    let group = g.n_heads / g.n_kv_heads;
    let scale = 1.0 / (hd as f32).sqrt();
    let slot = |p: usize| block_table[p / bs] as usize * bs + p % bs;
    scores.resize(pos + 1, 0.0);
    for h in 0..g.n_heads {
        let kvh = h / group;
        let qh = &q[h * hd..(h + 1) * hd];
        let mut max = f32::NEG_INFINITY;
        for (p, s) in scores.iter_mut().enumerate() {
            let off = slot(p) * w + kvh * hd;
            *s = dot(qh, &k_cache[off..off + hd]) * scale;
            max = max.max(*s);
        }
        let mut sum = 0.0;
        for s in scores.iter_mut() {
            *s = (*s - max).exp();
            sum += *s;
        }
        let o = &mut out[h * hd..(h + 1) * hd];
        o.fill(0.0);
        for (p, &s) in scores.iter().enumerate() {
            let off = slot(p) * w + kvh * hd;
            let pw = s / sum;
            for (oi, &vi) in o.iter_mut().zip(&v_cache[off..off + hd]) {
                *oi += pw * vi;
            }
        }
    }
}

/// Attention for every row of the batch. `row_seq[t]` is the sequence owning row `t`.
pub fn attention(
    g: &AttnGeom,
    plan: &BatchPlan,
    row_seq: &[u32],
    qkv: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    out: &mut [f32],
) {
    let n = plan.num_tokens();
    let q_dim = g.n_heads * g.head_dim;
    let out = &mut out[..n * q_dim];
    let work: usize = plan.positions.iter().map(|&p| p as usize + 1).sum::<usize>() * g.n_heads;
    let run = |(t, o): (usize, &mut [f32]), scores: &mut Vec<f32>| {
        let s = &plan.seqs[row_seq[t] as usize];
        let q = &qkv[t * g.qkv_stride..t * g.qkv_stride + q_dim];
        attend_token(g, q, k_cache, v_cache, &s.block_table, plan.positions[t] as usize, scores, o);
    };
    if work >= PAR_MIN_WORK && n > 1 {
        out.par_chunks_mut(q_dim).enumerate().for_each_init(Vec::new, |scores, item| run(item, scores));
    } else {
        let mut scores = Vec::new();
        out.chunks_mut(q_dim).enumerate().for_each(|item| run(item, &mut scores));
    }
}
