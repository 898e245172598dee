//! Paged varlen attention on the CPU: every token of the batch (prefill chunk or decode)
//! attends causally over its own sequence's cached context (or the last `window` positions
//! of it).
//!
//! For one token at position `pos` and one KV head, the query heads of its GQA group are
//! processed together so each cached key and value is read once:
//! ```text
//! scores[j][p] = cap(q[g*group + j] . K[slot(p), g] * scale)   p in lo..=pos
//! out[g*group + j] = sum_p softmax_p(scores[j])[p] * V[slot(p), g]
//! slot(p) = block_table[p / block_size] * block_size + p % block_size
//! lo = pos + 1 - window (0 without a window), cap(s) = c * tanh(s / c) (identity without)
//! ```
//! With attention sinks (gpt-oss), query head `h`'s logit `sink[h]` joins the softmax's
//! denominator (as it is: neither scaled nor capped) and weights no value:
//! `softmax_p = exp(s_p - m) / (exp(sink[h] - m) + sum_i exp(s_i - m))`, `m` the maximum of
//! the row's logits and the sink.

use rayon::prelude::*;

use super::ops::{dot, exp_in_place, matmul};
use crate::backend::{AttnShape, BatchPlan, KvShape};

/// Work (context positions x heads) below which attention stays on the calling thread.
const PAR_MIN_WORK: usize = 1 << 14;

/// Geometry shared by every token of a call.
pub struct AttnGeom<'a> {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Row stride of the fused qkv tensor.
    pub qkv_stride: usize,
    pub kv: KvShape,
    /// Sliding window (keys per query, itself included).
    pub window: Option<usize>,
    /// Logit soft cap.
    pub softcap: Option<f32>,
    /// Factor applied to `q . k`.
    pub scale: f32,
    /// `[n_heads]` per-head sink logits (gpt-oss); `None`: plain softmax.
    pub sinks: Option<&'a [f32]>,
}

impl<'a> AttnGeom<'a> {
    /// The geometry of `shape` over a qkv tensor of row stride `qkv_stride` and cache `kv`,
    /// with no sinks.
    pub fn new(shape: &AttnShape, qkv_stride: usize, kv: KvShape) -> AttnGeom<'a> {
        AttnGeom {
            n_heads: shape.n_heads,
            n_kv_heads: shape.n_kv_heads,
            head_dim: shape.head_dim,
            qkv_stride,
            kv,
            window: shape.window,
            softcap: shape.softcap,
            scale: shape.score_scale(),
            sinks: None,
        }
    }
    /// Turns one row of query head `head`'s logits into unnormalised softmax weights in
    /// place and returns the reciprocal of their denominator (the head's sink included).
    #[inline]
    fn softmax_weights(&self, head: usize, s: &mut [f32]) -> f32 {
        let sink = self.sinks.map(|k| k[head]);
        let max = s
            .iter()
            .copied()
            .fold(sink.unwrap_or(f32::NEG_INFINITY), f32::max);
        s.iter_mut().for_each(|x| *x -= max);
        exp_in_place(s);
        let sink_mass = sink.map_or(0.0, |k| (k - max).exp());
        1.0 / (s.iter().sum::<f32>() + sink_mass)
    }
    /// The first key position a query at `pos` sees.
    #[inline]
    fn first_visible(&self, pos: usize) -> usize {
        self.window.map_or(0, |w| (pos + 1).saturating_sub(w))
    }
    /// Scales (and soft-caps) raw `q . k` products in place.
    #[inline]
    fn logits(&self, s: &mut [f32]) {
        let scale = self.scale;
        match self.softcap {
            None => s.iter_mut().for_each(|x| *x *= scale),
            Some(c) => s.iter_mut().for_each(|x| *x = c * (*x * scale / c).tanh()),
        }
    }
}

/// Visits the cache slots of positions `lo..n` in order, a block at a time; blocks wholly
/// before `lo` are skipped.
#[inline]
fn for_each_slot(table: &[u32], bs: usize, lo: usize, n: usize, mut f: impl FnMut(usize, usize)) {
    let mut p = lo / bs * bs;
    for &b in table.iter().skip(lo / bs) {
        if p >= n {
            break;
        }
        let base = b as usize * bs;
        for o in lo.max(p) - p..bs.min(n - p) {
            f(p + o, base + o);
        }
        p += bs;
    }
}

/// One token, all heads.
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
    let (lo, end) = (g.first_visible(pos), pos + 1);
    let n = end - lo;
    scores.resize(group * n, 0.0);
    out.fill(0.0);
    for kvh in 0..g.n_kv_heads {
        let qg = &q[kvh * group * hd..(kvh + 1) * group * hd];
        for_each_slot(block_table, bs, lo, end, |p, slot| {
            let k = &k_cache[slot * w + kvh * hd..slot * w + (kvh + 1) * hd];
            for j in 0..group {
                scores[j * n + p - lo] = dot(&qg[j * hd..(j + 1) * hd], k);
            }
        });
        let mut inv_sums = [0.0f32; 64];
        for j in 0..group {
            let s = &mut scores[j * n..(j + 1) * n];
            g.logits(s);
            inv_sums[j % 64] = g.softmax_weights(kvh * group + j, s);
        }
        let og = &mut out[kvh * group * hd..(kvh + 1) * group * hd];
        for_each_slot(block_table, bs, lo, end, |p, slot| {
            let v = &v_cache[slot * w + kvh * hd..slot * w + (kvh + 1) * hd];
            for j in 0..group {
                let pw = scores[j * n + p - lo];
                og[j * hd..(j + 1) * hd]
                    .iter_mut()
                    .zip(v)
                    .for_each(|(o, &vi)| *o += pw * vi);
            }
        });
        for j in 0..group {
            og[j * hd..(j + 1) * hd]
                .iter_mut()
                .for_each(|o| *o *= inv_sums[j % 64]);
        }
    }
}

/// Query tokens per tile of the prefill path.
const TILE: usize = 64;
/// Chunks at least this long take the GEMM path.
const GEMM_MIN_Q: u32 = 4;

/// A prefill chunk's tile for one KV head, with GEMMs over the positions any of its rows
/// sees: `S = cap(Q K^T * scale)` (causal and window mask), row softmax, `O = P V`.
/// Returns `[rows, group * hd]`.
#[allow(clippy::too_many_arguments)]
fn prefill_tile(
    g: &AttnGeom,
    plan: &BatchPlan,
    seq: usize,
    kvh: usize,
    rows: std::ops::Range<usize>,
    qkv: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
) -> Vec<f32> {
    let (hd, bs, w) = (g.head_dim, g.kv.block_size, g.kv.slot_width());
    let group = g.n_heads / g.n_kv_heads;
    let s = &plan.seqs[seq];
    let pos = |r: usize| plan.positions[r] as usize;
    let end = rows.clone().map(|r| pos(r) + 1).max().unwrap_or(0);
    let lo = rows
        .clone()
        .map(|r| g.first_visible(pos(r)))
        .min()
        .unwrap_or(0);
    let ctx = end - lo;
    let (t, qr) = (rows.len(), rows.len() * group);
    // Q: [t * group, hd]; K: [ctx, hd]; Vt: [hd, ctx] (positions lo..end).
    let mut q = Vec::with_capacity(qr * hd);
    for r in rows.clone() {
        let base = r * g.qkv_stride + kvh * group * hd;
        q.extend_from_slice(&qkv[base..base + group * hd]);
    }
    let mut k = vec![0.0f32; ctx * hd];
    let mut vt = vec![0.0f32; hd * ctx];
    for_each_slot(&s.block_table, bs, lo, end, |p, slot| {
        let (off, p) = (slot * w + kvh * hd, p - lo);
        k[p * hd..(p + 1) * hd].copy_from_slice(&k_cache[off..off + hd]);
        for (d, &v) in v_cache[off..off + hd].iter().enumerate() {
            vt[d * ctx + p] = v;
        }
    });
    let mut scores = vec![0.0f32; qr * ctx];
    matmul(&q, &k, None, qr, hd, ctx, &mut scores);
    for (i, r) in rows.clone().enumerate() {
        let seen = g.first_visible(pos(r)) - lo..pos(r) + 1 - lo;
        for j in 0..group {
            let row = &mut scores[(i * group + j) * ctx..(i * group + j + 1) * ctx];
            let vis = &mut row[seen.clone()];
            g.logits(vis);
            let inv = g.softmax_weights(kvh * group + j, vis);
            vis.iter_mut().for_each(|x| *x *= inv);
            row[..seen.start].fill(0.0);
            row[seen.end..].fill(0.0);
        }
    }
    let mut out = vec![0.0f32; t * group * hd];
    matmul(&scores, &vt, None, qr, ctx, hd, &mut out);
    out
}

/// Attention for every row of the batch. `row_seq[t]` is the sequence owning row `t`.
/// Decode tokens and short chunks go token by token; longer prefill chunks go by GEMM tiles.
pub fn attention(
    g: &AttnGeom,
    plan: &BatchPlan,
    row_seq: &[u32],
    qkv: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    out: &mut [f32],
) {
    assert!(g.n_heads / g.n_kv_heads <= 64, "GQA group larger than 64");
    let n = plan.num_tokens();
    let q_dim = g.n_heads * g.head_dim;
    let out = &mut out[..n * q_dim];
    let gemm_row = |t: usize| plan.seqs[row_seq[t] as usize].q_len >= GEMM_MIN_Q;
    let work: usize = plan
        .positions
        .iter()
        .map(|&p| p as usize + 1 - g.first_visible(p as usize))
        .sum::<usize>()
        * g.n_heads;
    let run = |(t, o): (usize, &mut [f32]), scores: &mut Vec<f32>| {
        if gemm_row(t) {
            return;
        }
        let s = &plan.seqs[row_seq[t] as usize];
        let q = &qkv[t * g.qkv_stride..t * g.qkv_stride + q_dim];
        attend_token(
            g,
            q,
            k_cache,
            v_cache,
            &s.block_table,
            plan.positions[t] as usize,
            scores,
            o,
        );
    };
    if work >= PAR_MIN_WORK && n > 1 {
        out.par_chunks_mut(q_dim)
            .enumerate()
            .with_max_len(1)
            .for_each_init(Vec::new, |scores, item| run(item, scores));
    } else {
        let mut scores = Vec::new();
        out.chunks_mut(q_dim)
            .enumerate()
            .for_each(|item| run(item, &mut scores));
    }
    let mut tasks = Vec::new();
    for (i, s) in plan
        .seqs
        .iter()
        .enumerate()
        .filter(|(_, s)| s.q_len >= GEMM_MIN_Q)
    {
        let (start, end) = (s.q_start as usize, (s.q_start + s.q_len) as usize);
        for tile in (start..end).step_by(TILE) {
            for kvh in 0..g.n_kv_heads {
                tasks.push((i, kvh, tile..(tile + TILE).min(end)));
            }
        }
    }
    let tile_out = |(i, kvh, rows): &(usize, usize, std::ops::Range<usize>)| {
        prefill_tile(g, plan, *i, *kvh, rows.clone(), qkv, k_cache, v_cache)
    };
    let results: Vec<Vec<f32>> = if tasks.len() > 1 && work >= PAR_MIN_WORK {
        tasks.par_iter().with_max_len(1).map(tile_out).collect()
    } else {
        tasks.iter().map(tile_out).collect()
    };
    let gw = g.n_heads / g.n_kv_heads * g.head_dim;
    for ((_, kvh, rows), res) in tasks.iter().zip(results) {
        for (i, r) in rows.clone().enumerate() {
            out[r * q_dim + kvh * gw..r * q_dim + (kvh + 1) * gw]
                .copy_from_slice(&res[i * gw..(i + 1) * gw]);
        }
    }
}

#[cfg(test)]
mod tests;
