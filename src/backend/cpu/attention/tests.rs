//! The paged attention against a naive per-query reference: windows (wider and narrower than
//! a block, chunks starting mid-sequence), soft caps and scales, GQA, both the token path and
//! the GEMM tile path; attention sinks (gpt-oss) on both paths, with windows, soft caps and
//! GQA 4:1, from sinks that take most of the mass to sinks that take none.

use super::*;
use crate::backend::HostTensor;
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

/// Attention of one query head over positions of its sequence, the textbook way, with the
/// head's sink logit (if any) in the softmax denominator. Returns the output and the share
/// of the softmax mass the sink took.
fn naive(
    g: &AttnGeom,
    s: &SeqSlice,
    pos: usize,
    q: &[f32],
    kvh: usize,
    sink: Option<f32>,
    (k, v): (&[f32], &[f32]),
) -> (Vec<f32>, f64) {
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
    // The sink as one more logit column that weights no value.
    let sink = sink.map(f64::from);
    let max = logits
        .iter()
        .copied()
        .chain(sink)
        .fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = logits.iter().map(|l| (l - max).exp()).collect();
    let sink_e = sink.map_or(0.0, |x| (x - max).exp());
    let sum: f64 = e.iter().sum::<f64>() + sink_e;
    let mut out = vec![0.0f64; hd];
    for (&j, p) in seen.iter().zip(&e) {
        let vr = &v[slot(j) * w + kvh * hd..][..hd];
        out.iter_mut()
            .zip(vr)
            .for_each(|(o, x)| *o += p / sum * *x as f64);
    }
    (out.into_iter().map(|x| x as f32).collect(), sink_e / sum)
}

/// A batch over a random cache: a decode token, a short chunk (token path) and two GEMM
/// chunks starting mid-sequence (one longer than a tile).
struct Case {
    shape: AttnShape,
    plan: BatchPlan,
    kv: KvShape,
    row_seq: Vec<u32>,
    qkv: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
}

impl Case {
    fn new(shape: AttnShape) -> Case {
        shape.check().unwrap();
        let plan = plan(&[(149, 1), (40, 3), (57, 70), (0, 33)], 128);
        let kv = KvShape {
            num_layers: 1,
            num_blocks: 128,
            block_size: 8,
            n_kv_heads: shape.n_kv_heads,
            head_dim: shape.head_dim,
        };
        let row_seq = plan
            .seqs
            .iter()
            .enumerate()
            .flat_map(|(i, s)| std::iter::repeat_n(i as u32, s.q_len as usize))
            .collect();
        let qkv = noise(plan.num_tokens() * shape.qkv_dim(), 1);
        // Larger keys make the logits spread (and the soft cap bite).
        let k = noise(kv.num_slots() * kv.slot_width(), 2)
            .iter()
            .map(|x| x * 6.0)
            .collect();
        let v = noise(kv.num_slots() * kv.slot_width(), 3);
        Case {
            shape,
            plan,
            kv,
            row_seq,
            qkv,
            k,
            v,
        }
    }

    fn geom<'a>(&self, sinks: Option<&'a [f32]>) -> AttnGeom<'a> {
        AttnGeom {
            sinks,
            ..AttnGeom::new(&self.shape, self.shape.qkv_dim(), self.kv)
        }
    }

    /// The kernel's output, `[n, q_dim]`.
    fn run(&self, sinks: Option<&[f32]>) -> Vec<f32> {
        let mut out = vec![0.0f32; self.plan.num_tokens() * self.shape.q_dim()];
        let (p, g) = (&self.plan, self.geom(sinks));
        attention(&g, p, &self.row_seq, &self.qkv, &self.k, &self.v, &mut out);
        out
    }

    /// Checks `out` against [`naive`] (within `1e-4` of the values' mass, the sink's share
    /// left out) and returns the smallest share the sink took.
    fn check(&self, sinks: Option<&[f32]>, out: &[f32]) -> f64 {
        let (shape, g) = (&self.shape, self.geom(sinks));
        let (hd, group) = (shape.head_dim, shape.n_heads / shape.n_kv_heads);
        let mut least_share = f64::INFINITY;
        for t in 0..self.plan.num_tokens() {
            let s = &self.plan.seqs[self.row_seq[t] as usize];
            let pos = self.plan.positions[t] as usize;
            for h in 0..shape.n_heads {
                let q = &self.qkv[t * shape.qkv_dim() + h * hd..][..hd];
                let sink = sinks.map(|k| k[h]);
                let (want, share) = naive(&g, s, pos, q, h / group, sink, (&self.k, &self.v));
                least_share = least_share.min(share);
                let tol = 1e-4 * (1.0 - share).max(1e-4) as f32;
                let got = &out[t * shape.q_dim() + h * hd..][..hd];
                for (a, b) in got.iter().zip(&want) {
                    assert!(
                        (a - b).abs() < tol,
                        "{shape:?} sinks {sinks:?} row {t} (position {pos}) head {h}: \
                         {got:?} vs {want:?}"
                    );
                }
            }
        }
        least_share
    }
}

/// GQA 4:1 (8 query heads over 2 KV heads).
fn gqa4(window: Option<usize>, softcap: Option<f32>) -> Case {
    Case::new(AttnShape {
        window,
        softcap,
        ..AttnShape::new(8, 2, 16)
    })
}

/// Per-head sinks `base + spread * noise`.
fn sinks(n: usize, base: f32, spread: f32) -> Vec<f32> {
    noise(n, 9).iter().map(|x| base + spread * x).collect()
}

/// The largest difference between two outputs.
fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn check(window: Option<usize>, softcap: Option<f32>, scale: Option<f32>) {
    let c = Case::new(AttnShape {
        window,
        softcap,
        scale,
        ..AttnShape::new(4, 2, 16)
    });
    c.check(None, &c.run(None));
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

#[test]
fn sinks_match_reference() {
    // Windows shorter than a block and than most contexts, none, and one with a soft cap
    // (the cap applies to the scores, not to the sink).
    for (window, softcap) in [
        (None, None),
        (Some(5), None),
        (Some(40), None),
        (Some(20), Some(5.0)),
    ] {
        let c = gqa4(window, softcap);
        let k = sinks(8, 0.0, 3.0);
        let out = c.run(Some(&k));
        c.check(Some(&k), &out);
        // The sinks mattered: the output is not plain attention's.
        let plain = c.run(None);
        assert!(
            max_diff(&out, &plain) > 1e-2,
            "window {window:?} cap {softcap:?}: sinks changed nothing"
        );
    }
}

#[test]
fn a_dominant_sink_takes_most_of_the_mass() {
    for window in [None, Some(5)] {
        let c = gqa4(window, None);
        let k = sinks(8, 10.0, 1.0);
        let least = c.check(Some(&k), &c.run(Some(&k)));
        assert!(
            least > 0.5,
            "window {window:?}: the sink took only {least} of a row's mass"
        );
    }
}

#[test]
fn very_negative_sinks_change_nothing() {
    for window in [None, Some(5)] {
        let c = gqa4(window, None);
        let plain = c.run(None);
        for base in [-200.0, -1e30, f32::NEG_INFINITY] {
            let out = c.run(Some(&[base; 8]));
            let d = max_diff(&out, &plain);
            assert!(
                d <= 1e-6,
                "window {window:?} sinks {base}: {d} from plain attention"
            );
        }
    }
}

#[test]
fn a_huge_sink_leaves_finite_zeros() {
    // The row maximum includes the sink: exp(sink - max) cannot overflow.
    let c = gqa4(Some(40), None);
    let out = c.run(Some(&[1e4; 8]));
    assert!(out.iter().all(|x| x.abs() < 1e-30), "{:?}", &out[..16]);
}

#[test]
fn the_backend_checks_the_sink_weight() {
    use crate::backend::Backend;
    use crate::backend::cpu::{CpuBackend, CpuBatch, CpuKv, CpuTensor};
    let c = gqa4(Some(20), None);
    let n = c.plan.num_tokens();
    let mut b = CpuBackend::new();
    let kv = CpuKv {
        shape: c.kv,
        k: vec![c.k.clone()],
        v: vec![c.v.clone()],
    };
    let batch = CpuBatch {
        plan: c.plan.clone(),
        row_seq: c.row_seq.clone(),
        logits_rows: Vec::new(),
    };
    let qkv = CpuTensor {
        data: c.qkv.clone(),
        cols: c.shape.qkv_dim(),
    };
    let mut out = b.alloc(n, c.shape.q_dim()).unwrap();
    let k = sinks(8, 0.0, 3.0);
    let w = HostTensor::new(vec![8], k.clone());
    b.attention(&qkv, &kv, 0, &batch, &c.shape, Some(&w), &mut out)
        .unwrap();
    assert_eq!(out.data[..n * c.shape.q_dim()], c.run(Some(&k))[..]);
    let mut nan = k.clone();
    nan[3] = f32::NAN;
    let mut inf = k.clone();
    inf[5] = f32::INFINITY;
    for bad in [
        HostTensor::new(vec![7], k[..7].to_vec()),
        HostTensor::new(vec![2, 4], k.clone()),
        HostTensor::new(vec![8], nan),
        HostTensor::new(vec![8], inf),
    ] {
        let r = b.attention(&qkv, &kv, 0, &batch, &c.shape, Some(&bad), &mut out);
        assert!(
            matches!(r, Err(crate::backend::BackendError::InvalidBatch(_))),
            "sinks {:?} {:?}: {r:?}",
            bad.shape,
            bad.values()
        );
    }
}
