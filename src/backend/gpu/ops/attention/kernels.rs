//! The attention family's kernels' facts ([`Kernel::info`]): the portable
//! (`attention_prefill.cu`, one part per head size), tensor-core (`attention_tc.cu`) and
//! decode (`attention_decode.cu`, one part per head and pass size, the split-K merge in its
//! common part) paged attention.

use crate::backend::gpu::kernels::{Entry, Kernel, KernelInfo};
use crate::backend::gpu::registry::{Part, Source};

/// The paged attention kernels: portable (`attention_prefill.cu`), tensor-core
/// (`attention_tc.cu`) and decode (`attention_decode.cu`, with the split-K merge).
pub(crate) fn info(k: Kernel) -> Option<KernelInfo> {
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
