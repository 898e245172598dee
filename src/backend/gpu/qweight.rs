//! Weights on the device in their file's type: GGUF quantized blocks repacked once at load
//! into planes (`kernels/qgemv.cu` documents the layout; the bits per weight stay the
//! file's), F16/BF16 converted on the device to the compute type, F32 as values. A stacked
//! weight (fused qkv, gate/up) keeps one part per file tensor, each in its own type; nothing
//! is dequantized into a full-size buffer except the one reused matmul scratch of batch
//! steps (`matmul.rs`).

use super::args::{ConvertArgs, DequantArgs};
use super::device::DevBuf;
use super::qtype::QType;
use super::runtime::{Grid, Runtime};
use super::{GpuBackend, invalid};
use crate::backend::quant::GgmlType;
use crate::backend::{BackendError, HostData, HostTensor};

/// One row range of a weight, in one storage.
#[derive(Debug)]
pub struct WeightPart {
    pub(super) buf: DevBuf,
    /// `None`: the compute type's elements, row-major.
    pub(super) q: Option<QType>,
    pub(super) row0: usize,
    pub(super) rows: usize,
}

/// Largest device staging buffer of an on-device F16/BF16 conversion.
const STAGE_BYTES: usize = 32 << 20;

impl<R: Runtime> GpuBackend<R> {
    /// Uploads `w`'s parts: one dense buffer when every part is plain (F32/F16/BF16), else one
    /// part per file tensor, each quantized type in its device layout (a type without one is
    /// refused). A vector is plain.
    pub(super) fn upload_parts(&mut self, w: HostTensor) -> Result<Vec<WeightPart>, BackendError> {
        let (rows, cols) = (w.rows(), w.cols());
        let parts = match w.data {
            HostData::Stacked(parts) => parts,
            _ => vec![w],
        };
        // Float parts go dense; a quantized matrix keeps its type on the device (MXFP4
        // included: its file bytes, in planes) or is refused (never dequantized here behind
        // the caller's back).
        let plain = |p: &HostTensor| {
            matches!(
                p.weight_type(),
                GgmlType::F32 | GgmlType::F16 | GgmlType::BF16
            )
        };
        if parts.iter().all(plain) || parts.iter().any(|p| p.shape.len() < 2) {
            let buf = self
                .ctx
                .dev
                .alloc(rows * cols * self.ctx.dt.size(), "weight")?;
            let mut row0 = 0;
            for p in parts {
                let n = p.rows();
                self.upload_plain(&buf, row0 * cols * self.ctx.dt.size(), p)?;
                row0 += n;
            }
            return Ok(vec![WeightPart {
                buf,
                q: None,
                row0: 0,
                rows,
            }]);
        }
        let mut out = Vec::with_capacity(parts.len());
        let mut row0 = 0;
        for p in parts {
            let n = p.rows();
            let HostData::Raw { ty, bytes } = &p.data else {
                return Err(unsupported(
                    R::NAME,
                    format!("a stack of quantized and plain parts ({})", p.type_label()),
                ));
            };
            let q = QType::of(*ty).ok_or_else(|| unsupported(R::NAME, ty.to_string()))?;
            if !cols.is_multiple_of(q.block().0) || cols > i32::MAX as usize {
                return Err(unsupported(R::NAME, format!("{ty} with {cols} columns")));
            }
            let buf = self.upload_repacked(q, bytes, n, cols)?;
            out.push(WeightPart {
                buf,
                q: Some(q),
                row0,
                rows: n,
            });
            row0 += n;
        }
        Ok(out)
    }

    /// A device buffer with `bytes` (`rows` x `k` file blocks of `q`) in its device layout,
    /// repacked and uploaded a chunk of plane rows at a time (no host copy of the matrix).
    fn upload_repacked(
        &mut self,
        q: QType,
        bytes: &[u8],
        rows: usize,
        k: usize,
    ) -> Result<DevBuf, BackendError> {
        let (planes, total) = q.planes(rows, k);
        let buf = self.ctx.dev.alloc(total, "weight")?;
        for (i, &(start, row_bytes)) in planes.iter().enumerate() {
            if row_bytes == 0 {
                continue;
            }
            let fill = |at: usize, out: &mut [u8]| q.repack_rows(bytes, k, i, at / row_bytes, out);
            self.ctx
                .dev
                .upload_with(&buf, start, rows * row_bytes, row_bytes, &fill)?;
        }
        Ok(buf)
    }

    /// Writes plain tensor `p` as compute-type elements at byte `offset` of `buf`.
    fn upload_plain(
        &mut self,
        buf: &DevBuf,
        offset: usize,
        p: HostTensor,
    ) -> Result<(), BackendError> {
        let ty = p.weight_type();
        let bf16 = match (&p.data, ty) {
            (HostData::Raw { .. }, GgmlType::F16) => false,
            (HostData::Raw { .. }, GgmlType::BF16) => true,
            (HostData::F32(v), _) => {
                let bytes = self.ctx.dt.encode(v);
                return self.ctx.dev.upload(buf, offset, &bytes);
            }
            _ => {
                // Quantized vectors (never seen in practice) are tiny: values on the host.
                let v = p.into_f32()?;
                let bytes = self.ctx.dt.encode(v.values().unwrap_or_default());
                return self.ctx.dev.upload(buf, offset, &bytes);
            }
        };
        let HostData::Raw { bytes, .. } = &p.data else {
            return Err(unsupported(R::NAME, ty.to_string()));
        };
        let copy = |at: usize, out: &mut [u8]| out.copy_from_slice(&bytes[at..at + out.len()]);
        if bf16 && self.ctx.dt == crate::backend::DType::Bf16 {
            return self.ctx.dev.upload_with(buf, offset, bytes.len(), 1, &copy);
        }
        let stage = self
            .ctx
            .dev
            .alloc(bytes.len().min(STAGE_BYTES), "weight staging")?;
        let size = self.ctx.dt.size() as u64;
        for (i, chunk) in bytes.chunks(STAGE_BYTES).enumerate() {
            let at = i * STAGE_BYTES;
            let fill = |a: usize, out: &mut [u8]| copy(at + a, out);
            // Stream order keeps the next chunk's copy behind this chunk's conversion.
            self.ctx.dev.upload_with(&stage, 0, chunk.len(), 1, &fill)?;
            let total = (chunk.len() / 2) as u64;
            let first = (i * STAGE_BYTES / 2) as u64;
            let args = ConvertArgs {
                src: stage.ptr(),
                dst: buf.ptr() + offset as u64 + first * size,
                total,
            };
            let grid = Grid {
                blocks: (total.div_ceil(256).min(65535) as u32, 1, 1),
                threads: 256,
            };
            self.launch_with(super::Kernel::Convert { bf16 }, grid, &args)?;
        }
        // The staging buffer is reused by the next chunk and freed here: wait for the work.
        self.ctx.dev.sync("convert")
    }

    /// Dequantizes rows `ids[i]` (or all rows, `ids` 0) of quantized part `p` (`k` columns)
    /// into rows of `out` (device address, row stride `ldo` elements); `count` rows.
    pub(super) fn launch_dequant(
        &mut self,
        p: &WeightPart,
        k: usize,
        ids: Option<(u64, usize)>,
        count: usize,
        out: u64,
        ldo: usize,
    ) -> Result<(), BackendError> {
        let q =
            p.q.ok_or_else(|| invalid("dequant of a plain weight".into()))?;
        if count == 0 {
            return Ok(());
        }
        let (ids, first) = ids.unwrap_or((0, 0));
        let args = DequantArgs {
            w: p.buf.ptr(),
            ids,
            out,
            k: k as i32,
            n: p.rows as i32,
            ldo: ldo as i32,
            first: first as i32,
        };
        let grid = Grid {
            blocks: (count as u32, 1, 1),
            threads: 128,
        };
        self.launch_with(super::Kernel::Dequant { q }, grid, &args)
    }
}

fn unsupported(backend: &'static str, what: String) -> BackendError {
    BackendError::Unsupported {
        backend,
        op: "upload_weight",
        dtype: what,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::gpu::qtype::PLANE_ALIGN;

    #[test]
    fn repacked_planes_keep_every_byte() {
        for q in QType::ALL {
            let (elems, bb) = q.block();
            let (rows, k) = (3, 2 * 256);
            let nb = k / elems;
            let bytes: Vec<u8> = (0..rows * nb * bb)
                .map(|i| (i * 7 + i / 251) as u8)
                .collect();
            let packed = q.repack(&bytes, rows, k);
            let (planes, total) = q.planes(rows, k);
            assert_eq!(packed.len(), total);
            assert!(total < rows * nb * bb + planes.len() * PLANE_ALIGN, "{q:?}");
            // Every source byte sits at its plane position.
            for j in 0..rows {
                for b in 0..nb {
                    let block = &bytes[(j * nb + b) * bb..][..bb];
                    for (&(start, rb), &(from, len)) in planes.iter().zip(q.pieces()) {
                        let at = start + j * rb + b * len;
                        assert_eq!(&packed[at..at + len], &block[from..from + len], "{q:?}");
                    }
                }
            }
            // A chunk of rows repacked alone is the same bytes (the upload stages chunks).
            for (i, &(start, rb)) in planes.iter().enumerate() {
                let mut chunk = vec![0u8; 2 * rb];
                q.repack_rows(&bytes, k, i, 1, &mut chunk);
                assert_eq!(chunk, packed[start + rb..start + 3 * rb], "{q:?} plane {i}");
            }
            assert_eq!(q.ggml().block_bytes(), Some(bb as u64));
            assert!(planes.iter().all(|p| p.0 % PLANE_ALIGN == 0));
        }
    }
}
