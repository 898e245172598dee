//! The NVIDIA backend: [`gpu::GpuBackend`](super::gpu::GpuBackend) over the CUDA runtime
//! (driver API, NVRTC and cuBLAS through cudarc, all loaded at run time).

pub use super::gpu::cuda_rt::Cuda;
pub use super::gpu::{
    DType, GpuBatch, GpuKv, GpuOptions as CudaOptions, GpuTensor, GpuWeight, KernelTiming,
    TransferStats, kernels,
};

/// The backend of one CUDA lane.
pub type CudaBackend = super::gpu::GpuBackend<Cuda>;

/// Whether the CUDA libraries load and at least one device is visible.
pub fn device_available() -> bool {
    CudaBackend::device_available()
}
