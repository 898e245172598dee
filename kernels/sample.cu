// Sampling on the device, one block per logits row; only ids and logprobs go back to the host.
// Mirrors the CPU sampler (src/sampling): same order of stages, same tie rules.
//
//   sample_prep:    work = float(logits); lse = log-sum-exp of the raw row
//   sample_topn:    the n largest raw logits (ties: lower id first) minus lse, in order
//   sample_penalty: per (row, token) entry: v += bias; repetition; v -= presence + frequency*count
//   sample_mask:    constrained rows: tokens their bitmask does not allow become -inf
//   sample_pick:    greedy argmax (ties: lower id), or temperature -> top-k -> min-p -> top-p -> draw
//   sample_greedy:  prep + pick in one pass, for steps whose rows are all plain greedy
//
// Row params, 8 words: greedy, inv_t, top_k, top_p, min_p, uniform, n_top, top_off.
// Output words: [token, logprob] per row, then [id, logprob] pairs at 2*rows + 2*top_off.
//
// Order without sorting: key(i) = (ordered bits of x_i) << 32 | ~i, so a larger key comes
// first in the CPU's sort (value descending, id ascending). Every cut of the sorted list
// (top-k count, top-p mass, the draw) is a radix select over keys, 8 bits at a time.

constexpr int SAMPLE_THREADS = 1024;

__device__ __forceinline__ u32 ord_bits(float x) {
    const u32 u = __float_as_uint(x);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ u64 sort_key(float x, u32 i) { return ((u64)ord_bits(x) << 32) | (u64)(~i); }

struct RadixScratch {
    u32 cnt[256];
    double mass[256];
    u64 prefix;
    double above;
};

// Key of the first element, in key-descending order over the set S, at which the running
// quantity (count, or mass e = exp(x - xmax)) reaches `target` (> when strict, else >=); the
// last element of S when it never does. S = {i : key_i >= floor and (min_p <= 0 or e_i >= min_p)},
// x_i = w[i] * inv_t.
template <bool MASS>
__device__ u64 radix_select(const float* __restrict__ w, float inv_t, int V, float xmax, u64 floor, float min_p,
                            double target, bool strict, RadixScratch* rs) {
    u64 prefix = 0;
    double above = 0.0;
    for (int shift = 56; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < 256; b += blockDim.x) {
            rs->cnt[b] = 0;
            rs->mass[b] = 0.0;
        }
        __syncthreads();
        const u64 hi = shift == 56 ? 0ull : (~0ull << (shift + 8));
        for (int i = threadIdx.x; i < V; i += blockDim.x) {
            const float x = w[i] * inv_t;
            const u64 key = sort_key(x, (u32)i);
            if (key < floor || (key & hi) != (prefix & hi)) continue;
            const float e = expf(x - xmax);
            if (min_p > 0.f && e < min_p) continue;
            const int b = (int)((key >> shift) & 255u);
            atomicAdd(&rs->cnt[b], 1u);
            if (MASS) atomicAdd(&rs->mass[b], (double)e);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            int sel = -1, last = 0;
            double acc = above, before_last = above;
            for (int b = 255; b >= 0; --b) {
                if (rs->cnt[b] == 0) continue;
                const double q = MASS ? rs->mass[b] : (double)rs->cnt[b];
                if (strict ? acc + q > target : acc + q >= target) {
                    sel = b;
                    break;
                }
                before_last = acc;
                last = b;
                acc += q;
            }
            if (sel < 0) {
                sel = last;
                acc = before_last;
            }
            rs->prefix = prefix | ((u64)sel << shift);
            rs->above = acc;
        }
        __syncthreads();
        prefix = rs->prefix;
        above = rs->above;
        __syncthreads();
    }
    return prefix;
}

// Sum of e = exp(x - xmax) over S (see radix_select), in f64.
__device__ double set_mass(const float* __restrict__ w, float inv_t, int V, float xmax, u64 floor, float min_p,
                           double* scratch) {
    double acc = 0.0;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        const float x = w[i] * inv_t;
        if (sort_key(x, (u32)i) < floor) continue;
        const float e = expf(x - xmax);
        if (min_p > 0.f && e < min_p) continue;
        acc += (double)e;
    }
    return block_sum(acc, scratch);
}

template <typename T>
__device__ void prep_impl(const T* __restrict__ logits, int V, float* __restrict__ work, float* __restrict__ lse) {
    __shared__ float scratch[MAX_WARPS];
    const size_t base = (size_t)blockIdx.x * V;
    float mx = -KILN_INF;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        const float v = to_f(logits[base + i]);
        work[base + i] = v;
        mx = fmaxf(mx, v);
    }
    mx = block_max(mx, scratch);
    float s = 0.f;
    for (int i = threadIdx.x; i < V; i += blockDim.x) s += expf(work[base + i] - mx);
    s = block_sum(s, scratch);
    if (threadIdx.x == 0) lse[blockIdx.x] = mx + logf(s);
}

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_topn(const float* work, const float* lse, const u32* params, int V, int rows, u32* out) {
    __shared__ RadixScratch rs;
    __shared__ u64 keys[SAMPLE_THREADS];
    __shared__ u32 count;
    const u32* p = params + 8 * blockIdx.x;
    const int n = min((int)p[6], V);
    if (n <= 0) return;
    const float* w = work + (size_t)blockIdx.x * V;
    const u64 pivot = radix_select<false>(w, 1.f, V, 0.f, 0ull, 0.f, (double)n, false, &rs);
    if (threadIdx.x == 0) count = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        const u64 key = sort_key(w[i], (u32)i);
        if (key >= pivot) keys[atomicAdd(&count, 1u)] = key;
    }
    __syncthreads();
    if (threadIdx.x < n) {
        const u64 key = keys[threadIdx.x];
        int rank = 0;
        for (int j = 0; j < n; ++j) rank += keys[j] > key;
        const u32 id = ~(u32)key;
        u32* o = out + 2 * (size_t)rows + 2 * ((size_t)p[7] + rank);
        o[0] = id;
        o[1] = __float_as_uint(w[id] - lse[blockIdx.x]);
    }
}

extern "C" __global__ void sample_penalty(const u32* entries, int n, float* work, int V) {
    const int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n) return;
    const u32* en = entries + 5 * (size_t)e;
    float* x = work + (size_t)en[0] * V + en[1];
    const float rep = __uint_as_float(en[3]);
    float v = *x + __uint_as_float(en[2]);
    if (rep != 1.f) v = v > 0.f ? v / rep : v * rep;
    *x = v - __uint_as_float(en[4]);
}

// One block per constrained row: rows[m] is its logits row, masks + m*W its bitmask (bit
// t%32 of word t/32 set: token t allowed). Runs after the penalties, before the pick.
extern "C" __global__ void sample_mask(const u32* rows, const u32* masks, int W, float* work, int V) {
    const u32* m = masks + (size_t)blockIdx.x * W;
    float* w = work + (size_t)rows[blockIdx.x] * V;
    for (int i = threadIdx.x; i < V; i += blockDim.x)
        if (((m[i >> 5] >> (i & 31)) & 1u) == 0u) w[i] = -KILN_INF;
}

// Block reduction of each thread's (best value, first index): the first index of the
// maximum (NONE where a thread saw nothing).
constexpr u32 NONE = 0xffffffffu;
__device__ u32 argmax_reduce(float best, u32 bi, float* vs, u32* is) {
    vs[threadIdx.x] = best;
    is[threadIdx.x] = bi;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) {
            const float ov = vs[threadIdx.x + s];
            const u32 oi = is[threadIdx.x + s];
            if (oi != NONE && (is[threadIdx.x] == NONE || ov > vs[threadIdx.x] || (ov == vs[threadIdx.x] && oi < is[threadIdx.x]))) {
                vs[threadIdx.x] = ov;
                is[threadIdx.x] = oi;
            }
        }
        __syncthreads();
    }
    return is[0];
}

// Greedy: first index of the maximum.
__device__ u32 argmax(const float* __restrict__ w, int V, float* vs, u32* is) {
    float best = -KILN_INF;
    u32 bi = NONE;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        if (bi == NONE || w[i] > best) {
            best = w[i];
            bi = (u32)i;
        }
    }
    return argmax_reduce(best, bi, vs, is);
}

__device__ u32 draw(const float* __restrict__ w, const u32* p, int V, RadixScratch* rs, float* fscratch,
                    double* dscratch) {
    const float inv_t = __uint_as_float(p[1]);
    const u32 top_k = p[2];
    const float top_p = __uint_as_float(p[3]), min_p = fminf(__uint_as_float(p[4]), 1.f);
    const float u = __uint_as_float(p[5]);
    float mx = -KILN_INF;
    for (int i = threadIdx.x; i < V; i += blockDim.x) mx = fmaxf(mx, w[i] * inv_t);
    mx = block_max(mx, fscratch);
    u64 floor = 0;
    if (top_k > 0 && top_k < (u32)V) floor = radix_select<false>(w, inv_t, V, mx, 0ull, 0.f, (double)top_k, false, rs);
    if (top_p < 1.f) {
        const double total = set_mass(w, inv_t, V, mx, floor, 0.f, dscratch);
        floor = radix_select<true>(w, inv_t, V, mx, floor, min_p, (double)top_p * total, false, rs);
    }
    const double kept = set_mass(w, inv_t, V, mx, floor, min_p, dscratch);
    const u64 key = radix_select<true>(w, inv_t, V, mx, floor, min_p, (double)u * kept, true, rs);
    return ~(u32)key;
}

template <typename T>
__device__ void pick_impl(const T* __restrict__ logits, const float* __restrict__ work, const float* __restrict__ lse,
                          const u32* __restrict__ params, int V, u32* __restrict__ out) {
    __shared__ RadixScratch rs;
    __shared__ float vs[SAMPLE_THREADS];
    __shared__ u32 is[SAMPLE_THREADS];
    __shared__ double dscratch[MAX_WARPS];
    const u32* p = params + 8 * blockIdx.x;
    const float* w = work + (size_t)blockIdx.x * V;
    const u32 token = p[0] ? argmax(w, V, vs, is) : draw(w, p, V, &rs, vs, dscratch);
    if (threadIdx.x == 0) {
        out[2 * blockIdx.x] = token;
        out[2 * blockIdx.x + 1] = __float_as_uint(to_f(logits[(size_t)blockIdx.x * V + token]) - lse[blockIdx.x]);
    }
}

// Greedy rows with no penalty, bias or top alternatives (the usual decode step): one pass
// over the raw logits gives the first index of the maximum and the log-sum-exp (online:
// each thread's sum is rescaled whenever its maximum grows), so nothing is copied. Grid
// (rows, parts): block (r, p) takes slice p of row r, ceil(V / parts) logits each (the host
// leaves no slice empty). With one part the block writes the row's result; with more, it
// writes its slice's (max value, its first index, max, sum of exp(x - max)) to
// part[4 (r parts + p)] and the last of the row's blocks to finish (counts[r], zero before
// the launch and left zero) merges them, so one row's pass is spread over many SMs (a
// single block, latency-bound, took ~30 us a row of 128K logits on an H100).
template <typename T>
__device__ void greedy_impl(const T* __restrict__ logits, int V, u32* __restrict__ out, float* __restrict__ part,
                            u32* __restrict__ counts) {
    __shared__ float vs[SAMPLE_THREADS];
    __shared__ u32 is[SAMPLE_THREADS];
    __shared__ float scratch[MAX_WARPS];
    __shared__ u32 last;
    constexpr int UN = 8;  // independent loads in flight per thread
    const int r = blockIdx.x, parts = gridDim.y, chunk = (V + parts - 1) / parts;
    const int lo = blockIdx.y * chunk, hi = min(V, lo + chunk);
    const T* row = logits + (size_t)r * V;
    float best = -KILN_INF, m = -KILN_INF, s = 0.f;
    u32 bi = NONE;
    for (int i0 = lo + threadIdx.x; i0 < hi; i0 += UN * blockDim.x) {
        float x[UN];
#pragma unroll
        for (int u = 0; u < UN; ++u) {
            const int i = i0 + u * blockDim.x;
            x[u] = i < hi ? to_f(row[i]) : -KILN_INF;
        }
        float cm = -KILN_INF;
#pragma unroll
        for (int u = 0; u < UN; ++u) {
            const int i = i0 + u * blockDim.x;
            if (i < hi && (bi == NONE || x[u] > best)) {
                best = x[u];
                bi = (u32)i;
            }
            cm = fmaxf(cm, x[u]);
        }
        if (cm > m) {
            s = m == -KILN_INF ? 0.f : s * expf(m - cm);
            m = cm;
        }
#pragma unroll
        for (int u = 0; u < UN; ++u)
            if (i0 + u * (int)blockDim.x < hi) s += expf(x[u] - m);
    }
    const u32 token = argmax_reduce(best, bi, vs, is);
    const float mx = block_max(m, scratch);
    const float sum = block_sum(m == -KILN_INF ? 0.f : s * expf(m - mx), scratch);
    if (parts == 1) {
        if (threadIdx.x == 0) {
            out[2 * r] = token;
            out[2 * r + 1] = __float_as_uint(to_f(row[token]) - (mx + logf(sum)));
        }
        return;
    }
    if (threadIdx.x == 0) {
        float* pp = part + 4 * ((size_t)r * parts + blockIdx.y);
        pp[0] = vs[0];
        pp[1] = __uint_as_float(token);
        pp[2] = mx;
        pp[3] = sum;
        __threadfence();  // the slice's result, visible to the merging block
        last = atomicAdd(&counts[r], 1u) + 1u == (u32)parts;
        if (last) atomicExch(&counts[r], 0u);  // every other block of the row has counted
    }
    __syncthreads();
    if (!last || threadIdx.x >= WARP) return;
    __threadfence();
    // One warp merges: lane l takes slices l, l + WARP, ... in order (a later slice wins a
    // tie of values only if nothing came before: the first index of the maximum).
    float bv = -KILN_INF, gm = -KILN_INF, gs = 0.f;
    u32 bt = NONE;
    for (int q = threadIdx.x; q < parts; q += WARP) {
        float v[4];
        ld_l2_4(part + 4 * ((size_t)r * parts + q), v);
        const u32 t = __float_as_uint(v[1]);
        if (bt == NONE || v[0] > bv) bv = v[0], bt = t;
        if (v[2] > gm) {
            gs = gm == -KILN_INF ? 0.f : gs * expf(gm - v[2]);
            gm = v[2];
        }
        if (v[2] != -KILN_INF) gs += v[3] * expf(v[2] - gm);
    }
#pragma unroll
    for (int o = WARP / 2; o > 0; o >>= 1) {
        const float ov = shfl_xor(bv, o), om = shfl_xor(gm, o), os = shfl_xor(gs, o);
        const u32 ot = shfl_xor(bt, o);
        if (ot != NONE && (bt == NONE || ov > bv || (ov == bv && ot < bt))) bv = ov, bt = ot;
        const float nm = fmaxf(gm, om);
        gs = (gm == -KILN_INF ? 0.f : gs * expf(gm - nm)) + (om == -KILN_INF ? 0.f : os * expf(om - nm));
        gm = nm;
    }
    if (threadIdx.x == 0) {
        out[2 * r] = bt;
        out[2 * r + 1] = __float_as_uint(to_f(row[bt]) - (gm + logf(gs)));
    }
}

#define KILN_SAMPLE(N, T)                                                                                \
    extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)                                         \
        sample_prep_##N(const T* logits, int V, float* work, float* lse) {                               \
        prep_impl<T>(logits, V, work, lse);                                                              \
    }                                                                                                    \
    extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS) sample_pick_##N(                        \
        const T* logits, const float* work, const float* lse, const u32* params, int V, u32* out) {     \
        pick_impl<T>(logits, work, lse, params, V, out);                                                 \
    }                                                                                                    \
    extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)                                         \
        sample_greedy_##N(const T* logits, int V, u32* out, float* part, u32* counts) {                  \
        greedy_impl<T>(logits, V, out, part, counts);                                                    \
    }
KILN_FOR_DTYPES(KILN_SAMPLE)
