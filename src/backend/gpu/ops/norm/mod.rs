//! RMSNorm launchers (`kernels/norm.cu`): plain or with the residual add fused in, on the
//! 16-byte vector kernels when rows split into whole aligned chunks. At decode sizes in bf16
//! with quantized weights, the vector kernels also leave the output as 8-bit blocks of 32 in
//! the dequant scratch for the quantized matmul after them ([`QxRows`]).

pub(in crate::backend::gpu) mod kernels;

use crate::backend::BackendError;
use crate::backend::gpu::args::{AddRmsNormArgs, AddRmsNormVecArgs, RmsNormArgs, RmsNormVecArgs};
use crate::backend::gpu::kernels::Kernel;
use crate::backend::gpu::ops::matmul::QxRows;
use crate::backend::gpu::runtime::{Grid, Runtime};
use crate::backend::gpu::{GpuBackend, GpuTensor, GpuWeight, check_cols, check_rows};

impl<R: Runtime> GpuBackend<R> {
    /// `out = rms_norm(x (+ residual, stored back))` over `n` rows; `resid` is the
    /// residual's device address for the fused add.
    pub(in crate::backend::gpu) fn launch_norm(
        &mut self,
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
        let wb = w.dense_for("rms_norm")?.ptr();
        self.launch_norm_raw(x.buf.ptr(), resid, wb, eps, n, h, out.buf.ptr())
    }

    /// [`GpuBackend::launch_norm`] on device addresses (`n` rows of `h` columns each,
    /// checked by the caller).
    #[allow(clippy::too_many_arguments)]
    pub(in crate::backend::gpu) fn launch_norm_raw(
        &mut self,
        x: u64,
        resid: Option<u64>,
        wb: u64,
        eps: f32,
        n: usize,
        h: usize,
        out: u64,
    ) -> Result<(), BackendError> {
        // Whole warps: block_sum reduces warp by warp (64 lanes on CDNA).
        let warp = self.ctx.caps.warp;
        let ptrs = [x, wb, out, resid.unwrap_or(0)];
        let (vec, threads) = if self.whole_chunks(h, &ptrs) {
            let chunk = 16 / self.ctx.dt.size();
            // Two 16-byte chunks per thread stay in registers between the two passes.
            let threads = (h / chunk)
                .div_ceil(2)
                .next_multiple_of(warp)
                .clamp(64, 1024);
            (true, threads)
        } else {
            // Up to eight values per thread stay in registers between the two passes; more
            // threads keep more loads in flight (the kernel is latency-bound at decode).
            (false, h.div_ceil(4).next_multiple_of(warp).clamp(128, 1024))
        };
        let grid = Grid {
            blocks: (n as u32, 1, 1),
            threads: threads as u32,
        };
        let xq = if vec { self.qx_slot(n, h) } else { None };
        let (w, h) = (wb, h as i32);
        match (resid, vec) {
            (None, false) => {
                let args = RmsNormArgs { x, w, out, h, eps };
                self.launch_with(Kernel::RmsNorm, grid, &args)?;
            }
            (None, true) => {
                let xq = xq.unwrap_or(0);
                let args = RmsNormVecArgs {
                    x,
                    w,
                    out,
                    xq,
                    h,
                    eps,
                };
                self.launch_with(Kernel::RmsNormVec, grid, &args)?;
            }
            (Some(residual), false) => {
                let args = AddRmsNormArgs {
                    x,
                    residual,
                    w,
                    out,
                    h,
                    eps,
                };
                self.launch_with(Kernel::AddRmsNorm, grid, &args)?;
            }
            (Some(residual), true) => {
                let args = AddRmsNormVecArgs {
                    x,
                    residual,
                    w,
                    out,
                    xq: xq.unwrap_or(0),
                    h,
                    eps,
                };
                self.launch_with(Kernel::AddRmsNormVec, grid, &args)?;
            }
        }
        self.ctx.scratch.qx = xq.map(|at| QxRows {
            x: out,
            rows: n,
            cols: h as usize,
            at,
            norm: None,
        });
        Ok(())
    }
}
