//! Speed of issue 17's model families at real shapes, bf16 dummy weights (ignored: run on a GPU
//! with `--ignored bench_arch`, or `scripts/cuda_device.sh bencharch`):
//! - Qwen3-8B next to Llama-3-8B in the same run: prefill 2048, decode batch 1 (ctx 512) and
//!   32 (ctx 2048), eager and graph-replayed, with the Qwen3 / Llama time ratio.
//! - Gemma-3-12B at context 8192, decode batch 1 and 32: step time, tokens/s, the bytes a step
//!   must read (weights, and the KV its sliding-window layers actually read) and the ratio of
//!   the step time to that floor at 3.0 TB/s.
//!
//! - A mixture-of-experts GGUF file (`KILN_BENCH_GGUF`, e.g. the Qwen3-30B-A3B-shape file of
//!   `scripts/make_moe_gguf.py` that llama.cpp reads too): prefill 2048 and decode at batch
//!   1, 32 and 64 (context 576: llama-batched-bench's 512-token prompts halfway through 128
//!   generated), the per-kernel split of one eager step of each, and the floor (bytes a step
//!   reads: dense weights, the experts its tokens choose under uniform routing, KV) at 3.35 TB/s.
//!
//! `KILN_BENCH_LAYERS` caps every model's layers (quick runs). When a case's weights and KV do
//! not fit the device (Gemma batch 32 x 8192 needs ~125 GB), its layers are cut to a multiple
//! of the model's layer pattern that fits, and the line says so: the floor is for the layers
//! that ran.

#![cfg(feature = "cuda")]

use kiln::backend::Backend;
use kiln::backend::cuda::CudaBackend;
use kiln::model::gguf::GgufFile;
use kiln::model::spec::{Activation, Variant};
use kiln::model::{LoadFormat, ModelFiles, ModelSpec, RopeLayout, RopeSpec};

use crate::bench::{FastDummy, Mix, llama3_8b, weight_bytes};
use crate::harness::rig::{BenchRig, bf16_backend, by_op, plan};

/// Bandwidth the floors assume (H100 SXM HBM3, bytes per second).
const BANDWIDTH: f64 = 3.0e12;

fn rope(theta: f32, dim: usize) -> RopeSpec {
    RopeSpec {
        theta,
        dim,
        layout: RopeLayout::Half,
        llama3: None,
        freq_factors: None,
        attn_factor: 1.0,
    }
}

/// Qwen3-8B: Llama's block with per-head q/k RMSNorm, 36 layers, FFN 12288, vocab 151936.
fn qwen3_8b(layers: usize) -> ModelSpec {
    ModelSpec {
        arch: "qwen3".into(),
        hidden: 4096,
        intermediate: 12288,
        n_layers: layers,
        n_heads: 32,
        n_kv_heads: 8,
        head_dim: 128,
        vocab_size: 151936,
        max_position: 40960,
        rms_eps: 1e-6,
        rope: rope(1e6, 128),
        tied_embeddings: false,
        qkv_bias: false,
        variant: Variant {
            qk_norm: true,
            ..Variant::default()
        },
    }
}

/// Gemma-3-12B (text): head size 256, GeGLU, q/k norms, post-norms, tied embeddings, a
/// window of 1024 on five of every six layers (their own rope base).
fn gemma3_12b(layers: usize) -> ModelSpec {
    ModelSpec {
        arch: "gemma3".into(),
        hidden: 3840,
        intermediate: 15360,
        n_layers: layers,
        n_heads: 16,
        n_kv_heads: 8,
        head_dim: 256,
        vocab_size: 262144,
        max_position: 131072,
        rms_eps: 1e-6,
        rope: rope(1e6, 256),
        tied_embeddings: true,
        qkv_bias: false,
        variant: Variant {
            act: Activation::GeluTanh,
            qk_norm: true,
            post_norms: true,
            embed_scale: Some((3840f32).sqrt()),
            window: Some(1024),
            sliding: (0..layers).map(|l| (l + 1) % 6 != 0).collect(),
            rope_local: Some(rope(1e4, 256)),
            ..Variant::default()
        },
    }
}

/// Layers of every model, capped by `KILN_BENCH_LAYERS`.
fn layer_cap(full: usize) -> usize {
    std::env::var("KILN_BENCH_LAYERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(full, |c: usize| c.clamp(1, full))
}

/// The most layers (at most `full`, a multiple of `pattern`) whose weights and KV of
/// `kv_tokens` cache slots fit on `b`'s device next to the model's fixed weights.
fn fitting_layers(
    b: &CudaBackend,
    make: fn(usize) -> ModelSpec,
    full: usize,
    pattern: usize,
    kv_tokens: usize,
) -> usize {
    let fixed = weight_bytes(&make(0), Mix::Plain);
    let s1 = make(1);
    let per_layer =
        weight_bytes(&s1, Mix::Plain) - fixed + (kv_tokens * 2 * s1.kv_dim() * 2) as f64;
    // Scratch, cuBLAS and graph memory besides the weights and KV.
    let margin = 3.0e9;
    let budget = b.kv_budget_bytes(0.95).unwrap_or(0) as f64;
    let n = ((budget - fixed - margin) / per_layer).max(0.0) as usize;
    (n.min(full) / pattern * pattern).max(pattern.min(full))
}

/// One model of these benchmarks on the shared rig.
struct ArchRig {
    name: &'static str,
    rig: BenchRig,
}

/// Step times of one case: (eager, graph-replayed) seconds.
type Times = (f64, f64);

impl ArchRig {
    /// Loads `spec` with a KV pool of `num_blocks` blocks of 16 slots on backend `b`.
    fn new(name: &'static str, b: CudaBackend, spec: ModelSpec, num_blocks: usize) -> ArchRig {
        let files = ModelFiles {
            name: format!("{name}-dummy"),
            spec,
            tokenizer: None,
            source: Box::new(FastDummy(Mix::Plain)),
        };
        let rig = BenchRig::load(b, &files, num_blocks, 32);
        ArchRig { name, rig }
    }

    /// Loads a model file's weights as they are, for steps of up to `max_seqs` sequences.
    fn from_files(
        name: &'static str,
        b: CudaBackend,
        files: &ModelFiles,
        num_blocks: usize,
        max_seqs: usize,
    ) -> ArchRig {
        let rig = BenchRig::load(b, files, num_blocks, max_seqs);
        ArchRig { name, rig }
    }

    /// Median decode step times at `batch` rows of context `ctx`. Contexts up to 2048 are
    /// prefilled first; longer ones decode over unwritten cache (its values do not change
    /// a step's time, its length does).
    fn decode(&mut self, batch: usize, ctx: u32) -> Times {
        let bps = (ctx as usize + 64).div_ceil(16);
        if ctx <= 2048 {
            self.rig.fill(batch, ctx, bps);
        }
        let eager = self.rig.decode_median(batch, ctx, bps, false);
        let graph = self.rig.decode_median(batch, ctx, bps, true);
        self.rig.b.set_graphs(false);
        (eager, graph)
    }

    /// Kernel time of one 2048-token prefill step by op; prints the ops.
    fn prefill_breakdown(&mut self) {
        self.rig.b.set_graphs(false);
        let (wall, timings) = self
            .rig
            .timed_kernels(&plan(&[(2048, 2048)], 0, 2048 / 16 + 1, 16));
        let (_, line) = by_op(&timings);
        eprintln!(
            "BREAKDOWN {} prefill 2048: wall {:.3} ms, {}, {line}",
            self.name,
            wall * 1e3,
            head_line(&timings)
        );
    }

    /// Kernel time of one eager decode step by op, and the attention time (with its split-K
    /// merge) of the sliding and the global layers; prints the ops.
    fn breakdown(&mut self, label: &str, batch: usize, ctx: u32) -> (f64, f64) {
        let bps = (ctx as usize + 64).div_ceil(16);
        let seqs: Vec<(u32, u32)> = (0..batch).map(|_| (1, ctx + 21)).collect();
        self.rig.b.set_graphs(false);
        let (wall, timings) = self.rig.timed_kernels(&plan(&seqs, 0, bps, 16));
        let spec = &self.rig.model.spec;
        let (mut layer, mut attn, mut kind) = (0usize, [0.0f64; 2], 0);
        // Attention launches come in layer order, each merge right after its launch.
        for t in &timings {
            match t.kernel {
                "attention" => {
                    kind = usize::from(!spec.variant.is_sliding(layer));
                    layer += 1;
                    attn[kind] += t.seconds;
                }
                "attn_combine" => attn[kind] += t.seconds,
                _ => {}
            }
        }
        let (_, line) = by_op(&timings);
        eprintln!(
            "BREAKDOWN {} {label}: wall {:.3} ms, {}, {line}",
            self.name,
            wall * 1e3,
            head_line(&timings)
        );
        (attn[0], attn[1])
    }
}

/// The output head's time in a step's timings (the last matmul launch).
fn head_line(timings: &[kiln::backend::gpu::KernelTiming]) -> String {
    let head = timings.iter().rev().find(|t| t.kernel == "matmul");
    format!("lm_head {:.3} ms", head.map_or(0.0, |t| t.seconds * 1e3))
}

/// Bytes of K and V one decode step reads at context `ctx`: every layer its window of it.
fn kv_read_bytes(s: &ModelSpec, batch: usize, ctx: usize) -> f64 {
    (0..s.n_layers)
        .map(|l| {
            let seen = s.layer_shape(l).window.map_or(ctx, |w| w.min(ctx));
            (2 * 2 * s.kv_dim() * seen * batch) as f64
        })
        .sum()
}

/// Qwen3-8B against Llama-3-8B, same run, same cases: prefill 2048, decode batch 1 at ctx
/// 512 and batch 32 at ctx 2048. Both models stay loaded and every measurement alternates
/// between them (three rounds, the median of each model's three), so a drift of the GPU's
/// clocks over the run does not land on one model alone.
#[test]
#[ignore]
fn bench_arch_qwen3_8b_vs_llama3_8b() {
    if !kiln::backend::cuda::device_available() {
        return;
    }
    const ROUNDS: usize = 3;
    let cases = [(1usize, 512u32), (32, 2048)];
    let models: [(&'static str, ModelSpec); 2] = [
        ("llama-3-8b", llama3_8b(layer_cap(32))),
        ("qwen3-8b", qwen3_8b(layer_cap(36))),
    ];
    let blocks = 32 * (2048 + 64) / 16;
    let mut rigs: Vec<ArchRig> = models
        .iter()
        .map(|(name, spec)| ArchRig::new(name, bf16_backend(), spec.clone(), blocks))
        .collect();
    let mid = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let mut pre: [Vec<f64>; 2] = Default::default();
    for _ in 0..ROUNDS {
        for (i, rig) in rigs.iter_mut().enumerate() {
            pre[i].push(rig.rig.prefill_median());
        }
    }
    // (prefill, decode cases) per model.
    let mut results: Vec<(f64, Vec<Times>)> = Vec::new();
    for (i, rig) in rigs.iter_mut().enumerate() {
        let p = mid(pre[i].clone());
        eprintln!(
            "BENCH {} prefill 2048 layers {}: {:.1} ms (rounds {:?})",
            rig.name,
            models[i].1.n_layers,
            p * 1e3,
            pre[i]
                .iter()
                .map(|t| (t * 1e4).round() / 10.0)
                .collect::<Vec<_>>()
        );
        rig.prefill_breakdown();
        results.push((p, Vec::new()));
    }
    for &(batch, ctx) in &cases {
        let mut runs: [Vec<Times>; 2] = Default::default();
        for _ in 0..ROUNDS {
            for (i, rig) in rigs.iter_mut().enumerate() {
                runs[i].push(rig.decode(batch, ctx));
            }
        }
        for (i, rig) in rigs.iter_mut().enumerate() {
            let t = (
                mid(runs[i].iter().map(|t| t.0).collect()),
                mid(runs[i].iter().map(|t| t.1).collect()),
            );
            rig.breakdown(&format!("decode batch {batch} ctx {ctx}"), batch, ctx);
            eprintln!(
                "BENCH {} decode batch {batch} ctx {ctx} layers {}: eager {:.3} ms, graph {:.3} ms/step, {:.0} tok/s",
                rig.name,
                models[i].1.n_layers,
                t.0 * 1e3,
                t.1 * 1e3,
                batch as f64 / t.1
            );
            results[i].1.push(t);
        }
    }
    let (l, q) = (&results[0], &results[1]);
    let floors = |s: &ModelSpec, batch: usize, ctx: u32| {
        (weight_bytes(s, Mix::Plain) + kv_read_bytes(s, batch, ctx as usize)) / BANDWIDTH
    };
    eprintln!(
        "BENCH qwen3-8b vs llama-3-8b prefill 2048: {:.1} ms vs {:.1} ms (qwen3/llama {:.3}; weights {:.3})",
        q.0 * 1e3,
        l.0 * 1e3,
        q.0 / l.0,
        weight_bytes(&models[1].1, Mix::Plain) / weight_bytes(&models[0].1, Mix::Plain)
    );
    for (i, &(batch, ctx)) in cases.iter().enumerate() {
        let (lt, qt) = (l.1[i], q.1[i]);
        let (lf, qf) = (
            floors(&models[0].1, batch, ctx),
            floors(&models[1].1, batch, ctx),
        );
        eprintln!(
            "BENCH qwen3-8b vs llama-3-8b decode batch {batch} ctx {ctx}: graph {:.3} ms vs {:.3} ms \
             (qwen3/llama {:.3}; floors {:.3} vs {:.3} ms, ratio {:.3}); eager {:.3} vs {:.3} ms ({:.3})",
            qt.1 * 1e3,
            lt.1 * 1e3,
            qt.1 / lt.1,
            qf * 1e3,
            lf * 1e3,
            qf / lf,
            qt.0 * 1e3,
            lt.0 * 1e3,
            qt.0 / lt.0
        );
    }
}

/// Gemma-3-12B decode at context 8192, batch 1 and 32: time, tokens/s, bytes per step with
/// the sliding-window layers reading only their window, and the ratio to the floor.
#[test]
#[ignore]
fn bench_arch_gemma3_12b_ctx8192() {
    if !kiln::backend::cuda::device_available() {
        return;
    }
    let ctx = 8192u32;
    let full = layer_cap(48);
    for batch in [1usize, 32] {
        let bps = (ctx as usize + 64).div_ceil(16);
        let blocks = batch * bps;
        let b = bf16_backend();
        let layers = fitting_layers(&b, gemma3_12b, full, 6, blocks * 16);
        let spec = gemma3_12b(layers);
        let mut rig = ArchRig::new("gemma-3-12b", b, spec.clone(), blocks);
        let (eager, graph) = rig.decode(batch, ctx);
        let (slide, global) = rig.breakdown(&format!("decode batch {batch} ctx {ctx}"), batch, ctx);
        let w = weight_bytes(&spec, Mix::Plain);
        let kv = kv_read_bytes(&spec, batch, ctx as usize);
        let kv_full = (2 * 2 * spec.kv_dim() * ctx as usize * batch * layers) as f64;
        let floor = (w + kv) / BANDWIDTH;
        let cut = if layers < 48 {
            " (cut from 48 to fit the device)".to_string()
        } else {
            String::new()
        };
        let n_slide = (0..layers).filter(|&l| spec.variant.is_sliding(l)).count();
        eprintln!(
            "BENCH gemma-3-12b decode batch {batch} ctx {ctx} layers {layers}{cut}: eager {:.3} ms, graph {:.3} ms/step, \
             {:.0} tok/s; reads {:.2} GB/step ({:.2} GB weights + {:.3} GB KV; {:.3} GB KV without windows); \
             floor {:.3} ms at {:.1} TB/s: {:.2}x the floor ({:.0}% of it)",
            eager * 1e3,
            graph * 1e3,
            batch as f64 / graph,
            (w + kv) / 1e9,
            w / 1e9,
            kv / 1e9,
            kv_full / 1e9,
            floor * 1e3,
            BANDWIDTH / 1e12,
            graph / floor,
            100.0 * floor / graph
        );
        // KV each kind of layer reads (the window's slots on sliding layers).
        let per = |sliding: bool| {
            (0..layers)
                .filter(|&l| spec.variant.is_sliding(l) == sliding)
                .map(|l| kv_read_bytes(&gemma_one(&spec, l), batch, ctx as usize))
                .sum::<f64>()
        };
        let (kv_s, kv_g) = (per(true), per(false));
        eprintln!(
            "BENCH gemma-3-12b attention batch {batch} ctx {ctx} (eager): {n_slide} sliding layers {:.3} ms \
             ({:.1} MB KV, {:.0} GB/s), {} global layers {:.3} ms ({:.1} MB KV, {:.0} GB/s)",
            slide * 1e3,
            kv_s / 1e6,
            kv_s / slide.max(1e-12) / 1e9,
            layers - n_slide,
            global * 1e3,
            kv_g / 1e6,
            kv_g / global.max(1e-12) / 1e9
        );
    }
}

/// Layer `l` of `s` alone (for its KV bytes).
fn gemma_one(s: &ModelSpec, l: usize) -> ModelSpec {
    let mut one = s.clone();
    one.n_layers = 1;
    one.variant.sliding = vec![s.variant.is_sliding(l)];
    one
}

/// H100 SXM HBM3's bandwidth as issue 17 states the MoE floor (bytes per second).
const MOE_BANDWIDTH: f64 = 3.35e12;

/// Bytes a decode step of `batch` rows at context `ctx` must read from MoE file `g`: every
/// weight but the embedding table, of the experts only those some row chooses (expected
/// count under uniform top-`k` routing: `ne * (1 - (1 - k/ne)^batch)`), and the bf16 KV.
fn moe_step_bytes(g: &GgufFile, s: &ModelSpec, batch: usize, ctx: usize) -> f64 {
    let m = s.variant.moe.as_ref().expect("a mixture-of-experts file");
    let (mut dense, mut experts) = (0.0, 0.0);
    for t in g.tensors() {
        if t.name == "token_embd.weight" {
            continue;
        }
        if t.name.contains("_exps.") {
            experts += t.n_bytes as f64;
        } else {
            dense += t.n_bytes as f64;
        }
    }
    let ne = m.n_expert as f64;
    let hit = ne * (1.0 - (1.0 - m.top_k as f64 / ne).powi(batch as i32));
    let kv = (2 * 2 * s.n_layers * s.kv_dim() * ctx * batch) as f64;
    dense + experts * hit / ne + kv
}

/// Issue 17's MoE speed on a GGUF file (`KILN_BENCH_GGUF`; skipped when unset): prefill
/// 2048, decode at batch 1, 32 and 64 (context 576), eager and graph-replayed, with each
/// case's per-kernel split and its floor.
#[test]
#[ignore]
fn bench_arch_moe_gguf() {
    let Some(path) = std::env::var_os("KILN_BENCH_GGUF") else {
        eprintln!("KILN_BENCH_GGUF unset: bench_arch_moe_gguf skipped");
        return;
    };
    if !kiln::backend::cuda::device_available() {
        return;
    }
    let path = std::path::PathBuf::from(path);
    let files = ModelFiles::open(&path, LoadFormat::Gguf).expect("open the GGUF file");
    let g = GgufFile::open(&path).expect("read the GGUF header");
    let spec = files.spec.clone();
    let ctx = 576u32;
    let bps = (ctx as usize + 64).div_ceil(16);
    let blocks = (64 * bps).max(2048 / 16 + 1);
    let mut rig = ArchRig::from_files("moe", bf16_backend(), &files, blocks, 64);
    for (k, regs, local, shared) in rig.rig.b.kernel_resources() {
        let name = format!("{k:?}");
        let q = name.contains("Q4K") || name.contains("Q6K");
        if name.starts_with("Moe") && (q || !name.contains('{')) {
            eprintln!("RESOURCES {name}: {regs} regs, {local} B local, {shared} B shared");
        }
    }
    // KILN_BENCH_CASES picks cases: e.g. "prefill,1,32" (default: all).
    let only = std::env::var("KILN_BENCH_CASES").ok();
    let on = |c: &str| only.as_deref().is_none_or(|o| o.split(',').any(|x| x == c));
    if on("prefill") {
        let pre = rig.rig.prefill_median();
        let p = plan(&[(2048, 2048)], 0, 2048 / 16 + 1, 16);
        rig.rig.b.set_graphs(false);
        let (wall, timings) = rig.rig.timed_kernels(&p);
        let (_, line) = by_op(&timings);
        eprintln!(
            "BREAKDOWN moe prefill 2048: wall {:.3} ms, {line}",
            wall * 1e3
        );
        eprintln!(
            "BENCH moe prefill 2048 layers {}: {:.1} ms ({:.0} tok/s)",
            spec.n_layers,
            pre * 1e3,
            2048.0 / pre
        );
    }
    for batch in [1usize, 32, 64] {
        if !on(&batch.to_string()) {
            continue;
        }
        let (eager, graph) = rig.decode(batch, ctx);
        rig.breakdown(&format!("decode batch {batch} ctx {ctx}"), batch, ctx);
        let bytes = moe_step_bytes(&g, &spec, batch, ctx as usize);
        let floor = bytes / MOE_BANDWIDTH;
        eprintln!(
            "BENCH moe decode batch {batch} ctx {ctx} layers {}: eager {:.3} ms, graph {:.3} ms/step, \
             {:.0} tok/s; reads {:.3} GB/step, floor {:.3} ms at {:.2} TB/s ({:.0} tok/s): {:.0}% of it",
            spec.n_layers,
            eager * 1e3,
            graph * 1e3,
            batch as f64 / graph,
            bytes / 1e9,
            floor * 1e3,
            MOE_BANDWIDTH / 1e12,
            batch as f64 / floor,
            100.0 * floor / graph
        );
    }
}
