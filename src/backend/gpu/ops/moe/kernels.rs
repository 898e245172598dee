//! The MoE family's kernels' facts ([`Kernel::info`]): routing, alignment, the float
//! experts and the combines (`moe.cu`), and the grouped matmuls of quantized experts
//! (`moe_quant.cu`, one part per type; the dp4a and tensor-core ones bf16 only).

use crate::backend::gpu::kernels::{Entry, Kernel, KernelInfo};
use crate::backend::gpu::registry::{Part, Source};

/// The facts of `k` if it is one of this family's kernels.
pub(crate) fn info(k: Kernel) -> Option<KernelInfo> {
    let moe = |op, entry| KernelInfo::whole(op, Source::Moe, entry);
    let quant = |op, q, entry| KernelInfo::new(op, Source::MoeQuant, Part::Q(q), entry);
    Some(match k {
        Kernel::MoeRoute => moe("moe_route", Entry::typed("moe_route")),
        Kernel::MoeAlign => moe("moe_align", Entry::untyped("moe_align")),
        Kernel::MoePrep => moe("moe_prep", Entry::typed("moe_prep")),
        Kernel::MoeGateUp => moe("moe_gate_up", Entry::typed("moe_gate_up")),
        Kernel::MoeDown => moe("moe_down", Entry::typed("moe_down")),
        Kernel::MoeCombine => moe("moe_combine", Entry::typed("moe_combine")),
        Kernel::MoeCombineNorm => moe("moe_combine_norm", Entry::typed("moe_combine_norm")),
        Kernel::MoeSharedAdd => moe("moe_shared_add", Entry::typed("moe_shared_add")),
        Kernel::MoeQGateUp { q } => quant("moe_gate_up", q, Entry::q("moe_gate_up", q)),
        Kernel::MoeQDown { q } => quant("moe_down", q, Entry::q("moe_down", q)),
        Kernel::MoeQ8GateUp { q, slots } => {
            quant("moe_gate_up", q, Entry::q("moe8_gate_up", q).slots(slots)).bf16()
        }
        Kernel::MoeQ8Down { q, slots } => {
            quant("moe_down", q, Entry::q("moe8_down", q).slots(slots)).bf16()
        }
        Kernel::MoeQ8DownSelf { q } => quant("moe_down", q, Entry::q("moe8_down_self", q)).bf16(),
        Kernel::MoeMmaGateUp { q } => quant("moe_gate_up", q, Entry::q("moemma_gate_up", q)).bf16(),
        Kernel::MoeMmaDown { q } => quant("moe_down", q, Entry::q("moemma_down", q)).bf16(),
        _ => return None,
    })
}
