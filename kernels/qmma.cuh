// The core of the tiled quantized matmul (bf16 compute), shared by qmma.cu (dense batches)
// and grouped kernels such as MoE experts: one block of THREADS threads (default
// QMMA_THREADS) multiplies BM gathered rows of x by BN (default QMMA_BN) rows of one
// quantized weight (types of quant.cuh) over a range of k-tiles, with no dequantized copy of
// the weight:
//
//   qmma_tile<Q, BM[, BN, THREADS, WM]>(w, n, k, n0, x, ldx, xrow, kt0, nt, store)
//     acc[s][j] = sum over k-tiles [kt0, nt) of x[xrow(s)][kk] * W[j][kk]
//     then store(s, j, acc[s][j]) for every slot s < BM and column j in [n0, n0 + BN)
//     (j may reach n or more: store() filters; so does it slots with no row).
//
// - w: the weight's device base (the plane layout of quant.cuh for an n x k matrix; a
//   grouped kernel passes its tile's expert's matrix), n weight rows = output columns.
// - x: bf16 rows of at least k values, row r at x + r * ldx (ldx a multiple of 8: 16-byte
//   loads); xrow(s) is the x row of tile slot s, or -1 for a zero row.
// - k: a multiple of QMMA_BK (the caller checks), or of 32 for a QmmaKTail type (the last
//   k-tile partial); kt0 < nt <= qmma_ktiles(k) (split-k ranges).
// Every thread of the block must call it (it synchronizes); its shared memory is
// qmma_shared<BN, BM>() (one per shape in a kernel, whichever types it decodes). The order
// of a thread's store() calls depends only on the shape (MoE's gate/up relies on it).
//
// Per k-tile of QMMA_BK columns a block
//   - decodes BN weight rows (units of quant.cuh, in registers; fetched one tile ahead
//     so the loads of tile t + 1 fly during the products of tile t) into w_s as bf16,
//   - copies BM gathered rows of x into x_s (slots without a row zero; on sm_80+ with
//     cp.async, issued before the decoding so the copies fly meanwhile),
//   - multiplies: on sm_80+ the warps form WM rows (of BM / WM x rows) by THREADS / 32 / WM
//     columns (of WN weight rows); warp (wm, wn) owns its m16 tiles by WN / 8 n8 tiles,
//     mma.m16n8k16 bf16 with f32 accumulation (A = x_s rows, B = w_s rows: k is contiguous
//     in both; fragments read with ldmatrix); elsewhere (ROCm, older NVIDIA) a plain
//     shared-memory FMA loop.
//
// Fragments of mma.m16n8k16 (g = lane / 4, c = lane % 4), two bf16 per register, low first:
//   A: a0 (g, 2c..2c+1)  a1 (g+8, 2c..)  a2 (g, 2c+8..)  a3 (g+8, 2c+8..)
//   B: b0 (k 2c..2c+1, n g)  b1 (k 2c+8..2c+9, n g)
//   C: c0 c1 (g, 2c..2c+1)  c2 c3 (g+8, 2c..2c+1)

constexpr int QMMA_BN = 64;       // weight rows (output columns) per block (the default)
constexpr int QMMA_BK = 128;      // columns per k-tile: k must be a multiple (host checks)
constexpr int QMMA_THREADS = 128;  // threads per block (the default)

// The types whose tiles take a k that is whole blocks of 32 but no whole k-tiles (MXFP4:
// gpt-oss's 2880 columns): the last k-tile is partial, its units past k decode to zeros (their
// loads clamped to the row's last unit) and x's chunks past k copy in as zeros. Every other
// type keeps k a multiple of QMMA_BK (the host checks) and the code without the checks.
template <typename Q>
struct QmmaKTail {
    static constexpr bool V = false;
};
template <>
struct QmmaKTail<MXFP4> {
    static constexpr bool V = true;
};
// The k-tiles of k columns (the last one partial where k is no multiple of QMMA_BK).
__device__ __forceinline__ int qmma_ktiles(int k) { return (k + QMMA_BK - 1) / QMMA_BK; }

#if defined(KILN_SM80)
#define KILN_QMMA_TC 1
#endif

// The bf16 tiles' layout in shared memory. On tensor cores: rows of QMMA_BK values with no
// padding, the 16-byte chunk c of row r stored at chunk c ^ qmma_swz(r, c) of the row:
// p(r) = 4 (r % 2) + (r / 2) % 4 flipped by bit 3 of c, on the low 3 bits. The 8 rows an
// ldmatrix phase reads (one chunk of rows 8i..8i+7), and the 8 chunks of one row a copy
// writes, fall in distinct banks, and so do the weight stores of a decode step: 8 threads
// write chunks {0, 2, 8, 10} + s of two rows (Q4_K, Q5_K) or {0, 2} + s of four (Q6_K).
// Elsewhere: rows of QMMA_BK + 8 values. Element (r, col) of a tile (col % 8 kept).
#if defined(KILN_QMMA_TC)
constexpr int QMMA_ROW = QMMA_BK;
__device__ __forceinline__ int qmma_swz(int r, int c) { return (((r & 1) << 2) | ((r >> 1) & 3)) ^ ((c >> 3) & 1); }
__device__ __forceinline__ int qmma_at(int r, int col) {
    return r * QMMA_BK + ((col >> 3) ^ qmma_swz(r, col >> 3)) * 8 + (col & 7);
}
#else
constexpr int QMMA_ROW = QMMA_BK + 8;
__device__ __forceinline__ int qmma_at(int r, int col) { return r * QMMA_ROW + col; }
#endif

// (lo, hi) rounded to bf16, packed: lo in the low half.
__device__ __forceinline__ u32 qmma_pack(float lo, float hi) {
#if defined(KILN_QMMA_TC)
    return pack_bf16(lo, hi);
#else
    return Chunk<bf16>::pair(lo, hi);
#endif
}

// On tensor cores the types whose quant bytes are below 128 once masked (Q4_0, Q4_K, Q5_K,
// Q6_K: their `bytes`, weight = sc * (byte - bias) + add) decode a run straight to bf16
// pairs: each byte becomes the exact bf16 128 + byte (a byte permute with the bf16 exponent
// of 128), then two bf16x2 fmas: less 128 + bias (exact), times the run's scale plus its add
// (both rounded to bf16; the product and sum rounded once). H100, 8B Q4_K_M decode: b16
// 6.26-6.35 -> 6.05-6.11 ms, b32 9.02-9.03 -> 8.63-8.66, b64 12.72-12.73 -> 12.38-12.40
// (Q4_K and Q5_K only). Q8_0 (and every type elsewhere) decodes to f32 and rounds each
// weight once.
template <typename Q>
struct QmmaPairs {
    static constexpr bool V = false;
};
#if defined(KILN_QMMA_TC)
template <bool Q5>
struct QmmaPairs<QK45<Q5>> {
    static constexpr bool V = true;
};
template <>
struct QmmaPairs<Q6_K> {
    static constexpr bool V = true;
};
template <>
struct QmmaPairs<Q4_0> {
    static constexpr bool V = true;
};
template <>
struct QmmaPairs<MXFP4> {
    static constexpr bool V = true;
};
__device__ __forceinline__ u32 bf16x2_fma(u32 a, u32 b, u32 c) {
    u32 d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
// Run ri of unit lo of a QmmaPairs type (its run's weights) as 8 bf16 pairs, element 2e low
// in pk[e].
template <typename Q>
__device__ __forceinline__ void qmma_pairs(const typename Q::Raw& raw, int lo, int ri, u32 pk[8]) {
    u32 v[4];
    float bias, sc, add;
    Q::bytes(raw, lo, ri, v, bias, sc, add);
    const u32 sc2 = pack_bf16(sc, sc), ad2 = pack_bf16(add, add), less = pack_bf16(-128.f - bias, -128.f - bias);
    constexpr u32 ONE = 0x3f803f80u;  // bf16 pair 1, 1
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        pk[2 * i] = bf16x2_fma(bf16x2_fma(__byte_perm(v[i], 0x43u, 0x4140u), ONE, less), sc2, ad2);
        pk[2 * i + 1] = bf16x2_fma(bf16x2_fma(__byte_perm(v[i], 0x43u, 0x4342u), ONE, less), sc2, ad2);
    }
}
#endif

// The tiles' shared memory, one per block shape (BN weight rows, BM x rows) whatever the
// weight type, so a kernel that calls qmma_tile for two types (a mixed stack) holds one
// copy: w_s, then x_s.
template <int BN, int BM, int XB = 1>
__device__ __forceinline__ u16* qmma_shared() {
    alignas(16) __shared__ u16 tiles[(BN + XB * BM) * QMMA_ROW];
    return tiles;
}

// BN, THREADS and WM give the block's shape: on tensor cores the THREADS / 32 warps form
// WM rows of warps, each warp BM / WM rows by WN = BN / (THREADS / 32 / WM) output columns
// (a multiple of 16). At BN 128 and BM 64 the shared memory is 48 KiB, the static limit.
// XB 2 (tensor cores only): two x buffers, tile t + 1's copies flying during tile t.
//
// GLU (gate/up pairs): w holds the gate rows and wu the up rows (n of each); the block's
// outputs are the n0.. of act = silu(gate) * up, BN / 2 of them, from BN / 2 gate rows and the
// same up rows, and store(s, j, g, u) gets both sums of output j. A group of GW weight rows
// of the tile (a warp's WN on tensor cores, the whole BN elsewhere) holds GW / 2 gate rows,
// then their up rows: on tensor cores a thread's n8 tile j and tile j + NJ / 2 hold the same
// outputs' gate and up sums (pairs in registers); elsewhere the up half goes through shared
// memory after the loop.
template <typename Q, int BM, int BN = QMMA_BN, int THREADS = QMMA_THREADS, int WM = 1, int XB = 1,
          bool GLU = false, typename XRow, typename Store>
__device__ __forceinline__ void qmma_tile(const u8* __restrict__ w, int n, int k, int n0,
                                          const bf16* __restrict__ x, int ldx, XRow xrow, int kt0, int nt,
                                          Store store, const u8* __restrict__ wu = nullptr) {
    constexpr int UPR = QMMA_BK / Q::UNIT;                // units per weight row per tile
    constexpr int UPT = BN * UPR / THREADS;               // units per thread per tile
    constexpr int XC = QMMA_BK / 8;                       // 16-byte chunks per x row per tile
    constexpr int XPT = BM * XC / THREADS;                // x chunks per thread per tile
    static_assert(UPT >= 1 && UPT * THREADS == BN * UPR, "qmma: units per thread");
    static_assert(XPT >= 1 && XPT * THREADS == BM * XC, "qmma: x chunks per thread");
    static_assert(BM % 16 == 0, "qmma: m16 tiles");
#if !defined(KILN_QMMA_TC)
    static_assert(XB == 1, "qmma: one x buffer off tensor cores");
#endif
    u16* w_s = qmma_shared<BN, BM, XB>();
    u16* x_s = w_s + BN * QMMA_ROW;

#if defined(KILN_QMMA_TC)
    constexpr int GW = BN * WM / (THREADS / WARP);  // a warp's weight rows (WN below)
#else
    constexpr int GW = BN;
#endif
    static_assert(!GLU || GW % 16 == 0, "qmma: gate/up halves of whole n8 tiles");
    const int t = threadIdx.x;
    typename Q::Row wr[UPT];
    int wrow[UPT], lu[UPT];
#pragma unroll
    for (int s = 0; s < UPT; ++s) {
        const int i = t + s * THREADS;
        wrow[s] = i / UPR;
        lu[s] = i % UPR;
        int row = n0 + wrow[s];
        const u8* base = w;
        if (GLU) {
            const int r = wrow[s];
            row = n0 + r / GW * (GW / 2) + r % (GW / 2);
            if (r % GW >= GW / 2) base = wu;
        }
        // Rows past n decode row n - 1 (valid memory); their columns are never stored.
        wr[s] = Q::row(base, n, k, min(row, n - 1));
    }
    const vec4u* xp[XPT];
    u32 keep[XPT];
#pragma unroll
    for (int s = 0; s < XPT; ++s) {
        const int i = t + s * THREADS, r = xrow(i / XC);
        // A slot without a row reads row 0 (valid memory) and stores zeros.
        xp[s] = reinterpret_cast<const vec4u*>(x + (size_t)max(r, 0) * ldx) + i % XC;
        keep[s] = r >= 0 ? 0xffffffffu : 0u;
    }

    typename Q::Raw raw[UPT];
#if !defined(KILN_QMMA_TC)
    vec4u xv[XPT];
#endif
    constexpr bool TAIL = QmmaKTail<Q>::V;
    // With TAIL: x chunk s (8 values) of k-tile kt lies within k; unit u of a row does.
    auto x_live = [&](int kt, int s) { return !TAIL || kt * QMMA_BK + ((t + s * THREADS) % XC) * 8 < k; };
    auto u_live = [&](int u) { return !TAIL || Q::xoff(u, 0) < k; };
    auto fetch = [&](int kt) {
#pragma unroll
        for (int s = 0; s < UPT; ++s) {
            const int u = kt * UPR + lu[s];
            raw[s] = Q::load(wr[s], TAIL ? min(u, k / Q::UNIT - 1) : u);
        }
#if !defined(KILN_QMMA_TC)
#pragma unroll
        for (int s = 0; s < XPT; ++s) xv[s] = xp[s][x_live(kt, s) ? kt * XC : 0];
#endif
    };

#if defined(KILN_QMMA_TC)
    constexpr int WN = BN * WM / (THREADS / WARP);  // columns per warp
    constexpr int NJ = WN / 8;                      // n8 tiles per warp
    constexpr int MT = BM / 16 / WM;                // m16 tiles per warp
    static_assert(WN % 16 == 0, "qmma: columns per warp in ldmatrix x4 steps of 16");
    static_assert(MT >= 1 && MT * 16 * WM == BM, "qmma: m16 tiles per warp");
    const int warp = t / WARP, lane = t % WARP, g = lane / 4, c = lane % 4;
    const int wm = warp % WM, wn = warp / WM;
    // ldmatrix x4: lane l addresses row l % 16 (A), chunk l / 16 of the k16 step; B: row
    // (l / 16) * 8 + l % 8 of 16 columns, chunk (l / 8) & 1. Both rows are l % 8 modulo 8,
    // so the stored chunk of k16 step kk is (2 kk) ^ (h ^ qmma_swz(l, 2 kk)), h the lane's
    // half: e (kk < 4) or e ^ 1 (kk >= 4).
    const int xe = (lane / 16) ^ qmma_swz(lane, 0), we = ((lane / 8) & 1) ^ qmma_swz(lane, 0);
    const u32 x_base = smem_u32(x_s + (wm * MT * 16 + lane % 16) * QMMA_BK);
    const u32 w_base = smem_u32(w_s + (wn * WN + (lane / 16) * 8 + lane % 8) * QMMA_BK);
    float acc[MT][NJ][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int j = 0; j < NJ; ++j) acc[mt][j][0] = acc[mt][j][1] = acc[mt][j][2] = acc[mt][j][3] = 0.f;
#else
    // Portable: thread t owns column t % BN of slots t / BN + i * (THREADS / BN).
    constexpr int RSTEP = THREADS / BN;
    static_assert(RSTEP >= 1 && BM % RSTEP == 0, "qmma: portable slots");
    const int pc = t % BN, pr = t / BN;
    float acc[BM / RSTEP];
#pragma unroll
    for (int i = 0; i < BM / RSTEP; ++i) acc[i] = 0.f;
#endif

#if defined(KILN_QMMA_TC)
    // x tile kt straight into shared memory buffer b: one commit group.
    auto xcopy = [&](int kt, int b) {
        u16* xb = x_s + b * BM * QMMA_ROW;
#pragma unroll
        for (int s = 0; s < XPT; ++s) {
            const int i = t + s * THREADS;
            const bool live = x_live(kt, s);
            cp_async16(smem_u32(xb + qmma_at(i / XC, (i % XC) * 8)), xp[s] + (live ? kt * XC : 0),
                       live ? keep[s] & 16u : 0u);
        }
        cp_async_commit();
    };
    if (XB == 2 && kt0 < nt) xcopy(kt0, 0);
#endif
    if (kt0 < nt) fetch(kt0);
    for (int kt = kt0; kt < nt; ++kt) {
        __syncthreads();  // the previous tile's products are done with w_s, x_s
#if defined(KILN_QMMA_TC)
        // x straight into shared memory: the copies fly while the weights decode (with two
        // buffers: tile kt + 1's, during tile kt's products too).
        const int xbuf = XB == 2 ? (kt - kt0) & 1 : 0;
        if (XB == 1)
            xcopy(kt, 0);
        else if (kt + 1 < nt)
            xcopy(kt + 1, xbuf ^ 1);
#endif
#pragma unroll
        for (int s = 0; s < UPT; ++s) {
            const int u = kt * UPR + lu[s];
#pragma unroll
            for (int run = 0; run < Q::RUNS; ++run) {
                u32 pk[8];
#if defined(KILN_QMMA_TC)
                if constexpr (QmmaPairs<Q>::V) {
                    qmma_pairs<Q>(raw[s], u, run, pk);
                } else
#endif
                {
                    float q[16], sc, ad;
                    Q::run(raw[s], u, run, q, sc, ad);
#pragma unroll
                    for (int e = 0; e < 8; ++e) pk[e] = qmma_pack(fmaf(sc, q[2 * e], ad), fmaf(sc, q[2 * e + 1], ad));
                }
                if (TAIL && !u_live(u))
#pragma unroll
                    for (int e = 0; e < 8; ++e) pk[e] = 0u;
                const int col = Q::xoff(u, run) - kt * QMMA_BK;
                *reinterpret_cast<vec4u*>(w_s + qmma_at(wrow[s], col)) = vec4u{pk[0], pk[1], pk[2], pk[3]};
                *reinterpret_cast<vec4u*>(w_s + qmma_at(wrow[s], col + 8)) = vec4u{pk[4], pk[5], pk[6], pk[7]};
            }
        }
#if !defined(KILN_QMMA_TC)
#pragma unroll
        for (int s = 0; s < XPT; ++s) {
            const int i = t + s * THREADS;
            const vec4u v = xv[s];
            const u32 kp = x_live(kt, s) ? keep[s] : 0u;
            *reinterpret_cast<vec4u*>(x_s + qmma_at(i / XC, (i % XC) * 8)) = vec4u{v.x & kp, v.y & kp, v.z & kp, v.w & kp};
        }
#endif
        if (kt + 1 < nt) fetch(kt + 1);
#if defined(KILN_QMMA_TC)
        if (XB == 2 && kt + 1 < nt)
            cp_async_wait<1>();
        else
            cp_async_wait<0>();
#endif
        __syncthreads();
#if defined(KILN_QMMA_TC)
        const u32 xb_base = x_base + xbuf * (2 * BM * QMMA_ROW);
#endif
#if defined(KILN_QMMA_TC)
#pragma unroll
        for (int kk = 0; kk < QMMA_BK / 16; ++kk) {
            u32 b[NJ][2];
#pragma unroll
            for (int jb = 0; jb < NJ / 2; ++jb) {
                u32 bq[4];
                ldsm_x4(bq, w_base + 2 * (jb * 16 * QMMA_BK + ((2 * kk) ^ we ^ (kk >> 2)) * 8));
                b[2 * jb][0] = bq[0], b[2 * jb][1] = bq[1], b[2 * jb + 1][0] = bq[2], b[2 * jb + 1][1] = bq[3];
            }
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                u32 a[4];
                ldsm_x4(a, xb_base + 2 * (mt * 16 * QMMA_BK + ((2 * kk) ^ xe ^ (kk >> 2)) * 8));
#pragma unroll
                for (int j = 0; j < NJ; ++j) mma_bf16(acc[mt][j], a, b[j][0], b[j][1]);
            }
        }
#else
        for (int kk = 0; kk < QMMA_BK; ++kk) {
            const float wv = __uint_as_float((u32)w_s[qmma_at(pc, kk)] << 16);
#pragma unroll
            for (int i = 0; i < BM / RSTEP; ++i)
                acc[i] = fmaf(__uint_as_float((u32)x_s[qmma_at(pr + i * RSTEP, kk)] << 16), wv, acc[i]);
        }
#endif
    }

#if defined(KILN_QMMA_TC)
    if constexpr (GLU) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int j = 0; j < NJ / 2; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    store((wm * MT + mt) * 16 + g + (e >= 2 ? 8 : 0), n0 + wn * (WN / 2) + j * 8 + 2 * c + (e & 1),
                          acc[mt][j][e], acc[mt][j + NJ / 2][e]);
    } else {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int j = 0; j < NJ; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    store((wm * MT + mt) * 16 + g + (e >= 2 ? 8 : 0), n0 + wn * WN + j * 8 + 2 * c + (e & 1),
                          acc[mt][j][e]);
    }
#else
    if constexpr (GLU) {
        // The up half's sums through shared memory (BM x BN / 2 floats fit in w_s).
        static_assert(BM * (BN / 2) * 4 <= BN * QMMA_ROW * 2, "qmma: up sums in w_s");
        float* up_s = reinterpret_cast<float*>(w_s);
        __syncthreads();
        if (pc >= BN / 2) {
#pragma unroll
            for (int i = 0; i < BM / RSTEP; ++i) up_s[(pr + i * RSTEP) * (BN / 2) + pc - BN / 2] = acc[i];
        }
        __syncthreads();
        if (pc < BN / 2) {
#pragma unroll
            for (int i = 0; i < BM / RSTEP; ++i)
                store(pr + i * RSTEP, n0 + pc, acc[i], up_s[(pr + i * RSTEP) * (BN / 2) + pc]);
        }
    } else {
#pragma unroll
        for (int i = 0; i < BM / RSTEP; ++i) store(pr + i * RSTEP, n0 + pc, acc[i]);
    }
#endif
}

// ---- The 8-bit variant: qmma8_tile (k: whole pairs of 32-blocks) --------------------------
// The same product on x rows quantized to 8 bits (quantize_x's layout, quant.cuh: i8 values
// xq[r * k + kk], then at plane_align(rows * k) one QxScale (d, s) per 32 of a row), with
// the weight tile unpacked to centred signed 8-bit quants (each type's run8) in shared
// memory and multiplied on int8 tensor cores:
//
//   qmma8_tile<Q, BM>(w, n, k, n0, xq, xs, xrow, kt0, nt, store)
//     acc[s][j] = sum over 32-blocks b of  dx[s][b] * sum_t sw[j][t] * (x8[s] . q[j]) over
//                 the scale runs t of b   (+ xsum[s][b] * mn[j][b] for the k-quants' min)
//
// The weight's scale granularity QMMA8_SUB<Q> is 32 (Q8_0, Q4_0, Q4_K, Q5_K: mma.m16n8k32,
// one int32 per block of 32) or 16 (Q6_K: two mma.m16n8k16, one per scale). The int32
// results are scaled into f32 accumulators once per 32-block (dx * sw): the x traffic and
// the shared tiles are half the bf16 path's. xs: the QxScale array of the same xq (rows of
// k / 32). Same contract otherwise as qmma_tile (k a multiple of QMMA_BK; every thread
// calls it; shared memory qmma8_shared<BM>()). Elsewhere than sm_80+ NVIDIA a portable
// dp4a loop does the products (the host keeps the bf16 path there).
//
// Fragments of mma.m16n8k32 s8 (g = lane / 4, c = lane % 4), four i8 per register:
//   A: a0 (g, 4c..4c+3)  a1 (g+8, 4c..)  a2 (g, 16+4c..)  a3 (g+8, 16+4c..)
//   B: b0 (k 4c..4c+3, n g)  b1 (k 16+4c.., n g)      C: as m16n8k16's
// m16n8k16 s8 takes (a0, a1) and b0: the first k16 half; (a2, a3) and b1 the second.

constexpr int QMMA8_LD = QMMA_BK + 16;  // shared row stride in bytes: conflict-free ldmatrix
constexpr int QMMA8_MAGIC = 0x4B400000;  // the bits of 1.5 * 2^23
constexpr float QMMA8_MAGIC_F = 12582912.0f;

template <typename Q>
struct QMMA8_SUB {
    static constexpr int V = 32;
};
template <>
struct QMMA8_SUB<Q6_K> {
    static constexpr int V = 16;
};

#if defined(KILN_QMMA_TC)
__device__ __forceinline__ void qmma_s8k32(int c[4], const u32 a[4], u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// f32 rounded to tf32 (nearest, ties away), as the bits of a b32 register.
__device__ __forceinline__ u32 qmma_tf32(float v) {
    u32 r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(v));
    return r;
}
// m16n8k4 tf32, f32 accumulation: A a0 (g, c) a1 (g+8, c); B b0 (k c, n g); C as above.
__device__ __forceinline__ void qmma_tf32k4(float c[4], u32 a0, u32 a1, u32 b0) {
    asm("mma.sync.aligned.m16n8k4.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(b0));
}
__device__ __forceinline__ void qmma_s8k16(int c[4], u32 a0, u32 a1, u32 b0) {
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(b0));
}
#endif

// The 8-bit tiles' shared memory (one per BM): w8 (QMMA_BN rows), two buffers of x8 (BM
// rows each: tile t + 1 copies in while tile t multiplies), then the f32 weight scales
// [QMMA_BK / 16][QMMA_BN], the mins [QMMA_BK / 32][QMMA_BN] and two buffers of the x blocks'
// QxScale [BM][QMMA_BK / 32].
template <int BM>
__device__ __forceinline__ u8* qmma8_shared() {
    constexpr int BYTES = (QMMA_BN + 2 * BM) * QMMA8_LD + (QMMA_BK / 16 + QMMA_BK / 32) * QMMA_BN * 4 +
                          2 * BM * (QMMA_BK / 32) * 8;
    alignas(16) __shared__ u8 tiles[BYTES];
    return tiles;
}

template <typename Q, int BM, typename XRow, typename Store>
__device__ __forceinline__ void qmma8_tile(const u8* __restrict__ w, int n, int k, int n0,
                                           const u8* __restrict__ xq, const QxScale* __restrict__ xs,
                                           XRow xrow, int kt0, int nt, Store store) {
    constexpr int SUB = QMMA8_SUB<Q>::V;
    constexpr int NB = QMMA_BK / 32;                      // x blocks per row per tile
    constexpr int UPR = QMMA_BK / Q::UNIT;
    constexpr int UPT = QMMA_BN * UPR / QMMA_THREADS;
    constexpr int XC = QMMA_BK / 16;                      // 16-byte chunks per x row per tile
    constexpr int XPT = BM * XC / QMMA_THREADS;
    constexpr int SC = BM * NB * 8 / 16;                  // 16-byte chunks of x scales per tile
    static_assert(UPT >= 1 && UPT * QMMA_THREADS == QMMA_BN * UPR, "qmma8: units per thread");
    static_assert(XPT >= 1 && XPT * QMMA_THREADS == BM * XC, "qmma8: x chunks per thread");
    static_assert(SC <= QMMA_THREADS, "qmma8: x scale chunks");
    static_assert(BM % 16 == 0, "qmma8: m16 tiles");
    u8* w_s = qmma8_shared<BM>();
    u8* x_s = w_s + QMMA_BN * QMMA8_LD;
    float* sw_s = reinterpret_cast<float*>(x_s + 2 * BM * QMMA8_LD);  // [QMMA_BK / SUB][QMMA_BN]
    float* mn_s = sw_s + (QMMA_BK / 16) * QMMA_BN;                 // [NB][QMMA_BN]
    QxScale* xd_s = reinterpret_cast<QxScale*>(mn_s + NB * QMMA_BN);  // [2][BM][NB]

    const int t = threadIdx.x;
    typename Q::Row wr[UPT];
    int wrow[UPT], lu[UPT];
#pragma unroll
    for (int s = 0; s < UPT; ++s) {
        const int i = t + s * QMMA_THREADS;
        wrow[s] = i / UPR;
        lu[s] = i % UPR;
        wr[s] = Q::row(w, n, k, min(n0 + wrow[s], n - 1));
    }
    // x chunk s of thread t: row i / XC, 16 bytes at (i % XC) * 16 of the tile; slots
    // without a row read row 0 and keep zeros (their scales too).
    const vec4u* xp[XPT];
    u32 keep[XPT];
#pragma unroll
    for (int s = 0; s < XPT; ++s) {
        const int i = t + s * QMMA_THREADS, r = xrow(i / XC);
        xp[s] = reinterpret_cast<const vec4u*>(xq + (size_t)max(r, 0) * k) + i % XC;
        keep[s] = r >= 0 ? 0xffffffffu : 0u;
    }
    const int sr = t < SC ? xrow(t / 2) : -1;
    const vec4u* sp = reinterpret_cast<const vec4u*>(xs + (size_t)max(sr, 0) * (k / 32)) + (t & 1);

    typename Q::Raw raw[UPT];
#if !defined(KILN_QMMA_TC)
    vec4u xv[XPT], sv;
#endif
    constexpr bool TAIL = QmmaKTail<Q>::V;
    // With TAIL: x chunk s (16 values) of k-tile kt lies within k; unit u does; the bytes of
    // this thread's 16-byte chunk of x scales (two blocks' QxScale) that do: k is whole pairs
    // of blocks here (each row's scales start 16-byte aligned; the host checks), so a chunk is
    // whole or past k.
    auto x_live = [&](int kt, int s) { return !TAIL || kt * QMMA_BK + ((t + s * QMMA_THREADS) % XC) * 16 < k; };
    auto u_live = [&](int u) { return !TAIL || Q::xoff(u, 0) < k; };
    auto s_bytes = [&](int kt) { return !TAIL || k / 32 - kt * NB - 2 * (t & 1) > 0 ? 16u : 0u; };
    auto fetch = [&](int kt) {
#pragma unroll
        for (int s = 0; s < UPT; ++s) {
            const int u = kt * UPR + lu[s];
            raw[s] = Q::load(wr[s], TAIL ? min(u, k / Q::UNIT - 1) : u);
        }
#if !defined(KILN_QMMA_TC)
#pragma unroll
        for (int s = 0; s < XPT; ++s) xv[s] = xp[s][x_live(kt, s) ? kt * XC : 0];
        if (t < SC) {
            sv = s_bytes(kt) != 0u ? sp[kt * (NB * 8 / 16)] : vec4u{0u, 0u, 0u, 0u};
        }
#endif
    };

#if defined(KILN_QMMA_TC)
    const int warp = t / WARP, lane = t % WARP, g = lane / 4, c = lane % 4;
    const u32 x_base = smem_u32(x_s + (lane % 16) * QMMA8_LD + (lane / 16) * 16);
    const u32 w_base = smem_u32(w_s + (warp * 16 + (lane / 16) * 8 + lane % 8) * QMMA8_LD + ((lane / 8) & 1) * 16);
    float acc[BM / 16][2][4];
#pragma unroll
    for (int mt = 0; mt < BM / 16; ++mt)
#pragma unroll
        for (int j = 0; j < 2; ++j) acc[mt][j][0] = acc[mt][j][1] = acc[mt][j][2] = acc[mt][j][3] = 0.f;
#else
    constexpr int RSTEP = QMMA_THREADS / QMMA_BN;
    const int pc = t % QMMA_BN, pr = t / QMMA_BN;
    float acc[BM / RSTEP];
#pragma unroll
    for (int i = 0; i < BM / RSTEP; ++i) acc[i] = 0.f;
#endif

#if defined(KILN_QMMA_TC)
    // x tile kt (values and scales) into buffer `buf`, asynchronously: one commit group.
    auto xcopy = [&](int kt, int buf) {
        u8* xb = x_s + buf * BM * QMMA8_LD;
#pragma unroll
        for (int s = 0; s < XPT; ++s) {
            const int i = t + s * QMMA_THREADS;
            const bool live = x_live(kt, s);
            cp_async16(smem_u32(xb + (i / XC) * QMMA8_LD + (i % XC) * 16), xp[s] + (live ? kt * XC : 0),
                       live ? keep[s] & 16u : 0u);
        }
        if (t < SC) {
            const u32 sb = sr >= 0 ? s_bytes(kt) : 0u;
            cp_async16(smem_u32(reinterpret_cast<u8*>(xd_s + buf * BM * NB) + 16 * t),
                       sp + (sb > 0 ? kt * (NB * 8 / 16) : 0), sb);
        }
        cp_async_commit();
    };
    if (kt0 < nt) xcopy(kt0, 0);
#endif
    if (kt0 < nt) fetch(kt0);
    for (int kt = kt0; kt < nt; ++kt) {
        __syncthreads();  // the previous tile's products are done with w8 and the other x buffer
#if defined(KILN_QMMA_TC)
        const int buf = (kt - kt0) & 1;
        if (kt + 1 < nt) xcopy(kt + 1, buf ^ 1);
#endif
#pragma unroll
        for (int s = 0; s < UPT; ++s) {
            const int u = kt * UPR + lu[s];
#pragma unroll
            for (int run = 0; run < Q::RUNS; ++run) {
                u32 q[4];
                float sc, mn;
                Q::run8(raw[s], u, run, q, sc, mn);
                if (TAIL && !u_live(u)) {
                    q[0] = q[1] = q[2] = q[3] = 0u;
                    sc = mn = 0.f;
                }
                const int off = Q::xoff(u, run) - kt * QMMA_BK;
                *reinterpret_cast<vec4u*>(w_s + wrow[s] * QMMA8_LD + off) = vec4u{q[0], q[1], q[2], q[3]};
                // A scale of 32 is written by the unit of its first 16 (both halves hold it).
                if (SUB == 16 || off % 32 == 0) sw_s[(off / SUB) * QMMA_BN + wrow[s]] = sc;
                if (Q::XSUM && off % 32 == 0) mn_s[(off / 32) * QMMA_BN + wrow[s]] = mn;
            }
        }
#if !defined(KILN_QMMA_TC)
#pragma unroll
        for (int s = 0; s < XPT; ++s) {
            const int i = t + s * QMMA_THREADS;
            const vec4u v = xv[s];
            const u32 kp = x_live(kt, s) ? keep[s] : 0u;
            *reinterpret_cast<vec4u*>(x_s + (i / XC) * QMMA8_LD + (i % XC) * 16) = vec4u{v.x & kp, v.y & kp, v.z & kp, v.w & kp};
        }
        if (t < SC) {
            const u32 m = sr >= 0 ? 0xffffffffu : 0u;
            reinterpret_cast<vec4u*>(xd_s)[t] = vec4u{sv.x & m, sv.y & m, sv.z & m, sv.w & m};
        }
#endif
        if (kt + 1 < nt) fetch(kt + 1);
#if defined(KILN_QMMA_TC)
        // Tile kt's copies are done (tile kt + 1's may still fly).
        if (kt + 1 < nt)
            cp_async_wait<1>();
        else
            cp_async_wait<0>();
#endif
        __syncthreads();
#if defined(KILN_QMMA_TC)
        const u32 xb_base = x_base + buf * BM * QMMA8_LD;
        const QxScale* xd = xd_s + buf * BM * NB;
#pragma unroll
        for (int b = 0; b < NB; ++b) {
            u32 bq[4];
            ldsm_x4(bq, w_base + 32 * b);
            // This lane's columns: 2c, 2c + 1 of n8 tile j (warp * 16 + 8j).
            float2 sw[2][2];
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const int col = warp * 16 + j * 8 + 2 * c;
#pragma unroll
                for (int h = 0; h < 32 / SUB; ++h)
                    sw[j][h] = *reinterpret_cast<const float2*>(sw_s + ((32 / SUB) * b + h) * QMMA_BN + col);
            }
#pragma unroll
            for (int mt = 0; mt < BM / 16; ++mt) {
                u32 a[4];
                ldsm_x4(a, xb_base + mt * 16 * QMMA8_LD + 32 * b);
                const QxScale xr[2] = {xd[(mt * 16 + g) * NB + b], xd[(mt * 16 + g + 8) * NB + b]};
#pragma unroll
                for (int j = 0; j < 2; ++j) {
                    // The int32 sums start at the bits of 1.5 * 2^23, so each reads as that
                    // float plus the sum (|sum| < 2^22: 32 * 128 * 128 at most), exactly; one
                    // subtraction gives the sum as a float (no int-to-float conversion, a
                    // quarter-rate instruction).
                    if (SUB == 32) {
                        int ci[4] = {QMMA8_MAGIC, QMMA8_MAGIC, QMMA8_MAGIC, QMMA8_MAGIC};
                        qmma_s8k32(ci, a, bq[2 * j], bq[2 * j + 1]);
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            const float s = e & 1 ? sw[j][0].y : sw[j][0].x;
                            acc[mt][j][e] =
                                fmaf(__int_as_float(ci[e]) - QMMA8_MAGIC_F, xr[e >> 1].d * s, acc[mt][j][e]);
                        }
                    } else {
                        int c0[4] = {QMMA8_MAGIC, QMMA8_MAGIC, QMMA8_MAGIC, QMMA8_MAGIC};
                        int c1[4] = {QMMA8_MAGIC, QMMA8_MAGIC, QMMA8_MAGIC, QMMA8_MAGIC};
                        qmma_s8k16(c0, a[0], a[1], bq[2 * j]);
                        qmma_s8k16(c1, a[2], a[3], bq[2 * j + 1]);
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            const float s0 = e & 1 ? sw[j][0].y : sw[j][0].x;
                            const float s1 = e & 1 ? sw[j][1 % (32 / SUB)].y : sw[j][1 % (32 / SUB)].x;
                            const float f0 = __int_as_float(c0[e]) - QMMA8_MAGIC_F;
                            const float f1 = __int_as_float(c1[e]) - QMMA8_MAGIC_F;
                            acc[mt][j][e] = fmaf(xr[e >> 1].d, fmaf(f1, s1, f0 * s0), acc[mt][j][e]);
                        }
                    }
                }
            }
        }
        if (Q::XSUM) {
            // The k-quants' min term, sum over the tile's 32-blocks b of xsum[s][b] * mn[j][b]:
            // a rank-4 product, one tf32 mma per m16 x n8 tile (k = b = c: NB is 4).
            static_assert(NB == 4, "qmma8: one k4 step of 32-blocks per tile");
            u32 bm[2];
#pragma unroll
            for (int j = 0; j < 2; ++j) bm[j] = qmma_tf32(mn_s[c * QMMA_BN + warp * 16 + j * 8 + g]);
#pragma unroll
            for (int mt = 0; mt < BM / 16; ++mt) {
                const u32 a0 = qmma_tf32(xd[(mt * 16 + g) * NB + c].s), a1 = qmma_tf32(xd[(mt * 16 + g + 8) * NB + c].s);
#pragma unroll
                for (int j = 0; j < 2; ++j) qmma_tf32k4(acc[mt][j], a0, a1, bm[j]);
            }
        }
#else
        for (int b = 0; b < NB; ++b) {
            const u32* wq = reinterpret_cast<const u32*>(w_s + pc * QMMA8_LD + 32 * b);
            const float mnv = Q::XSUM ? mn_s[b * QMMA_BN + pc] : 0.f;
#pragma unroll
            for (int i = 0; i < BM / RSTEP; ++i) {
                const int r = pr + i * RSTEP;
                const u32* xw = reinterpret_cast<const u32*>(x_s + r * QMMA8_LD + 32 * b);
                const QxScale xr = xd_s[r * NB + b];
                float v = 0.f;
#pragma unroll
                for (int h = 0; h < 32 / SUB; ++h) {
                    int d = 0;
#pragma unroll
                    for (int e = 0; e < SUB / 4; ++e) d = dp4a(xw[h * (SUB / 4) + e], wq[h * (SUB / 4) + e], d);
                    v = fmaf((float)d, sw_s[((32 / SUB) * b + h) * QMMA_BN + pc], v);
                }
                acc[i] = fmaf(xr.d, v, acc[i]);
                if (Q::XSUM) acc[i] = fmaf(xr.s, mnv, acc[i]);
            }
        }
#endif
    }

#if defined(KILN_QMMA_TC)
#pragma unroll
    for (int mt = 0; mt < BM / 16; ++mt)
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                store(mt * 16 + g + (e >= 2 ? 8 : 0), n0 + warp * 16 + j * 8 + 2 * c + (e & 1), acc[mt][j][e]);
#else
#pragma unroll
    for (int i = 0; i < BM / RSTEP; ++i) store(pr + i * RSTEP, n0 + pc, acc[i]);
#endif
}
