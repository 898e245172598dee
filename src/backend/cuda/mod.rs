//! The NVIDIA backend: kernels from `kernels/` compiled by NVRTC at lane start, GEMMs through
//! cuBLAS, attention in one launch per layer over the paged cache, sampling on the device.
//!
//! Everything lives in one [`CudaBackend`], created and used on its lane's thread: context
//! and stream, loaded kernels, cuBLAS handle, weights, KV pool and workspaces. Nothing is
//! global; two backends in one process (parallel tests) share only the driver's primary
//! context. There is no CPU fallback: every op of the contract runs on the device, and
//! a missing kernel fails `new`.

mod attention;
mod device;
mod gemm;
pub mod kernels;
mod meta;
mod sample;
mod timing;
mod types;

use device::{Arg, DevBuf, Device, Grid};
pub use device::{TransferStats, device_available};
use kernels::{Kernel, Kernels};
pub use timing::KernelTiming;
pub use types::{CudaBatch, CudaKv, CudaOptions, CudaTensor, CudaWeight, DType};

use super::{Backend, BackendError, BatchPlan, KvShape};
use crate::model::{HostTensor, ModelSpec, RopeLayout, RopeSpec};
use crate::sampling::{SampleRow, Sampled};

/// The CUDA backend of one lane.
pub struct CudaBackend {
    kernels: Kernels,
    blas: gemm::Blas,
    dev: Device,
    dt: DType,
    kv_shape: Option<KvShape>,
    meta: Option<DevBuf>,
    meta_words: Vec<u32>,
    epoch: u64,
    rope: Option<(RopeSpec, DevBuf)>,
    attn_ws: Option<DevBuf>,
    sample_in: Option<DevBuf>,
    sample_work: Option<DevBuf>,
    sample_out: Option<DevBuf>,
    sample_pack: sample::SamplePack,
    /// Largest activation allocated, in elements (sizes the sampling workspace estimate).
    largest_alloc: usize,
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

/// Grows `slot` to at least `bytes` (by half again, to avoid regrowing every step).
fn ensure(
    dev: &Device,
    slot: &mut Option<DevBuf>,
    bytes: usize,
    what: &'static str,
) -> Result<u64, BackendError> {
    if slot.as_ref().is_none_or(|b| b.bytes() < bytes) {
        *slot = None;
        *slot = Some(dev.alloc(bytes + bytes / 2, what)?);
    }
    Ok(slot.as_ref().map_or(0, |b| b.ptr()))
}

impl CudaBackend {
    /// Opens device `ordinal`, compiles or loads every kernel, creates the cuBLAS handle.
    pub fn new(ordinal: usize, opts: CudaOptions) -> Result<CudaBackend, BackendError> {
        let dev = Device::open(ordinal, opts.sync_check, opts.timing_period)?;
        let kernels = Kernels::load(&dev, opts.dtype, opts.kernel_cache.as_deref())?;
        let blas = gemm::Blas::new(&dev)?;
        tracing::info!(device = %dev.name, ordinal, arch = ?dev.arch, sms = dev.sm_count, dtype = ?opts.dtype, "cuda backend ready");
        Ok(CudaBackend {
            kernels,
            blas,
            dev,
            dt: opts.dtype,
            kv_shape: None,
            meta: None,
            meta_words: Vec::new(),
            epoch: 0,
            rope: None,
            attn_ws: None,
            sample_in: None,
            sample_work: None,
            sample_out: None,
            sample_pack: sample::SamplePack::default(),
            largest_alloc: 0,
        })
    }

    /// Storage type of this backend.
    pub fn dtype(&self) -> DType {
        self.dt
    }

    /// Host<->device traffic so far (weights included); diff two readings for one step.
    pub fn transfer_stats(&self) -> TransferStats {
        self.dev.stats()
    }

    /// Kernel durations of the timed steps since the last call (see
    /// [`CudaOptions::timing_period`]); waits for the timed work to finish.
    pub fn take_kernel_timings(&mut self) -> Result<Vec<KernelTiming>, BackendError> {
        self.dev.timer.take()
    }

    /// Registers, spill bytes and shared memory of every loaded kernel (tuning reports).
    pub fn kernel_resources(&self) -> Vec<(Kernel, i32, i32, i32)> {
        self.kernels.resources()
    }

    /// Changes how often steps are timed (`None`: never).
    pub fn set_timing_period(&mut self, period: Option<u64>) {
        self.dev.timer.set_period(period);
    }

    /// Overwrites the first `data.len() / cols` rows of `t` (tests: inputs and NaN poison).
    pub fn write_tensor(&mut self, t: &mut CudaTensor, data: &[f32]) -> Result<(), BackendError> {
        if data.len() > t.rows * t.cols {
            return Err(invalid(format!(
                "{} values for a {}x{} tensor",
                data.len(),
                t.rows,
                t.cols
            )));
        }
        let bytes = self.dt.encode(data);
        self.dev.upload(&t.buf, 0, &bytes)
    }

    fn layout(&self, b: &CudaBatch) -> Result<meta::Layout, BackendError> {
        if b.epoch != self.epoch {
            return Err(invalid(
                "batch was prepared before the latest prepare()".into(),
            ));
        }
        Ok(b.layout)
    }

    /// Device address of word `off` of the step's metadata.
    fn meta_ptr(&self, off: usize) -> u64 {
        self.meta.as_ref().map_or(0, |m| m.ptr() + 4 * off as u64)
    }

    fn launch(&mut self, k: Kernel, grid: Grid, args: &[Arg]) -> Result<(), BackendError> {
        self.dev.launch(k.op(), self.kernels.get(k)?, grid, 0, args)
    }

    fn inv_freqs(&mut self, rope: &RopeSpec) -> Result<u64, BackendError> {
        if self.rope.as_ref().is_none_or(|(r, _)| r != rope) {
            let f = rope.inv_freqs();
            let buf = self.dev.alloc(f.len() * 4, "rope frequencies")?;
            let bytes: Vec<u8> = f.iter().flat_map(|v| v.to_le_bytes()).collect();
            self.dev.upload(&buf, 0, &bytes)?;
            self.rope = Some((rope.clone(), buf));
        }
        Ok(self.rope.as_ref().map_or(0, |(_, b)| b.ptr()))
    }

    #[allow(clippy::too_many_arguments)]
    fn norm(
        &mut self,
        k: Kernel,
        x: &CudaTensor,
        resid: Option<u64>,
        w: &CudaWeight,
        eps: f32,
        n: usize,
        out: &CudaTensor,
    ) -> Result<(), BackendError> {
        let h = x.cols;
        check_cols("rms_norm weight", w.rows * w.cols, h)?;
        check_cols("rms_norm output", out.cols, h)?;
        check_rows("rms_norm", n, x.rows.min(out.rows))?;
        // Up to eight values per thread stay in registers between the kernel's two passes;
        // more threads keep more loads in flight (the kernel is latency-bound at decode).
        let threads = h.div_ceil(4).next_multiple_of(32).clamp(128, 1024) as u32;
        let grid = Grid {
            blocks: (n as u32, 1, 1),
            threads,
        };
        let mut args = vec![Arg::Ptr(x.buf.ptr())];
        args.extend(resid.map(Arg::Ptr));
        args.extend([
            Arg::Ptr(w.buf.ptr()),
            Arg::Ptr(out.buf.ptr()),
            Arg::I32(h as i32),
            Arg::F32(eps),
        ]);
        self.launch(k, grid, &args)
    }
}

impl Backend for CudaBackend {
    type Tensor = CudaTensor;
    type Weight = CudaWeight;
    type Kv = CudaKv;
    type Batch = CudaBatch;

    fn name(&self) -> String {
        format!("cuda:{}", self.dev.ordinal)
    }

    fn upload_weight(&mut self, w: HostTensor) -> Result<CudaWeight, BackendError> {
        let (rows, cols) = (w.rows(), w.cols());
        let buf = self.dev.alloc(rows * cols * self.dt.size(), "weight")?;
        let bytes = self.dt.encode(&w.data);
        drop(w);
        self.dev.upload(&buf, 0, &bytes)?;
        Ok(CudaWeight { buf, rows, cols })
    }

    fn alloc(&mut self, rows: usize, cols: usize) -> Result<CudaTensor, BackendError> {
        self.largest_alloc = self.largest_alloc.max(rows * cols);
        Ok(CudaTensor {
            buf: self.dev.alloc(rows * cols * self.dt.size(), "activation")?,
            rows,
            cols,
        })
    }

    fn alloc_kv(&mut self, shape: &KvShape) -> Result<CudaKv, BackendError> {
        let hd = shape.head_dim;
        if kernels::AttnHead::for_head_dim(hd) == kernels::AttnHead::Any
            && hd > kernels::AttnHead::MAX_ANY
        {
            return Err(BackendError::Unsupported {
                backend: "cuda",
                op: "attention",
                dtype: format!("head_dim {hd}"),
            });
        }
        let bytes = 2 * shape.num_layers * shape.num_slots() * shape.slot_width() * self.dt.size();
        let buf = self.dev.alloc(bytes, "kv cache")?;
        self.kv_shape = Some(*shape);
        Ok(CudaKv { buf, shape: *shape })
    }

    fn prepare(&mut self, plan: &BatchPlan) -> Result<CudaBatch, BackendError> {
        let shape = self
            .kv_shape
            .ok_or_else(|| invalid("no KV cache allocated".into()))?;
        plan.validate(&shape)?;
        let mut words = std::mem::take(&mut self.meta_words);
        let layout = meta::pack(plan, &shape, self.dev.sm_count, &mut words);
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        self.meta_words = words;
        ensure(&self.dev, &mut self.meta, bytes.len(), "batch metadata")?;
        if let Some(m) = &self.meta {
            self.dev.upload(m, 0, &bytes)?;
        }
        self.epoch += 1;
        self.dev.timer.begin_step(self.epoch);
        Ok(CudaBatch {
            epoch: self.epoch,
            layout,
        })
    }

    fn embed(
        &mut self,
        table: &CudaWeight,
        b: &CudaBatch,
        out: &mut CudaTensor,
    ) -> Result<(), BackendError> {
        let l = self.layout(b)?;
        check_cols("embed", out.cols, table.cols)?;
        check_rows("embed", l.n_tokens, out.rows)?;
        if l.n_tokens > 0 && l.max_token as usize >= table.rows {
            return Err(invalid(format!(
                "token id {} >= vocab {}",
                l.max_token, table.rows
            )));
        }
        let grid = Grid {
            blocks: (l.n_tokens as u32, 1, 1),
            threads: 256,
        };
        let args = [
            Arg::Ptr(table.buf.ptr()),
            Arg::Ptr(self.meta_ptr(l.tokens)),
            Arg::Ptr(out.buf.ptr()),
            Arg::I32(table.cols as i32),
        ];
        self.launch(Kernel::Embed, grid, &args)
    }

    fn rms_norm(
        &mut self,
        x: &CudaTensor,
        w: &CudaWeight,
        eps: f32,
        n: usize,
        out: &mut CudaTensor,
    ) -> Result<(), BackendError> {
        self.norm(Kernel::RmsNorm, x, None, w, eps, n, out)
    }

    fn add_rms_norm(
        &mut self,
        x: &CudaTensor,
        residual: &mut CudaTensor,
        w: &CudaWeight,
        eps: f32,
        n: usize,
        out: &mut CudaTensor,
    ) -> Result<(), BackendError> {
        check_cols("add_rms_norm residual", residual.cols, x.cols)?;
        check_rows("add_rms_norm residual", n, residual.rows)?;
        self.norm(
            Kernel::AddRmsNorm,
            x,
            Some(residual.buf.ptr()),
            w,
            eps,
            n,
            out,
        )
    }

    fn matmul(
        &mut self,
        x: &CudaTensor,
        w: &CudaWeight,
        bias: Option<&CudaWeight>,
        n: usize,
        out: &mut CudaTensor,
    ) -> Result<(), BackendError> {
        let (m, k) = (w.rows, w.cols);
        check_cols("matmul input", x.cols, k)?;
        check_cols("matmul output", out.cols, m)?;
        check_rows("matmul", n, x.rows.min(out.rows))?;
        let (blas, dt) = (&self.blas, self.dt);
        self.dev.timed("matmul", || {
            blas.matmul(dt, x.buf.ptr(), w.buf.ptr(), out.buf.ptr(), n, k, m)
        })?;
        if let Some(b) = bias {
            check_cols("matmul bias", b.rows * b.cols, m)?;
            let total = n * m;
            let grid = Grid {
                blocks: (total.div_ceil(256).min(65535) as u32, 1, 1),
                threads: 256,
            };
            let args = [
                Arg::Ptr(out.buf.ptr()),
                Arg::Ptr(b.buf.ptr()),
                Arg::I32(m as i32),
                Arg::U64(total as u64),
            ];
            self.launch(Kernel::AddBias, grid, &args)?;
        }
        Ok(())
    }

    fn rope(
        &mut self,
        qkv: &mut CudaTensor,
        b: &CudaBatch,
        spec: &ModelSpec,
    ) -> Result<(), BackendError> {
        let l = self.layout(b)?;
        check_cols("rope", qkv.cols, spec.qkv_dim())?;
        check_rows("rope", l.n_tokens, qkv.rows)?;
        let freqs = self.inv_freqs(&spec.rope)?;
        let heads = (spec.n_heads + spec.n_kv_heads) as u32;
        let grid = Grid {
            blocks: (l.n_tokens as u32, heads, 1),
            threads: 64,
        };
        let args = [
            Arg::Ptr(qkv.buf.ptr()),
            Arg::I32(qkv.cols as i32),
            Arg::Ptr(self.meta_ptr(l.positions)),
            Arg::Ptr(freqs),
            Arg::I32(spec.head_dim as i32),
            Arg::I32(spec.rope.dim as i32),
            Arg::I32((spec.rope.layout == RopeLayout::Interleaved) as i32),
        ];
        self.launch(Kernel::Rope, grid, &args)
    }

    fn write_kv(
        &mut self,
        kv: &mut CudaKv,
        layer: usize,
        qkv: &CudaTensor,
        b: &CudaBatch,
        spec: &ModelSpec,
    ) -> Result<(), BackendError> {
        let l = self.layout(b)?;
        let w = spec.kv_dim();
        check_cols("write_kv", w, kv.shape.slot_width())?;
        check_cols("write_kv input", qkv.cols, spec.qkv_dim())?;
        check_rows("write_kv", l.n_tokens, qkv.rows)?;
        if layer >= kv.shape.num_layers {
            return Err(invalid(format!("layer {layer} of {}", kv.shape.num_layers)));
        }
        let layer_bytes = (kv.shape.num_slots() * w * self.dt.size()) as u64;
        let k = kv.buf.ptr() + 2 * layer as u64 * layer_bytes;
        let grid = Grid {
            blocks: (l.n_tokens as u32, 1, 1),
            threads: 128,
        };
        let args = [
            Arg::Ptr(qkv.buf.ptr()),
            Arg::I32(qkv.cols as i32),
            Arg::I32(spec.q_dim() as i32),
            Arg::I32(w as i32),
            Arg::Ptr(self.meta_ptr(l.slots)),
            Arg::Ptr(k),
            Arg::Ptr(k + layer_bytes),
        ];
        self.launch(Kernel::WriteKv, grid, &args)
    }

    fn attention(
        &mut self,
        qkv: &CudaTensor,
        kv: &CudaKv,
        layer: usize,
        b: &CudaBatch,
        spec: &ModelSpec,
        out: &mut CudaTensor,
    ) -> Result<(), BackendError> {
        self.launch_attention(qkv, kv, layer, b, spec, out)
    }

    fn silu_mul(
        &mut self,
        gate_up: &CudaTensor,
        n: usize,
        out: &mut CudaTensor,
    ) -> Result<(), BackendError> {
        let f = out.cols;
        check_cols("silu_mul", gate_up.cols, 2 * f)?;
        check_rows("silu_mul", n, gate_up.rows.min(out.rows))?;
        let total = n * f;
        let grid = Grid {
            blocks: (total.div_ceil(256).min(65535) as u32, 1, 1),
            threads: 256,
        };
        let args = [
            Arg::Ptr(gate_up.buf.ptr()),
            Arg::Ptr(out.buf.ptr()),
            Arg::I32(f as i32),
            Arg::U64(total as u64),
        ];
        self.launch(Kernel::SiluMul, grid, &args)
    }

    fn gather_rows(
        &mut self,
        x: &CudaTensor,
        b: &CudaBatch,
        out: &mut CudaTensor,
    ) -> Result<(), BackendError> {
        let l = self.layout(b)?;
        check_cols("gather_rows", out.cols, x.cols)?;
        check_rows("gather_rows", l.n_logits, out.rows)?;
        let grid = Grid {
            blocks: (l.n_logits as u32, 1, 1),
            threads: 256,
        };
        let args = [
            Arg::Ptr(x.buf.ptr()),
            Arg::Ptr(self.meta_ptr(l.logits_rows)),
            Arg::Ptr(out.buf.ptr()),
            Arg::I32(x.cols as i32),
        ];
        self.launch(Kernel::GatherRows, grid, &args)
    }

    fn sample(
        &mut self,
        logits: &CudaTensor,
        rows: &[SampleRow<'_>],
    ) -> Result<Vec<Sampled>, BackendError> {
        self.sample_on_device(logits, rows)
    }

    fn to_host(&mut self, x: &CudaTensor, n: usize) -> Result<Vec<f32>, BackendError> {
        check_rows("to_host", n, x.rows)?;
        let mut bytes = vec![0u8; n * x.cols * self.dt.size()];
        self.dev.download(&x.buf, 0, &mut bytes)?;
        Ok(self.dt.decode(&bytes))
    }

    fn take_kernel_timings(&mut self) -> Result<Vec<(&'static str, f64)>, BackendError> {
        Ok(CudaBackend::take_kernel_timings(self)?
            .into_iter()
            .map(|t| (t.kernel, t.seconds))
            .collect())
    }

    fn kv_budget_bytes(&self, utilization: f32) -> Option<usize> {
        let (free, total) = self.dev.mem_info().ok()?;
        // Sampling workspace for the largest logits buffer, attention partials and cuBLAS.
        let reserve = self.largest_alloc * 4 + (256 << 20);
        let keep = ((1.0 - utilization.clamp(0.05, 1.0) as f64) * total as f64) as usize;
        Some(free.saturating_sub(keep).saturating_sub(reserve))
    }

    fn kv_element_bytes(&self) -> usize {
        self.dt.size()
    }
}
