//! The matmul family's geometry: tile and bucket sizes the routes and the launchers share
//! (a leaf both use, so `route.rs` needs nothing of the launchers).

use crate::backend::gpu::qtype::QType;

/// Most rows of a step on the tiled quantized matmul; more dequantize for the BLAS GEMM.
pub const QMMA_MAX_ROWS: usize = 256;

/// Weight rows (output columns) and threads per block of `qmma_*` and `qmma8_*` (`QMMA_BN`,
/// `QMMA_THREADS` in `kernels/qmma.cuh`); the wide 64-row blocks (`qmma_*_m64w`, NVIDIA
/// sm_80+: `QmmaShape` in `kernels/qmma.cu`) take [`QMMA_WIDE`] instead.
pub(in crate::backend::gpu) const QMMA_BN: usize = 64;
pub(in crate::backend::gpu) const QMMA_THREADS: u32 = 128;
pub(in crate::backend::gpu) const QMMA_WIDE: (usize, u32) = (128, 256);

/// `QMMA_BK`, the k-tile every k must be a multiple of, except for the types whose tiles
/// take a partial last k-tile ([`QMMA_KTAIL_TYPES`]).
pub(in crate::backend::gpu) const QMMA_BK: usize = 128;

/// The types whose tiles take any k of whole 32-blocks, the last k-tile partial (`QmmaKTail`
/// in `kernels/qmma.cuh`): MXFP4, whose gpt-oss matrices are 2880 wide.
pub(in crate::backend::gpu) const QMMA_KTAIL_TYPES: [QType; 1] = [QType::Mxfp4];

/// Fewest rows whose add + RMSNorm after a split tiled matmul runs in its reduce (one block
/// per row there): H100, 8B Q4_K_M decode, against the reduce then `add_rms_norm`: batch 32
/// 9.07-9.09 -> 8.99-9.01 ms, 64 12.82-12.85 -> 12.74-12.79, but 16 6.35 -> 6.40 (16 blocks).
pub(in crate::backend::gpu) const QMMA_NORM_MIN_ROWS: usize = 32;

/// Most columns of that reduce: four chunks of 4 columns for each of 1024 threads, all in
/// registers between its two passes.
pub(in crate::backend::gpu) const QMMA_NORM_MAX_COLS: usize = 4 * 4 * 1024;

/// Most parts of a stacked weight in one `qdot_*` launch (`qdot_impl` in `kernels/qgemv.cu`).
pub(in crate::backend::gpu) const QDOT_PARTS: usize = 3;

/// Scratch bytes of `n` activation rows of `k` columns quantized to 8 bits: the values,
/// then at the next 256-byte boundary one (scale, sum) pair of f32 per 32.
pub(in crate::backend::gpu) fn qx_bytes(n: usize, k: usize) -> usize {
    (n * k).next_multiple_of(256) + n * (k / 32) * 8
}
