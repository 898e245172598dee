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

mod attention;
#[cfg(feature = "cuda")]
pub mod cuda_rt;
mod device;
#[cfg(feature = "rocm")]
pub mod hip_rt;
pub mod kernels;
mod meta;
pub mod runtime;
mod sample;
mod timing;
mod types;

pub use device::TransferStats;
use device::{Arg, DevBuf, Device};
use std::collections::{HashMap, HashSet};

pub use super::open::GpuOptions;
use kernels::{GEMV_MAX_ROWS, Kernel, Kernels};
use meta::GraphKey;
use runtime::{Grid, Runtime};
pub use timing::KernelTiming;
pub use types::{GpuBatch, GpuKv, GpuTensor, GpuWeight};

pub use super::DType;
use super::{
    AttnShape, Backend, BackendError, BatchPlan, HostTensor, KvShape, RopeLayout, RopeSpec,
};
use crate::sampling::{SampleRow, Sampled};

/// The GPU backend of one lane, over vendor runtime `R`.
pub struct GpuBackend<R: Runtime> {
    // Field order is drop order: kernels and the BLAS handle go before the device.
    kernels: Kernels<R>,
    blas: R::Blas,
    dev: Device<R>,
    dt: DType,
    /// Small-batch matmuls may use the streaming kernels ([`GpuOptions::gemv`]).
    gemv: bool,
    /// Decode steps may use the decode attention variant ([`GpuOptions::attn_decode`]).
    attn_decode: bool,
    /// Attention may use the bf16 tensor-core kernels (`mma.sync`: NVIDIA sm_80 or newer,
    /// bf16 storage; f32 storage keeps the CUDA-core kernels, the parity reference).
    mma: bool,
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
    use_graphs: bool,
    /// Recorded decode graphs of the current generation, by shape.
    graphs: HashMap<GraphKey, R::Graph>,
    /// Shapes run eagerly once in the current generation: recorded when they recur.
    graph_seen: HashSet<GraphKey>,
    /// Failed recordings by shape; a shape that failed `GRAPH_TRIES` times stays eager.
    graph_failed: HashMap<GraphKey, u32>,
    /// Bumped by every allocation a recorded graph could address; graphs of an older
    /// generation are dropped before the next step.
    generation: u64,
    graph_generation: u64,
    graph_stats: GraphStats,
}

/// How decode steps ran: recorded into a graph, or replayed from one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GraphStats {
    pub captures: u64,
    pub replays: u64,
    /// Recordings the runtime refused (the step then ran eagerly).
    pub failures: u64,
}

/// Recording attempts per shape before it stays eager.
const GRAPH_TRIES: u32 = 3;

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

/// Heads per rope block (`ROPE_HEADS` in `kernels/rope.cu`).
const ROPE_HEADS: usize = 8;

/// Warps per block of the streaming matmul kernels (`GEMV_WARPS` in `kernels/gemv.cu`).
const GEMV_WARPS: usize = 4;

/// Weight rows per warp of `gemv_*_m{n}` (the instantiations in `kernels/gemv.cu`).
fn gemv_rows_per_warp(n: usize) -> usize {
    if n == 1 { 1 } else { 2 }
}

/// `90` for `sm_90`, `90` for `sm_90a`; 0 for anything else (AMD targets).
fn sm_version(arch: &str) -> u32 {
    arch.strip_prefix("sm_")
        .map(|v| v.trim_end_matches(|c: char| c.is_ascii_alphabetic()))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
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

    /// Opens device `ordinal`, compiles or loads every kernel, creates the BLAS handle.
    pub fn new(ordinal: usize, opts: GpuOptions) -> Result<GpuBackend<R>, BackendError> {
        let dev = Device::<R>::open(ordinal, opts.sync_check, opts.timing_period)?;
        let kernels = Kernels::load(&dev, opts.dtype, opts.kernel_cache.as_deref())?;
        let blas = dev.rt.blas().map_err(runtime::dev_err("blas"))?;
        let i = &dev.info;
        let mma = R::NAME == "cuda" && opts.dtype == DType::Bf16 && sm_version(&i.arch) >= 80;
        tracing::info!(backend = R::NAME, device = %i.name, ordinal, arch = %i.arch, sms = i.sm_count, warp = i.warp_size, dtype = ?opts.dtype, "gpu backend ready");
        Ok(GpuBackend {
            kernels,
            blas,
            dev,
            dt: opts.dtype,
            mma,
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
            use_graphs: opts.graphs,
            gemv: opts.gemv,
            attn_decode: opts.attn_decode,
            graphs: HashMap::new(),
            graph_seen: HashSet::new(),
            graph_failed: HashMap::new(),
            generation: 0,
            graph_generation: 0,
            graph_stats: GraphStats::default(),
        })
    }

    /// Storage type of this backend.
    pub fn dtype(&self) -> DType {
        self.dt
    }

    /// Turns decode graphs on or off for the following steps (benchmarks compare both).
    pub fn set_graphs(&mut self, on: bool) {
        self.use_graphs = on;
    }

    /// Decode steps recorded into graphs and replayed from them so far.
    pub fn graph_stats(&self) -> GraphStats {
        self.graph_stats
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
        self.dev.upload(&t.buf, 0, &bytes)
    }

    fn layout(&self, b: &GpuBatch) -> Result<meta::Layout, BackendError> {
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

    /// Whether `n` rows of `x` times `w` run on the streaming kernels of `kernels/gemv.cu`
    /// (faster than the BLAS for one or two rows): whole 16-byte chunks, aligned buffers.
    fn gemv_fits(&self, n: usize, x: &GpuTensor, w: &GpuWeight) -> bool {
        (1..=GEMV_MAX_ROWS).contains(&n)
            && self.gemv
            && x.cols == w.cols
            && w.cols <= i32::MAX as usize
            && w.rows <= i32::MAX as usize
            && self.whole_chunks(w.cols, &[x.buf.ptr(), w.buf.ptr()])
    }

    /// Whether rows of `cols` elements at `ptrs` split into whole, aligned 16-byte chunks
    /// (the vector kernels' requirement; 0 stands for an absent buffer).
    fn whole_chunks(&self, cols: usize, ptrs: &[u64]) -> bool {
        cols.is_multiple_of(16 / self.dt.size()) && ptrs.iter().all(|p| p.is_multiple_of(16))
    }

    /// Launch shape and arguments of `rope` (shared by the fused `rope_kv`).
    fn rope_args(
        &mut self,
        qkv: &GpuTensor,
        b: &GpuBatch,
        shape: &AttnShape,
        rope: &RopeSpec,
    ) -> Result<(Grid, [Arg; 7]), BackendError> {
        let l = self.layout(b)?;
        check_cols("rope", qkv.cols, shape.qkv_dim())?;
        check_rows("rope", l.n_tokens, qkv.rows)?;
        let freqs = self.inv_freqs(rope)?;
        let groups = (shape.n_heads + shape.n_kv_heads).div_ceil(ROPE_HEADS) as u32;
        let grid = Grid {
            blocks: (l.n_tokens as u32, groups, 1),
            threads: 64,
        };
        let args = [
            Arg::Ptr(qkv.buf.ptr()),
            Arg::I32(qkv.cols as i32),
            Arg::Ptr(self.meta_ptr(l.positions)),
            Arg::Ptr(freqs),
            Arg::I32(shape.head_dim as i32),
            Arg::I32(rope.dim as i32),
            Arg::I32((rope.layout == RopeLayout::Interleaved) as i32),
        ];
        Ok((grid, args))
    }

    /// Device addresses of `layer`'s K and V in the paged cache, checked against `shape`.
    fn kv_layer(
        &self,
        kv: &GpuKv,
        layer: usize,
        shape: &AttnShape,
    ) -> Result<(u64, u64), BackendError> {
        let w = shape.kv_dim();
        check_cols("write_kv", w, kv.shape.slot_width())?;
        if layer >= kv.shape.num_layers {
            return Err(invalid(format!("layer {layer} of {}", kv.shape.num_layers)));
        }
        let layer_bytes = (kv.shape.num_slots() * w * self.dt.size()) as u64;
        let k = kv.buf.ptr() + 2 * layer as u64 * layer_bytes;
        Ok((k, k + layer_bytes))
    }

    fn gemv_grid(&self, blocks: usize) -> Grid {
        Grid {
            blocks: (blocks as u32, 1, 1),
            threads: (GEMV_WARPS * self.dev.info.warp_size) as u32,
        }
    }

    fn inv_freqs(&mut self, rope: &RopeSpec) -> Result<u64, BackendError> {
        if self.rope.as_ref().is_none_or(|(r, _)| r != rope) {
            let f = rope.inv_freqs();
            if self.dev.capturing {
                return Err(invalid(
                    "rope frequencies first uploaded while recording".into(),
                ));
            }
            self.generation += 1;
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
        x: &GpuTensor,
        resid: Option<u64>,
        w: &GpuWeight,
        eps: f32,
        n: usize,
        out: &GpuTensor,
    ) -> Result<(), BackendError> {
        let h = x.cols;
        check_cols("rms_norm weight", w.rows * w.cols, h)?;
        check_cols("rms_norm output", out.cols, h)?;
        check_rows("rms_norm", n, x.rows.min(out.rows))?;
        // Whole warps: block_sum reduces warp by warp (64 lanes on CDNA).
        let warp = self.dev.info.warp_size;
        let ptrs = [x.buf.ptr(), w.buf.ptr(), out.buf.ptr(), resid.unwrap_or(0)];
        let (k, threads) = if self.whole_chunks(h, &ptrs) {
            let chunk = 16 / self.dt.size();
            // Two 16-byte chunks per thread stay in registers between the two passes.
            let k = if k == Kernel::RmsNorm {
                Kernel::RmsNormVec
            } else {
                Kernel::AddRmsNormVec
            };
            (
                k,
                (h / chunk)
                    .div_ceil(2)
                    .next_multiple_of(warp)
                    .clamp(64, 1024),
            )
        } else {
            // Up to eight values per thread stay in registers between the two passes; more
            // threads keep more loads in flight (the kernel is latency-bound at decode).
            (k, h.div_ceil(4).next_multiple_of(warp).clamp(128, 1024))
        };
        let grid = Grid {
            blocks: (n as u32, 1, 1),
            threads: threads as u32,
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

impl<R: Runtime> GpuBackend<R> {
    /// Validates and packs `plan` (at graph shape `key` when given) and uploads it.
    fn prepare_with(
        &mut self,
        plan: &BatchPlan,
        key: Option<GraphKey>,
    ) -> Result<GpuBatch, BackendError> {
        let shape = self
            .kv_shape
            .ok_or_else(|| invalid("no KV cache allocated".into()))?;
        plan.validate(&shape)?;
        let mut words = std::mem::take(&mut self.meta_words);
        let layout = match key {
            Some(k) => meta::pack_graph(plan, k, &mut words),
            None => meta::pack(plan, &shape, self.dev.info.sm_count, &mut words),
        };
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        self.meta_words = words;
        // Room to spare: block tables grow with the contexts, and a new buffer means new
        // graphs.
        ensure(
            &self.dev,
            &mut self.meta,
            bytes.len().max(64 << 10),
            "batch metadata",
            &mut self.generation,
        )?;
        if let Some(m) = &self.meta {
            self.dev.upload(m, 0, &bytes)?;
        }
        self.epoch += 1;
        self.dev.timer.begin_step(self.epoch);
        Ok(GpuBatch {
            epoch: self.epoch,
            layout,
            graph: key,
        })
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
        let buf = self.dev.alloc(rows * cols * self.dt.size(), "weight")?;
        let w = w.into_f32()?;
        let bytes = self.dt.encode(w.values().unwrap_or_default());
        drop(w);
        self.dev.upload(&buf, 0, &bytes)?;
        Ok(GpuWeight { buf, rows, cols })
    }

    fn alloc(&mut self, rows: usize, cols: usize) -> Result<GpuTensor, BackendError> {
        self.largest_alloc = self.largest_alloc.max(rows * cols);
        self.generation += 1;
        Ok(GpuTensor {
            buf: self.dev.alloc(rows * cols * self.dt.size(), "activation")?,
            rows,
            cols,
        })
    }

    fn alloc_kv(&mut self, shape: &KvShape) -> Result<GpuKv, BackendError> {
        self.generation += 1;
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
        self.kv_shape = Some(*shape);
        Ok(GpuKv { buf, shape: *shape })
    }

    fn prepare(&mut self, plan: &BatchPlan) -> Result<GpuBatch, BackendError> {
        self.prepare_with(plan, None)
    }

    fn prepare_step(&mut self, plan: &BatchPlan, row_cap: usize) -> Result<GpuBatch, BackendError> {
        let key = match self.kv_shape {
            Some(kv) if self.use_graphs => {
                GraphKey::for_plan(plan, &kv, self.dev.info.sm_count, row_cap)
                    .filter(|k| self.graph_failed.get(k).is_none_or(|&n| n < GRAPH_TRIES))
            }
            _ => None,
        };
        self.prepare_with(plan, key)
    }

    fn padded_rows(&self, b: &GpuBatch) -> Option<usize> {
        b.graph.map(|k| k.rows as usize)
    }

    fn run_step(
        &mut self,
        b: &GpuBatch,
        mut ops: impl FnMut(&mut Self) -> Result<(), BackendError>,
    ) -> Result<(), BackendError> {
        self.layout(b)?;
        let Some(key) = b.graph else {
            return ops(self);
        };
        if self.graph_generation != self.generation {
            self.graphs.clear();
            self.graph_seen.clear();
            self.graph_generation = self.generation;
        }
        if let Some(g) = self.graphs.get(&key) {
            let dev = &mut self.dev;
            dev.timed("decode_graph", |rt| {
                rt.replay(g).map_err(runtime::dev_err("decode_graph"))
            })?;
            self.graph_stats.replays += 1;
            return Ok(());
        }
        // The first step of a shape runs eagerly: it makes every lazy allocation (rope
        // tables, workspaces) that a recording must not.
        if self.graph_seen.insert(key) {
            return ops(self);
        }
        let generation = self.generation;
        self.dev
            .rt
            .begin_capture()
            .map_err(runtime::dev_err("graph capture"))?;
        self.dev.capturing = true;
        let recorded = ops(self);
        self.dev.capturing = false;
        let graph = self.dev.rt.end_capture();
        match (recorded, graph) {
            (Ok(()), Ok(g)) if generation == self.generation => {
                self.dev.timed("decode_graph", |rt| {
                    rt.replay(&g).map_err(runtime::dev_err("decode_graph"))
                })?;
                self.graphs.insert(key, g);
                self.graph_stats.captures += 1;
                Ok(())
            }
            (recorded, graph) => {
                // Nothing recorded ran: run the step eagerly; the shape is recorded again on
                // a later step, up to GRAPH_TRIES attempts.
                let why = recorded
                    .err()
                    .map(|e| e.to_string())
                    .or(graph.err().map(|e| e.to_string()));
                tracing::warn!(?key, reason = ?why, "decode graph not recorded; running eagerly");
                *self.graph_failed.entry(key).or_default() += 1;
                self.graph_stats.failures += 1;
                ops(self)
            }
        }
    }

    fn embed(
        &mut self,
        table: &GpuWeight,
        b: &GpuBatch,
        out: &mut GpuTensor,
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
        x: &GpuTensor,
        w: &GpuWeight,
        eps: f32,
        n: usize,
        out: &mut GpuTensor,
    ) -> Result<(), BackendError> {
        self.norm(Kernel::RmsNorm, x, None, w, eps, n, out)
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
        x: &GpuTensor,
        w: &GpuWeight,
        bias: Option<&GpuWeight>,
        n: usize,
        out: &mut GpuTensor,
    ) -> Result<(), BackendError> {
        let (m, k) = (w.rows, w.cols);
        check_cols("matmul input", x.cols, k)?;
        check_cols("matmul output", out.cols, m)?;
        check_rows("matmul", n, x.rows.min(out.rows))?;
        if m > 0 && self.gemv_fits(n, x, w) {
            let bias = bias.map_or(Ok(0), |b| {
                check_cols("matmul bias", b.rows * b.cols, m).map(|_| b.buf.ptr())
            })?;
            let per_block = GEMV_WARPS * gemv_rows_per_warp(n);
            let args = [
                Arg::Ptr(x.buf.ptr()),
                Arg::Ptr(w.buf.ptr()),
                Arg::Ptr(bias),
                Arg::Ptr(out.buf.ptr()),
                Arg::I32(k as i32),
                Arg::I32(m as i32),
            ];
            return self.launch(
                Kernel::Gemv { rows: n as u32 },
                self.gemv_grid(m.div_ceil(per_block)),
                &args,
            );
        }
        if n > 0 && m > 0 {
            if [n, k, m].iter().any(|&v| v > i32::MAX as usize) {
                return Err(invalid(format!("GEMM {n}x{k}x{m} too large")));
            }
            let (blas, dt) = (&self.blas, self.dt);
            // SAFETY: x holds n*k, w m*k and out n*m elements of `dt` (shapes checked above);
            // all three buffers are live.
            self.dev.timed("matmul", |rt| unsafe {
                rt.gemm(blas, dt, x.buf.ptr(), w.buf.ptr(), out.buf.ptr(), n, k, m)
                    .map_err(runtime::dev_err("matmul"))
            })?;
        }
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
        qkv: &mut GpuTensor,
        b: &GpuBatch,
        shape: &AttnShape,
        rope: &RopeSpec,
    ) -> Result<(), BackendError> {
        let (grid, rope) = self.rope_args(qkv, b, shape, rope)?;
        let mut args = rope.to_vec();
        args.push(Arg::I32((shape.n_heads + shape.n_kv_heads) as i32));
        self.launch(Kernel::Rope, grid, &args)
    }

    fn write_kv(
        &mut self,
        kv: &mut GpuKv,
        layer: usize,
        qkv: &GpuTensor,
        b: &GpuBatch,
        shape: &AttnShape,
    ) -> Result<(), BackendError> {
        let l = self.layout(b)?;
        check_cols("write_kv input", qkv.cols, shape.qkv_dim())?;
        check_rows("write_kv", l.n_tokens, qkv.rows)?;
        let (k, v) = self.kv_layer(kv, layer, shape)?;
        let grid = Grid {
            blocks: (l.n_tokens as u32, 1, 1),
            threads: 128,
        };
        let args = [
            Arg::Ptr(qkv.buf.ptr()),
            Arg::I32(qkv.cols as i32),
            Arg::I32(shape.q_dim() as i32),
            Arg::I32(shape.kv_dim() as i32),
            Arg::Ptr(self.meta_ptr(l.slots)),
            Arg::Ptr(k),
            Arg::Ptr(v),
        ];
        self.launch(Kernel::WriteKv, grid, &args)
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
        let (grid, rope) = self.rope_args(qkv, b, shape, rope)?;
        let (k, v) = self.kv_layer(kv, layer, shape)?;
        let l = self.layout(b)?;
        let mut args = rope.to_vec();
        args.extend([
            Arg::I32(shape.n_heads as i32),
            Arg::I32(shape.n_kv_heads as i32),
            Arg::Ptr(self.meta_ptr(l.slots)),
            Arg::Ptr(k),
            Arg::Ptr(v),
        ]);
        self.launch(Kernel::RopeKv, grid, &args)
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

    fn silu_mul(
        &mut self,
        gate_up: &GpuTensor,
        n: usize,
        out: &mut GpuTensor,
    ) -> Result<(), BackendError> {
        let f = out.cols;
        check_cols("silu_mul", gate_up.cols, 2 * f)?;
        check_rows("silu_mul", n, gate_up.rows.min(out.rows))?;
        if n > 0 && self.whole_chunks(f, &[gate_up.buf.ptr(), out.buf.ptr()]) {
            let chunk = 16 / self.dt.size();
            let grid = Grid {
                blocks: ((f / chunk).div_ceil(256) as u32, n.min(65535) as u32, 1),
                threads: 256,
            };
            let args = [
                Arg::Ptr(gate_up.buf.ptr()),
                Arg::Ptr(out.buf.ptr()),
                Arg::I32(f as i32),
                Arg::I32(n as i32),
            ];
            return self.launch(Kernel::SiluMulVec, grid, &args);
        }
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

    fn matmul_silu_mul(
        &mut self,
        x: &GpuTensor,
        w_gate_up: &GpuWeight,
        n: usize,
        gate_up: &mut GpuTensor,
        act: &mut GpuTensor,
    ) -> Result<(), BackendError> {
        let f = act.cols;
        if !self.gemv_fits(n, x, w_gate_up) {
            self.matmul(x, w_gate_up, None, n, gate_up)?;
            return self.silu_mul(gate_up, n, act);
        }
        check_cols("matmul_silu_mul input", x.cols, w_gate_up.cols)?;
        check_cols("matmul_silu_mul weight", w_gate_up.rows, 2 * f)?;
        check_rows("matmul_silu_mul", n, x.rows.min(act.rows))?;
        let args = [
            Arg::Ptr(x.buf.ptr()),
            Arg::Ptr(w_gate_up.buf.ptr()),
            Arg::Ptr(act.buf.ptr()),
            Arg::I32(w_gate_up.cols as i32),
            Arg::I32(f as i32),
        ];
        // One warp per output column (a gate row and its up row).
        self.launch(
            Kernel::GemvSiluMul { rows: n as u32 },
            self.gemv_grid(f.div_ceil(GEMV_WARPS)),
            &args,
        )
    }

    fn gather_rows(
        &mut self,
        x: &GpuTensor,
        b: &GpuBatch,
        out: &mut GpuTensor,
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
        logits: &GpuTensor,
        rows: &[SampleRow<'_>],
    ) -> Result<Vec<Sampled>, BackendError> {
        self.sample_on_device(logits, rows)
    }

    fn to_host(&mut self, x: &GpuTensor, n: usize) -> Result<Vec<f32>, BackendError> {
        check_rows("to_host", n, x.rows)?;
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
        let reserve = self.largest_alloc * 4 + (256 << 20);
        let keep = ((1.0 - utilization.clamp(0.05, 1.0) as f64) * total as f64) as usize;
        Some(free.saturating_sub(keep).saturating_sub(reserve))
    }

    fn kv_element_bytes(&self) -> usize {
        self.dt.size()
    }
}
