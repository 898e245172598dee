// Quantized GGUF block types on the device (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, MXFP4): the repacked
// plane layout and each type's decoding of one "unit" into runs of 16 exact quants plus
// (scale, add). Shared by qgemv.cu (streaming GEMV) and qmma.cu (tiled tensor-core GEMM).
//
// Device layout: the host repacks each GGUF matrix once at load into planes, back to back,
// each plane 256-byte aligned and row-major with a fixed byte count per row, so that every
// lane reads its quants with 16-byte loads (the bits per weight are the file's):
//   q8_0: qs[n][k] i8                | d[n][k/32] f16
//   q4_0: qs[n][k/32][16]            | d[n][k/32] f16                (ggml nibble order)
//   q4_k: qs[n][k/256][128]          | meta[n][k/256][16]            (d, dmin, scales[12])
//   q5_k: qs[n][k/256][128]          | qh[n][k/256][32] | meta[n][k/256][16]
//   q6_k: ql[n][k/256][128]          | qh[n][k/256][64] | sc[n][k/256][16] i8 | d[n][k/256] f16
//   mxfp4: qs[n][k/32][16]           | e[n][k/32] u8                   (ggml nibble order)
// (src/backend/gpu/qweight.rs writes the same layout.)
//
// A "unit" is what one thread decodes at a time: RUNS runs of 16 weights, each run
// multiplying 16 consecutive elements of x (at xoff); bytes become exact floats through the
// exponent trick. run8() gives the same run as 4 words of signed 8-bit quants for dp4a
// against 8-bit activations (qdot in qgemv.cu): weight = sc * q, plus mn * (sum of x over
// the run's 32-element block) when XSUM (the k-quants' min and centering). The quants are
// centred (Q4_0 and Q4_K less 8, Q5_K less 16, Q6_K less 32) so that the activations'
// rounding error multiplies small values.
//
// unit8() is the decode of qdot (qgemv.cu): a whole unit's runs at once, the quants left
// uncentred as unsigned bytes (dp4a_us), scale and min decoded once per unit. Run ri's
// integer dot is taken from cw(ri) . x (signed bytes: minus the centre) instead of 0, so the
// sum is exactly run8's centred one; a run whose quant bytes are f times the quants (Q4_0 and
// Q4_K high nibbles left in place: f = 16, cw = -128 per byte) has sc divided by f, exact.

__device__ __forceinline__ size_t plane_align(size_t b) { return (b + 255) & ~(size_t)255; }

// The scale and the exact sum of one block of 32 8-bit activations (quantize_x's output,
// after the i8 plane; read by qdot in qgemv.cu and the moe8 tiles in moe_quant.cu).
struct alignas(8) QxScale {
    float d, s;
};

#if !defined(KILN_DTYPE_F32)
// One block of 32 bf16 values at `x` to the 8-bit activation layout: the signed quants to
// `qs` (32 bytes, 16-aligned), the block's (d = amax / 127, s = the exact sum) returned.
// quantize_x (qgemv.cu) and the MoE kernels' own quantization both use it, so a row has the
// same bits whichever kernel quantized it.
__device__ __forceinline__ QxScale qx32_bf16(const bf16* __restrict__ x, u8* __restrict__ qs) {
    const vec4u* src = reinterpret_cast<const vec4u*>(x);
    vec4u raw[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) raw[i] = src[i];
    float v[32];
#pragma unroll
    for (int i = 0; i < 4; ++i) Chunk<bf16>::unpack(raw[i], v + 8 * i);
    float amax = 0.f, sum = 0.f;
#pragma unroll
    for (int e = 0; e < 32; ++e) {
        amax = fmaxf(amax, fabsf(v[e]));
        sum += v[e];
    }
    const float id = amax > 0.f ? 127.f / amax : 0.f;
    u32 w[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        u32 r = 0;
#pragma unroll
        for (int e = 0; e < 4; ++e) r |= ((u32)(int)rintf(v[4 * i + e] * id) & 0xffu) << (8 * e);
        w[i] = r;
    }
    vec4u* dst = reinterpret_cast<vec4u*>(qs);
    dst[0] = vec4u{w[0], w[1], w[2], w[3]};
    dst[1] = vec4u{w[4], w[5], w[6], w[7]};
    return QxScale{amax / 127.f, sum};
}
#endif

// IEEE half to float (exact; inf/NaN kept).
__device__ __forceinline__ float half_to_f(u32 h) {
#if defined(KILN_CUDA)
    float f;
    asm("{ .reg .b16 t; mov.b16 t, %1; cvt.f32.f16 %0, t; }" : "=f"(f) : "h"((u16)h));
    return f;
#else
    const u32 sign = (h & 0x8000u) << 16;
    const u32 mag = h & 0x7fffu;
    if (mag >= 0x7c00u) return __uint_as_float(sign | 0x7f800000u | ((mag & 0x3ffu) << 13));
    return __uint_as_float(sign | __float_as_uint(__uint_as_float(mag << 13) * 5.192296858534828e33f));
#endif
}

// A quant chunk read once: past L1 on NVIDIA (never reused by this SM).
__device__ __forceinline__ vec4u ld_stream(const vec4u* p) {
#if defined(KILN_CUDA)
    vec4u r;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p));
    return r;
#else
    return *p;
#endif
}

// 2^23 + byte i of v, as a float (the byte lands in the mantissa); subtracting 2^23 + bias
// gives byte - bias exactly.
__device__ __forceinline__ float byte_f(u32 v, int i) {
#if defined(KILN_CUDA)
    return __uint_as_float(__byte_perm(v, 0x4B000000u, 0x7440u | (u32)i));
#else
    return __uint_as_float(((v >> (8 * i)) & 0xffu) | 0x4B000000u);
#endif
}

// The four bytes of v less bias, as exact floats.
__device__ __forceinline__ void q4(u32 v, float bias, float* q) {
    const float b = 8388608.0f + bias;
#pragma unroll
    for (int i = 0; i < 4; ++i) q[i] = byte_f(v, i) - b;
}

__device__ __forceinline__ u32 word(const vec4u& v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// Run ri of unit lo as exact floats q = byte - bias from a type's bytes() (the 4 words of
// the run's quant bytes: weight = sc * q + add).
template <typename Q>
__device__ __forceinline__ void run_of_bytes(const typename Q::Raw& raw, int lo, int ri, float* q, float& sc,
                                             float& add) {
    u32 v[4];
    float bias;
    Q::bytes(raw, lo, ri, v, bias, sc, add);
#pragma unroll
    for (int i = 0; i < 4; ++i) q4(v[i], bias, q + 4 * i);
}

// c + the dot product of the four signed bytes of a and of b.
__device__ __forceinline__ int dp4a(u32 a, u32 b, int c) {
#if defined(KILN_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 610
    int r;
    asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
#else
#pragma unroll
    for (int i = 0; i < 4; ++i) c += (int)(signed char)(a >> (8 * i)) * (int)(signed char)(b >> (8 * i));
    return c;
#endif
}

// c + the dot product of the four unsigned bytes of a and the four signed bytes of b.
__device__ __forceinline__ int dp4a_us(u32 a, u32 b, int c) {
#if defined(KILN_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 610
    int r;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
#else
#pragma unroll
    for (int i = 0; i < 4; ++i) c += (int)((a >> (8 * i)) & 0xffu) * (int)(signed char)(b >> (8 * i));
    return c;
#endif
}

// Each byte of v (0..127) less `bias` (at most 128), as signed bytes (no borrow crosses bytes).
__device__ __forceinline__ u32 bytes_less(u32 v, u32 bias) {
    return ((v | 0x80808080u) - bias * 0x01010101u) ^ 0x80808080u;
}


// The 6-bit (scale, min) of sub-block j of a k-quant block's 16-byte meta (d, dmin,
// scales[12]: words y, z, w); j is the same for every unit of a lane, so the shifts are too.
__device__ __forceinline__ void kq_scale_min(const vec4u& meta, int j, float& sc, float& mn) {
    const int sh = 8 * (j & 3);
    const u32 ys = meta.y >> sh, zs = meta.z >> sh, ws = meta.w >> sh;
    u32 s, m;
    if (j < 4) {
        s = ys & 63u;
        m = zs & 63u;
    } else {
        s = (ws & 15u) | ((ys >> 2) & 0x30u);
        m = ((ws >> 4) & 15u) | ((zs >> 2) & 0x30u);
    }
    sc = (float)s;
    mn = (float)m;
}

// Each type: UNIT weights per unit in RUNS runs of 16; run() gives a run's 16 quants as exact
// floats q and the run's (scale, add): weight = scale * q + add (add is 0 unless MIN).
// `lo` has the unit index's low 3 bits (the lane's: units step by whole warps).

// ---- Q8_0: unit = half a block, 16 quants (1 run) ---------------------------------------
struct Q8_0 {
    static constexpr int UNIT = 16, RUNS = 1;
    static constexpr bool MIN = false, XSUM = false, CENTRED = false;
    static __device__ __forceinline__ constexpr u32 cw(int) { return 0u; }
    static __device__ __forceinline__ constexpr bool xsum_run(int) { return false; }
    struct Row {
        const u8* qs;
        const u16* d;
    };
    struct Raw {
        vec4u q;
        u32 d;
    };
    static __device__ __forceinline__ Row row(const u8* w, int n, int k, int j) {
        const size_t qs = plane_align((size_t)n * k);
        return Row{w + (size_t)j * k, reinterpret_cast<const u16*>(w + qs) + (size_t)j * (k / 32)};
    }
    static __device__ __forceinline__ Raw load(const Row& r, int u) {
        return Raw{ld_stream(reinterpret_cast<const vec4u*>(r.qs) + u), r.d[u >> 1]};
    }
    static __device__ __forceinline__ int xoff(int u, int) { return 16 * u; }
    static __device__ __forceinline__ void run(const Raw& raw, int, int, float* q, float& sc, float& add) {
        sc = half_to_f(raw.d);
        add = 0.f;
#pragma unroll
        for (int i = 0; i < 4; ++i) q4(word(raw.q, i) ^ 0x80808080u, 128.f, q + 4 * i);
    }
    static __device__ __forceinline__ void run8(const Raw& raw, int, int, u32* q, float& sc, float& mn) {
        sc = half_to_f(raw.d);
        mn = 0.f;
#pragma unroll
        for (int i = 0; i < 4; ++i) q[i] = word(raw.q, i);
    }
    static __device__ __forceinline__ void unit8(const Raw& raw, int lo, u32 (&q)[RUNS][4], float (&sc)[RUNS],
                                                 float (&mn)[RUNS]) {
        run8(raw, lo, 0, q[0], sc[0], mn[0]);
    }
};

// ---- Q4_0: unit = one block of 32 (low nibbles: run 0, high: run 1) -----------------------
struct Q4_0 {
    static constexpr int UNIT = 32, RUNS = 2;
    static constexpr bool MIN = false, XSUM = false, CENTRED = true;
    static __device__ __forceinline__ constexpr u32 cw(int ri) { return ri == 0 ? 0xf8f8f8f8u : 0x80808080u; }
    static __device__ __forceinline__ constexpr bool xsum_run(int) { return false; }
    struct Row {
        const u8* qs;
        const u16* d;
    };
    struct Raw {
        vec4u q;
        u32 d;
    };
    static __device__ __forceinline__ Row row(const u8* w, int n, int k, int j) {
        const size_t qs = plane_align((size_t)n * (k / 2));
        return Row{w + (size_t)j * (k / 2), reinterpret_cast<const u16*>(w + qs) + (size_t)j * (k / 32)};
    }
    static __device__ __forceinline__ Raw load(const Row& r, int u) {
        return Raw{ld_stream(reinterpret_cast<const vec4u*>(r.qs) + u), r.d[u]};
    }
    static __device__ __forceinline__ int xoff(int u, int ri) { return 32 * u + 16 * ri; }
    // Run ri as 4 words of quant bytes: weight = sc * (byte - bias) + add.
    static __device__ __forceinline__ void bytes(const Raw& raw, int, int ri, u32* v, float& bias, float& sc,
                                                 float& add) {
        sc = half_to_f(raw.d);
        add = 0.f;
        bias = 8.f;
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = (word(raw.q, i) >> (4 * ri)) & 0x0f0f0f0fu;
    }
    static __device__ __forceinline__ void run(const Raw& raw, int lo, int ri, float* q, float& sc, float& add) {
        run_of_bytes<Q4_0>(raw, lo, ri, q, sc, add);
    }
    static __device__ __forceinline__ void run8(const Raw& raw, int, int ri, u32* q, float& sc, float& mn) {
        sc = half_to_f(raw.d);
        mn = 0.f;
#pragma unroll
        for (int i = 0; i < 4; ++i) q[i] = bytes_less((word(raw.q, i) >> (4 * ri)) & 0x0f0f0f0fu, 8u);
    }
    // Run 1's quants stay in the high nibbles (16 q): its scale is d / 16.
    static __device__ __forceinline__ void unit8(const Raw& raw, int, u32 (&q)[RUNS][4], float (&sc)[RUNS],
                                                 float (&mn)[RUNS]) {
        const float d = half_to_f(raw.d);
        sc[0] = d;
        sc[1] = d * 0.0625f;
        mn[0] = mn[1] = 0.f;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            q[0][i] = word(raw.q, i) & 0x0f0f0f0fu;
            q[1][i] = word(raw.q, i) & 0xf0f0f0f0u;
        }
    }
};

// ---- Q4_K / Q5_K: unit = 16 quant bytes of one 32-byte group g of a super-block: elements
// 16h..16h+16 of sub-blocks 2g (low nibbles, run 0) and 2g+1 (high nibbles, run 1) ----------
// The 6-bit scales and mins of sub-blocks 2g and 2g + 1 of a Q4_K/Q5_K super-block (its
// 16-byte meta: d, dmin, scales[12]) as bytes 0 and 1 of s2 and m2: bytes 2(g & 1) and
// 2(g & 1) + 1 of meta words y/z (g < 2) or of w's nibbles with y/z's top bits (g >= 2),
// shifts and masks that are lane constants where g is; d and dmin as floats.
__device__ __forceinline__ void kq_group_scales(const vec4u& meta, int g, u32& s2, u32& m2, float& d, float& dmin) {
    const int sh = 16 * (g & 1), ysh = sh + (g >= 2 ? 2 : 0);
    const u32 mhi = g >= 2 ? 0x3030u : 0x3f3fu, mlo = g >= 2 ? 0x0f0fu : 0u;
    s2 = ((meta.y >> ysh) & mhi) | ((meta.w >> sh) & mlo);
    m2 = ((meta.z >> ysh) & mhi) | ((meta.w >> (sh + 4)) & mlo);
    d = half_to_f(meta.x & 0xffffu);
    dmin = half_to_f(meta.x >> 16);
}

template <bool Q5>
struct QK45 {
    static constexpr int UNIT = 32, RUNS = 2;
    static constexpr bool MIN = true, XSUM = true, CENTRED = true;
    // Q5_K: -16 for both runs; Q4_K: -8, and -128 for run 1 (high nibbles in place).
    static __device__ __forceinline__ constexpr u32 cw(int ri) { return Q5 ? 0xf0f0f0f0u : ri == 0 ? 0xf8f8f8f8u : 0x80808080u; }
    static __device__ __forceinline__ constexpr bool xsum_run(int) { return true; }
    struct Row {
        const u8* qs;
        const u8* qh;
        const vec4u* meta;
    };
    struct Raw {
        vec4u q, h, meta;
    };
    static __device__ __forceinline__ Row row(const u8* w, int n, int k, int j) {
        const int nb = k / 256;
        const size_t qs = plane_align((size_t)n * nb * 128);
        const size_t qh = Q5 ? plane_align((size_t)n * nb * 32) : 0;
        return Row{w + (size_t)j * nb * 128, w + qs + (size_t)j * nb * 32,
                   reinterpret_cast<const vec4u*>(w + qs + qh) + (size_t)j * nb};
    }
    static __device__ __forceinline__ Raw load(const Row& r, int u) {
        Raw raw;
        raw.q = ld_stream(reinterpret_cast<const vec4u*>(r.qs) + u);
        raw.meta = r.meta[u >> 3];
        if (Q5) raw.h = reinterpret_cast<const vec4u*>(r.qh)[2 * (u >> 3) + (u & 1)];
        return raw;
    }
    static __device__ __forceinline__ int xoff(int u, int ri) {
        return 256 * (u >> 3) + 64 * ((u & 7) >> 1) + 16 * (u & 1) + 32 * ri;
    }
    // Run ri as 4 words of quant bytes: weight = sc * (byte - bias) + add.
    static __device__ __forceinline__ void bytes(const Raw& raw, int lo, int ri, u32* v, float& bias, float& sc,
                                                 float& add) {
        const int sub = 2 * ((lo & 7) >> 1) + ri;
        float s, m;
        kq_scale_min(raw.meta, sub, s, m);
        sc = half_to_f(raw.meta.x & 0xffffu) * s;
        add = -half_to_f(raw.meta.x >> 16) * m;
        bias = 0.f;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            v[i] = (word(raw.q, i) >> (4 * ri)) & 0x0f0f0f0fu;
            if (Q5) v[i] |= ((word(raw.h, i) >> sub) & 0x01010101u) << 4;
        }
    }
    static __device__ __forceinline__ void run(const Raw& raw, int lo, int ri, float* q, float& sc, float& add) {
        run_of_bytes<QK45>(raw, lo, ri, q, sc, add);
    }
    // weight = sc * (q - C) + (C * sc - dmin * m), C = 8 (16 for Q5_K): the constant
    // multiplies the sum of x over the whole 32-element sub-block, added by the unit of the
    // first 16 (even lo), none by the other.
    static __device__ __forceinline__ void run8(const Raw& raw, int lo, int ri, u32* q, float& sc, float& mn) {
        constexpr u32 C = Q5 ? 16u : 8u;
        const int sub = 2 * ((lo & 7) >> 1) + ri;
        float s, m;
        kq_scale_min(raw.meta, sub, s, m);
        sc = half_to_f(raw.meta.x & 0xffffu) * s;
        mn = (lo & 1) ? 0.f : fmaf((float)C, sc, -half_to_f(raw.meta.x >> 16) * m);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            u32 v = (word(raw.q, i) >> (4 * ri)) & 0x0f0f0f0fu;
            if (Q5) v |= ((word(raw.h, i) >> sub) & 0x01010101u) << 4;
            q[i] = bytes_less(v, C);
        }
    }
    // Both runs: sub-blocks 2g and 2g + 1 (g = (lo & 7) / 2, the same for every unit of a
    // lane), their scales and mins decoded at once (kq_group_scales).
    static __device__ __forceinline__ void unit8(const Raw& raw, int lo, u32 (&q)[RUNS][4], float (&sc)[RUNS],
                                                 float (&mn)[RUNS]) {
        constexpr u32 C = Q5 ? 16u : 8u;
        u32 s2, m2;
        float d, dmin;
        kq_group_scales(raw.meta, (lo & 7) >> 1, s2, m2, d, dmin);
#pragma unroll
        for (int ri = 0; ri < 2; ++ri) {
            const float s = byte_f(s2, ri) - 8388608.0f, m = byte_f(m2, ri) - 8388608.0f;
            const float scr = d * s;
            sc[ri] = Q5 || ri == 0 ? scr : scr * 0.0625f;
            mn[ri] = (lo & 1) ? 0.f : fmaf((float)C, scr, -dmin * m);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const u32 w = word(raw.q, i);
            if (Q5) {
                const int sub = 2 * ((lo & 7) >> 1);
                q[0][i] = (w & 0x0f0f0f0fu) | (((word(raw.h, i) >> sub) & 0x01010101u) << 4);
                q[1][i] = ((w >> 4) & 0x0f0f0f0fu) | (((word(raw.h, i) >> (sub + 1)) & 0x01010101u) << 4);
            } else {
                q[0][i] = w & 0x0f0f0f0fu;
                q[1][i] = w & 0xf0f0f0f0u;
            }
        }
    }
};
typedef QK45<false> Q4_K;
typedef QK45<true> Q5_K;

// ---- Q4_K for qdot only: unit = one whole 32-byte group g of a super-block (64 weights:
// sub-blocks 2g and 2g + 1), so a lane decodes the group's two scales and mins once and adds
// each sub-block's min term once. Runs: low nibbles of bytes 0-15 and 16-31 (sub-block 2g),
// then the high nibbles of the same (2g + 1, left in place: sc / 16). Same device layout
// and Row as Q4_K.
struct Q4_KW {
    static constexpr int UNIT = 64, RUNS = 4;
    static constexpr bool MIN = true, XSUM = true, CENTRED = true;
    static __device__ __forceinline__ constexpr u32 cw(int ri) { return ri < 2 ? 0xf8f8f8f8u : 0x80808080u; }
    // The min term (mn * the exact sum of x's block of 32) once per sub-block: runs 0 and 2.
    static __device__ __forceinline__ constexpr bool xsum_run(int ri) { return (ri & 1) == 0; }
    typedef Q4_K::Row Row;
    struct Raw {
        vec4u q0, q1, meta;
    };
    static __device__ __forceinline__ Row row(const u8* w, int n, int k, int j) { return Q4_K::row(w, n, k, j); }
    static __device__ __forceinline__ Raw load(const Row& r, int u) {
        const vec4u* q = reinterpret_cast<const vec4u*>(r.qs) + 2 * u;
        return Raw{ld_stream(q), ld_stream(q + 1), r.meta[u >> 2]};
    }
    static __device__ __forceinline__ int xoff(int u, int ri) {
        return 256 * (u >> 2) + 64 * (u & 3) + 16 * (ri & 1) + 32 * (ri >> 1);
    }
    static __device__ __forceinline__ void unit8(const Raw& raw, int lo, u32 (&q)[RUNS][4], float (&sc)[RUNS],
                                                 float (&mn)[RUNS]) {
        u32 s2, m2;  // g = lo & 3: the same for every unit of a lane (units step by whole warps)
        float d, dmin;
        kq_group_scales(raw.meta, lo & 3, s2, m2, d, dmin);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const float s = byte_f(s2, h) - 8388608.0f, m = byte_f(m2, h) - 8388608.0f;
            const float scr = d * s;
            sc[2 * h] = sc[2 * h + 1] = h == 0 ? scr : scr * 0.0625f;
            mn[2 * h] = fmaf(8.f, scr, -dmin * m);
            mn[2 * h + 1] = 0.f;
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            q[0][i] = word(raw.q0, i) & 0x0f0f0f0fu;
            q[1][i] = word(raw.q1, i) & 0x0f0f0f0fu;
            q[2][i] = word(raw.q0, i) & 0xf0f0f0f0u;
            q[3][i] = word(raw.q1, i) & 0xf0f0f0f0u;
        }
    }
};

// ---- Q6_K: unit = l0..l0+16 of one half h of a super-block: 4 runs, one scale each --------
struct Q6_K {
    static constexpr int UNIT = 64, RUNS = 4;
    static constexpr bool MIN = false, XSUM = false, CENTRED = true;
    static __device__ __forceinline__ constexpr u32 cw(int) { return 0xe0e0e0e0u; }
    static __device__ __forceinline__ constexpr bool xsum_run(int) { return false; }
    struct Row {
        const u8* ql;
        const u8* qh;
        const vec4u* sc;
        const u16* d;
    };
    struct Raw {
        vec4u a, b, h, sc;
        u32 d;
    };
    static __device__ __forceinline__ Row row(const u8* w, int n, int k, int j) {
        const int nb = k / 256;
        const size_t ql = plane_align((size_t)n * nb * 128);
        const size_t qh = plane_align((size_t)n * nb * 64);
        const size_t sc = plane_align((size_t)n * nb * 16);
        return Row{w + (size_t)j * nb * 128, w + ql + (size_t)j * nb * 64,
                   reinterpret_cast<const vec4u*>(w + ql + qh) + (size_t)j * nb,
                   reinterpret_cast<const u16*>(w + ql + qh + sc) + (size_t)j * nb};
    }
    // u: super-block u/4, half h = (u/2)&1, l0 = 16 (u&1).
    static __device__ __forceinline__ Raw load(const Row& r, int u) {
        const int b = u >> 2, h = (u >> 1) & 1, c = u & 1;
        const vec4u* ql = reinterpret_cast<const vec4u*>(r.ql) + 8 * b + 4 * h + c;
        Raw raw;
        raw.a = ld_stream(ql);
        raw.b = ld_stream(ql + 2);
        raw.h = ld_stream(reinterpret_cast<const vec4u*>(r.qh) + 4 * b + 2 * h + c);
        raw.sc = r.sc[b];
        raw.d = r.d[b];
        return raw;
    }
    static __device__ __forceinline__ int xoff(int u, int ri) {
        return 256 * (u >> 2) + 128 * ((u >> 1) & 1) + 16 * (u & 1) + 32 * ri;
    }
    // Run ri as 4 words of quant bytes: weight = sc * (byte - bias) + add.
    static __device__ __forceinline__ void bytes(const Raw& raw, int lo, int ri, u32* v, float& bias, float& sc,
                                                 float& add) {
        const int h = (lo >> 1) & 1, c = lo & 1;
        // scales[8h + c + 2ri]: word 2h (ri < 2) or 2h + 1, byte (c + 2ri) & 3.
        const u32 wsel = ri < 2 ? (h ? raw.sc.z : raw.sc.x) : (h ? raw.sc.w : raw.sc.y);
        const int s = (int)(signed char)((wsel >> (8 * ((c + 2 * ri) & 3))) & 0xffu);
        sc = half_to_f(raw.d) * (float)s;
        add = 0.f;
        bias = 32.f;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const u32 lw = word(ri & 1 ? raw.b : raw.a, i);
            const u32 qq = (ri < 2 ? lw : lw >> 4) & 0x0f0f0f0fu;
            v[i] = qq | (((word(raw.h, i) >> (2 * ri)) & 0x03030303u) << 4);
        }
    }
    static __device__ __forceinline__ void run(const Raw& raw, int lo, int ri, float* q, float& sc, float& add) {
        run_of_bytes<Q6_K>(raw, lo, ri, q, sc, add);
    }
    static __device__ __forceinline__ void run8(const Raw& raw, int lo, int ri, u32* q, float& sc, float& mn) {
        const int h = (lo >> 1) & 1, c = lo & 1;
        const u32 wsel = ri < 2 ? (h ? raw.sc.z : raw.sc.x) : (h ? raw.sc.w : raw.sc.y);
        const int s = (int)(signed char)((wsel >> (8 * ((c + 2 * ri) & 3))) & 0xffu);
        sc = half_to_f(raw.d) * (float)s;
        mn = 0.f;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const u32 lw = word(ri & 1 ? raw.b : raw.a, i);
            const u32 qq = (ri < 2 ? lw : lw >> 4) & 0x0f0f0f0fu;
            const u32 hb = ((word(raw.h, i) >> (2 * ri)) & 0x03030303u) << 4;
            q[i] = bytes_less(qq | hb, 32u);
        }
    }
    static __device__ __forceinline__ void unit8(const Raw& raw, int lo, u32 (&q)[RUNS][4], float (&sc)[RUNS],
                                                 float (&mn)[RUNS]) {
        const int h = (lo >> 1) & 1, c = lo & 1;
        const float d = half_to_f(raw.d);
#pragma unroll
        for (int ri = 0; ri < 4; ++ri) {
            const u32 wsel = ri < 2 ? (h ? raw.sc.z : raw.sc.x) : (h ? raw.sc.w : raw.sc.y);
            const int s = (int)(signed char)((wsel >> (8 * ((c + 2 * ri) & 3))) & 0xffu);
            sc[ri] = d * (float)s;
            mn[ri] = 0.f;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const u32 lw = word(ri & 1 ? raw.b : raw.a, i);
                const u32 qq = (ri < 2 ? lw : lw >> 4) & 0x0f0f0f0fu;
                const u32 hb = ((word(raw.h, i) >> (2 * ri)) & 0x03030303u) << 4;
                q[ri][i] = qq | hb;
            }
        }
    }
};

// ---- MXFP4 (ggml type 39): unit = one block of 32 (low nibbles: elements 0..16, run 0;
// high nibbles: elements 16..32, run 1) ------------------------------------------------------
// Device layout: qs[n][k/32][16] (the file's nibble bytes) | e[n][k/32] u8 (the E8M0 bytes).
// weight = KV[nibble] * 2^(e - 128), KV the E2M1 values doubled (ggml's kvalues_mxfp4: 0, 1,
// 2, 3, 4, 6, 8, 12, then the same negated; nibble 8 is -0) and 2^(e - 128) ggml's
// e8m0_to_fp32_half (e 0 and 1: the f32 subnormals 2^-128, 2^-127). Every weight is exact in
// f32 and bf16 (two significant bits times a power of two). The nibbles are looked up four at
// a time by byte permutes over a 16-byte table: signed KV for the dp4a paths (run8, unit8),
// KV + 12 (bytes 0..24, below 128) for the float and bf16-pair paths (bytes, bias 12).

// Byte i of the result is byte (s >> 4i) & 7 of the 8 bytes (lo, hi); the selector's nibbles
// must be below 8.
__device__ __forceinline__ u32 perm8(u32 lo, u32 hi, u32 s) {
#if defined(KILN_CUDA)
    return __byte_perm(lo, hi, s);
#else
    const unsigned long long t = ((unsigned long long)hi << 32) | lo;
    u32 r = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) r |= (u32)((t >> (8 * ((s >> (4 * i)) & 7u))) & 0xffu) << (8 * i);
    return r;
#endif
}

// The 16-entry byte table t (entry i: byte i % 4 of word i / 4) at the four nibbles of s's low
// 16 bits: byte i of the result is t[nibble i].
__device__ __forceinline__ u32 fp4_lut(u32 s, u32 t0, u32 t1, u32 t2, u32 t3) {
    const u32 m = s & 0x7777u;
    const u32 pos = perm8(t0, t1, m), neg = perm8(t2, t3, m);
    // Nibble i's bit 3 picks byte i of neg (selector i + 4) over byte i of pos (i).
    return perm8(pos, neg, 0x3210u | ((s & 0x8888u) >> 1));
}

// Quant word w (bytes b..b+3 of a block: low nibbles elements b.., high nibbles b+16..)
// through the table: lo = elements b..b+3 (run 0), hi = b+16..b+19 (run 1), one byte each.
__device__ __forceinline__ void fp4_word(u32 w, u32 t0, u32 t1, u32 t2, u32 t3, u32& lo, u32& hi) {
    const u32 a = fp4_lut(w, t0, t1, t2, t3);        // elements b, b+16, b+1, b+17
    const u32 b = fp4_lut(w >> 16, t0, t1, t2, t3);  // elements b+2, b+18, b+3, b+19
    lo = perm8(a, b, 0x6420u);
    hi = perm8(a, b, 0x7531u);
}

// KV as signed bytes, and KV + 12.
#define KILN_FP4_SIGNED 0x03020100u, 0x0C080604u, 0xFDFEFF00u, 0xF4F8FAFCu
#define KILN_FP4_BIASED 0x0F0E0D0Cu, 0x18141210u, 0x090A0B0Cu, 0x00040608u

// 2^(e - 128) as a float, exactly.
__device__ __forceinline__ float e8m0_half(u32 e) {
    return __uint_as_float(e < 2u ? 0x00200000u << e : (e - 1u) << 23);
}

struct MXFP4 {
    static constexpr int UNIT = 32, RUNS = 2;
    static constexpr bool MIN = false, XSUM = false, CENTRED = false;
    static __device__ __forceinline__ constexpr u32 cw(int) { return 0u; }
    static __device__ __forceinline__ constexpr bool xsum_run(int) { return false; }
    struct Row {
        const u8* qs;
        const u8* e;
    };
    struct Raw {
        vec4u q;
        u32 e;
    };
    static __device__ __forceinline__ Row row(const u8* w, int n, int k, int j) {
        const size_t qs = plane_align((size_t)n * (k / 2));
        return Row{w + (size_t)j * (k / 2), w + qs + (size_t)j * (k / 32)};
    }
    static __device__ __forceinline__ Raw load(const Row& r, int u) {
        return Raw{ld_stream(reinterpret_cast<const vec4u*>(r.qs) + u), r.e[u]};
    }
    static __device__ __forceinline__ int xoff(int u, int ri) { return 32 * u + 16 * ri; }
    // Run ri as 4 words of quant bytes: weight = sc * (byte - bias) + add.
    static __device__ __forceinline__ void bytes(const Raw& raw, int, int ri, u32* v, float& bias, float& sc,
                                                 float& add) {
        sc = e8m0_half(raw.e);
        add = 0.f;
        bias = 12.f;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            u32 lo, hi;
            fp4_word(word(raw.q, i), KILN_FP4_BIASED, lo, hi);
            v[i] = ri == 0 ? lo : hi;
        }
    }
    static __device__ __forceinline__ void run(const Raw& raw, int lo, int ri, float* q, float& sc, float& add) {
        run_of_bytes<MXFP4>(raw, lo, ri, q, sc, add);
    }
    static __device__ __forceinline__ void run8(const Raw& raw, int, int ri, u32* q, float& sc, float& mn) {
        sc = e8m0_half(raw.e);
        mn = 0.f;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            u32 lo, hi;
            fp4_word(word(raw.q, i), KILN_FP4_SIGNED, lo, hi);
            q[i] = ri == 0 ? lo : hi;
        }
    }
    static __device__ __forceinline__ void unit8(const Raw& raw, int, u32 (&q)[RUNS][4], float (&sc)[RUNS],
                                                 float (&mn)[RUNS]) {
        sc[0] = sc[1] = e8m0_half(raw.e);
        mn[0] = mn[1] = 0.f;
#pragma unroll
        for (int i = 0; i < 4; ++i) fp4_word(word(raw.q, i), KILN_FP4_SIGNED, q[0][i], q[1][i]);
    }
};
