//! [`Runtime`] for NVIDIA through cudarc: the driver API (loaded at run time), NVRTC and
//! cuBLAS. Nothing here is needed to build; a machine without CUDA gets a clear error from
//! [`Runtime::available`].

use std::ffi::{CStr, CString, c_int, c_void};
use std::sync::Arc;

use cudarc::cublas::{result as blas, sys as blas_sys};
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr,
    DriverError, PinnedHostSlice, result, sys,
};
use cudarc::nvrtc::{Ptx, result as nvrtc, sys as nvrtc_sys};

use super::runtime::{DeviceInfo, Grid, PinnedHost, RtError, RtResult, Runtime};
use crate::backend::DType;

/// One CUDA device: its primary context and a non-blocking stream of this lane's own.
pub struct Cuda {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// Whether [`Runtime::launch_dependent`] uses programmatic dependent launch
    /// ([`pdl_available`]); which launches ask for it is the device's `PdlPolicy`.
    pdl: bool,
}

/// Device `ordinal`'s name, architecture and limits, read from the driver (initialized)
/// without a context, so [`Runtime::probe`] and [`Runtime::open`] report the same.
fn device_info(ordinal: usize) -> RtResult<DeviceInfo> {
    let dev = result::device::get(ordinal as c_int).map_err(failed)?;
    let attr = |a| {
        // SAFETY: `dev` is a device handle the driver just returned.
        unsafe { result::device::get_attribute(dev, a) }.map_err(failed)
    };
    use sys::CUdevice_attribute as A;
    let major = attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    let minor = attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    let mut driver_version = 0;
    // SAFETY: writes one int through a valid pointer.
    unsafe { sys::cuDriverGetVersion(&mut driver_version) }
        .result()
        .map_err(failed)?;
    Ok(DeviceInfo {
        name: result::device::get_name(dev).map_err(failed)?,
        arch: format!("sm_{major}{minor}"),
        sm_count: attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as usize,
        warp_size: attr(A::CU_DEVICE_ATTRIBUTE_WARP_SIZE)? as usize,
        driver_version,
    })
}

/// Programmatic dependent launch needs sm_90+ and a driver of CUDA 12.3+ (whose graph
/// capture keeps the programmatic edges); whether a launch asks for it (`pdl = off`: none)
/// is the device's `PdlPolicy`.
fn pdl_available(info: &DeviceInfo) -> bool {
    super::caps::pdl_hardware(info)
}

fn failed(e: DriverError) -> RtError {
    match e.0 {
        sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => RtError::OutOfMemory,
        _ => RtError::Failed(e.to_string()),
    }
}

fn blas_failed(e: blas::CublasError) -> RtError {
    RtError::Failed(format!("cuBLAS: {e:?}"))
}

/// The cuBLAS handle of a lane, bound to its stream.
pub struct CudaBlas {
    handle: blas_sys::cublasHandle_t,
    /// cuBLAS's workspace, set explicitly so graph capture never allocates.
    _workspace: CudaSlice<u8>,
}

impl Drop for CudaBlas {
    fn drop(&mut self) {
        // SAFETY: the handle is live and destroyed once; errors cannot be reported from drop.
        let _ = unsafe { blas::destroy_handle(self.handle) };
    }
}

/// Page-locked host memory of cudarc's (`cuMemHostAlloc`).
struct CudaPinned(PinnedHostSlice<u8>);

impl PinnedHost for CudaPinned {
    fn bytes_mut(&mut self) -> RtResult<&mut [u8]> {
        // cudarc's own event is never recorded (copies go through `upload_async`, whose
        // caller waits for an event of its own), so this does not wait.
        self.0.as_mut_slice().map_err(failed)
    }
}

/// cuBLAS workspace: what NVIDIA documents for Hopper (32 MiB) covers older parts too.
const BLAS_WORKSPACE: usize = 32 << 20;

impl Runtime for Cuda {
    const NAME: &'static str = "cuda";
    const COMPILER: &'static str = "nvrtc";
    type Alloc = CudaSlice<u8>;
    type Module = Arc<CudaModule>;
    type Func = CudaFunction;
    type Event = CudaEvent;
    type Blas = CudaBlas;
    type Graph = cudarc::driver::CudaGraph;
    type Comm = super::nccl::NcclComm;

    fn available() -> RtResult<()> {
        let missing = |lib: &str| {
            RtError::Failed(format!(
                "the CUDA library {lib} cannot be loaded (no driver or toolkit on this machine?)"
            ))
        };
        // SAFETY: each call only tries to dlopen the library by its candidate names and
        // reports whether that worked; no symbol is called.
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
        match CudaContext::device_count().map_err(failed)? {
            0 => Err(RtError::Failed("no CUDA device is visible".into())),
            _ => Ok(()),
        }
    }

    fn open(ordinal: usize) -> RtResult<(Cuda, DeviceInfo)> {
        Self::available()?;
        let ctx = CudaContext::new(ordinal).map_err(failed)?;
        // SAFETY: the backend uses one stream and orders every use of its buffers on it, so
        // cudarc's cross-stream event tracking is not needed; buffers are created after this.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(failed)?;
        let info = device_info(ordinal)?;
        let cuda = Cuda {
            ctx,
            stream,
            pdl: pdl_available(&info),
        };
        Ok((cuda, info))
    }

    fn mem_info(&self) -> RtResult<(usize, usize)> {
        self.ctx.mem_get_info().map_err(failed)
    }

    fn alloc(&self, bytes: usize) -> RtResult<(CudaSlice<u8>, u64)> {
        // SAFETY: the memory is uninitialized; every reader in the backend reads only what a
        // kernel or copy wrote first (tests poison outputs with NaN to check that).
        let slice = unsafe { self.stream.alloc::<u8>(bytes) }.map_err(failed)?;
        let ptr = slice.device_ptr(&self.stream).0;
        Ok((slice, ptr))
    }

    unsafe fn upload(&self, dst: u64, src: &[u8]) -> RtResult<()> {
        self.ctx.bind_to_thread().map_err(failed)?;
        // SAFETY: the range is inside a live allocation (caller); `src` is pageable host
        // memory, so the driver stages it before returning.
        unsafe { result::memcpy_htod_async(dst, src, self.stream.cu_stream()) }.map_err(failed)
    }

    fn alloc_pinned(&self, bytes: usize) -> RtResult<Option<Box<dyn PinnedHost>>> {
        // Plain page-locked memory (not write-combined: the repack writes it in pieces).
        // SAFETY: the memory is uninitialized; the stager writes every byte it copies.
        let p = unsafe { self.ctx.alloc_pinned_with_flags::<u8>(bytes, 0) }.map_err(failed)?;
        Ok(Some(Box::new(CudaPinned(p))))
    }

    unsafe fn upload_async(&self, dst: u64, src: &[u8]) -> RtResult<()> {
        self.ctx.bind_to_thread().map_err(failed)?;
        // SAFETY: the range is inside a live allocation and `src` (page-locked, or pageable
        // and staged by the driver before returning) outlives the copy (caller).
        unsafe { result::memcpy_htod_async(dst, src, self.stream.cu_stream()) }.map_err(failed)
    }

    unsafe fn download(&self, src: u64, dst: &mut [u8]) -> RtResult<()> {
        self.ctx.bind_to_thread().map_err(failed)?;
        // SAFETY: the range is inside a live allocation (caller); the stream is synchronized
        // before `dst` is read or dropped.
        unsafe { result::memcpy_dtoh_async(dst, src, self.stream.cu_stream()) }.map_err(failed)?;
        self.stream.synchronize().map_err(failed)
    }

    unsafe fn launch(
        &self,
        f: &CudaFunction,
        grid: Grid,
        smem: u32,
        params: &mut [*mut c_void],
    ) -> RtResult<()> {
        self.ctx.bind_to_thread().map_err(failed)?;
        // SAFETY: per this method's contract.
        unsafe {
            result::launch_kernel(
                f.cu_function(),
                grid.blocks,
                (grid.threads, 1, 1),
                smem,
                self.stream.cu_stream(),
                params,
            )
        }
        .map_err(failed)
    }

    unsafe fn launch_dependent(
        &self,
        f: &CudaFunction,
        grid: Grid,
        smem: u32,
        params: &mut [*mut c_void],
    ) -> RtResult<()> {
        if !self.pdl {
            // SAFETY: per this method's contract.
            return unsafe { self.launch(f, grid, smem, params) };
        }
        self.ctx.bind_to_thread().map_err(failed)?;
        // SAFETY: a zeroed attribute value is a valid union (plain integers); the field set
        // is the one the id names.
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let config = sys::CUlaunchConfig {
            gridDimX: grid.blocks.0,
            gridDimY: grid.blocks.1,
            gridDimZ: grid.blocks.2,
            blockDimX: grid.threads,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: smem,
            hStream: self.stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: 1,
        };
        // SAFETY: per this method's contract; `config` and `attr` live across the call, and
        // the kernel waits for its predecessors before touching their buffers (the contract).
        unsafe {
            sys::cuLaunchKernelEx(
                &config,
                f.cu_function(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
        .map_err(failed)
    }

    fn sync(&self) -> RtResult<()> {
        self.stream.synchronize().map_err(failed)
    }

    fn new_event(&self) -> RtResult<CudaEvent> {
        self.ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(failed)
    }

    fn record(&self, e: &CudaEvent) -> RtResult<()> {
        e.record(&self.stream).map_err(failed)
    }

    fn wait(&self, e: &CudaEvent) -> RtResult<()> {
        e.synchronize().map_err(failed)
    }

    fn elapsed_ms(&self, start: &CudaEvent, end: &CudaEvent) -> RtResult<f32> {
        start.elapsed_ms(end).map_err(failed)
    }

    fn compile_options(info: &DeviceInfo, tuning: &crate::backend::GpuTuning) -> Vec<String> {
        use crate::backend::tuning::NvrtcSplit;
        let mut opts = vec![
            format!("--gpu-architecture={}", info.arch),
            format!("-DKILN_WARP_SIZE={}", info.warp_size),
            "--std=c++17".to_string(),
        ];
        // NVRTC optimizes the kernels of one source on several threads (0: one per CPU), so
        // the largest source no longer bounds a cold start alone. `nvrtc_split = off`
        // (`KILN_NVRTC_SPLIT=off`) compiles each source on one thread, `N` on at most N.
        match tuning.nvrtc_split {
            NvrtcSplit::Off => {}
            NvrtcSplit::Threads(n) => opts.push(format!("--split-compile={n}")),
            NvrtcSplit::Auto => opts.push("--split-compile=0".to_string()),
        }
        opts
    }

    fn compiler_version() -> String {
        let (mut major, mut minor): (c_int, c_int) = (0, 0);
        // SAFETY: writes two ints through valid pointers.
        let _ = unsafe { nvrtc_sys::nvrtcVersion(&mut major, &mut minor) };
        format!("nvrtc {major}.{minor}")
    }

    fn compile(text: &str, name: &str, opts: &[String]) -> RtResult<Vec<u8>> {
        let err = |m: String| RtError::Failed(format!("{name}: {m}"));
        let c_src = CString::new(text).map_err(|_| err("NUL in source".into()))?;
        let c_name = CString::new(name).map_err(|_| err("NUL in name".into()))?;
        let prog =
            nvrtc::create_program(&c_src, Some(&c_name)).map_err(|e| err(format!("{e:?}")))?;
        // SAFETY: `prog` was created above and is destroyed exactly once, below; the log and
        // CUBIN buffers are sized by NVRTC's own size queries before being filled.
        unsafe {
            let result = match nvrtc::compile_program(prog, opts) {
                Ok(()) => cubin(prog).map_err(err),
                Err(e) => {
                    let log = nvrtc::get_program_log(prog)
                        .map(|l| CStr::from_ptr(l.as_ptr()).to_string_lossy().into_owned())
                        .unwrap_or_default();
                    Err(err(format!("{e:?}\n{log}")))
                }
            };
            let _ = nvrtc::destroy_program(prog);
            result
        }
    }

    fn load_module(&self, image: &[u8]) -> RtResult<Arc<CudaModule>> {
        self.ctx
            .load_module(Ptx::from_binary(image.to_vec()))
            .map_err(failed)
    }

    fn function(&self, m: &Arc<CudaModule>, name: &str) -> Option<CudaFunction> {
        m.load_function(name).ok()
    }

    fn resources(&self, f: &CudaFunction) -> (i32, i32, i32) {
        (
            f.num_regs().unwrap_or(-1),
            f.local_size_bytes().unwrap_or(-1),
            f.shared_size_bytes().unwrap_or(-1),
        )
    }

    fn allow_dynamic_smem(&self, f: &CudaFunction, bytes: u32) -> RtResult<()> {
        use sys::CUfunction_attribute::*;
        self.ctx.bind_to_thread().map_err(failed)?;
        f.set_attribute(
            CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            bytes as i32,
        )
        .map_err(failed)?;
        // The largest shared-memory carveout (L1 gets the rest), so that blocks of this
        // size fit as many to an SM as their registers allow.
        f.set_attribute(CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, 100)
            .map_err(failed)
    }

    fn blas(&self) -> RtResult<CudaBlas> {
        self.ctx.bind_to_thread().map_err(failed)?;
        let (workspace, ws_ptr) = self.alloc(BLAS_WORKSPACE)?;
        let handle = blas::create_handle().map_err(blas_failed)?;
        let b = CudaBlas {
            handle,
            _workspace: workspace,
        };
        // SAFETY: the handle was just created; the stream and the workspace outlive it (the
        // handle is dropped first: it is a field of the backend declared before the device).
        unsafe {
            blas::set_stream(handle, self.stream.cu_stream() as _).map_err(blas_failed)?;
            blas_sys::cublasSetWorkspace_v2(handle, ws_ptr as *mut c_void, BLAS_WORKSPACE)
                .result()
                .map_err(blas_failed)?;
        }
        Ok(b)
    }

    unsafe fn gemm(
        &self,
        b: &CudaBlas,
        dt: DType,
        x: u64,
        w: u64,
        out: u64,
        n: usize,
        k: usize,
        m: usize,
    ) -> RtResult<()> {
        // cuBLAS is column-major and a row-major [r, c] buffer is a column-major [c, r] one,
        // so this computes C = out^T (m x n, ld m) = op(A) B with A = w seen column-major
        // (k x m, ld k, op T) and B = x seen column-major (k x n, ld k). Compute in f32,
        // no TF32 (the default math mode).
        let ty = match dt {
            DType::F32 => blas_sys::cudaDataType::CUDA_R_32F,
            DType::Bf16 => blas_sys::cudaDataType::CUDA_R_16BF,
        };
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: per this method's contract; alpha/beta are f32 as CUBLAS_COMPUTE_32F
        // requires and live across the call.
        unsafe {
            blas::gemm_ex(
                b.handle,
                blas_sys::cublasOperation_t::CUBLAS_OP_T,
                blas_sys::cublasOperation_t::CUBLAS_OP_N,
                m as i32,
                n as i32,
                k as i32,
                &alpha as *const f32 as *const c_void,
                w as *const c_void,
                ty,
                k as i32,
                x as *const c_void,
                ty,
                k as i32,
                &beta as *const f32 as *const c_void,
                out as *mut c_void,
                ty,
                m as i32,
                blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(blas_failed)
    }

    fn begin_capture(&self) -> RtResult<()> {
        // Thread-local: other lanes (and other tests in this process) keep allocating and
        // synchronizing while this one records.
        self.stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(failed)?;
        Ok(())
    }

    fn end_capture(&self) -> RtResult<cudarc::driver::CudaGraph> {
        self.stream
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .map_err(failed)?
            .ok_or_else(|| RtError::Failed("stream capture recorded nothing".into()))
    }

    fn replay(&self, g: &cudarc::driver::CudaGraph) -> RtResult<()> {
        g.launch().map_err(failed)
    }

    fn probe(ordinal: usize) -> Option<DeviceInfo> {
        Self::available().ok()?;
        result::init().ok()?;
        device_info(ordinal).ok()
    }

    fn total_memory(ordinal: usize) -> RtResult<usize> {
        Self::available()?;
        result::init().map_err(failed)?;
        let dev = result::device::get(ordinal as c_int).map_err(failed)?;
        // SAFETY: `dev` is a device handle the driver just returned.
        unsafe { result::device::total_mem(dev) }.map_err(failed)
    }

    fn device_count() -> RtResult<usize> {
        Self::available()?;
        Ok(CudaContext::device_count().map_err(failed)?.max(0) as usize)
    }

    fn comm_id() -> RtResult<Vec<u8>> {
        super::nccl::unique_id()
    }

    fn comm_join(&self, id: &[u8], rank: usize, size: usize) -> RtResult<Self::Comm> {
        // NCCL binds the communicator to the current device.
        self.ctx.bind_to_thread().map_err(failed)?;
        super::nccl::join(id, rank, size)
    }

    fn comm_join_or_give_up(
        &self,
        id: &[u8],
        rank: usize,
        size: usize,
        give_up: &dyn Fn() -> bool,
    ) -> RtResult<Self::Comm> {
        let ctx = self.ctx.clone();
        let bind = move || ctx.bind_to_thread().map_err(failed);
        super::nccl::join_or_give_up(id.to_vec(), rank, size, bind, give_up)
    }

    unsafe fn all_reduce_sum(
        &self,
        c: &Self::Comm,
        dt: DType,
        x: u64,
        count: usize,
    ) -> RtResult<()> {
        self.ctx.bind_to_thread().map_err(failed)?;
        // SAFETY: per the trait's contract.
        unsafe { super::nccl::all_reduce_sum(c, self.stream.cu_stream(), dt, x, count) }
    }

    unsafe fn all_gather(
        &self,
        c: &Self::Comm,
        dt: DType,
        send: u64,
        recv: u64,
        count: usize,
    ) -> RtResult<()> {
        self.ctx.bind_to_thread().map_err(failed)?;
        // SAFETY: per the trait's contract.
        unsafe { super::nccl::all_gather(c, self.stream.cu_stream(), dt, send, recv, count) }
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
        self.ctx.bind_to_thread().map_err(failed)?;
        let s = self.stream.cu_stream();
        // SAFETY: per the trait's contract.
        unsafe { super::nccl::copy_2d(s, dst, dst_pitch, src, src_pitch, width, height) }
    }
}

/// # Safety
/// `prog` must be a successfully compiled, live NVRTC program.
unsafe fn cubin(prog: nvrtc_sys::nvrtcProgram) -> Result<Vec<u8>, String> {
    let mut size = 0usize;
    // SAFETY: per this function's contract; NVRTC writes the size, then that many bytes.
    unsafe {
        nvrtc_sys::nvrtcGetCUBINSize(prog, &mut size)
            .result()
            .map_err(|e| format!("{e:?}"))?;
        let mut buf = vec![0u8; size];
        nvrtc_sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut std::ffi::c_char)
            .result()
            .map_err(|e| format!("{e:?}"))?;
        Ok(buf)
    }
}
