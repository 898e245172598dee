// Paged attention on CUDA cores, attention.cuh's attn_impl, in passes of 1, 4 or 8 query vectors:
// attn_<dt>_d<64|80|96|128|256|any>_q<1|4|8> (prefill chunks, mixed batches, and decode rows
// when the decode variant does not apply).

#define KILN_ATTN_ONE(N, TT, DN, D, QV)                                                                 \
    extern "C" __global__ void __launch_bounds__(ATTN_WARPS * WARP) attn_##N##_d##DN##_q##QV(        \
        const TT *qkv, int qkv_stride, const TT *k_cache, const TT *v_cache, TT *out, float *part_acc,   \
        float *part_ml, const u32 *positions, const u32 *seqinfo, const u32 *tables, const u32 *items,  \
        int n_heads, int n_kv, int head_dim, int block_size, float scale, int window, float softcap,   \
        const TT *sinks) {                                                                              \
        typedef TT T;                                                                                   \
        attn_impl<T, D, QV>(KILN_ATTN_PASS_ARGS);                                                            \
    }
#define KILN_ATTN_D(N, T, DN, D) \
    KILN_ATTN_ONE(N, T, DN, D, 1) KILN_ATTN_ONE(N, T, DN, D, 4) KILN_ATTN_ONE(N, T, DN, D, 8)
#define KILN_ATTN_PREFILL(N, T)                                                                      \
    KILN_IN_PART(h64, KILN_ATTN_D(N, T, 64, 64))                                                     \
    KILN_IN_PART(h80, KILN_ATTN_D(N, T, 80, 80))                                                     \
    KILN_IN_PART(h96, KILN_ATTN_D(N, T, 96, 96))                                                     \
    KILN_IN_PART(h128, KILN_ATTN_D(N, T, 128, 128))                                                  \
    KILN_IN_PART(h256, KILN_ATTN_D(N, T, 256, 256))                                                  \
    KILN_IN_PART(hany, KILN_ATTN_D(N, T, any, 0))
KILN_FOR_DTYPES(KILN_ATTN_PREFILL)
