// Paged varlen attention: ONE launch per layer for a whole mixed batch (prefill chunks and
// decode tokens), GQA, causal inside each sequence, online softmax.
//
// The host cuts the batch into work items (6 words each):
//   seq, row0, nrows, kv_begin, kv_end, part
// Grid = (items, n_kv_heads). A block takes the nrows * G query vectors of its item that
// share KV head blockIdx.y (G = n_heads / n_kv_heads) in passes of QV vectors, and streams
// the context positions [kv_begin, min(kv_end, last query pos + 1)) through its warps:
//
//   warp w takes positions c0 = kv_begin + w*WARP, + NW*WARP, ...; lane = one position:
//     s[i]   = q_i . K[slot(pos)] * scale   (-inf where pos > pos(q_i): causal)
//     m, l   online max / sum per vector, acc[i][d] (lane owns d = lane*DPL + k)
//   then the NW warps' (m, l, acc) are merged in shared memory.
//   slot(pos) = table[pos / block_size] * block_size + pos % block_size
//
// part == NO_PART: the block writes out[row, h*D + d]. Otherwise (split-K, flash-decoding;
// decode items only) it writes unnormalized partials; attn_combine merges them.

constexpr int ATTN_WARPS = 4;
constexpr u32 NO_PART = 0xffffffffu;

// One element of a query head's result: the normalized output (part == NO_PART) or the
// split-K partial, with the head's (max in natural log, sum) pair written by d == 0.
template <typename T>
__device__ __forceinline__ void store_result(T* __restrict__ out, float* __restrict__ part_acc,
                                             float* __restrict__ part_ml, u32 part, size_t row, int h, int d,
                                             int n_heads, int hd, float o, float sum, float mx_ln) {
    if (part == NO_PART) {
        out[row * n_heads * hd + (size_t)h * hd + d] = from_f<T>(sum > 0.f ? o / sum : 0.f);
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
                          float scale) {
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
    const int seq = it[0], row0 = it[1], nrows = it[2], kv0 = it[3], kv1 = it[4];
    const u32 part = it[5];
    const int kvh = blockIdx.y, G = n_heads / n_kv, width = n_kv * hd;
    const u32* table = tables + seqinfo[4 * seq + 3];
    const T* kbase = k_cache + (size_t)kvh * hd;
    const T* vbase = v_cache + (size_t)kvh * hd;
    const int nvec = nrows * G;

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
        int maxpos = -1;
#pragma unroll
        for (int i = 0; i < QV; ++i) {
            qpos[i] = i < nv ? (int)positions[row0 + (vb + i) / G] : -1;
            maxpos = max(maxpos, qpos[i]);
        }
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
                    const float sc = (valid && pos <= qpos[i]) ? s[i] * scale : -KILN_INF;
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
                             mx);
        }
        __syncthreads();
    }
}

#define KILN_ATTN_PASS_ARGS                                                                             \
    qkv, qkv_stride, k_cache, v_cache, out, part_acc, part_ml, positions, seqinfo, tables, items, n_heads, \
        n_kv, head_dim, block_size, scale

// ---------------------------------------------------------------------------------------------
// Tensor-core variant (NVIDIA sm_80+, bf16; flash-attention-2 style) for items with many query
// vectors. Same items, grid and block as attn_impl. A pass takes up to 64 query vectors of
// the item (T = ceil(nv / 16) m16 tiles); warp w owns tile w / S and column split w % S of
// every K/V tile (S = 4 / T warps per tile: 4, 2, 1; with T = 3 the fourth warp only loads):
//
//   K/V tile: TC_BN positions -> k_s[pos][d], v_s[pos][d] (row-major, 16-byte stores),
//             zero past the causal limit, loaded by the whole block
//   warp:     S_ = Q(16 x D) . K_s[cols]^T          mma m16n8k16, B = K rows (k = d)
//             online softmax in the log2 domain (rows g, g+8 of the thread's group)
//             O += P(16 x cols) . V_s[cols]         mma m16n8k16, B = V through ldmatrix.trans
//   end:      the S splits of a tile merged in shared memory, rows written (or partials)
//
// Fragments of mma.m16n8k16 (g = lane / 4, c = lane % 4), two bf16 per register, low first:
//   A: a0 (g, 2c..2c+1)  a1 (g+8, 2c..)  a2 (g, 2c+8..)  a3 (g+8, 2c+8..)
//   B: b0 (k 2c..2c+1, n g)  b1 (k 2c+8..2c+9, n g)
//   C: c0 c1 (g, 2c..2c+1)  c2 c3 (g+8, 2c..2c+1)
// The accumulator of n-tiles 2j, 2j+1 is, packed to bf16, the A fragment of k-step j.

constexpr int TC_BN = 64;

#if defined(KILN_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define KILN_MMA 1

__device__ __forceinline__ void mma_bf16(float c[4], const u32 a[4], u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four 8x8 b16 matrices from shared memory, transposed: lanes 8i..8i+7 give the row
// addresses of matrix i (16-byte aligned); register i holds, for this lane, column g of
// matrix i at rows 2c and 2c + 1 - the B fragment half (k = rows) of mma.m16n8k16.
__device__ __forceinline__ void ldmatrix_x4_trans(u32 r[4], const void* row) {
    u32 a;
    asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(row));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

// (lo, hi) rounded to nearest even, packed: lo in the low half.
__device__ __forceinline__ u32 pack_bf16(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

template <int D>
__device__ __forceinline__ void attn_tc_impl(const bf16* __restrict__ qkv, int qkv_stride, const bf16* __restrict__ k_cache,
                             const bf16* __restrict__ v_cache, bf16* __restrict__ out, float* __restrict__ part_acc,
                             float* __restrict__ part_ml, const u32* __restrict__ positions,
                             const u32* __restrict__ seqinfo, const u32* __restrict__ tables,
                             const u32* __restrict__ items, int n_heads, int n_kv, int block_size, float scale) {
    static_assert(D % 16 == 0 && D <= 128, "tensor-core attention: head size");
    constexpr int NW = ATTN_WARPS;
    constexpr int KS = D + 8;                    // k_s row stride (bf16)
    constexpr int OS = D + 8;                    // o_s row stride (f32)
    constexpr int KV_BYTES = 2 * TC_BN * KS * 2;
    static_assert((D / 8) % 2 == 0, "tensor-core attention: O n-tiles in pairs");
    constexpr int O_BYTES = NW * 16 * OS * 4;
    constexpr int SMEM = KV_BYTES > O_BYTES ? KV_BYTES : O_BYTES;
    constexpr int NK = D / 16;                   // k-steps of Q . K^T
    constexpr int ND = D / 8;                    // n-tiles of O
    alignas(16) __shared__ unsigned char smem[SMEM];
    __shared__ float m_s[NW][16], l_s[NW][16];
    u16* k_s = reinterpret_cast<u16*>(smem);     // [TC_BN][KS]
    u16* v_s = k_s + TC_BN * KS;                 // [TC_BN][KS]
    float* o_s = reinterpret_cast<float*>(smem); // [NW][16][OS], after the last tile

    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int g = lane / 4, c = lane % 4;
    const u32* it = items + 6 * (size_t)blockIdx.x;
    const int seq = it[0], row0 = it[1], nrows = it[2], kv0 = it[3], kv1 = it[4];
    const u32 part = it[5];
    const int kvh = blockIdx.y, G = n_heads / n_kv, width = n_kv * D;
    const u32* table = tables + seqinfo[4 * seq + 3];
    const bf16* kbase = k_cache + (size_t)kvh * D;
    const bf16* vbase = v_cache + (size_t)kvh * D;
    const int nvec = nrows * G;
    const float sl2 = scale * 1.4426950408889634f;  // scores in the log2 domain
    // The loader's position in a tile (fixed per thread) and its first 8-element chunk.
    const int lp = threadIdx.x % TC_BN, lc0 = threadIdx.x / TC_BN;
    constexpr int LSTEP = NW * 32 / TC_BN;

    for (int vb = 0; vb < nvec; vb += 64) {
        const int nv = min(64, nvec - vb);
        const int T = (nv + 15) / 16;
        const int S = T == 1 ? 4 : T == 2 ? 2 : 1;
        const int tile = warp / S, split = warp % S;
        const bool active = tile < T;
        const int cw = TC_BN / S;                // columns of a K/V tile this warp takes
        const int col0 = split * cw;

        // Q fragments and positions of rows g, g+8 of the warp's tile (zero / -1 past nv).
        u32 qf[NK][4];
        int qpos[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int i = tile * 16 + g + 8 * h;
            const bool ok = active && i < nv;
            const int v = vb + i;
            qpos[h] = ok ? (int)positions[row0 + v / G] : -1;
            const bf16* q = qkv + (ok ? (size_t)(row0 + v / G) * qkv_stride + (size_t)(kvh * G + v % G) * D : 0);
#pragma unroll
            for (int kk = 0; kk < NK; ++kk) {
                qf[kk][h] = ok ? *reinterpret_cast<const u32*>(q + kk * 16 + 2 * c) : 0u;
                qf[kk][h + 2] = ok ? *reinterpret_cast<const u32*>(q + kk * 16 + 2 * c + 8) : 0u;
            }
        }
        int maxpos = -1;
        for (int i = 0; i < nv; i += G) maxpos = max(maxpos, (int)positions[row0 + (vb + i) / G]);
        maxpos = max(maxpos, (int)positions[row0 + (vb + nv - 1) / G]);
        const int lim = min(kv1, maxpos + 1);

        float o[ND][4];
#pragma unroll
        for (int j = 0; j < ND; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
        float m[2] = {-KILN_INF, -KILN_INF}, l[2] = {0.f, 0.f};

        for (int c0 = kv0; c0 < lim; c0 += TC_BN) {
            __syncthreads();  // the previous tile (or pass) is consumed
            {
                const int pos = c0 + lp;
                const bool ok = pos < lim;
                const size_t slot = ok ? (size_t)table[pos / block_size] * block_size + pos % block_size : 0;
                const vec4u* kr = reinterpret_cast<const vec4u*>(kbase + slot * width);
                const vec4u* vr = reinterpret_cast<const vec4u*>(vbase + slot * width);
                // Past the limit: slot 0 is read (any block is valid memory) and zeroed.
                const u32 keep = ok ? 0xffffffffu : 0u;
                vec4u x[ND / LSTEP];
#pragma unroll
                for (int i = 0; i < ND / LSTEP; ++i) x[i] = kr[lc0 + i * LSTEP];
#pragma unroll
                for (int i = 0; i < ND / LSTEP; ++i) {
                    const vec4u k = {x[i].x & keep, x[i].y & keep, x[i].z & keep, x[i].w & keep};
                    *reinterpret_cast<vec4u*>(&k_s[lp * KS + (lc0 + i * LSTEP) * 8]) = k;
                }
#pragma unroll
                for (int i = 0; i < ND / LSTEP; ++i) x[i] = vr[lc0 + i * LSTEP];
#pragma unroll
                for (int i = 0; i < ND / LSTEP; ++i) {
                    const vec4u v = {x[i].x & keep, x[i].y & keep, x[i].z & keep, x[i].w & keep};
                    *reinterpret_cast<vec4u*>(&v_s[lp * KS + (lc0 + i * LSTEP) * 8]) = v;
                }
            }
            __syncthreads();
            if (!active || c0 + col0 >= lim) continue;

            // S_ = Q . K^T over this warp's cw columns (cw / 8 n-tiles, at most 8).
            float sc[8][4];
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.f;
                if (j * 8 < cw) {
                    const u16* kr = k_s + (col0 + j * 8 + g) * KS + 2 * c;
#pragma unroll
                    for (int kk = 0; kk < NK; ++kk) {
                        const u32 b0 = *reinterpret_cast<const u32*>(kr + kk * 16);
                        const u32 b1 = *reinterpret_cast<const u32*>(kr + kk * 16 + 8);
                        mma_bf16(sc[j], qf[kk], b0, b1);
                    }
                }
            }
            // Causal mask, scale, running max of rows g (h = 0) and g + 8 (h = 1).
            float mx[2] = {-KILN_INF, -KILN_INF};
#pragma unroll
            for (int j = 0; j < 8; ++j) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int h = e / 2, pos = c0 + col0 + j * 8 + 2 * c + (e & 1);
                    const bool ok = j * 8 < cw && pos < lim && pos <= qpos[h];
                    sc[j][e] = ok ? sc[j][e] * sl2 : -KILN_INF;
                    mx[h] = fmaxf(mx[h], sc[j][e]);
                }
            }
            // Lazy rescaling as in the decode variant: the reference max of a row moves
            // (O and l rescaled) only when a score passes it by more than 2^8.
            float corr[2] = {1.f, 1.f}, ref[2];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                mx[h] = fmaxf(mx[h], shfl_xor(mx[h], 1));
                mx[h] = fmaxf(mx[h], shfl_xor(mx[h], 2));
                if (mx[h] > m[h] + 8.f) {
                    corr[h] = exp2f(m[h] - mx[h]);
                    m[h] = mx[h];
                    l[h] *= corr[h];
                }
                ref[h] = m[h] == -KILN_INF ? 0.f : m[h];
            }
            if (corr[0] != 1.f || corr[1] != 1.f) {
#pragma unroll
                for (int j = 0; j < ND; ++j) {
                    o[j][0] *= corr[0];
                    o[j][1] *= corr[0];
                    o[j][2] *= corr[1];
                    o[j][3] *= corr[1];
                }
            }
#pragma unroll
            for (int j = 0; j < 8; ++j) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    sc[j][e] = exp2f(sc[j][e] - ref[e / 2]);
                    l[e / 2] += sc[j][e];
                }
            }
            // O += P . V, one k-step per 16 columns.
#pragma unroll
            for (int ks = 0; ks < 4; ++ks) {
                if (ks * 16 < cw) {
                    const u32 a[4] = {pack_bf16(sc[2 * ks][0], sc[2 * ks][1]), pack_bf16(sc[2 * ks][2], sc[2 * ks][3]),
                                      pack_bf16(sc[2 * ks + 1][0], sc[2 * ks + 1][1]),
                                      pack_bf16(sc[2 * ks + 1][2], sc[2 * ks + 1][3])};
                    // Lane L addresses row L % 8 of matrix L / 8: positions +0..7 / +8..15
                    // (b0 / b1) of n-tiles 2jj / 2jj + 1.
                    const u16* vr = v_s + (col0 + ks * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * KS + (lane >> 4) * 8;
#pragma unroll
                    for (int jj = 0; jj < ND / 2; ++jj) {
                        u32 b[4];
                        ldmatrix_x4_trans(b, vr + jj * 16);
                        mma_bf16(o[2 * jj], a, b[0], b[1]);
                        mma_bf16(o[2 * jj + 1], a, b[2], b[3]);
                    }
                }
            }
        }

        // Merge: each warp leaves (m, l, O) of its 16 rows; the block combines the S splits.
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            l[h] += shfl_xor(l[h], 1);
            l[h] += shfl_xor(l[h], 2);
        }
        __syncthreads();  // the K/V tiles are consumed: o_s reuses their memory
        if (c == 0) {
            m_s[warp][g] = m[0];
            m_s[warp][g + 8] = m[1];
            l_s[warp][g] = l[0];
            l_s[warp][g + 8] = l[1];
        }
        float* ow = o_s + warp * 16 * OS;
#pragma unroll
        for (int j = 0; j < ND; ++j) {
            ow[g * OS + j * 8 + 2 * c] = o[j][0];
            ow[g * OS + j * 8 + 2 * c + 1] = o[j][1];
            ow[(g + 8) * OS + j * 8 + 2 * c] = o[j][2];
            ow[(g + 8) * OS + j * 8 + 2 * c + 1] = o[j][3];
        }
        __syncthreads();
        for (int e = threadIdx.x; e < nv * D; e += blockDim.x) {
            const int i = e / D, d = e % D, t = i / 16, r = i % 16;
            float mxs = -KILN_INF;
            for (int s = 0; s < S; ++s) mxs = fmaxf(mxs, m_s[t * S + s][r]);
            float sum = 0.f, acc = 0.f;
            for (int s = 0; s < S; ++s) {
                const float ms = m_s[t * S + s][r];
                const float f = ms == -KILN_INF ? 0.f : exp2f(ms - mxs);
                sum += l_s[t * S + s][r] * f;
                acc += o_s[((t * S + s) * 16 + r) * OS + d] * f;
            }
            const int v = vb + i, h = kvh * G + v % G;
            store_result<bf16>(out, part_acc, part_ml, part, (size_t)(row0 + v / G), h, d, n_heads, D, acc, sum,
                             mxs * 0.6931471805599453f);
        }
    }
}
#endif

// The tensor-core entry's body: the mma kernel for bf16 where the target has it, else the
// portable kernel at its largest pass (same items, grid and block).
template <int D>
__device__ __forceinline__ void attn_tc_body(const float* qkv, int qkv_stride, const float* k_cache,
                                             const float* v_cache, float* out, float* part_acc, float* part_ml,
                                             const u32* positions, const u32* seqinfo, const u32* tables,
                                             const u32* items, int n_heads, int n_kv, int head_dim, int block_size,
                                             float scale) {
    attn_impl<float, D, 8>(KILN_ATTN_PASS_ARGS);
}
template <int D>
__device__ __forceinline__ void attn_tc_body(const bf16* qkv, int qkv_stride, const bf16* k_cache,
                                             const bf16* v_cache, bf16* out, float* part_acc, float* part_ml,
                                             const u32* positions, const u32* seqinfo, const u32* tables,
                                             const u32* items, int n_heads, int n_kv, int head_dim, int block_size,
                                             float scale) {
#if defined(KILN_MMA)
    attn_tc_impl<D>(qkv, qkv_stride, k_cache, v_cache, out, part_acc, part_ml, positions, seqinfo, tables, items,
                    n_heads, n_kv, block_size, scale);
#else
    attn_impl<bf16, D, 8>(KILN_ATTN_PASS_ARGS);
#endif
}

// Asynchronous 16-byte global -> shared copies (NVIDIA sm_80+): the decode variant stages
// K/V in shared memory a few steps ahead without holding them in registers. `ok == false`
// fills zeros (source size 0). Each thread copies and later reads only its own slots, so
// waiting on its own groups is all the ordering needed.
#if defined(KILN_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define KILN_CP_ASYNC 1
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool ok) {
    u32 s;
    asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(s) : "l"(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(src), "r"(ok ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }
#endif

// ---------------------------------------------------------------------------------------------
// Decode variant (vLLM paged-attention style) for items of at most QV query vectors (decode
// rows: nrows * G <= 8). Same items and block as attn_impl, grid transposed (KV head, item);
// head sizes whose rows are a power of two of 16-byte chunks (64, 128, 256).
//
// A thread group of TPR lanes reads one K (and V) row together, lane t taking 16-byte chunks
// t, t + TPR, ... (CPL chunks): the warp reads WARP / TPR whole rows per load, coalesced.
// Each group is an independent online-softmax stream over U consecutive positions per
// step, K and V of all U positions loaded before first use (U * CPL * 2 loads in flight per
// lane), all QV query vectors (held in registers, pre-scaled, log2 domain) reusing every
// load. A score is the group's xor-shuffle sum, so every lane of the group holds it and
// accumulates its own dims of P . V with no shared memory. At the end the streams of a warp
// merge through shuffles, the warps through shared memory.

template <typename T, int D, int QV>
__device__ __forceinline__ void attn_dec_impl(const T* __restrict__ qkv, int qkv_stride, const T* __restrict__ k_cache,
                              const T* __restrict__ v_cache, T* __restrict__ out, float* __restrict__ part_acc,
                              float* __restrict__ part_ml, const u32* __restrict__ positions,
                              const u32* __restrict__ seqinfo, const u32* __restrict__ tables,
                              const u32* __restrict__ items, int n_heads, int n_kv, int block_size, float scale) {
    typedef Chunk<T> C;
    typedef typename C::Raw Raw;
    constexpr int E = C::E;
    constexpr int NCH = D / E;                        // 16-byte chunks per row
    constexpr int TPR = NCH < 16 ? NCH : 16;          // lanes per row (thread group)
    constexpr int CPL = NCH / TPR;                    // chunks per lane
    constexpr int RPW = WARP / TPR;                   // rows (streams) per warp
    constexpr int NW = ATTN_WARPS;
    constexpr int S = NW * RPW;                       // streams per block
    constexpr int U = QV * CPL <= 4 ? 4 : 2;          // positions per stream and step
    static_assert(NCH % TPR == 0 && WARP % TPR == 0, "decode attention: head size");
    // Stages of K/V staged ahead in shared memory (cp.async), each thread's U x 2 x CPL
    // chunks per stage in its own slots; 0 loads straight into registers (AMD, pre-sm_80,
    // and shapes whose stages would not fit). The merge buffers reuse the same memory.
    constexpr int NT = NW * WARP;
    constexpr int STAGE = U * 2 * CPL;                // chunks per thread and stage
    constexpr int MERGE_BYTES = NW * QV * (D + 2) * 4;
#if defined(KILN_CP_ASYNC)
    constexpr int SMEM_MAX = 48 * 1024;               // static shared memory per block
    constexpr int NST = 3 * STAGE * NT * 16 <= SMEM_MAX ? 3 : 2 * STAGE * NT * 16 <= SMEM_MAX ? 2 : 0;
#else
    constexpr int NST = 0;
#endif
    constexpr int STAGE_BYTES = NST * STAGE * NT * 16;
    constexpr int SMEM_BYTES = STAGE_BYTES > MERGE_BYTES ? STAGE_BYTES : MERGE_BYTES;
    __shared__ __align__(16) unsigned char smem[SMEM_BYTES];
    float(*o_s)[QV][D] = reinterpret_cast<float(*)[QV][D]>(smem);
    float(*m_s)[QV] = reinterpret_cast<float(*)[QV]>(smem + NW * QV * D * 4);
    float(*l_s)[QV] = reinterpret_cast<float(*)[QV]>(smem + NW * QV * (D + 1) * 4);
    Raw* stage_s = reinterpret_cast<Raw*>(smem);      // [NST][STAGE][NT]

    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int t = lane % TPR, stream = warp * RPW + lane / TPR;
    // Grid (KV head, item), heads fastest: the blocks of one row's heads run together and
    // read the same cache slots (each slot row holds every head) at about the same time.
    const u32* it = items + 6 * (size_t)blockIdx.y;
    const int seq = it[0], row0 = it[1], nrows = it[2], kv0 = it[3], kv1 = it[4];
    const u32 part = it[5];
    const int kvh = blockIdx.x, G = n_heads / n_kv, width = n_kv * D;
    const u32* table = tables + seqinfo[4 * seq + 3];
    const T* kbase = k_cache + (size_t)kvh * D;
    const T* vbase = v_cache + (size_t)kvh * D;
    const int nvec = nrows * G;
    const float sl2 = scale * 1.4426950408889634f;

    for (int vb = 0; vb < nvec; vb += QV) {
        const int nv = min(QV, nvec - vb);
        float q[QV][CPL][E];
        int qpos[QV];
        int maxpos = -1;
#pragma unroll
        for (int i = 0; i < QV; ++i) {
            const int v = vb + i;
            qpos[i] = i < nv ? (int)positions[row0 + v / G] : -1;
            maxpos = max(maxpos, qpos[i]);
            const T* qr = qkv + (i < nv ? (size_t)(row0 + v / G) * qkv_stride + (size_t)(kvh * G + v % G) * D : 0);
#pragma unroll
            for (int c = 0; c < CPL; ++c) {
                const Raw r = i < nv ? reinterpret_cast<const Raw*>(qr)[t + c * TPR] : C::zero();
                C::unpack(r, q[i][c]);
#pragma unroll
                for (int e = 0; e < E; ++e) q[i][c][e] *= sl2;
            }
        }
        const int lim = min(kv1, maxpos + 1);
        // The smallest query position of the pass: steps wholly below it need no mask
        // (vectors past nv have q = 0 and are never stored).
        int minpos = maxpos;
#pragma unroll
        for (int i = 0; i < QV; ++i)
            if (i < nv) minpos = min(minpos, qpos[i]);
        float m[QV], l[QV], acc[QV][CPL][E];
#pragma unroll
        for (int i = 0; i < QV; ++i) {
            m[i] = -KILN_INF;
            l[i] = 0.f;
#pragma unroll
            for (int c = 0; c < CPL; ++c)
#pragma unroll
                for (int e = 0; e < E; ++e) acc[i][c][e] = 0.f;
        }

        // The U positions of a stream share one block-table entry when blocks and the item's
        // start are multiples of U (the usual case): that entry is loaded one step ahead so
        // the K/V loads do not wait on it. Otherwise each position looks its entry up.
        const bool one = block_size % U == 0 && kv0 % U == 0;
        // When a step (S * U positions) is also a whole number of blocks, a stream's offset
        // inside its block is the same at every step and its table index advances by a
        // constant: no division per step (the loop is issue-bound at short contexts).
        const bool fast = one && (S * U) % block_size == 0;
        const int first = kv0 + stream * U;
        int tidx = first / block_size;
        const int off0 = first - tidx * block_size, tstep = (S * U) / block_size;
        u32 blk = 0;
        if (one && first < lim) blk = table[tidx];
        // The chunks of step position p0's U positions: K/V addresses (ok: inside the item).
        // Advances `blk` to the entry of the stream's next step.
        auto addresses = [&](int p0, const Raw* kp[U], const Raw* vp[U], bool ok[U]) {
            if (fast) {
                const size_t slot0 = (size_t)blk * block_size + off0;
                const Raw* k0 = reinterpret_cast<const Raw*>(kbase + slot0 * width) + t;
                const Raw* v0 = reinterpret_cast<const Raw*>(vbase + slot0 * width) + t;
                const int row = width / E;  // chunks per cache slot
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    ok[u] = p0 + u < lim;
                    kp[u] = k0 + u * row;
                    vp[u] = v0 + u * row;
                }
                tidx += tstep;
                if (p0 + S * U < lim) blk = table[tidx];
                return;
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int pos = p0 + u;
                ok[u] = pos < lim;
                const u32 b = ok[u] ? (one ? blk : table[pos / block_size]) : 0u;
                const size_t slot = ok[u] ? (size_t)b * block_size + pos % block_size : 0;
                kp[u] = reinterpret_cast<const Raw*>(kbase + slot * width) + t;
                vp[u] = reinterpret_cast<const Raw*>(vbase + slot * width) + t;
            }
            if (one && p0 + S * U < lim) blk = table[(p0 + S * U) / block_size];
        };
        // Stage ahead: issue the copies of step j (group j), NST - 1 steps before its use.
        auto issue = [&](int j) {
#if defined(KILN_CP_ASYNC)
            const int c0 = kv0 + j * S * U;
            if (c0 < lim) {
                const Raw* kp[U];
                const Raw* vp[U];
                bool ok[U];
                addresses(c0 + stream * U, kp, vp, ok);
                Raw* dst = stage_s + (size_t)(j % (NST > 0 ? NST : 1)) * STAGE * NT + threadIdx.x;
#pragma unroll
                for (int u = 0; u < U; ++u)
#pragma unroll
                    for (int c = 0; c < CPL; ++c) {
                        cp_async16(dst + ((u * 2) * CPL + c) * NT, kp[u] + c * TPR, ok[u]);
                        cp_async16(dst + ((u * 2 + 1) * CPL + c) * NT, vp[u] + c * TPR, ok[u]);
                    }
            }
            cp_async_commit();
#else
            (void)j;
#endif
        };
        if constexpr (NST > 0) {
#pragma unroll
            for (int j = 0; j < NST - 1; ++j) issue(j);
        }
        for (int c0 = kv0, j = 0; c0 < lim; c0 += S * U, ++j) {
            const int p0 = c0 + stream * U;
            Raw kr[U][CPL], vr[U][CPL];
            if constexpr (NST > 0) {
                issue(j + NST - 1);
#if defined(KILN_CP_ASYNC)
                cp_async_wait<NST - 1>();
#endif
                const Raw* src = stage_s + (size_t)(j % (NST > 0 ? NST : 1)) * STAGE * NT + threadIdx.x;
#pragma unroll
                for (int u = 0; u < U; ++u)
#pragma unroll
                    for (int c = 0; c < CPL; ++c) {
                        kr[u][c] = src[((u * 2) * CPL + c) * NT];
                        vr[u][c] = src[((u * 2 + 1) * CPL + c) * NT];
                    }
            } else {
                const Raw* kp[U];
                const Raw* vp[U];
                bool ok[U];
                addresses(p0, kp, vp, ok);
#pragma unroll
                for (int u = 0; u < U; ++u)
#pragma unroll
                    for (int c = 0; c < CPL; ++c) {
                        kr[u][c] = ok[u] ? kp[u][c * TPR] : C::zero();
                        vr[u][c] = ok[u] ? vp[u][c * TPR] : C::zero();
                    }
            }
            // Scores of the U positions for every vector (log2 domain).
            float s[U][QV];
#pragma unroll
            for (int u = 0; u < U; ++u) {
#pragma unroll
                for (int i = 0; i < QV; ++i) s[u][i] = 0.f;
#pragma unroll
                for (int c = 0; c < CPL; ++c) {
                    float k[E];
                    C::unpack(kr[u][c], k);
#pragma unroll
                    for (int i = 0; i < QV; ++i) {
#pragma unroll
                        for (int e = 0; e < E; ++e) s[u][i] += q[i][c][e] * k[e];
                    }
                }
            }
#pragma unroll
            for (int o = 1; o < TPR; o <<= 1) {
#pragma unroll
                for (int u = 0; u < U; ++u)
#pragma unroll
                    for (int i = 0; i < QV; ++i) s[u][i] += shfl_xor(s[u][i], o);
            }
            // Masks only where the step reaches past a limit (the last steps of an item).
            const bool edge = p0 + U > lim || p0 + U - 1 > minpos;
            float p[U][QV];
#pragma unroll
            for (int i = 0; i < QV; ++i) {
                float mx = -KILN_INF;
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    const int pos = p0 + u;
                    if (edge) s[u][i] = (pos < lim && pos <= qpos[i]) ? s[u][i] : -KILN_INF;
                    mx = fmaxf(mx, s[u][i]);
                }
                // Lazy rescaling: the reference max moves (and acc, l are rescaled) only when
                // a score exceeds it by more than 2^8; below that, exp2 terms up to 256 are
                // exact enough in f32 and l, acc keep the same reference.
                if (mx > m[i] + 8.f) {
                    const float corr = exp2f(m[i] - mx);
                    m[i] = mx;
                    l[i] *= corr;
#pragma unroll
                    for (int c = 0; c < CPL; ++c)
#pragma unroll
                        for (int e = 0; e < E; ++e) acc[i][c][e] *= corr;
                }
                const float ref = m[i] == -KILN_INF ? 0.f : m[i];
                float sum = 0.f;
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    p[u][i] = exp2f(s[u][i] - ref);
                    sum += p[u][i];
                }
                l[i] += sum;
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
#pragma unroll
                for (int c = 0; c < CPL; ++c) {
                    float v[E];
                    C::unpack(vr[u][c], v);
#pragma unroll
                    for (int i = 0; i < QV; ++i) {
#pragma unroll
                        for (int e = 0; e < E; ++e) acc[i][c][e] += p[u][i] * v[e];
                    }
                }
            }
        }

        // The merge buffers below reuse other warps' stage slots.
        if constexpr (NST > 0) __syncthreads();
        // Merge the RPW streams of the warp (lanes t, t + TPR, ...) through shuffles.
#pragma unroll
        for (int i = 0; i < QV; ++i) {
            float mw = m[i];
#pragma unroll
            for (int o = TPR; o < WARP; o <<= 1) mw = fmaxf(mw, shfl_xor(mw, o));
            const float f = m[i] == -KILN_INF ? 0.f : exp2f(m[i] - mw);
            float lw = l[i] * f;
#pragma unroll
            for (int o = TPR; o < WARP; o <<= 1) lw += shfl_xor(lw, o);
#pragma unroll
            for (int c = 0; c < CPL; ++c) {
#pragma unroll
                for (int e = 0; e < E; ++e) {
                    float a = acc[i][c][e] * f;
#pragma unroll
                    for (int o = TPR; o < WARP; o <<= 1) a += shfl_xor(a, o);
                    acc[i][c][e] = a;
                }
            }
            m[i] = mw;
            l[i] = lw;
        }
        if (lane < TPR) {
#pragma unroll
            for (int i = 0; i < QV; ++i) {
                if (lane == 0) {
                    m_s[warp][i] = m[i];
                    l_s[warp][i] = l[i];
                }
#pragma unroll
                for (int c = 0; c < CPL; ++c)
#pragma unroll
                    for (int e = 0; e < E; ++e) o_s[warp][i][(t + c * TPR) * E + e] = acc[i][c][e];
            }
        }
        __syncthreads();
        for (int e = threadIdx.x; e < nv * D; e += blockDim.x) {
            const int i = e / D, d = e % D;
            float mx = -KILN_INF;
#pragma unroll
            for (int w = 0; w < NW; ++w) mx = fmaxf(mx, m_s[w][i]);
            float sum = 0.f, o = 0.f;
#pragma unroll
            for (int w = 0; w < NW; ++w) {
                const float f = m_s[w][i] == -KILN_INF ? 0.f : exp2f(m_s[w][i] - mx);
                sum += l_s[w][i] * f;
                o += o_s[w][i][d] * f;
            }
            const int v = vb + i, h = kvh * G + v % G;
            store_result<T>(out, part_acc, part_ml, part, (size_t)(row0 + v / G), h, d, n_heads, D, o, sum,
                             mx * 0.6931471805599453f);
        }
        __syncthreads();
    }
}

// Merges split-K partials. splits: 3 words per row (row, first part, number of parts).
// Grid (split rows, n_heads).
template <typename T>
__device__ __forceinline__ void attn_combine_impl(const float* __restrict__ part_acc, const float* __restrict__ part_ml,
                                  const u32* __restrict__ splits, T* __restrict__ out, int n_heads, int hd) {
    const u32* sp = splits + 3 * (size_t)blockIdx.x;
    const size_t row = sp[0];
    const int p0 = sp[1], np = sp[2], h = blockIdx.y;
    float mx = -KILN_INF;
    for (int k = 0; k < np; ++k) mx = fmaxf(mx, part_ml[((size_t)(p0 + k) * n_heads + h) * 2]);
    float sum = 0.f;
    for (int k = 0; k < np; ++k) {
        const float* ml = part_ml + ((size_t)(p0 + k) * n_heads + h) * 2;
        sum += ml[0] == -KILN_INF ? 0.f : ml[1] * expf(ml[0] - mx);
    }
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.f;
        for (int k = 0; k < np; ++k) {
            const float mk = part_ml[((size_t)(p0 + k) * n_heads + h) * 2];
            if (mk != -KILN_INF) o += part_acc[((size_t)(p0 + k) * n_heads + h) * hd + d] * expf(mk - mx);
        }
        out[row * n_heads * hd + (size_t)h * hd + d] = from_f<T>(o / sum);
    }
}

#define KILN_ATTN_ONE(N, TT, DN, D, QV)                                                                 \
    extern "C" __global__ void __launch_bounds__(ATTN_WARPS * WARP) attn_##N##_d##DN##_q##QV(        \
        const TT *qkv, int qkv_stride, const TT *k_cache, const TT *v_cache, TT *out, float *part_acc,   \
        float *part_ml, const u32 *positions, const u32 *seqinfo, const u32 *tables, const u32 *items,  \
        int n_heads, int n_kv, int head_dim, int block_size, float scale) {                             \
        typedef TT T;                                                                                   \
        attn_impl<T, D, QV>(KILN_ATTN_PASS_ARGS);                                                            \
    }
#define KILN_ATTN_D(N, T, DN, D) \
    KILN_ATTN_ONE(N, T, DN, D, 1) KILN_ATTN_ONE(N, T, DN, D, 4) KILN_ATTN_ONE(N, T, DN, D, 8)
#define KILN_ATTN_TC(N, TT, D)                                                                          \
    extern "C" __global__ void __launch_bounds__(ATTN_WARPS * WARP) attn_##N##_d##D##_tc(              \
        const TT *qkv, int qkv_stride, const TT *k_cache, const TT *v_cache, TT *out, float *part_acc,   \
        float *part_ml, const u32 *positions, const u32 *seqinfo, const u32 *tables, const u32 *items,  \
        int n_heads, int n_kv, int head_dim, int block_size, float scale) {                             \
        attn_tc_body<D>(KILN_ATTN_PASS_ARGS);                                                           \
    }
// Decode blocks per SM the compiler must fit (NVIDIA): 4 (<= 128 registers) while the query
// vectors of a lane take at most 4 chunks, so a batch of 64 x 8 KV heads runs in one wave.
#define KILN_DEC_MINB(TT, D, QV) \
    ((QV) * ((D) * (int)sizeof(TT) / 16 > 16 ? (D) * (int)sizeof(TT) / 256 : 1) <= 4 ? 4 : 2)
#if defined(KILN_CUDA)
#define KILN_DEC_BOUNDS(TT, D, QV) __launch_bounds__(ATTN_WARPS * WARP, KILN_DEC_MINB(TT, D, QV))
#else
#define KILN_DEC_BOUNDS(TT, D, QV) __launch_bounds__(ATTN_WARPS * WARP)
#endif
#define KILN_ATTN_DEC(N, TT, D, QV)                                                                     \
    extern "C" __global__ void KILN_DEC_BOUNDS(TT, D, QV) attn_##N##_d##D##_dec##QV(                   \
        const TT *qkv, int qkv_stride, const TT *k_cache, const TT *v_cache, TT *out, float *part_acc,   \
        float *part_ml, const u32 *positions, const u32 *seqinfo, const u32 *tables, const u32 *items,  \
        int n_heads, int n_kv, int head_dim, int block_size, float scale) {                             \
        attn_dec_impl<TT, D, QV>(qkv, qkv_stride, k_cache, v_cache, out, part_acc, part_ml, positions,    \
                                 seqinfo, tables, items, n_heads, n_kv, block_size, scale);              \
    }
#define KILN_ATTN_DEC_D(N, T, D) \
    KILN_ATTN_DEC(N, T, D, 1) KILN_ATTN_DEC(N, T, D, 2) KILN_ATTN_DEC(N, T, D, 4) KILN_ATTN_DEC(N, T, D, 8)
#define KILN_ATTN(N, T)                                                                                  \
    KILN_ATTN_D(N, T, 64, 64)                                            \
    KILN_ATTN_D(N, T, 80, 80)                                            \
    KILN_ATTN_D(N, T, 96, 96)                                            \
    KILN_ATTN_D(N, T, 128, 128)                                        \
    KILN_ATTN_D(N, T, 256, 256)                                                                          \
    KILN_ATTN_D(N, T, any, 0)                                                                            \
    KILN_ATTN_TC(N, T, 64)                                                                               \
    KILN_ATTN_TC(N, T, 80)                                                                               \
    KILN_ATTN_TC(N, T, 96)                                                                               \
    KILN_ATTN_TC(N, T, 128)                                                                              \
    KILN_ATTN_DEC_D(N, T, 64)                                                                            \
    KILN_ATTN_DEC_D(N, T, 128)                                                                           \
    extern "C" __global__ void attn_combine_##N(const float* part_acc, const float* part_ml,             \
                                                const u32* splits, T* out, int n_heads, int hd) {        \
        attn_combine_impl<T>(part_acc, part_ml, splits, out, n_heads, hd);                               \
    }
KILN_FOR_DTYPES(KILN_ATTN)
