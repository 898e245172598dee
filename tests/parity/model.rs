//! End to end on the real stories260K fixture: the whole forward and the sampler on every
//! compiled backend against the CPU, and (CUDA) the host<->device traffic of a decode step.

use std::path::PathBuf;

use kiln::backend::Backend;
use kiln::backend::cpu::CpuBackend;
use kiln::generate::{GenerateOptions, Generation, SingleGenerator};
use kiln::model::{LoadFormat, ModelFiles};
use kiln::sampling::SamplingParams;

/// The fixture directory: `KILN_MODELS_DIR` (device runs carry the files), else `../shared/models`.
fn models_dir() -> PathBuf {
    std::env::var_os("KILN_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/models"))
}

fn stories() -> ModelFiles {
    ModelFiles::open(&models_dir().join("stories260K.gguf"), LoadFormat::Gguf)
        .expect("stories260K fixture")
}

const PROMPTS: [&str; 3] = [
    "Once upon a time",
    "The little dog",
    "Lily and Ben went to the park",
];

fn generate<B: Backend>(backend: B, files: &ModelFiles) -> Vec<Generation> {
    let tok = files.tokenizer.as_ref().expect("fixture tokenizer");
    let mut g = SingleGenerator::new(backend, files, 256, 7, 4).expect("load");
    let opts = GenerateOptions {
        max_tokens: 64,
        params: SamplingParams::greedy(),
        stop_ids: vec![],
        chunk: 7,
        block_size: 4,
        record_logits: 64,
    };
    PROMPTS
        .iter()
        .map(|p| {
            g.generate(&tok.encode(p, true).unwrap(), &opts, |_| {})
                .expect("generate")
        })
        .collect()
}

/// Relative L2 error of `a` against `b`.
pub(crate) fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (*x as f64 - *y as f64).powi(2))
        .sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den).sqrt()
}

/// Compares a run with the CPU run: ids identical when `exact`; the prompt's logits (step 0)
/// within `tol`, and every step up to the first differing id within `2 * tol` (bf16 errors
/// compound along the sequence). Returns (matching ids, worst step-0 error, worst error).
fn compare(
    label: &str,
    got: &[Generation],
    want: &[Generation],
    exact: bool,
    tol: f64,
) -> (usize, f64, f64) {
    let (mut same, mut first, mut worst) = (0, 0.0f64, 0.0f64);
    for (p, (g, w)) in got.iter().zip(want).enumerate() {
        let agree = g
            .token_ids
            .iter()
            .zip(&w.token_ids)
            .take_while(|(a, b)| a == b)
            .count();
        if exact {
            assert_eq!(
                g.token_ids, w.token_ids,
                "{label}: greedy ids for prompt {p}"
            );
        }
        for step in 0..=agree.min(g.step_logits.len() - 1) {
            let err = rel_l2(&g.step_logits[step], &w.step_logits[step]);
            let limit = if step == 0 { tol } else { 2.0 * tol };
            assert!(
                err < limit,
                "{label}: prompt {p} step {step} logits relative error {err:.3e}"
            );
            if step == 0 {
                first = first.max(err);
            }
            worst = worst.max(err);
        }
        same += agree;
    }
    (same, first, worst)
}

fn report(label: &str, (same, first, worst): (usize, f64, f64)) {
    let n = 64 * PROMPTS.len();
    eprintln!(
        "{label}: {same}/{n} greedy ids agree; logits error {first:.2e} at the prompt, {worst:.2e} worst step"
    );
}

#[test]
fn stories260k_greedy_matches_cpu() {
    let files = stories();
    let want = generate(CpuBackend::new(), &files);
    report(
        "cpu",
        compare(
            "cpu",
            &generate(CpuBackend::new(), &files),
            &want,
            true,
            1e-6,
        ),
    );
    #[cfg(feature = "cuda")]
    {
        use kiln::backend::cuda::DType;
        if let Some(b) = crate::harness::cuda(DType::F32) {
            report(
                "cuda f32",
                compare("cuda f32", &generate(b, &files), &want, true, 1e-4),
            );
        }
        if let Some(b) = crate::harness::cuda(DType::Bf16) {
            report(
                "cuda bf16",
                compare("cuda bf16", &generate(b, &files), &want, false, 2e-2),
            );
        }
    }
}

/// Every row of a prompt-logprobs chunk (`every_row_logits`) gives the logits that row gives
/// as the last row of a prefill of the prompt up to it, on every compiled backend; a step
/// with more logits rows than the scratch holds is refused.
#[test]
fn every_row_logits_equal_each_prefix_last_row() {
    let files = stories();
    every_row_vs_prefixes(CpuBackend::new(), &files, 1e-5);
    #[cfg(feature = "cuda")]
    {
        use kiln::backend::cuda::DType;
        if let Some(b) = crate::harness::cuda(DType::F32) {
            every_row_vs_prefixes(b, &files, 1e-4);
        }
        if let Some(b) = crate::harness::cuda(DType::Bf16) {
            every_row_vs_prefixes(b, &files, 2e-2);
        }
    }
}

fn every_row_vs_prefixes<B: Backend>(mut b: B, files: &ModelFiles, tol: f64) {
    use kiln::backend::{BackendError, BatchPlan, KvShape, SeqSlice};
    use kiln::runner::Llama;
    let tok = files.tokenizer.as_ref().expect("fixture tokenizer");
    let ids = tok.encode(PROMPTS[2], true).unwrap();
    let (n, spec) = (ids.len(), &files.spec);
    let mut model = Llama::load(&mut b, files, 64, 16).unwrap();
    let mut small = Llama::load(&mut b, files, 64, n - 1).unwrap();
    let shape = KvShape {
        num_layers: spec.n_layers,
        num_blocks: 8,
        block_size: 16,
        n_kv_heads: spec.n_kv_heads,
        head_dim: spec.head_dim,
    };
    let mut kv = b.alloc_kv(&shape).unwrap();
    let plan = |len: usize, every: bool| {
        let mut p = BatchPlan {
            token_ids: ids[..len].to_vec(),
            block_size: 16,
            every_row_logits: if every { vec![0] } else { vec![] },
            ..Default::default()
        };
        p.seqs.push(SeqSlice {
            q_start: 0,
            q_len: len as u32,
            ctx_len: len as u32,
            block_table: (0..8).collect(),
            wants_logits: true,
        });
        p.fill_positions_and_slots();
        p
    };
    let v = spec.vocab_size;
    model.forward(&mut b, &mut kv, &plan(n, true)).unwrap();
    let all = b.to_host(model.logits(), n).unwrap();
    for p in 1..=n {
        model.forward(&mut b, &mut kv, &plan(p, false)).unwrap();
        let last = b.to_host(model.logits(), 1).unwrap();
        let err = rel_l2(&all[(p - 1) * v..p * v], &last[..v]);
        assert!(
            err < tol,
            "{}: row {} of {n}: error {err:.3e}",
            b.name(),
            p - 1
        );
    }
    let refused = small.forward(&mut b, &mut kv, &plan(n, true));
    assert!(
        matches!(refused, Err(BackendError::InvalidBatch(_))),
        "{n} logits rows past a scratch of {}",
        n - 1
    );
}

#[cfg(feature = "cuda")]
mod transfers {
    use kiln::backend::cuda::DType;
    use kiln::backend::{Backend, BatchPlan, KvShape, SeqSlice};
    use kiln::model::ModelFiles;
    use kiln::model::source::DummySource;
    use kiln::runner::Llama;
    use kiln::sampling::{Penalties, SampleRow, SamplingParams};

    use super::stories;

    /// Four sequences: a prefill step, then decode steps; returns the decode plan for `step`.
    fn decode_plan(lens: &[u32], step: u32, tokens: &[u32]) -> BatchPlan {
        let mut p = BatchPlan {
            block_size: 16,
            ..Default::default()
        };
        for (i, &n) in lens.iter().enumerate() {
            let table = (0..8).map(|b| (i * 8 + b) as u32).collect();
            p.seqs.push(SeqSlice {
                q_start: i as u32,
                q_len: 1,
                ctx_len: n + step + 1,
                block_table: table,
                wants_logits: true,
            });
        }
        p.token_ids = tokens.to_vec();
        p.fill_positions_and_slots();
        p
    }

    #[test]
    fn decode_step_moves_only_metadata_in_and_ids_out() {
        // Eager steps: the exact metadata layout below (graph replays upload the padded
        // layout; `decode_graphs_match_eager_steps` counts their copies).
        let Some(mut b) = crate::harness::cuda_with(DType::Bf16, false) else {
            return;
        };
        let files = stories();
        let mut model = Llama::load(&mut b, &files, 64, 4).unwrap();
        let shape = KvShape {
            num_layers: 5,
            num_blocks: 32,
            block_size: 16,
            n_kv_heads: 4,
            head_dim: 8,
        };
        let mut kv = b.alloc_kv(&shape).unwrap();
        let lens = [5u32, 9, 2, 30];
        let mut p = BatchPlan {
            block_size: 16,
            ..Default::default()
        };
        for (i, &n) in lens.iter().enumerate() {
            let table = (0..8).map(|b| (i * 8 + b) as u32).collect();
            p.seqs.push(SeqSlice {
                q_start: p.token_ids.len() as u32,
                q_len: n,
                ctx_len: n,
                block_table: table,
                wants_logits: true,
            });
            p.token_ids
                .extend((0..n).map(|t| 1 + (t * 7 + i as u32) % 500));
        }
        p.fill_positions_and_slots();
        let greedy = SamplingParams::greedy();
        let with_top = SamplingParams {
            logprobs: Some(4),
            ..SamplingParams::greedy()
        };
        let row = |params| SampleRow {
            params,
            uniform: 0.5,
            penalties: Penalties::none(),
            mask: None,
            forced: None,
        };
        let logits = model.forward(&mut b, &mut kv, &p).unwrap();
        let mut tokens: Vec<u32> = b
            .sample(logits, &[row(&greedy); 4])
            .unwrap()
            .iter()
            .map(|s| s.token)
            .collect();
        for step in 0..2u32 {
            let dp = decode_plan(&lens, step, &tokens);
            let before = b.transfer_stats();
            let logits = model.forward(&mut b, &mut kv, &dp).unwrap();
            let rows = [row(&greedy), row(&with_top), row(&greedy), row(&greedy)];
            let out = b.sample(logits, &rows).unwrap();
            let d = b.transfer_stats().since(&before);
            tokens = out.iter().map(|s| s.token).collect();
            let tables: usize = dp.seqs.iter().map(|s| s.block_table.len()).sum();
            // Plan: ids, positions, slots, 4 words per sequence, tables, logits rows, 6 per item;
            // sampling: 8 words per row. Out: (id, logprob) per row and per top alternative.
            let meta_words = 3 * 4 + 4 * 4 + tables + 4 + 6 * 4 + 8 * 4;
            assert_eq!(
                (d.h2d_calls, d.h2d_bytes),
                (2, 4 * meta_words as u64),
                "decode step {step} uploads: {d:?}"
            );
            assert_eq!(
                (d.d2h_calls, d.d2h_bytes),
                (1, 8 * (4 + 4)),
                "decode step {step} downloads: {d:?}"
            );
        }
    }

    /// One decode step over `seqs` = (first block, context length after this token, token).
    fn step_plan(seqs: &[(u32, u32, u32)]) -> BatchPlan {
        let mut p = BatchPlan {
            block_size: 16,
            ..Default::default()
        };
        for (i, &(first, ctx, tok)) in seqs.iter().enumerate() {
            p.seqs.push(SeqSlice {
                q_start: i as u32,
                q_len: 1,
                ctx_len: ctx,
                block_table: (first..first + ctx.div_ceil(16)).collect(),
                wants_logits: true,
            });
            p.token_ids.push(tok);
        }
        p.fill_positions_and_slots();
        p
    }

    fn rel(a: &[f32], b: &[f32]) -> f64 {
        super::rel_l2(a, b)
    }

    /// Decode steps replayed from recorded graphs (padded to a bucket, split-K at a fixed
    /// part count) give the eager steps' logits, for two buckets, with padding rows that
    /// would corrupt sequence 0's first KV entry (block 0) if they wrote the cache.
    #[test]
    fn decode_graphs_match_eager_steps() {
        // stories260K (head_dim 8: the generic kernel) and random weights at head_dim 128
        // with one KV head (the decode kernel, with many empty split-K parts per row).
        let dummy = {
            let mut spec = stories().spec;
            (spec.n_heads, spec.n_kv_heads, spec.head_dim) = (4, 1, 128);
            (spec.hidden, spec.n_layers, spec.vocab_size) = (512, 2, 512);
            spec.rope.dim = 128;
            ModelFiles {
                name: "dummy-d128".into(),
                spec,
                tokenizer: None,
                source: Box::new(DummySource { seed: 5 }),
            }
        };
        for files in [stories(), dummy] {
            for dt in [DType::F32, DType::Bf16] {
                graphs_vs_eager(&files, dt);
            }
        }
    }

    fn graphs_vs_eager(files: &ModelFiles, dt: DType) {
        {
            let (Some(mut eager), Some(mut graphed)) = (
                crate::harness::cuda_with(dt, false),
                crate::harness::cuda_with(dt, true),
            ) else {
                return;
            };
            let spec = &files.spec;
            let mut me = Llama::load(&mut eager, files, 256, 8).unwrap();
            let mut mg = Llama::load(&mut graphed, files, 256, 8).unwrap();
            let shape = KvShape {
                num_layers: spec.n_layers,
                num_blocks: 5 * 20,
                block_size: 16,
                n_kv_heads: spec.n_kv_heads,
                head_dim: spec.head_dim,
            };
            let (mut kve, mut kvg) = (
                eager.alloc_kv(&shape).unwrap(),
                graphed.alloc_kv(&shape).unwrap(),
            );
            // Prompts (eager on both: prefill is never graphed).
            let lens = [5u32, 9, 2, 200, 30];
            let mut p = BatchPlan {
                block_size: 16,
                ..Default::default()
            };
            for (i, &n) in lens.iter().enumerate() {
                p.seqs.push(SeqSlice {
                    q_start: p.token_ids.len() as u32,
                    q_len: n,
                    ctx_len: n,
                    block_table: (0..n.div_ceil(16)).map(|b| i as u32 * 20 + b).collect(),
                    wants_logits: true,
                });
                p.token_ids
                    .extend((0..n).map(|t| 1 + (t * 11 + i as u32) % 500));
            }
            p.fill_positions_and_slots();
            let argmax = |row: &[f32]| {
                (0..row.len())
                    .max_by(|&a, &b| row[a].total_cmp(&row[b]))
                    .unwrap() as u32
            };
            let vocab = files.spec.vocab_size;
            mg.forward(&mut graphed, &mut kvg, &p).unwrap();
            let le = me.forward(&mut eager, &mut kve, &p).unwrap();
            let host = eager.to_host(le, lens.len()).unwrap();
            let mut next: Vec<u32> = host.chunks(vocab).map(argmax).collect();
            let mut ctx = lens.to_vec();
            let (tol, mut worst) = (if dt == DType::F32 { 1e-4 } else { 2e-2 }, 0.0f64);
            for step in 0..12 {
                // Five sequences (bucket 8), then three (bucket 4).
                let active: Vec<usize> = if step < 6 {
                    (0..5).collect()
                } else {
                    vec![0, 2, 4]
                };
                for &i in &active {
                    ctx[i] += 1;
                }
                let seqs: Vec<(u32, u32, u32)> = active
                    .iter()
                    .map(|&i| (i as u32 * 20, ctx[i], next[i]))
                    .collect();
                let plan = step_plan(&seqs);
                let le = me.forward(&mut eager, &mut kve, &plan).unwrap();
                let want = eager.to_host(le, seqs.len()).unwrap();
                let before = graphed.transfer_stats();
                let lg = mg.forward(&mut graphed, &mut kvg, &plan).unwrap();
                let got = graphed.to_host(lg, seqs.len()).unwrap();
                let d = graphed.transfer_stats().since(&before);
                assert_eq!(
                    (d.h2d_calls, d.d2h_calls),
                    (1, 1),
                    "step {step}: one upload, one download"
                );
                for (r, &i) in active.iter().enumerate() {
                    let (w, g) = (
                        &want[r * vocab..(r + 1) * vocab],
                        &got[r * vocab..(r + 1) * vocab],
                    );
                    let err = rel(g, w);
                    assert!(
                        err < tol,
                        "{dt:?} step {step} sequence {i}: relative error {err:.3e}"
                    );
                    worst = worst.max(err);
                    next[i] = argmax(w);
                }
            }
            let gs = graphed.graph_stats();
            eprintln!(
                "{} {dt:?}: graphs {gs:?}, worst logits error vs eager {worst:.2e}",
                files.name
            );
            // Per bucket: one eager step (two when that step grew a workspace: a new buffer
            // retires what was seen), one recording, replays after that. A recording the
            // driver refuses (e.g. while a parallel test lazily loads a module) runs eagerly
            // and is tried again on the next step.
            assert_eq!(gs.captures, 2, "one recording per bucket: {gs:?}");
            assert!(
                gs.replays + gs.failures >= 7,
                "later steps of a bucket replay: {gs:?}"
            );
            assert_eq!(
                eager.graph_stats().captures + eager.graph_stats().replays,
                0
            );
        }
    }
}
