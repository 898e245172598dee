//! NCCL for the CUDA runtime: a tensor-parallel group's communicator, its all-reduce and
//! all-gather on the lane's stream (capturable into the decode graphs), and the strided
//! device copy the gather's re-layout uses. libnccl is loaded at run time like the rest.

use std::ffi::c_void;

use cudarc::driver::sys as drv;
use cudarc::nccl::{result as nccl, sys};

use super::runtime::{RtError, RtResult};
use crate::backend::DType;

/// One rank's NCCL communicator; destroyed when dropped.
pub struct NcclComm {
    comm: sys::ncclComm_t,
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        // SAFETY: the communicator is live and destroyed once; nothing queued on it is
        // still running (the backend syncs its stream before dropping); errors cannot be
        // reported from drop.
        let _ = unsafe { nccl::comm_destroy(self.comm) };
    }
}

fn failed(e: nccl::NcclError) -> RtError {
    RtError::Failed(format!("NCCL: {e:?}"))
}

/// Fails clearly when libnccl cannot be loaded (cudarc would panic on first use).
fn loaded() -> RtResult<()> {
    // SAFETY: only tries to dlopen the library by its candidate names; no symbol is called.
    if unsafe { sys::is_culib_present() } {
        return Ok(());
    }
    Err(RtError::Failed(
        "libnccl cannot be loaded: tensor parallelism on CUDA needs NCCL (libnccl.so on the \
         library path; pip's nvidia-nccl wheel ships only libnccl.so.2, link libnccl.so to it)"
            .into(),
    ))
}

fn nccl_type(dt: DType) -> sys::ncclDataType_t {
    match dt {
        DType::F32 => sys::ncclDataType_t::ncclFloat32,
        DType::Bf16 => sys::ncclDataType_t::ncclBfloat16,
    }
}

/// A fresh unique id, as bytes.
pub fn unique_id() -> RtResult<Vec<u8>> {
    loaded()?;
    let id = nccl::get_uniqueid().map_err(failed)?;
    Ok(id.internal.iter().map(|&c| c as u8).collect())
}

/// Joins rank `rank` of `size` to the communicator `id`; the device of the current
/// context (bound by the caller) is the rank's device.
pub fn join(id: &[u8], rank: usize, size: usize) -> RtResult<NcclComm> {
    loaded()?;
    let mut raw = sys::ncclUniqueId { internal: [0; 128] };
    if id.len() != raw.internal.len() {
        return Err(RtError::Failed(format!(
            "NCCL unique id of {} bytes, expected {}",
            id.len(),
            raw.internal.len()
        )));
    }
    for (d, &s) in raw.internal.iter_mut().zip(id) {
        *d = s as _;
    }
    let mut comm = std::ptr::null_mut();
    // SAFETY: `comm` is a valid out pointer; the id came from ncclGetUniqueId on rank 0.
    unsafe { nccl::comm_init_rank(&mut comm, size as i32, raw, rank as i32) }.map_err(failed)?;
    Ok(NcclComm { comm })
}

/// A communicator made on a set-up thread, handed back to the rank's thread.
struct Made(RtResult<NcclComm>);

// SAFETY: an NCCL communicator is not tied to the thread that made it; each call on it
// binds its device's context first, and only one thread holds it at a time.
unsafe impl Send for Made {}

/// [`join`] on a thread of its own (`bind` makes the rank's device current there), waited
/// for until it ends or `give_up` says so. `ncclCommInitRank` waits for every rank of the
/// group and cannot be interrupted; when another rank never joins (it failed before, or
/// in, its own init), this returns an error instead of waiting forever, and the set-up
/// thread is left waiting inside NCCL (the lane then fails to load, which ends a server's
/// start).
pub fn join_or_give_up(
    id: Vec<u8>,
    rank: usize,
    size: usize,
    bind: impl FnOnce() -> RtResult<()> + Send + 'static,
    give_up: &dyn Fn() -> bool,
) -> RtResult<NcclComm> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name(format!("kiln-nccl-init-{rank}"))
        .spawn(move || {
            let made = bind().and_then(|()| join(&id, rank, size));
            let _ = tx.send(Made(made));
        })
        .map_err(|e| RtError::Failed(format!("cannot start the NCCL set-up thread: {e}")))?;
    loop {
        match rx.recv_timeout(std::time::Duration::from_millis(5)) {
            Ok(Made(made)) => return made,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) if give_up() => {
                return Err(RtError::Failed(format!(
                    "NCCL: rank {rank} of {size} gave up waiting for the other ranks to join \
                     the communicator"
                )));
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                return Err(RtError::Failed("NCCL: the set-up thread ended".into()));
            }
        }
    }
}

/// Queues an in-place sum over the group of `count` elements at `x` on `stream`.
///
/// # Safety
/// `x` addresses at least `count` elements of `dt` on this rank's device.
pub unsafe fn all_reduce_sum(
    c: &NcclComm,
    stream: drv::CUstream,
    dt: DType,
    x: u64,
    count: usize,
) -> RtResult<()> {
    let p = x as *mut c_void;
    // SAFETY: in place over `count` elements the caller vouches for.
    unsafe {
        nccl::all_reduce(
            p,
            p,
            count,
            nccl_type(dt),
            sys::ncclRedOp_t::ncclSum,
            c.comm,
            stream as _,
        )
    }
    .map(drop)
    .map_err(failed)
}

/// Queues an all-gather of `count` elements per rank from `send` into `recv` (rank-major).
///
/// # Safety
/// `send` holds `count` and `recv` `size * count` elements of `dt` on this rank's device.
pub unsafe fn all_gather(
    c: &NcclComm,
    stream: drv::CUstream,
    dt: DType,
    send: u64,
    recv: u64,
    count: usize,
) -> RtResult<()> {
    // SAFETY: the ranges the caller vouches for.
    unsafe {
        nccl::all_gather(
            send as *const c_void,
            recv as *mut c_void,
            count,
            nccl_type(dt),
            c.comm,
            stream as _,
        )
    }
    .map(drop)
    .map_err(failed)
}

/// Queues a strided device-to-device copy of `height` rows of `width` bytes.
///
/// # Safety
/// Both ranges lie inside live device allocations.
pub unsafe fn copy_2d(
    stream: drv::CUstream,
    dst: u64,
    dst_pitch: usize,
    src: u64,
    src_pitch: usize,
    width: usize,
    height: usize,
) -> RtResult<()> {
    if width == 0 || height == 0 {
        return Ok(());
    }
    let p = drv::CUDA_MEMCPY2D {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: drv::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        srcHost: std::ptr::null(),
        srcDevice: src,
        srcArray: std::ptr::null_mut(),
        srcPitch: src_pitch,
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: drv::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        dstHost: std::ptr::null_mut(),
        dstDevice: dst,
        dstArray: std::ptr::null_mut(),
        dstPitch: dst_pitch,
        WidthInBytes: width,
        Height: height,
    };
    // SAFETY: `p` describes ranges the caller vouches for; queued on the lane's stream.
    unsafe { drv::cuMemcpy2DAsync_v2(&p, stream) }
        .result()
        .map_err(|e| RtError::Failed(e.to_string()))?;
    Ok(())
}
