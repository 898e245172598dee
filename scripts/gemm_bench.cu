// Tuning harness for the decode/prefill GEMMs: cublasGemmEx with the default algorithm (what
// Kiln's CUDA runtime calls) against cublasLt, every algorithm its heuristic offers, on the
// weights of a whole Llama-3-8B-shaped model (bf16, 32 layers of qkv/o/gate_up/down + the
// output projection, 16 GB, so nothing is served from L2). For each rows count M it prints,
// per weight shape, the time of the GemmEx call and of the best Lt algorithm (its index in
// the heuristic's list / the split-K factor set on it), then one whole pass over the
// model's weights with each.
//
// Build and run on the GPU machine:
//   nvcc -O3 -std=c++17 -arch=sm_90 scripts/gemm_bench.cu -lcublas -lcublasLt -o /tmp/gemm_bench
//   /tmp/gemm_bench [M ...]        (default: 32 64 128 256 2048)
#include "bench_common.cuh"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#define CB(x)                                                          \
    do {                                                               \
        int st_ = (int)(x);                                            \
        if (st_ != 0) {                                                \
            fprintf(stderr, "%s:%d cublas status %d\n", __FILE__, __LINE__, st_); \
            exit(1);                                                   \
        }                                                              \
    } while (0)

static const size_t WORKSPACE = 32 << 20;
static const int LAYERS = 32;

struct Shape {
    const char* name;
    int n, k;  // output features, input features
};
static const Shape SHAPES[] = {
    {"qkv", 6144, 4096}, {"o", 4096, 4096}, {"gate_up", 28672, 4096}, {"down", 4096, 14336}};
static const Shape HEAD = {"lm_head", 128256, 4096};

__global__ void fill(__nv_bfloat16* p, size_t n, unsigned seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed;
        h ^= h >> 13;
        h *= 0x5bd1e995u;
        p[i] = __float2bfloat16(((h >> 8) & 0xffff) / 65536.0f - 0.5f);
    }
}

struct Lt {
    cublasLtHandle_t h;
    void* ws;
};

struct Plan {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    std::vector<cublasLtMatmulHeuristicResult_t> algos;
};

// out^T (n x m, col-major) = W^T... in cuBLAS terms: C[n_out, m] = op_T(A = W as k x n_out) * B (x as k x m).
static Plan plan(Lt& lt, int n_out, int k, int m) {
    Plan p;
    CB(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t t = CUBLAS_OP_T, nn = CUBLAS_OP_N;
    CB(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t));
    CB(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &nn, sizeof nn));
    CB(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, k, n_out, k));
    CB(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, k, m, k));
    CB(cublasLtMatrixLayoutCreate(&p.c, CUDA_R_16BF, n_out, m, n_out));
    cublasLtMatmulPreference_t pref;
    CB(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = WORKSPACE;
    CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    p.algos.resize(24);
    int got = 0;
    CB(cublasLtMatmulAlgoGetHeuristic(lt.h, p.op, p.a, p.b, p.c, p.c, pref, 24, p.algos.data(), &got));
    p.algos.resize(got);
    cublasLtMatmulPreferenceDestroy(pref);
    return p;
}

template <class F>
static float time_ms(cudaStream_t s, int reps, F&& body) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    body();
    CK(cudaStreamSynchronize(s));
    CK(cudaEventRecord(a, s));
    for (int r = 0; r < reps; r++) body();
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    return ms / reps;
}

int main(int argc, char** argv) {
    std::vector<int> ms_list;
    for (int i = 1; i < argc; i++) ms_list.push_back(atoi(argv[i]));
    if (ms_list.empty()) ms_list = {32, 64, 128, 256, 2048};
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    cublasHandle_t blas;
    CB(cublasCreate(&blas));
    CB(cublasSetStream(blas, s));
    Lt lt;
    CB(cublasLtCreate(&lt.h));
    CK(cudaMalloc(&lt.ws, WORKSPACE));
    CB(cublasSetWorkspace(blas, lt.ws, WORKSPACE));

    // Weights: LAYERS copies of each layer shape + the head.
    std::vector<__nv_bfloat16*> w[4];
    size_t total = 0;
    for (int si = 0; si < 4; si++)
        for (int l = 0; l < LAYERS; l++) {
            __nv_bfloat16* p;
            size_t n = (size_t)SHAPES[si].n * SHAPES[si].k;
            CK(cudaMalloc(&p, n * 2));
            fill<<<1024, 256, 0, s>>>(p, n, si * 100 + l);
            w[si].push_back(p);
            total += n * 2;
        }
    __nv_bfloat16* head;
    CK(cudaMalloc(&head, (size_t)HEAD.n * HEAD.k * 2));
    fill<<<1024, 256, 0, s>>>(head, (size_t)HEAD.n * HEAD.k, 7);
    total += (size_t)HEAD.n * HEAD.k * 2;
    int max_m = 0;
    for (int m : ms_list) max_m = m > max_m ? m : max_m;
    __nv_bfloat16 *x, *y;
    CK(cudaMalloc(&x, (size_t)max_m * 14336 * 2));
    CK(cudaMalloc(&y, (size_t)max_m * HEAD.n * 2));
    fill<<<1024, 256, 0, s>>>(x, (size_t)max_m * 14336, 99);
    CK(cudaStreamSynchronize(s));
    printf("weights %.2f GB\n", total / 1e9);
    const float alpha = 1.f, beta = 0.f;

    auto gemmex = [&](const __nv_bfloat16* wp, const Shape& sh, int m) { CB(kiln_gemm(blas, wp, x, y, sh.n, sh.k, m)); };
    auto ltmm = [&](const __nv_bfloat16* wp, Plan& p, int ai) {
        CB(cublasLtMatmul(lt.h, p.op, &alpha, wp, p.a, x, p.b, &beta, y, p.c, y, p.c, &p.algos[ai].algo, lt.ws,
                          WORKSPACE, s));
    };

    for (int m : ms_list) {
        printf("\n== M = %d ==\n", m);
        printf("%-8s %10s %10s %5s %6s %9s\n", "shape", "gemmex ms", "lt best", "#/spl", "algos", "TFLOP/s");
        Plan plans[5];
        int best[5];      // heuristic index * 10 + split
        size_t best_idx[5];
        const Shape* all[5] = {&SHAPES[0], &SHAPES[1], &SHAPES[2], &SHAPES[3], &HEAD};
        for (int si = 0; si < 5; si++) {
            const Shape& sh = *all[si];
            plans[si] = plan(lt, sh.n, sh.k, m);
            // Rotate over the layer copies so each call reads cold weights.
            int li = 0;
            auto wsel = [&]() { return si == 4 ? head : w[si][(li++) % LAYERS]; };
            float ex = time_ms(s, 32, [&] { gemmex(wsel(), sh, m); });
            float bt = 1e9;
            best[si] = 0, best_idx[si] = 0;
            // Each heuristic algorithm as offered, then with its K split in 2..8 (where the
            // algorithm accepts that configuration).
            const size_t offered = plans[si].algos.size();
            for (size_t ai = 0; ai < offered; ai++) {
                for (int sk : {1, 2, 3, 4, 6, 8}) {
                    cublasLtMatmulHeuristicResult_t h = plans[si].algos[ai];
                    if (sk > 1) {
                        int32_t v = sk;
                        if (cublasLtMatmulAlgoConfigSetAttribute(&h.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &v,
                                                                 sizeof v) != CUBLAS_STATUS_SUCCESS)
                            continue;
                        uint32_t red = CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE;
                        cublasLtMatmulAlgoConfigSetAttribute(&h.algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red,
                                                             sizeof red);
                        cublasLtMatmulHeuristicResult_t chk;
                        if (cublasLtMatmulAlgoCheck(lt.h, plans[si].op, plans[si].a, plans[si].b, plans[si].c,
                                                    plans[si].c, &h.algo, &chk) != CUBLAS_STATUS_SUCCESS ||
                            chk.workspaceSize > WORKSPACE)
                            continue;
                    }
                    plans[si].algos.push_back(h);
                    const size_t idx = plans[si].algos.size() - 1;
                    float t = time_ms(s, 16, [&] { ltmm(wsel(), plans[si], idx); });
                    if (t < bt) bt = t, best[si] = ai * 10 + sk, best_idx[si] = idx;
                }
            }
            double fl = 2.0 * m * sh.n * sh.k;
            printf("%-8s %10.4f %10.4f %3d/%d %6zu %9.1f\n", sh.name, ex, bt, best[si] / 10, best[si] % 10, offered,
                   fl / (bt * 1e-3) / 1e12);
        }
        auto pass = [&](bool use_lt) {
            for (int l = 0; l < LAYERS; l++)
                for (int si = 0; si < 4; si++) {
                    if (use_lt)
                        ltmm(w[si][l], plans[si], best_idx[si]);
                    else
                        gemmex(w[si][l], SHAPES[si], m);
                }
            if (use_lt)
                ltmm(head, plans[4], best_idx[4]);
            else
                gemmex(head, HEAD, m);
        };
        float pe = time_ms(s, 5, [&] { pass(false); });
        float pl = time_ms(s, 5, [&] { pass(true); });
        printf("whole pass: gemmex %.3f ms (%.2f TB/s), lt best %.3f ms (%.2f TB/s), lt heuristic #0 ",
               pe, total / (pe * 1e-3) / 1e12, pl, total / (pl * 1e-3) / 1e12);
        for (int si = 0; si < 5; si++) best_idx[si] = 0;
        float p0 = time_ms(s, 5, [&] { pass(true); });
        printf("%.3f ms\n", p0);
    }
    return 0;
}
