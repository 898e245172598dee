// Tuning harness for kernels/gemv.cu against cuBLAS, on the weights of a whole
// Llama-3-8B-shaped model (bf16: 32 layers of qkv/o/gate_up/down + the output projection,
// 16 GB, so nothing is served from L2). For each rows count M it times one pass over every
// weight matrix (the matmuls of one decode step) with cuBLAS and with each (R, U) variant of
// the kernel, and prints ms per pass and the weight bandwidth.
//
// Build and run on the GPU machine from the repository root:
//   nvcc -O3 -std=c++17 -arch=sm_90 -DKILN_WARP_SIZE=32 -DKILN_DTYPE_BF16 -DKILN_GEMV_BENCH \
//        -include kernels/prelude.cuh scripts/gemv_bench.cu -lcublas -o /tmp/gemv_bench
//   /tmp/gemv_bench [LAYERS]
// The kernel text is included unchanged, so the numbers are those of the shipped kernel.
#include "../kernels/gemv.cu"
#include "bench_common.cuh"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <vector>


template <int M, int R, int U>
__global__ void __launch_bounds__(GEMV_WARPS * WARP) variant(const bf16* x, const bf16* w, bf16* y, int k, int n) {
    gemv_impl<bf16, M, R, U, false>(x, w, nullptr, y, k, n);
}

template <int M, int U>
__global__ void __launch_bounds__(GEMV_WARPS * WARP) glu_variant(const bf16* x, const bf16* w, bf16* y, int k, int f) {
    gemv_impl<bf16, M, 2, U, true>(x, w, nullptr, y, k, f);
}

struct Mat {
    const bf16* w;
    int n, k;
};

typedef void (*Kern)(const bf16*, const bf16*, bf16*, int, int);

struct Variant {
    const char* name;
    int r;
    Kern f;
};

template <int M>
std::vector<Variant> variants() {
    return {
        {"R1 U4", 1, variant<M, 1, 4>}, {"R1 U8", 1, variant<M, 1, 8>}, {"R1 U16", 1, variant<M, 1, 16>},
        {"R2 U4", 2, variant<M, 2, 4>}, {"R2 U8", 2, variant<M, 2, 8>},
    };
}

template <typename F>
static float time_pass(const std::vector<Mat>& mats, F&& one) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    std::vector<float> t;
    for (int rep = 0; rep < 6; ++rep) {
        CK(cudaEventRecord(a));
        for (const Mat& m : mats) one(m);
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        if (rep > 0) t.push_back(ms);
    }
    CK(cudaGetLastError());
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

static float host_bf16(u16 v) {
    const u32 u = (u32)v << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

template <int M>
void run_m(cublasHandle_t h, const std::vector<Mat>& mats, const bf16* x, bf16* y, bf16* y2, double bytes) {
    auto blas = [&](const Mat& m) { kiln_gemm(h, m.w, x, y, m.n, m.k, M); };
    const float tb = time_pass(mats, blas);
    printf("M=%d  cublas   %7.3f ms  %6.0f GB/s\n", M, tb, bytes / tb / 1e6);
    for (const Variant& v : variants<M>()) {
        auto kern = [&](const Mat& m) {
            const int rows_per_block = GEMV_WARPS * v.r;
            v.f<<<(m.n + rows_per_block - 1) / rows_per_block, GEMV_WARPS * WARP>>>(x, m.w, y2, m.k, m.n);
        };
        const float tk = time_pass(mats, kern);
        // Check the last matrix against cuBLAS.
        const Mat& last = mats.back();
        blas(last);
        kern(last);
        CK(cudaDeviceSynchronize());
        std::vector<u16> a((size_t)M * last.n), b((size_t)M * last.n);
        CK(cudaMemcpy(a.data(), y, a.size() * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(b.data(), y2, b.size() * 2, cudaMemcpyDeviceToHost));
        double worst = 0;
        for (size_t i = 0; i < a.size(); ++i) {
            const float fa = host_bf16(a[i]), fb = host_bf16(b[i]);
            worst = std::max(worst, (double)std::abs(fa - fb) / (std::abs(fa) + 1e-3));
        }
        printf("M=%d  %-8s %7.3f ms  %6.0f GB/s  (%.0f%% of cublas time; worst rel diff %.1e)\n", M, v.name, tk,
               bytes / tk / 1e6, 100.0 * tk / tb, worst);
    }
}

// The gate/up matrices alone: cuBLAS (product only) against gemv_silu_mul (product + SiLU-mul).
template <int M>
void run_glu(cublasHandle_t h, const std::vector<Mat>& all, const bf16* x, bf16* y) {
    std::vector<Mat> mats;
    double bytes = 0;
    for (const Mat& m : all)
        if (m.n == 2 * 14336) {
            mats.push_back(m);
            bytes += 2.0 * m.n * m.k;
        }
    auto blas = [&](const Mat& m) { kiln_gemm(h, m.w, x, y, m.n, m.k, M); };
    const float tb = time_pass(mats, blas);
    printf("gate_up M=%d cublas      %7.3f ms  %6.0f GB/s\n", M, tb, bytes / tb / 1e6);
    const Kern ks[2] = {glu_variant<M, 4>, glu_variant<M, 8>};
    for (int i = 0; i < 2; ++i) {
        auto kern = [&](const Mat& m) {
            ks[i]<<<(m.n / 2 + GEMV_WARPS - 1) / GEMV_WARPS, GEMV_WARPS * WARP>>>(x, m.w, y, m.k, m.n / 2);
        };
        const float tk = time_pass(mats, kern);
        printf("gate_up M=%d glu R2 U%d   %7.3f ms  %6.0f GB/s\n", M, i ? 8 : 4, tk, bytes / tk / 1e6);
    }
}

int main(int argc, char** argv) {
    const int layers = argc > 1 ? atoi(argv[1]) : 32;
    const int hidden = 4096, inter = 14336, qkv = 6144, vocab = 128256;
    std::vector<std::pair<int, int>> shapes;  // (n, k)
    for (int l = 0; l < layers; ++l) {
        shapes.push_back({qkv, hidden});
        shapes.push_back({hidden, hidden});
        shapes.push_back({2 * inter, hidden});
        shapes.push_back({hidden, inter});
    }
    shapes.push_back({vocab, hidden});
    size_t total = 0;
    for (auto [n, k] : shapes) total += (size_t)n * k;
    bf16* pool;
    CK(cudaMalloc(&pool, total * 2));
    // Small values with varied mantissas: bytes 0x3b..0x3c repeat.
    CK(cudaMemset(pool, 0x3b, total * 2));
    std::vector<Mat> mats;
    size_t off = 0;
    for (auto [n, k] : shapes) {
        mats.push_back({pool + off, n, k});
        off += (size_t)n * k;
    }
    bf16 *x, *y, *y2;
    CK(cudaMalloc(&x, 8 * inter * 2));
    CK(cudaMalloc(&y, 8 * (size_t)vocab * 2));
    CK(cudaMalloc(&y2, 8 * (size_t)vocab * 2));
    std::vector<u16> hx(8 * inter);
    for (size_t i = 0; i < hx.size(); ++i) hx[i] = 0x3c00 + (i * 37 % 200) - 100 + ((i & 1) << 15);
    CK(cudaMemcpy(x, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
    cublasHandle_t h;
    cublasCreate(&h);
    const double bytes = total * 2.0;
    printf("weights %.2f GB in %zu matrices (%d layers)\n", bytes / 1e9, mats.size(), layers);
    run_glu<1>(h, mats, x, y);
    run_glu<2>(h, mats, x, y);
    run_m<1>(h, mats, x, y, y2, bytes);
    run_m<2>(h, mats, x, y, y2, bytes);
    run_m<4>(h, mats, x, y, y2, bytes);
    // cuBLAS at larger batches, for the batched decode steps.
    for (int m : {8, 32, 256}) {
        bf16* xb;
        bf16* yb;
        CK(cudaMalloc(&xb, (size_t)m * inter * 2));
        CK(cudaMalloc(&yb, (size_t)m * vocab * 2));
        CK(cudaMemset(xb, 0x3c, (size_t)m * inter * 2));
        auto blas = [&](const Mat& mm) {
            float one = 1.f, zero = 0.f;
            cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, mm.n, m, mm.k, &one, mm.w, CUDA_R_16BF, mm.k, xb, CUDA_R_16BF,
                         mm.k, &zero, yb, CUDA_R_16BF, mm.n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        };
        const float t = time_pass(mats, blas);
        double flops = 0;
        for (auto& mm : mats) flops += 2.0 * m * mm.n * mm.k;
        printf("M=%-3d cublas %7.3f ms  %6.0f GB/s  %5.0f TFLOP/s\n", m, t, bytes / t / 1e6, flops / t / 1e9);
        CK(cudaFree(xb));
        CK(cudaFree(yb));
    }
    return 0;
}
