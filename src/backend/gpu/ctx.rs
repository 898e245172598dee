//! The shared device state of one backend ([`GpuCtx`]: runtime and stream, loaded kernels,
//! BLAS handle, scratch arena, capabilities and switches), how the backend opens it, and the
//! launch path every op family goes through. The families' own state (step metadata,
//! graphs, sampling workspaces) lives with them in [`GpuBackend`].

use std::collections::HashMap;

use super::args::KernelArgs;
use super::caps::{self, Caps};
use super::device::{self, Arg, DevBuf, Device};
use super::kernels::{self, Kernel, KernelNeeds, Kernels};
use super::ops::sample::SampleState;
use super::runtime::{self, DeviceInfo, Grid, Runtime};
use super::{
    GpuBackend, GpuBatch, GpuKv, GpuOptions, GpuTensor, GpuWeight, GraphStats, KernelTiming, QType,
    TransferStats, batch, check_rows, graphs, invalid, ops,
};
use crate::backend::{BackendError, DType, GpuTuning, HostTensor, KvShape, RopeSpec};

/// The device state every op family shares (field order is drop order: kernels, the BLAS
/// handle and every buffer go before the device).
pub(super) struct GpuCtx<R: Runtime> {
    pub kernels: Kernels<R>,
    pub blas: R::Blas,
    pub dt: DType,
    pub switches: Switches,
    /// What the device can do, parsed once at `new`.
    pub caps: Caps,
    /// The kernel-variant switches ([`GpuOptions::tuning`]).
    pub tuning: GpuTuning,
    pub scratch: Scratch,
    /// Bumped by every allocation a recorded graph could address; graphs of an older
    /// generation are dropped before the next step.
    pub generation: u64,
    /// Per kernel, the dynamic shared memory its launches are already allowed (`launch`).
    pub smem_allowed: HashMap<Kernel, u32>,
    pub dev: Device<R>,
}

/// Which kernel variants this backend may use, fixed at `new`.
pub(super) struct Switches {
    /// Small-batch matmuls may use the streaming kernels ([`GpuOptions::gemv`]).
    pub gemv: bool,
    /// Decode steps may use the decode attention variant ([`GpuOptions::attn_decode`]).
    pub attn_decode: bool,
}

/// Buffers allocated on first use and kept across steps (besides sampling's).
#[derive(Default)]
pub(super) struct Scratch {
    /// The rope specs whose inverse frequencies are on the device, and their tables (one
    /// per distinct spec: Gemma 3's local and global layers alternate).
    pub rope: Vec<(RopeSpec, DevBuf)>,
    /// Split-K attention partials.
    pub attn_ws: Option<DevBuf>,
    /// The mixture-of-experts routes, sorted assignments and expert outputs (`moe.rs`).
    pub moe: Option<DevBuf>,
    /// The shared expert's activations (`moe.rs`).
    pub moe_shared: Option<ops::moe::SharedScratch>,
    /// Largest activation allocated, in elements (sizes the sampling workspace estimate).
    pub largest_alloc: usize,
    /// A quantized weight dequantized for a BLAS GEMM of a batch step: sized at upload for
    /// the largest quantized matrix, so graphs can address it.
    pub dequant: Option<DevBuf>,
    /// The 8-bit activation rows the last launch left in the dequant scratch for the next
    /// quantized decode matmul (`matmul.rs`); any other launch, write, download or
    /// allocation settles it first ([`GpuBackend::settle_qx`]).
    pub qx: Option<ops::matmul::QxRows>,
    /// Whether an op may leave work to the next (a decode matmul's residual norm, finished
    /// by the quantized matmul after it): within steps, whose tensors outlive it.
    pub fuse_across_ops: bool,
    /// Weight bytes on the device and in the file (the load log).
    pub weight_bytes: (usize, usize),
    /// Seconds spent in `upload_weight` (host repacking, copies and conversion launches).
    pub upload_s: f64,
}

/// Grows `slot` to at least `bytes` (by half again, to avoid regrowing every step); a new
/// buffer bumps `generation`, retiring the graphs that address the old one.
pub(super) fn ensure<R: Runtime>(
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
            Kernels::load(
                i,
                opts.dtype,
                opts.kernel_cache.as_deref(),
                needs,
                &opts.tuning,
            )
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
            step: batch::StepMeta::default(),
            graphs: graphs::Graphs::new(opts.graphs),
            sample: SampleState::default(),
            group: None,
            qmma_resident: HashMap::new(),
            ctx: GpuCtx {
                kernels,
                blas,
                dt: opts.dtype,
                switches: Switches {
                    gemv: opts.gemv,
                    attn_decode: opts.attn_decode,
                },
                caps,
                tuning: opts.tuning,
                scratch: Scratch::default(),
                generation: 0,
                smem_allowed: HashMap::new(),
                dev,
            },
        })
    }

    /// One small matmul through the BLAS, waited for (its values are not read).
    pub(super) fn warm_blas(&mut self) -> Result<(), BackendError> {
        let (n, k, m) = (16, 256, 256);
        let size = self.ctx.dt.size() as u64;
        let buf = self
            .ctx
            .dev
            .alloc((n * k + m * k + n * m) * self.ctx.dt.size(), "blas warm-up")?;
        let (x, w) = (buf.ptr(), buf.ptr() + (n * k) as u64 * size);
        let out = w + (m * k) as u64 * size;
        self.gemm(x, w, out, n, k, m)?;
        self.ctx
            .dev
            .rt
            .sync()
            .map_err(runtime::dev_err("blas warm-up"))
    }

    /// Bytes of the weights uploaded so far: (on the device, in the file's tensors).
    pub fn weight_bytes(&self) -> (usize, usize) {
        self.ctx.scratch.weight_bytes
    }

    /// Storage type of this backend.
    pub fn dtype(&self) -> DType {
        self.ctx.dt
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
        self.ctx.dev.stats()
    }

    /// Kernel durations of the timed steps since the last call (see
    /// [`GpuOptions::timing_period`]); waits for the timed work to finish.
    pub fn take_kernel_timings(&mut self) -> Result<Vec<KernelTiming>, BackendError> {
        self.ctx.dev.timer.take(&self.ctx.dev.rt)
    }

    /// Registers, spill bytes and shared memory of every loaded kernel (tuning reports).
    pub fn kernel_resources(&self) -> Vec<(Kernel, i32, i32, i32)> {
        self.ctx.kernels.resources(&self.ctx.dev.rt)
    }

    /// Waits until every kernel the model may run is loaded, the tiled matmuls that larger
    /// steps take included (tests and benchmarks that must reach those kernels; a serving
    /// lane takes other paths while they compile).
    pub fn wait_kernels(&mut self) -> Result<(), BackendError> {
        self.ctx.kernels.wait_model(&self.ctx.dev.rt)?;
        self.ctx.kernels.poll_later(&self.ctx.dev.rt);
        Ok(())
    }

    /// Lets ops leave work to the next outside steps too (within [`Backend::run_step`] they
    /// always may): a decode matmul's residual norm, finished by the quantized matmul that
    /// reads its output, or by the next other op, write or download. The caller keeps the
    /// norm's tensors alive until then (tests of the fused ops).
    pub fn fuse_across_ops(&mut self, on: bool) -> Result<(), BackendError> {
        self.settle_qx()?;
        self.ctx.scratch.fuse_across_ops = on;
        Ok(())
    }

    /// Changes how often steps are timed (`None`: never).
    pub fn set_timing_period(&mut self, period: Option<u64>) {
        self.ctx.dev.timer.set_period(period);
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
        let bytes = self.ctx.dt.encode(data);
        self.settle_qx()?;
        self.ctx.dev.upload(&t.buf, 0, &bytes)
    }

    /// Launches `k` with a positional list and `smem` bytes of dynamic shared memory (only
    /// through [`GpuBackend::launch_with`] / [`GpuBackend::launch_with_smem`]).
    pub(super) fn launch(
        &mut self,
        k: Kernel,
        grid: Grid,
        smem: u32,
        args: &[Arg],
    ) -> Result<(), BackendError> {
        self.settle_qx()?;
        let f = self.ctx.kernels.get(&self.ctx.dev.rt, k)?;
        // Once per kernel (the attribute stays with the function).
        if smem > self.ctx.smem_allowed.get(&k).copied().unwrap_or(0) {
            self.ctx
                .dev
                .rt
                .allow_dynamic_smem(f, smem)
                .map_err(runtime::dev_err(k.op()))?;
            self.ctx.smem_allowed.insert(k, smem);
        }
        self.ctx
            .dev
            .launch(k.op(), f, grid, smem, args, k.waits_for_predecessor())
    }

    /// Launches `k` with its typed arguments; a kernel of another signature is refused.
    pub(super) fn launch_with<A: KernelArgs>(
        &mut self,
        k: Kernel,
        grid: Grid,
        args: &A,
    ) -> Result<(), BackendError> {
        self.launch_with_smem(k, grid, 0, args)
    }

    /// [`GpuBackend::launch_with`] with `smem` bytes of dynamic shared memory.
    pub(super) fn launch_with_smem<A: KernelArgs>(
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
    pub(super) fn whole_chunks(&self, cols: usize, ptrs: &[u64]) -> bool {
        cols.is_multiple_of(16 / self.ctx.dt.size()) && ptrs.iter().all(|p| p.is_multiple_of(16))
    }

    pub(super) fn upload_weight_parts(&mut self, w: HostTensor) -> Result<GpuWeight, BackendError> {
        let (rows, cols) = (w.rows(), w.cols());
        // New buffers (a new model, new scratch) retire recorded graphs.
        self.ctx.generation += 1;
        let (label, file) = (w.type_label(), w.byte_len());
        let t0 = std::time::Instant::now();
        let parts = self.upload_parts(w)?;
        self.ctx.scratch.upload_s += t0.elapsed().as_secs_f64();
        let w = GpuWeight { parts, rows, cols };
        if w.dense().is_none() {
            let bytes = rows * cols * self.ctx.dt.size();
            if self
                .ctx
                .scratch
                .dequant
                .as_ref()
                .is_none_or(|b| b.bytes() < bytes)
            {
                self.ctx.scratch.dequant = None;
                self.ctx.scratch.dequant = Some(self.ctx.dev.alloc(bytes, "dequant scratch")?);
            }
        }
        let device = w.device_bytes();
        self.ctx.scratch.weight_bytes.0 += device;
        self.ctx.scratch.weight_bytes.1 += file;
        tracing::debug!(rows, cols, types = %label, device, file, "weight uploaded");
        Ok(w)
    }

    pub(super) fn alloc_activation(
        &mut self,
        rows: usize,
        cols: usize,
    ) -> Result<GpuTensor, BackendError> {
        self.ctx.scratch.largest_alloc = self.ctx.scratch.largest_alloc.max(rows * cols);
        self.settle_qx()?;
        self.ctx.generation += 1;
        Ok(GpuTensor {
            buf: self
                .ctx
                .dev
                .alloc(rows * cols * self.ctx.dt.size(), "activation")?,
            rows,
            cols,
        })
    }

    pub(super) fn alloc_kv_pool(&mut self, shape: &KvShape) -> Result<GpuKv, BackendError> {
        // The last staged weight copies may still run: they count as upload time.
        let t0 = std::time::Instant::now();
        self.ctx.dev.drain_uploads()?;
        self.ctx.scratch.upload_s += t0.elapsed().as_secs_f64();
        // While the kernels still compile: the BLAS library's first call loads its own
        // kernels (~0.1 s on an H100), which a first prompt's matmuls would pay otherwise
        // (prompts dequantize for the BLAS until the tiled matmuls compile).
        self.warm_blas()?;
        // The lane reports ready after this: every kernel a dense model runs is loaded now,
        // so a compile error shows at start-up and the first request does not wait.
        self.ctx.kernels.wait_core(&self.ctx.dev.rt)?;
        self.ctx.generation += 1;
        let (device, file) = self.ctx.scratch.weight_bytes;
        let scratch = self.ctx.scratch.dequant.as_ref().map_or(0, DevBuf::bytes);
        let upload_s = self.ctx.scratch.upload_s;
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
        let bytes =
            2 * shape.num_layers * shape.num_slots() * shape.slot_width() * self.ctx.dt.size();
        let buf = self.ctx.dev.alloc(bytes, "kv cache")?;
        self.step.kv_shape = Some(*shape);
        Ok(GpuKv { buf, shape: *shape })
    }

    pub(super) fn download(&mut self, x: &GpuTensor, n: usize) -> Result<Vec<f32>, BackendError> {
        check_rows("to_host", n, x.rows)?;
        self.settle_qx()?;
        let mut bytes = vec![0u8; n * x.cols * self.ctx.dt.size()];
        self.ctx.dev.download(&x.buf, 0, &mut bytes)?;
        Ok(self.ctx.dt.decode(&bytes))
    }

    pub(super) fn kv_budget(&self, utilization: f32) -> Option<usize> {
        let (free, total) = self.ctx.dev.mem_info().ok()?;
        // Sampling workspace for the largest logits buffer, attention partials and cuBLAS.
        let reserve = self.ctx.scratch.largest_alloc * 4 + (256 << 20);
        let keep = ((1.0 - utilization.clamp(0.05, 1.0) as f64) * total as f64) as usize;
        Some(free.saturating_sub(keep).saturating_sub(reserve))
    }

    pub(super) fn run_step_graphed(
        &mut self,
        b: &GpuBatch,
        ops: impl FnMut(&mut Self) -> Result<(), BackendError>,
    ) -> Result<(), BackendError> {
        // Kernels compiled since start-up load between steps; graphs recorded without them
        // (batches through the BLAS meanwhile) are recorded again.
        if self.ctx.kernels.poll_later(&self.ctx.dev.rt) {
            self.ctx.generation += 1;
        }
        let mut ops = ops;
        self.run_graphed(b, |s| {
            let outside = std::mem::replace(&mut s.ctx.scratch.fuse_across_ops, true);
            let r = ops(s);
            s.ctx.scratch.fuse_across_ops = outside;
            match r {
                Ok(()) => s.settle_qx(),
                Err(e) => {
                    // Nothing of a failed step is read: drop what it left pending.
                    s.ctx.scratch.qx = None;
                    Err(e)
                }
            }
        })
    }
}
