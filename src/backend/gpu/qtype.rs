//! The quantized weight types the GPU has kernels for, and their device layout: each file
//! block split into per-row planes (quants, then scales), every plane 256-byte aligned, so
//! a matrix takes its file's bytes plus less than 256 bytes of padding per plane.

use rayon::prelude::*;

use crate::backend::quant::GgmlType;

/// A quantized weight type with device kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QType {
    Q8_0,
    Q4_0,
    Q4K,
    Q5K,
    Q6K,
    /// OCP microscaling FP4 (ggml type 39): E2M1 nibbles, one E8M0 exponent per 32.
    Mxfp4,
}

/// Bytes of each plane start are aligned to this (`plane_align` in `kernels/qgemv.cu`).
pub(super) const PLANE_ALIGN: usize = 256;

impl QType {
    /// Every quantized type, in kernel load order.
    pub const ALL: [QType; 6] = [
        QType::Q8_0,
        QType::Q4_0,
        QType::Q4K,
        QType::Q5K,
        QType::Q6K,
        QType::Mxfp4,
    ];

    /// The device type of a file type; `None` for plain types (F32, F16, BF16) and types
    /// without kernels.
    pub fn of(ty: GgmlType) -> Option<QType> {
        match ty {
            GgmlType::Q8_0 => Some(QType::Q8_0),
            GgmlType::Q4_0 => Some(QType::Q4_0),
            GgmlType::Q4K => Some(QType::Q4K),
            GgmlType::Q5K => Some(QType::Q5K),
            GgmlType::Q6K => Some(QType::Q6K),
            GgmlType::Mxfp4 => Some(QType::Mxfp4),
            _ => None,
        }
    }

    /// The kernel name piece (`q4k`; one alphanumeric run).
    pub fn tag(self) -> &'static str {
        match self {
            QType::Q8_0 => "q80",
            QType::Q4_0 => "q40",
            QType::Q4K => "q4k",
            QType::Q5K => "q5k",
            QType::Q6K => "q6k",
            QType::Mxfp4 => "mxfp4",
        }
    }

    #[cfg(test)]
    pub(super) fn ggml(self) -> GgmlType {
        match self {
            QType::Q8_0 => GgmlType::Q8_0,
            QType::Q4_0 => GgmlType::Q4_0,
            QType::Q4K => GgmlType::Q4K,
            QType::Q5K => GgmlType::Q5K,
            QType::Q6K => GgmlType::Q6K,
            QType::Mxfp4 => GgmlType::Mxfp4,
        }
    }

    /// (elements, bytes) of one file block.
    pub(super) fn block(self) -> (usize, usize) {
        match self {
            QType::Q8_0 => (32, 34),
            QType::Q4_0 => (32, 18),
            QType::Q4K => (256, 144),
            QType::Q5K => (256, 176),
            QType::Q6K => (256, 210),
            QType::Mxfp4 => (32, 17),
        }
    }

    /// The byte ranges of a file block that go to each plane, in plane order.
    pub(super) fn pieces(self) -> &'static [(usize, usize)] {
        match self {
            QType::Q8_0 => &[(2, 32), (0, 2)],
            QType::Q4_0 => &[(2, 16), (0, 2)],
            QType::Q4K => &[(16, 128), (0, 16)],
            QType::Q5K => &[(48, 128), (16, 32), (0, 16)],
            QType::Q6K => &[(0, 128), (128, 64), (192, 16), (208, 2)],
            // The nibbles (16-byte loads), then the E8M0 exponent bytes.
            QType::Mxfp4 => &[(1, 16), (0, 1)],
        }
    }

    /// (start, bytes per row) of each plane of a `[rows, k]` matrix, and the total bytes.
    pub fn planes(self, rows: usize, k: usize) -> (Vec<(usize, usize)>, usize) {
        let nb = k / self.block().0;
        let mut at = 0usize;
        let mut planes = Vec::new();
        for &(_, len) in self.pieces() {
            at = at.next_multiple_of(PLANE_ALIGN);
            planes.push((at, nb * len));
            at += rows * nb * len;
        }
        (planes, at)
    }

    /// The device layout of `bytes`, a `[rows, k]` matrix of file blocks.
    #[cfg(test)]
    pub fn repack(self, bytes: &[u8], rows: usize, k: usize) -> Vec<u8> {
        let (planes, total) = self.planes(rows, k);
        let mut out = vec![0u8; total];
        for (i, &(start, row_bytes)) in planes.iter().enumerate() {
            self.repack_rows(bytes, k, i, 0, &mut out[start..start + rows * row_bytes]);
        }
        out
    }

    /// Rows `j0..` of plane `plane` of `bytes` (a matrix of file blocks, `k` columns) into
    /// `out`, as many whole plane rows as it holds (the upload stages a matrix this way, a
    /// chunk at a time).
    pub fn repack_rows(self, bytes: &[u8], k: usize, plane: usize, j0: usize, out: &mut [u8]) {
        let (elems, bb) = self.block();
        let nb = k / elems;
        let (from, len) = self.pieces()[plane];
        let row_bytes = nb * len;
        if row_bytes == 0 {
            return;
        }
        out.par_chunks_exact_mut(row_bytes)
            .enumerate()
            .for_each(|(i, row)| {
                let j = j0 + i;
                let src = &bytes[j * nb * bb..(j + 1) * nb * bb];
                for (dst, block) in row.chunks_exact_mut(len).zip(src.chunks_exact(bb)) {
                    dst.copy_from_slice(&block[from..from + len]);
                }
            });
    }
}
