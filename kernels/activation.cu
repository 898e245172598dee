// Element-wise ops over [n, cols] tensors, grid-stride.
//   silu_mul: out[r, i] = silu(gu[r, i]) * gu[r, f + i]   (gu is [n, 2f], out is [n, f])
//             (bf16: the silu product is taken in f32 and rounded once)
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

// silu_mul_vec: the same over whole 16-byte chunks (f a multiple of the chunk; the host
// checks). Grid (chunks of a row / block, rows); a thread takes one chunk of g and of u.
template <typename T>
__device__ void silu_mul_vec_impl(const T* __restrict__ gu, T* __restrict__ out, int f, int n) {
    typedef Chunk<T> C;
    typedef typename C::Raw Raw;
    const int fc = f / C::E;
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= fc) return;
    for (int r = blockIdx.y; r < n; r += gridDim.y) {
        const Raw* row = reinterpret_cast<const Raw*>(gu + (size_t)r * 2 * f);
        float g[C::E], u[C::E];
        C::unpack(row[c], g);
        C::unpack(row[fc + c], u);
#pragma unroll
        for (int e = 0; e < C::E; ++e) g[e] = g[e] / (1.0f + expf(-g[e])) * u[e];
        reinterpret_cast<Raw*>(out + (size_t)r * f)[c] = C::pack(g);
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
    extern "C" __global__ void silu_mul_vec_##N(const T* gu, T* out, int f, int n) {                 \
        silu_mul_vec_impl<T>(gu, out, f, n);                                                       \
    }                                                                                               \
    extern "C" __global__ void add_bias_##N(T* x, const T* bias, int cols, u64 total) {             \
        add_bias_impl<T>(x, bias, cols, (size_t)total);                                            \
    }
KILN_FOR_DTYPES(KILN_ACT)
