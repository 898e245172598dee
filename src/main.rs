//! `kiln`: the command-line entry point (generate, serve, bench, openapi).

use std::io::Write;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

use kiln::backend::cpu::CpuBackend;
use kiln::config::{HubSettings, ServeArgs};
use kiln::generate::{GenerateOptions, SingleGenerator};
use kiln::model::{LoadFormat, ModelFiles};
use kiln::sampling::SamplingParams;
use kiln::tokenizer::IncrementalDecoder;

#[derive(Parser)]
#[command(
    name = "kiln",
    version,
    about = "OpenAI-compatible continuous-batching inference server"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate a continuation of a prompt and print it.
    Generate(GenerateArgs),
    /// Serve the OpenAI-compatible HTTP API.
    Serve(Box<ServeArgs>),
    /// Print the OpenAPI document (the committed openapi/openapi.json).
    Openapi,
    /// Benchmark an OpenAI-compatible server (or, with --offline, the engine in-process).
    Bench(Box<kiln::bench::BenchArgs>),
}

#[derive(clap::Args)]
struct GenerateArgs {
    /// GGUF file, Hugging Face directory, config.json (with --load-format dummy), or hf:OWNER/REPO[/FILE].
    #[arg(long)]
    model: Option<String>,
    #[arg(long, value_enum, default_value_t = LoadFormat::Auto)]
    load_format: LoadFormat,
    #[arg(long)]
    prompt: String,
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    #[arg(long, default_value_t = 1.0)]
    repetition_penalty: f32,
    #[arg(long)]
    seed: Option<u64>,
    /// Keep going past end-of-sequence tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// Print one JSON line: prompt_token_ids, token_ids, text.
    #[arg(long)]
    json: bool,
    /// Print in-process prefill and decode speed to stderr.
    #[arg(long)]
    timing: bool,
    /// Prompt tokens per forward step.
    #[arg(long, default_value_t = 512)]
    chunk: usize,
}

fn main() -> Result<()> {
    kiln::logging::init(
        tracing_subscriber::EnvFilter::try_from_env("KILN_LOG").unwrap_or_else(|_| "info".into()),
    );
    match Cli::parse().command {
        Command::Generate(args) => generate(args),
        Command::Serve(args) => kiln::api::serve::run(&args),
        Command::Bench(args) => kiln::bench::run(*args),
        Command::Openapi => {
            print!("{}", kiln::api::openapi_json());
            Ok(())
        }
    }
}

fn generate(args: GenerateArgs) -> Result<()> {
    let path = match &args.model {
        Some(m) => kiln::config::resolve_model(m, &HubSettings::from_env())?,
        None => kiln::config::default_model_path(),
    };
    let t0 = Instant::now();
    let files = ModelFiles::open(&path, args.load_format)
        .with_context(|| kiln::config::opening_model(&path))?;
    let tokenizer = files
        .tokenizer
        .clone()
        .context("the model has no tokenizer")?;
    let prompt = tokenizer.encode(&args.prompt, tokenizer.add_bos_default())?;
    let context = prompt.len() + args.max_tokens;
    let mut generator =
        SingleGenerator::new(CpuBackend::new(), &files, context, args.chunk.max(1), 16)?;
    tracing::info!(model = %files.name, load_s = t0.elapsed().as_secs_f64(), "model loaded");
    let params = SamplingParams {
        temperature: args.temperature,
        top_p: args.top_p,
        top_k: args.top_k,
        min_p: args.min_p,
        repetition_penalty: args.repetition_penalty,
        seed: args.seed,
        ..SamplingParams::default()
    };
    let opts = GenerateOptions {
        max_tokens: args.max_tokens,
        params,
        stop_ids: if args.ignore_eos {
            vec![]
        } else {
            tokenizer.eos_ids().to_vec()
        },
        chunk: args.chunk.max(1),
        block_size: 16,
        record_logits: 0,
    };
    let mut decoder = IncrementalDecoder::with_prompt(&tokenizer, &prompt, true);
    let stream = !args.json;
    let mut stdout = std::io::stdout();
    let out = generator.generate(&prompt, &opts, |id| {
        if stream
            && !tokenizer.eos_ids().contains(&id)
            && let Ok(piece) = decoder.push(id)
        {
            let _ = write!(stdout, "{piece}");
            let _ = stdout.flush();
        }
    })?;
    let shown: Vec<u32> = out
        .token_ids
        .iter()
        .copied()
        .filter(|t| !tokenizer.eos_ids().contains(t))
        .collect();
    if args.json {
        let text = tokenizer.decode(&shown, true)?;
        let line = serde_json::json!({"prompt_token_ids": prompt, "token_ids": out.token_ids, "text": text});
        println!("{line}");
    } else {
        println!("{}", decoder.finish());
    }
    if args.timing {
        let decoded = out.token_ids.len().saturating_sub(1);
        eprintln!(
            "prefill: {} tokens in {:.3} ms ({:.0} tok/s); decode: {} tokens in {:.3} ms ({:.0} tok/s)",
            prompt.len(),
            out.prefill_time.as_secs_f64() * 1e3,
            prompt.len() as f64 / out.prefill_time.as_secs_f64(),
            decoded,
            out.decode_time.as_secs_f64() * 1e3,
            decoded as f64 / out.decode_time.as_secs_f64()
        );
    }
    Ok(())
}
