// Quantized weights (GGUF Q8_0, Q4_0, Q4_K, Q5_K, Q6_K) kept quantized on the device:
//   qgemv:       y[m, j] = sum_k x[m, k] * W[j, k] (+ bias[j])   for 1..8 rows of x
//   qgemv_silu:  y[m, j] = silu(G[j] . x[m]) * (U[j] . x[m])      gate G and up U, f rows each
//   dequant:     out[i] = W[ids ? ids[i] : i] as the compute type  (embedding rows; the
//                weight of a batch step, dequantized into a scratch for the BLAS GEMM)
//   convert:     f16 / bf16 elements to the compute type (dense F16/BF16 weights)
//
// (Block types and their device layout: quant.cuh, prepended to this file.) Each lane decodes
// units in registers, products accumulate in f32, lane sums are reduced with shuffles: one
// warp per R weight rows, no shared memory.

constexpr int QGEMV_WARPS = 4;     // warps per block of qgemv; the host sizes the grid with it
constexpr int DEQUANT_THREADS = 128;

// 16 elements of x row `xr` at `off`, as floats.
template <typename T>
__device__ __forceinline__ void load_x16(const T* __restrict__ xr, int off, float* xf) {
    typedef Chunk<T> C;
    const typename C::Raw* p = reinterpret_cast<const typename C::Raw*>(xr + off);
#pragma unroll
    for (int c = 0; c < 16 / C::E; ++c) C::unpack(p[c], xf + c * C::E);
}

// One warp per R weight rows (plain: rows j0..j0+R of w; GLU: row j0 of the gate w and of the
// up w2), M rows of x of which `rows` are real (the others reread row rows-1, never stored).
template <typename Q, typename T, int M, int R, int U, bool GLU>
__device__ __forceinline__ void qgemv_impl(const u8* __restrict__ w, const u8* __restrict__ w2,
                                           const T* __restrict__ x, const T* __restrict__ bias,
                                           T* __restrict__ y, int k, int n, int rows, int ldy) {
    static_assert(!GLU || R == 2, "qgemv_silu pairs a gate row and an up row");
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int wid = blockIdx.x * (blockDim.x / WARP) + warp;
    const int j0 = GLU ? wid : wid * R;
    if (j0 >= n) return;  // whole warps leave; nothing below synchronizes the block
    typename Q::Row wr[R];
#pragma unroll
    for (int r = 0; r < R; ++r)
        wr[r] = GLU ? Q::row(r == 0 ? w : w2, n, k, j0) : Q::row(w, n, k, min(j0 + r, n - 1));
    const T* xr[M];
#pragma unroll
    for (int m = 0; m < M; ++m) xr[m] = x + (size_t)min(m, rows - 1) * k;
    float acc[M][R];
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
        for (int r = 0; r < R; ++r) acc[m][r] = 0.f;

    const int nu = k / Q::UNIT;
    for (int u0 = lane; u0 < nu; u0 += U * WARP) {
        typename Q::Raw raw[U][R];
#pragma unroll
        for (int t = 0; t < U; ++t)
            if (u0 + t * WARP < nu)
#pragma unroll
                for (int r = 0; r < R; ++r) raw[t][r] = Q::load(wr[r], u0 + t * WARP);
#pragma unroll
        for (int t = 0; t < U; ++t) {
            const int u = u0 + t * WARP;
#pragma unroll
            for (int run = 0; run < Q::RUNS; ++run) {
                if (u >= nu) continue;
                float qv[R][16], sc[R], ad[R];
#pragma unroll
                for (int r = 0; r < R; ++r) Q::run(raw[t][r], lane, run, qv[r], sc[r], ad[r]);
                const int off = Q::xoff(u, run);
#pragma unroll
                for (int m = 0; m < M; ++m) {
                    float xf[16];
                    load_x16<T>(xr[m], off, xf);
                    float sx = 0.f;
                    if (Q::MIN) {
#pragma unroll
                        for (int e = 0; e < 16; ++e) sx += xf[e];
                    }
#pragma unroll
                    for (int r = 0; r < R; ++r) {
                        float d0 = 0.f, d1 = 0.f;
#pragma unroll
                        for (int e = 0; e < 16; e += 2) {
                            d0 = fmaf(xf[e], qv[r][e], d0);
                            d1 = fmaf(xf[e + 1], qv[r][e + 1], d1);
                        }
                        acc[m][r] = fmaf(sc[r], d0 + d1, acc[m][r]);
                        if (Q::MIN) acc[m][r] = fmaf(ad[r], sx, acc[m][r]);
                    }
                }
            }
        }
    }
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
        for (int r = 0; r < R; ++r) acc[m][r] = warp_sum(acc[m][r]);
    if (lane != 0) return;
#pragma unroll
    for (int m = 0; m < M; ++m) {
        if (m >= rows) continue;
        if (GLU) {
            const float g = acc[m][0];
            y[(size_t)m * ldy + j0] = from_f<T>(g / (1.0f + expf(-g)) * acc[m][R - 1]);
        } else {
#pragma unroll
            for (int r = 0; r < R; ++r)
                if (j0 + r < n)
                    y[(size_t)m * ldy + j0 + r] =
                        from_f<T>(acc[m][r] + (bias ? to_f(bias[j0 + r]) : 0.f));
        }
    }
}

// Rows ids[i] (or i) of w into rows i of out (row stride ldo); one block per row.
template <typename Q, typename T>
__device__ __forceinline__ void dequant_impl(const u8* __restrict__ w, const u32* __restrict__ ids,
                                             T* __restrict__ out, int k, int n, int ldo) {
    typedef Chunk<T> C;
    const int j = ids ? (int)ids[blockIdx.x] : (int)blockIdx.x;
    const typename Q::Row wr = Q::row(w, n, k, j);
    T* o = out + (size_t)blockIdx.x * ldo;
    for (int u = threadIdx.x; u < k / Q::UNIT; u += blockDim.x) {
        const typename Q::Raw raw = Q::load(wr, u);
#pragma unroll
        for (int run = 0; run < Q::RUNS; ++run) {
            float wf[16], sc, ad;
            Q::run(raw, threadIdx.x, run, wf, sc, ad);
#pragma unroll
            for (int e = 0; e < 16; ++e) wf[e] = fmaf(sc, wf[e], ad);
            typename C::Raw* p = reinterpret_cast<typename C::Raw*>(o + Q::xoff(u, run));
#pragma unroll
            for (int c = 0; c < 16 / C::E; ++c) p[c] = C::pack(wf + c * C::E);
        }
    }
}

// f16 (F = 0) or bf16 (F = 1) elements to the compute type, grid-stride.
template <int F, typename T>
__device__ __forceinline__ void convert_impl(const u16* __restrict__ src, T* __restrict__ dst, size_t total) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const u32 h = src[i];
        dst[i] = from_f<T>(F == 0 ? half_to_f(h) : __uint_as_float(h << 16));
    }
}

// (rows per warp, units in flight) per row count of x.
#define KILN_QGEMV_M(QN, Q, N, T, M, R, U)                                                          \
    extern "C" __global__ void __launch_bounds__(QGEMV_WARPS * WARP)                                \
        qgemv_##QN##_##N##_m##M(const u8* w, const T* x, const T* bias, T* y, int k, int n,         \
                                int rows, int ldy) {                                                \
        qgemv_impl<Q, T, M, R, U, false>(w, nullptr, x, bias, y, k, n, rows, ldy);                  \
    }                                                                                               \
    extern "C" __global__ void __launch_bounds__(QGEMV_WARPS * WARP)                                \
        qgemv_silu_##QN##_##N##_m##M(const u8* wg, const u8* wu, const T* x, T* y, int k, int f,    \
                                     int rows, int ldy) {                                           \
        qgemv_impl<Q, T, M, 2, U, true>(wg, wu, x, nullptr, y, k, f, rows, ldy);                    \
    }
#define KILN_QGEMV_T(QN, Q, N, T)                                                                   \
    KILN_QGEMV_M(QN, Q, N, T, 1, 2, 2)                                                              \
    KILN_QGEMV_M(QN, Q, N, T, 2, 2, 2)                                                              \
    KILN_QGEMV_M(QN, Q, N, T, 4, 2, 1)                                                              \
    KILN_QGEMV_M(QN, Q, N, T, 8, 2, 1)                                                              \
    extern "C" __global__ void __launch_bounds__(DEQUANT_THREADS)                                   \
        dequant_##QN##_##N(const u8* w, const u32* ids, T* out, int k, int n, int ldo) {            \
        dequant_impl<Q, T>(w, ids, out, k, n, ldo);                                                 \
    }
#define KILN_QGEMV(N, T)                                                                            \
    KILN_QGEMV_T(q80, Q8_0, N, T)                                                                  \
    KILN_QGEMV_T(q40, Q4_0, N, T)                                                                  \
    KILN_QGEMV_T(q4k, Q4_K, N, T)                                                                  \
    KILN_QGEMV_T(q5k, Q5_K, N, T)                                                                  \
    KILN_QGEMV_T(q6k, Q6_K, N, T)                                                                  \
    extern "C" __global__ void convert_f16_##N(const u16* src, T* dst, u64 total) {                 \
        convert_impl<0, T>(src, dst, total);                                                        \
    }                                                                                               \
    extern "C" __global__ void convert_bf16_##N(const u16* src, T* dst, u64 total) {                \
        convert_impl<1, T>(src, dst, total);                                                        \
    }
KILN_FOR_DTYPES(KILN_QGEMV)
