// Quantized weights (GGUF Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, MXFP4) kept quantized on the device:
//   qgemv:       y[m, j] = sum_k x[m, k] * W[j, k] (+ bias[j])   for 1..8 rows of x
//   qgemv_silu:  y[m, j] = silu(G[j] . x[m]) * (U[j] . x[m])      gate G and up U, f rows each
//   dequant:     out[i] = W[ids ? ids[i] - first : i] as the compute type (embedding rows,
//                zero for an id outside the part's rows: a vocabulary shard; the weight
//                of a batch step, dequantized into a scratch for the BLAS GEMM)
//   convert:     f16 / bf16 elements to the compute type (dense F16/BF16 weights)
//   (bf16 only, the decode path there:)
//   quantize_x:  x[rows, k] to 8-bit blocks of 32 (scale amax/127, and the block's sum)
//   qdot:        y[m, j] = sum_k x[m, k] * W[j, k] (+ bias[j]) on those 8-bit activations by
//                dp4a, for up to three parts of a stacked weight (of one type) in one
//                launch; qdot_silu: the fused gate/up SiLU of qgemv_silu the same way
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
    KILN_PDL_TRIGGER();
    KILN_PDL_WAIT();
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

// Rows ids[i] - first (or i) of w into rows i of out (row stride ldo); one block per row.
// An id outside first..first + n gives a zero row.
template <typename Q, typename T>
__device__ __forceinline__ void dequant_impl(const u8* __restrict__ w, const u32* __restrict__ ids,
                                             T* __restrict__ out, int k, int n, int ldo, int first) {
    typedef Chunk<T> C;
    const long long j = ids ? (long long)ids[blockIdx.x] - first : (long long)blockIdx.x;
    T* o = out + (size_t)blockIdx.x * ldo;
    if (j < 0 || j >= n) {
        for (int i = threadIdx.x; i < k; i += blockDim.x) o[i] = from_f<T>(0.f);
        return;
    }
    const typename Q::Row wr = Q::row(w, n, k, (int)j);
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
    KILN_QGEMV_M(QN, Q, N, T, 8, 2, 1)
#define KILN_DEQUANT_T(QN, Q, N, T)                                                                 \
    extern "C" __global__ void __launch_bounds__(DEQUANT_THREADS)                                   \
        dequant_##QN##_##N(const u8* w, const u32* ids, T* out, int k, int n, int ldo, int first) { \
        dequant_impl<Q, T>(w, ids, out, k, n, ldo, first);                                          \
    }
// The streaming matmuls on float activations are parts of their own (s<type>): bf16 decode
// runs the 8-bit `qdot_*` kernels below, so a bf16 start-up does not wait for these.
#define KILN_QGEMV(N, T)                                                                            \
    KILN_IN_PART(sq80, KILN_QGEMV_T(q80, Q8_0, N, T))                                              \
    KILN_IN_PART(sq40, KILN_QGEMV_T(q40, Q4_0, N, T))                                              \
    KILN_IN_PART(sq4k, KILN_QGEMV_T(q4k, Q4_K, N, T))                                              \
    KILN_IN_PART(sq5k, KILN_QGEMV_T(q5k, Q5_K, N, T))                                              \
    KILN_IN_PART(sq6k, KILN_QGEMV_T(q6k, Q6_K, N, T))                                              \
    KILN_IN_PART(smxfp4, KILN_QGEMV_T(mxfp4, MXFP4, N, T))                                         \
    KILN_IN_PART(q80, KILN_DEQUANT_T(q80, Q8_0, N, T))                                             \
    KILN_IN_PART(q40, KILN_DEQUANT_T(q40, Q4_0, N, T))                                             \
    KILN_IN_PART(q4k, KILN_DEQUANT_T(q4k, Q4_K, N, T))                                             \
    KILN_IN_PART(q5k, KILN_DEQUANT_T(q5k, Q5_K, N, T))                                             \
    KILN_IN_PART(q6k, KILN_DEQUANT_T(q6k, Q6_K, N, T))                                             \
    KILN_IN_PART(mxfp4, KILN_DEQUANT_T(mxfp4, MXFP4, N, T))                                        \
    KILN_IN_PART(common,                                                                            \
        extern "C" __global__ void convert_f16_##N(const u16* src, T* dst, u64 total) {             \
            convert_impl<0, T>(src, dst, total);                                                    \
        }                                                                                           \
        extern "C" __global__ void convert_bf16_##N(const u16* src, T* dst, u64 total) {            \
            convert_impl<1, T>(src, dst, total);                                                    \
        })
KILN_FOR_DTYPES(KILN_QGEMV)

#if !defined(KILN_DTYPE_F32)
// ---- 8-bit activations (bf16 compute only): llama.cpp's MMVQ idea ----------------------
// The activations of a decode step are quantized once per matmul input into a scratch
// `xq`: i8 qs[rows][k] at 0, then float2 ds[rows][k / 32] (d = amax / 127, s = the exact
// sum of the 32 values) at plane_align(rows * k). The RMSNorm before a matmul writes it as
// it goes (norm.cu), and so does decode attention's split-K merge (attention_decode.cu);
// `quantize_x` makes it for the other inputs (the SiLU output, an unmerged attention
// output). Each weight run of 16 becomes 4 words of signed 8-bit quants (run8 in quant.cuh),
// multiplied with 4 words of qs by dp4a; the run adds sc * d * sumi (+ mn * s once per block
// for the k-quants' min and centering).

constexpr int QX_THREADS = 256;

// Grid ceil(rows * k / 32 / QX_THREADS); each thread quantizes one block of 32 values.
#if KILN_HAS_PART(common)
extern "C" __global__ void __launch_bounds__(QX_THREADS)
    quantize_x_bf16(const bf16* __restrict__ x, u8* __restrict__ xq, int k, int rows) {
    KILN_PDL_TRIGGER();
    KILN_PDL_WAIT();
    const size_t c = (size_t)blockIdx.x * QX_THREADS + threadIdx.x;  // block of 32
    if (c >= (size_t)rows * k / 32) return;
    reinterpret_cast<QxScale*>(xq + plane_align((size_t)rows * k))[c] = qx32_bf16(x + 32 * c, xq + 32 * c);
}
#endif

// Accumulates acc[m][r] += x row m . weight row r (rows wr[r], each of k columns) for M rows
// of x (those past `rows` reread row rows - 1), from the 8-bit activations at xq; it executes
// the caller's KILN_PDL_WAIT, after its first weight loads and before reading xq. Each lane
// takes U units of each row per step; at 1 and 2 rows the next step's units are fetched
// before this step's products (loads stay in flight through the arithmetic). Every step but a
// last partial one runs without bounds checks. A lane's units are lane + WARP * i, whose x
// offsets are the lane's xoff(lane, run) + WARP * UNIT * i (every type's xoff is linear in
// whole warps of units), so x is addressed from per-lane constants. `post` runs right after
// the wait (work on earlier kernels' outputs whose loads then overlap the first weights').
struct NoPost {
    __device__ __forceinline__ void operator()() const {}
};
template <typename Q, int M, int R, int U, bool PP, typename Post = NoPost>
__device__ __forceinline__ void qdot_acc(const typename Q::Row (&wr)[R], const u8* __restrict__ xq, int k,
                                         int rows, int lane, float (&acc)[M][R], Post post = Post()) {
    constexpr bool AHEAD = M <= 2;
    constexpr int STEP = U * WARP;
    const QxScale* ds = reinterpret_cast<const QxScale*>(xq + plane_align((size_t)rows * k));
    const int nu = k / Q::UNIT;
    typename Q::Raw raw[U][R], next[U][R];
    auto fetch = [&](typename Q::Raw (&dst)[U][R], int u0) {
#pragma unroll
        for (int t = 0; t < U; ++t)
            if (u0 + t * WARP < nu)
#pragma unroll
                for (int r = 0; r < R; ++r) dst[t][r] = Q::load(wr[r], u0 + t * WARP);
    };
    // The weights are no earlier kernel's output: the first units load before KILN_PDL_WAIT,
    // while the kernel before drains (the callers have not waited); x only after it.
    fetch(raw, lane);
    KILN_PDL_WAIT();
    post();
    const u8* xm[M];
    const QxScale* dm[M];
#pragma unroll
    for (int m = 0; m < M; ++m) {
        const int mr = M == 1 ? 0 : min(m, rows - 1);
        xm[m] = xq + (size_t)mr * k + (u32)Q::xoff(lane, 0);
        dm[m] = ds + (size_t)mr * (k / 32) + (u32)Q::xoff(lane, 0) / 32u;
    }
    // The U units of the step at lane + s0 (s0 a multiple of STEP) from rw; with `guard`,
    // those past nu are skipped. Run offsets from run 0's stay within run 0's block of 32 (or
    // are whole blocks), so the scales' index is the sum of both parts' block indices.
    auto products = [&](const typename Q::Raw (&rw)[U][R], int s0, bool guard) {
#pragma unroll
        for (int t = 0; t < U; ++t) {
            const int ub = s0 + t * WARP;
            if (guard && lane + ub >= nu) continue;
            u32 wq[R][Q::RUNS][4];
            float sc[R][Q::RUNS], mn[R][Q::RUNS];
#pragma unroll
            for (int r = 0; r < R; ++r) Q::unit8(rw[t][r], lane, wq[r], sc[r], mn[r]);
#pragma unroll
            for (int run = 0; run < Q::RUNS; ++run) {
                const u32 xr = (u32)(Q::xoff(lane, run) - Q::xoff(lane, 0));
                const u32 off = (u32)ub * Q::UNIT + xr;
                const u32 blk = (u32)ub * Q::UNIT / 32u + xr / 32u;
#pragma unroll
                for (int m = 0; m < M; ++m) {
                    const vec4u xv = *reinterpret_cast<const vec4u*>(xm[m] + off);
                    const QxScale dx = dm[m][blk];
                    int base = 0;
                    if (Q::CENTRED) {
                        base = dp4a(Q::cw(run), xv.x, 0);
                        base = dp4a(Q::cw(run), xv.y, base);
                        base = dp4a(Q::cw(run), xv.z, base);
                        base = dp4a(Q::cw(run), xv.w, base);
                    }
#pragma unroll
                    for (int r = 0; r < R; ++r) {
                        int si;
                        if (Q::CENTRED) {
                            si = dp4a_us(wq[r][run][0], xv.x, base);
                            si = dp4a_us(wq[r][run][1], xv.y, si);
                            si = dp4a_us(wq[r][run][2], xv.z, si);
                            si = dp4a_us(wq[r][run][3], xv.w, si);
                        } else {
                            si = dp4a(wq[r][run][0], xv.x, 0);
                            si = dp4a(wq[r][run][1], xv.y, si);
                            si = dp4a(wq[r][run][2], xv.z, si);
                            si = dp4a(wq[r][run][3], xv.w, si);
                        }
                        acc[m][r] = fmaf(sc[r][run] * dx.d, (float)si, acc[m][r]);
                        if (Q::XSUM && Q::xsum_run(run)) acc[m][r] = fmaf(mn[r][run], dx.s, acc[m][r]);
                    }
                }
            }
        }
    };
    const int full = nu / STEP;  // steps whose units are all below nu, for every lane
    if (AHEAD && PP) {
        // Two steps a trip (raw, then next), so the fetched units never move between arrays.
        int s = 0;
        for (; s + 2 <= full; s += 2) {
            fetch(next, lane + (s + 1) * STEP);
            products(raw, s * STEP, false);
            fetch(raw, lane + (s + 2) * STEP);
            products(next, (s + 1) * STEP, false);
        }
        if (s < full) {
            fetch(next, lane + (s + 1) * STEP);
            products(raw, s * STEP, false);
            if ((s + 1) * STEP < nu) products(next, (s + 1) * STEP, true);
        } else if (s * STEP < nu) {
            products(raw, s * STEP, true);
        }
    } else {
        for (int s = 0; s < full; ++s) {
            if (AHEAD)
                fetch(next, lane + (s + 1) * STEP);
            else if (s != 0)
                fetch(raw, lane + s * STEP);
            products(raw, s * STEP, false);
            if (AHEAD)
#pragma unroll
                for (int t = 0; t < U; ++t)
#pragma unroll
                    for (int r = 0; r < R; ++r) raw[t][r] = next[t][r];
        }
        if (full * STEP < nu) {
            if (!AHEAD && full != 0) fetch(raw, lane + full * STEP);
            products(raw, full * STEP, true);
        }
    }
}

// Rows j0..j0+R of a part of n rows of type Q.
template <typename Q, int M, int R, int U, bool PP, typename Post = NoPost>
__device__ __forceinline__ void qdot_rows(const u8* w, int n, int j0, const u8* xq, int k, int rows, int lane,
                                          float (&acc)[M][R], Post post = Post()) {
    typename Q::Row wr[R];
#pragma unroll
    for (int r = 0; r < R; ++r) wr[r] = Q::row(w, n, k, min(j0 + r, n - 1));
    qdot_acc<Q, M, R, U, PP>(wr, xq, k, rows, lane, acc, post);
}

template <typename A, typename B>
struct SameType {
    static constexpr bool value = false;
};
template <typename A>
struct SameType<A, A> {
    static constexpr bool value = true;
};

// One warp per R rows of one part: part p (of r0, r1, r2 rows, weights w0, w1, w2; parts 0
// and 1 of type QA, part 2 of type QB) takes ceil(rp / R) warps, in part order (part 2 first
// when QB is another type); its rows land
// at columns r0 (+ r1) + j of y (row stride ldy) with bias at the same index. One type per
// launch (QA = QB) keeps the registers of that type alone, so more warps stay resident; two
// (a Q4_K_M qkv: Q4_K q and k, Q6_K v) save a launch.
// A qkv launch's rope and cache write (rope_kv in rope.cu, interleaved pairs), done by the
// launch itself when inv_freq is non-null: the rotation of each q and k pair (2i, 2i + 1),
// which are the two weight rows of one warp, and the k and v pairs copied to each row's cache
// slot (0xffffffff: a padding row, nothing written). cbase: the qkv column of the launch's
// first output column (y, bias); q_dim, kv_dim: the q and the k (= v) columns.
struct QkvRope {
    const u32* positions;
    const float* inv_freq;
    const u32* slots;
    bf16* k_cache;
    bf16* v_cache;
    int cbase, q_dim, kv_dim, head_dim, rot_dim;
    float mscale;
};

// Row m's output pair at columns j, j + 1 of y (values a0, a1 before the bias), roped and
// written to the cache as QkvRope says; the same values (each rounded to bf16 first) as the
// matmul's store and then rope_kv.
__device__ __forceinline__ void qkv_rope_store(const QkvRope& ro, float a0, float a1, const bf16* __restrict__ bias,
                                               bf16* __restrict__ y, int j, int m) {
    float v0 = to_f(from_f<bf16>(a0 + (bias ? to_f(bias[j]) : 0.f)));
    float v1 = to_f(from_f<bf16>(a1 + (bias ? to_f(bias[j + 1]) : 0.f)));
    const int c = ro.cbase + j, qk = ro.q_dim + ro.kv_dim, d = c % ro.head_dim;
    if (c < qk && d < ro.rot_dim) {
        float cf, sf;
        rope_angle((double)ro.positions[m], ro.inv_freq, d / 2, ro.mscale, cf, sf);
        const float x0 = v0, x1 = v1;
        v0 = to_f(from_f<bf16>(x0 * cf - x1 * sf));
        v1 = to_f(from_f<bf16>(x0 * sf + x1 * cf));
    }
    y[j] = from_f<bf16>(v0);
    y[j + 1] = from_f<bf16>(v1);
    if (c < ro.q_dim) return;
    const u32 slot = ro.slots[m];
    if (slot == 0xffffffffu) return;
    bf16* dst = c < qk ? ro.k_cache + (size_t)slot * ro.kv_dim + (c - ro.q_dim)
                       : ro.v_cache + (size_t)slot * ro.kv_dim + (c - qk);
    dst[0] = from_f<bf16>(v0);
    dst[1] = from_f<bf16>(v1);
}

// The residual add and RMSNorm after a one-row decode matmul, split between it and the
// quantized matmul that reads the norm's output (a Llama layer's output projection or down
// matmul, then its gate/up or the next layer's qkv), with no launch of its own:
// - qdot_norm_* (the producer): a block of 16 warps takes 32 output columns (two a warp),
//   adds them into the residual, and quantizes rmsnorm's input times the norm weight, r * w,
//   for those columns as 8-bit rows at oxq (qx_lanes: the factor 1 / rms is left out), with
//   the group's sum of r^2 in oss[row][group].
// - NormIn (the consumers qdot_in_*, qdotmix_in_*, qdot_silu_in_*): each warp sums the row's
//   group partials (a fixed order), scales its dot products by inv = 1 / sqrt(sum / k + eps),
//   and the launch's warps write the norm's output out = w * (r * inv) (rms_norm's rounding)
//   for later readers.
struct NormIn {
    const float* ss;
    const bf16* res;
    const bf16* w;
    bf16* out;
    float eps;
};

// Output columns of a qdot_norm_* block: one group of 8-bit activations.
constexpr int QDOT_NORM_WARPS = 32 / 2;

template <typename Q, int M, int U, bool PP>
__device__ __forceinline__ void qdot_norm_impl(const u8* __restrict__ xq, const u8* __restrict__ w, int k, int h,
                                               int rows, bf16* __restrict__ res, const bf16* __restrict__ nw,
                                               u8* __restrict__ oxq, float* __restrict__ oss) {
    KILN_PDL_TRIGGER();  // KILN_PDL_WAIT: in qdot_acc, after the first weight loads
    __shared__ float sr[M][32];
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int g = blockIdx.x, j0 = 32 * g + 2 * warp;
    float acc[M][2];
#pragma unroll
    for (int m = 0; m < M; ++m) acc[m][0] = acc[m][1] = 0.f;
    qdot_rows<Q, M, 2, U, PP>(w, h, j0, xq, k, rows, lane, acc);
#pragma unroll
    for (int m = 0; m < M; ++m) {
        acc[m][0] = warp_sum(acc[m][0]);
        acc[m][1] = warp_sum(acc[m][1]);
        if (lane == m && m < rows) {
            bf16* rp = res + (size_t)m * h + j0;
            const bf16 r0 = from_f<bf16>(to_f(rp[0]) + to_f(from_f<bf16>(acc[m][0])));
            const bf16 r1 = from_f<bf16>(to_f(rp[1]) + to_f(from_f<bf16>(acc[m][1])));
            rp[0] = r0;
            rp[1] = r1;
            sr[m][2 * warp] = to_f(r0);
            sr[m][2 * warp + 1] = to_f(r1);
        }
    }
    __syncthreads();
    if (warp != 0) return;
    const int gs = h / 32;
    float* ds = reinterpret_cast<float*>(oxq + plane_align((size_t)rows * h));
    const bool valid = lane < 32;
    const int c = 32 * g + (lane & 31);
    const float wc = to_f(nw[c]);
    for (int m = 0; m < rows; ++m) {
        const float r = valid ? sr[m][lane & 31] : 0.f;
        float v = r * wc;
        qx_lanes<1>(&v, valid, lane == 0, oxq + (size_t)m * h + c, ds + 2 * ((size_t)m * gs + g));
        const float sq = warp_sum(r * r);
        if (lane == 0) oss[(size_t)m * gs + g] = sq;
    }
}

// Consumer side (after the wait): each row's 1 / rms over k columns into inv (the caller
// scales its dot products by it); warp `wid` of the launch's `warps` also writes the norm's
// output for the groups of 32 columns wid, wid + warps, ...
template <int M>
__device__ __forceinline__ void norm_in_start(const NormIn& ni, int k, int rows, int wid, int warps, int lane,
                                              float (&inv)[M]) {
    const int gs = k / 32;
#pragma unroll
    for (int m = 0; m < M; ++m) {
        const int mr = min(m, rows - 1);
        float s = 0.f;
        for (int g = lane; g < gs; g += WARP) s += ni.ss[(size_t)mr * gs + g];
        s = warp_sum(s);
        inv[m] = 1.0f / sqrtf(s / (float)k + ni.eps);
        if (m < rows && lane < 32)
            for (int g = wid; g < gs; g += warps) {
                const size_t c = (size_t)m * k + 32 * g + lane;
                ni.out[c] = from_f<bf16>(to_f(ni.w[32 * g + lane]) * (to_f(ni.res[c]) * inv[m]));
            }
    }
}

template <typename QA, typename QB, int M, int R, int UA, int UB, bool PP, bool NI>
__device__ __forceinline__ void qdot_impl(const u8* __restrict__ xq, const u8* __restrict__ w0,
                                          const u8* __restrict__ w1, const u8* __restrict__ w2,
                                          const bf16* __restrict__ bias, bf16* __restrict__ y, int k, int r0,
                                          int r1, int r2, int rows, int ldy, const QkvRope& ro, const NormIn& ni) {
    KILN_PDL_TRIGGER();  // KILN_PDL_WAIT: in qdot_acc, after the first weight loads
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    int wid = blockIdx.x * (blockDim.x / WARP) + warp;
    const int c0 = (r0 + R - 1) / R, c1 = (r1 + R - 1) / R, c2 = (r2 + R - 1) / R;
    const int gw = wid;  // the warp's index before the part order below
    int n, col0;
    const u8* w;
    // Two types: part 2's warps (Q6_K, the slower rows) go first in the grid, so that they
    // do not run in the launch's last partial wave (H100, 8B Q4_K_M decode at batch 1: the
    // qkv launch has 768 blocks for 528 resident; 2.66-2.68 -> 2.63-2.64 ms a step).
    if (!SameType<QA, QB>::value) wid = wid < c2 ? wid + c0 + c1 : wid < c0 + c1 + c2 ? wid - c2 : wid;
    if (wid < c0) {
        n = r0, col0 = 0, w = w0;
    } else if (wid < c0 + c1) {
        n = r1, col0 = r0, w = w1, wid -= c0;
    } else if (wid < c0 + c1 + c2) {
        n = r2, col0 = r0 + r1, w = w2, wid -= c0 + c1;
    } else {
        return;  // whole warps leave; nothing below synchronizes the block
    }
    const int j0 = wid * R;
    float acc[M][R];
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
        for (int r = 0; r < R; ++r) acc[m][r] = 0.f;
    float inv[M];
    const auto post = [&]() {
        if constexpr (NI) norm_in_start<M>(ni, k, rows, gw, c0 + c1 + c2, lane, inv);
    };
    if (!SameType<QA, QB>::value && col0 == r0 + r1)
        qdot_rows<QB, M, R, UB, PP>(w, n, j0, xq, k, rows, lane, acc, post);
    else
        qdot_rows<QA, M, R, UA, PP>(w, n, j0, xq, k, rows, lane, acc, post);
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
        for (int r = 0; r < R; ++r) acc[m][r] = warp_sum(acc[m][r]);
    if constexpr (NI)
#pragma unroll
        for (int m = 0; m < M; ++m)
#pragma unroll
            for (int r = 0; r < R; ++r) acc[m][r] *= inv[m];
    if (ro.inv_freq != nullptr) {
        // Every lane holds the sums: lane m ropes and stores row m (the host passes R = 2 and
        // parts of even rows, so j0 + 1 < n).
        static_assert(R == 2, "qkv rope: one pair per warp");
#pragma unroll
        for (int m = 0; m < M; ++m)
            if (lane == m && m < rows) qkv_rope_store(ro, acc[m][0], acc[m][1], bias, y + (size_t)m * ldy, col0 + j0, m);
        return;
    }
    if (lane != 0) return;
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const int j = col0 + j0 + r;
            if (m < rows && j0 + r < n)
                y[(size_t)m * ldy + j] = from_f<bf16>(acc[m][r] + (bias ? to_f(bias[j]) : 0.f));
        }
}

// One warp per output column j: gate row j of wg and up row j of wu (f rows each, type Q).
template <typename Q, int M, int U, bool PP, bool NI>
__device__ __forceinline__ void qdot_silu_impl(const u8* __restrict__ xq, const u8* __restrict__ wg,
                                               const u8* __restrict__ wu, bf16* __restrict__ y, int k, int f,
                                               int rows, int ldy, const NormIn& ni) {
    KILN_PDL_TRIGGER();  // KILN_PDL_WAIT: in qdot_acc, after the first weight loads
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int j = blockIdx.x * (blockDim.x / WARP) + warp;
    if (j >= f) return;  // whole warps leave (others of the grid wait)
    const typename Q::Row wr[2] = {Q::row(wg, f, k, j), Q::row(wu, f, k, j)};
    float acc[M][2];
#pragma unroll
    for (int m = 0; m < M; ++m) acc[m][0] = acc[m][1] = 0.f;
    float inv[M];
    const auto post = [&]() {
        if constexpr (NI) norm_in_start<M>(ni, k, rows, j, f, lane, inv);
    };
    qdot_acc<Q, M, 2, U, PP>(wr, xq, k, rows, lane, acc, post);
#pragma unroll
    for (int m = 0; m < M; ++m) {
        float g = warp_sum(acc[m][0]), v = warp_sum(acc[m][1]);
        if constexpr (NI) g *= inv[m], v *= inv[m];
        if (lane == 0 && m < rows) y[(size_t)m * ldy + j] = from_f<bf16>(g / (1.0f + expf(-g)) * v);
    }
}

// The fused gate/up kernel at one row of x is compiled for 5 blocks per SM on NVIDIA: ptxas
// then keeps Q4_K's and Q6_K's to 96 registers without spilling (4 blocks of 4 warps at the
// 120-126 they take otherwise), so more loads are in flight per SM. H100, 8B Q4_K_M decode at
// batch 1: the gate/up kernels 1.03 -> 0.98 ms a step (session 11's decode); with Q4_KW, 5
// blocks still beat the 80 registers ptxas picks unbounded (2.65 against 2.69 ms a step). Not
// for Q5_K (about 160 registers), nor for the plain matmul.
#if defined(KILN_CUDA)
#define KILN_QDOT_SILU_BOUNDS_1 __launch_bounds__(QGEMV_WARPS * WARP, 5)
#else
#define KILN_QDOT_SILU_BOUNDS_1 __launch_bounds__(QGEMV_WARPS * WARP)
#endif
#define KILN_QDOT_SILU_BOUNDS_0 __launch_bounds__(QGEMV_WARPS * WARP)
#define KILN_QDOT_SILU_BOUNDS(FIVE) KILN_QDOT_SILU_BOUNDS_##FIVE
// The rope epilogue's parameters (the last 11 of qdot_* and qdotmix_*) as a QkvRope
// (inv_freq null: a plain matmul).
#define KILN_QKV_ROPE                                                                               \
    QkvRope { positions, inv_freq, slots, k_cache, v_cache, cbase, q_dim, kv_dim, head_dim, rot_dim, mscale }
// The consumer's parameters of qdot_in_*, qdotmix_in_* and qdot_silu_in_* (nss .. neps) as a
// NormIn.
#define KILN_NORM_IN NormIn{nss, nres, nw, nout, neps}
// Per type (QN): the decode types at 1-2 rows (Q) and at 4-8 rows (Q4: Q4_K's whole-group
// unit Q4_KW takes more registers at 4 and 8 rows and was slower there), the units in flight
// per lane at one row for qdot (UQ) and qdot_silu (US), at two rows (U2; 4 and 8 rows take 1),
// FIVE (1: the one-row qdot_silu runs at 5 blocks per SM on NVIDIA) and PP (the one- and
// two-row loops take two steps a trip, qdot_acc). H100, 8B decode at batch 1: Q8_0 gains from
// UQ 4 and PP; Q4_K lost with PP, so did Q4_K's qdot at UQ 2 (Q4_KW, 32 bytes a unit).
#define KILN_QDOT(QN, Q, M, UQ, US, FIVE, PP)                                                       \
    extern "C" __global__ void __launch_bounds__(QGEMV_WARPS * WARP)                                \
        qdot_##QN##_bf16_m##M(const u8* xq, const u8* w0, const u8* w1, const u8* w2, const bf16* bias, \
                              bf16* y, int k, int r0, int r1, int r2, int rows, int ldy,            \
                              const u32* positions, const float* inv_freq, const u32* slots,        \
                              bf16* k_cache, bf16* v_cache, int cbase, int q_dim, int kv_dim,       \
                              int head_dim, int rot_dim, float mscale) {                            \
        qdot_impl<Q, Q, M, 2, UQ, UQ, PP, false>(xq, w0, w1, w2, bias, y, k, r0, r1, r2, rows, ldy, \
                                                 KILN_QKV_ROPE, NormIn{});                          \
    }                                                                                               \
    extern "C" __global__ void KILN_QDOT_SILU_BOUNDS(FIVE)                                          \
        qdot_silu_##QN##_bf16_m##M(const u8* xq, const u8* wg, const u8* wu, bf16* y, int k, int f, \
                                   int rows, int ldy) {                                             \
        qdot_silu_impl<Q, M, US, PP, false>(xq, wg, wu, y, k, f, rows, ldy, NormIn{});              \
    }
// The one-row consumers of the residual norm (NormIn): entries of their own, so that the
// plain kernels keep their code (H100, 8B Q4_K_M b1: the norm's parameters and branch in the
// plain kernels cost 2.53 -> 2.58 ms a step). They and the producer are a part of their own
// per type (n<type>), compiled after start-up: the one-row part's compile stays as it was.
#define KILN_QDOT_IN(QN, Q, UQ, US, FIVE, PP)                                                       \
    extern "C" __global__ void __launch_bounds__(QGEMV_WARPS * WARP)                                \
        qdot_in_##QN##_bf16_m1(const u8* xq, const u8* w0, const u8* w1, const u8* w2, const bf16* bias, \
                               bf16* y, int k, int r0, int r1, int r2, int rows, int ldy,           \
                               const u32* positions, const float* inv_freq, const u32* slots,       \
                               bf16* k_cache, bf16* v_cache, int cbase, int q_dim, int kv_dim,      \
                               int head_dim, int rot_dim, float mscale, const float* nss,           \
                               const bf16* nres, const bf16* nw, bf16* nout, float neps) {          \
        qdot_impl<Q, Q, 1, 2, UQ, UQ, PP, true>(xq, w0, w1, w2, bias, y, k, r0, r1, r2, rows, ldy,  \
                                                KILN_QKV_ROPE, KILN_NORM_IN);                       \
    }                                                                                               \
    extern "C" __global__ void KILN_QDOT_SILU_BOUNDS(FIVE)                                          \
        qdot_silu_in_##QN##_bf16_m1(const u8* xq, const u8* wg, const u8* wu, bf16* y, int k, int f, \
                                    int rows, int ldy, const float* nss, const bf16* nres,          \
                                    const bf16* nw, bf16* nout, float neps) {                       \
        qdot_silu_impl<Q, 1, US, PP, true>(xq, wg, wu, y, k, f, rows, ldy, KILN_NORM_IN);           \
    }
// Each row count is a compile unit of its own (1 row in the type's part, QN; then QNm2 ...).
// The one-row producer of the residual norm (qdot_norm_impl): QDOT_NORM_WARPS warps a block.
#define KILN_QDOT_NORM(QN, Q, UQ, PP)                                                               \
    extern "C" __global__ void __launch_bounds__(QDOT_NORM_WARPS * WARP)                            \
        qdot_norm_##QN##_bf16_m1(const u8* xq, const u8* w, int k, int h, int rows, bf16* res,      \
                                 const bf16* nw, u8* oxq, float* oss) {                             \
        qdot_norm_impl<Q, 1, UQ, PP>(xq, w, k, h, rows, res, nw, oxq, oss);                         \
    }
#define KILN_QDOT_T(QN, Q, Q4, UQ, US, U2, FIVE, PP)                                                \
    KILN_IN_PART(QN, KILN_QDOT(QN, Q, 1, UQ, US, FIVE, PP))                                         \
    KILN_IN_PART(n##QN, KILN_QDOT_IN(QN, Q, UQ, US, FIVE, PP) KILN_QDOT_NORM(QN, Q, UQ, PP))        \
    KILN_IN_PART(QN##m2, KILN_QDOT(QN, Q, 2, U2, U2, 0, PP))                                        \
    KILN_IN_PART(QN##m4, KILN_QDOT(QN, Q4, 4, 1, 1, 0, PP))                                         \
    KILN_IN_PART(QN##m8, KILN_QDOT(QN, Q4, 8, 1, 1, 0, PP))
KILN_QDOT_T(q80, Q8_0, Q8_0, 4, 2, 1, 1, true)
KILN_QDOT_T(q40, Q4_0, Q4_0, 2, 2, 1, 1, false)
KILN_QDOT_T(q4k, Q4_KW, Q4_K, 1, 1, 1, 1, false)
KILN_QDOT_T(q5k, Q5_K, Q5_K, 2, 2, 1, 0, false)
KILN_QDOT_T(q6k, Q6_K, Q6_K, 1, 1, 1, 1, false)
// MXFP4 as Q4_0 (a block of 32 a unit), without the five-block bound (its table lookups
// hold more registers).
KILN_QDOT_T(mxfp4, MXFP4, MXFP4, 2, 2, 1, 0, false)
// q and k of type Q (Q4 at 4-8 rows), v of Q6_K in one launch (llama.cpp's Q4_K_M and Q5_K_M
// give attn_v more bits).
#define KILN_QDOT_MIX(QN, Q, M, U)                                                                  \
    extern "C" __global__ void __launch_bounds__(QGEMV_WARPS * WARP)                                \
        qdotmix_##QN##_q6k_bf16_m##M(const u8* xq, const u8* w0, const u8* w1, const u8* w2,         \
                                  const bf16* bias, bf16* y, int k, int r0, int r1, int r2,         \
                                  int rows, int ldy, const u32* positions, const float* inv_freq,   \
                                  const u32* slots, bf16* k_cache, bf16* v_cache, int cbase,        \
                                  int q_dim, int kv_dim, int head_dim, int rot_dim, float mscale) { \
        qdot_impl<Q, Q6_K, M, 2, U, 1, false, false>(xq, w0, w1, w2, bias, y, k, r0, r1, r2, rows,  \
                                                     ldy, KILN_QKV_ROPE, NormIn{});                 \
    }
#define KILN_QDOT_MIX_IN(QN, Q, U)                                                                  \
    extern "C" __global__ void __launch_bounds__(QGEMV_WARPS * WARP)                                \
        qdotmix_in_##QN##_q6k_bf16_m1(const u8* xq, const u8* w0, const u8* w1, const u8* w2,      \
                                      const bf16* bias, bf16* y, int k, int r0, int r1, int r2,     \
                                      int rows, int ldy, const u32* positions, const float* inv_freq, \
                                      const u32* slots, bf16* k_cache, bf16* v_cache, int cbase,    \
                                      int q_dim, int kv_dim, int head_dim, int rot_dim, float mscale, \
                                      const float* nss, const bf16* nres, const bf16* nw, bf16* nout, \
                                      float neps) {                                                 \
        qdot_impl<Q, Q6_K, 1, 2, U, 1, false, true>(xq, w0, w1, w2, bias, y, k, r0, r1, r2, rows,   \
                                                    ldy, KILN_QKV_ROPE, KILN_NORM_IN);              \
    }
#define KILN_QDOT_MIX_T(QN, Q, Q4, U1)                                                              \
    KILN_IN_PART(QN, KILN_QDOT_MIX(QN, Q, 1, U1)) KILN_IN_PART(n##QN, KILN_QDOT_MIX_IN(QN, Q, U1))  \
    KILN_IN_PART(QN##m2, KILN_QDOT_MIX(QN, Q, 2, 1))                                                \
    KILN_IN_PART(QN##m4, KILN_QDOT_MIX(QN, Q4, 4, 1)) KILN_IN_PART(QN##m8, KILN_QDOT_MIX(QN, Q4, 8, 1))
KILN_QDOT_MIX_T(q4k, Q4_KW, Q4_K, 1)
KILN_QDOT_MIX_T(q5k, Q5_K, Q5_K, 2)
#endif
