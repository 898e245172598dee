//! Which dot kernels the running CPU gets: the portable table of `qdot.rs` and the
//! vectorized tables (`qdot_avx2.rs`, `qdot_avx512.rs`) where the CPU has their instructions.
//! Kept apart from `qdot.rs`, which the vectorized files build on.

use super::qdot::Kernels;

impl Kernels {
    /// The fastest kernels this CPU runs, detected at run time.
    pub fn detect() -> Kernels {
        Self::available().pop().unwrap_or(Kernels::PORTABLE)
    }

    /// Every kernel table this CPU runs, slowest first: `portable`, then `avx2` and
    /// `avx512` where detected.
    pub fn available() -> Vec<Kernels> {
        let mut all = vec![Kernels::PORTABLE];
        #[cfg(target_arch = "x86_64")]
        all.extend(super::qdot_avx2::kernels());
        #[cfg(target_arch = "x86_64")]
        all.extend(super::qdot_avx512::kernels());
        all
    }
}
