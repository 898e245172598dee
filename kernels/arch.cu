// Ops of the model families beyond Llama (Qwen3, Gemma, Phi-3), over [n, cols] tensors.
//   head_rms_norm: each q head (weight qw) and k head (weight kw) of a fused qkv row
//                  normalized in place; one block per (row, head)
//   gelu_tanh_mul: out[r, i] = gelu_tanh(gu[r, i]) * gu[r, f + i]  (GeGLU, grid-stride)
//   scale_rows:    x *= s                       (Gemma's embedding scale)
//   softcap:       x = cap * tanh(x / cap)      (Gemma 2's final logits)
// Math in f32; bf16 results are rounded once.

template <typename T>
__device__ void head_rms_norm_impl(T* __restrict__ qkv, int stride, const T* __restrict__ qw,
                                   const T* __restrict__ kw, int n_heads, int head_dim, float eps) {
    __shared__ float scratch[MAX_WARPS];
    const int head = blockIdx.y;
    T* x = qkv + (size_t)blockIdx.x * stride + (size_t)head * head_dim;
    const T* w = head < n_heads ? qw : kw;
    float ss = 0.f;
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
        const float v = to_f(x[i]);
        ss += v * v;
    }
    ss = block_sum(ss, scratch);
    const float inv = 1.0f / sqrtf(ss / (float)head_dim + eps);
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
        x[i] = from_f<T>(to_f(x[i]) * inv * to_f(w[i]));
    }
}

__device__ __forceinline__ float gelu_tanh(float g) {
    return 0.5f * g * (1.0f + tanhf(0.7978845608f * (g + 0.044715f * g * g * g)));
}

template <typename T>
__device__ void gelu_tanh_mul_impl(const T* __restrict__ gu, T* __restrict__ out, int f, size_t total) {
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        const size_t r = e / f, i = e % f;
        const float g = to_f(gu[r * 2 * f + i]);
        const float u = to_f(gu[r * 2 * f + f + i]);
        out[e] = from_f<T>(gelu_tanh(g) * u);
    }
}

template <typename T>
__device__ void scale_rows_impl(T* __restrict__ x, float s, size_t total) {
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        x[e] = from_f<T>(to_f(x[e]) * s);
    }
}

template <typename T>
__device__ void softcap_impl(T* __restrict__ x, float cap, size_t total) {
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        x[e] = from_f<T>(cap * tanhf(to_f(x[e]) / cap));
    }
}

#define KILN_ARCH(N, T)                                                                             \
    extern "C" __global__ void head_rms_norm_##N(T* qkv, int stride, const T* qw, const T* kw,      \
                                                 int n_heads, int head_dim, float eps) {            \
        head_rms_norm_impl<T>(qkv, stride, qw, kw, n_heads, head_dim, eps);                        \
    }                                                                                               \
    extern "C" __global__ void gelu_tanh_mul_##N(const T* gu, T* out, int f, u64 total) {           \
        gelu_tanh_mul_impl<T>(gu, out, f, (size_t)total);                                          \
    }                                                                                               \
    extern "C" __global__ void scale_rows_##N(T* x, float s, u64 total) {                           \
        scale_rows_impl<T>(x, s, (size_t)total);                                                   \
    }                                                                                               \
    extern "C" __global__ void softcap_##N(T* x, float cap, u64 total) {                            \
        softcap_impl<T>(x, cap, (size_t)total);                                                    \
    }
KILN_FOR_DTYPES(KILN_ARCH)
