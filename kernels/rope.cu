// Rotary position embedding, in place on the fused qkv tensor [T, stride]: the q heads and
// then the k heads of each row (v is left alone). Grid (token, group of ROPE_HEADS heads);
// one thread per pair, its angle computed once for the group's heads.
//   interleaved: pairs (2i, 2i+1)      half: pairs (i, i + rot_dim/2)
// Angles pos * inv_freq[i] in f64, as the CPU reference computes them; inv_freq carries the
// Llama-3 scaling (computed once on the host by RopeSpec::inv_freqs). The rotated values are
// multiplied by mscale (long-rope's attention factor, RopeSpec::attn_factor; 1 elsewhere):
// only the rotated dims, so a partial rope leaves the others as they are.

constexpr int ROPE_HEADS = 8;  // heads per block (ROPE_HEADS in src/backend/gpu/mod.rs)

// (rope_angle, the rotation factors of one pair: prelude.cuh, shared with qgemv.cu's qdot.)

// (cf0, sf0): pair threadIdx.x's factors, computed by the caller (before KILN_PDL_WAIT in
// rope_kv: the position and the frequencies are no predecessor's output).
template <typename T>
__device__ __forceinline__ void rope_impl(T* __restrict__ qkv, int stride, double pos,
                                          const float* __restrict__ inv_freq, int head_dim, int rot_dim,
                                          int interleaved, float mscale, int heads, float cf0, float sf0) {
    const int h0 = blockIdx.y * ROPE_HEADS, h1 = min(h0 + ROPE_HEADS, heads);
    T* row = qkv + (size_t)blockIdx.x * stride;
    const int half = rot_dim / 2;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const int a = interleaved ? 2 * i : i;
        const int b = interleaved ? 2 * i + 1 : i + half;
        // Every head's pair loaded before the first store: one memory latency per block.
        float x0[ROPE_HEADS], x1[ROPE_HEADS];
#pragma unroll
        for (int j = 0; j < ROPE_HEADS; ++j) {
            const T* x = row + (size_t)(h0 + j) * head_dim;
            x0[j] = h0 + j < h1 ? to_f(x[a]) : 0.f;
            x1[j] = h0 + j < h1 ? to_f(x[b]) : 0.f;
        }
        float cf = cf0, sf = sf0;
        if (i != (int)threadIdx.x) rope_angle(pos, inv_freq, i, mscale, cf, sf);
#pragma unroll
        for (int j = 0; j < ROPE_HEADS; ++j) {
            if (h0 + j < h1) {
                T* x = row + (size_t)(h0 + j) * head_dim;
                x[a] = from_f<T>(x0[j] * cf - x1[j] * sf);
                x[b] = from_f<T>(x0[j] * sf + x1[j] * cf);
            }
        }
    }
}

// The cache write of rope_kv: the block of a group with k heads copies their rotated k and
// their v into the paged cache at the row's slot (slot 0xffffffff: a padding row, nothing
// written). Called by every thread after its own stores to the row; slot: slots[row].
template <typename T>
__device__ __forceinline__ void rope_kv_copy(const T* __restrict__ qkv, int stride, int head_dim, int n_heads,
                                             int n_kv, u32 slot, T* __restrict__ k_cache,
                                             T* __restrict__ v_cache) {
    // The group's k heads: [k0, k1) of the n_kv.
    const int k0 = max((int)blockIdx.y * ROPE_HEADS, n_heads) - n_heads;
    const int k1 = min(((int)blockIdx.y + 1) * ROPE_HEADS, n_heads + n_kv) - n_heads;
    if (k0 >= k1 || slot == 0xffffffffu) return;
    __syncthreads();  // the heads' rotated values, written by other threads of the block
    const int width = n_kv * head_dim;
    const T* k = qkv + (size_t)blockIdx.x * stride + (size_t)n_heads * head_dim;
    const size_t dst = (size_t)slot * width;
    const int i0 = k0 * head_dim, i1 = k1 * head_dim;
    typedef typename Chunk<T>::Raw Raw;
    constexpr int E = Chunk<T>::E;
    // E is a power of two: OR-ed values are multiples of E (16) when each one is.
    const bool whole = (i0 | i1 | width) % E == 0 &&
                       ((size_t)(k + i0) | (size_t)(k_cache + dst + i0) | (size_t)(v_cache + dst + i0)) % 16 == 0;
    if (whole) {  // 16-byte chunks (the usual case: head sizes of whole chunks)
        for (int c = i0 / E + threadIdx.x; c < i1 / E; c += blockDim.x) {
            const Raw kc = reinterpret_cast<const Raw*>(k)[c];
            const Raw vc = reinterpret_cast<const Raw*>(k + width)[c];
            reinterpret_cast<Raw*>(k_cache + dst)[c] = kc;
            reinterpret_cast<Raw*>(v_cache + dst)[c] = vc;
        }
        return;
    }
    for (int i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
        k_cache[dst + i] = k[i];
        v_cache[dst + i] = k[width + i];
    }
}

// rope_kv: rope, then what write_kv (kv.cu) does, in one launch (rope_kv_copy).
template <typename T>
__device__ void rope_kv_impl(T* __restrict__ qkv, int stride, const u32* __restrict__ positions,
                             const float* __restrict__ inv_freq, int head_dim, int rot_dim, int interleaved,
                             float mscale, int n_heads, int n_kv, const u32* __restrict__ slots, T* __restrict__ k_cache,
                             T* __restrict__ v_cache) {
    KILN_PDL_TRIGGER();
    // The step's metadata and the frequencies are no predecessor's output: read (and the
    // first angle computed) while the kernel before drains.
    const double pos = (double)positions[blockIdx.x];
    const u32 slot = slots[blockIdx.x];
    float cf = 0.f, sf = 0.f;
    if ((int)threadIdx.x < rot_dim / 2) rope_angle(pos, inv_freq, threadIdx.x, mscale, cf, sf);
    KILN_PDL_WAIT();
    rope_impl<T>(qkv, stride, pos, inv_freq, head_dim, rot_dim, interleaved, mscale, n_heads + n_kv, cf, sf);
    rope_kv_copy<T>(qkv, stride, head_dim, n_heads, n_kv, slot, k_cache, v_cache);
}

// rope_kv_norm: Qwen3's and Gemma 3's per-head q/k RMSNorm (weights qw for the q heads, kw
// for the k heads: head_rms_norm's values in arch.cu, rounded to the dtype as its store
// would be), then rope_kv, in one launch. Thread i holds pair i of each of the group's heads
// in registers (the host launches at least rot_dim / 2 threads): the row and the weights in
// one round of loads, the block's sums of squares, then each rotated value stored to the row
// and, for a k head, to the cache by the thread that computed it (no second barrier, no
// re-read); the group's v heads are copied while the loads are in flight. The dims past
// rot_dim (a partial rope) count in the norm and are normalized only.
template <typename T>
__device__ void rope_kv_norm_impl(T* __restrict__ qkv, int stride, const u32* __restrict__ positions,
                                  const float* __restrict__ inv_freq, int head_dim, int rot_dim, int interleaved,
                                  float mscale, int n_heads, int n_kv, const u32* __restrict__ slots,
                                  T* __restrict__ k_cache, T* __restrict__ v_cache, const T* __restrict__ qw,
                                  const T* __restrict__ kw, float eps) {
    KILN_PDL_TRIGGER();
    __shared__ float part[ROPE_HEADS][MAX_WARPS];
    const int h0 = blockIdx.y * ROPE_HEADS, h1 = min(h0 + ROPE_HEADS, n_heads + n_kv);
    T* row = qkv + (size_t)blockIdx.x * stride;
    const int half = rot_dim / 2, i = threadIdx.x;
    const bool pair = i < half;
    const int a = interleaved ? 2 * i : i;
    const int b = interleaved ? 2 * i + 1 : i + half;
    float qa = 0.f, qb = 0.f, ka = 0.f, kb = 0.f;
    if (pair) {
        qa = to_f(qw[a]);
        qb = to_f(qw[b]);
        ka = to_f(kw[a]);
        kb = to_f(kw[b]);
    }
    // The weights, the angle and the slot are no predecessor's output: read (and computed)
    // while the kernel before drains.
    float cf = 0.f, sf = 0.f;
    if (pair) rope_angle((double)positions[blockIdx.x], inv_freq, i, mscale, cf, sf);
    const u32 slot = slots[blockIdx.x];
    KILN_PDL_WAIT();
    float x0[ROPE_HEADS], x1[ROPE_HEADS], ss[ROPE_HEADS];
#pragma unroll
    for (int j = 0; j < ROPE_HEADS; ++j) {
        const T* x = row + (size_t)(h0 + j) * head_dim;
        const bool own = pair && h0 + j < h1;
        x0[j] = own ? to_f(x[a]) : 0.f;
        x1[j] = own ? to_f(x[b]) : 0.f;
        ss[j] = x0[j] * x0[j] + x1[j] * x1[j];
    }
    for (int d = rot_dim + i; d < head_dim; d += blockDim.x) {
#pragma unroll
        for (int j = 0; j < ROPE_HEADS; ++j) {
            const float v = h0 + j < h1 ? to_f(row[(size_t)(h0 + j) * head_dim + d]) : 0.f;
            ss[j] += v * v;
        }
    }
    // The group's kv heads [k0, k1) (none, or a padding row's slot: nothing written).
    const int k0 = max(h0, n_heads) - n_heads, k1 = max(h1, n_heads) - n_heads;
    const bool cache = k0 < k1 && slot != 0xffffffffu;
    const int width = n_kv * head_dim;
    const size_t dst = (size_t)slot * width;
    if (cache) {  // v: copied as it is
        const T* v = row + (size_t)n_heads * head_dim + width;
        const int i0 = k0 * head_dim, i1 = k1 * head_dim;
        typedef typename Chunk<T>::Raw Raw;
        constexpr int E = Chunk<T>::E;
        if ((i0 | i1) % E == 0 && ((size_t)(v + i0) | (size_t)(v_cache + dst + i0)) % 16 == 0) {
            for (int c = i0 / E + i; c < i1 / E; c += blockDim.x) {
                reinterpret_cast<Raw*>(v_cache + dst)[c] = reinterpret_cast<const Raw*>(v)[c];
            }
        } else {
            for (int e = i0 + i; e < i1; e += blockDim.x) v_cache[dst + e] = v[e];
        }
    }
    const int w = threadIdx.x / WARP, nw = blockDim.x / WARP;
#pragma unroll
    for (int j = 0; j < ROPE_HEADS; ++j) {
        ss[j] = warp_sum(ss[j]);
        if (threadIdx.x % WARP == 0) part[j][w] = ss[j];
    }
    __syncthreads();
    float inv[ROPE_HEADS];
#pragma unroll
    for (int j = 0; j < ROPE_HEADS; ++j) {
        float t = 0.f;
        for (int k = 0; k < nw; ++k) t += part[j][k];
        inv[j] = 1.0f / sqrtf(t / (float)head_dim + eps);
    }
    if (pair) {
#pragma unroll
        for (int j = 0; j < ROPE_HEADS; ++j) {
            if (h0 + j < h1) {
                const bool q = h0 + j < n_heads;
                const float y0 = to_f(from_f<T>(x0[j] * inv[j] * (q ? qa : ka)));
                const float y1 = to_f(from_f<T>(x1[j] * inv[j] * (q ? qb : kb)));
                const T r0 = from_f<T>(y0 * cf - y1 * sf), r1 = from_f<T>(y0 * sf + y1 * cf);
                T* x = row + (size_t)(h0 + j) * head_dim;
                x[a] = r0;
                x[b] = r1;
                if (!q && cache) {
                    T* kc = k_cache + dst + (size_t)(h0 + j - n_heads) * head_dim;
                    kc[a] = r0;
                    kc[b] = r1;
                }
            }
        }
    }
    for (int d = rot_dim + i; d < head_dim; d += blockDim.x) {
        const float wq = to_f(qw[d]), wk = to_f(kw[d]);
#pragma unroll
        for (int j = 0; j < ROPE_HEADS; ++j) {
            if (h0 + j < h1) {
                const bool q = h0 + j < n_heads;
                T* x = row + (size_t)(h0 + j) * head_dim;
                const T r = from_f<T>(to_f(x[d]) * inv[j] * (q ? wq : wk));
                x[d] = r;
                if (!q && cache) k_cache[dst + (size_t)(h0 + j - n_heads) * head_dim + d] = r;
            }
        }
    }
}

#define KILN_ROPE(N, T)                                                                            \
    KILN_IN_PART(common,                                                                       \
    extern "C" __global__ void rope_##N(T* qkv, int stride, const u32* positions, const float* inv_freq, \
                                        int head_dim, int rot_dim, int interleaved, float mscale,  \
                                        int heads) {                                               \
        const double pos = (double)positions[blockIdx.x];                                          \
        float cf = 0.f, sf = 0.f;                                                                  \
        if ((int)threadIdx.x < rot_dim / 2) rope_angle(pos, inv_freq, threadIdx.x, mscale, cf, sf); \
        rope_impl<T>(qkv, stride, pos, inv_freq, head_dim, rot_dim, interleaved, mscale, heads, cf, sf); \
    }                                                                                              \
    extern "C" __global__ void rope_kv_##N(T* qkv, int stride, const u32* positions, const float* inv_freq, \
                                           int head_dim, int rot_dim, int interleaved, float mscale,  \
                                           int n_heads, int n_kv, const u32* slots, T* k_cache,       \
                                           T* v_cache) {                                              \
        rope_kv_impl<T>(qkv, stride, positions, inv_freq, head_dim, rot_dim, interleaved, mscale, n_heads, n_kv, \
                        slots, k_cache, v_cache);                                                  \
    })                                                                                              \
    KILN_IN_PART(qkn, extern "C" __global__ void rope_kv_norm_##N(                                 \
        T* qkv, int stride, const u32* positions, const float* inv_freq, int head_dim, int rot_dim, \
        int interleaved, float mscale, int n_heads, int n_kv, const u32* slots, T* k_cache,          \
        T* v_cache, const T* qw, const T* kw, float eps) {                                          \
        rope_kv_norm_impl<T>(qkv, stride, positions, inv_freq, head_dim, rot_dim, interleaved, mscale, n_heads, \
                             n_kv, slots, k_cache, v_cache, qw, kw, eps);                          \
    })
KILN_FOR_DTYPES(KILN_ROPE)
