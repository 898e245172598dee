//! Launcher of the mixture-of-experts FFN (`kernels/moe.cu`): route, sort the assignments
//! by expert on the device, grouped gate/up and down matmuls over tiles of one expert,
//! then each token's weighted sum. Five launches per layer (seven with quantized experts
//! in bf16 at small batches: x and the activations quantized to 8 bits for the dp4a tiles
//! of `moe_quant.cu`; from 16 rows per expert on average the tensor-core tiles take gate/up
//! and down instead, on bf16 rows). Up to 8 rows one `moe_prep` block routes, aligns and
//! quantizes x (three launches in one), and at one row each down block quantizes its own
//! activations: four launches at batch 1. Every size
//! comes from the step's row count, so decode steps record into graphs. A shared expert
//! (Qwen2-MoE) adds three: its gate/up and down matmuls (the dense FFN's launchers, so a
//! quantized shared expert runs too) and the sigmoid-gated add.

pub(in crate::backend::gpu) mod kernels;

use super::matmul::{QX_THREADS, QxRows, qx_bytes};
use crate::backend::gpu::args::{
    MoeAlignArgs, MoeCombineArgs, MoeCombineNormArgs, MoeDownArgs, MoeGateUpArgs, MoeMmaDownArgs,
    MoeMmaGateUpArgs, MoePrepArgs, MoeQ8DownArgs, MoeQ8DownSelfArgs, MoeQ8GateUpArgs, MoeQDownArgs,
    MoeQGateUpArgs, MoeRouteArgs, MoeSharedAddArgs, QuantizeXArgs,
};
use crate::backend::gpu::kernels::{Kernel, MOE8_SLOTS};
use crate::backend::gpu::qtype::QType;
use crate::backend::gpu::runtime::{Grid, Runtime};
use crate::backend::gpu::{GpuBackend, GpuTensor, GpuWeight, check_cols, check_rows, invalid};
use crate::backend::{Backend, BackendError, MoeExperts, MoeShape, SharedExpert};

/// The shared expert's activations, sized for the activation capacity.
pub(in crate::backend::gpu) struct SharedScratch {
    /// `[rows, 2 * shared_ff]` gate/up product.
    gu: GpuTensor,
    /// `[rows, shared_ff]`
    act: GpuTensor,
    /// `[rows, hidden]` the expert's output before its gate.
    y: GpuTensor,
}

/// Where the MoE FFN's output goes.
pub(in crate::backend::gpu) enum MoeOut<'a> {
    /// `[rows, hidden]`: the weighted sums (`moe_combine`).
    Delta(&'a mut GpuTensor),
    /// Added to `residual`, then `out = rms_norm(residual) * w` (`moe_combine_norm`: the
    /// next `add_rms_norm` in the same launch). `out` is the FFN's input `x` itself, read
    /// only by the launches before.
    Norm {
        residual: &'a mut GpuTensor,
        w: &'a GpuWeight,
        eps: f32,
    },
}

/// Values per thread of `moe_combine_norm` (`MOE_CN_E`).
const CN_E: usize = 8;

/// Assignment slots per tile (`MOE_TILE` in `moe.cu`).
const TILE: usize = 8;
/// Output columns per block of the grouped matmuls.
const COLS: usize = 64;
/// Threads per block of `moe_route` (a warp per row) and `moe_align` (`MOE_ALIGN_THREADS`).
const ROUTE_THREADS: usize = 256;
const ALIGN_THREADS: u32 = 1024;
/// Threads per block of the 8-bit activation tiles (`moe8_*`), and the output columns each
/// group of lanes takes in gate/up and in down (`MOE8_GU_C`, `MOE8_DOWN_C`).
const Q8_THREADS: usize = 128;
const Q8_GU_COLS: usize = 1;
const Q8_DOWN_COLS: usize = 4;
/// Threads, output columns per block and the columns' multiple of the tensor-core tiles
/// (`moemma_*`: `QMMA_THREADS`, `QMMA_BN`, `QMMA_BK` of `qmma.cuh`).
const MMA_THREADS: u32 = 128;
const MMA_BN: usize = 64;
const MMA_BK: usize = 128;
/// Mean rows per expert from which the tensor-core tiles (64 slots of one expert per
/// block) take over from the dp4a ones (8 slots).
const MMA_MIN_ROWS: usize = 16;
/// Most assignments (rows * top k, `MOE_PREP_MAX`) and rows `moe_prep` takes in one block:
/// small decode steps. Up to 8 rows its route has the warps `moe_route`'s one block would
/// have; at 32 and 64 rows (Qwen3-30B-A3B shape, H100) one block doing what four SMs did
/// was slower than the three launches (graph step 22.78 -> 23.16 ms at 32, 35.01 -> 36.54
/// at 64), while batch 1 gained (3.81 -> 3.70 ms with the in-block down quantization).
const PREP_MAX: usize = 512;
const PREP_ROWS: usize = 8;
/// Most rows of a step the `moe8_*` tiles take in groups of 4 slots. (Qwen3-30B-A3B shape,
/// H100, graph step: batch 32 22.70 -> 19.89 ms, batch 64 35.21 -> 31.39 ms against bucket 8:
/// 93 registers instead of 128 for Q4_K gate/up, most tiles one pass.)
const S4_ROWS: usize = 64;
/// Longest expert row whose activations a `moe8_down_self_*` block quantizes itself
/// (`MOE8_SELF_MAX`).
const SELF_MAX: usize = 4096;

/// Weights per unit of `quant.cuh`'s decoders (`Q::UNIT`).
fn unit(q: QType) -> usize {
    match q {
        QType::Q8_0 => 16,
        QType::Q6K => 64,
        _ => 32,
    }
}

/// Lanes per output column of a `moe8_*` tile over rows of `cols` weights of type `q`: a
/// power of two up to 32, at most one lane per unit where the row is short.
fn q8_lanes(q: QType, cols: usize) -> usize {
    (cols / unit(q)).next_power_of_two().clamp(1, 32)
}

/// Where each part of the MoE workspace starts, in bytes, for `rows` rows.
struct Layout {
    ids: usize,
    wts: usize,
    inv: usize,
    sorted: usize,
    tile_expert: usize,
    estart: usize,
    act: usize,
    y: usize,
    /// 8-bit rows of x (`rows` rows) and of the activations (every slot).
    xq: usize,
    actq: usize,
    bytes: usize,
}

/// Tiles a step of `total` assignments over `ne` experts can need.
fn max_tiles(total: usize, ne: usize) -> usize {
    (total + ne * (TILE - 1)).div_ceil(TILE)
}

/// The slot bucket of the `moe8_*` tiles for a step of `n` rows: an expert takes a token at
/// most once, so no tile holds more than `n` real slots (bucket 1 at one row); up to
/// `S4_ROWS` rows, groups of 4 slots (fewer registers than 8; a tile with more than 4 real
/// slots takes a second pass over its weights); past that, all 8 in one pass.
fn moe8_slots(n: usize) -> u32 {
    let want = if n <= 1 {
        1
    } else if n <= S4_ROWS {
        4
    } else {
        TILE as u32
    };
    debug_assert!(MOE8_SLOTS.contains(&want));
    want
}

/// Tiles the grouped matmuls launch: the tiles in use are a prefix, each with at least one
/// assignment, so no more than `total` of them.
fn used_tiles(total: usize, ne: usize) -> usize {
    max_tiles(total, ne).min(total)
}

impl Layout {
    fn new(rows: usize, s: &MoeShape, h: usize, elem: usize) -> Self {
        let total = rows * s.top_k;
        let tiles = max_tiles(total, s.n_expert);
        let slots = tiles * TILE;
        let align = |b: usize| b.next_multiple_of(256);
        let ids = 0;
        let wts = align(ids + 4 * total);
        let inv = align(wts + 4 * total);
        let sorted = align(inv + 4 * total);
        let tile_expert = align(sorted + 4 * slots);
        let estart = align(tile_expert + 4 * tiles);
        let act = align(estart + 4 * (s.n_expert + 1));
        let y = align(act + elem * slots * s.expert_ff);
        let xq = align(y + elem * slots * h);
        let actq = align(xq + qx_bytes(rows, h));
        Layout {
            ids,
            wts,
            inv,
            sorted,
            tile_expert,
            estart,
            act,
            y,
            xq,
            actq,
            bytes: actq + qx_bytes(slots, s.expert_ff),
        }
    }
}

/// A stacked expert weight's device address and type: one dense part of compute-type
/// elements, or one quantized part in `quant.cuh`'s plane layout (a 3-D GGUF tensor).
fn experts_of(w: &GpuWeight) -> Result<(u64, Option<QType>), BackendError> {
    match w.parts.as_slice() {
        [p] => Ok((p.buf.ptr(), p.q)),
        _ => Err(BackendError::Unsupported {
            backend: "gpu",
            op: "moe_ffn (experts in several quantized parts)",
            dtype: format!("{:?}", w.part_types()),
        }),
    }
}

impl<R: Runtime> GpuBackend<R> {
    /// `Backend::moe_ffn_add_rms_norm`: the weighted sum fused with the norm where
    /// `moe_combine_norm` takes the rows (no shared expert; whole aligned chunks, at most
    /// `CN_E` values a thread of a 1024-thread block), else `moe_ffn` then `add_rms_norm`.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::backend::gpu) fn launch_moe_ffn_norm(
        &mut self,
        h: &mut GpuTensor,
        logits: &GpuTensor,
        w: MoeExperts<'_, GpuWeight>,
        s: &MoeShape,
        n: usize,
        delta: &mut GpuTensor,
        residual: &mut GpuTensor,
        nw: &GpuWeight,
        eps: f32,
    ) -> Result<(), BackendError> {
        let cols = h.cols;
        let ptrs = [
            h.buf.ptr(),
            residual.buf.ptr(),
            nw.dense().map_or(1, |b| b.ptr()),
        ];
        let fused = w.shared.is_none()
            && cols.is_multiple_of(32)
            && cols <= CN_E * 1024
            && self.whole_chunks(cols, &ptrs);
        if !fused {
            self.launch_moe_ffn(h, logits, w, s, n, MoeOut::Delta(delta))?;
            return self.add_rms_norm(delta, residual, nw, eps, n, h);
        }
        let out = MoeOut::Norm {
            residual,
            w: nw,
            eps,
        };
        self.launch_moe_ffn(h, logits, w, s, n, out)
    }

    #[allow(clippy::too_many_arguments)]
    pub(in crate::backend::gpu) fn launch_moe_ffn(
        &mut self,
        x: &GpuTensor,
        logits: &GpuTensor,
        w: MoeExperts<'_, GpuWeight>,
        s: &MoeShape,
        n: usize,
        out: MoeOut<'_>,
    ) -> Result<(), BackendError> {
        s.check().map_err(invalid)?;
        let (h, ne, f, k) = (x.cols, s.n_expert, s.expert_ff, s.top_k);
        check_cols("moe router logits", logits.cols, ne)?;
        let out_rows = match &out {
            MoeOut::Delta(o) => {
                check_cols("moe output", o.cols, h)?;
                o.rows
            }
            MoeOut::Norm { residual, w, .. } => {
                check_cols("moe residual", residual.cols, h)?;
                check_cols("moe norm weight", w.rows * w.cols, h)?;
                residual.rows
            }
        };
        check_rows("moe_ffn", n, x.rows.min(logits.rows).min(out_rows))?;
        for (what, t, rows, cols) in [
            ("moe gate experts", w.gate, ne * f, h),
            ("moe up experts", w.up, ne * f, h),
            ("moe down experts", w.down, ne * h, f),
        ] {
            if (t.rows, t.cols) != (rows, cols) {
                return Err(invalid(format!(
                    "{what}: [{}, {}], expected [{rows}, {cols}]",
                    t.rows, t.cols
                )));
            }
        }
        // Compute-type experts, or each kind one quantized part (gate and up of one type).
        let (gu_q, wg, wu) = match (experts_of(w.gate)?, experts_of(w.up)?) {
            ((g, qg), (u, qu)) if qg == qu => (qg, g, u),
            _ => {
                return Err(invalid(
                    "moe_ffn: gate and up experts must share one type".into(),
                ));
            }
        };
        let (down_q, wd) = {
            let (d, q) = experts_of(w.down)?;
            (q, d)
        };
        for (q, cols) in [(gu_q, h), (down_q, f)] {
            if let Some(q) = q
                && cols % q.block().0 != 0
            {
                return Err(invalid(format!(
                    "moe_ffn: {cols} columns of {q:?} experts are not whole blocks"
                )));
            }
        }
        if n == 0 {
            return Ok(());
        }
        // Sized once for the activation capacity (the first, eager step), so a recorded
        // step never reallocates.
        let lay = Layout::new(x.rows, s, h, self.ctx.dt.size());
        if self.ctx
            .scratch
            .moe
            .as_ref()
            .is_none_or(|b| b.bytes() < lay.bytes)
        {
            self.ctx.generation += 1;
            self.ctx.scratch.moe = Some(self.ctx.dev.alloc(lay.bytes, "moe workspace")?);
        }
        let base = self.ctx.scratch.moe.as_ref().map_or(0, |b| b.ptr());
        let at = |off: usize| base + off as u64;
        let total = n * k;
        let tiles = max_tiles(total, ne);
        let used = used_tiles(total, ne);
        // bf16 with quantized experts: dp4a on 8-bit activations (whole blocks of 32).
        let q8 = |q: Option<QType>, cols: usize| {
            q.filter(|_| self.ctx.dt == crate::backend::DType::Bf16 && cols.is_multiple_of(32))
        };
        let (gu_q8, down_q8) = (q8(gu_q, h), q8(down_q, f));
        // Many rows per expert (prefill): tensor cores over 64 slots of one expert.
        let many = total >= MMA_MIN_ROWS * ne;
        let mma = |q: Option<QType>, cols: usize| {
            q.filter(|_| {
                many && self.ctx.dt == crate::backend::DType::Bf16 && cols.is_multiple_of(MMA_BK)
            })
        };
        let (gu_mma, down_mma) = (mma(gu_q, h), mma(down_q, f));
        // The dp4a gate/up tiles read 8-bit rows of x.
        let gu_xq = gu_q8.is_some() && gu_mma.is_none();
        let grid = |blocks: (usize, usize), threads: u32| Grid {
            blocks: (blocks.0 as u32, blocks.1 as u32, 1),
            threads,
        };
        // Decode sizes: route, align and x's 8-bit rows in one launch.
        let prep = total <= PREP_MAX && n <= PREP_ROWS;
        if prep {
            let args = MoePrepArgs {
                logits: logits.buf.ptr(),
                x: x.buf.ptr(),
                n: n as i32,
                ne: ne as i32,
                k: k as i32,
                norm: s.norm_topk as i32,
                h: h as i32,
                wts: at(lay.wts),
                sorted: at(lay.sorted),
                tile_expert: at(lay.tile_expert),
                inv: at(lay.inv),
                max_tiles: tiles as i32,
                estart: at(lay.estart),
                xq: if gu_xq { at(lay.xq) } else { 0 },
            };
            // Up to a warp of assignments one warp routes and aligns in registers and the
            // block's other warps quantize x (a block of 32 each); else the whole block.
            let warp = self.ctx.dev.info.warp_size;
            let threads = if total <= warp {
                let blocks = if gu_xq { n * h / 32 } else { 0 };
                warp * (1 + blocks.div_ceil(warp).min(ALIGN_THREADS as usize / warp - 1))
            } else {
                ALIGN_THREADS as usize
            };
            self.launch_with(Kernel::MoePrep, grid((1, 1), threads as u32), &args)?;
        } else {
            let route = MoeRouteArgs {
                logits: logits.buf.ptr(),
                n: n as i32,
                ne: ne as i32,
                k: k as i32,
                norm: s.norm_topk as i32,
                ids: at(lay.ids),
                wts: at(lay.wts),
            };
            let per_block = ROUTE_THREADS / 32;
            let blocks = n.div_ceil(per_block).min(65535);
            self.launch_with(
                Kernel::MoeRoute,
                grid((blocks, 1), ROUTE_THREADS as u32),
                &route,
            )?;
            let align = MoeAlignArgs {
                ids: at(lay.ids),
                total: total as i32,
                ne: ne as i32,
                sorted: at(lay.sorted),
                tile_expert: at(lay.tile_expert),
                inv: at(lay.inv),
                max_tiles: tiles as i32,
                estart: at(lay.estart),
            };
            self.launch_with(Kernel::MoeAlign, grid((1, 1), ALIGN_THREADS), &align)?;
        }
        let g = grid((used, f.div_ceil(COLS)), 256);
        match gu_q {
            Some(q) if gu_mma.is_some() => {
                let gate_up = MoeMmaGateUpArgs {
                    x: x.buf.ptr(),
                    wg,
                    wu,
                    sorted: at(lay.sorted),
                    tile_expert: at(lay.tile_expert),
                    estart: at(lay.estart),
                    k: k as i32,
                    h: h as i32,
                    f: f as i32,
                    n_rows: (ne * f) as i32,
                    act: at(lay.act),
                };
                let g = grid((used, f.div_ceil(MMA_BN)), MMA_THREADS);
                self.launch_with(Kernel::MoeMmaGateUp { q }, g, &gate_up)?;
            }
            Some(q) if gu_q8.is_some() => {
                if !prep {
                    self.quantize_rows(x.buf.ptr(), at(lay.xq), h, n)?;
                }
                let lanes = q8_lanes(q, h);
                let gate_up = MoeQ8GateUpArgs {
                    xq: at(lay.xq),
                    xrows: n as i32,
                    wg,
                    wu,
                    sorted: at(lay.sorted),
                    tile_expert: at(lay.tile_expert),
                    k: k as i32,
                    h: h as i32,
                    f: f as i32,
                    n_rows: (ne * f) as i32,
                    lanes: lanes as i32,
                    act: at(lay.act),
                };
                let per_block = Q8_THREADS / lanes * Q8_GU_COLS;
                let g = grid((used, f.div_ceil(per_block)), Q8_THREADS as u32);
                let slots = moe8_slots(n);
                self.launch_with(Kernel::MoeQ8GateUp { q, slots }, g, &gate_up)?;
            }
            None => {
                let gate_up = MoeGateUpArgs {
                    x: x.buf.ptr(),
                    wg,
                    wu,
                    sorted: at(lay.sorted),
                    tile_expert: at(lay.tile_expert),
                    k: k as i32,
                    h: h as i32,
                    f: f as i32,
                    cols: COLS as i32,
                    act: at(lay.act),
                };
                self.launch_with(Kernel::MoeGateUp, g, &gate_up)?;
            }
            Some(q) => {
                let gate_up = MoeQGateUpArgs {
                    x: x.buf.ptr(),
                    wg,
                    wu,
                    sorted: at(lay.sorted),
                    tile_expert: at(lay.tile_expert),
                    k: k as i32,
                    h: h as i32,
                    f: f as i32,
                    n_rows: (ne * f) as i32,
                    cols: COLS as i32,
                    act: at(lay.act),
                };
                self.launch_with(Kernel::MoeQGateUp { q }, g, &gate_up)?;
            }
        }
        let g = grid((used, h.div_ceil(COLS)), 256);
        match down_q {
            Some(q) if down_mma.is_some() => {
                let down = MoeMmaDownArgs {
                    act: at(lay.act),
                    wd,
                    sorted: at(lay.sorted),
                    tile_expert: at(lay.tile_expert),
                    estart: at(lay.estart),
                    f: f as i32,
                    h: h as i32,
                    n_rows: (ne * h) as i32,
                    y: at(lay.y),
                };
                let g = grid((used, h.div_ceil(MMA_BN)), MMA_THREADS);
                self.launch_with(Kernel::MoeMmaDown { q }, g, &down)?;
            }
            Some(q) if down_q8.is_some() && moe8_slots(n) == 1 && f <= SELF_MAX => {
                // One slot a tile: each block quantizes its slot's activations itself.
                let lanes = q8_lanes(q, f);
                let down = MoeQ8DownSelfArgs {
                    act: at(lay.act),
                    wd,
                    sorted: at(lay.sorted),
                    tile_expert: at(lay.tile_expert),
                    f: f as i32,
                    h: h as i32,
                    n_rows: (ne * h) as i32,
                    lanes: lanes as i32,
                    y: at(lay.y),
                };
                let per_block = Q8_THREADS / lanes * Q8_DOWN_COLS;
                let g = grid((used, h.div_ceil(per_block)), Q8_THREADS as u32);
                self.launch_with(Kernel::MoeQ8DownSelf { q }, g, &down)?;
            }
            Some(q) if down_q8.is_some() => {
                let slots = used * TILE;
                self.quantize_rows(at(lay.act), at(lay.actq), f, slots)?;
                let lanes = q8_lanes(q, f);
                let down = MoeQ8DownArgs {
                    xq: at(lay.actq),
                    xrows: slots as i32,
                    wd,
                    sorted: at(lay.sorted),
                    tile_expert: at(lay.tile_expert),
                    f: f as i32,
                    h: h as i32,
                    n_rows: (ne * h) as i32,
                    lanes: lanes as i32,
                    y: at(lay.y),
                };
                let per_block = Q8_THREADS / lanes * Q8_DOWN_COLS;
                let g = grid((used, h.div_ceil(per_block)), Q8_THREADS as u32);
                let slots = moe8_slots(n);
                self.launch_with(Kernel::MoeQ8Down { q, slots }, g, &down)?;
            }
            None => {
                let down = MoeDownArgs {
                    act: at(lay.act),
                    wd,
                    sorted: at(lay.sorted),
                    tile_expert: at(lay.tile_expert),
                    f: f as i32,
                    h: h as i32,
                    cols: COLS as i32,
                    y: at(lay.y),
                };
                self.launch_with(Kernel::MoeDown, g, &down)?;
            }
            Some(q) => {
                let down = MoeQDownArgs {
                    act: at(lay.act),
                    wd,
                    sorted: at(lay.sorted),
                    tile_expert: at(lay.tile_expert),
                    f: f as i32,
                    h: h as i32,
                    n_rows: (ne * h) as i32,
                    cols: COLS as i32,
                    y: at(lay.y),
                };
                self.launch_with(Kernel::MoeQDown { q }, g, &down)?;
            }
        }
        let out = match out {
            MoeOut::Delta(out) => out,
            MoeOut::Norm { residual, w, eps } => {
                // One block per row, CN_E values a thread; in bf16 at decode sizes also the
                // 8-bit rows the quantized matmul after reads (as the vector norms leave).
                let xq = self.qx_slot(n, h);
                let args = MoeCombineNormArgs {
                    y: at(lay.y),
                    inv: at(lay.inv),
                    wts: at(lay.wts),
                    k: k as i32,
                    h: h as i32,
                    residual: residual.buf.ptr(),
                    w: w.dense_for("moe_combine_norm")?.ptr(),
                    out: x.buf.ptr(),
                    xq: xq.unwrap_or(0),
                    eps,
                };
                let threads = (h / CN_E).next_multiple_of(self.ctx.dev.info.warp_size);
                self.launch_with(Kernel::MoeCombineNorm, grid((n, 1), threads as u32), &args)?;
                self.ctx.scratch.qx = xq.map(|at| QxRows {
                    x: x.buf.ptr(),
                    rows: n,
                    cols: h,
                    at,
                    norm: None,
                });
                return Ok(());
            }
        };
        let combine = MoeCombineArgs {
            y: at(lay.y),
            inv: at(lay.inv),
            wts: at(lay.wts),
            k: k as i32,
            h: h as i32,
            total: (n * h) as u64,
            out: out.buf.ptr(),
        };
        let blocks = (n * h).div_ceil(256).clamp(1, 65535);
        self.launch_with(Kernel::MoeCombine, grid((blocks, 1), 256), &combine)?;
        match w.shared {
            Some(sh) => self.launch_moe_shared(x, sh, s.shared_ff, n, out),
            None => Ok(()),
        }
    }

    /// `rows` rows of `cols` compute-type values at `x` to 8-bit blocks of 32 at `xq`
    /// (`quantize_x`'s layout, `qx_bytes(rows, cols)` bytes).
    fn quantize_rows(
        &mut self,
        x: u64,
        xq: u64,
        cols: usize,
        rows: usize,
    ) -> Result<(), BackendError> {
        let args = QuantizeXArgs {
            x,
            xq,
            k: cols as i32,
            rows: rows as i32,
        };
        let grid = Grid {
            blocks: ((rows * cols / 32).div_ceil(QX_THREADS) as u32, 1, 1),
            threads: QX_THREADS as u32,
        };
        self.launch_with(Kernel::QuantizeX, grid, &args)
    }

    /// `out[t] += sigmoid(x[t] · gate) * down(silu(x[t] W_g^T) * (x[t] W_u^T))` for the first
    /// `n` rows.
    fn launch_moe_shared(
        &mut self,
        x: &GpuTensor,
        sh: SharedExpert<'_, GpuWeight>,
        sf: usize,
        n: usize,
        out: &mut GpuTensor,
    ) -> Result<(), BackendError> {
        let h = x.cols;
        let g = sh.gate.dense_for("moe shared expert gate")?.ptr();
        if sh.gate.rows * sh.gate.cols != h {
            return Err(invalid(format!(
                "moe shared gate: [{}, {}], expected {h} values",
                sh.gate.rows, sh.gate.cols
            )));
        }
        // Sized once for the activation capacity (the first, eager step).
        let mut sc = match self.ctx.scratch.moe_shared.take() {
            Some(sc) if sc.act.rows >= x.rows && sc.act.cols == sf && sc.y.cols == h => sc,
            _ => {
                self.ctx.generation += 1;
                SharedScratch {
                    gu: self.alloc(x.rows, 2 * sf)?,
                    act: self.alloc(x.rows, sf)?,
                    y: self.alloc(x.rows, h)?,
                }
            }
        };
        let mut run = || -> Result<(), BackendError> {
            self.launch_matmul_silu_mul(x, sh.gate_up, n, &mut sc.gu, &mut sc.act)?;
            self.launch_matmul(&sc.act, sh.down, None, n, &mut sc.y)?;
            let args = MoeSharedAddArgs {
                x: x.buf.ptr(),
                g,
                ys: sc.y.buf.ptr(),
                h: h as i32,
                n: n as i32,
                out: out.buf.ptr(),
            };
            let grid = Grid {
                blocks: (n.clamp(1, 65535) as u32, 1, 1),
                threads: 256,
            };
            self.launch_with(Kernel::MoeSharedAdd, grid, &args)
        };
        let r = run();
        self.ctx.scratch.moe_shared = Some(sc);
        r
    }
}
