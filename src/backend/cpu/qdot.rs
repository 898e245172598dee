//! Dot products of one weight row in its file's type with one activation row: activations
//! quantized to 8 bits per block (Q8_0-style blocks of 32 for Q8_0/Q4_0/MXFP4 weights, Q8_K-style
//! blocks of 256 with 16-element sums for the k-quants) and integer products per block;
//! f16/bf16 rows widened on the fly against f32 activations. The plain-Rust kernels here
//! are the portable path and the reference the vectorized ones are tested against; the
//! kernel table picks the fastest the running CPU supports.

use half::{bf16, f16};

use crate::backend::quant::{GgmlType, MXFP4_VALUES, QK_K, QK32, e8m0_to_f32_half, q4_k_scale_min};

/// 32 activations as `d * qs[i]` (ggml's Q8_0 with an f32 scale).
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub struct BlockQ8_0 {
    pub d: f32,
    pub qs: [i8; QK32],
}

impl BlockQ8_0 {
    pub const ZERO: Self = Self {
        d: 0.0,
        qs: [0; QK32],
    };
}

/// 256 activations as `d * qs[i]` with the sums of each 16 `qs` (ggml's Q8_K).
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; QK_K],
    pub bsums: [i16; QK_K / 16],
}

impl BlockQ8K {
    pub const ZERO: Self = Self {
        d: 0.0,
        qs: [0; QK_K],
        bsums: [0; QK_K / 16],
    };
}

/// A weight row (`w`, in its type's bytes) times an activation row of the matching kind.
pub type DotFn<A> = fn(w: &[u8], a: &[A]) -> f32;
/// A weight row times four activation rows (the weight row is decoded once).
pub type Dot4Fn<A> = fn(w: &[u8], a: [&[A]; 4]) -> [f32; 4];

/// One dot kernel per weight type, all for the same instruction set.
#[derive(Debug, Clone, Copy)]
pub struct Kernels {
    /// `portable`, `avx2` or `avx512`.
    pub name: &'static str,
    /// Activation rows from which a quantized matmul dequantizes weight tiles and runs the
    /// f32 GEMM instead of these kernels (`usize::MAX`: never).
    pub gemm_min_rows: usize,
    pub q8_0: DotFn<BlockQ8_0>,
    pub q4_0: DotFn<BlockQ8_0>,
    pub q4_k: DotFn<BlockQ8K>,
    pub q5_k: DotFn<BlockQ8K>,
    pub q6_k: DotFn<BlockQ8K>,
    pub mxfp4: DotFn<BlockQ8_0>,
    pub f16: DotFn<f32>,
    pub bf16: DotFn<f32>,
    pub q8_0_x4: Dot4Fn<BlockQ8_0>,
    pub q4_0_x4: Dot4Fn<BlockQ8_0>,
    pub q4_k_x4: Dot4Fn<BlockQ8K>,
    pub q5_k_x4: Dot4Fn<BlockQ8K>,
    pub q6_k_x4: Dot4Fn<BlockQ8K>,
    pub mxfp4_x4: Dot4Fn<BlockQ8_0>,
    pub f16_x4: Dot4Fn<f32>,
    pub bf16_x4: Dot4Fn<f32>,
}

/// The four-row form of a one-row kernel: four calls.
macro_rules! four {
    ($name:ident, $one:ident, $act:ty) => {
        fn $name(w: &[u8], a: [&[$act]; 4]) -> [f32; 4] {
            a.map(|a| $one(w, a))
        }
    };
}
four!(dot_q8_0_x4, dot_q8_0, BlockQ8_0);
four!(dot_q4_0_x4, dot_q4_0, BlockQ8_0);
four!(dot_q4_k_x4, dot_q4_k, BlockQ8K);
four!(dot_q5_k_x4, dot_q5_k, BlockQ8K);
four!(dot_q6_k_x4, dot_q6_k, BlockQ8K);
four!(dot_mxfp4_x4, dot_mxfp4, BlockQ8_0);
four!(dot_f16_x4, dot_f16, f32);
four!(dot_bf16_x4, dot_bf16, f32);

impl Kernels {
    /// The plain-Rust kernels (any CPU).
    pub const PORTABLE: Kernels = Kernels {
        name: "portable",
        gemm_min_rows: 32,
        q8_0: dot_q8_0,
        q4_0: dot_q4_0,
        q4_k: dot_q4_k,
        q5_k: dot_q5_k,
        q6_k: dot_q6_k,
        mxfp4: dot_mxfp4,
        f16: dot_f16,
        bf16: dot_bf16,
        q8_0_x4: dot_q8_0_x4,
        q4_0_x4: dot_q4_0_x4,
        q4_k_x4: dot_q4_k_x4,
        q5_k_x4: dot_q5_k_x4,
        q6_k_x4: dot_q6_k_x4,
        mxfp4_x4: dot_mxfp4_x4,
        f16_x4: dot_f16_x4,
        bf16_x4: dot_bf16_x4,
    };
}

/// How a weight type's activations are quantized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActKind {
    /// Blocks of 32 ([`BlockQ8_0`]).
    Q8_0,
    /// Blocks of 256 ([`BlockQ8K`]).
    Q8K,
    /// Plain f32 (f16, bf16 and f32 weights).
    F32,
}

impl ActKind {
    /// The activation kind `ty`'s weights multiply with; `None` for types without kernels.
    pub fn of(ty: GgmlType) -> Option<ActKind> {
        match ty {
            GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Mxfp4 => Some(ActKind::Q8_0),
            GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K => Some(ActKind::Q8K),
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => Some(ActKind::F32),
            GgmlType::Other(_) => None,
        }
    }
}

/// Scale and reciprocal for symmetric 8-bit quantization of values with maximum `amax`.
fn scale_of(amax: f32) -> (f32, f32) {
    let d = amax / 127.0;
    (d, if d > 0.0 { 1.0 / d } else { 0.0 })
}

/// Quantizes `x` (a multiple of 32 long) into `out` (one block per 32 values).
pub fn quantize_q8_0(x: &[f32], out: &mut [BlockQ8_0]) {
    for (xb, b) in x.chunks_exact(QK32).zip(out) {
        let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let (d, id) = scale_of(amax);
        b.d = d;
        for (q, &v) in b.qs.iter_mut().zip(xb) {
            *q = (v * id).round() as i8;
        }
    }
}

/// Quantizes `x` (a multiple of 256 long) into `out` (one block per 256 values).
pub fn quantize_q8_k(x: &[f32], out: &mut [BlockQ8K]) {
    for (xb, b) in x.chunks_exact(QK_K).zip(out) {
        let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let (d, id) = scale_of(amax);
        b.d = d;
        for (q, &v) in b.qs.iter_mut().zip(xb) {
            *q = (v * id).round() as i8;
        }
        for (s, q) in b.bsums.iter_mut().zip(b.qs.chunks_exact(16)) {
            *s = q.iter().map(|&v| i16::from(v)).sum();
        }
    }
}

/// The f16 at `b[at..at + 2]`.
#[inline]
pub fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// Q8_0 weights: blocks of 34 bytes (`d` f16, 32 i8).
pub fn dot_q8_0(w: &[u8], a: &[BlockQ8_0]) -> f32 {
    w.chunks_exact(34)
        .zip(a)
        .map(|(wb, ab)| {
            let s: i32 = wb[2..]
                .iter()
                .zip(&ab.qs)
                .map(|(&q, &x)| i32::from(q as i8) * i32::from(x))
                .sum();
            f16_at(wb, 0) * ab.d * s as f32
        })
        .sum()
}

/// Q4_0 weights: blocks of 18 bytes (`d` f16, 16 bytes: low nibbles are elements 0..16).
pub fn dot_q4_0(w: &[u8], a: &[BlockQ8_0]) -> f32 {
    w.chunks_exact(18)
        .zip(a)
        .map(|(wb, ab)| {
            let (lo, hi) = ab.qs.split_at(16);
            let s: i32 = wb[2..]
                .iter()
                .zip(lo.iter().zip(hi))
                .map(|(&q, (&x0, &x1))| {
                    i32::from((q & 15) as i8 - 8) * i32::from(x0)
                        + i32::from((q >> 4) as i8 - 8) * i32::from(x1)
                })
                .sum();
            f16_at(wb, 0) * ab.d * s as f32
        })
        .sum()
}

/// MXFP4 weights: blocks of 17 bytes (E8M0 exponent `e`, 16 bytes of E2M1 nibbles: low
/// nibbles are elements 0..16). As ggml: the doubled E2M1 integers times the activations'
/// 8-bit integers, summed per block, times `2^(e-128) * d` (the half folded into the scale).
pub fn dot_mxfp4(w: &[u8], a: &[BlockQ8_0]) -> f32 {
    w.chunks_exact(17)
        .zip(a)
        .map(|(wb, ab)| {
            let (lo, hi) = ab.qs.split_at(16);
            let s: i32 = wb[1..]
                .iter()
                .zip(lo.iter().zip(hi))
                .map(|(&q, (&x0, &x1))| {
                    i32::from(MXFP4_VALUES[usize::from(q & 15)]) * i32::from(x0)
                        + i32::from(MXFP4_VALUES[usize::from(q >> 4)]) * i32::from(x1)
                })
                .sum();
            e8m0_to_f32_half(wb[0]) * ab.d * s as f32
        })
        .sum()
}

/// The (scale, min) pairs of a Q4_K/Q5_K block and `sum(min_j * sum(a of sub-block j))`.
#[inline]
pub fn k_scales(scales: &[u8], bsums: &[i16; 16]) -> ([u8; 8], i32) {
    let mut sc = [0u8; 8];
    let mut summ = 0i32;
    for (j, s) in sc.iter_mut().enumerate() {
        let (scale, min) = q4_k_scale_min(j, scales);
        *s = scale;
        summ += i32::from(min) * (i32::from(bsums[2 * j]) + i32::from(bsums[2 * j + 1]));
    }
    (sc, summ)
}

/// Q4_K weights: blocks of 144 bytes (`d`, `dmin`, scales[12], qs[128]).
pub fn dot_q4_k(w: &[u8], a: &[BlockQ8K]) -> f32 {
    w.chunks_exact(144)
        .zip(a)
        .map(|(wb, ab)| {
            let (sc, summ) = k_scales(&wb[4..16], &ab.bsums);
            let mut sumi = 0i32;
            for (g, q) in wb[16..].chunks_exact(32).enumerate() {
                let (a1, a2) = ab.qs[64 * g..64 * g + 64].split_at(32);
                let (mut s1, mut s2) = (0i32, 0i32);
                for l in 0..32 {
                    s1 += i32::from(q[l] & 15) * i32::from(a1[l]);
                    s2 += i32::from(q[l] >> 4) * i32::from(a2[l]);
                }
                sumi += i32::from(sc[2 * g]) * s1 + i32::from(sc[2 * g + 1]) * s2;
            }
            ab.d * (f16_at(wb, 0) * sumi as f32 - f16_at(wb, 2) * summ as f32)
        })
        .sum()
}

/// Q5_K weights: blocks of 176 bytes (`d`, `dmin`, scales[12], qh[32], qs[128]).
pub fn dot_q5_k(w: &[u8], a: &[BlockQ8K]) -> f32 {
    w.chunks_exact(176)
        .zip(a)
        .map(|(wb, ab)| {
            let (sc, summ) = k_scales(&wb[4..16], &ab.bsums);
            let qh = &wb[16..48];
            let mut sumi = 0i32;
            for (g, q) in wb[48..].chunks_exact(32).enumerate() {
                let (a1, a2) = ab.qs[64 * g..64 * g + 64].split_at(32);
                let (mut s1, mut s2) = (0i32, 0i32);
                for l in 0..32 {
                    let h1 = ((qh[l] >> (2 * g)) & 1) << 4;
                    let h2 = ((qh[l] >> (2 * g + 1)) & 1) << 4;
                    s1 += i32::from((q[l] & 15) | h1) * i32::from(a1[l]);
                    s2 += i32::from((q[l] >> 4) | h2) * i32::from(a2[l]);
                }
                sumi += i32::from(sc[2 * g]) * s1 + i32::from(sc[2 * g + 1]) * s2;
            }
            ab.d * (f16_at(wb, 0) * sumi as f32 - f16_at(wb, 2) * summ as f32)
        })
        .sum()
}

/// Q6_K weights: blocks of 210 bytes (ql[128], qh[64], scales[16] i8, `d`).
pub fn dot_q6_k(w: &[u8], a: &[BlockQ8K]) -> f32 {
    w.chunks_exact(210)
        .zip(a)
        .map(|(wb, ab)| {
            let (ql, qh, scales) = (&wb[..128], &wb[128..192], &wb[192..208]);
            // Per 16-element sub-block: sum(q * a) with q in 0..64, then the -32 via bsums.
            let mut isum = [0i32; 16];
            for h in 0..2 {
                let (ql, qh, x) = (&ql[64 * h..], &qh[32 * h..], &ab.qs[128 * h..]);
                for l in 0..32 {
                    let q = [
                        (ql[l] & 15) | ((qh[l] & 3) << 4),
                        (ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4),
                        (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4),
                        (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4),
                    ];
                    for (k, &q) in q.iter().enumerate() {
                        let e = l + 32 * k;
                        isum[8 * h + e / 16] += i32::from(q) * i32::from(x[e]);
                    }
                }
            }
            let total: i32 = (0..16)
                .map(|s| i32::from(scales[s] as i8) * (isum[s] - 32 * i32::from(ab.bsums[s])))
                .sum();
            f16_at(wb, 208) * ab.d * total as f32
        })
        .sum()
}

/// F16 weights against f32 activations.
pub fn dot_f16(w: &[u8], a: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (wc, ac) = (w.as_chunks::<16>().0, a.chunks_exact(8));
    for (wb, x) in wc.iter().zip(ac) {
        for i in 0..8 {
            acc[i] += f16::from_le_bytes([wb[2 * i], wb[2 * i + 1]]).to_f32() * x[i];
        }
    }
    let done = wc.len() * 8;
    let tail: f32 = (done..a.len()).map(|i| f16_at(w, 2 * i) * a[i]).sum();
    acc.iter().sum::<f32>() + tail
}

/// BF16 weights against f32 activations.
pub fn dot_bf16(w: &[u8], a: &[f32]) -> f32 {
    let widen = |b: &[u8], i: usize| bf16::from_le_bytes([b[2 * i], b[2 * i + 1]]).to_f32();
    let mut acc = [0.0f32; 8];
    let (wc, ac) = (w.as_chunks::<16>().0, a.chunks_exact(8));
    for (wb, x) in wc.iter().zip(ac) {
        for i in 0..8 {
            acc[i] += widen(wb, i) * x[i];
        }
    }
    let done = wc.len() * 8;
    let tail: f32 = (done..a.len()).map(|i| widen(w, i) * a[i]).sum();
    acc.iter().sum::<f32>() + tail
}
