// Rotary position embedding, in place on the fused qkv tensor [T, stride]: the q heads and
// then the k heads of each row (v is left alone). Grid (token, head); one thread per pair.
//   interleaved: pairs (2i, 2i+1)      half: pairs (i, i + rot_dim/2)
// Angles pos * inv_freq[i] in f64, as the CPU reference computes them; inv_freq carries the
// Llama-3 scaling (computed once on the host by RopeSpec::inv_freqs).

template <typename T>
__device__ __forceinline__ void rope_impl(T* __restrict__ qkv, int stride, const u32* __restrict__ positions,
                                          const float* __restrict__ inv_freq, int head_dim, int rot_dim,
                                          int interleaved) {
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

// rope_kv: rope, then what write_kv (kv.cu) does, in one launch: the block of k head h
// copies that head's rotated k and its v into the paged cache at the row's slot (slot
// 0xffffffff: a padding row, nothing written). Grid (token, n_heads + n_kv).
template <typename T>
__device__ void rope_kv_impl(T* __restrict__ qkv, int stride, const u32* __restrict__ positions,
                             const float* __restrict__ inv_freq, int head_dim, int rot_dim, int interleaved,
                             int n_heads, int n_kv, const u32* __restrict__ slots, T* __restrict__ k_cache,
                             T* __restrict__ v_cache) {
    rope_impl<T>(qkv, stride, positions, inv_freq, head_dim, rot_dim, interleaved);
    const u32 slot = slots[blockIdx.x];
    if ((int)blockIdx.y < n_heads || slot == 0xffffffffu) return;
    __syncthreads();  // the head's rotated values, written by other threads of the block
    const int kh = blockIdx.y - n_heads, width = n_kv * head_dim;
    const T* k = qkv + (size_t)blockIdx.x * stride + (size_t)n_heads * head_dim + (size_t)kh * head_dim;
    const size_t dst = (size_t)slot * width + (size_t)kh * head_dim;
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
        k_cache[dst + i] = k[i];
        v_cache[dst + i] = k[width + i];
    }
}

#define KILN_ROPE(N, T)                                                                            \
    extern "C" __global__ void rope_##N(T* qkv, int stride, const u32* positions, const float* inv_freq, \
                                        int head_dim, int rot_dim, int interleaved) {              \
        rope_impl<T>(qkv, stride, positions, inv_freq, head_dim, rot_dim, interleaved);            \
    }                                                                                              \
    extern "C" __global__ void rope_kv_##N(T* qkv, int stride, const u32* positions, const float* inv_freq, \
                                           int head_dim, int rot_dim, int interleaved, int n_heads, int n_kv, \
                                           const u32* slots, T* k_cache, T* v_cache) {             \
        rope_kv_impl<T>(qkv, stride, positions, inv_freq, head_dim, rot_dim, interleaved, n_heads, n_kv, \
                        slots, k_cache, v_cache);                                                  \
    }
KILN_FOR_DTYPES(KILN_ROPE)
