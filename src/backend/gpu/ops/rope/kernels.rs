//! The rope family's kernels' facts ([`Kernel::info`]): the ropes (`rope.cu`: the plain
//! ones in its common part, the one with the q/k head norms in a part of its own) and the
//! paged KV write (`kv.cu`).

use crate::backend::gpu::kernels::{Entry, Kernel, KernelInfo};
use crate::backend::gpu::registry::{Part, Source};

/// The facts of `k` if it is one of this family's kernels.
pub(crate) fn info(k: Kernel) -> Option<KernelInfo> {
    let rope = |op, part| KernelInfo::new(op, Source::Rope, part, Entry::typed(op));
    Some(match k {
        Kernel::Rope => rope("rope", Part::Common),
        Kernel::RopeKv => rope("rope_kv", Part::Common).pdl(),
        Kernel::RopeKvNorm => rope("rope_kv_norm", Part::QkNorm).pdl(),
        Kernel::WriteKv => KernelInfo::whole("write_kv", Source::Kv, Entry::typed("write_kv")),
        _ => return None,
    })
}
