//! hipRTC, loaded at run time: ROCm 6+ ships it as `libhiprtc.so`, ROCm 5.x inside
//! `libamdhip64.so`. Compiling needs no GPU (the target comes from `--offload-arch`), so the
//! kernels can be checked on any machine with ROCm's compiler libraries.

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::sync::OnceLock;

use libloading::Library;

use super::super::runtime::{RtError, RtResult};

/// `hiprtcResult`: a C enum, so an `int`; 0 is `HIPRTC_SUCCESS`.
type RtcResult = c_int;
type Program = *mut c_void;

/// Where hipRTC may live, newest first; the ROCm 5.x runtime library carries it itself.
const CANDIDATES: [&str; 8] = [
    "libhiprtc.so",
    "libhiprtc.so.7",
    "libhiprtc.so.6",
    "libhiprtc.so.5",
    "libamdhip64.so",
    "libamdhip64.so.7",
    "libamdhip64.so.6",
    "libamdhip64.so.5",
];

/// The hipRTC entry points Kiln uses (signatures from `hip/hiprtc.h`, unchanged since ROCm 4).
struct Api {
    version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> RtcResult,
    error_string: unsafe extern "C" fn(RtcResult) -> *const c_char,
    create: unsafe extern "C" fn(
        *mut Program,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> RtcResult,
    compile: unsafe extern "C" fn(Program, c_int, *const *const c_char) -> RtcResult,
    log_size: unsafe extern "C" fn(Program, *mut usize) -> RtcResult,
    log: unsafe extern "C" fn(Program, *mut c_char) -> RtcResult,
    code_size: unsafe extern "C" fn(Program, *mut usize) -> RtcResult,
    code: unsafe extern "C" fn(Program, *mut c_char) -> RtcResult,
    destroy: unsafe extern "C" fn(*mut Program) -> RtcResult,
    /// Keeps the function pointers above valid; never unloaded.
    _lib: Library,
}

/// Loaded once per process: a library handle, not device state.
static API: OnceLock<Result<Api, String>> = OnceLock::new();

/// # Safety
/// `lib` must be a hipRTC library: each symbol found has the C signature of its field.
unsafe fn resolve(lib: Library) -> Result<Api, libloading::Error> {
    // SAFETY: per this function's contract; each pointer is copied out of its `Symbol` and
    // stays valid because `lib` moves into the returned struct, which is never dropped
    // (it lives in a `static`).
    unsafe {
        Ok(Api {
            version: *lib.get(b"hiprtcVersion")?,
            error_string: *lib.get(b"hiprtcGetErrorString")?,
            create: *lib.get(b"hiprtcCreateProgram")?,
            compile: *lib.get(b"hiprtcCompileProgram")?,
            log_size: *lib.get(b"hiprtcGetProgramLogSize")?,
            log: *lib.get(b"hiprtcGetProgramLog")?,
            code_size: *lib.get(b"hiprtcGetCodeSize")?,
            code: *lib.get(b"hiprtcGetCode")?,
            destroy: *lib.get(b"hiprtcDestroyProgram")?,
            _lib: lib,
        })
    }
}

fn load() -> Result<Api, String> {
    // SAFETY: the candidates are hipRTC or the HIP runtime that contains it (ROCm 5);
    // `resolve` gives each symbol its C signature.
    unsafe { super::load_first(&CANDIDATES, resolve) }.map_err(|tried| {
        format!(
            "hipRTC cannot be loaded (install ROCm's hiprtc, or libamdhip64 for ROCm 5.x); tried {tried}"
        )
    })
}

fn api() -> RtResult<&'static Api> {
    API.get_or_init(load)
        .as_ref()
        .map_err(|e| RtError::Failed(e.clone()))
}

/// Whether hipRTC loads.
pub fn available() -> RtResult<()> {
    api().map(|_| ())
}

/// `hiprtc X.Y`, or `hiprtc ?` where it does not load (the compile then fails clearly).
pub fn version() -> String {
    let Ok(api) = api() else {
        return "hiprtc ?".into();
    };
    let (mut major, mut minor) = (0, 0);
    // SAFETY: writes two ints through valid pointers.
    let _ = unsafe { (api.version)(&mut major, &mut minor) };
    format!("hiprtc {major}.{minor}")
}

impl Api {
    fn describe(&self, call: &str, r: RtcResult) -> String {
        // SAFETY: hipRTC returns a static NUL-terminated string for any result value.
        let text = unsafe { CStr::from_ptr((self.error_string)(r)) }.to_string_lossy();
        format!("{call}: {text} ({r})")
    }

    /// # Safety
    /// `prog` is a live program.
    unsafe fn program_log(&self, prog: Program) -> String {
        let mut size = 0usize;
        // SAFETY: per this function's contract; hipRTC writes the size, then at most that
        // many bytes into a zeroed buffer one byte larger (ROCm 5.2 counts no terminating
        // NUL in the size and may write none).
        unsafe {
            if (self.log_size)(prog, &mut size) != 0 || size == 0 {
                return String::new();
            }
            let mut buf = vec![0u8; size + 1];
            if (self.log)(prog, buf.as_mut_ptr() as *mut c_char) != 0 {
                return String::new();
            }
            let len = buf.iter().position(|&b| b == 0).unwrap_or(size);
            String::from_utf8_lossy(&buf[..len]).trim_end().to_string()
        }
    }

    /// # Safety
    /// `prog` is a live, successfully compiled program.
    unsafe fn program_code(&self, prog: Program) -> Result<Vec<u8>, String> {
        let mut size = 0usize;
        // SAFETY: per this function's contract; hipRTC writes the size, then that many bytes.
        unsafe {
            let r = (self.code_size)(prog, &mut size);
            if r != 0 {
                return Err(self.describe("hiprtcGetCodeSize", r));
            }
            let mut buf = vec![0u8; size];
            let r = (self.code)(prog, buf.as_mut_ptr() as *mut c_char);
            if r != 0 {
                return Err(self.describe("hiprtcGetCode", r));
            }
            Ok(buf)
        }
    }
}

/// Compiles one translation unit to a code object (an AMDGPU ELF `hipModuleLoadData` takes).
/// Thread-safe: every call has its own program.
pub fn compile(text: &str, name: &str, opts: &[String]) -> RtResult<Vec<u8>> {
    let err = |m: String| RtError::Failed(format!("{name}: {m}"));
    let api = api().map_err(|e| err(e.to_string()))?;
    let c_src = CString::new(text).map_err(|_| err("NUL in source".into()))?;
    let c_name = CString::new(name).map_err(|_| err("NUL in name".into()))?;
    let c_opts = opts
        .iter()
        .map(|o| CString::new(o.as_str()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| err("NUL in an option".into()))?;
    let opt_ptrs: Vec<*const c_char> = c_opts.iter().map(|o| o.as_ptr()).collect();
    // One compile at a time per process: ROCm 5's hipRTC runs LLVM in-process with global
    // state, and parallel compiles crashed it (SIGSEGV, once in five CI runs of the hipRTC
    // test). Kernels are compiled once per source and then come from the disk cache.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let mut prog: Program = std::ptr::null_mut();
    // SAFETY: the source and name are NUL-terminated and outlive the call; no headers are
    // passed (count 0, null arrays), as the kernels include none.
    let r = unsafe {
        (api.create)(
            &mut prog,
            c_src.as_ptr(),
            c_name.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    if r != 0 {
        return Err(err(api.describe("hiprtcCreateProgram", r)));
    }
    // SAFETY: `prog` was created above and is destroyed exactly once, below; the option
    // pointers point into `c_opts`, alive across the call.
    unsafe {
        let r = (api.compile)(prog, opt_ptrs.len() as c_int, opt_ptrs.as_ptr());
        let result = if r == 0 {
            api.program_code(prog).map_err(err)
        } else {
            let log = api.program_log(prog);
            Err(err(format!(
                "{}\n{log}",
                api.describe("hiprtcCompileProgram", r)
            )))
        };
        let _ = (api.destroy)(&mut prog);
        result
    }
}
