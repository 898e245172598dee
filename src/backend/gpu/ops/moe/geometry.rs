//! The MoE family's geometry: tile, block and bucket sizes and the sorted-assignment layout
//! the route and the launchers share (a leaf both use).

use crate::backend::MoeShape;
use crate::backend::gpu::kernels::MOE8_SLOTS;
use crate::backend::gpu::ops::matmul::geometry::qx_bytes;
use crate::backend::gpu::qtype::QType;

/// Values per thread of `moe_combine_norm` (`MOE_CN_E`).
pub(in crate::backend::gpu) const CN_E: usize = 8;

/// Assignment slots per tile (`MOE_TILE` in `moe.cu`).
pub(in crate::backend::gpu) const TILE: usize = 8;

/// Output columns per block of the grouped matmuls.
pub(in crate::backend::gpu) const COLS: usize = 64;

/// Threads per block of `moe_route` (a warp per row) and `moe_align` (`MOE_ALIGN_THREADS`).
pub(in crate::backend::gpu) const ROUTE_THREADS: usize = 256;
pub(in crate::backend::gpu) const ALIGN_THREADS: u32 = 1024;

/// Threads per block of the 8-bit activation tiles (`moe8_*`), and the output columns each
/// group of lanes takes in gate/up and in down (`MOE8_GU_C`, `MOE8_DOWN_C`).
pub(in crate::backend::gpu) const Q8_THREADS: usize = 128;
pub(in crate::backend::gpu) const Q8_GU_COLS: usize = 1;
pub(in crate::backend::gpu) const Q8_DOWN_COLS: usize = 4;

/// Threads, output columns per block and the columns' multiple of the tensor-core tiles
/// (`moemma_*`: `QMMA_THREADS`, `QMMA_BN`, `QMMA_BK` of `qmma.cuh`).
pub(in crate::backend::gpu) const MMA_THREADS: u32 = 128;
pub(in crate::backend::gpu) const MMA_BN: usize = 64;
pub(in crate::backend::gpu) const MMA_BK: usize = 128;

/// Mean rows per expert from which the tensor-core tiles (64 slots of one expert per
/// block) take over from the dp4a ones (8 slots).
pub(in crate::backend::gpu) const MMA_MIN_ROWS: usize = 16;

/// Most assignments (rows * top k, `MOE_PREP_MAX`) and rows `moe_prep` takes in one block:
/// small decode steps. Up to 8 rows its route has the warps `moe_route`'s one block would
/// have; at 32 and 64 rows (Qwen3-30B-A3B shape, H100) one block doing what four SMs did
/// was slower than the three launches (graph step 22.78 -> 23.16 ms at 32, 35.01 -> 36.54
/// at 64), while batch 1 gained (3.81 -> 3.70 ms with the in-block down quantization).
pub(in crate::backend::gpu) const PREP_MAX: usize = 512;
pub(in crate::backend::gpu) const PREP_ROWS: usize = 8;

/// Most rows of a step the `moe8_*` tiles take in groups of 4 slots. (Qwen3-30B-A3B shape,
/// H100, graph step: batch 32 22.70 -> 19.89 ms, batch 64 35.21 -> 31.39 ms against bucket 8:
/// 93 registers instead of 128 for Q4_K gate/up, most tiles one pass.)
pub(in crate::backend::gpu) const S4_ROWS: usize = 64;

/// Longest expert row whose activations a `moe8_down_self_*` block quantizes itself
/// (`MOE8_SELF_MAX`).
pub(in crate::backend::gpu) const SELF_MAX: usize = 4096;

/// Weights per unit of `quant.cuh`'s decoders (`Q::UNIT`).
pub(in crate::backend::gpu) fn unit(q: QType) -> usize {
    match q {
        QType::Q8_0 => 16,
        QType::Q6K => 64,
        _ => 32,
    }
}

/// Lanes per output column of a `moe8_*` tile over rows of `cols` weights of type `q`: a
/// power of two up to 32, at most one lane per unit where the row is short.
pub(in crate::backend::gpu) fn q8_lanes(q: QType, cols: usize) -> usize {
    (cols / unit(q)).next_power_of_two().clamp(1, 32)
}

/// Where each part of the MoE workspace starts, in bytes, for `rows` rows.
pub(in crate::backend::gpu) struct Layout {
    pub(in crate::backend::gpu) ids: usize,
    pub(in crate::backend::gpu) wts: usize,
    pub(in crate::backend::gpu) inv: usize,
    pub(in crate::backend::gpu) sorted: usize,
    pub(in crate::backend::gpu) tile_expert: usize,
    pub(in crate::backend::gpu) estart: usize,
    pub(in crate::backend::gpu) act: usize,
    pub(in crate::backend::gpu) y: usize,
    /// 8-bit rows of x (`rows` rows) and of the activations (every slot).
    pub(in crate::backend::gpu) xq: usize,
    pub(in crate::backend::gpu) actq: usize,
    pub(in crate::backend::gpu) bytes: usize,
}

/// Tiles a step of `total` assignments over `ne` experts can need.
pub(in crate::backend::gpu) fn max_tiles(total: usize, ne: usize) -> usize {
    (total + ne * (TILE - 1)).div_ceil(TILE)
}

/// The slot bucket of the `moe8_*` tiles for a step of `n` rows: an expert takes a token at
/// most once, so no tile holds more than `n` real slots (bucket 1 at one row); up to
/// `S4_ROWS` rows, groups of 4 slots (fewer registers than 8; a tile with more than 4 real
/// slots takes a second pass over its weights); past that, all 8 in one pass.
pub(in crate::backend::gpu) fn moe8_slots(n: usize) -> u32 {
    let want = if n <= 1 {
        1
    } else if n <= S4_ROWS {
        4
    } else {
        TILE as u32
    };
    debug_assert!(MOE8_SLOTS.contains(&want));
    want
}

/// Tiles the grouped matmuls launch: the tiles in use are a prefix, each with at least one
/// assignment, so no more than `total` of them.
pub(in crate::backend::gpu) fn used_tiles(total: usize, ne: usize) -> usize {
    max_tiles(total, ne).min(total)
}

impl Layout {
    pub(in crate::backend::gpu) fn new(rows: usize, s: &MoeShape, h: usize, elem: usize) -> Self {
        let total = rows * s.top_k;
        let tiles = max_tiles(total, s.n_expert);
        let slots = tiles * TILE;
        let align = |b: usize| b.next_multiple_of(256);
        let ids = 0;
        let wts = align(ids + 4 * total);
        let inv = align(wts + 4 * total);
        let sorted = align(inv + 4 * total);
        let tile_expert = align(sorted + 4 * slots);
        let estart = align(tile_expert + 4 * tiles);
        let act = align(estart + 4 * (s.n_expert + 1));
        let y = align(act + elem * slots * s.expert_ff);
        let xq = align(y + elem * slots * h);
        let actq = align(xq + qx_bytes(rows, h));
        Layout {
            ids,
            wts,
            inv,
            sorted,
            tile_expert,
            estart,
            act,
            y,
            xq,
            actq,
            bytes: actq + qx_bytes(slots, s.expert_ff),
        }
    }
}
