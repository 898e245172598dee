//! When each compile unit compiles: what a model runs ([`KernelNeeds`]) sorted into the
//! units start-up waits for, those that compile after it and those left to first use
//! ([`Class`]).

use super::units::{Part, Source, Unit};
use crate::backend::DType;
use crate::backend::gpu::kernels::AttnHead;
use crate::backend::gpu::qtype::QType;

/// What a model runs, so start-up waits only for the kernels a first request may run
/// ([`Class`]). `None`: every type, every head size.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelNeeds {
    /// The model has mixture-of-experts layers.
    pub moe: bool,
    /// The quantized weight types of its file. `None`: a backend opened without a model
    /// (the tests), which waits for every unit at start.
    pub qtypes: Option<Vec<QType>>,
    /// It has matrices stored in a float type (or one the GPU dequantizes at load): the
    /// streaming float-weight matmuls (`gemv.cu`) are its decode path. A file whose matrices
    /// are all quantized never runs them (they compile on first use, if ever).
    pub dense: bool,
    /// Its attention has q/k head norms (Qwen3, Gemma 3): the rope that applies them.
    pub qk_norm: bool,
    /// Its attention head sizes.
    pub head_dims: Option<Vec<usize>>,
    /// Query heads per KV head of its attention (of one tensor-parallel shard): the decode
    /// attention pass sizes it can launch ([`AttnHead::decode_passes`]). `None`: every size.
    pub gqa_group: Option<usize>,
    /// Whether its attention takes the portable kernels (`attention_prefill.cu`) on an
    /// ordinary step: false where decode steps take the decode variant and larger items the
    /// tensor-core one (`attention_kernel` in attention.rs: NVIDIA sm_80+, bf16), which
    /// leaves them only a rare case (more than 65,535 items in a decode step).
    pub portable_attention: bool,
}

/// When a compile unit compiles and who waits for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    /// From [`Kernels::load`](super::Kernels::load) on, while the weights upload; start-up waits for it: what a
    /// first request of any size may run, except [`Class::Later`].
    Core,
    /// Once the core units are ready, in the background (the lane is serving by then);
    /// loaded between steps once compiled ([`Kernels::poll_later`](super::Kernels::poll_later)), or on first use, which
    /// waits for a compile still running and logs it. What only larger steps run: the tiled
    /// quantized matmuls of 9-256 rows (`qmma.cu`) and the 8-bit decode matmuls of 2-8 rows
    /// (`qdot_*` at 2, 4 and 8 rows): until loaded, such steps dequantize for the BLAS instead,
    /// so a first prompt does not wait for them; the decode attention passes of items of
    /// more than one row (the tensor-core or the portable variant takes those meanwhile);
    /// and the portable attention where it is a rare path. A tensor-parallel group waits
    /// for these too before its communicator exists ([`Kernels::wait_model`](super::Kernels::wait_model)).
    Later,
    /// Only on first use: kernels the model does not run (other weight types and head
    /// sizes, MoE in a dense model, the 8-bit tiles of the k-quants, bf16's float-activation
    /// streaming matmuls).
    Lazy,
}

impl KernelNeeds {
    /// Everything: what a backend opened without a model (the tests) waits for.
    pub fn all() -> KernelNeeds {
        KernelNeeds {
            moe: true,
            qtypes: None,
            dense: true,
            qk_norm: true,
            head_dims: None,
            gqa_group: None,
            portable_attention: true,
        }
    }

    /// When `unit` of storage type `dt` compiles.
    pub(crate) fn class(&self, unit: Unit, dt: DType) -> Class {
        // A backend opened without a model waits for every unit.
        let everything = self.qtypes.is_none();
        let has_q = |q: QType| self.qtypes.as_ref().is_none_or(|t| t.contains(&q));
        let has_head = |h: AttnHead| {
            self.head_dims
                .as_ref()
                .is_none_or(|d| d.iter().any(|&d| AttnHead::for_head_dim(d) == h))
        };
        let runs = match unit.part {
            _ if !self.moe && matches!(unit.src, Source::Moe | Source::MoeQuant) => false,
            _ if !self.dense && unit.src == Source::Gemv => false,
            Part::Q(q) | Part::Rows(q, _) | Part::Norm(q) => has_q(q),
            Part::Head(h) => has_head(h),
            // A pass smaller than the GQA group never runs.
            Part::Pass(h, qv) => {
                has_head(h)
                    && self
                        .gqa_group
                        .is_none_or(|g| h.decode_passes(g).contains(&qv))
            }
            Part::Int8(_) => everything,
            Part::QkNorm => self.qk_norm,
            // bf16 decode streams 8-bit activations (`qdot_*`): these only where that
            // cannot take a step (no room for the 8-bit rows in the dequant scratch).
            Part::Stream(q) => everything || (dt != DType::Bf16 && has_q(q)),
            Part::Whole | Part::Common => true,
        };
        let later = match (unit.src, unit.part) {
            (Source::Qmma, _) => true,
            // Decode steps of 2-8 rows (prompts of a few tokens, 2+ sequences at once):
            // until these load, they dequantize for the BLAS (matmul.rs, `qgemv_rows`). A
            // start waits for the one-row decode only: the two-row units were its longest
            // compiles (Q4_K 1.4-1.6 s on one core against 1.0-1.1 s for one row) and a
            // quarter of its compile work.
            (Source::Qgemv, Part::Rows(..)) => true,
            // The one-row decode's fused norms: the plain launches run until they load
            // (matmul.rs, `launch_qdot_norm`).
            (Source::Qgemv, Part::Norm(_)) => true,
            // Decode attention passes above a single row's (items of 2-8 rows: prompts of a
            // few tokens): the tensor-core or the portable variant takes them meanwhile
            // (attention.rs, `attention_kernel`).
            (Source::AttentionDecode, Part::Pass(h, qv)) => self
                .gqa_group
                .is_some_and(|g| h.decode_pass(g).is_some_and(|one_row| qv > one_row)),
            (Source::AttentionPrefill, Part::Head(h)) => {
                !self.portable_attention && h.has_decode() && h.has_tc()
            }
            // The tensor-core attention (the longest core compile otherwise): steps pack
            // items of one row for the decode variant's one-row pass meanwhile (batch.rs).
            (Source::AttentionTc, Part::Head(h)) => self
                .gqa_group
                .is_some_and(|g| h.has_decode() && h.decode_pass(g).is_some()),
            _ => false,
        };
        match (runs, everything, later) {
            (false, ..) => Class::Lazy,
            (true, false, true) => Class::Later,
            _ => Class::Core,
        }
    }
}
