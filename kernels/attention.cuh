// Shared by the attention sources (attention_prefill.cu, attention_tc.cu, attention_decode.cu).
// The host prepends it to each of them, after prelude.cuh, as text (NVRTC and hipRTC search
// no include path): the work items, the device helpers and attn_impl, the portable kernel
// (the prefill entry points, and the tensor-core entry's body where mma is absent).
//
// Paged varlen attention: ONE launch per layer for a whole mixed batch (prefill chunks and
// decode tokens), GQA, causal inside each sequence, online softmax.
//
// The host cuts the batch into work items (6 words each):
//   seq, row0, nrows, kv_begin, kv_end, part
// Grid = (items, n_kv_heads). A block takes the nrows * G query vectors of its item that
// share KV head blockIdx.y (G = n_heads / n_kv_heads) in passes of QV vectors, and streams
// the context positions [kv_begin, min(kv_end, last query pos + 1)) through its warps
// (with a sliding window, only the positions some vector of the pass sees: attn_window):
//
//   warp w takes positions c0 = kv_begin + w*WARP, + NW*WARP, ...; lane = one position:
//     s[i]   = cap(q_i . K[slot(pos)] * scale)   (-inf where pos > pos(q_i): causal, or
//              pos(q_i) - pos >= window: out of the window; cap(s) = softcap*tanh(s/softcap))
//     m, l   online max / sum per vector, acc[i][d] (lane owns d = lane*DPL + k)
//   then the NW warps' (m, l, acc) are merged in shared memory.
//   slot(pos) = table[pos / block_size] * block_size + pos % block_size
//
// part == NO_PART: the block writes out[row, h*D + d]. Otherwise (split-K, flash-decoding;
// decode items only) it writes unnormalized partials; attn_combine merges them, or (the
// decode variant, by default) the last part block of each split row and KV head does.
//
// sinks (gpt-oss; null: plain softmax): one logit per query head joining each row's softmax
// denominator and weighting no value, p_j = exp(s_j) / (exp(sink_h) + sum_i exp(s_i)). It
// joins once per row where the row is normalized (store_result, or the split-K merge), never
// in the loops over positions: a model without sinks runs the same loops.

constexpr int ATTN_WARPS = 4;
constexpr u32 NO_PART = 0xffffffffu;
constexpr float ATTN_LOG2E = 1.4426950408889634f;

// How a raw q . k product becomes a logit: `a * s` without a soft cap, `b * tanhf(a * s)` with
// one (a = scale / cap, b = cap; both times log2(e) for the kernels that work in base 2).
struct Logit {
    float a, b;
    bool capped;
    __device__ __forceinline__ Logit(float scale, float softcap, float unit) {
        capped = softcap > 0.f;
        a = capped ? scale / softcap : scale * unit;
        b = softcap * unit;
    }
    // The logit of a product already multiplied by `a` (a query pre-scaled by it).
    __device__ __forceinline__ float of_scaled(float s) const { return capped ? b * tanhf(s) : s; }
    __device__ __forceinline__ float operator()(float s) const { return of_scaled(a * s); }
};

// The window as a distance bound: position p is seen by a query at q when q - p < win.
__device__ __forceinline__ int attn_win(int window) { return window > 0 ? window : 0x7fffffff; }

// The first context position a pass must stream, given the item's [kv0, kv1) and the pass's
// smallest / largest query positions, rounded down to 16 (so the decode variant's aligned
// paths still apply; the few positions below the window are masked). A split-K part (decode
// rows only: its parts cut [0, pos + 1) of its single query position) is instead mapped
// proportionally onto the window, so the parts share the window's positions rather than
// most of them finding nothing to do; parts tile the window exactly since the map is
// monotonic with 0 -> lo and pos + 1 -> pos + 1. Returns the new kv0 and updates kv1.
__device__ __forceinline__ int attn_window(int kv0, int& kv1, u32 part, int minpos, int maxpos, int window) {
    if (window <= 0) return kv0;
    if (part == NO_PART) {
        const int lo = max(0, minpos + 1 - window) & ~15;
        return max(kv0, lo);
    }
    const int c = maxpos + 1;
    const int lo = max(0, c - window) & ~15;
    auto map = [&](int b) {
        return b >= c ? c : lo + (int)(((long long)b * (c - lo) / c) & ~15ll);
    };
    kv1 = map(kv1);
    return map(kv0);
}

// A finished row's value o / sum (o and sum relative to exp(mx_ln)), with head h's sink
// (gpt-oss; `sinks` non-null: one logit per query head, in the compute type) joining the
// denominator: o / (sum + exp(sink - mx_ln)), both exponents taken against max(mx_ln, sink)
// so neither overflows. Once per output element, outside every loop over positions.
template <typename T>
__device__ __forceinline__ float attn_norm(float o, float sum, float mx_ln, const T* __restrict__ sinks, int h) {
    if (sinks == nullptr) return sum > 0.f ? o / sum : 0.f;
    const float sk = to_f(sinks[h]);
    const float top = fmaxf(mx_ln, sk);
    const float f = mx_ln == -KILN_INF ? 0.f : expf(mx_ln - top);
    return o * f / (sum * f + expf(sk - top));
}

// One element of a query head's result: the normalized output (part == NO_PART; the sink,
// if any, joins here) or the split-K partial, with the head's (max in natural log, sum) pair
// written by d == 0 (the merge adds the sink once).
template <typename T>
__device__ __forceinline__ void store_result(T* __restrict__ out, float* __restrict__ part_acc,
                                             float* __restrict__ part_ml, u32 part, size_t row, int h, int d,
                                             int n_heads, int hd, float o, float sum, float mx_ln,
                                             const T* __restrict__ sinks) {
    if (part == NO_PART) {
        out[row * n_heads * hd + (size_t)h * hd + d] = from_f<T>(attn_norm<T>(o, sum, mx_ln, sinks, h));
    } else {
        part_acc[((size_t)part * n_heads + h) * hd + d] = o;
        if (d == 0) {
            part_ml[((size_t)part * n_heads + h) * 2] = mx_ln;
            part_ml[((size_t)part * n_heads + h) * 2 + 1] = sum;
        }
    }
}

// 8 consecutive elements as floats; p is 16-byte aligned.
__device__ __forceinline__ void load8(const float* p, float k[8]) {
    const vec4f a = *reinterpret_cast<const vec4f*>(p);
    const vec4f b = *reinterpret_cast<const vec4f*>(p + 4);
    k[0] = a.x; k[1] = a.y; k[2] = a.z; k[3] = a.w;
    k[4] = b.x; k[5] = b.y; k[6] = b.z; k[7] = b.w;
}
__device__ __forceinline__ void load8(const bf16* p, float k[8]) {
    const vec4u r = *reinterpret_cast<const vec4u*>(p);
    k[0] = __uint_as_float(r.x << 16); k[1] = __uint_as_float(r.x & 0xffff0000u);
    k[2] = __uint_as_float(r.y << 16); k[3] = __uint_as_float(r.y & 0xffff0000u);
    k[4] = __uint_as_float(r.z << 16); k[5] = __uint_as_float(r.z & 0xffff0000u);
    k[6] = __uint_as_float(r.w << 16); k[7] = __uint_as_float(r.w & 0xffff0000u);
}

// s[i] += q_s[i] . krow for the first nv vectors. D > 0: fixed head_dim (multiple of 8);
// the row is read 32 elements at a time with its four 16-byte loads in flight.
template <typename T, int D, int QV, int DMAX>
__device__ __forceinline__ void dot_rows(const T* __restrict__ kr, const float (*q_s)[DMAX], int hd, int nv, float s[QV]) {
    if (D > 0) {
        constexpr int CH = D % 32 == 0 ? 32 : 16;
#pragma unroll
        for (int d0 = 0; d0 < D; d0 += CH) {
            float k[CH];
#pragma unroll
            for (int c = 0; c < CH; c += 8) load8(kr + d0 + c, &k[c]);
#pragma unroll
            for (int i = 0; i < QV; ++i) {
                if (i < nv) {
                    float acc = 0.f;
#pragma unroll
                    for (int c = 0; c < CH; c += 4) {
                        const vec4f a = *reinterpret_cast<const vec4f*>(&q_s[i][d0 + c]);
                        acc += a.x * k[c] + a.y * k[c + 1] + a.z * k[c + 2] + a.w * k[c + 3];
                    }
                    s[i] += acc;
                }
            }
        }
    } else {
        for (int d = 0; d < hd; ++d) {
            const float k = to_f(kr[d]);
#pragma unroll
            for (int i = 0; i < QV; ++i) {
                if (i < nv) s[i] += q_s[i][d] * k;
            }
        }
    }
}

// The N = DPL consecutive elements at row[d0..] (a lane's share of a V row), zero past hd.
// Vector loads only for the fixed head sizes, whose rows are 16-byte aligned.
template <int N>
__device__ __forceinline__ void load_n(const float* p, float* v) {
    if (N == 8) {
        load8(p, v);
    } else if (N == 4) {
        const vec4f a = *reinterpret_cast<const vec4f*>(p);
        v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
    } else {
#pragma unroll
        for (int k = 0; k < N; ++k) v[k] = p[k];
    }
}
template <int N>
__device__ __forceinline__ void load_n(const bf16* p, float* v) {
    if (N == 8) {
        load8(p, v);
    } else if (N == 4) {
        const vec2u r = *reinterpret_cast<const vec2u*>(p);
        v[0] = __uint_as_float(r.x << 16); v[1] = __uint_as_float(r.x & 0xffff0000u);
        v[2] = __uint_as_float(r.y << 16); v[3] = __uint_as_float(r.y & 0xffff0000u);
    } else if (N == 2) {
        const u32 r = *reinterpret_cast<const u32*>(p);
        v[0] = __uint_as_float(r << 16); v[1] = __uint_as_float(r & 0xffff0000u);
    } else {
#pragma unroll
        for (int k = 0; k < N; ++k) v[k] = to_f(p[k]);
    }
}
template <typename T, int D, int DPL>
__device__ __forceinline__ void load_dims(const T* __restrict__ row, int d0, int hd, float v[DPL]) {
    if (D > 0 && d0 + DPL <= D) {
        load_n<DPL>(row + d0, v);
    } else {
#pragma unroll
        for (int k = 0; k < DPL; ++k) v[k] = d0 + k < hd ? to_f(row[d0 + k]) : 0.f;
    }
}

template <typename T, int D, int QV>
__device__ __forceinline__ void attn_impl(const T* __restrict__ qkv, int qkv_stride, const T* __restrict__ k_cache,
                          const T* __restrict__ v_cache, T* __restrict__ out, float* __restrict__ part_acc,
                          float* __restrict__ part_ml, const u32* __restrict__ positions,
                          const u32* __restrict__ seqinfo, const u32* __restrict__ tables,
                          const u32* __restrict__ items, int n_heads, int n_kv, int head_dim, int block_size,
                          float scale, int window, float softcap, const T* __restrict__ sinks) {
    constexpr int DMAX = D > 0 ? D : 256;
    constexpr int DPL = (DMAX + WARP - 1) / WARP;
    constexpr int NW = ATTN_WARPS;
    alignas(16) __shared__ float q_s[QV][DMAX];
    __shared__ float o_s[QV][DMAX];
    __shared__ float p_s[NW][QV][WARP];
    __shared__ int slot_s[NW][WARP];
    __shared__ float m_s[NW][QV], l_s[NW][QV];

    const int hd = D > 0 ? D : head_dim;
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const u32* it = items + 6 * (size_t)blockIdx.x;
    const int seq = it[0], row0 = it[1], nrows = it[2], item_kv0 = it[3], item_kv1 = it[4];
    const u32 part = it[5];
    const int kvh = blockIdx.y, G = n_heads / n_kv, width = n_kv * hd;
    const u32* table = tables + seqinfo[4 * seq + 3];
    const T* kbase = k_cache + (size_t)kvh * hd;
    const T* vbase = v_cache + (size_t)kvh * hd;
    const int nvec = nrows * G;
    const Logit logit(scale, softcap, 1.f);
    const int win = attn_win(window);

    for (int vb = 0; vb < nvec; vb += QV) {
        const int nv = min(QV, nvec - vb);
        for (int e = threadIdx.x; e < QV * hd; e += blockDim.x) {
            const int i = e / hd, d = e % hd;
            float val = 0.f;
            if (i < nv) {
                const int v = vb + i;
                val = to_f(qkv[(size_t)(row0 + v / G) * qkv_stride + (size_t)(kvh * G + v % G) * hd + d]);
            }
            q_s[i][d] = val;
        }
        int qpos[QV];
        int maxpos = -1, minpos = 0x7fffffff;
#pragma unroll
        for (int i = 0; i < QV; ++i) {
            qpos[i] = i < nv ? (int)positions[row0 + (vb + i) / G] : -1;
            maxpos = max(maxpos, qpos[i]);
            if (i < nv) minpos = min(minpos, qpos[i]);
        }
        int kv1 = item_kv1;
        const int kv0 = attn_window(item_kv0, kv1, part, minpos, maxpos, window);
        const int lim = min(kv1, maxpos + 1);
        float m[QV], l[QV], acc[QV][DPL];
#pragma unroll
        for (int i = 0; i < QV; ++i) {
            m[i] = -KILN_INF;
            l[i] = 0.f;
#pragma unroll
            for (int k = 0; k < DPL; ++k) acc[i][k] = 0.f;
        }
        __syncthreads();

        for (int c0 = kv0 + warp * WARP; c0 < lim; c0 += NW * WARP) {
            const int pos = c0 + lane;
            const bool valid = pos < lim;
            int slot = 0;
            if (valid) slot = (int)table[pos / block_size] * block_size + pos % block_size;
            slot_s[warp][lane] = slot;
            float s[QV];
#pragma unroll
            for (int i = 0; i < QV; ++i) s[i] = 0.f;
            if (valid) dot_rows<T, D, QV, DMAX>(kbase + (size_t)slot * width, q_s, hd, nv, s);
#pragma unroll
            for (int i = 0; i < QV; ++i) {
                if (i < nv) {
                    const float sc = (valid && pos <= qpos[i] && qpos[i] - pos < win) ? logit(s[i]) : -KILN_INF;
                    const float mn = fmaxf(m[i], warp_max(sc));
                    const float p = mn == -KILN_INF ? 0.f : expf(sc - mn);
                    const float corr = mn == -KILN_INF ? 1.f : expf(m[i] - mn);
                    l[i] = l[i] * corr + warp_sum(p);
                    m[i] = mn;
#pragma unroll
                    for (int k = 0; k < DPL; ++k) acc[i][k] *= corr;
                    p_s[warp][i][lane] = p;
                }
            }
            sync_warp();
            const int nj = min(WARP, lim - c0);
            constexpr int PF = 8;
            for (int j0 = 0; j0 < nj; j0 += PF) {
                float vv[PF][DPL];
#pragma unroll
                for (int u = 0; u < PF; ++u) {
                    if (j0 + u < nj) {
                        load_dims<T, D, DPL>(vbase + (size_t)slot_s[warp][j0 + u] * width, lane * DPL, hd, vv[u]);
                    } else {
#pragma unroll
                        for (int k = 0; k < DPL; ++k) vv[u][k] = 0.f;
                    }
                }
#pragma unroll
                for (int u = 0; u < PF; ++u) {
#pragma unroll
                    for (int i = 0; i < QV; ++i) {
                        if (i < nv) {
                            const float p = j0 + u < nj ? p_s[warp][i][j0 + u] : 0.f;
#pragma unroll
                            for (int k = 0; k < DPL; ++k) acc[i][k] += p * vv[u][k];
                        }
                    }
                }
            }
            sync_warp();
        }

        // Merge the warps: rescale each warp's partial to the common max, sum in warp order.
        if (lane == 0) {
#pragma unroll
            for (int i = 0; i < QV; ++i) {
                m_s[warp][i] = m[i];
                l_s[warp][i] = l[i];
            }
        }
        __syncthreads();
        float f[QV];
#pragma unroll
        for (int i = 0; i < QV; ++i) {
            float mx = -KILN_INF;
            for (int w = 0; w < NW; ++w) mx = fmaxf(mx, m_s[w][i]);
            f[i] = m[i] == -KILN_INF ? 0.f : expf(m[i] - mx);
        }
        for (int w = 0; w < NW; ++w) {
            if (warp == w) {
#pragma unroll
                for (int i = 0; i < QV; ++i) {
#pragma unroll
                    for (int k = 0; k < DPL; ++k) {
                        const int d = lane * DPL + k;
                        if (d < hd) o_s[i][d] = (w == 0 ? 0.f : o_s[i][d]) + acc[i][k] * f[i];
                    }
                }
            }
            __syncthreads();
        }
        for (int e = threadIdx.x; e < nv * hd; e += blockDim.x) {
            const int i = e / hd, d = e % hd;
            float mx = -KILN_INF, sum = 0.f;
            for (int w = 0; w < NW; ++w) mx = fmaxf(mx, m_s[w][i]);
            for (int w = 0; w < NW; ++w) sum += m_s[w][i] == -KILN_INF ? 0.f : l_s[w][i] * expf(m_s[w][i] - mx);
            const int v = vb + i, h = kvh * G + v % G;
            store_result<T>(out, part_acc, part_ml, part, (size_t)(row0 + v / G), h, d, n_heads, hd, o_s[i][d], sum,
                             mx, sinks);
        }
        __syncthreads();
    }
}

#define KILN_ATTN_PASS_ARGS                                                                             \
    qkv, qkv_stride, k_cache, v_cache, out, part_acc, part_ml, positions, seqinfo, tables, items, n_heads, \
        n_kv, head_dim, block_size, scale, window, softcap, sinks
