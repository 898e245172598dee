// Writes the k and v parts of each row of the fused qkv tensor into the paged cache at the
// row's slot. Cache layout per layer: K and V each [num_slots, width], width = n_kv * head_dim,
// slot = block_table[pos / block_size] * block_size + pos % block_size (from the host).
// Slot 0xffffffff marks a padding row of a graph-replayed step: nothing is written.

template <typename T>
__device__ void write_kv_impl(const T* __restrict__ qkv, int stride, int q_dim, int width,
                              const u32* __restrict__ slots, T* __restrict__ k_cache, T* __restrict__ v_cache) {
    const u32 slot = slots[blockIdx.x];
    if (slot == 0xffffffffu) return;
    const T* row = qkv + (size_t)blockIdx.x * stride + q_dim;
    const size_t dst = (size_t)slot * width;
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        k_cache[dst + i] = row[i];
        v_cache[dst + i] = row[width + i];
    }
}

#define KILN_KV(N, T)                                                                               \
    extern "C" __global__ void write_kv_##N(const T* qkv, int stride, int q_dim, int width,         \
                                            const u32* slots, T* k_cache, T* v_cache) {             \
        write_kv_impl<T>(qkv, stride, q_dim, width, slots, k_cache, v_cache);                       \
    }
KILN_FOR_DTYPES(KILN_KV)
