//! The model-family ops' kernels' facts ([`Kernel::info`]): q/k head norms, GeGLU, scale
//! and soft cap (`arch.cu`).

use crate::backend::gpu::kernels::{Entry, Kernel, KernelInfo};
use crate::backend::gpu::registry::Source;

/// The model-family ops (`arch.cu`).
pub(crate) fn info(k: Kernel) -> Option<KernelInfo> {
    let a = |op| KernelInfo::whole(op, Source::Arch, Entry::typed(op));
    Some(match k {
        Kernel::HeadRmsNorm => a("head_rms_norm"),
        Kernel::GeluTanhMul => a("gelu_tanh_mul"),
        Kernel::ScaleRows => a("scale_rows"),
        Kernel::Softcap => a("softcap"),
        _ => return None,
    })
}
