// Token embedding and row gathers. One block per output row.
//   embed:       out[t] = table[ids[t] - first]  (ids checked against the vocab on the host;
//                zero for an id outside the table's rows: another shard's vocabulary)
//   gather_rows: out[i] = x[rows[i]]             (the rows that produce logits)

template <typename T>
__device__ void copy_row(const T* __restrict__ src, T* __restrict__ dst, int cols) {
    for (int i = threadIdx.x; i < cols; i += blockDim.x) dst[i] = src[i];
}

#define KILN_EMBED(N, T)                                                                             \
    extern "C" __global__ void embed_##N(const T* table, const u32* ids, T* out, int cols, int first, \
                                         int rows) {                                                 \
        const long long r = (long long)ids[blockIdx.x] - first;                                      \
        T* o = out + (size_t)blockIdx.x * cols;                                                      \
        if (r < 0 || r >= rows) {                                                                    \
            for (int i = threadIdx.x; i < cols; i += blockDim.x) o[i] = from_f<T>(0.f);              \
            return;                                                                                  \
        }                                                                                            \
        copy_row<T>(table + (size_t)r * cols, o, cols);                                              \
    }                                                                                                \
    extern "C" __global__ void gather_rows_##N(const T* x, const u32* rows, T* out, int cols) {      \
        copy_row<T>(x + (size_t)rows[blockIdx.x] * cols, out + (size_t)blockIdx.x * cols, cols);    \
    }
KILN_FOR_DTYPES(KILN_EMBED)
