//! The GPU backend's op families, each with its kernels' launchers and routes.

pub(super) mod matmul;
pub(super) mod moe;
pub(super) mod rope;
