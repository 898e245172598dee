// Mixture-of-experts FFN, grouped by expert for the whole batch; every size is bounded by
// the step's rows, so a step records into a graph (no host round trip inside).
//   moe_route:   per row, softmax over the router logits, the top k (ties -> lowest
//                index), weights renormalised over the k when `norm`; one warp per row
//   moe_prep:    small decode steps (the host: up to 8 rows, at most MOE_PREP_MAX
//                assignments): moe_route, moe_align and, with `xq`, quantize_x of the n rows
//                of x (bf16), in one block and one launch; up to WARP assignments one
//                warp routes and aligns in registers while the block's other warps quantize
//   moe_align:   one block: the assignments (t * k + j) sorted by expert (in assignment
//                order within an expert), each expert's
//                run padded to a multiple of MOE_TILE; `sorted[p]` = assignment or -1,
//                `tile_expert[i]` = expert of tile i or -1, `inv[a]` = a's padded slot,
//                `estart[e]` = expert e's first slot (estart[ne]: the slots in use)
//   moe_gate_up: act[p] = silu(Wg_e x_t) * (Wu_e x_t) for the MOE_TILE slots of a tile
//                (one warp per output column, the expert's weight row read once per tile);
//                gpt-oss: biases bg/bu before a clamped SwiGLU (moe_act, moe.cuh)
//   moe_down:    y[p] = Wd_e act[p]
//   moe_combine: out[t] = sum_j w[t, j] * y[inv[t * k + j]]   (fixed order: deterministic;
//                gpt-oss: + the slot's expert's down bias bd inside the sum)
//   moe_combine_norm: moe_combine's sum added to the residual, then the next RMSNorm
//                (add_rms_norm's arithmetic, and in bf16 the 8-bit rows the vector norms
//                leave): the MoE output and the next layer's norm in one launch
//   moe_shared_add: out[t] += sigmoid(x_t . g) * ys[t]   (Qwen2-MoE's shared expert, whose
//                ys = Wd (silu(Wg x) * (Wu x)) the ordinary matmuls compute); one block a row
//
//   sorted:  | e0 a a a - | e1 a - - - | e3 a a a a | a - - - |  - = -1 padding
//              tile 0        tile 1       tile 2      tile 3     (MOE_TILE = 4 here)

constexpr int MOE_MAX_EXPERTS = 512;
constexpr int MOE_MAX_K = 32;

// Experts per lane of moe_route's warp (lane l holds experts l, l + WARP, ...).
constexpr int MOE_PER_LANE = MOE_MAX_EXPERTS / WARP;

// One row's routing by one warp: the lanes hold the row's logits, softmax by warp
// reductions, then k rounds of a warp-wide arg-max over the experts not yet taken (larger
// value first, then the lower index: the lowest index wins a tie). Lane r < k gets the r-th
// choice and its weight (renormalised over the k when `norm`); every lane takes part.
template <typename T>
__device__ __forceinline__ void moe_route_one(const T* __restrict__ l, int ne, int k, int norm, int& my_id,
                                              float& my_w) {
    const int lane = threadIdx.x % WARP;
    float v[MOE_PER_LANE];
    float mx = -KILN_INF;
#pragma unroll
    for (int i = 0; i < MOE_PER_LANE; ++i) {
        const int e = lane + WARP * i;
        v[i] = e < ne ? to_f(l[e]) : -KILN_INF;
        mx = fmaxf(mx, v[i]);
    }
    mx = warp_max(mx);
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < MOE_PER_LANE; ++i)
        if (lane + WARP * i < ne) sum += __expf(v[i] - mx);
    sum = warp_sum(sum);
    u32 taken = 0u;  // bit i: expert lane + WARP * i
    float my_p = 0.f, total = 0.f;
    my_id = 0;
    for (int r = 0; r < k; ++r) {
        int best = -1;
        float bv = 0.f;
#pragma unroll
        for (int i = 0; i < MOE_PER_LANE; ++i) {
            const int e = lane + WARP * i;
            if (e < ne && !(taken & (1u << i)) && (best < 0 || v[i] > bv)) {
                best = e;
                bv = v[i];
            }
        }
        for (int o = WARP / 2; o > 0; o >>= 1) {
            const int ob = shfl_xor(best, o);
            const float ov = shfl_xor(bv, o);
            if (ob >= 0 && (best < 0 || ov > bv || (ov == bv && ob < best))) {
                best = ob;
                bv = ov;
            }
        }
        if (best % WARP == lane) taken |= 1u << (best / WARP);
        const float p = __expf(bv - mx) / sum;
        total += p;
        if (lane == r) {
            my_id = best;
            my_p = p;
        }
    }
    my_w = norm ? my_p / total : my_p;
}

// One warp per row (warp w of `warps` takes rows w, w + warps, ...), moe_route_one each.
// `ids` may be shared memory (moe_prep).
template <typename T>
__device__ __forceinline__ void moe_route_rows(const T* __restrict__ logits, int n, int ne, int k, int norm,
                                               int* ids, float* __restrict__ wts, int w, int warps) {
    const int lane = threadIdx.x % WARP;
    for (int t = w; t < n; t += warps) {
        int my_id;
        float my_w;
        moe_route_one<T>(logits + (size_t)t * ne, ne, k, norm, my_id, my_w);
        if (lane < k) {
            ids[(size_t)t * k + lane] = my_id;
            wts[(size_t)t * k + lane] = my_w;
        }
    }
}

// Threads of moe_align's one block (the host launches it with this many).
constexpr int MOE_ALIGN_THREADS = 1024;

// Counts per expert (shared atomics), a block-wide prefix sum of the padded counts, then a
// warp per expert places its assignments in order: a lane-wide prefix sum of
// `ids[a] == e` over each WARP assignments gives every match its slot. `ids` may be shared
// memory (moe_prep).
__device__ __forceinline__ void moe_align_block(const int* ids, int total, int ne, int* __restrict__ sorted,
                                                int* __restrict__ tile_expert, int* __restrict__ inv,
                                                int max_tiles, int* __restrict__ estart) {
    __shared__ int cnt[MOE_MAX_EXPERTS];
    __shared__ int start[MOE_MAX_EXPERTS + 1];
    const int tid = threadIdx.x, nt = blockDim.x;
    for (int e = tid; e < MOE_MAX_EXPERTS; e += nt) cnt[e] = 0;
    __syncthreads();
    for (int a = tid; a < total; a += nt) atomicAdd(&cnt[ids[a]], 1);
    __syncthreads();
    // Inclusive scan (Hillis-Steele, one thread per expert slot) of the padded counts
    // into start[1..].
    static_assert(MOE_ALIGN_THREADS >= MOE_MAX_EXPERTS, "the scan takes a thread per expert");
    const bool scan = tid < MOE_MAX_EXPERTS;
    if (tid == 0) start[0] = 0;
    if (scan) start[tid + 1] = tid < ne ? (cnt[tid] + MOE_TILE - 1) / MOE_TILE * MOE_TILE : 0;
    __syncthreads();
    for (int o = 1; o < MOE_MAX_EXPERTS; o <<= 1) {
        const int add = scan && tid >= o ? start[tid + 1 - o] : 0;
        __syncthreads();
        if (scan) start[tid + 1] += add;
        __syncthreads();
    }
    for (int e = tid; e <= ne; e += nt) estart[e] = start[e];
    const int lane = tid % WARP, w = tid / WARP, nw = nt / WARP;
    for (int e = w; e < ne; e += nw) {
        int base = start[e];
        const int end = base + cnt[e];
        for (int a0 = 0; a0 < total && base < end; a0 += WARP) {
            const int a = a0 + lane;
            const int hit = a < total && ids[a] == e;
            int s = hit;
            for (int o = 1; o < WARP; o <<= 1) {
                const int y = shfl(s, lane >= o ? lane - o : 0);
                if (lane >= o) s += y;
            }
            if (hit) {
                sorted[base + s - 1] = a;
                inv[a] = base + s - 1;
            }
            base += shfl(s, WARP - 1);
        }
        for (int p = base + lane; p < start[e + 1]; p += WARP) sorted[p] = -1;
        for (int i = start[e] / MOE_TILE + lane; i < start[e + 1] / MOE_TILE; i += WARP) tile_expert[i] = e;
    }
    for (int i = start[ne] / MOE_TILE + tid; i < max_tiles; i += nt) tile_expert[i] = -1;
}

extern "C" __global__ void __launch_bounds__(MOE_ALIGN_THREADS)
    moe_align(const int* __restrict__ ids, int total, int ne, int* __restrict__ sorted,
              int* __restrict__ tile_expert, int* __restrict__ inv, int max_tiles, int* __restrict__ estart) {
    moe_align_block(ids, total, ne, sorted, tile_expert, inv, max_tiles, estart);
}

// Most assignments (rows * k) moe_prep takes: its ids stay in shared memory (MOE_PREP_MAX
// in src/backend/gpu/moe.rs).
constexpr int MOE_PREP_MAX = 512;

// moe_prep's quantize_x: the n rows of x, a thread per block of 32 (bf16 only; the host
// passes no xq in f32).
// Threads first, first + stride, ... take the blocks.
__device__ __forceinline__ void moe_prep_qx(const float*, int, int, u8*, int, int) {}
#if !defined(KILN_DTYPE_F32)
__device__ __forceinline__ void moe_prep_qx(const bf16* __restrict__ x, int n, int h, u8* __restrict__ xq, int first,
                                            int stride) {
    if (xq == nullptr) return;
    const int blocks = n * (h / 32);
    QxScale* ds = reinterpret_cast<QxScale*>(xq + plane_align((size_t)n * h));
    for (int c = first; c < blocks; c += stride) ds[c] = qx32_bf16(x + 32 * (size_t)c, xq + 32 * (size_t)c);
}
#endif

// moe_prep with at most WARP assignments (n * k <= WARP): warp 0 routes the rows and aligns
// their assignments in registers (lane a holds assignment a; no block barrier), while the
// block's other warps (the host launches WARP * (1 + quantizing warps) threads) quantize x.
// The same outputs as moe_align_block: sorted, inv, tile_expert and estart.
template <typename T>
__device__ __forceinline__ void moe_prep_warp(const T* __restrict__ logits, const T* __restrict__ x, int n, int ne,
                                              int k, int norm, int h, float* __restrict__ wts,
                                              int* __restrict__ sorted, int* __restrict__ tile_expert,
                                              int* __restrict__ inv, int max_tiles, int* __restrict__ estart,
                                              u8* __restrict__ xq) {
    if (threadIdx.x >= WARP) {
        moe_prep_qx(x, n, h, xq, threadIdx.x - WARP, blockDim.x - WARP);
        return;
    }
    const int lane = threadIdx.x, total = n * k;
    // Lane a's expert; lanes past the assignments hold one above every expert.
    int id = MOE_MAX_EXPERTS;
    for (int t = 0; t < n; ++t) {
        int my_id;
        float my_w;
        moe_route_one<T>(logits + (size_t)t * ne, ne, k, norm, my_id, my_w);
        if (lane < k) wts[(size_t)t * k + lane] = my_w;
        const int j = lane - t * k;
        const bool row = j >= 0 && j < k;
        const int v = shfl(my_id, row ? j : 0);
        if (row) id = v;
    }
    // The lane's expert's assignment count and the lane's rank among them (assignment order).
    int cnt = 0, rank = 0;
    for (int b = 0; b < total; ++b) {
        const int eb = shfl(id, b);
        cnt += eb == id;
        rank += eb == id && b < lane;
    }
    // The expert's first assignment carries its padded run; an expert's run starts after
    // the runs of every lower expert (estart[e]: lane + WARP * i holds e's in est[i]).
    const int pc = lane < total && rank == 0 ? (cnt + MOE_TILE - 1) / MOE_TILE * MOE_TILE : 0;
    constexpr int NE = MOE_MAX_EXPERTS / WARP + 1;
    int est[NE];
#pragma unroll
    for (int i = 0; i < NE; ++i) est[i] = 0;
    int start = 0, used = 0;
    for (int b = 0; b < total; ++b) {
        const int eb = shfl(id, b), pb = shfl(pc, b);
        if (eb < id) start += pb;
        used += pb;
#pragma unroll
        for (int i = 0; i < NE; ++i)
            if (eb < lane + WARP * i) est[i] += pb;
    }
#pragma unroll
    for (int i = 0; i < NE; ++i)
        if (lane + WARP * i <= ne) estart[lane + WARP * i] = est[i];
    if (lane < total) {
        sorted[start + rank] = lane;
        inv[lane] = start + rank;
    }
    if (pc > 0) {
        for (int p = start + cnt; p < start + pc; ++p) sorted[p] = -1;
        for (int i = start / MOE_TILE; i < (start + pc) / MOE_TILE; ++i) tile_expert[i] = id;
    }
    for (int i = used / MOE_TILE + lane; i < max_tiles; i += WARP) tile_expert[i] = -1;
    if (blockDim.x == WARP) moe_prep_qx(x, n, h, xq, lane, WARP);
}

// Decode steps: route (a warp per row), quantize x, then align the assignments held in
// shared memory, in one block of MOE_ALIGN_THREADS: one launch instead of three. Up to WARP
// assignments, moe_prep_warp instead (a smaller block, no block barrier).
template <typename T>
__device__ void moe_prep_impl(const T* __restrict__ logits, const T* __restrict__ x, int n, int ne, int k, int norm,
                              int h, float* __restrict__ wts, int* __restrict__ sorted, int* __restrict__ tile_expert,
                              int* __restrict__ inv, int max_tiles, int* __restrict__ estart, u8* __restrict__ xq) {
    if (n * k <= WARP) {
        moe_prep_warp<T>(logits, x, n, ne, k, norm, h, wts, sorted, tile_expert, inv, max_tiles, estart, xq);
        return;
    }
    __shared__ int ids[MOE_PREP_MAX];
    moe_route_rows<T>(logits, n, ne, k, norm, ids, wts, threadIdx.x / WARP, blockDim.x / WARP);
    moe_prep_qx(x, n, h, xq, threadIdx.x, blockDim.x);
    __syncthreads();
    moe_align_block(ids, n * k, ne, sorted, tile_expert, inv, max_tiles, estart);
}

// One block per (tile, group of output columns); each warp takes columns in turn and
// reduces the MOE_TILE dot products of its column over its lanes.
template <typename T, bool GATE_UP>
__device__ void moe_tile_impl(const T* __restrict__ in, const T* __restrict__ w0, const T* __restrict__ w1,
                              const int* __restrict__ sorted, const int* __restrict__ tile_expert, int k,
                              int in_len, int out_len, int cols_per_block, T* __restrict__ out,
                              const T* __restrict__ bg = nullptr, const T* __restrict__ bu = nullptr,
                              float alpha = 0.f, float limit = 0.f) {
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
                const float v = GATE_UP ? moe_act<T>(s0, s1, bg, bu, (size_t)e * out_len + c, alpha, limit) : s0;
                out[(size_t)slot[i] * out_len + c] = from_f<T>(v);
            }
        }
    }
}

// With `bd` (gpt-oss's down biases; non-null), each expert's bias joins its output before
// the routing weight multiplies it.
template <typename T>
__device__ void moe_combine_impl(const T* __restrict__ y, const int* __restrict__ inv, const float* __restrict__ wts,
                                 int k, int h, size_t total, T* __restrict__ out, const int* __restrict__ tile_expert,
                                 const T* __restrict__ bd) {
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        const size_t t = e / h, i = e % h;
        float s = 0.f;
        for (int j = 0; j < k; ++j) {
            const int slot = inv[t * k + j];
            s += wts[t * k + j] * moe_y_bias<T>(to_f(y[(size_t)slot * h + i]), bd, tile_expert, slot, h, (int)i);
        }
        out[e] = from_f<T>(s);
    }
}

// Values per thread of moe_combine_norm (consecutive: four threads hold a block of 32).
constexpr int MOE_CN_E = 8;

// MOE_CN_E values at p (16-byte aligned) as floats, and back (rounded to T).
template <typename T>
__device__ __forceinline__ void moe_ld8(const T* __restrict__ p, float* v) {
    typedef Chunk<T> C;
#pragma unroll
    for (int c = 0; c < MOE_CN_E / C::E; ++c) C::unpack(reinterpret_cast<const typename C::Raw*>(p)[c], v + c * C::E);
}
template <typename T>
__device__ __forceinline__ void moe_st8(T* __restrict__ p, const float* v) {
    typedef Chunk<T> C;
#pragma unroll
    for (int c = 0; c < MOE_CN_E / C::E; ++c) reinterpret_cast<typename C::Raw*>(p)[c] = C::pack(v + c * C::E);
}

// moe_combine followed by add_rms_norm in one launch, one block per row t: the row's
// weighted sum of its slots (rounded to T, as moe_combine stores it) is added to the
// residual (rounded, stored back), then out = rmsnorm(residual) * w (add_rms_norm's
// arithmetic). A thread takes MOE_CN_E consecutive values (h a multiple of 32, at most
// MOE_CN_E * blockDim.x; rows 16-byte aligned: the host checks). With xq (bf16), out's 8-bit
// blocks of 32 as the vector norms leave them for the quantized matmul after: i8 qs[rows][h],
// then at plane_align(rows * h) one (d, s) per block (rows = gridDim.x).
template <typename T>
__device__ void moe_combine_norm_impl(const T* __restrict__ y, const int* __restrict__ inv,
                                      const float* __restrict__ wts, int k, int h, T* __restrict__ residual,
                                      const T* __restrict__ w, T* __restrict__ out, u8* __restrict__ xq,
                                      float eps, const int* __restrict__ tile_expert, const T* __restrict__ bd) {
    __shared__ float scratch[MAX_WARPS];
    const int t = blockIdx.x, i0 = threadIdx.x * MOE_CN_E;
    const bool on = i0 < h;
    const size_t row = (size_t)t * h;
    float v[MOE_CN_E];
    float ss = 0.f;
#pragma unroll
    for (int e = 0; e < MOE_CN_E; ++e) v[e] = 0.f;
    if (on) {
        for (int j = 0; j < k; ++j) {
            const float wj = wts[(size_t)t * k + j];
            const int slot = inv[(size_t)t * k + j];
            float yv[MOE_CN_E];
            moe_ld8<T>(y + (size_t)slot * h + i0, yv);
            if (bd != nullptr) {
                float bv[MOE_CN_E];
                moe_ld8<T>(bd + (size_t)tile_expert[slot / MOE_TILE] * h + i0, bv);
#pragma unroll
                for (int e = 0; e < MOE_CN_E; ++e) yv[e] += bv[e];
            }
#pragma unroll
            for (int e = 0; e < MOE_CN_E; ++e) v[e] += wj * yv[e];
        }
        float r[MOE_CN_E];
        moe_ld8<T>(residual + row + i0, r);
#pragma unroll
        for (int e = 0; e < MOE_CN_E; ++e) {
            v[e] = to_f(from_f<T>(r[e] + to_f(from_f<T>(v[e]))));  // the rounded residual
            ss += v[e] * v[e];
        }
        moe_st8<T>(residual + row + i0, v);
    }
    ss = block_sum(ss, scratch);
    const float rs = 1.0f / sqrtf(ss / (float)h + eps);
    float o[MOE_CN_E];
#pragma unroll
    for (int e = 0; e < MOE_CN_E; ++e) o[e] = 0.f;
    if (on) {
        moe_ld8<T>(w + i0, o);
#pragma unroll
        for (int e = 0; e < MOE_CN_E; ++e) o[e] = to_f(from_f<T>(o[e] * (v[e] * rs)));  // rounded
        moe_st8<T>(out + row + i0, o);
    }
    if (xq == nullptr) return;
    // A block of 32: adjacent lanes (every lane takes part in the shuffles).
    float* ds = reinterpret_cast<float*>(xq + plane_align((size_t)gridDim.x * h));
    qx_lanes<MOE_CN_E>(o, on, threadIdx.x % (32 / MOE_CN_E) == 0, xq + row + i0, ds + 2 * ((row + i0) / 32));
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
        moe_route_rows<T>(logits, n, ne, k, norm, ids, wts,                                         \
                          blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP,                    \
                          gridDim.x * (blockDim.x / WARP));                                         \
    }                                                                                               \
    extern "C" __global__ void __launch_bounds__(MOE_ALIGN_THREADS)                                 \
        moe_prep_##N(const T* logits, const T* x, int n, int ne, int k, int norm, int h, float* wts, \
                     int* sorted, int* tile_expert, int* inv, int max_tiles, int* estart, u8* xq) { \
        moe_prep_impl<T>(logits, x, n, ne, k, norm, h, wts, sorted, tile_expert, inv, max_tiles,    \
                         estart, xq);                                                               \
    }                                                                                               \
    extern "C" __global__ void moe_gate_up_##N(const T* x, const T* wg, const T* wu,                \
                                               const int* sorted, const int* tile_expert, int k,    \
                                               int h, int f, int cols, T* act, const T* bg,         \
                                               const T* bu, float alpha, float limit) {             \
        moe_tile_impl<T, true>(x, wg, wu, sorted, tile_expert, k, h, f, cols, act, bg, bu, alpha,   \
                               limit);                                                              \
    }                                                                                               \
    extern "C" __global__ void moe_down_##N(const T* act, const T* wd, const int* sorted,           \
                                            const int* tile_expert, int f, int h, int cols, T* y) { \
        moe_tile_impl<T, false>(act, wd, nullptr, sorted, tile_expert, 1, f, h, cols, y);           \
    }                                                                                               \
    extern "C" __global__ void moe_combine_##N(const T* y, const int* inv, const float* wts, int k, \
                                               int h, u64 total, T* out, const int* tile_expert,    \
                                               const T* bd) {                                       \
        moe_combine_impl<T>(y, inv, wts, k, h, (size_t)total, out, tile_expert, bd);                \
    }                                                                                               \
    extern "C" __global__ void moe_combine_norm_##N(const T* y, const int* inv, const float* wts,   \
                                                    int k, int h, T* residual, const T* w, T* out,  \
                                                    u8* xq, float eps, const int* tile_expert,      \
                                                    const T* bd) {                                  \
        moe_combine_norm_impl<T>(y, inv, wts, k, h, residual, w, out, xq, eps, tile_expert, bd);    \
    }                                                                                               \
    extern "C" __global__ void moe_shared_add_##N(const T* x, const T* g, const T* ys, int h,       \
                                                  int n, T* out) {                                  \
        moe_shared_add_impl<T>(x, g, ys, h, n, out);                                                \
    }
KILN_FOR_DTYPES(KILN_MOE)
