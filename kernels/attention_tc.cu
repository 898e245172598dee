// Tensor-core variant (NVIDIA sm_80+, bf16; flash-attention-2's shape) for items with many
// query vectors. Grid (items, KV heads), ATTN_WARPS warps. Causal balance: a prompt's items
// grow with their position, so block b takes item n - 1 - b, then item b (n items; the blocks
// of the grid's second half exit at once): every block of a prompt gets the same work, in one
// wave where it fits. A pass takes up to TC_QV = 128 query vectors of the item into shared
// memory; warp w owns the 32 vectors (two m16 tiles) of row group w / S and column split
// w % S of every K/V tile, S = 4 / (row groups of the pass) (S = 1 for 128 vectors: items of
// 32 rows of a GQA group of 4, `TC_ROWS_PER_ITEM` in src/backend/gpu/meta.rs):
//
//   Q:        q_s[vec][d] by cp.async, once per pass; A fragments by ldmatrix per k-step
//   K/V tile: TC_BN = 64 positions -> k_s[pos][d], v_s[pos][d] (row-major) by cp.async, the
//             next tile's copies in flight while this one is multiplied (two stages, one barrier
//             per tile); consecutive threads copy consecutive 16-byte chunks of a row (whole
//             sectors); the cache slots of a tile are read two tiles ahead into slot_s; zeros
//             past the causal limit; tiles start at the pass's window (attn_window)
//   warp:     per chunk of TC_CN columns of its share of the tile:
//             S_ = Q(32 x D) . K_s[cols]^T        mma m16n8k16; each K fragment feeds both
//                                                 m-tiles
//             mask (only in chunks that cross a causal / window limit), online softmax in
//             the log2 domain (rows g, g+8 of each m-tile)
//             O += P(32 x cols) . V_s[cols]       V fragments by ldmatrix.trans, each feeding
//                                                 both m-tiles
//   end:      S = 1: each warp writes its rows from registers; else the splits merge in
//             shared memory (or partials: split-K items)
//
// The dynamic shared memory (q_s, then two stages of K and V tiles; rows of D + 8 bf16 so that
// ldmatrix's eight rows fall in distinct banks) is tc_smem_bytes below; the host passes it
// (`tc_smem_bytes` in src/backend/gpu/attention.rs) and raises the kernel's limit to it. Two
// blocks fit an SM (registers and shared memory): 8 warps.
//
// H100, Llama-3-8B shape, prefill of 2048 tokens (32 layers), attention per step: 14.9-15.1
// ms with 16-vector warps, two 32-position stages and the items reversed (167 registers, three
// blocks an SM); 13.8-14.1 ms with this shape (one thread a position in the copies); 12.1 ms
// with the copies by sectors (ncu before it: SMs active 70% of the launch, 1.8 warps per
// scheduler, 0.27 eligible; stalls per issue: 2.8 fixed latency, 1.4 long and 1.3 short
// scoreboard); 8.1 ms with the balanced blocks (255 registers, 24 bytes spilled). Chunks of 64
// columns (TC_CN) measured 13.1 ms before the copies by sectors and 8.3 ms after the balance.
//
// Fragments of mma.m16n8k16 (g = lane / 4, c = lane % 4), two bf16 per register, low first:
//   A: a0 (g, 2c..2c+1)  a1 (g+8, 2c..)  a2 (g, 2c+8..)  a3 (g+8, 2c+8..)
//   B: b0 (k 2c..2c+1, n g)  b1 (k 2c+8..2c+9, n g)
//   C: c0 c1 (g, 2c..2c+1)  c2 c3 (g+8, 2c..2c+1)
// The accumulator of n-tiles 2j, 2j+1 is, packed to bf16, the A fragment of k-step j.

constexpr int TC_QV = 128;     // query vectors per pass (ATTN_WARPS warps x 32)
constexpr int TC_BN = 64;      // positions per K/V tile
constexpr int TC_CN = 32;      // columns per softmax chunk (a warp's S_ registers)

// Dynamic shared memory of head size D: q_s [TC_QV][D + 8], then [2 stages][K, V][TC_BN][D + 8].
__host__ __device__ constexpr int tc_smem_bytes(int d) { return (TC_QV + 4 * TC_BN) * (d + 8) * 2; }

#if defined(KILN_SM80)
#define KILN_MMA 1

extern __shared__ __align__(16) unsigned char tc_dyn_smem[];

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
                             int window, float softcap, const bf16* __restrict__ sinks) {
    static_assert(D % 16 == 0 && D <= 128, "tensor-core attention: head size");
    static_assert((D / 8) % 2 == 0, "tensor-core attention: O n-tiles in pairs");
    constexpr int NW = ATTN_WARPS;
    static_assert(NW * 32 == TC_QV, "tensor-core attention: 32 vectors per warp");
    constexpr int RS = D + 8;                    // q_s / k_s / v_s row stride (bf16)
    constexpr int OS = D + 4;                    // o_s row stride (f32)
    constexpr int KV_STAGE = 2 * TC_BN * RS;     // bf16 of one stage: K tile, then V tile
    static_assert(NW * 32 * OS * 4 <= tc_smem_bytes(D), "tensor-core attention: merge buffer");
    constexpr int NK = D / 16;                   // k-steps of Q . K^T
    constexpr int ND = D / 8;                    // n-tiles of O
    constexpr int NT = TC_CN / 8;                // n-tiles of a chunk of S_
    __shared__ float m_s[NW][32], l_s[NW][32];
    u16* q_s = reinterpret_cast<u16*>(tc_dyn_smem);  // [TC_QV][RS]
    u16* kv_s = q_s + TC_QV * RS;                    // [2][K, V][TC_BN][RS]
    float* o_s = reinterpret_cast<float*>(tc_dyn_smem);  // [NW][32][OS], the merge (splits)

    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int g = lane / 4, c = lane % 4;
    const int kvh = blockIdx.y, G = n_heads / n_kv, width = n_kv * D;
    const bf16* kbase = k_cache + (size_t)kvh * D;
    const bf16* vbase = v_cache + (size_t)kvh * D;
    const Logit logit(scale, softcap, ATTN_LOG2E);  // scores in the log2 domain
    const int win = attn_win(window);
    // Copies: 16-byte chunks in row order, consecutive threads on consecutive chunks of a row
    // (whole 32-byte sectors); the tile's cache slots in slot_s (thread t < TC_BN: entry t).
    constexpr int NT_ = NW * 32;
    static_assert((TC_BN * ND) % NT_ == 0 && (TC_QV * ND) % NT_ == 0, "tensor-core attention: copies");
    __shared__ int slot_s[2][TC_BN];

    // Causal balance: a prompt's items grow with their position, so block b takes item
    // n - 1 - b (among the longest) and then item b (among the shortest); the blocks of the
    // second half of the grid have none.
    const int n_it = gridDim.x, bi = blockIdx.x;
    if (2 * bi >= n_it) return;
    for (int pi = 0; pi < 2; ++pi) {
        const int idx = pi == 0 ? n_it - 1 - bi : bi;
        if (pi == 1 && idx == n_it - 1 - bi) break;
        const u32* it = items + 6 * (size_t)idx;
        const int seq = it[0], row0 = it[1], nrows = it[2], item_kv0 = it[3], item_kv1 = it[4];
        const u32 part = it[5];
        const u32* table = tables + seqinfo[4 * seq + 3];
        const int nvec = nrows * G;
        for (int vb = 0; vb < nvec; vb += TC_QV) {
            const int nv = min(TC_QV, nvec - vb);
            const int MG = (nv + 31) / 32;           // row groups of 32 vectors
            const int S = MG == 1 ? 4 : MG == 2 ? 2 : 1;
            const int rg = warp / S, split = warp % S;
            const bool active = rg < MG;
            const int cw = TC_BN / S;                // columns of a K/V tile this warp takes
            const int col0 = split * cw;

            __syncthreads();  // the previous pass is done with the shared memory
            // Q (zeros past nv).
#pragma unroll
            for (int k = 0; k < TC_QV * ND / NT_; ++k) {
                const int e = threadIdx.x + k * NT_, i = e / ND, ch = e % ND;
                const bool ok = i < nv;
                const int v = vb + (ok ? i : 0);
                const bf16* q = qkv + (size_t)(row0 + v / G) * qkv_stride + (size_t)(kvh * G + v % G) * D;
                cp_async16(smem_u32(q_s + i * RS + ch * 8), q + ch * 8, ok ? 16u : 0u);
            }
            cp_async_commit();
            // Positions of rows g, g+8 of the warp's two m-tiles (-1 past nv); the warp's range.
            int qpos[2][2];
            int wmax = -1, wmin = 0x7fffffff;
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int i = rg * 32 + mt * 16 + g + 8 * h;
                    const bool ok = active && i < nv;
                    qpos[mt][h] = ok ? (int)positions[row0 + (vb + i) / G] : -1;
                    if (ok) {
                        wmax = max(wmax, qpos[mt][h]);
                        wmin = min(wmin, qpos[mt][h]);
                    }
                }
            }
#pragma unroll
            for (int o = 1; o < WARP; o *= 2) {
                wmax = max(wmax, shfl_xor(wmax, o));
                wmin = min(wmin, shfl_xor(wmin, o));
            }
            // The pass's range: its rows' positions, a row per lane.
            int maxpos = -1, minpos = 0x7fffffff;
            for (int r = vb / G + lane; r <= (vb + nv - 1) / G; r += WARP) {
                const int p = (int)positions[row0 + r];
                maxpos = max(maxpos, p);
                minpos = min(minpos, p);
            }
#pragma unroll
            for (int o = 1; o < WARP; o *= 2) {
                maxpos = max(maxpos, shfl_xor(maxpos, o));
                minpos = min(minpos, shfl_xor(minpos, o));
            }
            int kv1 = item_kv1;
            const int kv0 = attn_window(item_kv0, kv1, part, minpos, maxpos, window);
            const int lim = min(kv1, maxpos + 1);

            float o[2][ND][4];
#pragma unroll
            for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                for (int j = 0; j < ND; ++j) o[mt][j][0] = o[mt][j][1] = o[mt][j][2] = o[mt][j][3] = 0.f;
            float m[2][2], l[2][2];
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) m[mt][0] = m[mt][1] = -KILN_INF, l[mt][0] = l[mt][1] = 0.f;

            // The cache slot of position c0 + threadIdx.x (-1 past the limit; threads < TC_BN).
            auto slot_of = [&](int c0) {
                const int pos = c0 + threadIdx.x;
                return pos < lim ? (int)table[pos / block_size] * block_size + pos % block_size : -1;
            };
            // Loads the K/V tile whose slots are slot_s[st] into stage st (zeros where slot < 0).
            auto load_tile = [&](int st) {
                const u32 ks = smem_u32(kv_s + st * KV_STAGE);
#pragma unroll 1
                for (int k = 0; k < TC_BN * ND / NT_; ++k) {
                    const int e = threadIdx.x + k * NT_, p = e / ND, ch = e % ND;
                    const int slot = slot_s[st][p];
                    const size_t off = (size_t)(slot >= 0 ? slot : 0) * width + ch * 8;
                    const u32 d = ks + (p * RS + ch * 8) * 2;
                    cp_async16(d, kbase + off, slot >= 0 ? 16u : 0u);
                    cp_async16(d + TC_BN * RS * 2, vbase + off, slot >= 0 ? 16u : 0u);
                }
                cp_async_commit();
            };
            // Slots are read three tiles ahead (the latency hidden behind a tile's products) and
            // stored a tile later into the stage their tile will take.
            int ahead = -1;
            if (threadIdx.x < TC_BN) {
                slot_s[0][threadIdx.x] = slot_of(kv0);
                slot_s[1][threadIdx.x] = slot_of(kv0 + TC_BN);
                ahead = slot_of(kv0 + 2 * TC_BN);
            }
            __syncthreads();
            if (kv0 < lim) load_tile(0);
            // Q fragment addresses: lane L gives row L % 8 (+8 for matrices 1, 3) at column
            // +8 (matrices 2, 3) of the m-tile.
            const u32 qa_base = smem_u32(q_s + (rg * 32 + (lane & 7) + ((lane >> 3) & 1) * 8) * RS + (lane >> 4) * 8);
            int st = 0;
            for (int c0 = kv0; c0 < lim; c0 += TC_BN, st ^= 1) {
                const int ahead3 = threadIdx.x < TC_BN ? slot_of(c0 + 3 * TC_BN) : -1;
                cp_async_wait<0>();
                __syncthreads();  // tile c0 (and Q) in place; every warp is done with stage st ^ 1
                if (c0 + TC_BN < lim) load_tile(st ^ 1);
                // Tile c0 + 2 TC_BN takes stage st (whose slots tile c0's copies have read).
                if (threadIdx.x < TC_BN) slot_s[st][threadIdx.x] = ahead;
                ahead = ahead3;
                if (!active) continue;
                const u16* k_s = kv_s + st * KV_STAGE;
                const u16* v_s = k_s + TC_BN * RS;

#pragma unroll
                for (int cc = 0; cc < TC_BN; cc += TC_CN) {
                    if (cc >= cw) break;
                    const int ncols = min(TC_CN, cw - cc);  // 16 or TC_CN
                    const int first = c0 + col0 + cc, last = first + ncols - 1;
                    // Nothing of the warp's rows in these columns (causal, window): skip.
                    if (first >= lim || first > wmax || wmin - last >= win) continue;
                    // S_ = Q . K^T; K's B fragments by ldmatrix: lanes 8i..8i+7 address positions
                    // +0..7 at head dims +8i (two k-steps per instruction).
                    float sc[2][NT][4];
#pragma unroll
                    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                        for (int j = 0; j < NT; ++j) sc[mt][j][0] = sc[mt][j][1] = sc[mt][j][2] = sc[mt][j][3] = 0.f;
                    const u32 kr = smem_u32(k_s + (col0 + cc + (lane & 7)) * RS + (lane >> 3) * 8);
#pragma unroll
                    for (int kk = 0; kk < NK; kk += 2) {
                        u32 qa[2][2][4];
#pragma unroll
                        for (int mt = 0; mt < 2; ++mt) {
                            ldsm_x4(qa[mt][0], qa_base + (mt * 16 * RS + kk * 16) * 2);
                            if (kk + 1 < NK) ldsm_x4(qa[mt][1], qa_base + (mt * 16 * RS + kk * 16 + 16) * 2);
                        }
#pragma unroll
                        for (int j = 0; j < NT; ++j) {
                            if (j * 8 < ncols) {
                                if (kk + 1 < NK) {
                                    u32 b[4];
                                    ldsm_x4(b, kr + (j * 8 * RS + kk * 16) * 2);
                                    mma_bf16(sc[0][j], qa[0][0], b[0], b[1]);
                                    mma_bf16(sc[1][j], qa[1][0], b[0], b[1]);
                                    mma_bf16(sc[0][j], qa[0][1], b[2], b[3]);
                                    mma_bf16(sc[1][j], qa[1][1], b[2], b[3]);
                                } else {
                                    u32 b[2];
                                    ldsm_x2(b, kr + (j * 8 * RS + kk * 16) * 2);
                                    mma_bf16(sc[0][j], qa[0][0], b[0], b[1]);
                                    mma_bf16(sc[1][j], qa[1][0], b[0], b[1]);
                                }
                            }
                        }
                    }
                    // Causal and window mask (only where a column may fall outside a row's
                    // range), scale (and cap), running max of each m-tile's rows g (h = 0) and
                    // g + 8 (h = 1).
                    bool full = last < lim;
#pragma unroll
                    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                        for (int h = 0; h < 2; ++h)
                            if (qpos[mt][h] >= 0) full = full && last <= qpos[mt][h] && qpos[mt][h] - first < win;
                    full = __all_sync(0xffffffffu, full);
#pragma unroll
                    for (int mt = 0; mt < 2; ++mt) {
                        float mx[2] = {-KILN_INF, -KILN_INF};
#pragma unroll
                        for (int j = 0; j < NT; ++j) {
#pragma unroll
                            for (int e = 0; e < 4; ++e) {
                                const int h = e / 2, pos = first + j * 8 + 2 * c + (e & 1);
                                const bool ok = j * 8 < ncols &&
                                                (full || (pos < lim && pos <= qpos[mt][h] && qpos[mt][h] - pos < win));
                                sc[mt][j][e] = ok ? logit(sc[mt][j][e]) : -KILN_INF;
                                mx[h] = fmaxf(mx[h], sc[mt][j][e]);
                            }
                        }
                        // Lazy rescaling as in the decode variant: the reference max of a row
                        // moves (O and l rescaled) only when a score passes it by more than 2^8.
                        float corr[2] = {1.f, 1.f}, ref[2];
#pragma unroll
                        for (int h = 0; h < 2; ++h) {
                            mx[h] = fmaxf(mx[h], shfl_xor(mx[h], 1));
                            mx[h] = fmaxf(mx[h], shfl_xor(mx[h], 2));
                            if (mx[h] > m[mt][h] + 8.f) {
                                corr[h] = exp2f(m[mt][h] - mx[h]);
                                m[mt][h] = mx[h];
                                l[mt][h] *= corr[h];
                            }
                            ref[h] = m[mt][h] == -KILN_INF ? 0.f : m[mt][h];
                        }
                        if (corr[0] != 1.f || corr[1] != 1.f) {
#pragma unroll
                            for (int j = 0; j < ND; ++j) {
                                o[mt][j][0] *= corr[0];
                                o[mt][j][1] *= corr[0];
                                o[mt][j][2] *= corr[1];
                                o[mt][j][3] *= corr[1];
                            }
                        }
#pragma unroll
                        for (int j = 0; j < NT; ++j) {
#pragma unroll
                            for (int e = 0; e < 4; ++e) {
                                sc[mt][j][e] = tc_exp2(sc[mt][j][e] - ref[e / 2]);
                                l[mt][e / 2] += sc[mt][j][e];
                            }
                        }
                    }
                    // O += P . V, one k-step per 16 columns; each V fragment feeds both m-tiles.
#pragma unroll
                    for (int ks = 0; ks < NT / 2; ++ks) {
                        if (ks * 16 < ncols) {
                            u32 a[2][4];
#pragma unroll
                            for (int mt = 0; mt < 2; ++mt) {
                                a[mt][0] = pack_bf16(sc[mt][2 * ks][0], sc[mt][2 * ks][1]);
                                a[mt][1] = pack_bf16(sc[mt][2 * ks][2], sc[mt][2 * ks][3]);
                                a[mt][2] = pack_bf16(sc[mt][2 * ks + 1][0], sc[mt][2 * ks + 1][1]);
                                a[mt][3] = pack_bf16(sc[mt][2 * ks + 1][2], sc[mt][2 * ks + 1][3]);
                            }
                            // Lane L addresses row L % 8 of matrix L / 8: positions +0..7 / +8..15
                            // (b0 / b1) of n-tiles 2jj / 2jj + 1.
                            const u32 vr = smem_u32(v_s + (col0 + cc + ks * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * RS +
                                                    (lane >> 4) * 8);
#pragma unroll
                            for (int jj = 0; jj < ND / 2; ++jj) {
                                u32 b[4];
                                ldsm_x4_trans(b, vr + jj * 32);
                                mma_bf16(o[0][2 * jj], a[0], b[0], b[1]);
                                mma_bf16(o[1][2 * jj], a[1], b[0], b[1]);
                                mma_bf16(o[0][2 * jj + 1], a[0], b[2], b[3]);
                                mma_bf16(o[1][2 * jj + 1], a[1], b[2], b[3]);
                            }
                        }
                    }
                }
            }
            cp_async_wait<0>();  // no copy still lands in the shared memory (no tile: Q's)

#pragma unroll
            for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    l[mt][h] += shfl_xor(l[mt][h], 1);
                    l[mt][h] += shfl_xor(l[mt][h], 2);
                }
            if (S == 1) {
                // Each warp holds whole rows: written from registers.
#pragma unroll
                for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int i = rg * 32 + mt * 16 + g + 8 * h;
                        if (i >= nv) continue;
                        const int v = vb + i, hq = kvh * G + v % G;
                        const size_t row = (size_t)(row0 + v / G);
                        if (part == NO_PART) {
                            // 1 / l, with the sink (if any) in the denominator.
                            const float inv = attn_norm<bf16>(1.f, l[mt][h], m[mt][h] * 0.6931471805599453f, sinks, hq);
                            u32* dst = reinterpret_cast<u32*>(out + row * n_heads * D + (size_t)hq * D + 2 * c);
#pragma unroll
                            for (int j = 0; j < ND; ++j)
                                dst[j * 4] = pack_bf16(o[mt][j][2 * h] * inv, o[mt][j][2 * h + 1] * inv);
                        } else {
                            float* dst = part_acc + ((size_t)part * n_heads + hq) * D + 2 * c;
#pragma unroll
                            for (int j = 0; j < ND; ++j) {
                                dst[j * 8] = o[mt][j][2 * h];
                                dst[j * 8 + 1] = o[mt][j][2 * h + 1];
                            }
                            if (c == 0) {
                                part_ml[((size_t)part * n_heads + hq) * 2] = m[mt][h] * 0.6931471805599453f;
                                part_ml[((size_t)part * n_heads + hq) * 2 + 1] = l[mt][h];
                            }
                        }
                    }
                }
                continue;
            }

            // Splits: each warp leaves (m, l, O) of its 32 rows; the block combines them.
            __syncthreads();  // every warp is done with q_s and the tiles: o_s reuses them
            if (c == 0) {
#pragma unroll
                for (int mt = 0; mt < 2; ++mt) {
                    m_s[warp][mt * 16 + g] = m[mt][0];
                    m_s[warp][mt * 16 + g + 8] = m[mt][1];
                    l_s[warp][mt * 16 + g] = l[mt][0];
                    l_s[warp][mt * 16 + g + 8] = l[mt][1];
                }
            }
            float* ow = o_s + warp * 32 * OS;
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
                for (int j = 0; j < ND; ++j) {
                    ow[(mt * 16 + g) * OS + j * 8 + 2 * c] = o[mt][j][0];
                    ow[(mt * 16 + g) * OS + j * 8 + 2 * c + 1] = o[mt][j][1];
                    ow[(mt * 16 + g + 8) * OS + j * 8 + 2 * c] = o[mt][j][2];
                    ow[(mt * 16 + g + 8) * OS + j * 8 + 2 * c + 1] = o[mt][j][3];
                }
            }
            __syncthreads();
            for (int e = threadIdx.x; e < nv * D; e += blockDim.x) {
                const int i = e / D, d = e % D, t = i / 32, r = i % 32;
                float mxs = -KILN_INF;
                for (int s = 0; s < S; ++s) mxs = fmaxf(mxs, m_s[t * S + s][r]);
                float sum = 0.f, acc = 0.f;
                for (int s = 0; s < S; ++s) {
                    const float ms = m_s[t * S + s][r];
                    const float f = ms == -KILN_INF ? 0.f : exp2f(ms - mxs);
                    sum += l_s[t * S + s][r] * f;
                    acc += o_s[((t * S + s) * 32 + r) * OS + d] * f;
                }
                const int v = vb + i, h = kvh * G + v % G;
                store_result<bf16>(out, part_acc, part_ml, part, (size_t)(row0 + v / G), h, d, n_heads, D, acc, sum,
                                 mxs * 0.6931471805599453f, sinks);
            }
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
                                             float scale, int window, float softcap, const float* sinks) {
    attn_impl<float, D, 8>(KILN_ATTN_PASS_ARGS);
}
template <int D>
__device__ __forceinline__ void attn_tc_body(const bf16* qkv, int qkv_stride, const bf16* k_cache,
                                             const bf16* v_cache, bf16* out, float* part_acc, float* part_ml,
                                             const u32* positions, const u32* seqinfo, const u32* tables,
                                             const u32* items, int n_heads, int n_kv, int head_dim, int block_size,
                                             float scale, int window, float softcap, const bf16* sinks) {
#if defined(KILN_MMA)
    attn_tc_impl<D>(qkv, qkv_stride, k_cache, v_cache, out, part_acc, part_ml, positions, seqinfo, tables, items,
                    n_heads, n_kv, block_size, scale, window, softcap, sinks);
#else
    attn_impl<bf16, D, 8>(KILN_ATTN_PASS_ARGS);
#endif
}

#define KILN_ATTN_TC(N, TT, D)                                                                          \
    extern "C" __global__ void __launch_bounds__(ATTN_WARPS * WARP) attn_##N##_d##D##_tc(              \
        const TT *qkv, int qkv_stride, const TT *k_cache, const TT *v_cache, TT *out, float *part_acc,   \
        float *part_ml, const u32 *positions, const u32 *seqinfo, const u32 *tables, const u32 *items,  \
        int n_heads, int n_kv, int head_dim, int block_size, float scale, int window, float softcap,   \
        const TT *sinks) {                                                                              \
        attn_tc_body<D>(KILN_ATTN_PASS_ARGS);                                                           \
    }
#define KILN_ATTN_TC_ALL(N, T)                                                                       \
    KILN_IN_PART(h64, KILN_ATTN_TC(N, T, 64))                                                        \
    KILN_IN_PART(h80, KILN_ATTN_TC(N, T, 80))                                                        \
    KILN_IN_PART(h96, KILN_ATTN_TC(N, T, 96))                                                        \
    KILN_IN_PART(h128, KILN_ATTN_TC(N, T, 128))
KILN_FOR_DTYPES(KILN_ATTN_TC_ALL)
