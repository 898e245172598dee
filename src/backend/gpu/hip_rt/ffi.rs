//! A hand-written FFI to exactly the HIP runtime functions Kiln calls, linked against
//! `libamdhip64` (build.rs, `rocm` feature). Every value below was checked against ROCm 5.2's
//! `/usr/include/hip/hip_runtime_api.h` (Debian's libamdhip64-dev, what CI links against) by
//! a C program built with `gcc -D__HIP_PLATFORM_AMD__ -I/usr/include`, and against the current
//! header of ROCm/rocm-systems (ROCm 6/7) for stability across releases. The values and
//! layout offsets below are also asserted against the installed header by `c_check` (CI).

use std::ffi::{c_char, c_int, c_uint, c_void};

/// `hipError_t`: a C enum, so an `int`.
pub type HipError = c_int;
pub type Stream = *mut c_void;
pub type Module = *mut c_void;
pub type Function = *mut c_void;
pub type Event = *mut c_void;
pub type Graph = *mut c_void;
pub type GraphExec = *mut c_void;
pub type GraphNode = *mut c_void;

pub const SUCCESS: HipError = 0;
/// `hipErrorOutOfMemory`.
pub const ERROR_OUT_OF_MEMORY: HipError = 2;

/// `hipDeviceAttribute_t` values. ROCm 5.0 renumbered the enum (the CUDA-compatible
/// attributes count from `hipDeviceAttributeCudaCompatibleBegin = 0`, alphabetically); since
/// then entries are only renamed in place (`hipDeviceAttributeName` became `Unused1`,
/// `Uuid` became `Unused2`), never inserted, so these numbers hold for ROCm 5.x, 6.x and 7.x.
pub const ATTR_MULTIPROCESSOR_COUNT: c_int = 63;
pub const ATTR_WARP_SIZE: c_int = 87;

/// `hipMemcpyKind` values (as CUDA's `cudaMemcpyKind`).
pub const MEMCPY_HOST_TO_DEVICE: c_int = 1;
pub const MEMCPY_DEVICE_TO_HOST: c_int = 2;
pub const MEMCPY_DEVICE_TO_DEVICE: c_int = 3;

/// `hipStreamNonBlocking` (a `#define`).
pub const STREAM_NON_BLOCKING: c_uint = 1;
/// `hipStreamCaptureModeThreadLocal` (`Global = 0, ThreadLocal, Relaxed`, as in CUDA).
pub const CAPTURE_MODE_THREAD_LOCAL: c_int = 1;

/// `hipFunction_attribute` values (the order of CUDA's `CUfunction_attribute`).
pub const FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: c_int = 1;
pub const FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES: c_int = 3;
pub const FUNC_ATTRIBUTE_NUM_REGS: c_int = 4;

/// `hipDeviceProp_t` is read as raw bytes, only for `name` and `gcnArchName`.
///
/// ROCm 5.x layout (checked with `offsetof`/`sizeof` against the 5.2 header): 792 bytes,
/// `char name[256]` at 0, `char gcnArchName[256]` at 396. ROCm 6.0 grew the struct
/// (`hipDeviceProp_tR0600`, `gcnArchName` at 1160) and its headers map the name
/// `hipGetDeviceProperties` to the new symbol `hipGetDevicePropertiesR0600`, but the library
/// keeps exporting the plain `hipGetDeviceProperties` (and `hipGetDevicePropertiesR0000`) with
/// the old layout for binaries built against 5.x (ROCm/ROCm#2728; llvm-project#167695 reads
/// both layouts the same way). Kiln declares the plain symbol below, so it gets the old
/// layout; it still passes a zeroed buffer far larger than either struct and accepts the arch
/// name at either offset only if it reads as `gfx...`.
pub const PROP_BUFFER_BYTES: usize = 8192;
pub const PROP_NAME_OFFSET: usize = 0;
pub const PROP_GCN_ARCH_NAME_OFFSETS: [usize; 2] = [396, 1160];
pub const PROP_STRING_BYTES: usize = 256;

unsafe extern "C" {
    pub fn hipGetErrorString(e: HipError) -> *const c_char;
    pub fn hipGetDeviceCount(count: *mut c_int) -> HipError;
    pub fn hipSetDevice(device: c_int) -> HipError;
    pub fn hipDeviceGetAttribute(value: *mut c_int, attr: c_int, device: c_int) -> HipError;
    /// `device` is a `hipDevice_t`, which on AMD is the ordinal itself (`hipDeviceGet`
    /// returns it unchanged).
    pub fn hipDeviceGetName(name: *mut c_char, len: c_int, device: c_int) -> HipError;
    pub fn hipGetDeviceProperties(prop: *mut c_void, device: c_int) -> HipError;
    pub fn hipDriverGetVersion(version: *mut c_int) -> HipError;

    pub fn hipStreamCreateWithFlags(stream: *mut Stream, flags: c_uint) -> HipError;
    pub fn hipStreamDestroy(stream: Stream) -> HipError;
    pub fn hipStreamSynchronize(stream: Stream) -> HipError;

    pub fn hipMalloc(ptr: *mut *mut c_void, bytes: usize) -> HipError;
    pub fn hipFree(ptr: *mut c_void) -> HipError;
    pub fn hipMemGetInfo(free: *mut usize, total: *mut usize) -> HipError;
    /// Page-locked host memory (`flags` 0: `hipHostMallocDefault`).
    pub fn hipHostMalloc(ptr: *mut *mut c_void, bytes: usize, flags: c_uint) -> HipError;
    pub fn hipHostFree(ptr: *mut c_void) -> HipError;
    pub fn hipMemcpyAsync(
        dst: *mut c_void,
        src: *const c_void,
        bytes: usize,
        kind: c_int,
        stream: Stream,
    ) -> HipError;

    /// Captured into graphs like the other async copies (tensor parallelism's gather).
    #[allow(clippy::too_many_arguments)]
    pub fn hipMemcpy2DAsync(
        dst: *mut c_void,
        dst_pitch: usize,
        src: *const c_void,
        src_pitch: usize,
        width: usize,
        height: usize,
        kind: c_int,
        stream: Stream,
    ) -> HipError;

    pub fn hipModuleLoadData(module: *mut Module, image: *const c_void) -> HipError;
    pub fn hipModuleUnload(module: Module) -> HipError;
    pub fn hipModuleGetFunction(f: *mut Function, module: Module, name: *const c_char) -> HipError;
    pub fn hipFuncGetAttribute(value: *mut c_int, attr: c_int, f: Function) -> HipError;
    #[allow(clippy::too_many_arguments)]
    pub fn hipModuleLaunchKernel(
        f: Function,
        grid_x: c_uint,
        grid_y: c_uint,
        grid_z: c_uint,
        block_x: c_uint,
        block_y: c_uint,
        block_z: c_uint,
        shared_bytes: c_uint,
        stream: Stream,
        params: *mut *mut c_void,
        extra: *mut *mut c_void,
    ) -> HipError;

    pub fn hipEventCreate(event: *mut Event) -> HipError;
    pub fn hipEventRecord(event: Event, stream: Stream) -> HipError;
    pub fn hipEventElapsedTime(ms: *mut f32, start: Event, end: Event) -> HipError;
    pub fn hipEventSynchronize(event: Event) -> HipError;
    pub fn hipEventDestroy(event: Event) -> HipError;

    pub fn hipStreamBeginCapture(stream: Stream, mode: c_int) -> HipError;
    pub fn hipStreamEndCapture(stream: Stream, graph: *mut Graph) -> HipError;
    pub fn hipGraphInstantiate(
        exec: *mut GraphExec,
        graph: Graph,
        error_node: *mut GraphNode,
        log: *mut c_char,
        log_bytes: usize,
    ) -> HipError;
    pub fn hipGraphLaunch(exec: GraphExec, stream: Stream) -> HipError;
    pub fn hipGraphExecDestroy(exec: GraphExec) -> HipError;
    pub fn hipGraphDestroy(graph: Graph) -> HipError;
}

/// Values and layout offsets `c_check` asserts against `hip/hip_runtime_api.h`, as C
/// expressions (`hipDeviceProp_t` is the ROCm 5 layout or, under ROCm 6+ headers, R0600's).
#[cfg(test)]
pub(super) fn c_facts() -> Vec<String> {
    let [arch5, arch6] = PROP_GCN_ARCH_NAME_OFFSETS;
    let arch = "offsetof(hipDeviceProp_t, gcnArchName)";
    vec![
        format!("hipSuccess == {SUCCESS}"),
        format!("hipErrorOutOfMemory == {ERROR_OUT_OF_MEMORY}"),
        format!("hipDeviceAttributeMultiprocessorCount == {ATTR_MULTIPROCESSOR_COUNT}"),
        format!("hipDeviceAttributeWarpSize == {ATTR_WARP_SIZE}"),
        format!("hipMemcpyHostToDevice == {MEMCPY_HOST_TO_DEVICE}"),
        format!("hipMemcpyDeviceToHost == {MEMCPY_DEVICE_TO_HOST}"),
        format!("hipMemcpyDeviceToDevice == {MEMCPY_DEVICE_TO_DEVICE}"),
        format!("hipStreamNonBlocking == {STREAM_NON_BLOCKING}"),
        format!("hipStreamCaptureModeThreadLocal == {CAPTURE_MODE_THREAD_LOCAL}"),
        format!("HIP_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES == {FUNC_ATTRIBUTE_SHARED_SIZE_BYTES}"),
        format!("HIP_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES == {FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES}"),
        format!("HIP_FUNC_ATTRIBUTE_NUM_REGS == {FUNC_ATTRIBUTE_NUM_REGS}"),
        format!("sizeof(hipError_t) == {}", std::mem::size_of::<HipError>()),
        format!("offsetof(hipDeviceProp_t, name) == {PROP_NAME_OFFSET}"),
        format!("sizeof(((hipDeviceProp_t*)0)->name) == {PROP_STRING_BYTES}"),
        format!("sizeof(((hipDeviceProp_t*)0)->gcnArchName) == {PROP_STRING_BYTES}"),
        format!("{arch} == {arch5} || {arch} == {arch6}"),
        format!("sizeof(hipDeviceProp_t) <= {PROP_BUFFER_BYTES}"),
    ]
}
