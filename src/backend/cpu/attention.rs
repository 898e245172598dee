//! Paged varlen attention on the CPU: every token of the batch (prefill chunk or decode)
//! attends causally over its own sequence's cached context.
//!
//! For one token at position `pos` and one KV head, the query heads of its GQA group are
//! processed together so each cached key and value is read once:
//! ```text
//! scores[j][p] = q[g*group + j] . K[slot(p), g] * scale      p in 0..=pos
//! out[g*group + j] = sum_p softmax_p(scores[j])[p] * V[slot(p), g]
//! slot(p) = block_table[p / block_size] * block_size + p % block_size
//! ```

use rayon::prelude::*;

use super::ops::{dot, exp_in_place, matmul};
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

/// Visits the cache slots of positions `0..n` in order, a block at a time.
#[inline]
fn for_each_slot(table: &[u32], bs: usize, n: usize, mut f: impl FnMut(usize, usize)) {
    let mut p = 0;
    for &b in table {
        if p >= n {
            break;
        }
        let base = b as usize * bs;
        for o in 0..bs.min(n - p) {
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
    let scale = 1.0 / (hd as f32).sqrt();
    let n = pos + 1;
    scores.resize(group * n, 0.0);
    out.fill(0.0);
    for kvh in 0..g.n_kv_heads {
        let qg = &q[kvh * group * hd..(kvh + 1) * group * hd];
        for_each_slot(block_table, bs, n, |p, slot| {
            let k = &k_cache[slot * w + kvh * hd..slot * w + (kvh + 1) * hd];
            for j in 0..group {
                scores[j * n + p] = dot(&qg[j * hd..(j + 1) * hd], k) * scale;
            }
        });
        let mut inv_sums = [0.0f32; 64];
        for j in 0..group {
            let s = &mut scores[j * n..(j + 1) * n];
            let max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            s.iter_mut().for_each(|x| *x -= max);
            exp_in_place(s);
            inv_sums[j % 64] = 1.0 / s.iter().sum::<f32>();
        }
        let og = &mut out[kvh * group * hd..(kvh + 1) * group * hd];
        for_each_slot(block_table, bs, n, |p, slot| {
            let v = &v_cache[slot * w + kvh * hd..slot * w + (kvh + 1) * hd];
            for j in 0..group {
                let pw = scores[j * n + p];
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

/// A prefill chunk's tile for one KV head, with GEMMs:
/// `S = Q K^T * scale` (causal mask), row softmax, `O = P V`. Returns `[rows, group * hd]`.
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
    let ctx = plan.positions[rows.end - 1] as usize + 1;
    let (t, qr) = (rows.len(), rows.len() * group);
    // Q: [t * group, hd]; K: [ctx, hd]; Vt: [hd, ctx].
    let mut q = Vec::with_capacity(qr * hd);
    for r in rows.clone() {
        let base = r * g.qkv_stride + kvh * group * hd;
        q.extend_from_slice(&qkv[base..base + group * hd]);
    }
    let mut k = vec![0.0f32; ctx * hd];
    let mut vt = vec![0.0f32; hd * ctx];
    for_each_slot(&s.block_table, bs, ctx, |p, slot| {
        let off = slot * w + kvh * hd;
        k[p * hd..(p + 1) * hd].copy_from_slice(&k_cache[off..off + hd]);
        for (d, &v) in v_cache[off..off + hd].iter().enumerate() {
            vt[d * ctx + p] = v;
        }
    });
    let mut scores = vec![0.0f32; qr * ctx];
    matmul(&q, &k, None, qr, hd, ctx, &mut scores);
    let scale = 1.0 / (hd as f32).sqrt();
    for (i, r) in rows.clone().enumerate() {
        let visible = plan.positions[r] as usize + 1;
        for j in 0..group {
            let row = &mut scores[(i * group + j) * ctx..(i * group + j + 1) * ctx];
            let max = row[..visible]
                .iter()
                .fold(f32::NEG_INFINITY, |m, &x| m.max(x))
                * scale;
            row[..visible]
                .iter_mut()
                .for_each(|x| *x = *x * scale - max);
            exp_in_place(&mut row[..visible]);
            let inv = 1.0 / row[..visible].iter().sum::<f32>();
            row[..visible].iter_mut().for_each(|x| *x *= inv);
            row[visible..].fill(0.0);
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
        .map(|&p| p as usize + 1)
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
