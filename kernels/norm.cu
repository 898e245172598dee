// RMSNorm, plain and fused with the residual add. One block per row.
//   rms_norm:     out = x / sqrt(mean(x^2) + eps) * w
//   add_rms_norm: residual += x; out = rmsnorm(residual) * w
// Sums in f32; in bf16 the residual is rounded once and the norm reads the rounded value.

template <typename T>
__device__ void rms_norm_impl(const T* __restrict__ x, T* __restrict__ residual, const T* __restrict__ w,
                              T* __restrict__ out, int h, float eps) {
    __shared__ float scratch[MAX_WARPS];
    const size_t base = (size_t)blockIdx.x * h;
    float ss = 0.f;
    for (int i = threadIdx.x; i < h; i += blockDim.x) {
        float v = to_f(x[base + i]);
        if (residual) {
            const T r = from_f<T>(to_f(residual[base + i]) + v);
            residual[base + i] = r;
            v = to_f(r);
        }
        ss += v * v;
    }
    ss = block_sum(ss, scratch);
    const float inv = 1.0f / sqrtf(ss / (float)h + eps);
    for (int i = threadIdx.x; i < h; i += blockDim.x) {
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
