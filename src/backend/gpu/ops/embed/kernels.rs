//! The embedding family's kernels' facts ([`Kernel::info`]): the embedding and the row
//! gather (`embed.cu`).

use crate::backend::gpu::kernels::{Entry, Kernel, KernelInfo};
use crate::backend::gpu::registry::Source;

/// The embedding and row gather (`embed.cu`).
pub(crate) fn info(k: Kernel) -> Option<KernelInfo> {
    let e = |op| KernelInfo::whole(op, Source::Embed, Entry::typed(op));
    Some(match k {
        Kernel::Embed => e("embed"),
        Kernel::GatherRows => e("gather_rows"),
        _ => return None,
    })
}
