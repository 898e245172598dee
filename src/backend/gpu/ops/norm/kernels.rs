//! The norm family's kernels' facts ([`Kernel::info`]): the RMSNorms, plain and after a
//! residual add, scalar and over 16-byte chunks (`norm.cu`).

use crate::backend::gpu::kernels::{Entry, Kernel, KernelInfo};
use crate::backend::gpu::registry::Source;

/// The norms (`norm.cu`), every one of the decode chain.
pub(crate) fn info(k: Kernel) -> Option<KernelInfo> {
    let n = |op, entry| KernelInfo::whole(op, Source::Norm, Entry::typed(entry)).pdl();
    Some(match k {
        Kernel::RmsNorm => n("rms_norm", "rms_norm"),
        Kernel::AddRmsNorm => n("add_rms_norm", "add_rms_norm"),
        Kernel::RmsNormVec => n("rms_norm", "rms_norm_vec"),
        Kernel::AddRmsNormVec => n("add_rms_norm", "add_rms_norm_vec"),
        _ => return None,
    })
}
