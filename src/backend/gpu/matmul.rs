//! Matmul launchers: one or two rows stream the weights through `kernels/gemv.cu` (faster
//! than the BLAS there), more rows go to the vendor BLAS GEMM plus a bias kernel; the
//! SwiGLU activation, alone or fused into the gate/up streaming matmul.

use super::args::{AddBiasArgs, GemvArgs, GemvSiluMulArgs, SiluMulArgs, SiluMulVecArgs};
use super::kernels::{GEMV_MAX_ROWS, Kernel};
use super::runtime::{self, Grid, Runtime};
use super::{GpuBackend, GpuTensor, GpuWeight, check_cols, check_rows, invalid};
use crate::backend::BackendError;

/// Warps per block of the streaming matmul kernels (`GEMV_WARPS` in `kernels/gemv.cu`).
const GEMV_WARPS: usize = 4;

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
            && self.whole_chunks(w.cols, &[x.buf.ptr(), w.buf.ptr()])
    }

    fn gemv_grid(&self, blocks: usize) -> Grid {
        Grid {
            blocks: (blocks as u32, 1, 1),
            threads: (GEMV_WARPS * self.dev.info.warp_size) as u32,
        }
    }

    pub(super) fn launch_matmul(
        &mut self,
        x: &GpuTensor,
        w: &GpuWeight,
        bias: Option<&GpuWeight>,
        n: usize,
        out: &mut GpuTensor,
    ) -> Result<(), BackendError> {
        let (m, k) = (w.rows, w.cols);
        check_cols("matmul input", x.cols, k)?;
        check_cols("matmul output", out.cols, m)?;
        check_rows("matmul", n, x.rows.min(out.rows))?;
        if m > 0 && self.gemv_fits(n, x, w) {
            let bias = bias.map_or(Ok(0), |b| {
                check_cols("matmul bias", b.rows * b.cols, m).map(|_| b.buf.ptr())
            })?;
            let per_block = GEMV_WARPS * gemv_rows_per_warp(n);
            let args = GemvArgs {
                x: x.buf.ptr(),
                w: w.buf.ptr(),
                bias,
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
        if n > 0 && m > 0 {
            if [n, k, m].iter().any(|&v| v > i32::MAX as usize) {
                return Err(invalid(format!("GEMM {n}x{k}x{m} too large")));
            }
            let (blas, dt) = (&self.blas, self.dt);
            // SAFETY: x holds n*k, w m*k and out n*m elements of `dt` (shapes checked above);
            // all three buffers are live.
            self.dev.timed("matmul", |rt| unsafe {
                rt.gemm(blas, dt, x.buf.ptr(), w.buf.ptr(), out.buf.ptr(), n, k, m)
                    .map_err(runtime::dev_err("matmul"))
            })?;
        }
        if let Some(b) = bias {
            check_cols("matmul bias", b.rows * b.cols, m)?;
            let total = n * m;
            let grid = Grid {
                blocks: (total.div_ceil(256).min(65535) as u32, 1, 1),
                threads: 256,
            };
            let args = AddBiasArgs {
                x: out.buf.ptr(),
                bias: b.buf.ptr(),
                cols: m as i32,
                total: total as u64,
            };
            self.launch_with(Kernel::AddBias, grid, &args)?;
        }
        Ok(())
    }

    pub(super) fn launch_silu_mul(
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

    pub(super) fn launch_matmul_silu_mul(
        &mut self,
        x: &GpuTensor,
        w_gate_up: &GpuWeight,
        n: usize,
        gate_up: &mut GpuTensor,
        act: &mut GpuTensor,
    ) -> Result<(), BackendError> {
        let f = act.cols;
        if !self.gemv_fits(n, x, w_gate_up) {
            self.launch_matmul(x, w_gate_up, None, n, gate_up)?;
            return self.launch_silu_mul(gate_up, n, act);
        }
        check_cols("matmul_silu_mul input", x.cols, w_gate_up.cols)?;
        check_cols("matmul_silu_mul weight", w_gate_up.rows, 2 * f)?;
        check_rows("matmul_silu_mul", n, x.rows.min(act.rows))?;
        let args = GemvSiluMulArgs {
            x: x.buf.ptr(),
            w: w_gate_up.buf.ptr(),
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
}
