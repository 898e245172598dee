//! The continuous-batching engine against the single-sequence reference: greedy output of
//! every request is the same alone, in a batch of 32, under KV oversubscription (with
//! preemptions), with prefix-cache hits, and across one or two lanes.

use std::sync::Arc;

use futures_util::future::join_all;
use kiln::backend::cpu::CpuBackend;
use kiln::engine::{
    Device, Engine, EngineConfig, EngineError, FinishReason, GenerateRequest, StopCriteria,
    StreamEvent,
};
use kiln::generate::{GenerateOptions, SingleGenerator};
use kiln::model::{LoadFormat, ModelFiles};
use kiln::sampling::SamplingParams;
use kiln::tokenizer::Tokenizer;

fn files() -> ModelFiles {
    ModelFiles::open(&kiln::config::default_model_path(), LoadFormat::Gguf).unwrap()
}

const SENTENCES: &[&str] = &[
    "Once upon a time",
    "The little dog was very happy because",
    "Lily and Tom went to the park. They saw a big",
    "One day, a girl named Sue found a shiny red ball in the garden. She",
    "Tim liked to eat apples.",
    "The sun was hot and the sky was blue. The birds sang in the trees and the cat slept under the table. Then",
    "Mom said",
    "Ben had a toy car. He",
];

/// 32 prompts of mixed lengths, some sharing long prefixes.
fn prompts(tok: &Tokenizer) -> Vec<Vec<u32>> {
    (0..32)
        .map(|i| {
            let mut text = SENTENCES[i % SENTENCES.len()].to_string();
            if i >= 16 {
                text = format!("{} {}", SENTENCES[5], SENTENCES[i % 4]);
            }
            tok.encode(&text, true).unwrap()
        })
        .collect()
}

fn reference(files: &ModelFiles, prompts: &[Vec<u32>], max_tokens: usize) -> Vec<Vec<u32>> {
    let mut g = SingleGenerator::new(CpuBackend::new(), files, 512, 64, 16).unwrap();
    prompts
        .iter()
        .map(|p| {
            let opts = GenerateOptions {
                max_tokens,
                params: SamplingParams::greedy(),
                stop_ids: vec![],
                chunk: 64,
                block_size: 16,
                record_logits: 0,
            };
            g.generate(p, &opts, |_| {}).unwrap().token_ids
        })
        .collect()
}

struct Outcome {
    tokens: Vec<Vec<u32>>,
    text: Vec<String>,
    finish: Vec<FinishReason>,
}

async fn run(client: &kiln::engine::EngineClient, req: GenerateRequest) -> Outcome {
    let n = req.n;
    let mut o = Outcome {
        tokens: vec![vec![]; n],
        text: vec![String::new(); n],
        finish: vec![FinishReason::Abort; n],
    };
    let mut stream = client.submit(req).unwrap();
    let mut done = false;
    while let Some(ev) = stream.next_event().await {
        match ev {
            StreamEvent::Delta {
                choice,
                text,
                tokens,
            } => {
                o.text[choice].push_str(&text);
                o.tokens[choice].extend(tokens.iter().map(|t| t.id));
            }
            StreamEvent::Finish { choice, reason } => o.finish[choice] = reason,
            StreamEvent::PromptLogprobs { .. } => {}
            StreamEvent::Done { usage, .. } => {
                assert_eq!(
                    usage.completion_tokens,
                    o.tokens.iter().map(|t| t.len()).sum::<usize>()
                );
                done = true;
            }
            StreamEvent::Error(e) => panic!("request failed: {e}"),
        }
    }
    assert!(done, "stream ended without Done");
    o
}

fn ignore_eos(prompt: Vec<u32>, max_tokens: usize) -> GenerateRequest {
    let mut r = GenerateRequest::greedy(prompt, max_tokens);
    r.stop.ignore_eos = true;
    r
}

async fn batch_matches_reference(
    cfg: EngineConfig,
    devices: &[Device],
) -> kiln::engine::EngineStats {
    let f = files();
    let ps = prompts(f.tokenizer.as_ref().unwrap());
    these_match_reference(f, &ps, 24, cfg, devices).await
}

/// Every prompt of `ps` at once (greedy, `max_tokens` each, EOS ignored) gives the
/// single-sequence reference's tokens; returns the stats once the engine is idle.
async fn these_match_reference(
    f: ModelFiles,
    ps: &[Vec<u32>],
    max_tokens: usize,
    cfg: EngineConfig,
    devices: &[Device],
) -> kiln::engine::EngineStats {
    let want = reference(&f, ps, max_tokens);
    let engine = Engine::start(f, devices, cfg).unwrap();
    let client = engine.client();
    let outs = join_all(
        ps.iter()
            .map(|p| run(&client, ignore_eos(p.clone(), max_tokens))),
    )
    .await;
    for (i, (o, w)) in outs.iter().zip(&want).enumerate() {
        assert_eq!(
            &o.tokens[0], w,
            "request {i} differs from the single-sequence reference"
        );
        assert_eq!(o.finish[0], FinishReason::Length);
    }
    wait_idle(&client).await
}

/// Waits (bounded) until every lane has published an idle state with all blocks free.
async fn wait_idle(client: &kiln::engine::EngineClient) -> kiln::engine::EngineStats {
    for _ in 0..400 {
        let s = client.stats();
        if s.lanes
            .iter()
            .all(|l| l.kv_free_blocks == l.kv_total_blocks && l.running + l.waiting == 0)
        {
            return s;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    panic!("blocks leaked or requests stuck: {:?}", client.stats());
}

#[tokio::test]
async fn batch_of_32_matches_single_sequence_reference() {
    let cfg = EngineConfig {
        max_num_seqs: 32,
        max_num_batched_tokens: Some(96),
        ..Default::default()
    };
    let stats = batch_matches_reference(cfg, &[Device::Cpu]).await;
    assert_eq!(stats.preemptions(), 0);
    assert!(
        stats.prefix_cache_hits() > 0,
        "shared prefixes should hit the cache"
    );
}

#[tokio::test]
async fn oversubscribed_kv_preempts_and_still_matches() {
    // 32 requests of up to ~60 tokens need ~100 blocks of 16; give a quarter of that.
    let cfg = EngineConfig {
        max_num_seqs: 32,
        kv_blocks: Some(24),
        ..Default::default()
    };
    let stats = batch_matches_reference(cfg, &[Device::Cpu]).await;
    assert!(stats.preemptions() > 0, "4x oversubscription must preempt");
}

#[tokio::test]
async fn two_lanes_match_and_share_the_load() {
    let cfg = EngineConfig {
        max_num_seqs: 8,
        ..Default::default()
    };
    let stats = batch_matches_reference(cfg, &[Device::Cpu, Device::Cpu]).await;
    assert_eq!(stats.lanes.len(), 2);
    assert!(
        stats.lanes.iter().all(|l| l.steps > 0),
        "both lanes must have run steps"
    );
}

#[tokio::test]
async fn no_prefix_caching_matches_too() {
    let cfg = EngineConfig {
        enable_prefix_caching: false,
        max_num_batched_tokens: Some(40),
        ..Default::default()
    };
    let stats = batch_matches_reference(cfg, &[Device::Cpu]).await;
    assert_eq!(stats.prefix_cache_hits(), 0);
}

fn engine(cfg: EngineConfig) -> (Engine, Arc<Tokenizer>) {
    let f = files();
    let tok = Arc::new(f.tokenizer.clone().unwrap());
    (Engine::start(f, &[Device::Cpu], cfg).unwrap(), tok)
}

#[tokio::test]
async fn stop_strings_spanning_tokens_are_cut_and_never_leaked() {
    let (engine, tok) = engine(EngineConfig::default());
    let client = engine.client();
    let prompt = tok.encode("Once upon a time", true).unwrap();
    let full = run(&client, ignore_eos(prompt.clone(), 48)).await.text[0].clone();
    // Pick a stop string that spans several tokens in the middle of the text.
    let at = full
        .find("named")
        .expect("the fixture's story names a girl");
    let stop = full[at..at + 9].to_string();
    let mut req = ignore_eos(prompt.clone(), 48);
    req.stop = StopCriteria {
        strings: vec![stop.clone(), "zzzz".into()],
        ..req.stop
    };
    let o = run(&client, req).await;
    assert_eq!(o.text[0], full[..at]);
    assert_eq!(o.finish[0], FinishReason::Stop);
    // Streaming deltas never contained any part of the stop string past the cut point.
    let mut req = ignore_eos(prompt, 48);
    req.stop.strings = vec![stop];
    let mut stream = client.submit(req).unwrap();
    let mut seen = String::new();
    while let Some(ev) = stream.next_event().await {
        if let StreamEvent::Delta { text, .. } = ev {
            seen.push_str(&text);
            assert!(
                full[..at].starts_with(&seen),
                "leaked held-back text: {seen:?}"
            );
        }
    }
    assert_eq!(seen, full[..at]);
}

#[tokio::test]
async fn eos_and_stop_token_ids_finish_with_stop() {
    let (engine, tok) = engine(EngineConfig::default());
    let client = engine.client();
    let prompt = tok.encode("Once upon a time", true).unwrap();
    let free = run(&client, ignore_eos(prompt.clone(), 20)).await;
    let mut req = ignore_eos(prompt, 20);
    req.stop.token_ids = vec![free.tokens[0][5]];
    let o = run(&client, req).await;
    assert_eq!(o.finish[0], FinishReason::Stop);
    assert_eq!(o.tokens[0], free.tokens[0][..6]);
}

#[tokio::test]
async fn n_choices_share_the_prompt_and_seeds_reproduce() {
    let (engine, tok) = engine(EngineConfig::default());
    let client = engine.client();
    let prompt = tok
        .encode(&format!("{} {}", SENTENCES[5], SENTENCES[3]), true)
        .unwrap();
    let mut req = ignore_eos(prompt.clone(), 16);
    req.n = 3;
    req.params = SamplingParams {
        temperature: 1.0,
        seed: Some(42),
        ..Default::default()
    };
    let before = client.stats().prefix_cache_hits();
    let a = run(&client, req.clone()).await;
    let hits = client.stats().prefix_cache_hits() - before;
    assert!(
        hits >= 2 * (prompt.len() as u64 / 16) * 16,
        "choices 1 and 2 reuse the prompt blocks ({hits})"
    );
    let b = run(&client, req).await;
    assert_eq!(a.tokens, b.tokens, "same seed, same output");
    assert_ne!(a.tokens[0], a.tokens[1], "choices draw different samples");
    assert!(a.finish.iter().all(|f| *f == FinishReason::Length));
}

#[tokio::test]
async fn seeded_sampling_is_independent_of_batching() {
    let (engine, tok) = engine(EngineConfig::default());
    let client = engine.client();
    let mk = |s: &str| {
        let mut r = ignore_eos(tok.encode(s, true).unwrap(), 20);
        r.params = SamplingParams {
            temperature: 0.8,
            top_p: 0.9,
            seed: Some(7),
            logprobs: Some(2),
            ..Default::default()
        };
        r
    };
    let alone = run(&client, mk(SENTENCES[0])).await;
    let batch = join_all(SENTENCES.iter().map(|s| run(&client, mk(s)))).await;
    assert_eq!(alone.tokens, batch[0].tokens);
}

#[tokio::test]
async fn dropping_a_stream_frees_its_blocks() {
    let (engine, tok) = engine(EngineConfig::default());
    let client = engine.client();
    let mut stream = client
        .submit(ignore_eos(tok.encode(SENTENCES[5], true).unwrap(), 400))
        .unwrap();
    let mut got = 0;
    while got < 3 {
        if let Some(StreamEvent::Delta { tokens, .. }) = stream.next_event().await {
            got += tokens.len();
        }
    }
    assert!(client.stats().kv_usage() > 0.0);
    drop(stream);
    wait_idle(&client).await;
}

#[tokio::test]
async fn bad_requests_are_rejected_before_queueing() {
    let (engine, tok) = engine(EngineConfig {
        max_model_len: Some(64),
        ..Default::default()
    });
    let client = engine.client();
    let p = tok.encode(SENTENCES[0], true).unwrap();
    let too_long = client
        .submit(GenerateRequest::greedy(p.clone(), 100))
        .err()
        .unwrap();
    assert!(
        matches!(
            too_long,
            EngineError::ContextLength {
                param: "max_tokens",
                ..
            }
        ),
        "{too_long}"
    );
    assert!(
        too_long
            .to_string()
            .contains("maximum context length is 64")
    );
    let bad_id = client
        .submit(GenerateRequest::greedy(vec![1, 100000], 4))
        .err()
        .unwrap();
    assert!(matches!(
        bad_id,
        EngineError::InvalidRequest {
            param: Some("prompt"),
            ..
        }
    ));
    let empty = client
        .submit(GenerateRequest::greedy(vec![], 4))
        .err()
        .unwrap();
    assert!(matches!(empty, EngineError::InvalidRequest { .. }));
}

#[tokio::test]
async fn full_waiting_queue_is_overloaded() {
    let (engine, tok) = engine(EngineConfig {
        max_waiting: 2,
        max_num_seqs: 1,
        ..Default::default()
    });
    let client = engine.client();
    let p = tok.encode(SENTENCES[5], true).unwrap();
    let mut streams = Vec::new();
    let mut overloaded = false;
    for _ in 0..50 {
        match client.submit(ignore_eos(p.clone(), 400)) {
            Ok(s) => streams.push(s),
            Err(EngineError::Overloaded { .. }) => {
                overloaded = true;
                break;
            }
            Err(e) => panic!("{e}"),
        }
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    assert!(overloaded, "a bounded queue must refuse work");
}

/// Phi-3's fixture slides every layer within 48 tokens. Six sequences reach 160 tokens in a
/// pool of 32 blocks of 16 (they would need 60 if every block stayed): the blocks behind
/// each window are freed as it advances, so nothing is preempted, every block comes back,
/// and the tokens are the single-sequence reference's.
#[tokio::test]
async fn blocks_behind_a_models_sliding_window_are_freed_and_output_matches() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/arch/phi3");
    let f = ModelFiles::open(&dir, LoadFormat::Hf).unwrap();
    assert_eq!(f.spec.variant.kv_window(f.spec.n_layers), Some(48));
    let vocab = f.spec.vocab_size;
    let ps: Vec<Vec<u32>> = (0..6)
        .map(|i| {
            (0..40)
                .map(|t| ((t * 7 + i * 13 + 3) % vocab) as u32)
                .collect()
        })
        .collect();
    let cfg = EngineConfig {
        max_num_seqs: 6,
        kv_blocks: Some(32),
        ..Default::default()
    };
    let stats = these_match_reference(f, &ps, 120, cfg, &[Device::Cpu]).await;
    assert_eq!(stats.preemptions(), 0, "freed blocks make room for all six");
}

/// `kiln serve`'s start: the tokenizer builds on its own thread while the lanes load; the
/// engine then tokenizes and stops exactly as one started from fully opened files, and a
/// tokenizer that fails to build fails the start with its error (the lanes stopped).
#[tokio::test]
async fn overlapped_tokenizer_start_matches_the_plain_one_and_reports_its_failure() {
    let path = kiln::config::default_model_path();
    let (f, job) = ModelFiles::open_overlapped(&path, LoadFormat::Gguf).unwrap();
    assert!(f.tokenizer.is_none(), "the tokenizer is left to its thread");
    let overlapped =
        Engine::start_overlapped(f, Some(job), &[Device::Cpu], EngineConfig::default()).unwrap();
    let (plain, tok) = engine(EngineConfig::default());
    let got = overlapped
        .client()
        .tokenizer()
        .expect("the built tokenizer");
    for s in SENTENCES {
        assert_eq!(
            got.encode(s, true).unwrap(),
            tok.encode(s, true).unwrap(),
            "{s}"
        );
    }
    assert_eq!(got.eos_ids(), tok.eos_ids());
    let prompt = tok.encode(SENTENCES[1], true).unwrap();
    let a = run(&overlapped.client(), ignore_eos(prompt.clone(), 24)).await;
    let b = run(&plain.client(), ignore_eos(prompt, 24)).await;
    assert_eq!(a.text, b.text);

    // A Hugging Face directory whose tokenizer.json is not a tokenizer.
    let dir = std::env::temp_dir().join(format!("kiln-bad-tokenizer-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/arch/qwen3");
    for name in ["config.json", "model.safetensors"] {
        std::fs::copy(fixture.join(name), dir.join(name)).unwrap();
    }
    std::fs::write(dir.join("tokenizer.json"), "{ not a tokenizer").unwrap();
    let (f, job) = ModelFiles::open_overlapped(&dir, LoadFormat::Hf).unwrap();
    let e = Engine::start_overlapped(f, Some(job), &[Device::Cpu], EngineConfig::default())
        .err()
        .expect("a broken tokenizer fails the start");
    assert!(e.to_string().contains("tokenizer"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}
