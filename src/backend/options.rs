//! What a GPU backend is built with (`gpu::GpuBackend::new`): plain data the engine fills
//! from its config, kept apart from `open.rs` (which names the backends) so the GPU backend
//! can read it without depending on its own opener.

use std::path::PathBuf;

use super::DType;

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
    /// What the model runs (its kernels' dependencies), derived by `runner::model_needs`;
    /// the GPU backend plans the kernels it waits for at start-up from it.
    pub needs: super::ModelNeeds,
    /// The kernel-variant switches (`[engine.gpu_tuning]`, filled by `config`).
    pub tuning: super::GpuTuning,
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
            needs: super::ModelNeeds::default(),
            tuning: super::GpuTuning::default(),
        }
    }
}
