// The core of the tiled quantized matmul (bf16 compute), shared by qmma.cu (dense batches)
// and grouped kernels such as MoE experts: one block of QMMA_THREADS threads multiplies BM
// gathered rows of x by QMMA_BN rows of one quantized weight (types of quant.cuh) over a
// range of k-tiles, with no dequantized copy of the weight:
//
//   qmma_tile<Q, BM>(w, n, k, n0, x, ldx, xrow, kt0, nt, store)
//     acc[s][j] = sum over k-tiles [kt0, nt) of x[xrow(s)][kk] * W[j][kk]
//     then store(s, j, acc[s][j]) for every slot s < BM and column j in [n0, n0 + QMMA_BN)
//     (j may reach n or more: store() filters; so does it slots with no row).
//
// - w: the weight's device base (the plane layout of quant.cuh for an n x k matrix; a
//   grouped kernel passes its tile's expert's matrix), n weight rows = output columns.
// - x: bf16 rows of at least k values, row r at x + r * ldx (ldx a multiple of 8: 16-byte
//   loads); xrow(s) is the x row of tile slot s, or -1 for a zero row.
// - k: a multiple of QMMA_BK (the caller checks); kt0 < nt <= k / QMMA_BK (split-k ranges).
// Every thread of the block must call it (it synchronizes); shared memory is its own.
//
// Per k-tile of QMMA_BK columns a block
//   - decodes QMMA_BN weight rows (units of quant.cuh, in registers; fetched one tile ahead
//     so the loads of tile t + 1 fly during the products of tile t) into w_s as bf16,
//   - copies BM gathered rows of x into x_s (slots without a row zero),
//   - multiplies: on sm_80+ warp w owns output columns 16w..16w+16 (two n8 tiles) of every
//     m16 tile, mma.m16n8k16 bf16 with f32 accumulation (A = x_s rows, B = w_s rows: k is
//     contiguous in both); elsewhere (ROCm, older NVIDIA) a plain shared-memory FMA loop.
//
// Fragments of mma.m16n8k16 (g = lane / 4, c = lane % 4), two bf16 per register, low first:
//   A: a0 (g, 2c..2c+1)  a1 (g+8, 2c..)  a2 (g, 2c+8..)  a3 (g+8, 2c+8..)
//   B: b0 (k 2c..2c+1, n g)  b1 (k 2c+8..2c+9, n g)
//   C: c0 c1 (g, 2c..2c+1)  c2 c3 (g+8, 2c..2c+1)

constexpr int QMMA_BN = 64;       // weight rows (output columns) per block
constexpr int QMMA_BK = 128;      // columns per k-tile: k must be a multiple (host checks)
constexpr int QMMA_THREADS = 128;
constexpr int QMMA_LD = QMMA_BK + 8;  // shared row stride (bf16): conflict-free fragments

#if defined(KILN_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define KILN_QMMA_TC 1
__device__ __forceinline__ void qmma_bf16(float c[4], const u32 a[4], u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#endif

// (lo, hi) rounded to bf16, packed: lo in the low half.
__device__ __forceinline__ u32 qmma_pack(float lo, float hi) {
#if defined(KILN_QMMA_TC)
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#else
    return Chunk<bf16>::pair(lo, hi);
#endif
}

template <typename Q, int BM, typename XRow, typename Store>
__device__ __forceinline__ void qmma_tile(const u8* __restrict__ w, int n, int k, int n0,
                                          const bf16* __restrict__ x, int ldx, XRow xrow, int kt0, int nt,
                                          Store store) {
    constexpr int UPR = QMMA_BK / Q::UNIT;                // units per weight row per tile
    constexpr int UPT = QMMA_BN * UPR / QMMA_THREADS;     // units per thread per tile
    constexpr int XC = QMMA_BK / 8;                       // 16-byte chunks per x row per tile
    constexpr int XPT = BM * XC / QMMA_THREADS;           // x chunks per thread per tile
    static_assert(UPT >= 1 && UPT * QMMA_THREADS == QMMA_BN * UPR, "qmma: units per thread");
    static_assert(XPT >= 1 && XPT * QMMA_THREADS == BM * XC, "qmma: x chunks per thread");
    static_assert(BM % 16 == 0, "qmma: m16 tiles");
    alignas(16) __shared__ u16 w_s[QMMA_BN * QMMA_LD];
    alignas(16) __shared__ u16 x_s[BM * QMMA_LD];

    const int t = threadIdx.x;
    typename Q::Row wr[UPT];
    int wrow[UPT], lu[UPT];
#pragma unroll
    for (int s = 0; s < UPT; ++s) {
        const int i = t + s * QMMA_THREADS;
        wrow[s] = i / UPR;
        lu[s] = i % UPR;
        // Rows past n decode row n - 1 (valid memory); their columns are never stored.
        wr[s] = Q::row(w, n, k, min(n0 + wrow[s], n - 1));
    }
    const vec4u* xp[XPT];
    u32 keep[XPT];
#pragma unroll
    for (int s = 0; s < XPT; ++s) {
        const int i = t + s * QMMA_THREADS, r = xrow(i / XC);
        // A slot without a row reads row 0 (valid memory) and stores zeros.
        xp[s] = reinterpret_cast<const vec4u*>(x + (size_t)max(r, 0) * ldx) + i % XC;
        keep[s] = r >= 0 ? 0xffffffffu : 0u;
    }

    typename Q::Raw raw[UPT];
    vec4u xv[XPT];
    auto fetch = [&](int kt) {
#pragma unroll
        for (int s = 0; s < UPT; ++s) raw[s] = Q::load(wr[s], kt * UPR + lu[s]);
#pragma unroll
        for (int s = 0; s < XPT; ++s) xv[s] = xp[s][kt * XC];
    };

#if defined(KILN_QMMA_TC)
    const int warp = t / WARP, lane = t % WARP, g = lane / 4, c = lane % 4;
    float acc[BM / 16][2][4];
#pragma unroll
    for (int mt = 0; mt < BM / 16; ++mt)
#pragma unroll
        for (int j = 0; j < 2; ++j) acc[mt][j][0] = acc[mt][j][1] = acc[mt][j][2] = acc[mt][j][3] = 0.f;
#else
    // Portable: thread t owns column t % QMMA_BN of slots t / QMMA_BN + i * (THREADS / BN).
    constexpr int RSTEP = QMMA_THREADS / QMMA_BN;
    const int pc = t % QMMA_BN, pr = t / QMMA_BN;
    float acc[BM / RSTEP];
#pragma unroll
    for (int i = 0; i < BM / RSTEP; ++i) acc[i] = 0.f;
#endif

    if (kt0 < nt) fetch(kt0);
    for (int kt = kt0; kt < nt; ++kt) {
        __syncthreads();  // the previous tile's products are done with w_s, x_s
#pragma unroll
        for (int s = 0; s < UPT; ++s) {
            const int u = kt * UPR + lu[s];
#pragma unroll
            for (int run = 0; run < Q::RUNS; ++run) {
                float q[16], sc, ad;
                Q::run(raw[s], u, run, q, sc, ad);
                u32 pk[8];
#pragma unroll
                for (int e = 0; e < 8; ++e) pk[e] = qmma_pack(fmaf(sc, q[2 * e], ad), fmaf(sc, q[2 * e + 1], ad));
                vec4u* dst = reinterpret_cast<vec4u*>(w_s + wrow[s] * QMMA_LD + Q::xoff(u, run) - kt * QMMA_BK);
                dst[0] = vec4u{pk[0], pk[1], pk[2], pk[3]};
                dst[1] = vec4u{pk[4], pk[5], pk[6], pk[7]};
            }
        }
#pragma unroll
        for (int s = 0; s < XPT; ++s) {
            const int i = t + s * QMMA_THREADS;
            const vec4u v = xv[s];
            *reinterpret_cast<vec4u*>(x_s + (i / XC) * QMMA_LD + (i % XC) * 8) =
                vec4u{v.x & keep[s], v.y & keep[s], v.z & keep[s], v.w & keep[s]};
        }
        if (kt + 1 < nt) fetch(kt + 1);
        __syncthreads();
#if defined(KILN_QMMA_TC)
#pragma unroll
        for (int kk = 0; kk < QMMA_BK / 16; ++kk) {
            u32 b[2][2];
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const u16* wp = w_s + (warp * 16 + j * 8 + g) * QMMA_LD + kk * 16 + 2 * c;
                b[j][0] = *reinterpret_cast<const u32*>(wp);
                b[j][1] = *reinterpret_cast<const u32*>(wp + 8);
            }
#pragma unroll
            for (int mt = 0; mt < BM / 16; ++mt) {
                const u16* ap = x_s + (mt * 16 + g) * QMMA_LD + kk * 16 + 2 * c;
                const u32 a[4] = {*reinterpret_cast<const u32*>(ap), *reinterpret_cast<const u32*>(ap + 8 * QMMA_LD),
                                  *reinterpret_cast<const u32*>(ap + 8),
                                  *reinterpret_cast<const u32*>(ap + 8 * QMMA_LD + 8)};
#pragma unroll
                for (int j = 0; j < 2; ++j) qmma_bf16(acc[mt][j], a, b[j][0], b[j][1]);
            }
        }
#else
        for (int kk = 0; kk < QMMA_BK; ++kk) {
            const float wv = __uint_as_float((u32)w_s[pc * QMMA_LD + kk] << 16);
#pragma unroll
            for (int i = 0; i < BM / RSTEP; ++i)
                acc[i] = fmaf(__uint_as_float((u32)x_s[(pr + i * RSTEP) * QMMA_LD + kk] << 16), wv, acc[i]);
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
