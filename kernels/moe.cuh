// Shared by moe.cu and moe_quant.cu (after prelude.cuh and quant.cuh): the tile size of the
// grouped expert matmuls and the 8-bit quantization of one block of activations.

// Assignment slots per tile of the grouped matmuls (TILE in src/backend/gpu/moe.rs).
constexpr int MOE_TILE = 8;

#if !defined(KILN_DTYPE_F32)
// One block of 32 bf16 values at `x` to qgemv.cu's 8-bit activation layout: the signed
// quants to `qs` (32 bytes, 16-aligned), the block's (d = amax / 127, s = the exact sum)
// returned. The same arithmetic in the same order as `quantize_x_bf16`, so a row quantized
// here has the very bits `quantize_x` gives it.
__device__ __forceinline__ QxScale moe_qx32(const bf16* __restrict__ x, u8* __restrict__ qs) {
    const vec4u* src = reinterpret_cast<const vec4u*>(x);
    vec4u raw[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) raw[i] = src[i];
    float v[32];
#pragma unroll
    for (int i = 0; i < 4; ++i) Chunk<bf16>::unpack(raw[i], v + 8 * i);
    float amax = 0.f, sum = 0.f;
#pragma unroll
    for (int e = 0; e < 32; ++e) {
        amax = fmaxf(amax, fabsf(v[e]));
        sum += v[e];
    }
    const float id = amax > 0.f ? 127.f / amax : 0.f;
    u32 w[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        u32 r = 0;
#pragma unroll
        for (int e = 0; e < 4; ++e) r |= ((u32)(int)rintf(v[4 * i + e] * id) & 0xffu) << (8 * e);
        w[i] = r;
    }
    vec4u* dst = reinterpret_cast<vec4u*>(qs);
    dst[0] = vec4u{w[0], w[1], w[2], w[3]};
    dst[1] = vec4u{w[4], w[5], w[6], w[7]};
    return QxScale{amax / 127.f, sum};
}
#endif
