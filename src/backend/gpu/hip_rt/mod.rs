//! [`Runtime`] for AMD through the HIP runtime: a hand-written FFI to `libamdhip64` (linked;
//! see `ffi`), hipRTC, rocBLAS and RCCL loaded at run time (`rtc`, `blas`, `rccl`). A machine
//! without a GPU gets a clear error from [`Runtime::available`]; one without rocBLAS, from
//! [`Runtime::blas`]; one without RCCL, from [`collectives_available`] and the collectives.
//!
//! HIP's current device is per host thread: every method selects this lane's device first
//! (`hipSetDevice`, a thread-local store), as `cuda_rt` binds its context.

mod blas;
#[cfg(test)]
mod c_check;
#[cfg(test)]
mod c_types;
mod ffi;
mod rccl;
mod rtc;

use std::ffi::{CStr, CString, c_char, c_int, c_void};

use super::runtime::{DeviceInfo, Grid, PinnedHost, RtError, RtResult, Runtime};
use crate::backend::DType;

/// The first of `candidates` that loads and whose symbols `resolve` finds; otherwise what
/// each attempt said.
///
/// # Safety
/// Each candidate must be the library `resolve` expects: every symbol it finds has the C
/// signature `resolve` gives it.
unsafe fn load_first<A>(
    candidates: &[&str],
    resolve: unsafe fn(libloading::Library) -> Result<A, libloading::Error>,
) -> Result<A, String> {
    let mut tried = Vec::new();
    for &name in candidates {
        // SAFETY: loading runs only the library's initializers; per this function's
        // contract `resolve` reads its symbols with their true signatures.
        match unsafe { libloading::Library::new(name) }.and_then(|lib| unsafe { resolve(lib) }) {
            Ok(api) => return Ok(api),
            Err(e) => match std::error::Error::source(&e) {
                // libloading says "dlopen failed" and keeps the loader's reason as the source.
                Some(why) => tried.push(format!("{name}: {why}")),
                None => tried.push(format!("{name}: {e}")),
            },
        }
    }
    Err(tried.join("; "))
}

/// Maps a HIP status of `call` into an [`RtError`] naming the call and HIP's description.
fn check(call: &str, e: ffi::HipError) -> RtResult<()> {
    match e {
        ffi::SUCCESS => Ok(()),
        ffi::ERROR_OUT_OF_MEMORY => Err(RtError::OutOfMemory),
        _ => {
            // SAFETY: hipGetErrorString returns a static NUL-terminated string for any value.
            let text = unsafe { CStr::from_ptr(ffi::hipGetErrorString(e)) }.to_string_lossy();
            Err(RtError::Failed(format!("{call}: {text} (hipError {e})")))
        }
    }
}

fn select(device: c_int) -> RtResult<()> {
    // SAFETY: takes a plain int; an out-of-range ordinal is reported, not undefined.
    check("hipSetDevice", unsafe { ffi::hipSetDevice(device) })
}

fn device_count() -> RtResult<usize> {
    let mut n: c_int = 0;
    // SAFETY: writes one int through a valid pointer.
    check("hipGetDeviceCount", unsafe {
        ffi::hipGetDeviceCount(&mut n)
    })?;
    Ok(n.max(0) as usize)
}

/// One AMD device and a non-blocking stream of this lane's own (destroyed on drop).
pub struct Hip {
    device: c_int,
    stream: ffi::Stream,
}

impl Drop for Hip {
    fn drop(&mut self) {
        // SAFETY: the stream is live and destroyed once, after everything queued on it (the
        // backend drops kernels, BLAS handle and graphs first); errors cannot be reported
        // from drop.
        unsafe {
            let _ = ffi::hipSetDevice(self.device);
            let _ = ffi::hipStreamDestroy(self.stream);
        }
    }
}

/// A device allocation, freed (`hipFree`) when dropped.
pub struct HipAlloc {
    device: c_int,
    ptr: *mut c_void,
}

impl Drop for HipAlloc {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from hipMalloc on `device` and is freed once; hipFree waits
        // for work still using it.
        unsafe {
            let _ = ffi::hipSetDevice(self.device);
            let _ = ffi::hipFree(self.ptr);
        }
    }
}

/// Page-locked host memory (`hipHostMalloc`), freed (`hipHostFree`) when dropped.
pub struct HipPinned {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the buffer is plain host memory owned by this value alone; HIP allows it to be
// used and freed from any thread.
unsafe impl Send for HipPinned {}

impl PinnedHost for HipPinned {
    fn bytes_mut(&mut self) -> RtResult<&mut [u8]> {
        // SAFETY: `ptr` holds `len` bytes from hipHostMalloc, alive while `self` is, and
        // borrowed mutably through `self` only.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) })
    }
}

impl Drop for HipPinned {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from hipHostMalloc and is freed once (the owner waited for
        // every copy reading it).
        let _ = unsafe { ffi::hipHostFree(self.ptr.cast()) };
    }
}

/// A loaded code object; unloaded when dropped.
pub struct HipModule {
    handle: ffi::Module,
    /// The image, 8-byte aligned, kept alive as long as the module in case the runtime
    /// reads it lazily.
    _image: Vec<u64>,
}

impl Drop for HipModule {
    fn drop(&mut self) {
        // SAFETY: the module is live and unloaded once; its functions are dropped with it.
        let _ = unsafe { ffi::hipModuleUnload(self.handle) };
    }
}

/// A kernel entry point, valid while its [`HipModule`] lives.
pub struct HipFunc(ffi::Function);

/// A timing event; destroyed when dropped.
pub struct HipEvent(ffi::Event);

impl Drop for HipEvent {
    fn drop(&mut self) {
        // SAFETY: the event is live and destroyed once.
        let _ = unsafe { ffi::hipEventDestroy(self.0) };
    }
}

/// A captured graph and its instantiation; both destroyed when dropped.
pub struct HipGraph {
    exec: ffi::GraphExec,
    graph: ffi::Graph,
}

impl Drop for HipGraph {
    fn drop(&mut self) {
        // SAFETY: both are live and destroyed once, the executable first.
        unsafe {
            let _ = ffi::hipGraphExecDestroy(self.exec);
            let _ = ffi::hipGraphDestroy(self.graph);
        }
    }
}

/// The rocBLAS handle of a lane, bound to its stream, and the workspace it uses.
pub struct HipBlas {
    // Field order is drop order: the handle goes before its workspace.
    blas: blas::RocBlas,
    _workspace: HipAlloc,
}

/// rocBLAS workspace, set explicitly so graph capture never allocates (as cuda_rt's 32 MiB).
const BLAS_WORKSPACE: usize = 32 << 20;

/// The NUL-terminated string at `at` in `buf` (at most `PROP_STRING_BYTES`).
fn c_string_at(buf: &[u8], at: usize) -> String {
    let end = (at + ffi::PROP_STRING_BYTES).min(buf.len());
    let field = buf.get(at..end).unwrap_or_default();
    let len = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    String::from_utf8_lossy(&field[..len]).into_owned()
}

/// `gcnArchName` (`gfx90a:sramecc+:xnack-`) of `device`; see `ffi::PROP_BUFFER_BYTES` for
/// the layouts read.
fn arch_name(device: c_int) -> RtResult<String> {
    let mut props = vec![0u8; ffi::PROP_BUFFER_BYTES];
    // SAFETY: the buffer is zeroed and ten times the size of any hipDeviceProp_t layout, so
    // the runtime writes inside it whichever layout it fills.
    check("hipGetDeviceProperties", unsafe {
        ffi::hipGetDeviceProperties(props.as_mut_ptr() as *mut c_void, device)
    })?;
    ffi::PROP_GCN_ARCH_NAME_OFFSETS
        .iter()
        .map(|&at| c_string_at(&props, at))
        .find(|s| s.starts_with("gfx"))
        .ok_or_else(|| {
            RtError::Failed(format!(
                "hipGetDeviceProperties: no gfx architecture name found (device name '{}'): \
                 unknown hipDeviceProp_t layout",
                c_string_at(&props, ffi::PROP_NAME_OFFSET)
            ))
        })
}

fn attribute(device: c_int, attr: c_int, what: &str) -> RtResult<usize> {
    let mut v: c_int = 0;
    // SAFETY: writes one int through a valid pointer.
    check(what, unsafe {
        ffi::hipDeviceGetAttribute(&mut v, attr, device)
    })?;
    usize::try_from(v).map_err(|_| RtError::Failed(format!("{what}: {v}")))
}

impl Hip {
    fn bind(&self) -> RtResult<()> {
        select(self.device)
    }
}

impl Runtime for Hip {
    const NAME: &'static str = "rocm";
    const COMPILER: &'static str = "hiprtc";
    type Alloc = HipAlloc;
    type Module = HipModule;
    type Func = HipFunc;
    type Event = HipEvent;
    type Blas = HipBlas;
    type Graph = HipGraph;
    type Comm = rccl::RcclComm;

    fn available() -> RtResult<()> {
        let no_device = |why: String| {
            RtError::Failed(format!(
                "no ROCm device is visible (is /dev/kfd passed through, and the user in the \
                 video and render groups?): {why}"
            ))
        };
        match device_count() {
            Ok(0) => return Err(no_device("hipGetDeviceCount found 0 devices".into())),
            Ok(_) => {}
            Err(e) => return Err(no_device(e.to_string())),
        }
        rtc::available()?;
        blas::available()
    }

    fn open(ordinal: usize) -> RtResult<(Hip, DeviceInfo)> {
        Self::available()?;
        let count = device_count()?;
        if ordinal >= count {
            return Err(RtError::Failed(format!(
                "rocm:{ordinal} does not exist: {count} ROCm device(s) visible"
            )));
        }
        let device = ordinal as c_int;
        select(device)?;
        let mut name = [0 as c_char; 256];
        // SAFETY: HIP writes at most `len` bytes, NUL included, into the buffer.
        check("hipDeviceGetName", unsafe {
            ffi::hipDeviceGetName(name.as_mut_ptr(), name.len() as c_int, device)
        })?;
        // SAFETY: the buffer is NUL-terminated: HIP terminates it, and it started zeroed.
        let name = unsafe { CStr::from_ptr(name.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        let mut driver_version = 0;
        // SAFETY: writes one int through a valid pointer.
        check("hipDriverGetVersion", unsafe {
            ffi::hipDriverGetVersion(&mut driver_version)
        })?;
        let info = DeviceInfo {
            name,
            arch: arch_name(device)?,
            sm_count: attribute(
                device,
                ffi::ATTR_MULTIPROCESSOR_COUNT,
                "hipDeviceAttributeMultiprocessorCount",
            )?,
            warp_size: attribute(device, ffi::ATTR_WARP_SIZE, "hipDeviceAttributeWarpSize")?,
            driver_version,
        };
        let mut stream: ffi::Stream = std::ptr::null_mut();
        // SAFETY: writes one stream handle through a valid pointer; `Hip` destroys it.
        check("hipStreamCreateWithFlags", unsafe {
            ffi::hipStreamCreateWithFlags(&mut stream, ffi::STREAM_NON_BLOCKING)
        })?;
        Ok((Hip { device, stream }, info))
    }

    fn mem_info(&self) -> RtResult<(usize, usize)> {
        self.bind()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: writes two sizes through valid pointers.
        check("hipMemGetInfo", unsafe {
            ffi::hipMemGetInfo(&mut free, &mut total)
        })?;
        Ok((free, total))
    }

    fn alloc(&self, bytes: usize) -> RtResult<(HipAlloc, u64)> {
        self.bind()?;
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: writes one pointer; the memory is uninitialized, and every reader in the
        // backend reads only what a kernel or copy wrote first (tests poison outputs with NaN
        // to check that). `HipAlloc` frees it.
        check("hipMalloc", unsafe { ffi::hipMalloc(&mut ptr, bytes) })?;
        let a = HipAlloc {
            device: self.device,
            ptr,
        };
        Ok((a, ptr as u64))
    }

    fn alloc_pinned(&self, bytes: usize) -> RtResult<Option<Box<dyn PinnedHost>>> {
        self.bind()?;
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: writes one pointer; `HipPinned` frees it.
        check("hipHostMalloc", unsafe {
            ffi::hipHostMalloc(&mut ptr, bytes, 0)
        })?;
        Ok(Some(Box::new(HipPinned {
            ptr: ptr.cast(),
            len: bytes,
        })))
    }

    unsafe fn upload_async(&self, dst: u64, src: &[u8]) -> RtResult<()> {
        self.bind()?;
        // SAFETY: the range is inside a live allocation and `src` (page-locked, copied
        // while the host goes on, or pageable, copied before this returns) outlives the
        // copy (caller).
        check("hipMemcpyAsync (host to device)", unsafe {
            ffi::hipMemcpyAsync(
                dst as *mut c_void,
                src.as_ptr() as *const c_void,
                src.len(),
                ffi::MEMCPY_HOST_TO_DEVICE,
                self.stream,
            )
        })
    }

    unsafe fn upload(&self, dst: u64, src: &[u8]) -> RtResult<()> {
        // SAFETY: the range is inside a live allocation (caller); `src` is pageable host
        // memory, which hipMemcpyAsync copies synchronously (hip_runtime_api.h, ROCm 5.2
        // through 7: "If host or dest are not pinned, the memory copy will be performed
        // synchronously"), so `src` is free again when this returns.
        unsafe { self.upload_async(dst, src) }
    }

    unsafe fn download(&self, src: u64, dst: &mut [u8]) -> RtResult<()> {
        self.bind()?;
        // SAFETY: the range is inside a live allocation (caller); the stream is synchronized
        // before `dst` is read or dropped.
        check("hipMemcpyAsync (device to host)", unsafe {
            ffi::hipMemcpyAsync(
                dst.as_mut_ptr() as *mut c_void,
                src as *const c_void,
                dst.len(),
                ffi::MEMCPY_DEVICE_TO_HOST,
                self.stream,
            )
        })?;
        self.sync()
    }

    unsafe fn launch(
        &self,
        f: &HipFunc,
        grid: Grid,
        smem: u32,
        params: &mut [*mut c_void],
    ) -> RtResult<()> {
        self.bind()?;
        let (x, y, z) = grid.blocks;
        // SAFETY: per this method's contract; `extra` is null (parameters go by `params`).
        check("hipModuleLaunchKernel", unsafe {
            ffi::hipModuleLaunchKernel(
                f.0,
                x,
                y,
                z,
                grid.threads,
                1,
                1,
                smem,
                self.stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })
    }

    fn sync(&self) -> RtResult<()> {
        // SAFETY: the stream is live.
        check("hipStreamSynchronize", unsafe {
            ffi::hipStreamSynchronize(self.stream)
        })
    }

    fn total_memory(ordinal: usize) -> RtResult<usize> {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: selects a device of this thread, then writes two sizes through valid
        // pointers.
        unsafe {
            check("hipSetDevice", ffi::hipSetDevice(ordinal as c_int))?;
            check("hipMemGetInfo", ffi::hipMemGetInfo(&mut free, &mut total))?;
        }
        Ok(total)
    }

    fn new_event(&self) -> RtResult<HipEvent> {
        self.bind()?;
        let mut e: ffi::Event = std::ptr::null_mut();
        // SAFETY: writes one event handle; `HipEvent` destroys it.
        check("hipEventCreate", unsafe { ffi::hipEventCreate(&mut e) })?;
        Ok(HipEvent(e))
    }

    fn record(&self, e: &HipEvent) -> RtResult<()> {
        // SAFETY: the event and the stream are live.
        check("hipEventRecord", unsafe {
            ffi::hipEventRecord(e.0, self.stream)
        })
    }

    fn wait(&self, e: &HipEvent) -> RtResult<()> {
        // SAFETY: the event is live.
        check("hipEventSynchronize", unsafe {
            ffi::hipEventSynchronize(e.0)
        })
    }

    fn elapsed_ms(&self, start: &HipEvent, end: &HipEvent) -> RtResult<f32> {
        let mut ms = 0f32;
        // SAFETY: both events are live; writes one float through a valid pointer.
        unsafe {
            check("hipEventSynchronize", ffi::hipEventSynchronize(end.0))?;
            check(
                "hipEventElapsedTime",
                ffi::hipEventElapsedTime(&mut ms, start.0, end.0),
            )?;
        }
        Ok(ms)
    }

    /// The target is `gcnArchName` as the device reports it (`gfx90a:sramecc+:xnack-`), so
    /// the code object matches the device's features.
    ///
    /// No `-mllvm` options: hipRTC compiles in-process, where they set LLVM's global option
    /// state, and sources are compiled on parallel threads (ROCm 5.2 loses them when
    /// compiles start together). So unlike Debian's `hipcc` (the CI AOT compile, which adds
    /// `-mllvm -amdgpu-early-inline-all=true`), device functions are inlined only as the
    /// kernel source asks.
    fn compile_options(info: &DeviceInfo, _tuning: &crate::backend::GpuTuning) -> Vec<String> {
        vec![
            format!("--offload-arch={}", info.arch),
            format!("-DKILN_WARP_SIZE={}", info.warp_size),
            "-std=c++17".to_string(),
            "-O3".to_string(),
        ]
    }

    fn compiler_version() -> String {
        rtc::version()
    }

    fn compile(text: &str, name: &str, opts: &[String]) -> RtResult<Vec<u8>> {
        rtc::compile(text, name, opts)
    }

    fn load_module(&self, image: &[u8]) -> RtResult<HipModule> {
        self.bind()?;
        let mut words = vec![0u64; image.len().div_ceil(8)];
        // SAFETY: `words` holds at least `image.len()` bytes and does not overlap `image`.
        unsafe {
            std::ptr::copy_nonoverlapping(
                image.as_ptr(),
                words.as_mut_ptr() as *mut u8,
                image.len(),
            )
        };
        let mut handle: ffi::Module = std::ptr::null_mut();
        // SAFETY: the image is a complete code object in memory that outlives the module
        // (`HipModule` keeps it); `HipModule` unloads the handle.
        check("hipModuleLoadData", unsafe {
            ffi::hipModuleLoadData(&mut handle, words.as_ptr() as *const c_void)
        })?;
        Ok(HipModule {
            handle,
            _image: words,
        })
    }

    fn function(&self, m: &HipModule, name: &str) -> Option<HipFunc> {
        let c_name = CString::new(name).ok()?;
        let mut f: ffi::Function = std::ptr::null_mut();
        // SAFETY: the module is live; writes one function handle, valid while it lives.
        let r = unsafe { ffi::hipModuleGetFunction(&mut f, m.handle, c_name.as_ptr()) };
        (r == ffi::SUCCESS && !f.is_null()).then_some(HipFunc(f))
    }

    fn resources(&self, f: &HipFunc) -> (i32, i32, i32) {
        let get = |attr| {
            let mut v: c_int = -1;
            // SAFETY: the function is live; writes one int through a valid pointer.
            match unsafe { ffi::hipFuncGetAttribute(&mut v, attr, f.0) } {
                ffi::SUCCESS => v,
                _ => -1,
            }
        };
        (
            get(ffi::FUNC_ATTRIBUTE_NUM_REGS),
            get(ffi::FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES),
            get(ffi::FUNC_ATTRIBUTE_SHARED_SIZE_BYTES),
        )
    }

    fn blas(&self) -> RtResult<HipBlas> {
        self.bind()?;
        let (workspace, ws_ptr) = self.alloc(BLAS_WORKSPACE)?;
        // SAFETY: the stream outlives the handle (the handle is dropped first: it is a field
        // of the backend declared before the device), and the workspace is dropped after it
        // (field order of `HipBlas`); both belong to the device selected above.
        let blas = unsafe { blas::RocBlas::new(self.stream, ws_ptr, BLAS_WORKSPACE) }?;
        Ok(HipBlas {
            blas,
            _workspace: workspace,
        })
    }

    unsafe fn gemm(
        &self,
        b: &HipBlas,
        dt: DType,
        x: u64,
        w: u64,
        out: u64,
        n: usize,
        k: usize,
        m: usize,
    ) -> RtResult<()> {
        let ty = match dt {
            DType::F32 => blas::DATATYPE_F32,
            DType::Bf16 => blas::DATATYPE_BF16,
        };
        self.bind()?;
        // SAFETY: per this method's contract.
        unsafe { b.blas.gemm(ty, x, w, out, n, k, m) }
    }

    fn begin_capture(&self) -> RtResult<()> {
        self.bind()?;
        // Thread-local: other lanes (and other tests in this process) keep allocating and
        // synchronizing while this one records.
        // SAFETY: the stream is live.
        check("hipStreamBeginCapture", unsafe {
            ffi::hipStreamBeginCapture(self.stream, ffi::CAPTURE_MODE_THREAD_LOCAL)
        })
    }

    fn end_capture(&self) -> RtResult<HipGraph> {
        let mut graph: ffi::Graph = std::ptr::null_mut();
        // SAFETY: the stream is live and capturing; writes one graph handle.
        check("hipStreamEndCapture", unsafe {
            ffi::hipStreamEndCapture(self.stream, &mut graph)
        })?;
        if graph.is_null() {
            return Err(RtError::Failed("stream capture recorded nothing".into()));
        }
        let mut exec: ffi::GraphExec = std::ptr::null_mut();
        // SAFETY: `graph` is live; no error node or log buffer is requested (null, 0).
        let r = unsafe {
            ffi::hipGraphInstantiate(
                &mut exec,
                graph,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        if let Err(e) = check("hipGraphInstantiate", r) {
            // SAFETY: the graph is live, uninstantiated, and destroyed once.
            let _ = unsafe { ffi::hipGraphDestroy(graph) };
            return Err(e);
        }
        Ok(HipGraph { exec, graph })
    }

    fn replay(&self, g: &HipGraph) -> RtResult<()> {
        self.bind()?;
        // SAFETY: the executable graph and the stream are live.
        check("hipGraphLaunch", unsafe {
            ffi::hipGraphLaunch(g.exec, self.stream)
        })
    }

    fn device_count() -> RtResult<usize> {
        Self::available()?;
        device_count()
    }

    fn comm_id() -> RtResult<Vec<u8>> {
        rccl::unique_id()
    }

    fn comm_join(&self, id: &[u8], rank: usize, size: usize) -> RtResult<rccl::RcclComm> {
        // RCCL binds the communicator to the thread's current device.
        self.bind()?;
        rccl::join(id, rank, size)
    }

    unsafe fn all_reduce_sum(
        &self,
        c: &rccl::RcclComm,
        dt: DType,
        x: u64,
        count: usize,
    ) -> RtResult<()> {
        self.bind()?;
        // SAFETY: per the trait's contract; this lane's device is selected and its stream live.
        unsafe { rccl::all_reduce_sum(c, self.stream, dt, x, count) }
    }

    unsafe fn all_gather(
        &self,
        c: &rccl::RcclComm,
        dt: DType,
        send: u64,
        recv: u64,
        count: usize,
    ) -> RtResult<()> {
        self.bind()?;
        // SAFETY: per the trait's contract; this lane's device is selected and its stream live.
        unsafe { rccl::all_gather(c, self.stream, dt, send, recv, count) }
    }

    unsafe fn copy_2d(
        &self,
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
        self.bind()?;
        // SAFETY: both ranges lie inside live device allocations (the trait's contract);
        // queued on the lane's stream, so graph capture records it.
        check("hipMemcpy2DAsync", unsafe {
            ffi::hipMemcpy2DAsync(
                dst as *mut c_void,
                dst_pitch,
                src as *const c_void,
                src_pitch,
                width,
                height,
                ffi::MEMCPY_DEVICE_TO_DEVICE,
                self.stream,
            )
        })
    }
}

/// Whether RCCL, which a tensor-parallel ROCm lane needs, loads (the reason, naming
/// `librccl`, where it does not). Needs no device.
pub fn collectives_available() -> RtResult<()> {
    rccl::available()
}
