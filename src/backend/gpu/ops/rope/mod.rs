//! Rotary embedding and paged-cache writes (`kernels/rope.cu`, `kernels/kv.cu`): rope alone,
//! the k/v write alone, or both in one launch; the rope frequency tables, uploaded once per
//! rope spec.

pub(in crate::backend::gpu) mod kernels;

use super::matmul::route::{QkvPath, RopeFacts};
use super::matmul::{QkvRope, QmmaTail, matmul_operands, operands};
use crate::backend::gpu::args::{RopeArgs, RopeKvArgs, RopeKvNormArgs, WriteKvArgs};
use crate::backend::gpu::kernels::Kernel;
use crate::backend::gpu::runtime::{Grid, Runtime};
use crate::backend::gpu::{
    GpuBackend, GpuBatch, GpuKv, GpuTensor, GpuWeight, check_cols, check_rows, invalid,
};
use crate::backend::{AttnShape, BackendError, QkNorm, RopeLayout, RopeSpec};

/// Heads per rope block (`ROPE_HEADS` in `kernels/rope.cu`).
const ROPE_HEADS: usize = 8;

/// What `rope` and the fused `rope_kv` share: the launch shape and the leading arguments.
struct RopeLaunch {
    grid: Grid,
    qkv: u64,
    stride: i32,
    positions: u64,
    inv_freq: u64,
    head_dim: i32,
    rot_dim: i32,
    interleaved: i32,
    mscale: f32,
}

impl<R: Runtime> GpuBackend<R> {
    /// Checks `qkv` against `b` and `shape`; the launch shape and leading rope arguments.
    fn rope_launch(
        &mut self,
        qkv: &GpuTensor,
        b: &GpuBatch,
        shape: &AttnShape,
        rope: &RopeSpec,
    ) -> Result<RopeLaunch, BackendError> {
        let l = self.layout(b)?;
        check_cols("rope", qkv.cols, shape.qkv_dim())?;
        check_rows("rope", l.n_tokens, qkv.rows)?;
        let inv_freq = self.inv_freqs(rope)?;
        let groups = (shape.n_heads + shape.n_kv_heads).div_ceil(ROPE_HEADS) as u32;
        Ok(RopeLaunch {
            grid: Grid {
                blocks: (l.n_tokens as u32, groups, 1),
                threads: 64,
            },
            qkv: qkv.buf.ptr(),
            stride: qkv.cols as i32,
            positions: self.meta_ptr(l.positions),
            inv_freq,
            head_dim: shape.head_dim as i32,
            rot_dim: rope.dim as i32,
            interleaved: (rope.layout == RopeLayout::Interleaved) as i32,
            mscale: rope.attn_factor,
        })
    }

    /// Device addresses of `layer`'s K and V in the paged cache, checked against `shape`.
    fn kv_layer(
        &self,
        kv: &GpuKv,
        layer: usize,
        shape: &AttnShape,
    ) -> Result<(u64, u64), BackendError> {
        let w = shape.kv_dim();
        check_cols("write_kv", w, kv.shape.slot_width())?;
        if layer >= kv.shape.num_layers {
            return Err(invalid(format!("layer {layer} of {}", kv.shape.num_layers)));
        }
        let layer_bytes = (kv.shape.num_slots() * w * self.ctx.dt.size()) as u64;
        let k = kv.buf.ptr() + 2 * layer as u64 * layer_bytes;
        Ok((k, k + layer_bytes))
    }

    /// The device table of `rope`'s inverse frequencies, uploaded the first time the spec is
    /// seen (each distinct spec keeps its table).
    fn inv_freqs(&mut self, rope: &RopeSpec) -> Result<u64, BackendError> {
        if let Some((_, buf)) = self.ctx.scratch.rope.iter().find(|(r, _)| r == rope) {
            return Ok(buf.ptr());
        }
        let f = rope.inv_freqs();
        if self.ctx.dev.capturing {
            return Err(invalid(
                "rope frequencies first uploaded while recording".into(),
            ));
        }
        self.ctx.generation += 1;
        let buf = self.ctx.dev.alloc(f.len() * 4, "rope frequencies")?;
        let bytes: Vec<u8> = f.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.ctx.dev.upload(&buf, 0, &bytes)?;
        let ptr = buf.ptr();
        self.ctx.scratch.rope.push((rope.clone(), buf));
        Ok(ptr)
    }

    pub(in crate::backend::gpu) fn launch_rope(
        &mut self,
        qkv: &mut GpuTensor,
        b: &GpuBatch,
        shape: &AttnShape,
        rope: &RopeSpec,
    ) -> Result<(), BackendError> {
        let r = self.rope_launch(qkv, b, shape, rope)?;
        let args = RopeArgs {
            qkv: r.qkv,
            stride: r.stride,
            positions: r.positions,
            inv_freq: r.inv_freq,
            head_dim: r.head_dim,
            rot_dim: r.rot_dim,
            interleaved: r.interleaved,
            mscale: r.mscale,
            heads: (shape.n_heads + shape.n_kv_heads) as i32,
        };
        self.launch_with(Kernel::Rope, r.grid, &args)
    }

    pub(in crate::backend::gpu) fn launch_write_kv(
        &mut self,
        kv: &mut GpuKv,
        layer: usize,
        qkv: &GpuTensor,
        b: &GpuBatch,
        shape: &AttnShape,
    ) -> Result<(), BackendError> {
        let l = self.layout(b)?;
        check_cols("write_kv input", qkv.cols, shape.qkv_dim())?;
        check_rows("write_kv", l.n_tokens, qkv.rows)?;
        let (k, v) = self.kv_layer(kv, layer, shape)?;
        let grid = Grid {
            blocks: (l.n_tokens as u32, 1, 1),
            threads: 128,
        };
        let args = WriteKvArgs {
            qkv: qkv.buf.ptr(),
            stride: qkv.cols as i32,
            q_dim: shape.q_dim() as i32,
            width: shape.kv_dim() as i32,
            slots: self.meta_ptr(l.slots),
            k_cache: k,
            v_cache: v,
        };
        self.launch_with(Kernel::WriteKv, grid, &args)
    }

    /// Rope and the cache write of `layer` in one launch; with `norm`, the q/k head norms
    /// first in the same launch (`head_rms_norm`'s values, rounded as its store would be).
    #[allow(clippy::too_many_arguments)]
    pub(in crate::backend::gpu) fn launch_rope_write_kv(
        &mut self,
        qkv: &mut GpuTensor,
        kv: &mut GpuKv,
        layer: usize,
        b: &GpuBatch,
        shape: &AttnShape,
        rope: &RopeSpec,
        norm: Option<QkNorm<'_, GpuWeight>>,
    ) -> Result<(), BackendError> {
        let r = self.rope_launch(qkv, b, shape, rope)?;
        let (k, v) = self.kv_layer(kv, layer, shape)?;
        let l = self.layout(b)?;
        let slots = self.meta_ptr(l.slots);
        let Some(norm) = norm else {
            let args = RopeKvArgs {
                qkv: r.qkv,
                stride: r.stride,
                positions: r.positions,
                inv_freq: r.inv_freq,
                head_dim: r.head_dim,
                rot_dim: r.rot_dim,
                interleaved: r.interleaved,
                mscale: r.mscale,
                n_heads: shape.n_heads as i32,
                n_kv: shape.n_kv_heads as i32,
                slots,
                k_cache: k,
                v_cache: v,
            };
            return self.launch_with(Kernel::RopeKv, r.grid, &args);
        };
        let hd = shape.head_dim;
        check_cols("head_rms_norm q weight", norm.q.rows * norm.q.cols, hd)?;
        check_cols("head_rms_norm k weight", norm.k.rows * norm.k.cols, hd)?;
        if norm.n != l.n_tokens {
            return Err(invalid(format!(
                "head norms of {} rows in a step of {}",
                norm.n, l.n_tokens
            )));
        }
        // A thread per rotated pair (whole warps, at least the rope's 64).
        let warp = self.ctx.dev.info.warp_size;
        let threads = (rope.dim / 2).next_multiple_of(warp).max(64);
        if threads > 1024 {
            return Err(invalid(format!("head norms of head size {hd}")));
        }
        let grid = Grid {
            threads: threads as u32,
            ..r.grid
        };
        let args = RopeKvNormArgs {
            qkv: r.qkv,
            stride: r.stride,
            positions: r.positions,
            inv_freq: r.inv_freq,
            head_dim: r.head_dim,
            rot_dim: r.rot_dim,
            interleaved: r.interleaved,
            mscale: r.mscale,
            n_heads: shape.n_heads as i32,
            n_kv: shape.n_kv_heads as i32,
            slots,
            k_cache: k,
            v_cache: v,
            qw: norm.q.dense_for("head_rms_norm")?.ptr(),
            kw: norm.k.dense_for("head_rms_norm")?.ptr(),
            eps: norm.eps,
        };
        self.launch_with(Kernel::RopeKvNorm, grid, &args)
    }

    /// The qkv matmul, rope and cache write of `layer`: in the matmul's own launches where
    /// [`Self::qkv_rope`] allows (quantized decode rows, and the tiled batches whose k is
    /// split: their reduce), else the matmul and then `rope_kv`.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::backend::gpu) fn launch_matmul_rope_write_kv(
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
        let bias_ptr = matmul_operands(x, w, bias, n, qkv)?;
        match self.qkv_rope(x, w, n, (kv, layer), b, (shape, rope))? {
            Some((QkvPath::Decode(rows), epi)) => {
                return self.launch_qdot(x, w, bias_ptr, n, rows, qkv, Some(&epi));
            }
            Some((QkvPath::Tiles(rows), epi)) => {
                if self.launch_qmma(x, w, bias_ptr, n, rows, qkv, QmmaTail::Rope(&epi))? {
                    return Ok(());
                }
            }
            None => self.launch_matmul(x, w, bias, n, qkv)?,
        }
        self.launch_rope_write_kv(qkv, kv, layer, b, shape, rope, None)
    }

    /// Whether the qkv matmul may rope and cache its own output, on which kernels
    /// ([`Route::qkv_rope`](super::matmul::route::Route::qkv_rope)), and with what: the
    /// step must be the batch's (its positions and slots). The matmul's shapes are checked
    /// by the caller.
    fn qkv_rope(
        &mut self,
        x: &GpuTensor,
        w: &GpuWeight,
        n: usize,
        (kv, layer): (&GpuKv, usize),
        b: &GpuBatch,
        (shape, rope): (&AttnShape, &RopeSpec),
    ) -> Result<Option<(QkvPath, QkvRope)>, BackendError> {
        let hd = shape.head_dim;
        let interleaved = rope.layout == RopeLayout::Interleaved;
        let facts = RopeFacts {
            qkv_dim: shape.qkv_dim(),
            head_dim: hd,
            rot_dim: rope.dim,
            interleaved,
        };
        let Some(path) = self.route().qkv_rope(&operands(x, w, n), &facts) else {
            return Ok(None);
        };
        let l = self.layout(b)?;
        if l.n_tokens != n {
            return Ok(None);
        }
        let (k_cache, v_cache) = self.kv_layer(kv, layer, shape)?;
        let epi = QkvRope {
            positions: self.meta_ptr(l.positions),
            inv_freq: self.inv_freqs(rope)?,
            slots: self.meta_ptr(l.slots),
            k_cache,
            v_cache,
            q_dim: shape.q_dim() as i32,
            kv_dim: shape.kv_dim() as i32,
            head_dim: hd as i32,
            rot_dim: rope.dim as i32,
            mscale: rope.attn_factor,
            interleaved,
        };
        Ok(Some((path, epi)))
    }
}
