// Shared by the standalone CUDA benchmarks in scripts/ (gemv_bench.cu, gemm_bench.cu).
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

// Exits with the file, line and message of a failed CUDA runtime call.
#define CK(x)                                                                        \
    do {                                                                             \
        cudaError_t e = (x);                                                         \
        if (e != cudaSuccess) {                                                      \
            fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); \
            exit(1);                                                                 \
        }                                                                            \
    } while (0)

// What Kiln's CUDA runtime runs for a matmul: y[rows, n] = x[rows, k] . w[n, k]^T in bf16
// (row-major), f32 accumulation, the default algorithm.
inline cublasStatus_t kiln_gemm(cublasHandle_t h, const void* w, const void* x, void* y, int n, int k, int rows) {
    const float one = 1.f, zero = 0.f;
    return cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, rows, k, &one, w, CUDA_R_16BF, k, x, CUDA_R_16BF, k, &zero,
                        y, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}
