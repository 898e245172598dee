//! Sampling parity: the device sampler picks the same token as the CPU sampler for the same
//! logits and uniform draw, with the same logprobs and top alternatives.

use kiln::backend::Backend;
use kiln::backend::cpu::CpuBackend;
use kiln::sampling::{Penalties, SampleRow, SamplingParams};
use rand::RngExt;

use crate::harness::*;
use crate::parity_test;

fn params() -> Vec<SamplingParams> {
    let g = SamplingParams::greedy;
    let d = SamplingParams::default;
    vec![
        g(),
        SamplingParams {
            logprobs: Some(5),
            ..g()
        },
        SamplingParams {
            temperature: 0.7,
            ..d()
        },
        SamplingParams { top_k: 40, ..d() },
        SamplingParams {
            top_p: 0.9,
            temperature: 0.9,
            ..d()
        },
        SamplingParams { min_p: 0.05, ..d() },
        SamplingParams {
            top_k: 50,
            top_p: 0.8,
            min_p: 0.02,
            temperature: 1.3,
            logprobs: Some(3),
            ..d()
        },
        SamplingParams {
            repetition_penalty: 1.3,
            presence_penalty: 0.5,
            frequency_penalty: 0.2,
            ..g()
        },
        SamplingParams {
            temperature: 0.8,
            logit_bias: vec![(3, 10.0), (7, -100.0)],
            repetition_penalty: 0.9,
            ..d()
        },
        g(),
        SamplingParams { top_k: 1, ..d() },
        SamplingParams { top_p: 1e-6, ..d() },
        SamplingParams {
            temperature: 2.0,
            top_p: 0.95,
            frequency_penalty: 0.4,
            logprobs: Some(20),
            ..d()
        },
    ]
}

fn samples<B: TestBackend>(b: &mut B) {
    let mut rng = rng("samples");
    let mut cpu = CpuBackend::new();
    let ps = params();
    let s = ps.len();
    for vocab in [512usize, 1003, 32000] {
        for round in 0..3 {
            let mut logits = b.quantize(&random(&mut rng, s * vocab, 6.0));
            // Row 9: a tie at the maximum between two ids; greedy takes the lower one.
            let (lo, hi) = (
                rng.random_range(0..vocab / 2),
                vocab / 2 + rng.random_range(0..vocab / 2),
            );
            logits[9 * vocab + lo] = 50.0;
            logits[9 * vocab + hi] = 50.0;
            let history: Vec<Vec<u32>> = (0..s)
                .map(|_| (0..40).map(|_| rng.random_range(0..vocab as u32)).collect())
                .collect();
            let uniforms: Vec<f32> = (0..s).map(|_| rng.random::<f32>()).collect();
            let penalties: Vec<Penalties> = (0..s)
                .map(|i| Penalties::from_history(&ps[i], &history[i][..25], &history[i][25..]))
                .collect();
            let rows: Vec<SampleRow<'_>> = (0..s)
                .map(|i| SampleRow {
                    params: &ps[i],
                    uniform: uniforms[i],
                    penalties: &penalties[i],
                    mask: None,
                    forced: None,
                })
                .collect();
            let bl = tensor(b, s, vocab, &logits);
            let cl = tensor(&mut cpu, s, vocab, &logits);
            // Mixed rows (the full path), then the same logits with every row plain greedy
            // (the one-pass path: no penalties, bias or alternatives anywhere in the step).
            let greedy = SamplingParams::greedy();
            let plain: Vec<SampleRow<'_>> = rows
                .iter()
                .map(|r| SampleRow {
                    params: &greedy,
                    ..*r
                })
                .collect();
            // Constrained rows: a token mask on every row but the last (a free neighbour);
            // row 0 allows one token, the tie row allows both tied ids.
            let masks: Vec<Vec<u32>> = (0..s)
                .map(|i| {
                    let mut m: Vec<u32> = (0..vocab.div_ceil(32))
                        .map(|_| rng.random::<u32>() & rng.random::<u32>() & rng.random::<u32>())
                        .collect();
                    let mut allow = |t: usize| m[t / 32] |= 1 << (t % 32);
                    if i == 0 {
                        m.iter_mut().for_each(|w| *w = 0);
                        m[vocab / 64] = 1 << 5;
                    } else if i == 9 {
                        allow(lo);
                        allow(hi);
                    }
                    m
                })
                .collect();
            let masked: Vec<SampleRow<'_>> = rows
                .iter()
                .enumerate()
                .map(|(i, r)| SampleRow {
                    mask: (i + 1 < s).then_some(&masks[i][..]),
                    forced: None,
                    ..*r
                })
                .collect();
            // Prompt positions: every even row (not the tie row) forced to a random token,
            // whatever its parameters; its logprob and alternatives come from the raw row.
            let targets: Vec<Option<u32>> = (0..s)
                .map(|i| (i % 2 == 0 && i != 9).then(|| rng.random_range(0..vocab as u32)))
                .collect();
            let forced: Vec<SampleRow<'_>> = rows
                .iter()
                .zip(&targets)
                .map(|(r, &t)| SampleRow { forced: t, ..*r })
                .collect();
            for (kind, rows) in [
                ("mixed", &rows),
                ("plain greedy", &plain),
                ("masked", &masked),
                ("forced", &forced),
            ] {
                let got = b.sample(&bl, rows).unwrap();
                let want = cpu.sample(&cl, rows).unwrap();
                if kind == "masked" {
                    assert_eq!(got[0].token as usize, vocab / 64 * 32 + 5, "{}", b.label());
                    for (i, g) in got.iter().enumerate().take(s - 1) {
                        assert!(
                            kiln::sampling::mask_allows(&masks[i], g.token as usize),
                            "{} row {i}: token {} is masked",
                            b.label(),
                            g.token
                        );
                    }
                }
                if kind == "forced" {
                    for (i, (g, t)) in got.iter().zip(&targets).enumerate() {
                        if let Some(t) = *t {
                            assert_eq!(g.token, t, "{} row {i}: the forced token", b.label());
                        }
                    }
                }
                assert_eq!(
                    got[9].token as usize,
                    lo,
                    "{} {kind}: greedy tie",
                    b.label()
                );
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    let what = format!(
                        "{} {kind} vocab {vocab} round {round} row {i} {:?}",
                        b.label(),
                        rows[i].params
                    );
                    assert_eq!(g.token, w.token, "{what}: token (u = {})", uniforms[i]);
                    assert!(
                        (g.logprob - w.logprob).abs() < 1e-4,
                        "{what}: logprob {} vs {}",
                        g.logprob,
                        w.logprob
                    );
                    assert_eq!(g.top.len(), w.top.len(), "{what}: top count");
                    for (a, c) in g.top.iter().zip(&w.top) {
                        assert_eq!(a.0, c.0, "{what}: top ids {:?} vs {:?}", g.top, w.top);
                        assert!(
                            (a.1 - c.1).abs() < 1e-4,
                            "{what}: top logprobs {:?} vs {:?}",
                            g.top,
                            w.top
                        );
                    }
                }
            }
        }
    }
}
parity_test!(sample_on_device, samples);

/// Plain greedy rows of today's vocabularies (Llama 3, Qwen, odd sizes): each row's pass is
/// spread over many blocks (`greedy_parts` in sample.rs: up to 64 slices at one row) and
/// merged by the last to finish. The token (the first id of the maximum, ties across slices
/// and at the row's ends included) and its logprob match the CPU, at 1, 2 and 5 rows, and
/// again on the same buffers (the merge counters are left zero for the next step).
fn greedy_slices<B: TestBackend>(b: &mut B) {
    let mut rng = rng("greedy_slices");
    let mut cpu = CpuBackend::new();
    let greedy = SamplingParams::greedy();
    let none = Penalties::default();
    for (vocab, s) in [
        (128_256usize, 1usize),
        (151_936, 2),
        (128_263, 5),
        (4_097, 1),
    ] {
        for round in 0..2 {
            let mut logits = b.quantize(&random(&mut rng, s * vocab, 6.0));
            for r in 0..s {
                let row = &mut logits[r * vocab..(r + 1) * vocab];
                // Row 0: the maximum tied at a late and an early id (different slices);
                // row 1: at the last id alone; others: a random pair.
                let (a, z) = match r {
                    0 => (
                        vocab - 3 - rng.random_range(0..vocab / 3),
                        rng.random_range(0..vocab / 3),
                    ),
                    1 => (vocab - 1, vocab - 1),
                    _ => (rng.random_range(0..vocab), rng.random_range(0..vocab)),
                };
                row[a] = 40.0;
                row[z] = 40.0;
            }
            let rows: Vec<SampleRow<'_>> = (0..s)
                .map(|_| SampleRow {
                    params: &greedy,
                    uniform: 0.5,
                    penalties: &none,
                    mask: None,
                    forced: None,
                })
                .collect();
            let (bl, cl) = (
                tensor(b, s, vocab, &logits),
                tensor(&mut cpu, s, vocab, &logits),
            );
            let got = b.sample(&bl, &rows).unwrap();
            let want = cpu.sample(&cl, &rows).unwrap();
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                let what = format!("{} vocab {vocab} rows {s} round {round} row {i}", b.label());
                let first = logits[i * vocab..(i + 1) * vocab]
                    .iter()
                    .position(|&x| x == 40.0)
                    .unwrap();
                assert_eq!(
                    g.token as usize, first,
                    "{what}: the first id of the maximum"
                );
                assert_eq!(g.token, w.token, "{what}: token");
                assert!(
                    (g.logprob - w.logprob).abs() < 1e-4,
                    "{what}: logprob {} vs {}",
                    g.logprob,
                    w.logprob
                );
            }
        }
    }
}
parity_test!(greedy_rows_over_many_slices, greedy_slices);
