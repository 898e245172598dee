//! GEMMs through cuBLAS on the lane's stream: `out[n, m] = x[n, k] @ w[m, k]^T`, row-major.
//!
//! cuBLAS is column-major, and a row-major `[r, c]` buffer is a column-major `[c, r]` one,
//! so cuBLAS computes `out^T = w x^T`:
//! ```text
//! C (m x n, ld m) = op(A) (m x k) * B (k x n)
//! A = w seen column-major: k x m, ld k, op = T      B = x seen column-major: k x n, ld k
//! ```
//! Accumulation is always f32 (`CUBLAS_COMPUTE_32F`, no TF32: the default math mode).

use std::ffi::c_void;

use cudarc::cublas::{result as blas, sys as blas_sys};

use super::DType;
use super::device::Device;
use crate::backend::BackendError;

/// A cuBLAS handle bound to the lane's stream.
pub struct Blas {
    handle: blas_sys::cublasHandle_t,
}

fn blas_err(op: &'static str) -> impl Fn(blas::CublasError) -> BackendError {
    move |e| BackendError::Device {
        op,
        message: format!("cuBLAS: {e:?}"),
    }
}

impl Blas {
    /// Creates the handle on `dev`'s context and binds it to `dev`'s stream.
    pub fn new(dev: &Device) -> Result<Blas, BackendError> {
        dev.ctx
            .bind_to_thread()
            .map_err(super::device::dev_err("cublas"))?;
        let handle = blas::create_handle().map_err(blas_err("cublas"))?;
        let blas = Blas { handle };
        // SAFETY: the handle was just created; the stream outlives it (both owned by the
        // backend, the handle dropped first).
        unsafe { blas::set_stream(handle, dev.stream.cu_stream() as _) }
            .map_err(blas_err("cublas"))?;
        Ok(blas)
    }

    /// `out[n, m] = x[n, k] @ w[m, k]^T`; all three are device addresses of `dt` elements.
    #[allow(clippy::too_many_arguments)]
    pub fn matmul(
        &self,
        dt: DType,
        x: u64,
        w: u64,
        out: u64,
        n: usize,
        k: usize,
        m: usize,
    ) -> Result<(), BackendError> {
        if n == 0 || m == 0 {
            return Ok(());
        }
        let too_big = |v: usize| v > i32::MAX as usize;
        if too_big(n) || too_big(k) || too_big(m) {
            return Err(BackendError::Device {
                op: "matmul",
                message: format!("GEMM {n}x{k}x{m} too large"),
            });
        }
        let ty = match dt {
            DType::F32 => blas_sys::cudaDataType::CUDA_R_32F,
            DType::Bf16 => blas_sys::cudaDataType::CUDA_R_16BF,
        };
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: x holds n*k, w holds m*k and out holds n*m elements of `dt` (the callers check
        // the tensors' shapes); alpha/beta are f32 as CUBLAS_COMPUTE_32F requires and live
        // across the call; the work is queued on the lane's stream.
        unsafe {
            blas::gemm_ex(
                self.handle,
                blas_sys::cublasOperation_t::CUBLAS_OP_T,
                blas_sys::cublasOperation_t::CUBLAS_OP_N,
                m as i32,
                n as i32,
                k as i32,
                &alpha as *const f32 as *const c_void,
                w as *const c_void,
                ty,
                k as i32,
                x as *const c_void,
                ty,
                k as i32,
                &beta as *const f32 as *const c_void,
                out as *mut c_void,
                ty,
                m as i32,
                blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(blas_err("matmul"))
    }
}

impl Drop for Blas {
    fn drop(&mut self) {
        // SAFETY: the handle is live and destroyed once; errors cannot be reported from drop.
        let _ = unsafe { blas::destroy_handle(self.handle) };
    }
}
