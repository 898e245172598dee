//! Matmul launchers: one or two rows stream the weights through `kernels/gemv.cu` (faster
//! than the BLAS there), more rows go to the vendor BLAS GEMM plus a bias kernel; the
//! SwiGLU activation, alone or fused into the gate/up streaming matmul.
//!
//! Quantized weights: up to 8 rows stream the weight through `kernels/qgemv.cu`. In bf16
//! `qdot` takes up to three adjacent parts of one type per launch (or Q4_K/Q5_K q and k with
//! a Q6_K v) on activations quantized to 8-bit blocks of 32 in the dequant scratch, their
//! quants multiplied with dp4a (llama.cpp's MMVQ scheme: an activation error of about 0.5%
//! against exact products, under bf16's tolerance). The RMSNorm before qkv and gate/up
//! writes its output quantized as well ([`QxRows`]), and so does decode attention's split-K
//! merge (the input of o_proj, when every row is merged); `quantize_x` runs only for the
//! other inputs (the SiLU output before down, an attention output written unmerged). f32 keeps
//! exact float products in registers (`qgemv`, one launch per part, each writing its
//! columns). Batches of up
//! to [`QMMA_MAX_ROWS`] rows (bf16) run the tiled kernel of `kernels/qmma.cu` (weight tiles
//! dequantized into shared memory, tensor-core products, no full-size copy; the parts of a
//! stack grouped into launches as for `qdot` (a Q4_K_M qkv, a gate/up pair: one launch);
//! k split over the grid when the blocks would not fill the SMs (at 64 rows on tensor
//! cores: into as many ranges as one wave of the blocks an SM holds), the f32 partials summed
//! in the dequant scratch by `qmma_reduce_bf16`; at 64 rows on NVIDIA sm_80+ launches of
//! many columns take blocks of 128 columns ([`QMMA_WIDE`]); on NVIDIA sm_80+ the types of
//! `QMMA8_TYPES` (route.rs) take `qmma8_*` instead: x quantized to 8 bits per 32 by `quantize_x`,
//! int8 tensor-core products, `GpuTuning::qmma8` overrides); more rows
//! (prefill) and f32 dequantize the weight into the backend's one scratch of the compute
//! type, then the BLAS GEMM (the scratch is a fixed buffer, so recorded graphs replay it).

mod gemv;
pub(in crate::backend::gpu) mod kernels;
mod qdot;
mod qmma;
pub(in crate::backend::gpu) mod route;

pub(in crate::backend::gpu) mod geometry;

pub(in crate::backend::gpu) use geometry::{
    QDOT_PARTS, QMMA_BK, QMMA_BN, QMMA_THREADS, QMMA_WIDE, qx_bytes,
};
use route::{GluPath, MatmulPath, NormFacts, NormPath, Operands, PartRun, Route};

use crate::backend::BackendError;
use crate::backend::gpu::qweight::WeightPart;
use crate::backend::gpu::registry::Unit;
use crate::backend::gpu::runtime::Runtime;
use crate::backend::gpu::{GpuBackend, GpuTensor, GpuWeight, check_cols, check_rows};

impl PartRun<'_, WeightPart> {
    /// Each slot's weight pointer and row count, as the kernels' `w0..w2` and `r0..r2` take
    /// them (0 for an empty slot).
    fn slot_args(&self) -> ([u64; QDOT_PARTS], [i32; QDOT_PARTS]) {
        let (mut w, mut r) = ([0; QDOT_PARTS], [0; QDOT_PARTS]);
        for &(i, p) in &self.slots {
            (w[i], r[i]) = (p.buf.ptr(), p.rows as i32);
        }
        (w, r)
    }
}

/// The rope and cache write a qkv `qdot_*` launch does itself (`QkvRope` in
/// `kernels/qgemv.cu`; `rope.rs` decides when): device addresses and the qkv layout.
#[derive(Debug, Clone, Copy, Default)]
pub(in crate::backend::gpu) struct QkvRope {
    pub positions: u64,
    pub inv_freq: u64,
    pub slots: u64,
    pub k_cache: u64,
    pub v_cache: u64,
    pub q_dim: i32,
    pub kv_dim: i32,
    pub head_dim: i32,
    pub rot_dim: i32,
    pub mscale: f32,
    /// The rope turns adjacent pairs (else each head's halves: the tiles' reduce only; the
    /// decode kernels take adjacent pairs alone).
    pub interleaved: bool,
}

/// Checks the shapes of `out = x @ w^T (+ bias)` over `n` rows; the bias's device address.
pub(in crate::backend::gpu) fn matmul_operands(
    x: &GpuTensor,
    w: &GpuWeight,
    bias: Option<&GpuWeight>,
    n: usize,
    out: &GpuTensor,
) -> Result<Option<u64>, BackendError> {
    check_cols("matmul input", x.cols, w.cols)?;
    check_cols("matmul output", out.cols, w.rows)?;
    check_rows("matmul", n, x.rows.min(out.rows))?;
    bias.map(|b| {
        check_cols("matmul bias", b.rows * b.cols, w.rows)?;
        Ok(b.dense_for("matmul bias")?.ptr())
    })
    .transpose()
}

/// Warps per block of the streaming matmul kernels (`GEMV_WARPS` in `kernels/gemv.cu`).
const GEMV_WARPS: usize = 4;

/// Blocks per SM a `qmma_*` launch aims for by splitting k (memory latency hides behind them).
const QMMA_WAVES: usize = 4;
/// Fewest k-tiles per split, and most splits, of a `qmma_*` launch.
const QMMA_MIN_SPLIT_TILES: usize = 2;
const QMMA_MAX_SPLITS: usize = 16;
/// Most blocks per SM a 64-row `qmma_*` launch on tensor cores counts on when it splits k
/// (fewer where the kernel's registers allow fewer; `qmma_splits`).
const QMMA_RESIDENT_MAX: usize = 3;
/// 32-bit registers per SM (NVIDIA sm_80 to sm_90), and their allocation unit per warp.
const SM_REGS: usize = 65_536;
const WARP_REG_UNIT: usize = 256;

/// Warps of a `qdot_norm_*` block (`QDOT_NORM_WARPS` in `kernels/qgemv.cu`): two output
/// columns each, one group of 32 8-bit activations a block.
const QDOT_NORM_WARPS: u32 = 16;
/// Weight rows per warp of `qgemv_*` and `qdot_*` at every row bucket.
const QGEMV_ROWS_PER_WARP: usize = 2;
/// Threads per block of `quantize_x_bf16`; each quantizes a block of 32 activations.
pub(in crate::backend::gpu) const QX_THREADS: usize = 256;

/// Activation rows left quantized to 8 bits in the dequant scratch by the launch that made
/// them: `rows` rows of `cols` values of the tensor at device address `x`, at `at`. The
/// next quantized decode matmul on exactly those rows reads them instead of launching
/// `quantize_x`; every other launch, write, download or allocation settles the record first
/// ([`GpuBackend::settle_qx`]). With `norm`, the rows are a residual norm's input that a
/// decode matmul left instead of its output `x`, which the settling then writes.
#[derive(Debug, Clone, Copy)]
pub(in crate::backend::gpu) struct QxRows {
    pub x: u64,
    pub rows: usize,
    pub cols: usize,
    pub at: u64,
    pub norm: Option<NormIn>,
}

/// The RMSNorm a decode matmul ([`GpuBackend::launch_qdot_norm`]) left to the quantized
/// matmul that reads its output (`NormIn` in `kernels/qgemv.cu`): the rows at [`QxRows::at`] are
/// the residual times the norm weight `w`, quantized; `ss` holds each row's sums of squares
/// of the residual per 32 columns. The reader scales by 1 / rms and writes the norm's
/// output (`add.out` = [`QxRows::x`]) for later readers.
#[derive(Debug, Clone, Copy)]
pub(in crate::backend::gpu) struct NormIn {
    pub ss: u64,
    pub add: AddNorm,
}

/// What a tiled launch's split-k reduce does besides the sum ([`GpuBackend::launch_qmma`]).
#[derive(Clone, Copy)]
pub(in crate::backend::gpu) enum QmmaTail<'a> {
    None,
    /// The qkv's rope and cache write.
    Rope(&'a QkvRope),
    /// The residual add and RMSNorm after the matmul.
    AddNorm(AddNorm),
}

/// `residual += delta; out = rmsnorm(residual) * w` (device addresses; `h` columns each).
#[derive(Debug, Clone, Copy)]
pub(in crate::backend::gpu) struct AddNorm {
    pub residual: u64,
    pub w: u64,
    pub out: u64,
    pub eps: f32,
}

/// The operands of `n` rows of `x` times `w` as a route reads them.
pub(in crate::backend::gpu) fn operands<'a>(
    x: &GpuTensor,
    w: &'a GpuWeight,
    n: usize,
) -> Operands<'a, WeightPart> {
    Operands {
        n,
        x_cols: x.cols,
        w_rows: w.rows,
        w_cols: w.cols,
        parts: &w.parts,
        x_aligned: x.buf.ptr().is_multiple_of(16),
        w_aligned: w.dense().is_none_or(|b| b.ptr().is_multiple_of(16)),
    }
}

impl<R: Runtime> GpuBackend<R> {
    /// The routes of this backend's matmuls: its storage type, device, switches, dequant
    /// scratch and compile state.
    pub(in crate::backend::gpu) fn route(&self) -> Route<'_, impl Fn(Unit) -> bool + '_> {
        Route {
            dt: self.ctx.dt,
            caps: &self.ctx.caps,
            tuning: &self.ctx.tuning,
            gemv: self.ctx.switches.gemv,
            room: self.ctx.scratch.dequant.as_ref().map_or(0, |b| b.bytes()),
            pending: move |u| self.ctx.kernels.pending(u),
        }
    }

    /// Where part `p`'s columns start in the bias and in `out`: (bias, y) device addresses
    /// (bias 0 without one).
    fn part_out(&self, p: &WeightPart, bias: Option<u64>, out: &GpuTensor) -> (u64, u64) {
        let at = p.row0 as u64 * self.ctx.dt.size() as u64;
        (bias.map_or(0, |b| b + at), out.buf.ptr() + at)
    }

    /// `out = x @ w^T (+ bias)` over `n` rows, on the route's path ([`MatmulPath`]).
    pub(in crate::backend::gpu) fn launch_matmul(
        &mut self,
        x: &GpuTensor,
        w: &GpuWeight,
        bias: Option<&GpuWeight>,
        n: usize,
        out: &mut GpuTensor,
    ) -> Result<(), BackendError> {
        let (m, k) = (w.rows, w.cols);
        let bias = matmul_operands(x, w, bias, n, out)?;
        let path = self.route().matmul(&operands(x, w, n));
        match path {
            MatmulPath::Gemv { rows } => self.launch_gemv(x, w, bias, rows, out),
            MatmulPath::Blas => {
                let wbuf = w.dense().map_or(0, |b| b.ptr());
                self.gemm(x.buf.ptr(), wbuf, out.buf.ptr(), n, k, m)?;
                self.add_bias(out, bias, n, m)
            }
            MatmulPath::Qdot { rows } => self.launch_qdot(x, w, bias, n, rows, out, None),
            MatmulPath::Qgemv { rows } => self.launch_qgemv(x, w, bias, n, rows, out),
            MatmulPath::Empty => Ok(()),
            MatmulPath::Qmma { tile, .. } => self
                .launch_qmma(x, w, bias, n, tile, out, QmmaTail::None)
                .map(|_| ()),
            MatmulPath::DequantBlas => {
                let scratch = self.dequantize_into_scratch(w)?;
                self.gemm(x.buf.ptr(), scratch, out.buf.ptr(), n, k, m)?;
                self.add_bias(out, bias, n, m)
            }
        }
    }

    /// `act = silu(x @ gate^T) * (x @ up^T)` over `n` rows (`w_gate_up`: the gate rows, then
    /// the up rows), on the route's path ([`GluPath`]): fused where a kernel takes the pair,
    /// else the matmul into `gate_up`, then SiLU-mul.
    pub(in crate::backend::gpu) fn launch_matmul_silu_mul(
        &mut self,
        x: &GpuTensor,
        w_gate_up: &GpuWeight,
        n: usize,
        gate_up: &mut GpuTensor,
        act: &mut GpuTensor,
    ) -> Result<(), BackendError> {
        let (w, f) = (w_gate_up, act.cols);
        if w.dense().is_none() {
            check_cols("matmul_silu_mul input", x.cols, w.cols)?;
            check_cols("matmul_silu_mul weight", w.rows, 2 * f)?;
            check_rows("matmul_silu_mul", n, x.rows.min(act.rows))?;
        }
        let path = self.route().glu(&operands(x, w, n), f);
        let pair = match w.parts.as_slice() {
            [g, u] => Some([g, u]),
            _ => None,
        };
        match (path, pair) {
            (GluPath::GemvSilu { .. }, _) => self.launch_gemv_silu(x, w, n, act),
            (
                GluPath::QdotSilu {
                    q,
                    rows,
                    takes_norm,
                },
                Some(gu),
            ) => self.launch_qdot_silu(x, gu, n, (q, rows, takes_norm), act),
            (GluPath::QgemvSilu { q, rows }, Some(gu)) => {
                self.launch_qgemv_silu(x, gu, q, n, rows, act)
            }
            (GluPath::QmmaGlu { q, tile }, Some(gu)) => {
                self.launch_qmma_glu(x, gu, q, n, tile, act)
            }
            _ => {
                self.launch_matmul(x, w, None, n, gate_up)?;
                self.launch_silu_mul(gate_up, n, act)
            }
        }
    }

    /// `delta = x @ w^T; residual += delta; out = rmsnorm(residual) * norm_w` over `n` rows,
    /// on the route's path ([`NormPath`]): one decode row on `qdot_norm_*` (the norm left
    /// to the next quantized matmul), a quantized weight on the tiles whose launch splits k,
    /// at [`QMMA_NORM_MIN_ROWS`] rows or more, with the add and the norm in its reduce
    /// (`qmma_reduce_add_norm`; `delta` is then not written); anything else runs the matmul,
    /// then the fused add + norm.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::backend::gpu) fn launch_matmul_add_rms_norm(
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
        matmul_operands(x, w, None, n, delta)?;
        let h = w.rows;
        check_cols("add_rms_norm residual", residual.cols, h)?;
        check_rows("add_rms_norm residual", n, residual.rows)?;
        check_cols("rms_norm weight", norm_w.rows * norm_w.cols, h)?;
        check_cols("rms_norm output", out.cols, h)?;
        check_rows("rms_norm", n, out.rows)?;
        let nf = NormFacts {
            h,
            w_dense: norm_w.dense().is_some(),
            across_ops: self.ctx.scratch.fuse_across_ops,
        };
        let an = AddNorm {
            residual: residual.buf.ptr(),
            w: norm_w.dense().map_or(0, |b| b.ptr()),
            out: out.buf.ptr(),
            eps,
        };
        let path = self.route().add_norm(&operands(x, w, n), &nf);
        match path {
            NormPath::QdotNorm { q } => return self.launch_qdot_norm(x, w, n, an, h, q),
            NormPath::Tiles { tile } => {
                if self.launch_qmma(x, w, None, n, tile, delta, QmmaTail::AddNorm(an))? {
                    return Ok(());
                }
            }
            NormPath::Unfused => self.launch_matmul(x, w, None, n, delta)?,
        }
        self.launch_norm(delta, Some(residual.buf.ptr()), norm_w, eps, n, out)
    }
}
