// Kiln kernel prelude: the only place where CUDA (NVRTC) and HIP (hipRTC) differ.
//
// Kernels include nothing: NVRTC and hipRTC search no include directories, so the
// storage types, conversions, shuffles and reductions every kernel needs are defined here.
// The host prepends this text to each kernel file and passes:
//   -DKILN_WARP_SIZE=<32 on NVIDIA and RDNA, 64 on CDNA>
// Never write a literal 32 in a reduction: use WARP.

#ifndef KILN_WARP_SIZE
#error "the host must define KILN_WARP_SIZE"
#endif

constexpr int WARP = KILN_WARP_SIZE;
// Most warps of a 1024-thread block; sizes the scratch of block reductions.
constexpr int MAX_WARPS = 1024 / WARP;

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef int i32;
typedef unsigned long long u64;

#define KILN_INF (__uint_as_float(0x7f800000u))

#if defined(__HIPCC_RTC__) || defined(__HIPCC__)
#define KILN_HIP 1
template <typename V>
__device__ __forceinline__ V shfl_xor(V v, int mask) { return __shfl_xor(v, mask, WARP); }
template <typename V>
__device__ __forceinline__ V shfl(V v, int src) { return __shfl(v, src, WARP); }
__device__ __forceinline__ void sync_warp() {}
#else
#define KILN_CUDA 1
template <typename V>
__device__ __forceinline__ V shfl_xor(V v, int mask) { return __shfl_xor_sync(0xffffffffu, v, mask, WARP); }
template <typename V>
__device__ __forceinline__ V shfl(V v, int src) { return __shfl_sync(0xffffffffu, v, src, WARP); }
__device__ __forceinline__ void sync_warp() { __syncwarp(); }
#endif

// Programmatic dependent launch (NVIDIA sm_90+). A kernel the host launches as dependent
// (Kernel::waits_for_predecessor) may start while the kernel before it on the stream drains:
//   KILN_PDL_WAIT():    returns once every kernel before this one has finished and its writes
//                       are visible. Execute it on every path (early exits included) before
//                       reading or writing any buffer another kernel uses; only read-only
//                       data (weights) may be touched before it.
//   KILN_PDL_TRIGGER(): lets the next dependent kernel start its blocks (it still waits in
//                       its own KILN_PDL_WAIT()); without it, that happens at this kernel's end.
// Both are no-ops when the kernel was launched plainly, below sm_90, and on HIP.
#if defined(KILN_CUDA) && defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
#define KILN_PDL_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#define KILN_PDL_TRIGGER() asm volatile("griddepcontrol.launch_dependents;" ::: "memory")
#else
#define KILN_PDL_WAIT() ((void)0)
#define KILN_PDL_TRIGGER() ((void)0)
#endif

// Tensor cores and asynchronous copies (NVIDIA sm_80+: KILN_SM80; the kernels that use them
// keep a portable body for every other target):
//   smem_u32(p):               the shared-memory address of a generic pointer p
//   cp_async16(dst, src, n):   16 bytes global -> shared (dst a smem_u32 address) without
//                              the registers; n = 0 fills zeros (src is not read)
//   cp_async_commit(), cp_async_wait<N>(): close a group of copies; wait until at most N of
//                              this thread's groups are in flight
//   ldsm_x4/x2(r, a), ldsm_x4_trans(r, a): ldmatrix of 8x8 b16 matrices (lanes 8i..8i+7 give
//                              the row addresses of matrix i; register i holds, for lane
//                              (g = lane / 4, c = lane % 4), row g at columns 2c, 2c + 1, or
//                              with .trans column g at rows 2c, 2c + 1)
//   mma_bf16(c, a, b0, b1):    c += a . b, mma.m16n8k16 bf16 with f32 accumulation
//   pack_bf16(lo, hi):         two floats rounded to bf16 (nearest even), lo in the low half
#if defined(KILN_CUDA) && defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 800)
#define KILN_SM80 1
__device__ __forceinline__ u32 smem_u32(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}
__device__ __forceinline__ void cp_async16(u32 dst, const void* src, u32 bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void ldsm_x4(u32 r[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}
__device__ __forceinline__ void ldsm_x2(u32 r[2], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(addr) : "memory");
}
__device__ __forceinline__ void ldsm_x4_trans(u32 r[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}
__device__ __forceinline__ void mma_bf16(float c[4], const u32 a[4], u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ u32 pack_bf16(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
#endif

// bfloat16 storage: the top 16 bits of an IEEE float. Same layout as __nv_bfloat16 and
// hip_bfloat16, so buffers are shared with cuBLAS / hipBLAS as-is.
struct bf16 {
    u16 bits;
};

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(bf16 x) { return __uint_as_float(((u32)x.bits) << 16); }

template <typename T>
__device__ __forceinline__ T from_f(float x);
template <>
__device__ __forceinline__ float from_f<float>(float x) { return x; }
// Round to nearest even; NaN stays NaN.
template <>
__device__ __forceinline__ bf16 from_f<bf16>(float x) {
    u32 u = __float_as_uint(x);
    bf16 r;
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        r.bits = 0x7fc0;
    } else {
        u += 0x7fffu + ((u >> 16) & 1u);
        r.bits = (u16)(u >> 16);
    }
    return r;
}

template <typename V>
__device__ __forceinline__ V warp_sum(V v) {
    for (int o = WARP / 2; o > 0; o >>= 1) v += shfl_xor(v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = WARP / 2; o > 0; o >>= 1) v = fmaxf(v, shfl_xor(v, o));
    return v;
}

// One lane's share of an 8-bit activation row (the layout of qgemv.cu's qdot: int8 quants,
// and per block of 32 values d = amax / 127 and the exact sum s): the lane holds E values v
// of a block whose 32 / E lanes are adjacent. Writes the lane's E quants at q (4-byte
// aligned when E >= 4) and, where `first` (the block's first lane), the block's (d, s) at
// ds[0], ds[1]. Every lane of the warp calls it (shuffles); only `valid` lanes store.
template <int E>
__device__ __forceinline__ void qx_lanes(const float* v, bool valid, bool first, u8* q, float* ds) {
    float amax = 0.f, sum = 0.f;
#pragma unroll
    for (int e = 0; e < E; ++e) {
        amax = fmaxf(amax, fabsf(v[e]));
        sum += v[e];
    }
#pragma unroll
    for (int o = 32 / E / 2; o > 0; o >>= 1) {
        amax = fmaxf(amax, shfl_xor(amax, o));
        sum += shfl_xor(sum, o);
    }
    if (!valid) return;
    const float id = amax > 0.f ? 127.f / amax : 0.f;
    if constexpr (E % 4 == 0) {
#pragma unroll
        for (int i = 0; i < E / 4; ++i) {
            u32 w = 0;
#pragma unroll
            for (int e = 0; e < 4; ++e) w |= ((u32)(int)rintf(v[4 * i + e] * id) & 0xffu) << (8 * e);
            reinterpret_cast<u32*>(q)[i] = w;
        }
    } else {
#pragma unroll
        for (int e = 0; e < E; ++e) q[e] = (u8)((u32)(int)rintf(v[e] * id) & 0xffu);
    }
    if (first) {
        ds[0] = amax / 127.f;
        ds[1] = sum;
    }
}

// Rotary embedding: the rotation factors (cos, sin) * mscale of pair i at position pos, the
// angle pos * inv_freq[i] in f64 as the CPU reference computes it (rope.cu; qgemv.cu's qdot
// when it ropes its own output).
__device__ __forceinline__ void rope_angle(double pos, const float* __restrict__ inv_freq, int i, float mscale,
                                           float& cf, float& sf) {
    double s, c;
    sincos(pos * (double)inv_freq[i], &s, &c);
    cf = (float)c * mscale;
    sf = (float)s * mscale;
}

// Sum over the block; every thread gets the result. `scratch` holds MAX_WARPS values.
template <typename V>
__device__ V block_sum(V v, V* scratch) {
    const int w = threadIdx.x / WARP, l = threadIdx.x % WARP, nw = blockDim.x / WARP;
    v = warp_sum(v);
    __syncthreads();
    if (l == 0) scratch[w] = v;
    __syncthreads();
    if (w == 0) {
        V t = l < nw ? scratch[l] : (V)0;
        t = warp_sum(t);
        if (l == 0) scratch[0] = t;
    }
    __syncthreads();
    return scratch[0];
}

// Max over the block; every thread gets the result.
__device__ float block_max(float v, float* scratch) {
    const int w = threadIdx.x / WARP, l = threadIdx.x % WARP, nw = blockDim.x / WARP;
    v = warp_max(v);
    __syncthreads();
    if (l == 0) scratch[w] = v;
    __syncthreads();
    if (w == 0) {
        float t = l < nw ? scratch[l] : -KILN_INF;
        t = warp_max(t);
        if (l == 0) scratch[0] = t;
    }
    __syncthreads();
    return scratch[0];
}

// Loads of what other blocks of the same launch wrote (a last block merging their partials:
// attention_decode.cu, sample.cu): from L2, never a possibly stale L1 line (NVIDIA:
// ld.global.cg; AMD: volatile loads bypass the vector L1).
__device__ __forceinline__ float ld_l2(const float* p) {
#if defined(KILN_CUDA)
    return __ldcg(p);
#else
    return *reinterpret_cast<const volatile float*>(p);
#endif
}
__device__ __forceinline__ void ld_l2_4(const float* p, float x[4]) {
#if defined(KILN_CUDA)
    const float4 v = __ldcg(reinterpret_cast<const float4*>(p));
    x[0] = v.x; x[1] = v.y; x[2] = v.z; x[3] = v.w;
#else
#pragma unroll
    for (int e = 0; e < 4; ++e) x[e] = reinterpret_cast<const volatile float*>(p)[e];
#endif
}

// 16-byte vectors: the widest single load of a thread.
struct alignas(16) vec4u {
    u32 x, y, z, w;
};
struct alignas(8) vec2u {
    u32 x, y;
};
struct alignas(16) vec4f {
    float x, y, z, w;
};

// One 16-byte chunk of storage type T: E elements, unpacked to floats.
template <typename T>
struct Chunk;
template <>
struct Chunk<bf16> {
    static constexpr int E = 8;  // elements per 16-byte chunk
    typedef vec4u Raw;
    static __device__ __forceinline__ void unpack(const Raw& r, float* k) {
        k[0] = __uint_as_float(r.x << 16); k[1] = __uint_as_float(r.x & 0xffff0000u);
        k[2] = __uint_as_float(r.y << 16); k[3] = __uint_as_float(r.y & 0xffff0000u);
        k[4] = __uint_as_float(r.z << 16); k[5] = __uint_as_float(r.z & 0xffff0000u);
        k[6] = __uint_as_float(r.w << 16); k[7] = __uint_as_float(r.w & 0xffff0000u);
    }
    static __device__ __forceinline__ Raw zero() { return Raw{0u, 0u, 0u, 0u}; }
    static __device__ __forceinline__ u32 pair(float lo, float hi) {
        return (u32)from_f<bf16>(lo).bits | ((u32)from_f<bf16>(hi).bits << 16);
    }
    // E floats rounded to one chunk.
    static __device__ __forceinline__ Raw pack(const float* v) {
        return Raw{pair(v[0], v[1]), pair(v[2], v[3]), pair(v[4], v[5]), pair(v[6], v[7])};
    }
};
template <>
struct Chunk<float> {
    static constexpr int E = 4;
    typedef vec4f Raw;
    static __device__ __forceinline__ void unpack(const Raw& r, float* k) {
        k[0] = r.x; k[1] = r.y; k[2] = r.z; k[3] = r.w;
    }
    static __device__ __forceinline__ Raw zero() { return Raw{0.f, 0.f, 0.f, 0.f}; }
    static __device__ __forceinline__ Raw pack(const float* v) { return Raw{v[0], v[1], v[2], v[3]}; }
};

// One instantiation per storage type: M(suffix, type). The host passes -DKILN_DTYPE_F32 or
// -DKILN_DTYPE_BF16 to build only the type a backend uses (default: both).
#if defined(KILN_DTYPE_F32)
#define KILN_FOR_DTYPES(M) M(f32, float)
#elif defined(KILN_DTYPE_BF16)
#define KILN_FOR_DTYPES(M) M(bf16, bf16)
#else
#define KILN_FOR_DTYPES(M) \
    M(f32, float)          \
    M(bf16, bf16)
#endif

// Compile units (`Part` in src/backend/gpu/registry/units.rs): the large sources are compiled
// once per weight type (q80 ... q6k) or head size (h64 ... hany), plus `common` for the rest
// (and i8q40 ... i8q6k: qmma.cu's 8-bit tiles of the types that do not take them by default;
// sq80 ... sq6k: qgemv.cu's streaming matmuls on float activations, bf16's fallback;
// q4km2 ...: qgemv.cu's 8-bit decode kernels of 2, 4 and 8 rows of a type, whose 1-row ones
// are in the type's part; h128q4 ...: attention_decode.cu's kernel of one head size and
// pass size; qkn: rope.cu's rope with the q/k head norms, for the models that have them),
// so a start-up waits only for the parts its model runs. The host defines every part tag
// of a unit (`Unit::text` in src/backend/gpu/registry/texts.rs): KILN_PARTS, then
// KILN_PART_<tag> as 1 for the unit's own part and as 0 for each other part of its source;
// a tag it does not define is a compile error in KILN_IN_PART. A whole-source compile
// (hipcc in CI, tests/hiprtc.rs) defines KILN_ALL_PARTS instead: every part is in.
// KILN_IN_PART(tag, ...) keeps its text only in that part; KILN_HAS_PART(tag) is 1 there
// (for `#if` around longer text).
#if defined(KILN_ALL_PARTS)
#define KILN_IN_PART(tag, ...) __VA_ARGS__
#define KILN_HAS_PART(tag) 1
#else
#define KILN_PART_IF_0(...)
#define KILN_PART_IF_1(...) __VA_ARGS__
#define KILN_PART_IF_(flag, ...) KILN_PART_IF_##flag(__VA_ARGS__)
#define KILN_PART_IF(flag, ...) KILN_PART_IF_(flag, __VA_ARGS__)
#define KILN_IN_PART(tag, ...) KILN_PART_IF(KILN_PART_##tag, __VA_ARGS__)
#define KILN_HAS_PART(tag) KILN_PART_##tag
#endif
