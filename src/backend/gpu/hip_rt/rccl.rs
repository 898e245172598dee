//! RCCL for the HIP runtime, loaded at run time (`librccl.so.1`, only tensor-parallel lanes
//! need it): a group's communicator, and its all-reduce and all-gather queued on the lane's
//! stream, so they are recorded into the decode graphs with the rest of the step (RCCL
//! captures into hipGraphs without opt-in since ROCm 5.4, RCCL 2.13).
//!
//! Types and values are those of `rccl/rccl.h` (NCCL's C API): checked against Debian's
//! librccl-dev 5.4.3 (RCCL 2.13.4) by `c_check`, a C program generated from the declarations
//! below and compiled against the header (CI runs it), and read against the current header of
//! ROCm/rocm-systems (ROCm 7): the 128-byte unique id passed by value, `ncclSuccess = 0`,
//! `ncclSum = 0`, `ncclFloat32 = 7`, `ncclBfloat16 = 9` and the seven signatures below have
//! not changed since RCCL 2.x.

use std::cell::Cell;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::OnceLock;

use libloading::Library;

use super::super::runtime::{RtError, RtResult};
use super::ffi;
use crate::backend::DType;

/// `NCCL_UNIQUE_ID_BYTES`.
pub const UNIQUE_ID_BYTES: usize = 128;

/// `ncclUniqueId`: `struct { char internal[128]; }`, passed by value to `ncclCommInitRank`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueId {
    pub internal: [c_char; UNIQUE_ID_BYTES],
}

/// `ncclResult_t` (a C enum: an `int`).
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct NcclResult(pub c_int);

/// `ncclDataType_t` (a C enum: an `int`).
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct DataType(pub c_int);

/// `ncclRedOp_t` (a C enum: an `int`).
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct RedOp(pub c_int);

/// `ncclComm_t`: a pointer to RCCL's opaque communicator.
#[repr(transparent)]
#[derive(Clone, Copy)]
pub struct CommHandle(pub *mut c_void);

/// `hipStream_t` as RCCL's signatures name it (the same pointer as `ffi::Stream`).
#[repr(transparent)]
#[derive(Clone, Copy)]
pub struct HipStream(pub ffi::Stream);

pub const SUCCESS: NcclResult = NcclResult(0);
pub const SUM: RedOp = RedOp(0);
pub const FLOAT32: DataType = DataType(7);
pub const BFLOAT16: DataType = DataType(9);

/// librccl sonames: `librccl.so.1` from ROCm 5 through 7 and Debian's librccl1; the bare
/// name where only the development link exists.
const CANDIDATES: [&str; 2] = ["librccl.so.1", "librccl.so"];

/// Declares the entry points once: the table of function pointers, the loader that fills it
/// by symbol name, and (in tests) the C declarations `c_check` compiles against the header.
macro_rules! rccl_api {
    ($($field:ident: fn($($arg:ty),*) -> $ret:ty = $symbol:literal;)*) => {
        /// The RCCL entry points Kiln uses.
        struct Api {
            $($field: unsafe extern "C" fn($($arg),*) -> $ret,)*
            /// Keeps the function pointers above valid; never unloaded.
            _lib: Library,
        }

        /// # Safety
        /// `lib` must be RCCL: each symbol found has the C signature of its field.
        unsafe fn resolve(lib: Library) -> Result<Api, libloading::Error> {
            // SAFETY: per this function's contract; each pointer is copied out of its
            // `Symbol` and stays valid because `lib` moves into the returned struct, which is
            // never dropped (it lives in a `static`).
            unsafe {
                Ok(Api {
                    $($field: *lib.get($symbol.as_bytes())?,)*
                    _lib: lib,
                })
            }
        }

        /// One C declaration per entry point, initialized from the header's symbol (a
        /// signature that differs from the header's does not compile).
        #[cfg(test)]
        pub(super) fn c_declarations() -> Vec<String> {
            use super::c_types::CFn;
            vec![$(
                <unsafe extern "C" fn($($arg),*) -> $ret as CFn>::declare(
                    stringify!($field),
                    $symbol,
                ),
            )*]
        }
    };
}

rccl_api! {
    get_unique_id: fn(*mut UniqueId) -> NcclResult = "ncclGetUniqueId";
    comm_init_rank: fn(
        *mut CommHandle, c_int, UniqueId, c_int
    ) -> NcclResult = "ncclCommInitRank";
    comm_destroy: fn(CommHandle) -> NcclResult = "ncclCommDestroy";
    comm_abort: fn(CommHandle) -> NcclResult = "ncclCommAbort";
    error_string: fn(NcclResult) -> *const c_char = "ncclGetErrorString";
    all_reduce: fn(
        *const c_void, *mut c_void, usize, DataType, RedOp, CommHandle, HipStream
    ) -> NcclResult = "ncclAllReduce";
    all_gather: fn(
        *const c_void, *mut c_void, usize, DataType, CommHandle, HipStream
    ) -> NcclResult = "ncclAllGather";
}

#[cfg(test)]
super::c_types::c_names! {
    UniqueId => "ncclUniqueId",
    NcclResult => "ncclResult_t",
    DataType => "ncclDataType_t",
    RedOp => "ncclRedOp_t",
    CommHandle => "ncclComm_t",
    HipStream => "hipStream_t",
}

/// Values and sizes `c_check` asserts against the header, as C expressions.
#[cfg(test)]
pub(super) fn c_facts() -> Vec<String> {
    use std::mem::{align_of, size_of};
    vec![
        format!("NCCL_UNIQUE_ID_BYTES == {UNIQUE_ID_BYTES}"),
        format!("sizeof(ncclUniqueId) == {}", size_of::<UniqueId>()),
        format!("_Alignof(ncclUniqueId) == {}", align_of::<UniqueId>()),
        format!("sizeof(ncclResult_t) == {}", size_of::<NcclResult>()),
        format!("sizeof(ncclDataType_t) == {}", size_of::<DataType>()),
        format!("sizeof(ncclRedOp_t) == {}", size_of::<RedOp>()),
        format!("sizeof(ncclComm_t) == {}", size_of::<CommHandle>()),
        format!("sizeof(hipStream_t) == {}", size_of::<HipStream>()),
        format!("ncclSuccess == {}", SUCCESS.0),
        format!("ncclSum == {}", SUM.0),
        format!("ncclFloat32 == {}", FLOAT32.0),
        format!("ncclBfloat16 == {}", BFLOAT16.0),
    ]
}

/// Loaded once per process: a library handle, not device state.
static API: OnceLock<Result<Api, String>> = OnceLock::new();

fn load() -> Result<Api, String> {
    // SAFETY: the candidates are RCCL; `resolve` gives each symbol its C signature.
    unsafe { super::load_first(&CANDIDATES, resolve) }.map_err(|tried| {
        format!(
            "librccl cannot be loaded: tensor parallelism on ROCm needs RCCL (librccl.so.1: \
             ROCm's rccl package, or Debian's librccl1, on the library path); tried {tried}"
        )
    })
}

fn api() -> RtResult<&'static Api> {
    API.get_or_init(load)
        .as_ref()
        .map_err(|e| RtError::Failed(e.clone()))
}

/// Whether RCCL loads (the reason, naming the library, where it does not).
pub fn available() -> RtResult<()> {
    api().map(|_| ())
}

impl Api {
    fn check(&self, call: &str, r: NcclResult) -> RtResult<()> {
        if r == SUCCESS {
            return Ok(());
        }
        // SAFETY: RCCL returns a static NUL-terminated string for any result value.
        let text = unsafe { CStr::from_ptr((self.error_string)(r)) }.to_string_lossy();
        Err(RtError::Failed(format!("RCCL {call}: {text} ({})", r.0)))
    }
}

fn data_type(dt: DType) -> DataType {
    match dt {
        DType::F32 => FLOAT32,
        DType::Bf16 => BFLOAT16,
    }
}

/// One rank's RCCL communicator: destroyed when dropped, or aborted if a call on it failed
/// (destroying waits for queued collectives, which a failed group may never finish).
pub struct RcclComm {
    comm: CommHandle,
    failed: Cell<bool>,
}

impl Drop for RcclComm {
    fn drop(&mut self) {
        // A communicator exists only once the library loaded.
        let Ok(api) = api() else { return };
        // SAFETY: the communicator is live and released once; the backend syncs its stream
        // before dropping it; errors cannot be reported from drop.
        unsafe {
            let _ = match self.failed.get() {
                true => (api.comm_abort)(self.comm),
                false => (api.comm_destroy)(self.comm),
            };
        }
    }
}

impl RcclComm {
    /// Notes a failed call (the drop then aborts), passing the result through.
    fn watch(&self, r: RtResult<()>) -> RtResult<()> {
        if r.is_err() {
            self.failed.set(true);
        }
        r
    }
}

/// A fresh unique id, as bytes.
pub fn unique_id() -> RtResult<Vec<u8>> {
    let api = api()?;
    let mut id = UniqueId {
        internal: [0; UNIQUE_ID_BYTES],
    };
    // SAFETY: writes one `ncclUniqueId` through a valid pointer.
    api.check("ncclGetUniqueId", unsafe { (api.get_unique_id)(&mut id) })?;
    Ok(id.internal.iter().map(|&c| c as u8).collect())
}

/// Joins rank `rank` of `size` to the communicator `id`; the caller has selected the rank's
/// device on this thread (`hipSetDevice`). Blocks until every rank has joined.
pub fn join(id: &[u8], rank: usize, size: usize) -> RtResult<RcclComm> {
    let api = api()?;
    let mut raw = UniqueId {
        internal: [0; UNIQUE_ID_BYTES],
    };
    if id.len() != UNIQUE_ID_BYTES {
        return Err(RtError::Failed(format!(
            "RCCL unique id of {} bytes, expected {UNIQUE_ID_BYTES}",
            id.len()
        )));
    }
    for (d, &s) in raw.internal.iter_mut().zip(id) {
        *d = s as c_char;
    }
    let too_big = |what: &str, v: usize| RtError::Failed(format!("RCCL {what} {v} exceeds int"));
    let n = c_int::try_from(size).map_err(|_| too_big("group size", size))?;
    let r = c_int::try_from(rank).map_err(|_| too_big("rank", rank))?;
    let mut comm = CommHandle(std::ptr::null_mut());
    // SAFETY: `comm` is a valid out pointer; the id came from ncclGetUniqueId on rank 0.
    api.check("ncclCommInitRank", unsafe {
        (api.comm_init_rank)(&mut comm, n, raw, r)
    })?;
    Ok(RcclComm {
        comm,
        failed: Cell::new(false),
    })
}

/// Queues an in-place sum over the group of `count` elements at `x` on `stream`.
///
/// # Safety
/// `x` addresses at least `count` elements of `dt` on this rank's device, selected on this
/// thread; `stream` is live.
pub unsafe fn all_reduce_sum(
    c: &RcclComm,
    stream: ffi::Stream,
    dt: DType,
    x: u64,
    count: usize,
) -> RtResult<()> {
    let api = api()?;
    let p = x as *mut c_void;
    // SAFETY: in place over `count` elements the caller vouches for.
    let r = unsafe { (api.all_reduce)(p, p, count, data_type(dt), SUM, c.comm, HipStream(stream)) };
    c.watch(api.check("ncclAllReduce", r))
}

/// Queues an all-gather of `count` elements per rank from `send` into `recv` (rank-major).
///
/// # Safety
/// `send` holds `count` and `recv` `size * count` elements of `dt` on this rank's device,
/// selected on this thread; `stream` is live.
pub unsafe fn all_gather(
    c: &RcclComm,
    stream: ffi::Stream,
    dt: DType,
    send: u64,
    recv: u64,
    count: usize,
) -> RtResult<()> {
    let api = api()?;
    // SAFETY: the ranges the caller vouches for.
    let r = unsafe {
        (api.all_gather)(
            send as *const c_void,
            recv as *mut c_void,
            count,
            data_type(dt),
            c.comm,
            HipStream(stream),
        )
    };
    c.watch(api.check("ncclAllGather", r))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a machine without RCCL (CI, this build host) every entry point fails with the
    /// library's name instead of panicking; where RCCL is present the id is 128 bytes.
    #[test]
    fn a_missing_librccl_is_named_and_nothing_panics() {
        match available() {
            Err(e) => {
                let e = e.to_string();
                assert!(
                    e.contains("librccl") && e.contains("tensor parallelism"),
                    "{e}"
                );
                assert_eq!(unique_id().unwrap_err().to_string(), e);
                let id = vec![0u8; UNIQUE_ID_BYTES];
                assert_eq!(join(&id, 0, 2).err().unwrap().to_string(), e);
            }
            Ok(()) => {
                assert_eq!(unique_id().unwrap().len(), UNIQUE_ID_BYTES);
                let err = join(&[0u8; 3], 0, 2).err().unwrap().to_string();
                assert!(err.contains("3 bytes"), "{err}");
            }
        }
    }
}
