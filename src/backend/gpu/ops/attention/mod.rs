//! Host side of paged attention: picks the kernel instantiation for the head size and the
//! step's largest item, launches it once over every item and KV head, then merges split-K
//! partials when the step has any: inside the decode kernel (the last part block of each
//! split row and KV head merges them), else by an `attn_combine` launch.

pub(in crate::backend::gpu) mod kernels;

use crate::backend::gpu::args::{AttnArgs, AttnCombineArgs, AttnDecArgs};
use crate::backend::gpu::kernels::{AttnHead, Kernel};
use crate::backend::gpu::ops::matmul::QxRows;
use crate::backend::gpu::runtime::{Grid, Runtime};
use crate::backend::gpu::{
    GpuBackend, GpuKv, GpuTensor, GpuWeight, check_cols, check_rows, ensure, invalid,
};
use crate::backend::{AttnShape, BackendError};

/// Warps per attention block (`ATTN_WARPS` in `kernels/attention.cuh`).
const ATTN_WARPS: usize = 4;
/// Threads per split-K merge block (`COMBINE_THREADS` in `kernels/attention_decode.cu`).
const COMBINE_THREADS: u32 = 128;
/// Most query heads per KV head and parts per split row for the folded merge: its weights
/// (heads x parts floats) must fit every decode variant's shared memory (`attn_dec_merge`).
const MERGE_MAX_GROUP: usize = 16;
const MERGE_MAX_PARTS: usize = 64;

/// Dynamic shared memory of the tensor-core variant at head size `hd` (`tc_smem_bytes` in
/// `kernels/attention_tc.cu`): a pass's 128 query vectors, then two stages of 64-position K
/// and V tiles, rows of `hd + 8` bf16.
pub(in crate::backend::gpu) fn tc_smem_bytes(hd: usize) -> u32 {
    ((128 + 4 * 64) * (hd + 8) * 2) as u32
}

/// Checks `launch_attention`'s tensors against `shape` and the step's `n_tokens`; returns the
/// sinks' device pointer (0: none).
fn check_inputs(
    qkv: &GpuTensor,
    (kv, layer): (&GpuKv, usize),
    n_tokens: usize,
    shape: &AttnShape,
    sinks: Option<&GpuWeight>,
    out: &GpuTensor,
) -> Result<u64, BackendError> {
    let (hd, n_heads, n_kv) = (shape.head_dim, shape.n_heads, shape.n_kv_heads);
    check_cols("attention output", out.cols, shape.q_dim())?;
    check_cols("attention input", qkv.cols, shape.qkv_dim())?;
    check_rows("attention", n_tokens, qkv.rows.min(out.rows))?;
    shape.check().map_err(invalid)?;
    if kv.shape.head_dim != hd || kv.shape.n_kv_heads != n_kv || layer >= kv.shape.num_layers {
        return Err(invalid(format!(
            "attention: cache {:?} does not fit layer {layer} of {shape:?}",
            kv.shape
        )));
    }
    match sinks {
        Some(w) if w.rows * w.cols != n_heads => Err(invalid(format!(
            "attention sinks: [{}, {}], expected {n_heads} values (one per query head)",
            w.rows, w.cols
        ))),
        Some(w) => Ok(w.dense_for("attention sinks")?.ptr()),
        None => Ok(0),
    }
}

impl<R: Runtime> GpuBackend<R> {
    /// `Backend::attention` over layer `layer` of the cache `kv`; `sinks` (gpt-oss):
    /// `[n_heads]` logits, kept in the compute type as every vector weight is, that join each
    /// row's denominator where the row is normalized (or its split-K parts merged).
    pub(in crate::backend::gpu) fn launch_attention(
        &mut self,
        qkv: &GpuTensor,
        (kv, layer): (&GpuKv, usize),
        b: &crate::backend::gpu::GpuBatch,
        shape: &AttnShape,
        sinks: Option<&GpuWeight>,
        out: &mut GpuTensor,
    ) -> Result<(), BackendError> {
        let l = self.layout(b)?;
        let (hd, n_heads, n_kv) = (shape.head_dim, shape.n_heads, shape.n_kv_heads);
        let sinks = check_inputs(qkv, (kv, layer), l.n_tokens, shape, sinks, out)?;
        let head = AttnHead::for_head_dim(hd);
        let vectors = l.max_item_rows as usize * (n_heads / n_kv);
        let kernel = self.attention_kernel(head, vectors, l.n_items);
        let dec = matches!(kernel, Kernel::AttentionDecode { .. });
        let fold = dec
            && l.n_splits > 0
            // The decode kernel merges its split-K parts itself (no `attn_combine` launch)
            // unless `attn_fuse` is off.
            && self.ctx.tuning.attn_fuse
            && n_heads / n_kv <= MERGE_MAX_GROUP
            && l.n_counters >= l.n_splits * n_kv
            && l.max_parts as usize <= MERGE_MAX_PARTS;
        let (mut part_acc, mut part_ml) = (0u64, 0u64);
        if l.n_parts > 0 {
            let acc_bytes = l.n_parts * n_heads * hd * 4;
            part_acc = ensure(
                &self.ctx.dev,
                &mut self.ctx.scratch.attn_ws,
                acc_bytes + l.n_parts * n_heads * 8,
                "attention partials",
                &mut self.ctx.generation,
            )?;
            part_ml = part_acc + acc_bytes as u64;
        }
        // The step's metadata holds the counters, zeroed by its upload.
        let counters = if fold { self.meta_ptr(l.counters) } else { 0 };
        let size = self.ctx.dt.size() as u64;
        let layer_elems = (kv.shape.num_slots() * kv.shape.slot_width()) as u64;
        let k = kv.buf.ptr() + 2 * layer as u64 * layer_elems * size;
        let blocks = if dec {
            (n_kv as u32, l.n_items as u32, 1)
        } else {
            (l.n_items as u32, n_kv as u32, 1)
        };
        let grid = Grid {
            blocks,
            threads: (ATTN_WARPS * self.ctx.caps.warp) as u32,
        };
        // Every row merged (none written by the attention kernel itself), head blocks of
        // whole warps: the merge also leaves the 8-bit rows of its output for the decode
        // matmul after it (bf16; `qx_slot`), as the RMSNorms do.
        let q_dim = shape.q_dim();
        let xq = if l.n_splits > 0 && l.n_splits == l.n_tokens && hd.is_multiple_of(32) && hd <= 256
        {
            self.qx_slot(l.n_tokens, q_dim)
        } else {
            None
        };
        let args = AttnArgs {
            qkv: qkv.buf.ptr(),
            qkv_stride: qkv.cols as i32,
            k_cache: k,
            v_cache: k + layer_elems * size,
            out: out.buf.ptr(),
            part_acc,
            part_ml,
            positions: self.meta_ptr(l.positions),
            seqinfo: self.meta_ptr(l.seqinfo),
            tables: self.meta_ptr(l.tables),
            items: self.meta_ptr(l.items),
            n_heads: n_heads as i32,
            n_kv: n_kv as i32,
            head_dim: hd as i32,
            block_size: kv.shape.block_size as i32,
            scale: shape.score_scale(),
            // 0: no window (a window past i32 covers every context the cache holds).
            window: shape.window.map_or(0, |w| w.min(i32::MAX as usize) as i32),
            softcap: shape.softcap.unwrap_or(0.0),
            sinks,
        };
        if dec {
            let args = AttnDecArgs {
                qkv: args.qkv,
                qkv_stride: args.qkv_stride,
                k_cache: args.k_cache,
                v_cache: args.v_cache,
                out: args.out,
                part_acc,
                part_ml,
                positions: args.positions,
                seqinfo: args.seqinfo,
                tables: args.tables,
                items: args.items,
                n_heads: args.n_heads,
                n_kv: args.n_kv,
                head_dim: args.head_dim,
                block_size: args.block_size,
                scale: args.scale,
                window: args.window,
                softcap: args.softcap,
                splits: self.meta_ptr(l.splits),
                part_split: self.meta_ptr(l.part_splits),
                counters,
                xq: if fold { xq.unwrap_or(0) } else { 0 },
                rows: l.n_tokens as i32,
                sinks,
            };
            self.launch_with(kernel, grid, &args)?;
        } else if matches!(kernel, Kernel::AttentionTc { .. }) {
            self.launch_with_smem(kernel, grid, tc_smem_bytes(hd), &args)?;
        } else {
            self.launch_with(kernel, grid, &args)?;
        }
        if l.n_splits > 0 && !fold {
            let grid = Grid {
                blocks: (l.n_splits as u32, n_heads as u32, 1),
                threads: COMBINE_THREADS,
            };
            let args = AttnCombineArgs {
                part_acc,
                part_ml,
                splits: self.meta_ptr(l.splits),
                out: out.buf.ptr(),
                n_heads: n_heads as i32,
                hd: hd as i32,
                xq: xq.unwrap_or(0),
                rows: l.n_tokens as i32,
                sinks,
            };
            self.launch_with(Kernel::AttnCombine, grid, &args)?;
        }
        if l.n_splits > 0 {
            self.ctx.scratch.qx = xq.map(|at| QxRows {
                x: out.buf.ptr(),
                rows: l.n_tokens,
                cols: q_dim,
                at,
                norm: None,
            });
        }
        Ok(())
    }

    /// The attention instantiation for head size `head`, at most `vectors` query vectors
    /// per item and `n_items` items.
    fn attention_kernel(&self, head: AttnHead, vectors: usize, n_items: usize) -> Kernel {
        let sizes = head.group_sizes();
        let qv = sizes
            .iter()
            .copied()
            .find(|&q| q as usize >= vectors)
            .unwrap_or(sizes[sizes.len() - 1]);
        // Decode steps (every item at most 8 query vectors): the thread-group decode variant.
        // More query vectors than the largest CUDA-core pass: the tensor-core variant.
        let dec = head.decode_sizes();
        // The decode variant's grid is (KV head, item): items must fit the grid's y limit.
        let decode = head.has_decode()
            && vectors <= dec[dec.len() - 1] as usize
            && n_items <= 65535
            && self.ctx.switches.attn_decode;
        // The pass sizes a start compiles follow the same rule (`KernelNeeds::class`); one
        // still compiling after start-up (items of more than one row) leaves its items to the
        // other variants meanwhile.
        let pass = head.decode_pass(vectors).unwrap_or(1);
        let compiling = decode
            && self
                .ctx
                .kernels
                .pending(Kernel::AttentionDecode { head, qv: pass }.unit());
        if decode && !compiling {
            Kernel::AttentionDecode { head, qv: pass }
        } else if (vectors > sizes[sizes.len() - 1] as usize || compiling)
            && self.ctx.caps.mma
            && head.has_tc()
        {
            Kernel::AttentionTc { head }
        } else {
            Kernel::Attention { head, qv }
        }
    }
}
