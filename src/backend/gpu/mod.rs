//! The GPU backend, written once for every vendor: kernels from `kernels/` compiled at lane
//! start by the runtime's compiler (NVRTC, hipRTC), GEMMs through the vendor BLAS (cuBLAS,
//! rocBLAS), attention in one launch per layer over the paged cache, sampling on the
//! device, decode steps replayed from graphs.
//!
//! Everything lives in one [`GpuBackend`], created and used on its lane's thread: runtime
//! and stream, loaded kernels, BLAS handle, weights, KV pool and workspaces. Nothing is
//! global; two backends in one process (parallel tests) share only the driver's primary
//! context. There is no CPU fallback: every op of the contract runs on the device, and
//! a missing kernel fails `new`. The vendor runtimes ([`runtime::Runtime`]) are the only
//! vendor-specific code.
//!
//! The shared device state is `ctx.rs`'s `GpuCtx` (device, kernels, BLAS, scratch, caps,
//! tuning) with the launch path; the op families are rooms of `ops/` (embed, norm, rope,
//! attention, matmul, moe, sample, arch); `batch`/`meta` hold the step metadata, `graphs`
//! the decode graphs; `args` types every kernel's arguments.

mod args;
mod batch;
mod caps;
mod ctx;
#[cfg(feature = "cuda")]
pub mod cuda_rt;
mod device;
mod graphs;
mod group;
#[cfg(feature = "rocm")]
pub mod hip_rt;
pub mod kernels;
mod meta;
#[cfg(feature = "cuda")]
mod nccl;
mod ops;
mod qtype;
mod qweight;
mod registry;
pub mod runtime;
mod timing;
mod types;

use std::collections::HashMap;

use ctx::ensure;
pub use device::TransferStats;
pub use graphs::GraphStats;

pub use super::open::GpuOptions;
use kernels::Kernel;
pub use qtype::QType;
use runtime::Runtime;
pub use timing::KernelTiming;
pub use types::{GpuBatch, GpuKv, GpuTensor, GpuWeight};

pub use super::DType;
use super::{
    Activation, AttnShape, Backend, BackendError, BatchPlan, HostTensor, KvShape, QkNorm, RopeSpec,
};
use crate::sampling::{SampleRow, Sampled};

/// The GPU backend of one lane, over vendor runtime `R`: the shared device state
/// ([`ctx::GpuCtx`]) and the state of the families that keep some between ops.
pub struct GpuBackend<R: Runtime> {
    // Field order is drop order: graphs and every buffer go before the context (whose
    // device goes last).
    step: batch::StepMeta,
    graphs: graphs::Graphs<R>,
    /// The sampling workspaces (`ops/sample`).
    sample: ops::sample::SampleState,
    /// The tensor-parallel group this backend is a shard of (`group.rs`; none: whole model).
    group: Option<group::GpuGroup<R>>,
    /// Per 64-row tile kernel and block size, its blocks per SM (`qmma_resident`).
    qmma_resident: HashMap<(Kernel, u32), Option<usize>>,
    ctx: ctx::GpuCtx<R>,
}

fn invalid(m: String) -> BackendError {
    BackendError::InvalidBatch(m)
}

fn check_cols(what: &str, got: usize, want: usize) -> Result<(), BackendError> {
    if got != want {
        return Err(invalid(format!("{what}: {got} columns, expected {want}")));
    }
    Ok(())
}

fn check_rows(what: &str, n: usize, cap: usize) -> Result<(), BackendError> {
    if n > cap {
        return Err(invalid(format!("{what}: {n} rows, capacity {cap}")));
    }
    Ok(())
}

impl<R: Runtime> Backend for GpuBackend<R> {
    type Tensor = GpuTensor;
    type Weight = GpuWeight;
    type Kv = GpuKv;
    type Batch = GpuBatch;

    fn name(&self) -> String {
        format!("{}:{}", R::NAME, self.ctx.dev.ordinal)
    }

    fn upload_weight(&mut self, w: HostTensor) -> Result<GpuWeight, BackendError> {
        self.upload_weight_parts(w)
    }

    fn alloc(&mut self, rows: usize, cols: usize) -> Result<GpuTensor, BackendError> {
        self.alloc_activation(rows, cols)
    }

    fn alloc_kv(&mut self, shape: &KvShape) -> Result<GpuKv, BackendError> {
        self.alloc_kv_pool(shape)
    }

    fn prepare(&mut self, plan: &BatchPlan) -> Result<GpuBatch, BackendError> {
        self.prepare_with(plan, None)
    }

    fn prepare_step(&mut self, plan: &BatchPlan, row_cap: usize) -> Result<GpuBatch, BackendError> {
        let key = self.graph_key(plan, row_cap);
        self.prepare_with(plan, key)
    }

    fn padded_rows(&self, b: &GpuBatch) -> Option<usize> {
        b.graph.map(|k| k.rows as usize)
    }

    fn run_step(
        &mut self,
        b: &GpuBatch,
        ops: impl FnMut(&mut Self) -> Result<(), BackendError>,
    ) -> Result<(), BackendError> {
        self.run_step_graphed(b, ops)
    }

    fn embed(
        &mut self,
        table: &GpuWeight,
        first: usize,
        vocab: usize,
        b: &GpuBatch,
        out: &mut GpuTensor,
    ) -> Result<(), BackendError> {
        self.launch_embed(table, first, vocab, b, out)
    }

    fn rms_norm(
        &mut self,
        x: &GpuTensor,
        w: &GpuWeight,
        eps: f32,
        n: usize,
        out: &mut GpuTensor,
    ) -> Result<(), BackendError> {
        self.launch_norm(x, None, w, eps, n, out)
    }

    fn matmul_add_rms_norm(
        &mut self,
        x: &GpuTensor,
        w: &GpuWeight,
        n: usize,
        delta: &mut GpuTensor,
        residual: &mut GpuTensor,
        norm_w: &GpuWeight,
        eps: f32,
        out: &mut GpuTensor,
    ) -> Result<(), BackendError> {
        self.launch_matmul_add_rms_norm(x, w, n, delta, residual, norm_w, eps, out)
    }

    fn add_rms_norm(
        &mut self,
        x: &GpuTensor,
        residual: &mut GpuTensor,
        w: &GpuWeight,
        eps: f32,
        n: usize,
        out: &mut GpuTensor,
    ) -> Result<(), BackendError> {
        check_cols("add_rms_norm residual", residual.cols, x.cols)?;
        check_rows("add_rms_norm residual", n, residual.rows)?;
        self.launch_norm(x, Some(residual.buf.ptr()), w, eps, n, out)
    }

    fn matmul(
        &mut self,
        x: &GpuTensor,
        w: &GpuWeight,
        bias: Option<&GpuWeight>,
        n: usize,
        out: &mut GpuTensor,
    ) -> Result<(), BackendError> {
        self.launch_matmul(x, w, bias, n, out)
    }

    fn rope(
        &mut self,
        qkv: &mut GpuTensor,
        b: &GpuBatch,
        shape: &AttnShape,
        rope: &RopeSpec,
    ) -> Result<(), BackendError> {
        self.launch_rope(qkv, b, shape, rope)
    }

    fn write_kv(
        &mut self,
        kv: &mut GpuKv,
        layer: usize,
        qkv: &GpuTensor,
        b: &GpuBatch,
        shape: &AttnShape,
    ) -> Result<(), BackendError> {
        self.launch_write_kv(kv, layer, qkv, b, shape)
    }

    fn rope_write_kv(
        &mut self,
        qkv: &mut GpuTensor,
        kv: &mut GpuKv,
        layer: usize,
        b: &GpuBatch,
        shape: &AttnShape,
        rope: &RopeSpec,
    ) -> Result<(), BackendError> {
        self.launch_rope_write_kv(qkv, kv, layer, b, shape, rope, None)
    }

    fn matmul_rope_write_kv(
        &mut self,
        x: &GpuTensor,
        w: &GpuWeight,
        bias: Option<&GpuWeight>,
        n: usize,
        qkv: &mut GpuTensor,
        kv: &mut GpuKv,
        layer: usize,
        b: &GpuBatch,
        shape: &AttnShape,
        rope: &RopeSpec,
    ) -> Result<(), BackendError> {
        self.launch_matmul_rope_write_kv(x, w, bias, n, qkv, kv, layer, b, shape, rope)
    }

    fn norm_rope_write_kv(
        &mut self,
        qkv: &mut GpuTensor,
        kv: &mut GpuKv,
        layer: usize,
        b: &GpuBatch,
        shape: &AttnShape,
        rope: &RopeSpec,
        norm: QkNorm<'_, GpuWeight>,
    ) -> Result<(), BackendError> {
        self.launch_rope_write_kv(qkv, kv, layer, b, shape, rope, Some(norm))
    }

    fn attention(
        &mut self,
        qkv: &GpuTensor,
        kv: &GpuKv,
        layer: usize,
        b: &GpuBatch,
        shape: &AttnShape,
        sinks: Option<&GpuWeight>,
        out: &mut GpuTensor,
    ) -> Result<(), BackendError> {
        self.launch_attention(qkv, (kv, layer), b, shape, sinks, out)
    }

    fn glu(
        &mut self,
        act: Activation,
        gate_up: &GpuTensor,
        n: usize,
        out: &mut GpuTensor,
    ) -> Result<(), BackendError> {
        self.launch_glu(act, gate_up, n, out)
    }

    fn matmul_glu(
        &mut self,
        act: Activation,
        x: &GpuTensor,
        w_gate_up: &GpuWeight,
        n: usize,
        gate_up: &mut GpuTensor,
        out: &mut GpuTensor,
    ) -> Result<(), BackendError> {
        self.launch_matmul_glu(act, x, w_gate_up, n, gate_up, out)
    }

    fn gather_rows(
        &mut self,
        x: &GpuTensor,
        b: &GpuBatch,
        out: &mut GpuTensor,
    ) -> Result<(), BackendError> {
        self.launch_gather_rows(x, b, out)
    }

    fn head_rms_norm(
        &mut self,
        qkv: &mut GpuTensor,
        q_w: &GpuWeight,
        k_w: &GpuWeight,
        shape: &AttnShape,
        eps: f32,
        n: usize,
    ) -> Result<(), BackendError> {
        self.launch_head_rms_norm(qkv, q_w, k_w, shape, eps, n)
    }

    fn scale(&mut self, x: &mut GpuTensor, s: f32, n: usize) -> Result<(), BackendError> {
        self.launch_scale_rows(x, s, n)
    }

    fn softcap(&mut self, x: &mut GpuTensor, cap: f32, n: usize) -> Result<(), BackendError> {
        self.launch_softcap(x, cap, n)
    }

    fn moe_ffn(
        &mut self,
        x: &GpuTensor,
        router_logits: &GpuTensor,
        experts: super::MoeExperts<'_, GpuWeight>,
        shape: &super::MoeShape,
        n: usize,
        out: &mut GpuTensor,
    ) -> Result<(), BackendError> {
        let out = ops::moe::MoeOut::Delta(out);
        self.launch_moe_ffn(x, router_logits, experts, shape, n, out)
    }

    fn moe_ffn_add_rms_norm(
        &mut self,
        h: &mut GpuTensor,
        router_logits: &GpuTensor,
        experts: super::MoeExperts<'_, GpuWeight>,
        shape: &super::MoeShape,
        n: usize,
        delta: &mut GpuTensor,
        residual: &mut GpuTensor,
        w: &GpuWeight,
        eps: f32,
    ) -> Result<(), BackendError> {
        let (e, s) = (experts, shape);
        self.launch_moe_ffn_norm(h, router_logits, e, s, n, delta, residual, w, eps)
    }

    fn join_group(&mut self, member: super::GroupMember) -> Result<(), BackendError> {
        self.join(member)
    }

    fn all_reduce_sum(&mut self, x: &mut GpuTensor, n: usize) -> Result<(), BackendError> {
        self.launch_all_reduce(x, n)
    }

    fn all_gather(
        &mut self,
        part: &GpuTensor,
        n: usize,
        out: &mut GpuTensor,
    ) -> Result<(), BackendError> {
        self.launch_all_gather(part, n, out)
    }

    fn sample(
        &mut self,
        logits: &GpuTensor,
        rows: &[SampleRow<'_>],
    ) -> Result<Vec<Sampled>, BackendError> {
        self.sample_on_device(logits, rows)
    }

    fn to_host(&mut self, x: &GpuTensor, n: usize) -> Result<Vec<f32>, BackendError> {
        self.download(x, n)
    }

    fn take_kernel_timings(&mut self) -> Result<Vec<(&'static str, f64)>, BackendError> {
        Ok(GpuBackend::take_kernel_timings(self)?
            .into_iter()
            .map(|t| (t.kernel, t.seconds))
            .collect())
    }

    fn kv_budget_bytes(&self, utilization: f32) -> Option<usize> {
        self.kv_budget(utilization)
    }

    fn kv_element_bytes(&self) -> usize {
        self.ctx.dt.size()
    }
}
