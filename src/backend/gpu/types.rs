//! The GPU backend's device-resident value types.

use super::device::DevBuf;
use super::meta;
use super::qtype::QType;
use super::qweight::WeightPart;
use crate::backend::BackendError;
use crate::backend::KvShape;

/// A `[rows, cols]` activation buffer on the device.
#[derive(Debug)]
pub struct GpuTensor {
    pub(super) buf: DevBuf,
    pub(super) rows: usize,
    pub(super) cols: usize,
}

impl GpuTensor {
    /// Row capacity.
    pub fn rows(&self) -> usize {
        self.rows
    }
    pub fn cols(&self) -> usize {
        self.cols
    }
}

/// A weight on the device: `[rows, cols]`, or `[1, len]` for vectors; one part per row range
/// of its own storage (a plain weight is one part of compute-type elements).
#[derive(Debug)]
pub struct GpuWeight {
    pub(super) parts: Vec<WeightPart>,
    pub(super) rows: usize,
    pub(super) cols: usize,
}

impl GpuWeight {
    /// The buffer of a plain weight (compute-type elements); `None` when quantized.
    pub(super) fn dense(&self) -> Option<&DevBuf> {
        match self.parts.as_slice() {
            [p] if p.q.is_none() => Some(&p.buf),
            _ => None,
        }
    }

    /// [`GpuWeight::dense`], or an error naming `op` for a quantized weight.
    pub(super) fn dense_for(&self, op: &'static str) -> Result<&DevBuf, BackendError> {
        self.dense().ok_or_else(|| BackendError::Unsupported {
            backend: "gpu",
            op,
            dtype: "a quantized vector".into(),
        })
    }

    /// Bytes the weight takes on the device.
    pub fn device_bytes(&self) -> usize {
        self.parts.iter().map(|p| p.buf.bytes()).sum()
    }

    /// The weight types of the parts (`None`: compute-type elements).
    pub fn part_types(&self) -> Vec<Option<QType>> {
        self.parts.iter().map(|p| p.q).collect()
    }
}

/// The paged KV pool: per layer, K then V, each `[num_slots, n_kv_heads * head_dim]`.
#[derive(Debug)]
pub struct GpuKv {
    pub(super) buf: DevBuf,
    pub(super) shape: KvShape,
}

/// A prepared step: where its metadata sits in the backend's metadata buffer.
#[derive(Debug)]
pub struct GpuBatch {
    pub(super) epoch: u64,
    pub(super) layout: meta::Layout,
    /// The graph shape of a padded decode step; `None` runs eagerly.
    pub(super) graph: Option<meta::GraphKey>,
}
