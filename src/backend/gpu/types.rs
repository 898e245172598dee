//! The GPU backend's value types: options and device-resident tensors.

use std::path::PathBuf;

use super::device::DevBuf;
use super::kernels;
use super::meta;
use crate::backend::{DType, KvShape};

/// How to build a [`super::GpuBackend`].
#[derive(Debug, Clone)]
pub struct GpuOptions {
    pub dtype: DType,
    /// Where compiled kernels are cached; `None` compiles every time.
    pub kernel_cache: Option<PathBuf>,
    /// Synchronize after every launch so errors name the op that caused them (slow).
    pub sync_check: bool,
    /// Time every launch of every `n`-th step with device events (see
    /// [`super::GpuBackend::take_kernel_timings`]); `None`: never.
    pub timing_period: Option<u64>,
    /// Record decode steps into graphs at bucketed batch sizes and replay them.
    pub graphs: bool,
}

impl Default for GpuOptions {
    fn default() -> Self {
        Self {
            dtype: DType::Bf16,
            kernel_cache: kernels::default_cache_dir(),
            sync_check: false,
            timing_period: None,
            graphs: true,
        }
    }
}

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
