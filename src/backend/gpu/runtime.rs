//! What the GPU backend needs from a vendor runtime, and nothing more: one device, one
//! stream, memory, copies, module loading, launches, events, run-time compilation, a BLAS
//! GEMM and stream capture into replayable graphs.
//!
//! [`super::GpuBackend`] is written once against this trait; `cuda_rt` (cudarc: driver,
//! NVRTC, cuBLAS) and `hip_rt` (libamdhip64, hipRTC, rocBLAS) implement it. Everything
//! above this line — kernels, launch geometry, metadata, sampling, graphs, metrics — is
//! shared, so the two vendors cannot drift apart.

use std::ffi::c_void;

use crate::backend::{BackendError, DType};

/// Launch geometry: a 3-D grid of 1-D blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Grid {
    pub blocks: (u32, u32, u32),
    pub threads: u32,
}

/// A runtime call that failed.
#[derive(Debug, Clone)]
pub enum RtError {
    /// An allocation found no room.
    OutOfMemory,
    /// Anything else, with the runtime's own description.
    Failed(String),
}

impl std::fmt::Display for RtError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RtError::OutOfMemory => f.write_str("out of device memory"),
            RtError::Failed(m) => f.write_str(m),
        }
    }
}

pub type RtResult<T> = Result<T, RtError>;

/// What the backend knows about its device once it is open.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    /// Marketing name (`NVIDIA H100 80GB HBM3`, `AMD Instinct MI250X`).
    pub name: String,
    /// Compilation target (`sm_90`, `gfx90a`): part of the kernel cache key.
    pub arch: String,
    /// Streaming multiprocessors / compute units (steers split-K).
    pub sm_count: usize,
    /// Threads per warp / wavefront: 32 on NVIDIA and RDNA, 64 on CDNA.
    pub warp_size: usize,
    /// Driver / runtime version (cache key).
    pub driver_version: i32,
}

/// Page-locked host memory from [`Runtime::alloc_pinned`]: a stream copy reads it while the
/// host goes on. Freed when dropped (the owner first waits for every copy reading it).
pub trait PinnedHost: Send {
    /// The whole buffer; only while no copy from it is in flight.
    fn bytes_mut(&mut self) -> RtResult<&mut [u8]>;
}

/// One vendor runtime bound to one device and one stream. Created and used on the lane's
/// thread only.
pub trait Runtime: Sized + 'static {
    /// Backend name in logs, errors and metrics (`cuda`, `rocm`).
    const NAME: &'static str;
    /// Name of the run-time compiler in errors (`nvrtc`, `hiprtc`).
    const COMPILER: &'static str;
    /// A device allocation; freed when dropped.
    type Alloc: 'static;
    /// A loaded code object; its functions stay valid while it lives.
    type Module;
    /// A kernel entry point.
    type Func;
    /// A timing event.
    type Event;
    /// The BLAS handle bound to the stream.
    type Blas;
    /// An instantiated, replayable graph.
    type Graph;
    /// A collective communicator joining this device to a tensor-parallel group (NCCL on CUDA,
    /// RCCL on ROCm); a runtime without collectives names a type it never makes.
    type Comm;

    /// Whether the runtime libraries load and at least one device is visible.
    fn available() -> RtResult<()>;

    /// Opens device `ordinal` with a fresh stream.
    fn open(ordinal: usize) -> RtResult<(Self, DeviceInfo)>;

    /// What [`Runtime::open`] will report of device `ordinal`, read without creating its
    /// context (the kernels start compiling while it is created); `None` where the runtime
    /// cannot tell beforehand (they start after it).
    fn probe(_ordinal: usize) -> Option<DeviceInfo> {
        None
    }

    /// (free, total) device memory in bytes.
    fn mem_info(&self) -> RtResult<(usize, usize)>;

    /// An uninitialized allocation of `bytes` (> 0) bytes and its device address.
    fn alloc(&self, bytes: usize) -> RtResult<(Self::Alloc, u64)>;

    /// Queues a copy of `src` to device address `dst` on the stream; `src` may be reused
    /// when this returns.
    ///
    /// # Safety
    /// `dst .. dst + src.len()` lies inside a live allocation of this runtime.
    unsafe fn upload(&self, dst: u64, src: &[u8]) -> RtResult<()>;

    /// `bytes` of page-locked host memory for [`Runtime::upload_async`], or `None` where the
    /// runtime copies only from pageable memory (then large uploads stage through ordinary
    /// memory and [`Runtime::upload`]).
    fn alloc_pinned(&self, bytes: usize) -> RtResult<Option<Box<dyn PinnedHost>>> {
        let _ = bytes;
        Ok(None)
    }

    /// Queues a copy of `src` to device address `dst` that reads `src` after this returns.
    ///
    /// # Safety
    /// As [`Runtime::upload`]; `src` lies in memory from [`Runtime::alloc_pinned`] (or is
    /// pageable, where the copy stages it before returning), and stays alive and unwritten
    /// until an event recorded after this call has completed.
    unsafe fn upload_async(&self, dst: u64, src: &[u8]) -> RtResult<()> {
        // SAFETY: per this method's contract.
        unsafe { self.upload(dst, src) }
    }

    /// Copies `dst.len()` bytes from device address `src` after all queued work, and waits.
    ///
    /// # Safety
    /// `src .. src + dst.len()` lies inside a live allocation of this runtime.
    unsafe fn download(&self, src: u64, dst: &mut [u8]) -> RtResult<()>;

    /// Queues `f` on the stream.
    ///
    /// # Safety
    /// `params` holds one pointer per kernel parameter, in order, each to a value of the
    /// parameter's width; every device address passed stays inside a live allocation for
    /// everything the kernel reads and writes at this geometry.
    unsafe fn launch(
        &self,
        f: &Self::Func,
        grid: Grid,
        smem: u32,
        params: &mut [*mut c_void],
    ) -> RtResult<()>;

    /// [`Runtime::launch`] for a kernel that executes `KILN_PDL_WAIT()` (prelude.cuh) before
    /// it reads or writes anything its predecessors on the stream read or write: where the
    /// runtime supports it (CUDA on sm_90+; `KILN_PDL` says where: not inside recorded
    /// graphs unless `=graphs`, never with `=0`), the kernel may start while its predecessor
    /// drains and waits in the wait; elsewhere (and by default) a plain launch.
    ///
    /// # Safety
    /// As [`Runtime::launch`], and `f` waits as above on every path, early exits included.
    unsafe fn launch_dependent(
        &self,
        f: &Self::Func,
        grid: Grid,
        smem: u32,
        params: &mut [*mut c_void],
    ) -> RtResult<()> {
        // SAFETY: per this method's contract.
        unsafe { self.launch(f, grid, smem, params) }
    }

    /// Waits for all queued work.
    fn sync(&self) -> RtResult<()>;

    fn new_event(&self) -> RtResult<Self::Event>;
    /// Queues `e` on the stream.
    fn record(&self, e: &Self::Event) -> RtResult<()>;
    /// Blocks the host until the work before `e`'s last recording has completed.
    fn wait(&self, e: &Self::Event) -> RtResult<()>;
    /// Milliseconds between two recorded events (waits for `end`).
    fn elapsed_ms(&self, start: &Self::Event, end: &Self::Event) -> RtResult<f32>;

    /// Compiler options for `info`'s device (target, warp size) under `tuning` (NVRTC's
    /// threads per unit); the backend adds the storage type define.
    fn compile_options(info: &DeviceInfo, tuning: &crate::backend::GpuTuning) -> Vec<String>;
    /// Compiler identity for the kernel cache key.
    fn compiler_version() -> String;
    /// Compiles one translation unit to a loadable code object. Thread-safe.
    fn compile(text: &str, name: &str, opts: &[String]) -> RtResult<Vec<u8>>;
    fn load_module(&self, image: &[u8]) -> RtResult<Self::Module>;
    /// The entry point `name` of `m`, or `None` when it has none.
    fn function(&self, m: &Self::Module, name: &str) -> Option<Self::Func>;
    /// (registers per thread, spill bytes per thread, static shared bytes per block);
    /// -1 where the runtime cannot tell.
    fn resources(&self, f: &Self::Func) -> (i32, i32, i32);
    /// Lets `f` be launched with `bytes` of dynamic shared memory (past the default 48 KB
    /// limit where the runtime has one: CUDA). Nothing to do by default.
    fn allow_dynamic_smem(&self, f: &Self::Func, bytes: u32) -> RtResult<()> {
        let _ = (f, bytes);
        Ok(())
    }

    fn blas(&self) -> RtResult<Self::Blas>;
    /// Queues `out[n, m] = x[n, k] @ w[m, k]^T` (row-major, f32 accumulation).
    ///
    /// # Safety
    /// `x`, `w`, `out` address live allocations of at least n*k, m*k, n*m elements of `dt`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn gemm(
        &self,
        blas: &Self::Blas,
        dt: DType,
        x: u64,
        w: u64,
        out: u64,
        n: usize,
        k: usize,
        m: usize,
    ) -> RtResult<()>;

    /// Starts recording the stream's work into a graph instead of running it.
    fn begin_capture(&self) -> RtResult<()>;
    /// Stops recording and instantiates what was recorded.
    fn end_capture(&self) -> RtResult<Self::Graph>;
    /// Queues a replay of `g` on the stream.
    fn replay(&self, g: &Self::Graph) -> RtResult<()>;

    /// Total memory of device `ordinal` in bytes, read without opening the device for work
    /// (start-up sizes defaults by it before the lanes open their devices).
    fn total_memory(ordinal: usize) -> RtResult<usize>;

    /// Devices visible to this runtime (a tensor-parallel lane needs one per shard).
    fn device_count() -> RtResult<usize> {
        Self::available().map(|_| 1)
    }
    /// A fresh communicator id (made by rank 0, handed to the others by the host group).
    fn comm_id() -> RtResult<Vec<u8>> {
        Err(no_collectives())
    }
    /// Joins rank `rank` of `size` to the communicator `id` (blocks until every rank has
    /// joined; each rank calls it on its own thread).
    fn comm_join(&self, id: &[u8], rank: usize, size: usize) -> RtResult<Self::Comm> {
        let _ = (id, rank, size);
        Err(no_collectives())
    }
    /// [`Runtime::comm_join`] that stops waiting for the other ranks once `give_up` says
    /// so (polled while it waits: another rank failed, or it waited too long). By default
    /// the plain join, which waits for every rank.
    fn comm_join_or_give_up(
        &self,
        id: &[u8],
        rank: usize,
        size: usize,
        give_up: &dyn Fn() -> bool,
    ) -> RtResult<Self::Comm> {
        let _ = give_up;
        self.comm_join(id, rank, size)
    }
    /// Queues `x[..count] = sum over ranks of x[..count]` on the stream, in place.
    ///
    /// # Safety
    /// `x` addresses a live allocation of at least `count` elements of `dt`.
    unsafe fn all_reduce_sum(
        &self,
        c: &Self::Comm,
        dt: DType,
        x: u64,
        count: usize,
    ) -> RtResult<()> {
        let _ = (c, dt, x, count);
        Err(no_collectives())
    }
    /// Queues `recv[r * count ..][..count] = send[..count] of rank r` for every rank.
    ///
    /// # Safety
    /// `send` and `recv` address live allocations of `count` and `size * count` elements.
    unsafe fn all_gather(
        &self,
        c: &Self::Comm,
        dt: DType,
        send: u64,
        recv: u64,
        count: usize,
    ) -> RtResult<()> {
        let _ = (c, dt, send, recv, count);
        Err(no_collectives())
    }
    /// Queues a strided device-to-device copy: `height` rows of `width` bytes, from rows
    /// `src_pitch` bytes apart to rows `dst_pitch` bytes apart.
    ///
    /// # Safety
    /// Both ranges lie inside live allocations.
    unsafe fn copy_2d(
        &self,
        dst: u64,
        dst_pitch: usize,
        src: u64,
        src_pitch: usize,
        width: usize,
        height: usize,
    ) -> RtResult<()> {
        let _ = (dst, dst_pitch, src, src_pitch, width, height);
        Err(no_collectives())
    }
}

fn no_collectives() -> RtError {
    RtError::Failed("this runtime has no collectives (tensor parallelism)".into())
}

/// Maps a runtime error of `op` into the backend's error.
pub(crate) fn dev_err(op: &'static str) -> impl Fn(RtError) -> BackendError {
    move |e| BackendError::Device {
        op,
        message: e.to_string(),
    }
}
