//! `kiln bench`: a serving benchmark and load generator for any OpenAI-compatible server, or
//! (`--offline`) for the engine in-process.
//!
//! ```text
//! BenchArgs ─▶ Plan ─▶ dataset::build ─▶ arrival::drive ─▶ client (HTTP) | offline (engine)
//!                                                               │ a RequestRecord each
//!                                         report::Report ◀──────┘ ─▶ table, --json, --plot
//! ```

pub mod args;
pub mod arrival;
pub mod client;
pub mod dataset;
mod error;
pub mod offline;
pub mod plot;
pub mod record;
pub mod report;

use std::io::IsTerminal;
use std::sync::Arc;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};

pub use args::{BenchArgs, Plan, TargetSpec};
pub use error::BenchError;
pub use record::{Failure, RequestRecord};
pub use report::{Report, RunInfo, Stats, Summary};

use client::HttpTarget;
use dataset::{DatasetSpec, Sample, TokenCounter};
use offline::OfflineTarget;
use record::SampleInfo;

/// Runs `kiln bench`: prints the table to stdout and writes `--json` and `--plot`.
pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting tokio")?;
    let report = runtime.block_on(execute(&args))?;
    print!("{}", report.table());
    if let Some(path) = &args.json {
        std::fs::write(path, report.to_json())
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.plot {
        std::fs::write(path, plot::svg(&report))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// Builds the workload, runs it and returns the report (nothing printed but the progress bar).
pub async fn execute(args: &BenchArgs) -> Result<Report, BenchError> {
    let plan = Plan::from_args(args)?;
    if let Some(p) = args
        .plot
        .as_ref()
        .filter(|p| p.extension().is_none_or(|e| e != "svg"))
    {
        return Err(BenchError::Invalid {
            flag: "--plot",
            message: format!("{}: only .svg is supported", p.display()),
        });
    }
    let local = match &plan.tokenizer {
        Some(path) => Some(local_tokenizer(path, args.load_format)?),
        None => None,
    };
    match &plan.target {
        TargetSpec::Http { .. } => run_http(&plan, local).await,
        TargetSpec::Offline(cfg) => {
            let cfg = cfg.clone();
            let engine = tokio::task::spawn_blocking(move || offline::start_engine(&cfg))
                .await
                .map_err(|e| BenchError::Model(format!("engine start panicked: {e}")))??;
            let report = run_offline(&plan, &engine.client(), local).await;
            tokio::task::spawn_blocking(move || drop(engine)).await.ok();
            report
        }
    }
}

fn local_tokenizer(
    path: &std::path::Path,
    format: crate::model::LoadFormat,
) -> Result<TokenCounter, BenchError> {
    let files = crate::model::ModelFiles::open(path, format)
        .map_err(|e| BenchError::Tokenizer(format!("{}: {e}", path.display())))?;
    let tok = files
        .tokenizer
        .ok_or_else(|| BenchError::Tokenizer(format!("{} has no tokenizer", path.display())))?;
    Ok(TokenCounter::Local(tok))
}

fn progress(n: usize) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(n as u64);
    if let Ok(style) = ProgressStyle::with_template(
        "{bar:40.cyan/blue} {pos}/{len} requests [{elapsed_precise} < {eta}]",
    ) {
        bar.set_style(style);
    }
    bar
}

fn dataset_name(spec: &DatasetSpec) -> String {
    match spec {
        DatasetSpec::Random { input, output } => {
            format!(
                "random in {}..{} out {}..{}",
                input.min, input.max, output.min, output.max
            )
        }
        DatasetSpec::ShareGpt { path, .. } => format!("sharegpt {}", path.display()),
        DatasetSpec::Fixed { prompts, .. } => format!("fixed ({} prompts)", prompts.len()),
    }
}

fn run_info(plan: &Plan, target: String, endpoint: &str, model: String) -> RunInfo {
    RunInfo {
        label: plan.label.clone().unwrap_or_else(|| target.clone()),
        target,
        endpoint: endpoint.to_string(),
        model,
        dataset: dataset_name(&plan.dataset),
        num_prompts: plan.num_prompts,
        request_rate: plan.arrival.rate.to_string(),
        max_concurrency: plan.arrival.max_concurrency,
        seed: plan.seed,
        ignore_eos: plan.params.ignore_eos,
        started_unix_s: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        kiln_version: env!("CARGO_PKG_VERSION").to_string(),
    }
}

fn log_workload(samples: &[Sample]) {
    let counted: Vec<usize> = samples.iter().filter_map(|s| s.prompt_len).collect();
    tracing::info!(
        prompts = samples.len(),
        mean_prompt_tokens = counted.iter().sum::<usize>() as f64 / counted.len().max(1) as f64,
        max_tokens_total = samples.iter().map(|s| s.output_len).sum::<usize>(),
        "workload ready"
    );
}

fn info(i: usize, s: &Sample) -> SampleInfo {
    SampleInfo {
        index: i,
        expected_prompt_tokens: s.prompt_len,
        requested_output_tokens: s.output_len,
    }
}

async fn run_http(plan: &Plan, local: Option<TokenCounter>) -> Result<Report, BenchError> {
    let TargetSpec::Http {
        base_url,
        endpoint,
        model,
        api_key,
        timeout,
    } = &plan.target
    else {
        return Err(BenchError::Invalid {
            flag: "--offline",
            message: "not an HTTP target".into(),
        });
    };
    let http = client::http_client(*timeout)?;
    let model = match model {
        Some(m) => m.clone(),
        None => client::first_model(&http, base_url, api_key.as_deref()).await?,
    };
    let counter = local.unwrap_or_else(|| TokenCounter::Server {
        http: http.clone(),
        base_url: base_url.clone(),
        model: model.clone(),
        api_key: api_key.clone(),
    });
    let samples =
        dataset::build(&plan.dataset, plan.num_prompts, plan.seed, Some(&counter)).await?;
    log_workload(&samples);
    let target = Arc::new(HttpTarget::new(
        http,
        base_url,
        *endpoint,
        model.clone(),
        api_key.clone(),
        plan.params.clone(),
    ));
    let samples = Arc::new(samples);
    let bar = progress(samples.len());
    let (records, wall) = arrival::drive(samples.len(), &plan.arrival, &bar, |i, start| {
        let (target, samples) = (target.clone(), samples.clone());
        async move {
            target
                .send(info(i, &samples[i]), &samples[i].prompt, start)
                .await
        }
    })
    .await;
    bar.finish_and_clear();
    let endpoint = match endpoint {
        client::Endpoint::Completions => "completions",
        client::Endpoint::Chat => "chat",
    };
    Ok(Report::new(
        run_info(plan, base_url.clone(), endpoint, model),
        records,
        wall,
    ))
}

async fn run_offline(
    plan: &Plan,
    engine: &crate::engine::EngineClient,
    local: Option<TokenCounter>,
) -> Result<Report, BenchError> {
    let tok = match local {
        Some(TokenCounter::Local(t)) => Some(t),
        _ => engine.tokenizer().map(|t| (*t).clone()),
    };
    let (samples, ids) = match (tok, &plan.dataset) {
        (Some(tok), spec) => {
            let counter = TokenCounter::Local(tok.clone());
            let samples = dataset::build(spec, plan.num_prompts, plan.seed, Some(&counter)).await?;
            let ids: Vec<Vec<u32>> = samples
                .iter()
                .map(|s| tok.encode(&s.prompt, tok.add_bos_default()))
                .collect::<Result<_, _>>()
                .map_err(|e| BenchError::Tokenizer(e.to_string()))?;
            (samples, ids)
        }
        (None, DatasetSpec::Random { input, output }) => {
            let vocab = engine.spec().vocab_size;
            dataset::random_token_ids(plan.num_prompts, *input, *output, plan.seed, vocab)
        }
        (None, _) => {
            return Err(BenchError::Tokenizer(
                "the model has no tokenizer: use --dataset random (token ids) or --tokenizer PATH"
                    .into(),
            ));
        }
    };
    log_workload(&samples);
    let target = OfflineTarget::new(
        engine.clone(),
        plan.params.ignore_eos,
        plan.params.temperature,
    );
    let (samples, ids) = (Arc::new(samples), Arc::new(ids));
    let bar = progress(samples.len());
    let (records, wall) = arrival::drive(samples.len(), &plan.arrival, &bar, |i, start| {
        let (target, samples, ids) = (target.clone(), samples.clone(), ids.clone());
        async move {
            target
                .send(info(i, &samples[i]), ids[i].clone(), start)
                .await
        }
    })
    .await;
    bar.finish_and_clear();
    let model = engine.model_name().to_string();
    Ok(Report::new(
        run_info(plan, "offline".into(), "engine", model),
        records,
        wall,
    ))
}
