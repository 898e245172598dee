//! The GPU backend's op families, each with its kernels' launchers and routes.

pub(super) mod arch;
pub(super) mod attention;
pub(super) mod embed;
pub(super) mod matmul;
pub(super) mod moe;
pub(super) mod norm;
pub(super) mod rope;
pub(super) mod sample;
