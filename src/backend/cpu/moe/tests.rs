//! The MoE FFN against a naive f64 reference written from gpt-oss's expert formula:
//! `out[t] = sum_j w_j * (act(x W_g^T + b_g, x W_u^T + b_u) W_d^T + b_d)` over the row's top-k
//! experts, with the clamped SwiGLU on both sides of its limit, biases (f32 and bf16), top-k
//! 3 of 6 experts shared by several tokens, and MXFP4 experts through the quantized kernels.

use crate::backend::cpu::{CpuBackend, CpuTensor, Kernels};
use crate::backend::quant::{self, GgmlType};
use crate::backend::{Backend, BackendError, HostTensor, MoeAct, MoeBias, MoeExperts, MoeShape};

/// Deterministic values in [-1, 1).
fn noise(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn scaled(n: usize, seed: u64, s: f32) -> Vec<f32> {
    noise(n, seed).into_iter().map(|x| x * s).collect()
}

const CLAMPED: MoeAct = MoeAct::ClampedSwiglu {
    alpha: 1.702,
    limit: 7.0,
};

/// One layer's operands, all f32: `[ne * f, h]` gate and up, `[ne * h, f]` down, biases
/// `[ne, f]`, `[ne, f]`, `[ne, h]`, `[n, h]` inputs and `[n, ne]` router logits.
struct Layer {
    shape: MoeShape,
    h: usize,
    n: usize,
    w: [Vec<f32>; 3],
    b: [Vec<f32>; 3],
    x: Vec<f32>,
    logits: Vec<f32>,
}

impl Layer {
    /// Weights and biases large enough that the gate and up products often pass the clamp
    /// limit 7 (on both sides).
    fn new(act: MoeAct, n: usize) -> Layer {
        let (ne, k, f, h) = (6, 3, 32, 64);
        let shape = MoeShape {
            n_expert: ne,
            top_k: k,
            expert_ff: f,
            norm_topk: true,
            shared_ff: 0,
            act,
        };
        Layer {
            shape,
            h,
            n,
            w: [
                scaled(ne * f * h, 1, 0.8),
                scaled(ne * f * h, 2, 0.8),
                scaled(ne * h * f, 3, 0.3),
            ],
            b: [
                scaled(ne * f, 4, 4.0),
                scaled(ne * f, 5, 4.0),
                scaled(ne * h, 6, 1.0),
            ],
            x: scaled(n * h, 7, 1.0),
            logits: scaled(n * ne, 8, 2.0),
        }
    }

    /// The gate or up product of token `t` through expert `e` (bias included), in f64.
    fn proj(&self, which: usize, t: usize, e: usize, with_bias: bool) -> Vec<f64> {
        let (f, h) = (self.shape.expert_ff, self.h);
        let x = &self.x[t * h..(t + 1) * h];
        (0..f)
            .map(|i| {
                let row = &self.w[which][(e * f + i) * h..][..h];
                let d: f64 = row.iter().zip(x).map(|(a, b)| *a as f64 * *b as f64).sum();
                d + if with_bias {
                    self.b[which][e * f + i] as f64
                } else {
                    0.0
                }
            })
            .collect()
    }

    /// The row's top-k experts (softmax over all logits, the k largest, renormalised).
    fn route(&self, t: usize) -> Vec<(usize, f64)> {
        let ne = self.shape.n_expert;
        let l: Vec<f64> = self.logits[t * ne..(t + 1) * ne]
            .iter()
            .map(|&x| x as f64)
            .collect();
        let mut idx: Vec<usize> = (0..ne).collect();
        idx.sort_by(|&a, &b| l[b].total_cmp(&l[a]));
        let top = &idx[..self.shape.top_k];
        let max = l.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = top.iter().map(|&e| (l[e] - max).exp()).sum();
        top.iter().map(|&e| (e, (l[e] - max).exp() / z)).collect()
    }

    /// The reference output `[n, h]` and how many gate values passed the limit and up
    /// values passed it above and below.
    fn reference(&self, with_bias: bool) -> (Vec<f32>, [usize; 3]) {
        let (f, h) = (self.shape.expert_ff, self.h);
        let mut out = vec![0.0f64; self.n * h];
        let mut clamped = [0; 3];
        for t in 0..self.n {
            for (e, wt) in self.route(t) {
                let (g, u) = (self.proj(0, t, e, with_bias), self.proj(1, t, e, with_bias));
                let a: Vec<f64> = g
                    .iter()
                    .zip(&u)
                    .map(|(&g, &u)| match self.shape.act {
                        MoeAct::Silu => g / (1.0 + (-g).exp()) * u,
                        MoeAct::ClampedSwiglu { alpha, limit } => {
                            let (alpha, limit) = (alpha as f64, limit as f64);
                            clamped[0] += usize::from(g > limit);
                            clamped[1] += usize::from(u > limit);
                            clamped[2] += usize::from(u < -limit);
                            let g = g.min(limit);
                            let u = u.clamp(-limit, limit);
                            g / (1.0 + (-alpha * g).exp()) * (u + 1.0)
                        }
                    })
                    .collect();
                for (o, d) in out[t * h..(t + 1) * h].iter_mut().enumerate() {
                    let row = &self.w[2][(e * h + o) * f..][..f];
                    let y: f64 = row.iter().zip(&a).map(|(w, a)| *w as f64 * a).sum();
                    let bd = if with_bias {
                        self.b[2][e * h + o] as f64
                    } else {
                        0.0
                    };
                    *d += wt * (y + bd);
                }
            }
        }
        (out.into_iter().map(|x| x as f32).collect(), clamped)
    }

    fn weights(&self) -> [HostTensor; 3] {
        let (ne, f, h) = (self.shape.n_expert, self.shape.expert_ff, self.h);
        let [g, u, d] = self.w.clone();
        [
            HostTensor::new(vec![ne * f, h], g),
            HostTensor::new(vec![ne * f, h], u),
            HostTensor::new(vec![ne * h, f], d),
        ]
    }

    fn biases(&self) -> [HostTensor; 3] {
        let (ne, f, h) = (self.shape.n_expert, self.shape.expert_ff, self.h);
        let [g, u, d] = self.b.clone();
        [
            HostTensor::new(vec![ne, f], g),
            HostTensor::new(vec![ne, f], u),
            HostTensor::new(vec![ne, h], d),
        ]
    }

    /// The backend's output `[n, h]`.
    fn run(
        &self,
        b: &mut CpuBackend,
        w: &[HostTensor; 3],
        bias: Option<&[HostTensor; 3]>,
        shape: &MoeShape,
    ) -> Result<Vec<f32>, BackendError> {
        let (n, h, ne) = (self.n, self.h, self.shape.n_expert);
        let w: Vec<HostTensor> = w
            .iter()
            .map(|w| b.upload_weight(w.clone()))
            .collect::<Result<_, _>>()?;
        let experts = MoeExperts {
            gate: &w[0],
            up: &w[1],
            down: &w[2],
            shared: None,
            bias: bias.map(|[g, u, d]| MoeBias {
                gate: g,
                up: u,
                down: d,
            }),
        };
        let x = CpuTensor {
            data: self.x.clone(),
            cols: h,
        };
        let l = CpuTensor {
            data: self.logits.clone(),
            cols: ne,
        };
        let mut out = CpuTensor {
            data: vec![f32::NAN; n * h],
            cols: h,
        };
        b.moe_ffn(&x, &l, experts, shape, n, &mut out)?;
        Ok(out.data)
    }
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn max_abs(a: &[f32]) -> f32 {
    a.iter().fold(0.0, |m, x| m.max(x.abs()))
}

/// Tokens per expert of a layer's routing (each expert's rows go through one matmul).
fn tokens_per_expert(l: &Layer) -> Vec<usize> {
    let mut c = vec![0; l.shape.n_expert];
    (0..l.n)
        .flat_map(|t| l.route(t))
        .for_each(|(e, _)| c[e] += 1);
    c
}

#[test]
fn clamped_swiglu_with_biases_matches_reference() {
    for n in [1, 9] {
        let l = Layer::new(CLAMPED, n);
        let (want, clamped) = l.reference(true);
        if n == 9 {
            // The clamp bites on every side, and experts serve several tokens at once.
            assert!(clamped.iter().all(|&c| c >= 3), "clamped {clamped:?}");
            assert!(tokens_per_expert(&l).iter().filter(|&&c| c >= 3).count() >= 2);
        }
        let mut b = CpuBackend::new();
        let got = l
            .run(&mut b, &l.weights(), Some(&l.biases()), &l.shape)
            .unwrap();
        let tol = 1e-5 * max_abs(&want).max(1.0);
        let d = max_diff(&got, &want);
        assert!(d < tol, "{n} rows: {d} off (tolerance {tol})");
        // The clamp and the biases matter: without either the output is far off.
        let loose = MoeShape {
            act: MoeAct::ClampedSwiglu {
                alpha: 1.702,
                limit: 1e9,
            },
            ..l.shape
        };
        let unclamped = l
            .run(&mut b, &l.weights(), Some(&l.biases()), &loose)
            .unwrap();
        let unbiased = l.run(&mut b, &l.weights(), None, &l.shape).unwrap();
        if clamped.iter().any(|&c| c > 0) {
            assert!(
                max_diff(&unclamped, &want) > 100.0 * tol,
                "{n} rows: the clamp did nothing"
            );
        }
        assert!(
            max_diff(&unbiased, &want) > 100.0 * tol,
            "{n} rows: the biases did nothing"
        );
        assert!(max_diff(&unbiased, &l.reference(false).0) < tol);
    }
}

#[test]
fn silu_with_biases_matches_reference() {
    let l = Layer::new(MoeAct::Silu, 9);
    let want = l.reference(true).0;
    let got = l
        .run(
            &mut CpuBackend::new(),
            &l.weights(),
            Some(&l.biases()),
            &l.shape,
        )
        .unwrap();
    let d = max_diff(&got, &want);
    assert!(d < 1e-5 * max_abs(&want).max(1.0), "{d}");
}

/// `v` in bf16 bytes, each value rounded toward zero to bf16 in place.
fn bf16(v: &mut [f32]) -> Vec<u8> {
    v.iter_mut()
        .flat_map(|x| {
            *x = f32::from_bits(x.to_bits() & 0xFFFF_0000);
            ((x.to_bits() >> 16) as u16).to_le_bytes()
        })
        .collect()
}

#[test]
fn bf16_biases_match_their_f32_values() {
    let mut l = Layer::new(CLAMPED, 9);
    let raw: Vec<HostTensor> = l
        .biases()
        .iter()
        .zip(&mut l.b)
        .map(|(t, v)| HostTensor::raw(t.shape.clone(), GgmlType::BF16, bf16(v)).unwrap())
        .collect();
    let raw: [HostTensor; 3] = raw.try_into().unwrap();
    let mut b = CpuBackend::new();
    let got = l.run(&mut b, &l.weights(), Some(&raw), &l.shape).unwrap();
    let f32s = l
        .run(&mut b, &l.weights(), Some(&l.biases()), &l.shape)
        .unwrap();
    assert_eq!(got, f32s);
}

/// Random MXFP4 rows `[rows, cols]`: block exponents 2^-5..2^-3 (weights up to 1.5) and
/// random nibbles.
fn mxfp4(rows: usize, cols: usize, seed: u64) -> (HostTensor, Vec<f32>) {
    let blocks = rows * cols / 32;
    let r = noise(blocks * 17, seed);
    let bytes: Vec<u8> = r
        .chunks_exact(17)
        .flat_map(|b| {
            let e = 123 + ((b[0] + 1.0) * 1.5) as u8;
            std::iter::once(e).chain(b[1..].iter().map(|x| ((x + 1.0) * 127.99) as u8))
        })
        .collect();
    let mut values = vec![0.0f32; rows * cols];
    quant::dequantize_mxfp4(&bytes, &mut values).unwrap();
    let t = HostTensor::raw(vec![rows, cols], GgmlType::Mxfp4, bytes).unwrap();
    (t, values)
}

#[test]
fn mxfp4_experts_match_their_dequantized_values() {
    let l0 = Layer::new(CLAMPED, 9);
    let (ne, f, h) = (l0.shape.n_expert, l0.shape.expert_ff, l0.h);
    let (g, gv) = mxfp4(ne * f, h, 11);
    let (u, uv) = mxfp4(ne * f, h, 12);
    let (d, dv) = mxfp4(ne * h, f, 13);
    let l = Layer {
        w: [gv, uv, dv],
        ..l0
    };
    let (want, clamped) = l.reference(true);
    assert!(clamped.iter().all(|&c| c >= 3), "clamped {clamped:?}");
    let q = [g, u, d];
    for kernels in [Kernels::PORTABLE, Kernels::detect()] {
        let mut b = CpuBackend::with_kernels(kernels);
        // The experts stay MXFP4 on upload: the quantized dot kernels multiply them.
        let up = b.upload_weight(q[0].clone()).unwrap();
        assert_eq!(up.weight_type(), GgmlType::Mxfp4);
        let got = l.run(&mut b, &q, Some(&l.biases()), &l.shape).unwrap();
        let dense = l
            .run(&mut b, &l.weights(), Some(&l.biases()), &l.shape)
            .unwrap();
        // The weights are exact; the 8-bit activations (Q8_0, one scale per 32, before
        // gate/up and before down) leave well under 1% of the output's range.
        let scale = max_abs(&want);
        let (dq, df) = (max_diff(&got, &want), max_diff(&dense, &want));
        assert!(df < 1e-5 * scale, "{}: f32 experts {df} off", kernels.name);
        assert!(
            dq < 1e-2 * scale,
            "{}: MXFP4 experts {dq} off ({scale})",
            kernels.name
        );
    }
}

#[test]
fn bad_biases_and_activations_are_refused() {
    let l = Layer::new(CLAMPED, 3);
    let (ne, f, h) = (l.shape.n_expert, l.shape.expert_ff, l.h);
    let mut b = CpuBackend::new();
    let good = l.biases();
    let wrong = [
        [
            HostTensor::new(vec![ne, f + 1], vec![0.0; ne * (f + 1)]),
            good[1].clone(),
            good[2].clone(),
        ],
        [
            good[0].clone(),
            HostTensor::new(vec![ne - 1, f], vec![0.0; (ne - 1) * f]),
            good[2].clone(),
        ],
        [
            good[0].clone(),
            good[1].clone(),
            HostTensor::new(vec![ne, f], vec![0.0; ne * f]),
        ],
        [
            good[0].clone(),
            good[1].clone(),
            HostTensor::new(vec![ne * h], vec![0.0; ne * h]),
        ],
    ];
    for bias in &wrong {
        let r = l.run(&mut b, &l.weights(), Some(bias), &l.shape);
        assert!(matches!(r, Err(BackendError::InvalidBatch(_))), "{r:?}");
    }
    for (alpha, limit) in [(1.702, 0.0), (f32::NAN, 7.0), (1.702, f32::INFINITY)] {
        let s = MoeShape {
            act: MoeAct::ClampedSwiglu { alpha, limit },
            ..l.shape
        };
        let r = l.run(&mut b, &l.weights(), Some(&good), &s);
        assert!(
            matches!(r, Err(BackendError::InvalidBatch(_))),
            "{alpha} {limit}: {r:?}"
        );
    }
}
