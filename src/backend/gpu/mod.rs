//! The GPU backend, written once for every vendor: kernels from `kernels/` compiled at lane
//! start by the runtime's compiler (NVRTC, hipRTC), GEMMs through the vendor BLAS (cuBLAS,
//! rocBLAS), attention in one launch per layer over the paged cache, sampling on the
//! device, decode steps replayed from graphs.
//!
//! Everything lives in one [`GpuBackend`], created and used on its lane's thread: runtime
//! and stream, loaded kernels, BLAS handle, weights, KV pool and workspaces. Nothing is
//! global; two backends in one process (parallel tests) share only the driver's primary
//! context. There is no CPU fallback: every op of the contract runs on the device, and
//! a missing kernel fails `new`. The vendor runtimes ([`runtime::Runtime`]) are the only
//! vendor-specific code.
//!
//! By noun: `batch` (step metadata, embed and row gather), `matmul` (GEMV, BLAS GEMM, bias,
//! SwiGLU), `norm`, `rope` (rope and the paged-cache writes), `attention`, `sample`,
//! `graphs` (decode graph capture and replay); `args` types every kernel's arguments.

mod args;
mod batch;
mod caps;
#[cfg(feature = "cuda")]
pub mod cuda_rt;
mod device;
mod graphs;
mod group;
#[cfg(feature = "rocm")]
pub mod hip_rt;
pub mod kernels;
mod meta;
#[cfg(feature = "cuda")]
mod nccl;
mod ops;
mod qtype;
mod qweight;
mod registry;
pub mod runtime;
mod timing;
mod types;

use std::collections::HashMap;

use args::KernelArgs;
pub use device::TransferStats;
use device::{Arg, DevBuf, Device};
pub use graphs::GraphStats;

pub use super::open::GpuOptions;
use kernels::{Kernel, KernelNeeds, Kernels};
pub use qtype::QType;
use runtime::{DeviceInfo, Grid, Runtime};
pub use timing::KernelTiming;
pub use types::{GpuBatch, GpuKv, GpuTensor, GpuWeight};

pub use super::DType;
use super::{
    Activation, AttnShape, Backend, BackendError, BatchPlan, HostTensor, KvShape, QkNorm, RopeSpec,
};
use crate::sampling::{SampleRow, Sampled};

/// The GPU backend of one lane, over vendor runtime `R`.
pub struct GpuBackend<R: Runtime> {
    // Field order is drop order: kernels, the BLAS handle, graphs and every buffer go
    // before the device.
    kernels: Kernels<R>,
    blas: R::Blas,
    dt: DType,
    switches: Switches,
    /// What the device can do, parsed once at `new`.
    caps: caps::Caps,
    /// The kernel-variant switches ([`GpuOptions::tuning`]).
    tuning: super::GpuTuning,
    step: batch::StepMeta,
    scratch: Scratch,
    graphs: graphs::Graphs<R>,
    /// Bumped by every allocation a recorded graph could address; graphs of an older
    /// generation are dropped before the next step.
    generation: u64,
    // The sampling workspaces (`sample.rs`).
    sample_in: Option<DevBuf>,
    sample_work: Option<DevBuf>,
    sample_out: Option<DevBuf>,
    /// The greedy pass's per-slice results, and its per-row counters (zeroed when allocated;
    /// the kernel leaves them zero).
    sample_parts: Option<DevBuf>,
    sample_counts: Option<DevBuf>,
    sample_pack: ops::sample::SamplePack,
    /// The tensor-parallel group this backend is a shard of (`group.rs`; none: whole model).
    group: Option<group::GpuGroup<R>>,
    /// Per kernel, the dynamic shared memory its launches are already allowed (`launch`).
    smem_allowed: HashMap<Kernel, u32>,
    /// Per 64-row tile kernel and block size, its blocks per SM (`qmma_resident`).
    qmma_resident: HashMap<(Kernel, u32), Option<usize>>,
    dev: Device<R>,
}

/// Which kernel variants this backend may use, fixed at `new`.
struct Switches {
    /// Small-batch matmuls may use the streaming kernels ([`GpuOptions::gemv`]).
    gemv: bool,
    /// Decode steps may use the decode attention variant ([`GpuOptions::attn_decode`]).
    attn_decode: bool,
}

/// Buffers allocated on first use and kept across steps (besides sampling's).
#[derive(Default)]
struct Scratch {
    /// The rope specs whose inverse frequencies are on the device, and their tables (one
    /// per distinct spec: Gemma 3's local and global layers alternate).
    rope: Vec<(RopeSpec, DevBuf)>,
    /// Split-K attention partials.
    attn_ws: Option<DevBuf>,
    /// The mixture-of-experts routes, sorted assignments and expert outputs (`moe.rs`).
    moe: Option<DevBuf>,
    /// The shared expert's activations (`moe.rs`).
    moe_shared: Option<ops::moe::SharedScratch>,
    /// Largest activation allocated, in elements (sizes the sampling workspace estimate).
    largest_alloc: usize,
    /// A quantized weight dequantized for a BLAS GEMM of a batch step: sized at upload for
    /// the largest quantized matrix, so graphs can address it.
    dequant: Option<DevBuf>,
    /// The 8-bit activation rows the last launch left in the dequant scratch for the next
    /// quantized decode matmul (`matmul.rs`); any other launch, write, download or
    /// allocation settles it first ([`GpuBackend::settle_qx`]).
    qx: Option<ops::matmul::QxRows>,
    /// Whether an op may leave work to the next (a decode matmul's residual norm, finished
    /// by the quantized matmul after it): within steps, whose tensors outlive it.
    fuse_across_ops: bool,
    /// Weight bytes on the device and in the file (the load log).
    weight_bytes: (usize, usize),
    /// Seconds spent in `upload_weight` (host repacking, copies and conversion launches).
    upload_s: f64,
}

fn invalid(m: String) -> BackendError {
    BackendError::InvalidBatch(m)
}

fn check_cols(what: &str, got: usize, want: usize) -> Result<(), BackendError> {
    if got != want {
        return Err(invalid(format!("{what}: {got} columns, expected {want}")));
    }
    Ok(())
}

fn check_rows(what: &str, n: usize, cap: usize) -> Result<(), BackendError> {
    if n > cap {
        return Err(invalid(format!("{what}: {n} rows, capacity {cap}")));
    }
    Ok(())
}

/// Grows `slot` to at least `bytes` (by half again, to avoid regrowing every step); a new
/// buffer bumps `generation`, retiring the graphs that address the old one.
fn ensure<R: Runtime>(
    dev: &Device<R>,
    slot: &mut Option<DevBuf>,
    bytes: usize,
    what: &'static str,
    generation: &mut u64,
) -> Result<u64, BackendError> {
    if slot.as_ref().is_none_or(|b| b.bytes() < bytes) {
        if dev.capturing {
            return Err(BackendError::Device {
                op: what,
                message: "a workspace would grow while recording a graph".into(),
            });
        }
        *generation += 1;
        *slot = None;
        *slot = Some(dev.alloc(bytes + bytes / 2, what)?);
    }
    Ok(slot.as_ref().map_or(0, |b| b.ptr()))
}

impl<R: Runtime> GpuBackend<R> {
    /// Whether `R`'s libraries load and at least one device is visible.
    pub fn device_available() -> bool {
        R::available().is_ok()
    }

    /// Total memory of device `ordinal` in bytes, or `None` where it cannot be read.
    pub fn total_memory(ordinal: usize) -> Option<usize> {
        R::total_memory(ordinal).ok()
    }

    /// Opens device `ordinal`, starts compiling (or reading from the cache) every kernel,
    /// creates the BLAS handle.
    pub fn new(ordinal: usize, opts: GpuOptions) -> Result<GpuBackend<R>, BackendError> {
        let t0 = std::time::Instant::now();
        let caps_of = |i: &DeviceInfo| caps::Caps::of(i, R::NAME, opts.dtype, &opts.tuning);
        // The kernels compile on threads of their own while the device's context is created
        // and the weights upload: from the probed device where the runtime reports it
        // without a context (an empty kernel cache's start is bound by these compiles).
        let start_kernels = |i: &DeviceInfo| {
            let model = &opts.needs;
            let types = model.weight_types.as_deref();
            let needs = KernelNeeds {
                moe: model.moe,
                qtypes: types.map(|t| t.iter().filter_map(|&t| QType::of(t)).collect()),
                dense: types.is_none_or(|t| t.iter().any(|&t| QType::of(t).is_none())),
                qk_norm: model.qk_norm,
                head_dims: model.head_dims.clone(),
                gqa_group: model.gqa_group,
                portable_attention: !(caps_of(i).mma && opts.attn_decode),
            };
            Kernels::load(i, opts.dtype, opts.kernel_cache.as_deref(), needs, &opts.tuning)
        };
        let early = R::probe(ordinal).map(|i| start_kernels(&i).map(|k| (i, k)));
        let mut dev = Device::<R>::open(ordinal, opts.sync_check, opts.timing_period)?;
        let open_s = t0.elapsed().as_secs_f64();
        let caps = caps_of(&dev.info);
        dev.pdl = device::PdlPolicy::new(caps.pdl, opts.tuning.pdl);
        dev.upload_pinned = opts.tuning.upload_pinned;
        let i = &dev.info;
        let kernels = match early {
            Some(Ok((probed, k))) if probed.arch == i.arch && probed.warp_size == i.warp_size => k,
            Some(Err(e)) => return Err(e),
            _ => start_kernels(i)?,
        };
        let t1 = std::time::Instant::now();
        let blas = dev.rt.blas().map_err(runtime::dev_err("blas"))?;
        tracing::info!(
            backend = R::NAME,
            ordinal,
            device_open_s = open_s,
            blas_s = t1.elapsed().as_secs_f64(),
            "start-up: device context and BLAS handle"
        );
        tracing::info!(backend = R::NAME, device = %i.name, ordinal, arch = %i.arch, sms = i.sm_count, warp = i.warp_size, dtype = ?opts.dtype, "gpu backend ready");
        Ok(GpuBackend {
            kernels,
            blas,
            dt: opts.dtype,
            switches: Switches {
                gemv: opts.gemv,
                attn_decode: opts.attn_decode,
            },
            caps,
            tuning: opts.tuning,
            step: batch::StepMeta::default(),
            scratch: Scratch::default(),
            graphs: graphs::Graphs::new(opts.graphs),
            generation: 0,
            sample_in: None,
            sample_work: None,
            sample_out: None,
            sample_parts: None,
            sample_counts: None,
            sample_pack: ops::sample::SamplePack::default(),
            group: None,
            smem_allowed: HashMap::new(),
            qmma_resident: HashMap::new(),
            dev,
        })
    }

    /// One small matmul through the BLAS, waited for (its values are not read).
    fn warm_blas(&mut self) -> Result<(), BackendError> {
        let (n, k, m) = (16, 256, 256);
        let size = self.dt.size() as u64;
        let buf = self
            .dev
            .alloc((n * k + m * k + n * m) * self.dt.size(), "blas warm-up")?;
        let (x, w) = (buf.ptr(), buf.ptr() + (n * k) as u64 * size);
        let out = w + (m * k) as u64 * size;
        self.gemm(x, w, out, n, k, m)?;
        self.dev.rt.sync().map_err(runtime::dev_err("blas warm-up"))
    }

    /// Bytes of the weights uploaded so far: (on the device, in the file's tensors).
    pub fn weight_bytes(&self) -> (usize, usize) {
        self.scratch.weight_bytes
    }

    /// Storage type of this backend.
    pub fn dtype(&self) -> DType {
        self.dt
    }

    /// Turns decode graphs on or off for the following steps (benchmarks compare both).
    pub fn set_graphs(&mut self, on: bool) {
        self.graphs.on = on;
    }

    /// Decode steps recorded into graphs and replayed from them so far.
    pub fn graph_stats(&self) -> GraphStats {
        self.graphs.stats.clone()
    }

    /// Host<->device traffic so far (weights included); diff two readings for one step.
    pub fn transfer_stats(&self) -> TransferStats {
        self.dev.stats()
    }

    /// Kernel durations of the timed steps since the last call (see
    /// [`GpuOptions::timing_period`]); waits for the timed work to finish.
    pub fn take_kernel_timings(&mut self) -> Result<Vec<KernelTiming>, BackendError> {
        self.dev.timer.take(&self.dev.rt)
    }

    /// Registers, spill bytes and shared memory of every loaded kernel (tuning reports).
    pub fn kernel_resources(&self) -> Vec<(Kernel, i32, i32, i32)> {
        self.kernels.resources(&self.dev.rt)
    }

    /// Waits until every kernel the model may run is loaded, the tiled matmuls that larger
    /// steps take included (tests and benchmarks that must reach those kernels; a serving
    /// lane takes other paths while they compile).
    pub fn wait_kernels(&mut self) -> Result<(), BackendError> {
        self.kernels.wait_model(&self.dev.rt)?;
        self.kernels.poll_later(&self.dev.rt);
        Ok(())
    }

    /// Lets ops leave work to the next outside steps too (within [`Backend::run_step`] they
    /// always may): a decode matmul's residual norm, finished by the quantized matmul that
    /// reads its output, or by the next other op, write or download. The caller keeps the
    /// norm's tensors alive until then (tests of the fused ops).
    pub fn fuse_across_ops(&mut self, on: bool) -> Result<(), BackendError> {
        self.settle_qx()?;
        self.scratch.fuse_across_ops = on;
        Ok(())
    }

    /// Changes how often steps are timed (`None`: never).
    pub fn set_timing_period(&mut self, period: Option<u64>) {
        self.dev.timer.set_period(period);
    }

    /// Overwrites the first `data.len() / cols` rows of `t` (tests: inputs and NaN poison).
    pub fn write_tensor(&mut self, t: &mut GpuTensor, data: &[f32]) -> Result<(), BackendError> {
        if data.len() > t.rows * t.cols {
            return Err(invalid(format!(
                "{} values for a {}x{} tensor",
                data.len(),
                t.rows,
                t.cols
            )));
        }
        let bytes = self.dt.encode(data);
        self.settle_qx()?;
        self.dev.upload(&t.buf, 0, &bytes)
    }

    /// Launches `k` with a positional list and `smem` bytes of dynamic shared memory (only
    /// through [`GpuBackend::launch_with`] / [`GpuBackend::launch_with_smem`]).
    fn launch(
        &mut self,
        k: Kernel,
        grid: Grid,
        smem: u32,
        args: &[Arg],
    ) -> Result<(), BackendError> {
        self.settle_qx()?;
        let f = self.kernels.get(&self.dev.rt, k)?;
        // Once per kernel (the attribute stays with the function).
        if smem > self.smem_allowed.get(&k).copied().unwrap_or(0) {
            self.dev
                .rt
                .allow_dynamic_smem(f, smem)
                .map_err(runtime::dev_err(k.op()))?;
            self.smem_allowed.insert(k, smem);
        }
        self.dev
            .launch(k.op(), f, grid, smem, args, k.waits_for_predecessor())
    }

    /// Launches `k` with its typed arguments; a kernel of another signature is refused.
    fn launch_with<A: KernelArgs>(
        &mut self,
        k: Kernel,
        grid: Grid,
        args: &A,
    ) -> Result<(), BackendError> {
        self.launch_with_smem(k, grid, 0, args)
    }

    /// [`GpuBackend::launch_with`] with `smem` bytes of dynamic shared memory.
    fn launch_with_smem<A: KernelArgs>(
        &mut self,
        k: Kernel,
        grid: Grid,
        smem: u32,
        args: &A,
    ) -> Result<(), BackendError> {
        if !A::takes(k) {
            return Err(BackendError::Device {
                op: k.op(),
                message: format!(
                    "{k:?} launched with the arguments of another kernel ({})",
                    std::any::type_name::<A>()
                ),
            });
        }
        self.launch(k, grid, smem, args.args().as_ref())
    }

    /// Whether rows of `cols` elements at `ptrs` split into whole, aligned 16-byte chunks
    /// (the vector kernels' requirement; 0 stands for an absent buffer).
    fn whole_chunks(&self, cols: usize, ptrs: &[u64]) -> bool {
        cols.is_multiple_of(16 / self.dt.size()) && ptrs.iter().all(|p| p.is_multiple_of(16))
    }
}

impl<R: Runtime> Backend for GpuBackend<R> {
    type Tensor = GpuTensor;
    type Weight = GpuWeight;
    type Kv = GpuKv;
    type Batch = GpuBatch;

    fn name(&self) -> String {
        format!("{}:{}", R::NAME, self.dev.ordinal)
    }

    fn upload_weight(&mut self, w: HostTensor) -> Result<GpuWeight, BackendError> {
        let (rows, cols) = (w.rows(), w.cols());
        // New buffers (a new model, new scratch) retire recorded graphs.
        self.generation += 1;
        let (label, file) = (w.type_label(), w.byte_len());
        let t0 = std::time::Instant::now();
        let parts = self.upload_parts(w)?;
        self.scratch.upload_s += t0.elapsed().as_secs_f64();
        let w = GpuWeight { parts, rows, cols };
        if w.dense().is_none() {
            let bytes = rows * cols * self.dt.size();
            if self
                .scratch
                .dequant
                .as_ref()
                .is_none_or(|b| b.bytes() < bytes)
            {
                self.scratch.dequant = None;
                self.scratch.dequant = Some(self.dev.alloc(bytes, "dequant scratch")?);
            }
        }
        let device = w.device_bytes();
        self.scratch.weight_bytes.0 += device;
        self.scratch.weight_bytes.1 += file;
        tracing::debug!(rows, cols, types = %label, device, file, "weight uploaded");
        Ok(w)
    }

    fn alloc(&mut self, rows: usize, cols: usize) -> Result<GpuTensor, BackendError> {
        self.scratch.largest_alloc = self.scratch.largest_alloc.max(rows * cols);
        self.settle_qx()?;
        self.generation += 1;
        Ok(GpuTensor {
            buf: self.dev.alloc(rows * cols * self.dt.size(), "activation")?,
            rows,
            cols,
        })
    }

    fn alloc_kv(&mut self, shape: &KvShape) -> Result<GpuKv, BackendError> {
        // The last staged weight copies may still run: they count as upload time.
        let t0 = std::time::Instant::now();
        self.dev.drain_uploads()?;
        self.scratch.upload_s += t0.elapsed().as_secs_f64();
        // While the kernels still compile: the BLAS library's first call loads its own
        // kernels (~0.1 s on an H100), which a first prompt's matmuls would pay otherwise
        // (prompts dequantize for the BLAS until the tiled matmuls compile).
        self.warm_blas()?;
        // The lane reports ready after this: every kernel a dense model runs is loaded now,
        // so a compile error shows at start-up and the first request does not wait.
        self.kernels.wait_core(&self.dev.rt)?;
        self.generation += 1;
        let (device, file) = self.scratch.weight_bytes;
        let scratch = self.scratch.dequant.as_ref().map_or(0, DevBuf::bytes);
        let upload_s = self.scratch.upload_s;
        tracing::info!(
            weights_device_bytes = device,
            weights_file_bytes = file,
            dequant_scratch_bytes = scratch,
            upload_s,
            upload_gb_per_s = file as f64 / upload_s.max(1e-9) / 1e9,
            "weights on the device"
        );
        let hd = shape.head_dim;
        if kernels::AttnHead::for_head_dim(hd) == kernels::AttnHead::Any
            && hd > kernels::AttnHead::MAX_ANY
        {
            return Err(BackendError::Unsupported {
                backend: R::NAME,
                op: "attention",
                dtype: format!("head_dim {hd}"),
            });
        }
        let bytes = 2 * shape.num_layers * shape.num_slots() * shape.slot_width() * self.dt.size();
        let buf = self.dev.alloc(bytes, "kv cache")?;
        self.step.kv_shape = Some(*shape);
        Ok(GpuKv { buf, shape: *shape })
    }

    fn prepare(&mut self, plan: &BatchPlan) -> Result<GpuBatch, BackendError> {
        self.prepare_with(plan, None)
    }

    fn prepare_step(&mut self, plan: &BatchPlan, row_cap: usize) -> Result<GpuBatch, BackendError> {
        let key = self.graph_key(plan, row_cap);
        self.prepare_with(plan, key)
    }

    fn padded_rows(&self, b: &GpuBatch) -> Option<usize> {
        b.graph.map(|k| k.rows as usize)
    }

    fn run_step(
        &mut self,
        b: &GpuBatch,
        ops: impl FnMut(&mut Self) -> Result<(), BackendError>,
    ) -> Result<(), BackendError> {
        // Kernels compiled since start-up load between steps; graphs recorded without them
        // (batches through the BLAS meanwhile) are recorded again.
        if self.kernels.poll_later(&self.dev.rt) {
            self.generation += 1;
        }
        let mut ops = ops;
        self.run_graphed(b, |s| {
            let outside = std::mem::replace(&mut s.scratch.fuse_across_ops, true);
            let r = ops(s);
            s.scratch.fuse_across_ops = outside;
            match r {
                Ok(()) => s.settle_qx(),
                Err(e) => {
                    // Nothing of a failed step is read: drop what it left pending.
                    s.scratch.qx = None;
                    Err(e)
                }
            }
        })
    }

    fn embed(
        &mut self,
        table: &GpuWeight,
        first: usize,
        vocab: usize,
        b: &GpuBatch,
        out: &mut GpuTensor,
    ) -> Result<(), BackendError> {
        self.launch_embed(table, first, vocab, b, out)
    }

    fn rms_norm(
        &mut self,
        x: &GpuTensor,
        w: &GpuWeight,
        eps: f32,
        n: usize,
        out: &mut GpuTensor,
    ) -> Result<(), BackendError> {
        self.launch_norm(x, None, w, eps, n, out)
    }

    fn matmul_add_rms_norm(
        &mut self,
        x: &GpuTensor,
        w: &GpuWeight,
        n: usize,
        delta: &mut GpuTensor,
        residual: &mut GpuTensor,
        norm_w: &GpuWeight,
        eps: f32,
        out: &mut GpuTensor,
    ) -> Result<(), BackendError> {
        self.launch_matmul_add_rms_norm(x, w, n, delta, residual, norm_w, eps, out)
    }

    fn add_rms_norm(
        &mut self,
        x: &GpuTensor,
        residual: &mut GpuTensor,
        w: &GpuWeight,
        eps: f32,
        n: usize,
        out: &mut GpuTensor,
    ) -> Result<(), BackendError> {
        check_cols("add_rms_norm residual", residual.cols, x.cols)?;
        check_rows("add_rms_norm residual", n, residual.rows)?;
        self.launch_norm(x, Some(residual.buf.ptr()), w, eps, n, out)
    }

    fn matmul(
        &mut self,
        x: &GpuTensor,
        w: &GpuWeight,
        bias: Option<&GpuWeight>,
        n: usize,
        out: &mut GpuTensor,
    ) -> Result<(), BackendError> {
        self.launch_matmul(x, w, bias, n, out)
    }

    fn rope(
        &mut self,
        qkv: &mut GpuTensor,
        b: &GpuBatch,
        shape: &AttnShape,
        rope: &RopeSpec,
    ) -> Result<(), BackendError> {
        self.launch_rope(qkv, b, shape, rope)
    }

    fn write_kv(
        &mut self,
        kv: &mut GpuKv,
        layer: usize,
        qkv: &GpuTensor,
        b: &GpuBatch,
        shape: &AttnShape,
    ) -> Result<(), BackendError> {
        self.launch_write_kv(kv, layer, qkv, b, shape)
    }

    fn rope_write_kv(
        &mut self,
        qkv: &mut GpuTensor,
        kv: &mut GpuKv,
        layer: usize,
        b: &GpuBatch,
        shape: &AttnShape,
        rope: &RopeSpec,
    ) -> Result<(), BackendError> {
        self.launch_rope_write_kv(qkv, kv, layer, b, shape, rope, None)
    }

    fn matmul_rope_write_kv(
        &mut self,
        x: &GpuTensor,
        w: &GpuWeight,
        bias: Option<&GpuWeight>,
        n: usize,
        qkv: &mut GpuTensor,
        kv: &mut GpuKv,
        layer: usize,
        b: &GpuBatch,
        shape: &AttnShape,
        rope: &RopeSpec,
    ) -> Result<(), BackendError> {
        self.launch_matmul_rope_write_kv(x, w, bias, n, qkv, kv, layer, b, shape, rope)
    }

    fn norm_rope_write_kv(
        &mut self,
        qkv: &mut GpuTensor,
        kv: &mut GpuKv,
        layer: usize,
        b: &GpuBatch,
        shape: &AttnShape,
        rope: &RopeSpec,
        norm: QkNorm<'_, GpuWeight>,
    ) -> Result<(), BackendError> {
        self.launch_rope_write_kv(qkv, kv, layer, b, shape, rope, Some(norm))
    }

    fn attention(
        &mut self,
        qkv: &GpuTensor,
        kv: &GpuKv,
        layer: usize,
        b: &GpuBatch,
        shape: &AttnShape,
        out: &mut GpuTensor,
    ) -> Result<(), BackendError> {
        self.launch_attention(qkv, kv, layer, b, shape, out)
    }

    fn glu(
        &mut self,
        act: Activation,
        gate_up: &GpuTensor,
        n: usize,
        out: &mut GpuTensor,
    ) -> Result<(), BackendError> {
        match act {
            Activation::Silu => self.launch_silu_mul(gate_up, n, out),
            Activation::GeluTanh => self.launch_gelu_tanh_mul(gate_up, n, out),
        }
    }

    fn matmul_glu(
        &mut self,
        act: Activation,
        x: &GpuTensor,
        w_gate_up: &GpuWeight,
        n: usize,
        gate_up: &mut GpuTensor,
        out: &mut GpuTensor,
    ) -> Result<(), BackendError> {
        match act {
            // Fused streaming kernels for small batches (plain and quantized weights).
            Activation::Silu => self.launch_matmul_silu_mul(x, w_gate_up, n, gate_up, out),
            Activation::GeluTanh => {
                self.launch_matmul(x, w_gate_up, None, n, gate_up)?;
                self.launch_gelu_tanh_mul(gate_up, n, out)
            }
        }
    }

    fn gather_rows(
        &mut self,
        x: &GpuTensor,
        b: &GpuBatch,
        out: &mut GpuTensor,
    ) -> Result<(), BackendError> {
        self.launch_gather_rows(x, b, out)
    }

    fn head_rms_norm(
        &mut self,
        qkv: &mut GpuTensor,
        q_w: &GpuWeight,
        k_w: &GpuWeight,
        shape: &AttnShape,
        eps: f32,
        n: usize,
    ) -> Result<(), BackendError> {
        self.launch_head_rms_norm(qkv, q_w, k_w, shape, eps, n)
    }

    fn scale(&mut self, x: &mut GpuTensor, s: f32, n: usize) -> Result<(), BackendError> {
        self.launch_scale_rows(x, s, n)
    }

    fn softcap(&mut self, x: &mut GpuTensor, cap: f32, n: usize) -> Result<(), BackendError> {
        self.launch_softcap(x, cap, n)
    }

    fn moe_ffn(
        &mut self,
        x: &GpuTensor,
        router_logits: &GpuTensor,
        experts: super::MoeExperts<'_, GpuWeight>,
        shape: &super::MoeShape,
        n: usize,
        out: &mut GpuTensor,
    ) -> Result<(), BackendError> {
        self.launch_moe_ffn(x, router_logits, experts, shape, n, ops::moe::MoeOut::Delta(out))
    }

    fn moe_ffn_add_rms_norm(
        &mut self,
        h: &mut GpuTensor,
        router_logits: &GpuTensor,
        experts: super::MoeExperts<'_, GpuWeight>,
        shape: &super::MoeShape,
        n: usize,
        delta: &mut GpuTensor,
        residual: &mut GpuTensor,
        w: &GpuWeight,
        eps: f32,
    ) -> Result<(), BackendError> {
        let (e, s) = (experts, shape);
        self.launch_moe_ffn_norm(h, router_logits, e, s, n, delta, residual, w, eps)
    }

    fn join_group(&mut self, member: super::GroupMember) -> Result<(), BackendError> {
        // Every kernel module is loaded before the communicator exists: loading one on a GPU
        // while a peer's collective waits there can deadlock (NCCL's rule on concurrent
        // implicitly synchronizing calls), and no step can start before all ranks joined.
        self.kernels.wait_model(&self.dev.rt)?;
        self.join(member)
    }

    fn all_reduce_sum(&mut self, x: &mut GpuTensor, n: usize) -> Result<(), BackendError> {
        self.settle_qx()?;
        self.launch_all_reduce(x, n)
    }

    fn all_gather(
        &mut self,
        part: &GpuTensor,
        n: usize,
        out: &mut GpuTensor,
    ) -> Result<(), BackendError> {
        self.settle_qx()?;
        self.launch_all_gather(part, n, out)
    }

    fn sample(
        &mut self,
        logits: &GpuTensor,
        rows: &[SampleRow<'_>],
    ) -> Result<Vec<Sampled>, BackendError> {
        self.sample_on_device(logits, rows)
    }

    fn to_host(&mut self, x: &GpuTensor, n: usize) -> Result<Vec<f32>, BackendError> {
        check_rows("to_host", n, x.rows)?;
        self.settle_qx()?;
        let mut bytes = vec![0u8; n * x.cols * self.dt.size()];
        self.dev.download(&x.buf, 0, &mut bytes)?;
        Ok(self.dt.decode(&bytes))
    }

    fn take_kernel_timings(&mut self) -> Result<Vec<(&'static str, f64)>, BackendError> {
        Ok(GpuBackend::take_kernel_timings(self)?
            .into_iter()
            .map(|t| (t.kernel, t.seconds))
            .collect())
    }

    fn kv_budget_bytes(&self, utilization: f32) -> Option<usize> {
        let (free, total) = self.dev.mem_info().ok()?;
        // Sampling workspace for the largest logits buffer, attention partials and cuBLAS.
        let reserve = self.scratch.largest_alloc * 4 + (256 << 20);
        let keep = ((1.0 - utilization.clamp(0.05, 1.0) as f64) * total as f64) as usize;
        Some(free.saturating_sub(keep).saturating_sub(reserve))
    }

    fn kv_element_bytes(&self) -> usize {
        self.dt.size()
    }
}
