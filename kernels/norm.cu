// RMSNorm, plain and fused with the residual add. One block per row.
//   rms_norm:     out = x / sqrt(mean(x^2) + eps) * w
//   add_rms_norm: residual += x; out = rmsnorm(residual) * w
// Sums in f32; in bf16 the residual is rounded once and the norm reads the rounded value.
// The vector variants can also write `out` as 8-bit blocks of 32 at xq (non-null; rows a
// multiple of 32 long): i8 qs[rows][h], then at the next 256-byte boundary one (d, s) pair of
// f32 per block (d = amax / 127, s = the sum of the block's rounded outputs), the layout the
// quantized decode matmuls read (qgemv.cu), so they need no quantize launch.

// Values per thread kept in registers between the two passes (more are re-read).
constexpr int NORM_CACHE = 8;

template <typename T>
__device__ __forceinline__ float norm_in(const T* __restrict__ x, T* __restrict__ residual, size_t i) {
    float v = to_f(x[i]);
    if (residual) {
        const T r = from_f<T>(to_f(residual[i]) + v);
        residual[i] = r;
        v = to_f(r);
    }
    return v;
}

template <typename T>
__device__ void rms_norm_impl(const T* __restrict__ x, T* __restrict__ residual, const T* __restrict__ w,
                              T* __restrict__ out, int h, float eps) {
    KILN_PDL_TRIGGER();
    KILN_PDL_WAIT();
    __shared__ float scratch[MAX_WARPS];
    const size_t base = (size_t)blockIdx.x * h;
    const int step = blockDim.x;
    float cache[NORM_CACHE];
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < NORM_CACHE; ++k) {
        const int i = threadIdx.x + k * step;
        cache[k] = i < h ? norm_in(x, residual, base + i) : 0.f;
        ss += cache[k] * cache[k];
    }
    for (int i = threadIdx.x + NORM_CACHE * step; i < h; i += step) {
        const float v = norm_in(x, residual, base + i);
        ss += v * v;
    }
    ss = block_sum(ss, scratch);
    const float inv = 1.0f / sqrtf(ss / (float)h + eps);
#pragma unroll
    for (int k = 0; k < NORM_CACHE; ++k) {
        const int i = threadIdx.x + k * step;
        if (i < h) out[base + i] = from_f<T>(cache[k] * inv * to_f(w[i]));
    }
    for (int i = threadIdx.x + NORM_CACHE * step; i < h; i += step) {
        const float v = residual ? to_f(residual[base + i]) : to_f(x[base + i]);
        out[base + i] = from_f<T>(v * inv * to_f(w[i]));
    }
}

// The same over whole 16-byte chunks (h a multiple of the chunk, aligned rows; the host
// checks): NORM_VEC_CACHE chunks per thread stay in registers between the two passes.
constexpr int NORM_VEC_CACHE = 2;

template <typename T>
__device__ __forceinline__ void norm_in_vec(const T* __restrict__ x, T* __restrict__ residual, size_t row, int c,
                                            float v[Chunk<T>::E]) {
    typedef Chunk<T> C;
    typedef typename C::Raw Raw;
    C::unpack(reinterpret_cast<const Raw*>(x + row)[c], v);
    if (residual) {
        Raw* rr = reinterpret_cast<Raw*>(residual + row) + c;
        float r[C::E];
        C::unpack(*rr, r);
#pragma unroll
        for (int e = 0; e < C::E; ++e) r[e] += v[e];
        const Raw rounded = C::pack(r);
        *rr = rounded;
        C::unpack(rounded, v);
    }
}

// Chunk c of row `row` (values v, rounded) into xq: the 32 / E threads of a block of 32 are
// adjacent lanes (chunks c of one pass are consecutive); every lane of the warp calls it,
// `valid` or not.
template <typename T>
__device__ __forceinline__ void norm_quant(const float* v, bool valid, u8* __restrict__ xq, int row, int c, int h) {
    constexpr int E = Chunk<T>::E, G = 32 / E;
    float* ds = reinterpret_cast<float*>(xq + (((size_t)gridDim.x * h + 255) & ~(size_t)255));
    qx_lanes<E>(v, valid, c % G == 0, xq + (size_t)row * h + (size_t)c * E,
                ds + 2 * ((size_t)row * (h / 32) + c / G));
}

template <typename T>
__device__ void rms_norm_vec_impl(const T* __restrict__ x, T* __restrict__ residual, const T* __restrict__ w,
                                  T* __restrict__ out, u8* __restrict__ xq, int h, float eps) {
    KILN_PDL_TRIGGER();
    typedef Chunk<T> C;
    typedef typename C::Raw Raw;
    constexpr int E = C::E;
    __shared__ float scratch[MAX_WARPS];
    const size_t row = (size_t)blockIdx.x * h;
    const int hc = h / E, step = blockDim.x;
    // The weight chunks of the cached passes, loaded first (they are no predecessor's
    // output: before KILN_PDL_WAIT, so they arrive while the kernel before drains; without
    // PDL, with the row's loads rather than after the block's sum).
    const Raw* wr = reinterpret_cast<const Raw*>(w);
    Raw wc[NORM_VEC_CACHE];
#pragma unroll
    for (int k = 0; k < NORM_VEC_CACHE; ++k) {
        const int c = threadIdx.x + k * step;
        wc[k] = c < hc ? wr[c] : C::zero();
    }
    KILN_PDL_WAIT();
    float cache[NORM_VEC_CACHE][E];
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < NORM_VEC_CACHE; ++k) {
        const int c = threadIdx.x + k * step;
        if (c < hc) {
            norm_in_vec(x, residual, row, c, cache[k]);
        } else {
#pragma unroll
            for (int e = 0; e < E; ++e) cache[k][e] = 0.f;
        }
#pragma unroll
        for (int e = 0; e < E; ++e) ss += cache[k][e] * cache[k][e];
    }
    for (int c = threadIdx.x + NORM_VEC_CACHE * step; c < hc; c += step) {
        float v[E];
        norm_in_vec(x, residual, row, c, v);
#pragma unroll
        for (int e = 0; e < E; ++e) ss += v[e] * v[e];
    }
    ss = block_sum(ss, scratch);
    const float inv = 1.0f / sqrtf(ss / (float)h + eps);
    Raw* orow = reinterpret_cast<Raw*>(out + row);
    // Passes over the row are block-uniform (every lane takes part in norm_quant's shuffles).
#pragma unroll
    for (int k = 0; k < NORM_VEC_CACHE; ++k) {
        const int c = threadIdx.x + k * step;
        float wf[E];
        if (c < hc) {
            C::unpack(wc[k], wf);
#pragma unroll
            for (int e = 0; e < E; ++e) wf[e] *= cache[k][e] * inv;
            const Raw o = C::pack(wf);
            orow[c] = o;
            if (xq) C::unpack(o, wf);  // the rounded outputs, for norm_quant
        } else {
#pragma unroll
            for (int e = 0; e < E; ++e) wf[e] = 0.f;
        }
        if (xq && k * step < hc) norm_quant<T>(wf, c < hc, xq, blockIdx.x, c, h);
    }
    for (int c0 = NORM_VEC_CACHE * step; c0 < hc; c0 += step) {
        const int c = c0 + threadIdx.x;
        float v[E], wf[E];
        if (c < hc) {
            C::unpack(reinterpret_cast<const Raw*>((residual ? residual : x) + row)[c], v);
            C::unpack(wr[c], wf);
#pragma unroll
            for (int e = 0; e < E; ++e) wf[e] *= v[e] * inv;
            const Raw o = C::pack(wf);
            orow[c] = o;
            if (xq) C::unpack(o, wf);  // the rounded outputs, for norm_quant
        } else {
#pragma unroll
            for (int e = 0; e < E; ++e) wf[e] = 0.f;
        }
        if (xq) norm_quant<T>(wf, c < hc, xq, blockIdx.x, c, h);
    }
}

#define KILN_NORM(N, T)                                                                              \
    extern "C" __global__ void rms_norm_##N(const T* x, const T* w, T* out, int h, float eps) {      \
        rms_norm_impl<T>(x, nullptr, w, out, h, eps);                                               \
    }                                                                                                \
    extern "C" __global__ void add_rms_norm_##N(const T* x, T* residual, const T* w, T* out, int h,  \
                                                float eps) {                                         \
        rms_norm_impl<T>(x, residual, w, out, h, eps);                                              \
    }                                                                                                \
    extern "C" __global__ void rms_norm_vec_##N(const T* x, const T* w, T* out, u8* xq, int h,       \
                                                float eps) {                                         \
        rms_norm_vec_impl<T>(x, nullptr, w, out, xq, h, eps);                                       \
    }                                                                                                \
    extern "C" __global__ void add_rms_norm_vec_##N(const T* x, T* residual, const T* w, T* out,     \
                                                    u8* xq, int h, float eps) {                      \
        rms_norm_vec_impl<T>(x, residual, w, out, xq, h, eps);                                      \
    }
KILN_FOR_DTYPES(KILN_NORM)
