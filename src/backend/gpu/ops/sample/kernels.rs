//! The sampling family's kernels' facts ([`Kernel::info`]): `sample.cu`.

use crate::backend::gpu::kernels::{Entry, Kernel, KernelInfo};
use crate::backend::gpu::registry::Source;

/// Sampling (`sample.cu`); the kernels of integer or f32 data have one entry point for
/// both storage types.
pub(crate) fn info(k: Kernel) -> Option<KernelInfo> {
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
