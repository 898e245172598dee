//! The GPU backend's value types: storage type, options, and device-resident tensors.

use std::path::PathBuf;

use rayon::prelude::*;

use super::device::DevBuf;
use super::kernels;
use super::meta;
use crate::backend::KvShape;

/// Storage type of weights, activations and the KV cache. Accumulation is always f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    /// Exact parity with the CPU reference (tests).
    F32,
    /// Serving.
    Bf16,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::Bf16 => 2,
        }
    }
    /// `data` as this type's little-endian bytes (bf16: round to nearest even).
    pub fn encode(self, data: &[f32]) -> Vec<u8> {
        let mut out = vec![0u8; data.len() * self.size()];
        match self {
            DType::F32 => out
                .par_chunks_mut(4)
                .zip(data.par_iter())
                .for_each(|(o, v)| o.copy_from_slice(&v.to_le_bytes())),
            DType::Bf16 => out
                .par_chunks_mut(2)
                .zip(data.par_iter())
                .for_each(|(o, v)| {
                    o.copy_from_slice(&half::bf16::from_f32(*v).to_bits().to_le_bytes())
                }),
        }
        out
    }

    /// The values of this type's little-endian `bytes`.
    pub fn decode(self, bytes: &[u8]) -> Vec<f32> {
        match self {
            DType::F32 => bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            DType::Bf16 => bytes
                .chunks_exact(2)
                .map(|b| half::bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32())
                .collect(),
        }
    }

    pub(super) fn suffix(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::Bf16 => "bf16",
        }
    }
}

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
