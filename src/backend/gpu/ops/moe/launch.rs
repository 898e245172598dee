//! The launches of one MoE FFN step on the route's kernels ([`MoePath`]): routing and
//! alignment, the grouped gate/up and down matmuls, and the weighted sum.

use super::geometry::{
    ALIGN_THREADS, CN_E, COLS, Layout, MMA_BN, MMA_THREADS, Q8_DOWN_COLS, Q8_GU_COLS, Q8_THREADS,
    ROUTE_THREADS, TILE, q8_lanes,
};
use super::route::{MoePath, MoeStage};
use crate::backend::gpu::args::{
    MoeAlignArgs, MoeCombineArgs, MoeCombineNormArgs, MoeDownArgs, MoeGateUpArgs, MoeMmaDownArgs,
    MoeMmaGateUpArgs, MoePrepArgs, MoeQ8DownArgs, MoeQ8DownSelfArgs, MoeQ8GateUpArgs, MoeQDownArgs,
    MoeQGateUpArgs, MoeRouteArgs,
};
use crate::backend::gpu::kernels::Kernel;
use crate::backend::gpu::ops::matmul::QxRows;
use crate::backend::gpu::qtype::QType;
use crate::backend::gpu::runtime::{Grid, Runtime};
use crate::backend::gpu::{GpuBackend, GpuTensor, GpuWeight};
use crate::backend::{BackendError, MoeShape};

/// One step's sizes and device addresses: the workspace (at `base`, laid out as `lay`) and
/// the stacked experts.
pub(super) struct MoeStep {
    pub base: u64,
    pub lay: Layout,
    pub n: usize,
    pub h: usize,
    pub f: usize,
    pub k: usize,
    pub ne: usize,
    /// Tiles the alignment may fill, and the prefix the grouped matmuls launch.
    pub tiles: usize,
    pub used: usize,
    pub wg: u64,
    pub wu: u64,
    pub wd: u64,
    /// The experts' activation and biases ([`MoeEpilogue::PLAIN`]: SwiGLU, none).
    pub epi: MoeEpilogue,
}

/// What the gate/up kernels do after their products and the combines before their weights
/// (gpt-oss): gate/up biases `bg`, `bu` (`[n_expert, f]`, compute type; 0: none), the clamped
/// SwiGLU's `alpha` and `limit` (`limit` 0: SwiGLU), down biases `bd` (`[n_expert, h]`; 0:
/// none).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct MoeEpilogue {
    pub bg: u64,
    pub bu: u64,
    pub bd: u64,
    pub alpha: f32,
    pub limit: f32,
}

impl MoeEpilogue {
    /// Qwen/Mixtral experts: SwiGLU, no biases.
    pub const PLAIN: MoeEpilogue = MoeEpilogue {
        bg: 0,
        bu: 0,
        bd: 0,
        alpha: 0.0,
        limit: 0.0,
    };
}

impl MoeStep {
    /// The device address `off` bytes into the workspace.
    fn at(&self, off: usize) -> u64 {
        self.base + off as u64
    }
}

fn grid(blocks: (usize, usize), threads: u32) -> Grid {
    Grid {
        blocks: (blocks.0 as u32, blocks.1 as u32, 1),
        threads,
    }
}

impl<R: Runtime> GpuBackend<R> {
    /// Routes and aligns the step's assignments: `moe_prep` at decode sizes (with x's 8-bit
    /// rows where the gate/up tiles read them), else `moe_route` then `moe_align`.
    pub(super) fn moe_assign(
        &mut self,
        st: &MoeStep,
        path: &MoePath,
        x: &GpuTensor,
        logits: &GpuTensor,
        s: &MoeShape,
    ) -> Result<(), BackendError> {
        let (lay, at) = (&st.lay, |off| st.at(off));
        let (n, ne, k, h, total) = (st.n, st.ne, st.k, st.h, st.n * st.k);
        let gu_xq = path.x8();
        if path.prep {
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
                max_tiles: st.tiles as i32,
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
            return self.launch_with(Kernel::MoePrep, grid((1, 1), threads as u32), &args);
        }
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
            max_tiles: st.tiles as i32,
            estart: at(lay.estart),
        };
        self.launch_with(Kernel::MoeAlign, grid((1, 1), ALIGN_THREADS), &align)
    }

    /// The grouped gate/up matmul and SiLU-mul into the activations, on `stage`'s kernels
    /// (the dp4a tiles quantize x first unless `moe_prep` did).
    pub(super) fn moe_gate_up(
        &mut self,
        st: &MoeStep,
        stage: MoeStage,
        prep: bool,
        x: &GpuTensor,
    ) -> Result<(), BackendError> {
        let (lay, at) = (&st.lay, |off| st.at(off));
        let (ne, k, h, f, used) = (st.ne, st.k, st.h, st.f, st.used);
        let (wg, wu) = (st.wg, st.wu);
        let g = grid((used, f.div_ceil(COLS)), 256);
        match stage {
            MoeStage::Mma(q) => {
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
                    bg: st.epi.bg,
                    bu: st.epi.bu,
                    alpha: st.epi.alpha,
                    limit: st.epi.limit,
                };
                let g = grid((used, f.div_ceil(MMA_BN)), MMA_THREADS);
                self.launch_with(Kernel::MoeMmaGateUp { q }, g, &gate_up)
            }
            MoeStage::Q8 { q, slots } => self.moe_gate_up8(st, (q, slots), prep, x),
            MoeStage::Dense => {
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
                    bg: st.epi.bg,
                    bu: st.epi.bu,
                    alpha: st.epi.alpha,
                    limit: st.epi.limit,
                };
                self.launch_with(Kernel::MoeGateUp, g, &gate_up)
            }
            MoeStage::Quant(q) | MoeStage::Q8Self(q) => {
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
                    bg: st.epi.bg,
                    bu: st.epi.bu,
                    alpha: st.epi.alpha,
                    limit: st.epi.limit,
                };
                self.launch_with(Kernel::MoeQGateUp { q }, g, &gate_up)
            }
        }
    }

    /// The gate/up matmul on the dp4a tiles (`moe8_gate_up_*`, slot bucket `slots`) over x's
    /// 8-bit rows, quantized here unless `moe_prep` wrote them.
    fn moe_gate_up8(
        &mut self,
        st: &MoeStep,
        (q, slots): (QType, u32),
        prep: bool,
        x: &GpuTensor,
    ) -> Result<(), BackendError> {
        let (lay, at) = (&st.lay, |off| st.at(off));
        let (n, ne, k, h, f, used) = (st.n, st.ne, st.k, st.h, st.f, st.used);
        let (wg, wu) = (st.wg, st.wu);
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
            bg: st.epi.bg,
            bu: st.epi.bu,
            alpha: st.epi.alpha,
            limit: st.epi.limit,
        };
        let per_block = Q8_THREADS / lanes * Q8_GU_COLS;
        let g = grid((used, f.div_ceil(per_block)), Q8_THREADS as u32);
        self.launch_with(Kernel::MoeQ8GateUp { q, slots }, g, &gate_up)
    }

    /// The grouped down matmul into each assignment's output row, on `stage`'s kernels.
    pub(super) fn moe_down(&mut self, st: &MoeStep, stage: MoeStage) -> Result<(), BackendError> {
        let (lay, at) = (&st.lay, |off| st.at(off));
        let (ne, h, f, used, wd) = (st.ne, st.h, st.f, st.used, st.wd);
        let g = grid((used, h.div_ceil(COLS)), 256);
        match stage {
            MoeStage::Mma(q) => {
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
                self.launch_with(Kernel::MoeMmaDown { q }, g, &down)
            }
            MoeStage::Q8Self(_) | MoeStage::Q8 { .. } => self.moe_down8(st, stage),
            MoeStage::Dense => {
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
                self.launch_with(Kernel::MoeDown, g, &down)
            }
            MoeStage::Quant(q) => {
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
                self.launch_with(Kernel::MoeQDown { q }, g, &down)
            }
        }
    }

    /// The down matmul on the dp4a tiles: at one slot a tile each block quantizes its
    /// slot's activations itself ([`MoeStage::Q8Self`]), else they are quantized first.
    fn moe_down8(&mut self, st: &MoeStep, stage: MoeStage) -> Result<(), BackendError> {
        let (lay, at) = (&st.lay, |off| st.at(off));
        let (ne, h, f, used, wd) = (st.ne, st.h, st.f, st.used, st.wd);
        if let MoeStage::Q8Self(q) = stage {
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
            return self.launch_with(Kernel::MoeQ8DownSelf { q }, g, &down);
        }
        let MoeStage::Q8 { q, slots: bucket } = stage else {
            unreachable!("moe_down8 of {stage:?}")
        };
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
        self.launch_with(Kernel::MoeQ8Down { q, slots: bucket }, g, &down)
    }

    /// Each token's weighted sum of its experts' rows into `out` (`moe_combine`).
    pub(super) fn moe_combine(
        &mut self,
        st: &MoeStep,
        out: &GpuTensor,
    ) -> Result<(), BackendError> {
        let (lay, at) = (&st.lay, |off| st.at(off));
        let (n, h, k) = (st.n, st.h, st.k);
        let combine = MoeCombineArgs {
            y: at(lay.y),
            inv: at(lay.inv),
            wts: at(lay.wts),
            k: k as i32,
            h: h as i32,
            total: (n * h) as u64,
            out: out.buf.ptr(),
            tile_expert: at(lay.tile_expert),
            bd: st.epi.bd,
        };
        let blocks = (n * h).div_ceil(256).clamp(1, 65535);
        self.launch_with(Kernel::MoeCombine, grid((blocks, 1), 256), &combine)
    }

    /// The weighted sum added to `residual`, then `x = rms_norm(residual) * w`
    /// (`moe_combine_norm`): one block per row, CN_E values a thread; in bf16 at decode
    /// sizes also the 8-bit rows the quantized matmul after reads (as the vector norms leave).
    pub(super) fn moe_combine_norm(
        &mut self,
        st: &MoeStep,
        x: &GpuTensor,
        residual: &GpuTensor,
        w: &GpuWeight,
        eps: f32,
    ) -> Result<(), BackendError> {
        let (lay, at) = (&st.lay, |off| st.at(off));
        let (n, h, k) = (st.n, st.h, st.k);
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
            tile_expert: at(lay.tile_expert),
            bd: st.epi.bd,
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
        Ok(())
    }
}
