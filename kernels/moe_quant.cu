// Mixture-of-experts grouped matmuls of quantized experts (GGUF Q8_0, Q4_0, Q4_K, Q5_K,
// Q6_K): the tiles of moe.cu's moe_gate_up / moe_down (same routing, sorted assignments and
// combine), with each expert weight row decoded in registers by quant.cuh's unit decoders,
// once per tile of MOE_TILE slots. The experts of one kind are one stacked
// [n_expert * rows, cols] matrix in quant.cuh's plane layout: expert e's row c is row
// e * rows + c. Products accumulate in f32. In bf16 the host takes the dp4a tiles on 8-bit
// activations (moe8_*) or, with many rows per expert, the tensor-core ones (moemma_*) below.
//   moe_gate_up_<q>: act[p] = silu(Wg_e x_t) * (Wu_e x_t)   (gate and up of one type; every
//                    gate/up kernel here ends in moe.cuh's moe_act: gpt-oss's biases and
//                    clamped SwiGLU where the host passes them)
//   moe_down_<q>:    y[p] = Wd_e act[p]

// 16 elements of row `xr` at `off`, as floats (16-byte loads: `off` and rows 16-aligned).
template <typename T>
__device__ __forceinline__ void moeq_x16(const T* __restrict__ xr, int off, float* xf) {
    typedef Chunk<T> C;
    const typename C::Raw* p = reinterpret_cast<const typename C::Raw*>(xr + off);
#pragma unroll
    for (int c = 0; c < 16 / C::E; ++c) C::unpack(p[c], xf + c * C::E);
}

// One block per (tile, group of output columns); each warp takes columns in turn, its lanes
// the units of the column's row, and reduces the MOE_TILE dot products over the lanes.
template <typename Q, typename T, bool GATE_UP>
__device__ void moeq_tile_impl(const T* __restrict__ in, const u8* __restrict__ w0, const u8* __restrict__ w1,
                               const int* __restrict__ sorted, const int* __restrict__ tile_expert, int k,
                               int in_len, int out_len, int n_rows, int cols_per_block, T* __restrict__ out,
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
    const int nu = in_len / Q::UNIT;
    const int c0 = blockIdx.y * cols_per_block;
    const int c1 = min(out_len, c0 + cols_per_block);
    for (int c = c0 + warp; c < c1; c += nw) {
        const int j = e * out_len + c;
        const typename Q::Row r0 = Q::row(w0, n_rows, in_len, j);
        const typename Q::Row r1 = GATE_UP ? Q::row(w1, n_rows, in_len, j) : r0;
        float a0[MOE_TILE], a1[MOE_TILE];
        for (int i = 0; i < MOE_TILE; ++i) a0[i] = a1[i] = 0.f;
        for (int u = lane; u < nu; u += WARP) {
            const typename Q::Raw raw0 = Q::load(r0, u);
            const typename Q::Raw raw1 = GATE_UP ? Q::load(r1, u) : raw0;
#pragma unroll
            for (int run = 0; run < Q::RUNS; ++run) {
                float q0[16], q1[16], s0, d0, s1 = 0.f, d1 = 0.f;
                Q::run(raw0, u, run, q0, s0, d0);
                if (GATE_UP) Q::run(raw1, u, run, q1, s1, d1);
                const int off = Q::xoff(u, run);
                for (int i = 0; i < MOE_TILE; ++i) {
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
        for (int i = 0; i < MOE_TILE; ++i) {
            const float s0 = warp_sum(a0[i]);
            const float s1 = GATE_UP ? warp_sum(a1[i]) : 0.f;
            if (lane == 0 && slot[i] >= 0) {
                const float v = GATE_UP ? moe_act<T>(s0, s1, bg, bu, (size_t)j, alpha, limit) : s0;
                out[(size_t)slot[i] * out_len + c] = from_f<T>(v);
            }
        }
    }
}

#define KILN_MOEQ_T(QN, Q, N, T)                                                                    \
    extern "C" __global__ void moe_gate_up_##QN##_##N(const T* x, const u8* wg, const u8* wu,       \
                                                      const int* sorted, const int* tile_expert,    \
                                                      int k, int h, int f, int n_rows, int cols,    \
                                                      T* act, const T* bg, const T* bu, float alpha, \
                                                      float limit) {                                \
        moeq_tile_impl<Q, T, true>(x, wg, wu, sorted, tile_expert, k, h, f, n_rows, cols, act, bg, bu, \
                                   alpha, limit);                                                   \
    }                                                                                               \
    extern "C" __global__ void moe_down_##QN##_##N(const T* act, const u8* wd, const int* sorted,   \
                                                   const int* tile_expert, int f, int h,            \
                                                   int n_rows, int cols, T* y) {                    \
        moeq_tile_impl<Q, T, false>(act, wd, nullptr, sorted, tile_expert, 1, f, h, n_rows, cols,   \
                                    y);                                                             \
    }
#define KILN_MOEQ(N, T)                                                                             \
    KILN_IN_PART(q80, KILN_MOEQ_T(q80, Q8_0, N, T))                                                \
    KILN_IN_PART(q40, KILN_MOEQ_T(q40, Q4_0, N, T))                                                \
    KILN_IN_PART(q4k, KILN_MOEQ_T(q4k, Q4_K, N, T))                                                \
    KILN_IN_PART(q5k, KILN_MOEQ_T(q5k, Q5_K, N, T))                                                \
    KILN_IN_PART(q6k, KILN_MOEQ_T(q6k, Q6_K, N, T))                                                \
    KILN_IN_PART(mxfp4, KILN_MOEQ_T(mxfp4, MXFP4, N, T))
KILN_FOR_DTYPES(KILN_MOEQ)

#if !defined(KILN_DTYPE_F32)
// ---- 8-bit activations (bf16 compute only) -----------------------------------------------
// The same tiles on qgemv.cu's 8-bit activations (`quantize_x` layout: i8 qs[rows][k], then
// (d, s) per block of 32 at plane_align(rows * k)): each weight run becomes 4 words of signed
// 8-bit quants (quant.cuh's run8), multiplied with the activations by dp4a, once per tile.
//   moe8_gate_up_<q>: act[p] = silu(Wg_e x_t) * (Wu_e x_t)   xq: the n rows of x
//   moe8_down_<q>:    y[p] = Wd_e act[p]                      xq: the slots' rows of act
// A group of `lanes` lanes (a power of two up to the warp) takes C output columns, its lanes
// the units of the columns' rows, U units of each in flight; a block of blockDim threads
// covers blockDim / lanes * C columns of one tile. Only the tile's real slots (a prefix) are
// computed.

// MS: the most real slots a tile of this step can hold (an expert takes a token at most once:
// min(rows, MOE_TILE)); slots from MS on are padding.
// SELF (down at one slot a tile): the block quantizes its slot's row of `act` (bf16, at most
// MOE8_SELF_MAX values) into shared memory itself, after its first weight units are in
// flight, instead of reading a quantize_x launch's rows at xq.
constexpr int MOE8_SELF_MAX = 4096;  // MOE8_SELF_MAX in src/backend/gpu/moe.rs

template <typename Q, bool GATE_UP, int C, int U, int MS, bool SELF = false>
__device__ __forceinline__ void moe8_tile_impl(const u8* __restrict__ xq, int xrows, const u8* __restrict__ w0,
                                               const u8* __restrict__ w1, const int* __restrict__ sorted,
                                               const int* __restrict__ tile_expert, int k, int in_len,
                                               int out_len, int n_rows, int lanes, bf16* __restrict__ out,
                                               const bf16* __restrict__ act = nullptr,
                                               const bf16* __restrict__ bg = nullptr,
                                               const bf16* __restrict__ bu = nullptr, float alpha = 0.f,
                                               float limit = 0.f) {
    static_assert(!SELF || (MS == 1 && !GATE_UP), "in-block quantization: down, one slot a tile");
    const int tile = blockIdx.x;
    const int e = tile_expert[tile];
    if (e < 0) return;
    const int sub = threadIdx.x % lanes;
    // The group's C columns; a column past the last computes the last one (the group's
    // shuffles stay whole) and is not stored.
    const int c0 = (blockIdx.y * blockDim.x + threadIdx.x) / lanes * C;
    const QxScale* ds0 = reinterpret_cast<const QxScale*>(xq + plane_align((size_t)xrows * in_len));
    const int nb = in_len / 32;
    typename Q::Row r0[C], r1[C];
#pragma unroll
    for (int cc = 0; cc < C; ++cc) {
        const int j = e * out_len + min(c0 + cc, out_len - 1);
        r0[cc] = Q::row(w0, n_rows, in_len, j);
        r1[cc] = Q::row(GATE_UP ? w1 : w0, n_rows, in_len, j);
    }
    const int nu = in_len / Q::UNIT;
    typename Q::Raw raw0[U][C], raw1[U][C];
    auto fetch = [&](int u0) {
#pragma unroll
        for (int t = 0; t < U; ++t) {
            const int u = u0 + t * lanes;
            if (u < nu)
#pragma unroll
                for (int cc = 0; cc < C; ++cc) {
                    raw0[t][cc] = Q::load(r0[cc], u);
                    if (GATE_UP) raw1[t][cc] = Q::load(r1[cc], u);
                }
        }
    };
    // The tile's slots in groups of MS (real slots are a prefix: a group without one ends
    // the tile). Buckets 1 and 8 take one group; bucket 4 up to two, the second decoding the
    // weight units again (from L2).
    constexpr int GROUPS = MS == 4 ? MOE_TILE / MS : 1;
#pragma unroll 1
    for (int grp = 0; grp < GROUPS; ++grp) {
        const int p0 = tile * MOE_TILE + grp * MS;  // the group's first slot
        int xr[MS];
        int nv = 0;
    #pragma unroll
        for (int i = 0; i < MS; ++i) {
            const int p = p0 + i;
            const int a = sorted[p];
            if (a >= 0) nv = i + 1;
            // gate/up read the token's row of x; down reads the slot's own activation row.
            xr[i] = a < 0 ? 0 : (GATE_UP ? a / k : p);
        }
        if (nv == 0) break;
        const QxScale* ds = ds0;
        const u8* xbase = xq;
        float a0[C][MS], a1[C][MS];
    #pragma unroll
        for (int cc = 0; cc < C; ++cc)
    #pragma unroll
            for (int i = 0; i < MS; ++i) a0[cc][i] = a1[cc][i] = 0.f;
        fetch(sub);
        if constexpr (SELF) {
            // The slot's row quantized by the block while the first units load; every slot then
            // reads row 0 of the shared copy.
            __shared__ __align__(16) u8 sq[MOE8_SELF_MAX];
            __shared__ QxScale sds[MOE8_SELF_MAX / 32];
            if (nv > 0)
                for (int c = threadIdx.x; c < nb; c += blockDim.x)
                    sds[c] = qx32_bf16(act + (size_t)p0 * in_len + 32 * c, sq + 32 * c);
            __syncthreads();
            xbase = sq;
            ds = sds;
            xr[0] = 0;
        }
        for (int u0 = sub; u0 < nu; u0 += U * lanes) {
            if (u0 != sub) fetch(u0);
    #pragma unroll
            for (int t = 0; t < U; ++t) {
                const int u = u0 + t * lanes;
                if (u >= nu) continue;
    #pragma unroll
                for (int run = 0; run < Q::RUNS; ++run) {
                    u32 q0[C][4], q1[C][4];
                    float s0[C], m0[C], s1[C], m1[C];
    #pragma unroll
                    for (int cc = 0; cc < C; ++cc) {
                        Q::run8(raw0[t][cc], u, run, q0[cc], s0[cc], m0[cc]);
                        if (GATE_UP) Q::run8(raw1[t][cc], u, run, q1[cc], s1[cc], m1[cc]);
                    }
                    const int off = Q::xoff(u, run);
    #pragma unroll
                    for (int i = 0; i < MS; ++i) {
                        if (i >= nv) continue;
                        const vec4u xv = *reinterpret_cast<const vec4u*>(xbase + (size_t)xr[i] * in_len + off);
                        const QxScale dx = ds[(size_t)xr[i] * nb + off / 32];
    #pragma unroll
                        for (int cc = 0; cc < C; ++cc) {
                            int si = dp4a(q0[cc][0], xv.x, 0);
                            si = dp4a(q0[cc][1], xv.y, si);
                            si = dp4a(q0[cc][2], xv.z, si);
                            si = dp4a(q0[cc][3], xv.w, si);
                            a0[cc][i] = fmaf(s0[cc] * dx.d, (float)si, a0[cc][i]);
                            if (Q::XSUM) a0[cc][i] = fmaf(m0[cc], dx.s, a0[cc][i]);
                            if (GATE_UP) {
                                int sj = dp4a(q1[cc][0], xv.x, 0);
                                sj = dp4a(q1[cc][1], xv.y, sj);
                                sj = dp4a(q1[cc][2], xv.z, sj);
                                sj = dp4a(q1[cc][3], xv.w, sj);
                                a1[cc][i] = fmaf(s1[cc] * dx.d, (float)sj, a1[cc][i]);
                                if (Q::XSUM) a1[cc][i] = fmaf(m1[cc], dx.s, a1[cc][i]);
                            }
                        }
                    }
                }
            }
        }
    #pragma unroll
        for (int i = 0; i < MS; ++i) {
            if (i >= nv) continue;
    #pragma unroll
            for (int cc = 0; cc < C; ++cc) {
                float g = a0[cc][i], v = a1[cc][i];
                for (int o = lanes / 2; o > 0; o >>= 1) {
                    g += shfl_xor(g, o);
                    if (GATE_UP) v += shfl_xor(v, o);
                }
                if (sub == 0 && c0 + cc < out_len)
                    out[(size_t)(p0 + i) * out_len + c0 + cc] = from_f<bf16>(
                        GATE_UP ? moe_act<bf16>(g, v, bg, bu, (size_t)e * out_len + c0 + cc, alpha, limit) : g);
            }
        }
    }
}

// Columns per group (C) and units in flight per lane (U): gate/up rows come in pairs and are
// long (the hidden size), down rows are short (the expert width) and many. (Measured on the
// Qwen3-30B-A3B shape, H200: down C = 4 over 1 took batch 32 from 25.2 to 23.2 ms a step;
// gate/up C = 2 made every batch slower, 23.2 to 26.3 ms at 32. The one-slot bucket took batch
// 1 from 4.13 to 3.70 ms.)
constexpr int MOE8_GU_C = 1, MOE8_GU_U = 2, MOE8_DOWN_C = 4, MOE8_DOWN_U = 1;

#define KILN_MOE8_S(QN, Q, MS)                                                                      \
    extern "C" __global__ void moe8_gate_up_##QN##_bf16_s##MS(const u8* xq, int xrows, const u8* wg, \
                                                              const u8* wu, const int* sorted,      \
                                                              const int* tile_expert, int k, int h, \
                                                              int f, int n_rows, int lanes,         \
                                                              bf16* act, const bf16* bg,            \
                                                              const bf16* bu, float alpha,          \
                                                              float limit) {                        \
        moe8_tile_impl<Q, true, MOE8_GU_C, MOE8_GU_U, MS>(xq, xrows, wg, wu, sorted, tile_expert, k, h, \
                                                          f, n_rows, lanes, act, nullptr, bg, bu,   \
                                                          alpha, limit);                            \
    }                                                                                               \
    extern "C" __global__ void moe8_down_##QN##_bf16_s##MS(const u8* xq, int xrows, const u8* wd,   \
                                                           const int* sorted, const int* tile_expert, \
                                                           int f, int h, int n_rows, int lanes,     \
                                                           bf16* y) {                               \
        moe8_tile_impl<Q, false, MOE8_DOWN_C, MOE8_DOWN_U, MS>(xq, xrows, wd, nullptr, sorted,      \
                                                               tile_expert, 1, f, h, n_rows, lanes, y); \
    }
// Down at one slot a tile, the activations quantized in the block (no quantize_x launch).
#define KILN_MOE8_SELF(QN, Q)                                                                       \
    extern "C" __global__ void moe8_down_self_##QN##_bf16(const bf16* act, const u8* wd,           \
                                                         const int* sorted, const int* tile_expert, \
                                                         int f, int h, int n_rows, int lanes,       \
                                                         bf16* y) {                                 \
        moe8_tile_impl<Q, false, MOE8_DOWN_C, MOE8_DOWN_U, 1, true>(nullptr, 0, wd, nullptr, sorted, \
                                                                    tile_expert, 1, f, h, n_rows,   \
                                                                    lanes, y, act);                 \
    }
// One real slot a tile (one row: decode batch 1), groups of 4 (up to two passes) or 8.
#define KILN_MOE8(QN, Q) KILN_MOE8_S(QN, Q, 1) KILN_MOE8_S(QN, Q, 4) KILN_MOE8_S(QN, Q, 8) KILN_MOE8_SELF(QN, Q)
KILN_IN_PART(q80, KILN_MOE8(q80, Q8_0))
KILN_IN_PART(q40, KILN_MOE8(q40, Q4_0))
KILN_IN_PART(q4k, KILN_MOE8(q4k, Q4_K))
KILN_IN_PART(q5k, KILN_MOE8(q5k, Q5_K))
KILN_IN_PART(q6k, KILN_MOE8(q6k, Q6_K))
KILN_IN_PART(mxfp4, KILN_MOE8(mxfp4, MXFP4))
#endif

#if !defined(KILN_DTYPE_F32)
// ---- Many rows per expert (bf16 compute only): tensor cores ------------------------------
// qmma.cuh's tile over MOEMMA_BM slots of one expert: a block starts at each MOEMMA_BM-th
// slot of an expert's run (estart[e] on; blocks of the tiles between leave at once) and takes
// QMMA_BN output columns; slots past the run or without an assignment are zero rows.
//   moemma_gate_up_<q>: act[p] = silu(Wg_e x_t) * (Wu_e x_t)   (gate, then up over the
//                        same slots and columns: each thread's outputs come in one order)
//   moemma_down_<q>:    y[p] = Wd_e act[p]
// Expert e's rows are rows e * rows.. of the stacked matrix; rows past the expert (in the
// last column block) decode the next expert's and are not stored.

constexpr int MOEMMA_BM = 64;
// Outputs per thread of one qmma_tile call.
constexpr int MOEMMA_NS = MOEMMA_BM * QMMA_BN / QMMA_THREADS;

template <typename Q>
__device__ __forceinline__ void moemma_gate_up_impl(const bf16* __restrict__ x, const u8* __restrict__ wg,
                                                    const u8* __restrict__ wu, const int* __restrict__ sorted,
                                                    const int* __restrict__ tile_expert,
                                                    const int* __restrict__ estart, int k, int h, int f,
                                                    int n_rows, bf16* __restrict__ act, const bf16* __restrict__ bg,
                                                    const bf16* __restrict__ bu, float alpha, float limit) {
    const int e = tile_expert[blockIdx.x];
    if (e < 0) return;
    const int p0 = blockIdx.x * MOE_TILE, first = estart[e], end = estart[e + 1];
    if ((p0 - first) % MOEMMA_BM != 0) return;  // the whole block leaves, before any sync
    auto xrow = [&](int s) {
        const int p = p0 + s;
        const int a = p < end ? sorted[p] : -1;
        return a < 0 ? -1 : a / k;
    };
    const int c0 = blockIdx.y * QMMA_BN;
    float gv[MOEMMA_NS];
    int i = 0;
    bool up = false;
    // One store type for both calls: one instance of qmma_tile and of its shared memory.
    auto store = [&](int s, int j, float v) {
        if (!up) {
            gv[i++] = v;
            return;
        }
        const float g = gv[i++];
        const int col = j - e * f, p = p0 + s;
        if (col < f && p < end && sorted[p] >= 0)
            act[(size_t)p * f + col] = from_f<bf16>(moe_act<bf16>(g, v, bg, bu, (size_t)j, alpha, limit));
    };
    qmma_tile<Q, MOEMMA_BM>(wg, n_rows, h, e * f + c0, x, h, xrow, 0, qmma_ktiles(h), store);
    i = 0;
    up = true;
    qmma_tile<Q, MOEMMA_BM>(wu, n_rows, h, e * f + c0, x, h, xrow, 0, qmma_ktiles(h), store);
}

template <typename Q>
__device__ __forceinline__ void moemma_down_impl(const bf16* __restrict__ act, const u8* __restrict__ wd,
                                                 const int* __restrict__ sorted, const int* __restrict__ tile_expert,
                                                 const int* __restrict__ estart, int f, int h, int n_rows,
                                                 bf16* __restrict__ y) {
    const int e = tile_expert[blockIdx.x];
    if (e < 0) return;
    const int p0 = blockIdx.x * MOE_TILE, first = estart[e], end = estart[e + 1];
    if ((p0 - first) % MOEMMA_BM != 0) return;
    auto xrow = [&](int s) {
        const int p = p0 + s;
        return p < end && sorted[p] >= 0 ? p : -1;
    };
    qmma_tile<Q, MOEMMA_BM>(wd, n_rows, f, e * h + blockIdx.y * QMMA_BN, act, f, xrow, 0, qmma_ktiles(f),
                            [&](int s, int j, float v) {
                                const int col = j - e * h, p = p0 + s;
                                if (col < h && p < end && sorted[p] >= 0) y[(size_t)p * h + col] = from_f<bf16>(v);
                            });
}

#define KILN_MOEMMA(QN, Q)                                                                          \
    extern "C" __global__ void __launch_bounds__(QMMA_THREADS)                                      \
        moemma_gate_up_##QN##_bf16(const bf16* x, const u8* wg, const u8* wu, const int* sorted,    \
                                   const int* tile_expert, const int* estart, int k, int h, int f,  \
                                   int n_rows, bf16* act, const bf16* bg, const bf16* bu,           \
                                   float alpha, float limit) {                                      \
        moemma_gate_up_impl<Q>(x, wg, wu, sorted, tile_expert, estart, k, h, f, n_rows, act, bg, bu, \
                               alpha, limit);                                                       \
    }                                                                                               \
    extern "C" __global__ void __launch_bounds__(QMMA_THREADS)                                      \
        moemma_down_##QN##_bf16(const bf16* act, const u8* wd, const int* sorted,                   \
                                const int* tile_expert, const int* estart, int f, int h,            \
                                int n_rows, bf16* y) {                                              \
        moemma_down_impl<Q>(act, wd, sorted, tile_expert, estart, f, h, n_rows, y);                 \
    }
KILN_IN_PART(q80, KILN_MOEMMA(q80, Q8_0))
KILN_IN_PART(q40, KILN_MOEMMA(q40, Q4_0))
KILN_IN_PART(q4k, KILN_MOEMMA(q4k, Q4_K))
KILN_IN_PART(q5k, KILN_MOEMMA(q5k, Q5_K))
KILN_IN_PART(q6k, KILN_MOEMMA(q6k, Q6_K))
KILN_IN_PART(mxfp4, KILN_MOEMMA(mxfp4, MXFP4))
#endif
