//! The paged attention against a naive per-query reference: windows (wider and narrower than
//! a block, chunks starting mid-sequence), soft caps and scales, GQA, both the token path and
//! the GEMM tile path.

use super::*;
use crate::backend::SeqSlice;

/// Deterministic values in [-1, 1).
fn noise(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// A batch of `(computed, q_len)` sequences over shuffled blocks of size 8.
fn plan(seqs: &[(u32, u32)], num_blocks: usize) -> BatchPlan {
    let bs = 8u32;
    let mut next = 0u32;
    let mut plan = BatchPlan {
        block_size: bs,
        ..BatchPlan::default()
    };
    let mut q_start = 0;
    for &(done, q_len) in seqs {
        let ctx = done + q_len;
        let table = (0..ctx.div_ceil(bs))
            .map(|_| {
                next += 1;
                (next * 7) % num_blocks as u32
            })
            .collect();
        plan.seqs.push(SeqSlice {
            q_start,
            q_len,
            ctx_len: ctx,
            block_table: table,
            wants_logits: true,
        });
        plan.token_ids
            .extend(std::iter::repeat_n(0, q_len as usize));
        q_start += q_len;
    }
    plan.fill_positions_and_slots();
    plan
}

/// Attention of one query head over positions of its sequence, the textbook way.
fn naive(
    g: &AttnGeom,
    s: &SeqSlice,
    pos: usize,
    q: &[f32],
    kvh: usize,
    k: &[f32],
    v: &[f32],
) -> Vec<f32> {
    let (hd, bs, w) = (g.head_dim, g.kv.block_size, g.kv.slot_width());
    let slot = |p: usize| s.block_table[p / bs] as usize * bs + p % bs;
    let seen: Vec<usize> = (0..=pos)
        .filter(|&j| g.window.is_none_or(|win| pos - j < win))
        .collect();
    let logits: Vec<f64> = seen
        .iter()
        .map(|&j| {
            let kr = &k[slot(j) * w + kvh * hd..][..hd];
            let d: f64 = q.iter().zip(kr).map(|(a, b)| *a as f64 * *b as f64).sum();
            let l = d * g.scale as f64;
            g.softcap.map_or(l, |c| c as f64 * (l / c as f64).tanh())
        })
        .collect();
    let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = logits.iter().map(|l| (l - max).exp()).collect();
    let sum: f64 = e.iter().sum();
    let mut out = vec![0.0f64; hd];
    for (&j, p) in seen.iter().zip(&e) {
        let vr = &v[slot(j) * w + kvh * hd..][..hd];
        out.iter_mut()
            .zip(vr)
            .for_each(|(o, x)| *o += p / sum * *x as f64);
    }
    out.into_iter().map(|x| x as f32).collect()
}

fn check(window: Option<usize>, softcap: Option<f32>, scale: Option<f32>) {
    let shape = AttnShape {
        window,
        softcap,
        scale,
        ..AttnShape::new(4, 2, 16)
    };
    shape.check().unwrap();
    // A decode token, a short chunk (token path) and two GEMM chunks starting mid-sequence
    // (one longer than a tile).
    let p = plan(&[(149, 1), (40, 3), (57, 70), (0, 33)], 128);
    let kv = KvShape {
        num_layers: 1,
        num_blocks: 128,
        block_size: 8,
        n_kv_heads: 2,
        head_dim: 16,
    };
    let g = AttnGeom::new(&shape, shape.qkv_dim(), kv);
    let n = p.num_tokens();
    let qkv = noise(n * shape.qkv_dim(), 1);
    // Larger keys make the logits spread (and the soft cap bite).
    let k: Vec<f32> = noise(kv.num_slots() * kv.slot_width(), 2)
        .iter()
        .map(|x| x * 6.0)
        .collect();
    let v = noise(kv.num_slots() * kv.slot_width(), 3);
    let row_seq: Vec<u32> = p
        .seqs
        .iter()
        .enumerate()
        .flat_map(|(i, s)| std::iter::repeat_n(i as u32, s.q_len as usize))
        .collect();
    let mut out = vec![0.0f32; n * shape.q_dim()];
    attention(&g, &p, &row_seq, &qkv, &k, &v, &mut out);
    let hd = shape.head_dim;
    for t in 0..n {
        let s = &p.seqs[row_seq[t] as usize];
        for h in 0..shape.n_heads {
            let q = &qkv[t * shape.qkv_dim() + h * hd..][..hd];
            let want = naive(&g, s, p.positions[t] as usize, q, h / 2, &k, &v);
            let got = &out[t * shape.q_dim() + h * hd..][..hd];
            for (a, b) in got.iter().zip(&want) {
                assert!(
                    (a - b).abs() < 1e-4,
                    "{shape:?} row {t} head {h}: {got:?} vs {want:?}"
                );
            }
        }
    }
}

#[test]
fn full_causal_matches_reference() {
    check(None, None, None);
}

#[test]
fn windows_match_reference() {
    // Narrower than a block, a query alone, across block edges, wider than any context.
    for w in [1, 3, 8, 17, 64, 1000] {
        check(Some(w), None, None);
    }
}

#[test]
fn softcap_and_scale_match_reference() {
    check(None, Some(2.0), None);
    check(None, None, Some(0.07));
    check(Some(20), Some(5.0), Some(0.3));
}

#[test]
fn bad_parameters_are_refused() {
    let base = AttnShape::new(4, 2, 16);
    for bad in [
        AttnShape {
            window: Some(0),
            ..base
        },
        AttnShape {
            softcap: Some(0.0),
            ..base
        },
        AttnShape {
            scale: Some(f32::NAN),
            ..base
        },
    ] {
        assert!(bad.check().is_err(), "{bad:?}");
    }
}
