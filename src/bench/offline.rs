//! `--offline`: the same workloads straight through an in-process [`Engine`], no HTTP.

use std::path::PathBuf;
use std::time::Instant;

use super::error::BenchError;
use super::record::{Failure, RequestRecord, SampleInfo, Timer};
use crate::engine::{
    Device, Engine, EngineClient, EngineConfig, EngineError, GenerateRequest, StopCriteria,
    StreamEvent,
};
use crate::model::{LoadFormat, ModelFiles};
use crate::sampling::SamplingParams;

/// Which model to load and how to run it.
#[derive(Debug, Clone)]
pub struct OfflineConfig {
    pub model: PathBuf,
    pub load_format: LoadFormat,
    /// One lane per device.
    pub devices: Vec<Device>,
    pub engine: EngineConfig,
}

/// Loads the model and starts the lanes (blocking until they are ready).
pub fn start_engine(cfg: &OfflineConfig) -> Result<Engine, BenchError> {
    let files = ModelFiles::open(&cfg.model, cfg.load_format)
        .map_err(|e| BenchError::Model(format!("{}: {e}", cfg.model.display())))?;
    Ok(Engine::start(files, &cfg.devices, cfg.engine.clone())?)
}

/// A stable label for an engine error, like an OpenAI `error.type`.
pub fn error_kind(e: &EngineError) -> &'static str {
    match e {
        EngineError::Overloaded { .. } => "overloaded",
        EngineError::InvalidRequest { .. } => "invalid_request",
        EngineError::ContextLength { .. } => "context_length",
        EngineError::LaneFailed { .. } => "lane_failed",
        EngineError::Stalled { .. } => "stalled",
        EngineError::ShuttingDown => "shutting_down",
        EngineError::Load(_) => "load",
    }
}

/// Submits requests to an engine and times their token events.
#[derive(Clone)]
pub struct OfflineTarget {
    client: EngineClient,
    ignore_eos: bool,
    temperature: f32,
}

impl OfflineTarget {
    /// A target for `client`; each request asks for `ignore_eos` and `temperature`.
    pub fn new(client: EngineClient, ignore_eos: bool, temperature: f32) -> Self {
        Self {
            client,
            ignore_eos,
            temperature,
        }
    }

    /// Runs one request; timing starts when this future is first polled. A delta carrying
    /// tokens counts as a chunk (the engine's equivalent of an SSE chunk).
    pub async fn send(
        &self,
        info: SampleInfo,
        prompt_ids: Vec<u32>,
        run_start: Instant,
    ) -> RequestRecord {
        let req = GenerateRequest {
            prompt_ids,
            prompt_param: "prompt",
            params: SamplingParams {
                temperature: self.temperature,
                ..SamplingParams::greedy()
            },
            max_tokens: Some(info.requested_output_tokens),
            stop: StopCriteria {
                ignore_eos: self.ignore_eos,
                ..StopCriteria::default()
            },
            n: 1,
            priority: 0,
            constraint: None,
        };
        let mut timer = Timer::start(run_start);
        let mut stream = match self.client.submit(req) {
            Ok(s) => s,
            Err(e) => {
                return timer.finish(
                    info,
                    None,
                    Some(Failure::new(error_kind(&e), e.to_string())),
                );
            }
        };
        while let Some(ev) = stream.next_event().await {
            match ev {
                StreamEvent::Delta { tokens, .. } if !tokens.is_empty() => {
                    timer.chunk(Instant::now())
                }
                StreamEvent::Delta { .. }
                | StreamEvent::PromptLogprobs { .. }
                | StreamEvent::Finish { .. } => {}
                StreamEvent::Done { usage, .. } => {
                    return timer.finish(
                        info,
                        Some((usage.prompt_tokens, usage.completion_tokens)),
                        None,
                    );
                }
                StreamEvent::Error(e) => {
                    return timer.finish(
                        info,
                        None,
                        Some(Failure::new(error_kind(&e), e.to_string())),
                    );
                }
            }
        }
        timer.finish(
            info,
            None,
            Some(Failure::new(
                "incomplete_stream",
                "the engine stream ended without Done",
            )),
        )
    }
}
