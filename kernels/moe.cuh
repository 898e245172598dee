// Shared by moe.cu and moe_quant.cu (after prelude.cuh and quant.cuh, whose qx32_bf16 they use
// for 8-bit activations): the tile size of the grouped expert matmuls.

// Assignment slots per tile of the grouped matmuls (TILE in src/backend/gpu/moe.rs).
constexpr int MOE_TILE = 8;

// The expert activation of one gate/up pair (gate g, up u of expert column `at` = e * f + c),
// MoeAct::apply's arithmetic: with `bg` (gpt-oss; non-null: `bu` too) the experts' gate and up
// biases first; `limit` > 0: gpt-oss's clamped SwiGLU, g = min(g, limit), u = clamp(u, -limit,
// limit), g * sigmoid(alpha * g) * (u + 1); else SwiGLU, silu(g) * u. Once per output, outside
// the products' loops (the branches are uniform over the launch).
template <typename T>
__device__ __forceinline__ float moe_act(float g, float u, const T* __restrict__ bg, const T* __restrict__ bu,
                                         size_t at, float alpha, float limit) {
    if (bg != nullptr) {
        g += to_f(bg[at]);
        u += to_f(bu[at]);
    }
    if (limit > 0.f) {
        g = fminf(g, limit);
        u = fminf(fmaxf(u, -limit), limit);
        return g / (1.0f + __expf(-alpha * g)) * (u + 1.0f);
    }
    return g / (1.0f + __expf(-g)) * u;
}

// Expert output value y of slot `slot`, column i (h columns), with expert bias `bd` (gpt-oss;
// non-null): the slot's expert is its tile's (tile_expert).
template <typename T>
__device__ __forceinline__ float moe_y_bias(float y, const T* __restrict__ bd, const int* __restrict__ tile_expert,
                                            int slot, int h, int i) {
    return bd == nullptr ? y : y + to_f(bd[(size_t)tile_expert[slot / MOE_TILE] * h + i]);
}
