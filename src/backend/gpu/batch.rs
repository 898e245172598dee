//! A step's metadata on the device: the plan validated, packed (`meta.rs`) and uploaded in
//! one copy; the two row copies it steers (embedding rows by token id, the gather of the
//! rows that produce logits) are `ops/embed`.

use super::device::DevBuf;
use super::meta::{self, GraphKey};
use super::runtime::Runtime;
use super::{GpuBackend, GpuBatch, ensure, invalid};
use crate::backend::{BackendError, BatchPlan, KvShape};

/// The step metadata of one backend.
#[derive(Default)]
pub(super) struct StepMeta {
    /// The KV cache's shape, once allocated (plans are validated against it).
    pub kv_shape: Option<KvShape>,
    /// The uploaded words of the latest step.
    buf: Option<DevBuf>,
    /// Host staging for the packed words (reused).
    words: Vec<u32>,
    /// Bumped by every `prepare`; a batch of an older epoch is refused.
    epoch: u64,
}

impl<R: Runtime> GpuBackend<R> {
    /// Validates and packs `plan` (at graph shape `key` when given) and uploads it.
    pub(super) fn prepare_with(
        &mut self,
        plan: &BatchPlan,
        key: Option<GraphKey>,
    ) -> Result<GpuBatch, BackendError> {
        let shape = self
            .step
            .kv_shape
            .ok_or_else(|| invalid("no KV cache allocated".into()))?;
        plan.validate(&shape)?;
        let mut words = std::mem::take(&mut self.step.words);
        let layout = match key {
            Some(k) => meta::pack_graph(plan, k, self.ctx.tuning.attn_min_split, &mut words),
            None => {
                // The items the tensor-core attention takes (`attention_kernel`) may be longer;
                // while it still compiles after start-up, items of one row take the decode
                // variant instead.
                let head = super::kernels::AttnHead::for_head_dim(shape.head_dim);
                let rows = if !(self.ctx.caps.mma && head.has_tc()) {
                    meta::ItemRows::Portable
                } else if self
                    .ctx
                    .kernels
                    .pending(super::kernels::Kernel::AttentionTc { head }.unit())
                {
                    meta::ItemRows::One
                } else {
                    meta::ItemRows::TensorCore
                };
                let (sms, min_split) = (self.ctx.caps.sms, self.ctx.tuning.attn_min_split);
                meta::pack(plan, &shape, sms, min_split, rows, &mut words)
            }
        };
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        self.step.words = words;
        // Room to spare: block tables grow with the contexts, and a new buffer means new
        // graphs.
        ensure(
            &self.ctx.dev,
            &mut self.step.buf,
            bytes.len().max(64 << 10),
            "batch metadata",
            &mut self.ctx.generation,
        )?;
        if let Some(m) = &self.step.buf {
            self.ctx.dev.upload(m, 0, &bytes)?;
        }
        self.step.epoch += 1;
        self.ctx.dev.timer.begin_step(self.step.epoch);
        Ok(GpuBatch {
            epoch: self.step.epoch,
            layout,
            graph: key,
        })
    }

    /// The layout of `b`, refused when a later `prepare` overwrote its metadata.
    pub(super) fn layout(&self, b: &GpuBatch) -> Result<meta::Layout, BackendError> {
        if b.epoch != self.step.epoch {
            return Err(invalid(
                "batch was prepared before the latest prepare()".into(),
            ));
        }
        Ok(b.layout)
    }

    /// Device address of word `off` of the step's metadata.
    pub(super) fn meta_ptr(&self, off: usize) -> u64 {
        self.step
            .buf
            .as_ref()
            .map_or(0, |m| m.ptr() + 4 * off as u64)
    }
}
