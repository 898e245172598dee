//! The tiled quantized matmuls of batches (`kernels/qmma.cu`): one launch per run of
//! parts, k split over the grid where the blocks would not fill the SMs, the split-k
//! reduce (alone, with the qkv's rope and cache write, or with the residual add and
//! RMSNorm), and the gate/up pair fused with SiLU-mul (`qmmaglu_*`).

use super::route::{PartRun, part_runs};
use super::{
    AddNorm, QMMA_BK, QMMA_BN, QMMA_MAX_SPLITS, QMMA_MIN_SPLIT_TILES, QMMA_RESIDENT_MAX,
    QMMA_THREADS, QMMA_WAVES, QMMA_WIDE, QmmaTail, SM_REGS, WARP_REG_UNIT, operands,
};
use crate::backend::BackendError;
use crate::backend::gpu::args::{
    QmmaArgs, QmmaGluArgs, QmmaReduceAddNormArgs, QmmaReduceArgs, QmmaReduceGluArgs,
    QmmaReduceRopeArgs,
};
use crate::backend::gpu::kernels::Kernel;
use crate::backend::gpu::qtype::QType;
use crate::backend::gpu::qweight::WeightPart;
use crate::backend::gpu::runtime::{Grid, Runtime};
use crate::backend::gpu::{GpuBackend, GpuTensor, GpuWeight};

impl<R: Runtime> GpuBackend<R> {
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
    fn qmma_splits(
        &self,
        (blocks, threads): (usize, u32),
        k: usize,
        outputs: usize,
        tile: u32,
        used: usize,
        resident: Option<usize>,
    ) -> usize {
        let room = self
            .ctx
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
            Some(r) if tile == 64 => (r * self.ctx.dev.info.sm_count / blocks.max(1)).max(1),
            _ => (waves * self.ctx.dev.info.sm_count).div_ceil(blocks.max(1)),
        };
        // The last k-tile may be partial (MXFP4: `QmmaKTail` in qmma.cuh).
        let tiles = k.div_ceil(QMMA_BK);
        let most = (tiles / QMMA_MIN_SPLIT_TILES)
            .min(QMMA_MAX_SPLITS)
            .min(room);
        let splits = want.min(most).max(1);
        // Equal ranges of whole tiles: no split is left empty.
        let per = tiles.div_ceil(splits);
        tiles.div_ceil(per.max(1)).max(1)
    }

    /// Blocks of `threads` threads of kernel `k` one SM holds by its registers, at most
    /// [`QMMA_RESIDENT_MAX`] (NVIDIA tensor cores only; None elsewhere or when the driver
    /// does not say). Asked of the driver once per kernel and block size.
    fn qmma_resident(&mut self, k: Kernel, threads: u32) -> Result<Option<usize>, BackendError> {
        if !self.ctx.caps.int8_mma {
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
        let f = self.ctx.kernels.get(&self.ctx.dev.rt, k)?;
        let (regs, _, _) = self.ctx.dev.rt.resources(f);
        let Ok(regs) = usize::try_from(regs) else {
            return Ok(None);
        };
        let warps = (threads as usize).div_ceil(self.ctx.dev.info.warp_size);
        let per_warp = (regs * self.ctx.dev.info.warp_size).next_multiple_of(WARP_REG_UNIT);
        let fit = SM_REGS / (per_warp * warps).max(1);
        Ok((fit > 0).then_some(fit.min(QMMA_RESIDENT_MAX)))
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
        let qx8 = self.route().qmma_x8(&operands(x, w, n));
        let xq = match qx8 {
            Some(_) => Some(self.quantize_x(x, n)?),
            None => None,
        };
        let used = qx8.unwrap_or(0);
        let scratch = self.ctx.scratch.dequant.as_ref().map_or(0, |b| b.ptr());
        for run in part_runs(&w.parts) {
            let PartRun { q, mix, ref slots } = run;
            let (bias, y) = self.part_out(slots[0].1, bias, out);
            let ([w0, w1, w2], [r0, r1, r2]) = run.slot_args();
            let cols: usize = slots.iter().map(|(_, p)| p.rows).sum();
            let kernel = self.route().qmma_kernel(rows, xq.is_some(), q, mix, cols);
            let (int8, wide) = match kernel {
                Kernel::Qmma { wide, .. } | Kernel::QmmaMix { wide, .. } => (false, wide),
                _ => (true, false),
            };
            let args = QmmaArgs {
                w0,
                w1,
                w2,
                r0,
                r1,
                r2,
                x: xq.filter(|_| int8).unwrap_or(x.buf.ptr()),
                bias,
                y,
                ws: scratch + used as u64,
                k: k as i32,
                rows: n as i32,
                ldy: m as i32,
            };
            let (bn, threads) = if wide {
                QMMA_WIDE
            } else {
                (QMMA_BN, QMMA_THREADS)
            };
            let blocks: usize = slots.iter().map(|(_, p)| p.rows.div_ceil(bn)).sum();
            let tiles = (blocks, n.div_ceil(rows as usize));
            let resident = if rows == 64 {
                self.qmma_resident(kernel, threads)?
            } else {
                None
            };
            let splits = self.qmma_splits(
                (tiles.0 * tiles.1, threads),
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
            if splits > 1 {
                done |= self.qmma_reduce(&args, splits, cols, whole, n, &tail)?;
            }
        }
        Ok(done)
    }

    /// The split-k reduce after a `qmma_*` launch of `args` (`splits` parts of `cols` output
    /// columns over `n` rows): with `tail`'s work where the launch was the whole matrix
    /// (`whole`) — the residual add and norm (no bias), or the rope and cache write —
    /// returning whether it did that work.
    fn qmma_reduce(
        &mut self,
        args: &QmmaArgs,
        splits: usize,
        cols: usize,
        whole: bool,
        n: usize,
        tail: &QmmaTail<'_>,
    ) -> Result<bool, BackendError> {
        if let (true, QmmaTail::AddNorm(an)) = (whole, tail)
            && args.bias == 0
        {
            self.qmma_reduce_add_norm(args, splits, cols, n, an)?;
            return Ok(true);
        }
        if whole && let QmmaTail::Rope(ro) = *tail {
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
            return Ok(true);
        }
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
        Ok(false)
    }

    /// `qmma_reduce_add_norm`: the split-k sum added to the residual, then its RMSNorm.
    fn qmma_reduce_add_norm(
        &mut self,
        args: &QmmaArgs,
        splits: usize,
        cols: usize,
        n: usize,
        an: &AddNorm,
    ) -> Result<(), BackendError> {
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
            .next_multiple_of(self.ctx.dev.info.warp_size)
            .clamp(64, 1024);
        let grid = Grid {
            blocks: (n as u32, 1, 1),
            threads: threads as u32,
        };
        self.launch_with(Kernel::QmmaReduceAddNorm, grid, &reduce)?;
        self.ctx.scratch.qx = None;
        Ok(())
    }

    /// The gate/up product and SiLU-mul of `n` rows on the tiled kernels (`qmmaglu_*`, row
    /// tile `rows`; parts checked by the caller): the blocks, wide blocks and k splits of the
    /// stacked gate/up launch (`launch_qmma`), each block pairing its gate and up rows, and
    /// with k split, the reduce that takes the SiLU.
    pub(super) fn launch_qmma_glu(
        &mut self,
        x: &GpuTensor,
        [g, u]: [&WeightPart; 2],
        q: QType,
        n: usize,
        rows: u32,
        act: &GpuTensor,
    ) -> Result<(), BackendError> {
        let (k, f) = (x.cols, g.rows);
        let wide = self.route().qmma_wide(rows, 2 * f);
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
        let splits = self.qmma_splits(
            (tiles.0 * tiles.1, threads),
            k,
            n * 2 * f,
            rows,
            0,
            resident,
        );
        let args = QmmaGluArgs {
            wg: g.buf.ptr(),
            wu: u.buf.ptr(),
            x: x.buf.ptr(),
            y: act.buf.ptr(),
            ws: self.ctx.scratch.dequant.as_ref().map_or(0, |b| b.ptr()),
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
}
