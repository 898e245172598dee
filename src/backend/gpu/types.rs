//! The GPU backend's device-resident value types.

use super::device::DevBuf;
use super::meta;
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

/// A weight on the device: `[rows, cols]`, or `[1, len]` for vectors.
#[derive(Debug)]
pub struct GpuWeight {
    pub(super) buf: DevBuf,
    pub(super) rows: usize,
    pub(super) cols: usize,
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
