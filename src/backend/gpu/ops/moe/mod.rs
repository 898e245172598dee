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
mod launch;
pub(in crate::backend::gpu) mod route;

mod geometry;

use geometry::{CN_E, Layout, max_tiles, used_tiles};

use super::matmul::QX_THREADS;
use crate::backend::gpu::args::{MoeSharedAddArgs, QuantizeXArgs};
use crate::backend::gpu::kernels::Kernel;
use crate::backend::gpu::qtype::QType;
use crate::backend::gpu::runtime::{Grid, Runtime};
use crate::backend::gpu::{GpuBackend, GpuTensor, GpuWeight, check_cols, check_rows, invalid};
use crate::backend::{Backend, BackendError, MoeAct, MoeExperts, MoeShape, SharedExpert};
use launch::{MoeEpilogue, MoeStep};

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

    /// `Backend::moe_ffn` (into [`MoeOut::Delta`]) or its fused norm ([`MoeOut::Norm`]):
    /// the operands checked, then the route's launches ([`route::moe_path`]): assignment,
    /// gate/up, down, the weighted sum, and a shared expert's FFN.
    pub(in crate::backend::gpu) fn launch_moe_ffn(
        &mut self,
        x: &GpuTensor,
        logits: &GpuTensor,
        w: MoeExperts<'_, GpuWeight>,
        s: &MoeShape,
        n: usize,
        out: MoeOut<'_>,
    ) -> Result<(), BackendError> {
        let (gu_q, down_q, [wg, wu, wd]) = moe_operands(x, logits, &w, s, n, &out)?;
        let epi = moe_epilogue(&w, s, x.cols)?;
        if n == 0 {
            return Ok(());
        }
        let (h, ne, f, k) = (x.cols, s.n_expert, s.expert_ff, s.top_k);
        // Sized once for the activation capacity (the first, eager step), so a recorded
        // step never reallocates.
        let lay = Layout::new(x.rows, s, h, self.ctx.dt.size());
        if self
            .ctx
            .scratch
            .moe
            .as_ref()
            .is_none_or(|b| b.bytes() < lay.bytes)
        {
            self.ctx.generation += 1;
            self.ctx.scratch.moe = Some(self.ctx.dev.alloc(lay.bytes, "moe workspace")?);
        }
        let total = n * k;
        let st = MoeStep {
            base: self.ctx.scratch.moe.as_ref().map_or(0, |b| b.ptr()),
            lay,
            n,
            h,
            f,
            k,
            ne,
            tiles: max_tiles(total, ne),
            used: used_tiles(total, ne),
            wg,
            wu,
            wd,
            epi,
        };
        let path = route::moe_path(self.ctx.dt, n, s, h, gu_q, down_q);
        self.moe_assign(&st, &path, x, logits, s)?;
        self.moe_gate_up(&st, path.gate_up, path.prep, x)?;
        self.moe_down(&st, path.down)?;
        let out = match out {
            MoeOut::Delta(out) => out,
            MoeOut::Norm { residual, w, eps } => {
                return self.moe_combine_norm(&st, x, residual, w, eps);
            }
        };
        self.moe_combine(&st, out)?;
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

/// The experts' activation and biases as the kernels take them (gpt-oss's clamped SwiGLU and
/// per-expert biases, checked against the shape; [`MoeEpilogue::PLAIN`] otherwise).
fn moe_epilogue(
    w: &MoeExperts<'_, GpuWeight>,
    s: &MoeShape,
    h: usize,
) -> Result<MoeEpilogue, BackendError> {
    let (alpha, limit) = match s.act {
        MoeAct::Silu => (0.0, 0.0),
        MoeAct::ClampedSwiglu { alpha, limit } => (alpha, limit),
    };
    let mut epi = MoeEpilogue {
        alpha,
        limit,
        ..MoeEpilogue::PLAIN
    };
    if let Some(b) = &w.bias {
        let (ne, f) = (s.n_expert, s.expert_ff);
        let ptr = |what, t: &GpuWeight, cols| {
            if t.rows * t.cols != ne * cols {
                return Err(invalid(format!(
                    "{what}: [{}, {}], expected [{ne}, {cols}]",
                    t.rows, t.cols
                )));
            }
            Ok(t.dense_for(what)?.ptr())
        };
        epi.bg = ptr("moe gate biases", b.gate, f)?;
        epi.bu = ptr("moe up biases", b.up, f)?;
        epi.bd = ptr("moe down biases", b.down, h)?;
    }
    Ok(epi)
}

/// Checks the MoE FFN's operands; the experts' types (gate/up, down; `None`: the compute
/// type) and device addresses (gate, up, down).
#[allow(clippy::type_complexity)]
fn moe_operands(
    x: &GpuTensor,
    logits: &GpuTensor,
    w: &MoeExperts<'_, GpuWeight>,
    s: &MoeShape,
    n: usize,
    out: &MoeOut<'_>,
) -> Result<(Option<QType>, Option<QType>, [u64; 3]), BackendError> {
    s.check().map_err(invalid)?;
    let (h, ne, f) = (x.cols, s.n_expert, s.expert_ff);
    check_cols("moe router logits", logits.cols, ne)?;
    let out_rows = match out {
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
    let (wd, down_q) = experts_of(w.down)?;
    for (q, cols) in [(gu_q, h), (down_q, f)] {
        if let Some(q) = q
            && cols % q.block().0 != 0
        {
            return Err(invalid(format!(
                "moe_ffn: {cols} columns of {q:?} experts are not whole blocks"
            )));
        }
    }
    Ok((gu_q, down_q, [wg, wu, wd]))
}
