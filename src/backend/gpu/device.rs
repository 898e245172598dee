//! One lane's device over a vendor [`Runtime`]: buffers, counted host<->device copies,
//! checked launches and sampled timing. Created on the lane thread and never shared.

use std::any::Any;
use std::ffi::c_void;

use super::runtime::{DeviceInfo, Grid, PinnedHost, RtError, RtResult, Runtime, dev_err};
use super::timing::Timer;
use crate::backend::BackendError;
use crate::backend::tuning::Pdl;

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

/// A device allocation; its raw address is taken once, at allocation. The runtime's
/// allocation object (freed on drop) is kept type-erased so tensors need no runtime
/// parameter.
pub struct DevBuf {
    _mem: Box<dyn Any>,
    ptr: u64,
    bytes: usize,
}

impl std::fmt::Debug for DevBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DevBuf({:#x}, {} bytes)", self.ptr, self.bytes)
    }
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

/// Page-locked staging buffers of [`Device::upload_with`], each with the event recorded
/// after the copy that reads it. Declared before the runtime in [`Device`], and drained on
/// drop, so no copy outlives its buffer.
struct Staging<R: Runtime> {
    slots: Vec<StagingSlot<R>>,
    next: usize,
}

impl<R: Runtime> Staging<R> {
    /// Waits for every copy still reading a buffer (all of them, even after an error).
    fn wait_all(&self, rt: &R) -> RtResult<()> {
        let waits: Vec<RtResult<()>> = (self.slots.iter())
            .filter(|s| s.in_flight)
            .map(|s| rt.wait(&s.done))
            .collect();
        waits.into_iter().collect()
    }
}

struct StagingSlot<R: Runtime> {
    mem: Box<dyn PinnedHost>,
    done: R::Event,
    in_flight: bool,
}

/// Staging buffers in the ring and the size of each: the host fills one while the copies
/// of the others run.
const STAGING_SLOTS: usize = 4;
const STAGING_BYTES: usize = 16 << 20;
/// The host fills a staging buffer in pieces of about this size, one per thread.
const FILL_PIECE: usize = 1 << 20;

/// Fills `out` (bytes `at..` of an upload of whole `unit`s) in parallel pieces.
fn par_fill(out: &mut [u8], at: usize, unit: usize, fill: &(dyn Fn(usize, &mut [u8]) + Sync)) {
    use rayon::prelude::*;
    let piece = (FILL_PIECE / unit).max(1) * unit;
    out.par_chunks_mut(piece)
        .enumerate()
        .for_each(|(i, c)| fill(at + i * piece, c));
}

/// Which launches of a kernel that waits for its predecessors (`Kernel::waits_for_predecessor`)
/// ask the runtime for programmatic dependent launch: eager ones always, recorded ones in
/// graphs of at most `graph_rows` rows. Measured on one H100 (graph step, same binary):
/// Q4_K_M Llama-3-8B at batch 1 2.999 -> 2.809-2.828 ms, bf16 Llama-3-8B 5.752 -> 5.639
/// and Qwen3-8B 6.038 -> 5.859 ms; at batch 32, context 2048, slower: Qwen3-8B 10.321 ->
/// 10.652 ms (the waiting blocks of the next kernel hold SM slots the many blocks of the
/// running one still need). `pdl = graphs` ([`Pdl`]): every graph; `eager`: none; `off`, or
/// a device without it ([`Caps::pdl`](super::caps::Caps)): no launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PdlPolicy {
    /// Eager launches ask for it.
    pub eager: bool,
    pub graph_rows: u32,
}

impl PdlPolicy {
    /// The streaming matmuls' largest row bucket: their graphs gain.
    pub const SMALL_STEPS: u32 = 8;

    /// The policy of switch `pdl` on a device where programmatic dependent launch is
    /// `available` (the switch already applied to it: [`Caps::pdl`](super::caps::Caps)).
    pub fn new(available: bool, pdl: Pdl) -> PdlPolicy {
        let graph_rows = match pdl {
            Pdl::Graphs => u32::MAX,
            Pdl::Eager => 0,
            Pdl::Auto | Pdl::Off => Self::SMALL_STEPS,
        };
        match available && pdl != Pdl::Off {
            true => PdlPolicy {
                eager: true,
                graph_rows,
            },
            false => PdlPolicy {
                eager: false,
                graph_rows: 0,
            },
        }
    }
}

/// The device of one lane.
pub struct Device<R: Runtime> {
    /// Before `rt`: dropped (after draining) while the runtime still lives.
    staging: Option<Staging<R>>,
    /// Page-locked memory was refused once: stage through pageable memory from then on.
    no_staging: bool,
    pub rt: R,
    pub ordinal: usize,
    pub info: DeviceInfo,
    /// Synchronize and check after every launch (tests and debugging).
    pub sync_check: bool,
    /// Sampled kernel timings.
    pub timer: Timer<R>,
    /// Launches are being recorded into a graph: nothing may synchronize or copy.
    pub capturing: bool,
    /// The rows of the step being recorded (for [`PdlPolicy`]).
    pub capture_rows: u32,
    pub pdl: PdlPolicy,
    /// Large uploads stage through page-locked memory (`GpuTuning::upload_pinned`; off:
    /// through pageable memory, as before; for comparisons).
    pub upload_pinned: bool,
    stats: TransferStats,
}

impl<R: Runtime> Device<R> {
    /// Opens device `ordinal` with a fresh stream; `pdl` and `upload_pinned` are set by the
    /// caller once it knows the device ([`Caps`](super::caps::Caps)).
    pub fn open(
        ordinal: usize,
        sync_check: bool,
        timing_period: Option<u64>,
    ) -> Result<Device<R>, BackendError> {
        let (rt, info) = R::open(ordinal).map_err(dev_err("init"))?;
        Ok(Device {
            staging: None,
            no_staging: false,
            rt,
            ordinal,
            info,
            sync_check,
            timer: Timer::new(timing_period),
            capturing: false,
            capture_rows: 0,
            pdl: PdlPolicy::new(false, Pdl::Off),
            upload_pinned: true,
            stats: TransferStats::default(),
        })
    }

    /// Cumulative transfer counters.
    pub fn stats(&self) -> TransferStats {
        self.stats
    }

    /// (free, total) device memory in bytes.
    pub fn mem_info(&self) -> Result<(usize, usize), BackendError> {
        self.rt.mem_info().map_err(dev_err("mem_get_info"))
    }

    /// An uninitialized buffer of `bytes` bytes (at least 1).
    pub fn alloc(&self, bytes: usize, what: &'static str) -> Result<DevBuf, BackendError> {
        let bytes = bytes.max(1);
        let (mem, ptr) = self.rt.alloc(bytes).map_err(|e| match e {
            RtError::OutOfMemory => BackendError::OutOfMemory { what, bytes },
            RtError::Failed(message) => BackendError::Device { op: what, message },
        })?;
        Ok(DevBuf {
            _mem: Box::new(mem),
            ptr,
            bytes,
        })
    }

    fn not_while_capturing(&self, op: &'static str) -> Result<(), BackendError> {
        if self.capturing {
            return Err(BackendError::Device {
                op,
                message: "host<->device copy inside a captured graph".into(),
            });
        }
        Ok(())
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
        self.not_while_capturing("upload")?;
        // SAFETY: the destination range lies inside `dst` (checked above), which is live.
        unsafe { self.rt.upload(dst.ptr + offset as u64, src) }.map_err(dev_err("upload"))?;
        self.stats.h2d_calls += 1;
        self.stats.h2d_bytes += src.len() as u64;
        Ok(())
    }

    /// Writes `len` bytes made by `fill` to `dst` at byte `offset` (stream-ordered). Counted.
    ///
    /// `fill(at, out)` writes bytes `at .. at + out.len()` of the upload; `at` is a multiple of
    /// `unit` and so is `out.len()`, except where `out` ends the upload. The host fills
    /// page-locked staging buffers on the rayon pool (reading a memory-mapped file there
    /// faults its pages in on every thread) while the copies of earlier buffers run; a runtime
    /// without page-locked memory, or `KILN_UPLOAD_PINNED=0`, stages through ordinary memory.
    /// A staged copy may still run when this returns: [`Device::drain_uploads`] waits for it.
    pub fn upload_with(
        &mut self,
        dst: &DevBuf,
        offset: usize,
        len: usize,
        unit: usize,
        fill: &(dyn Fn(usize, &mut [u8]) + Sync),
    ) -> Result<(), BackendError> {
        if offset + len > dst.bytes {
            return Err(BackendError::Device {
                op: "upload",
                message: "copy past the end of a buffer".into(),
            });
        }
        if len == 0 {
            return Ok(());
        }
        self.not_while_capturing("upload")?;
        let unit = unit.max(1);
        let per = (STAGING_BYTES / unit).max(1) * unit;
        if unit <= STAGING_BYTES {
            self.ensure_staging()?;
        }
        let (Some(staging), true) = (self.staging.as_mut(), unit <= STAGING_BYTES) else {
            let mut stage = vec![0u8; per.min(len)];
            for at in (0..len).step_by(per) {
                let out = &mut stage[..per.min(len - at)];
                par_fill(out, at, unit, fill);
                self.upload(dst, offset + at, out)?;
            }
            return Ok(());
        };
        for at in (0..len).step_by(per) {
            let n = per.min(len - at);
            let count = staging.slots.len();
            let slot = &mut staging.slots[staging.next];
            staging.next = (staging.next + 1) % count;
            if slot.in_flight {
                self.rt.wait(&slot.done).map_err(dev_err("upload"))?;
                slot.in_flight = false;
            }
            let out = &mut slot.mem.bytes_mut().map_err(dev_err("upload"))?[..n];
            par_fill(out, at, unit, fill);
            // SAFETY: the destination range lies inside `dst` (checked above), which is
            // live; `out` is page-locked and is not written again before `done`, recorded
            // next, has completed (waited above, in `drain_uploads` or on drop).
            unsafe { self.rt.upload_async(dst.ptr + (offset + at) as u64, out) }
                .map_err(dev_err("upload"))?;
            self.rt.record(&slot.done).map_err(dev_err("upload"))?;
            slot.in_flight = true;
            self.stats.h2d_calls += 1;
            self.stats.h2d_bytes += n as u64;
        }
        Ok(())
    }

    /// Makes the staging ring of [`Device::upload_with`] if there is none yet and the runtime
    /// has page-locked memory (and it is wanted).
    fn ensure_staging(&mut self) -> Result<(), BackendError> {
        if self.staging.is_some() || self.no_staging || !self.upload_pinned {
            return Ok(());
        }
        let mut slots = Vec::with_capacity(STAGING_SLOTS);
        for _ in 0..STAGING_SLOTS {
            let mem = match self.rt.alloc_pinned(STAGING_BYTES) {
                Ok(Some(mem)) => mem,
                Ok(None) => {
                    self.no_staging = true;
                    return Ok(());
                }
                Err(e) => {
                    // Page-locked memory can run out (other processes, container limits):
                    // the pageable path is slower, not wrong.
                    tracing::warn!(error = %e, "no page-locked staging; uploads go through pageable memory");
                    self.no_staging = true;
                    return Ok(());
                }
            };
            let done = self.rt.new_event().map_err(dev_err("pinned staging"))?;
            slots.push(StagingSlot {
                mem,
                done,
                in_flight: false,
            });
        }
        self.staging = Some(Staging { slots, next: 0 });
        Ok(())
    }

    /// Waits for the copies of [`Device::upload_with`] and frees its page-locked buffers
    /// (after the weights are loaded).
    pub fn drain_uploads(&mut self) -> Result<(), BackendError> {
        match self.staging.take() {
            Some(staging) => staging.wait_all(&self.rt).map_err(dev_err("upload")),
            None => Ok(()),
        }
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
        self.not_while_capturing("download")?;
        // SAFETY: the source range lies inside `src` (checked above), which is live.
        unsafe { self.rt.download(src.ptr + offset as u64, dst) }.map_err(dev_err("download"))?;
        self.stats.d2h_calls += 1;
        self.stats.d2h_bytes += dst.len() as u64;
        Ok(())
    }

    /// Launches `f` on the lane's stream; with `sync_check`, waits and reports errors as `op`'s.
    /// `dependent`: `f` waits for its predecessors itself (`KILN_PDL_WAIT()` on every path
    /// before it touches a buffer they use), so it may start early
    /// ([`Runtime::launch_dependent`]).
    pub fn launch(
        &mut self,
        op: &'static str,
        f: &R::Func,
        grid: Grid,
        smem: u32,
        args: &[Arg],
        dependent: bool,
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
        // Inside a recording, by the step's size (`PdlPolicy`).
        let dependent = dependent
            && match self.capturing {
                false => self.pdl.eager,
                true => self.capture_rows <= self.pdl.graph_rows,
            };
        let timed = self.time_start(op)?;
        // SAFETY: `params` points at one live slot per kernel parameter, in order, with the
        // width the kernel declares (entry points and argument lists are kept in step in
        // this module's callers); every pointer argument addresses a live buffer of this
        // backend that the launch's geometry stays inside; a dependent kernel waits for its
        // predecessors before it touches their buffers (the caller's `dependent`).
        unsafe {
            if dependent {
                self.rt.launch_dependent(f, grid, smem, &mut params)
            } else {
                self.rt.launch(f, grid, smem, &mut params)
            }
        }
        .map_err(dev_err(op))?;
        self.timer.end(timed, &self.rt)?;
        if self.sync_check && !self.capturing {
            self.rt.sync().map_err(dev_err(op))?;
        }
        Ok(())
    }

    /// Brackets work queued by `f` (a library call) with timing events as `op`.
    pub fn timed<T>(
        &mut self,
        op: &'static str,
        f: impl FnOnce(&R) -> Result<T, BackendError>,
    ) -> Result<T, BackendError> {
        let timed = self.time_start(op)?;
        let out = f(&self.rt)?;
        self.timer.end(timed, &self.rt)?;
        if self.sync_check && !self.capturing {
            self.rt.sync().map_err(dev_err(op))?;
        }
        Ok(out)
    }

    /// Starts timing `op` when this step is sampled (never inside a graph: replays are
    /// timed as a whole).
    fn time_start(&mut self, op: &'static str) -> Result<Option<usize>, BackendError> {
        if self.capturing {
            return Ok(None);
        }
        self.timer.start(&self.rt, op)
    }

    /// Waits for all queued work.
    pub fn sync(&self, op: &'static str) -> Result<(), BackendError> {
        self.rt.sync().map_err(dev_err(op))
    }
}

impl<R: Runtime> Drop for Device<R> {
    fn drop(&mut self) {
        // A staged copy may still read a page-locked buffer: wait before it is freed.
        if let Some(staging) = &self.staging {
            let _ = staging.wait_all(&self.rt);
        }
    }
}
