//! Which kernels a matmul takes, as a value: [`MatmulPath`] (and the fused paths' routes,
//! [`GluPath`], [`NormPath`], [`QkvPath`]) from plain facts only — the rows, the weight's
//! part types and shape, the storage type, the device's [`Caps`], the [`GpuTuning`], the
//! dequant scratch's room and which compile units are still pending. The launchers, rope's
//! fused qkv path and the tests (the table below) ask the same functions; the compile
//! planner's side of it is [`routes_around`].

use crate::backend::DType;
use crate::backend::gpu::caps::Caps;
use crate::backend::gpu::kernels::{
    GEMV_MAX_ROWS, Kernel, Part, QDOT_MIX_TYPES, QGEMV_ROWS, QMMA_GLU_TYPES, QMMA_ROWS, Source,
};
use crate::backend::gpu::qtype::QType;
use crate::backend::gpu::qweight::WeightPart;
use crate::backend::gpu::registry::Unit;
use crate::backend::tuning::GpuTuning;

use super::geometry::{
    QDOT_PARTS, QMMA_BK, QMMA_KTAIL_TYPES, QMMA_MAX_ROWS, QMMA_NORM_MAX_COLS, QMMA_NORM_MIN_ROWS,
    QMMA_WIDE, qx_bytes,
};

/// One row range of a weight as routes see it: its type (`None`: compute-type elements),
/// first row and row count. [`WeightPart`] is one; tests build their own.
pub(in crate::backend::gpu) trait PartFacts {
    fn q(&self) -> Option<QType>;
    fn row0(&self) -> usize;
    fn rows(&self) -> usize;
}

impl PartFacts for WeightPart {
    fn q(&self) -> Option<QType> {
        self.q
    }
    fn row0(&self) -> usize {
        self.row0
    }
    fn rows(&self) -> usize {
        self.rows
    }
}

/// The operands of `x[n, k] @ w[m, k]^T` a route reads.
pub(in crate::backend::gpu) struct Operands<'a, P> {
    pub n: usize,
    /// `x`'s columns (a route checks them against `w_cols`; the launchers have already).
    pub x_cols: usize,
    /// `w`'s rows (`m`, output columns) and columns (`k`).
    pub w_rows: usize,
    pub w_cols: usize,
    pub parts: &'a [P],
    /// `x`'s device address starts a 16-byte chunk.
    pub x_aligned: bool,
    /// A dense weight's device address starts a 16-byte chunk (true for quantized ones).
    pub w_aligned: bool,
}

impl<P: PartFacts> Operands<'_, P> {
    /// The buffer is one part of compute-type elements ([`GpuWeight::dense`]).
    ///
    /// [`GpuWeight::dense`]: crate::backend::gpu::GpuWeight
    pub fn dense(&self) -> bool {
        matches!(self.parts, [p] if p.q().is_none())
    }

    fn quantized(&self) -> bool {
        self.parts.iter().all(|p| p.q().is_some())
    }
}

/// What a route may ask besides the operands: storage type, device, switches, the dequant
/// scratch's bytes (0 without one) and `pending(unit)`: whether a compile unit is still
/// compiling (`Kernels::pending`), so a step takes another path rather than wait.
pub(in crate::backend::gpu) struct Route<'a, F> {
    pub dt: DType,
    pub caps: &'a Caps,
    pub tuning: &'a GpuTuning,
    /// The streaming kernels are on ([`GpuOptions::gemv`](crate::backend::GpuOptions)).
    pub gemv: bool,
    pub room: usize,
    pub pending: F,
}

/// The kernels one matmul `out = x @ w^T (+ bias)` launches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::backend::gpu) enum MatmulPath {
    /// A dense weight streamed by `gemv_*_m{rows}` (1-2 rows).
    Gemv { rows: u32 },
    /// A dense weight on the BLAS GEMM, then the bias.
    Blas,
    /// A quantized weight streamed on 8-bit activations (`qdot_*`, bf16) at row bucket
    /// `rows`, one launch per run of parts.
    Qdot { rows: u32 },
    /// A quantized weight streamed on compute-type activations (`qgemv_*`), one launch a
    /// part.
    Qgemv { rows: u32 },
    /// A quantized weight with no rows or no columns: nothing to launch.
    Empty,
    /// The tiles of `kernels/qmma.cu` at row tile `tile`; `x8`: x is quantized to 8 bits
    /// once for the runs that take the 8-bit tiles ([`Route::qmma_kernel`]).
    Qmma { tile: u32, x8: bool },
    /// Every part dequantized into the scratch, then the BLAS GEMM and the bias.
    DequantBlas,
}

/// A gate/up matmul followed by SiLU-mul ([`GpuBackend::launch_matmul_silu_mul`]).
///
/// [`GpuBackend::launch_matmul_silu_mul`]: crate::backend::gpu::GpuBackend
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::backend::gpu) enum GluPath {
    /// The matmul's own path ([`MatmulPath`]), then `silu_mul`.
    Unfused,
    /// A dense gate/up streamed with the SiLU in `gemv_silu_mul_m{rows}`.
    GemvSilu { rows: u32 },
    /// A quantized pair on 8-bit activations (`qdot_silu_*`); `takes_norm`: a one-row launch
    /// whose `qdot_silu_in_*` entry is loaded (it finishes a norm the launch before left).
    QdotSilu {
        q: QType,
        rows: u32,
        takes_norm: bool,
    },
    /// A quantized pair on compute-type activations (`qgemv_silu_*`).
    QgemvSilu { q: QType, rows: u32 },
    /// A quantized pair on the tiles with the SiLU in the matmul (`qmmaglu_*`).
    QmmaGlu { q: QType, tile: u32 },
}

/// A residual matmul followed by add + RMSNorm ([`GpuBackend::launch_matmul_add_rms_norm`]).
///
/// [`GpuBackend::launch_matmul_add_rms_norm`]: crate::backend::gpu::GpuBackend
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::backend::gpu) enum NormPath {
    /// One decode row on `qdot_norm_*`, which leaves the norm to the next quantized matmul.
    QdotNorm { q: QType },
    /// The tiles at row tile `tile`, whose split-k reduce adds and norms (where k splits).
    Tiles { tile: u32 },
    /// The matmul's own path ([`MatmulPath`]), then `add_rms_norm`.
    Unfused,
}

/// Which kernels rope and cache the qkv matmul's output itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::backend::gpu) enum QkvPath {
    /// The 8-bit decode kernels (`qdot_*`, 1-8 rows).
    Decode(u32),
    /// The tiled kernels (`qmma_*`), in the reduce of a split k.
    Tiles(u32),
}

/// The facts of a fused residual norm a [`NormPath`] reads.
pub(in crate::backend::gpu) struct NormFacts {
    /// The norm's width (the matmul's output columns).
    pub h: usize,
    /// The norm weight is dense (a quantized one never fuses).
    pub w_dense: bool,
    /// Ops may leave work to the next (within a step: `GpuBackend::fuse_across_ops`).
    pub across_ops: bool,
}

/// The facts of a fused qkv rope a [`QkvPath`] reads.
pub(in crate::backend::gpu) struct RopeFacts {
    /// `AttnShape::qkv_dim` and `head_dim`.
    pub qkv_dim: usize,
    pub head_dim: usize,
    /// Rotated dimensions (`RopeSpec::dim`); adjacent pairs rotate (else each head's halves).
    pub rot_dim: usize,
    pub interleaved: bool,
}

/// Adjacent parts of a stacked weight that one launch takes (`qdot_*`, `qmma_*`): up to
/// [`QDOT_PARTS`] of one type `q`, or one or two of a [`QDOT_MIX_TYPES`] type and a Q6_K
/// part after them (`mix`: the Q6_K part goes in the last slot); `slots` pairs each part with
/// its slot.
pub(in crate::backend::gpu) struct PartRun<'a, P> {
    pub q: QType,
    pub mix: bool,
    pub slots: Vec<(usize, &'a P)>,
}

/// The launches of `parts`' quantized parts, in order (unquantized parts are skipped).
pub(in crate::backend::gpu) fn part_runs<P: PartFacts>(parts: &[P]) -> Vec<PartRun<'_, P>> {
    let mut runs = Vec::new();
    let mut first = 0;
    while first < parts.len() {
        let q = parts[first].q();
        let run = parts[first..]
            .iter()
            .take(QDOT_PARTS)
            .take_while(|p| p.q() == q)
            .count();
        let mix = run < QDOT_PARTS
            && q.is_some_and(|q| QDOT_MIX_TYPES.contains(&q))
            && parts
                .get(first + run)
                .is_some_and(|p| p.q() == Some(QType::Q6K));
        let mut slots: Vec<(usize, &P)> = parts[first..first + run].iter().enumerate().collect();
        if mix {
            slots.push((QDOT_PARTS - 1, &parts[first + run]));
        }
        first += slots.len();
        if let Some(q) = q {
            runs.push(PartRun { q, mix, slots });
        }
    }
    runs
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
/// MXFP4 stays on the bf16 tiles (exact weights, as Q4_0): on an H200 (`bench_mxfp4_decode`,
/// us a matrix for rows 16 / 64 / 256) 2880 x 2880 took 11.1 / 17.0 / 35.1 on the bf16 tiles
/// against 15.2 / 17.4 / 38.4 on the 8-bit ones, 4096 x 4096 14.7 / 23.4 / 52.7 against
/// 15.0 / 24.0 / 56.7.
/// (A type added here also moves its `Kernel::Qmma8` into its own compile unit,
/// `Kernel::unit` in kernels.rs, so its models compile those kernels at start.)
const QMMA8_TYPES: [QType; 1] = [QType::Q8_0];

/// Whether the matmul route has another path while `unit` is still compiling, so the
/// compile planner may leave it for after start-up (`KernelNeeds::class`'s `Class::Later`
/// for the matmul sources): the tiles (`qmma.cu`: batches dequantize for the BLAS), the
/// 8-bit decode kernels above one row (`qdot_*` of 2, 4, 8 rows: those steps dequantize
/// too) and the one-row fused norms (`qdot_norm_*`, `*_in_*`: the plain launches run).
/// Every unit a [`Route`] asks `pending` about is one of these (the table test checks).
// For `KernelNeeds::class` (registry/needs.rs) to call; the tests check it meanwhile.
#[allow(dead_code)]
pub(in crate::backend::gpu) fn routes_around(unit: Unit) -> bool {
    matches!(
        (unit.src, unit.part),
        (Source::Qmma, _) | (Source::Qgemv, Part::Rows(..)) | (Source::Qgemv, Part::Norm(_))
    )
}

impl<F: Fn(Unit) -> bool> Route<'_, F> {
    /// `cols` values of the storage type are whole 16-byte chunks (`GpuBackend::whole_chunks`
    /// with the addresses' part in the operands).
    fn whole_chunks(&self, cols: usize) -> bool {
        cols.is_multiple_of(16 / self.dt.size())
    }

    /// Whether `n` rows run on the streaming kernels of `kernels/gemv.cu` (faster than the
    /// BLAS for one or two rows): whole 16-byte chunks, aligned buffers.
    pub fn gemv_fits<P: PartFacts>(&self, o: &Operands<'_, P>) -> bool {
        (1..=GEMV_MAX_ROWS).contains(&o.n)
            && self.gemv
            && o.x_cols == o.w_cols
            && o.w_cols <= i32::MAX as usize
            && o.w_rows <= i32::MAX as usize
            && o.dense()
            && self.whole_chunks(o.w_cols)
            && o.x_aligned
            && o.w_aligned
    }

    /// The row bucket of `kernels/qgemv.cu` for a quantized weight, when the streaming
    /// kernels take it: not while the bucket's 8-bit kernels (`qdot_*` of 2, 4 and 8 rows,
    /// compiled after start-up) still compile, so such a step dequantizes for the BLAS
    /// meanwhile rather than wait (or compile bf16's float-activation `qgemv_*`).
    pub fn qgemv_rows<P: PartFacts>(&self, o: &Operands<'_, P>) -> Option<u32> {
        let fits = self.gemv
            && o.x_cols == o.w_cols
            && o.w_rows <= i32::MAX as usize
            && o.quantized()
            && self.whole_chunks(o.w_cols)
            && o.x_aligned;
        let compiling = |rows| {
            o.parts.iter().any(|p| {
                p.q()
                    .is_some_and(|q| (self.pending)(Kernel::Qdot { q, rows }.unit()))
            })
        };
        QGEMV_ROWS
            .into_iter()
            .find(|&r| r as usize >= o.n)
            .filter(|&r| fits && o.n > 0 && !compiling(r))
    }

    /// The row bucket of the 8-bit activation kernels (`qdot_*`), when they take the step:
    /// the streaming bucket, bf16, and a scratch that holds the quantized rows.
    pub fn qdot_rows<P: PartFacts>(&self, o: &Operands<'_, P>) -> Option<u32> {
        self.qgemv_rows(o).filter(|_| {
            self.dt == DType::Bf16
                && o.w_cols.is_multiple_of(32)
                && o.w_cols <= i32::MAX as usize
                && qx_bytes(o.n, o.w_cols) <= self.room
        })
    }

    /// Whether a `qdot_*` launch of `o` at row bucket `rows` finishes a residual norm the
    /// launch before left ([`NormIn`](super::NormIn)): one row, every run's `*_in_*` entries
    /// loaded.
    pub fn qdot_takes_norm<P: PartFacts>(&self, o: &Operands<'_, P>, rows: u32) -> bool {
        rows == 1
            && part_runs(o.parts)
                .iter()
                .all(|r| !(self.pending)(Kernel::QdotIn { q: r.q }.unit()))
    }

    /// The row tile of `kernels/qmma.cu`, when the tiled kernel takes the step (bf16
    /// compute, a warp of 32, whole k-tiles or, for MXFP4, whole 32-blocks
    /// ([`Route::qmma_k_step`]), its compile units loaded: right after start-up
    /// they may still compile, and batches dequantize for the BLAS meanwhile).
    pub fn qmma_rows<P: PartFacts>(&self, o: &Operands<'_, P>) -> Option<u32> {
        let unit = |part| Unit {
            src: Source::Qmma,
            part,
        };
        let compiling = (self.pending)(unit(Part::Common))
            || o.parts
                .iter()
                .any(|p| p.q().is_some_and(|q| (self.pending)(unit(Part::Q(q)))));
        let fits = !compiling
            && self.gemv
            && self.dt == DType::Bf16
            && self.caps.warp == 32
            && o.x_cols == o.w_cols
            && o.w_cols.is_multiple_of(self.qmma_k_step(o))
            && o.w_rows <= i32::MAX as usize
            && o.quantized()
            && self.whole_chunks(o.w_cols)
            && o.x_aligned;
        let last = QMMA_ROWS[QMMA_ROWS.len() - 1];
        let tile = QMMA_ROWS
            .into_iter()
            .find(|&r| r as usize >= o.n)
            .unwrap_or(last);
        Some(tile).filter(|_| fits && o.n > 0 && o.n <= QMMA_MAX_ROWS)
    }

    /// The multiple of k the tiles take for `o`'s parts: whole 32-blocks where every part's
    /// type takes a partial last k-tile ([`QMMA_KTAIL_TYPES`]), else whole k-tiles.
    fn qmma_k_step<P: PartFacts>(&self, o: &Operands<'_, P>) -> usize {
        let tail = o
            .parts
            .iter()
            .all(|p| p.q().is_some_and(|q| QMMA_KTAIL_TYPES.contains(&q)));
        if tail { 32 } else { QMMA_BK }
    }

    /// Whether a `qmma_*` launch of type `q` (`mix`: with a Q6_K part) takes the 8-bit tiles:
    /// [`QMMA8_TYPES`], or as [`GpuTuning::qmma8`] says.
    pub fn qmma8_takes(&self, q: QType, mix: bool) -> bool {
        self.tuning.qmma8.or(!mix && QMMA8_TYPES.contains(&q))
    }

    /// The scratch bytes of x's 8-bit rows for the 8-bit tiles (`qmma8_*`), where `n` rows of
    /// `k` columns may take them: on NVIDIA sm_80 or newer (int8 `mma.sync`; elsewhere the
    /// bf16 tiles stay), k whole pairs of 32-blocks, with room in the dequant scratch (the
    /// split-k partials follow them).
    pub fn qmma8_bytes(&self, n: usize, k: usize) -> Option<usize> {
        let bytes = qx_bytes(n, k).next_multiple_of(256);
        // Whole pairs of 32-blocks: a tile copies x's scales 16 bytes (two blocks) at a time
        // from each row's start (MXFP4's tiles take any k of whole 32-blocks).
        (self.caps.int8_mma && k.is_multiple_of(64) && bytes <= self.room).then_some(bytes)
    }

    /// The scratch bytes of x's 8-bit rows where a tiled launch of `o` quantizes x once for
    /// the runs that take the 8-bit tiles ([`Route::qmma8_takes`], [`Route::qmma8_bytes`]).
    pub fn qmma_x8<P: PartFacts>(&self, o: &Operands<'_, P>) -> Option<usize> {
        let takes = part_runs(o.parts)
            .iter()
            .any(|r| self.qmma8_takes(r.q, r.mix));
        if takes {
            self.qmma8_bytes(o.n, o.w_cols)
        } else {
            None
        }
    }

    /// Whether a bf16 `qmma_*` launch at row tile `tile` of `cols` output columns takes the
    /// wide blocks ([`QMMA_WIDE`]): 64 rows on tensor cores, with at least one wide block per
    /// two SMs before splitting k. On an H100 at 64 rows they are faster for the gate and up
    /// (14336 rows alone: 59.6 -> 53.4 us; a Llama-3-8B Q4_K_M step at batch 64, where the
    /// stacked gate/up is the only wide launch: 14.28 -> 13.40 ms) and slower for 4096
    /// columns (down 56.7 -> 71.8 us: fewer blocks in flight). [`GpuTuning::qmma_wide`]:
    /// never, or at every 64-row launch (tests of the wide kernels on small shapes).
    pub fn qmma_wide(&self, tile: u32, cols: usize) -> bool {
        tile == 64
            && self.caps.int8_mma
            && self
                .tuning
                .qmma_wide
                .or(2 * cols.div_ceil(QMMA_WIDE.0) >= self.caps.sms)
    }

    /// The kernel of one run of parts (type `q`, `mix`, `cols` output columns) on the tiles
    /// at row tile `tile`, where x's 8-bit rows are there (`x8`) or not.
    pub fn qmma_kernel(&self, tile: u32, x8: bool, q: QType, mix: bool, cols: usize) -> Kernel {
        let rows = tile;
        match (mix, x8 && self.qmma8_takes(q, mix)) {
            (true, true) => Kernel::Qmma8Mix { q, rows },
            (false, true) => Kernel::Qmma8 { q, rows },
            (true, false) => Kernel::QmmaMix {
                q,
                rows,
                wide: self.qmma_wide(rows, cols),
            },
            (false, false) => Kernel::Qmma {
                q,
                rows,
                wide: self.qmma_wide(rows, cols),
            },
        }
    }

    /// Whether a gate/up pair of type `q` on the tiles takes `qmmaglu_*` (the SiLU-mul in the
    /// matmul) rather than the stacked launch and `silu_mul`: the types of [`QMMA_GLU_TYPES`]
    /// that run on the bf16 tiles; [`GpuTuning::qmma_glu`] off: never (measurements).
    pub fn qmma_glu_takes(&self, q: QType) -> bool {
        self.tuning.qmma_glu && QMMA_GLU_TYPES.contains(&q) && !self.qmma8_takes(q, false)
    }

    /// The path of `out = x @ w^T (+ bias)`.
    pub fn matmul<P: PartFacts>(&self, o: &Operands<'_, P>) -> MatmulPath {
        let m = o.w_rows;
        if o.dense() {
            if m > 0 && self.gemv_fits(o) {
                return MatmulPath::Gemv { rows: o.n as u32 };
            }
            return MatmulPath::Blas;
        }
        if m > 0
            && let Some(rows) = self.qdot_rows(o)
        {
            return MatmulPath::Qdot { rows };
        }
        if let Some(rows) = self.qgemv_rows(o) {
            return MatmulPath::Qgemv { rows };
        }
        if o.n == 0 || m == 0 {
            return MatmulPath::Empty;
        }
        match self.qmma_rows(o) {
            Some(tile) => MatmulPath::Qmma {
                tile,
                x8: self.qmma_x8(o).is_some(),
            },
            None => MatmulPath::DequantBlas,
        }
    }

    /// The path of a gate/up matmul and SiLU-mul to `f` columns (`w`: gate rows, then up).
    pub fn glu<P: PartFacts>(&self, o: &Operands<'_, P>, f: usize) -> GluPath {
        if o.dense() {
            return match self.gemv_fits(o) {
                true => GluPath::GemvSilu { rows: o.n as u32 },
                false => GluPath::Unfused,
            };
        }
        let q = match o.parts {
            [g, u] if g.q() == u.q() && g.rows() == f && u.rows() == f => g.q(),
            _ => None,
        };
        let Some(q) = q else {
            return GluPath::Unfused;
        };
        let Some(rows) = self.qgemv_rows(o) else {
            return match self.qmma_rows(o).filter(|_| self.qmma_glu_takes(q)) {
                Some(tile) => GluPath::QmmaGlu { q, tile },
                None => GluPath::Unfused,
            };
        };
        match self.qdot_rows(o) {
            Some(rows) => GluPath::QdotSilu {
                q,
                rows,
                takes_norm: rows == 1 && !(self.pending)(Kernel::QdotSiluIn { q }.unit()),
            },
            None => GluPath::QgemvSilu { q, rows },
        }
    }

    /// The path of a residual matmul and the add + RMSNorm after it.
    pub fn add_norm<P: PartFacts>(&self, o: &Operands<'_, P>, nf: &NormFacts) -> NormPath {
        let h = nf.h;
        if nf.w_dense
            && let Some(q) = self.qdot_norm(o, nf)
        {
            return NormPath::QdotNorm { q };
        }
        // Rows the decode kernels take (`qdot_rows` is a subset) stay with them, as in
        // `launch_qmatmul`; the reduce holds a row in registers (`QRN_CACHE` in qmma.cu).
        let eligible = self.tuning.qmma_norm
            && !o.dense()
            && o.n >= QMMA_NORM_MIN_ROWS
            && h.is_multiple_of(4)
            && h <= QMMA_NORM_MAX_COLS
            && self.qgemv_rows(o).is_none();
        match eligible.then(|| self.qmma_rows(o)).flatten() {
            Some(tile) if nf.w_dense => NormPath::Tiles { tile },
            _ => NormPath::Unfused,
        }
    }

    /// The type of a one-row `qdot_norm_*` launch that takes the matmul and leaves the norm
    /// (a one-part weight of `h` rows; Q5_K's decode registers, about 160, do not fit a block
    /// of 512 threads unspilled), with room for x's, the norm input's 8-bit rows and the
    /// sums of squares (`GpuBackend::launch_qdot_norm`'s layout).
    fn qdot_norm<P: PartFacts>(&self, o: &Operands<'_, P>, nf: &NormFacts) -> Option<QType> {
        let (n, h) = (o.n, nf.h);
        let q = match o.parts {
            [p] if p.rows() == h => p.q().filter(|&q| q != QType::Q5K),
            _ => None,
        }?;
        if self.room == 0 {
            // No dequant scratch.
            return None;
        }
        let (_, ss_off) = qdot_norm_offsets(n, o.x_cols, h);
        let fits = self.tuning.qdot_norm
            && nf.across_ops
            && n == 1
            && h.is_multiple_of(32)
            && ss_off + 4 * n * (h / 32) <= self.room
            && self.qdot_rows(o) == Some(1)
            && !(self.pending)(Kernel::QdotNorm { q }.unit());
        fits.then_some(q)
    }

    /// Whether the qkv matmul may rope and cache its own output, on which kernels: the
    /// 8-bit decode kernels (`QkvRope` in kernels/qgemv.cu) where the rope rotates adjacent
    /// pairs (a warp's two weight rows) and every part starts at an even column, or the
    /// tiled kernels' split-k reduce (`qmma_reduce_rope` in kernels/qmma.cu, either rope
    /// layout). [`GpuTuning::qkv_rope`] off: never (A/B measurements). (The step must also
    /// be the batch's: its positions and slots; the launcher checks.)
    pub fn qkv_rope<P: PartFacts>(&self, o: &Operands<'_, P>, r: &RopeFacts) -> Option<QkvPath> {
        let fits = self.tuning.qkv_rope
            && !o.dense()
            && o.w_rows > 0
            && o.w_rows == r.qkv_dim
            && r.head_dim.is_multiple_of(2)
            && r.rot_dim.is_multiple_of(2)
            && r.rot_dim <= r.head_dim;
        let decode = r.interleaved
            && o.parts
                .iter()
                .all(|p| p.row0().is_multiple_of(2) && p.rows().is_multiple_of(2));
        match fits.then(|| self.qdot_rows(o))? {
            Some(rows) if decode => Some(QkvPath::Decode(rows)),
            Some(_) => None,
            None => match (self.qgemv_rows(o), self.qmma_rows(o)) {
                (None, Some(rows)) => Some(QkvPath::Tiles(rows)),
                _ => None,
            },
        }
    }
}

/// Where a `qdot_norm_*` launch of `n` rows (`k` input columns, `h` output columns) puts
/// the norm input's 8-bit rows and then the sums of squares in the dequant scratch: past
/// x's own 8-bit rows, which it reads meanwhile.
pub(in crate::backend::gpu) fn qdot_norm_offsets(n: usize, k: usize, h: usize) -> (usize, usize) {
    let off = qx_bytes(n, k).next_multiple_of(256);
    (off, off + qx_bytes(n, h).next_multiple_of(256))
}

#[cfg(test)]
mod tests;
