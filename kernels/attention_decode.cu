// Decode variant (vLLM paged-attention style) for items of at most QV query vectors (decode
// rows: nrows * G <= 8). Same items and block as attn_impl, grid transposed (KV head, item);
// head sizes whose rows are a power of two of 16-byte chunks (64, 128, 256).
//
// With a sliding window the streams start at the pass's window (attn_window), so only the
// window's K/V rows are read; a soft cap applies tanh to each score before the mask.
//
// A thread group of TPR lanes reads one K (and V) row together, lane t taking 16-byte chunks
// t, t + TPR, ... (CPL chunks): the warp reads WARP / TPR whole rows per load, coalesced.
// Each group is an independent online-softmax stream over U consecutive positions per
// step, K and V of all U positions loaded before first use (U * CPL * 2 loads in flight per
// lane), all QV query vectors (held in registers, pre-scaled, log2 domain) reusing every
// load. A score is the group's xor-shuffle sum, so every lane of the group holds it and
// accumulates its own dims of P . V with no shared memory. At the end the streams of a warp
// merge through shuffles, the warps through shared memory.

// The decode variant stages K/V in shared memory a few steps ahead by cp.async (NVIDIA sm_80+,
// prelude.cuh) without holding them in registers. Each thread copies and later reads only
// its own slots, so waiting on its own groups is all the ordering needed.

// Part k's weight: exp(m_k - mx), 0 for a part that saw no position.
__device__ __forceinline__ float combine_weight(const float* __restrict__ ml, size_t ml_stride, int k, float mx) {
    const float m = ml[(size_t)k * ml_stride];
    return m == -KILN_INF ? 0.f : expf(m - mx);
}

// The split-K merge of one KV head's G query heads by the last of its part blocks
// (attn_dec_impl): the same result as attn_combine for those heads, in one pass over all G
// heads (no launch of its own). sp: the split row (row, first part, number of parts). Warp w
// weighs heads w, w + NW, ... (each part's exp(m - max), lanes over the parts); then each
// thread sums VW dims of one head over every part, its loads independent. With xq, the
// rounded outputs also go out as 8-bit rows (attn_combine's combine_quant, VW lanes wide).
// Shared memory: the G x np weights, G reciprocal sums and G counts of parts read (np <= 64,
// G <= 16: the host's limits, within every decode variant's buffer).
template <typename T, int D, int SMEM_BYTES>
__device__ __forceinline__ void attn_dec_merge(unsigned char* smem, const float* part_acc,
                                               const float* part_ml, const u32* __restrict__ sp,
                                               T* __restrict__ out, u8* __restrict__ xq, int rows, int kvh, int G,
                                               int n_heads, const T* __restrict__ sinks) {
    constexpr int VW = 4;
    constexpr int LPB = 32 / VW;  // lanes per block of 32 dims
    const size_t row = sp[0];
    const int p0 = sp[1], np = sp[2], h0 = kvh * G;
    float* w_s = reinterpret_cast<float*>(smem);  // [G][np]
    float* inv_s = w_s + G * np;                  // [G]
    int* used_s = reinterpret_cast<int*>(inv_s + G);  // [G]
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, nw = blockDim.x / WARP;
    const size_t ml_stride = 2 * (size_t)n_heads;
    for (int j = warp; j < G; j += nw) {
        const float* ml = part_ml + ((size_t)p0 * n_heads + h0 + j) * 2;
        float mx = -KILN_INF;
        // The parts past the last that saw a position (a graph's fixed part count over a
        // shorter context: the trailing parts are empty) are not read below.
        int used = 0;
        for (int k = lane; k < np; k += WARP) {
            const float m = ld_l2(ml + (size_t)k * ml_stride);
            mx = fmaxf(mx, m);
            if (m != -KILN_INF) used = k + 1;
        }
        mx = warp_max(mx);
        // The head's sink joins the denominator once, here: the weights are taken against
        // max(parts, sink) and the sink adds exp(sink - mx) to the sum.
        const float sk = sinks != nullptr ? to_f(sinks[h0 + j]) : -KILN_INF;
        mx = fmaxf(mx, sk);
#pragma unroll
        for (int o = WARP / 2; o > 0; o >>= 1) used = max(used, shfl_xor(used, o));
        float sum = 0.f;
        for (int k = lane; k < used; k += WARP) {
            const float m = ld_l2(ml + (size_t)k * ml_stride);
            const float w = m == -KILN_INF ? 0.f : expf(m - mx);
            w_s[j * np + k] = w;
            sum += w * ld_l2(ml + (size_t)k * ml_stride + 1);
        }
        sum = warp_sum(sum);
        if (sinks != nullptr) sum += expf(sk - mx);
        if (lane == 0) {
            inv_s[j] = sum > 0.f ? 1.f / sum : 0.f;
            used_s[j] = used;
        }
    }
    __syncthreads();
    const size_t acc_stride = (size_t)n_heads * D;
    const size_t width = (size_t)n_heads * D;
    constexpr int NV = D / VW;  // vectors per head
    const int total = G * NV;
    // Block-uniform passes: every lane takes part in the quantization's shuffles.
    for (int base = 0; base < total; base += blockDim.x) {
        const int idx = base + threadIdx.x;
        const bool ok = idx < total;
        const int j = ok ? idx / NV : 0, v = ok ? idx % NV : 0;
        float a[VW];
#pragma unroll
        for (int e = 0; e < VW; ++e) a[e] = 0.f;
        if (ok) {
            const float* acc = part_acc + ((size_t)p0 * n_heads + h0 + j) * D + v * VW;
            const float* w = w_s + j * np;
            const int used = used_s[j];
#pragma unroll 8
            for (int k = 0; k < used; ++k) {
                float x[VW];
                ld_l2_4(acc + (size_t)k * acc_stride, x);
#pragma unroll
                for (int e = 0; e < VW; ++e) a[e] += w[k] * x[e];
            }
        }
        const float inv = ok ? inv_s[j] : 0.f;
        float r[VW];
        T* o = out + row * width + (size_t)(h0 + j) * D + v * VW;
#pragma unroll
        for (int e = 0; e < VW; ++e) {
            const T t = from_f<T>(a[e] * inv);
            if (ok) o[e] = t;
            r[e] = to_f(t);
        }
        if (xq) {
            const size_t at = row * width + (size_t)(h0 + j) * D + v * VW;
            float* ds = reinterpret_cast<float*>(xq + (((size_t)rows * width + 255) & ~(size_t)255));
            qx_lanes<VW>(r, ok, v % LPB == 0, xq + at, ds + 2 * (at / 32));
        }
    }
}

template <typename T, int D, int QV>
__device__ __forceinline__ void attn_dec_impl(const T* __restrict__ qkv, int qkv_stride, const T* __restrict__ k_cache,
                              const T* __restrict__ v_cache, T* __restrict__ out, float* __restrict__ part_acc,
                              float* __restrict__ part_ml, const u32* __restrict__ positions,
                              const u32* __restrict__ seqinfo, const u32* __restrict__ tables,
                              const u32* __restrict__ items, int n_heads, int n_kv, int block_size, float scale,
                              int window, float softcap, const u32* __restrict__ splits,
                              const u32* __restrict__ part_split, u32* __restrict__ counters, u8* __restrict__ xq,
                              int rows, const T* __restrict__ sinks) {
    typedef Chunk<T> C;
    typedef typename C::Raw Raw;
    constexpr int E = C::E;
    constexpr int NCH = D / E;                        // 16-byte chunks per row
    constexpr int TPR = NCH < 16 ? NCH : 16;          // lanes per row (thread group)
    constexpr int CPL = NCH / TPR;                    // chunks per lane
    constexpr int RPW = WARP / TPR;                   // rows (streams) per warp
    constexpr int NW = ATTN_WARPS;
    constexpr int S = NW * RPW;                       // streams per block
    // Positions per stream and step: 8 chunks of K/V per thread and step for up to 4
    // vectors of one-chunk lanes (head 128 bf16); 2 positions for wider lanes (head 256
    // bf16: the same 8 chunks, so three stages fit the shared memory).
    constexpr int U = CPL > 1 ? 2 : QV <= 4 ? 4 : 2;
    static_assert(NCH % TPR == 0 && WARP % TPR == 0, "decode attention: head size");
    // Stages of K/V staged ahead in shared memory (cp.async), each thread's U x 2 x CPL
    // chunks per stage in its own slots; 0 loads straight into registers (AMD, pre-sm_80,
    // and shapes whose stages would not fit). The merge buffers reuse the same memory.
    constexpr int NT = NW * WARP;
    constexpr int STAGE = U * 2 * CPL;                // chunks per thread and stage
    constexpr int MERGE_BYTES = NW * QV * (D + 2) * 4;
#if defined(KILN_SM80)
    constexpr int SMEM_MAX = 48 * 1024;               // static shared memory per block
    constexpr int NST = 3 * STAGE * NT * 16 <= SMEM_MAX ? 3 : 2 * STAGE * NT * 16 <= SMEM_MAX ? 2 : 0;
#else
    constexpr int NST = 0;
#endif
    constexpr int STAGE_BYTES = NST * STAGE * NT * 16;
    constexpr int SMEM_BYTES = STAGE_BYTES > MERGE_BYTES ? STAGE_BYTES : MERGE_BYTES;
    __shared__ __align__(16) unsigned char smem[SMEM_BYTES];
    float(*o_s)[QV][D] = reinterpret_cast<float(*)[QV][D]>(smem);
    float(*m_s)[QV] = reinterpret_cast<float(*)[QV]>(smem + NW * QV * D * 4);
    float(*l_s)[QV] = reinterpret_cast<float(*)[QV]>(smem + NW * QV * (D + 1) * 4);
    Raw* stage_s = reinterpret_cast<Raw*>(smem);      // [NST][STAGE][NT]

    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int t = lane % TPR, stream = warp * RPW + lane / TPR;
    KILN_PDL_TRIGGER();
    // The step's metadata (items, positions, tables) is no predecessor's output: the first
    // pass reads it, up to its first block-table entry, before KILN_PDL_WAIT (while the
    // kernel before drains); q and the cache only after.
    // Grid (KV head, item), heads fastest: the blocks of one row's heads run together and
    // read the same cache slots (each slot row holds every head) at about the same time.
    const u32* it = items + 6 * (size_t)blockIdx.y;
    const int seq = it[0], row0 = it[1], nrows = it[2], item_kv0 = it[3], item_kv1 = it[4];
    const u32 part = it[5];
    const int kvh = blockIdx.x, G = n_heads / n_kv, width = n_kv * D;
    const u32* table = tables + seqinfo[4 * seq + 3];
    const T* kbase = k_cache + (size_t)kvh * D;
    const T* vbase = v_cache + (size_t)kvh * D;
    const int nvec = nrows * G;
    // Queries are pre-multiplied by logit.a: scores come out in the log2 domain, or as the
    // tanh argument when soft-capped.
    const Logit logit(scale, softcap, ATTN_LOG2E);
    const float sl2 = logit.a;
    const int win = attn_win(window);

    for (int vb = 0; vb < nvec; vb += QV) {
        const int nv = min(QV, nvec - vb);
        int qpos[QV];
        int maxpos = -1;
#pragma unroll
        for (int i = 0; i < QV; ++i) {
            const int v = vb + i;
            qpos[i] = i < nv ? (int)positions[row0 + v / G] : -1;
            maxpos = max(maxpos, qpos[i]);
        }
        // The smallest query position of the pass: steps wholly below it need no mask
        // (vectors past nv have q = 0 and are never stored).
        int minpos = maxpos;
#pragma unroll
        for (int i = 0; i < QV; ++i)
            if (i < nv) minpos = min(minpos, qpos[i]);
        int kv1 = item_kv1;
        const int kv0 = attn_window(item_kv0, kv1, part, minpos, maxpos, window);
        const int lim = min(kv1, maxpos + 1);

        // The U positions of a stream share one block-table entry when blocks and the item's
        // start are multiples of U (the usual case): that entry is loaded one step ahead so
        // the K/V loads do not wait on it. Otherwise each position looks its entry up.
        const bool one = block_size % U == 0 && kv0 % U == 0;
        // When a step (S * U positions) is also a whole number of blocks, a stream's offset
        // inside its block is the same at every step and its table index advances by a
        // constant: no division per step (the loop is issue-bound at short contexts).
        const bool fast = one && (S * U) % block_size == 0;
        const int first = kv0 + stream * U;
        int tidx = first / block_size;
        const int off0 = first - tidx * block_size, tstep = (S * U) / block_size;
        u32 blk = 0;
        if (one && first < lim) blk = table[tidx];
        if (vb == 0) KILN_PDL_WAIT();  // every block, once, before q and the cache
        float q[QV][CPL][E];
#pragma unroll
        for (int i = 0; i < QV; ++i) {
            const int v = vb + i;
            const T* qr = qkv + (i < nv ? (size_t)(row0 + v / G) * qkv_stride + (size_t)(kvh * G + v % G) * D : 0);
#pragma unroll
            for (int c = 0; c < CPL; ++c) {
                const Raw r = i < nv ? reinterpret_cast<const Raw*>(qr)[t + c * TPR] : C::zero();
                C::unpack(r, q[i][c]);
#pragma unroll
                for (int e = 0; e < E; ++e) q[i][c][e] *= sl2;
            }
        }
        float m[QV], l[QV], acc[QV][CPL][E];
#pragma unroll
        for (int i = 0; i < QV; ++i) {
            m[i] = -KILN_INF;
            l[i] = 0.f;
#pragma unroll
            for (int c = 0; c < CPL; ++c)
#pragma unroll
                for (int e = 0; e < E; ++e) acc[i][c][e] = 0.f;
        }
        // The chunks of step position p0's U positions: K/V addresses (ok: inside the item).
        // Advances `blk` to the entry of the stream's next step.
        auto addresses = [&](int p0, const Raw* kp[U], const Raw* vp[U], bool ok[U]) {
            if (fast) {
                const size_t slot0 = (size_t)blk * block_size + off0;
                const Raw* k0 = reinterpret_cast<const Raw*>(kbase + slot0 * width) + t;
                const Raw* v0 = reinterpret_cast<const Raw*>(vbase + slot0 * width) + t;
                const int row = width / E;  // chunks per cache slot
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    ok[u] = p0 + u < lim;
                    kp[u] = k0 + u * row;
                    vp[u] = v0 + u * row;
                }
                tidx += tstep;
                if (p0 + S * U < lim) blk = table[tidx];
                return;
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int pos = p0 + u;
                ok[u] = pos < lim;
                const u32 b = ok[u] ? (one ? blk : table[pos / block_size]) : 0u;
                const size_t slot = ok[u] ? (size_t)b * block_size + pos % block_size : 0;
                kp[u] = reinterpret_cast<const Raw*>(kbase + slot * width) + t;
                vp[u] = reinterpret_cast<const Raw*>(vbase + slot * width) + t;
            }
            if (one && p0 + S * U < lim) blk = table[(p0 + S * U) / block_size];
        };
        // Stage ahead: issue the copies of step j (group j), NST - 1 steps before its use.
        auto issue = [&](int j) {
#if defined(KILN_SM80)
            const int c0 = kv0 + j * S * U;
            if (c0 < lim) {
                const Raw* kp[U];
                const Raw* vp[U];
                bool ok[U];
                addresses(c0 + stream * U, kp, vp, ok);
                Raw* dst = stage_s + (size_t)(j % (NST > 0 ? NST : 1)) * STAGE * NT + threadIdx.x;
#pragma unroll
                for (int u = 0; u < U; ++u)
#pragma unroll
                    for (int c = 0; c < CPL; ++c) {
                        cp_async16(smem_u32(dst + ((u * 2) * CPL + c) * NT), kp[u] + c * TPR, ok[u] ? 16u : 0u);
                        cp_async16(smem_u32(dst + ((u * 2 + 1) * CPL + c) * NT), vp[u] + c * TPR, ok[u] ? 16u : 0u);
                    }
            }
            cp_async_commit();
#else
            (void)j;
#endif
        };
        if constexpr (NST > 0) {
#pragma unroll
            for (int j = 0; j < NST - 1; ++j) issue(j);
        }
        for (int c0 = kv0, j = 0; c0 < lim; c0 += S * U, ++j) {
            const int p0 = c0 + stream * U;
            Raw kr[U][CPL], vr[U][CPL];
            if constexpr (NST > 0) {
                issue(j + NST - 1);
#if defined(KILN_SM80)
                cp_async_wait<NST - 1>();
#endif
                const Raw* src = stage_s + (size_t)(j % (NST > 0 ? NST : 1)) * STAGE * NT + threadIdx.x;
#pragma unroll
                for (int u = 0; u < U; ++u)
#pragma unroll
                    for (int c = 0; c < CPL; ++c) {
                        kr[u][c] = src[((u * 2) * CPL + c) * NT];
                        vr[u][c] = src[((u * 2 + 1) * CPL + c) * NT];
                    }
            } else {
                const Raw* kp[U];
                const Raw* vp[U];
                bool ok[U];
                addresses(p0, kp, vp, ok);
#pragma unroll
                for (int u = 0; u < U; ++u)
#pragma unroll
                    for (int c = 0; c < CPL; ++c) {
                        kr[u][c] = ok[u] ? kp[u][c * TPR] : C::zero();
                        vr[u][c] = ok[u] ? vp[u][c * TPR] : C::zero();
                    }
            }
            // Scores of the U positions for every vector (log2 domain).
            float s[U][QV];
#pragma unroll
            for (int u = 0; u < U; ++u) {
#pragma unroll
                for (int i = 0; i < QV; ++i) s[u][i] = 0.f;
#pragma unroll
                for (int c = 0; c < CPL; ++c) {
                    float k[E];
                    C::unpack(kr[u][c], k);
#pragma unroll
                    for (int i = 0; i < QV; ++i) {
#pragma unroll
                        for (int e = 0; e < E; ++e) s[u][i] += q[i][c][e] * k[e];
                    }
                }
            }
#pragma unroll
            for (int o = 1; o < TPR; o <<= 1) {
#pragma unroll
                for (int u = 0; u < U; ++u)
#pragma unroll
                    for (int i = 0; i < QV; ++i) s[u][i] += shfl_xor(s[u][i], o);
            }
            if (logit.capped) {
#pragma unroll
                for (int u = 0; u < U; ++u)
#pragma unroll
                    for (int i = 0; i < QV; ++i) s[u][i] = logit.of_scaled(s[u][i]);
            }
            // Masks only where the step reaches past a limit (the last steps of an item) or
            // starts where the window may not reach (the first steps).
            const bool edge = p0 + U > lim || p0 + U - 1 > minpos || maxpos - p0 >= win;
            float p[U][QV];
#pragma unroll
            for (int i = 0; i < QV; ++i) {
                float mx = -KILN_INF;
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    const int pos = p0 + u;
                    if (edge) s[u][i] = (pos < lim && pos <= qpos[i] && qpos[i] - pos < win) ? s[u][i] : -KILN_INF;
                    mx = fmaxf(mx, s[u][i]);
                }
                // Lazy rescaling: the reference max moves (and acc, l are rescaled) only when
                // a score exceeds it by more than 2^8; below that, exp2 terms up to 256 are
                // exact enough in f32 and l, acc keep the same reference.
                if (mx > m[i] + 8.f) {
                    const float corr = exp2f(m[i] - mx);
                    m[i] = mx;
                    l[i] *= corr;
#pragma unroll
                    for (int c = 0; c < CPL; ++c)
#pragma unroll
                        for (int e = 0; e < E; ++e) acc[i][c][e] *= corr;
                }
                const float ref = m[i] == -KILN_INF ? 0.f : m[i];
                float sum = 0.f;
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    p[u][i] = exp2f(s[u][i] - ref);
                    sum += p[u][i];
                }
                l[i] += sum;
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
#pragma unroll
                for (int c = 0; c < CPL; ++c) {
                    float v[E];
                    C::unpack(vr[u][c], v);
#pragma unroll
                    for (int i = 0; i < QV; ++i) {
#pragma unroll
                        for (int e = 0; e < E; ++e) acc[i][c][e] += p[u][i] * v[e];
                    }
                }
            }
        }

        // The merge buffers below reuse other warps' stage slots.
        if constexpr (NST > 0) __syncthreads();
        // Merge the RPW streams of the warp (lanes t, t + TPR, ...) through shuffles.
#pragma unroll
        for (int i = 0; i < QV; ++i) {
            float mw = m[i];
#pragma unroll
            for (int o = TPR; o < WARP; o <<= 1) mw = fmaxf(mw, shfl_xor(mw, o));
            const float f = m[i] == -KILN_INF ? 0.f : exp2f(m[i] - mw);
            float lw = l[i] * f;
#pragma unroll
            for (int o = TPR; o < WARP; o <<= 1) lw += shfl_xor(lw, o);
#pragma unroll
            for (int c = 0; c < CPL; ++c) {
#pragma unroll
                for (int e = 0; e < E; ++e) {
                    float a = acc[i][c][e] * f;
#pragma unroll
                    for (int o = TPR; o < WARP; o <<= 1) a += shfl_xor(a, o);
                    acc[i][c][e] = a;
                }
            }
            m[i] = mw;
            l[i] = lw;
        }
        if (lane < TPR) {
#pragma unroll
            for (int i = 0; i < QV; ++i) {
                if (lane == 0) {
                    m_s[warp][i] = m[i];
                    l_s[warp][i] = l[i];
                }
#pragma unroll
                for (int c = 0; c < CPL; ++c)
#pragma unroll
                    for (int e = 0; e < E; ++e) o_s[warp][i][(t + c * TPR) * E + e] = acc[i][c][e];
            }
        }
        __syncthreads();
        for (int e = threadIdx.x; e < nv * D; e += blockDim.x) {
            const int i = e / D, d = e % D;
            float mx = -KILN_INF;
#pragma unroll
            for (int w = 0; w < NW; ++w) mx = fmaxf(mx, m_s[w][i]);
            float sum = 0.f, o = 0.f;
#pragma unroll
            for (int w = 0; w < NW; ++w) {
                const float f = m_s[w][i] == -KILN_INF ? 0.f : exp2f(m_s[w][i] - mx);
                sum += l_s[w][i] * f;
                o += o_s[w][i][d] * f;
            }
            const int v = vb + i, h = kvh * G + v % G;
            store_result<T>(out, part_acc, part_ml, part, (size_t)(row0 + v / G), h, d, n_heads, D, o, sum,
                             mx * 0.6931471805599453f, sinks);
        }
        __syncthreads();
    }
    if (nvec <= 0) KILN_PDL_WAIT();  // (an empty item: never made by the host)
    // Split-K with the merge folded in (counters non-null): the last of a split row's part
    // blocks of this KV head merges the parts of its G query heads (attn_dec_merge); the
    // host launches no attn_combine.
    if (counters != nullptr && part != NO_PART) {
        __threadfence();  // this block's partials, visible to the merging block
        __syncthreads();
        int* flag = reinterpret_cast<int*>(smem);
        if (threadIdx.x == 0) {
            const u32 sidx = part_split[part];
            u32* c = counters + (size_t)sidx * n_kv + kvh;
            const bool last = atomicAdd(c, 1u) + 1u == splits[3 * sidx + 2];
            // Reset for the next launch (every other part block has counted already).
            if (last) atomicExch(c, 0u);
            flag[0] = last ? 1 : 0;
            flag[1] = (int)sidx;
        }
        __syncthreads();
        const int last = flag[0], sidx = flag[1];
        if (last) {
            __threadfence();
            __syncthreads();  // flag read by every thread before the merge reuses smem
            attn_dec_merge<T, D, SMEM_BYTES>(smem, part_acc, part_ml, splits + 3 * (size_t)sidx, out, xq, rows, kvh, G,
                                             n_heads, sinks);
        }
    }
}

// Split-K merge (flash-decoding's second pass). One block per (split row, query head): the
// parts' (max, sum) pairs are read once, reduced over the block and turned into weights in
// shared memory; then the threads cover (part group, head-dim vector): thread (g, v) sums
// parts g, g + NG, ... of VW consecutive dims with its loads independent (several in flight),
// and the NG groups' sums meet in shared memory. No loop over the parts one after another.
// splits: 3 words per row (row, first part, number of parts). Grid (split rows, n_heads),
// COMBINE_THREADS threads.
constexpr int COMBINE_THREADS = 128;
// Parts whose weights stay in shared memory; further ones (never, with the host's cap of
// 64 parts) are weighed from global memory.
constexpr int COMBINE_PARTS = 256;

// Output value v (rounded) at d of a head into the 8-bit rows at q (this head's first byte)
// and ds (its first (d, s) pair): the layout of quantize_x (qgemv.cu). Every lane of a
// group of 32 calls it, at 32 consecutive d (a block of 32; a 64-wide wavefront holds two).
__device__ __forceinline__ void combine_quant(float v, int d, u8* __restrict__ q, float* __restrict__ ds) {
    qx_lanes<1>(&v, true, d % 32 == 0, q + d, ds + 2 * (d / 32));
}

template <typename T, int VW>
__device__ __forceinline__ void combine_dims(const float* __restrict__ acc, size_t acc_stride,
                                            const float* __restrict__ ml, size_t ml_stride, const float* w_s,
                                            float mx, int np, int hd, float inv, T* __restrict__ o,
                                            u8* __restrict__ q, float* __restrict__ ds) {
    __shared__ __align__(16) float o_s[COMBINE_THREADS * VW];
    const int nvec = hd / VW;
    const int nt = min((int)blockDim.x, COMBINE_THREADS);
    const int nvt = min(nvec, nt), ng = nt / nvt;
    const int g = threadIdx.x / nvt, vi = threadIdx.x % nvt;
    for (int v = vi; v < nvec; v += nvt) {
        float a[VW];
#pragma unroll
        for (int j = 0; j < VW; ++j) a[j] = 0.f;
        if (g < ng) {
            // An empty part's partial is zeros (written all the same), so its weight 0
            // needs no branch around the load.
#pragma unroll 4
            for (int k = g; k < np; k += ng) {
                const float w = k < COMBINE_PARTS ? w_s[k] : combine_weight(ml, ml_stride, k, mx);
                float x[VW];
                load_n<VW>(acc + (size_t)k * acc_stride + v * VW, x);
#pragma unroll
                for (int j = 0; j < VW; ++j) a[j] += w * x[j];
            }
        }
        if (ng == 1) {
#pragma unroll
            for (int j = 0; j < VW; ++j) o[v * VW + j] = from_f<T>(a[j] * inv);
        } else if (g < ng) {
            // ng > 1 only when nvec <= nt: one pass, ng * hd <= nt * VW floats.
#pragma unroll
            for (int j = 0; j < VW; ++j) o_s[g * hd + v * VW + j] = a[j];
        }
    }
    if (ng > 1) {
        __syncthreads();
        // With q (hd a multiple of 32, at most 4 * COMBINE_THREADS / 2: this path), whole
        // warps take each pass.
        for (int d = threadIdx.x; d < hd; d += blockDim.x) {
            float s = 0.f;
            for (int k = 0; k < ng; ++k) s += o_s[k * hd + d];
            const T r = from_f<T>(s * inv);
            o[d] = r;
            if (q) combine_quant(to_f(r), d, q, ds);
        }
    }
}

template <typename T>
__device__ __forceinline__ void attn_combine_impl(const float* __restrict__ part_acc, const float* __restrict__ part_ml,
                                  const u32* __restrict__ splits, T* __restrict__ out, int n_heads, int hd,
                                  u8* __restrict__ xq, int rows, const T* __restrict__ sinks) {
    KILN_PDL_TRIGGER();
    __shared__ float w_s[COMBINE_PARTS];
    __shared__ float red_s[MAX_WARPS];
    // The split row (step metadata, no predecessor's output) before the wait.
    const u32* sp = splits + 3 * (size_t)blockIdx.x;
    const size_t row = sp[0];
    const int p0 = sp[1], np = sp[2], h = blockIdx.y;
    KILN_PDL_WAIT();
    const size_t ml_stride = 2 * (size_t)n_heads;
    const float* ml = part_ml + ((size_t)p0 * n_heads + h) * 2;
    float m = -KILN_INF;
    for (int k = threadIdx.x; k < np; k += blockDim.x) m = fmaxf(m, ml[(size_t)k * ml_stride]);
    // The head's sink (if any) joins once, here: weights against max(parts, sink).
    const float sk = sinks != nullptr ? to_f(sinks[h]) : -KILN_INF;
    const float mx = fmaxf(block_max(m, red_s), sk);
    float s = 0.f;
    for (int k = threadIdx.x; k < np; k += blockDim.x) {
        const float w = combine_weight(ml, ml_stride, k, mx);
        if (k < COMBINE_PARTS) w_s[k] = w;
        s += w * ml[(size_t)k * ml_stride + 1];
    }
    // block_sum's barriers also publish w_s.
    const float sum = block_sum(s, red_s) + (sinks != nullptr ? expf(sk - mx) : 0.f);
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    const float* acc = part_acc + ((size_t)p0 * n_heads + h) * hd;
    const size_t acc_stride = (size_t)n_heads * hd;
    T* o = out + row * n_heads * hd + (size_t)h * hd;
    // xq (non-null: bf16 decode, every row merged here, hd a multiple of 32 up to 256): the
    // rounded outputs also as 8-bit rows for the output matmul (no quantize_x launch).
    u8* q = nullptr;
    float* ds = nullptr;
    if (xq) {
        const size_t width = (size_t)n_heads * hd, at = row * width + (size_t)h * hd;
        q = xq + at;
        ds = reinterpret_cast<float*>(xq + (((size_t)rows * width + 255) & ~(size_t)255)) + 2 * (at / 32);
    }
    if (hd % 4 == 0) {
        combine_dims<T, 4>(acc, acc_stride, ml, ml_stride, w_s, mx, np, hd, inv, o, q, ds);
    } else {
        combine_dims<T, 1>(acc, acc_stride, ml, ml_stride, w_s, mx, np, hd, inv, o, q, ds);
    }
}

// Decode blocks per SM the compiler must fit (NVIDIA): 4 (<= 128 registers) while the query
// vectors of a lane take at most 4 chunks, so a batch of 64 x 8 KV heads runs in one wave.
#define KILN_DEC_MINB(TT, D, QV) \
    ((QV) * ((D) * (int)sizeof(TT) / 16 > 16 ? (D) * (int)sizeof(TT) / 256 : 1) <= 4 ? 4 : 2)
#if defined(KILN_CUDA)
#define KILN_DEC_BOUNDS(TT, D, QV) __launch_bounds__(ATTN_WARPS * WARP, KILN_DEC_MINB(TT, D, QV))
#else
#define KILN_DEC_BOUNDS(TT, D, QV) __launch_bounds__(ATTN_WARPS * WARP)
#endif
// Each head size and pass size is a compile unit of its own (h128q4 ...).
#define KILN_ATTN_DEC(N, TT, D, QV)                                                                     \
    KILN_IN_PART(h##D##q##QV, KILN_ATTN_DEC_KERNEL(N, TT, D, QV))
#define KILN_ATTN_DEC_KERNEL(N, TT, D, QV)                                                              \
    extern "C" __global__ void KILN_DEC_BOUNDS(TT, D, QV) attn_##N##_d##D##_dec##QV(                   \
        const TT *qkv, int qkv_stride, const TT *k_cache, const TT *v_cache, TT *out, float *part_acc,   \
        float *part_ml, const u32 *positions, const u32 *seqinfo, const u32 *tables, const u32 *items,  \
        int n_heads, int n_kv, int head_dim, int block_size, float scale, int window, float softcap,    \
        const u32 *splits, const u32 *part_split, u32 *counters, u8 *xq, int rows, const TT *sinks) {   \
        attn_dec_impl<TT, D, QV>(qkv, qkv_stride, k_cache, v_cache, out, part_acc, part_ml, positions,    \
                                 seqinfo, tables, items, n_heads, n_kv, block_size, scale, window,        \
                                 softcap, splits, part_split, counters, xq, rows, sinks);                        \
    }
#define KILN_ATTN_DEC_D(N, T, D) \
    KILN_ATTN_DEC(N, T, D, 1) KILN_ATTN_DEC(N, T, D, 2) KILN_ATTN_DEC(N, T, D, 4) KILN_ATTN_DEC(N, T, D, 8)
// Head size 256 (Gemma): up to 4 vectors per pass (8 would not fit the registers).
#define KILN_ATTN_DEC_256(N, T) KILN_ATTN_DEC(N, T, 256, 1) KILN_ATTN_DEC(N, T, 256, 2) KILN_ATTN_DEC(N, T, 256, 4)
#define KILN_ATTN_DECODE(N, T)                                                                       \
    KILN_ATTN_DEC_D(N, T, 64)                                                                       \
    KILN_ATTN_DEC_D(N, T, 128)                                                                      \
    KILN_ATTN_DEC_256(N, T)                                                                         \
    KILN_IN_PART(common,                                                                            \
        extern "C" __global__ void attn_combine_##N(const float* part_acc, const float* part_ml,     \
                                                    const u32* splits, T* out, int n_heads, int hd,  \
                                                    u8* xq, int rows, const T* sinks) {              \
            attn_combine_impl<T>(part_acc, part_ml, splits, out, n_heads, hd, xq, rows, sinks);      \
        })
KILN_FOR_DTYPES(KILN_ATTN_DECODE)
