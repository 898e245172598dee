//! Speed at a real shape (ignored: run on a GPU with `--ignored bench_`). Dummy weights in the
//! Llama-3-8B shape, bf16, or (`bench_llama3_8b_quant`) random quantized blocks laid out as a
//! Q4_K_M file (Q4_K, with Q6_K for attn_v, ffn_down and the output head) or all Q8_0;
//! prints median step times next to the bandwidth floor.
//! Layers default to 32 and can be cut with `KILN_BENCH_LAYERS` (the floor scales with them).

#![cfg(feature = "cuda")]

use kiln::backend::quant::GgmlType;
use kiln::backend::{BatchPlan, HostTensor};
use kiln::model::dummy::random_elements;
use kiln::model::spec::Llama3Scaling;
use kiln::model::{ModelError, ModelFiles, ModelSpec, RopeLayout, RopeSpec, TensorSource};
use rayon::prelude::*;

use crate::harness::rig::{BenchRig, bf16_backend, by_op, plan};

/// Weight types of a benchmark model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mix {
    /// f32 values uploaded as the backend's bf16.
    Plain,
    /// Q4_K, with Q6_K for attn_v, ffn_down and the output head (llama.cpp's Q4_K_M).
    Q4KM,
    /// Every matrix Q8_0.
    Q8_0,
}

impl Mix {
    /// The type of matrix `name` (`None`: plain f32 values).
    fn ty(self, name: &str) -> Option<GgmlType> {
        match self {
            Mix::Plain => None,
            Mix::Q8_0 => Some(GgmlType::Q8_0),
            Mix::Q4KM if name.contains("attn_v") || name.contains("ffn_down") => {
                Some(GgmlType::Q6K)
            }
            Mix::Q4KM if name.starts_with("output.") => Some(GgmlType::Q6K),
            Mix::Q4KM => Some(GgmlType::Q4K),
        }
    }

    /// Bytes per weight of `name`.
    fn bytes_per_weight(self, name: &str) -> f64 {
        self.ty(name).map_or(2.0, |t| {
            t.block_bytes().unwrap_or(0) as f64 / t.block_size().unwrap_or(1) as f64
        })
    }
}

/// Random weights, generated in parallel (speed does not depend on the values).
pub(crate) struct FastDummy(pub(crate) Mix);

fn salt_of(name: &str) -> u64 {
    name.bytes().fold(0x9e37_79b9_7f4a_7c15u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

impl TensorSource for FastDummy {
    fn fetch_host(&self, name: &str, shape: &[usize]) -> Result<Option<HostTensor>, ModelError> {
        match (self.0.ty(name), shape) {
            (Some(ty), &[rows, cols]) => {
                let len = ty.byte_size((rows * cols) as u64)? as usize;
                let bytes = random_elements(ty, len, salt_of(name));
                let t = HostTensor::raw(shape.to_vec(), ty, bytes)
                    .map_err(|e| ModelError::Shape(e.to_string()))?;
                Ok(Some(t))
            }
            _ => Ok(self
                .fetch(name, shape)?
                .map(|v| HostTensor::new(shape.to_vec(), v))),
        }
    }

    fn fetch(&self, name: &str, shape: &[usize]) -> Result<Option<Vec<f32>>, ModelError> {
        let n: usize = shape.iter().product();
        if name.ends_with("norm.weight") {
            return Ok(Some(vec![1.0; n]));
        }
        if name.ends_with(".bias") {
            return Ok(None);
        }
        let a = 1.0 / (*shape.last().unwrap_or(&1) as f32).sqrt();
        let salt = salt_of(name);
        let mut v = vec![0.0f32; n];
        v.par_chunks_mut(1 << 16)
            .enumerate()
            .for_each(|(c, chunk)| {
                let mut x = salt ^ ((c as u64 + 1).wrapping_mul(0xd1b5_4a32_d192_ed03));
                for o in chunk {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    *o = ((x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * a;
                }
            });
        Ok(Some(v))
    }
}

pub(crate) fn llama3_8b(layers: usize) -> ModelSpec {
    ModelSpec {
        arch: "llama".into(),
        hidden: 4096,
        intermediate: 14336,
        n_layers: layers,
        n_heads: 32,
        n_kv_heads: 8,
        head_dim: 128,
        vocab_size: 128256,
        max_position: 8192,
        rms_eps: 1e-5,
        rope: RopeSpec {
            theta: 500000.0,
            dim: 128,
            layout: RopeLayout::Half,
            llama3: Some(Llama3Scaling {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position: 8192.0,
            }),
            freq_factors: None,
            attn_factor: 1.0,
        },
        tied_embeddings: false,
        qkv_bias: false,
        variant: Default::default(),
    }
}

/// The Llama-3-8B benchmark: the shared rig and the weight types it was loaded with.
struct Rig {
    mix: Mix,
    rig: BenchRig,
}

impl Rig {
    fn new(num_blocks: usize, max_seqs: usize, mix: Mix) -> Rig {
        let layers = std::env::var("KILN_BENCH_LAYERS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(32);
        let mut spec = llama3_8b(layers);
        if mix != Mix::Plain {
            // Quantized weights come in GGUF files, whose Llama q/k rows rope adjacent pairs.
            spec.rope.layout = RopeLayout::Interleaved;
        }
        let files = ModelFiles {
            name: format!("llama-3-8b-dummy ({mix:?})"),
            spec,
            tokenizer: None,
            source: Box::new(FastDummy(mix)),
        };
        let rig = BenchRig::load(bf16_backend(), &files, num_blocks, max_seqs);
        Rig { mix, rig }
    }

    fn decode(&mut self, batch: usize, ctx: u32) {
        let bps = (ctx as usize + 64).div_ceil(16);
        // Contexts beyond one prefill step stay unfilled: the cache's contents do not change
        // the time of a decode step, only its length does.
        if ctx <= 2048 {
            self.rig.fill(batch, ctx, bps);
        }
        let spec = self.rig.model.spec.clone();
        let kv_bytes =
            2.0 * 2.0 * (spec.n_layers * spec.kv_dim()) as f64 * batch as f64 * ctx as f64;
        let floor = (weight_bytes(&spec, self.mix) + kv_bytes) / 3.0e12;
        for graphs in [false, true] {
            let t = self.rig.decode_median(batch, ctx, bps, graphs);
            let mode = if graphs { "graph" } else { "eager" };
            let seqs: Vec<(u32, u32)> = (0..batch).map(|_| (1, ctx + 21)).collect();
            let attn = self.breakdown(
                &format!("decode batch {batch} ctx {ctx} {mode}"),
                &plan(&seqs, 0, bps, 16),
            );
            eprintln!(
                "BENCH {:?} decode batch {batch} ctx {ctx} layers {} {mode}: {:.3} ms/step, {:.0} tok/s; bandwidth floor {:.3} ms ({:.0}% of floor)",
                self.mix,
                spec.n_layers,
                t * 1e3,
                batch as f64 / t,
                floor * 1e3,
                100.0 * floor / t
            );
            if let Some(a) = attn {
                eprintln!(
                    "BENCH attention batch {batch} ctx {ctx}: {:.3} ms for {} layers, {:.0} GB/s of KV read",
                    a * 1e3,
                    spec.n_layers,
                    kv_bytes / a / 1e9
                );
            }
        }
    }

    fn prefill(&mut self) {
        let t = self.rig.prefill_median();
        let p = plan(&[(2048, 2048)], 0, 2048 / 16 + 1, 16);
        let _ = self.breakdown("prefill 2048", &p);
        let s = &self.rig.model.spec;
        let floor = 2.0 * weight_bytes(s, Mix::Plain) / 2.0 * 2048.0 / 800e12;
        eprintln!(
            "BENCH {:?} prefill 2048 layers {}: {:.1} ms; GEMM floor {:.1} ms ({:.0}% of floor)",
            self.mix,
            s.n_layers,
            t * 1e3,
            floor * 1e3,
            100.0 * floor / t
        );
    }

    /// Times each kernel of one step of `p` with device events and prints the totals by op;
    /// returns the attention time (with its split-K merge), when the step ran eagerly.
    fn breakdown(&mut self, label: &str, p: &BatchPlan) -> Option<f64> {
        let (wall, timings) = self.rig.timed_kernels(p);
        let (ops, line) = by_op(&timings);
        eprintln!("BREAKDOWN {label}: wall {:.3} ms, {line}", wall * 1e3);
        ops.get("attention")
            .map(|a| a.1 + ops.get("attn_combine").map_or(0.0, |c| c.1))
    }
}

/// Weight bytes a decode step reads (every layer matrix and the output head).
pub(crate) fn weight_bytes(s: &ModelSpec, mix: Mix) -> f64 {
    let b = |name: &str, n: usize| mix.bytes_per_weight(name) * n as f64;
    let (h, kv) = (s.hidden, s.kv_dim());
    let per_layer = b("attn_q", s.q_dim() * h)
        + b("attn_k", kv * h)
        + b("attn_v", kv * h)
        + b("attn_output", h * s.q_dim())
        + b("ffn_gate", 2 * s.intermediate * h)
        + b("ffn_down", s.intermediate * h);
    s.n_layers as f64 * per_layer + b("output.weight", s.vocab_size * h)
}

/// Prefill of 2048 tokens, then decode at batch 1 (ctx 512), 32 and 64 (ctx 2048), 256
/// (ctx 512) and 64 (ctx 4096: the attention kernel's bandwidth), each eager and graph-replayed.
#[test]
#[ignore]
fn bench_llama3_8b_shape() {
    // (Batches 16 and 128 at ctx 2048 run only when KILN_BENCH_CASES names them.)
    let mut rig = Rig::new(128 * (2048 + 64) / 16 + 64, 256, Mix::Plain);
    for (k, regs, local, shared) in rig.rig.b.kernel_resources() {
        eprintln!("RESOURCES {k:?}: {regs} regs, {local} B local, {shared} B shared");
    }
    // KILN_BENCH_CASES picks cases (for profilers): e.g. "prefill,256x512".
    let only = std::env::var("KILN_BENCH_CASES").ok();
    let on = |c: &str| only.as_deref().is_none_or(|o| o.split(',').any(|x| x == c));
    if on("prefill") {
        rig.prefill();
    }
    for (batch, ctx) in [
        (1, 512),
        (16, 2048),
        (32, 2048),
        (64, 2048),
        (128, 2048),
        (256, 512),
        (64, 4096),
    ] {
        let named = only
            .as_deref()
            .is_some_and(|o| o.split(',').any(|x| x == format!("{batch}x{ctx}")));
        if on(&format!("{batch}x{ctx}")) && (named || ![16, 128].contains(&batch)) {
            rig.decode(batch, ctx);
        }
    }
}

/// Quantized weights (`KILN_BENCH_MIX`: `q4_k_m`, `q8_0` or both, the default): prefill of
/// 2048 tokens, decode at batch 1 (ctx 512), 32 and 64 (ctx 2048); batches 16 and 128 (ctx
/// 2048) when `KILN_BENCH_CASES` names them. `KILN_QMMA8=0` keeps the batches (9-256 rows)
/// on the bf16 tiles instead of the 8-bit ones (run the binary twice to compare).
#[test]
#[ignore]
fn bench_llama3_8b_quant() {
    let mixes = std::env::var("KILN_BENCH_MIX").unwrap_or_else(|_| "q4_k_m,q8_0".into());
    let only = std::env::var("KILN_BENCH_CASES").ok();
    let on = |c: &str| only.as_deref().is_none_or(|o| o.split(',').any(|x| x == c));
    for m in mixes.split(',') {
        let mix = match m {
            "q4_k_m" => Mix::Q4KM,
            "q8_0" => Mix::Q8_0,
            other => panic!("KILN_BENCH_MIX: unknown mix {other}"),
        };
        let big = only
            .as_deref()
            .is_some_and(|o| o.split(',').any(|x| x == "128x2048"));
        let seqs = if big { 128 } else { 64 };
        let mut rig = Rig::new(seqs * (2048 + 64) / 16 + 64, seqs, mix);
        for (k, regs, local, shared) in rig.rig.b.kernel_resources() {
            let name = format!("{k:?}");
            if ["Qdot", "QuantizeX", "Qgemv", "Qmma"]
                .iter()
                .any(|p| name.starts_with(p))
            {
                eprintln!("RESOURCES {name}: {regs} regs, {local} B local, {shared} B shared");
            }
        }
        if on("prefill") {
            rig.prefill();
        }
        for (batch, ctx) in [(1, 512), (16, 2048), (32, 2048), (64, 2048), (128, 2048)] {
            let named = only
                .as_deref()
                .is_some_and(|o| o.split(',').any(|x| x == format!("{batch}x{ctx}")));
            if on(&format!("{batch}x{ctx}")) && (named || ![16, 128].contains(&batch)) {
                rig.decode(batch, ctx);
            }
        }
    }
}

/// The seven matmuls of one Llama-3-8B layer (q, k, v, o, gate, up, down as separate
/// weights) at the row counts of `KILN_BENCH_ROWS` (default 9,16,32,64,128), for bf16 weights
/// (the BLAS GEMM) and the Q4_K_M and Q8_0 types: time per call (back-to-back calls, wall
/// clock), per matrix and per layer. The quick loop for the batch kernels.
#[test]
#[ignore]
fn bench_quant_layer_matmuls() {
    use crate::harness::{random, rng, tensor};
    use kiln::backend::Backend;
    let rows: Vec<usize> = std::env::var("KILN_BENCH_ROWS")
        .unwrap_or_else(|_| "9,16,32,64,128".into())
        .split(',')
        .map(|s| s.parse().expect("KILN_BENCH_ROWS"))
        .collect();
    let mixes = std::env::var("KILN_BENCH_MIX").unwrap_or_else(|_| "bf16,q4_k_m,q8_0".into());
    let shapes = [
        ("attn_q", 4096, 4096),
        ("attn_k", 1024, 4096),
        ("attn_v", 1024, 4096),
        ("attn_output", 4096, 4096),
        ("ffn_gate", 14336, 4096),
        ("ffn_up", 14336, 4096),
        ("ffn_down", 4096, 14336),
    ];
    let mut b = bf16_backend();
    let mut rng = rng("bench_quant_layer_matmuls");
    for m in mixes.split(',') {
        let mix = match m {
            "bf16" => Mix::Plain,
            "q4_k_m" => Mix::Q4KM,
            "q8_0" => Mix::Q8_0,
            other => panic!("KILN_BENCH_MIX: unknown mix {other}"),
        };
        let src = FastDummy(mix);
        let weights: Vec<_> = shapes
            .iter()
            .map(|&(name, m, k)| {
                let name = format!("blk.0.{name}.weight");
                let t = src.fetch_host(&name, &[m, k]).unwrap().unwrap();
                b.upload_weight(t).expect("upload")
            })
            .collect();
        for &n in &rows {
            let mut io: Vec<_> = shapes
                .iter()
                .map(|&(_, m, k)| {
                    let x = tensor(&mut b, n, k, &random(&mut rng, n * k, 1.0));
                    (x, b.alloc(n, m).expect("alloc"))
                })
                .collect();
            let mut time =
                |which: &[usize], reps: usize| pass_time(&mut b, &weights, &mut io, which, n, reps);
            // The layer's matrices in turn (more than L2 holds), then each alone (L2-warm).
            let layer = time(&[0, 1, 2, 3, 4, 5, 6], 10);
            let mut line = String::new();
            for (i, &(name, ..)) in shapes.iter().enumerate() {
                line.push_str(&format!(" {name} {:.1}us", time(&[i], 30) * 1e6));
            }
            eprintln!(
                "LAYER {m} rows {n}: {:.1} us per layer ({:.3} ms for 32 layers); alone:{line}",
                layer * 1e6,
                layer * 32e3
            );
        }
    }
}

/// Wall time of one pass of the matmuls `which` (`weights[i]` times `io[i].0` into
/// `io[i].1`, `n` rows), over `reps` passes back to back (the launches run ahead of the
/// device), synchronized by one-row downloads; median of 5.
fn pass_time<B: kiln::backend::Backend>(
    b: &mut B,
    weights: &[B::Weight],
    io: &mut [(B::Tensor, B::Tensor)],
    which: &[usize],
    n: usize,
    reps: usize,
) -> f64 {
    let pass = |b: &mut B, io: &mut [(B::Tensor, B::Tensor)]| {
        for &i in which {
            let (x, out) = &mut io[i];
            b.matmul(x, &weights[i], None, n, out).expect("matmul");
        }
    };
    pass(b, io);
    b.to_host(&io[0].1, 1).expect("download");
    let times = (0..5)
        .map(|_| {
            let t = std::time::Instant::now();
            for _ in 0..reps {
                pass(b, io);
            }
            b.to_host(&io[0].1, 1).expect("download");
            t.elapsed().as_secs_f64() / reps as f64
        })
        .collect();
    crate::harness::rig::median(times)
}
