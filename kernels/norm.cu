// RMSNorm, plain and fused with the residual add. One block per row.
//   rms_norm:     out = x / sqrt(mean(x^2) + eps) * w
//   add_rms_norm: residual += x; out = rmsnorm(residual) * w
// Sums in f32; in bf16 the residual is rounded once and the norm reads the rounded value.

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

#define KILN_NORM(N, T)                                                                              \
    extern "C" __global__ void rms_norm_##N(const T* x, const T* w, T* out, int h, float eps) {      \
        rms_norm_impl<T>(x, nullptr, w, out, h, eps);                                               \
    }                                                                                                \
    extern "C" __global__ void add_rms_norm_##N(const T* x, T* residual, const T* w, T* out, int h,  \
                                                float eps) {                                         \
        rms_norm_impl<T>(x, residual, w, out, h, eps);                                              \
    }
KILN_FOR_DTYPES(KILN_NORM)
