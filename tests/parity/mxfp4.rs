//! MXFP4 (ggml type 39: one E8M0 exponent byte and 16 bytes of E2M1 nibbles per 32) on every
//! backend against the f32 matmul of the same blocks dequantized on the CPU
//! (`CpuBackend::with_f32_weights`; the CPU's dequantization is checked bit-exactly against
//! gguf-py's in `tests/cpu_quant.rs`). The blocks are random bytes (every nibble: both zeros,
//! both signs, every magnitude) with exponents spread over rows from 2^-108 to 2^102 (each
//! output column compared after dividing by its row's scale, so every row counts alike), at
//! every path's row counts (1-8 decode, 9-256 tiles or dequantized GEMM, 300 the GEMM) and
//! widths of whole blocks of 32 that are no whole super-blocks of 256 (2880: gpt-oss's width,
//! 1152: also whole k-tiles of the tiled kernels); the fused gate/up SiLU; MoE experts in
//! MXFP4; quantized embedding rows (the dequantization itself) exact over every exponent
//! 0..=255; and on a GPU, an uploaded matrix's device bytes against its file bytes.

use kiln::backend::cpu::CpuBackend;
use kiln::backend::quant::GgmlType;
use kiln::backend::{Activation, Backend, HostTensor, MoeAct, MoeExperts, MoeShape};
use rand::{Rng, RngExt};
use rand_chacha::ChaCha8Rng;

use crate::harness::*;

/// Row counts of every path and the edges between them.
const ROWS: [usize; 12] = [1, 2, 3, 5, 8, 9, 16, 17, 64, 100, 256, 300];

/// Relative error allowed where activations are quantized to 8 bits per 32 (the CPU's
/// quantized matmul, a GPU's bf16 decode rows): as `quant.rs`'s `ACT8_TOL`.
const ACT8_TOL: f64 = 5e-2;

fn gpu<B: TestBackend>(b: &B) -> bool {
    b.label() != "cpu"
}

fn tol<B: TestBackend>(b: &B, n: usize) -> f64 {
    if !gpu(b) || (n <= 256 && b.label().contains("Bf16")) {
        ACT8_TOL
    } else {
        b.tol()
    }
}

/// `rows x cols` MXFP4 blocks: random nibble bytes; row j's exponents `base(j)` plus a
/// random -3..=3 per block (every exponent within 0..=255).
fn blocks(rng: &mut ChaCha8Rng, rows: usize, cols: usize, base: impl Fn(usize) -> i32) -> Vec<u8> {
    let nb = cols / 32;
    let mut bytes = vec![0u8; rows * nb * 17];
    rng.fill_bytes(&mut bytes);
    for (i, blk) in bytes.chunks_exact_mut(17).enumerate() {
        let e = base(i / nb) + rng.random_range(-3..=3);
        blk[0] = e.clamp(0, 255) as u8;
    }
    bytes
}

/// Row j's base exponent: spread over 20..=230 (scales 2^-108 .. 2^102).
fn spread(j: usize) -> i32 {
    20 + ((j * 37) % 211) as i32
}

fn mxfp4(rows: usize, cols: usize, bytes: Vec<u8>) -> HostTensor {
    HostTensor::raw(vec![rows, cols], GgmlType::Mxfp4, bytes).expect("mxfp4 blocks")
}

/// `v` (rows of `m` columns) with column j divided by 2^(base(j) - 128).
fn per_row_scaled(v: &[f32], m: usize, base: impl Fn(usize) -> i32) -> Vec<f32> {
    v.iter()
        .enumerate()
        .map(|(i, &x)| (x as f64 * 2f64.powi(128 - base(i % m))) as f32)
        .collect()
}

/// `x @ w^T (+ bias)` of MXFP4 blocks `bytes` (`m x k`, row exponents `spread`) at each row
/// count, the backend against the f32 reference.
fn check_matmul<B: TestBackend>(
    b: &mut B,
    rng: &mut ChaCha8Rng,
    (m, k): (usize, usize),
    rows: &[usize],
    with_bias: bool,
) {
    let mut reference = CpuBackend::with_f32_weights();
    let w = mxfp4(m, k, blocks(rng, m, k, spread));
    let bw = b.upload_weight(w.clone()).expect("upload");
    let rw = reference.upload_weight(w).expect("upload");
    // A bias of each column's own scale.
    let bias: Vec<f32> = (0..m)
        .map(|j| (rng.random::<f32>() * 2.0 - 1.0) * 2f32.powi(spread(j) - 128 + 4))
        .collect();
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
        let (bias_b, bias_r) = match with_bias {
            true => (Some(&bb), Some(&rb)),
            false => (None, None),
        };
        b.matmul(&bx, &bw, bias_b, n, &mut out).expect("matmul");
        reference.matmul(&rx, &rw, bias_r, n, &mut rout).unwrap();
        let got = b.to_host(&out, n + 1).unwrap();
        let want = reference.to_host(&rout, n).unwrap();
        let what = format!("{} MXFP4 matmul {n}x{k}x{m} bias={with_bias}", b.label());
        assert!(
            got[n * m..].iter().all(|v| v.is_nan()),
            "{what}: wrote past its rows"
        );
        assert_close(
            &what,
            &per_row_scaled(&got[..n * m], m, spread),
            &per_row_scaled(&want, m, spread),
            tol(b, n),
        );
    }
}

fn matmuls<B: TestBackend>(b: &mut B) {
    let mut rng = rng("mxfp4_matmuls");
    b.wait_kernels();
    // 2880: gpt-oss's hidden and expert width (90 blocks, no whole k-tile of 128: batches
    // dequantize for the GEMM); 1152: whole k-tiles (the tiled kernels), 4.5 super-blocks.
    // Odd and partial row blocks: 75 and 200 weight rows.
    check_matmul(b, &mut rng, (75, 2880), &ROWS, true);
    check_matmul(b, &mut rng, (200, 1152), &ROWS, false);
    // The tiles' last k-tile of 1 and 3 blocks of 32 (2880: of 2).
    check_matmul(b, &mut rng, (33, 1184), &[9, 17, 64, 100], false);
    check_matmul(b, &mut rng, (40, 1248), &[9, 17, 64, 100], true);
    if gpu(b) {
        // The gpt-oss expert shape; and a width of many whole decode steps then a partial
        // one (6400 = 200 blocks).
        check_matmul(b, &mut rng, (2880, 2880), &[1, 2, 8, 9, 64, 256], false);
        check_matmul(b, &mut rng, (64, 6400), &[1, 2, 4, 8], false);
        check_matmul(b, &mut rng, (1024, 4096), &[16, 33, 64, 256], true);
    }
}
crate::parity_test!(mxfp4_matmul_every_path, matmuls);

/// The 8-bit tiles (`qmma8_*`, int8 tensor cores on NVIDIA sm_80+: `KILN_QMMA8=all`) on MXFP4
/// batches, whole and partial last k-tiles.
#[cfg(feature = "cuda")]
#[test]
fn mxfp4_matmul_8_bit_tiles() {
    let Some(mut b) = cuda_opened(kiln::backend::cuda::CudaOptions {
        dtype: kiln::backend::DType::Bf16,
        tuning: kiln::backend::GpuTuning {
            qmma8: kiln::backend::tuning::Choice::All,
            ..env_tuning()
        },
        ..gpu_options()
    }) else {
        return;
    };
    let mut rng = rng("mxfp4_matmul_8_bit_tiles");
    b.wait_kernels().expect("every kernel loads");
    for (m, k) in [
        (75, 2880),
        (200, 1152),
        (33, 1184),
        (40, 1248),
        (1024, 4096),
    ] {
        check_matmul(
            &mut b,
            &mut rng,
            (m, k),
            &[9, 16, 17, 33, 64, 100, 256],
            m == 40,
        );
    }
}

/// The fused gate/up SiLU over two MXFP4 parts, exponents near 2^0 (the SiLU mixes scales).
fn glu<B: TestBackend>(b: &mut B) {
    let mut rng = rng("mxfp4_glu");
    let mut reference = CpuBackend::with_f32_weights();
    b.wait_kernels();
    let mut cases = vec![(96, 2880), (64, 1152)];
    if gpu(b) {
        cases.push((1024, 4096));
    }
    for (f, k) in cases {
        let near = |_| 124;
        let parts = vec![
            mxfp4(f, k, blocks(&mut rng, f, k, near)),
            mxfp4(f, k, blocks(&mut rng, f, k, near)),
        ];
        let w = HostTensor::concat_rows(parts).unwrap();
        let bw = b.upload_weight(w.clone()).expect("upload");
        let rw = reference.upload_weight(w).unwrap();
        for n in [1, 2, 5, 8, 9, 16, 33, 64, 100] {
            let x = b.quantize(&random(&mut rng, n * k, 1.0));
            let (bx, rx) = (tensor(b, n, k, &x), tensor(&mut reference, n, k, &x));
            let (mut gu, mut out) = (poisoned(b, n, 2 * f), poisoned(b, n + 1, f));
            let mut rgu = reference.alloc(n, 2 * f).unwrap();
            let mut rout = reference.alloc(n, f).unwrap();
            b.matmul_glu(Activation::Silu, &bx, &bw, n, &mut gu, &mut out)
                .expect("matmul_glu");
            reference
                .matmul_glu(Activation::Silu, &rx, &rw, n, &mut rgu, &mut rout)
                .unwrap();
            let what = format!("{} MXFP4 matmul_silu_mul {n}x{k}x{f}", b.label());
            assert_rows_only(
                &what,
                &b.to_host(&out, n + 1).unwrap(),
                &reference.to_host(&rout, n).unwrap(),
                tol(b, n),
            );
        }
    }
}
crate::parity_test!(mxfp4_matmul_silu_mul, glu);

/// Embedding rows of an MXFP4 table (the GPU's dequantization kernel): row r's blocks all of
/// exponent r, 0..=255 (subnormal scales, and past f32's range: infinities, as the CPU and
/// ggml give), exactly the CPU's values as the backend stores them.
fn embed<B: TestBackend>(b: &mut B) {
    let mut rng = rng("mxfp4_embed");
    let (vocab, h) = (256, 96);
    let mut bytes = vec![0u8; vocab * h / 32 * 17];
    rng.fill_bytes(&mut bytes);
    for (i, blk) in bytes.chunks_exact_mut(17).enumerate() {
        blk[0] = (i / (h / 32)) as u8;
    }
    let table = mxfp4(vocab, h, bytes);
    let want_all = table.clone().into_f32().expect("dequantize");
    let want_all = want_all.values().expect("values").to_vec();
    let tw = b.upload_weight(table).expect("upload");
    let shape = kiln::backend::KvShape {
        num_blocks: 16,
        block_size: 16,
        ..TINY_KV
    };
    b.alloc_kv(&shape).unwrap();
    let tables = block_tables(&mut rng, &[vocab as u32], 16, 16);
    let ids: Vec<u32> = (0..vocab as u32).rev().collect();
    let p = plan(
        &[(vocab as u32, vocab as u32, tables[0].clone())],
        16,
        |i| ids[i],
    );
    let bb = b.prepare(&p).unwrap();
    let mut out = poisoned(b, vocab, h);
    b.embed(&tw, 0, vocab, &bb, &mut out).expect("embed");
    let got = b.to_host(&out, vocab).unwrap();
    for (i, &id) in ids.iter().enumerate() {
        let want = b.quantize(&want_all[id as usize * h..(id as usize + 1) * h]);
        let row = &got[i * h..(i + 1) * h];
        for (c, (g, w)) in row.iter().zip(&want).enumerate() {
            assert!(
                g == w || (g.is_nan() && w.is_nan()),
                "{} MXFP4 embed row {id} (exponent {id}) column {c}: {g} against {w}",
                b.label()
            );
        }
    }
}
crate::parity_test!(mxfp4_embedding_rows_exact_over_every_exponent, embed);

/// MoE experts in MXFP4 (gate, up and down; gpt-oss's experts), exponents near 2^0, against
/// the CPU's f32 experts: one row (the dp4a tiles at one slot, down quantizing in its
/// blocks), a few, and many rows per expert (the tensor-core tiles where the widths are
/// whole k-tiles).
fn moe<B: TestBackend>(b: &mut B) {
    let mut rng = rng("mxfp4_moe");
    let mut reference = CpuBackend::with_f32_weights();
    b.wait_kernels();
    let mut shapes = vec![(4, 2, 96, 160, vec![1, 11])];
    if gpu(b) {
        // gpt-oss's expert widths (2880, top 4), then whole k-tiles.
        shapes.push((8, 4, 2880, 2880, vec![1, 5, 40]));
        shapes.push((8, 2, 256, 512, vec![1, 8, 300]));
    }
    let tol = if gpu(b) { b.tol().max(1e-4) } else { 7e-2 };
    for (ne, top_k, f, h, rows) in shapes {
        let s = MoeShape {
            n_expert: ne,
            top_k,
            expert_ff: f,
            norm_topk: true,
            shared_ff: 0,
            act: MoeAct::Silu,
        };
        let near = |_| 124;
        let host = [
            mxfp4(ne * f, h, blocks(&mut rng, ne * f, h, near)),
            mxfp4(ne * f, h, blocks(&mut rng, ne * f, h, near)),
            mxfp4(ne * h, f, blocks(&mut rng, ne * h, f, near)),
        ];
        let bw: Vec<_> = host
            .iter()
            .map(|w| b.upload_weight(w.clone()).expect("upload"))
            .collect();
        let rw: Vec<_> = host
            .iter()
            .map(|w| reference.upload_weight(w.clone()).unwrap())
            .collect();
        fn experts<W>(w: &[W]) -> MoeExperts<'_, W> {
            MoeExperts {
                gate: &w[0],
                up: &w[1],
                down: &w[2],
                shared: None,
                bias: None,
            }
        }
        for n in rows {
            let x = b.quantize(&random(&mut rng, n * h, 1.0));
            let l = b.quantize(&random(&mut rng, n * ne, 2.0));
            let (bx, bl) = (tensor(b, n, h, &x), tensor(b, n, ne, &l));
            let mut out = poisoned(b, n + 1, h);
            let what = format!("{} MXFP4 moe_ffn experts {ne}x{f}x{h}, {n} rows", b.label());
            b.moe_ffn(&bx, &bl, experts(&bw), &s, n, &mut out)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let (rx, rl) = (
                tensor(&mut reference, n, h, &x),
                tensor(&mut reference, n, ne, &l),
            );
            let mut rout = reference.alloc(n, h).unwrap();
            reference
                .moe_ffn(&rx, &rl, experts(&rw), &s, n, &mut rout)
                .unwrap();
            let want = reference.to_host(&rout, n).unwrap();
            assert_rows_only(&what, &b.to_host(&out, n + 1).unwrap(), &want, tol);
        }
    }
}
crate::parity_test!(mxfp4_moe_experts, moe);

/// An uploaded MXFP4 matrix takes its file bytes on the device plus the planes' alignment:
/// the nibble plane then the exponent plane, each starting at a 256-byte boundary (less than
/// 256 bytes of padding after the nibbles, none after the exponents but the allocator's).
#[cfg(feature = "cuda")]
#[test]
fn mxfp4_device_bytes_are_its_file_bytes() {
    use kiln::backend::gpu::QType;
    let Some(mut b) = cuda(kiln::backend::DType::Bf16) else {
        return;
    };
    let mut rng = rng("mxfp4_device_bytes");
    for (m, k) in [(2880, 2880), (75, 1152), (1, 32)] {
        let file = m * k / 32 * 17;
        let w = b
            .upload_weight(mxfp4(m, k, blocks(&mut rng, m, k, spread)))
            .expect("upload");
        let (planes, total) = QType::Mxfp4.planes(m, k);
        let padding = total - file;
        eprintln!(
            "MXFP4 {m}x{k}: file {file} bytes, device {} bytes (planes {total}, padding {padding})",
            w.device_bytes()
        );
        assert_eq!(
            planes,
            vec![(0, k / 2), ((m * k / 2).next_multiple_of(256), k / 32)]
        );
        assert!(padding < 256, "{m}x{k}: {padding} bytes of padding");
        assert_eq!(w.device_bytes(), total, "{m}x{k}");
    }
}

/// Decode speed of MXFP4 weights on a bf16 CUDA backend (`--ignored`): the gpt-oss expert
/// matrix (2880 x 2880) at 1, 2, 4 and 8 rows, 24 distinct matrices in turn (105 MB, more than
/// L2 holds), and a batched expert set (32 experts of gate, up and down, 2880 wide, top 4, four
/// layers' sets in turn) through `moe_ffn` at 1, 8 and 32 rows; then 4096 x 4096 batches on the
/// tiles (`KILN_QMMA8=all` in the environment for the 8-bit ones). Wall time of back-to-back
/// passes (median of 5), and the weight bytes each pass reads over that time.
#[cfg(feature = "cuda")]
#[test]
#[ignore]
fn bench_mxfp4_decode() {
    // No sync after each launch (the parity backends' `sync_check`).
    let Some(mut b) = cuda_opened(kiln::backend::cuda::CudaOptions {
        dtype: kiln::backend::DType::Bf16,
        ..gpu_options()
    }) else {
        return;
    };
    b.wait_kernels().expect("every kernel loads");
    let mut rng = rng("bench_mxfp4_decode");
    type Cuda = kiln::backend::cuda::CudaBackend;
    // A download after the passes waits for them (one stream).
    let probe = b.alloc(1, 8).expect("alloc");
    let time = |b: &mut Cuda, pass: &mut dyn FnMut(&mut Cuda), reps: usize| {
        pass(b);
        b.to_host(&probe, 1).expect("download");
        let mut times: Vec<f64> = (0..5)
            .map(|_| {
                let t = std::time::Instant::now();
                for _ in 0..reps {
                    pass(b);
                }
                b.to_host(&probe, 1).expect("download");
                t.elapsed().as_secs_f64() / reps as f64
            })
            .collect();
        times.sort_by(f64::total_cmp);
        times[2]
    };
    let (m, k) = (2880, 2880);
    let ws: Vec<_> = (0..24)
        .map(|_| {
            b.upload_weight(mxfp4(m, k, blocks(&mut rng, m, k, |_| 124)))
                .expect("upload")
        })
        .collect();
    let bytes: usize = ws.iter().map(|w| w.device_bytes()).sum();
    for n in [1, 2, 4, 8, 64, 256] {
        let x = tensor(&mut b, n, k, &random(&mut rng, n * k, 1.0));
        let mut out = b.alloc(n, m).expect("alloc");
        let t = time(
            &mut b,
            &mut |b| {
                for w in &ws {
                    b.matmul(&x, w, None, n, &mut out).expect("matmul");
                }
            },
            20,
        );
        eprintln!(
            "BENCH mxfp4 matmul {n}x{k}x{m}: {:.2} us a matrix, {:.0} GB/s of weights",
            t / ws.len() as f64 * 1e6,
            bytes as f64 / t / 1e9
        );
    }
    drop(ws);
    let (ne, top_k, f, h) = (32, 4, 2880, 2880);
    let s = MoeShape {
        n_expert: ne,
        top_k,
        expert_ff: f,
        norm_topk: true,
        shared_ff: 0,
        act: MoeAct::Silu,
    };
    let layers: Vec<Vec<_>> = (0..4)
        .map(|_| {
            [(ne * f, h), (ne * f, h), (ne * h, f)]
                .iter()
                .map(|&(r, c)| {
                    b.upload_weight(mxfp4(r, c, blocks(&mut rng, r, c, |_| 124)))
                        .expect("upload")
                })
                .collect()
        })
        .collect();
    let expert_bytes = layers[0][0].device_bytes() / ne;
    for n in [1, 8, 32] {
        let x = tensor(&mut b, n, h, &random(&mut rng, n * h, 1.0));
        let logits = random(&mut rng, n * ne, 2.0);
        // The experts a pass reads: the distinct top-k of the rows (each of 3 matrices).
        let mut used = vec![false; ne];
        for t in 0..n {
            let row = &logits[t * ne..(t + 1) * ne];
            let mut order: Vec<usize> = (0..ne).collect();
            order.sort_by(|&a, &c| row[c].total_cmp(&row[a]));
            for &e in &order[..top_k] {
                used[e] = true;
            }
        }
        let experts = used.iter().filter(|&&u| u).count();
        let l = tensor(&mut b, n, ne, &logits);
        let mut out = b.alloc(n, h).expect("alloc");
        let t = time(
            &mut b,
            &mut |b| {
                for w in &layers {
                    let ex = MoeExperts {
                        gate: &w[0],
                        up: &w[1],
                        down: &w[2],
                        shared: None,
                        bias: None,
                    };
                    b.moe_ffn(&x, &l, ex, &s, n, &mut out).expect("moe_ffn");
                }
            },
            10,
        );
        let read = 3 * experts * expert_bytes;
        eprintln!(
            "BENCH mxfp4 moe_ffn 32x2880x2880 top 4, {n} rows ({experts} experts): {:.1} us a layer, {:.0} GB/s of expert weights",
            t / layers.len() as f64 * 1e6,
            (read * layers.len()) as f64 / t / 1e9
        );
    }
    drop(layers);
    // Batches on the tiles: the bf16 tiles (the default) and the 8-bit ones.
    let Some(mut b8) = cuda_opened(kiln::backend::cuda::CudaOptions {
        dtype: kiln::backend::DType::Bf16,
        tuning: kiln::backend::GpuTuning {
            qmma8: kiln::backend::tuning::Choice::All,
            ..env_tuning()
        },
        ..gpu_options()
    }) else {
        return;
    };
    b8.wait_kernels().expect("every kernel loads");
    let probe8 = b8.alloc(1, 8).expect("alloc");
    for (m, k) in [(2880, 2880), (4096, 4096)] {
        let host: Vec<_> = (0..4)
            .map(|_| mxfp4(m, k, blocks(&mut rng, m, k, |_| 124)))
            .collect();
        for (label, be, pr) in [
            ("bf16 tiles", &mut b, &probe),
            ("8-bit tiles", &mut b8, &probe8),
        ] {
            let ws: Vec<_> = host
                .iter()
                .map(|w| be.upload_weight(w.clone()).expect("upload"))
                .collect();
            for n in [16, 32, 64, 128, 256] {
                let x = tensor(be, n, k, &random(&mut rng, n * k, 1.0));
                let mut out = be.alloc(n, m).expect("alloc");
                let mut pass = |be: &mut Cuda| {
                    for w in &ws {
                        be.matmul(&x, w, None, n, &mut out).expect("matmul");
                    }
                };
                pass(be);
                be.to_host(pr, 1).expect("download");
                let mut times: Vec<f64> = (0..5)
                    .map(|_| {
                        let t = std::time::Instant::now();
                        for _ in 0..10 {
                            pass(be);
                        }
                        be.to_host(pr, 1).expect("download");
                        t.elapsed().as_secs_f64() / 10.0
                    })
                    .collect();
                times.sort_by(f64::total_cmp);
                let per = times[2] / ws.len() as f64;
                eprintln!(
                    "BENCH mxfp4 {label} {n}x{k}x{m}: {:.1} us a matrix, {:.0} TFLOP/s",
                    per * 1e6,
                    2.0 * (n * m * k) as f64 / per / 1e12
                );
            }
        }
    }
}
