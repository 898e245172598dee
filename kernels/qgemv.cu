// Quantized weights (GGUF Q8_0, Q4_0, Q4_K, Q5_K, Q6_K) kept quantized on the device:
//   qgemv:       y[m, j] = sum_k x[m, k] * W[j, k] (+ bias[j])   for 1..8 rows of x
//   qgemv_silu:  y[m, j] = silu(G[j] . x[m]) * (U[j] . x[m])      gate G and up U, f rows each
//   dequant:     out[i] = W[ids ? ids[i] : i] as the compute type  (embedding rows; the
//                weight of a batch step, dequantized into a scratch for the BLAS GEMM)
//   convert:     f16 / bf16 elements to the compute type (dense F16/BF16 weights)
//
// Device layout: the host repacks each GGUF matrix once at load into planes, back to back,
// each plane 256-byte aligned and row-major with a fixed byte count per row, so that every
// lane reads its quants with 16-byte loads (the bits per weight are the file's):
//   q8_0: qs[n][k] i8                | d[n][k/32] f16
//   q4_0: qs[n][k/32][16]            | d[n][k/32] f16                (ggml nibble order)
//   q4_k: qs[n][k/256][128]          | meta[n][k/256][16]            (d, dmin, scales[12])
//   q5_k: qs[n][k/256][128]          | qh[n][k/256][32] | meta[n][k/256][16]
//   q6_k: ql[n][k/256][128]          | qh[n][k/256][64] | sc[n][k/256][16] i8 | d[n][k/256] f16
// (src/backend/gpu/qweight.rs writes the same layout.)
//
// A "unit" is what one lane decodes at a time: RUNS runs of 16 weights, each run multiplying
// 16 consecutive elements of x (at xoff). Weights are dequantized in registers
// (byte -> float through the exponent trick, exact), products accumulate in f32, lane sums
// are reduced with shuffles: one warp per R weight rows, no shared memory.

constexpr int QGEMV_WARPS = 4;     // warps per block of qgemv; the host sizes the grid with it
constexpr int DEQUANT_THREADS = 128;

__device__ __forceinline__ size_t plane_align(size_t b) { return (b + 255) & ~(size_t)255; }

// IEEE half to float (exact; inf/NaN kept).
__device__ __forceinline__ float half_to_f(u32 h) {
#if defined(KILN_CUDA)
    float f;
    asm("{ .reg .b16 t; mov.b16 t, %1; cvt.f32.f16 %0, t; }" : "=f"(f) : "h"((u16)h));
    return f;
#else
    const u32 sign = (h & 0x8000u) << 16;
    const u32 mag = h & 0x7fffu;
    if (mag >= 0x7c00u) return __uint_as_float(sign | 0x7f800000u | ((mag & 0x3ffu) << 13));
    return __uint_as_float(sign | __float_as_uint(__uint_as_float(mag << 13) * 5.192296858534828e33f));
#endif
}

// A quant chunk read once: past L1 on NVIDIA (never reused by this SM).
__device__ __forceinline__ vec4u ld_stream(const vec4u* p) {
#if defined(KILN_CUDA)
    vec4u r;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p));
    return r;
#else
    return *p;
#endif
}

// 2^23 + byte i of v, as a float (the byte lands in the mantissa); subtracting 2^23 + bias
// gives byte - bias exactly.
__device__ __forceinline__ float byte_f(u32 v, int i) {
#if defined(KILN_CUDA)
    return __uint_as_float(__byte_perm(v, 0x4B000000u, 0x7440u | (u32)i));
#else
    return __uint_as_float(((v >> (8 * i)) & 0xffu) | 0x4B000000u);
#endif
}

// The four bytes of v less bias, as exact floats.
__device__ __forceinline__ void q4(u32 v, float bias, float* q) {
    const float b = 8388608.0f + bias;
#pragma unroll
    for (int i = 0; i < 4; ++i) q[i] = byte_f(v, i) - b;
}

__device__ __forceinline__ u32 word(const vec4u& v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}


// The 6-bit (scale, min) of sub-block j of a k-quant block's 16-byte meta (d, dmin,
// scales[12]: words y, z, w); j is the same for every unit of a lane, so the shifts are too.
__device__ __forceinline__ void kq_scale_min(const vec4u& meta, int j, float& sc, float& mn) {
    const int sh = 8 * (j & 3);
    const u32 ys = meta.y >> sh, zs = meta.z >> sh, ws = meta.w >> sh;
    u32 s, m;
    if (j < 4) {
        s = ys & 63u;
        m = zs & 63u;
    } else {
        s = (ws & 15u) | ((ys >> 2) & 0x30u);
        m = ((ws >> 4) & 15u) | ((zs >> 2) & 0x30u);
    }
    sc = (float)s;
    mn = (float)m;
}

// Each type: UNIT weights per unit in RUNS runs of 16; run() gives a run's 16 quants as exact
// floats q and the run's (scale, add): weight = scale * q + add (add is 0 unless MIN).
// `lo` has the unit index's low 3 bits (the lane's: units step by whole warps).

// ---- Q8_0: unit = half a block, 16 quants (1 run) ---------------------------------------
struct Q8_0 {
    static constexpr int UNIT = 16, RUNS = 1;
    static constexpr bool MIN = false;
    struct Row {
        const u8* qs;
        const u16* d;
    };
    struct Raw {
        vec4u q;
        u32 d;
    };
    static __device__ __forceinline__ Row row(const u8* w, int n, int k, int j) {
        const size_t qs = plane_align((size_t)n * k);
        return Row{w + (size_t)j * k, reinterpret_cast<const u16*>(w + qs) + (size_t)j * (k / 32)};
    }
    static __device__ __forceinline__ Raw load(const Row& r, int u) {
        return Raw{ld_stream(reinterpret_cast<const vec4u*>(r.qs) + u), r.d[u >> 1]};
    }
    static __device__ __forceinline__ int xoff(int u, int) { return 16 * u; }
    static __device__ __forceinline__ void run(const Raw& raw, int, int, float* q, float& sc, float& add) {
        sc = half_to_f(raw.d);
        add = 0.f;
#pragma unroll
        for (int i = 0; i < 4; ++i) q4(word(raw.q, i) ^ 0x80808080u, 128.f, q + 4 * i);
    }
};

// ---- Q4_0: unit = one block of 32 (low nibbles: run 0, high: run 1) -----------------------
struct Q4_0 {
    static constexpr int UNIT = 32, RUNS = 2;
    static constexpr bool MIN = false;
    struct Row {
        const u8* qs;
        const u16* d;
    };
    struct Raw {
        vec4u q;
        u32 d;
    };
    static __device__ __forceinline__ Row row(const u8* w, int n, int k, int j) {
        const size_t qs = plane_align((size_t)n * (k / 2));
        return Row{w + (size_t)j * (k / 2), reinterpret_cast<const u16*>(w + qs) + (size_t)j * (k / 32)};
    }
    static __device__ __forceinline__ Raw load(const Row& r, int u) {
        return Raw{ld_stream(reinterpret_cast<const vec4u*>(r.qs) + u), r.d[u]};
    }
    static __device__ __forceinline__ int xoff(int u, int ri) { return 32 * u + 16 * ri; }
    static __device__ __forceinline__ void run(const Raw& raw, int, int ri, float* q, float& sc, float& add) {
        sc = half_to_f(raw.d);
        add = 0.f;
#pragma unroll
        for (int i = 0; i < 4; ++i) q4((word(raw.q, i) >> (4 * ri)) & 0x0f0f0f0fu, 8.f, q + 4 * i);
    }
};

// ---- Q4_K / Q5_K: unit = 16 quant bytes of one 32-byte group g of a super-block: elements
// 16h..16h+16 of sub-blocks 2g (low nibbles, run 0) and 2g+1 (high nibbles, run 1) ----------
template <bool Q5>
struct QK45 {
    static constexpr int UNIT = 32, RUNS = 2;
    static constexpr bool MIN = true;
    struct Row {
        const u8* qs;
        const u8* qh;
        const vec4u* meta;
    };
    struct Raw {
        vec4u q, h, meta;
    };
    static __device__ __forceinline__ Row row(const u8* w, int n, int k, int j) {
        const int nb = k / 256;
        const size_t qs = plane_align((size_t)n * nb * 128);
        const size_t qh = Q5 ? plane_align((size_t)n * nb * 32) : 0;
        return Row{w + (size_t)j * nb * 128, w + qs + (size_t)j * nb * 32,
                   reinterpret_cast<const vec4u*>(w + qs + qh) + (size_t)j * nb};
    }
    static __device__ __forceinline__ Raw load(const Row& r, int u) {
        Raw raw;
        raw.q = ld_stream(reinterpret_cast<const vec4u*>(r.qs) + u);
        raw.meta = r.meta[u >> 3];
        if (Q5) raw.h = reinterpret_cast<const vec4u*>(r.qh)[2 * (u >> 3) + (u & 1)];
        return raw;
    }
    static __device__ __forceinline__ int xoff(int u, int ri) {
        return 256 * (u >> 3) + 64 * ((u & 7) >> 1) + 16 * (u & 1) + 32 * ri;
    }
    static __device__ __forceinline__ void run(const Raw& raw, int lo, int ri, float* q, float& sc, float& add) {
        const int sub = 2 * ((lo & 7) >> 1) + ri;
        float s, m;
        kq_scale_min(raw.meta, sub, s, m);
        sc = half_to_f(raw.meta.x & 0xffffu) * s;
        add = -half_to_f(raw.meta.x >> 16) * m;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            u32 v = (word(raw.q, i) >> (4 * ri)) & 0x0f0f0f0fu;
            if (Q5) v |= ((word(raw.h, i) >> sub) & 0x01010101u) << 4;
            q4(v, 0.f, q + 4 * i);
        }
    }
};
typedef QK45<false> Q4_K;
typedef QK45<true> Q5_K;

// ---- Q6_K: unit = l0..l0+16 of one half h of a super-block: 4 runs, one scale each --------
struct Q6_K {
    static constexpr int UNIT = 64, RUNS = 4;
    static constexpr bool MIN = false;
    struct Row {
        const u8* ql;
        const u8* qh;
        const vec4u* sc;
        const u16* d;
    };
    struct Raw {
        vec4u a, b, h, sc;
        u32 d;
    };
    static __device__ __forceinline__ Row row(const u8* w, int n, int k, int j) {
        const int nb = k / 256;
        const size_t ql = plane_align((size_t)n * nb * 128);
        const size_t qh = plane_align((size_t)n * nb * 64);
        const size_t sc = plane_align((size_t)n * nb * 16);
        return Row{w + (size_t)j * nb * 128, w + ql + (size_t)j * nb * 64,
                   reinterpret_cast<const vec4u*>(w + ql + qh) + (size_t)j * nb,
                   reinterpret_cast<const u16*>(w + ql + qh + sc) + (size_t)j * nb};
    }
    // u: super-block u/4, half h = (u/2)&1, l0 = 16 (u&1).
    static __device__ __forceinline__ Raw load(const Row& r, int u) {
        const int b = u >> 2, h = (u >> 1) & 1, c = u & 1;
        const vec4u* ql = reinterpret_cast<const vec4u*>(r.ql) + 8 * b + 4 * h + c;
        Raw raw;
        raw.a = ld_stream(ql);
        raw.b = ld_stream(ql + 2);
        raw.h = ld_stream(reinterpret_cast<const vec4u*>(r.qh) + 4 * b + 2 * h + c);
        raw.sc = r.sc[b];
        raw.d = r.d[b];
        return raw;
    }
    static __device__ __forceinline__ int xoff(int u, int ri) {
        return 256 * (u >> 2) + 128 * ((u >> 1) & 1) + 16 * (u & 1) + 32 * ri;
    }
    static __device__ __forceinline__ void run(const Raw& raw, int lo, int ri, float* q, float& sc, float& add) {
        const int h = (lo >> 1) & 1, c = lo & 1;
        // scales[8h + c + 2ri]: word 2h (ri < 2) or 2h + 1, byte (c + 2ri) & 3.
        const u32 wsel = ri < 2 ? (h ? raw.sc.z : raw.sc.x) : (h ? raw.sc.w : raw.sc.y);
        const int s = (int)(signed char)((wsel >> (8 * ((c + 2 * ri) & 3))) & 0xffu);
        sc = half_to_f(raw.d) * (float)s;
        add = 0.f;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const u32 lw = word(ri & 1 ? raw.b : raw.a, i);
            const u32 qq = (ri < 2 ? lw : lw >> 4) & 0x0f0f0f0fu;
            const u32 hb = ((word(raw.h, i) >> (2 * ri)) & 0x03030303u) << 4;
            q4(qq | hb, 32.f, q + 4 * i);
        }
    }
};

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
