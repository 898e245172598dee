// Mixture-of-experts grouped matmuls of quantized experts (GGUF Q8_0, Q4_0, Q4_K, Q5_K,
// Q6_K): the tiles of moe.cu's moe_gate_up / moe_down (same routing, sorted assignments and
// combine), with each expert weight row decoded in registers by quant.cuh's unit decoders,
// once per tile of MOE_TILE slots. The experts of one kind are one stacked
// [n_expert * rows, cols] matrix in quant.cuh's plane layout: expert e's row c is row
// e * rows + c. Products accumulate in f32.
//   moe_gate_up_<q>: act[p] = silu(Wg_e x_t) * (Wu_e x_t)   (gate and up of one type)
//   moe_down_<q>:    y[p] = Wd_e act[p]

constexpr int MOEQ_TILE = 8;  // MOE_TILE of moe.cu (the host sizes both alike)

// 16 elements of row `xr` at `off`, as floats (16-byte loads: `off` and rows 16-aligned).
template <typename T>
__device__ __forceinline__ void moeq_x16(const T* __restrict__ xr, int off, float* xf) {
    typedef Chunk<T> C;
    const typename C::Raw* p = reinterpret_cast<const typename C::Raw*>(xr + off);
#pragma unroll
    for (int c = 0; c < 16 / C::E; ++c) C::unpack(p[c], xf + c * C::E);
}

// One block per (tile, group of output columns); each warp takes columns in turn, its lanes
// the units of the column's row, and reduces the MOEQ_TILE dot products over the lanes.
template <typename Q, typename T, bool GATE_UP>
__device__ void moeq_tile_impl(const T* __restrict__ in, const u8* __restrict__ w0, const u8* __restrict__ w1,
                               const int* __restrict__ sorted, const int* __restrict__ tile_expert, int k,
                               int in_len, int out_len, int n_rows, int cols_per_block, T* __restrict__ out) {
    const int tile = blockIdx.x;
    const int e = tile_expert[tile];
    if (e < 0) return;
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, nw = blockDim.x / WARP;
    const T* rows[MOEQ_TILE];
    int slot[MOEQ_TILE];
    for (int i = 0; i < MOEQ_TILE; ++i) {
        const int p = tile * MOEQ_TILE + i;
        const int a = sorted[p];
        slot[i] = a < 0 ? -1 : p;
        // gate/up read the token's row of x; down reads the slot's own activation row.
        rows[i] = a < 0 ? nullptr : in + (size_t)(GATE_UP ? a / k : p) * in_len;
    }
    const int nu = in_len / Q::UNIT;
    const int c0 = blockIdx.y * cols_per_block;
    const int c1 = min(out_len, c0 + cols_per_block);
    for (int c = c0 + warp; c < c1; c += nw) {
        const int j = e * out_len + c;
        const typename Q::Row r0 = Q::row(w0, n_rows, in_len, j);
        const typename Q::Row r1 = GATE_UP ? Q::row(w1, n_rows, in_len, j) : r0;
        float a0[MOEQ_TILE], a1[MOEQ_TILE];
        for (int i = 0; i < MOEQ_TILE; ++i) a0[i] = a1[i] = 0.f;
        for (int u = lane; u < nu; u += WARP) {
            const typename Q::Raw raw0 = Q::load(r0, u);
            const typename Q::Raw raw1 = GATE_UP ? Q::load(r1, u) : raw0;
#pragma unroll
            for (int run = 0; run < Q::RUNS; ++run) {
                float q0[16], q1[16], s0, d0, s1 = 0.f, d1 = 0.f;
                Q::run(raw0, u, run, q0, s0, d0);
                if (GATE_UP) Q::run(raw1, u, run, q1, s1, d1);
                const int off = Q::xoff(u, run);
                for (int i = 0; i < MOEQ_TILE; ++i) {
                    if (!rows[i]) continue;
                    float xf[16];
                    moeq_x16<T>(rows[i], off, xf);
                    float sx = 0.f, p0 = 0.f, p1 = 0.f;
#pragma unroll
                    for (int v = 0; v < 16; ++v) {
                        sx += xf[v];
                        p0 = fmaf(xf[v], q0[v], p0);
                        if (GATE_UP) p1 = fmaf(xf[v], q1[v], p1);
                    }
                    // weight = scale * q + add: sum w x = scale * (q . x) + add * sum x.
                    a0[i] += s0 * p0 + d0 * sx;
                    if (GATE_UP) a1[i] += s1 * p1 + d1 * sx;
                }
            }
        }
        for (int i = 0; i < MOEQ_TILE; ++i) {
            const float s0 = warp_sum(a0[i]);
            const float s1 = GATE_UP ? warp_sum(a1[i]) : 0.f;
            if (lane == 0 && slot[i] >= 0) {
                const float v = GATE_UP ? s0 / (1.0f + __expf(-s0)) * s1 : s0;
                out[(size_t)slot[i] * out_len + c] = from_f<T>(v);
            }
        }
    }
}

#define KILN_MOEQ_T(QN, Q, N, T)                                                                    \
    extern "C" __global__ void moe_gate_up_##QN##_##N(const T* x, const u8* wg, const u8* wu,       \
                                                      const int* sorted, const int* tile_expert,    \
                                                      int k, int h, int f, int n_rows, int cols,    \
                                                      T* act) {                                     \
        moeq_tile_impl<Q, T, true>(x, wg, wu, sorted, tile_expert, k, h, f, n_rows, cols, act);     \
    }                                                                                               \
    extern "C" __global__ void moe_down_##QN##_##N(const T* act, const u8* wd, const int* sorted,   \
                                                   const int* tile_expert, int f, int h,            \
                                                   int n_rows, int cols, T* y) {                    \
        moeq_tile_impl<Q, T, false>(act, wd, nullptr, sorted, tile_expert, 1, f, h, n_rows, cols,   \
                                    y);                                                             \
    }
#define KILN_MOEQ(N, T)                                                                             \
    KILN_MOEQ_T(q80, Q8_0, N, T)                                                                   \
    KILN_MOEQ_T(q40, Q4_0, N, T)                                                                   \
    KILN_MOEQ_T(q4k, Q4_K, N, T)                                                                   \
    KILN_MOEQ_T(q5k, Q5_K, N, T)                                                                   \
    KILN_MOEQ_T(q6k, Q6_K, N, T)
KILN_FOR_DTYPES(KILN_MOEQ)
