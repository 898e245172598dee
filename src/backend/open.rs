//! Opening a backend for a device: the one place that knows which backends this build
//! has, so the engine names a device and never a backend type or a feature.

use std::path::PathBuf;

use super::cpu::CpuBackend;
use super::{Backend, BackendError, DType};

/// How to build a GPU backend (`gpu::GpuBackend`); the engine fills it from its config.
#[derive(Debug, Clone)]
pub struct GpuOptions {
    pub dtype: DType,
    /// Where compiled kernels are cached; `None` compiles every time (the engine config's
    /// `kernel_cache_dir` fills it).
    pub kernel_cache: Option<PathBuf>,
    /// Synchronize after every launch so errors name the op that caused them (slow).
    pub sync_check: bool,
    /// Time every launch of every `n`-th step with device events (see
    /// `GpuBackend::take_kernel_timings`); `None`: never.
    pub timing_period: Option<u64>,
    /// Record decode steps into graphs at bucketed batch sizes and replay them.
    pub graphs: bool,
    /// Streaming matmul kernels for small batches (off: every matmul through the BLAS; the
    /// config key `gpu_gemv`, for A/B measurements).
    pub gemv: bool,
    /// The thread-group decode attention variant (off: the prefill kernels serve decode
    /// steps too; the config key `gpu_attn_decode`, for A/B measurements).
    pub attn_decode: bool,
}

impl Default for GpuOptions {
    fn default() -> Self {
        Self {
            dtype: DType::Bf16,
            kernel_cache: None,
            sync_check: false,
            timing_period: None,
            graphs: true,
            gemv: true,
            attn_decode: true,
        }
    }
}

/// A device to open a backend on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceId {
    Cpu,
    /// NVIDIA GPU by ordinal.
    Cuda(usize),
    /// AMD GPU by ordinal.
    Rocm(usize),
}

/// What to do with an opened backend: `run` gets the backend's constructor (called on the
/// caller's thread, so a lane builds its device state where it lives).
pub trait WithBackend {
    type Output;
    fn run<B: Backend + 'static>(
        self,
        make: impl FnOnce() -> Result<B, BackendError> + Send + 'static,
    ) -> Self::Output;
}

/// Hands `with` the constructor of `device`'s backend; a backend this build lacks gives a
/// constructor that fails with [`BackendError::NotCompiled`].
pub fn open<W: WithBackend>(device: DeviceId, options: GpuOptions, with: W) -> W::Output {
    let _ = &options;
    match device {
        DeviceId::Cpu => with.run(|| Ok(CpuBackend::new())),
        #[cfg(feature = "cuda")]
        DeviceId::Cuda(i) => with.run(move || super::cuda::CudaBackend::new(i, options)),
        #[cfg(not(feature = "cuda"))]
        DeviceId::Cuda(_) => with.run::<CpuBackend>(|| Err(BackendError::NotCompiled("cuda"))),
        #[cfg(feature = "rocm")]
        DeviceId::Rocm(i) => with.run(move || super::rocm::RocmBackend::new(i, options)),
        #[cfg(not(feature = "rocm"))]
        DeviceId::Rocm(_) => with.run::<CpuBackend>(|| Err(BackendError::NotCompiled("rocm"))),
    }
}
