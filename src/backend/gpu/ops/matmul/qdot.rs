//! The quantized decode matmuls (`kernels/qgemv.cu`): `qdot_*` on activations quantized
//! to 8-bit blocks of 32 (bf16: the rows a norm or the launch before left, [`QxRows`], else
//! `quantize_x`), `qgemv_*` on compute-type activations, their gate/up pairs fused with
//! SiLU-mul, and the one-row residual matmul that leaves its norm to the next
//! (`qdot_norm_*`).

use super::route::{PartRun, part_runs, qdot_norm_offsets};
use super::{
    AddNorm, GEMV_WARPS, NormIn, QDOT_NORM_WARPS, QGEMV_ROWS_PER_WARP, QX_THREADS, QkvRope, QxRows,
    operands, qx_bytes,
};
use crate::backend::BackendError;
use crate::backend::gpu::args::{
    QdotArgs, QdotInArgs, QdotNormArgs, QdotSiluArgs, QdotSiluInArgs, QgemvArgs, QgemvSiluArgs,
    QuantizeXArgs,
};
use crate::backend::gpu::kernels::{Kernel, QGEMV_ROWS};
use crate::backend::gpu::qtype::QType;
use crate::backend::gpu::qweight::WeightPart;
use crate::backend::gpu::runtime::{Grid, Runtime};
use crate::backend::gpu::{GpuBackend, GpuTensor, GpuWeight};

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

impl<R: Runtime> GpuBackend<R> {
    /// Where a kernel that makes `n` rows of `cols` values may also leave them quantized
    /// for the decode matmul after it (bf16, up to 8 rows, whole blocks of 32): the dequant
    /// scratch, where `quantize_x` would put them.
    pub(in crate::backend::gpu) fn qx_slot(&self, n: usize, cols: usize) -> Option<u64> {
        let buf = self.ctx.scratch.dequant.as_ref()?;
        let fits = self.ctx.dt == crate::backend::DType::Bf16
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
        match self.ctx.scratch.qx {
            Some(q) if (q.x, q.rows, q.cols) == want && (takes_norm || q.norm.is_none()) => {
                self.ctx.scratch.qx = None;
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
        let Some(q) = self.ctx.scratch.qx.take() else {
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
    pub(super) fn quantize_x(&mut self, x: &GpuTensor, n: usize) -> Result<u64, BackendError> {
        let xq = self.ctx.scratch.dequant.as_ref().map_or(0, |b| b.ptr());
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
        let takes = self.route().qdot_takes_norm(&operands(x, w, n), rows);
        let (xq, ni) = self.qx_of(x, n, takes)?;
        let r = rope.copied().unwrap_or_default();
        for run in part_runs(&w.parts) {
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

    /// `residual += x @ w^T` for one decode row on `qdot_norm_*` of type `q` (a one-part
    /// weight of `h` rows, 32 output columns a block; `NormPath::QdotNorm`), which also
    /// leaves the RMSNorm (weight `norm`) to the next quantized matmul: per 32 columns
    /// `residual * norm` as 8-bit rows in the dequant scratch after the launch's own input
    /// (which it reads meanwhile), and the sum of `residual^2` after those ([`NormIn`];
    /// `out` is written by that matmul or by [`GpuBackend::settle_qx`]). The route takes it
    /// only within a step ([`GpuBackend::fuse_across_ops`]: the runner's tensors outlive the
    /// pending norm), with room, and with [`GpuTuning::qdot_norm`] on.
    ///
    /// [`GpuTuning::qdot_norm`]: crate::backend::GpuTuning
    pub(super) fn launch_qdot_norm(
        &mut self,
        x: &GpuTensor,
        w: &GpuWeight,
        n: usize,
        an: AddNorm,
        h: usize,
        q: QType,
    ) -> Result<(), BackendError> {
        let scratch = self.ctx.scratch.dequant.as_ref().map_or(0, |b| b.ptr());
        let (off, ss_off) = qdot_norm_offsets(n, x.cols, h);
        let (oxq, oss) = (scratch + off as u64, scratch + ss_off as u64);
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
        let warp = self.ctx.dev.info.warp_size as u32;
        let grid = Grid {
            blocks: ((h / 32) as u32, 1, 1),
            threads: QDOT_NORM_WARPS * warp,
        };
        self.launch_with(Kernel::QdotNorm { q }, grid, &args)?;
        self.ctx.scratch.qx = Some(QxRows {
            x: an.out,
            rows: n,
            cols: h,
            at: oxq,
            norm: Some(NormIn { ss: oss, add: an }),
        });
        Ok(())
    }

    /// `out = x @ w^T (+ bias)` for `n` rows on `qgemv_*` (`rows` bucket, compute-type
    /// activations): one launch a part, each writing its columns.
    pub(super) fn launch_qgemv(
        &mut self,
        x: &GpuTensor,
        w: &GpuWeight,
        bias: Option<u64>,
        n: usize,
        rows: u32,
        out: &GpuTensor,
    ) -> Result<(), BackendError> {
        let (m, k) = (w.rows, w.cols);
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
        Ok(())
    }

    /// A quantized gate/up pair `[g, u]` of type `q` and SiLU-mul in one launch of
    /// `qdot_silu_*` (8-bit activations) at `GluPath::QdotSilu`'s type, row bucket and
    /// `takes_norm`: the rows then finish a norm the launch before left (`qdot_silu_in_*`).
    pub(super) fn launch_qdot_silu(
        &mut self,
        x: &GpuTensor,
        [g, u]: [&WeightPart; 2],
        n: usize,
        (q, rows, takes_norm): (QType, u32, bool),
        act: &GpuTensor,
    ) -> Result<(), BackendError> {
        let f = act.cols;
        // One warp per output column (a gate row and its up row).
        let grid = self.gemv_grid(f.div_ceil(GEMV_WARPS));
        let (xq, ni) = self.qx_of(x, n, takes_norm)?;
        let args = QdotSiluArgs {
            xq,
            wg: g.buf.ptr(),
            wu: u.buf.ptr(),
            y: act.buf.ptr(),
            k: x.cols as i32,
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
        self.launch_with(Kernel::QdotSilu { q, rows }, grid, &args)
    }

    /// A quantized gate/up pair and SiLU-mul in one launch of `qgemv_silu_*` (compute-type
    /// activations; `GluPath::QgemvSilu`).
    pub(super) fn launch_qgemv_silu(
        &mut self,
        x: &GpuTensor,
        [g, u]: [&WeightPart; 2],
        q: QType,
        n: usize,
        rows: u32,
        act: &GpuTensor,
    ) -> Result<(), BackendError> {
        let f = act.cols;
        // One warp per output column (a gate row and its up row).
        let grid = self.gemv_grid(f.div_ceil(GEMV_WARPS));
        let args = QgemvSiluArgs {
            wg: g.buf.ptr(),
            wu: u.buf.ptr(),
            x: x.buf.ptr(),
            y: act.buf.ptr(),
            k: x.cols as i32,
            f: f as i32,
            rows: n as i32,
            ldy: f as i32,
        };
        self.launch_with(Kernel::QgemvSilu { q, rows }, grid, &args)
    }
}
