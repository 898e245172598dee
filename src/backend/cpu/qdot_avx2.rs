//! AVX2/FMA/F16C versions of the dot kernels of `qdot` (same inputs, same results up to
//! float summation order). They are handed out only after run-time detection of the
//! features they are compiled for, which is what makes calling them sound.

use std::arch::x86_64::*;

use super::qdot::{BlockQ8_0, BlockQ8K, Kernels};

/// The AVX2 kernel table, when this CPU has AVX2, FMA and F16C.
pub fn kernels() -> Option<Kernels> {
    let ok = is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c");
    ok.then_some(Kernels {
        name: "avx2",
        gemm_min_rows: 32,
        q8_0,
        q4_0,
        q4_k,
        q5_k,
        q6_k,
        mxfp4,
        f16,
        bf16,
        q8_0_x4,
        q4_0_x4,
        q4_k_x4,
        q5_k_x4,
        q6_k_x4,
        mxfp4_x4,
        f16_x4,
        bf16_x4,
    })
}

// The safe wrappers below are private and reachable only through `kernels()`, which returns
// them only when the CPU has every feature the `imp` functions are compiled for.
macro_rules! wrap {
    ($name:ident, $name4:ident, $act:ty) => {
        fn $name(w: &[u8], a: &[$act]) -> f32 {
            // SAFETY: `kernels()` hands this function out only after detecting AVX2, FMA and
            // F16C; `imp` reads only inside `w` and `a` (checked chunks, see each body).
            unsafe { imp::$name::<1>(w, [a])[0] }
        }
        fn $name4(w: &[u8], a: [&[$act]; 4]) -> [f32; 4] {
            // SAFETY: as above.
            unsafe { imp::$name::<4>(w, a) }
        }
    };
}
wrap!(q8_0, q8_0_x4, BlockQ8_0);
wrap!(q4_0, q4_0_x4, BlockQ8_0);
wrap!(q4_k, q4_k_x4, BlockQ8K);
wrap!(q5_k, q5_k_x4, BlockQ8K);
wrap!(q6_k, q6_k_x4, BlockQ8K);
wrap!(mxfp4, mxfp4_x4, BlockQ8_0);
wrap!(f16, f16_x4, f32);
wrap!(bf16, bf16_x4, f32);

mod imp {
    //! The kernels proper. Every load reads a 16- or 32-byte range of a slice that is at
    //! least that long (fixed-size block chunks), with unaligned loads.

    use super::*;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn half(b: &[u8], at: usize) -> f32 {
        let bits = i32::from(u16::from_le_bytes([b[at], b[at + 1]]));
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits)))
    }

    /// 32 bytes at the start of `b` (`b.len() >= 32`).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load32(b: &[u8]) -> __m256i {
        debug_assert!(b.len() >= 32);
        // SAFETY: callers pass slices of at least 32 bytes; the load is unaligned.
        unsafe { _mm256_loadu_si256(b.as_ptr().cast()) }
    }

    /// 32 i8 at the start of `b` (`b.len() >= 32`).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load32_i8(b: &[i8]) -> __m256i {
        debug_assert!(b.len() >= 32);
        // SAFETY: callers pass slices of at least 32 bytes; the load is unaligned.
        unsafe { _mm256_loadu_si256(b.as_ptr().cast()) }
    }

    /// Sum of `x[i] * y[i]` (signed bytes) over each 4 neighbours, as 8 i32.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn dot_i8(x: __m256i, y: __m256i) -> __m256i {
        let ax = _mm256_sign_epi8(x, x);
        let sy = _mm256_sign_epi8(y, x);
        _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), _mm256_set1_epi16(1))
    }

    /// Horizontal sums of `R` accumulators.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn hsums<const R: usize>(acc: [__m256; R], minus: [f32; R]) -> [f32; R] {
        std::array::from_fn(|r| hsum(acc[r]) - minus[r])
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn q8_0<const R: usize>(w: &[u8], a: [&[BlockQ8_0]; R]) -> [f32; R] {
        let mut acc = [_mm256_setzero_ps(); R];
        for (i, wb) in w.as_chunks::<34>().0.iter().enumerate() {
            // SAFETY: wb[2..34] holds exactly 32 bytes.
            let qw = unsafe { load32(&wb[2..]) };
            let (ax, d) = (_mm256_sign_epi8(qw, qw), half(wb, 0));
            for r in 0..R {
                let ab = &a[r][i];
                // SAFETY: 32 bytes.
                let qa = unsafe { load32_i8(&ab.qs) };
                let p = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(ax, _mm256_sign_epi8(qa, qw)),
                    _mm256_set1_epi16(1),
                );
                let p = _mm256_cvtepi32_ps(p);
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * ab.d), p, acc[r]);
            }
        }
        hsums(acc, [0.0; R])
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn q4_0<const R: usize>(w: &[u8], a: [&[BlockQ8_0]; R]) -> [f32; R] {
        let m4 = _mm_set1_epi8(15);
        let mut acc = [_mm256_setzero_ps(); R];
        for (i, wb) in w.as_chunks::<18>().0.iter().enumerate() {
            // SAFETY: wb[2..18] holds exactly 16 bytes.
            let b = unsafe { _mm_loadu_si128(wb[2..].as_ptr().cast()) };
            let lo = _mm_and_si128(b, m4);
            let hi = _mm_and_si128(_mm_srli_epi16::<4>(b), m4);
            let q = _mm256_sub_epi8(_mm256_set_m128i(hi, lo), _mm256_set1_epi8(8));
            let d = half(wb, 0);
            for r in 0..R {
                let ab = &a[r][i];
                // SAFETY: 32 bytes.
                let qa = unsafe { load32_i8(&ab.qs) };
                let p = _mm256_cvtepi32_ps(dot_i8(q, qa));
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * ab.d), p, acc[r]);
            }
        }
        hsums(acc, [0.0; R])
    }

    /// MXFP4: the nibbles (low: elements 0..16, high: 16..32) looked up in the doubled E2M1
    /// table by `vpshufb`, then as Q4_0 with the block scale `2^(e-128)`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn mxfp4<const R: usize>(w: &[u8], a: [&[BlockQ8_0]; R]) -> [f32; R] {
        let m4 = _mm_set1_epi8(15);
        let kv = crate::backend::quant::MXFP4_VALUES;
        // SAFETY: `kv` holds 16 bytes.
        let table = unsafe { _mm_loadu_si128(kv.as_ptr().cast()) };
        let table = _mm256_set_m128i(table, table);
        let mut acc = [_mm256_setzero_ps(); R];
        for (i, wb) in w.as_chunks::<17>().0.iter().enumerate() {
            // SAFETY: wb[1..17] holds exactly 16 bytes.
            let b = unsafe { _mm_loadu_si128(wb[1..].as_ptr().cast()) };
            let lo = _mm_and_si128(b, m4);
            let hi = _mm_and_si128(_mm_srli_epi16::<4>(b), m4);
            let q = _mm256_shuffle_epi8(table, _mm256_set_m128i(hi, lo));
            let d = crate::backend::quant::e8m0_to_f32_half(wb[0]);
            for r in 0..R {
                let ab = &a[r][i];
                // SAFETY: 32 bytes.
                let qa = unsafe { load32_i8(&ab.qs) };
                let p = _mm256_cvtepi32_ps(dot_i8(q, qa));
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * ab.d), p, acc[r]);
            }
        }
        hsums(acc, [0.0; R])
    }

    /// `sum_j sc[j] * dot(q_j, a_j)` over the 8 sub-blocks of 32 (unsigned `q` in 0..32).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn k_block(qs: &[__m256i; 8], a: &BlockQ8K, sc: &[__m256i; 8]) -> __m256i {
        let mut acc = _mm256_setzero_si256();
        for j in 0..8 {
            // SAFETY: a.qs holds 256 bytes; j * 32 + 32 <= 256.
            let x = unsafe { load32_i8(&a.qs[32 * j..]) };
            let p = _mm256_madd_epi16(_mm256_maddubs_epi16(qs[j], x), sc[j]);
            acc = _mm256_add_epi32(acc, p);
        }
        acc
    }

    /// Q4_K and Q5_K (the fifth bits in `qh` at bytes 16..48 when `Q5`).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn k45<const R: usize, const B: usize, const Q5: bool>(
        w: &[u8],
        a: [&[BlockQ8K]; R],
    ) -> [f32; R] {
        let (m4, one) = (_mm256_set1_epi8(15), _mm256_set1_epi8(1));
        let (mut acc, mut mins) = ([_mm256_setzero_ps(); R], [0.0f32; R]);
        let q_at = if Q5 { 48 } else { 16 };
        for (i, wb) in w.as_chunks::<B>().0.iter().enumerate() {
            let mut sc = [0u8; 8];
            let mut m = [0u8; 8];
            for j in 0..8 {
                (sc[j], m[j]) = crate::backend::quant::q4_k_scale_min(j, &wb[4..16]);
            }
            let scv: [__m256i; 8] = std::array::from_fn(|j| _mm256_set1_epi16(i16::from(sc[j])));
            // SAFETY: for Q5, wb[16..48] is the 32-byte qh (never read otherwise).
            let qh = if Q5 {
                unsafe { load32(&wb[16..]) }
            } else {
                _mm256_setzero_si256()
            };
            let mut qs = [_mm256_setzero_si256(); 8];
            for g in 0..4 {
                // SAFETY: wb[q_at + 32g..] holds at least 32 bytes (g < 4, B bytes).
                let q = unsafe { load32(&wb[q_at + 32 * g..]) };
                let lo = _mm256_and_si256(q, m4);
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4);
                if Q5 {
                    qs[2 * g] = _mm256_or_si256(lo, high_bits(qh, 2 * g as i32, one));
                    qs[2 * g + 1] = _mm256_or_si256(hi, high_bits(qh, 2 * g as i32 + 1, one));
                } else {
                    (qs[2 * g], qs[2 * g + 1]) = (lo, hi);
                }
            }
            let (d, dmin) = (half(wb, 0), half(wb, 2));
            for r in 0..R {
                let ab = &a[r][i];
                let sumi = _mm256_cvtepi32_ps(k_block(&qs, ab, &scv));
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * ab.d), sumi, acc[r]);
                let summ: i32 = (0..8)
                    .map(|j| {
                        i32::from(m[j])
                            * (i32::from(ab.bsums[2 * j]) + i32::from(ab.bsums[2 * j + 1]))
                    })
                    .sum();
                mins[r] += dmin * ab.d * summ as f32;
            }
        }
        hsums(acc, mins)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn q4_k<const R: usize>(w: &[u8], a: [&[BlockQ8K]; R]) -> [f32; R] {
        k45::<R, 144, false>(w, a)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn q5_k<const R: usize>(w: &[u8], a: [&[BlockQ8K]; R]) -> [f32; R] {
        k45::<R, 176, true>(w, a)
    }

    /// Per byte: `((qh >> shift) & mask) << 4` (a 16-bit shift, then a per-byte mask keeps
    /// each byte's own bits).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn high_bits(qh: __m256i, shift: i32, mask: __m256i) -> __m256i {
        let b = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(shift));
        _mm256_slli_epi16::<4>(_mm256_and_si256(b, mask))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn q6_k<const R: usize>(w: &[u8], a: [&[BlockQ8K]; R]) -> [f32; R] {
        let (m4, m2) = (_mm256_set1_epi8(15), _mm256_set1_epi8(3));
        let (mut acc, mut offsets) = ([_mm256_setzero_ps(); R], [0.0f32; R]);
        for (i, wb) in w.as_chunks::<210>().0.iter().enumerate() {
            let scales = &wb[192..208];
            let mut q = [_mm256_setzero_si256(); 8];
            for h in 0..2 {
                // SAFETY: ql is wb[0..128], qh wb[128..192]: each load reads 32 bytes inside.
                let (ql0, ql1, qh) = unsafe {
                    (
                        load32(&wb[64 * h..]),
                        load32(&wb[64 * h + 32..]),
                        load32(&wb[128 + 32 * h..]),
                    )
                };
                let hi0 = _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4);
                let hi1 = _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4);
                q[4 * h] = _mm256_or_si256(_mm256_and_si256(ql0, m4), high_bits(qh, 0, m2));
                q[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(ql1, m4), high_bits(qh, 2, m2));
                q[4 * h + 2] = _mm256_or_si256(hi0, high_bits(qh, 4, m2));
                q[4 * h + 3] = _mm256_or_si256(hi1, high_bits(qh, 6, m2));
            }
            // Sub-blocks of 16: lanes 0..8 of 32-element group t use scale 2t, lanes 8..16 2t+1.
            let sc: [__m256i; 8] = std::array::from_fn(|t| {
                _mm256_set_m128i(
                    _mm_set1_epi16(i16::from(scales[2 * t + 1] as i8)),
                    _mm_set1_epi16(i16::from(scales[2 * t] as i8)),
                )
            });
            let d = half(wb, 208);
            for r in 0..R {
                let ab = &a[r][i];
                let mut sumi = _mm256_setzero_si256();
                for t in 0..8 {
                    // SAFETY: ab.qs holds 256 bytes; 32t + 32 <= 256.
                    let x = unsafe { load32_i8(&ab.qs[32 * t..]) };
                    let p = _mm256_maddubs_epi16(q[t], x);
                    sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, sc[t]));
                }
                let offset: i32 = (0..16)
                    .map(|s| i32::from(scales[s] as i8) * i32::from(ab.bsums[s]))
                    .sum();
                let dd = d * ab.d;
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dd), _mm256_cvtepi32_ps(sumi), acc[r]);
                offsets[r] += dd * (32 * offset) as f32;
            }
        }
        hsums(acc, offsets)
    }

    /// 8 f16 (or bf16 when `BF16`) widened to f32.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn widen<const BF16: bool>(h: __m128i) -> __m256 {
        if BF16 {
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
        } else {
            _mm256_cvtph_ps(h)
        }
    }

    /// `sum_i w[i] * a[r][i]` for f16 (bf16 when `BF16`) `w`, 16 elements per step and a
    /// scalar tail.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn dot_wide<const R: usize, const BF16: bool>(w: &[u8], a: [&[f32]; R]) -> [f32; R] {
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        let wc = w.as_chunks::<32>().0;
        let steps = a.iter().fold(wc.len(), |n, a| n.min(a.len() / 16));
        for (s, wb) in wc[..steps].iter().enumerate() {
            // SAFETY: wb holds 32 bytes: 16 at 0 and 16.
            let h = unsafe {
                [
                    widen::<BF16>(_mm_loadu_si128(wb.as_ptr().cast())),
                    widen::<BF16>(_mm_loadu_si128(wb[16..].as_ptr().cast())),
                ]
            };
            for r in 0..R {
                let x = &a[r][16 * s..16 * s + 16];
                for (u, acc) in acc[r].iter_mut().enumerate() {
                    // SAFETY: x holds 16 floats: 8 at 0 and 8.
                    let v = unsafe { _mm256_loadu_ps(x[8 * u..].as_ptr()) };
                    *acc = _mm256_fmadd_ps(h[u], v, *acc);
                }
            }
        }
        let widen1 = |i: usize| {
            let bits = [w[2 * i], w[2 * i + 1]];
            if BF16 {
                half::bf16::from_le_bytes(bits).to_f32()
            } else {
                half::f16::from_le_bytes(bits).to_f32()
            }
        };
        std::array::from_fn(|r| {
            let tail: f32 = (16 * steps..a[r].len()).map(|i| widen1(i) * a[r][i]).sum();
            hsum(_mm256_add_ps(acc[r][0], acc[r][1])) + tail
        })
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn f16<const R: usize>(w: &[u8], a: [&[f32]; R]) -> [f32; R] {
        dot_wide::<R, false>(w, a)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn bf16<const R: usize>(w: &[u8], a: [&[f32]; R]) -> [f32; R] {
        dot_wide::<R, true>(w, a)
    }
}
