// Tiled matmul of a batch of rows with up to three stacked quantized weight parts in one
// launch, without a dequantized copy of the weight (bf16 compute only; f32 keeps the
// dequant + GEMM path; the tile core is qmma_tile of qmma.cuh):
//   qmma_<q>_bf16_m<BM>:         y[m, j] = sum_k x[m, k] * [W0; W1; W2][j, k] (+ bias[j])
//   qmmamix_<q>_q6k_bf16_m<BM>:  the same with part 2 of type Q6_K (a Q4_K_M / Q5_K_M qkv)
//   qmma_<q>_bf16_m64w, qmmamix_<q>_q6k_bf16_m64w: the 64-row tile in wide blocks (below)
//   qmma_reduce_bf16:            y[m, j] = sum_z ws[z][m][j] (+ bias[j])   (split-k partials)
//   qmma_reduce_rope_bf16:       the same for a qkv launch, with rope_kv's rope and cache write
//   qmmaglu_<q>_bf16_m<BM>[w], qmma_reduce_glu_bf16: a gate/up pair with SiLU-mul (below)
//   qmma_reduce_add_norm_bf16:   the reduce of a residual delta, with the add and RMSNorm after it
//   qmma8_<q>_bf16_m<BM>, qmma8mix_<q>_q6k_bf16_m<BM>: the same two on x rows quantized to
//                                8 bits (quantize_x), int8 tensor cores (qmma8_tile)
// for m < rows, j < r0 + r1 + r2 (part p has rp rows, 0 when absent; its columns follow the
// earlier parts').
//
// Grid (blocks of BN columns of each part in turn, ceil(rows / BM), splits), THREADS
// threads, BN and THREADS of QmmaShape below (the 8-bit kernels: QMMA_BN, QMMA_THREADS);
// the block's product is qmma_tile over x rows m0..m0+BM (rows past `rows` zero). Split z
// of the k range takes k-tiles [z * per, min(nt, (z + 1) * per)),
// per = ceil(nt / splits); with one split the block writes y, else f32 partial sums to
// ws[z * rows * n + m * n + j] (n = r0 + r1 + r2, no bias), which qmma_reduce_bf16 sums
// into y. A 4096-row weight at a batch of 32 is 64 blocks: the splits fill the SMs and keep
// more loads in flight. Output column j lands at y[m * ldy + j]: the host offsets y and
// bias by the first part's first row in a larger stack.

// The bf16 tiles' block shape for row tile BM (WIDE: the m64w kernels): output columns BN,
// threads, WM rows of warps and XB x buffers (qmma_tile). On tensor cores:
// - the 64-row tile's warps are 2 x 2, each 32 rows by 32 columns: per k16 step a warp
//   reads 2 A and 2 B fragments (ldmatrix) for 8 mma, where 1 x 4 warps of 64 x 16 read 4
//   and 1; the tile loop is bound by shared-memory traffic (H100, Nsight Compute: L1/TEX
//   throughput 82%, short-scoreboard stalls the first reason);
// - the wide blocks (128 columns, 8 warps as 2 x 4) copy each x value once for twice the
//   weight columns; they pay where the grid has blocks enough (gate/up);
// - the narrow tiles double-buffer x (tile t + 1's copies fly during tile t's products).
// The host (`QMMA_WIDE`, `qmma_wide` in src/backend/gpu/matmul.rs) agrees.
template <int BM, bool WIDE>
struct QmmaShape {
#if defined(KILN_QMMA_TC)
    static constexpr int BN = WIDE ? 128 : 64, THREADS = WIDE ? 256 : 128, WM = BM == 64 ? 2 : 1, XB = WIDE ? 1 : 2;
#else
    static constexpr int BN = QMMA_BN, THREADS = QMMA_THREADS, WM = 1, XB = 1;
#endif
};

// This block's share of the grid above: its part (weight, rows n, first output column col0;
// `last`: part 2, of type QB), its columns n0.., its rows m0.. and its split's k-tiles
// [kt0, nt); `store(s, col, v)` puts output (row m0 + s, column col of the part) where it
// belongs: bf16 (+ bias) at y with one split, else the split's f32 partial in ws.
struct QmmaBlock {
    const u8* w;
    int n, col0, n0, m0, kt0, nt;
    bool last;
    const bf16* bias;
    bf16* y;
    float* ws;
    int ntot, rows, ldy;

    __device__ __forceinline__ int xrow(int s) const { return m0 + s < rows ? m0 + s : -1; }
    __device__ __forceinline__ void operator()(int s, int col, float v) const {
        const int r = m0 + s;
        if (r >= rows || col >= n) return;
        const int j = col0 + col;
        if (gridDim.z > 1)
            ws[(size_t)r * ntot + j] = v;
        else
            y[(size_t)r * ldy + j] = from_f<bf16>(v + (bias ? to_f(bias[j]) : 0.f));
    }
};

template <int BM, int BN>
__device__ __forceinline__ QmmaBlock qmma_block(const u8* w0, const u8* w1, const u8* w2, const bf16* bias,
                                                bf16* y, float* ws, int k, int r0, int r1, int r2, int rows,
                                                int ldy) {
    const int b0 = (r0 + BN - 1) / BN, b1 = (r1 + BN - 1) / BN;
    QmmaBlock b;
    int bx = blockIdx.x;
    b.w = w0, b.col0 = 0, b.n = r0, b.last = false;
    if (bx >= b0 + b1) {
        bx -= b0 + b1;
        b.w = w2, b.col0 = r0 + r1, b.n = r2, b.last = true;
    } else if (bx >= b0) {
        bx -= b0;
        b.w = w1, b.col0 = r0, b.n = r1;
    }
    b.n0 = bx * BN, b.m0 = blockIdx.y * BM, b.ntot = r0 + r1 + r2;
    const int per = (qmma_ktiles(k) + (int)gridDim.z - 1) / (int)gridDim.z;
    b.kt0 = (int)blockIdx.z * per, b.nt = min(qmma_ktiles(k), b.kt0 + per);
    b.bias = bias, b.y = y, b.rows = rows, b.ldy = ldy;
    b.ws = gridDim.z > 1 ? ws + (size_t)blockIdx.z * rows * b.ntot : ws;
    return b;
}

template <typename QA, typename QB, int BM, bool WIDE>
__device__ __forceinline__ void qmma_impl(const u8* __restrict__ w0, const u8* __restrict__ w1,
                                          const u8* __restrict__ w2, const bf16* __restrict__ x,
                                          const bf16* __restrict__ bias, bf16* __restrict__ y,
                                          float* __restrict__ ws, int k, int r0, int r1, int r2, int rows,
                                          int ldy) {
    using S = QmmaShape<BM, WIDE>;
    constexpr int BN = S::BN, THREADS = S::THREADS, WM = S::WM, XB = S::XB;
    const QmmaBlock b = qmma_block<BM, BN>(w0, w1, w2, bias, y, ws, k, r0, r1, r2, rows, ldy);
    auto xrow = [&](int s) { return b.xrow(s); };
    // The part is the same for the whole block: every thread takes the same branch.
    if (b.last)
        qmma_tile<QB, BM, BN, THREADS, WM, XB>(b.w, b.n, k, b.n0, x, k, xrow, b.kt0, b.nt, b);
    else
        qmma_tile<QA, BM, BN, THREADS, WM, XB>(b.w, b.n, k, b.n0, x, k, xrow, b.kt0, b.nt, b);
}

// The FFN's gate/up product and SiLU-mul in one launch (qmma_tile's GLU pairs):
//   qmmaglu_<q>_bf16_m<BM>[w]:  act[m, j] = silu(x[m] . G[j]) * (x[m] . U[j])   (j < f)
// gate G and up U of one type, f rows each; grid (ceil(f / (BN / 2)), ceil(rows / BM), splits)
// of QmmaShape's blocks, each BN / 2 outputs from as many gate and up rows. With k split,
// the splits' f32 sums go to ws as qmma's partials of the stacked [G; U] ([z][rows][2f]: the
// gate's at j, the up's at f + j), and qmma_reduce_glu_bf16 finishes them. The SiLU takes the
// f32 sums (qdot_silu's rounding: once, at the product).
struct QmmaGluBlock {
    int f, n0, m0, kt0, nt, rows, ldy;
    bf16* y;
    float* ws;

    __device__ __forceinline__ int xrow(int s) const { return m0 + s < rows ? m0 + s : -1; }
    __device__ __forceinline__ void operator()(int s, int j, float g, float u) const {
        const int r = m0 + s;
        if (r >= rows || j >= f) return;
        if (gridDim.z > 1) {
            float* p = ws + (size_t)r * 2 * f;
            p[j] = g;
            p[f + j] = u;
        } else {
            y[(size_t)r * ldy + j] = from_f<bf16>(g / (1.0f + expf(-g)) * u);
        }
    }
};

template <typename Q, int BM, bool WIDE>
__device__ __forceinline__ void qmmaglu_impl(const u8* __restrict__ wg, const u8* __restrict__ wu,
                                             const bf16* __restrict__ x, bf16* __restrict__ y,
                                             float* __restrict__ ws, int k, int f, int rows, int ldy) {
    using S = QmmaShape<BM, WIDE>;
    QmmaGluBlock b;
    b.f = f, b.n0 = blockIdx.x * (S::BN / 2), b.m0 = blockIdx.y * BM;
    const int per = (qmma_ktiles(k) + (int)gridDim.z - 1) / (int)gridDim.z;
    b.kt0 = (int)blockIdx.z * per, b.nt = min(qmma_ktiles(k), b.kt0 + per);
    b.rows = rows, b.ldy = ldy, b.y = y;
    b.ws = gridDim.z > 1 ? ws + (size_t)blockIdx.z * rows * 2 * f : ws;
    auto xrow = [&](int s) { return b.xrow(s); };
    qmma_tile<Q, BM, S::BN, S::THREADS, S::WM, S::XB, true>(wg, f, k, b.n0, x, k, xrow, b.kt0, b.nt, b, wu);
}

// The 8-bit variant (qmma8_tile of qmma.cuh): the same grid, parts, splits and stores on x
// rows quantized by quantize_x at xq (rows * k i8 values, then the QxScale blocks).
//   qmma8_<q>_bf16_m<BM>, qmma8mix_<q>_q6k_bf16_m<BM>
template <typename QA, typename QB, int BM>
__device__ __forceinline__ void qmma8_impl(const u8* __restrict__ w0, const u8* __restrict__ w1,
                                           const u8* __restrict__ w2, const u8* __restrict__ xq,
                                           const bf16* __restrict__ bias, bf16* __restrict__ y,
                                           float* __restrict__ ws, int k, int r0, int r1, int r2, int rows,
                                           int ldy) {
    const QmmaBlock b = qmma_block<BM, QMMA_BN>(w0, w1, w2, bias, y, ws, k, r0, r1, r2, rows, ldy);
    const QxScale* xs = reinterpret_cast<const QxScale*>(xq + plane_align((size_t)rows * k));
    auto xrow = [&](int s) { return b.xrow(s); };
    if (b.last)
        qmma8_tile<QB, BM>(b.w, b.n, k, b.n0, xq, xs, xrow, b.kt0, b.nt, b);
    else
        qmma8_tile<QA, BM>(b.w, b.n, k, b.n0, xq, xs, xrow, b.kt0, b.nt, b);
}

// Each type's __launch_bounds__: KILN_QMMA_BOUNDS(4) also asks NVIDIA's compiler for 4
// blocks per SM (at most 128 registers). Q8_0 takes it: its 64-row tile had 168 registers,
// and a Llama-3-8B Q8_0 step at batch 64 is 5.9% faster with it on an H100 (15.64 ->
// 14.76 ms). Q4_K_M's types lose with 3 or 4 (b64 14.36 -> 15.84 / 14.52 ms), and even an
// explicit 1 changes their code (b64 16.81 ms), so the others keep the plain bounds.
// (Threads of the block shape; a block of 256 threads counts as two of 128. The template
// arguments' comma stays inside parentheses: HIP's __launch_bounds__ is a macro.)
#define KILN_QMMA_BOUNDS_0(BM, W) __launch_bounds__((QmmaShape<BM, W>::THREADS))
#if defined(KILN_CUDA)
#define KILN_QMMA_BOUNDS_4(BM, W) \
    __launch_bounds__((QmmaShape<BM, W>::THREADS), (4 * QMMA_THREADS / QmmaShape<BM, W>::THREADS))
#else
#define KILN_QMMA_BOUNDS_4(BM, W) __launch_bounds__((QmmaShape<BM, W>::THREADS))
#endif
#define KILN_QMMA_BOUNDS(MINB, BM, W) KILN_QMMA_BOUNDS_##MINB(BM, W)

#define KILN_QMMA_M(QN, QA, BM, W, TAG, MINB)                                                      \
    extern "C" __global__ void KILN_QMMA_BOUNDS(MINB, BM, W)                                         \
        qmma_##QN##_bf16_##TAG(const u8* w0, const u8* w1, const u8* w2, const bf16* x, const bf16* bias, \
                               bf16* y, float* ws, int k, int r0, int r1, int r2, int rows, int ldy) { \
        qmma_impl<QA, QA, BM, W>(w0, w1, w2, x, bias, y, ws, k, r0, r1, r2, rows, ldy);             \
    }
#define KILN_QMMAMIX_M(QN, QA, BM, W, TAG)                                                          \
    extern "C" __global__ void KILN_QMMA_BOUNDS(0, BM, W) qmmamix_##QN##_q6k_bf16_##TAG(           \
        const u8* w0, const u8* w1, const u8* w2, const bf16* x, const bf16* bias, bf16* y, float* ws, int k, \
        int r0, int r1, int r2, int rows, int ldy) {                                                \
        qmma_impl<QA, Q6_K, BM, W>(w0, w1, w2, x, bias, y, ws, k, r0, r1, r2, rows, ldy);           \
    }
#define KILN_QMMA(QN, Q, MINB)                                                                      \
    KILN_QMMA_M(QN, Q, 16, false, m16, MINB) KILN_QMMA_M(QN, Q, 32, false, m32, MINB)                \
    KILN_QMMA_M(QN, Q, 64, false, m64, MINB) KILN_QMMA_M(QN, Q, 64, true, m64w, MINB)
#define KILN_QMMAMIX(QN, Q)                                                                         \
    KILN_QMMAMIX_M(QN, Q, 16, false, m16) KILN_QMMAMIX_M(QN, Q, 32, false, m32)                      \
    KILN_QMMAMIX_M(QN, Q, 64, false, m64) KILN_QMMAMIX_M(QN, Q, 64, true, m64w)

#define KILN_QMMAGLU_M(QN, Q, BM, W, TAG)                                                          \
    extern "C" __global__ void KILN_QMMA_BOUNDS(0, BM, W) qmmaglu_##QN##_bf16_##TAG(                 \
        const u8* wg, const u8* wu, const bf16* x, bf16* y, float* ws, int k, int f, int rows, int ldy) { \
        qmmaglu_impl<Q, BM, W>(wg, wu, x, y, ws, k, f, rows, ldy);                                   \
    }
#define KILN_QMMAGLU(QN, Q)                                                                         \
    KILN_QMMAGLU_M(QN, Q, 16, false, m16) KILN_QMMAGLU_M(QN, Q, 32, false, m32)                      \
    KILN_QMMAGLU_M(QN, Q, 64, false, m64) KILN_QMMAGLU_M(QN, Q, 64, true, m64w)

#define KILN_QMMA8_M(QN, Q, BM)                                                                     \
    extern "C" __global__ void __launch_bounds__(QMMA_THREADS) qmma8_##QN##_bf16_m##BM(              \
        const u8* w0, const u8* w1, const u8* w2, const u8* x, const bf16* bias, bf16* y, float* ws, int k, \
        int r0, int r1, int r2, int rows, int ldy) {                                                \
        qmma8_impl<Q, Q, BM>(w0, w1, w2, x, bias, y, ws, k, r0, r1, r2, rows, ldy);                 \
    }
#define KILN_QMMA8MIX_M(QN, Q, BM)                                                                  \
    extern "C" __global__ void __launch_bounds__(QMMA_THREADS) qmma8mix_##QN##_q6k_bf16_m##BM(       \
        const u8* w0, const u8* w1, const u8* w2, const u8* x, const bf16* bias, bf16* y, float* ws, int k, \
        int r0, int r1, int r2, int rows, int ldy) {                                                \
        qmma8_impl<Q, Q6_K, BM>(w0, w1, w2, x, bias, y, ws, k, r0, r1, r2, rows, ldy);              \
    }
#define KILN_QMMA8(QN, Q) KILN_QMMA8_M(QN, Q, 16) KILN_QMMA8_M(QN, Q, 32) KILN_QMMA8_M(QN, Q, 64)
#define KILN_QMMA8MIX(QN, Q) KILN_QMMA8MIX_M(QN, Q, 16) KILN_QMMA8MIX_M(QN, Q, 32) KILN_QMMA8MIX_M(QN, Q, 64)

#if !defined(KILN_DTYPE_F32)
KILN_IN_PART(q80, KILN_QMMA(q80, Q8_0, 4))
KILN_IN_PART(q40, KILN_QMMA(q40, Q4_0, 0))
KILN_IN_PART(q4k, KILN_QMMA(q4k, Q4_K, 0))
KILN_IN_PART(q5k, KILN_QMMA(q5k, Q5_K, 0))
KILN_IN_PART(q6k, KILN_QMMA(q6k, Q6_K, 0))
KILN_IN_PART(mxfp4, KILN_QMMA(mxfp4, MXFP4, 0))
KILN_IN_PART(q4k, KILN_QMMAMIX(q4k, Q4_K))
KILN_IN_PART(q5k, KILN_QMMAMIX(q5k, Q5_K))
// Gate/up with SiLU-mul for the types whose batches take the bf16 tiles (not Q8_0: qmma8).
KILN_IN_PART(q40, KILN_QMMAGLU(q40, Q4_0))
KILN_IN_PART(q4k, KILN_QMMAGLU(q4k, Q4_K))
KILN_IN_PART(q5k, KILN_QMMAGLU(q5k, Q5_K))
KILN_IN_PART(q6k, KILN_QMMAGLU(q6k, Q6_K))
KILN_IN_PART(mxfp4, KILN_QMMAGLU(mxfp4, MXFP4))
// The 8-bit tiles: Q8_0's default path; the other types' only with KILN_QMMA8=all (slower for
// the k-quants), so they are parts of their own that compile on first use.
KILN_IN_PART(q80, KILN_QMMA8(q80, Q8_0))
KILN_IN_PART(i8q40, KILN_QMMA8(q40, Q4_0))
KILN_IN_PART(i8q4k, KILN_QMMA8(q4k, Q4_K))
KILN_IN_PART(i8q5k, KILN_QMMA8(q5k, Q5_K))
KILN_IN_PART(i8q6k, KILN_QMMA8(q6k, Q6_K))
KILN_IN_PART(i8mxfp4, KILN_QMMA8(mxfp4, MXFP4))
KILN_IN_PART(i8q4k, KILN_QMMA8MIX(q4k, Q4_K))
KILN_IN_PART(i8q5k, KILN_QMMA8MIX(q5k, Q5_K))

// A separate launch: an in-kernel fix-up instead (the last split of each tile to finish
// sums the partials in split order, tile counters it resets) measured slower on an H100
// (Q4_K_M b64 16.60 against 14.29 ms: the tile loop's code got worse even where the fix-up
// did not run, 15.82 ms, and the tail of the last blocks cost the rest).
// Grid (ceil(n / 256), rows), 256 threads: sums the `splits` f32 partials of each output
// (ws[z][r][j], n columns) in split order, adds the bias, stores bf16 at y[r * ldy + j].
#if KILN_HAS_PART(common)
extern "C" __global__ void __launch_bounds__(256)
    qmma_reduce_bf16(const float* __restrict__ ws, const bf16* __restrict__ bias, bf16* __restrict__ y, int n,
                     int rows, int ldy, int splits) {
    const int j = blockIdx.x * 256 + threadIdx.x, r = blockIdx.y;
    if (j >= n || r >= rows) return;
    const size_t plane = (size_t)rows * n;
    const float* p = ws + (size_t)r * n + j;
    float s = 0.f;
    for (int z = 0; z < splits; ++z) s += p[z * plane];
    y[(size_t)r * ldy + j] = from_f<bf16>(s + (bias ? to_f(bias[j]) : 0.f));
}

// The split-k reduce of a qmmaglu launch: act[r, j] = silu(sum_z ws[z][r][j]) *
// sum_z ws[z][r][f + j], in split order. Grid (ceil(f / 256), rows), 256 threads.
extern "C" __global__ void __launch_bounds__(256)
    qmma_reduce_glu_bf16(const float* __restrict__ ws, bf16* __restrict__ y, int f, int rows, int ldy, int splits) {
    const int j = blockIdx.x * 256 + threadIdx.x, r = blockIdx.y;
    if (j >= f || r >= rows) return;
    const size_t plane = (size_t)rows * 2 * f;
    const float* p = ws + (size_t)r * 2 * f + j;
    float g = 0.f, u = 0.f;
    for (int z = 0; z < splits; ++z) {
        g += p[z * plane];
        u += p[z * plane + f];
    }
    y[(size_t)r * ldy + j] = from_f<bf16>(g / (1.0f + expf(-g)) * u);
}

// The split-k reduce of a launch with no bias whose output is a residual delta, fused with
// the residual add and the RMSNorm after it (add_rms_norm_vec's values: the sum rounded to
// bf16 as the reduce stores it, the residual rounded once, the norm reading it):
//   residual[r] += bf16(sum_z ws[z][r]);  out[r] = rmsnorm(residual[r]) * w
// The delta itself is not stored. One block per row (h columns, a multiple of 4 and at most
// 4 * QRN_CACHE * blockDim.x: the host checks; grid (rows)); thread t takes the 4-column
// chunks t, t + blockDim.x, ..., kept in registers between the two passes. The splits' loads
// of all its chunks are issued together (the block is latency-bound).
constexpr int QRN_CACHE = 4;
extern "C" __global__ void __launch_bounds__(1024)
    qmma_reduce_add_norm_bf16(const float* __restrict__ ws, bf16* __restrict__ residual,
                              const bf16* __restrict__ w, bf16* __restrict__ out, int h, int rows, int splits,
                              float eps) {
    __shared__ float scratch[MAX_WARPS];
    const int r = blockIdx.x, hc = h / 4, step = blockDim.x;
    const size_t plane = (size_t)rows * h;
    const float4* p = reinterpret_cast<const float4*>(ws + (size_t)r * h);
    uint2* res = reinterpret_cast<uint2*>(residual + (size_t)r * h);  // 4 bf16 a chunk
    float v[QRN_CACHE][4];
    uint2 rc[QRN_CACHE];
#pragma unroll
    for (int k = 0; k < QRN_CACHE; ++k) {
        const int c = threadIdx.x + k * step;
        rc[k] = c < hc ? res[c] : uint2{0u, 0u};
        v[k][0] = v[k][1] = v[k][2] = v[k][3] = 0.f;
    }
#pragma unroll 4
    for (int z = 0; z < splits; ++z) {
#pragma unroll
        for (int k = 0; k < QRN_CACHE; ++k) {
            const int c = threadIdx.x + k * step;
            if (c < hc) {
                const float4 t = p[z * plane / 4 + c];
                v[k][0] += t.x, v[k][1] += t.y, v[k][2] += t.z, v[k][3] += t.w;
            }
        }
    }
    // Each sum rounded as the plain reduce stores it, added to the residual, rounded, stored;
    // the rounded residual stays in v for the norm.
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < QRN_CACHE; ++k) {
        const int c = threadIdx.x + k * step;
        if (c < hc) {
            const u32 in[2] = {rc[k].x, rc[k].y};
            u32 pk[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const float lo = __uint_as_float(in[e] << 16), hi = __uint_as_float(in[e] & 0xffff0000u);
                pk[e] = Chunk<bf16>::pair(lo + to_f(from_f<bf16>(v[k][2 * e])),
                                          hi + to_f(from_f<bf16>(v[k][2 * e + 1])));
                v[k][2 * e] = __uint_as_float(pk[e] << 16);
                v[k][2 * e + 1] = __uint_as_float(pk[e] & 0xffff0000u);
            }
            res[c] = uint2{pk[0], pk[1]};
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) ss += v[k][e] * v[k][e];
    }
    ss = block_sum(ss, scratch);
    const float inv = 1.0f / sqrtf(ss / (float)h + eps);
    const uint2* wv = reinterpret_cast<const uint2*>(w);
    uint2* o = reinterpret_cast<uint2*>(out + (size_t)r * h);
#pragma unroll
    for (int k = 0; k < QRN_CACHE; ++k) {
        const int c = threadIdx.x + k * step;
        if (c >= hc) continue;
        const u32 in[2] = {wv[c].x, wv[c].y};
        u32 pk[2];
#pragma unroll
        for (int e = 0; e < 2; ++e)
            pk[e] = Chunk<bf16>::pair(__uint_as_float(in[e] << 16) * (v[k][2 * e] * inv),
                                      __uint_as_float(in[e] & 0xffff0000u) * (v[k][2 * e + 1] * inv));
        o[c] = uint2{pk[0], pk[1]};
    }
}

// qmma_reduce_bf16 of a whole qkv launch (n = q_dim + 2 kv_dim columns, heads of head_dim)
// that also does rope_kv's work (rope.cu) as it stores: q and k roped over their first
// rot_dim dims, k and v written to the cache at the row's slot (0xffffffff: a padding row,
// nothing written). The values are the reduce's store and then rope_kv's: each sum (+ bias)
// rounded to bf16, then rotated, and the rotation rounded. Grid (ceil(n / 512), rows), 256
// threads; thread P takes pair P of the row, e = P % (head_dim / 2) of its head: for
// e < rot_dim / 2 of a q or k head the rotated pair (e, e + rot_dim / 2) of the head-halves
// layout or (2e, 2e + 1) of the adjacent one (`interleaved`), else the plain (2e, 2e + 1).
extern "C" __global__ void __launch_bounds__(256)
    qmma_reduce_rope_bf16(const float* __restrict__ ws, const bf16* __restrict__ bias, bf16* __restrict__ y, int n,
                          int rows, int ldy, int splits, const u32* __restrict__ positions,
                          const float* __restrict__ inv_freq, const u32* __restrict__ slots, bf16* __restrict__ k_cache,
                          bf16* __restrict__ v_cache, int q_dim, int kv_dim, int head_dim, int rot_dim,
                          int interleaved, float mscale) {
    const int pair = blockIdx.x * 256 + threadIdx.x, r = blockIdx.y;
    if (pair >= n / 2 || r >= rows) return;
    const int hp = head_dim / 2, half = rot_dim / 2, qk = q_dim + kv_dim;
    const int e = pair % hp, base = pair / hp * head_dim;
    const bool rot = e < half && base < qk;
    const int c0 = base + (rot && !interleaved ? e : 2 * e), c1 = rot && !interleaved ? c0 + half : c0 + 1;
    const size_t plane = (size_t)rows * n;
    const float* p = ws + (size_t)r * n;
    float s0 = 0.f, s1 = 0.f;
    for (int z = 0; z < splits; ++z) {
        s0 += p[z * plane + c0];
        s1 += p[z * plane + c1];
    }
    float v0 = to_f(from_f<bf16>(s0 + (bias ? to_f(bias[c0]) : 0.f)));
    float v1 = to_f(from_f<bf16>(s1 + (bias ? to_f(bias[c1]) : 0.f)));
    if (rot) {
        float cf, sf;
        rope_angle((double)positions[r], inv_freq, e, mscale, cf, sf);
        const float x0 = v0, x1 = v1;
        v0 = to_f(from_f<bf16>(x0 * cf - x1 * sf));
        v1 = to_f(from_f<bf16>(x0 * sf + x1 * cf));
    }
    bf16* yr = y + (size_t)r * ldy;
    yr[c0] = from_f<bf16>(v0);
    yr[c1] = from_f<bf16>(v1);
    const u32 slot = slots[r];
    if (c0 < q_dim || slot == 0xffffffffu) return;
    bf16* dst = c0 < qk ? k_cache + (size_t)slot * kv_dim + (c0 - q_dim) : v_cache + (size_t)slot * kv_dim + (c0 - qk);
    dst[0] = from_f<bf16>(v0);
    dst[c1 - c0] = from_f<bf16>(v1);
}
#endif  // KILN_HAS_PART(common)
#endif
