//! The AMD backend: [`gpu::GpuBackend`](super::gpu::GpuBackend) over the HIP runtime
//! (libamdhip64, hipRTC, rocBLAS loaded at run time). Same kernels, lane and metrics as
//! the NVIDIA backend.

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
