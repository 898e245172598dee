//! AVX2/FMA/F16C versions of the dot kernels of `qdot` (same inputs, same results up to
//! float summation order). They are handed out only after run-time detection of the
//! features they are compiled for, which is what makes calling them sound.

use std::arch::x86_64::*;

use super::qdot::{BlockQ8_0, BlockQ8K, Kernels, k_scales};

/// The AVX2 kernel table, when this CPU has AVX2, FMA and F16C.
pub fn kernels() -> Option<Kernels> {
    let ok = is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c");
    ok.then_some(Kernels {
        name: "avx2",
        q8_0,
        q4_0,
        q4_k,
        q5_k,
        q6_k,
        f16,
        bf16,
    })
}

// The safe wrappers below are private and reachable only through `kernels()`, which returns
// them only when the CPU has every feature the `imp` functions are compiled for.
macro_rules! wrap {
    ($name:ident, $act:ty) => {
        fn $name(w: &[u8], a: &[$act]) -> f32 {
            // SAFETY: `kernels()` hands this function out only after detecting AVX2, FMA and
            // F16C; `imp` reads only inside `w` and `a` (checked chunks, see each body).
            unsafe { imp::$name(w, a) }
        }
    };
}
wrap!(q8_0, BlockQ8_0);
wrap!(q4_0, BlockQ8_0);
wrap!(q4_k, BlockQ8K);
wrap!(q5_k, BlockQ8K);
wrap!(q6_k, BlockQ8K);
wrap!(f16, f32);
wrap!(bf16, f32);

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

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn q8_0(w: &[u8], a: &[BlockQ8_0]) -> f32 {
        let mut acc = _mm256_setzero_ps();
        for (wb, ab) in w.as_chunks::<34>().0.iter().zip(a) {
            // SAFETY: both ranges hold exactly 32 bytes.
            let (qw, qa) = unsafe { (load32(&wb[2..]), load32_i8(&ab.qs)) };
            let p = _mm256_cvtepi32_ps(dot_i8(qw, qa));
            acc = _mm256_fmadd_ps(_mm256_set1_ps(half(wb, 0) * ab.d), p, acc);
        }
        hsum(acc)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn q4_0(w: &[u8], a: &[BlockQ8_0]) -> f32 {
        let m4 = _mm_set1_epi8(15);
        let mut acc = _mm256_setzero_ps();
        for (wb, ab) in w.as_chunks::<18>().0.iter().zip(a) {
            // SAFETY: wb[2..18] holds exactly 16 bytes.
            let b = unsafe { _mm_loadu_si128(wb[2..].as_ptr().cast()) };
            let lo = _mm_and_si128(b, m4);
            let hi = _mm_and_si128(_mm_srli_epi16::<4>(b), m4);
            let q = _mm256_sub_epi8(_mm256_set_m128i(hi, lo), _mm256_set1_epi8(8));
            // SAFETY: 32 bytes.
            let qa = unsafe { load32_i8(&ab.qs) };
            let p = _mm256_cvtepi32_ps(dot_i8(q, qa));
            acc = _mm256_fmadd_ps(_mm256_set1_ps(half(wb, 0) * ab.d), p, acc);
        }
        hsum(acc)
    }

    /// `sum_j sc[j] * dot(q_j, a_j)` over the 8 sub-blocks of 32 (unsigned `q` in 0..32).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn k_block(qs: [__m256i; 8], a: &BlockQ8K, sc: &[u8; 8]) -> __m256i {
        let mut acc = _mm256_setzero_si256();
        for (j, q) in qs.iter().enumerate() {
            // SAFETY: a.qs holds 256 bytes; j * 32 + 32 <= 256.
            let x = unsafe { load32_i8(&a.qs[32 * j..]) };
            let p = _mm256_maddubs_epi16(*q, x);
            let p = _mm256_madd_epi16(p, _mm256_set1_epi16(i16::from(sc[j])));
            acc = _mm256_add_epi32(acc, p);
        }
        acc
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn q4_k(w: &[u8], a: &[BlockQ8K]) -> f32 {
        let m4 = _mm256_set1_epi8(15);
        let (mut acc, mut mins) = (_mm256_setzero_ps(), 0.0f32);
        for (wb, ab) in w.as_chunks::<144>().0.iter().zip(a) {
            let (sc, summ) = k_scales(&wb[4..16], &ab.bsums);
            let mut qs = [_mm256_setzero_si256(); 8];
            for g in 0..4 {
                // SAFETY: wb[16 + 32g..] holds at least 32 bytes (g < 4, 144 bytes).
                let q = unsafe { load32(&wb[16 + 32 * g..]) };
                qs[2 * g] = _mm256_and_si256(q, m4);
                qs[2 * g + 1] = _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4);
            }
            let sumi = _mm256_cvtepi32_ps(k_block(qs, ab, &sc));
            acc = _mm256_fmadd_ps(_mm256_set1_ps(half(wb, 0) * ab.d), sumi, acc);
            mins += half(wb, 2) * ab.d * summ as f32;
        }
        hsum(acc) - mins
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
    pub unsafe fn q5_k(w: &[u8], a: &[BlockQ8K]) -> f32 {
        let (m4, one) = (_mm256_set1_epi8(15), _mm256_set1_epi8(1));
        let (mut acc, mut mins) = (_mm256_setzero_ps(), 0.0f32);
        for (wb, ab) in w.as_chunks::<176>().0.iter().zip(a) {
            let (sc, summ) = k_scales(&wb[4..16], &ab.bsums);
            // SAFETY: wb[16..48] is the 32-byte qh.
            let qh = unsafe { load32(&wb[16..]) };
            let mut qs = [_mm256_setzero_si256(); 8];
            for g in 0..4 {
                // SAFETY: wb[48 + 32g..] holds at least 32 bytes (g < 4, 176 bytes).
                let q = unsafe { load32(&wb[48 + 32 * g..]) };
                let lo = _mm256_and_si256(q, m4);
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4);
                qs[2 * g] = _mm256_or_si256(lo, high_bits(qh, 2 * g as i32, one));
                qs[2 * g + 1] = _mm256_or_si256(hi, high_bits(qh, 2 * g as i32 + 1, one));
            }
            let sumi = _mm256_cvtepi32_ps(k_block(qs, ab, &sc));
            acc = _mm256_fmadd_ps(_mm256_set1_ps(half(wb, 0) * ab.d), sumi, acc);
            mins += half(wb, 2) * ab.d * summ as f32;
        }
        hsum(acc) - mins
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn q6_k(w: &[u8], a: &[BlockQ8K]) -> f32 {
        let (m4, m2) = (_mm256_set1_epi8(15), _mm256_set1_epi8(3));
        let (mut acc, mut offsets) = (_mm256_setzero_ps(), 0.0f32);
        for (wb, ab) in w.as_chunks::<210>().0.iter().zip(a) {
            let scales = &wb[192..208];
            let mut sumi = _mm256_setzero_si256();
            for h in 0..2 {
                // SAFETY: ql is wb[0..128], qh wb[128..192]: each load reads 32 bytes inside.
                let (ql0, ql1, qh) = unsafe {
                    (
                        load32(&wb[64 * h..]),
                        load32(&wb[64 * h + 32..]),
                        load32(&wb[128 + 32 * h..]),
                    )
                };
                let q = [
                    _mm256_or_si256(_mm256_and_si256(ql0, m4), high_bits(qh, 0, m2)),
                    _mm256_or_si256(_mm256_and_si256(ql1, m4), high_bits(qh, 2, m2)),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4),
                        high_bits(qh, 4, m2),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4),
                        high_bits(qh, 6, m2),
                    ),
                ];
                for (k, q) in q.iter().enumerate() {
                    // SAFETY: ab.qs holds 256 bytes; 128h + 32k + 32 <= 256.
                    let x = unsafe { load32_i8(&ab.qs[128 * h + 32 * k..]) };
                    let p = _mm256_maddubs_epi16(*q, x);
                    let s = 8 * h + 2 * k;
                    let sc = _mm256_set_m128i(
                        _mm_set1_epi16(i16::from(scales[s + 1] as i8)),
                        _mm_set1_epi16(i16::from(scales[s] as i8)),
                    );
                    sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, sc));
                }
            }
            let offset: i32 = (0..16)
                .map(|s| i32::from(scales[s] as i8) * i32::from(ab.bsums[s]))
                .sum();
            let d = half(wb, 208) * ab.d;
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
            offsets += d * (32 * offset) as f32;
        }
        hsum(acc) - offsets
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

    /// Sum of `w[i] * a[i]` for f16 (bf16 when `BF16`) `w`, 32 elements per step and a
    /// scalar tail.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn dot_wide<const BF16: bool>(w: &[u8], a: &[f32]) -> f32 {
        let mut acc = [_mm256_setzero_ps(); 4];
        let (wc, ac) = (w.as_chunks::<64>().0, a.as_chunks::<32>().0);
        for (wb, x) in wc.iter().zip(ac) {
            for (i, acc) in acc.iter_mut().enumerate() {
                // SAFETY: wb holds 64 bytes and x 32 floats: 16 bytes and 8 floats at 16i / 8i.
                let (h, v) = unsafe {
                    (
                        _mm_loadu_si128(wb[16 * i..].as_ptr().cast()),
                        _mm256_loadu_ps(x[8 * i..].as_ptr()),
                    )
                };
                *acc = _mm256_fmadd_ps(widen::<BF16>(h), v, *acc);
            }
        }
        let sum = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        let done = wc.len().min(ac.len()) * 32;
        let tail = |i: usize| {
            let bits = [w[2 * i], w[2 * i + 1]];
            let v = if BF16 {
                half::bf16::from_le_bytes(bits).to_f32()
            } else {
                half::f16::from_le_bytes(bits).to_f32()
            };
            v * a[i]
        };
        hsum(sum) + (done..a.len()).map(tail).sum::<f32>()
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn f16(w: &[u8], a: &[f32]) -> f32 {
        dot_wide::<false>(w, a)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn bf16(w: &[u8], a: &[f32]) -> f32 {
        dot_wide::<true>(w, a)
    }
}
