//! What the parity tests need beyond the op contract: writing host data into a backend's
//! tensors, a per-dtype tolerance, and running one test body on every compiled backend.

use kiln::backend::HostTensor;
use kiln::backend::cpu::CpuBackend;
use kiln::backend::{Backend, BatchPlan, SeqSlice};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A backend under test.
pub trait TestBackend: Backend {
    /// Name for messages (`cpu`, `cuda:0 f32`).
    fn label(&self) -> String;
    /// Relative error allowed against the f32 CPU reference.
    fn tol(&self) -> f64;
    /// Writes `data` into the first rows of `t`.
    fn write(&mut self, t: &mut Self::Tensor, data: &[f32]);
    /// `data` as this backend stores it (bf16 rounding), so references can see the same inputs.
    fn quantize(&self, data: &[f32]) -> Vec<f32>;
    /// Waits until every kernel is loaded (a GPU's tiled matmuls compile after start-up's).
    fn wait_kernels(&mut self) {}
}

impl TestBackend for CpuBackend {
    fn label(&self) -> String {
        "cpu".into()
    }
    fn tol(&self) -> f64 {
        1e-6
    }
    fn write(&mut self, t: &mut Self::Tensor, data: &[f32]) {
        t.data[..data.len()].copy_from_slice(data);
    }
    fn quantize(&self, data: &[f32]) -> Vec<f32> {
        data.to_vec()
    }
}

#[cfg(any(feature = "cuda", feature = "rocm"))]
impl<R: kiln::backend::gpu::runtime::Runtime> TestBackend for kiln::backend::gpu::GpuBackend<R> {
    fn label(&self) -> String {
        format!("{} {:?}", self.name(), self.dtype())
    }
    fn tol(&self) -> f64 {
        match self.dtype() {
            kiln::backend::DType::F32 => 2e-5,
            kiln::backend::DType::Bf16 => 2e-2,
        }
    }
    fn write(&mut self, t: &mut Self::Tensor, data: &[f32]) {
        self.write_tensor(t, data).expect("write tensor");
    }
    fn wait_kernels(&mut self) {
        kiln::backend::gpu::GpuBackend::wait_kernels(self).expect("every kernel loads");
    }
    fn quantize(&self, data: &[f32]) -> Vec<f32> {
        match self.dtype() {
            kiln::backend::DType::F32 => data.to_vec(),
            kiln::backend::DType::Bf16 => data
                .iter()
                .map(|&v| half::bf16::from_f32(v).to_f32())
                .collect(),
        }
    }
}

/// The GPU switches of the tests' backends: the defaults with the process's `KILN_*`
/// environment applied (the A/B scripts set it; the backend itself never reads it).
#[cfg(any(feature = "cuda", feature = "rocm"))]
pub fn env_tuning() -> kiln::backend::GpuTuning {
    kiln::backend::GpuTuning::default()
        .with_env(|k| std::env::var(k).ok())
        .unwrap_or_else(|(var, e)| panic!("{var}: {e}"))
}

/// The tests' default GPU options: the defaults with [`env_tuning`].
#[cfg(any(feature = "cuda", feature = "rocm"))]
pub fn gpu_options() -> kiln::backend::GpuOptions {
    kiln::backend::GpuOptions {
        tuning: env_tuning(),
        ..kiln::backend::GpuOptions::default()
    }
}

/// A CUDA backend of `dtype` on device 0, or `None` (with a notice) where no GPU is usable.
#[cfg(feature = "cuda")]
pub fn cuda(dtype: kiln::backend::cuda::DType) -> Option<kiln::backend::cuda::CudaBackend> {
    cuda_with(dtype, true)
}

/// [`cuda`] with decode graphs on or off.
#[cfg(feature = "cuda")]
pub fn cuda_with(
    dtype: kiln::backend::cuda::DType,
    graphs: bool,
) -> Option<kiln::backend::cuda::CudaBackend> {
    cuda_opened(kiln::backend::cuda::CudaOptions {
        dtype,
        sync_check: true,
        graphs,
        ..gpu_options()
    })
}

/// [`cuda`] with the switches `tuning` (tests of both settings of a switch).
#[cfg(feature = "cuda")]
pub fn cuda_tuned(
    dtype: kiln::backend::cuda::DType,
    tuning: kiln::backend::GpuTuning,
) -> Option<kiln::backend::cuda::CudaBackend> {
    cuda_opened(kiln::backend::cuda::CudaOptions {
        dtype,
        sync_check: true,
        tuning,
        ..gpu_options()
    })
}

/// A CUDA backend on device 0 opened with `opts` (and the default kernel cache), or `None`
/// (with a notice) where no GPU is usable.
#[cfg(feature = "cuda")]
pub fn cuda_opened(
    opts: kiln::backend::cuda::CudaOptions,
) -> Option<kiln::backend::cuda::CudaBackend> {
    use kiln::backend::cuda::{CudaBackend, CudaOptions, device_available};
    if !device_available() {
        eprintln!("notice: no CUDA device or driver here; CUDA parity skipped");
        return None;
    }
    let opts = CudaOptions {
        kernel_cache: kiln::engine::default_kernel_cache_dir(),
        ..opts
    };
    Some(CudaBackend::new(0, opts).expect("a CUDA device is present, so the backend must start"))
}

/// A ROCm backend of `dtype` on device 0, or `None` (with a notice) where no GPU is usable.
#[cfg(feature = "rocm")]
pub fn rocm(dtype: kiln::backend::DType) -> Option<kiln::backend::rocm::RocmBackend> {
    use kiln::backend::rocm::{RocmBackend, RocmOptions, device_available};
    if !device_available() {
        eprintln!("notice: no ROCm device or runtime here; ROCm parity skipped");
        return None;
    }
    let opts = RocmOptions {
        dtype,
        sync_check: true,
        kernel_cache: kiln::engine::default_kernel_cache_dir(),
        ..gpu_options()
    };
    Some(RocmBackend::new(0, opts).expect("a ROCm device is present, so the backend must start"))
}

/// Defines `#[test] fn $name` running `$body::<B>(&mut backend)` on the CPU and, when
/// compiled with CUDA or ROCm and a GPU is present, on that GPU in f32 and in bf16.
#[macro_export]
macro_rules! parity_test {
    ($name:ident, $body:ident) => {
        #[test]
        fn $name() {
            $body(&mut kiln::backend::cpu::CpuBackend::new());
            #[cfg(feature = "cuda")]
            for dt in [kiln::backend::DType::F32, kiln::backend::DType::Bf16] {
                if let Some(mut b) = $crate::harness::cuda(dt) {
                    $body(&mut b);
                }
            }
            #[cfg(feature = "rocm")]
            for dt in [kiln::backend::DType::F32, kiln::backend::DType::Bf16] {
                if let Some(mut b) = $crate::harness::rocm(dt) {
                    $body(&mut b);
                }
            }
        }
    };
}

/// A generator seeded freshly each run; the seed is printed so a failure can be replayed
/// with `KILN_PARITY_SEED`.
pub fn rng(test: &str) -> ChaCha8Rng {
    let seed = std::env::var("KILN_PARITY_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    eprintln!("{test}: seed {seed}");
    ChaCha8Rng::seed_from_u64(seed)
}

/// `n` values uniform in `[-scale, scale)`.
pub fn random(rng: &mut ChaCha8Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| (rng.random::<f32>() * 2.0 - 1.0) * scale)
        .collect()
}

/// A tensor holding `data` (`rows x cols`).
pub fn tensor<B: TestBackend>(b: &mut B, rows: usize, cols: usize, data: &[f32]) -> B::Tensor {
    assert_eq!(data.len(), rows * cols);
    let mut t = b.alloc(rows, cols).expect("alloc");
    b.write(&mut t, data);
    t
}

/// A KV pool of one layer with 8 blocks of 4 positions (one head of 8): for ops that need a
/// prepared batch but read no cache (embedding rows).
pub const TINY_KV: kiln::backend::KvShape = kiln::backend::KvShape {
    num_layers: 1,
    num_blocks: 8,
    block_size: 4,
    n_kv_heads: 1,
    head_dim: 8,
};

/// A tensor whose every element is NaN, so unwritten outputs show.
pub fn poisoned<B: TestBackend>(b: &mut B, rows: usize, cols: usize) -> B::Tensor {
    tensor(b, rows, cols, &vec![f32::NAN; rows * cols])
}

pub fn weight<B: Backend>(b: &mut B, shape: Vec<usize>, data: &[f32]) -> B::Weight {
    b.upload_weight(HostTensor::new(shape, data.to_vec()))
        .expect("upload weight")
}

/// Checks every element was written (finite) and `‖got − want‖₂ / ‖want‖₂ <= tol`.
pub fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = got.iter().position(|v| !v.is_finite()) {
        panic!("{what}: element {i} not written or not finite ({})", got[i]);
    }
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (g, w) in got.iter().zip(want) {
        num += (*g as f64 - *w as f64).powi(2);
        den += (*w as f64).powi(2);
    }
    let err = (num / den.max(1e-30)).sqrt();
    assert!(err <= tol, "{what}: relative error {err:.3e} > {tol:.1e}");
}

/// `got` (read back from a poisoned tensor) holds `want` in its first `want.len()` elements
/// and NaN after them: the op wrote its rows and nothing past them.
pub fn assert_rows_only(what: &str, got: &[f32], want: &[f32], tol: f64) {
    let n = want.len();
    assert_close(what, &got[..n], want, tol);
    assert!(
        got[n..].iter().all(|v| v.is_nan()),
        "{what}: wrote past its rows"
    );
}

/// A plan over sequences given as (q_len, ctx_len, block table); tokens are `token`.
pub fn plan(
    seqs: &[(u32, u32, Vec<u32>)],
    block_size: u32,
    token: impl Fn(usize) -> u32,
) -> BatchPlan {
    let mut p = BatchPlan {
        block_size,
        ..Default::default()
    };
    let mut row = 0;
    for (q_len, ctx_len, table) in seqs {
        p.seqs.push(SeqSlice {
            q_start: row,
            q_len: *q_len,
            ctx_len: *ctx_len,
            block_table: table.clone(),
            wants_logits: true,
        });
        row += q_len;
    }
    p.token_ids = (0..row as usize).map(token).collect();
    p.fill_positions_and_slots();
    p
}

/// Block tables for sequences of the given lengths: blocks drawn at random without
/// replacement from a pool of `num_blocks`, so tables are out of order and leave gaps.
pub fn block_tables(
    rng: &mut ChaCha8Rng,
    ctx: &[u32],
    block_size: u32,
    num_blocks: usize,
) -> Vec<Vec<u32>> {
    let mut free: Vec<u32> = (0..num_blocks as u32).collect();
    ctx.iter()
        .map(|&c| {
            (0..c.div_ceil(block_size))
                .map(|_| free.swap_remove(rng.random_range(0..free.len())))
                .collect()
        })
        .collect()
}

/// Random valid blocks of quantized type `ty` for a `[rows, cols]` matrix: random quants and
/// scale bytes, with the f16 super-scales (`d`, `dmin`) set to sane values, so dequantized
/// weights are of order 0.1 to 1 (the speed and parity of the kernels do not depend on values).
/// Each Q4_K/Q5_K block's `dmin` cancels its mean (`d * mid * sum(sc) = dmin * sum(m)`, `mid`
/// the quants' middle): weights with a common sign made every gate of a row negative, so a
/// SiLU output was a few near-zero gates whose relative error the 8-bit activations blew up
/// (CI, seed 4215414442121055166: 5.4e-2 with 0.7% error on the gates).
pub fn random_blocks(
    rng: &mut impl rand::Rng,
    ty: kiln::backend::quant::GgmlType,
    rows: usize,
    cols: usize,
) -> Vec<u8> {
    use kiln::backend::quant::GgmlType;
    let (be, bb) = (
        ty.block_size().expect("a known type") as usize,
        ty.block_bytes().expect("a known type") as usize,
    );
    let mut bytes = vec![0u8; rows * cols / be * bb];
    rng.fill_bytes(&mut bytes);
    let mut f16 = |lo: f32, hi: f32| {
        let v = lo + (hi - lo) * (rng.next_u32() as f32 / u32::MAX as f32);
        half::f16::from_f32(v).to_le_bytes()
    };
    for blk in bytes.chunks_exact_mut(bb) {
        match ty {
            GgmlType::Q8_0 => blk[..2].copy_from_slice(&f16(0.001, 0.004)),
            GgmlType::Q4_0 => blk[..2].copy_from_slice(&f16(0.01, 0.05)),
            GgmlType::Q4K | GgmlType::Q5K => {
                let d = f16(0.0005, 0.002);
                let (sc, m) = (0..8).fold((0.0, 0.0), |(sc, m), j| {
                    let (s, n) = kiln::backend::quant::q4_k_scale_min(j, &blk[4..16]);
                    (sc + f32::from(s), m + f32::from(n))
                });
                let mid = if ty == GgmlType::Q4K { 7.5 } else { 15.5 };
                let dmin = half::f16::from_le_bytes(d).to_f32() * mid * sc / m.max(1.0);
                blk[..2].copy_from_slice(&d);
                blk[2..4].copy_from_slice(&half::f16::from_f32(dmin).to_le_bytes());
            }
            GgmlType::Q6K => blk[208..210].copy_from_slice(&f16(0.0001, 0.0004)),
            _ => {}
        }
    }
    bytes
}

/// The speed benchmarks' common part (`bench.rs`, `bench_arch.rs`): a model with dummy
/// weights on a bf16 CUDA backend with its KV pool, timed steps, and kernel timings by op.
#[cfg(feature = "cuda")]
pub mod rig {
    use std::collections::BTreeMap;
    use std::time::Instant;

    use kiln::backend::cuda::{CudaBackend, CudaOptions, DType};
    use kiln::backend::gpu::KernelTiming;
    use kiln::backend::{Backend, BatchPlan, KvShape, SeqSlice};
    use kiln::model::ModelFiles;
    use kiln::runner::Llama;
    use kiln::sampling::{Penalties, SampleRow, SamplingParams};

    /// Tokens of the longest step (prefill 2048).
    pub const MAX_STEP: usize = 2048;

    /// A bf16 CUDA backend on device 0 with the on-disk kernel cache.
    pub fn bf16_backend() -> CudaBackend {
        let opts = CudaOptions {
            dtype: DType::Bf16,
            kernel_cache: kiln::engine::default_kernel_cache_dir(),
            ..super::gpu_options()
        };
        CudaBackend::new(0, opts).expect("cuda")
    }

    /// A plan where sequence `first_seq + i` owns blocks `(first_seq + i) * bps ..`, each
    /// sequence given as (new tokens, context).
    pub fn plan(seqs: &[(u32, u32)], first_seq: usize, bps: usize, block_size: u32) -> BatchPlan {
        let mut p = BatchPlan {
            block_size,
            ..Default::default()
        };
        for (i, &(q, ctx)) in seqs.iter().enumerate() {
            let s = first_seq + i;
            let table = (0..bps).map(|b| (s * bps + b) as u32).collect();
            p.seqs.push(SeqSlice {
                q_start: p.token_ids.len() as u32,
                q_len: q,
                ctx_len: ctx,
                block_table: table,
                wants_logits: true,
            });
            p.token_ids
                .extend((0..q).map(|t| (t * 7919 + s as u32 * 31) % 128000));
        }
        p.fill_positions_and_slots();
        p
    }

    pub fn median(mut v: Vec<f64>) -> f64 {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    }

    /// Kernel time by op (launches, seconds), longest first, and the line that prints it.
    pub fn by_op(timings: &[KernelTiming]) -> (BTreeMap<&'static str, (usize, f64)>, String) {
        let mut ops: BTreeMap<&'static str, (usize, f64)> = BTreeMap::new();
        for t in timings {
            let e = ops.entry(t.kernel).or_default();
            e.0 += 1;
            e.1 += t.seconds;
        }
        let total: f64 = ops.values().map(|v| v.1).sum();
        let mut rows: Vec<_> = ops.iter().collect();
        rows.sort_by(|a, b| b.1.1.total_cmp(&a.1.1));
        let parts: Vec<String> = rows
            .iter()
            .map(|(op, (n, t))| format!("{op} {:.3}ms/{n}", t * 1e3))
            .collect();
        let line = format!("kernels {:.3} ms: {}", total * 1e3, parts.join(", "));
        (ops, line)
    }

    /// A loaded benchmark model.
    pub struct BenchRig {
        pub b: CudaBackend,
        pub model: Llama<CudaBackend>,
        pub kv: <CudaBackend as Backend>::Kv,
        pub shape: KvShape,
    }

    impl BenchRig {
        /// Loads `files` on `b` (steps up to [`MAX_STEP`] tokens and `max_seqs` sequences)
        /// with a KV pool of `num_blocks` blocks of 16 slots; prints the load.
        pub fn load(
            mut b: CudaBackend,
            files: &ModelFiles,
            num_blocks: usize,
            max_seqs: usize,
        ) -> Self {
            let spec = &files.spec;
            let t0 = Instant::now();
            let model = Llama::load(&mut b, files, MAX_STEP, max_seqs).expect("load");
            let shape = KvShape {
                num_layers: spec.n_layers,
                num_blocks,
                block_size: 16,
                n_kv_heads: spec.n_kv_heads,
                head_dim: spec.head_dim,
            };
            let kv = b.alloc_kv(&shape).expect("kv");
            let (device, file) = b.weight_bytes();
            eprintln!(
                "loaded {}: {} layers in {:.1}s: weights {:.3} GB on the device, {:.3} GB in the source",
                files.name,
                spec.n_layers,
                t0.elapsed().as_secs_f64(),
                device as f64 / 1e9,
                file as f64 / 1e9
            );
            BenchRig {
                b,
                model,
                kv,
                shape,
            }
        }

        /// One forward + greedy sample; returns seconds (synchronized by the sample download).
        pub fn step(&mut self, p: &BatchPlan) -> f64 {
            let greedy = SamplingParams::greedy();
            let rows: Vec<SampleRow<'_>> = (0..p.seqs.len())
                .map(|_| SampleRow {
                    params: &greedy,
                    uniform: 0.5,
                    penalties: Penalties::none(),
                    mask: None,
                    forced: None,
                })
                .collect();
            let t = Instant::now();
            let logits = self
                .model
                .forward(&mut self.b, &mut self.kv, p)
                .expect("forward");
            self.b.sample(logits, &rows).expect("sample");
            t.elapsed().as_secs_f64()
        }

        /// Prefills `n` sequences of `ctx` tokens (ctx <= 2048), packed into 2048-token steps,
        /// eagerly.
        pub fn fill(&mut self, n: usize, ctx: u32, bps: usize) {
            let per_step = (MAX_STEP / ctx as usize).max(1);
            self.b.set_graphs(false);
            for first in (0..n).step_by(per_step) {
                let k = per_step.min(n - first);
                self.step(&plan(&vec![(ctx, ctx); k], first, bps, 16));
            }
        }

        /// Median of 20 decode steps of `batch` rows at contexts `ctx + 1 ..`, eager or
        /// graph-replayed.
        pub fn decode_median(&mut self, batch: usize, ctx: u32, bps: usize, graphs: bool) -> f64 {
            assert!(
                batch * bps <= self.shape.num_blocks,
                "KV pool too small for batch {batch} ctx {ctx}"
            );
            self.b.set_graphs(graphs);
            let times = (0..20u32)
                .map(|i| {
                    let seqs: Vec<(u32, u32)> = (0..batch).map(|_| (1, ctx + 1 + i)).collect();
                    self.step(&plan(&seqs, 0, bps, 16))
                })
                .collect();
            median(times)
        }

        /// Median of five 2048-token prefills after a warm-up (eager: no graph applies).
        pub fn prefill_median(&mut self) -> f64 {
            let p = plan(&[(2048, 2048)], 0, 2048 / 16 + 1, 16);
            self.b.set_graphs(false);
            self.step(&p);
            median((0..5).map(|_| self.step(&p)).collect())
        }

        /// Wall time of one step of `p` with every kernel timed by device events, and the
        /// timings in launch order.
        pub fn timed_kernels(&mut self, p: &BatchPlan) -> (f64, Vec<KernelTiming>) {
            self.b.set_timing_period(Some(1));
            let wall = self.step(p);
            self.b.set_timing_period(None);
            (wall, self.b.take_kernel_timings().expect("timings"))
        }
    }
}
