//! Matmuls against weights in their file's type: `out[n, m] = x[n, k] @ w[m, k]^T`.
//! Decode and small batches (fewer than the kernel table's `gemm_min_rows` rows): the
//! activations quantized once per call into scratch allocated up front, then rayon over
//! chunks of output rows (each chunk of weight rows stays in cache while it is multiplied
//! with all `n` activation rows, four at a time). Larger batches with the portable and AVX2
//! kernels: weight tiles dequantized into a small f32 scratch and the f32 GEMM, which
//! measured faster there; the AVX-512/VNNI kernels beat that GEMM at every size (1B
//! Q4_K_M prefill 100 against 46 tokens/s), so they take the first path always.

use std::ops::Range;

use rayon::prelude::*;

use super::ops;
use super::qdot::{self, ActKind, BlockQ8_0, BlockQ8K, Dot4Fn, DotFn, Kernels};
use crate::backend::quant::{self, GgmlType, QK_K, QK32};
use crate::backend::{BackendError, HostData, HostTensor};

/// Work (multiply-adds) below which a matmul stays on the calling thread.
const PAR_MIN_WORK: usize = 1 << 17;
/// Weight rows per rayon task.
const ROWS_PER_TASK: usize = 16;
/// Weight rows per dequantized tile of the GEMM path.
const TILE_ROWS: usize = 256;

/// Quantized activations, sized once for the largest activation buffer.
#[derive(Debug, Default)]
pub struct QScratch {
    q8_0: Vec<BlockQ8_0>,
    q8k: Vec<BlockQ8K>,
    /// `[TILE_ROWS, k]` dequantized weight rows (GEMM path; grows once to the largest `k`).
    tile: Vec<f32>,
    /// Which kinds hold the current call's activations.
    ready: [bool; 2],
}

impl QScratch {
    /// Makes room for `values` activations (called when activation buffers are allocated,
    /// so matmuls never allocate).
    pub fn reserve(&mut self, values: usize) {
        let (b32, b256) = (values.div_ceil(QK32), values.div_ceil(QK_K));
        if self.q8_0.len() < b32 {
            self.q8_0.resize(b32, BlockQ8_0::ZERO);
        }
        if self.q8k.len() < b256 {
            self.q8k.resize(b256, BlockQ8K::ZERO);
        }
    }

    /// The activations `x` quantized for `kind` (quantizing at the first use in a call).
    fn quantized(&mut self, kind: ActKind, x: &[f32]) -> Acts<'_> {
        match kind {
            ActKind::Q8_0 => {
                let blocks = x.len() / QK32;
                self.reserve(x.len());
                if !self.ready[0] {
                    par_quantize(x, &mut self.q8_0[..blocks], QK32, qdot::quantize_q8_0);
                    self.ready[0] = true;
                }
                Acts::Q8_0(&self.q8_0[..blocks])
            }
            ActKind::Q8K => {
                let blocks = x.len() / QK_K;
                self.reserve(x.len());
                if !self.ready[1] {
                    par_quantize(x, &mut self.q8k[..blocks], QK_K, qdot::quantize_q8_k);
                    self.ready[1] = true;
                }
                Acts::Q8K(&self.q8k[..blocks])
            }
            ActKind::F32 => Acts::F32,
        }
    }
}

/// Quantizes `x` into `out` (`block` values per element of `out`), in parallel when large.
fn par_quantize<B: Send>(x: &[f32], out: &mut [B], block: usize, f: fn(&[f32], &mut [B])) {
    const CHUNK: usize = 64;
    if x.len() < PAR_MIN_WORK / 8 {
        return f(x, out);
    }
    out.par_chunks_mut(CHUNK)
        .zip(x.par_chunks(CHUNK * block))
        .for_each(|(o, x)| f(x, o));
}

/// One call's activations, as a weight type's kernel takes them.
enum Acts<'a> {
    Q8_0(&'a [BlockQ8_0]),
    Q8K(&'a [BlockQ8K]),
    F32,
}

/// `out[n, m] = x[n, k] @ w^T` for a `[m, k]` weight in any type the CPU keeps; `out` rows
/// are `m` long. Plain f32 weights go through `ops::matmul`.
pub fn matmul(
    kern: &Kernels,
    scratch: &mut QScratch,
    x: &[f32],
    w: &HostTensor,
    n: usize,
    out: &mut [f32],
) -> Result<(), BackendError> {
    let (m, k) = (w.rows(), w.cols());
    let (x, out) = (&x[..n * k], &mut out[..n * m]);
    scratch.ready = [false; 2];
    let parts = match &w.data {
        HostData::F32(v) => {
            ops::matmul(x, v, None, n, k, m, out);
            return Ok(());
        }
        HostData::Raw { .. } => std::slice::from_ref(w),
        HostData::Stacked(parts) => parts.as_slice(),
    };
    let mut col0 = 0;
    for p in parts {
        let cols = col0..col0 + p.rows();
        part(kern, scratch, x, p, n, k, cols.clone(), out)?;
        col0 = cols.end;
    }
    if col0 != m {
        return Err(BackendError::InvalidBatch(format!(
            "stacked weight: parts hold {col0} rows, shape says {m}"
        )));
    }
    Ok(())
}

/// The columns `cols` of `out` (rows of length `m`) from one unstacked part.
#[allow(clippy::too_many_arguments)]
fn part(
    kern: &Kernels,
    scratch: &mut QScratch,
    x: &[f32],
    w: &HostTensor,
    n: usize,
    k: usize,
    cols: Range<usize>,
    out: &mut [f32],
) -> Result<(), BackendError> {
    let ty = w.weight_type();
    let unsupported = || BackendError::Unsupported {
        backend: "cpu",
        op: "matmul",
        dtype: ty.to_string(),
    };
    if w.cols() != k {
        return Err(BackendError::InvalidBatch(format!(
            "stacked weight part has {} columns, expected {k}",
            w.cols()
        )));
    }
    let kind = ActKind::of(ty).ok_or_else(unsupported)?;
    let bytes: &[u8] = match &w.data {
        HostData::Raw { bytes, .. } => bytes,
        HostData::F32(v) => {
            let body = |j: usize, r: usize| ops::dot(&v[j * k..(j + 1) * k], &x[r * k..][..k]);
            let body4 = |j: usize, r: usize| std::array::from_fn(|i| body(j, r + i));
            run_rows(n, cols, out, k, body, body4);
            return Ok(());
        }
        HostData::Stacked(_) => return Err(unsupported()),
    };
    let row_bytes = ty.byte_size(k as u64)? as usize;
    if n >= kern.gemm_min_rows {
        return gemm_tiles(&mut scratch.tile, x, ty, bytes, n, k, cols, out);
    }
    let row = |j: usize| &bytes[j * row_bytes..(j + 1) * row_bytes];
    let (b32, b256) = (k / QK32, k / QK_K);
    let kr = kern;
    match (scratch.quantized(kind, x), ty) {
        (Acts::Q8_0(a), GgmlType::Q8_0) => {
            blocks(n, cols, out, k, row, a, b32, kr.q8_0, kr.q8_0_x4)
        }
        (Acts::Q8_0(a), GgmlType::Q4_0) => {
            blocks(n, cols, out, k, row, a, b32, kr.q4_0, kr.q4_0_x4)
        }
        (Acts::Q8_0(a), GgmlType::Mxfp4) => {
            blocks(n, cols, out, k, row, a, b32, kr.mxfp4, kr.mxfp4_x4)
        }
        (Acts::Q8K(a), GgmlType::Q4K) => blocks(n, cols, out, k, row, a, b256, kr.q4_k, kr.q4_k_x4),
        (Acts::Q8K(a), GgmlType::Q5K) => blocks(n, cols, out, k, row, a, b256, kr.q5_k, kr.q5_k_x4),
        (Acts::Q8K(a), GgmlType::Q6K) => blocks(n, cols, out, k, row, a, b256, kr.q6_k, kr.q6_k_x4),
        (Acts::F32, GgmlType::F16) => blocks(n, cols, out, k, row, x, k, kr.f16, kr.f16_x4),
        (Acts::F32, GgmlType::BF16) => blocks(n, cols, out, k, row, x, k, kr.bf16, kr.bf16_x4),
        _ => return Err(unsupported()),
    }
    Ok(())
}

/// `out[:, cols] = x @ w^T` by tiles of [`TILE_ROWS`] weight rows dequantized into `tile`
/// (rayon over rows) and multiplied by the f32 GEMM (rayon inside).
#[allow(clippy::too_many_arguments)]
fn gemm_tiles(
    tile: &mut Vec<f32>,
    x: &[f32],
    ty: GgmlType,
    bytes: &[u8],
    n: usize,
    k: usize,
    cols: Range<usize>,
    out: &mut [f32],
) -> Result<(), BackendError> {
    let m = out.len() / n;
    assert!(cols.end <= m && out.len() == n * m && x.len() == n * k);
    let row_bytes = ty.byte_size(k as u64)? as usize;
    if tile.len() < TILE_ROWS * k {
        tile.resize(TILE_ROWS * k, 0.0);
    }
    let mut t0 = 0;
    while t0 < cols.len() {
        let tr = TILE_ROWS.min(cols.len() - t0);
        let dst = &mut tile[..tr * k];
        let src = &bytes[t0 * row_bytes..(t0 + tr) * row_bytes];
        dst.par_chunks_mut(k)
            .zip(src.par_chunks(row_bytes))
            .try_for_each(|(d, s)| quant::dequantize(ty, s, d))?;
        let c = cols.start + t0;
        ops::gemm_xwt(
            n,
            tr,
            k,
            x,
            dst,
            &mut out[c..],
            m,
            gemm::Parallelism::Rayon(0),
        );
        t0 += tr;
    }
    Ok(())
}

/// `out[r, cols.start + j] = dot(row(j), acts[r])` with `per_row` activation elements per row.
#[allow(clippy::too_many_arguments)]
fn blocks<'w, A: Sync>(
    n: usize,
    cols: Range<usize>,
    out: &mut [f32],
    k: usize,
    row: impl Fn(usize) -> &'w [u8] + Sync,
    acts: &[A],
    per_row: usize,
    dot: DotFn<A>,
    dot4: Dot4Fn<A>,
) {
    let act = |r: usize| &acts[r * per_row..(r + 1) * per_row];
    let body = |j: usize, r: usize| dot(row(j), act(r));
    let body4 = |j: usize, r: usize| dot4(row(j), [act(r), act(r + 1), act(r + 2), act(r + 3)]);
    run_rows(n, cols, out, k, body, body4);
}

/// A pointer to the output shared by the row tasks, each writing its own columns.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: the tasks of `run_rows` write disjoint elements through it (see there).
unsafe impl Send for OutPtr {}
// SAFETY: as above.
unsafe impl Sync for OutPtr {}

/// For every weight row `j` in `0..cols.len()` and activation row `r` in `0..n`:
/// `out[r * m + cols.start + j] = f(j, r)`, where `m = out.len() / n`; `f4(j, r)` gives rows
/// `r..r + 4` at once. Rayon over chunks of weight rows when the work (`n * cols * k`) is
/// large.
fn run_rows(
    n: usize,
    cols: Range<usize>,
    out: &mut [f32],
    k: usize,
    f: impl Fn(usize, usize) -> f32 + Sync,
    f4: impl Fn(usize, usize) -> [f32; 4] + Sync,
) {
    let m = out.len() / n.max(1);
    assert!(
        cols.end <= m && out.len() == n * m,
        "output columns out of range"
    );
    let ptr = OutPtr(out.as_mut_ptr());
    let c0 = cols.start;
    let task = |js: Range<usize>| {
        let p = ptr;
        let put = |r: usize, j: usize, v: f32| {
            // SAFETY: r < n and c0 + j < cols.end <= m, so the index is inside `out` (n * m
            // elements); each (r, j) is written by exactly one task, because the tasks'
            // ranges of j are disjoint, and nothing reads `out` meanwhile.
            unsafe { *p.0.add(r * m + c0 + j) = v };
        };
        // Activation rows outside, weight rows inside: the task's weight rows stay in cache
        // and each group of four activation rows is read once per task.
        let mut r = 0;
        while r + 4 <= n {
            for j in js.clone() {
                for (i, v) in f4(j, r).into_iter().enumerate() {
                    put(r + i, j, v);
                }
            }
            r += 4;
        }
        for r in r..n {
            for j in js.clone() {
                put(r, j, f(j, r));
            }
        }
    };
    let rows = cols.len();
    if n * rows * k < PAR_MIN_WORK {
        task(0..rows);
    } else {
        (0..rows.div_ceil(ROWS_PER_TASK))
            .into_par_iter()
            .for_each(|t| task(t * ROWS_PER_TASK..((t + 1) * ROWS_PER_TASK).min(rows)));
    }
}
