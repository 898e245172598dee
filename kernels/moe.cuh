// Shared by moe.cu and moe_quant.cu (after prelude.cuh and quant.cuh, whose qx32_bf16 they use
// for 8-bit activations): the tile size of the grouped expert matmuls.

// Assignment slots per tile of the grouped matmuls (TILE in src/backend/gpu/moe.rs).
constexpr int MOE_TILE = 8;
