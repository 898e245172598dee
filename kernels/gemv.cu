// Skinny matmul for decode steps of one or two rows:
//   gemv:          y[m, j] = sum_k x[m, k] * w[j, k] (+ bias[j])     x [M, k], w [n, k], y [M, n]
//   gemv_silu_mul: y[m, j] = silu(g) * u with g, u the products with rows j and f + j of
//                  w [2f, k] (gate rows over up rows), y [M, f]: the FFN's gate/up matmul and
//                  activation in one pass, the [M, 2f] product never stored.
// f32 accumulation. The weight is read once and dominates the traffic, so the kernel is a
// stream over it: each warp owns R weight rows, every lane reads 16-byte chunks of them with U
// chunks per row in flight, and all M rows of x (re-read from L1/L2 by every warp) reuse each
// chunk. Lane sums are reduced with shuffles; no shared memory, no block barrier. Requires k
// to be a multiple of the chunk (8 bf16 / 4 f32 elements) and 16-byte aligned x and w (the
// host checks both and otherwise uses the BLAS).

constexpr int GEMV_WARPS = 4;  // warps per block; the host sizes the grid with it

// A weight chunk, read once: past L1 on NVIDIA (the data is never reused by this SM).
template <typename Raw>
__device__ __forceinline__ Raw load_once(const Raw* p) {
#if defined(KILN_CUDA)
    u32 a, b, c, d;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(a), "=r"(b), "=r"(c), "=r"(d)
        : "l"(p));
    Raw r;
    u32* o = reinterpret_cast<u32*>(&r);
    o[0] = a;
    o[1] = b;
    o[2] = c;
    o[3] = d;
    return r;
#else
    return *p;
#endif
}

// The warp's rows are j0 + r * rs (r < R); GLU pairs row j with row j + f (R = 2, rs = f).
template <typename T, int M, int R, int U, bool GLU>
__device__ __forceinline__ void gemv_impl(const T* __restrict__ x, const T* __restrict__ w,
                                          const T* __restrict__ bias, T* __restrict__ y, int k, int n) {
    static_assert(!GLU || R == 2, "gemv_silu_mul pairs two rows");
    typedef Chunk<T> C;
    typedef typename C::Raw Raw;
    constexpr int E = C::E;
    KILN_PDL_TRIGGER();
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int wid = blockIdx.x * (blockDim.x / WARP) + warp;
    // n counts output columns: weight rows, or pairs of them for GLU.
    const int j0 = GLU ? wid : wid * R, rs = GLU ? n : 1;
    if (j0 >= n) return;  // whole warps leave (others of the grid wait); no block barrier
    const int nch = k / E;
    const Raw* wr[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int j = GLU ? j0 + r * rs : min(j0 + r, n - 1);
        wr[r] = reinterpret_cast<const Raw*>(w + (size_t)j * k);
    }
    const Raw* xr = reinterpret_cast<const Raw*>(x);
    float acc[M][R];
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
        for (int r = 0; r < R; ++r) acc[m][r] = 0.f;

    int c = lane;
    // Main loop: U chunks of each of the R rows in flight per lane. The weights are no earlier
    // kernel's output: the first U chunks load before KILN_PDL_WAIT, while the kernel before
    // drains; x only after it.
    Raw wv[U][R];
    auto load = [&](int c0) {
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int r = 0; r < R; ++r) wv[u][r] = load_once(wr[r] + c0 + u * WARP);
    };
    if (c + (U - 1) * WARP < nch) load(c);
    KILN_PDL_WAIT();
    for (; c + (U - 1) * WARP < nch; c += U * WARP) {
        if (c != lane) load(c);
#pragma unroll
        for (int u = 0; u < U; ++u) {
            float wf[R][E];
#pragma unroll
            for (int r = 0; r < R; ++r) C::unpack(wv[u][r], wf[r]);
#pragma unroll
            for (int m = 0; m < M; ++m) {
                float xf[E];
                C::unpack(xr[(size_t)m * nch + c + u * WARP], xf);
#pragma unroll
                for (int r = 0; r < R; ++r)
#pragma unroll
                    for (int e = 0; e < E; ++e) acc[m][r] += xf[e] * wf[r][e];
            }
        }
    }
    // Tail: one chunk at a time.
    for (; c < nch; c += WARP) {
        float wf[R][E];
#pragma unroll
        for (int r = 0; r < R; ++r) C::unpack(load_once(wr[r] + c), wf[r]);
#pragma unroll
        for (int m = 0; m < M; ++m) {
            float xf[E];
            C::unpack(xr[(size_t)m * nch + c], xf);
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
                for (int e = 0; e < E; ++e) acc[m][r] += xf[e] * wf[r][e];
        }
    }
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
        for (int r = 0; r < R; ++r) acc[m][r] = warp_sum(acc[m][r]);
    if (lane != 0) return;
    if (GLU) {
#pragma unroll
        for (int m = 0; m < M; ++m) {
            const float g = acc[m][0];
            y[(size_t)m * n + j0] = from_f<T>(g / (1.0f + expf(-g)) * acc[m][R - 1]);
        }
        return;
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
        if (j0 + r < n) {
            const float b = bias ? to_f(bias[j0 + r]) : 0.f;
#pragma unroll
            for (int m = 0; m < M; ++m) y[(size_t)m * n + j0 + r] = from_f<T>(acc[m][r] + b);
        }
    }
}

// (rows per warp, chunks in flight) per row count, picked on the GPU with
// scripts/gemv_bench.cu; two rows of x pair weight rows for the shared x loads. GEMV_ROWS in
// src/backend/gpu/mod.rs mirrors the rows per warp. More rows of x: the BLAS is faster.
#define KILN_GEMV_M(N, T, M, R, U)                                                                  \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * WARP)                                 \
        gemv_##N##_m##M(const T* x, const T* w, const T* bias, T* y, int k, int n) {                \
        gemv_impl<T, M, R, U, false>(x, w, bias, y, k, n);                                          \
    }                                                                                               \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * WARP)                                 \
        gemv_silu_mul_##N##_m##M(const T* x, const T* w, T* y, int k, int f) {                      \
        gemv_impl<T, M, 2, 4, true>(x, w, nullptr, y, k, f);                                        \
    }
#define KILN_GEMV(N, T) KILN_GEMV_M(N, T, 1, 1, 8) KILN_GEMV_M(N, T, 2, 2, 4)
KILN_FOR_DTYPES(KILN_GEMV)
