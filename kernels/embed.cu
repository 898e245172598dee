// Token embedding and row gathers. One block per output row.
//   embed:       out[t] = table[ids[t]]          (ids checked against the vocab on the host)
//   gather_rows: out[i] = x[rows[i]]             (the rows that produce logits)

template <typename T>
__device__ void copy_row(const T* __restrict__ src, T* __restrict__ dst, int cols) {
    for (int i = threadIdx.x; i < cols; i += blockDim.x) dst[i] = src[i];
}

#define KILN_EMBED(N, T)                                                                             \
    extern "C" __global__ void embed_##N(const T* table, const u32* ids, T* out, int cols) {         \
        copy_row<T>(table + (size_t)ids[blockIdx.x] * cols, out + (size_t)blockIdx.x * cols, cols); \
    }                                                                                                \
    extern "C" __global__ void gather_rows_##N(const T* x, const u32* rows, T* out, int cols) {      \
        copy_row<T>(x + (size_t)rows[blockIdx.x] * cols, out + (size_t)blockIdx.x * cols, cols);    \
    }
KILN_FOR_DTYPES(KILN_EMBED)
