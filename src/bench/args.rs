//! `kiln bench` flags and their validation into a [`Plan`].

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use serde_json::{Map, Value};

use super::BenchError;
use super::arrival::{Arrival, RequestRate};
use super::client::{Endpoint, RequestParams};
use super::dataset::{DatasetSpec, LenRange};
use super::offline::OfflineConfig;
use crate::config::HubSettings;
use crate::engine::{Device, EngineConfig};
use crate::model::LoadFormat;

/// Flags of `kiln bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Server to drive (any OpenAI-compatible server).
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    pub base_url: String,
    #[arg(long, value_enum, default_value_t = Endpoint::Completions)]
    pub endpoint: Endpoint,
    /// Model name to request (default: the first of /v1/models). With --offline: the model
    /// path (GGUF, HF directory, or hf:OWNER/REPO[/FILE]; default: the stories260K fixture).
    #[arg(long)]
    pub model: Option<String>,
    /// Bearer key sent to the server.
    #[arg(long)]
    pub api_key: Option<String>,
    /// `random`, `sharegpt FILE` (ShareGPT JSON), or `fixed` (with --prompt).
    #[arg(long, num_args = 1..=2, value_names = ["KIND", "FILE"], default_values = ["random"])]
    pub dataset: Vec<String>,
    /// A prompt of the fixed dataset (repeatable; used in turn).
    #[arg(long = "prompt")]
    pub prompts: Vec<String>,
    #[arg(long, default_value_t = 100)]
    pub num_prompts: usize,
    /// Prompt tokens of the random dataset (BOS included): N or MIN..MAX.
    #[arg(long, default_value = "512")]
    pub input_len: LenRange,
    /// max_tokens per request: N or MIN..MAX (default 128; ShareGPT: the reply's length).
    #[arg(long)]
    pub output_len: Option<LenRange>,
    /// Requests per second (Poisson arrivals), or `inf` to send all at once.
    #[arg(long, default_value = "inf")]
    pub request_rate: RequestRate,
    /// Most requests in flight.
    #[arg(long)]
    pub max_concurrency: Option<usize>,
    /// Seed of the workload and the arrival times.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Ask the server to ignore end-of-sequence tokens, so output lengths are exact.
    #[arg(long)]
    pub ignore_eos: bool,
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// JSON object merged into every request body (overrides the bench's fields).
    #[arg(long)]
    pub extra_body: Option<String>,
    /// Count prompt tokens with this model's tokenizer instead of the server's /tokenize.
    #[arg(long)]
    pub tokenizer: Option<String>,
    /// Per-request timeout in seconds.
    #[arg(long, default_value_t = 600.0)]
    pub timeout_s: f64,
    /// End the run after this many seconds: requests still in flight or not yet sent are
    /// reported as `unfinished` failures (the report of a stuck run, instead of none).
    #[arg(long)]
    pub max_duration_s: Option<f64>,
    /// Write every figure and per-request record as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Draw latency CDFs and throughput over time into this SVG file.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// A name for this run in the table and the JSON (default: the target).
    #[arg(long)]
    pub label: Option<String>,
    /// Run the workload through an in-process engine instead of a server.
    #[arg(long)]
    pub offline: bool,
    /// --offline: how to read --model.
    #[arg(long, value_enum, default_value_t = LoadFormat::Auto)]
    pub load_format: LoadFormat,
    /// --offline: one lane per device (cpu, cuda:N); repeatable.
    #[arg(long = "device", default_values = ["cpu"])]
    pub devices: Vec<String>,
    /// --offline: sequences running at once per lane.
    #[arg(long)]
    pub max_num_seqs: Option<usize>,
    /// --offline: tokens per forward step per lane.
    #[arg(long)]
    pub max_num_batched_tokens: Option<usize>,
    /// --offline: KV cache size in blocks per lane.
    #[arg(long)]
    pub kv_blocks: Option<usize>,
}

#[derive(Parser)]
#[command(name = "kiln bench")]
struct Standalone {
    #[command(flatten)]
    args: BenchArgs,
}

impl BenchArgs {
    /// Parses flags as `kiln bench` would (the first item is the program name).
    pub fn parse_from<I, T>(items: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        Standalone::try_parse_from(items).map(|s| s.args)
    }
}

/// Where requests go.
#[derive(Debug, Clone)]
pub enum TargetSpec {
    Http {
        base_url: String,
        endpoint: Endpoint,
        model: Option<String>,
        api_key: Option<String>,
        timeout: Duration,
    },
    Offline(Box<OfflineConfig>),
}

/// Validated settings of a run.
#[derive(Debug, Clone)]
pub struct Plan {
    pub dataset: DatasetSpec,
    pub num_prompts: usize,
    pub arrival: Arrival,
    pub seed: u64,
    pub params: RequestParams,
    pub target: TargetSpec,
    /// A local tokenizer's model path, if given.
    pub tokenizer: Option<PathBuf>,
    pub label: Option<String>,
}

fn invalid(flag: &'static str, message: impl Into<String>) -> BenchError {
    BenchError::Invalid {
        flag,
        message: message.into(),
    }
}

fn resolve(reference: &str) -> Result<PathBuf, BenchError> {
    crate::config::resolve_model(reference, &HubSettings::from_env())
        .map_err(|e| BenchError::Model(e.to_string()))
}

fn check_numbers(a: &BenchArgs) -> Result<(), BenchError> {
    if a.num_prompts == 0 {
        return Err(invalid("--num-prompts", "must be at least 1"));
    }
    if a.max_concurrency == Some(0) {
        return Err(invalid("--max-concurrency", "must be at least 1"));
    }
    if !(a.timeout_s.is_finite() && a.timeout_s > 0.0) {
        return Err(invalid("--timeout-s", "must be a positive number"));
    }
    if a.max_duration_s
        .is_some_and(|d| !(d.is_finite() && d > 0.0))
    {
        return Err(invalid("--max-duration-s", "must be a positive number"));
    }
    if !(a.temperature.is_finite() && a.temperature >= 0.0) {
        return Err(invalid("--temperature", "must be a number >= 0"));
    }
    Ok(())
}

fn dataset(a: &BenchArgs) -> Result<DatasetSpec, BenchError> {
    let output = a.output_len.unwrap_or(LenRange::exact(128));
    let dataset = match a
        .dataset
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["random"] => DatasetSpec::Random {
            input: a.input_len,
            output,
        },
        ["sharegpt", file] => DatasetSpec::ShareGpt {
            path: PathBuf::from(file),
            output: a.output_len,
        },
        ["fixed"] if !a.prompts.is_empty() => DatasetSpec::Fixed {
            prompts: a.prompts.clone(),
            output,
        },
        ["fixed"] => {
            return Err(invalid(
                "--prompt",
                "the fixed dataset needs at least one --prompt",
            ));
        }
        ["sharegpt"] => {
            return Err(invalid(
                "--dataset",
                "give the file: --dataset sharegpt FILE",
            ));
        }
        other => {
            return Err(invalid(
                "--dataset",
                format!("unknown dataset {other:?} (random, sharegpt FILE, fixed)"),
            ));
        }
    };
    Ok(dataset)
}

fn target(a: &BenchArgs) -> Result<TargetSpec, BenchError> {
    let target = if a.offline {
        if a.endpoint == Endpoint::Chat {
            return Err(invalid(
                "--endpoint",
                "--offline drives the engine with raw prompts; chat is HTTP only",
            ));
        }
        let devices = a
            .devices
            .iter()
            .map(|d| d.parse::<Device>().map_err(|m| invalid("--device", m)))
            .collect::<Result<Vec<_>, _>>()?;
        let mut engine = EngineConfig::default();
        engine.max_num_seqs = a.max_num_seqs.unwrap_or(engine.max_num_seqs);
        engine.max_num_batched_tokens = a.max_num_batched_tokens;
        engine.kv_blocks = a.kv_blocks.or(engine.kv_blocks);
        engine.max_waiting = engine.max_waiting.max(a.num_prompts);
        let model = match &a.model {
            Some(m) => resolve(m)?,
            None => crate::config::default_model_path(),
        };
        TargetSpec::Offline(Box::new(OfflineConfig {
            model,
            load_format: a.load_format,
            devices,
            engine,
        }))
    } else {
        if !(a.base_url.starts_with("http://") || a.base_url.starts_with("https://")) {
            return Err(invalid(
                "--base-url",
                format!("'{}' is not an http:// URL", a.base_url),
            ));
        }
        TargetSpec::Http {
            base_url: a.base_url.trim_end_matches('/').to_string(),
            endpoint: a.endpoint,
            model: a.model.clone(),
            api_key: a.api_key.clone(),
            timeout: Duration::from_secs_f64(a.timeout_s),
        }
    };
    Ok(target)
}

impl Plan {
    /// Checks the flags and resolves model paths.
    pub fn from_args(a: &BenchArgs) -> Result<Self, BenchError> {
        check_numbers(a)?;
        let dataset = dataset(a)?;
        let extra_body = match &a.extra_body {
            None => Map::new(),
            Some(s) => match serde_json::from_str::<Value>(s) {
                Ok(Value::Object(m)) => m,
                _ => return Err(invalid("--extra-body", "must be a JSON object")),
            },
        };
        let target = target(a)?;
        Ok(Self {
            dataset,
            num_prompts: a.num_prompts,
            arrival: Arrival {
                rate: a.request_rate,
                max_concurrency: a.max_concurrency,
                seed: a.seed,
                max_duration: a.max_duration_s.map(Duration::from_secs_f64),
            },
            seed: a.seed,
            params: RequestParams {
                ignore_eos: a.ignore_eos,
                temperature: a.temperature,
                extra_body,
            },
            target,
            tokenizer: a.tokenizer.as_deref().map(resolve).transpose()?,
            label: a.label.clone(),
        })
    }
}
