//! Attention with a sliding window, a logit soft cap and a custom query scale, on every
//! backend against the CPU reference: decode rows (split into parts and not), prefill chunks
//! that start mid-sequence and are longer than the window, GQA, head sizes 64 to 256, block
//! sizes that do not divide a decode step. Plus an ignored bench of the decode attention time
//! with and without a window (`--ignored bench_window`).

use crate::harness::TestBackend;
use crate::{AttnCase, Scores, attention_case, decode_rows};

fn case(
    heads: (usize, usize),
    hd: usize,
    bs: u32,
    seqs: &[(u32, u32)],
    scores: Scores,
) -> AttnCase {
    AttnCase {
        heads,
        hd,
        block_size: bs,
        seqs: seqs.to_vec(),
        scores,
    }
}

fn window(w: usize) -> Scores {
    Scores {
        window: Some(w),
        ..Scores::default()
    }
}

fn windows<B: TestBackend>(b: &mut B) {
    let mut rng = crate::harness::rng("attention windows");
    let cases = [
        // Decode (the thread-group variant), long rows split into parts mapped onto the window.
        case(
            (32, 8),
            128,
            16,
            &[(1, 3000), (1, 700), (1, 1)],
            window(1024),
        ),
        case((16, 4), 64, 16, &[(1, 5000), (1, 130), (1, 2)], window(700)),
        case((32, 8), 128, 16, &decode_rows(40), window(512)),
        case((8, 1), 64, 16, &decode_rows(24), window(100)),
        // Two-row items: each vector has its own window.
        case((16, 4), 128, 16, &[(2, 300), (1, 50), (2, 2)], window(100)),
        // Prefill chunks starting mid-sequence (the tensor-core variant in bf16), next to
        // decode rows; a chunk longer than the window from position 0.
        case(
            (32, 8),
            128,
            16,
            &[(150, 1400), (1, 900), (64, 64)],
            window(256),
        ),
        case(
            (16, 2),
            64,
            16,
            &[(70, 2000), (1, 3000), (5, 5)],
            window(64),
        ),
        case((8, 4), 128, 16, &[(300, 300), (1, 77)], window(128)),
        // Items of 32 rows (a step that fills a wave of the tensor-core variant's blocks).
        case((64, 16), 128, 16, &[(560, 600), (1, 40)], window(100)),
        // Head size 256 (the portable kernel), prefill and decode, split.
        case(
            (8, 8),
            256,
            16,
            &[(1, 1000), (9, 9), (33, 1100)],
            window(300),
        ),
        case((16, 4), 256, 16, &[(1, 4097)], window(1024)),
        case((8, 2), 80, 16, &[(3, 300), (1, 77)], window(1)),
        // Block sizes where a decode step is not whole blocks, or straddles them.
        case((32, 8), 128, 12, &decode_rows(12), window(333)),
        case((16, 4), 128, 6, &[(1, 700), (1, 61), (2, 300)], window(50)),
        // Windows wider than the context, and one narrower than a block.
        case((8, 4), 128, 16, &[(1, 100), (20, 50)], window(5000)),
        case((4, 4), 64, 8, &[(1, 2500), (1, 33)], window(17)),
        // Head size 256 decode (the thread-group variant): Gemma 3's GQA 2 with split rows,
        // one query head per KV head.
        case(
            (16, 8),
            256,
            16,
            &[(1, 3000), (1, 700), (1, 1)],
            window(1024),
        ),
        case((8, 8), 256, 16, &decode_rows(6), window(300)),
        // One KV head, one long row: the most parts a row is split into (64 parts of 128
        // positions on a GPU of 32 SMs or more), all merged.
        case((8, 1), 128, 16, &[(1, 8190)], window(5000)),
    ];
    for c in &cases {
        attention_case(b, c, &mut rng);
    }
}
crate::parity_test!(attention_sliding_window, windows);

fn scores<B: TestBackend>(b: &mut B) {
    let mut rng = crate::harness::rng("attention soft cap and scale");
    let s = |window, softcap, scale| Scores {
        window,
        softcap,
        scale,
    };
    let cases = [
        // Scale 1 makes the logits spread (sigma ~3.8 at head size 128): the cap bites.
        case(
            (32, 8),
            128,
            16,
            &[(150, 1400), (1, 900), (64, 64)],
            s(None, Some(5.0), Some(1.0)),
        ),
        case((32, 8), 128, 16, &decode_rows(40), s(None, Some(0.2), None)),
        case(
            (16, 4),
            64,
            16,
            &[(1, 5000), (1, 130)],
            s(None, None, Some(0.5)),
        ),
        case(
            (8, 2),
            80,
            16,
            &[(3, 300), (1, 77)],
            s(None, Some(1.0), Some(0.3)),
        ),
        case(
            (8, 8),
            256,
            16,
            &[(1, 1000), (9, 9)],
            s(Some(200), Some(3.0), Some(0.3)),
        ),
        // Gemma 2's values: cap 50, query_pre_attn_scalar 256, window 1024 (here 512).
        case(
            (16, 2),
            128,
            16,
            &[(70, 2000), (1, 3000)],
            s(Some(512), Some(50.0), Some(0.0625)),
        ),
        // Gemma 2's cap and scale at head size 256 on decode rows (the decode variant).
        case(
            (16, 8),
            256,
            16,
            &decode_rows(12),
            s(None, Some(50.0), Some(0.0625)),
        ),
        // 64 parts over the whole context (as above); a head size that is not a multiple of 4 (the
        // merge's scalar path).
        case((8, 1), 128, 16, &[(1, 8190)], s(None, None, None)),
        case((4, 2), 50, 16, &[(1, 3000)], s(None, None, Some(0.3))),
    ];
    for c in &cases {
        attention_case(b, c, &mut rng);
    }
}
crate::parity_test!(attention_softcap_and_scale, scores);

/// Decode attention time at context 8192 (32 heads, 8 KV heads, head size 128, bf16), full
/// and with a window of 1024: one layer's kernel time from device events, and the KV bytes
/// the window leaves to read.
#[cfg(feature = "cuda")]
#[test]
#[ignore]
fn bench_window_decode_attention() {
    use kiln::backend::cuda::{CudaBackend, CudaOptions, DType, device_available};
    use kiln::backend::{AttnShape, Backend, KvShape};
    if !device_available() {
        return;
    }
    let mut b = CudaBackend::new(
        0,
        CudaOptions {
            dtype: DType::Bf16,
            kernel_cache: kiln::engine::default_kernel_cache_dir(),
            ..crate::harness::gpu_options()
        },
    )
    .expect("cuda");
    let full = AttnShape::new(32, 8, 128);
    let ctx = 8192u32;
    let bps = ctx.div_ceil(16);
    for batch in [1u32, 32] {
        let kvs = KvShape {
            num_layers: 1,
            num_blocks: (batch * bps) as usize,
            block_size: 16,
            n_kv_heads: 8,
            head_dim: 128,
        };
        let kv = b.alloc_kv(&kvs).expect("kv");
        let seqs: Vec<_> = (0..batch)
            .map(|i| (1, ctx, (i * bps..(i + 1) * bps).collect()))
            .collect();
        let p = crate::harness::plan(&seqs, 16, |_| 0);
        let mut rng = crate::harness::rng("bench window");
        let q = crate::harness::random(&mut rng, batch as usize * full.qkv_dim(), 1.0);
        let q = crate::harness::tensor(&mut b, batch as usize, full.qkv_dim(), &q);
        let mut out = b.alloc(batch as usize, full.q_dim()).expect("out");
        for (graphs, window) in [
            (false, None),
            (false, Some(1024)),
            (true, None),
            (true, Some(1024)),
        ] {
            b.set_graphs(graphs);
            let shape = AttnShape { window, ..full };
            let reps = 50;
            b.set_timing_period(Some(1));
            let bb = b.prepare(&p).expect("prepare");
            for _ in 0..reps {
                b.attention(&q, &kv, 0, &bb, &shape, None, &mut out)
                    .expect("attention");
            }
            b.to_host(&out, 1).expect("sync");
            b.set_timing_period(None);
            // (attention + merge, merge) per launch.
            let mut t: Vec<(f64, f64)> = Vec::new();
            for k in b.take_kernel_timings().expect("timings") {
                match k.kernel {
                    "attention" => t.push((k.seconds, 0.0)),
                    "attn_combine" => {
                        let last = t.last_mut().expect("attention first");
                        last.0 += k.seconds;
                        last.1 = k.seconds;
                    }
                    _ => {}
                }
            }
            t.sort_by(|a, b| a.0.total_cmp(&b.0));
            let (med, merge) = t[t.len() / 2];
            let read = window.map_or(ctx, |w| (w as u32).min(ctx)) as f64;
            let bytes = 2.0 * 2.0 * read * full.kv_dim() as f64 * batch as f64;
            eprintln!(
                "BENCH attention decode batch {batch} ctx {ctx} window {window:?} ({} split layout): \
                 {:.1} us per layer (merge {:.1} us), {:.1} MB of KV to read, {:.0} GB/s",
                if graphs { "graph" } else { "eager" },
                med * 1e6,
                merge * 1e6,
                bytes / 1e6,
                bytes / med / 1e9
            );
        }
    }
}
