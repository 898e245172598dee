// Mixture-of-experts FFN, grouped by expert for the whole batch; every size is bounded by
// the step's rows, so a step records into a graph (no host round trip inside).
//   moe_route:   per row, softmax over the router logits, the top k (ties -> lowest
//                index), weights renormalised over the k when `norm`; one thread per row
//   moe_align:   one block: the assignments (t * k + j) sorted by expert, each expert's
//                run padded to a multiple of MOE_TILE; `sorted[p]` = assignment or -1,
//                `tile_expert[i]` = expert of tile i or -1, `inv[a]` = a's padded slot
//   moe_gate_up: act[p] = silu(Wg_e x_t) * (Wu_e x_t) for the MOE_TILE slots of a tile
//                (one warp per output column, the expert's weight row read once per tile)
//   moe_down:    y[p] = Wd_e act[p]
//   moe_combine: out[t] = sum_j w[t, j] * y[inv[t * k + j]]   (fixed order: deterministic)
//   moe_shared_add: out[t] += sigmoid(x_t . g) * ys[t]   (Qwen2-MoE's shared expert, whose
//                ys = Wd (silu(Wg x) * (Wu x)) the ordinary matmuls compute); one block a row
//
//   sorted:  | e0 a a a - | e1 a - - - | e3 a a a a | a - - - |  - = -1 padding
//              tile 0        tile 1       tile 2      tile 3     (MOE_TILE = 4 here)

constexpr int MOE_TILE = 8;
constexpr int MOE_MAX_EXPERTS = 512;
constexpr int MOE_MAX_K = 32;

template <typename T>
__device__ void moe_route_impl(const T* __restrict__ logits, int n, int ne, int k, int norm,
                               int* __restrict__ ids, float* __restrict__ wts) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n) return;
    const T* l = logits + (size_t)t * ne;
    float mx = -KILN_INF;
    for (int e = 0; e < ne; ++e) mx = fmaxf(mx, to_f(l[e]));
    float sum = 0.f;
    for (int e = 0; e < ne; ++e) sum += __expf(to_f(l[e]) - mx);
    u32 taken[MOE_MAX_EXPERTS / 32];
    for (int i = 0; i < MOE_MAX_EXPERTS / 32; ++i) taken[i] = 0u;
    float p[MOE_MAX_K];
    float total = 0.f;
    for (int r = 0; r < k; ++r) {
        int best = -1;
        float bv = 0.f;
        for (int e = 0; e < ne; ++e) {
            const float v = to_f(l[e]);
            // Strictly greater: the lowest index wins a tie.
            if (!(taken[e >> 5] & (1u << (e & 31))) && (best < 0 || v > bv)) {
                best = e;
                bv = v;
            }
        }
        taken[best >> 5] |= 1u << (best & 31);
        p[r] = __expf(bv - mx) / sum;
        total += p[r];
        ids[t * k + r] = best;
    }
    for (int r = 0; r < k; ++r) wts[t * k + r] = norm ? p[r] / total : p[r];
}

extern "C" __global__ void moe_align(const int* ids, int total, int ne, int* sorted, int* tile_expert,
                                     int* inv, int max_tiles) {
    __shared__ int start[MOE_MAX_EXPERTS + 1];
    for (int e = threadIdx.x; e < ne; e += blockDim.x) {
        int c = 0;
        for (int a = 0; a < total; ++a) c += ids[a] == e;
        start[e + 1] = (c + MOE_TILE - 1) / MOE_TILE * MOE_TILE;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        start[0] = 0;
        for (int e = 0; e < ne; ++e) start[e + 1] += start[e];
    }
    __syncthreads();
    for (int e = threadIdx.x; e < ne; e += blockDim.x) {
        int p = start[e];
        for (int a = 0; a < total; ++a) {
            if (ids[a] == e) {
                sorted[p] = a;
                inv[a] = p;
                ++p;
            }
        }
        for (; p < start[e + 1]; ++p) sorted[p] = -1;
        for (int i = start[e] / MOE_TILE; i < start[e + 1] / MOE_TILE; ++i) tile_expert[i] = e;
    }
    for (int i = start[ne] / MOE_TILE + threadIdx.x; i < max_tiles; i += blockDim.x) tile_expert[i] = -1;
}

// One block per (tile, group of output columns); each warp takes columns in turn and
// reduces the MOE_TILE dot products of its column over its lanes.
template <typename T, bool GATE_UP>
__device__ void moe_tile_impl(const T* __restrict__ in, const T* __restrict__ w0, const T* __restrict__ w1,
                              const int* __restrict__ sorted, const int* __restrict__ tile_expert, int k,
                              int in_len, int out_len, int cols_per_block, T* __restrict__ out) {
    const int tile = blockIdx.x;
    const int e = tile_expert[tile];
    if (e < 0) return;
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, nw = blockDim.x / WARP;
    const T* rows[MOE_TILE];
    int slot[MOE_TILE];
    for (int i = 0; i < MOE_TILE; ++i) {
        const int p = tile * MOE_TILE + i;
        const int a = sorted[p];
        slot[i] = a < 0 ? -1 : p;
        // gate/up read the token's row of x; down reads the slot's own activation row.
        rows[i] = a < 0 ? nullptr : in + (size_t)(GATE_UP ? a / k : p) * in_len;
    }
    const int c0 = blockIdx.y * cols_per_block;
    const int c1 = min(out_len, c0 + cols_per_block);
    for (int c = c0 + warp; c < c1; c += nw) {
        const T* r0 = w0 + ((size_t)e * out_len + c) * in_len;
        const T* r1 = GATE_UP ? w1 + ((size_t)e * out_len + c) * in_len : nullptr;
        float a0[MOE_TILE], a1[MOE_TILE];
        for (int i = 0; i < MOE_TILE; ++i) a0[i] = a1[i] = 0.f;
        for (int j = lane; j < in_len; j += WARP) {
            const float g = to_f(r0[j]);
            const float u = GATE_UP ? to_f(r1[j]) : 0.f;
            for (int i = 0; i < MOE_TILE; ++i) {
                if (rows[i]) {
                    const float v = to_f(rows[i][j]);
                    a0[i] += g * v;
                    if (GATE_UP) a1[i] += u * v;
                }
            }
        }
        for (int i = 0; i < MOE_TILE; ++i) {
            const float s0 = warp_sum(a0[i]);
            const float s1 = GATE_UP ? warp_sum(a1[i]) : 0.f;
            if (lane == 0 && slot[i] >= 0) {
                const float v = GATE_UP ? s0 / (1.0f + __expf(-s0)) * s1 : s0;
                out[(size_t)slot[i] * out_len + c] = from_f<T>(v);
            }
        }
    }
}

template <typename T>
__device__ void moe_combine_impl(const T* __restrict__ y, const int* __restrict__ inv, const float* __restrict__ wts,
                                 int k, int h, size_t total, T* __restrict__ out) {
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        const size_t t = e / h, i = e % h;
        float s = 0.f;
        for (int j = 0; j < k; ++j) s += wts[t * k + j] * to_f(y[(size_t)inv[t * k + j] * h + i]);
        out[e] = from_f<T>(s);
    }
}

template <typename T>
__device__ void moe_shared_add_impl(const T* __restrict__ x, const T* __restrict__ g,
                                    const T* __restrict__ ys, int h, int n, T* __restrict__ out) {
    __shared__ float scratch[MAX_WARPS];
    for (int t = blockIdx.x; t < n; t += gridDim.x) {
        const T* xt = x + (size_t)t * h;
        float d = 0.f;
        for (int i = threadIdx.x; i < h; i += blockDim.x) d += to_f(xt[i]) * to_f(g[i]);
        d = block_sum(d, scratch);
        const float s = 1.0f / (1.0f + __expf(-d));
        T* o = out + (size_t)t * h;
        const T* y = ys + (size_t)t * h;
        for (int i = threadIdx.x; i < h; i += blockDim.x) o[i] = from_f<T>(to_f(o[i]) + s * to_f(y[i]));
        __syncthreads();
    }
}

#define KILN_MOE(N, T)                                                                              \
    extern "C" __global__ void moe_route_##N(const T* logits, int n, int ne, int k, int norm,       \
                                             int* ids, float* wts) {                                \
        moe_route_impl<T>(logits, n, ne, k, norm, ids, wts);                                        \
    }                                                                                               \
    extern "C" __global__ void moe_gate_up_##N(const T* x, const T* wg, const T* wu,                \
                                               const int* sorted, const int* tile_expert, int k,    \
                                               int h, int f, int cols, T* act) {                    \
        moe_tile_impl<T, true>(x, wg, wu, sorted, tile_expert, k, h, f, cols, act);                 \
    }                                                                                               \
    extern "C" __global__ void moe_down_##N(const T* act, const T* wd, const int* sorted,           \
                                            const int* tile_expert, int f, int h, int cols, T* y) { \
        moe_tile_impl<T, false>(act, wd, nullptr, sorted, tile_expert, 1, f, h, cols, y);           \
    }                                                                                               \
    extern "C" __global__ void moe_combine_##N(const T* y, const int* inv, const float* wts, int k, \
                                               int h, u64 total, T* out) {                          \
        moe_combine_impl<T>(y, inv, wts, k, h, (size_t)total, out);                                 \
    }                                                                                               \
    extern "C" __global__ void moe_shared_add_##N(const T* x, const T* g, const T* ys, int h,       \
                                                  int n, T* out) {                                  \
        moe_shared_add_impl<T>(x, g, ys, h, n, out);                                                \
    }
KILN_FOR_DTYPES(KILN_MOE)
