//! Runs a model spec on a backend: uploads the weights of a model's files and runs the llama
//! forward pass, written once against the backend op contract. It sits above both `model`
//! (files and specs) and `backend` (ops), which know nothing of each other's insides.

pub mod needs;
pub mod shard;
pub mod tp;
pub mod weights;

use crate::backend::{
    AttnShape, Backend, BackendError, BatchPlan, HostTensor, MoeBias, MoeExperts, QkNorm,
    SharedExpert,
};
use crate::model::{ModelError, ModelFiles, ModelSpec};
pub use needs::model_needs;
pub use shard::Shard;
pub use weights::{ExpertBias, Ffn, LayerWeights, ModelWeights, load_weights};

/// Why a model could not be loaded onto a backend.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// Reading or checking the model's tensors.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// Uploading or allocating on the backend.
    #[error(transparent)]
    Backend(#[from] BackendError),
}

/// Activation buffers, allocated once for the largest step.
struct Scratch<T> {
    /// `[T, hidden]` residual stream.
    x: T,
    /// `[T, hidden]` normalized input of the next block.
    h: T,
    /// `[T, q_dim + 2 * kv_dim]`
    qkv: T,
    /// `[T, q_dim]`
    attn: T,
    /// `[T, hidden]` output of attention or FFN, added into `x` by the next norm.
    delta: T,
    /// `[T, hidden]` `delta` after its post-norm (Gemma), added instead of it.
    post: T,
    /// `[T, 2 * intermediate]`
    gate_up: T,
    /// `[T, intermediate]`
    act: T,
    /// `[T, n_expert]` router logits (MoE models; one element otherwise).
    router: T,
    /// `[S, hidden]` rows that produce logits.
    last: T,
    /// `[S, vocab]`
    logits: T,
    /// `[S, vocab part]` a shard's own logits before the gather (one element unsharded).
    part: T,
}

/// A Llama-family model resident on a backend.
pub struct Llama<B: Backend> {
    pub spec: ModelSpec,
    /// Each layer's head geometry and attention options, as the attention ops take them.
    shapes: Vec<AttnShape>,
    pub weights: ModelWeights<B::Weight>,
    scratch: Scratch<B::Tensor>,
    max_tokens: usize,
    max_seqs: usize,
    /// This model's place in its tensor-parallel group ([`Shard::WHOLE`] unsharded; more
    /// than one member puts collectives in the forward).
    shard: Shard,
}

impl<B: Backend> Llama<B> {
    /// Uploads the weights of `files` and allocates scratch for steps of up to
    /// `max_tokens` tokens and `max_seqs` sequences.
    pub fn load(
        backend: &mut B,
        files: &ModelFiles,
        max_tokens: usize,
        max_seqs: usize,
    ) -> Result<Self, LoadError> {
        let weights = load_weights(files, |t| {
            backend.upload_weight(t).map_err(LoadError::Backend)
        })?;
        Self::with_weights(
            backend,
            &files.spec,
            weights,
            Shard::WHOLE,
            max_tokens,
            max_seqs,
        )
    }

    /// Shard `shard` of the whole model's host weights `host` (read for `spec`): uploads its
    /// part of them and allocates its scratch. The backend must have joined the shard's
    /// group ([`Backend::join_group`]) when the group has more than one member.
    pub fn load_shard(
        backend: &mut B,
        spec: &ModelSpec,
        host: &ModelWeights<HostTensor>,
        shard: Shard,
        max_tokens: usize,
        max_seqs: usize,
    ) -> Result<Self, LoadError> {
        let part = shard::shard_weights(host, spec, shard)?;
        let weights = part.into_map(|t| backend.upload_weight(t))?;
        let local = shard::shard_spec(spec, shard);
        Self::with_weights(backend, &local, weights, shard, max_tokens, max_seqs)
    }

    /// Allocates scratch for `weights`, the tensors of `s` (a shard's spec when sharded).
    fn with_weights(
        backend: &mut B,
        s: &ModelSpec,
        weights: ModelWeights<B::Weight>,
        shard: Shard,
        max_tokens: usize,
        max_seqs: usize,
    ) -> Result<Self, LoadError> {
        let (t, sq) = (max_tokens, max_seqs);
        let sharded = shard.size > 1;
        let dense = |t: usize| if s.variant.moe.is_some() { 1 } else { t };
        let scratch = Scratch {
            x: backend.alloc(t, s.hidden)?,
            h: backend.alloc(t, s.hidden)?,
            qkv: backend.alloc(t, s.qkv_dim())?,
            attn: backend.alloc(t, s.q_dim())?,
            delta: backend.alloc(t, s.hidden)?,
            post: backend.alloc(if s.variant.post_norms { t } else { 1 }, s.hidden)?,
            // A mixture-of-experts model has no dense FFN: its op keeps its own scratch.
            gate_up: backend.alloc(dense(t), 2 * s.intermediate)?,
            act: backend.alloc(dense(t), s.intermediate)?,
            router: match &s.variant.moe {
                Some(m) => backend.alloc(t, m.n_expert)?,
                None => backend.alloc(1, 1)?,
            },
            last: backend.alloc(sq, s.hidden)?,
            logits: backend.alloc(sq, s.vocab_size)?,
            part: match sharded {
                true => backend.alloc(sq, shard.vocab(s.vocab_size).len())?,
                false => backend.alloc(1, 1)?,
            },
        };
        Ok(Self {
            spec: s.clone(),
            shapes: (0..s.n_layers).map(|l| s.layer_shape(l)).collect(),
            weights,
            scratch,
            max_tokens,
            max_seqs,
            shard,
        })
    }

    /// The logits buffer written by the last [`Llama::forward`].
    pub fn logits(&self) -> &B::Tensor {
        &self.scratch.logits
    }

    /// `[S, hidden]` the final-norm hidden states of the last [`Llama::forward`]'s logits
    /// rows, in the order of its logits (what embeddings pool), valid until the next call.
    pub fn hidden_rows(&self) -> &B::Tensor {
        &self.scratch.last
    }

    /// Runs one step. Returns the logits of the plan's logits rows (`plan.logits_rows()`,
    /// in order) in the first rows of the buffer (a padded step computes more after
    /// them), valid until the next call.
    pub fn forward(
        &mut self,
        backend: &mut B,
        kv: &mut B::Kv,
        plan: &BatchPlan,
    ) -> Result<&B::Tensor, BackendError> {
        let n = plan.num_tokens();
        // The logits scratch holds `max_seqs` rows: prompt-logprobs steps must fit it too.
        let n_logits = plan.num_logits_rows();
        if n == 0
            || n > self.max_tokens
            || plan.seqs.len() > self.max_seqs
            || n_logits > self.max_seqs
        {
            return Err(BackendError::InvalidBatch(format!(
                "step of {n} tokens / {} sequences / {n_logits} logits rows outside capacity {} / {} / {}",
                plan.seqs.len(),
                self.max_tokens,
                self.max_seqs,
                self.max_seqs
            )));
        }
        let b = backend.prepare_step(plan, self.max_tokens.min(self.max_seqs))?;
        let (n, n_logits) = backend
            .padded_rows(&b)
            .map_or((n, n_logits), |rows| (rows, rows));
        let (spec, shapes, tp) = (&self.spec, &self.shapes, self.shard.size > 1);
        let (w, s) = (&self.weights, &mut self.scratch);
        let (eps, v) = (spec.rms_eps, &spec.variant);
        let vocab = self.shard.vocab(spec.vocab_size);
        backend.run_step(&b, |backend| {
            // Each shard looks up the tokens of its part of the vocabulary (zero rows for the
            // rest); the all-reduce assembles every row exactly.
            backend.embed(&w.embed, vocab.start, spec.vocab_size, &b, &mut s.x)?;
            reduce(backend, tp, &mut s.x, n)?;
            if let Some(scale) = v.embed_scale {
                backend.scale(&mut s.x, scale, n)?;
            }
            // Whether the pending residual delta is `post` (post-normed) rather than `delta`.
            let mut post = false;
            // Whether the FFN already added its output and ran the next norm into `s.h`.
            let mut normed = false;
            for (l, lw) in w.layers.iter().enumerate() {
                let (shape, rope) = (&shapes[l], spec.layer_rope(l));
                if l == 0 {
                    backend.rms_norm(&s.x, &lw.attn_norm, eps, n, &mut s.h)?;
                } else if !normed {
                    let d = if post { &s.post } else { &s.delta };
                    backend.add_rms_norm(d, &mut s.x, &lw.attn_norm, eps, n, &mut s.h)?;
                }
                if let (Some(q), Some(k)) = (&lw.q_norm, &lw.k_norm) {
                    backend.matmul(&s.h, &lw.wqkv, lw.bqkv.as_ref(), n, &mut s.qkv)?;
                    let norm = QkNorm { q, k, eps, n };
                    backend.norm_rope_write_kv(&mut s.qkv, kv, l, &b, shape, rope, norm)?;
                } else {
                    let (wqkv, bqkv) = (&lw.wqkv, lw.bqkv.as_ref());
                    backend.matmul_rope_write_kv(
                        &s.h, wqkv, bqkv, n, &mut s.qkv, kv, l, &b, shape, rope,
                    )?;
                }
                backend.attention(&s.qkv, kv, l, &b, shape, lw.sinks.as_ref(), &mut s.attn)?;
                if tp || lw.post_attn_norm.is_some() || lw.bo.is_some() {
                    // The fused op has no bias: the output projection with its bias alone.
                    backend.matmul(&s.attn, &lw.wo, lw.bo.as_ref(), n, &mut s.delta)?;
                    reduce(backend, tp, &mut s.delta, n)?;
                    post = post_norm(backend, lw.post_attn_norm.as_ref(), eps, n, s)?;
                    let d = if post { &s.post } else { &s.delta };
                    backend.add_rms_norm(d, &mut s.x, &lw.ffn_norm, eps, n, &mut s.h)?;
                } else {
                    // Nothing between the output projection and the norm: one op.
                    let (x, d, h) = (&mut s.x, &mut s.delta, &mut s.h);
                    backend.matmul_add_rms_norm(&s.attn, &lw.wo, n, d, x, &lw.ffn_norm, eps, h)?;
                }
                // The norm after the FFN, where the FFN may run it (nothing between them).
                let next = match w.layers.get(l + 1) {
                    Some(nl) => Some(&nl.attn_norm),
                    None => (n_logits > 0).then_some(&w.norm),
                };
                let next = next.filter(|_| !tp && lw.post_ffn_norm.is_none());
                normed = ffn(backend, &lw.ffn, v, n, s, next.map(|w| (w, eps)))?;
                reduce(backend, tp, &mut s.delta, n)?;
                post = post_norm(backend, lw.post_ffn_norm.as_ref(), eps, n, s)?;
            }
            if n_logits > 0 {
                let d = if post { &s.post } else { &s.delta };
                if !normed {
                    backend.add_rms_norm(d, &mut s.x, &w.norm, eps, n, &mut s.h)?;
                }
                backend.gather_rows(&s.h, &b, &mut s.last)?;
                head(backend, w.output(), tp, n_logits, s)?;
                if let Some(cap) = v.final_softcap {
                    backend.softcap(&mut s.logits, cap, n_logits)?;
                }
            }
            Ok(())
        })?;
        Ok(&s.logits)
    }
}

/// Sums a row-split matmul's partial outputs over the shards (nothing unsharded).
fn reduce<B: Backend>(
    backend: &mut B,
    sharded: bool,
    x: &mut B::Tensor,
    n: usize,
) -> Result<(), BackendError> {
    match sharded {
        true => backend.all_reduce_sum(x, n),
        false => Ok(()),
    }
}

/// The output head from `s.last` into `s.logits`: sharded, each shard's vocabulary part
/// into `s.part`, then gathered by columns.
fn head<B: Backend>(
    backend: &mut B,
    w: &B::Weight,
    sharded: bool,
    n: usize,
    s: &mut Scratch<B::Tensor>,
) -> Result<(), BackendError> {
    if !sharded {
        return backend.matmul(&s.last, w, None, n, &mut s.logits);
    }
    backend.matmul(&s.last, w, None, n, &mut s.part)?;
    backend.all_gather(&s.part, n, &mut s.logits)
}

/// `post = rmsnorm(delta) * w` when the layer has the post-norm `w`; whether it had.
fn post_norm<B: Backend>(
    backend: &mut B,
    w: Option<&B::Weight>,
    eps: f32,
    n: usize,
    s: &mut Scratch<B::Tensor>,
) -> Result<bool, BackendError> {
    match w {
        Some(w) => {
            backend.rms_norm(&s.delta, w, eps, n, &mut s.post)?;
            Ok(true)
        }
        None => Ok(false),
    }
}

/// The FFN of one layer from `s.h` into `s.delta`: dense (SwiGLU or GeGLU) or a mixture of
/// experts (router matmul, then the grouped expert op with any shared expert). With `next`
/// (the following norm's weight and eps), it instead adds its output to `s.x` and runs that
/// norm into `s.h` in the same op (the down matmul's, or the grouped expert op's); returns
/// whether it did.
fn ffn<B: Backend>(
    backend: &mut B,
    w: &Ffn<B::Weight>,
    v: &crate::model::spec::Variant,
    n: usize,
    s: &mut Scratch<B::Tensor>,
    next: Option<(&B::Weight, f32)>,
) -> Result<bool, BackendError> {
    match (w, &v.moe) {
        (Ffn::Dense { w_gate_up, w_down }, _) => {
            backend.matmul_glu(v.act, &s.h, w_gate_up, n, &mut s.gate_up, &mut s.act)?;
            match next {
                Some((nw, eps)) => {
                    let (x, d, h) = (&mut s.x, &mut s.delta, &mut s.h);
                    backend.matmul_add_rms_norm(&s.act, w_down, n, d, x, nw, eps, h)?;
                    Ok(true)
                }
                None => {
                    backend.matmul(&s.act, w_down, None, n, &mut s.delta)?;
                    Ok(false)
                }
            }
        }
        (
            Ffn::Moe {
                router,
                gate,
                up,
                down,
                shared,
                router_bias,
                bias,
            },
            Some(shape),
        ) => {
            backend.matmul(&s.h, router, router_bias.as_ref(), n, &mut s.router)?;
            let shared = shared.as_ref().map(|sh| SharedExpert {
                gate_up: &sh.gate_up,
                down: &sh.down,
                gate: &sh.gate,
            });
            let experts = MoeExperts {
                gate,
                up,
                down,
                shared,
                bias: bias.as_ref().map(|b| MoeBias {
                    gate: &b.gate,
                    up: &b.up,
                    down: &b.down,
                }),
            };
            match next {
                Some((nw, eps)) => {
                    let (h, d, x) = (&mut s.h, &mut s.delta, &mut s.x);
                    backend.moe_ffn_add_rms_norm(h, &s.router, experts, shape, n, d, x, nw, eps)?;
                    Ok(true)
                }
                None => {
                    backend.moe_ffn(&s.h, &s.router, experts, shape, n, &mut s.delta)?;
                    Ok(false)
                }
            }
        }
        (Ffn::Moe { .. }, None) => Err(BackendError::InvalidBatch(
            "expert weights without a mixture-of-experts spec".into(),
        )),
    }
}
