//! The AMD backend: [`gpu::GpuBackend`](super::gpu::GpuBackend) over the HIP runtime
//! (libamdhip64 linked; hipRTC, rocBLAS and, for tensor parallelism, RCCL loaded at run
//! time). Same kernels, lane, collectives and metrics as the NVIDIA backend.

pub use super::gpu::hip_rt::Hip;
pub use super::gpu::{
    DType, GpuBatch, GpuKv, GpuOptions as RocmOptions, GpuTensor, GpuWeight, KernelTiming,
    TransferStats, kernels,
};

/// The backend of one ROCm lane.
pub type RocmBackend = super::gpu::GpuBackend<Hip>;

/// Whether the HIP libraries load and at least one device is visible.
pub fn device_available() -> bool {
    RocmBackend::device_available()
}

/// Whether RCCL loads, which a tensor-parallel ROCm lane needs; the reason, naming
/// `librccl`, where it does not.
pub fn collectives_available() -> Result<(), String> {
    super::gpu::hip_rt::collectives_available().map_err(|e| e.to_string())
}
