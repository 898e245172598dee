//! Quantized weights (GGUF Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, and F16) against the f32 matmul of
//! the same weights dequantized on the CPU: every type at decode (1, 2, 4, 7, 8 rows: the
//! streaming kernels; in bf16 on 8-bit activations with dp4a, whose relative error is
//! printed), batch (9 to 256 rows at every tile edge: the tiled kernel in bf16) and prefill
//! (257, 300, 512 rows: dequantized scratch and GEMM) sizes, the
//! fused gate/up SiLU, stacked parts of mixed types (up to three adjacent parts of one type
//! per decode launch; odd row counts), quantized embedding tables. The CPU runs the small shapes (CI);
//! a GPU also the 4096x4096 ones.

use kiln::backend::cpu::CpuBackend;
use kiln::backend::quant::GgmlType;
use kiln::backend::{Activation, Backend, HostTensor};
use rand::RngExt;

use crate::harness::*;

const TYPES: [GgmlType; 5] = [
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
];
/// Every path's row counts and the edges between them: streaming (1-8), the tiled kernel's
/// 16/32/64-row tiles (9-256; past 64 in several row blocks), the dequantized GEMM (257 on).
const ROWS: [usize; 16] = [1, 2, 4, 7, 8, 9, 16, 17, 32, 33, 64, 65, 256, 257, 300, 512];

/// Relative error allowed where activations are quantized to 8 bits per 32 (the CPU's
/// quantized matmul, as llama.cpp's; a GPU's bf16 decode rows). Measured: median 5e-3 on the
/// H100 (2.6e-2 at worst, in the 96-column SiLU case); on the CPU over 250 seeds of every
/// `quant` case, at most 1.3e-2 (that SiLU case at one row, median 5.6e-3) once `random_blocks`
/// gave K-quant weights a zero mean (before, over 1,500 seeds, a row whose gates were all
/// negative reached 6.7e-1). A wrong kernel is off by about 1.
const ACT8_TOL: f64 = 5e-2;

/// Relative error allowed: the backend's, widened on the CPU (whose quantized matmul
/// quantizes activations to 8 bits, as llama.cpp does).
fn qtol<B: TestBackend>(b: &B) -> f64 {
    if b.label() == "cpu" {
        ACT8_TOL
    } else {
        b.tol()
    }
}

/// Relative error allowed at `n` rows: a GPU's decode rows in bf16 quantize the activations
/// to 8 bits per 32 as the CPU does, and so may its batch rows (9-256, the 8-bit tiles of
/// `qmma8_*` on NVIDIA sm_80+, for Q8_0 or every type with `KILN_QMMA8=all`): both get the
/// CPU's allowance ([`ACT8_TOL`]).
fn row_tol<B: TestBackend>(b: &B, n: usize) -> f64 {
    if gpu(b) && n <= 256 && b.label().contains("Bf16") {
        ACT8_TOL
    } else {
        qtol(b)
    }
}

fn gpu<B: TestBackend>(b: &B) -> bool {
    b.label() != "cpu"
}

/// `‖got − want‖ / ‖want‖` over the first `want.len()` values (as `assert_close` measures).
fn rel_err(got: &[f32], want: &[f32]) -> f64 {
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (g, w) in got.iter().zip(want) {
        num += (*g as f64 - *w as f64).powi(2);
        den += (*w as f64).powi(2);
    }
    (num / den.max(1e-30)).sqrt()
}

/// Checks `got` against `want` (rows only, see `assert_rows_only`); on a GPU at decode sizes
/// (the 8-bit activation path in bf16) also prints the error, for the record.
fn check_rows<B: TestBackend>(b: &B, what: &str, n: usize, got: &[f32], want: &[f32]) {
    if gpu(b) && n <= 8 {
        eprintln!("decode error {what}: {:.2e}", rel_err(got, want));
    }
    assert_rows_only(what, got, want, row_tol(b, n));
}

fn raw(rng: &mut rand_chacha::ChaCha8Rng, ty: GgmlType, rows: usize, cols: usize) -> HostTensor {
    HostTensor::raw(vec![rows, cols], ty, random_blocks(rng, ty, rows, cols)).expect("blocks")
}

/// `x @ w^T (+ bias)` for each row count of `rows`, backend against the f32 reference.
fn check_matmul<B: TestBackend>(
    b: &mut B,
    rng: &mut rand_chacha::ChaCha8Rng,
    w: HostTensor,
    with_bias: bool,
    rows: &[usize],
    what: &str,
) {
    let mut reference = CpuBackend::with_f32_weights();
    let (m, k) = (w.rows(), w.cols());
    let bw = b.upload_weight(w.clone()).expect("upload");
    let rw = reference.upload_weight(w).expect("upload");
    let bias = random(rng, m, 1.0);
    let (bb, rb) = (
        weight(b, vec![m], &bias),
        weight(&mut reference, vec![m], &b.quantize(&bias)),
    );
    for &n in rows {
        let x = b.quantize(&random(rng, n * k, 1.0));
        let bx = tensor(b, n, k, &x);
        let rx = tensor(&mut reference, n, k, &x);
        let mut out = poisoned(b, n + 1, m);
        let mut rout = reference.alloc(n, m).unwrap();
        let (bias_b, bias_r) = if with_bias {
            (Some(&bb), Some(&rb))
        } else {
            (None, None)
        };
        b.matmul(&bx, &bw, bias_b, n, &mut out).expect("matmul");
        reference.matmul(&rx, &rw, bias_r, n, &mut rout).unwrap();
        let got = b.to_host(&out, n + 1).unwrap();
        let what = format!("{} {what} {n}x{k}x{m}", b.label());
        check_rows(b, &what, n, &got, &reference.to_host(&rout, n).unwrap());
    }
}

fn quant_matmuls<B: TestBackend>(b: &mut B) {
    let mut rng = rng("quant_matmuls");
    let mut shapes = vec![(37, 768)];
    if gpu(b) {
        // 256x14336: down_proj's k; from 4 rows on, the 8-bit rows outgrow a block's shared
        // memory and are quantized once into the scratch (`quantize_x`) instead.
        shapes.extend([(4096, 4096), (256, 14336)]);
    }
    for ty in TYPES {
        for &(m, k) in &shapes {
            let w = raw(&mut rng, ty, m, k);
            check_matmul(b, &mut rng, w, m == 37, &ROWS, &ty.to_string());
        }
        if gpu(b) {
            // k = 6400: the decode kernels' (1-8 rows) unchecked whole steps, then a partial
            // one (of one step or of two, after an odd count of whole steps), for every type.
            let w = raw(&mut rng, ty, 64, 6400);
            check_matmul(b, &mut rng, w, false, &[1, 2, 4, 8], &ty.to_string());
        }
    }
    // F16 weights, converted to the compute type on the device.
    let bytes: Vec<u8> = random(&mut rng, 45 * 512, 1.0)
        .into_iter()
        .flat_map(|v| half::f16::from_f32(v).to_le_bytes())
        .collect();
    let w = HostTensor::raw(vec![45, 512], GgmlType::F16, bytes).unwrap();
    check_matmul(b, &mut rng, w, true, &[1, 7, 64], "F16");
}
crate::parity_test!(quantized_matmul_every_type, quant_matmuls);

/// Stacked parts of mixed types (fused qkv of a Q4_K_M file: Q4_K, Q4_K, Q6_K; of a Q5_K_M
/// file: Q5_K, Q5_K, Q6_K: one decode launch in bf16).
fn quant_stacked<B: TestBackend>(b: &mut B) {
    let mut rng = rng("quant_stacked");
    let mut shapes = vec![(GgmlType::Q4K, 64, 32, 512), (GgmlType::Q5K, 64, 32, 512)];
    if gpu(b) {
        shapes.push((GgmlType::Q4K, 4096, 1024, 4096));
    }
    for (ty, q, kv, k) in shapes {
        let parts = vec![
            raw(&mut rng, ty, q, k),
            raw(&mut rng, ty, kv, k),
            raw(&mut rng, GgmlType::Q6K, kv, k),
        ];
        let w = HostTensor::concat_rows(parts).unwrap();
        check_matmul(b, &mut rng, w, true, &ROWS, &format!("{ty}+Q6_K stack"));
    }
    // Five parts of odd row counts: four Q4_K (decode and batch launches of three parts,
    // then of one with the Q6_K in the last slot), then a Q6_K.
    let mut parts: Vec<HostTensor> = [37, 33, 31, 29]
        .iter()
        .map(|&r| raw(&mut rng, GgmlType::Q4K, r, 512))
        .collect();
    parts.push(raw(&mut rng, GgmlType::Q6K, 27, 512));
    let w = HostTensor::concat_rows(parts).unwrap();
    check_matmul(
        b,
        &mut rng,
        w,
        true,
        &[1, 2, 4, 7, 8, 16, 33, 64, 65, 300],
        "five-part stack",
    );
}
crate::parity_test!(quantized_matmul_stacked_mixed_types, quant_stacked);

/// The fused gate/up SiLU over quantized parts (same type: one kernel; mixed: matmul then
/// SiLU-mul), at the decode rows and, once every kernel is loaded, at the tiles' (16, 32 and
/// 64-row tiles, two row tiles at 100; k split into partials that the reduce finishes, and
/// whole at k 256; 14336 columns take the wide blocks at 64 rows).
fn quant_glu<B: TestBackend>(b: &mut B) {
    let mut rng = rng("quant_glu");
    let mut reference = CpuBackend::with_f32_weights();
    let mut cases: Vec<(GgmlType, GgmlType, usize, usize)> =
        TYPES.iter().map(|&t| (t, t, 96, 512)).collect();
    cases.push((GgmlType::Q4K, GgmlType::Q6K, 96, 512));
    if gpu(b) {
        b.wait_kernels();
        cases.push((GgmlType::Q4K, GgmlType::Q4K, 1024, 4096));
        cases.push((GgmlType::Q4K, GgmlType::Q4K, 14336, 256));
        cases.push((GgmlType::Q6K, GgmlType::Q6K, 14336, 512));
        // Whole steps then a partial one in the one-row kernels (Q8_0: two steps a trip).
        cases.push((GgmlType::Q8_0, GgmlType::Q8_0, 64, 6400));
        cases.push((GgmlType::Q4K, GgmlType::Q4K, 64, 6400));
    }
    for (tg, tu, f, k) in cases {
        let w = HostTensor::concat_rows(vec![raw(&mut rng, tg, f, k), raw(&mut rng, tu, f, k)])
            .unwrap();
        let bw = b.upload_weight(w.clone()).expect("upload");
        let rw = reference.upload_weight(w).unwrap();
        for n in [1, 2, 4, 7, 8, 9, 16, 32, 33, 64, 100] {
            let what = format!("{} matmul_silu_mul {tg}+{tu} {n}x{k}x{f}", b.label());
            check_glu(b, &mut reference, &mut rng, (&bw, &rw), (n, k, f), &what);
        }
    }
}
crate::parity_test!(quantized_matmul_silu_mul, quant_glu);

/// The gate/up SiLU product of `n` random rows through the stacked weight `w` (on `b`, and
/// on the CPU `reference`) of `f` columns each and `k` inputs, the output row past `n`
/// poisoned.
fn check_glu<B: TestBackend>(
    b: &mut B,
    reference: &mut CpuBackend,
    rng: &mut rand_chacha::ChaCha8Rng,
    w: (&B::Weight, &<CpuBackend as Backend>::Weight),
    (n, k, f): (usize, usize, usize),
    what: &str,
) {
    let x = b.quantize(&random(rng, n * k, 1.0));
    let (bx, rx) = (tensor(b, n, k, &x), tensor(reference, n, k, &x));
    let (mut gu, mut out) = (poisoned(b, n, 2 * f), poisoned(b, n + 1, f));
    let mut rgu = reference.alloc(n, 2 * f).unwrap();
    let mut rout = reference.alloc(n, f).unwrap();
    b.matmul_glu(Activation::Silu, &bx, w.0, n, &mut gu, &mut out)
        .expect("matmul_glu");
    reference
        .matmul_glu(Activation::Silu, &rx, w.1, n, &mut rgu, &mut rout)
        .unwrap();
    let got = b.to_host(&out, n + 1).unwrap();
    check_rows(b, what, n, &got, &reference.to_host(&rout, n).unwrap());
}

/// The output projection's (or the down matmul's) product with the residual add and the
/// RMSNorm after it (`matmul_add_rms_norm`), at decode rows and, once every kernel is
/// loaded, at the tiles' (k split: their reduce adds and norms, 16 to 300 rows): the residual
/// and the output against the CPU's matmul then `add_rms_norm`, and the residual exactly
/// what the backend's own two ops leave (the same sums and roundings), the output within a
/// rounding of theirs (the norm's sum of squares adds in another order).
fn quant_matmul_add_norm<B: TestBackend>(b: &mut B) {
    let mut rng = rng("quant_matmul_add_norm");
    let mut reference = CpuBackend::with_f32_weights();
    let mut cases = vec![(GgmlType::Q4K, 512, 1024)];
    if gpu(b) {
        b.wait_kernels();
        cases.push((GgmlType::Q6K, 4096, 4096));
        cases.push((GgmlType::Q4_0, 256, 512));
        cases.push((GgmlType::Q5K, 512, 512));
    }
    let eps = 1e-5;
    for (t, h, k) in cases {
        let w = raw(&mut rng, t, h, k);
        let (bw, rw) = (
            b.upload_weight(w.clone()).unwrap(),
            reference.upload_weight(w).unwrap(),
        );
        let norm = b.quantize(&random(&mut rng, h, 1.0));
        let (bn, rn) = (
            weight(b, vec![h], &norm),
            weight(&mut reference, vec![h], &norm),
        );
        for n in [1, 8, 9, 16, 33, 64, 100, 300] {
            let what = format!("{} matmul_add_rms_norm {t} {n}x{k}x{h}", b.label());
            let x = b.quantize(&random(&mut rng, n * k, 1.0));
            let r0 = b.quantize(&random(&mut rng, n * h, 1.0));
            let bx = tensor(b, n, k, &x);
            let [mut bres, mut bres2] = [0, 1].map(|_| tensor(b, n, h, &r0));
            let [mut bd, mut bd2] = [0, 1].map(|_| poisoned(b, n, h));
            let [mut bout, mut bout2] = [0, 1].map(|_| poisoned(b, n + 1, h));
            b.matmul_add_rms_norm(&bx, &bw, n, &mut bd, &mut bres, &bn, eps, &mut bout)
                .expect("matmul_add_rms_norm");
            b.matmul(&bx, &bw, None, n, &mut bd2).unwrap();
            b.add_rms_norm(&bd2, &mut bres2, &bn, eps, n, &mut bout2)
                .unwrap();
            let rx = tensor(&mut reference, n, k, &x);
            let mut rres = tensor(&mut reference, n, h, &r0);
            let mut rd = reference.alloc(n, h).unwrap();
            let mut rout = reference.alloc(n, h).unwrap();
            reference
                .matmul_add_rms_norm(&rx, &rw, n, &mut rd, &mut rres, &rn, eps, &mut rout)
                .unwrap();
            let (res, res2) = (b.to_host(&bres, n).unwrap(), b.to_host(&bres2, n).unwrap());
            let (out, out2) = (
                b.to_host(&bout, n + 1).unwrap(),
                b.to_host(&bout2, n + 1).unwrap(),
            );
            assert_close(
                &format!("{what}: residual"),
                &res,
                &reference.to_host(&rres, n).unwrap(),
                row_tol(b, n),
            );
            check_rows(
                b,
                &format!("{what}: out"),
                n,
                &out,
                &reference.to_host(&rout, n).unwrap(),
            );
            assert!(
                res.iter()
                    .zip(&res2)
                    .all(|(a, c)| a.to_bits() == c.to_bits()),
                "{what}: the residual differs from matmul + add_rms_norm's"
            );
            assert_rows_only(
                &format!("{what}: out against the two ops"),
                &out,
                &out2[..n * h],
                4e-3,
            );
        }
    }
}
crate::parity_test!(quantized_matmul_add_rms_norm, quant_matmul_add_norm);

/// A decode layer's chain of quantized matmuls after the kernels that make their inputs (in
/// bf16 on a GPU the RMSNorms also leave their output as 8-bit rows, which the matmul after
/// them reads instead of quantizing it again): RMSNorm, then a Q4_K+Q4_K+Q6_K qkv stack (one
/// launch); the residual add and RMSNorm, then the Q4_K gate/up SiLU, then the Q6_K down
/// matmul on the SiLU's output (checked against the reference's down matmul of that
/// output). Twice over the same buffers, with new values.
fn quant_chain<B: TestBackend>(b: &mut B) {
    // The CPU's own 8-bit activations (one scale per 256 for the k-quants) compound to
    // 3.2e-2 at times over these small shapes; the GPU's (per 32) keep to `row_tol`.
    let check = |b: &B, what: &str, n: usize, got: &[f32], want: &[f32]| {
        if gpu(b) {
            check_rows(b, what, n, got, want);
        } else {
            assert_rows_only(what, got, want, 6e-2);
        }
    };
    let mut rng = rng("quant_chain");
    let mut reference = CpuBackend::with_f32_weights();
    let mut shapes = vec![(256, 64, 512)];
    if gpu(b) {
        shapes.push((4096, 1024, 14336));
    }
    for (h, kv, f) in shapes {
        let qkv = HostTensor::concat_rows(vec![
            raw(&mut rng, GgmlType::Q4K, h, h),
            raw(&mut rng, GgmlType::Q4K, kv, h),
            raw(&mut rng, GgmlType::Q6K, kv, h),
        ])
        .unwrap();
        let gate_up = HostTensor::concat_rows(vec![
            raw(&mut rng, GgmlType::Q4K, f, h),
            raw(&mut rng, GgmlType::Q4K, f, h),
        ])
        .unwrap();
        let down = raw(&mut rng, GgmlType::Q6K, h, f);
        let m = h + 2 * kv;
        let (norm1, norm2) = (
            b.quantize(&random(&mut rng, h, 1.0)),
            b.quantize(&random(&mut rng, h, 1.0)),
        );
        let bw = [qkv.clone(), gate_up.clone(), down.clone()].map(|w| b.upload_weight(w).unwrap());
        let rw = [qkv, gate_up, down].map(|w| reference.upload_weight(w).unwrap());
        let bn = [weight(b, vec![h], &norm1), weight(b, vec![h], &norm2)];
        let rn = [
            weight(&mut reference, vec![h], &norm1),
            weight(&mut reference, vec![h], &norm2),
        ];
        for n in [1, 2, 4, 7, 8] {
            let mut bt = [
                (n, h),
                (n, h),
                (n, m),
                (n, h),
                (n, 2 * f),
                (n, f),
                (n + 1, h),
            ]
            .map(|(r, c)| poisoned(b, r, c));
            let mut rt = [(n, h), (n, h), (n, m), (n, h), (n, 2 * f), (n, f), (n, h)]
                .map(|(r, c)| reference.alloc(r, c).unwrap());
            for round in 0..2 {
                let x = b.quantize(&random(&mut rng, n * h, 1.0));
                let attn = b.quantize(&random(&mut rng, n * h, 1.0));
                let [bx, ba, bqkv, bxn, bgu, bact, bout] = &mut bt;
                b.write(bx, &x);
                b.write(ba, &attn);
                let [rx, ra, rqkv, rxn, rgu, ract, rout] = &mut rt;
                reference.write(rx, &x);
                reference.write(ra, &attn);
                let eps = 1e-5;
                b.rms_norm(bx, &bn[0], eps, n, bxn).unwrap();
                b.matmul(bxn, &bw[0], None, n, bqkv).unwrap();
                b.add_rms_norm(ba, bx, &bn[1], eps, n, bxn).unwrap();
                b.matmul_glu(Activation::Silu, bxn, &bw[1], n, bgu, bact)
                    .unwrap();
                b.matmul(bact, &bw[2], None, n, bout).unwrap();
                reference.rms_norm(rx, &rn[0], eps, n, rxn).unwrap();
                reference.matmul(rxn, &rw[0], None, n, rqkv).unwrap();
                reference.add_rms_norm(ra, rx, &rn[1], eps, n, rxn).unwrap();
                reference
                    .matmul_glu(Activation::Silu, rxn, &rw[1], n, rgu, ract)
                    .unwrap();
                let what = format!("{} chain {h}/{f} {n} rows round {round}", b.label());
                let (got, want) = (
                    b.to_host(bqkv, n).unwrap(),
                    reference.to_host(rqkv, n).unwrap(),
                );
                check(b, &format!("{what}: qkv"), n, &got, &want);
                let (got, want) = (
                    b.to_host(bact, n).unwrap(),
                    reference.to_host(ract, n).unwrap(),
                );
                check(b, &format!("{what}: silu"), n, &got, &want);
                // The down matmul against the reference's of the backend's own SiLU output
                // (one 8-bit rounding per check, not two compounded).
                reference.write(ract, &got[..n * f]);
                reference.matmul(ract, &rw[2], None, n, rout).unwrap();
                let (got, want) = (
                    b.to_host(bout, n + 1).unwrap(),
                    reference.to_host(rout, n).unwrap(),
                );
                check(b, &format!("{what}: down"), n, &got, &want);
            }
        }
    }
}
crate::parity_test!(quantized_decode_chain, quant_chain);

/// A decode chain like [`quant_chain`]'s (bf16, one row, 8B shapes; qkv, an output matmul,
/// gate/up SiLU and down) over three layers, 24 times with each down output fed to the next
/// layer's residual add, queued without waiting: on
/// sm_90 the norms, `quantize_x` and the 8-bit matmuls are launched as dependents that may
/// start while the kernel before them drains (programmatic dependent launch, `KILN_PDL`).
/// The results must be bit for bit those of the same chain with every launch waited for
/// (`sync_check`): a kernel touching a buffer before its predecessor is done (the 8-bit rows
/// the next norm overwrites, the residual) changes them. The same again with the output
/// and down matmuls adding into the residual and leaving their norms to the matmul after
/// them (`matmul_add_rms_norm` with ops allowed to leave work pending, as in a step:
/// `qdot_norm_*`, then `qdot_in_*` / `qdot_silu_in_*`).
#[cfg(feature = "cuda")]
#[test]
fn quantized_decode_chain_overlapped_equals_serialized() {
    use kiln::backend::cuda::{CudaBackend, CudaOptions, DType, device_available};
    if !device_available() {
        eprintln!("notice: no CUDA device or driver here; CUDA parity skipped");
        return;
    }
    let (h, kv, f, layers, steps) = (4096, 1024, 14336, 3, 24);
    let mut rng = rng("quant_chain_overlapped");
    let weights: Vec<[HostTensor; 4]> = (0..layers)
        .map(|_| {
            let qkv = HostTensor::concat_rows(vec![
                raw(&mut rng, GgmlType::Q4K, h, h),
                raw(&mut rng, GgmlType::Q4K, kv, h),
                raw(&mut rng, GgmlType::Q6K, kv, h),
            ])
            .unwrap();
            let gate_up = HostTensor::concat_rows(vec![
                raw(&mut rng, GgmlType::Q4K, f, h),
                raw(&mut rng, GgmlType::Q4K, f, h),
            ])
            .unwrap();
            let o = raw(&mut rng, GgmlType::Q4K, h, h);
            [qkv, o, gate_up, raw(&mut rng, GgmlType::Q6K, h, f)]
        })
        .collect();
    let norms: Vec<Vec<f32>> = (0..2 * layers).map(|_| random(&mut rng, h, 1.0)).collect();
    let x0 = random(&mut rng, h, 1.0);
    let m = h + 2 * kv;
    let run = |sync_check: bool, fused: bool| -> Vec<Vec<f32>> {
        let opts = CudaOptions {
            dtype: DType::Bf16,
            sync_check,
            graphs: false,
            kernel_cache: kiln::engine::default_kernel_cache_dir(),
            ..gpu_options()
        };
        let mut b = CudaBackend::new(0, opts).expect("a CUDA device is present");
        // Every unit loaded: the fused norms' kernels compile after start-up, and both runs
        // must take the same launches.
        b.wait_kernels().unwrap();
        b.fuse_across_ops(fused).unwrap();
        let bw: Vec<_> = weights
            .iter()
            .map(|ws| ws.clone().map(|w| b.upload_weight(w).unwrap()))
            .collect();
        let bn: Vec<_> = norms.iter().map(|n| weight(&mut b, vec![h], n)).collect();
        let mut x = tensor(&mut b, 1, h, &x0);
        let [mut xn, mut xn2, mut qkv, mut attn, mut gu, mut act, mut out] =
            [h, h, m, h, 2 * f, f, h].map(|c| poisoned(&mut b, 1, c));
        b.write(&mut out, &vec![0.0; h]);
        let eps = 1e-5;
        for step in 0..steps {
            let l = step % layers;
            // The previous down output joins the residual, then the layer's chain (the
            // "attention output" is a matmul of the normed row: its input is quantized by
            // `quantize_x`, as is the SiLU output). Fused, the down matmul before ran the
            // norm.
            if !fused || step == 0 {
                b.add_rms_norm(&out, &mut x, &bn[2 * l], eps, 1, &mut xn)
                    .unwrap();
            }
            b.matmul(&xn, &bw[l][0], None, 1, &mut qkv).unwrap();
            if fused {
                b.matmul_add_rms_norm(
                    &xn,
                    &bw[l][1],
                    1,
                    &mut attn,
                    &mut x,
                    &bn[2 * l + 1],
                    eps,
                    &mut xn2,
                )
                .unwrap();
            } else {
                b.matmul(&xn, &bw[l][1], None, 1, &mut attn).unwrap();
                b.add_rms_norm(&attn, &mut x, &bn[2 * l + 1], eps, 1, &mut xn2)
                    .unwrap();
            }
            b.matmul_glu(Activation::Silu, &xn2, &bw[l][2], 1, &mut gu, &mut act)
                .unwrap();
            if fused {
                let next = 2 * ((step + 1) % layers);
                b.matmul_add_rms_norm(
                    &act, &bw[l][3], 1, &mut out, &mut x, &bn[next], eps, &mut xn,
                )
                .unwrap();
            } else {
                b.matmul(&act, &bw[l][3], None, 1, &mut out).unwrap();
            }
        }
        // Fused, `out` is not written: the normed row stands for it.
        let last = if fused { &xn } else { &out };
        [&x, &qkv, &act, last]
            .map(|t| b.to_host(t, 1).unwrap())
            .into_iter()
            .collect()
    };
    for fused in [false, true] {
        let (serial, overlapped) = (run(true, fused), run(false, fused));
        for (what, (s, o)) in ["residual", "qkv", "silu", "down"]
            .iter()
            .zip(serial.iter().zip(&overlapped))
        {
            assert!(s.iter().all(|v| v.is_finite()), "{what}: serialized output");
            let differ = s
                .iter()
                .zip(o)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            assert_eq!(
                differ, 0,
                "{what} (fused {fused}): {differ} values differ from the serialized chain's"
            );
        }
    }
    eprintln!("quantized decode chain: overlapped launches give the serialized bits");
}

/// Embedding rows of quantized tables (dequantized by token id on the device).
fn quant_embed<B: TestBackend>(b: &mut B) {
    let mut rng = rng("quant_embed");
    let mut reference = CpuBackend::with_f32_weights();
    let shape = TINY_KV;
    b.alloc_kv(&shape).unwrap();
    reference.alloc_kv(&shape).unwrap();
    let (vocab, h) = (300, 512);
    for ty in TYPES {
        let table = raw(&mut rng, ty, vocab, h);
        let table_rows = table.clone();
        let bt = b.upload_weight(table.clone()).expect("upload");
        let rt = reference.upload_weight(table).unwrap();
        let ids: Vec<u32> = (0..9).map(|_| rng.random_range(0..vocab as u32)).collect();
        let tables = block_tables(&mut rng, &[9], 4, 8);
        let p = plan(&[(9, 9, tables[0].clone())], 4, |i| ids[i]);
        let (bb, rb) = (b.prepare(&p).unwrap(), reference.prepare(&p).unwrap());
        let mut out = poisoned(b, 10, h);
        let mut rout = reference.alloc(9, h).unwrap();
        b.embed(&bt, 0, vocab, &bb, &mut out).expect("embed");
        reference.embed(&rt, 0, vocab, &rb, &mut rout).unwrap();
        let want = reference.to_host(&rout, 9).unwrap();
        // Exact up to the compute type's rounding.
        assert_rows_only(
            &format!("{} embed {ty}", b.label()),
            &b.to_host(&out, 10).unwrap(),
            &want,
            b.tol().min(1e-2),
        );
        // A tensor-parallel shard's rows 100..220: its tokens as above, zeros for the rest.
        let part = kiln::runner::shard::rows(&table_rows, 100..220).unwrap();
        let bp = b.upload_weight(part).expect("upload part");
        let mut out = poisoned(b, 10, h);
        b.embed(&bp, 100, vocab, &bb, &mut out).expect("embed part");
        let masked: Vec<f32> = (0..9 * h)
            .map(|i| match ids[i / h] {
                100..220 => want[i],
                _ => 0.0,
            })
            .collect();
        assert_rows_only(
            &format!("{} embed {ty}, rows 100..220", b.label()),
            &b.to_host(&out, 10).unwrap(),
            &masked,
            b.tol().min(1e-2),
        );
    }
}
crate::parity_test!(quantized_embedding_rows, quant_embed);

/// Tables larger than the upload's page-locked staging ring (4 x 16 MiB on CUDA), so its
/// buffers are reused while earlier copies may still run: rows on each side of every
/// staging boundary, and the last row, read back exactly as the CPU has them. F16 and BF16
/// go through the device conversion or the direct copy, Q8_0 through the repack. GPU only
/// (the CPU has no staging; a table this size would only slow CI).
fn large_uploads<B: TestBackend>(b: &mut B) {
    if !gpu(b) {
        return;
    }
    let mut rng = rng("large_uploads");
    let mut reference = CpuBackend::with_f32_weights();
    let shape = TINY_KV;
    b.alloc_kv(&shape).unwrap();
    reference.alloc_kv(&shape).unwrap();
    let (vocab, h) = (17_001, 4096);
    for ty in [GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0] {
        let table = match ty {
            GgmlType::Q8_0 => raw(&mut rng, ty, vocab, h),
            _ => {
                let bytes = random(&mut rng, vocab * h, 1.0)
                    .into_iter()
                    .flat_map(|v| match ty {
                        GgmlType::F16 => half::f16::from_f32(v).to_le_bytes(),
                        _ => half::bf16::from_f32(v).to_le_bytes(),
                    })
                    .collect();
                HostTensor::raw(vec![vocab, h], ty, bytes).unwrap()
            }
        };
        let bt = b.upload_weight(table.clone()).expect("upload");
        let rt = reference.upload_weight(table).unwrap();
        // 16 MiB of two-byte rows is 2048 rows; of Q8_0's one-byte quants 4096.
        let mut ids: Vec<u32> = [0, 1, 2047, 2048, 4095, 4096, 8191, 8192, 12_288, 16_384]
            .into_iter()
            .chain([vocab as u32 - 1])
            .collect();
        ids.extend((0..5).map(|_| rng.random_range(0..vocab as u32)));
        let n = ids.len();
        let tables = block_tables(&mut rng, &[n as u32], 4, 8);
        let p = plan(&[(n as u32, n as u32, tables[0].clone())], 4, |i| ids[i]);
        let (bb, rb) = (b.prepare(&p).unwrap(), reference.prepare(&p).unwrap());
        let mut out = poisoned(b, n + 1, h);
        let mut rout = reference.alloc(n, h).unwrap();
        b.embed(&bt, 0, vocab, &bb, &mut out).expect("embed");
        reference.embed(&rt, 0, vocab, &rb, &mut rout).unwrap();
        let want = reference.to_host(&rout, n).unwrap();
        assert_rows_only(
            &format!("{} {ty} table of {vocab} x {h}", b.label()),
            &b.to_host(&out, n + 1).unwrap(),
            &want,
            b.tol().min(1e-2),
        );
    }
}
crate::parity_test!(large_weight_uploads, large_uploads);

/// The fixture directory: `KILN_MODELS_DIR` (device runs carry the files), else `../shared/models`.
fn models_dir() -> std::path::PathBuf {
    std::env::var_os("KILN_MODELS_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/models")
        })
}

/// Greedy ids of 48 tokens after each prompt.
fn greedy_ids<B: Backend>(backend: B, files: &kiln::model::ModelFiles) -> Vec<Vec<u32>> {
    use kiln::generate::{GenerateOptions, SingleGenerator};
    let tok = files.tokenizer.as_ref().expect("fixture tokenizer");
    let mut g = SingleGenerator::new(backend, files, 256, 7, 4).expect("load");
    let opts = GenerateOptions {
        max_tokens: 48,
        params: kiln::sampling::SamplingParams::greedy(),
        stop_ids: vec![],
        chunk: 7,
        block_size: 4,
        record_logits: 0,
    };
    [
        "Once upon a time",
        "The little dog",
        "Lily and Ben went to the park",
    ]
    .iter()
    .map(|p| {
        g.generate(&tok.encode(p, true).unwrap(), &opts, |_| {})
            .expect("generate")
            .token_ids
    })
    .collect()
}

/// stories260K in Q8_0 and Q4_0: a GPU in f32 (weights quantized on the device) gives the
/// greedy ids of the CPU on the same weights dequantized to f32.
#[test]
fn stories260k_quantized_greedy_matches_cpu() {
    use kiln::model::{LoadFormat, ModelFiles};
    for name in ["stories260K-Q8_0.gguf", "stories260K-Q4_0.gguf"] {
        let files = ModelFiles::open(&models_dir().join(name), LoadFormat::Gguf)
            .unwrap_or_else(|e| panic!("{name} fixture: {e}"));
        let want = greedy_ids(CpuBackend::with_f32_weights(), &files);
        assert!(want.iter().all(|ids| ids.len() == 48), "{name}: cpu ids");
        #[cfg(feature = "cuda")]
        if let Some(b) = cuda(kiln::backend::DType::F32) {
            assert_eq!(greedy_ids(b, &files), want, "{name}: cuda f32 greedy ids");
            eprintln!("{name}: cuda f32 greedy ids match the cpu's");
        }
        #[cfg(feature = "rocm")]
        if let Some(b) = rocm(kiln::backend::DType::F32) {
            assert_eq!(greedy_ids(b, &files), want, "{name}: rocm f32 greedy ids");
        }
    }
}

/// The qkv matmul with its rope and cache write (`matmul_rope_write_kv`: on a GPU in bf16, a
/// quantized qkv's decode launches rope adjacent pairs and fill the cache themselves, and
/// the tiled kernels' split-k reduce does it for 9-256 rows, either rope layout; no
/// `rope_kv` launch) against the backend's own matmul then `rope_write_kv`, and against the
/// CPU's f32 matmul, rope and cache write: the qkv rows, then attention over each cache
/// after a prefill of the sequences' earlier positions. Q4_K q and k with a Q6_K v (one
/// launch), Q8_0 throughout, and Q4_K q and k with a Q8_0 v (two launches, the second
/// starting at the v columns: the tiles' rope stays separate); Llama-3 rope and a partial
/// rope with an attention factor, adjacent pairs and head halves; 1, 2, 4, 7 and 8 decode
/// rows and 16, 33 and 64 rows (the tiles, loaded first) at positions 0 to 299.
fn quant_qkv_rope<B: TestBackend>(b: &mut B) {
    use kiln::backend::{AttnShape, KvShape};
    use kiln::model::{RopeLayout, RopeSpec};
    let mut rng = rng("quant_qkv_rope");
    let mut cpu = CpuBackend::with_f32_weights();
    let llama3 = RopeSpec {
        layout: RopeLayout::Interleaved,
        ..crate::llama3_rope()
    };
    let partial = |hd: usize, layout| RopeSpec {
        theta: 10000.0,
        dim: hd / 2,
        layout,
        llama3: None,
        freq_factors: None,
        attn_factor: 1.3,
    };
    b.wait_kernels();
    let mut shapes = vec![(4, 2, 128, 256)];
    if gpu(b) {
        shapes.push((32, 8, 128, 4096));
    }
    // The first 8 rows' contexts, then shorter ones (the cache holds 400 blocks of 16).
    let ctx_of = |i: usize| match [37u32, 5, 300, 1, 17, 64, 2, 129].get(i) {
        Some(&c) => c,
        None => 1 + (i as u32 * 37) % 61,
    };
    for (nh, nkv, hd, k) in shapes {
        let shape = AttnShape::new(nh, nkv, hd);
        let (q_dim, kv_dim, cols) = (shape.q_dim(), shape.kv_dim(), shape.qkv_dim());
        let cases = [
            (
                [GgmlType::Q4K, GgmlType::Q4K, GgmlType::Q6K],
                llama3.clone(),
            ),
            ([GgmlType::Q8_0; 3], partial(hd, RopeLayout::Interleaved)),
            (
                [GgmlType::Q4K, GgmlType::Q4K, GgmlType::Q8_0],
                llama3.clone(),
            ),
            (
                [GgmlType::Q4K, GgmlType::Q4K, GgmlType::Q6K],
                partial(hd, RopeLayout::Half),
            ),
        ];
        for (ty, rope) in cases {
            let w = HostTensor::concat_rows(
                [(ty[0], q_dim), (ty[1], kv_dim), (ty[2], kv_dim)]
                    .map(|(t, r)| raw(&mut rng, t, r, k))
                    .to_vec(),
            )
            .unwrap();
            let (bw, cw) = (
                b.upload_weight(w.clone()).unwrap(),
                cpu.upload_weight(w).unwrap(),
            );
            for n in [1usize, 2, 4, 7, 8, 16, 33, 64] {
                let ctx: Vec<u32> = (0..n).map(ctx_of).collect();
                let ctx = &ctx[..];
                let kvs = KvShape {
                    num_layers: 2,
                    num_blocks: 400,
                    block_size: 16,
                    n_kv_heads: nkv,
                    head_dim: hd,
                };
                let tables = block_tables(&mut rng, ctx, 16, 400);
                // Caches for the op under test, the backend's separate ops, the reference.
                let mut kvs3 = [b.alloc_kv(&kvs).unwrap(), b.alloc_kv(&kvs).unwrap()];
                let mut ckv = cpu.alloc_kv(&kvs).unwrap();
                // The earlier positions of each sequence (a prefill), the same in all three.
                let pre: Vec<_> = ctx
                    .iter()
                    .zip(&tables)
                    .filter(|(c, _)| **c > 1)
                    .map(|(&c, t)| (c - 1, c - 1, t.clone()))
                    .collect();
                if !pre.is_empty() {
                    let p = plan(&pre, 16, |_| 0);
                    let t = p.num_tokens();
                    let x = b.quantize(&random(&mut rng, t * cols, 1.0));
                    let pb = b.prepare(&p).unwrap();
                    for kv in &mut kvs3 {
                        let mut bx = tensor(b, t, cols, &x);
                        b.rope_write_kv(&mut bx, kv, 1, &pb, &shape, &rope).unwrap();
                    }
                    let cb = cpu.prepare(&p).unwrap();
                    let mut cx = tensor(&mut cpu, t, cols, &x);
                    cpu.rope_write_kv(&mut cx, &mut ckv, 1, &cb, &shape, &rope)
                        .unwrap();
                }
                let seqs: Vec<_> = ctx
                    .iter()
                    .zip(&tables)
                    .map(|(&c, t)| (1, c, t.clone()))
                    .collect();
                let p = plan(&seqs, 16, |_| 0);
                let (bb, cb) = (b.prepare(&p).unwrap(), cpu.prepare(&p).unwrap());
                // Inputs of half scale: q and k of moderate size, so the softmax is not peaked
                // enough to blow the 8-bit activations' error up (below).
                let x = b.quantize(&random(&mut rng, n * k, 0.5));
                let (bx, cx) = (tensor(b, n, k, &x), tensor(&mut cpu, n, k, &x));
                let [fused_kv, sep_kv] = &mut kvs3;
                let mut fused = poisoned(b, n + 1, cols);
                b.matmul_rope_write_kv(
                    &bx, &bw, None, n, &mut fused, fused_kv, 1, &bb, &shape, &rope,
                )
                .unwrap();
                let mut sep = poisoned(b, n + 1, cols);
                b.matmul(&bx, &bw, None, n, &mut sep).unwrap();
                b.rope_write_kv(&mut sep, sep_kv, 1, &bb, &shape, &rope)
                    .unwrap();
                let mut cq = cpu.alloc(n, cols).unwrap();
                cpu.matmul(&cx, &cw, None, n, &mut cq).unwrap();
                cpu.rope_write_kv(&mut cq, &mut ckv, 1, &cb, &shape, &rope)
                    .unwrap();
                let what = format!(
                    "{} qkv rope {ty:?} {:?} rot {} {nh}+{nkv}x{hd} k {k}, {n} rows",
                    b.label(),
                    rope.layout,
                    rope.dim
                );
                let got = b.to_host(&fused, n + 1).unwrap();
                let sep_got = b.to_host(&sep, n + 1).unwrap();
                assert_rows_only(
                    &format!("{what}: against the separate ops"),
                    &got,
                    &sep_got[..n * cols],
                    b.tol(),
                );
                check_rows(b, &what, n, &got, &cpu.to_host(&cq, n).unwrap());
                let mut outs = [0, 0].map(|_| poisoned(b, n, q_dim));
                let [out, sep_out] = &mut outs;
                b.attention(&fused, fused_kv, 1, &bb, &shape, None, out)
                    .unwrap();
                b.attention(&sep, sep_kv, 1, &bb, &shape, None, sep_out)
                    .unwrap();
                let mut cout = cpu.alloc(n, q_dim).unwrap();
                cpu.attention(&cq, &ckv, 1, &cb, &shape, None, &mut cout)
                    .unwrap();
                let got = b.to_host(out, n).unwrap();
                assert_close(
                    &format!("{what}: attention against the separate ops' cache"),
                    &got,
                    &b.to_host(sep_out, n).unwrap(),
                    b.tol(),
                );
                // Against the f32 reference the softmax amplifies the q and k rows' error of
                // 8-bit activations (CPU, GPU decode rows): up to 0.11 relative over 300
                // seeds on the CPU, where the rows themselves stay within ACT8_TOL. This
                // check catches a cache both paths got wrong; the one above, the values.
                let tol = 4.0 * row_tol(b, n);
                let want = cpu.to_host(&cout, n).unwrap();
                assert_rows_only(
                    &format!("{what}: attention over the written cache"),
                    &got,
                    &want,
                    tol,
                );
            }
        }
    }
}
crate::parity_test!(quantized_qkv_rope_write_kv, quant_qkv_rope);

/// In bf16 on a GPU the quantized qkv decode launches rope and cache their output
/// themselves: `matmul_rope_write_kv` launches the matmul kernels alone, no `rope_kv`, for a
/// Q4_K_M-like stack at 1 and 2 rows (start-up's kernels), and, once every kernel is loaded,
/// at 16 and 64 rows on the tiles (their split-k reduce ropes; the values:
/// `quantized_qkv_rope_write_kv`).
#[cfg(feature = "cuda")]
#[test]
fn qkv_decode_matmul_ropes_its_own_output() {
    use kiln::backend::{AttnShape, KvShape};
    use kiln::model::{RopeLayout, RopeSpec};
    // Both settings of the switch, each on a backend of its own.
    for fused in [true, false] {
        let tuning = kiln::backend::GpuTuning {
            qkv_rope: fused,
            ..env_tuning()
        };
        let Some(mut b) = cuda_tuned(kiln::backend::DType::Bf16, tuning) else {
            return;
        };
        let mut rng = rng("qkv_decode_matmul_ropes");
        let shape = AttnShape::new(32, 8, 128);
        let (q_dim, kv_dim, cols, k) = (shape.q_dim(), shape.kv_dim(), shape.qkv_dim(), 4096);
        let w = HostTensor::concat_rows(vec![
            raw(&mut rng, GgmlType::Q4K, q_dim, k),
            raw(&mut rng, GgmlType::Q4K, kv_dim, k),
            raw(&mut rng, GgmlType::Q6K, kv_dim, k),
        ])
        .unwrap();
        let w = b.upload_weight(w).unwrap();
        let rope = RopeSpec {
            layout: RopeLayout::Interleaved,
            ..crate::llama3_rope()
        };
        let kvs = KvShape {
            num_layers: 1,
            num_blocks: 64,
            block_size: 16,
            n_kv_heads: 8,
            head_dim: 128,
        };
        let mut kv = b.alloc_kv(&kvs).unwrap();
        for n in [1u32, 2, 16, 64] {
            if n > 8 {
                b.wait_kernels().unwrap();
            }
            let seqs: Vec<_> = (0..n).map(|i| (1, 2 + i % 8, vec![i])).collect();
            // Timing is switched on before the step is prepared: `prepare` decides whether a
            // step's launches are timed.
            b.set_timing_period(Some(1));
            let bb = b.prepare(&plan(&seqs, 16, |_| 0)).unwrap();
            let x = tensor(
                &mut b,
                n as usize,
                k,
                &random(&mut rng, n as usize * k, 1.0),
            );
            let mut y = poisoned(&mut b, n as usize, cols);
            b.matmul_rope_write_kv(
                &x, &w, None, n as usize, &mut y, &mut kv, 0, &bb, &shape, &rope,
            )
            .unwrap();
            let ops: Vec<_> = b
                .take_kernel_timings()
                .unwrap()
                .iter()
                .map(|t| t.kernel)
                .collect();
            b.set_timing_period(None);
            assert!(
                ops.contains(&"matmul"),
                "{n} rows: the step was timed: {ops:?}"
            );
            assert_eq!(ops.contains(&"rope_kv"), !fused, "{n} rows: {ops:?}");
            assert!(
                ops.iter()
                    .all(|o| ["matmul", "rope_kv", "quantize_x"].contains(o)),
                "{n} rows: {ops:?}"
            );
        }
    }
}

/// A quantized gate/up of one type on the tiles (9-256 rows, every kernel loaded) takes its
/// SiLU-mul in the matmul (`qmmaglu_*`, and with k split, its reduce): no `silu_mul` launch
/// and no plain `matmul` (the values: `quantized_matmul_silu_mul`). With `qmma_glu` off: the
/// stacked matmul, then `silu_mul` (both settings run).
#[cfg(feature = "cuda")]
#[test]
fn gate_up_tiles_take_the_silu() {
    // Both settings of the switch, each on a backend of its own.
    for fused in [true, false] {
        let tuning = kiln::backend::GpuTuning {
            qmma_glu: fused,
            ..env_tuning()
        };
        let Some(mut b) = cuda_tuned(kiln::backend::DType::Bf16, tuning) else {
            return;
        };
        let mut rng = rng("gate_up_tiles_take_the_silu");
        b.wait_kernels().unwrap();
        let _kv = b.alloc_kv(&tiny_kv()).unwrap();
        // k 256: one k range; k 4096: split.
        for (f, k) in [(14336, 256), (1024, 4096)] {
            let w = HostTensor::concat_rows(vec![
                raw(&mut rng, GgmlType::Q4K, f, k),
                raw(&mut rng, GgmlType::Q4K, f, k),
            ])
            .unwrap();
            let w = b.upload_weight(w).unwrap();
            for n in [16usize, 32, 64] {
                let x = tensor(&mut b, n, k, &random(&mut rng, n * k, 1.0));
                let (mut gu, mut act) = (poisoned(&mut b, n, 2 * f), poisoned(&mut b, n, f));
                let ops = timed_ops(&mut b, |b| {
                    b.matmul_glu(Activation::Silu, &x, &w, n, &mut gu, &mut act)
                        .unwrap()
                });
                let want: &[&str] = if fused {
                    &["matmul_silu_mul"]
                } else {
                    &["matmul", "silu_mul"]
                };
                assert_launches(&ops, want, &format!("{n}x{k}x{f}"));
            }
        }
    }
}

/// On the tiles (every kernel loaded) a quantized output projection whose k is split does
/// the residual add and RMSNorm in its reduce at 32 rows or more: `matmul` and
/// `matmul_add_rms_norm` launches, no `add_rms_norm` (the values:
/// `quantized_matmul_add_rms_norm`); at 16 rows, and with `qmma_norm` off (both run), the matmul
/// (and its reduce), then `add_rms_norm`.
#[cfg(feature = "cuda")]
#[test]
fn split_tiles_add_and_norm_in_their_reduce() {
    // Both settings of the switch, each on a backend of its own.
    for fused in [true, false] {
        let tuning = kiln::backend::GpuTuning {
            qmma_norm: fused,
            ..env_tuning()
        };
        let Some(mut b) = cuda_tuned(kiln::backend::DType::Bf16, tuning) else {
            return;
        };
        let mut rng = rng("split_tiles_add_and_norm");
        b.wait_kernels().unwrap();
        let _kv = b.alloc_kv(&tiny_kv()).unwrap();
        let (h, k) = (4096, 4096);
        let w = b.upload_weight(raw(&mut rng, GgmlType::Q4K, h, k)).unwrap();
        let nw = weight(&mut b, vec![h], &random(&mut rng, h, 1.0));
        for n in [16usize, 32, 64] {
            let x = tensor(&mut b, n, k, &random(&mut rng, n * k, 1.0));
            let mut res = tensor(&mut b, n, h, &random(&mut rng, n * h, 1.0));
            let (mut d, mut out) = (poisoned(&mut b, n, h), poisoned(&mut b, n, h));
            let ops = timed_ops(&mut b, |b| {
                b.matmul_add_rms_norm(&x, &w, n, &mut d, &mut res, &nw, 1e-5, &mut out)
                    .unwrap()
            });
            let want: &[&str] = if fused && n >= 32 {
                &["matmul", "matmul_add_rms_norm"]
            } else {
                &["matmul", "add_rms_norm"]
            };
            assert_launches(&ops, want, &format!("{n} rows"));
        }
    }
}

/// One decode row whose output projection (or down matmul) adds into the residual and
/// leaves its RMSNorm to the quantized matmul after it (`qdot_norm_*`, then `qdot_in_*`,
/// `qdotmix_in_*` or `qdot_silu_in_*`; ops may leave work pending only where the caller
/// says, as `run_step` does): for Q4_K, Q6_K, Q8_0 and Q4_0 producers, each consumer's
/// output against the CPU's matmul, `add_rms_norm` and consumer; the residual exactly what
/// the backend's own two ops leave; the norm's output (written by the consumer, or by the
/// `rms_norm` another op or a download settles it with) within a rounding of theirs. With
/// `qdot_norm` off (both settings run), the same values from the matmul and `add_rms_norm`.
#[cfg(feature = "cuda")]
#[test]
fn one_row_norm_is_left_to_the_next_matmul() {
    // Both settings of the switch, each on a backend of its own.
    for on in [true, false] {
        let tuning = kiln::backend::GpuTuning {
            qdot_norm: on,
            ..env_tuning()
        };
        let Some(mut b) = cuda_tuned(kiln::backend::DType::Bf16, tuning) else {
            return;
        };
        let mut rng = rng("one_row_norm_left");
        let mut reference = CpuBackend::with_f32_weights();
        b.wait_kernels().unwrap();
        let _kv = b.alloc_kv(&tiny_kv()).unwrap();
        let eps = 1e-5;
        for (t, h, k) in [
            (GgmlType::Q4K, 4096, 4096),
            (GgmlType::Q6K, 4096, 14336),
            (GgmlType::Q8_0, 512, 1024),
            (GgmlType::Q4_0, 1024, 512),
        ] {
            let (f, kv) = (3 * h / 2, h / 4);
            let wo = raw(&mut rng, t, h, k);
            let gate_up =
                HostTensor::concat_rows(vec![raw(&mut rng, t, f, h), raw(&mut rng, t, f, h)])
                    .unwrap();
            // A Q4_K_M qkv (one mixed launch) and a qkv of the producer's type (plain).
            let qkv_mix = HostTensor::concat_rows(vec![
                raw(&mut rng, GgmlType::Q4K, h, h),
                raw(&mut rng, GgmlType::Q4K, kv, h),
                raw(&mut rng, GgmlType::Q6K, kv, h),
            ])
            .unwrap();
            let qkv = raw(&mut rng, t, h + 2 * kv, h);
            let ws = [wo, gate_up, qkv_mix, qkv];
            let bw = ws.clone().map(|w| b.upload_weight(w).unwrap());
            let rw = ws.map(|w| reference.upload_weight(w).unwrap());
            let norm = b.quantize(&random(&mut rng, h, 1.0));
            let (bn, rn) = (
                weight(&mut b, vec![h], &norm),
                weight(&mut reference, vec![h], &norm),
            );
            // Consumers: the gate/up SiLU, the mixed qkv, the plain qkv; then none (a download
            // settles the norm) and another op (a bf16 RMSNorm of the residual).
            for consumer in 0..5 {
                let what = format!("{t} {h}x{k} consumer {consumer}");
                let x = b.quantize(&random(&mut rng, k, 1.0));
                let r0 = b.quantize(&random(&mut rng, h, 1.0));
                let bx = tensor(&mut b, 1, k, &x);
                let [mut bres, mut bres2] = [0, 1].map(|_| tensor(&mut b, 1, h, &r0));
                let [mut bd, mut bd2] = [0, 1].map(|_| poisoned(&mut b, 1, h));
                let [mut bout, mut bout2] = [0, 1].map(|_| poisoned(&mut b, 2, h));
                let cols = [f, h + 2 * kv, h + 2 * kv, h, h][consumer];
                let mut by = poisoned(&mut b, 2, cols);
                let mut bgu = poisoned(&mut b, 1, 2 * f);
                // (The last round's two ops ran in its timed step: their timings go first.)
                b.take_kernel_timings().unwrap();
                b.fuse_across_ops(true).unwrap();
                let fused = timed_ops(&mut b, |b| {
                    b.matmul_add_rms_norm(&bx, &bw[0], 1, &mut bd, &mut bres, &bn, eps, &mut bout)
                        .unwrap();
                });
                let next = timed_ops(&mut b, |b| match consumer {
                    0 => b
                        .matmul_glu(Activation::Silu, &bout, &bw[1], 1, &mut bgu, &mut by)
                        .unwrap(),
                    1 | 2 => b
                        .matmul(&bout, &bw[consumer + 1], None, 1, &mut by)
                        .unwrap(),
                    3 => {}
                    _ => b.rms_norm(&bres, &bn, eps, 1, &mut by).unwrap(),
                });
                b.fuse_across_ops(false).unwrap();
                // (x is a written tensor: `quantize_x` makes its 8-bit rows.)
                let want: &[&str] = if on {
                    &["quantize_x", "matmul_add_rms_norm"]
                } else {
                    &["quantize_x", "matmul", "add_rms_norm"]
                };
                assert_launches(&fused, want, &format!("{what}: producer"));
                let want_next: &[&str] = match consumer {
                    0 => &["matmul_silu_mul"],
                    1 | 2 => &["matmul"],
                    3 => &[],
                    // The settling rms_norm, then the op's own.
                    _ => &["rms_norm"],
                };
                assert_launches(&next, want_next, &format!("{what}: consumer"));
                let (res, out) = (b.to_host(&bres, 1).unwrap(), b.to_host(&bout, 2).unwrap());
                // The backend's own two ops (nothing left pending outside a step).
                b.matmul(&bx, &bw[0], None, 1, &mut bd2).unwrap();
                b.add_rms_norm(&bd2, &mut bres2, &bn, eps, 1, &mut bout2)
                    .unwrap();
                let (res2, out2) = (b.to_host(&bres2, 1).unwrap(), b.to_host(&bout2, 2).unwrap());
                assert!(
                    res.iter()
                        .zip(&res2)
                        .all(|(a, c)| a.to_bits() == c.to_bits()),
                    "{what}: the residual differs from matmul + add_rms_norm's"
                );
                assert_rows_only(&format!("{what}: out"), &out, &out2[..h], 4e-3);
                // The reference: the CPU's matmul, add_rms_norm and consumer.
                let rx = tensor(&mut reference, 1, k, &x);
                let mut rres = tensor(&mut reference, 1, h, &r0);
                let mut rd = reference.alloc(1, h).unwrap();
                let mut rout = reference.alloc(1, h).unwrap();
                reference
                    .matmul_add_rms_norm(&rx, &rw[0], 1, &mut rd, &mut rres, &rn, eps, &mut rout)
                    .unwrap();
                let want_out = reference.to_host(&rout, 1).unwrap();
                check_rows(&b, &format!("{what}: out (cpu)"), 1, &out, &want_out);
                if consumer == 3 {
                    continue;
                }
                let mut ry = reference.alloc(1, cols).unwrap();
                let mut rgu = reference.alloc(1, 2 * f).unwrap();
                match consumer {
                    0 => reference
                        .matmul_glu(Activation::Silu, &rout, &rw[1], 1, &mut rgu, &mut ry)
                        .unwrap(),
                    1 | 2 => reference
                        .matmul(&rout, &rw[consumer + 1], None, 1, &mut ry)
                        .unwrap(),
                    _ => reference.rms_norm(&rres, &rn, eps, 1, &mut ry).unwrap(),
                }
                let got = b.to_host(&by, 2).unwrap();
                let want = reference.to_host(&ry, 1).unwrap();
                check_rows(&b, &format!("{what}: consumer output"), 1, &got, &want);
            }
        }
    }
}

/// Every op of `want` was launched, and nothing else.
#[cfg(feature = "cuda")]
fn assert_launches(ops: &[&str], want: &[&str], what: &str) {
    for op in want {
        assert!(ops.contains(op), "{what}: {op} in {ops:?}");
    }
    assert!(ops.iter().all(|o| want.contains(o)), "{what}: {ops:?}");
}

/// A one-layer cache, for tests that prepare steps only to time their launches.
#[cfg(feature = "cuda")]
fn tiny_kv() -> kiln::backend::KvShape {
    kiln::backend::KvShape {
        num_layers: 1,
        num_blocks: 4,
        block_size: 16,
        n_kv_heads: 1,
        head_dim: 64,
    }
}

/// The ops of the launches `f` makes, timed (a step is prepared first: `prepare` decides
/// whether a step's launches are timed; the backend holds a cache).
#[cfg(feature = "cuda")]
fn timed_ops(
    b: &mut kiln::backend::cuda::CudaBackend,
    f: impl FnOnce(&mut kiln::backend::cuda::CudaBackend),
) -> Vec<&'static str> {
    b.set_timing_period(Some(1));
    let _ = b.prepare(&plan(&[(1, 2, vec![0])], 16, |_| 0)).unwrap();
    f(b);
    let ops = b
        .take_kernel_timings()
        .unwrap()
        .iter()
        .map(|t| t.kernel)
        .collect();
    b.set_timing_period(None);
    ops
}

/// The split-K merge of decode attention also leaves its output as 8-bit rows for the output
/// matmul (bf16, quantized weights loaded, every row split), so that matmul launches no
/// `quantize_x`; it gives what the same matmul gives on that output quantized by
/// `quantize_x` (after a write, which drops the merge's rows), for 1 and 3 decode rows.
#[cfg(feature = "cuda")]
#[test]
fn attention_merge_quantizes_the_output_rows() {
    use kiln::backend::AttnShape;
    // Both settings of the switch, each on a backend of its own.
    for on in [true, false] {
        let tuning = kiln::backend::GpuTuning {
            attn_fuse: on,
            ..env_tuning()
        };
        let Some(mut b) = cuda_tuned(kiln::backend::DType::Bf16, tuning) else {
            return;
        };
        let mut rng = rng("attention_merge_quantizes");
        let shape = AttnShape::new(32, 8, 128);
        let (qd, n_out, ctx) = (shape.q_dim(), 1024, 700u32);
        let w = b
            .upload_weight(raw(&mut rng, GgmlType::Q4K, n_out, qd))
            .unwrap();
        for batch in [1usize, 3] {
            let bps = (ctx + 1).div_ceil(16);
            let kvs = kiln::backend::KvShape {
                num_layers: 1,
                num_blocks: batch * bps as usize,
                block_size: 16,
                n_kv_heads: 8,
                head_dim: 128,
            };
            let mut kv = b.alloc_kv(&kvs).unwrap();
            let tables: Vec<Vec<u32>> = (0..batch as u32)
                .map(|i| (i * bps..(i + 1) * bps).collect())
                .collect();
            // The context's k and v (a prefill's), then one decode row per sequence.
            let seqs =
                |q: u32, c: u32| tables.iter().map(|t| (q, c, t.clone())).collect::<Vec<_>>();
            let (pre, dec) = (
                plan(&seqs(ctx, ctx), 16, |_| 0),
                plan(&seqs(1, ctx + 1), 16, |_| 0),
            );
            let n_pre = batch * ctx as usize;
            let ctx_qkv = random(&mut rng, n_pre * shape.qkv_dim(), 1.0);
            let ctx_qkv = tensor(&mut b, n_pre, shape.qkv_dim(), &ctx_qkv);
            let pb = b.prepare(&pre).unwrap();
            b.write_kv(&mut kv, 0, &ctx_qkv, &pb, &shape).unwrap();
            let q = random(&mut rng, batch * shape.qkv_dim(), 1.0);
            let q = tensor(&mut b, batch, shape.qkv_dim(), &q);
            // Every launch of the decode step timed (the ops show which kernels ran).
            b.set_timing_period(Some(1));
            let db = b.prepare(&dec).unwrap();
            b.write_kv(&mut kv, 0, &q, &db, &shape).unwrap();
            let mut out = poisoned(&mut b, batch, qd);
            let [mut y1, mut y2] = [0, 0].map(|_| poisoned(&mut b, batch, n_out));
            b.attention(&q, &kv, 0, &db, &shape, None, &mut out)
                .unwrap();
            b.matmul(&out, &w, None, batch, &mut y1).unwrap();
            let fused: Vec<_> = b.take_kernel_timings().unwrap();
            b.write(&mut y2, &vec![f32::NAN; batch * n_out]);
            b.matmul(&out, &w, None, batch, &mut y2).unwrap();
            let plain: Vec<_> = b.take_kernel_timings().unwrap();
            b.set_timing_period(None);
            let ops = |t: &[kiln::backend::gpu::KernelTiming]| {
                t.iter().map(|k| k.kernel).collect::<Vec<_>>()
            };
            let (fused, plain) = (ops(&fused), ops(&plain));
            // The merge runs inside the decode attention (no attn_combine launch) unless
            // `attn_fuse` is off.
            let folded = on;
            assert_eq!(
                fused.contains(&"attn_combine"),
                !folded,
                "batch {batch}: rows split: {fused:?}"
            );
            assert!(!fused.contains(&"quantize_x"), "batch {batch}: {fused:?}");
            assert!(plain.contains(&"quantize_x"), "batch {batch}: {plain:?}");
            let (g1, g2) = (
                b.to_host(&y1, batch).unwrap(),
                b.to_host(&y2, batch).unwrap(),
            );
            assert_close(
                &format!("batch {batch}: the merge's 8-bit rows against quantize_x's"),
                &g1,
                &g2,
                1e-5,
            );
        }
    }
}

/// The 8-bit tiles of batches (`qmma8_*`, 9-256 rows in bf16 on NVIDIA sm_80+: Q8_0 by
/// default, every type with `KILN_QMMA8=all`; the bf16 tiles elsewhere, for the other types
/// and with `KILN_QMMA8=0`): every type at each row tile and across them
/// (15, 16, 31, 32, 48, 63, 64; 100, 128, 200, 256 in several row blocks), output columns
/// that end inside a 64-column block, several k-tiles per split, a Q4_K+Q4_K+Q6_K stack of
/// ragged parts (one mixed launch), and a k that is not a multiple of the 128-column tile
/// (Q8_0 and Q4_0 at k 416: the dequantized GEMM instead).
fn quant_i8_tiles<B: TestBackend>(b: &mut B) {
    let mut rng = rng("quant_i8_tiles");
    let rows: &[usize] = if gpu(b) {
        &[9, 15, 16, 31, 32, 48, 63, 64, 100, 128, 200, 256]
    } else {
        &[9, 33, 100]
    };
    let mut cases: Vec<(GgmlType, usize, usize)> = TYPES.iter().map(|&t| (t, 72, 768)).collect();
    cases.extend([(GgmlType::Q8_0, 40, 416), (GgmlType::Q4_0, 40, 416)]);
    if gpu(b) {
        cases.extend(TYPES.iter().map(|&t| (t, 200, 2816)));
        // The 64-row tile's blocks of 128 columns: exactly one, and one plus 8 columns.
        cases.extend([(GgmlType::Q4K, 128, 512), (GgmlType::Q6K, 136, 512)]);
    }
    for (ty, m, k) in cases {
        let w = raw(&mut rng, ty, m, k);
        check_matmul(b, &mut rng, w, m == 200, rows, &format!("{ty} tiles"));
    }
    let parts = vec![
        raw(&mut rng, GgmlType::Q4K, 72, 768),
        raw(&mut rng, GgmlType::Q4K, 40, 768),
        raw(&mut rng, GgmlType::Q6K, 24, 768),
    ];
    let w = HostTensor::concat_rows(parts).unwrap();
    check_matmul(b, &mut rng, w, true, rows, "Q4_K+Q6_K stack tiles");
    if gpu(b) {
        // Enough columns for the 64-row tile's wide blocks (128 columns, one per two SMs of
        // an H100 or smaller), ending inside a block; a Q4_K pair with a Q6_K third in wide
        // blocks too (one mixed launch).
        let w = raw(&mut rng, GgmlType::Q4K, 17_480, 256);
        check_matmul(b, &mut rng, w, true, &[33, 64], "Q4_K wide tiles");
        let parts = vec![
            raw(&mut rng, GgmlType::Q4K, 8_192, 256),
            raw(&mut rng, GgmlType::Q4K, 8_200, 256),
            raw(&mut rng, GgmlType::Q6K, 1_080, 256),
        ];
        let w = HostTensor::concat_rows(parts).unwrap();
        check_matmul(b, &mut rng, w, false, &[64], "Q4_K+Q6_K stack wide tiles");
        // A mixed launch of 80 narrow 64-row blocks over 10 k-tiles: split into ranges of 3
        // (one wave of 3 resident blocks per SM on 100-150 SMs), so ranges start inside a
        // super-block and the last one is short.
        let parts = vec![
            raw(&mut rng, GgmlType::Q4K, 4_096, 1_280),
            raw(&mut rng, GgmlType::Q6K, 1_024, 1_280),
        ];
        let w = HostTensor::concat_rows(parts).unwrap();
        check_matmul(
            b,
            &mut rng,
            w,
            true,
            &[64],
            "Q4_K+Q6_K stack odd split tiles",
        );
    }
}
crate::parity_test!(quantized_matmul_i8_tiles, quant_i8_tiles);

/// The batches of a Q4_K_M model right after start-up, while its tiled matmuls and its 8-bit
/// decode matmuls of 2, 4 and 8 rows still compile (they start once the units a first request
/// runs are ready: `Class::Later` in kernels.rs): meanwhile they dequantize for the BLAS. A
/// backend opened for a Q4_K_M file and used before `alloc_kv` has not started those
/// compiles, so every step of 2-256 rows here takes that path; against the f32 CPU reference
/// at the tiles' and the decode buckets' row counts (a mixed qkv with a Q6_K v part, bias;
/// a Q6_K down; a Q4_K gate/up SiLU).
#[cfg(feature = "cuda")]
#[test]
fn quant_batches_before_their_tiled_kernels_compiled() {
    use kiln::backend::cuda::{CudaOptions, DType};
    let Some(mut b) = cuda_opened(CudaOptions {
        dtype: DType::Bf16,
        needs: kiln::backend::ModelNeeds {
            moe: false,
            weight_types: Some(vec![GgmlType::Q4K, GgmlType::Q6K]),
            head_dims: Some(vec![128]),
            ..Default::default()
        },
        ..gpu_options()
    }) else {
        return;
    };
    let mut rng = rng("quant_batches_before_tiles");
    let k = 1024;
    let qkv = HostTensor::concat_rows(vec![
        raw(&mut rng, GgmlType::Q4K, 512, k),
        raw(&mut rng, GgmlType::Q4K, 128, k),
        raw(&mut rng, GgmlType::Q6K, 128, k),
    ])
    .unwrap();
    let rows = [2, 3, 4, 8, 9, 16, 33, 64, 256];
    check_matmul(
        &mut b,
        &mut rng,
        qkv,
        true,
        &rows,
        "Q4_K_M qkv, tiles compiling",
    );
    let down = raw(&mut rng, GgmlType::Q6K, 256, k);
    check_matmul(
        &mut b,
        &mut rng,
        down,
        false,
        &rows,
        "Q6_K, tiles compiling",
    );
    let (f, mut reference) = (256, CpuBackend::with_f32_weights());
    let gate_up = HostTensor::concat_rows(vec![
        raw(&mut rng, GgmlType::Q4K, f, k),
        raw(&mut rng, GgmlType::Q4K, f, k),
    ])
    .unwrap();
    let bw = b.upload_weight(gate_up.clone()).expect("upload");
    let rw = reference.upload_weight(gate_up).unwrap();
    for n in [2, 3, 8, 16] {
        let what = format!("{} Q4_K gate/up SiLU, compiling {n}x{k}x{f}", b.label());
        check_glu(
            &mut b,
            &mut reference,
            &mut rng,
            (&bw, &rw),
            (n, k, f),
            &what,
        );
    }
}
