// Rotary position embedding, in place on the fused qkv tensor [T, stride]: the q heads and
// then the k heads of each row (v is left alone). Grid (token, head); one thread per pair.
//   interleaved: pairs (2i, 2i+1)      half: pairs (i, i + rot_dim/2)
// Angles pos * inv_freq[i] in f64, as the CPU reference computes them; inv_freq carries the
// Llama-3 scaling (computed once on the host by RopeSpec::inv_freqs).

template <typename T>
__device__ void rope_impl(T* __restrict__ qkv, int stride, const u32* __restrict__ positions,
                          const float* __restrict__ inv_freq, int head_dim, int rot_dim, int interleaved) {
    T* x = qkv + (size_t)blockIdx.x * stride + (size_t)blockIdx.y * head_dim;
    const double pos = (double)positions[blockIdx.x];
    const int half = rot_dim / 2;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        double s, c;
        sincos(pos * (double)inv_freq[i], &s, &c);
        const float cf = (float)c, sf = (float)s;
        const int a = interleaved ? 2 * i : i;
        const int b = interleaved ? 2 * i + 1 : i + half;
        const float x0 = to_f(x[a]), x1 = to_f(x[b]);
        x[a] = from_f<T>(x0 * cf - x1 * sf);
        x[b] = from_f<T>(x0 * sf + x1 * cf);
    }
}

#define KILN_ROPE(N, T)                                                                            \
    extern "C" __global__ void rope_##N(T* qkv, int stride, const u32* positions, const float* inv_freq, \
                                        int head_dim, int rot_dim, int interleaved) {              \
        rope_impl<T>(qkv, stride, positions, inv_freq, head_dim, rot_dim, interleaved);            \
    }
KILN_FOR_DTYPES(KILN_ROPE)
