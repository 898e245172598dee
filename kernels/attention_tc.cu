// Tensor-core variant (NVIDIA sm_80+, bf16; flash-attention-2 style) for items with many query
// vectors. Same items, grid and block as attn_impl (blocks take the items last first). A pass
// takes up to 64 query vectors of the item (T = ceil(nv / 16) m16 tiles); warp w owns tile
// w / S and column split w % S of every K/V tile (S = 2 for T <= 2, else 1; with T = 3 the
// fourth warp only loads):
//
//   K/V tile: TC_BN positions -> k_s[pos][d], v_s[pos][d] (row-major) by cp.async, the next
//             tile's copies in flight while this one is multiplied (TC_STAGES buffers, one
//             barrier per tile), zero past the causal limit; tiles start at the pass's window
//             (attn_window), out-of-window scores masked (only in tiles that cross a limit)
//   warp:     S_ = Q(16 x D) . K_s[cols]^T          mma m16n8k16, B = K rows through ldmatrix
//             online softmax in the log2 domain (rows g, g+8 of the thread's group)
//             O += P(16 x cols) . V_s[cols]         mma m16n8k16, B = V through ldmatrix.trans
//   end:      the S splits of a tile merged in shared memory, rows written (or partials)
//
// H100, Llama-3-8B shape, prefill of 2048 tokens (32 layers): 16.6 ms with one 64-position
// buffer loaded between two barriers, 15.5 ms with two 32-position stages, 14.9-15.1 ms with
// the items reversed (the causal tail no longer ends the launch). Four barriers per 64-position
// tile (K and V of the next tile loading under the other's products) measured 17.2-19.8 ms.
//
// Fragments of mma.m16n8k16 (g = lane / 4, c = lane % 4), two bf16 per register, low first:
//   A: a0 (g, 2c..2c+1)  a1 (g+8, 2c..)  a2 (g, 2c+8..)  a3 (g+8, 2c+8..)
//   B: b0 (k 2c..2c+1, n g)  b1 (k 2c+8..2c+9, n g)
//   C: c0 c1 (g, 2c..2c+1)  c2 c3 (g+8, 2c..2c+1)
// The accumulator of n-tiles 2j, 2j+1 is, packed to bf16, the A fragment of k-step j.

constexpr int TC_BN = 32;      // positions per K/V tile
constexpr int TC_STAGES = 2;   // K/V tiles in flight (cp.async)

#if defined(KILN_SM80)
#define KILN_MMA 1

// 2^x (scores in the log2 domain are at most 2^8 above their reference: no overflow).
__device__ __forceinline__ float tc_exp2(float x) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
    return r;
}

template <int D>
__device__ __forceinline__ void attn_tc_impl(const bf16* __restrict__ qkv, int qkv_stride, const bf16* __restrict__ k_cache,
                             const bf16* __restrict__ v_cache, bf16* __restrict__ out, float* __restrict__ part_acc,
                             float* __restrict__ part_ml, const u32* __restrict__ positions,
                             const u32* __restrict__ seqinfo, const u32* __restrict__ tables,
                             const u32* __restrict__ items, int n_heads, int n_kv, int block_size, float scale,
                             int window, float softcap) {
    static_assert(D % 16 == 0 && D <= 128, "tensor-core attention: head size");
    constexpr int NW = ATTN_WARPS;
    constexpr int KS = D + 8;                    // k_s row stride (bf16)
    constexpr int OS = D + 8;                    // o_s row stride (f32)
    constexpr int KV_STAGE = 2 * TC_BN * KS;     // bf16 of one stage: K tile, then V tile
    constexpr int KV_BYTES = TC_STAGES * KV_STAGE * 2;
    static_assert((D / 8) % 2 == 0, "tensor-core attention: O n-tiles in pairs");
    constexpr int O_BYTES = NW * 16 * OS * 4;
    constexpr int SMEM = KV_BYTES > O_BYTES ? KV_BYTES : O_BYTES;
    constexpr int NK = D / 16;                   // k-steps of Q . K^T
    constexpr int ND = D / 8;                    // n-tiles of O
    alignas(16) __shared__ unsigned char smem[SMEM];
    __shared__ float m_s[NW][16], l_s[NW][16];
    u16* kv_s = reinterpret_cast<u16*>(smem);    // [TC_STAGES][K, V][TC_BN][KS]
    float* o_s = reinterpret_cast<float*>(smem); // [NW][16][OS], after the last tile

    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int g = lane / 4, c = lane % 4;
    // Items in reverse: a prompt's items grow with their position (causal), so its longest
    // start first and the short ones fill the last wave.
    const u32* it = items + 6 * (size_t)(gridDim.x - 1 - blockIdx.x);
    const int seq = it[0], row0 = it[1], nrows = it[2], item_kv0 = it[3], item_kv1 = it[4];
    const u32 part = it[5];
    const int kvh = blockIdx.y, G = n_heads / n_kv, width = n_kv * D;
    const u32* table = tables + seqinfo[4 * seq + 3];
    const bf16* kbase = k_cache + (size_t)kvh * D;
    const bf16* vbase = v_cache + (size_t)kvh * D;
    const int nvec = nrows * G;
    const Logit logit(scale, softcap, ATTN_LOG2E);  // scores in the log2 domain
    const int win = attn_win(window);
    // The loader's position in a tile (fixed per thread) and its first 8-element chunk.
    const int lp = threadIdx.x % TC_BN, lc0 = threadIdx.x / TC_BN;
    constexpr int LSTEP = NW * 32 / TC_BN;
    constexpr int LCH = (ND + LSTEP - 1) / LSTEP;  // 16-byte chunks per loader thread

    for (int vb = 0; vb < nvec; vb += 64) {
        const int nv = min(64, nvec - vb);
        const int T = (nv + 15) / 16;
        const int S = T <= 2 ? 2 : 1;            // a PV k-step takes 16 columns
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
        int maxpos = -1, minpos = 0x7fffffff;
        for (int i = 0; i < nv; i += G) {
            const int p = (int)positions[row0 + (vb + i) / G];
            maxpos = max(maxpos, p);
            minpos = min(minpos, p);
        }
        {
            const int p = (int)positions[row0 + (vb + nv - 1) / G];
            maxpos = max(maxpos, p);
            minpos = min(minpos, p);
        }
        int kv1 = item_kv1;
        const int kv0 = attn_window(item_kv0, kv1, part, minpos, maxpos, window);
        const int lim = min(kv1, maxpos + 1);

        float o[ND][4];
#pragma unroll
        for (int j = 0; j < ND; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
        float m[2] = {-KILN_INF, -KILN_INF}, l[2] = {0.f, 0.f};

        // Loads K/V tile [c0, c0 + TC_BN) into stage st (positions past the limit as zeros).
        auto load_tile = [&](int c0, int st) {
            const int pos = c0 + lp;
            const bool ok = pos < lim;
            const size_t slot = ok ? (size_t)table[pos / block_size] * block_size + pos % block_size : 0;
            const bf16* kr = kbase + slot * width;
            const bf16* vr = vbase + slot * width;
            const u32 ks = smem_u32(kv_s + st * KV_STAGE + lp * KS), vs = ks + TC_BN * KS * 2;
#pragma unroll
            for (int i = 0; i < LCH; ++i) {
                const int ch = lc0 + i * LSTEP;
                if (ND % LSTEP == 0 || ch < ND) {
                    cp_async16(ks + ch * 16, kr + ch * 8, ok ? 16u : 0u);
                    cp_async16(vs + ch * 16, vr + ch * 8, ok ? 16u : 0u);
                }
            }
            cp_async_commit();
        };
        __syncthreads();  // the previous pass's merge is done with the shared memory
        if (kv0 < lim) load_tile(kv0, 0);
        int st = 0;
        for (int c0 = kv0; c0 < lim; c0 += TC_BN, st ^= 1) {
            cp_async_wait<0>();
            __syncthreads();  // tile c0 is in stage st; every warp is done with stage st ^ 1
            if (c0 + TC_BN < lim) load_tile(c0 + TC_BN, st ^ 1);
            if (!active || c0 + col0 >= lim) continue;
            const u16* k_s = kv_s + st * KV_STAGE;
            const u16* v_s = k_s + TC_BN * KS;

            // S_ = Q . K^T over this warp's cw columns (cw / 8 n-tiles, at most 4); B fragments
            // by ldmatrix: lanes 8i..8i+7 address positions +0..7 at head dims +8i.
            float sc[4][4];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.f;
                if (j * 8 < cw) {
                    const u32 kr = smem_u32(k_s + (col0 + j * 8 + (lane & 7)) * KS + (lane >> 3) * 8);
#pragma unroll
                    for (int kk = 0; kk < NK; kk += 2) {
                        if (kk + 1 < NK) {
                            u32 b[4];
                            ldsm_x4(b, kr + kk * 32);
                            mma_bf16(sc[j], qf[kk], b[0], b[1]);
                            mma_bf16(sc[j], qf[kk + 1], b[2], b[3]);
                        } else {
                            u32 b[2];
                            ldsm_x2(b, kr + kk * 32);
                            mma_bf16(sc[j], qf[kk], b[0], b[1]);
                        }
                    }
                }
            }
            // Causal and window mask (only where a column of the warp's part of the tile may
            // fall outside a row's range), scale (and cap), running max of rows g (h = 0) and
            // g + 8 (h = 1).
            const int first = c0 + col0, last = first + cw - 1;
            bool full = last < lim;
#pragma unroll
            for (int h = 0; h < 2; ++h)
                if (qpos[h] >= 0) full = full && last <= qpos[h] && qpos[h] - first < win;
            full = __all_sync(0xffffffffu, full);
            float mx[2] = {-KILN_INF, -KILN_INF};
#pragma unroll
            for (int j = 0; j < 4; ++j) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int h = e / 2, pos = first + j * 8 + 2 * c + (e & 1);
                    const bool ok = j * 8 < cw && (full || (pos < lim && pos <= qpos[h] && qpos[h] - pos < win));
                    sc[j][e] = ok ? logit(sc[j][e]) : -KILN_INF;
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
            for (int j = 0; j < 4; ++j) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    sc[j][e] = tc_exp2(sc[j][e] - ref[e / 2]);
                    l[e / 2] += sc[j][e];
                }
            }
            // O += P . V, one k-step per 16 columns.
#pragma unroll
            for (int ks = 0; ks < 2; ++ks) {
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
                        ldsm_x4_trans(b, smem_u32(vr + jj * 16));
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
                                             float scale, int window, float softcap) {
    attn_impl<float, D, 8>(KILN_ATTN_PASS_ARGS);
}
template <int D>
__device__ __forceinline__ void attn_tc_body(const bf16* qkv, int qkv_stride, const bf16* k_cache,
                                             const bf16* v_cache, bf16* out, float* part_acc, float* part_ml,
                                             const u32* positions, const u32* seqinfo, const u32* tables,
                                             const u32* items, int n_heads, int n_kv, int head_dim, int block_size,
                                             float scale, int window, float softcap) {
#if defined(KILN_MMA)
    attn_tc_impl<D>(qkv, qkv_stride, k_cache, v_cache, out, part_acc, part_ml, positions, seqinfo, tables, items,
                    n_heads, n_kv, block_size, scale, window, softcap);
#else
    attn_impl<bf16, D, 8>(KILN_ATTN_PASS_ARGS);
#endif
}

#define KILN_ATTN_TC(N, TT, D)                                                                          \
    extern "C" __global__ void __launch_bounds__(ATTN_WARPS * WARP) attn_##N##_d##D##_tc(              \
        const TT *qkv, int qkv_stride, const TT *k_cache, const TT *v_cache, TT *out, float *part_acc,   \
        float *part_ml, const u32 *positions, const u32 *seqinfo, const u32 *tables, const u32 *items,  \
        int n_heads, int n_kv, int head_dim, int block_size, float scale, int window, float softcap) {  \
        attn_tc_body<D>(KILN_ATTN_PASS_ARGS);                                                           \
    }
#define KILN_ATTN_TC_ALL(N, T)                                                                       \
    KILN_IN_PART(h64, KILN_ATTN_TC(N, T, 64))                                                        \
    KILN_IN_PART(h80, KILN_ATTN_TC(N, T, 80))                                                        \
    KILN_IN_PART(h96, KILN_ATTN_TC(N, T, 96))                                                        \
    KILN_IN_PART(h128, KILN_ATTN_TC(N, T, 128))
KILN_FOR_DTYPES(KILN_ATTN_TC_ALL)
