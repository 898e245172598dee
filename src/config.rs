//! One typed configuration: a config file (the working directory's `config/default.toml`, else
//! `$XDG_CONFIG_HOME/kiln/config.toml`, else the copy built into the binary) < `KILN_*`
//! environment < command-line flags.

mod hub;
mod responses;

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::engine::{Device, EngineConfig};
use crate::model::LoadFormat;

pub use hub::{HubError, HubSettings, resolve_model};
pub use responses::ResponsesConfig;

/// The source tree this was built from, for tests and tools that read its fixtures; what
/// `kiln` itself reads never depends on it (a copied binary runs anywhere).
pub fn project_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Resolves a path from the config or the command line: absolute, or relative to the working
/// directory.
pub fn resolve_path(p: &Path) -> PathBuf {
    p.to_path_buf()
}

/// The default model: `../shared/models/stories260K.gguf` (the repository's test fixture, next
/// to a checkout) relative to the working directory.
pub fn default_model_path() -> PathBuf {
    resolve_path(Path::new(DEFAULT_MODEL))
}

/// `model.path` unless a config file, `KILN_MODEL` or `--model` says otherwise.
pub const DEFAULT_MODEL: &str = "../shared/models/stories260K.gguf";

/// What opening the model at `path` failed on, saying what `--model` takes when there is no
/// such file (the default model is the repository's test fixture, absent beside a copied
/// binary).
pub fn opening_model(path: &Path) -> String {
    if path.exists() {
        return format!("opening {}", path.display());
    }
    format!(
        "opening {}: no such file or directory; --model (KILN_MODEL, model.path) takes any GGUF \
         file, a Hugging Face directory or hf:OWNER/REPO[/FILE] (the default, {DEFAULT_MODEL}, \
         is the test model beside a checkout of the repository, read relative to the working \
         directory)",
        path.display()
    )
}

/// The GPU tuning of the `KILN_*` variables over the defaults, for what builds its engine
/// without a config file (`kiln bench --offline`).
pub fn env_gpu_tuning() -> Result<crate::backend::GpuTuning, ConfigError> {
    crate::backend::GpuTuning::default()
        .with_env(|k| std::env::var(k).ok())
        .map_err(|(key, message)| ConfigError::Invalid { key, message })
}

/// The shipped `config/default.toml`, built into the binary: the settings where no config
/// file is found.
pub const DEFAULT_TOML: &str = include_str!("../config/default.toml");

/// Where a config file is looked for when `--config` names none, first found wins: the
/// working directory's `config/default.toml`, then `$XDG_CONFIG_HOME/kiln/config.toml`
/// (`~/.config/kiln/config.toml` without it).
pub fn config_search_paths() -> Vec<PathBuf> {
    let mut paths = vec![PathBuf::from("config/default.toml")];
    let xdg = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")));
    if let Some(dir) = xdg {
        paths.push(dir.join("kiln/config.toml"));
    }
    paths
}

/// Errors from reading the configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid config {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid setting `{key}`: {message}")]
    Invalid { key: &'static str, message: String },
}

/// Everything `kiln serve` needs.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub server: ServerConfig,
    pub model: ModelConfig,
    pub limits: LimitsConfig,
    pub engine: EngineConfig,
    pub responses: ResponsesConfig,
}

/// The HTTP listener and its protections.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    pub host: String,
    pub port: u16,
    /// Bearer keys accepted on every route but `/health`; empty means no authentication.
    pub api_keys: Vec<String>,
    /// HTTP worker threads; 0 means one per CPU core.
    pub workers: usize,
    /// Largest accepted request body (413 past it).
    pub max_body_bytes: usize,
    /// Largest accepted sum of header names and values (431 past it).
    pub max_header_bytes: usize,
    /// Seconds SIGTERM waits for in-flight requests before closing them.
    pub shutdown_timeout_s: u64,
    /// Seconds without an event before a streaming response sends a keep-alive comment.
    pub sse_keep_alive_s: f64,
    /// Origins allowed by CORS (`*` for any); empty turns CORS off.
    pub cors_allowed_origins: Vec<String>,
    /// `Host` names served besides loopback ones while bound to a loopback address (`*` for
    /// any); other hosts get 403 (DNS rebinding). Not checked when bound to another address.
    pub allowed_hosts: Vec<String>,
    /// Seconds a request body may take to arrive in full (408 past it).
    pub body_timeout_s: f64,
    /// Open connections served at once (all workers together); more wait in the listen
    /// backlog. Lowered at start to fit the process's file-descriptor limit.
    pub max_connections: usize,
    /// Requests in flight at once, from headers read to response body ended (streams until
    /// their end or their client leaves); past it 503 with `Retry-After` at once, never a
    /// queue. `/health` and `/metrics` are exempt. Kept below `max_connections`.
    pub max_in_flight: usize,
    /// Threads that tokenize and render templates (all workers together); 0 means one per
    /// CPU core. Each keeps its own tokenizer cache, so this also bounds their memory.
    pub blocking_threads: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            host: "127.0.0.1".into(),
            port: 8000,
            api_keys: Vec::new(),
            workers: 0,
            max_body_bytes: 4 << 20,
            max_header_bytes: 16 << 10,
            shutdown_timeout_s: 30,
            sse_keep_alive_s: 10.0,
            cors_allowed_origins: Vec::new(),
            allowed_hosts: Vec::new(),
            body_timeout_s: 30.0,
            max_connections: 8192,
            max_in_flight: 4096,
            blocking_threads: 0,
        }
    }
}

/// Which model to serve and where.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelConfig {
    /// GGUF file, Hugging Face directory, or `hf:OWNER/REPO[/FILE]`.
    pub path: String,
    pub load_format: LoadFormat,
    /// Name clients use in `model`; defaults to the file or directory name.
    pub served_model_name: Option<String>,
    /// One lane per device: `cpu`, `cuda:N`, `rocm:N`.
    pub devices: Vec<String>,
    /// How the model writes tool calls; by default picked from its chat template.
    pub tool_call_parser: Option<ToolCallParser>,
    /// Split the model's reasoning into `reasoning_content`; off by default.
    pub reasoning_parser: Option<ReasoningParser>,
    /// Serve `POST /v1/embeddings` (pooled by the model's stated pooling, else its last
    /// token's hidden state); off by default: the route answers 400.
    pub embeddings: bool,
}

/// Tool-call formats (`--tool-call-parser`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum ToolCallParser {
    /// Llama 3.1/3.2: `{"name": ..., "parameters": {...}}`.
    #[value(name = "llama3_json")]
    Llama3Json,
    /// Hermes, Qwen2.5, Qwen3: `<tool_call>{...}</tool_call>`.
    Hermes,
    /// Mistral: `[TOOL_CALLS][{...}]`.
    Mistral,
}

/// Reasoning formats (`--reasoning-parser`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum ReasoningParser {
    /// `<think>...</think>` (Qwen3, DeepSeek-R1).
    Think,
}

impl Default for ModelConfig {
    fn default() -> Self {
        Self {
            path: DEFAULT_MODEL.into(),
            load_format: LoadFormat::Auto,
            served_model_name: None,
            devices: vec!["cpu".into()],
            tool_call_parser: None,
            reasoning_parser: None,
            embeddings: false,
        }
    }
}

impl ModelConfig {
    /// The parsed device list.
    pub fn parsed_devices(&self) -> Result<Vec<Device>, ConfigError> {
        self.devices
            .iter()
            .map(|d| {
                d.parse().map_err(|message| ConfigError::Invalid {
                    key: "model.devices",
                    message,
                })
            })
            .collect()
    }
}

/// Caps on what one request may ask for.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// Most choices (`n`) per prompt.
    pub max_n: usize,
    /// Most stop strings, and the longest one in bytes.
    pub max_stop: usize,
    pub max_stop_len: usize,
    /// Most alternatives per token (`logprobs`, `top_logprobs`).
    pub max_logprobs: usize,
    /// Most prompts in one completions request.
    pub max_prompts: usize,
    /// Most `logit_bias` entries.
    pub max_logit_bias: usize,
    /// Most chat messages.
    pub max_messages: usize,
    /// Most inputs in one embeddings request.
    pub max_embedding_inputs: usize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            max_n: 16,
            max_stop: 16,
            max_stop_len: 256,
            max_logprobs: 20,
            max_prompts: 64,
            max_logit_bias: 1024,
            max_messages: 1024,
            max_embedding_inputs: 2048,
        }
    }
}

/// `kiln serve` flags; each also reads a `KILN_*` variable and overrides the config file.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ServeArgs {
    /// Config file [default: ./config/default.toml, else $XDG_CONFIG_HOME/kiln/config.toml, else built in].
    #[arg(long, env = "KILN_CONFIG")]
    pub config: Option<PathBuf>,
    /// GGUF file, Hugging Face directory, or hf:OWNER/REPO[/FILE].
    #[arg(long, env = "KILN_MODEL")]
    pub model: Option<String>,
    /// How to read --model.
    #[arg(long, value_enum, env = "KILN_LOAD_FORMAT")]
    pub load_format: Option<LoadFormat>,
    /// Name clients send as `model`.
    #[arg(long, env = "KILN_SERVED_MODEL_NAME")]
    pub served_model_name: Option<String>,
    /// Address to bind [default: 127.0.0.1].
    #[arg(long, env = "KILN_HOST")]
    pub host: Option<String>,
    /// Port to bind [default: 8000].
    #[arg(long, env = "KILN_PORT")]
    pub port: Option<u16>,
    /// Accepted bearer key; repeat for several (comma-separated in KILN_API_KEY).
    #[arg(
        long = "api-key",
        env = "KILN_API_KEY",
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub api_keys: Vec<String>,
    /// cpu, cuda:N or rocm:N; repeat for one lane per device.
    #[arg(long = "device", env = "KILN_DEVICE", value_delimiter = ',')]
    pub devices: Vec<String>,
    /// Sequences running at once per lane.
    #[arg(long, env = "KILN_MAX_NUM_SEQS")]
    pub max_num_seqs: Option<usize>,
    /// Tokens per forward step per lane.
    #[arg(long, env = "KILN_MAX_NUM_BATCHED_TOKENS")]
    pub max_num_batched_tokens: Option<usize>,
    /// Tokens per KV block.
    #[arg(long, env = "KILN_BLOCK_SIZE")]
    pub block_size: Option<usize>,
    /// KV pool size in blocks per lane (otherwise sized from memory).
    #[arg(long, env = "KILN_KV_BLOCKS")]
    pub kv_blocks: Option<usize>,
    /// Shards per lane (tensor parallelism; CPU and CUDA lanes: `cuda:i` spans GPUs i..i+N-1) [default: 1].
    #[arg(long = "tensor-parallel", env = "KILN_TENSOR_PARALLEL")]
    pub tensor_parallel_size: Option<usize>,
    /// Seconds a lane's step may run before the lane is declared hung and its requests fail
    /// (0: never) [default: 300 on GPU lanes, none on the CPU].
    #[arg(long = "step-timeout", env = "KILN_STEP_TIMEOUT")]
    pub step_timeout_s: Option<f64>,
    /// Waiting requests allowed before 429.
    #[arg(long, env = "KILN_MAX_WAITING")]
    pub max_waiting: Option<usize>,
    /// Context limit (defaults to the model's).
    #[arg(long, env = "KILN_MAX_MODEL_LEN")]
    pub max_model_len: Option<usize>,
    /// GPU streaming matmul kernels for small batches (`KILN_GEMV=0`: off, for A/B runs).
    #[arg(long, env = "KILN_GEMV", value_parser = clap::builder::BoolishValueParser::new())]
    pub gpu_gemv: Option<bool>,
    /// GPU decode attention variant (`KILN_ATTN_DECODE=0`: off, for A/B runs).
    #[arg(long, env = "KILN_ATTN_DECODE", value_parser = clap::builder::BoolishValueParser::new())]
    pub gpu_attn_decode: Option<bool>,
    /// HTTP worker threads (0: one per core).
    #[arg(long, env = "KILN_WORKERS")]
    pub workers: Option<usize>,
    /// Tool-call format: llama3_json, hermes or mistral [default: from the chat template].
    #[arg(long, value_enum, env = "KILN_TOOL_CALL_PARSER")]
    pub tool_call_parser: Option<ToolCallParser>,
    /// Reasoning format whose thinking goes to `reasoning_content` (think).
    #[arg(long, value_enum, env = "KILN_REASONING_PARSER")]
    pub reasoning_parser: Option<ReasoningParser>,
    /// Serve POST /v1/embeddings (`--embeddings`, or `--embeddings=false` to turn the config
    /// key off).
    #[arg(
        long,
        env = "KILN_EMBEDDINGS",
        num_args = 0..=1,
        default_missing_value = "true",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub embeddings: Option<bool>,
    /// Requests in flight at once before 503 with Retry-After [default: 4096].
    #[arg(long, env = "KILN_MAX_IN_FLIGHT")]
    pub max_in_flight: Option<usize>,
    /// Allowed CORS origin; repeat for several.
    #[arg(
        long = "cors-allowed-origin",
        env = "KILN_CORS_ALLOWED_ORIGINS",
        value_delimiter = ','
    )]
    pub cors_allowed_origins: Vec<String>,
    /// A GPU kernel-variant switch of `[engine.gpu_tuning]`, `KEY=VALUE` (repeatable; over
    /// its `KILN_*` variable), e.g. `--gpu-tuning qmma8=all`.
    #[arg(long = "gpu-tuning", value_name = "KEY=VALUE")]
    pub gpu_tuning: Vec<String>,
}

impl Config {
    /// Parses TOML text (unknown keys are errors).
    pub fn from_toml(text: &str, path: &Path) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })
    }

    /// Reads `path`, or else the first file of [`config_search_paths`] that exists, or else
    /// the built-in [`DEFAULT_TOML`].
    pub fn from_file(path: Option<&Path>) -> Result<Self, ConfigError> {
        match path {
            Some(p) => Self::read(p),
            None => Self::from_first(&config_search_paths()),
        }
    }

    /// The first of `paths` that exists, or the built-in [`DEFAULT_TOML`].
    pub fn from_first(paths: &[PathBuf]) -> Result<Self, ConfigError> {
        for path in paths {
            match std::fs::read_to_string(path) {
                Ok(text) => return Self::from_toml(&text, path),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => {
                    return Err(ConfigError::Io {
                        path: path.clone(),
                        source,
                    });
                }
            }
        }
        Self::from_toml(DEFAULT_TOML, Path::new("(built-in config/default.toml)"))
    }

    fn read(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_toml(&text, path)
    }

    /// The file named by `args` (or the default) with `args` applied on top.
    pub fn load(args: &ServeArgs) -> Result<Self, ConfigError> {
        let mut cfg = Self::from_file(args.config.as_deref())?;
        cfg.apply_gpu_tuning(|k| std::env::var(k).ok(), &args.gpu_tuning)?;
        cfg.apply(args);
        cfg.validate()?;
        Ok(cfg)
    }

    /// `[engine.gpu_tuning]` with the `KILN_*` variables `var` returns, then the
    /// `--gpu-tuning KEY=VALUE` flags, applied.
    pub fn apply_gpu_tuning(
        &mut self,
        var: impl Fn(&str) -> Option<String>,
        flags: &[String],
    ) -> Result<(), ConfigError> {
        let t = &mut self.engine.gpu_tuning;
        *t = t
            .clone()
            .with_env(var)
            .map_err(|(key, message)| ConfigError::Invalid { key, message })?;
        for f in flags {
            let invalid = |message: String| ConfigError::Invalid {
                key: "--gpu-tuning",
                message,
            };
            let (k, v) = f
                .split_once('=')
                .ok_or_else(|| invalid(format!("`{f}`: expected KEY=VALUE")))?;
            t.set(k.trim(), v).map_err(invalid)?;
        }
        t.check().map_err(|message| ConfigError::Invalid {
            key: "engine.gpu_tuning",
            message,
        })
    }

    /// Overrides every setting that `args` carries.
    pub fn apply(&mut self, args: &ServeArgs) {
        fn set<T: Clone>(dst: &mut T, v: &Option<T>) {
            if let Some(v) = v {
                *dst = v.clone();
            }
        }
        fn set_opt<T: Clone>(dst: &mut Option<T>, v: &Option<T>) {
            if v.is_some() {
                dst.clone_from(v);
            }
        }
        fn set_list(dst: &mut Vec<String>, v: &[String]) {
            if !v.is_empty() {
                *dst = v.to_vec();
            }
        }
        let (s, m, e) = (&mut self.server, &mut self.model, &mut self.engine);
        set(&mut m.path, &args.model);
        set(&mut m.load_format, &args.load_format);
        set_opt(&mut m.served_model_name, &args.served_model_name);
        set_list(&mut m.devices, &args.devices);
        set_opt(&mut m.tool_call_parser, &args.tool_call_parser);
        set_opt(&mut m.reasoning_parser, &args.reasoning_parser);
        set(&mut m.embeddings, &args.embeddings);
        set(&mut s.host, &args.host);
        set(&mut s.port, &args.port);
        set(&mut s.workers, &args.workers);
        set(&mut s.max_in_flight, &args.max_in_flight);
        set_list(&mut s.api_keys, &args.api_keys);
        set_list(&mut s.cors_allowed_origins, &args.cors_allowed_origins);
        set(&mut e.max_num_seqs, &args.max_num_seqs);
        set_opt(&mut e.max_num_batched_tokens, &args.max_num_batched_tokens);
        set(&mut e.block_size, &args.block_size);
        set_opt(&mut e.kv_blocks, &args.kv_blocks);
        set(&mut e.max_waiting, &args.max_waiting);
        set(&mut e.tensor_parallel_size, &args.tensor_parallel_size);
        set_opt(&mut e.step_timeout_s, &args.step_timeout_s);
        set_opt(&mut e.max_model_len, &args.max_model_len);
        set(&mut e.gpu_gemv, &args.gpu_gemv);
        set(&mut e.gpu_attn_decode, &args.gpu_attn_decode);
    }

    /// Rejects settings that cannot work (bad devices, empty keys, zero limits).
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key, message: &str| {
            Err(ConfigError::Invalid {
                key,
                message: message.into(),
            })
        };
        let devices = self.model.parsed_devices()?;
        if let Err((key, message)) = self.engine.grammar.check() {
            return Err(ConfigError::Invalid { key, message });
        }
        if self.model.devices.is_empty() {
            return invalid("model.devices", "at least one device is needed");
        }
        let tp = self.engine.tensor_parallel_size;
        if tp == 0 {
            return invalid("engine.tensor_parallel_size", "must be at least 1");
        }
        if tp > 1 {
            check_gpu_groups(&devices, tp)?;
        }
        if let Some(t) = self.engine.step_timeout_s
            && !(t.is_finite() && t >= 0.0)
        {
            return invalid(
                "engine.step_timeout_s",
                "must be a number of seconds, 0 or more",
            );
        }
        if self.server.api_keys.iter().any(|k| k.trim().is_empty()) {
            return invalid("server.api_keys", "API keys must not be empty");
        }
        if self.server.max_body_bytes == 0 || self.server.max_header_bytes == 0 {
            return invalid("server.max_body_bytes", "size limits must be positive");
        }
        let ka = self.server.sse_keep_alive_s;
        if !(ka.is_finite() && (0.01..=3600.0).contains(&ka)) {
            return invalid(
                "server.sse_keep_alive_s",
                "must be between 0.01 and 3600 seconds",
            );
        }
        let bt = self.server.body_timeout_s;
        if !(bt.is_finite() && (0.01..=3600.0).contains(&bt)) {
            return invalid(
                "server.body_timeout_s",
                "must be between 0.01 and 3600 seconds",
            );
        }
        if self.server.max_connections == 0 {
            return invalid("server.max_connections", "must be positive");
        }
        if self.server.max_in_flight == 0 {
            return invalid("server.max_in_flight", "must be positive");
        }
        let l = &self.limits;
        if l.max_n == 0 || l.max_prompts == 0 || l.max_messages == 0 || l.max_embedding_inputs == 0
        {
            return invalid(
                "limits",
                "max_n, max_prompts, max_messages and max_embedding_inputs must be positive",
            );
        }
        Ok(())
    }

    /// The model reference resolved to a local path (`hf:` references through the HF cache).
    pub fn model_path(&self, hub: &HubSettings) -> Result<PathBuf, HubError> {
        resolve_model(&self.model.path, hub)
    }
}

/// Tensor parallelism `tp` > 1 on GPUs: a lane named `cuda:i` (or `rocm:i`) spans devices
/// `i .. i + tp` of its vendor (the lanes' spans must not overlap). Whether the collectives
/// library (NCCL, RCCL) loads is checked when the lane opens its devices.
fn check_gpu_groups(devices: &[Device], tp: usize) -> Result<(), ConfigError> {
    let mut spans: Vec<(&str, usize, usize)> = Vec::new();
    for d in devices {
        let (vendor, i) = match d {
            Device::Cpu => continue,
            Device::Cuda(i) => ("cuda", *i),
            Device::Rocm(i) => ("rocm", *i),
        };
        let (start, end) = (i, i + tp);
        if let Some(o) = spans
            .iter()
            .find(|o| o.0 == vendor && o.1 < end && start < o.2)
        {
            return Err(ConfigError::Invalid {
                key: "engine.tensor_parallel_size",
                message: format!(
                    "tensor parallelism {tp}: lane {d} spans {vendor}:{start}..{vendor}:{}, \
                     which overlaps the lane on {vendor}:{} (name each lane's first GPU, {tp} \
                     apart)",
                    end - 1,
                    o.1
                ),
            });
        }
        spans.push((vendor, start, end));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_config_file_found_wins_else_the_built_in_one() {
        let dir = std::env::temp_dir().join(format!("kiln-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b) = (dir.join("a.toml"), dir.join("b.toml"));
        let _ = std::fs::remove_file(&a);
        std::fs::write(&b, "[server]\nport = 9123\n").unwrap();
        assert_eq!(
            Config::from_first(std::slice::from_ref(&a)).unwrap(),
            Config::default()
        );
        let cfg = Config::from_first(&[a.clone(), b.clone()]).unwrap();
        assert_eq!(cfg.server.port, 9123);
        assert_eq!(cfg.model, Config::default().model, "the rest are defaults");
        std::fs::write(&a, "[server]\nport = 9124\n").unwrap();
        assert_eq!(Config::from_first(&[a, b]).unwrap().server.port, 9124);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn shipped_default_toml_parses_and_matches_builtin_defaults() {
        let path = project_root().join("config/default.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        let cfg = Config::from_toml(&text, &path).unwrap();
        assert_eq!(cfg, Config::default());
        cfg.validate().unwrap();
    }

    #[test]
    fn batched_tokens_follow_the_flag_else_the_devices_memory() {
        use crate::engine::EngineConfig;
        let mut cfg = Config::default();
        assert_eq!(cfg.engine.max_num_batched_tokens, None);
        assert_eq!(cfg.engine.batched_tokens(), 2048);
        // Unset: an 80 GB H100 takes 8192 tokens a step; a 24 GB card and the CPU 2048.
        assert_eq!(
            EngineConfig::default_batched_tokens(Some(81_559 << 20)),
            8192
        );
        assert_eq!(EngineConfig::default_batched_tokens(Some(24 << 30)), 2048);
        assert_eq!(EngineConfig::default_batched_tokens(None), 2048);
        cfg.apply(&ServeArgs {
            max_num_batched_tokens: Some(512),
            ..ServeArgs::default()
        });
        assert_eq!(cfg.engine.max_num_batched_tokens, Some(512));
        assert_eq!(cfg.engine.batched_tokens(), 512);
    }

    #[test]
    fn flags_override_file() {
        let text = "[server]\nport = 9000\nhost = \"0.0.0.0\"\n[engine]\nmax_num_seqs = 4\n";
        let mut cfg = Config::from_toml(text, Path::new("x.toml")).unwrap();
        assert_eq!((cfg.server.port, cfg.engine.max_num_seqs), (9000, 4));
        let args = ServeArgs {
            port: Some(1234),
            api_keys: vec!["k1".into(), "k2".into()],
            kv_blocks: Some(64),
            max_in_flight: Some(7),
            ..ServeArgs::default()
        };
        cfg.apply(&args);
        assert_eq!(cfg.server.port, 1234);
        assert_eq!(cfg.server.max_in_flight, 7);
        assert_eq!(cfg.server.host, "0.0.0.0");
        assert_eq!(cfg.server.api_keys, ["k1", "k2"]);
        assert_eq!(cfg.engine.kv_blocks, Some(64));
        assert_eq!(cfg.engine.max_num_seqs, 4);
    }

    #[test]
    fn unknown_keys_and_bad_devices_are_errors() {
        assert!(Config::from_toml("[server]\nprot = 1\n", Path::new("x")).is_err());
        let text = "[model]\ntool_call_parser = \"llama3_json\"\nreasoning_parser = \"think\"\n";
        let cfg = Config::from_toml(text, Path::new("x")).unwrap();
        assert_eq!(cfg.model.tool_call_parser, Some(ToolCallParser::Llama3Json));
        assert_eq!(cfg.model.reasoning_parser, Some(ReasoningParser::Think));
        assert!(
            Config::from_toml("[model]\ntool_call_parser = \"xml\"\n", Path::new("x")).is_err()
        );
        let mut cfg = Config::default();
        cfg.model.devices = vec!["tpu:0".into()];
        assert!(cfg.validate().is_err());
    }

    #[test]
    fn tensor_parallel_size_is_read_checked_and_gpu_spans_do_not_overlap() {
        let text = "[engine]\ntensor_parallel_size = 4\n";
        let mut cfg = Config::from_toml(text, Path::new("x")).unwrap();
        assert_eq!(cfg.engine.tensor_parallel_size, 4);
        assert!(cfg.validate().is_ok(), "any size on the CPU");
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            serve: ServeArgs,
        }
        let cli = <Cli as clap::Parser>::try_parse_from(["kiln", "--tensor-parallel", "2"]);
        cfg.apply(&cli.unwrap().serve);
        assert_eq!(cfg.engine.tensor_parallel_size, 2);
        cfg.model.devices = vec!["cpu".into(), "rocm:1".into()];
        assert!(
            cfg.validate().is_ok(),
            "ROCm lanes shard too (RCCL is checked at open)"
        );
        cfg.model.devices = vec!["rocm:0".into(), "rocm:1".into()];
        let err = cfg.validate().unwrap_err().to_string();
        assert!(err.contains("overlaps") && err.contains("rocm:0"), "{err}");
        cfg.model.devices = vec!["rocm:0".into(), "cuda:1".into()];
        assert!(cfg.validate().is_ok(), "each vendor numbers its own GPUs");
        cfg.model.devices = vec!["cuda:0".into(), "cuda:2".into()];
        assert!(cfg.validate().is_ok(), "two lanes of two GPUs each");
        cfg.model.devices = vec!["cuda:0".into(), "cuda:1".into()];
        let err = cfg.validate().unwrap_err().to_string();
        assert!(err.contains("overlaps") && err.contains("cuda:0"), "{err}");
        cfg.model.devices = vec!["cuda:0".into()];
        cfg.engine.tensor_parallel_size = 1;
        assert!(cfg.validate().is_ok(), "size 1 runs anywhere");
        cfg.engine.tensor_parallel_size = 0;
        let err = cfg.validate().unwrap_err().to_string();
        assert!(err.contains("tensor_parallel_size"), "{err}");
    }

    #[test]
    fn step_timeout_is_seconds_from_the_flag_or_the_file() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            serve: ServeArgs,
        }
        let text = "[engine]\nstep_timeout_s = 0\n";
        let mut cfg = Config::from_toml(text, Path::new("x")).unwrap();
        assert_eq!(cfg.engine.step_timeout_s, Some(0.0), "0: never");
        let cli = <Cli as clap::Parser>::try_parse_from(["kiln", "--step-timeout", "12.5"]);
        cfg.apply(&cli.unwrap().serve);
        assert_eq!(cfg.engine.step_timeout_s, Some(12.5));
        assert!(cfg.validate().is_ok());
        for bad in [-1.0, f64::NAN, f64::INFINITY] {
            cfg.engine.step_timeout_s = Some(bad);
            let err = cfg.validate().unwrap_err().to_string();
            assert!(err.contains("step_timeout_s"), "{bad}: {err}");
        }
    }

    #[test]
    fn embeddings_are_off_unless_the_flag_or_the_file_turns_them_on() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            serve: ServeArgs,
        }
        let parse = |args: &[&str]| <Cli as clap::Parser>::try_parse_from(args).unwrap().serve;
        let mut cfg = Config::default();
        assert!(!cfg.model.embeddings);
        cfg.apply(&parse(&["kiln", "--embeddings"]));
        assert!(cfg.model.embeddings);
        cfg.apply(&parse(&["kiln", "--embeddings=false"]));
        assert!(!cfg.model.embeddings);
        cfg.apply(&parse(&["kiln"]));
        assert!(
            !cfg.model.embeddings,
            "no flag leaves the setting as it was"
        );
        let cfg = Config::from_toml("[model]\nembeddings = true\n", Path::new("x")).unwrap();
        assert!(cfg.model.embeddings);
    }

    #[test]
    fn gpu_tuning_is_file_then_environment_then_flags() {
        let text =
            "[engine.gpu_tuning]\nqmma8 = \"all\"\nqdot_norm = false\nattn_min_split = 128\n";
        let mut cfg = Config::from_toml(text, Path::new("x")).unwrap();
        let env = |k: &str| match k {
            "KILN_QMMA8" => Some("0".to_string()),
            "KILN_PDL" => Some("eager".to_string()),
            _ => None,
        };
        let flags = ["pdl=off".to_string(), "qmma_wide=all".to_string()];
        cfg.apply_gpu_tuning(env, &flags).unwrap();
        let t = &cfg.engine.gpu_tuning;
        use crate::backend::tuning::{Choice, Pdl};
        assert_eq!(t.qmma8, Choice::Never, "the environment over the file");
        assert_eq!(t.pdl, Pdl::Off, "a flag over the environment");
        assert_eq!(t.qmma_wide, Choice::All);
        assert!(
            !t.qdot_norm && t.attn_min_split == 128,
            "the file's own values stay"
        );
        let err = cfg
            .apply_gpu_tuning(|_| None, &["qmma8".into()])
            .unwrap_err();
        assert!(err.to_string().contains("KEY=VALUE"), "{err}");
        let err = cfg
            .apply_gpu_tuning(|k| (k == "KILN_ATTN_MIN_SPLIT").then(|| "10".into()), &[])
            .unwrap_err();
        assert!(err.to_string().contains("KILN_ATTN_MIN_SPLIT"), "{err}");
        let bad = Config::from_toml("[engine.gpu_tuning]\nqmma_eight = 1\n", Path::new("x"));
        assert!(bad.is_err(), "unknown switches are errors");
    }
}
