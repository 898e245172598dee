//! Compute backends behind one op contract; the llama forward (`runner`) is written once
//! against it. The backend knows nothing of model files: its ops take their own shapes
//! ([`AttnShape`], [`RopeSpec`]) and weights arrive as [`HostTensor`]s.

pub mod batch;
pub mod collective;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod dtype;
#[cfg(any(feature = "cuda", feature = "rocm"))]
pub mod gpu;
pub mod kernel_cache;
pub mod moe;
pub mod needs;
mod open;
mod options;
pub mod quant;
#[cfg(feature = "rocm")]
pub mod rocm;
pub mod shape;
pub mod tensor;
pub mod tuning;

pub use batch::{BatchPlan, KvShape, SeqSlice};
pub use collective::{GroupMember, HostGroup};
pub use dtype::DType;
pub use moe::{MoeAct, MoeBias, MoeExperts, MoeShape, SharedExpert};
pub use needs::ModelNeeds;
pub use open::{
    DeviceId, GpuOptions, Maker, WithBackend, WithBackends, open, open_group, total_memory,
};
pub use shape::{AttnShape, Llama3Scaling, RopeLayout, RopeSpec};
pub use tensor::{HostData, HostTensor};
pub use tuning::GpuTuning;

use crate::sampling::{SampleRow, Sampled};

/// Errors from a backend. A device error fails the lane's in-flight requests, not the process.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("backend '{backend}' does not support op '{op}' for {dtype}")]
    Unsupported {
        backend: &'static str,
        op: &'static str,
        dtype: String,
    },
    #[error("backend '{0}' is not compiled into this build (enable the `{0}` feature)")]
    NotCompiled(&'static str),
    #[error("out of memory allocating {bytes} bytes for {what}")]
    OutOfMemory { what: &'static str, bytes: usize },
    #[error("device error in {op}: {message}")]
    Device { op: &'static str, message: String },
    #[error("invalid batch: {0}")]
    InvalidBatch(String),
    #[error("weight: {0}")]
    Weight(#[from] quant::QuantError),
}

/// The per-head q/k RMSNorm of [`Backend::norm_rope_write_kv`] (Qwen3, Gemma 3): the
/// weights (`[head_dim]` each), the epsilon, and the step's rows (`n` of
/// [`Backend::head_rms_norm`]).
pub struct QkNorm<'a, W> {
    pub q: &'a W,
    pub k: &'a W,
    pub eps: f32,
    pub n: usize,
}

/// The gate activation of a gated FFN (GLU): `act(x W_g^T) * (x W_u^T)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Activation {
    /// SwiGLU: `silu(g) * u` (Llama, Qwen, Mistral, Phi-3).
    #[default]
    Silu,
    /// GeGLU with the tanh approximation of GELU (Gemma's `gelu_pytorch_tanh`):
    /// `0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) * u`.
    GeluTanh,
}

/// The error of an op a backend does not implement (the default of the family ops).
pub(crate) fn missing(op: &'static str) -> BackendError {
    BackendError::Unsupported {
        backend: "this backend",
        op,
        dtype: "any".into(),
    }
}

/// The op contract. Activations are `[rows, cols]` tensors allocated once with a row
/// capacity; every op takes `n`, the number of rows in use. Matrices are `[out, in]`.
pub trait Backend {
    /// Activation buffer.
    type Tensor;
    /// Uploaded weight.
    type Weight;
    /// The paged KV pool of all layers.
    type Kv;
    /// Batch metadata prepared for the device.
    type Batch;

    /// Short name for logs and metrics (`cpu`, `cuda:0`).
    fn name(&self) -> String;
    /// Moves a host tensor to the backend.
    fn upload_weight(&mut self, w: HostTensor) -> Result<Self::Weight, BackendError>;
    /// An activation buffer with capacity for `rows` rows of `cols` values.
    fn alloc(&mut self, rows: usize, cols: usize) -> Result<Self::Tensor, BackendError>;
    /// The KV pool.
    fn alloc_kv(&mut self, shape: &KvShape) -> Result<Self::Kv, BackendError>;
    /// Uploads the step's metadata (the only host-to-device traffic of a step).
    fn prepare(&mut self, plan: &BatchPlan) -> Result<Self::Batch, BackendError>;
    /// [`Backend::prepare`] for a whole model step whose activation buffers hold `row_cap`
    /// rows. A backend that replays recorded graphs may pad a decode step to a fixed bucket
    /// of rows ([`Backend::padded_rows`]); the plan's rows come first, in order.
    fn prepare_step(
        &mut self,
        plan: &BatchPlan,
        row_cap: usize,
    ) -> Result<Self::Batch, BackendError> {
        let _ = row_cap;
        self.prepare(plan)
    }
    /// Rows (token rows and logits rows alike) a padded step computes; `None` when the step
    /// computes exactly its plan's rows.
    fn padded_rows(&self, b: &Self::Batch) -> Option<usize> {
        let _ = b;
        None
    }
    /// Runs the ops `ops` queues for step `b`. A backend may record them into a graph the
    /// second time a step shape occurs and replay that graph for later steps of the shape
    /// instead of calling `ops` (which it may call more than once if a recording fails);
    /// the result is the same either way.
    fn run_step(
        &mut self,
        b: &Self::Batch,
        mut ops: impl FnMut(&mut Self) -> Result<(), BackendError>,
    ) -> Result<(), BackendError>
    where
        Self: Sized,
    {
        let _ = b;
        ops(self)
    }

    /// `out[t] = table[token_ids[t] - first]`: `table` holds rows `first..first + rows` of a
    /// vocabulary of `vocab` (all of it unsharded, a tensor-parallel shard's part otherwise).
    /// A token outside the table's rows gets a zero row (another shard holds it: the
    /// caller all-reduces); a token id of `vocab` or more is an error.
    fn embed(
        &mut self,
        table: &Self::Weight,
        first: usize,
        vocab: usize,
        b: &Self::Batch,
        out: &mut Self::Tensor,
    ) -> Result<(), BackendError>;
    /// `out = rmsnorm(x) * w`.
    fn rms_norm(
        &mut self,
        x: &Self::Tensor,
        w: &Self::Weight,
        eps: f32,
        n: usize,
        out: &mut Self::Tensor,
    ) -> Result<(), BackendError>;
    /// Fused residual add: `residual += x; out = rmsnorm(residual) * w`.
    fn add_rms_norm(
        &mut self,
        x: &Self::Tensor,
        residual: &mut Self::Tensor,
        w: &Self::Weight,
        eps: f32,
        n: usize,
        out: &mut Self::Tensor,
    ) -> Result<(), BackendError>;
    /// The output projection or the FFN's down matmul, then the next norm: `delta = x @
    /// w^T`, then [`Backend::add_rms_norm`] of `delta` into `residual` and `out`. `delta`
    /// is scratch: a backend may fuse the steps and leave it unwritten.
    #[allow(clippy::too_many_arguments)]
    fn matmul_add_rms_norm(
        &mut self,
        x: &Self::Tensor,
        w: &Self::Weight,
        n: usize,
        delta: &mut Self::Tensor,
        residual: &mut Self::Tensor,
        norm_w: &Self::Weight,
        eps: f32,
        out: &mut Self::Tensor,
    ) -> Result<(), BackendError> {
        self.matmul(x, w, None, n, delta)?;
        self.add_rms_norm(delta, residual, norm_w, eps, n, out)
    }
    /// `out[n, out] = x[n, in] @ w[out, in]^T (+ bias)`.
    fn matmul(
        &mut self,
        x: &Self::Tensor,
        w: &Self::Weight,
        bias: Option<&Self::Weight>,
        n: usize,
        out: &mut Self::Tensor,
    ) -> Result<(), BackendError>;
    /// Rotates the q and k parts of a fused `qkv` tensor in place at each token's position.
    fn rope(
        &mut self,
        qkv: &mut Self::Tensor,
        b: &Self::Batch,
        shape: &AttnShape,
        rope: &RopeSpec,
    ) -> Result<(), BackendError>;
    /// Writes the k and v parts of `qkv` into `layer`'s cache at each token's slot.
    fn write_kv(
        &mut self,
        kv: &mut Self::Kv,
        layer: usize,
        qkv: &Self::Tensor,
        b: &Self::Batch,
        shape: &AttnShape,
    ) -> Result<(), BackendError>;
    /// [`Backend::rope`] then [`Backend::write_kv`]; a backend may do both in one pass.
    fn rope_write_kv(
        &mut self,
        qkv: &mut Self::Tensor,
        kv: &mut Self::Kv,
        layer: usize,
        b: &Self::Batch,
        shape: &AttnShape,
        rope: &RopeSpec,
    ) -> Result<(), BackendError> {
        self.rope(qkv, b, shape, rope)?;
        self.write_kv(kv, layer, qkv, b, shape)
    }
    /// [`Backend::matmul`] of the fused qkv weight into `qkv`, then
    /// [`Backend::rope_write_kv`]; a backend may do both in the matmul's launches.
    #[allow(clippy::too_many_arguments)]
    fn matmul_rope_write_kv(
        &mut self,
        x: &Self::Tensor,
        w: &Self::Weight,
        bias: Option<&Self::Weight>,
        n: usize,
        qkv: &mut Self::Tensor,
        kv: &mut Self::Kv,
        layer: usize,
        b: &Self::Batch,
        shape: &AttnShape,
        rope: &RopeSpec,
    ) -> Result<(), BackendError> {
        self.matmul(x, w, bias, n, qkv)?;
        self.rope_write_kv(qkv, kv, layer, b, shape, rope)
    }
    /// [`Backend::head_rms_norm`] with `norm`, then [`Backend::rope_write_kv`]; a backend may
    /// do all three in one pass (its values then equal the two ops' within rounding).
    #[allow(clippy::too_many_arguments)]
    fn norm_rope_write_kv(
        &mut self,
        qkv: &mut Self::Tensor,
        kv: &mut Self::Kv,
        layer: usize,
        b: &Self::Batch,
        shape: &AttnShape,
        rope: &RopeSpec,
        norm: QkNorm<'_, Self::Weight>,
    ) -> Result<(), BackendError> {
        self.head_rms_norm(qkv, norm.q, norm.k, shape, norm.eps, norm.n)?;
        self.rope_write_kv(qkv, kv, layer, b, shape, rope)
    }
    /// Causal attention of every token's query (q part of `qkv`) over its sequence's paged
    /// context, prefill chunks and decode tokens in one call. `out` is `[n, q_dim]`.
    /// `sinks` (gpt-oss): `[n_heads]` f32 logits, one per query head, that join each row's
    /// softmax denominator and weight no value: `p_j = exp(s_j) / (exp(sink_h) + sum_i
    /// exp(s_i))`. `None`: plain softmax.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &mut self,
        qkv: &Self::Tensor,
        kv: &Self::Kv,
        layer: usize,
        b: &Self::Batch,
        shape: &AttnShape,
        sinks: Option<&Self::Weight>,
        out: &mut Self::Tensor,
    ) -> Result<(), BackendError>;
    /// `out[n, f] = act(gu[:, :f]) * gu[:, f:]` for a fused gate/up tensor of width `2f`.
    fn glu(
        &mut self,
        act: Activation,
        gate_up: &Self::Tensor,
        n: usize,
        out: &mut Self::Tensor,
    ) -> Result<(), BackendError>;
    /// The FFN's first half: `out[n, f] = act(x W_g^T) * (x W_u^T)` for `w_gate_up` holding
    /// the gate rows over the up rows. `gate_up` (`[n, 2f]`) is scratch for the product; a
    /// backend may fuse both steps and never write it.
    fn matmul_glu(
        &mut self,
        act: Activation,
        x: &Self::Tensor,
        w_gate_up: &Self::Weight,
        n: usize,
        gate_up: &mut Self::Tensor,
        out: &mut Self::Tensor,
    ) -> Result<(), BackendError> {
        self.matmul(x, w_gate_up, None, n, gate_up)?;
        self.glu(act, gate_up, n, out)
    }
    /// RMSNorm of every q head (weight `q_w`, `[head_dim]`) and every k head (`k_w`) of a
    /// fused `qkv` tensor in place, over `n` rows; v is untouched (Qwen3, Gemma 3).
    fn head_rms_norm(
        &mut self,
        qkv: &mut Self::Tensor,
        q_w: &Self::Weight,
        k_w: &Self::Weight,
        shape: &AttnShape,
        eps: f32,
        n: usize,
    ) -> Result<(), BackendError> {
        let _ = (qkv, q_w, k_w, shape, eps, n);
        Err(missing("head_rms_norm"))
    }
    /// `x *= s` over `n` rows, in place.
    fn scale(&mut self, x: &mut Self::Tensor, s: f32, n: usize) -> Result<(), BackendError> {
        let _ = (x, s, n);
        Err(missing("scale"))
    }
    /// `x = cap * tanh(x / cap)` over `n` rows, in place (logit soft-capping).
    fn softcap(&mut self, x: &mut Self::Tensor, cap: f32, n: usize) -> Result<(), BackendError> {
        let _ = (x, cap, n);
        Err(missing("softcap"))
    }
    /// The mixture-of-experts FFN of `n` rows: each row of `x` (`[n, hidden]`) goes to the
    /// top `shape.top_k` experts of its row of `router_logits` (`[n, n_expert]`, routed by
    /// [`moe::route_row`]'s rule) and `out[t] = sum_e w_e * down_e(silu(gate_e x) * up_e x)`,
    /// plus `experts.shared`'s gated output where the layer has a shared expert.
    /// The work is grouped by expert for the whole batch (each expert's weights are read
    /// once per call), and the assignment is built where the op runs (no host round trip).
    fn moe_ffn(
        &mut self,
        x: &Self::Tensor,
        router_logits: &Self::Tensor,
        experts: MoeExperts<'_, Self::Weight>,
        shape: &MoeShape,
        n: usize,
        out: &mut Self::Tensor,
    ) -> Result<(), BackendError> {
        let _ = (x, router_logits, experts, shape, n, out);
        Err(missing("moe_ffn"))
    }
    /// [`Backend::moe_ffn`] of the rows of `h` whose output goes straight into the next
    /// [`Backend::add_rms_norm`]: `residual += moe_ffn(h)`, then `h = rmsnorm(residual) * w`.
    /// `delta` is scratch for the FFN output (its contents afterwards are unspecified). A
    /// backend may fuse the expert outputs' weighted sum with the norm.
    #[allow(clippy::too_many_arguments)]
    fn moe_ffn_add_rms_norm(
        &mut self,
        h: &mut Self::Tensor,
        router_logits: &Self::Tensor,
        experts: MoeExperts<'_, Self::Weight>,
        shape: &MoeShape,
        n: usize,
        delta: &mut Self::Tensor,
        residual: &mut Self::Tensor,
        w: &Self::Weight,
        eps: f32,
    ) -> Result<(), BackendError> {
        self.moe_ffn(h, router_logits, experts, shape, n, delta)?;
        self.add_rms_norm(delta, residual, w, eps, n, h)
    }
    /// Makes this backend rank `member.rank` of a tensor-parallel group (before any
    /// collective). A backend without collectives refuses.
    fn join_group(&mut self, member: GroupMember) -> Result<(), BackendError> {
        let _ = member;
        Err(BackendError::Unsupported {
            backend: "this backend",
            op: "tensor parallelism (it has no collectives)",
            dtype: "any".into(),
        })
    }
    /// `x = sum over the group's ranks of x`, over `n` rows (every rank gets the same
    /// values). Called by every rank in the same order.
    fn all_reduce_sum(&mut self, x: &mut Self::Tensor, n: usize) -> Result<(), BackendError> {
        let _ = (x, n);
        Err(missing("all_reduce_sum"))
    }
    /// `out[:n] = [part of rank 0 | part of rank 1 | ...]` by columns, over `n` rows: each
    /// rank's `part` holds its own column block (its width is its tensor's width).
    fn all_gather(
        &mut self,
        part: &Self::Tensor,
        n: usize,
        out: &mut Self::Tensor,
    ) -> Result<(), BackendError> {
        let _ = (part, n, out);
        Err(missing("all_gather"))
    }
    /// Copies the rows that need logits (`b`'s logits rows) to the front of `out`.
    fn gather_rows(
        &mut self,
        x: &Self::Tensor,
        b: &Self::Batch,
        out: &mut Self::Tensor,
    ) -> Result<(), BackendError>;
    /// Samples one token per logits row.
    fn sample(
        &mut self,
        logits: &Self::Tensor,
        rows: &[SampleRow<'_>],
    ) -> Result<Vec<Sampled>, BackendError>;
    /// Downloads `n` rows of a tensor (tests and debugging).
    fn to_host(&mut self, x: &Self::Tensor, n: usize) -> Result<Vec<f32>, BackendError>;

    /// Device-timed kernel durations `(kernel, seconds)` recorded since the last call
    /// (sampled; empty for backends without device timers).
    fn take_kernel_timings(&mut self) -> Result<Vec<(&'static str, f64)>, BackendError> {
        Ok(Vec::new())
    }

    /// Bytes the KV pool may take, from the device memory left after weights and
    /// workspaces, keeping `1 - utilization` of the device free. `None`: not a device with
    /// its own memory (the configured CPU budget applies).
    fn kv_budget_bytes(&self, utilization: f32) -> Option<usize> {
        let _ = utilization;
        None
    }
    /// Bytes per cached K or V element.
    fn kv_element_bytes(&self) -> usize {
        std::mem::size_of::<f32>()
    }
}
