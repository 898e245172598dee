//! Kiln against an independent implementation (issue 5): a randomly initialised Llama at a
//! realistic shape (head_dim 128, GQA 4:1, vocab 32000, 4 layers), created and saved in bf16
//! by PyTorch/transformers with `scripts/torch_reference.py`, together with transformers'
//! logits for a few prompts in f32 (the exact reference) and in bf16 (its own bf16 noise).
//!
//! Each prompt goes through Kiln in one step whose slices share one block table: slice `j`
//! holds the tokens after stored position `j - 1` up to stored position `j`, so every slice's
//! last row is a stored position and yields logits, and the step mixes a prefill chunk with
//! single-token slices that read what the earlier slices wrote to the cache.

use std::path::{Path, PathBuf};

use kiln::backend::cpu::CpuBackend;
use kiln::backend::{Backend, BatchPlan, KvShape, SeqSlice};
use kiln::model::{LoadFormat, ModelFiles};
use kiln::runner::Llama;
use safetensors::{Dtype, SafeTensors};

/// f32 against transformers f32, both on the same (bf16-valued) weights. Measured on the CPU
/// against transformers on the CPU: 3e-6 (5 tokens) to 6e-6 (301 tokens), summation order
/// only. Broken variants of the same files, measured: rope theta 10000 instead of 500000
/// 8e-2..1; theta 1e6 1e-2..7e-1; q/k rows in the other rope layout 2e-1..1; attn and ffn norm
/// weights of one layer swapped 2.3e-1; rms eps 1e-6 instead of 1e-5 1.5e-2..3.7e-2. So 1e-4
/// separates "the same math" from "a different model" by two orders of magnitude or more, and
/// leaves CUDA f32 (cuBLAS without TF32, other summation orders) a factor ~15 of room.
const F32_TOL: f64 = 1e-4;
/// bf16 against transformers f32: transformers itself is 1.2e-2 (5 tokens) to 1.7e-2 (301
/// tokens) away in bf16 at this shape. Kiln in bf16 must stay under 2e-2, or under 1.5x
/// transformers' own bf16 error where that is larger (Kiln rounds at other places). This
/// guards the bf16 kernels; the model's math is pinned by the f32 runs (an rms eps off by 10x
/// is within bf16 noise, but 150x over `F32_TOL`).
const BF16_TOL: f64 = 2e-2;
const BF16_OVER_TORCH: f64 = 1.5;
/// A bf16 argmax that differs from transformers f32's must be a near tie there: its f32 logit
/// within this many times transformers' own bf16 RMS logit error (per prompt) of the top one.
/// Transformers' own bf16 picks were within ~3x (0.046 with an RMS error of 0.014).
const BF16_TIE_RMS: f64 = 10.0;
/// Share of positions where Kiln bf16 and transformers bf16 pick the same token. Random
/// models have small top-1 margins (median ~0.15 with logits of std ~0.93): transformers bf16
/// and f32 themselves agree on ~96%, two independent bf16 roundings somewhat less.
const BF16_ARGMAX_AGREE: f64 = 0.85;
/// An f32 argmax may differ from transformers f32's only on an exact tie (up to rounding).
const F32_TIE: f64 = 1e-3;
const BLOCK_SIZE: u32 = 16;

/// One prompt of the reference: token ids, the stored positions and transformers' logits
/// there (`[positions, vocab]` row-major).
struct Prompt {
    ids: Vec<u32>,
    positions: Vec<u32>,
    torch_bf16: Vec<f32>,
    torch_f32: Vec<f32>,
}

fn tensor_bytes<'a>(st: &'a SafeTensors<'a>, name: &str, dtype: Dtype) -> &'a [u8] {
    let t = st
        .tensor(name)
        .unwrap_or_else(|e| panic!("reference tensor {name}: {e}"));
    assert_eq!(t.dtype(), dtype, "reference tensor {name}");
    t.data()
}

fn read_i32(st: &SafeTensors<'_>, name: &str) -> Vec<u32> {
    tensor_bytes(st, name, Dtype::I32)
        .chunks_exact(4)
        .map(|c| {
            let v = i32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            u32::try_from(v).expect("non-negative id or position")
        })
        .collect()
}

fn read_f32(st: &SafeTensors<'_>, name: &str) -> Vec<f32> {
    tensor_bytes(st, name, Dtype::F32)
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn load_reference(dir: &Path, vocab: usize) -> (Vec<Prompt>, serde_json::Value) {
    let path = dir.join("reference.safetensors");
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let st = SafeTensors::deserialize(&bytes).expect("reference.safetensors");
    let mut prompts = Vec::new();
    for i in 0.. {
        if st.tensor(&format!("ids_{i}")).is_err() {
            break;
        }
        let p = Prompt {
            ids: read_i32(&st, &format!("ids_{i}")),
            positions: read_i32(&st, &format!("positions_{i}")),
            torch_bf16: read_f32(&st, &format!("logits_bf16_{i}")),
            torch_f32: read_f32(&st, &format!("logits_f32_{i}")),
        };
        let k = p.positions.len();
        assert!(k > 0 && p.positions.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(*p.positions.last().unwrap() as usize, p.ids.len() - 1);
        assert_eq!(p.torch_f32.len(), k * vocab, "prompt {i}: f32 logits shape");
        assert_eq!(
            p.torch_bf16.len(),
            k * vocab,
            "prompt {i}: bf16 logits shape"
        );
        prompts.push(p);
    }
    assert!(!prompts.is_empty(), "no prompts in {}", path.display());
    let meta_path = dir.join("reference.json");
    let meta = std::fs::read_to_string(&meta_path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(serde_json::Value::Null);
    (prompts, meta)
}

/// The one-step plan of a prompt: a slice ending at each stored position, all on `table`.
fn prompt_plan(p: &Prompt, table: &[u32]) -> BatchPlan {
    let mut plan = BatchPlan {
        token_ids: p.ids.clone(),
        block_size: BLOCK_SIZE,
        ..Default::default()
    };
    let mut start = 0;
    for &pos in &p.positions {
        plan.seqs.push(SeqSlice {
            q_start: start,
            q_len: pos + 1 - start,
            ctx_len: pos + 1,
            block_table: table.to_vec(),
            wants_logits: true,
        });
        start = pos + 1;
    }
    plan.fill_positions_and_slots();
    plan
}

/// Kiln's logits at the stored positions of every prompt, on `backend`.
fn kiln_logits<B: Backend>(
    mut backend: B,
    files: &ModelFiles,
    prompts: &[Prompt],
) -> Vec<Vec<f32>> {
    let s = &files.spec;
    let max_len = prompts.iter().map(|p| p.ids.len()).max().unwrap();
    let max_seqs = prompts.iter().map(|p| p.positions.len()).max().unwrap();
    let mut model = Llama::load(&mut backend, files, max_len, max_seqs).expect("load model");
    let shape = KvShape {
        num_layers: s.n_layers,
        num_blocks: max_len.div_ceil(BLOCK_SIZE as usize) + 2,
        block_size: BLOCK_SIZE as usize,
        n_kv_heads: s.n_kv_heads,
        head_dim: s.head_dim,
    };
    let mut kv = backend.alloc_kv(&shape).expect("alloc kv");
    // Blocks in reverse order, so the table is not the identity.
    let table: Vec<u32> = (0..shape.num_blocks as u32).rev().collect();
    prompts
        .iter()
        .map(|p| {
            let plan = prompt_plan(p, &table);
            let logits = model
                .forward(&mut backend, &mut kv, &plan)
                .expect("forward");
            backend
                .to_host(logits, p.positions.len())
                .expect("download logits")
        })
        .collect()
}

fn rel_l2(got: &[f32], want: &[f32]) -> f64 {
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (g, w) in got.iter().zip(want) {
        num += (*g as f64 - *w as f64).powi(2);
        den += (*w as f64).powi(2);
    }
    (num / den).sqrt()
}

fn rms_diff(a: &[f32], b: &[f32]) -> f64 {
    let sum: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (*x as f64 - *y as f64).powi(2))
        .sum();
    (sum / a.len() as f64).sqrt()
}

fn argmax(row: &[f32]) -> usize {
    row.iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |(bi, bv), (i, &v)| {
            if v > bv { (i, v) } else { (bi, bv) }
        })
        .0
}

/// How one backend compares on one prompt.
struct Compared {
    /// Relative L2 error against transformers f32.
    err: f64,
    /// Transformers' own bf16 error against its f32.
    torch_bf16_err: f64,
    /// Positions whose argmax equals transformers f32's / bf16's.
    agree_f32: usize,
    agree_bf16: usize,
    /// Largest f32-reference logit gap between the top token and the one Kiln picked.
    worst_gap: f64,
    /// Transformers' own bf16 RMS logit error.
    torch_bf16_rms: f64,
}

fn compare(p: &Prompt, got: &[f32], vocab: usize) -> Compared {
    assert_eq!(got.len(), p.torch_f32.len(), "logits shape");
    if let Some(i) = got.iter().position(|v| !v.is_finite()) {
        panic!("logit {i} is {}", got[i]);
    }
    let mut c = Compared {
        err: rel_l2(got, &p.torch_f32),
        torch_bf16_err: rel_l2(&p.torch_bf16, &p.torch_f32),
        agree_f32: 0,
        agree_bf16: 0,
        worst_gap: 0.0,
        torch_bf16_rms: rms_diff(&p.torch_bf16, &p.torch_f32),
    };
    let rows = got
        .chunks_exact(vocab)
        .zip(p.torch_f32.chunks_exact(vocab))
        .zip(p.torch_bf16.chunks_exact(vocab));
    for ((g, f), b) in rows {
        let (pick, top) = (argmax(g), argmax(f));
        c.agree_f32 += usize::from(pick == top);
        c.agree_bf16 += usize::from(pick == argmax(b));
        c.worst_gap = c.worst_gap.max((f[top] - f[pick]) as f64);
    }
    c
}

/// Checks and prints one backend against the reference; `bf16` selects the tolerances.
/// Prints every prompt's row before failing, with every violation.
fn check(label: &str, bf16: bool, got: &[Vec<f32>], prompts: &[Prompt], vocab: usize) {
    let (mut agree_bf16, mut total, mut failures) = (0, 0, Vec::new());
    for (i, (p, g)) in prompts.iter().zip(got).enumerate() {
        let c = compare(p, g, vocab);
        let k = p.positions.len();
        eprintln!(
            "{label:<10} {i:>6} {:>4} {k:>3}  {:>16.3e}  {:>11.3e}  {:>9}/{k:<3}  {:>5}/{k:<3}  {:>9.4}",
            p.ids.len(),
            c.err,
            c.torch_bf16_err,
            c.agree_f32,
            c.agree_bf16,
            c.worst_gap
        );
        let what = format!("{label} prompt {i} (len {})", p.ids.len());
        let (tol, tie) = if bf16 {
            (
                BF16_TOL.max(BF16_OVER_TORCH * c.torch_bf16_err),
                BF16_TIE_RMS * c.torch_bf16_rms,
            )
        } else {
            (F32_TOL, F32_TIE)
        };
        if c.err >= tol {
            failures.push(format!(
                "{what}: relative error {:.3e} against transformers f32 >= {tol:.1e} \
                 (transformers bf16: {:.3e})",
                c.err, c.torch_bf16_err
            ));
        }
        if c.worst_gap > tie {
            failures.push(format!(
                "{what}: picked a token {:.4} below transformers f32's top (near-tie bound {tie:.4})",
                c.worst_gap
            ));
        }
        agree_bf16 += c.agree_bf16;
        total += k;
    }
    if bf16 && (agree_bf16 as f64) < BF16_ARGMAX_AGREE * total as f64 {
        failures.push(format!(
            "{label}: argmax agrees with transformers bf16 on only {agree_bf16}/{total} positions"
        ));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn torch_reference_logits() {
    let Some(dir) = std::env::var_os("KILN_TORCH_REF").map(PathBuf::from) else {
        eprintln!(
            "torch_reference_logits skipped: set KILN_TORCH_REF=OUTDIR \
             (scripts/torch_reference.py OUTDIR makes it)"
        );
        return;
    };
    let files = ModelFiles::open(&dir.join("model"), LoadFormat::Hf).expect("open OUTDIR/model");
    let vocab = files.spec.vocab_size;
    let (prompts, meta) = load_reference(&dir, vocab);
    let s = &files.spec;
    let text = |key: &str| meta[key].as_str().unwrap_or("?").to_string();
    eprintln!(
        "reference: transformers {} / torch {} on {} ({} attention); kiln spec: hidden {} \
         heads {}/{} x {} layers {} rope theta {} {:?}",
        text("transformers"),
        text("torch"),
        text("device_name"),
        text("attn_implementation"),
        s.hidden,
        s.n_heads,
        s.n_kv_heads,
        s.head_dim,
        s.n_layers,
        s.rope.theta,
        s.rope.layout
    );
    eprintln!(
        "backend    prompt  len pos  rel L2 vs tf f32  tf bf16 own  argmax=tf f32  =tf bf16  worst gap"
    );
    let cpu = kiln_logits(CpuBackend::new(), &files, &prompts);
    check("cpu f32", false, &cpu, &prompts, vocab);
    #[cfg(feature = "cuda")]
    {
        use kiln::backend::cuda::DType;
        if let Some(b) = crate::harness::cuda(DType::F32) {
            check(
                "cuda f32",
                false,
                &kiln_logits(b, &files, &prompts),
                &prompts,
                vocab,
            );
        }
        if let Some(b) = crate::harness::cuda(DType::Bf16) {
            check(
                "cuda bf16",
                true,
                &kiln_logits(b, &files, &prompts),
                &prompts,
                vocab,
            );
        }
    }
}
