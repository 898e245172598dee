// Tiled matmul of a batch of rows with a quantized weight part, without a dequantized copy
// of the weight (bf16 compute only; f32 keeps the dequant + GEMM path; the tile core is
// qmma_tile of qmma.cuh):
//   qmma_<q>_bf16_m<BM>:  y[m, j] = sum_k x[m, k] * W[j, k] (+ bias[j])   m < rows, j < n
//   qmma_reduce_bf16:     y[m, j] = sum_z ws[z][m][j] (+ bias[j])          (split-k partials)
//
// Grid (ceil(n / QMMA_BN), ceil(rows / BM), splits), QMMA_THREADS threads; the block's
// product is qmma_tile of qmma.cuh over x rows m0..m0+BM (rows past `rows` zero). Split z
// of the k range takes k-tiles [z * per, min(nt, (z + 1) * per)), per = ceil(nt / splits);
// with one split the block writes y, else f32 partial sums to ws[z * rows * n + m * n + j]
// (no bias), which qmma_reduce_bf16 sums into y. A 4096-row weight at a batch of 32 is 64
// blocks: the splits fill the SMs and keep more loads in flight.
// Output column j of the part lands at y[m * ldy + j]: a stacked weight's parts each write
// their columns (the host offsets y and bias by the part's first row).

template <typename Q, int BM>
__device__ __forceinline__ void qmma_impl(const u8* __restrict__ w, const bf16* __restrict__ x,
                                          const bf16* __restrict__ bias, bf16* __restrict__ y,
                                          float* __restrict__ ws, int k, int n, int rows, int ldy) {
    const int n0 = blockIdx.x * QMMA_BN, m0 = blockIdx.y * BM;
    const int per = (k / QMMA_BK + (int)gridDim.z - 1) / (int)gridDim.z;
    const int kt0 = (int)blockIdx.z * per, nt = min(k / QMMA_BK, kt0 + per);
    if (gridDim.z > 1) ws += (size_t)blockIdx.z * rows * n;
    auto xrow = [&](int s) { return m0 + s < rows ? m0 + s : -1; };
    // One split stores bf16 (+ bias) at y[r * ldy + col]; several store f32 partials.
    auto store = [&](int s, int col, float v) {
        const int r = m0 + s;
        if (r >= rows || col >= n) return;
        if (gridDim.z > 1)
            ws[(size_t)r * n + col] = v;
        else
            y[(size_t)r * ldy + col] = from_f<bf16>(v + (bias ? to_f(bias[col]) : 0.f));
    };
    qmma_tile<Q, BM>(w, n, k, n0, x, k, xrow, kt0, nt, store);
}

#define KILN_QMMA_M(QN, Q, BM)                                                                      \
    extern "C" __global__ void __launch_bounds__(QMMA_THREADS)                                      \
        qmma_##QN##_bf16_m##BM(const u8* w, const bf16* x, const bf16* bias, bf16* y, float* ws, int k, \
                               int n, int rows, int ldy) {                                          \
        qmma_impl<Q, BM>(w, x, bias, y, ws, k, n, rows, ldy);                                       \
    }
#define KILN_QMMA(QN, Q) KILN_QMMA_M(QN, Q, 16) KILN_QMMA_M(QN, Q, 32) KILN_QMMA_M(QN, Q, 64)

#if !defined(KILN_DTYPE_F32)
KILN_QMMA(q80, Q8_0)
KILN_QMMA(q40, Q4_0)
KILN_QMMA(q4k, Q4_K)
KILN_QMMA(q5k, Q5_K)
KILN_QMMA(q6k, Q6_K)

// Grid (ceil(n / 256), rows), 256 threads: sums the `splits` f32 partials of each output
// (ws[z][r][j], n columns) in split order, adds the bias, stores bf16 at y[r * ldy + j].
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
#endif
