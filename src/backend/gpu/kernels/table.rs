//! [`Kernel::info`]: each family's kernels' facts, asked of the family that launches them
//! (`ops/<family>/kernels.rs`). The accessors every caller uses read the one [`KernelInfo`].

use super::{Kernel, KernelInfo};
use crate::backend::DType;
use crate::backend::gpu::ops;
use crate::backend::gpu::registry::{Source, Unit};

impl Kernel {
    /// The kernel's facts: asked of each family in turn, one of which has it.
    pub fn info(self) -> KernelInfo {
        ops::embed::kernels::info(self)
            .or_else(|| ops::norm::kernels::info(self))
            .or_else(|| ops::rope::kernels::info(self))
            .or_else(|| ops::attention::kernels::info(self))
            .or_else(|| ops::sample::kernels::info(self))
            .or_else(|| ops::arch::kernels::info(self))
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
