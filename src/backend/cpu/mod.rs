//! The CPU reference backend: plain f32 loops (GEMMs through the `gemm` crate, rayon over
//! both cores for large work). It is the oracle every GPU result is checked against.
//! Weights keep their file's type: GGUF blocks are multiplied as they are (`qmatmul`), with
//! activations quantized to 8 bits per block; f16/bf16 rows are widened on the fly.

mod attention;
mod moe;
pub mod ops;
pub mod qdot;
#[cfg(target_arch = "x86_64")]
mod qdot_avx2;
#[cfg(target_arch = "x86_64")]
mod qdot_avx512;
mod qdot_select;
pub mod qmatmul;

use attention::AttnGeom;

use super::quant;
use super::{
    Activation, AttnShape, Backend, BackendError, BatchPlan, HostData, HostTensor, KvShape,
    RopeLayout, RopeSpec,
};
use super::{GroupMember, MoeExperts, MoeShape};
use crate::sampling::{CpuSampler, SampleRow, Sampled};
pub use qdot::Kernels;
use qmatmul::QScratch;

/// A `[rows, cols]` activation buffer.
#[derive(Debug, Clone)]
pub struct CpuTensor {
    pub data: Vec<f32>,
    pub cols: usize,
}

/// The paged KV pool: per layer, `[num_blocks * block_size, n_kv_heads * head_dim]` for K and V.
#[derive(Debug)]
pub struct CpuKv {
    pub shape: KvShape,
    pub k: Vec<Vec<f32>>,
    pub v: Vec<Vec<f32>>,
}

/// A validated step plus the row-to-sequence map.
#[derive(Debug)]
pub struct CpuBatch {
    pub plan: BatchPlan,
    pub row_seq: Vec<u32>,
    pub logits_rows: Vec<u32>,
}

/// The CPU backend. Holds only scratch; no global state.
#[derive(Debug)]
pub struct CpuBackend {
    kv_shape: Option<KvShape>,
    sampler: CpuSampler,
    /// The rope spec `inv_freqs` was computed for.
    rope_spec: Option<RopeSpec>,
    inv_freqs: Vec<f32>,
    cos_sin: Vec<(f32, f32)>,
    /// The dot kernels of the instruction set in use.
    kernels: Kernels,
    /// Dequantize every weight to f32 at upload (the exact f32 reference path).
    f32_weights: bool,
    qscratch: QScratch,
    moe: moe::MoeScratch,
    /// The tensor-parallel group this backend is a shard of (none: the whole model).
    group: Option<GroupMember>,
}

impl Default for CpuBackend {
    fn default() -> Self {
        Self::with_kernels(Kernels::detect())
    }
}

impl CpuBackend {
    /// Weights in their file's type, with the fastest kernels this CPU runs.
    pub fn new() -> Self {
        Self::default()
    }

    /// Weights in their file's type, multiplied by `kernels` (tests pin the portable ones).
    pub fn with_kernels(kernels: Kernels) -> Self {
        Self {
            kv_shape: None,
            sampler: CpuSampler::default(),
            rope_spec: None,
            inv_freqs: Vec::new(),
            cos_sin: Vec::new(),
            kernels,
            f32_weights: false,
            qscratch: QScratch::default(),
            moe: moe::MoeScratch::default(),
            group: None,
        }
    }

    /// Every weight dequantized to f32 at upload: exact f32 matmuls of the dequantized
    /// weights (the reference quantized results are checked against), at 4-8x the memory.
    pub fn with_f32_weights() -> Self {
        Self {
            f32_weights: true,
            ..Self::default()
        }
    }

    /// The name of the kernels in use (`avx2`, `portable`).
    pub fn kernels_name(&self) -> &'static str {
        self.kernels.name
    }
}

/// The values of an uploaded vector weight (always f32: see `upload_weight`).
fn values(w: &HostTensor) -> Result<&[f32], BackendError> {
    w.values().ok_or(BackendError::Unsupported {
        backend: "cpu",
        op: "weight not uploaded",
        dtype: w.weight_type().to_string(),
    })
}

/// The values of an attention sink weight: `n_heads` logits, none NaN or +inf (a row's
/// softmax would be NaN); -inf is a sink of no weight.
fn attention_sinks(w: &HostTensor, n_heads: usize) -> Result<&[f32], BackendError> {
    let v = values(w)?;
    if w.shape.len() != 1 || v.len() != n_heads {
        return Err(BackendError::InvalidBatch(format!(
            "attention sinks: shape {:?}, expected [{n_heads}] (one logit per query head)",
            w.shape
        )));
    }
    if let Some((h, x)) = v
        .iter()
        .enumerate()
        .find(|(_, x)| x.is_nan() || **x == f32::INFINITY)
    {
        return Err(BackendError::InvalidBatch(format!(
            "attention sinks: head {h} has logit {x}, expected a number below +inf"
        )));
    }
    Ok(v)
}

fn check_rows(what: &'static str, want: usize, have: usize) -> Result<(), BackendError> {
    if want > have {
        return Err(BackendError::InvalidBatch(format!(
            "{what}: {want} values in a buffer of {have}"
        )));
    }
    Ok(())
}

fn check_cols(what: &'static str, got: usize, want: usize) -> Result<(), BackendError> {
    if got != want {
        return Err(BackendError::InvalidBatch(format!(
            "{what}: {got} columns, expected {want}"
        )));
    }
    Ok(())
}

impl Backend for CpuBackend {
    type Tensor = CpuTensor;
    type Weight = HostTensor;
    type Kv = CpuKv;
    type Batch = CpuBatch;

    fn name(&self) -> String {
        "cpu".into()
    }

    /// Keeps matrices in their file's type, copied out of the file's mapping into memory of
    /// their own (a model file truncated or replaced on disk while served would otherwise
    /// SIGBUS the process at the next read of a page); vectors (norms, biases) become f32.
    /// With [`CpuBackend::with_f32_weights`], everything does.
    fn upload_weight(&mut self, w: HostTensor) -> Result<HostTensor, BackendError> {
        if self.f32_weights || w.shape.len() < 2 {
            return Ok(w.into_f32()?);
        }
        let parts = match &w.data {
            HostData::Stacked(parts) => parts.as_slice(),
            _ => std::slice::from_ref(&w),
        };
        for p in parts {
            if qdot::ActKind::of(p.weight_type()).is_none() {
                return Err(BackendError::Unsupported {
                    backend: "cpu",
                    op: "matmul",
                    dtype: p.weight_type().to_string(),
                });
            }
        }
        Ok(w.into_owned())
    }

    fn alloc(&mut self, rows: usize, cols: usize) -> Result<CpuTensor, BackendError> {
        self.qscratch.reserve(rows * cols);
        Ok(CpuTensor {
            data: vec![0.0; rows * cols],
            cols,
        })
    }

    fn alloc_kv(&mut self, shape: &KvShape) -> Result<CpuKv, BackendError> {
        let per_layer = shape.num_slots() * shape.slot_width();
        let layer = || vec![0.0f32; per_layer];
        self.kv_shape = Some(*shape);
        Ok(CpuKv {
            shape: *shape,
            k: (0..shape.num_layers).map(|_| layer()).collect(),
            v: (0..shape.num_layers).map(|_| layer()).collect(),
        })
    }

    fn prepare(&mut self, plan: &BatchPlan) -> Result<CpuBatch, BackendError> {
        let shape = self
            .kv_shape
            .ok_or_else(|| BackendError::InvalidBatch("no KV cache allocated".into()))?;
        plan.validate(&shape)?;
        let mut row_seq = Vec::with_capacity(plan.num_tokens());
        for (i, s) in plan.seqs.iter().enumerate() {
            row_seq.extend(std::iter::repeat_n(i as u32, s.q_len as usize));
        }
        Ok(CpuBatch {
            plan: plan.clone(),
            row_seq,
            logits_rows: plan.logits_rows(),
        })
    }

    fn embed(
        &mut self,
        table: &HostTensor,
        first: usize,
        vocab: usize,
        b: &CpuBatch,
        out: &mut CpuTensor,
    ) -> Result<(), BackendError> {
        let h = table.cols();
        check_cols("embed", out.cols, h)?;
        for (t, &id) in b.plan.token_ids.iter().enumerate() {
            let id = id as usize;
            if id >= vocab {
                return Err(BackendError::InvalidBatch(format!(
                    "token id {id} >= vocab {vocab}"
                )));
            }
            let row = &mut out.data[t * h..(t + 1) * h];
            let Some(id) = id.checked_sub(first).filter(|&r| r < table.rows()) else {
                // Another shard's row: the all-reduce after the lookup adds it.
                row.fill(0.0);
                continue;
            };
            match &table.data {
                HostData::F32(v) => row.copy_from_slice(&v[id * h..(id + 1) * h]),
                // Only the looked-up rows are dequantized.
                HostData::Raw { ty, bytes } => {
                    let rb = ty.byte_size(h as u64)? as usize;
                    quant::dequantize(*ty, &bytes[id * rb..(id + 1) * rb], row)?;
                }
                HostData::Stacked(_) => {
                    return Err(BackendError::Unsupported {
                        backend: "cpu",
                        op: "embed",
                        dtype: table.type_label(),
                    });
                }
            }
        }
        Ok(())
    }

    fn rms_norm(
        &mut self,
        x: &CpuTensor,
        w: &HostTensor,
        eps: f32,
        n: usize,
        out: &mut CpuTensor,
    ) -> Result<(), BackendError> {
        let (h, w) = (x.cols, values(w)?);
        for (xr, or) in x.data[..n * h]
            .chunks_exact(h)
            .zip(out.data.chunks_exact_mut(h))
        {
            ops::rms_norm_row(xr, w, eps, or);
        }
        Ok(())
    }

    fn add_rms_norm(
        &mut self,
        x: &CpuTensor,
        residual: &mut CpuTensor,
        w: &HostTensor,
        eps: f32,
        n: usize,
        out: &mut CpuTensor,
    ) -> Result<(), BackendError> {
        let (h, w) = (x.cols, values(w)?);
        let rows = x.data[..n * h]
            .chunks_exact(h)
            .zip(residual.data.chunks_exact_mut(h));
        for ((xr, rr), or) in rows.zip(out.data.chunks_exact_mut(h)) {
            rr.iter_mut().zip(xr).for_each(|(r, v)| *r += v);
            ops::rms_norm_row(rr, w, eps, or);
        }
        Ok(())
    }

    fn matmul(
        &mut self,
        x: &CpuTensor,
        w: &HostTensor,
        bias: Option<&HostTensor>,
        n: usize,
        out: &mut CpuTensor,
    ) -> Result<(), BackendError> {
        let (m, k) = (w.rows(), w.cols());
        check_cols("matmul input", x.cols, k)?;
        check_cols("matmul output", out.cols, m)?;
        let bias = bias.map(values).transpose()?;
        if let Some(v) = w.values() {
            ops::matmul(&x.data, v, bias, n, k, m, &mut out.data);
            return Ok(());
        }
        let kern = self.kernels;
        qmatmul::matmul(&kern, &mut self.qscratch, &x.data, w, n, &mut out.data)?;
        if let Some(b) = bias {
            for row in out.data[..n * m].chunks_exact_mut(m) {
                row.iter_mut().zip(b).for_each(|(o, b)| *o += b);
            }
        }
        Ok(())
    }

    fn rope(
        &mut self,
        qkv: &mut CpuTensor,
        b: &CpuBatch,
        shape: &AttnShape,
        rope: &RopeSpec,
    ) -> Result<(), BackendError> {
        check_cols("rope", qkv.cols, shape.qkv_dim())?;
        if self.rope_spec.as_ref() != Some(rope) {
            self.inv_freqs = rope.inv_freqs();
            self.rope_spec = Some(rope.clone());
        }
        let hd = shape.head_dim;
        let heads = shape.n_heads + shape.n_kv_heads;
        let interleaved = rope.layout == RopeLayout::Interleaved;
        for (t, &pos) in b.plan.positions.iter().enumerate() {
            self.cos_sin.clear();
            let m = rope.attn_factor;
            self.cos_sin.extend(self.inv_freqs.iter().map(|&f| {
                let (s, c) = (pos as f64 * f as f64).sin_cos();
                (c as f32 * m, s as f32 * m)
            }));
            let row = &mut qkv.data[t * qkv.cols..t * qkv.cols + heads * hd];
            for head in row.chunks_exact_mut(hd) {
                ops::rope_head(&mut head[..rope.dim], &self.cos_sin, interleaved);
            }
        }
        Ok(())
    }

    fn write_kv(
        &mut self,
        kv: &mut CpuKv,
        layer: usize,
        qkv: &CpuTensor,
        b: &CpuBatch,
        shape: &AttnShape,
    ) -> Result<(), BackendError> {
        let (q, w) = (shape.q_dim(), shape.kv_dim());
        check_cols("write_kv", w, kv.shape.slot_width())?;
        for (t, &slot) in b.plan.slot_mapping.iter().enumerate() {
            let row = &qkv.data[t * qkv.cols..(t + 1) * qkv.cols];
            let s = slot as usize * w;
            kv.k[layer][s..s + w].copy_from_slice(&row[q..q + w]);
            kv.v[layer][s..s + w].copy_from_slice(&row[q + w..q + 2 * w]);
        }
        Ok(())
    }

    fn attention(
        &mut self,
        qkv: &CpuTensor,
        kv: &CpuKv,
        layer: usize,
        b: &CpuBatch,
        shape: &AttnShape,
        sinks: Option<&HostTensor>,
        out: &mut CpuTensor,
    ) -> Result<(), BackendError> {
        check_cols("attention output", out.cols, shape.q_dim())?;
        shape.check().map_err(BackendError::InvalidBatch)?;
        let sinks = sinks
            .map(|w| attention_sinks(w, shape.n_heads))
            .transpose()?;
        let g = AttnGeom {
            sinks,
            ..AttnGeom::new(shape, qkv.cols, kv.shape)
        };
        attention::attention(
            &g,
            &b.plan,
            &b.row_seq,
            &qkv.data,
            &kv.k[layer],
            &kv.v[layer],
            &mut out.data,
        );
        Ok(())
    }

    fn glu(
        &mut self,
        act: Activation,
        gate_up: &CpuTensor,
        n: usize,
        out: &mut CpuTensor,
    ) -> Result<(), BackendError> {
        glu_rows(gate_up, n, out, ops::glu_row(act))
    }

    fn head_rms_norm(
        &mut self,
        qkv: &mut CpuTensor,
        q_w: &HostTensor,
        k_w: &HostTensor,
        shape: &AttnShape,
        eps: f32,
        n: usize,
    ) -> Result<(), BackendError> {
        check_cols("head_rms_norm", qkv.cols, shape.qkv_dim())?;
        let (hd, q_w, k_w) = (shape.head_dim, values(q_w)?, values(k_w)?);
        check_cols("head_rms_norm q weight", q_w.len(), hd)?;
        check_cols("head_rms_norm k weight", k_w.len(), hd)?;
        let heads = shape.n_heads + shape.n_kv_heads;
        for row in qkv.data[..n * qkv.cols].chunks_exact_mut(qkv.cols) {
            for (i, head) in row[..heads * hd].chunks_exact_mut(hd).enumerate() {
                let w = if i < shape.n_heads { q_w } else { k_w };
                ops::rms_norm_in_place(head, w, eps);
            }
        }
        Ok(())
    }

    fn scale(&mut self, x: &mut CpuTensor, s: f32, n: usize) -> Result<(), BackendError> {
        x.data[..n * x.cols].iter_mut().for_each(|v| *v *= s);
        Ok(())
    }

    fn softcap(&mut self, x: &mut CpuTensor, cap: f32, n: usize) -> Result<(), BackendError> {
        x.data[..n * x.cols]
            .iter_mut()
            .for_each(|v| *v = cap * (*v / cap).tanh());
        Ok(())
    }

    fn moe_ffn(
        &mut self,
        x: &CpuTensor,
        router_logits: &CpuTensor,
        experts: MoeExperts<'_, HostTensor>,
        shape: &MoeShape,
        n: usize,
        out: &mut CpuTensor,
    ) -> Result<(), BackendError> {
        let kern = self.kernels;
        moe::moe_ffn(
            &kern,
            &mut self.qscratch,
            &mut self.moe,
            x,
            router_logits,
            experts,
            shape,
            n,
            out,
        )
    }

    fn gather_rows(
        &mut self,
        x: &CpuTensor,
        b: &CpuBatch,
        out: &mut CpuTensor,
    ) -> Result<(), BackendError> {
        let c = x.cols;
        check_cols("gather_rows", out.cols, c)?;
        for (i, &r) in b.logits_rows.iter().enumerate() {
            let r = r as usize;
            out.data[i * c..(i + 1) * c].copy_from_slice(&x.data[r * c..(r + 1) * c]);
        }
        Ok(())
    }

    fn sample(
        &mut self,
        logits: &CpuTensor,
        rows: &[SampleRow<'_>],
    ) -> Result<Vec<Sampled>, BackendError> {
        let v = logits.cols;
        Ok(rows
            .iter()
            .enumerate()
            .map(|(i, row)| self.sampler.sample(&logits.data[i * v..(i + 1) * v], row))
            .collect())
    }

    fn join_group(&mut self, member: GroupMember) -> Result<(), BackendError> {
        self.group = Some(member);
        Ok(())
    }

    fn all_reduce_sum(&mut self, x: &mut CpuTensor, n: usize) -> Result<(), BackendError> {
        let len = n * x.cols;
        check_rows("all_reduce_sum", len, x.data.len())?;
        match &self.group {
            Some(g) => g.all_reduce_sum(&mut x.data[..len]),
            None => Ok(()),
        }
    }

    fn all_gather(
        &mut self,
        part: &CpuTensor,
        n: usize,
        out: &mut CpuTensor,
    ) -> Result<(), BackendError> {
        let (p, o) = (n * part.cols, n * out.cols);
        check_rows("all_gather", p, part.data.len())?;
        check_rows("all_gather", o, out.data.len())?;
        match &self.group {
            Some(g) => g.all_gather_cols(&part.data[..p], n, &mut out.data[..o]),
            None => {
                check_cols("all_gather", out.cols, part.cols)?;
                out.data[..o].copy_from_slice(&part.data[..p]);
                Ok(())
            }
        }
    }

    fn to_host(&mut self, x: &CpuTensor, n: usize) -> Result<Vec<f32>, BackendError> {
        Ok(x.data[..n * x.cols].to_vec())
    }
}

/// `out[r] = act(gate) * up` for each of the first `n` rows of a fused `[gate | up]` tensor
/// (width `2f`), with `row` the activation's row kernel.
fn glu_rows(
    gate_up: &CpuTensor,
    n: usize,
    out: &mut CpuTensor,
    row: fn(&[f32], &[f32], &mut [f32]),
) -> Result<(), BackendError> {
    let f = out.cols;
    check_cols("glu", gate_up.cols, 2 * f)?;
    for (gu, o) in gate_up.data[..n * 2 * f]
        .chunks_exact(2 * f)
        .zip(out.data.chunks_exact_mut(f))
    {
        row(&gu[..f], &gu[f..], o);
    }
    Ok(())
}
