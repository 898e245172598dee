//! Launchers of the model-family ops (`kernels/arch.cu`): per-head q/k RMSNorm (Qwen3,
//! Gemma 3), GeGLU, the embedding scale and logit soft-capping (Gemma).

pub(in crate::backend::gpu) mod kernels;

use crate::backend::gpu::args::{GeluTanhMulArgs, HeadRmsNormArgs, ScaleRowsArgs, SoftcapArgs};
use crate::backend::gpu::kernels::Kernel;
use crate::backend::gpu::runtime::{Grid, Runtime};
use crate::backend::gpu::{GpuBackend, GpuTensor, GpuWeight, check_cols, check_rows};
use crate::backend::{Activation, AttnShape, BackendError};

/// A grid-stride launch over `total` elements.
fn flat_grid(total: usize) -> Grid {
    Grid {
        blocks: (total.div_ceil(256).clamp(1, 65535) as u32, 1, 1),
        threads: 256,
    }
}

impl<R: Runtime> GpuBackend<R> {
    /// `out = act(gate) * up` of `n` rows of `gate_up` (the gate half, then the up half).
    pub(in crate::backend::gpu) fn launch_glu(
        &mut self,
        act: Activation,
        gate_up: &GpuTensor,
        n: usize,
        out: &mut GpuTensor,
    ) -> Result<(), BackendError> {
        match act {
            Activation::Silu => self.launch_silu_mul(gate_up, n, out),
            Activation::GeluTanh => self.launch_gelu_tanh_mul(gate_up, n, out),
        }
    }

    /// `gate_up = x @ w_gate_up^T`, then [`GpuBackend::launch_glu`]: SiLU takes the fused
    /// streaming kernels for small batches (plain and quantized weights).
    pub(in crate::backend::gpu) fn launch_matmul_glu(
        &mut self,
        act: Activation,
        x: &GpuTensor,
        w_gate_up: &GpuWeight,
        n: usize,
        gate_up: &mut GpuTensor,
        out: &mut GpuTensor,
    ) -> Result<(), BackendError> {
        match act {
            Activation::Silu => self.launch_matmul_silu_mul(x, w_gate_up, n, gate_up, out),
            Activation::GeluTanh => {
                self.launch_matmul(x, w_gate_up, None, n, gate_up)?;
                self.launch_gelu_tanh_mul(gate_up, n, out)
            }
        }
    }

    pub(in crate::backend::gpu) fn launch_head_rms_norm(
        &mut self,
        qkv: &mut GpuTensor,
        q_w: &GpuWeight,
        k_w: &GpuWeight,
        shape: &AttnShape,
        eps: f32,
        n: usize,
    ) -> Result<(), BackendError> {
        let hd = shape.head_dim;
        check_cols("head_rms_norm", qkv.cols, shape.qkv_dim())?;
        check_cols("head_rms_norm q weight", q_w.rows * q_w.cols, hd)?;
        check_cols("head_rms_norm k weight", k_w.rows * k_w.cols, hd)?;
        check_rows("head_rms_norm", n, qkv.rows)?;
        if n == 0 {
            return Ok(());
        }
        // Whole warps: block_sum reduces warp by warp.
        let warp = self.ctx.caps.warp;
        let threads = hd.next_multiple_of(warp).clamp(warp, 256);
        let grid = Grid {
            blocks: (n as u32, (shape.n_heads + shape.n_kv_heads) as u32, 1),
            threads: threads as u32,
        };
        let args = HeadRmsNormArgs {
            qkv: qkv.buf.ptr(),
            stride: qkv.cols as i32,
            qw: q_w.dense_for("head_rms_norm")?.ptr(),
            kw: k_w.dense_for("head_rms_norm")?.ptr(),
            n_heads: shape.n_heads as i32,
            head_dim: hd as i32,
            eps,
        };
        self.launch_with(Kernel::HeadRmsNorm, grid, &args)
    }

    pub(in crate::backend::gpu) fn launch_gelu_tanh_mul(
        &mut self,
        gate_up: &GpuTensor,
        n: usize,
        out: &mut GpuTensor,
    ) -> Result<(), BackendError> {
        let f = out.cols;
        check_cols("gelu_tanh_mul", gate_up.cols, 2 * f)?;
        check_rows("gelu_tanh_mul", n, gate_up.rows.min(out.rows))?;
        let total = n * f;
        let args = GeluTanhMulArgs {
            gu: gate_up.buf.ptr(),
            out: out.buf.ptr(),
            f: f as i32,
            total: total as u64,
        };
        self.launch_with(Kernel::GeluTanhMul, flat_grid(total), &args)
    }

    pub(in crate::backend::gpu) fn launch_scale_rows(
        &mut self,
        x: &mut GpuTensor,
        s: f32,
        n: usize,
    ) -> Result<(), BackendError> {
        check_rows("scale", n, x.rows)?;
        let total = n * x.cols;
        let args = ScaleRowsArgs {
            x: x.buf.ptr(),
            s,
            total: total as u64,
        };
        self.launch_with(Kernel::ScaleRows, flat_grid(total), &args)
    }

    pub(in crate::backend::gpu) fn launch_softcap(
        &mut self,
        x: &mut GpuTensor,
        cap: f32,
        n: usize,
    ) -> Result<(), BackendError> {
        check_rows("softcap", n, x.rows)?;
        let total = n * x.cols;
        let args = SoftcapArgs {
            x: x.buf.ptr(),
            cap,
            total: total as u64,
        };
        self.launch_with(Kernel::Softcap, flat_grid(total), &args)
    }
}
