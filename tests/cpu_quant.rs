//! The CPU backend on weights kept in their file's type: each quantized matmul against the
//! f32 matmul of the dequantized weights (random blocks, the shapes of a 1B model), the
//! portable kernels against the vectorized ones, and greedy generation on the quantized
//! fixtures against the same files dequantized to f32.

use std::path::PathBuf;

use kiln::backend::cpu::qmatmul::{self, QScratch};
use kiln::backend::cpu::{CpuBackend, Kernels, ops, qdot};
use kiln::backend::quant::{self, GgmlType};
use kiln::backend::{Backend, HostTensor};
use kiln::generate::{GenerateOptions, SingleGenerator};
use kiln::model::{LoadFormat, ModelFiles};
use kiln::sampling::SamplingParams;

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn byte(&mut self) -> u8 {
        (self.next() >> 56) as u8
    }
    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    fn half(&mut self, lo: f32, hi: f32) -> [u8; 2] {
        let v = lo + (hi - lo) * (self.unit() * 0.5 + 0.5);
        half::f16::from_f32(v).to_le_bytes()
    }
}

/// Random bytes of `rows x cols` elements of `ty`, with scales that keep values near ±1.
fn random_weight(ty: GgmlType, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    let n = rows * cols;
    let mut out = Vec::with_capacity(ty.byte_size(n as u64).unwrap() as usize);
    let bytes = |rng: &mut Rng, out: &mut Vec<u8>, len: usize| {
        out.extend((0..len).map(|_| rng.byte()));
    };
    match ty {
        GgmlType::F16 => (0..n).for_each(|_| out.extend(rng.half(-1.0, 1.0))),
        GgmlType::BF16 => (0..n).for_each(|_| {
            out.extend(half::bf16::from_f32(rng.unit()).to_le_bytes());
        }),
        GgmlType::Q8_0 | GgmlType::Q4_0 => {
            for _ in 0..n / 32 {
                out.extend(rng.half(0.001, 0.02));
                bytes(rng, &mut out, if ty == GgmlType::Q8_0 { 32 } else { 16 });
            }
        }
        GgmlType::Q4K | GgmlType::Q5K => {
            for _ in 0..n / 256 {
                out.extend(rng.half(0.0005, 0.002));
                out.extend(rng.half(0.0005, 0.002));
                bytes(rng, &mut out, if ty == GgmlType::Q4K { 140 } else { 172 });
            }
        }
        GgmlType::Q6K => {
            for _ in 0..n / 256 {
                bytes(rng, &mut out, 208);
                out.extend(rng.half(0.0002, 0.001));
            }
        }
        GgmlType::Mxfp4 => {
            // Units 2^-10..2^-3: values up to 12 * 2^-3.
            for _ in 0..n / 32 {
                out.push(118 + rng.byte() % 8);
                bytes(rng, &mut out, 16);
            }
        }
        other => panic!("no generator for {other}"),
    }
    out
}

fn random_acts(n: usize, rng: &mut Rng) -> Vec<f32> {
    (0..n).map(|_| rng.unit()).collect()
}

/// max |a - b| / max |b|.
fn rel_err(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let diff = a
        .iter()
        .zip(b)
        .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()));
    diff / scale
}

fn quantized(kern: &Kernels, x: &[f32], w: &HostTensor, n: usize) -> Vec<f32> {
    let mut scratch = QScratch::default();
    let mut out = vec![f32::NAN; n * w.rows()];
    qmatmul::matmul(kern, &mut scratch, x, w, n, &mut out).unwrap();
    assert!(out.iter().all(|v| v.is_finite()), "every output written");
    out
}

/// The f32 matmul of the dequantized weight.
fn reference(x: &[f32], w: &HostTensor, n: usize) -> Vec<f32> {
    let (m, k) = (w.rows(), w.cols());
    let wf = w.clone().into_f32().unwrap();
    let mut out = vec![0.0; n * m];
    ops::matmul(x, wf.values().unwrap(), None, n, k, m, &mut out);
    out
}

/// Relative-error limit against the f32 matmul: 8-bit activations (rounding error up to
/// 1/254 of each block's max) for the quantized types, exact widening for f16/bf16.
fn limit(ty: GgmlType) -> f32 {
    match ty {
        GgmlType::F16 | GgmlType::BF16 => 1e-5,
        _ => 1e-2,
    }
}

const TYPES: [GgmlType; 8] = [
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Mxfp4,
];

/// Every type at `(rows n, out m, in k)`: quantized against f32, and every kernel table this
/// CPU runs (AVX2, AVX-512 where present) against the portable one.
fn check_shapes(shapes: &[(usize, usize, usize)]) {
    let tables = Kernels::available();
    let names: Vec<&str> = tables.iter().map(|k| k.name).collect();
    eprintln!("kernel tables on this CPU: {names:?}");
    assert_eq!(
        Kernels::detect().name,
        names[names.len() - 1],
        "detect picks the fastest"
    );
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for &(n, m, k) in shapes {
        let x = random_acts(n * k, &mut rng);
        for ty in TYPES {
            if !(k as u64).is_multiple_of(ty.block_size().unwrap()) {
                continue;
            }
            let w = HostTensor::raw(vec![m, k], ty, random_weight(ty, m, k, &mut rng)).unwrap();
            let want = reference(&x, &w, n);
            let portable = quantized(&Kernels::PORTABLE, &x, &w, n);
            let e = rel_err(&portable, &want);
            eprintln!("{ty} n={n} m={m} k={k}: portable rel err {e:.2e}");
            assert!(e < limit(ty), "{ty} [{n}x{k}] x [{m}x{k}]^T: rel err {e}");
            for fast in &tables[1..] {
                // The portable kernels on the same path (kernels or dequantized GEMM).
                let same = Kernels {
                    gemm_min_rows: fast.gemm_min_rows,
                    ..Kernels::PORTABLE
                };
                let portable = quantized(&same, &x, &w, n);
                assert!(
                    rel_err(&portable, &want) < limit(ty),
                    "{ty} n={n}: portable"
                );
                let ev = rel_err(&quantized(fast, &x, &w, n), &portable);
                eprintln!("  {} vs portable {ev:.2e}", fast.name);
                assert!(
                    ev < 1e-5,
                    "{ty} n={n} m={m} k={k}: {} kernels vs portable: rel err {ev}",
                    fast.name
                );
            }
        }
    }
}

#[test]
fn quantized_matmuls_match_dequantized_f32_small_and_batched() {
    // 31 rows: the four-row kernels and the one-row tail; 64 rows: the dequantized-tile GEMM.
    // k = 288: an odd number of 32-blocks (the AVX-512 pair kernels' single-block tail;
    // the 32-block and half types only).
    check_shapes(&[
        (1, 64, 256),
        (7, 96, 512),
        (31, 64, 512),
        (64, 256, 2048),
        (5, 16, 288),
    ]);
}

#[test]
fn quantized_matmuls_match_dequantized_f32_at_1b_shapes() {
    // The 1B model's q/o projections, its gate/up (8192 x 2048) and down (2048 x 8192).
    check_shapes(&[(1, 2048, 2048), (7, 8192, 2048), (1, 2048, 8192)]);
}

#[test]
fn stacked_parts_of_mixed_types_fill_their_own_columns() {
    let mut rng = Rng(7);
    let (n, k) = (3, 512);
    let parts = vec![
        HostTensor::raw(
            vec![40, k],
            GgmlType::Q4K,
            random_weight(GgmlType::Q4K, 40, k, &mut rng),
        )
        .unwrap(),
        HostTensor::raw(
            vec![24, k],
            GgmlType::Q6K,
            random_weight(GgmlType::Q6K, 24, k, &mut rng),
        )
        .unwrap(),
        HostTensor::new(vec![8, k], random_acts(8 * k, &mut rng)),
    ];
    let w = HostTensor::concat_rows(parts).unwrap();
    assert_eq!(w.type_label(), "Q4_K+Q6_K+F32");
    let x = random_acts(n * k, &mut rng);
    let want = reference(&x, &w, n);
    let got = quantized(&Kernels::detect(), &x, &w, n);
    assert!(
        rel_err(&got, &want) < 1e-2,
        "rel err {}",
        rel_err(&got, &want)
    );
}

#[test]
fn unsupported_weight_types_are_refused_at_upload() {
    let q3k = GgmlType::from_id(11);
    let w = HostTensor::raw(vec![1, 256], q3k, vec![0; 110]);
    assert!(
        w.is_err(),
        "Q3_K has no dequantizer, so no raw tensor either"
    );
    let ok = HostTensor::raw(vec![2, 256], GgmlType::Q4K, vec![0; 288]).unwrap();
    let mut cpu = CpuBackend::new();
    assert!(cpu.upload_weight(ok).is_ok());
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/models")
        .join(name)
}

/// Greedy generation with weights kept quantized against the same file dequantized to f32:
/// the same ids up to the first step where the f32 path's top two logits are closer than
/// `tie` (where the activations' 8-bit rounding may pick either), and logits close.
fn check_fixture(name: &str, tie: f32, logits_limit: f32) {
    let files = ModelFiles::open(&fixture(name), LoadFormat::Gguf).unwrap();
    let tok = files.tokenizer.clone().unwrap();
    let prompts = [
        "Once upon a time",
        "The little dog",
        "Lily and Ben went to the park",
    ];
    let mut fast = SingleGenerator::new(CpuBackend::new(), &files, 256, 7, 4).unwrap();
    let mut exact =
        SingleGenerator::new(CpuBackend::with_f32_weights(), &files, 256, 7, 4).unwrap();
    let mut compared = 0;
    for p in prompts {
        let prompt = tok.encode(p, true).unwrap();
        let opts = GenerateOptions {
            max_tokens: 64,
            params: SamplingParams::greedy(),
            stop_ids: vec![],
            chunk: 7,
            block_size: 4,
            record_logits: 64,
        };
        let a = fast.generate(&prompt, &opts, |_| {}).unwrap();
        let b = exact.generate(&prompt, &opts, |_| {}).unwrap();
        let mut worst = 0.0f32;
        for (step, (la, lb)) in a.step_logits.iter().zip(&b.step_logits).enumerate() {
            let mut sorted = lb.clone();
            sorted.sort_by(|x, y| y.total_cmp(x));
            if sorted[0] - sorted[1] < tie {
                break;
            }
            assert_eq!(
                a.token_ids[step], b.token_ids[step],
                "{name} '{p}' step {step}"
            );
            worst = worst.max(rel_err(la, lb));
            compared += 1;
        }
        eprintln!("{name} '{p}': logits rel err {worst:.2e}");
        assert!(worst < logits_limit, "{name} '{p}': logits rel err {worst}");
    }
    assert!(
        compared >= 48,
        "{name}: only {compared} steps before near-ties"
    );
}

#[test]
fn q8_0_fixture_generates_like_its_f32_dequantization() {
    check_fixture("stories260K-Q8_0.gguf", 0.1, 4e-2);
}

#[test]
fn q4_0_fixture_generates_like_its_f32_dequantization() {
    check_fixture("stories260K-Q4_0.gguf", 0.1, 4e-2);
}

#[test]
fn f16_fixture_generates_like_its_f32_dequantization() {
    check_fixture("stories260K-F16.gguf", 1e-3, 1e-4);
}

#[test]
fn q5_k_dequantizes_like_ggml() {
    // One block by hand: d = 1, dmin = 0.5, sub-block 0 has scale 2 / min 1 and sub-block 1
    // scale 3 / min 0; element 0 has nibble 5 and its fifth bit set, element 32 nibble 7.
    let mut b = vec![0u8; 176];
    b[..2].copy_from_slice(&half::f16::from_f32(1.0).to_le_bytes());
    b[2..4].copy_from_slice(&half::f16::from_f32(0.5).to_le_bytes());
    b[4] = 2; // sc0
    b[5] = 3; // sc1
    b[8] = 1; // m0
    b[16] = 0b01; // qh[0]: bit 0 -> element 0 (sub-block 0) gets +16
    b[48] = 0x75; // qs[0]: low nibble 5 (element 0), high nibble 7 (element 32)
    let y = quant::dequantize_to_vec(GgmlType::Q5K, &b, 256).unwrap();
    assert_eq!(y[0], 2.0 * 21.0 - 0.5);
    assert_eq!(y[1], -0.5);
    assert_eq!(y[32], 3.0 * 7.0);
    assert_eq!(y[64], 0.0);
}

#[test]
fn q5_k_dequantizes_like_gguf_py() {
    // Random blocks and gguf-py's dequantization (scripts/gen_quant_golden.py).
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/quant");
    let raw = std::fs::read(dir.join("q5_k.raw")).unwrap();
    let want: Vec<f32> = std::fs::read(dir.join("q5_k.f32"))
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let got = quant::dequantize_to_vec(GgmlType::Q5K, &raw, want.len() as u64).unwrap();
    let mismatch = got
        .iter()
        .zip(&want)
        .position(|(a, b)| a.to_bits() != b.to_bits());
    assert_eq!(mismatch, None, "first mismatch");
}

fn quant_golden(name: &str) -> Vec<u8> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/quant");
    std::fs::read(dir.join(name)).unwrap()
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[test]
fn mxfp4_type_and_scales_are_ggml_s() {
    let ty = GgmlType::from_id(39);
    assert_eq!(ty, GgmlType::Mxfp4);
    assert_eq!(
        (ty.id(), ty.name(), ty.to_string()),
        (39, "MXFP4", "MXFP4".into())
    );
    assert_eq!((ty.block_size(), ty.block_bytes()), (Some(32), Some(17)));
    assert!(ty.is_supported());
    assert_eq!(ty.byte_size(2880 * 64), Ok(2880 * 2 * 17));
    // 2^(e - 128) for every exponent byte, 255 included (ggml: no NaN).
    for e in 0..=255u8 {
        let want = (2.0f64).powi(i32::from(e) - 128) as f32;
        assert_eq!(
            quant::e8m0_to_f32_half(e).to_bits(),
            want.to_bits(),
            "e = {e}"
        );
    }
    assert_eq!(
        quant::MXFP4_VALUES.map(|v| f32::from(v) * 0.5),
        [
            0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0
        ],
        "the E2M1 values"
    );
    // A block by hand: e = 127 (unit 1/2), nibbles 0x7F in byte 0 (element 0: -12 -> -6,
    // element 16: 12 -> 6), 0x19 in byte 1 (element 1: -1 -> -0.5, element 17: 1 -> 0.5).
    let mut b = vec![0u8; 17];
    b[0] = 127;
    b[1] = 0x7F;
    b[2] = 0x19;
    b[3] = 0x88; // -0 both: +0.0
    let y = quant::dequantize_to_vec(GgmlType::Mxfp4, &b, 32).unwrap();
    assert_eq!((y[0], y[16], y[1], y[17]), (-6.0, 6.0, -0.5, 0.5));
    assert_eq!((y[2].to_bits(), y[18].to_bits()), (0, 0));
    let t = HostTensor::raw(vec![2, 32], GgmlType::Mxfp4, [b.clone(), b].concat()).unwrap();
    assert_eq!(t.weight_type(), GgmlType::Mxfp4);
    assert!(
        CpuBackend::new().upload_weight(t).is_ok(),
        "the CPU keeps MXFP4 weights"
    );
}

#[test]
fn mxfp4_dequantizes_like_gguf_py() {
    // Every exponent byte once (infinities of 253..255 included), random nibbles; gguf-py's
    // dequantization (scripts/gen_quant_golden.py), bit for bit.
    let raw = quant_golden("mxfp4.raw");
    let want = f32s(&quant_golden("mxfp4.f32"));
    assert_eq!((raw.len(), want.len()), (256 * 17, 256 * 32));
    let exps: std::collections::BTreeSet<u8> = raw.chunks_exact(17).map(|b| b[0]).collect();
    assert_eq!(exps.len(), 256, "every exponent byte");
    assert!(want.iter().any(|v| v.is_infinite()) && want.iter().any(|v| v.to_bits() == 0));
    let got = quant::dequantize_to_vec(GgmlType::Mxfp4, &raw, want.len() as u64).unwrap();
    let mismatch = got
        .iter()
        .zip(&want)
        .position(|(a, b)| a.to_bits() != b.to_bits());
    assert_eq!(mismatch, None, "first mismatch");
    // Past the parallel threshold: the same values.
    let big = quant::dequantize_to_vec(GgmlType::Mxfp4, &raw.repeat(16), 16 * 8192).unwrap();
    assert!(
        big.iter()
            .zip(want.repeat(16))
            .all(|(a, b)| a.to_bits() == b.to_bits())
    );
}

#[test]
fn mxfp4_dots_match_gguf_py() {
    // An [8, 512] weight gguf-py quantized (rows scaled 2^-20..2^20, exponents 0 and 255 in
    // row 7), [3, 512] activations, and gguf-py's float64 dots: every kernel table, on the
    // kernel path (one row, four rows) and the dequantized-tile GEMM path.
    let (m, k, n) = (8, 512, 3);
    let w = HostTensor::raw(vec![m, k], GgmlType::Mxfp4, quant_golden("mxfp4_dot_w.raw")).unwrap();
    let x = f32s(&quant_golden("mxfp4_dot_x.f32"));
    let want = f32s(&quant_golden("mxfp4_dot_y.f32"));
    assert_eq!((x.len(), want.len()), (n * k, n * m));
    // Per dot: the bound of the activations' 8-bit rounding (each value within half its
    // block's step amax / 127) from the dequantized weight (bit-exact to gguf-py, checked
    // above), and the magnitude sum |w x| (for the f32 summation error).
    let wf = w.clone().into_f32().unwrap();
    let wf = wf.values().unwrap();
    let bounds: Vec<(f32, f32)> = (0..n * m)
        .map(|o| {
            let (r, j) = (o / m, o % m);
            let (xr, wr) = (&x[r * k..][..k], &wf[j * k..][..k]);
            let (mut b, mut mag) = (0.0f64, 0.0f64);
            for (xb, wb) in xr.chunks_exact(32).zip(wr.chunks_exact(32)) {
                let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                let wsum: f64 = wb.iter().map(|v| f64::from(v.abs())).sum();
                b += f64::from(amax) / 254.0 * wsum;
                mag += xb
                    .iter()
                    .zip(wb)
                    .map(|(a, b)| f64::from((a * b).abs()))
                    .sum::<f64>();
            }
            (b as f32, mag as f32)
        })
        .collect();
    // The worst error as a fraction of its limit: the rounding bound plus 1e-5 of the
    // magnitude, or (`exact`: the GEMM of the dequantized weight, f32 activations) 1e-5 of
    // the magnitude alone.
    let worst = |got: &[f32], exact: bool| -> f32 {
        got.iter()
            .zip(&want)
            .zip(&bounds)
            .map(|((g, w), &(b, mag))| {
                let lim = if exact {
                    1e-5 * mag
                } else {
                    1.001 * b + 1e-5 * mag
                };
                (g - w).abs() / lim
            })
            .fold(0.0, f32::max)
    };
    assert!(
        worst(&reference(&x, &w, n), true) <= 1.0,
        "f32 matmul of the dequantized weight"
    );
    let tables = Kernels::available();
    for kern in &tables {
        for gemm_min_rows in [usize::MAX, 1] {
            let kern = Kernels {
                gemm_min_rows,
                ..*kern
            };
            let e = worst(&quantized(&kern, &x, &w, n), gemm_min_rows == 1);
            eprintln!(
                "mxfp4 golden dots, {} gemm_min_rows {gemm_min_rows}: {e:.3} of the limit",
                kern.name
            );
            assert!(
                e <= 1.0,
                "{} (gemm from {gemm_min_rows} rows): {e} of the limit",
                kern.name
            );
        }
        // The kernels themselves, one row and four (the fourth activation row repeats the first).
        let mut a = vec![qdot::BlockQ8_0::ZERO; n * k / 32];
        qdot::quantize_q8_0(&x, &mut a);
        let act = |r: usize| &a[r * k / 32..(r + 1) * k / 32];
        let bytes = quant_golden("mxfp4_dot_w.raw");
        for (j, row) in bytes.chunks_exact(17 * k / 32).enumerate() {
            let four = (kern.mxfp4_x4)(row, [act(0), act(1), act(2), act(0)]);
            for (r, &four_r) in four.iter().enumerate().take(n) {
                let one = (kern.mxfp4)(row, act(r));
                let p = (Kernels::PORTABLE.mxfp4)(row, act(r));
                let tol = 1e-5 * mxfp4_magnitude(row, act(r));
                assert!(
                    (one - p).abs() <= tol,
                    "{} row {j} act {r}: {one} vs {p}",
                    kern.name
                );
                assert!(
                    (four_r - p).abs() <= tol,
                    "{} x4 row {j} act {r}",
                    kern.name
                );
            }
            assert_eq!(
                four[3].to_bits(),
                four[0].to_bits(),
                "{} x4 rows",
                kern.name
            );
        }
    }
}

/// Random MXFP4 rows of `blocks` blocks and matching Q8_0 activation rows, row `i` with
/// every block at exponent `exps(i)` and activation scales that keep `2^(e-128) * d` normal
/// (so every exponent byte, 0, 254 and 255 included, gives finite dots).
fn mxfp4_rows(
    rng: &mut Rng,
    rows: usize,
    blocks: usize,
    exps: impl Fn(usize, usize) -> u8,
) -> (Vec<Vec<u8>>, Vec<Vec<qdot::BlockQ8_0>>) {
    let mut ws = vec![];
    let mut acts = vec![];
    for i in 0..rows {
        let mut w = vec![];
        let mut a = vec![];
        for b in 0..blocks {
            let e = exps(i, b);
            w.push(e);
            w.extend((0..16).map(|_| rng.byte()));
            let d = (0.5 + 0.5 * rng.unit().abs())
                * (2.0f32).powi((128 - i32::from(e)).clamp(-126, 127));
            let mut qs = [0i8; 32];
            qs.iter_mut()
                .for_each(|q| *q = (i16::from(rng.byte() % 255) - 127) as i8);
            a.push(qdot::BlockQ8_0 { d, qs });
        }
        ws.push(w);
        acts.push(a);
    }
    (ws, acts)
}

/// The size of a dot without cancellation: the portable dot of the weights' and the
/// activations' absolute values (E2M1 sign bits cleared, |qs|).
fn mxfp4_magnitude(w: &[u8], a: &[qdot::BlockQ8_0]) -> f32 {
    let w: Vec<u8> = w
        .chunks_exact(17)
        .flat_map(|b| std::iter::once(b[0]).chain(b[1..].iter().map(|q| q & 0x77)))
        .collect();
    let a: Vec<qdot::BlockQ8_0> = a
        .iter()
        .map(|b| qdot::BlockQ8_0 {
            d: b.d.abs(),
            qs: b.qs.map(|q| q.saturating_abs()),
        })
        .collect();
    (Kernels::PORTABLE.mxfp4)(&w, &a)
}

#[test]
fn mxfp4_kernel_tables_agree_with_portable_at_every_exponent() {
    let tables = Kernels::available();
    let mut rng = Rng(0x39);
    // Rows 0..256: one exponent byte each (all 16 blocks); then mixed exponents 96..160 in
    // rows of 1, 3 (the AVX-512 pair kernels' tail) and 16 blocks.
    let (mut ws, mut acts) = mxfp4_rows(&mut rng, 256, 16, |i, _| i as u8);
    for blocks in [1, 3, 16] {
        let (w, a) = mxfp4_rows(&mut rng, 64, blocks, |i, b| {
            96 + ((i * 7 + b * 13) % 64) as u8
        });
        ws.extend(w);
        acts.extend(a);
    }
    let mut nonzero = 0;
    for (i, (w, a)) in ws.iter().zip(&acts).enumerate() {
        // Four activation rows: this row's and two neighbours' of its group of 4 (the
        // groups of rows are multiples of 4 long: same length, exponents within 3).
        let pick = |d: usize| &acts[i ^ d][..];
        let four_acts = [&a[..], pick(1), pick(2), &a[..]];
        let want: Vec<(f32, f32)> = four_acts
            .iter()
            .map(|x| ((Kernels::PORTABLE.mxfp4)(w, x), mxfp4_magnitude(w, x)))
            .collect();
        assert!(
            want.iter().all(|(p, m)| p.is_finite() && m.is_finite()),
            "row {i}"
        );
        nonzero += usize::from(want[0].0 != 0.0);
        for kern in &tables[1..] {
            let one = (kern.mxfp4)(w, a);
            let (p, mag) = want[0];
            assert!(
                (one - p).abs() <= 1e-5 * mag,
                "{} row {i}: {one} vs {p}",
                kern.name
            );
            let four = (kern.mxfp4_x4)(w, four_acts);
            for (r, (&got, &(p, mag))) in four.iter().zip(&want).enumerate() {
                assert!(
                    (got - p).abs() <= 1e-5 * mag,
                    "{} x4 row {i} act {r}: {got} vs {p}",
                    kern.name
                );
            }
        }
    }
    assert!(
        nonzero > ws.len() * 9 / 10,
        "the rows' dots are not all zero"
    );
    let names: Vec<&str> = tables.iter().map(|k| k.name).collect();
    eprintln!("mxfp4 kernel tables {names:?} agree on {} rows", ws.len());
}

/// Micro-benchmark (ignored; run with `cargo test --release --test cpu_quant -- --ignored
/// --nocapture bench`): the machine's memory bandwidth (a two-thread read loop and a copy
/// loop over 512 MiB) and one decode row (`n = 1`) through 8192x2048 weights of each type
/// with each kernel table, in GB/s of weight bytes: cycling over ten weights (too large for
/// the caches: streaming from memory) and over one (in cache: the kernel's own speed). The
/// tables take turns within each repeat and the best of 7 repeats is reported, because the
/// machine is shared. Numbers only; nothing is asserted.
#[test]
#[ignore]
fn bench_decode_matmul_bandwidth() {
    use std::time::Instant;
    let best = |v: &[f64]| v.iter().fold(0.0f64, |m, &x| m.max(x));
    let src: Vec<u64> = (0..1usize << 26).map(|i| i as u64).collect();
    let mut dst = vec![0u64; src.len()];
    let bytes = (src.len() * 8) as f64;
    let (mut read, mut copy) = (vec![], vec![]);
    for _ in 0..7 {
        let t = Instant::now();
        let halves = src.split_at(src.len() / 2);
        let (a, b) = rayon::join(
            || halves.0.iter().fold(0u64, |s, v| s.wrapping_add(*v)),
            || halves.1.iter().fold(0u64, |s, v| s.wrapping_add(*v)),
        );
        std::hint::black_box(a ^ b);
        read.push(bytes / t.elapsed().as_secs_f64() / 1e9);
        let t = Instant::now();
        let (d0, d1) = dst.split_at_mut(src.len() / 2);
        let (s0, s1) = src.split_at(src.len() / 2);
        rayon::join(|| d0.copy_from_slice(s0), || d1.copy_from_slice(s1));
        std::hint::black_box(&dst);
        copy.push(2.0 * bytes / t.elapsed().as_secs_f64() / 1e9);
    }
    eprintln!(
        "memory, 2 threads, best of 7: read {:.1} GB/s, copy (read + write) {:.1} GB/s",
        best(&read),
        best(&copy)
    );
    drop((src, dst));
    let (m, k) = (8192, 2048);
    let mut rng = Rng(11);
    let x = random_acts(k, &mut rng);
    let tables = Kernels::available();
    for ty in TYPES {
        let ws: Vec<HostTensor> = (0..10)
            .map(|_| HostTensor::raw(vec![m, k], ty, random_weight(ty, m, k, &mut rng)).unwrap())
            .collect();
        let wbytes = ty.byte_size((m * k) as u64).unwrap() as f64;
        let mut speeds = vec![[vec![], vec![]]; tables.len()];
        let mut scratch = QScratch::default();
        let mut out = vec![0.0; m];
        for _ in 0..7 {
            for (kern, speed) in tables.iter().zip(&mut speeds) {
                for (set, sp) in [&ws[..], &ws[..1]].iter().zip(speed.iter_mut()) {
                    let reps = 10 / set.len();
                    let t = Instant::now();
                    for _ in 0..reps {
                        for w in *set {
                            qmatmul::matmul(kern, &mut scratch, &x, w, 1, &mut out).unwrap();
                        }
                    }
                    sp.push(10.0 * wbytes / t.elapsed().as_secs_f64() / 1e9);
                }
            }
        }
        for (kern, [stream, cached]) in tables.iter().zip(&speeds) {
            eprintln!(
                "{ty} {m}x{k} n=1 {:>8}: streaming {:5.1} GB/s, in cache {:5.1} GB/s",
                kern.name,
                best(stream),
                best(cached)
            );
        }
    }
}

/// Micro-benchmark (ignored, like the one above): each kernel table's one-row dot product
/// on one thread, over 64 weight rows of 2048 (in the L2 cache) against activations
/// quantized beforehand, in GB/s of weight bytes, best of 500 short runs (the least
/// disturbed by other work on the machine).
#[test]
#[ignore]
fn bench_dot_kernels_in_cache() {
    use kiln::backend::cpu::qdot::{self, BlockQ8_0, BlockQ8K};
    use std::time::Instant;
    let (m, k) = (64, 2048);
    let mut rng = Rng(5);
    let x = random_acts(k, &mut rng);
    let mut a32 = vec![BlockQ8_0::ZERO; k / 32];
    let mut a256 = vec![BlockQ8K::ZERO; k / 256];
    qdot::quantize_q8_0(&x, &mut a32);
    qdot::quantize_q8_k(&x, &mut a256);
    let tables = Kernels::available();
    for ty in TYPES {
        let w = random_weight(ty, m, k, &mut rng);
        let rb = w.len() / m;
        let mut best = vec![0.0f64; tables.len()];
        for _ in 0..500 {
            for (kern, b) in tables.iter().zip(&mut best) {
                let t = Instant::now();
                let mut s = 0.0;
                for row in w.chunks_exact(rb) {
                    s += match ty {
                        GgmlType::Q8_0 => (kern.q8_0)(row, &a32),
                        GgmlType::Q4_0 => (kern.q4_0)(row, &a32),
                        GgmlType::Q4K => (kern.q4_k)(row, &a256),
                        GgmlType::Q5K => (kern.q5_k)(row, &a256),
                        GgmlType::Q6K => (kern.q6_k)(row, &a256),
                        GgmlType::Mxfp4 => (kern.mxfp4)(row, &a32),
                        GgmlType::F16 => (kern.f16)(row, &x),
                        _ => (kern.bf16)(row, &x),
                    };
                }
                std::hint::black_box(s);
                *b = b.max(w.len() as f64 / t.elapsed().as_secs_f64() / 1e9);
            }
        }
        let line: Vec<String> = tables
            .iter()
            .zip(&best)
            .map(|(k, b)| format!("{} {b:5.1}", k.name))
            .collect();
        eprintln!("{ty:>5} one thread, in L2, GB/s: {}", line.join(", "));
    }
}
