//! AVX-512 (F/BW/VL + VNNI) versions of the dot kernels of `qdot` (same inputs, same
//! results up to float summation order). Integer products by `vpdpbusd` (u8 x i8, four
//! products summed into each i32; 32 bytes, one block at a time) for Q8_0/Q4_0, by
//! `vpmaddubsw` for MXFP4 (32 bytes at a time, looked up by `vpshufb`), and 64 bytes
//! at a time by `vpmaddubsw` followed by `vpdpwssd` (the products of a pair times the
//! sub-block's scale) for the k-quants; f16/bf16 widened 16 at a time. They are
//! handed out only after run-time detection of every feature they are compiled for, which is
//! what makes calling them sound.

use std::arch::x86_64::*;

use super::qdot::{BlockQ8_0, BlockQ8K, Kernels};

/// The AVX-512 kernel table, when this CPU has AVX-512 F/BW/VL/VNNI (and FMA/F16C).
pub fn kernels() -> Option<Kernels> {
    let ok = is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c");
    ok.then_some(Kernels {
        name: "avx512",
        gemm_min_rows: usize::MAX,
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
            // SAFETY: `kernels()` hands this function out only after detecting AVX-512
            // F/BW/VL/VNNI, FMA and F16C; `imp` reads only inside `w` and `a` (fixed-size
            // chunks, see each body).
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
    //! The kernels proper. Every load reads a 16-, 32- or 64-byte range of a slice that is
    //! at least that long (fixed-size block chunks), with unaligned loads.

    use super::*;

    /// The upper 16 of the 32 16-bit lanes of a 512-bit vector.
    const HI16: __mmask32 = 0xFFFF_0000;

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
    fn half(b: &[u8], at: usize) -> f32 {
        let bits = i32::from(u16::from_le_bytes([b[at], b[at + 1]]));
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits)))
    }

    /// 64 bytes at the start of `b` (`b.len() >= 64`).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
    unsafe fn load64<T>(b: &[T]) -> __m512i {
        debug_assert!(std::mem::size_of_val(b) >= 64);
        // SAFETY: callers pass slices of at least 64 bytes; the load is unaligned.
        unsafe { _mm512_loadu_si512(b.as_ptr().cast()) }
    }

    /// 32 bytes at the start of `b` (`b.len() >= 32`).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
    unsafe fn load32<T>(b: &[T]) -> __m256i {
        debug_assert!(std::mem::size_of_val(b) >= 32);
        // SAFETY: callers pass slices of at least 32 bytes; the load is unaligned.
        unsafe { _mm256_loadu_si256(b.as_ptr().cast()) }
    }

    /// 16 bytes at the start of `b` (`b.len() >= 16`).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
    unsafe fn load16<T>(b: &[T]) -> __m128i {
        debug_assert!(std::mem::size_of_val(b) >= 16);
        // SAFETY: callers pass slices of at least 16 bytes; the load is unaligned.
        unsafe { _mm_loadu_si128(b.as_ptr().cast()) }
    }

    /// `acc[r] += d * a[r][i].d * dot(w, a[r][i].qs)` for one block of 32 signed weights:
    /// the sign of `w` moves onto the activations, so `vpdpbusd` multiplies `|w|` (u8) by
    /// them (i8). 256 bits wide: the block is 32 bytes.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
    fn q8_block<const R: usize>(
        acc: &mut [__m256; R],
        w: __m256i,
        d: f32,
        a: &[&[BlockQ8_0]; R],
        i: usize,
    ) {
        let (w_abs, w_neg) = (_mm256_abs_epi8(w), _mm256_movepi8_mask(w));
        for r in 0..R {
            let ab = &a[r][i];
            // SAFETY: `qs` holds 32 bytes.
            let x = unsafe { load32(&ab.qs[..]) };
            let x = _mm256_mask_sub_epi8(x, w_neg, _mm256_setzero_si256(), x);
            let p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), w_abs, x);
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * ab.d), _mm256_cvtepi32_ps(p), acc[r]);
        }
    }

    /// The sums of the even- and odd-block accumulators.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
    fn reduce2<const R: usize>(acc: [[__m256; R]; 2]) -> [f32; R] {
        std::array::from_fn(|r| {
            _mm512_reduce_add_ps(_mm512_zextps256_ps512(_mm256_add_ps(acc[0][r], acc[1][r])))
        })
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
    pub unsafe fn q8_0<const R: usize>(w: &[u8], a: [&[BlockQ8_0]; R]) -> [f32; R] {
        // Two accumulators per row (even and odd blocks) halve the chain of additions.
        let mut acc = [[_mm256_setzero_ps(); R]; 2];
        for (i, wb) in w.as_chunks::<34>().0.iter().enumerate() {
            // SAFETY: wb[2..34] holds 32 bytes.
            let q = unsafe { load32(&wb[2..]) };
            q8_block(&mut acc[i % 2], q, half(wb, 0), &a, i);
        }
        reduce2(acc)
    }

    /// The 32 weights of one Q4_0 block minus 8, in element order.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
    fn q4_0_block(wb: &[u8]) -> __m256i {
        // SAFETY: wb[2..18] holds 16 bytes.
        let b = unsafe { load16(&wb[2..]) };
        let q = _mm256_set_m128i(_mm_srli_epi16::<4>(b), b);
        _mm256_sub_epi8(
            _mm256_and_si256(q, _mm256_set1_epi8(15)),
            _mm256_set1_epi8(8),
        )
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
    pub unsafe fn q4_0<const R: usize>(w: &[u8], a: [&[BlockQ8_0]; R]) -> [f32; R] {
        let mut acc = [[_mm256_setzero_ps(); R]; 2];
        for (i, wb) in w.as_chunks::<18>().0.iter().enumerate() {
            q8_block(&mut acc[i % 2], q4_0_block(wb), half(wb, 0), &a, i);
        }
        reduce2(acc)
    }

    /// The 32 weights of one MXFP4 block as the doubled E2M1 integers, in element order
    /// (`table`: the 16 values in each 128-bit lane).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
    fn mxfp4_block(wb: &[u8], table: __m256i) -> __m256i {
        // SAFETY: wb[1..17] holds 16 bytes.
        let b = unsafe { load16(&wb[1..]) };
        let q = _mm256_set_m128i(_mm_srli_epi16::<4>(b), b);
        _mm256_shuffle_epi8(table, _mm256_and_si256(q, _mm256_set1_epi8(15)))
    }

    /// MXFP4: the looked-up weights times the activations by `vpmaddubsw` on `|w|` and the
    /// activations with `w`'s signs (measured faster here than `q8_block`'s `vpdpbusd` with
    /// two accumulators: 9.2 against 7.5 GB/s on one thread in L2).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
    pub unsafe fn mxfp4<const R: usize>(w: &[u8], a: [&[BlockQ8_0]; R]) -> [f32; R] {
        use crate::backend::quant::{MXFP4_VALUES, e8m0_to_f32_half};
        // SAFETY: the table holds 16 bytes.
        let table = _mm256_broadcastsi128_si256(unsafe { load16(&MXFP4_VALUES[..]) });
        let mut acc = [_mm256_setzero_ps(); R];
        for (i, wb) in w.as_chunks::<17>().0.iter().enumerate() {
            let q = mxfp4_block(wb, table);
            let (q_abs, d) = (_mm256_sign_epi8(q, q), e8m0_to_f32_half(wb[0]));
            for r in 0..R {
                let ab = &a[r][i];
                // SAFETY: `qs` holds 32 bytes.
                let x = unsafe { load32(&ab.qs[..]) };
                let p = _mm256_maddubs_epi16(q_abs, _mm256_sign_epi8(x, q));
                let p = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, _mm256_set1_epi16(1)));
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * ab.d), p, acc[r]);
            }
        }
        std::array::from_fn(|r| _mm512_reduce_add_ps(_mm512_zextps256_ps512(acc[r])))
    }

    /// The 8 scales (low 8 bytes) and 8 mins (high 8 bytes) of a Q4_K/Q5_K block's 12
    /// scale bytes, 6 bits each.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
    fn k_scales(s: &[u8]) -> __m128i {
        let u = |i: usize| u32::from_le_bytes([s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]]);
        let (s0, s1, s2) = (u(0), u(1), u(2));
        // Sub-blocks 0..4 take the low 6 bits of bytes 0..4 (scales) and 4..8 (mins); 4..8
        // take a nibble of bytes 8..12 and the top 2 bits of bytes 0..4 (scales) / 4..8 (mins).
        let (m6, m4, m2) = (0x3f3f_3f3f, 0x0f0f_0f0f, 0x0303_0303);
        let sc = [s0 & m6, (s2 & m4) | (((s0 >> 6) & m2) << 4)];
        let mn = [s1 & m6, ((s2 >> 4) & m4) | (((s1 >> 6) & m2) << 4)];
        let join = |v: [u32; 2]| (u64::from(v[1]) << 32 | u64::from(v[0])) as i64;
        _mm_set_epi64x(join(mn), join(sc))
    }

    /// A `vpshufb` control that zero-extends byte `lo` into every 16-bit lane of the lower
    /// 256 bits and byte `hi` into those of the upper 256 bits.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
    fn spread(lo: i16, hi: i16) -> __m512i {
        // Each 16-bit lane: its low byte picks the source byte, its high byte (0x80) zeroes.
        let lane = |b: i16| _mm512_set1_epi16(b | (0x80u16 << 8) as i16);
        _mm512_mask_blend_epi16(HI16, lane(lo), lane(hi))
    }

    /// Q4_K and Q5_K (the fifth bits in `qh` at bytes 16..48 when `Q5`).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
    fn k45<const R: usize, const B: usize, const Q5: bool>(
        w: &[u8],
        a: [&[BlockQ8K]; R],
    ) -> [f32; R] {
        let m4 = _mm512_set1_epi8(15);
        // Scale lanes: the lower half of vector t holds sub-block 2t, the upper 2t + 1.
        let sc_idx: [__m512i; 4] = std::array::from_fn(|t| spread(2 * t as i16, 2 * t as i16 + 1));
        // Min lanes (bytes 8..16 of the scales): bsums 2j and 2j + 1 belong to sub-block j.
        let z = -128i8;
        let mn_idx = _mm256_setr_epi8(
            8, z, 8, z, 9, z, 9, z, 10, z, 10, z, 11, z, 11, z, 12, z, 12, z, 13, z, 13, z, 14, z,
            14, z, 15, z, 15, z,
        );
        // Q5: the fifth bit of sub-block j is bit j of qh.
        let bit: [__m512i; 4] = std::array::from_fn(|t| {
            _mm512_mask_blend_epi8(
                0xFFFF_FFFF_0000_0000,
                _mm512_set1_epi8(1 << (2 * t)),
                _mm512_set1_epi8((1u8 << (2 * t + 1)) as i8),
            )
        });
        let (mut acc, mut mins) = ([_mm512_setzero_ps(); R], [_mm256_setzero_ps(); R]);
        let q_at = if Q5 { 48 } else { 16 };
        for (i, wb) in w.as_chunks::<B>().0.iter().enumerate() {
            let sc = _mm512_broadcast_i32x4(k_scales(&wb[4..16]));
            let scv: [__m512i; 4] = std::array::from_fn(|t| _mm512_shuffle_epi8(sc, sc_idx[t]));
            let mnv = _mm256_shuffle_epi8(_mm512_castsi512_si256(sc), mn_idx);
            // SAFETY: for Q5, wb[16..48] is the 32-byte qh (never read otherwise).
            let qh = _mm512_broadcast_i64x4(if Q5 {
                unsafe { load32(&wb[16..]) }
            } else {
                _mm256_setzero_si256()
            });
            let qs: [__m512i; 4] = std::array::from_fn(|t| {
                // SAFETY: wb[q_at + 32t..] holds at least 32 bytes (t < 4, B bytes).
                let g = _mm512_broadcast_i64x4(unsafe { load32(&wb[q_at + 32 * t..]) });
                // Low nibbles (sub-block 2t) below, high nibbles (2t + 1) above.
                let q = _mm512_and_si512(_mm512_mask_srli_epi16::<4>(g, HI16, g), m4);
                if Q5 {
                    let k = _mm512_test_epi8_mask(qh, bit[t]);
                    _mm512_mask_add_epi8(q, k, q, _mm512_set1_epi8(16))
                } else {
                    q
                }
            });
            let (d, dmin) = (half(wb, 0), half(wb, 2));
            for r in 0..R {
                let ab = &a[r][i];
                let mut sumi = _mm512_setzero_si512();
                for (t, (q, s)) in qs.iter().zip(&scv).enumerate() {
                    // SAFETY: ab.qs holds 256 bytes; 64t + 64 <= 256.
                    let x = unsafe { load64(&ab.qs[64 * t..]) };
                    sumi = _mm512_dpwssd_epi32(sumi, _mm512_maddubs_epi16(*q, x), *s);
                }
                acc[r] =
                    _mm512_fmadd_ps(_mm512_set1_ps(d * ab.d), _mm512_cvtepi32_ps(sumi), acc[r]);
                // SAFETY: bsums holds 16 i16 (32 bytes).
                let bs = unsafe { load32(&ab.bsums[..]) };
                let m = _mm256_cvtepi32_ps(_mm256_madd_epi16(bs, mnv));
                mins[r] = _mm256_fmadd_ps(_mm256_set1_ps(dmin * ab.d), m, mins[r]);
            }
        }
        std::array::from_fn(|r| minus_reduce(acc[r], mins[r]))
    }

    /// The sum of `acc`'s lanes minus the sum of `minus`'s (one reduction).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
    fn minus_reduce(acc: __m512, minus: __m256) -> f32 {
        _mm512_reduce_add_ps(_mm512_sub_ps(acc, _mm512_zextps256_ps512(minus)))
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
    pub unsafe fn q4_k<const R: usize>(w: &[u8], a: [&[BlockQ8K]; R]) -> [f32; R] {
        k45::<R, 144, false>(w, a)
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
    pub unsafe fn q5_k<const R: usize>(w: &[u8], a: [&[BlockQ8K]; R]) -> [f32; R] {
        k45::<R, 176, true>(w, a)
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
    pub unsafe fn q6_k<const R: usize>(w: &[u8], a: [&[BlockQ8K]; R]) -> [f32; R] {
        let (m4, m30) = (_mm512_set1_epi8(15), _mm512_set1_epi8(0x30));
        // Vector s holds sub-blocks 4s..4s + 4, one per 128-bit lane.
        let sc_idx: [__m512i; 4] = std::array::from_fn(|s| {
            let l = |j: i16| _mm512_set1_epi16(4 * s as i16 + j);
            let lo = _mm512_mask_blend_epi16(0x0000_FF00, l(0), l(1));
            let hi = _mm512_mask_blend_epi16(0xFF00_0000, l(2), l(3));
            _mm512_mask_blend_epi16(HI16, lo, hi)
        });
        let (mut acc, mut offs) = ([_mm512_setzero_ps(); R], [_mm256_setzero_ps(); R]);
        for (i, wb) in w.as_chunks::<210>().0.iter().enumerate() {
            // SAFETY: wb[192..208] holds the 16 i8 scales.
            let sc16 = _mm256_cvtepi8_epi16(unsafe { load16(&wb[192..]) });
            let sc = _mm512_castsi256_si512(sc16);
            let scv: [__m512i; 4] =
                std::array::from_fn(|s| _mm512_permutexvar_epi16(sc_idx[s], sc));
            let mut q = [_mm512_setzero_si512(); 4];
            for h in 0..2 {
                // SAFETY: ql is wb[0..128] (64 bytes at 64h), qh wb[128..192] (32 at 32h).
                let (ql, qh) = unsafe {
                    (
                        load64(&wb[64 * h..]),
                        _mm512_broadcast_i64x4(load32(&wb[128 + 32 * h..])),
                    )
                };
                // Elements 128h + 0..64: low nibbles of ql, qh bits 0-1 (lower half) and 2-3
                // (upper half) moved to bits 4-5.
                let hl = _mm512_mask_slli_epi16::<2>(_mm512_slli_epi16::<4>(qh), HI16, qh);
                q[2 * h] = _mm512_or_si512(_mm512_and_si512(ql, m4), _mm512_and_si512(hl, m30));
                // Elements 128h + 64..128: high nibbles, qh bits 4-5 and 6-7.
                let hh = _mm512_mask_srli_epi16::<2>(qh, HI16, qh);
                let qhi = _mm512_and_si512(_mm512_srli_epi16::<4>(ql), m4);
                q[2 * h + 1] = _mm512_or_si512(qhi, _mm512_and_si512(hh, m30));
            }
            let d = half(wb, 208);
            for r in 0..R {
                let ab = &a[r][i];
                let mut sumi = _mm512_setzero_si512();
                for (s, (q, sv)) in q.iter().zip(&scv).enumerate() {
                    // SAFETY: ab.qs holds 256 bytes; 64s + 64 <= 256.
                    let x = unsafe { load64(&ab.qs[64 * s..]) };
                    sumi = _mm512_dpwssd_epi32(sumi, _mm512_maddubs_epi16(*q, x), *sv);
                }
                let dd = d * ab.d;
                acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(dd), _mm512_cvtepi32_ps(sumi), acc[r]);
                // The -32 of every weight: 32 * sum(scale_s * bsums_s).
                // SAFETY: bsums holds 16 i16 (32 bytes).
                let bs = unsafe { load32(&ab.bsums[..]) };
                let o = _mm256_cvtepi32_ps(_mm256_madd_epi16(bs, sc16));
                offs[r] = _mm256_fmadd_ps(_mm256_set1_ps(32.0 * dd), o, offs[r]);
            }
        }
        std::array::from_fn(|r| minus_reduce(acc[r], offs[r]))
    }

    /// 16 f16 (or bf16 when `BF16`) widened to f32.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
    fn widen<const BF16: bool>(h: __m256i) -> __m512 {
        if BF16 {
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
        } else {
            _mm512_cvtph_ps(h)
        }
    }

    /// `sum_i w[i] * a[r][i]` for f16 (bf16 when `BF16`) `w`, 32 elements per step and a
    /// scalar tail.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
    fn dot_wide<const R: usize, const BF16: bool>(w: &[u8], a: [&[f32]; R]) -> [f32; R] {
        let mut acc = [[_mm512_setzero_ps(); 2]; R];
        let wc = w.as_chunks::<64>().0;
        let steps = a.iter().fold(wc.len(), |n, a| n.min(a.len() / 32));
        for (s, wb) in wc[..steps].iter().enumerate() {
            // SAFETY: wb holds 64 bytes: 32 at 0 and 32.
            let h = unsafe {
                [
                    widen::<BF16>(load32(&wb[..])),
                    widen::<BF16>(load32(&wb[32..])),
                ]
            };
            for r in 0..R {
                let x = &a[r][32 * s..32 * s + 32];
                for (u, acc) in acc[r].iter_mut().enumerate() {
                    // SAFETY: x holds 32 floats: 16 at 0 and 16.
                    let v = unsafe { _mm512_loadu_ps(x[16 * u..].as_ptr()) };
                    *acc = _mm512_fmadd_ps(h[u], v, *acc);
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
            let tail: f32 = (32 * steps..a[r].len()).map(|i| widen1(i) * a[r][i]).sum();
            _mm512_reduce_add_ps(_mm512_add_ps(acc[r][0], acc[r][1])) + tail
        })
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
    pub unsafe fn f16<const R: usize>(w: &[u8], a: [&[f32]; R]) -> [f32; R] {
        dot_wide::<R, false>(w, a)
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
    pub unsafe fn bf16<const R: usize>(w: &[u8], a: [&[f32]; R]) -> [f32; R] {
        dot_wide::<R, true>(w, a)
    }
}
