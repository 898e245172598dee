//! Plain-loop CPU kernels: norms, activations and matmuls, in forward order.

use rayon::prelude::*;

use crate::backend::Activation;

/// Work (multiply-adds) below which a matmul stays on the calling thread: on tiny models
/// the cost of waking the pool is larger than the work.
const PAR_MIN_WORK: usize = 1 << 17;

/// Dot product with eight independent accumulators (vectorizes well).
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s = 0.0;
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s + acc.iter().sum::<f32>()
}

/// `out[j] = dot(x, w[j]) (+ bias[j])` for one row `x` of length `k`; `w` is `[m, k]`.
fn matvec(x: &[f32], w: &[f32], bias: Option<&[f32]>, k: usize, out: &mut [f32]) {
    let body = |(j, o): (usize, &mut f32)| {
        *o = dot(x, &w[j * k..(j + 1) * k]) + bias.map_or(0.0, |b| b[j]);
    };
    if out.len() * k >= PAR_MIN_WORK {
        out.par_iter_mut()
            .enumerate()
            .with_min_len(64)
            .for_each(body);
    } else {
        out.iter_mut().enumerate().for_each(body);
    }
}

/// `out[r * stride + j] = x[r] . w[j]` for `r < n`, `j < m`: `x` is [n, k] and `w` is
/// [m, k], both row-major; `out`'s rows are `stride >= m` apart (a column block of a wider
/// output). `out` is written, never read.
#[allow(clippy::too_many_arguments)]
pub fn gemm_xwt(
    n: usize,
    m: usize,
    k: usize,
    x: &[f32],
    w: &[f32],
    out: &mut [f32],
    stride: usize,
    par: gemm::Parallelism,
) {
    if n == 0 || m == 0 {
        return;
    }
    assert!(x.len() >= n * k && w.len() >= m * k && m <= stride);
    assert!(out.len() >= (n - 1) * stride + m, "output too short");
    // SAFETY: the asserts above make every access in range: dst is `out` seen as [n, m]
    // with row stride `stride` (rs = stride, cs = 1), ending at (n - 1) * stride + m <=
    // out.len(); lhs is x, [n, k] row-major; rhs is w^T, a [k, m] view of the row-major
    // [m, k] weight (rs = 1, cs = k). `read_dst = false`: out's prior contents are never
    // read.
    unsafe {
        gemm::gemm(
            n,
            m,
            k,
            out.as_mut_ptr(),
            1,
            stride as isize,
            false,
            x.as_ptr(),
            1,
            k as isize,
            w.as_ptr(),
            k as isize,
            1,
            0.0,
            1.0,
            false,
            false,
            false,
            par,
        );
    }
}

/// `out[n, m] = x[n, k] @ w[m, k]^T (+ bias)`.
pub fn matmul(
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    n: usize,
    k: usize,
    m: usize,
    out: &mut [f32],
) {
    let (x, out) = (&x[..n * k], &mut out[..n * m]);
    assert_eq!(w.len(), m * k, "weight is not [{m}, {k}]");
    if n == 1 {
        return matvec(x, w, bias, k, out);
    }
    let par = if n * m * k >= PAR_MIN_WORK {
        gemm::Parallelism::Rayon(0)
    } else {
        gemm::Parallelism::None
    };
    gemm_xwt(n, m, k, x, w, out, m, par);
    if let Some(b) = bias {
        for row in out.chunks_exact_mut(m) {
            row.iter_mut().zip(b).for_each(|(o, b)| *o += b);
        }
    }
}

/// `out = x / sqrt(mean(x^2) + eps) * w` for one row.
#[inline]
pub fn rms_norm_row(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let ss: f32 = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let inv = 1.0 / (ss + eps).sqrt();
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = v * inv * g;
    }
}

/// The row kernel of a GLU activation.
pub fn glu_row(act: Activation) -> fn(&[f32], &[f32], &mut [f32]) {
    match act {
        Activation::Silu => silu_mul_row,
        Activation::GeluTanh => gelu_tanh_mul_row,
    }
}

/// `silu(g) * u`.
#[inline]
pub fn silu_mul_row(gate: &[f32], up: &[f32], out: &mut [f32]) {
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = g / (1.0 + (-g).exp()) * u;
    }
}

/// `gelu_tanh(g) * u`, GELU's tanh approximation:
/// `0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))`.
#[inline]
pub fn gelu_tanh_mul_row(gate: &[f32], up: &[f32], out: &mut [f32]) {
    const C: f32 = 0.797_884_6; // sqrt(2 / pi)
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = 0.5 * g * (1.0 + (C * (g + 0.044_715 * g * g * g)).tanh()) * u;
    }
}

/// RMSNorm of one vector in place: `x = x / sqrt(mean(x^2) + eps) * w`.
#[inline]
pub fn rms_norm_in_place(x: &mut [f32], w: &[f32], eps: f32) {
    let ss: f32 = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let inv = 1.0 / (ss + eps).sqrt();
    x.iter_mut().zip(w).for_each(|(v, g)| *v *= inv * g);
}

/// Rotates one head in place by angles `pos * inv_freq[i]`.
/// Interleaved: pairs `(2i, 2i+1)`; half: pairs `(i, i + dim/2)`.
#[inline]
pub fn rope_head(x: &mut [f32], cos_sin: &[(f32, f32)], interleaved: bool) {
    let half = cos_sin.len();
    for (i, &(c, s)) in cos_sin.iter().enumerate() {
        let (a, b) = if interleaved {
            (2 * i, 2 * i + 1)
        } else {
            (i, i + half)
        };
        let (x0, x1) = (x[a], x[b]);
        x[a] = x0 * c - x1 * s;
        x[b] = x0 * s + x1 * c;
    }
}

/// `x = exp(x)` for `x <= 0` (softmax after max subtraction), vectorizable:
/// `exp(x) = 2^k * p(r)` with `x = k ln2 + r`, `|r| <= ln2 / 2`, and a degree-6
/// polynomial for `p` (relative error below 3e-7). Inputs below -87 give 0.
pub fn exp_in_place(xs: &mut [f32]) {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    for x in xs.iter_mut() {
        let v = x.max(-87.0);
        let k = (v * LOG2E).round();
        let r = v - k * LN2_HI - k * LN2_LO;
        let p = 1.0
            + r * (1.0
                + r * (0.5
                    + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
        let scale = f32::from_bits(((k as i32 + 127) as u32) << 23);
        *x = if *x < -87.0 { 0.0 } else { p * scale };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_exp_matches_libm() {
        let mut xs: Vec<f32> = (0..2000).map(|i| -(i as f32) * 0.05).collect();
        let want: Vec<f32> = xs.iter().map(|x| x.exp()).collect();
        exp_in_place(&mut xs);
        for (g, w) in xs.iter().zip(&want) {
            assert!((g - w).abs() <= 1e-6 * w + 1e-37, "{g} vs {w}");
        }
    }

    #[test]
    fn matmul_paths_agree_with_naive() {
        let (n, k, m) = (5, 37, 70);
        let x: Vec<f32> = (0..n * k)
            .map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.1)
            .collect();
        let w: Vec<f32> = (0..m * k)
            .map(|i| ((i * 5 % 11) as f32 - 5.0) * 0.1)
            .collect();
        let b: Vec<f32> = (0..m).map(|i| i as f32 * 0.01).collect();
        let mut out = vec![0.0; n * m];
        matmul(&x, &w, Some(&b), n, k, m, &mut out);
        for r in 0..n {
            let mut one = vec![0.0; m];
            matmul(&x[r * k..(r + 1) * k], &w, Some(&b), 1, k, m, &mut one);
            for j in 0..m {
                let naive: f32 = (0..k).map(|i| x[r * k + i] * w[j * k + i]).sum::<f32>() + b[j];
                assert!((out[r * m + j] - naive).abs() < 1e-4);
                assert!((one[j] - naive).abs() < 1e-4);
            }
        }
    }
}
