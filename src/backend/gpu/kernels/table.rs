//! [`Kernel::info`]: each family's kernels' facts, asked of the family that launches them
//! (`ops/<family>/kernels.rs`); the families without a folder of their own yet (embedding,
//! norms, attention, sampling, the model-family ops) keep theirs here. The accessors every
//! caller uses read the one [`KernelInfo`].

use super::{Entry, Kernel, KernelInfo};
use crate::backend::DType;
use crate::backend::gpu::ops;
use crate::backend::gpu::registry::{Part, Source, Unit};

impl Kernel {
    /// The kernel's facts: asked of each family in turn, one of which has it.
    pub fn info(self) -> KernelInfo {
        embed(self)
            .or_else(|| norm(self))
            .or_else(|| ops::rope::kernels::info(self))
            .or_else(|| attention(self))
            .or_else(|| sample(self))
            .or_else(|| arch(self))
            .or_else(|| ops::matmul::kernels::info(self))
            .or_else(|| ops::moe::kernels::info(self))
            .unwrap_or_else(|| unreachable!("{self:?} belongs to no kernel family"))
    }

    /// The op name used in errors and metrics.
    pub fn op(self) -> &'static str {
        self.info().op
    }

    /// Whether the kernel may launch while its predecessor drains ([`KernelInfo::waits`]).
    pub(crate) fn waits_for_predecessor(self) -> bool {
        self.info().waits
    }

    /// The source file holding the kernel.
    pub(crate) fn source(self) -> Source {
        self.info().unit.src
    }

    /// The compile unit holding the kernel.
    pub(crate) fn unit(self) -> Unit {
        self.info().unit
    }

    /// Whether the kernel exists for storage type `dt` ([`KernelInfo::bf16_only`]).
    pub fn available(self, dt: DType) -> bool {
        !self.info().bf16_only || dt == DType::Bf16
    }

    /// Entry point name for storage type `dt`.
    pub(crate) fn entry(self, dt: DType) -> String {
        self.info().entry.name(dt)
    }
}

/// The embedding and row gather (`embed.cu`).
fn embed(k: Kernel) -> Option<KernelInfo> {
    let e = |op| KernelInfo::whole(op, Source::Embed, Entry::typed(op));
    Some(match k {
        Kernel::Embed => e("embed"),
        Kernel::GatherRows => e("gather_rows"),
        _ => return None,
    })
}

/// The norms (`norm.cu`), every one of the decode chain.
fn norm(k: Kernel) -> Option<KernelInfo> {
    let n = |op, entry| KernelInfo::whole(op, Source::Norm, Entry::typed(entry)).pdl();
    Some(match k {
        Kernel::RmsNorm => n("rms_norm", "rms_norm"),
        Kernel::AddRmsNorm => n("add_rms_norm", "add_rms_norm"),
        Kernel::RmsNormVec => n("rms_norm", "rms_norm_vec"),
        Kernel::AddRmsNormVec => n("add_rms_norm", "add_rms_norm_vec"),
        _ => return None,
    })
}

/// The paged attention kernels: portable (`attention_prefill.cu`), tensor-core
/// (`attention_tc.cu`) and decode (`attention_decode.cu`, with the split-K merge).
fn attention(k: Kernel) -> Option<KernelInfo> {
    Some(match k {
        Kernel::Attention { head, qv } => KernelInfo::new(
            "attention",
            Source::AttentionPrefill,
            Part::Head(head),
            Entry::typed("attn").head(head, "q", Some(qv)),
        ),
        Kernel::AttentionTc { head } => KernelInfo::new(
            "attention",
            Source::AttentionTc,
            Part::Head(head),
            Entry::typed("attn").head(head, "tc", None),
        ),
        Kernel::AttentionDecode { head, qv } => KernelInfo::new(
            "attention",
            Source::AttentionDecode,
            Part::Pass(head, qv),
            Entry::typed("attn").head(head, "dec", Some(qv)),
        )
        .pdl(),
        Kernel::AttnCombine => KernelInfo::new(
            "attn_combine",
            Source::AttentionDecode,
            Part::Common,
            Entry::typed("attn_combine"),
        )
        .pdl(),
        _ => return None,
    })
}

/// Sampling (`sample.cu`); the kernels of integer or f32 data have one entry point for
/// both storage types.
fn sample(k: Kernel) -> Option<KernelInfo> {
    let typed = |op| KernelInfo::whole(op, Source::Sample, Entry::typed(op));
    let untyped = |op| KernelInfo::whole(op, Source::Sample, Entry::untyped(op));
    Some(match k {
        Kernel::SamplePrep => typed("sample_prep"),
        Kernel::SampleTopN => untyped("sample_topn"),
        Kernel::SamplePenalty => untyped("sample_penalty"),
        Kernel::SampleMask => untyped("sample_mask"),
        Kernel::SamplePick => typed("sample_pick"),
        Kernel::SampleGreedy => typed("sample_greedy"),
        _ => return None,
    })
}

/// The model-family ops (`arch.cu`).
fn arch(k: Kernel) -> Option<KernelInfo> {
    let a = |op| KernelInfo::whole(op, Source::Arch, Entry::typed(op));
    Some(match k {
        Kernel::HeadRmsNorm => a("head_rms_norm"),
        Kernel::GeluTanhMul => a("gelu_tanh_mul"),
        Kernel::ScaleRows => a("scale_rows"),
        Kernel::Softcap => a("softcap"),
        _ => return None,
    })
}
