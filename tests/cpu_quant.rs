//! The CPU backend on weights kept in their file's type: each quantized matmul against the
//! f32 matmul of the dequantized weights (random blocks, the shapes of a 1B model), the
//! portable kernels against the vectorized ones, and greedy generation on the quantized
//! fixtures against the same files dequantized to f32.

use std::path::PathBuf;

use kiln::backend::cpu::qmatmul::{self, QScratch};
use kiln::backend::cpu::{CpuBackend, Kernels, ops};
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

const TYPES: [GgmlType; 7] = [
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
    GgmlType::F16,
    GgmlType::BF16,
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
