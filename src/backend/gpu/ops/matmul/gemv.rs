//! The dense and BLAS side of the matmuls: one or two rows of a dense weight streamed by
//! `kernels/gemv.cu` (alone or with the SiLU-mul), the vendor BLAS GEMM and the bias after
//! it, a quantized weight dequantized into the scratch for the GEMM, and SiLU-mul alone.

use super::GEMV_WARPS;
use crate::backend::BackendError;
use crate::backend::gpu::args::{
    AddBiasArgs, GemvArgs, GemvSiluMulArgs, SiluMulArgs, SiluMulVecArgs,
};
use crate::backend::gpu::kernels::Kernel;
use crate::backend::gpu::runtime::{self, Grid, Runtime};
use crate::backend::gpu::{GpuBackend, GpuTensor, GpuWeight, check_cols, check_rows, invalid};

/// Weight rows per warp of `gemv_*_m{n}` (the instantiations in `kernels/gemv.cu`).
fn gemv_rows_per_warp(n: usize) -> usize {
    if n == 1 { 1 } else { 2 }
}

impl<R: Runtime> GpuBackend<R> {
    /// `out = x @ w^T (+ bias)` of a dense weight on `gemv_*_m{rows}`
    /// ([`MatmulPath::Gemv`](super::route::MatmulPath)).
    pub(super) fn launch_gemv(
        &mut self,
        x: &GpuTensor,
        w: &GpuWeight,
        bias: Option<u64>,
        rows: u32,
        out: &GpuTensor,
    ) -> Result<(), BackendError> {
        let (m, k) = (w.rows, w.cols);
        let per_block = GEMV_WARPS * gemv_rows_per_warp(rows as usize);
        let args = GemvArgs {
            x: x.buf.ptr(),
            w: w.dense().map_or(0, |b| b.ptr()),
            bias: bias.unwrap_or(0),
            y: out.buf.ptr(),
            k: k as i32,
            n: m as i32,
        };
        self.launch_with(
            Kernel::Gemv { rows },
            self.gemv_grid(m.div_ceil(per_block)),
            &args,
        )
    }

    /// The gate/up product of a dense weight and SiLU-mul in one launch of
    /// `gemv_silu_mul_m{rows}` (`n` rows; shapes checked here).
    pub(super) fn launch_gemv_silu(
        &mut self,
        x: &GpuTensor,
        w_gate_up: &GpuWeight,
        n: usize,
        act: &GpuTensor,
    ) -> Result<(), BackendError> {
        let f = act.cols;
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

    pub(super) fn gemv_grid(&self, blocks: usize) -> Grid {
        Grid {
            blocks: (blocks as u32, 1, 1),
            threads: (GEMV_WARPS * self.ctx.dev.info.warp_size) as u32,
        }
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
        let (blas, dt) = (&self.ctx.blas, self.ctx.dt);
        // SAFETY: the callers pass x of n*k, w of m*k and out of n*m elements of `dt` (shapes
        // checked by them); all three buffers are live.
        self.ctx.dev.timed("matmul", |rt| unsafe {
            rt.gemm(blas, dt, x, w, out, n, k, m)
                .map_err(runtime::dev_err("matmul"))
        })
    }

    pub(super) fn add_bias(
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

    /// Dequantizes every part of `w` into the scratch (`[rows, cols]` of the compute type);
    /// returns its device address.
    pub(super) fn dequantize_into_scratch(&mut self, w: &GpuWeight) -> Result<u64, BackendError> {
        let (m, k) = (w.rows, w.cols);
        let size = self.ctx.dt.size();
        let scratch = match &self.ctx.scratch.dequant {
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
            let chunk = 16 / self.ctx.dt.size();
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
}
