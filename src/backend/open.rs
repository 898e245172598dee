//! Opening a backend for a device: the one place that knows which backends this build
//! has, so the engine names a device and never a backend type or a feature.

use super::cpu::CpuBackend;
pub use super::options::GpuOptions;
use super::{Backend, BackendError};

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

/// Total memory of `device` in bytes (a GPU's, read before a lane opens it); `None` for the
/// CPU, a backend this build lacks, or a device that cannot be read.
pub fn total_memory(device: DeviceId) -> Option<usize> {
    match device {
        #[cfg(feature = "cuda")]
        DeviceId::Cuda(i) => super::cuda::CudaBackend::total_memory(i),
        #[cfg(feature = "rocm")]
        DeviceId::Rocm(i) => super::rocm::RocmBackend::total_memory(i),
        _ => None,
    }
}

/// A backend constructor, run on the thread of the shard it serves.
pub type Maker<B> = Box<dyn FnOnce() -> Result<B, BackendError> + Send>;

/// What to do with the backends of a tensor-parallel group: `run` gets one constructor per
/// device, in rank order.
pub trait WithBackends {
    type Output;
    fn run<B: Backend + 'static>(self, makers: Vec<Maker<B>>) -> Self::Output;
}

/// Hands `with` one constructor per device of `devices` (one kind of device; a mix, or a
/// backend this build lacks, gives a single constructor that fails).
pub fn open_group<W: WithBackends>(
    devices: &[DeviceId],
    options: GpuOptions,
    with: W,
) -> W::Output {
    let _ = &options;
    let kind = |d: &DeviceId| std::mem::discriminant(d);
    if devices.windows(2).any(|w| kind(&w[0]) != kind(&w[1])) {
        let list = format!("{devices:?}");
        return with.run::<CpuBackend>(vec![Box::new(move || {
            Err(BackendError::InvalidBatch(format!(
                "a tensor-parallel group spans devices of one kind, not {list}"
            )))
        })]);
    }
    match devices.first() {
        None | Some(DeviceId::Cpu) => with.run(
            devices
                .iter()
                .map(|_| Box::new(|| Ok(CpuBackend::new())) as Maker<CpuBackend>)
                .collect(),
        ),
        #[cfg(feature = "cuda")]
        Some(DeviceId::Cuda(_)) if devices.len() > 1 && !gpus_visible(devices) => {
            // Every shard fails to open (none joins, so none waits for the others).
            let ordinals = gpu_ordinals(devices);
            let visible = super::cuda::CudaBackend::device_count();
            let why = format!(
                "a tensor-parallel group of {} needs CUDA devices {ordinals:?}; {visible} visible",
                ordinals.len()
            );
            with.run::<CpuBackend>(refuse_all(devices.len(), why))
        }
        #[cfg(feature = "cuda")]
        Some(DeviceId::Cuda(_)) => with.run(
            gpu_ordinals(devices)
                .into_iter()
                .map(|i| {
                    let (o, size) = (options.clone(), devices.len());
                    Box::new(move || {
                        super::cuda::CudaBackend::new(i, o).map_err(|e| match size {
                            1 => e,
                            _ => BackendError::Device {
                                op: "open",
                                message: format!(
                                    "cuda:{i} (a shard of a tensor-parallel group of {size}): {e}"
                                ),
                            },
                        })
                    }) as Maker<_>
                })
                .collect(),
        ),
        #[cfg(not(feature = "cuda"))]
        Some(DeviceId::Cuda(_)) => {
            with.run::<CpuBackend>(vec![Box::new(|| Err(BackendError::NotCompiled("cuda")))])
        }
        #[cfg(feature = "rocm")]
        Some(DeviceId::Rocm(_)) => match rocm_group_refusal(devices) {
            // Every shard fails to open (none joins, so none waits for the others).
            Some(why) => with.run::<CpuBackend>(refuse_all(devices.len(), why)),
            None => with.run(rocm_shards(devices, &options)),
        },
        #[cfg(not(feature = "rocm"))]
        Some(DeviceId::Rocm(_)) => {
            with.run::<CpuBackend>(vec![Box::new(|| Err(BackendError::NotCompiled("rocm")))])
        }
    }
}

/// The GPU ordinals of a group: distinct devices as named; one device named for every
/// shard (a lane's `cuda:i` or `rocm:i` with `tensor_parallel_size` N) spans `i .. i + N`.
#[cfg(any(feature = "cuda", feature = "rocm"))]
fn gpu_ordinals(devices: &[DeviceId]) -> Vec<usize> {
    let first = devices.first().map_or(0, ordinal);
    match devices.iter().all(|d| ordinal(d) == first) {
        true => (first..first + devices.len()).collect(),
        false => devices.iter().map(ordinal).collect(),
    }
}

/// Whether every GPU of a group is visible (a shard that cannot open its device would leave
/// the others waiting for it to join).
#[cfg(feature = "cuda")]
fn gpus_visible(devices: &[DeviceId]) -> bool {
    let visible = super::cuda::CudaBackend::device_count();
    gpu_ordinals(devices).iter().all(|&i| i < visible)
}

/// Why a ROCm group of several devices cannot start, checked before any shard opens: RCCL
/// does not load, or the group names more GPUs than are visible.
#[cfg(feature = "rocm")]
fn rocm_group_refusal(devices: &[DeviceId]) -> Option<String> {
    let size = devices.len();
    if size < 2 {
        return None;
    }
    if let Err(e) = super::rocm::collectives_available() {
        return Some(format!("a tensor-parallel group of {size} on ROCm: {e}"));
    }
    let ordinals = gpu_ordinals(devices);
    let visible = super::rocm::RocmBackend::device_count();
    (!ordinals.iter().all(|&i| i < visible)).then(|| {
        format!(
            "a tensor-parallel group of {size} needs ROCm devices {ordinals:?}; {visible} visible"
        )
    })
}

/// One constructor per GPU of a ROCm group; a shard's error names its device and group.
#[cfg(feature = "rocm")]
fn rocm_shards(devices: &[DeviceId], options: &GpuOptions) -> Vec<Maker<super::rocm::RocmBackend>> {
    let size = devices.len();
    gpu_ordinals(devices)
        .into_iter()
        .map(|i| {
            let o = options.clone();
            Box::new(move || {
                super::rocm::RocmBackend::new(i, o).map_err(|e| match size {
                    1 => e,
                    _ => BackendError::Device {
                        op: "open",
                        message: format!(
                            "rocm:{i} (a shard of a tensor-parallel group of {size}): {e}"
                        ),
                    },
                })
            }) as Maker<_>
        })
        .collect()
}

/// One constructor per shard, each failing to open with `why`.
#[cfg(any(feature = "cuda", feature = "rocm"))]
fn refuse_all(size: usize, why: String) -> Vec<Maker<CpuBackend>> {
    (0..size)
        .map(|_| {
            let message = why.clone();
            Box::new(move || {
                Err(BackendError::Device {
                    op: "open",
                    message,
                })
            }) as Maker<CpuBackend>
        })
        .collect()
}

/// A GPU's ordinal (0 for the CPU).
#[cfg(any(feature = "cuda", feature = "rocm"))]
fn ordinal(d: &DeviceId) -> usize {
    match d {
        DeviceId::Cpu => 0,
        DeviceId::Cuda(i) | DeviceId::Rocm(i) => *i,
    }
}
