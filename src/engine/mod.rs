//! The continuous-batching engine: lanes (one per device), router, scheduler, paged KV
//! block manager and per-request output processing.

pub mod blocks;
mod client;
mod constraint;
mod embed;
mod lane;
mod output;
mod pooling;
mod request;
pub mod scheduler;
mod shards;
pub mod stats;
pub mod types;
mod validate;

pub use client::{Engine, EngineClient, ResponseStream};
pub use constraint::GrammarConfig;
pub use embed::EmbedHandle;
pub use pooling::{EmbedRequest, Embedding, normalize};
pub use stats::{EngineStats, LaneStats};
pub use types::*;
pub use validate::{MAX_CHOICES, ValidRequest};

use std::str::FromStr;

/// Errors the engine reports to callers. The API maps each to an HTTP status.
#[derive(Debug, Clone, thiserror::Error)]
pub enum EngineError {
    /// The waiting queue is full; retry later.
    #[error("the server is overloaded ({waiting} requests waiting); retry later")]
    Overloaded { waiting: usize, retry_after_s: u64 },
    /// The request cannot be served as given (e.g. longer than the context).
    #[error("{message}")]
    InvalidRequest {
        param: Option<&'static str>,
        message: String,
    },
    /// The prompt, or the prompt with `max_tokens`, does not fit the model's context (the
    /// message is in OpenAI's words: "This model's maximum context length is N tokens. ...").
    #[error("{message}")]
    ContextLength {
        param: &'static str,
        message: String,
    },
    /// A device or model error failed this lane's requests.
    #[error("lane {lane} failed: {message}")]
    LaneFailed { lane: usize, message: String },
    /// The client read nothing for `idle_s` seconds while its stream buffer was full.
    #[error("the client read nothing for {idle_s} s; the request was aborted")]
    Stalled { idle_s: f64 },
    /// The engine is shutting down or has stopped.
    #[error("the engine is shutting down")]
    ShuttingDown,
    /// The model could not be loaded.
    #[error("model load failed: {0}")]
    Load(String),
}

/// The error of a request on a hung lane (`ran`: how long its step had run, when known).
pub(crate) fn hung_error(lane: usize, ran: Option<std::time::Duration>) -> EngineError {
    let ran = ran.map_or(String::new(), |r| {
        format!(" after {:.1} s", r.as_secs_f64())
    });
    EngineError::LaneFailed {
        lane,
        message: format!(
            "its step has not returned{ran}, past engine.step_timeout_s: the device or a \
             collective is hung"
        ),
    }
}

/// Where a lane runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    Cpu,
    Cuda(usize),
    Rocm(usize),
}

impl FromStr for Device {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let idx = |rest: &str| {
            rest.parse::<usize>()
                .map_err(|_| format!("bad device index in '{s}'"))
        };
        match s.split_once(':') {
            None if s == "cpu" => Ok(Device::Cpu),
            None if s == "cuda" => Ok(Device::Cuda(0)),
            None if s == "rocm" => Ok(Device::Rocm(0)),
            Some(("cpu", _)) => Ok(Device::Cpu),
            Some(("cuda", i)) => Ok(Device::Cuda(idx(i)?)),
            Some(("rocm", i)) => Ok(Device::Rocm(idx(i)?)),
            _ => Err(format!(
                "unknown device '{s}' (expected cpu, cuda:N or rocm:N)"
            )),
        }
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Device::Cpu => write!(f, "cpu"),
            Device::Cuda(i) => write!(f, "cuda:{i}"),
            Device::Rocm(i) => write!(f, "rocm:{i}"),
        }
    }
}

/// Scheduler and cache limits (config keys and `kiln serve` flags).
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EngineConfig {
    /// Sequences running at once per lane.
    pub max_num_seqs: usize,
    /// Tokens per forward step per lane; unset: by the lane's device
    /// ([`EngineConfig::default_batched_tokens`]).
    pub max_num_batched_tokens: Option<usize>,
    /// Tokens per KV block.
    pub block_size: usize,
    /// Exact KV pool size in blocks (per lane); otherwise sized from memory.
    pub kv_blocks: Option<usize>,
    /// KV memory per lane on the CPU when `kv_blocks` is unset.
    pub cpu_kv_cache_bytes: usize,
    /// Fraction of device memory to use on GPUs.
    pub gpu_memory_utilization: f32,
    /// Requests allowed to wait (all lanes); past it submit fails with `Overloaded`.
    pub max_waiting: usize,
    pub enable_prefix_caching: bool,
    /// Context limit; defaults to the model's.
    pub max_model_len: Option<usize>,
    /// GPU lanes time every kernel of every n-th step with device events for
    /// `kiln_kernel_duration_seconds` (0: off).
    pub kernel_timing_period: u64,
    /// GPU activation/weight precision: `bf16` (default) or `f32` (exact parity with the CPU).
    pub gpu_dtype: GpuDtype,
    /// Events a request's stream buffers beyond one step's worth (a server bound, never a
    /// client's number). A request whose client reads slower pauses; while others wait for a
    /// seat or blocks it gives its own back and is recomputed once its client reads.
    pub stream_buffer_events: usize,
    /// A paused request whose client has read nothing for this long is aborted: its blocks
    /// are freed and it counts as a disconnect.
    pub stream_stall_timeout_s: f64,
    /// GPU streaming matmul kernels for small batches (`KILN_GEMV=0` turns them off).
    pub gpu_gemv: bool,
    /// GPU decode attention variant (`KILN_ATTN_DECODE=0` turns it off).
    pub gpu_attn_decode: bool,
    /// Where GPU lanes cache compiled kernels (default `$XDG_CACHE_HOME/kiln/kernels`, else
    /// `~/.cache/kiln/kernels`; unset when neither is known: compile at every start).
    pub kernel_cache_dir: Option<std::path::PathBuf>,
    /// Shards per lane (tensor parallelism): each holds 1/N of the weights and of the KV
    /// pool, on a thread of its own. CPU and CUDA lanes (`cuda:i` spans GPUs `i .. i + N`).
    pub tensor_parallel_size: usize,
    /// A lane whose step runs longer than this many seconds is declared hung (a device or
    /// a collective that never returns): its requests fail with a 503 and the router sends
    /// it no more, while the other lanes serve on. Unset: 300 s on GPU lanes, none on the
    /// CPU; 0: never.
    pub step_timeout_s: Option<f64>,
    /// Bounds on compiling constraints (`[engine.grammar]`).
    pub grammar: GrammarConfig,
    /// The GPU backend's kernel-variant switches (`[engine.gpu_tuning]`; each also a
    /// `KILN_*` variable and `--gpu-tuning KEY=VALUE`).
    pub gpu_tuning: crate::backend::GpuTuning,
}

/// The default on-disk kernel cache: `$XDG_CACHE_HOME/kiln/kernels`, else
/// `~/.cache/kiln/kernels` (read once, when the config is built).
pub fn default_kernel_cache_dir() -> Option<std::path::PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".cache")))?;
    Some(base.join("kiln").join("kernels"))
}

/// Precision of GPU weights and activations (accumulation is always f32): the backend's
/// storage type itself.
pub use crate::backend::DType as GpuDtype;

/// Tokens per forward step of a lane on a device with at least [`LARGE_DEVICE_BYTES`].
pub const LARGE_DEVICE_BATCHED_TOKENS: usize = 8192;
/// Tokens per forward step elsewhere (the CPU, smaller GPUs).
pub const DEFAULT_BATCHED_TOKENS: usize = 2048;
/// Device memory from which a lane takes [`LARGE_DEVICE_BATCHED_TOKENS`] (70 GiB: H100,
/// H200, MI300X; vLLM's OpenAI server draws the same line). Larger steps spread a step's
/// fixed costs (a quantized matrix dequantized for the BLAS, launches) over more prompt
/// tokens, for ~1 GB more activations on an 8B model.
pub const LARGE_DEVICE_BYTES: usize = 70 << 30;

impl EngineConfig {
    /// `max_num_batched_tokens`, or [`DEFAULT_BATCHED_TOKENS`] where unset.
    pub fn batched_tokens(&self) -> usize {
        self.max_num_batched_tokens
            .unwrap_or(DEFAULT_BATCHED_TOKENS)
    }

    /// Tokens per step for a lane whose device has `memory` bytes (`None`: the CPU, or not
    /// known) when `max_num_batched_tokens` is unset.
    pub fn default_batched_tokens(memory: Option<usize>) -> usize {
        match memory {
            Some(m) if m >= LARGE_DEVICE_BYTES => LARGE_DEVICE_BATCHED_TOKENS,
            _ => DEFAULT_BATCHED_TOKENS,
        }
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            max_num_seqs: 128,
            max_num_batched_tokens: None,
            block_size: 16,
            kv_blocks: None,
            cpu_kv_cache_bytes: 1 << 30,
            gpu_memory_utilization: 0.9,
            max_waiting: 1024,
            enable_prefix_caching: true,
            max_model_len: None,
            kernel_timing_period: 64,
            gpu_dtype: GpuDtype::Bf16,
            stream_buffer_events: 256,
            stream_stall_timeout_s: 30.0,
            gpu_gemv: true,
            gpu_attn_decode: true,
            kernel_cache_dir: default_kernel_cache_dir(),
            tensor_parallel_size: 1,
            step_timeout_s: None,
            grammar: GrammarConfig::default(),
            gpu_tuning: crate::backend::GpuTuning::default(),
        }
    }
}
