//! rocBLAS, loaded at run time (it is large, and only serving needs it): a handle bound to
//! the lane's stream with a workspace of its own, and the one GEMM the backend uses.
//!
//! Values from rocBLAS's `rocblas-types.h` (ROCm/rocBLAS `library/include/internal/`), the
//! same since rocBLAS 2.x (ROCm 4): `rocblas_operation_none = 111`, `_transpose = 112`,
//! `rocblas_datatype_f32_r = 151`, `_bf16_r = 168`, `rocblas_gemm_algo_standard = 0`,
//! `rocblas_status_success = 0`. `rocblas_gemm_ex` has had its 24-argument form (..., d,
//! d_type, ldd, compute_type, algo, solution_index, flags) since ROCm 3.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::OnceLock;

use libloading::Library;

use super::super::runtime::{RtError, RtResult};
use super::ffi::Stream;

/// `rocblas_status`; 0 is success.
type Status = c_int;
type Handle = *mut c_void;

pub const OP_NONE: c_int = 111;
pub const OP_TRANSPOSE: c_int = 112;
pub const DATATYPE_F32: c_int = 151;
pub const DATATYPE_BF16: c_int = 168;
const ALGO_STANDARD: c_int = 0;

/// librocblas sonames: ROCm 7 (`.so.5`), ROCm 6 (`.so.4`), ROCm 5 (`.so.0`).
const CANDIDATES: [&str; 4] = [
    "librocblas.so",
    "librocblas.so.5",
    "librocblas.so.4",
    "librocblas.so.0",
];

type GemmEx = unsafe extern "C" fn(
    Handle,
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    *const c_void,
    *const c_void,
    c_int,
    c_int,
    *const c_void,
    c_int,
    c_int,
    *const c_void,
    *const c_void,
    c_int,
    c_int,
    *mut c_void,
    c_int,
    c_int,
    c_int,
    c_int,
    i32,
    u32,
) -> Status;

struct Api {
    create: unsafe extern "C" fn(*mut Handle) -> Status,
    destroy: unsafe extern "C" fn(Handle) -> Status,
    set_stream: unsafe extern "C" fn(Handle, Stream) -> Status,
    set_workspace: unsafe extern "C" fn(Handle, *mut c_void, usize) -> Status,
    gemm_ex: GemmEx,
    /// `rocblas_status_to_string`, where this rocBLAS has it.
    status_string: Option<unsafe extern "C" fn(Status) -> *const c_char>,
    /// Keeps the function pointers above valid; never unloaded.
    _lib: Library,
}

/// Loaded once per process: a library handle, not device state.
static API: OnceLock<Result<Api, String>> = OnceLock::new();

/// # Safety
/// `lib` must be rocBLAS: each symbol found has the C signature of its field.
unsafe fn resolve(lib: Library) -> Result<Api, libloading::Error> {
    // SAFETY: per this function's contract; the pointers stay valid because `lib` moves into
    // the returned struct, which lives in a `static` and is never dropped.
    unsafe {
        Ok(Api {
            create: *lib.get(b"rocblas_create_handle")?,
            destroy: *lib.get(b"rocblas_destroy_handle")?,
            set_stream: *lib.get(b"rocblas_set_stream")?,
            set_workspace: *lib.get(b"rocblas_set_workspace")?,
            gemm_ex: *lib.get(b"rocblas_gemm_ex")?,
            status_string: lib.get(b"rocblas_status_to_string").ok().map(|s| *s),
            _lib: lib,
        })
    }
}

fn load() -> Result<Api, String> {
    // SAFETY: the candidates are rocBLAS; `resolve` gives each symbol its C signature.
    unsafe { super::load_first(&CANDIDATES, resolve) }.map_err(|tried| {
        format!(
            "rocBLAS (librocblas.so) cannot be loaded: install rocblas (the `rocblas` package of \
             ROCm, or use the ROCm image of docker/Dockerfile.rocm); Kiln runs every GEMM on \
             rocBLAS. Tried {tried}"
        )
    })
}

fn api() -> RtResult<&'static Api> {
    API.get_or_init(load)
        .as_ref()
        .map_err(|e| RtError::Failed(e.clone()))
}

/// Whether rocBLAS loads.
pub fn available() -> RtResult<()> {
    api().map(|_| ())
}

fn check(api: &Api, call: &str, s: Status) -> RtResult<()> {
    if s == 0 {
        return Ok(());
    }
    let text = api
        .status_string
        // SAFETY: rocBLAS returns a static NUL-terminated string for any status value.
        .map(|f| {
            unsafe { CStr::from_ptr(f(s)) }
                .to_string_lossy()
                .into_owned()
        })
        .unwrap_or_default();
    Err(RtError::Failed(format!("rocBLAS {call}: {text} ({s})")))
}

/// A rocBLAS handle bound to one stream, with a workspace it owns.
pub struct RocBlas {
    api: &'static Api,
    handle: Handle,
}

impl Drop for RocBlas {
    fn drop(&mut self) {
        // SAFETY: the handle is live and destroyed once; errors cannot be reported from drop.
        let _ = unsafe { (self.api.destroy)(self.handle) };
    }
}

impl RocBlas {
    /// A handle for the current device, queuing on `stream`, using the `bytes` bytes at
    /// device address `workspace` instead of allocating its own (so graph capture never
    /// allocates).
    ///
    /// # Safety
    /// `stream` and the workspace outlive the handle; the current device owns both.
    pub unsafe fn new(stream: Stream, workspace: u64, bytes: usize) -> RtResult<RocBlas> {
        let api = api()?;
        let mut handle: Handle = std::ptr::null_mut();
        // SAFETY: writes one handle through a valid pointer.
        check(api, "rocblas_create_handle", unsafe {
            (api.create)(&mut handle)
        })?;
        let b = RocBlas { api, handle };
        // SAFETY: the handle is live; the stream and workspace outlive it (caller).
        unsafe {
            check(api, "rocblas_set_stream", (api.set_stream)(handle, stream))?;
            check(
                api,
                "rocblas_set_workspace",
                (api.set_workspace)(handle, workspace as *mut c_void, bytes),
            )?;
        }
        Ok(b)
    }

    /// Queues `out[n, m] = x[n, k] @ w[m, k]^T` (row-major), all of element type `ty`
    /// (`DATATYPE_F32` or `DATATYPE_BF16`), accumulated in f32.
    ///
    /// # Safety
    /// `x`, `w`, `out` address live allocations of at least n*k, m*k, n*m elements of `ty`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gemm(
        &self,
        ty: c_int,
        x: u64,
        w: u64,
        out: u64,
        n: usize,
        k: usize,
        m: usize,
    ) -> RtResult<()> {
        // rocBLAS is column-major, like cuBLAS, and takes the same arguments in the same
        // order (see cuda_rt's gemm): C = out^T (m x n, ld m) = op(A) B with A = w seen
        // column-major (k x m, ld k, op T) and B = x seen column-major (k x n, ld k). D = C
        // (same buffer and layout, which rocBLAS allows); compute type f32.
        let (alpha, beta) = (1.0f32, 0.0f32);
        let dims = |v: usize| {
            c_int::try_from(v).map_err(|_| RtError::Failed(format!("GEMM size {v} > i32")))
        };
        let (m, n, k) = (dims(m)?, dims(n)?, dims(k)?);
        // SAFETY: per this method's contract; alpha/beta are f32 host values (the default
        // host pointer mode), as compute type f32 requires, and live across the call.
        let s = unsafe {
            (self.api.gemm_ex)(
                self.handle,
                OP_TRANSPOSE,
                OP_NONE,
                m,
                n,
                k,
                &alpha as *const f32 as *const c_void,
                w as *const c_void,
                ty,
                k,
                x as *const c_void,
                ty,
                k,
                &beta as *const f32 as *const c_void,
                out as *const c_void,
                ty,
                m,
                out as *mut c_void,
                ty,
                m,
                DATATYPE_F32,
                ALGO_STANDARD,
                0,
                0,
            )
        };
        check(self.api, "rocblas_gemm_ex", s)
    }
}
