//! GGML element types: block layouts of every known type and one dequantizer per type Kiln reads.
//!
//! Block layouts (little-endian; `d`/`dmin` are f16; ggml `ggml-common.h` semantics):
//!
//! ```text
//! Q8_0 (32 elems, 34 B):  d | qs[32] i8                       y[i] = d * qs[i]
//! Q4_0 (32 elems, 18 B):  d | qs[16] nibbles                  y[j] = d * ((qs[j] & 15) - 8)
//!                                                              y[j+16] = d * ((qs[j] >> 4) - 8)
//! Q4_K (256 elems, 144 B): d | dmin | scales[12] | qs[128]
//!   8 sub-blocks of 32 with 6-bit scale sc and 6-bit min m:     y = d*sc * q - dmin*m
//!   scales[12]: bytes 0..4 = sc0..3 (low 6 bits), bytes 4..8 = m0..3 (low 6 bits),
//!   bytes 8..12 = low 4 bits sc4..7 | high 4 bits m4..7; the top 2 bits of bytes 0..4
//!   (resp. 4..8) are the high bits of sc4..7 (resp. m4..7).
//!   qs: four 32-byte groups; group g holds sub-block 2g in low nibbles, 2g+1 in high.
//! Q5_K (256 elems, 176 B): d | dmin | scales[12] | qh[32] | qs[128]
//!   as Q4_K (same scales, same nibble groups), plus a fifth bit: element l of sub-block j
//!   adds 16 when bit j of qh[l] is set (l in 0..32).                y = d*sc * q - dmin*m
//! Q6_K (256 elems, 210 B): ql[128] | qh[64] | scales[16] i8 | d
//!   two halves of 128; in half h, for l in 0..32 (ql' = ql[64h..], qh' = qh[32h..]):
//!     q(l)    = ql'[l]    & 15 | (qh'[l] >> 0 & 3) << 4       sub-block  l/16
//!     q(l+32) = ql'[l+32] & 15 | (qh'[l] >> 2 & 3) << 4       sub-block  l/16 + 2
//!     q(l+64) = ql'[l]    >> 4 | (qh'[l] >> 4 & 3) << 4       sub-block  l/16 + 4
//!     q(l+96) = ql'[l+32] >> 4 | (qh'[l] >> 6 & 3) << 4       sub-block  l/16 + 6
//!   y = d * scales[8h + sub-block] * (q - 32)
//! MXFP4 (32 elems, 17 B): e | qs[16] nibbles (E2M1)      y[j]    = 2^(e-128) * KV[qs[j] & 15]
//!                                                          y[j+16] = 2^(e-128) * KV[qs[j] >> 4]
//!   e: E8M0 exponent byte (scale 2^(e-127), halved because KV holds the E2M1 values doubled);
//!   ggml gives 255 no NaN meaning: 2^127. KV = 0 1 2 3 4 6 8 12, then the same negated
//!   (nibble 8 is -0: 0). ggml's `kvalues_mxfp4` and `ggml_e8m0_to_fp32_half`.
//! ```

use std::fmt;

use half::{bf16, f16};
use rayon::prelude::*;

/// GGML tensor element types. The named variants are the ones Kiln dequantizes; any other
/// ggml type id parses as `Other(id)` (`LAYOUTS` below names every known id).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    BF16,
    Q8_0,
    Q4_0,
    Q4K,
    Q5K,
    Q6K,
    /// OCP microscaling FP4: E2M1 values, one E8M0 exponent per 32 (ggml type 39).
    Mxfp4,
    /// A ggml type id Kiln cannot dequantize (e.g. 11 = Q3_K) or does not know at all.
    Other(u32),
}

/// Elements per Q8_0 / Q4_0 / MXFP4 block.
pub const QK32: usize = 32;
/// Elements per k-quant super-block (Q4_K, Q5_K, Q6_K).
pub const QK_K: usize = 256;

const Q8_0_BYTES: usize = 34;
const Q4_0_BYTES: usize = 18;
const Q4_K_BYTES: usize = 144;
const Q5_K_BYTES: usize = 176;
const Q6_K_BYTES: usize = 210;
const MXFP4_BYTES: usize = 17;

/// The E2M1 values doubled, by nibble (ggml's `kvalues_mxfp4`): MXFP4 weights are these
/// integers times [`e8m0_to_f32_half`] of their block's exponent byte.
pub const MXFP4_VALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// Half the E8M0 scale `2^(e - 127)`, i.e. `2^(e - 128)`, exactly (bits built directly;
/// `e` 0 and 1 give the subnormals 2^-128 and 2^-127; 255 gives 2^127, as ggml's
/// `ggml_e8m0_to_fp32_half`, which has no NaN).
#[inline]
pub fn e8m0_to_f32_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        u32::from(e - 1) << 23
    };
    f32::from_bits(bits)
}

/// Tensors with at least this many elements are dequantized on the rayon pool.
const PARALLEL_MIN_ELEMENTS: usize = 1 << 16;

/// Why a buffer could not be dequantized.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    /// The type has no dequantizer in Kiln.
    #[error("Kiln cannot dequantize tensors of type {0}")]
    Unsupported(GgmlType),
    /// The element count does not fill whole blocks.
    #[error("{ty}: {n_elements} elements is not a multiple of the block size {block}")]
    PartialBlock {
        ty: GgmlType,
        n_elements: u64,
        block: u64,
    },
    /// The byte count does not match the element count.
    #[error("{ty}: {n_elements} elements need {expected} bytes, got {got}")]
    ByteCount {
        ty: GgmlType,
        n_elements: u64,
        expected: u64,
        got: u64,
    },
    /// The byte size of the element count does not fit in a u64.
    #[error("{ty}: byte size of {n_elements} elements overflows")]
    Overflow { ty: GgmlType, n_elements: u64 },
}

/// Every ggml type id with a known layout: (id, name, elements per block, bytes per block).
/// Ids 4, 5, 31..=33 and 36..=38 were removed from ggml and have no layout.
const LAYOUTS: &[(u32, &str, u64, u64)] = &[
    (0, "F32", 1, 4),
    (1, "F16", 1, 2),
    (2, "Q4_0", 32, 18),
    (3, "Q4_1", 32, 20),
    (6, "Q5_0", 32, 22),
    (7, "Q5_1", 32, 24),
    (8, "Q8_0", 32, 34),
    (9, "Q8_1", 32, 36),
    (10, "Q2_K", 256, 84),
    (11, "Q3_K", 256, 110),
    (12, "Q4_K", 256, 144),
    (13, "Q5_K", 256, 176),
    (14, "Q6_K", 256, 210),
    (15, "Q8_K", 256, 292),
    (16, "IQ2_XXS", 256, 66),
    (17, "IQ2_XS", 256, 74),
    (18, "IQ3_XXS", 256, 98),
    (19, "IQ1_S", 256, 50),
    (20, "IQ4_NL", 32, 18),
    (21, "IQ3_S", 256, 110),
    (22, "IQ2_S", 256, 82),
    (23, "IQ4_XS", 256, 136),
    (24, "I8", 1, 1),
    (25, "I16", 1, 2),
    (26, "I32", 1, 4),
    (27, "I64", 1, 8),
    (28, "F64", 1, 8),
    (29, "IQ1_M", 256, 56),
    (30, "BF16", 1, 2),
    (34, "TQ1_0", 256, 54),
    (35, "TQ2_0", 256, 66),
    (39, "MXFP4", 32, 17),
    (40, "NVFP4", 64, 36),
    (41, "Q1_0", 128, 18),
];

impl GgmlType {
    /// The type for a ggml type id; ids Kiln cannot dequantize become `Other(id)`.
    pub fn from_id(id: u32) -> GgmlType {
        match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            8 => GgmlType::Q8_0,
            12 => GgmlType::Q4K,
            13 => GgmlType::Q5K,
            14 => GgmlType::Q6K,
            30 => GgmlType::BF16,
            39 => GgmlType::Mxfp4,
            other => GgmlType::Other(other),
        }
    }

    /// The ggml type id (inverse of [`GgmlType::from_id`]).
    pub fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q8_0 => 8,
            GgmlType::Q4K => 12,
            GgmlType::Q5K => 13,
            GgmlType::Q6K => 14,
            GgmlType::BF16 => 30,
            GgmlType::Mxfp4 => 39,
            GgmlType::Other(id) => id,
        }
    }

    fn layout(self) -> Option<(&'static str, u64, u64)> {
        let id = self.id();
        LAYOUTS
            .iter()
            .find(|entry| entry.0 == id)
            .map(|&(_, name, block, bytes)| (name, block, bytes))
    }

    /// ggml's name for the type ("Q4_K", "IQ2_XXS", ...); "unknown" for an id with no known layout.
    pub fn name(self) -> &'static str {
        self.layout().map_or("unknown", |l| l.0)
    }

    /// Elements per block (1 for plain types); None for an id with no known layout.
    pub fn block_size(self) -> Option<u64> {
        self.layout().map(|l| l.1)
    }

    /// Bytes per block; None for an id with no known layout.
    pub fn block_bytes(self) -> Option<u64> {
        self.layout().map(|l| l.2)
    }

    /// Whether [`dequantize`] handles this type (every variant except `Other`).
    pub fn is_supported(self) -> bool {
        !matches!(self, GgmlType::Other(_))
    }

    /// Exact byte size of `n_elements` elements of this type, checked: the count must fill
    /// whole blocks and the size must not overflow.
    pub fn byte_size(self, n_elements: u64) -> Result<u64, QuantError> {
        let (block, bytes) = match self.layout() {
            Some((_, block, bytes)) => (block, bytes),
            None => return Err(QuantError::Unsupported(self)),
        };
        if !n_elements.is_multiple_of(block) {
            return Err(QuantError::PartialBlock {
                ty: self,
                n_elements,
                block,
            });
        }
        (n_elements / block)
            .checked_mul(bytes)
            .ok_or(QuantError::Overflow {
                ty: self,
                n_elements,
            })
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.layout() {
            Some((name, _, _)) => f.write_str(name),
            None => write!(f, "unknown type {}", self.id()),
        }
    }
}

/// Dequantizes `bytes` of type `ty` into `out` (one f32 per element, GGUF order).
/// `out.len()` is the element count; `bytes` must hold exactly that many elements.
/// Writes every element of `out` on success and nothing useful on error.
pub fn dequantize(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    match ty {
        GgmlType::F32 => dequantize_f32(bytes, out),
        GgmlType::F16 => dequantize_f16(bytes, out),
        GgmlType::BF16 => dequantize_bf16(bytes, out),
        GgmlType::Q8_0 => dequantize_q8_0(bytes, out),
        GgmlType::Q4_0 => dequantize_q4_0(bytes, out),
        GgmlType::Q4K => dequantize_q4_k(bytes, out),
        GgmlType::Q5K => dequantize_q5_k(bytes, out),
        GgmlType::Q6K => dequantize_q6_k(bytes, out),
        GgmlType::Mxfp4 => dequantize_mxfp4(bytes, out),
        GgmlType::Other(_) => Err(QuantError::Unsupported(ty)),
    }
}

/// Dequantizes into a new vector of `n_elements` f32. The byte count is checked before
/// allocating, so the allocation is bounded by a small multiple of `bytes.len()`.
pub fn dequantize_to_vec(
    ty: GgmlType,
    bytes: &[u8],
    n_elements: u64,
) -> Result<Vec<f32>, QuantError> {
    if !ty.is_supported() {
        return Err(QuantError::Unsupported(ty));
    }
    check_bytes(ty, bytes.len(), n_elements)?;
    let n = usize::try_from(n_elements).map_err(|_| QuantError::Overflow { ty, n_elements })?;
    let mut out = vec![0.0f32; n];
    dequantize(ty, bytes, &mut out)?;
    Ok(out)
}

fn check_bytes(ty: GgmlType, got: usize, n_elements: u64) -> Result<(), QuantError> {
    let expected = ty.byte_size(n_elements)?;
    if expected != got as u64 {
        return Err(QuantError::ByteCount {
            ty,
            n_elements,
            expected,
            got: got as u64,
        });
    }
    Ok(())
}

/// Checks the sizes, then runs `block` on each (input block, output block) pair,
/// in parallel for large tensors.
fn for_each_block<const B: usize, const E: usize>(
    ty: GgmlType,
    bytes: &[u8],
    out: &mut [f32],
    block: impl Fn(&[u8; B], &mut [f32; E]) + Sync,
) -> Result<(), QuantError> {
    check_bytes(ty, bytes.len(), out.len() as u64)?;
    let (src, _) = bytes.as_chunks::<B>();
    let (dst, _) = out.as_chunks_mut::<E>();
    if dst.len() * E >= PARALLEL_MIN_ELEMENTS {
        src.par_iter()
            .zip(dst.par_iter_mut())
            .with_min_len(64)
            .for_each(|(s, d)| block(s, d));
    } else {
        src.iter()
            .zip(dst.iter_mut())
            .for_each(|(s, d)| block(s, d));
    }
    Ok(())
}

fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// F32: little-endian IEEE floats, copied bit for bit.
pub fn dequantize_f32(bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    for_each_block::<4, 1>(GgmlType::F32, bytes, out, |s, d| {
        d[0] = f32::from_le_bytes(*s);
    })
}

/// F16: IEEE half floats, widened exactly.
pub fn dequantize_f16(bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    for_each_block::<2, 1>(GgmlType::F16, bytes, out, |s, d| {
        d[0] = f16::from_le_bytes(*s).to_f32();
    })
}

/// BF16: the top 16 bits of an f32, widened exactly.
pub fn dequantize_bf16(bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    for_each_block::<2, 1>(GgmlType::BF16, bytes, out, |s, d| {
        d[0] = bf16::from_le_bytes(*s).to_f32();
    })
}

/// Q8_0: blocks of 32 elements, `d * qs[i]`.
pub fn dequantize_q8_0(bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    for_each_block::<Q8_0_BYTES, QK32>(GgmlType::Q8_0, bytes, out, |s, y| {
        let d = f16_at(s, 0);
        for (y, &q) in y.iter_mut().zip(&s[2..]) {
            *y = d * f32::from(q as i8);
        }
    })
}

/// Q4_0: blocks of 32 elements, `d * (q - 8)`; low nibbles are elements 0..16, high 16..32.
pub fn dequantize_q4_0(bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    for_each_block::<Q4_0_BYTES, QK32>(GgmlType::Q4_0, bytes, out, |s, y| {
        let d = f16_at(s, 0);
        let (lo, hi) = y.split_at_mut(QK32 / 2);
        for ((&q, lo), hi) in s[2..].iter().zip(lo).zip(hi) {
            *lo = d * f32::from((q & 0x0F) as i8 - 8);
            *hi = d * f32::from((q >> 4) as i8 - 8);
        }
    })
}

/// The 6-bit (scale, min) of sub-block `j` (0..8) of a Q4_K or Q5_K block's packed `scales[12]`.
pub fn q4_k_scale_min(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// Q4_K: super-blocks of 256 elements in 8 sub-blocks of 32, `d*sc * q - dmin*m`.
pub fn dequantize_q4_k(bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    for_each_block::<Q4_K_BYTES, QK_K>(GgmlType::Q4K, bytes, out, |s, y| {
        let d = f16_at(s, 0);
        let dmin = f16_at(s, 2);
        let scales = &s[4..16];
        let qs = &s[16..];
        for (g, (q, y)) in qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
            let (sc1, m1) = q4_k_scale_min(2 * g, scales);
            let (sc2, m2) = q4_k_scale_min(2 * g + 1, scales);
            let (d1, min1) = (d * f32::from(sc1), dmin * f32::from(m1));
            let (d2, min2) = (d * f32::from(sc2), dmin * f32::from(m2));
            let (lo, hi) = y.split_at_mut(32);
            for ((&q, lo), hi) in q.iter().zip(lo).zip(hi) {
                *lo = d1 * f32::from(q & 0x0F) - min1;
                *hi = d2 * f32::from(q >> 4) - min2;
            }
        }
    })
}

/// Q5_K: super-blocks of 256 elements in 8 sub-blocks of 32, `d*sc * q - dmin*m` with 5-bit `q`.
pub fn dequantize_q5_k(bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    for_each_block::<Q5_K_BYTES, QK_K>(GgmlType::Q5K, bytes, out, |s, y| {
        let d = f16_at(s, 0);
        let dmin = f16_at(s, 2);
        let scales = &s[4..16];
        let qh = &s[16..48];
        let qs = &s[48..];
        for (g, (q, y)) in qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
            let (sc1, m1) = q4_k_scale_min(2 * g, scales);
            let (sc2, m2) = q4_k_scale_min(2 * g + 1, scales);
            let (d1, min1) = (d * f32::from(sc1), dmin * f32::from(m1));
            let (d2, min2) = (d * f32::from(sc2), dmin * f32::from(m2));
            let (lo, hi) = y.split_at_mut(32);
            for (l, (lo, hi)) in lo.iter_mut().zip(hi).enumerate() {
                let h1 = ((qh[l] >> (2 * g)) & 1) << 4;
                let h2 = ((qh[l] >> (2 * g + 1)) & 1) << 4;
                *lo = d1 * f32::from((q[l] & 0x0F) | h1) - min1;
                *hi = d2 * f32::from((q[l] >> 4) | h2) - min2;
            }
        }
    })
}

/// Q6_K: super-blocks of 256 elements in 16 sub-blocks of 16, `d*scale * (q - 32)`.
pub fn dequantize_q6_k(bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    for_each_block::<Q6_K_BYTES, QK_K>(GgmlType::Q6K, bytes, out, |s, y| {
        let (ql, rest) = s.split_at(128);
        let (qh, rest) = rest.split_at(64);
        let (scales, d) = rest.split_at(16);
        let d = f16::from_le_bytes([d[0], d[1]]).to_f32();
        for h in 0..2 {
            let ql = &ql[64 * h..64 * h + 64];
            let qh = &qh[32 * h..32 * h + 32];
            let sc = &scales[8 * h..8 * h + 8];
            let y = &mut y[128 * h..128 * h + 128];
            for l in 0..32 {
                let is = l / 16;
                let q = [
                    (ql[l] & 0x0F) | ((qh[l] & 3) << 4),
                    (ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4),
                    (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4),
                    (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4),
                ];
                for (k, &q) in q.iter().enumerate() {
                    let scale = d * f32::from(sc[is + 2 * k] as i8);
                    y[l + 32 * k] = scale * f32::from(q as i8 - 32);
                }
            }
        }
    })
}

/// MXFP4: blocks of 32 elements, `2^(e-128) * KV[q]` (see the layout above); low nibbles are
/// elements 0..16, high 16..32. Exact: every product is a small integer times a power of two
/// (those of `e` 254 and 255 past f32's range are infinite, as in ggml).
pub fn dequantize_mxfp4(bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    for_each_block::<MXFP4_BYTES, QK32>(GgmlType::Mxfp4, bytes, out, |s, y| {
        let d = e8m0_to_f32_half(s[0]);
        let (lo, hi) = y.split_at_mut(QK32 / 2);
        for ((&q, lo), hi) in s[1..].iter().zip(lo).zip(hi) {
            *lo = d * f32::from(MXFP4_VALUES[usize::from(q & 0x0F)]);
            *hi = d * f32::from(MXFP4_VALUES[usize::from(q >> 4)]);
        }
    })
}
