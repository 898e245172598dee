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
//! [`QMMA8_TYPES`] take `qmma8_*` instead: x quantized to 8 bits per 32 by `quantize_x`,
//! int8 tensor-core products, `KILN_QMMA8` overrides); more rows
//! (prefill) and f32 dequantize the weight into the backend's one scratch of the compute
//! type, then the BLAS GEMM (the scratch is a fixed buffer, so recorded graphs replay it).

use crate::backend::BackendError;
use crate::backend::gpu::args::{
    AddBiasArgs, GemvArgs, GemvSiluMulArgs, QdotArgs, QdotInArgs, QdotNormArgs, QdotSiluArgs,
    QdotSiluInArgs, QgemvArgs, QgemvSiluArgs, QmmaArgs, QmmaGluArgs, QmmaReduceAddNormArgs,
    QmmaReduceArgs, QmmaReduceGluArgs, QmmaReduceRopeArgs, QuantizeXArgs, SiluMulArgs,
    SiluMulVecArgs,
};
use crate::backend::gpu::kernels::{
    GEMV_MAX_ROWS, Kernel, Part, QDOT_MIX_TYPES, QGEMV_ROWS, QMMA_GLU_TYPES, QMMA_ROWS, Source,
    Unit,
};
use crate::backend::gpu::qtype::QType;
use crate::backend::gpu::qweight::WeightPart;
use crate::backend::gpu::runtime::{self, Grid, Runtime};
use crate::backend::gpu::{GpuBackend, GpuTensor, GpuWeight, check_cols, check_rows, invalid};

/// Adjacent parts of a stacked weight that one launch takes (`qdot_*`, `qmma_*`): up to
/// [`QDOT_PARTS`] of one type `q`, or one or two of a [`QDOT_MIX_TYPES`] type and a Q6_K
/// part after them (`mix`: the Q6_K part goes in the last slot); `slots` pairs each part with
/// its slot.
struct PartRun<'a> {
    q: QType,
    mix: bool,
    slots: Vec<(usize, &'a WeightPart)>,
}

impl PartRun<'_> {
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

/// The launches of `w`'s quantized parts, in order (unquantized parts are skipped).
fn part_runs(w: &GpuWeight) -> Vec<PartRun<'_>> {
    let mut runs = Vec::new();
    let mut first = 0;
    while first < w.parts.len() {
        let q = w.parts[first].q;
        let run = w.parts[first..]
            .iter()
            .take(QDOT_PARTS)
            .take_while(|p| p.q == q)
            .count();
        let mix = run < QDOT_PARTS
            && q.is_some_and(|q| QDOT_MIX_TYPES.contains(&q))
            && w.parts
                .get(first + run)
                .is_some_and(|p| p.q == Some(QType::Q6K));
        let mut slots: Vec<(usize, &WeightPart)> =
            w.parts[first..first + run].iter().enumerate().collect();
        if mix {
            slots.push((QDOT_PARTS - 1, &w.parts[first + run]));
        }
        first += slots.len();
        if let Some(q) = q {
            runs.push(PartRun { q, mix, slots });
        }
    }
    runs
}

/// Warps per block of the streaming matmul kernels (`GEMV_WARPS` in `kernels/gemv.cu`).
const GEMV_WARPS: usize = 4;

/// Most rows of a step on the tiled quantized matmul; more dequantize for the BLAS GEMM.
pub const QMMA_MAX_ROWS: usize = 256;
/// Weight rows (output columns) and threads per block of `qmma_*` and `qmma8_*` (`QMMA_BN`,
/// `QMMA_THREADS` in `kernels/qmma.cuh`); the wide 64-row blocks (`qmma_*_m64w`, NVIDIA
/// sm_80+: `QmmaShape` in `kernels/qmma.cu`) take [`QMMA_WIDE`] instead.
const QMMA_BN: usize = 64;
const QMMA_THREADS: u32 = 128;
const QMMA_WIDE: (usize, u32) = (128, 256);
/// `QMMA_BK`, the k-tile every k must be a multiple of.
const QMMA_BK: usize = 128;
/// Blocks per SM a `qmma_*` launch aims for by splitting k (memory latency hides behind them).
const QMMA_WAVES: usize = 4;
/// Fewest k-tiles per split, and most splits, of a `qmma_*` launch.
const QMMA_MIN_SPLIT_TILES: usize = 2;
const QMMA_MAX_SPLITS: usize = 16;
/// Fewest rows whose add + RMSNorm after a split tiled matmul runs in its reduce (one block
/// per row there): H100, 8B Q4_K_M decode, against the reduce then `add_rms_norm`: batch 32
/// 9.07-9.09 -> 8.99-9.01 ms, 64 12.82-12.85 -> 12.74-12.79, but 16 6.35 -> 6.40 (16 blocks).
const QMMA_NORM_MIN_ROWS: usize = 32;
/// Most columns of that reduce: four chunks of 4 columns for each of 1024 threads, all in
/// registers between its two passes.
const QMMA_NORM_MAX_COLS: usize = 4 * 4 * 1024;
/// Most blocks per SM a 64-row `qmma_*` launch on tensor cores counts on when it splits k
/// (fewer where the kernel's registers allow fewer; `qmma_splits`).
const QMMA_RESIDENT_MAX: usize = 3;
/// 32-bit registers per SM (NVIDIA sm_80 to sm_90), and their allocation unit per warp.
const SM_REGS: usize = 65_536;
const WARP_REG_UNIT: usize = 256;

/// Most parts of a stacked weight in one `qdot_*` launch (`qdot_impl` in `kernels/qgemv.cu`).
const QDOT_PARTS: usize = 3;
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

/// Scratch bytes of `n` activation rows of `k` columns quantized to 8 bits: the values,
/// then at the next 256-byte boundary one (scale, sum) pair of f32 per 32.
pub(in crate::backend::gpu) fn qx_bytes(n: usize, k: usize) -> usize {
    (n * k).next_multiple_of(256) + n * (k / 32) * 8
}

/// The types whose batches take the 8-bit tiles (`qmma8_*`) by default, where they run
/// (NVIDIA sm_80+). Per layer of Llama-3-8B shape on an H100 (bench_quant_layer_matmuls,
/// us for rows 16 / 32 / 64 / 128), bf16 tiles against 8-bit tiles:
/// Q8_0 178 / 198 / 281 / 443 against 162 / 187 / 249 / 391; the Q4_K_M mix (Q4_K, with
/// Q6_K v and down) 159 / 195 / 267 / 420 against 187 / 222 / 311 / 501. The 8-bit tiles
/// scale the int32 sums of every output per 32 of k (x scale times weight scale, 3 f32
/// operations an output), where the bf16 tiles apply the scales once per weight: that
/// pays for itself where unpacking is cheap (Q8_0's bytes are its quants) and not where it
/// is not (the k-quants' 6-bit scales and mins, Q6_K's 16-element scales).
/// (A type added here also moves its `Kernel::Qmma8` into its own compile unit,
/// `Kernel::unit` in kernels.rs, so its models compile those kernels at start.)
const QMMA8_TYPES: [QType; 1] = [QType::Q8_0];

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

/// Whether a gate/up pair of type `q` on the tiles takes `qmmaglu_*` (the SiLU-mul in the
/// matmul) rather than the stacked launch and `silu_mul`: the types of [`QMMA_GLU_TYPES`]
/// that run on the bf16 tiles; `KILN_QMMA_GLU=0` never (measurements).
fn qmma_glu_takes(q: QType) -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("KILN_QMMA_GLU").as_deref() != Ok("0"))
        && QMMA_GLU_TYPES.contains(&q)
        && !qmma8_takes(q, false)
}

/// Whether a `qmma_*` launch of type `q` (`mix`: with a Q6_K part) takes the 8-bit tiles:
/// [`QMMA8_TYPES`], or as `KILN_QMMA8` says: `0` none (the bf16 tiles for every type),
/// `all` every type and mix.
fn qmma8_takes(q: QType, mix: bool) -> bool {
    static MODE: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    let mode = *MODE.get_or_init(|| match std::env::var("KILN_QMMA8").as_deref() {
        Ok("0") => Some(false),
        Ok("all") => Some(true),
        _ => None,
    });
    mode.unwrap_or(!mix && QMMA8_TYPES.contains(&q))
}

/// `a` for a `qdot_in_*` / `qdotmix_in_*` launch that finishes the norm `n`.
fn qdot_in_args(a: QdotArgs, n: NormIn) -> QdotInArgs {
    QdotInArgs {
        xq: a.xq,
        w0: a.w0,
        w1: a.w1,
        w2: a.w2,
        bias: a.bias,
        y: a.y,
        k: a.k,
        r0: a.r0,
        r1: a.r1,
        r2: a.r2,
        rows: a.rows,
        ldy: a.ldy,
        positions: a.positions,
        inv_freq: a.inv_freq,
        slots: a.slots,
        k_cache: a.k_cache,
        v_cache: a.v_cache,
        cbase: a.cbase,
        q_dim: a.q_dim,
        kv_dim: a.kv_dim,
        head_dim: a.head_dim,
        rot_dim: a.rot_dim,
        mscale: a.mscale,
        nss: n.ss,
        nres: n.add.residual,
        nw: n.add.w,
        nout: n.add.out,
        neps: n.add.eps,
    }
}

/// Weight rows per warp of `gemv_*_m{n}` (the instantiations in `kernels/gemv.cu`).
fn gemv_rows_per_warp(n: usize) -> usize {
    if n == 1 { 1 } else { 2 }
}

impl<R: Runtime> GpuBackend<R> {
    /// Whether `n` rows of `x` times `w` run on the streaming kernels of `kernels/gemv.cu`
    /// (faster than the BLAS for one or two rows): whole 16-byte chunks, aligned buffers.
    fn gemv_fits(&self, n: usize, x: &GpuTensor, w: &GpuWeight) -> bool {
        (1..=GEMV_MAX_ROWS).contains(&n)
            && self.switches.gemv
            && x.cols == w.cols
            && w.cols <= i32::MAX as usize
            && w.rows <= i32::MAX as usize
            && w.dense()
                .is_some_and(|b| self.whole_chunks(w.cols, &[x.buf.ptr(), b.ptr()]))
    }

    /// The row bucket of `kernels/qgemv.cu` for `n` rows of `x` times quantized `w`, when
    /// the streaming kernels take it: not while the bucket's 8-bit kernels (`qdot_*` of 2,
    /// 4 and 8 rows, compiled after start-up) still compile, so such a step dequantizes for
    /// the BLAS meanwhile rather than wait (or compile bf16's float-activation `qgemv_*`).
    pub(in crate::backend::gpu) fn qgemv_rows(
        &self,
        n: usize,
        x: &GpuTensor,
        w: &GpuWeight,
    ) -> Option<u32> {
        let fits = self.switches.gemv
            && x.cols == w.cols
            && w.rows <= i32::MAX as usize
            && w.parts.iter().all(|p| p.q.is_some())
            && self.whole_chunks(w.cols, &[x.buf.ptr()]);
        let compiling = |rows| {
            w.parts.iter().any(|p| {
                p.q.is_some_and(|q| self.kernels.pending(Kernel::Qdot { q, rows }.unit()))
            })
        };
        QGEMV_ROWS
            .into_iter()
            .find(|&r| r as usize >= n)
            .filter(|&r| fits && n > 0 && !compiling(r))
    }

    /// The row bucket of the 8-bit activation kernels (`qdot_*`), when they take the step:
    /// the streaming bucket, bf16, and a scratch that holds the quantized rows.
    pub(in crate::backend::gpu) fn qdot_rows(
        &self,
        n: usize,
        x: &GpuTensor,
        w: &GpuWeight,
    ) -> Option<u32> {
        let room = self.scratch.dequant.as_ref().map_or(0, |b| b.bytes());
        self.qgemv_rows(n, x, w).filter(|_| {
            self.dt == crate::backend::DType::Bf16
                && w.cols.is_multiple_of(32)
                && w.cols <= i32::MAX as usize
                && qx_bytes(n, w.cols) <= room
        })
    }

    /// Where a kernel that makes `n` rows of `cols` values may also leave them quantized
    /// for the decode matmul after it (bf16, up to 8 rows, whole blocks of 32): the dequant
    /// scratch, where `quantize_x` would put them.
    pub(in crate::backend::gpu) fn qx_slot(&self, n: usize, cols: usize) -> Option<u64> {
        let buf = self.scratch.dequant.as_ref()?;
        let fits = self.dt == crate::backend::DType::Bf16
            && (1..=QGEMV_ROWS[QGEMV_ROWS.len() - 1] as usize).contains(&n)
            && cols.is_multiple_of(32)
            && cols <= i32::MAX as usize
            && qx_bytes(n, cols) <= buf.bytes();
        fits.then(|| buf.ptr())
    }

    /// The 8-bit rows of `n` rows of `x` for a `qdot_*` launch: those the launch before left
    /// ([`QxRows`], with the norm the launch then finishes where it `takes_norm`: a one-row
    /// launch whose `*_in_*` entries are loaded), else quantized now by `quantize_x` (after
    /// any pending norm is settled).
    fn qx_of(
        &mut self,
        x: &GpuTensor,
        n: usize,
        takes_norm: bool,
    ) -> Result<(u64, Option<NormIn>), BackendError> {
        let want = (x.buf.ptr(), n, x.cols);
        match self.scratch.qx {
            Some(q) if (q.x, q.rows, q.cols) == want && (takes_norm || q.norm.is_none()) => {
                self.scratch.qx = None;
                Ok((q.at, q.norm))
            }
            _ => Ok((self.quantize_x(x, n)?, None)),
        }
    }

    /// Finishes what the last launch left for the next reader ([`QxRows::norm`]): the
    /// norm's output, by `rms_norm` of the residual (whose 8-bit rows are then the record);
    /// clears the record otherwise. Every launch, write, download and allocation calls it
    /// before touching the device.
    pub(in crate::backend::gpu) fn settle_qx(&mut self) -> Result<(), BackendError> {
        let Some(q) = self.scratch.qx.take() else {
            return Ok(());
        };
        let Some(ni) = q.norm else {
            return Ok(());
        };
        let an = ni.add;
        self.launch_norm_raw(an.residual, None, an.w, an.eps, q.rows, q.cols, an.out)
    }

    /// Quantizes `n` rows of `x` to 8-bit blocks of 32 in the dequant scratch (free during
    /// decode steps: the batch paths alone use it); returns its device address.
    fn quantize_x(&mut self, x: &GpuTensor, n: usize) -> Result<u64, BackendError> {
        let xq = self.scratch.dequant.as_ref().map_or(0, |b| b.ptr());
        let chunks = n * x.cols / 32;
        let args = QuantizeXArgs {
            x: x.buf.ptr(),
            xq,
            k: x.cols as i32,
            rows: n as i32,
        };
        let grid = Grid {
            blocks: (chunks.div_ceil(QX_THREADS) as u32, 1, 1),
            threads: QX_THREADS as u32,
        };
        self.launch_with(Kernel::QuantizeX, grid, &args)?;
        Ok(xq)
    }

    /// Where part `p`'s columns start in the bias and in `out`: (bias, y) device addresses
    /// (bias 0 without one).
    fn part_out(&self, p: &WeightPart, bias: Option<u64>, out: &GpuTensor) -> (u64, u64) {
        let at = p.row0 as u64 * self.dt.size() as u64;
        (bias.map_or(0, |b| b + at), out.buf.ptr() + at)
    }

    /// `out = x @ w^T (+ bias)` for `n` decode rows on `qdot_*` (`rows` bucket): one launch
    /// per run of up to [`QDOT_PARTS`] adjacent parts of one type, or of one or two parts
    /// of a [`QDOT_MIX_TYPES`] type and a Q6_K part after them (a Q4_K_M qkv: one launch).
    /// With `rope`, each launch also ropes and caches its qkv columns ([`QkvRope`]). Rows
    /// a `qdot_norm_*` launch left take its norm along ([`NormIn`]).
    #[allow(clippy::too_many_arguments)]
    pub(in crate::backend::gpu) fn launch_qdot(
        &mut self,
        x: &GpuTensor,
        w: &GpuWeight,
        bias: Option<u64>,
        n: usize,
        rows: u32,
        out: &GpuTensor,
        rope: Option<&QkvRope>,
    ) -> Result<(), BackendError> {
        // A one-row launch finishes a pending norm where its types' `*_in_*` entries loaded.
        let runs = part_runs(w);
        let takes = rows == 1
            && runs
                .iter()
                .all(|r| !self.kernels.pending(Kernel::QdotIn { q: r.q }.unit()));
        let (xq, ni) = self.qx_of(x, n, takes)?;
        let r = rope.copied().unwrap_or_default();
        for run in runs {
            let PartRun { q, mix, ref slots } = run;
            let (bias, y) = self.part_out(slots[0].1, bias, out);
            let ([w0, w1, w2], [r0, r1, r2]) = run.slot_args();
            let args = QdotArgs {
                positions: r.positions,
                inv_freq: r.inv_freq,
                slots: r.slots,
                k_cache: r.k_cache,
                v_cache: r.v_cache,
                cbase: slots[0].1.row0 as i32,
                q_dim: r.q_dim,
                kv_dim: r.kv_dim,
                head_dim: r.head_dim,
                rot_dim: r.rot_dim,
                mscale: r.mscale,
                w0,
                w1,
                w2,
                r0,
                r1,
                r2,
                xq,
                bias,
                y,
                k: w.cols as i32,
                rows: n as i32,
                ldy: w.rows as i32,
            };
            let warps: usize = slots
                .iter()
                .map(|(_, p)| p.rows.div_ceil(QGEMV_ROWS_PER_WARP))
                .sum();
            let kernel = if mix {
                Kernel::QdotMix { q, rows }
            } else {
                Kernel::Qdot { q, rows }
            };
            let grid = self.gemv_grid(warps.div_ceil(GEMV_WARPS));
            match ni {
                Some(ni) => {
                    let kernel = if mix {
                        Kernel::QdotMixIn { q }
                    } else {
                        Kernel::QdotIn { q }
                    };
                    let args = qdot_in_args(args, ni);
                    self.launch_with(kernel, grid, &args)?;
                }
                None => self.launch_with(kernel, grid, &args)?,
            }
        }
        Ok(())
    }

    /// `residual += x @ w^T` for one decode row on `qdot_norm_*` (a one-part weight of `h`
    /// rows, 32 output columns a block), which also leaves the RMSNorm (weight `norm`) to the
    /// next quantized matmul: per 32 columns `residual * norm` as 8-bit rows in the dequant
    /// scratch after the launch's own input (which it reads meanwhile), and the sum of
    /// `residual^2` after those ([`NormIn`]; `out` is written by that matmul or by
    /// [`GpuBackend::settle_qx`]). Not taken (`Ok(false)`): outside a step
    /// ([`GpuBackend::fuse_across_ops`]: the runner's tensors outlive the pending norm), for
    /// other rows, weights or widths, without room, or with `KILN_QDOT_NORM=0`.
    pub(in crate::backend::gpu) fn launch_qdot_norm(
        &mut self,
        x: &GpuTensor,
        w: &GpuWeight,
        n: usize,
        an: AddNorm,
        h: usize,
    ) -> Result<bool, BackendError> {
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let on = *ON.get_or_init(|| std::env::var("KILN_QDOT_NORM").as_deref() != Ok("0"));
        // Q5_K's decode registers (about 160) do not fit a block of 512 threads unspilled.
        let q = match w.parts.as_slice() {
            [p] if p.rows == h => p.q.filter(|&q| q != QType::Q5K),
            _ => None,
        };
        let (Some(q), Some(scratch)) = (q, self.scratch.dequant.as_ref()) else {
            return Ok(false);
        };
        let off = qx_bytes(n, x.cols).next_multiple_of(256);
        let ss_off = off + qx_bytes(n, h).next_multiple_of(256);
        let fits = on
            && self.scratch.fuse_across_ops
            && n == 1
            && h.is_multiple_of(32)
            && ss_off + 4 * n * (h / 32) <= scratch.bytes()
            && self.qdot_rows(n, x, w) == Some(1)
            && !self.kernels.pending(Kernel::QdotNorm { q }.unit());
        if !fits {
            return Ok(false);
        }
        let (oxq, oss) = (scratch.ptr() + off as u64, scratch.ptr() + ss_off as u64);
        // This launch finishes no norm: one left pending is settled first.
        let (xq, _) = self.qx_of(x, n, false)?;
        let args = QdotNormArgs {
            xq,
            w: w.parts[0].buf.ptr(),
            k: x.cols as i32,
            h: h as i32,
            rows: n as i32,
            res: an.residual,
            nw: an.w,
            oxq,
            oss,
        };
        let warp = self.dev.info.warp_size as u32;
        let grid = Grid {
            blocks: ((h / 32) as u32, 1, 1),
            threads: QDOT_NORM_WARPS * warp,
        };
        self.launch_with(Kernel::QdotNorm { q }, grid, &args)?;
        self.scratch.qx = Some(QxRows {
            x: an.out,
            rows: n,
            cols: h,
            at: oxq,
            norm: Some(NormIn { ss: oss, add: an }),
        });
        Ok(true)
    }

    /// The row tile of `kernels/qmma.cu` for `n` rows of `x` times quantized `w`, when the
    /// tiled kernel takes it (bf16 compute, a warp of 32, whole k-tiles, its compile units
    /// loaded: right after start-up they may still compile, and batches dequantize for the
    /// BLAS meanwhile).
    pub(in crate::backend::gpu) fn qmma_rows(
        &self,
        n: usize,
        x: &GpuTensor,
        w: &GpuWeight,
    ) -> Option<u32> {
        let unit = |part| Unit {
            src: Source::Qmma,
            part,
        };
        let compiling = self.kernels.pending(unit(Part::Common))
            || w.parts
                .iter()
                .any(|p| p.q.is_some_and(|q| self.kernels.pending(unit(Part::Q(q)))));
        let fits = !compiling
            && self.switches.gemv
            && self.dt == crate::backend::DType::Bf16
            && self.dev.info.warp_size == 32
            && x.cols == w.cols
            && w.cols.is_multiple_of(QMMA_BK)
            && w.rows <= i32::MAX as usize
            && w.parts.iter().all(|p| p.q.is_some())
            && self.whole_chunks(w.cols, &[x.buf.ptr()]);
        let last = QMMA_ROWS[QMMA_ROWS.len() - 1];
        let tile = QMMA_ROWS
            .into_iter()
            .find(|&r| r as usize >= n)
            .unwrap_or(last);
        Some(tile).filter(|_| fits && n > 0 && n <= QMMA_MAX_ROWS)
    }

    /// Whether `n` rows of `k` columns may take the 8-bit tiled kernels (`qmma8_*`): on
    /// NVIDIA sm_80 or newer (int8 `mma.sync`; elsewhere the bf16 tiles stay), with room for
    /// the 8-bit rows in the dequant scratch. Returns the scratch bytes they take (the
    /// split-k partials follow them). Which launches take them: [`qmma8_takes`].
    fn qmma8_bytes(&self, n: usize, k: usize) -> Option<usize> {
        let sm80 = self.qmma_tc();
        let room = self.scratch.dequant.as_ref().map_or(0, |b| b.bytes());
        let bytes = qx_bytes(n, k).next_multiple_of(256);
        (sm80 && k.is_multiple_of(32) && bytes <= room).then_some(bytes)
    }

    /// Whether the tiled kernels run on tensor cores (`KILN_QMMA_TC` in `kernels/qmma.cuh`):
    /// NVIDIA sm_80 or newer.
    fn qmma_tc(&self) -> bool {
        R::NAME == "cuda"
            && self
                .dev
                .info
                .arch
                .strip_prefix("sm_")
                .and_then(|a| {
                    a.trim_end_matches(|c: char| c.is_ascii_alphabetic())
                        .parse::<u32>()
                        .ok()
                })
                .is_some_and(|a| a >= 80)
    }

    /// Whether a bf16 `qmma_*` launch at row tile `tile` of `cols` output columns takes the
    /// wide blocks ([`QMMA_WIDE`]): 64 rows on tensor cores, with at least one wide block per
    /// two SMs before splitting k. On an H100 at 64 rows they are faster for the gate and up
    /// (14336 rows alone: 59.6 -> 53.4 us; a Llama-3-8B Q4_K_M step at batch 64, where the
    /// stacked gate/up is the only wide launch: 14.28 -> 13.40 ms) and slower for 4096
    /// columns (down 56.7 -> 71.8 us: fewer blocks in flight). `KILN_QMMA_WIDE`: `0` never,
    /// `all` at every 64-row launch (tests of the wide kernels on small shapes).
    fn qmma_wide(&self, tile: u32, cols: usize) -> bool {
        static MODE: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
        let mode = *MODE.get_or_init(|| match std::env::var("KILN_QMMA_WIDE").as_deref() {
            Ok("0") => Some(false),
            Ok("all") => Some(true),
            _ => None,
        });
        tile == 64
            && self.qmma_tc()
            && mode.unwrap_or(2 * cols.div_ceil(QMMA_WIDE.0) >= self.dev.info.sm_count)
    }

    /// How many k-ranges (grid z) a `qmma_*` launch of `blocks` blocks of `threads` splits `k`
    /// into: enough for [`QMMA_WAVES`] blocks of [`QMMA_THREADS`] per SM (fewer larger
    /// blocks: as many threads), each split at least [`QMMA_MIN_SPLIT_TILES`] k-tiles,
    /// at most [`QMMA_MAX_SPLITS`], and the f32 partials of `outputs` values each fitting the
    /// dequant scratch past its first `used` bytes (free during these launches; 1 without it).
    ///
    /// `resident`: at 64 rows on tensor cores, the blocks of this kernel one SM holds (its
    /// registers: `qmma_resident`). Those launches split into as many ranges as fit
    /// one wave of resident blocks instead (rounded down: a few blocks past a full wave run
    /// alone after it). On an H100, Llama-3-8B Q4_K_M at batch 64: 13.39 -> 13.16 ms per
    /// step (qkv 3 -> 4 splits, o_proj and down 5 -> 6; the wide gate/up stay whole), Q8_0
    /// 14.27 -> 14.02 ms.
    #[allow(clippy::too_many_arguments)]
    fn qmma_splits(
        &self,
        blocks: usize,
        threads: u32,
        k: usize,
        outputs: usize,
        tile: u32,
        used: usize,
        resident: Option<usize>,
    ) -> usize {
        let room = self
            .scratch
            .dequant
            .as_ref()
            .map_or(0, |b| b.bytes().saturating_sub(used))
            / (4 * outputs.max(1));
        // Larger row tiles do more per k-tile and need fewer blocks in flight (H100: 32 and 64
        // rows were 6-7% faster at 2 than at 4 blocks per SM, 16 rows 4% slower).
        let waves = if tile >= 32 {
            QMMA_WAVES / 2
        } else {
            QMMA_WAVES
        };
        let waves = (waves * QMMA_THREADS as usize).div_ceil(threads as usize);
        let want = match resident {
            Some(r) if tile == 64 => (r * self.dev.info.sm_count / blocks.max(1)).max(1),
            _ => (waves * self.dev.info.sm_count).div_ceil(blocks.max(1)),
        };
        let most = (k / QMMA_BK / QMMA_MIN_SPLIT_TILES)
            .min(QMMA_MAX_SPLITS)
            .min(room);
        let splits = want.min(most).max(1);
        // Equal ranges of whole tiles: no split is left empty.
        let per = (k / QMMA_BK).div_ceil(splits);
        (k / QMMA_BK).div_ceil(per.max(1)).max(1)
    }

    /// Blocks of `threads` threads of kernel `k` one SM holds by its registers, at most
    /// [`QMMA_RESIDENT_MAX`] (NVIDIA tensor cores only; None elsewhere or when the driver
    /// does not say). Asked of the driver once per kernel and block size.
    fn qmma_resident(&mut self, k: Kernel, threads: u32) -> Result<Option<usize>, BackendError> {
        if !self.qmma_tc() {
            return Ok(None);
        }
        if let Some(&fit) = self.qmma_resident.get(&(k, threads)) {
            return Ok(fit);
        }
        let fit = self.qmma_resident_of(k, threads)?;
        self.qmma_resident.insert((k, threads), fit);
        Ok(fit)
    }

    fn qmma_resident_of(&self, k: Kernel, threads: u32) -> Result<Option<usize>, BackendError> {
        let f = self.kernels.get(&self.dev.rt, k)?;
        let (regs, _, _) = self.dev.rt.resources(f);
        let Ok(regs) = usize::try_from(regs) else {
            return Ok(None);
        };
        let warps = (threads as usize).div_ceil(self.dev.info.warp_size);
        let per_warp = (regs * self.dev.info.warp_size).next_multiple_of(WARP_REG_UNIT);
        let fit = SM_REGS / (per_warp * warps).max(1);
        Ok((fit > 0).then_some(fit.min(QMMA_RESIDENT_MAX)))
    }

    fn gemv_grid(&self, blocks: usize) -> Grid {
        Grid {
            blocks: (blocks as u32, 1, 1),
            threads: (GEMV_WARPS * self.dev.info.warp_size) as u32,
        }
    }

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
        let Some(wbuf) = w.dense() else {
            return self.launch_qmatmul(x, w, bias, n, out);
        };
        if m > 0 && self.gemv_fits(n, x, w) {
            let per_block = GEMV_WARPS * gemv_rows_per_warp(n);
            let args = GemvArgs {
                x: x.buf.ptr(),
                w: wbuf.ptr(),
                bias: bias.unwrap_or(0),
                y: out.buf.ptr(),
                k: k as i32,
                n: m as i32,
            };
            return self.launch_with(
                Kernel::Gemv { rows: n as u32 },
                self.gemv_grid(m.div_ceil(per_block)),
                &args,
            );
        }
        self.gemm(x.buf.ptr(), wbuf.ptr(), out.buf.ptr(), n, k, m)?;
        self.add_bias(out, bias, n, m)
    }

    /// `out[n, m] = x[n, k] @ w[m, k]^T` on the BLAS (device addresses).
    pub(in crate::backend::gpu) fn gemm(
        &mut self,
        x: u64,
        w: u64,
        out: u64,
        n: usize,
        k: usize,
        m: usize,
    ) -> Result<(), BackendError> {
        if n == 0 || m == 0 {
            return Ok(());
        }
        if [n, k, m].iter().any(|&v| v > i32::MAX as usize) {
            return Err(invalid(format!("GEMM {n}x{k}x{m} too large")));
        }
        self.settle_qx()?;
        let (blas, dt) = (&self.blas, self.dt);
        // SAFETY: the callers pass x of n*k, w of m*k and out of n*m elements of `dt` (shapes
        // checked by them); all three buffers are live.
        self.dev.timed("matmul", |rt| unsafe {
            rt.gemm(blas, dt, x, w, out, n, k, m)
                .map_err(runtime::dev_err("matmul"))
        })
    }

    fn add_bias(
        &mut self,
        out: &GpuTensor,
        bias: Option<u64>,
        n: usize,
        m: usize,
    ) -> Result<(), BackendError> {
        let Some(bias) = bias else { return Ok(()) };
        let total = n * m;
        if total == 0 {
            return Ok(());
        }
        let grid = Grid {
            blocks: (total.div_ceil(256).min(65535) as u32, 1, 1),
            threads: 256,
        };
        let args = AddBiasArgs {
            x: out.buf.ptr(),
            bias,
            cols: m as i32,
            total: total as u64,
        };
        self.launch_with(Kernel::AddBias, grid, &args)
    }

    /// [`GpuBackend::launch_matmul`] of a quantized weight (shapes checked by the caller).
    fn launch_qmatmul(
        &mut self,
        x: &GpuTensor,
        w: &GpuWeight,
        bias: Option<u64>,
        n: usize,
        out: &mut GpuTensor,
    ) -> Result<(), BackendError> {
        let (m, k) = (w.rows, w.cols);
        if m > 0
            && let Some(rows) = self.qdot_rows(n, x, w)
        {
            return self.launch_qdot(x, w, bias, n, rows, out, None);
        }
        if let Some(rows) = self.qgemv_rows(n, x, w) {
            // Two weight rows per warp at every row bucket (`KILN_QGEMV_T` in kernels/qgemv.cu).
            let per_block = GEMV_WARPS * QGEMV_ROWS_PER_WARP;
            for p in &w.parts {
                let Some(q) = p.q else { continue };
                let (bias, y) = self.part_out(p, bias, out);
                let args = QgemvArgs {
                    w: p.buf.ptr(),
                    x: x.buf.ptr(),
                    bias,
                    y,
                    k: k as i32,
                    n: p.rows as i32,
                    rows: n as i32,
                    ldy: m as i32,
                };
                let grid = self.gemv_grid(p.rows.div_ceil(per_block));
                self.launch_with(Kernel::Qgemv { q, rows }, grid, &args)?;
            }
            return Ok(());
        }
        if n == 0 || m == 0 {
            return Ok(());
        }
        if let Some(rows) = self.qmma_rows(n, x, w) {
            self.launch_qmma(x, w, bias, n, rows, out, QmmaTail::None)?;
            return Ok(());
        }
        let scratch = self.dequantize_into_scratch(w)?;
        self.gemm(x.buf.ptr(), scratch, out.buf.ptr(), n, k, m)?;
        self.add_bias(out, bias, n, m)
    }

    /// `out = x @ w^T (+ bias)` for `n` rows on the tiled kernels (`qmma_*`, row tile `rows`;
    /// shapes checked by the caller): one launch per run of parts, each with its split-k
    /// reduce. A run that is the whole matrix and splits k also does `tail`'s work in its
    /// reduce: the qkv's rope and cache write (`qmma_reduce_rope`), or the residual add and
    /// RMSNorm after the matmul (`qmma_reduce_add_norm`, `out` then unwritten). Returns
    /// whether it did, else the caller still has that to do.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::backend::gpu) fn launch_qmma(
        &mut self,
        x: &GpuTensor,
        w: &GpuWeight,
        bias: Option<u64>,
        n: usize,
        rows: u32,
        out: &GpuTensor,
        tail: QmmaTail<'_>,
    ) -> Result<bool, BackendError> {
        let (m, k) = (w.rows, w.cols);
        let mut done = false;
        // The 8-bit path quantizes x once for every run, at the scratch's start.
        let runs = part_runs(w);
        let qx8 = if runs.iter().any(|r| qmma8_takes(r.q, r.mix)) {
            self.qmma8_bytes(n, k)
        } else {
            None
        };
        let xq = match qx8 {
            Some(_) => Some(self.quantize_x(x, n)?),
            None => None,
        };
        let used = qx8.unwrap_or(0);
        let scratch = self.scratch.dequant.as_ref().map_or(0, |b| b.ptr());
        for run in runs {
            let PartRun { q, mix, ref slots } = run;
            let (bias, y) = self.part_out(slots[0].1, bias, out);
            let ([w0, w1, w2], [r0, r1, r2]) = run.slot_args();
            let xq = xq.filter(|_| qmma8_takes(q, mix));
            let args = QmmaArgs {
                w0,
                w1,
                w2,
                r0,
                r1,
                r2,
                x: xq.unwrap_or(x.buf.ptr()),
                bias,
                y,
                ws: scratch + used as u64,
                k: k as i32,
                rows: n as i32,
                ldy: m as i32,
            };
            let cols: usize = slots.iter().map(|(_, p)| p.rows).sum();
            let wide = xq.is_none() && self.qmma_wide(rows, cols);
            let (bn, threads) = if wide {
                QMMA_WIDE
            } else {
                (QMMA_BN, QMMA_THREADS)
            };
            let blocks: usize = slots.iter().map(|(_, p)| p.rows.div_ceil(bn)).sum();
            let tiles = (blocks, n.div_ceil(rows as usize));
            let kernel = match (mix, xq.is_some()) {
                (true, false) => Kernel::QmmaMix { q, rows, wide },
                (false, false) => Kernel::Qmma { q, rows, wide },
                (true, true) => Kernel::Qmma8Mix { q, rows },
                (false, true) => Kernel::Qmma8 { q, rows },
            };
            let resident = if rows == 64 {
                self.qmma_resident(kernel, threads)?
            } else {
                None
            };
            let splits = self.qmma_splits(
                tiles.0 * tiles.1,
                threads,
                k,
                n * cols,
                rows,
                used,
                resident,
            );
            let grid = Grid {
                blocks: (tiles.0 as u32, tiles.1 as u32, splits as u32),
                threads,
            };
            self.launch_with(kernel, grid, &args)?;
            let whole = cols == m && slots[0].1.row0 == 0;
            if let (true, true, QmmaTail::AddNorm(an)) = (splits > 1, whole, &tail)
                && args.bias == 0
            {
                let reduce = QmmaReduceAddNormArgs {
                    ws: args.ws,
                    residual: an.residual,
                    w: an.w,
                    out: an.out,
                    h: cols as i32,
                    rows: args.rows,
                    splits: splits as i32,
                    eps: an.eps,
                };
                // A 4-column chunk a thread (up to four past 1024 threads: QMMA_NORM_MAX_COLS).
                let threads = (cols / 4)
                    .next_multiple_of(self.dev.info.warp_size)
                    .clamp(64, 1024);
                let grid = Grid {
                    blocks: (n as u32, 1, 1),
                    threads: threads as u32,
                };
                self.launch_with(Kernel::QmmaReduceAddNorm, grid, &reduce)?;
                self.scratch.qx = None;
                done = true;
            } else if splits > 1
                && whole
                && let QmmaTail::Rope(ro) = tail
            {
                // The whole qkv in one launch: its reduce ropes and caches too.
                let reduce = QmmaReduceRopeArgs {
                    ws: args.ws,
                    bias: args.bias,
                    y: args.y,
                    n: cols as i32,
                    rows: args.rows,
                    ldy: args.ldy,
                    splits: splits as i32,
                    positions: ro.positions,
                    inv_freq: ro.inv_freq,
                    slots: ro.slots,
                    k_cache: ro.k_cache,
                    v_cache: ro.v_cache,
                    q_dim: ro.q_dim,
                    kv_dim: ro.kv_dim,
                    head_dim: ro.head_dim,
                    rot_dim: ro.rot_dim,
                    interleaved: ro.interleaved as i32,
                    mscale: ro.mscale,
                };
                let grid = Grid {
                    blocks: (cols.div_ceil(512) as u32, n as u32, 1),
                    threads: 256,
                };
                self.launch_with(Kernel::QmmaReduceRope, grid, &reduce)?;
                done = true;
            } else if splits > 1 {
                // The stream orders this before the next launch's partials reuse `ws`.
                let reduce = QmmaReduceArgs {
                    ws: args.ws,
                    bias: args.bias,
                    y: args.y,
                    n: cols as i32,
                    rows: args.rows,
                    ldy: args.ldy,
                    splits: splits as i32,
                };
                let grid = Grid {
                    blocks: (cols.div_ceil(256) as u32, n as u32, 1),
                    threads: 256,
                };
                self.launch_with(Kernel::QmmaReduce, grid, &reduce)?;
            }
        }
        Ok(done)
    }

    /// Dequantizes every part of `w` into the scratch (`[rows, cols]` of the compute type);
    /// returns its device address.
    fn dequantize_into_scratch(&mut self, w: &GpuWeight) -> Result<u64, BackendError> {
        let (m, k) = (w.rows, w.cols);
        let size = self.dt.size();
        let scratch = match &self.scratch.dequant {
            Some(b) if b.bytes() >= m * k * size => b.ptr(),
            _ => return Err(invalid(format!("no dequant scratch for a {m}x{k} weight"))),
        };
        for p in &w.parts {
            let at = scratch + (p.row0 * k * size) as u64;
            self.launch_dequant(p, k, None, p.rows, at, k)?;
        }
        Ok(scratch)
    }

    pub(in crate::backend::gpu) fn launch_silu_mul(
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
            let args = SiluMulVecArgs {
                gu: gate_up.buf.ptr(),
                out: out.buf.ptr(),
                f: f as i32,
                n: n as i32,
            };
            return self.launch_with(Kernel::SiluMulVec, grid, &args);
        }
        let total = n * f;
        let grid = Grid {
            blocks: (total.div_ceil(256).min(65535) as u32, 1, 1),
            threads: 256,
        };
        let args = SiluMulArgs {
            gu: gate_up.buf.ptr(),
            out: out.buf.ptr(),
            f: f as i32,
            total: total as u64,
        };
        self.launch_with(Kernel::SiluMul, grid, &args)
    }

    pub(in crate::backend::gpu) fn launch_matmul_silu_mul(
        &mut self,
        x: &GpuTensor,
        w_gate_up: &GpuWeight,
        n: usize,
        gate_up: &mut GpuTensor,
        act: &mut GpuTensor,
    ) -> Result<(), BackendError> {
        let f = act.cols;
        if w_gate_up.dense().is_none() {
            return self.launch_qmatmul_silu_mul(x, w_gate_up, n, gate_up, act);
        }
        if !self.gemv_fits(n, x, w_gate_up) {
            self.launch_matmul(x, w_gate_up, None, n, gate_up)?;
            return self.launch_silu_mul(gate_up, n, act);
        }
        check_cols("matmul_silu_mul input", x.cols, w_gate_up.cols)?;
        check_cols("matmul_silu_mul weight", w_gate_up.rows, 2 * f)?;
        check_rows("matmul_silu_mul", n, x.rows.min(act.rows))?;
        let args = GemvSiluMulArgs {
            x: x.buf.ptr(),
            w: w_gate_up.dense().map_or(0, |b| b.ptr()),
            y: act.buf.ptr(),
            k: w_gate_up.cols as i32,
            f: f as i32,
        };
        // One warp per output column (a gate row and its up row).
        self.launch_with(
            Kernel::GemvSiluMul { rows: n as u32 },
            self.gemv_grid(f.div_ceil(GEMV_WARPS)),
            &args,
        )
    }

    /// [`GpuBackend::launch_matmul_silu_mul`] of a quantized weight: gate and up parts of one
    /// type stream through the fused kernel; anything else runs the matmul, then SiLU-mul.
    fn launch_qmatmul_silu_mul(
        &mut self,
        x: &GpuTensor,
        w: &GpuWeight,
        n: usize,
        gate_up: &mut GpuTensor,
        act: &mut GpuTensor,
    ) -> Result<(), BackendError> {
        let f = act.cols;
        check_cols("matmul_silu_mul input", x.cols, w.cols)?;
        check_cols("matmul_silu_mul weight", w.rows, 2 * f)?;
        check_rows("matmul_silu_mul", n, x.rows.min(act.rows))?;
        let pair = match w.parts.as_slice() {
            [g, u] if g.q == u.q && g.rows == f && u.rows == f => g.q.map(|q| (g, u, q)),
            _ => None,
        };
        let Some((g, u, q)) = pair else {
            self.launch_matmul(x, w, None, n, gate_up)?;
            return self.launch_silu_mul(gate_up, n, act);
        };
        let Some(rows) = self.qgemv_rows(n, x, w) else {
            if let Some(rows) = self.qmma_rows(n, x, w).filter(|_| qmma_glu_takes(q)) {
                return self.launch_qmma_glu(x, [g, u], q, n, rows, act);
            }
            self.launch_matmul(x, w, None, n, gate_up)?;
            return self.launch_silu_mul(gate_up, n, act);
        };
        // One warp per output column (a gate row and its up row).
        let grid = self.gemv_grid(f.div_ceil(GEMV_WARPS));
        if let Some(rows) = self.qdot_rows(n, x, w) {
            let takes = rows == 1 && !self.kernels.pending(Kernel::QdotSiluIn { q }.unit());
            let (xq, ni) = self.qx_of(x, n, takes)?;
            let args = QdotSiluArgs {
                xq,
                wg: g.buf.ptr(),
                wu: u.buf.ptr(),
                y: act.buf.ptr(),
                k: w.cols as i32,
                f: f as i32,
                rows: n as i32,
                ldy: f as i32,
            };
            if let Some(ni) = ni {
                let a = args;
                let args = QdotSiluInArgs {
                    xq: a.xq,
                    wg: a.wg,
                    wu: a.wu,
                    y: a.y,
                    k: a.k,
                    f: a.f,
                    rows: a.rows,
                    ldy: a.ldy,
                    nss: ni.ss,
                    nres: ni.add.residual,
                    nw: ni.add.w,
                    nout: ni.add.out,
                    neps: ni.add.eps,
                };
                return self.launch_with(Kernel::QdotSiluIn { q }, grid, &args);
            }
            return self.launch_with(Kernel::QdotSilu { q, rows }, grid, &args);
        }
        let args = QgemvSiluArgs {
            wg: g.buf.ptr(),
            wu: u.buf.ptr(),
            x: x.buf.ptr(),
            y: act.buf.ptr(),
            k: w.cols as i32,
            f: f as i32,
            rows: n as i32,
            ldy: f as i32,
        };
        self.launch_with(Kernel::QgemvSilu { q, rows }, grid, &args)
    }

    /// The gate/up product and SiLU-mul of `n` rows on the tiled kernels (`qmmaglu_*`, row
    /// tile `rows`; parts checked by the caller): the blocks, wide blocks and k splits of the
    /// stacked gate/up launch (`launch_qmma`), each block pairing its gate and up rows, and
    /// with k split, the reduce that takes the SiLU.
    fn launch_qmma_glu(
        &mut self,
        x: &GpuTensor,
        [g, u]: [&WeightPart; 2],
        q: QType,
        n: usize,
        rows: u32,
        act: &GpuTensor,
    ) -> Result<(), BackendError> {
        let (k, f) = (x.cols, g.rows);
        let wide = self.qmma_wide(rows, 2 * f);
        let (bn, threads) = if wide {
            QMMA_WIDE
        } else {
            (QMMA_BN, QMMA_THREADS)
        };
        let tiles = (f.div_ceil(bn / 2), n.div_ceil(rows as usize));
        let kernel = Kernel::QmmaGlu { q, rows, wide };
        let resident = if rows == 64 {
            self.qmma_resident(kernel, threads)?
        } else {
            None
        };
        let splits = self.qmma_splits(tiles.0 * tiles.1, threads, k, n * 2 * f, rows, 0, resident);
        let args = QmmaGluArgs {
            wg: g.buf.ptr(),
            wu: u.buf.ptr(),
            x: x.buf.ptr(),
            y: act.buf.ptr(),
            ws: self.scratch.dequant.as_ref().map_or(0, |b| b.ptr()),
            k: k as i32,
            f: f as i32,
            rows: n as i32,
            ldy: act.cols as i32,
        };
        let grid = Grid {
            blocks: (tiles.0 as u32, tiles.1 as u32, splits as u32),
            threads,
        };
        self.launch_with(kernel, grid, &args)?;
        if splits > 1 {
            let reduce = QmmaReduceGluArgs {
                ws: args.ws,
                y: args.y,
                f: args.f,
                rows: args.rows,
                ldy: args.ldy,
                splits: splits as i32,
            };
            let grid = Grid {
                blocks: (f.div_ceil(256) as u32, n as u32, 1),
                threads: 256,
            };
            self.launch_with(Kernel::QmmaReduceGlu, grid, &reduce)?;
        }
        Ok(())
    }

    /// `delta = x @ w^T; residual += delta; out = rmsnorm(residual) * norm_w` over `n` rows.
    /// A quantized weight on the tiles whose launch splits k, at [`QMMA_NORM_MIN_ROWS`] rows
    /// or more, does the add and the norm in its reduce (`qmma_reduce_add_norm`; `delta` is
    /// then not written); anything else runs the matmul, then the fused add + norm.
    /// `KILN_QMMA_NORM=0`: never in the reduce.
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
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let on = *ON.get_or_init(|| std::env::var("KILN_QMMA_NORM").as_deref() != Ok("0"));
        matmul_operands(x, w, None, n, delta)?;
        let h = w.rows;
        check_cols("add_rms_norm residual", residual.cols, h)?;
        check_rows("add_rms_norm residual", n, residual.rows)?;
        check_cols("rms_norm weight", norm_w.rows * norm_w.cols, h)?;
        check_cols("rms_norm output", out.cols, h)?;
        check_rows("rms_norm", n, out.rows)?;
        if let Some(nw) = norm_w.dense() {
            let an = AddNorm {
                residual: residual.buf.ptr(),
                w: nw.ptr(),
                out: out.buf.ptr(),
                eps,
            };
            if self.launch_qdot_norm(x, w, n, an, h)? {
                return Ok(());
            }
        }
        // Rows the decode kernels take (`qdot_rows` is a subset) stay with them, as in
        // `launch_qmatmul`; the reduce holds a row in registers (`QRN_CACHE` in qmma.cu).
        let eligible = on
            && w.dense().is_none()
            && n >= QMMA_NORM_MIN_ROWS
            && h.is_multiple_of(4)
            && h <= QMMA_NORM_MAX_COLS
            && self.qgemv_rows(n, x, w).is_none();
        let tiles = if eligible {
            self.qmma_rows(n, x, w)
        } else {
            None
        };
        if let (Some(rows), Some(nw)) = (tiles, norm_w.dense()) {
            let an = AddNorm {
                residual: residual.buf.ptr(),
                w: nw.ptr(),
                out: out.buf.ptr(),
                eps,
            };
            if self.launch_qmma(x, w, None, n, rows, delta, QmmaTail::AddNorm(an))? {
                return Ok(());
            }
        } else {
            self.launch_matmul(x, w, None, n, delta)?;
        }
        self.launch_norm(delta, Some(residual.buf.ptr()), norm_w, eps, n, out)
    }
}
