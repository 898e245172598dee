//! One lane's CUDA device: context, stream, buffers, counted host<->device copies and
//! checked kernel launches. Created on the lane thread and never shared.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DriverError, result, sys,
};

use super::timing::Timer;
use crate::backend::BackendError;

/// Host<->device traffic since the backend was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TransferStats {
    pub h2d_calls: u64,
    pub h2d_bytes: u64,
    pub d2h_calls: u64,
    pub d2h_bytes: u64,
}

impl TransferStats {
    /// Traffic between `earlier` and `self`.
    pub fn since(&self, earlier: &TransferStats) -> TransferStats {
        TransferStats {
            h2d_calls: self.h2d_calls - earlier.h2d_calls,
            h2d_bytes: self.h2d_bytes - earlier.h2d_bytes,
            d2h_calls: self.d2h_calls - earlier.d2h_calls,
            d2h_bytes: self.d2h_bytes - earlier.d2h_bytes,
        }
    }
}

/// Maps a driver error of `op` into the backend's error.
pub(crate) fn dev_err(op: &'static str) -> impl Fn(DriverError) -> BackendError {
    move |e| BackendError::Device {
        op,
        message: e.to_string(),
    }
}

/// A device allocation; its raw address is taken once, at allocation.
#[derive(Debug)]
pub struct DevBuf {
    _slice: CudaSlice<u8>,
    ptr: u64,
    bytes: usize,
}

impl DevBuf {
    /// Device address of byte 0.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }
    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// One kernel argument, passed by value.
#[derive(Debug, Clone, Copy)]
pub enum Arg {
    Ptr(u64),
    I32(i32),
    U64(u64),
    F32(f32),
}

/// Launch geometry.
#[derive(Debug, Clone, Copy)]
pub struct Grid {
    pub blocks: (u32, u32, u32),
    pub threads: u32,
}

/// The device of one lane.
pub struct Device {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub ordinal: usize,
    /// Compute capability (major, minor).
    pub arch: (i32, i32),
    pub sm_count: usize,
    pub warp_size: usize,
    pub driver_version: i32,
    pub name: String,
    /// Synchronize and check after every launch (tests and debugging).
    pub sync_check: bool,
    /// Sampled kernel timings.
    pub timer: Timer,
    stats: TransferStats,
}

fn libs_present() -> Result<(), BackendError> {
    let missing = |lib: &str| BackendError::Device {
        op: "init",
        message: format!(
            "the CUDA library {lib} cannot be loaded (no driver or toolkit on this machine?)"
        ),
    };
    // SAFETY: each call only tries to dlopen the library by its candidate names and reports
    // whether that worked; no symbol is called.
    unsafe {
        if !cudarc::driver::sys::is_culib_present() {
            return Err(missing("libcuda"));
        }
        if !cudarc::nvrtc::sys::is_culib_present() {
            return Err(missing("libnvrtc"));
        }
        if !cudarc::cublas::sys::is_culib_present() {
            return Err(missing("libcublas"));
        }
    }
    Ok(())
}

/// Whether the CUDA libraries load and at least one device is visible.
pub fn device_available() -> bool {
    libs_present().is_ok() && CudaContext::device_count().is_ok_and(|n| n > 0)
}

impl Device {
    /// Opens device `ordinal` (its primary context) with a fresh non-blocking stream.
    pub fn open(
        ordinal: usize,
        sync_check: bool,
        timing_period: Option<u64>,
    ) -> Result<Device, BackendError> {
        libs_present()?;
        let e = dev_err("init");
        let ctx = CudaContext::new(ordinal).map_err(&e)?;
        // SAFETY: this backend uses one stream and orders every use of its buffers on it, so
        // cudarc's cross-stream event tracking is not needed; buffers are created after this.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(&e)?;
        let arch = ctx.compute_capability().map_err(&e)?;
        let attr = |a| ctx.attribute(a).map_err(&e);
        let sm_count =
            attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as usize;
        let warp_size = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_WARP_SIZE)? as usize;
        let mut driver_version = 0;
        // SAFETY: writes one int through a valid pointer.
        unsafe { sys::cuDriverGetVersion(&mut driver_version) }
            .result()
            .map_err(&e)?;
        let name = ctx.name().map_err(&e)?;
        Ok(Device {
            ctx,
            stream,
            ordinal,
            arch,
            sm_count,
            warp_size,
            driver_version,
            name,
            sync_check,
            timer: Timer::new(timing_period),
            stats: TransferStats::default(),
        })
    }

    /// Cumulative transfer counters.
    pub fn stats(&self) -> TransferStats {
        self.stats
    }

    /// (free, total) device memory in bytes.
    pub fn mem_info(&self) -> Result<(usize, usize), BackendError> {
        self.ctx.mem_get_info().map_err(dev_err("mem_get_info"))
    }

    /// An uninitialized buffer of `bytes` bytes (at least 1).
    pub fn alloc(&self, bytes: usize, what: &'static str) -> Result<DevBuf, BackendError> {
        let bytes = bytes.max(1);
        // SAFETY: the memory is uninitialized; every reader in this backend reads only what
        // a kernel or copy wrote first (tests poison outputs with NaN to check that).
        let slice = unsafe { self.stream.alloc::<u8>(bytes) }.map_err(|e| match e.0 {
            sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => BackendError::OutOfMemory { what, bytes },
            _ => BackendError::Device {
                op: what,
                message: e.to_string(),
            },
        })?;
        let ptr = slice.device_ptr(&self.stream).0;
        Ok(DevBuf {
            _slice: slice,
            ptr,
            bytes,
        })
    }

    /// Copies `src` to `dst` at byte `offset` (stream-ordered). Counted.
    pub fn upload(&mut self, dst: &DevBuf, offset: usize, src: &[u8]) -> Result<(), BackendError> {
        if offset + src.len() > dst.bytes {
            return Err(BackendError::Device {
                op: "upload",
                message: "copy past the end of a buffer".into(),
            });
        }
        if src.is_empty() {
            return Ok(());
        }
        self.ctx.bind_to_thread().map_err(dev_err("upload"))?;
        // SAFETY: the destination range lies inside `dst` (checked above). `src` is pageable
        // host memory, so the driver stages it before returning and `src` may be reused.
        unsafe { result::memcpy_htod_async(dst.ptr + offset as u64, src, self.stream.cu_stream()) }
            .map_err(dev_err("upload"))?;
        self.stats.h2d_calls += 1;
        self.stats.h2d_bytes += src.len() as u64;
        Ok(())
    }

    /// Copies `dst.len()` bytes from `src` at byte `offset` and waits for them. Counted.
    pub fn download(
        &mut self,
        src: &DevBuf,
        offset: usize,
        dst: &mut [u8],
    ) -> Result<(), BackendError> {
        if offset + dst.len() > src.bytes {
            return Err(BackendError::Device {
                op: "download",
                message: "copy past the end of a buffer".into(),
            });
        }
        if dst.is_empty() {
            return Ok(());
        }
        self.ctx.bind_to_thread().map_err(dev_err("download"))?;
        // SAFETY: the source range lies inside `src` (checked above); the stream is
        // synchronized before `dst` is read or dropped.
        unsafe { result::memcpy_dtoh_async(dst, src.ptr + offset as u64, self.stream.cu_stream()) }
            .map_err(dev_err("download"))?;
        self.stream.synchronize().map_err(dev_err("download"))?;
        self.stats.d2h_calls += 1;
        self.stats.d2h_bytes += dst.len() as u64;
        Ok(())
    }

    /// Launches `f` on the lane's stream; with `sync_check`, waits and reports errors as `op`'s.
    pub fn launch(
        &mut self,
        op: &'static str,
        f: &CudaFunction,
        grid: Grid,
        smem: u32,
        args: &[Arg],
    ) -> Result<(), BackendError> {
        let (bx, by, bz) = grid.blocks;
        if bx == 0 || by == 0 || bz == 0 {
            return Ok(());
        }
        let mut slots: Vec<u64> = args
            .iter()
            .map(|a| match *a {
                Arg::Ptr(p) | Arg::U64(p) => p,
                Arg::I32(v) => v as u32 as u64,
                Arg::F32(v) => v.to_bits() as u64,
            })
            .collect();
        // Each parameter is read from the start of its 8-byte slot: 4-byte values sit in
        // the low bytes (little-endian), as the kernel's i32/f32 parameters expect.
        let mut params: Vec<*mut c_void> = slots
            .iter_mut()
            .map(|s| s as *mut u64 as *mut c_void)
            .collect();
        self.ctx.bind_to_thread().map_err(dev_err(op))?;
        let timed = self.timer.start(&self.ctx, &self.stream, op)?;
        // SAFETY: `params` points at one live slot per kernel parameter, in order, with the
        // width the kernel declares (entry points and argument lists are kept in step in
        // this module's callers); every pointer argument addresses a live buffer of this
        // backend that the launch's geometry stays inside.
        unsafe {
            result::launch_kernel(
                f.cu_function(),
                grid.blocks,
                (grid.threads, 1, 1),
                smem,
                self.stream.cu_stream(),
                &mut params,
            )
        }
        .map_err(dev_err(op))?;
        self.timer.end(timed, &self.stream)?;
        if self.sync_check {
            self.stream.synchronize().map_err(dev_err(op))?;
        }
        Ok(())
    }

    /// Brackets work queued by `f` (a library call) with timing events as `op`.
    pub fn timed<T>(
        &mut self,
        op: &'static str,
        f: impl FnOnce() -> Result<T, BackendError>,
    ) -> Result<T, BackendError> {
        let timed = self.timer.start(&self.ctx, &self.stream, op)?;
        let out = f()?;
        self.timer.end(timed, &self.stream)?;
        if self.sync_check {
            self.stream.synchronize().map_err(dev_err(op))?;
        }
        Ok(out)
    }

    /// Waits for all queued work.
    pub fn sync(&self, op: &'static str) -> Result<(), BackendError> {
        self.stream.synchronize().map_err(dev_err(op))
    }
}
