//! Tensor parallelism on the CPU: N in-process shards (one thread each, meeting in the
//! shared-memory all-reduce and all-gather) give the logits of the unsharded model within
//! f32 tolerance, on the real fixture, a random Llama with GQA 8:1 (kv heads replicated),
//! every family fixture (biases, tied heads, q/k norms, soft-caps, windows, fused tensors,
//! bf16, MoE) and a quantized file (each shard keeps its type); a lane with
//! `tensor_parallel_size` 2 generates the same greedy tokens as one with 1; sizes that do not
//! divide the model are refused at start with the reason.

mod api_support;
mod golden_support;

use golden_support::{fixture, repo};
use kiln::backend::HostData;
use kiln::backend::cpu::CpuBackend;
use kiln::backend::quant::GgmlType;
use kiln::backend::{Backend, BatchPlan, HostGroup, KvShape, SeqSlice};
use kiln::engine::{Device, Engine, EngineConfig, GenerateRequest, StreamEvent};
use kiln::model::dummy::PooledDummy;
use kiln::model::source::DummySource;
use kiln::model::{LoadFormat, ModelError, ModelFiles, TensorSource};
use kiln::runner::tp::{Peers, ShardSource, load_shard};
use kiln::runner::{Ffn, Llama, Shard, load_weights, shard};

/// One step of a plan: `(tokens, cached before, block table, wants logits)` per sequence.
type Part<'a> = (&'a [u32], u32, &'a [u32], bool);

fn plan(parts: &[Part<'_>]) -> BatchPlan {
    let mut p = BatchPlan {
        block_size: 4,
        ..Default::default()
    };
    for &(tokens, done, table, want) in parts {
        p.seqs.push(SeqSlice {
            q_start: p.token_ids.len() as u32,
            q_len: tokens.len() as u32,
            ctx_len: done + tokens.len() as u32,
            block_table: table.to_vec(),
            wants_logits: want,
        });
        p.token_ids.extend_from_slice(tokens);
    }
    p.fill_positions_and_slots();
    p
}

/// Two sequences: an 11-token prompt in chunks of 5, 5 and 1, a 3-token prompt joining the
/// second chunk, then decode steps of both (fixed tokens, so no step depends on a tie).
fn plans(vocab: u32) -> Vec<BatchPlan> {
    let t: Vec<u32> = (0..24).map(|i| (i * 7919 + 13) % vocab).collect();
    let (a, b): (&[u32], &[u32]) = (&[9, 8, 7, 6, 5, 4], &[0, 1, 2, 3]);
    let mut out = vec![
        plan(&[(&t[..5], 0, a, false)]),
        plan(&[(&t[5..10], 5, a, false), (&t[12..15], 0, b, true)]),
        plan(&[(&t[10..11], 10, a, true), (&t[15..16], 3, b, true)]),
    ];
    for i in 0..3u32 {
        let (x, y) = (16 + 2 * i as usize, 17 + 2 * i as usize);
        out.push(plan(&[
            (&t[x..x + 1], 11 + i, a, true),
            (&t[y..y + 1], 4 + i, b, true),
        ]));
    }
    out
}

const KV_BLOCKS: usize = 10;

fn kv_shape(spec: &kiln::model::ModelSpec) -> KvShape {
    KvShape {
        num_layers: spec.n_layers,
        num_blocks: KV_BLOCKS,
        block_size: 4,
        n_kv_heads: spec.n_kv_heads,
        head_dim: spec.head_dim,
    }
}

fn logits_rows(p: &BatchPlan) -> usize {
    p.seqs.iter().filter(|s| s.wants_logits).count()
}

/// The logits of every step of `steps` on `n` shards; `n == 1` is the unsharded model
/// (`Llama::load`, the path every other test checks against references).
fn run(files: &ModelFiles, n: usize, steps: &[BatchPlan]) -> Result<Vec<Vec<f32>>, String> {
    let err = |e: &dyn std::fmt::Display| e.to_string();
    if n == 1 {
        let mut b = CpuBackend::new();
        let mut model = Llama::load(&mut b, files, 16, 4).map_err(|e| err(&e))?;
        let mut kv = b.alloc_kv(&kv_shape(&files.spec)).map_err(|e| err(&e))?;
        return steps
            .iter()
            .map(|p| {
                let logits = model.forward(&mut b, &mut kv, p).map_err(|e| err(&e))?;
                b.to_host(logits, logits_rows(p)).map_err(|e| err(&e))
            })
            .collect();
    }
    shard::check(&files.spec, n)?;
    let host = load_weights(files, Ok::<_, ModelError>).map_err(|e| err(&e))?;
    let src = ShardSource {
        spec: files.spec.clone(),
        host: std::sync::Arc::new(host),
        max_tokens: 16,
        max_seqs: 4,
        utilization: 0.9,
    };
    let group = HostGroup::new(n);
    std::thread::scope(|scope| {
        let makers = (1..n).map(|_| || Ok(CpuBackend::new())).collect();
        let peers = Peers::spawn(scope, makers, &group, &src)?;
        let member = group.members().remove(0);
        let (mut b, mut model) =
            load_shard(|| Ok(CpuBackend::new()), member, &src).map_err(|e| err(&e))?;
        peers.loaded()?;
        let shape = kv_shape(&shard::shard_spec(&files.spec, Shard { rank: 0, size: n }));
        let mut kv = b.alloc_kv(&shape).map_err(|e| err(&e))?;
        peers.alloc_kv(shape)?;
        steps
            .iter()
            .map(|p| {
                peers
                    .step(p, || model.forward(&mut b, &mut kv, p).map(|_| ()))
                    .map_err(|e| err(&e))?;
                b.to_host(model.logits(), logits_rows(p))
                    .map_err(|e| err(&e))
            })
            .collect()
    })
}

/// max |a - b| / max |b|.
fn rel_error(ours: &[f32], want: &[f32]) -> f64 {
    let scale = want.iter().fold(0.0f64, |m, &x| m.max(x.abs() as f64));
    let diff = ours
        .iter()
        .zip(want)
        .fold(0.0f64, |m, (&a, &b)| m.max((a as f64 - b as f64).abs()));
    diff / scale
}

/// Sharded `n` ways, `files` gives the unsharded logits within 1e-4 relative error.
fn check(label: &str, files: &ModelFiles, sizes: &[usize]) {
    let steps = plans(files.spec.vocab_size as u32);
    let want = run(files, 1, &steps).unwrap_or_else(|e| panic!("{label}: {e}"));
    for &n in sizes {
        let got = run(files, n, &steps).unwrap_or_else(|e| panic!("{label}, tp {n}: {e}"));
        for (step, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.len(), w.len());
            if w.is_empty() {
                continue; // a prefill chunk without logits
            }
            assert!(w.iter().any(|&x| x != 0.0) && g.iter().all(|x| x.is_finite()));
            let e = rel_error(g, w);
            assert!(e < 1e-4, "{label}, tp {n}, step {step}: rel error {e:.2e}");
        }
    }
}

fn gguf(name: &str) -> ModelFiles {
    ModelFiles::open(&fixture(name), LoadFormat::Gguf).unwrap()
}

fn arch(name: &str) -> ModelFiles {
    ModelFiles::open(&repo().join("tests/data/arch").join(name), LoadFormat::Hf).unwrap()
}

#[test]
fn stories260k_two_and_four_shards_match_one() {
    let f = gguf("stories260K.gguf");
    assert_eq!((f.spec.n_heads, f.spec.n_kv_heads), (8, 4));
    check("stories260K", &f, &[2, 4]);
}

/// Random weights (norms too) of a source without norms of its own.
struct NoisyNorms(DummySource);

impl TensorSource for NoisyNorms {
    fn fetch(&self, name: &str, shape: &[usize]) -> Result<Option<Vec<f32>>, ModelError> {
        let v = self.0.fetch(name, shape)?;
        if !name.ends_with("norm.weight") {
            return Ok(v);
        }
        let seed = name.len() as f32;
        Ok(v.map(|v| {
            v.iter()
                .enumerate()
                .map(|(i, w)| w + 0.3 * (i as f32 * 1.7 + seed).sin())
                .collect()
        }))
    }
}

/// 8 query heads over 1 kv head: every shard of 2, 4 or 8 holds a copy of the kv head.
/// The vocabulary of 250 splits unevenly (63, 63, 63, 61 for 4 shards).
fn gqa_8_to_1() -> ModelFiles {
    let mut spec = gguf("stories260K.gguf").spec;
    (spec.n_heads, spec.n_kv_heads, spec.head_dim) = (8, 1, 8);
    (
        spec.hidden,
        spec.intermediate,
        spec.n_layers,
        spec.vocab_size,
    ) = (64, 96, 2, 250);
    ModelFiles {
        name: "random-gqa-8to1".into(),
        spec,
        tokenizer: None,
        source: Box::new(NoisyNorms(DummySource { seed: 19 })),
    }
}

#[test]
fn random_llama_gqa_8_to_1_replicates_kv_heads() {
    let f = gqa_8_to_1();
    let local = shard::shard_spec(&f.spec, Shard { rank: 3, size: 4 });
    assert_eq!(
        (local.n_heads, local.n_kv_heads, local.intermediate),
        (2, 1, 24)
    );
    let host = load_weights(&f, Ok::<_, ModelError>).unwrap();
    let part = shard::shard_weights(&host, &f.spec, Shard { rank: 3, size: 4 }).unwrap();
    let l = &part.layers[0];
    assert_eq!(
        l.wqkv.shape,
        vec![(2 + 1 + 1) * 8, 64],
        "2 q heads, 1 k, 1 v"
    );
    assert_eq!(l.wo.shape, vec![64, 16]);
    assert_eq!(
        part.output().shape,
        vec![61, 64],
        "the last vocabulary part"
    );
    check("gqa 8:1", &f, &[2, 4, 8]);
}

#[test]
fn family_fixtures_match_when_sharded() {
    // (fixture, sizes): q/k/v biases and a tied head; GQA 4:1; bf16 weights; q/k norms at
    // head_dim 128; soft-caps, post-norms, windows, GeGLU; local/global layers; fused
    // qkv and gate/up tensors.
    let cases: &[(&str, &[usize])] = &[
        ("qwen2-tied", &[2, 4]),
        ("llama3-scaled", &[2, 4]),
        ("mistral-bf16", &[2]),
        ("qwen3", &[2]),
        ("gemma2", &[2]),
        ("gemma3", &[2, 4]),
        ("phi3", &[2, 4]),
        ("phi4mini", &[2]),
    ];
    for (name, sizes) in cases {
        check(name, &arch(name), sizes);
    }
}

#[test]
fn moe_fixtures_split_every_expert() {
    check("mixtral", &arch("mixtral"), &[2, 4]);
    check("qwen3moe", &arch("qwen3moe"), &[2, 4]);
    check("qwen2moe", &arch("qwen2moe"), &[2, 4]);
}

/// Q8_0 dummy weights with the experts stored one tensor per expert (`ffn_gate.E`, as older
/// GGUF files hold them) instead of llama.cpp's 3-D `ffn_gate_exps`.
struct PerExpert(PooledDummy);

impl TensorSource for PerExpert {
    fn fetch(&self, name: &str, shape: &[usize]) -> Result<Option<Vec<f32>>, ModelError> {
        match name.contains("_exps") {
            true => Ok(None),
            false => self.0.fetch(name, shape),
        }
    }

    fn fetch_host(
        &self,
        name: &str,
        shape: &[usize],
    ) -> Result<Option<kiln::backend::HostTensor>, ModelError> {
        match name.contains("_exps") {
            true => Ok(None),
            false => self.0.fetch_host(name, shape),
        }
    }
}

/// A Qwen3-MoE shape in Q8_0: 8 experts of width 64 over hidden 64, so two shards each take
/// whole 32-element blocks of every expert's down columns.
fn quantized_moe(per_expert: bool) -> ModelFiles {
    let mut spec = arch("qwen3moe").spec;
    (spec.hidden, spec.n_heads, spec.n_kv_heads, spec.head_dim) = (64, 4, 2, 16);
    spec.n_layers = 2;
    let moe = spec.variant.moe.as_mut().expect("qwen3moe has experts");
    moe.expert_ff = 64;
    let pool = PooledDummy::new(GgmlType::Q8_0).unwrap();
    ModelFiles {
        name: format!(
            "qwen3moe-q8_0{}",
            if per_expert { "-per-expert" } else { "" }
        ),
        spec,
        tokenizer: None,
        source: match per_expert {
            true => Box::new(PerExpert(pool)),
            false => Box::new(pool),
        },
    }
}

/// Quantized experts, whether stored as one 3-D tensor or one tensor per expert, and each
/// shard's rows of every expert, are one matrix of the file's type (a GPU computes experts
/// of one type in one part), and two shards give the unsharded logits.
#[test]
fn quantized_experts_stay_one_matrix_per_kind_sharded_or_not() {
    for per_expert in [false, true] {
        let f = quantized_moe(per_expert);
        let host = load_weights(&f, Ok::<_, ModelError>).unwrap();
        let part = shard::shard_weights(&host, &f.spec, Shard { rank: 1, size: 2 }).unwrap();
        for (label, w, rows) in [
            ("unsharded", &host, 8 * 64),
            ("shard 1 of 2", &part, 8 * 32),
        ] {
            let Ffn::Moe { gate, up, down, .. } = &w.layers[1].ffn else {
                panic!("{}: layer 1 has no experts", f.name);
            };
            for (kind, t, shape) in [
                ("gate", gate, [rows, 64]),
                ("up", up, [rows, 64]),
                ("down", down, [8 * 64, rows / 8]),
            ] {
                assert!(
                    matches!(
                        t.data,
                        HostData::Raw {
                            ty: GgmlType::Q8_0,
                            ..
                        }
                    ) && t.shape == shape,
                    "{} {label} {kind}: {} {:?}, expected one Q8_0 matrix {shape:?}",
                    f.name,
                    t.type_label(),
                    t.shape
                );
            }
        }
        check(&f.name, &f, &[2]);
    }
}

#[test]
fn quantized_shards_keep_the_files_types_and_refuse_partial_blocks() {
    let f = gguf("stories260K-Q8_0.gguf");
    let host = load_weights(&f, Ok::<_, ModelError>).unwrap();
    let part = shard::shard_weights(&host, &f.spec, Shard { rank: 1, size: 2 }).unwrap();
    let l = &part.layers[0];
    assert_eq!(l.wqkv.weight_type(), GgmlType::Q8_0);
    // The embedding is split by vocabulary too, and the tied head is that same part.
    let vocab = f.spec.vocab_size;
    assert_eq!(
        (part.embed.weight_type(), part.embed.shape.clone()),
        (
            GgmlType::Q8_0,
            vec![vocab - vocab.div_ceil(2), f.spec.hidden]
        )
    );
    let head = part.output.as_ref().expect("stories260K has its own head");
    assert_eq!(head.shape, part.embed.shape);
    let tied = arch("qwen2-tied");
    let tied_host = load_weights(&tied, Ok::<_, ModelError>).unwrap();
    let part = shard::shard_weights(&tied_host, &tied.spec, Shard { rank: 0, size: 2 }).unwrap();
    assert!(tied.spec.tied_embeddings && part.output.is_none());
    assert_eq!(part.embed.shape[0], tied.spec.vocab_size.div_ceil(2));
    assert_eq!(
        (l.wo.weight_type(), l.wo.shape.clone()),
        (GgmlType::Q8_0, vec![64, 32])
    );
    check("stories260K-Q8_0", &f, &[2]);
    // attn_output's 64 columns in 4 parts of 16: inside Q8_0's 32-element blocks.
    let e = shard::shard_weights(&host, &f.spec, Shard { rank: 0, size: 4 }).unwrap_err();
    let e = e.to_string();
    assert!(
        e.contains("blk.0.attn_output.weight") && e.contains("Q8_0"),
        "{e}"
    );
}

/// A shard that fails alone (its KV pool too small for the step's block) breaks the group:
/// the other shard, waiting in the all-reduce, is released with an error instead of hanging,
/// the step reports the cause, and the next step runs on the mended group and matches.
#[test]
fn a_shard_failing_alone_releases_the_others_and_the_next_step_matches() {
    let f = gguf("stories260K.gguf");
    let good = plan(&[(&[1, 45, 9], 0, &[1], true)]);
    let want = run(&f, 1, std::slice::from_ref(&good)).unwrap();
    let host = load_weights(&f, Ok::<_, ModelError>).unwrap();
    let src = ShardSource {
        spec: f.spec.clone(),
        host: std::sync::Arc::new(host),
        max_tokens: 16,
        max_seqs: 4,
        utilization: 0.9,
    };
    let shape = kv_shape(&shard::shard_spec(&f.spec, Shard { rank: 0, size: 2 }));
    let small = KvShape {
        num_blocks: 4,
        ..shape
    };
    for failing in [0, 1] {
        let group = HostGroup::new(2);
        std::thread::scope(|scope| {
            let makers = vec![|| Ok(CpuBackend::new())];
            let peers = Peers::spawn(scope, makers, &group, &src).unwrap();
            let member = group.members().remove(0);
            let (mut b, mut model) = load_shard(|| Ok(CpuBackend::new()), member, &src).unwrap();
            peers.loaded().unwrap();
            let mut kv = b
                .alloc_kv(if failing == 0 { &small } else { &shape })
                .unwrap();
            peers
                .alloc_kv(if failing == 1 { small } else { shape })
                .unwrap();
            let bad = plan(&[(&[1, 2, 3], 0, &[9], true)]);
            let e = peers
                .step(&bad, || model.forward(&mut b, &mut kv, &bad).map(|_| ()))
                .unwrap_err();
            assert!(
                e.to_string().contains("block 9 out of range"),
                "shard {failing} failing: {e}"
            );
            peers
                .step(&good, || model.forward(&mut b, &mut kv, &good).map(|_| ()))
                .unwrap();
            let got = b.to_host(model.logits(), 1).unwrap();
            assert!(rel_error(&got, &want[0]) < 1e-4);
        });
    }
}

async fn greedy(engine: &Engine, prompt: Vec<u32>, max_tokens: usize) -> Vec<u32> {
    let mut req = GenerateRequest::greedy(prompt, max_tokens);
    req.stop.ignore_eos = true;
    let mut stream = engine.client().submit(req).unwrap();
    let mut out = Vec::new();
    while let Some(ev) = stream.next_event().await {
        match ev {
            StreamEvent::Delta { tokens, .. } => out.extend(tokens.iter().map(|t| t.id)),
            StreamEvent::Error(e) => panic!("request failed: {e}"),
            _ => {}
        }
    }
    out
}

fn engine(files: ModelFiles, tp: usize) -> Result<Engine, String> {
    let cfg = EngineConfig {
        max_num_seqs: 8,
        max_num_batched_tokens: Some(64),
        tensor_parallel_size: tp,
        ..Default::default()
    };
    Engine::start(files, &[Device::Cpu], cfg).map_err(|e| e.to_string())
}

#[tokio::test]
async fn a_two_shard_lane_generates_the_same_greedy_tokens() {
    let f = gguf("stories260K.gguf");
    let tok = f.tokenizer.clone().unwrap();
    let prompts: Vec<Vec<u32>> = ["Once upon a time", "The little dog was", "Lily and Tom"]
        .iter()
        .map(|s| tok.encode(s, true).unwrap())
        .collect();
    let one = engine(gguf("stories260K.gguf"), 1).unwrap();
    let two = engine(f, 2).unwrap();
    let stats = two.client().stats();
    assert_eq!(
        stats.lanes[0].kv_total_blocks,
        one.client().stats().lanes[0].kv_total_blocks,
        "half the kv heads per shard in half the CPU budget"
    );
    let want = futures_util::future::join_all(prompts.iter().map(|p| greedy(&one, p.clone(), 24)));
    let got = futures_util::future::join_all(prompts.iter().map(|p| greedy(&two, p.clone(), 24)));
    let (want, got) = (want.await, got.await);
    assert!(want.iter().all(|w| w.len() == 24));
    assert_eq!(got, want);
}

#[test]
fn sizes_that_do_not_divide_the_model_are_refused_at_start() {
    let e = engine(gguf("stories260K.gguf"), 3)
        .err()
        .expect("8 heads over 3");
    assert!(e.contains("does not divide its 8 attention heads"), "{e}");
    let e = engine(gguf("stories260K-Q8_0.gguf"), 4)
        .err()
        .expect("Q8_0 blocks");
    assert!(e.contains("blk.0.attn_output.weight"), "{e}");
    let e = engine(gqa_8_to_1(), 16).err().expect("8 heads over 16");
    assert!(e.contains("attention heads"), "{e}");
}

/// `--tensor-parallel 2` through the serve flags and the HTTP API: a greedy completion (the
/// default sampler path, EOS stop) is `kiln generate`'s text.
#[tokio::test]
async fn serve_with_tensor_parallel_2_completes_like_kiln_generate() {
    let mut cfg = api_support::test_config();
    let cli = <ServeCli as clap::Parser>::try_parse_from(["kiln", "--tensor-parallel", "2"]);
    cfg.apply(&cli.unwrap().serve);
    cfg.validate().unwrap();
    assert_eq!(cfg.engine.tensor_parallel_size, 2);
    let s = api_support::start(cfg);
    let prompt = "Once upon a time";
    let body = serde_json::json!({"prompt": prompt, "max_tokens": 40, "temperature": 0});
    let (status, _, body) = api_support::post(&s.base, "/v1/completions", &body).await;
    assert_eq!(status, 200, "{body}");
    let text = body["choices"][0]["text"].as_str().unwrap();
    assert!(!text.is_empty());
    assert_eq!(text, api_support::greedy_reference(prompt, 40));
}

#[derive(clap::Parser)]
struct ServeCli {
    #[command(flatten)]
    serve: kiln::config::ServeArgs,
}
