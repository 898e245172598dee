// Element-wise ops over [n, cols] tensors, grid-stride.
//   silu_mul: out[r, i] = silu(gu[r, i]) * gu[r, f + i]   (gu is [n, 2f], out is [n, f])
//   add_bias: x[r, i] += bias[i]

template <typename T>
__device__ void silu_mul_impl(const T* __restrict__ gu, T* __restrict__ out, int f, size_t total) {
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        const size_t r = e / f, i = e % f;
        const float g = to_f(gu[r * 2 * f + i]);
        const float u = to_f(gu[r * 2 * f + f + i]);
        out[e] = from_f<T>(g / (1.0f + expf(-g)) * u);
    }
}

template <typename T>
__device__ void add_bias_impl(T* __restrict__ x, const T* __restrict__ bias, int cols, size_t total) {
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        x[e] = from_f<T>(to_f(x[e]) + to_f(bias[e % cols]));
    }
}

#define KILN_ACT(N, T)                                                                              \
    extern "C" __global__ void silu_mul_##N(const T* gu, T* out, int f, u64 total) {                \
        silu_mul_impl<T>(gu, out, f, (size_t)total);                                               \
    }                                                                                               \
    extern "C" __global__ void add_bias_##N(T* x, const T* bias, int cols, u64 total) {             \
        add_bias_impl<T>(x, bias, cols, (size_t)total);                                            \
    }
KILN_FOR_DTYPES(KILN_ACT)
