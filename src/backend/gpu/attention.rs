//! Host side of paged attention: picks the kernel instantiation for the head size and the
//! step's largest item, launches it once over every item and KV head, then merges split-K
//! partials when the step has any.

use super::args::{AttnArgs, AttnCombineArgs};
use super::kernels::{AttnHead, Kernel};
use super::matmul::QxRows;
use super::runtime::{Grid, Runtime};
use super::{GpuBackend, GpuKv, GpuTensor, check_cols, check_rows, ensure, invalid};
use crate::backend::{AttnShape, BackendError};

/// Warps per attention block (`ATTN_WARPS` in `kernels/attention.cuh`).
const ATTN_WARPS: usize = 4;
/// Threads per split-K merge block (`COMBINE_THREADS` in `kernels/attention_decode.cu`).
const COMBINE_THREADS: u32 = 128;

impl<R: Runtime> GpuBackend<R> {
    pub(super) fn launch_attention(
        &mut self,
        qkv: &GpuTensor,
        kv: &GpuKv,
        layer: usize,
        b: &super::GpuBatch,
        shape: &AttnShape,
        out: &mut GpuTensor,
    ) -> Result<(), BackendError> {
        let l = self.layout(b)?;
        let (hd, n_heads, n_kv) = (shape.head_dim, shape.n_heads, shape.n_kv_heads);
        check_cols("attention output", out.cols, shape.q_dim())?;
        check_cols("attention input", qkv.cols, shape.qkv_dim())?;
        check_rows("attention", l.n_tokens, qkv.rows.min(out.rows))?;
        shape.check().map_err(invalid)?;
        if kv.shape.head_dim != hd || kv.shape.n_kv_heads != n_kv || layer >= kv.shape.num_layers {
            return Err(invalid(format!(
                "attention: cache {:?} does not fit layer {layer} of {shape:?}",
                kv.shape
            )));
        }
        let head = AttnHead::for_head_dim(hd);
        let vectors = l.max_item_rows as usize * (n_heads / n_kv);
        let kernel = self.attention_kernel(head, vectors, l.n_items);
        let (mut part_acc, mut part_ml) = (0u64, 0u64);
        if l.n_parts > 0 {
            let acc_bytes = l.n_parts * n_heads * hd * 4;
            part_acc = ensure(
                &self.dev,
                &mut self.scratch.attn_ws,
                acc_bytes + l.n_parts * n_heads * 8,
                "attention partials",
                &mut self.generation,
            )?;
            part_ml = part_acc + acc_bytes as u64;
        }
        let size = self.dt.size() as u64;
        let layer_elems = (kv.shape.num_slots() * kv.shape.slot_width()) as u64;
        let k = kv.buf.ptr() + 2 * layer as u64 * layer_elems * size;
        let blocks = match kernel {
            Kernel::AttentionDecode { .. } => (n_kv as u32, l.n_items as u32, 1),
            _ => (l.n_items as u32, n_kv as u32, 1),
        };
        let grid = Grid {
            blocks,
            threads: (ATTN_WARPS * self.dev.info.warp_size) as u32,
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
        };
        self.launch_with(kernel, grid, &args)?;
        if l.n_splits > 0 {
            // Every row merged here (none written by the attention kernel itself), head
            // blocks of whole warps: the merge also leaves the 8-bit rows of its output for
            // the decode matmul after it (bf16; `qx_slot`), as the RMSNorms do.
            let q_dim = shape.q_dim();
            let xq = if l.n_splits == l.n_tokens && hd.is_multiple_of(32) && hd <= 256 {
                self.qx_slot(l.n_tokens, q_dim)
            } else {
                None
            };
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
            };
            self.launch_with(Kernel::AttnCombine, grid, &args)?;
            self.scratch.qx = xq.map(|at| QxRows {
                x: out.buf.ptr(),
                rows: l.n_tokens,
                cols: q_dim,
                at,
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
        if head.has_decode()
            && vectors <= dec[dec.len() - 1] as usize
            && n_items <= 65535
            && self.switches.attn_decode
        {
            let qv = dec
                .iter()
                .copied()
                .find(|&q| q as usize >= vectors)
                .unwrap_or(1);
            Kernel::AttentionDecode { head, qv }
        } else if vectors > sizes[sizes.len() - 1] as usize && self.switches.mma && head.has_tc() {
            Kernel::AttentionTc { head }
        } else {
            Kernel::Attention { head, qv }
        }
    }
}
