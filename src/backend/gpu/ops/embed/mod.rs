//! Row copies steered by a step's metadata: embedding rows by token id (a quantized table
//! dequantizes its rows), and the gather of the rows that produce logits.

pub(in crate::backend::gpu) mod kernels;

use crate::backend::BackendError;
use crate::backend::gpu::args::{EmbedArgs, GatherRowsArgs};
use crate::backend::gpu::kernels::Kernel;
use crate::backend::gpu::runtime::{Grid, Runtime};
use crate::backend::gpu::{
    GpuBackend, GpuBatch, GpuTensor, GpuWeight, check_cols, check_rows, invalid,
};

impl<R: Runtime> GpuBackend<R> {
    pub(in crate::backend::gpu) fn launch_embed(
        &mut self,
        table: &GpuWeight,
        first: usize,
        vocab: usize,
        b: &GpuBatch,
        out: &mut GpuTensor,
    ) -> Result<(), BackendError> {
        let l = self.layout(b)?;
        check_cols("embed", out.cols, table.cols)?;
        check_rows("embed", l.n_tokens, out.rows)?;
        if l.n_tokens > 0 && l.max_token as usize >= vocab {
            return Err(invalid(format!(
                "token id {} >= vocab {vocab}",
                l.max_token
            )));
        }
        if first + table.rows > vocab || vocab > i32::MAX as usize {
            return Err(invalid(format!(
                "embed: rows {first}..{} of a vocabulary of {vocab}",
                first + table.rows
            )));
        }
        let Some(dense) = table.dense() else {
            let [part] = table.parts.as_slice() else {
                return Err(invalid("embed: a stacked table".into()));
            };
            let ids = self.meta_ptr(l.tokens);
            return self.launch_dequant(
                part,
                table.cols,
                Some((ids, first)),
                l.n_tokens,
                out.buf.ptr(),
                out.cols,
            );
        };
        let grid = Grid {
            blocks: (l.n_tokens as u32, 1, 1),
            threads: 256,
        };
        let args = EmbedArgs {
            table: dense.ptr(),
            ids: self.meta_ptr(l.tokens),
            out: out.buf.ptr(),
            cols: table.cols as i32,
            first: first as i32,
            rows: table.rows as i32,
        };
        self.launch_with(Kernel::Embed, grid, &args)
    }

    pub(in crate::backend::gpu) fn launch_gather_rows(
        &mut self,
        x: &GpuTensor,
        b: &GpuBatch,
        out: &mut GpuTensor,
    ) -> Result<(), BackendError> {
        let l = self.layout(b)?;
        check_cols("gather_rows", out.cols, x.cols)?;
        check_rows("gather_rows", l.n_logits, out.rows)?;
        let grid = Grid {
            blocks: (l.n_logits as u32, 1, 1),
            threads: 256,
        };
        let args = GatherRowsArgs {
            x: x.buf.ptr(),
            rows: self.meta_ptr(l.logits_rows),
            out: out.buf.ptr(),
            cols: x.cols as i32,
        };
        self.launch_with(Kernel::GatherRows, grid, &args)
    }
}
