//! Shared server state, built once before the HTTP workers start.

use super::clock::unix_now;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use super::errors::ApiError;
use super::fdlimit;
use super::inflight::InFlight;
use super::logprobs::TokenTexts;
use crate::config::Config;
use crate::engine::EngineClient;
use crate::metrics::Metrics;
use crate::tokenizer::Tokenizer;
use crate::tokenizer::chat::ChatTemplate;

/// What the handlers need once the engine is up.
pub struct Ready {
    pub client: EngineClient,
    pub tokenizer: Arc<Tokenizer>,
    pub template: Arc<ChatTemplate>,
    /// The model's `tool_use` template, for requests with tools (see [`Ready::template_for`]).
    pub tool_template: Option<Arc<ChatTemplate>>,
    pub token_texts: Arc<TokenTexts>,
    /// The name clients send as `model`.
    pub model_name: String,
    /// Unix seconds when the engine became ready (the model card's `created`).
    pub created: u64,
    /// `system_fingerprint` of every chat and completion response (see [`fingerprint`]).
    pub fingerprint: String,
}

impl Ready {
    /// The template to render a conversation with: the model's `tool_use` one when the
    /// request offers tools and the model has one, else the default.
    pub fn template_for(&self, has_tools: bool) -> &Arc<ChatTemplate> {
        match &self.tool_template {
            Some(t) if has_tools => t,
            _ => &self.template,
        }
    }

    /// 404 unless `model` is absent or names the served model.
    pub fn check_model(&self, model: Option<&str>) -> Result<(), ApiError> {
        match model {
            None => Ok(()),
            Some(m) if m == self.model_name || m == self.client.model_name() => Ok(()),
            Some(m) => Err(ApiError::ModelNotFound(m.to_string())),
        }
    }
}

/// State shared by every worker (wrapped in `web::Data`, i.e. one `Arc`).
pub struct AppState {
    pub config: Config,
    pub metrics: Metrics,
    /// Requests in flight, bounded by `server.max_in_flight` (see [`super::inflight`]).
    pub in_flight: InFlight,
    /// The Responses API's store and in-flight responses.
    pub responses: super::responses::Responses,
    ready: OnceLock<Ready>,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("ready", &self.ready.get().is_some())
            .finish_non_exhaustive()
    }
}

/// `fp_` and 10 hex digits of an FNV-1a hash of what decides the outputs: Kiln's version, the
/// model, the lanes' device kinds (indexes dropped) and the GPU dtype. Stable across restarts
/// of the same build on the same model and devices.
pub fn fingerprint(client: &EngineClient) -> String {
    let stats = client.stats();
    let devices: Vec<&str> = stats
        .lanes
        .iter()
        .map(|l| l.device.split(':').next().unwrap_or_default())
        .collect();
    let cfg = client.config();
    let text = format!(
        "kiln {}\0{}\0{}\0{:?}\0tp{}",
        env!("CARGO_PKG_VERSION"),
        client.model_name(),
        devices.join(","),
        cfg.gpu_dtype,
        cfg.tensor_parallel_size,
    );
    let hash = text.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("fp_{:010x}", hash >> 24)
}

impl AppState {
    /// State with no engine yet: every model route answers 503 until [`AppState::set_engine`].
    /// `server.max_in_flight` is lowered, with a warning, to stay below the connection bound.
    pub fn new(config: Config) -> Self {
        let server = &config.server;
        let connections = fdlimit::connection_bound(server.max_connections);
        let cap = InFlight::effective_cap(server.max_in_flight, connections);
        if cap < server.max_in_flight {
            tracing::warn!(
                max_in_flight = cap,
                configured = server.max_in_flight,
                max_connections = connections,
                "server.max_in_flight lowered to stay below the connection bound"
            );
        }
        Self {
            in_flight: InFlight::new(cap),
            responses: super::responses::Responses::new(config.responses.clone()),
            config,
            metrics: Metrics::new(),
            ready: OnceLock::new(),
        }
    }

    /// Makes the engine available; compiles the chat template (the default one when the
    /// model has none, or when the model's does not compile, with a warning).
    pub fn set_engine(&self, client: EngineClient) -> Result<(), ApiError> {
        let tokenizer = client
            .tokenizer()
            .ok_or_else(|| ApiError::Internal("the model has no tokenizer".into()))?;
        let template = match ChatTemplate::for_tokenizer(&tokenizer) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(error = %e, "the model's chat template does not compile; using the default");
                let bos = tokenizer.bos_id().and_then(|id| tokenizer.id_to_piece(id));
                let eos = tokenizer
                    .eos_ids()
                    .first()
                    .and_then(|&id| tokenizer.id_to_piece(id));
                ChatTemplate::default_for(&bos.unwrap_or_default(), &eos.unwrap_or_default())?
            }
        };
        let tool_template = match ChatTemplate::tool_use_for_tokenizer(&tokenizer) {
            Some(Ok(t)) => Some(Arc::new(t)),
            Some(Err(e)) => {
                tracing::warn!(error = %e, "the model's `tool_use` chat template does not compile; requests with tools use the default one");
                None
            }
            None => None,
        };
        if template.is_default() {
            tracing::info!("the model has no chat template; chat uses the built-in default");
        }
        let model_name = self
            .config
            .model
            .served_model_name
            .clone()
            .unwrap_or_else(|| client.model_name().to_string());
        let ready = Ready {
            token_texts: Arc::new(TokenTexts::new(&tokenizer)),
            tokenizer,
            template: Arc::new(template),
            tool_template,
            model_name,
            created: unix_now(),
            fingerprint: fingerprint(&client),
            client,
        };
        self.ready
            .set(ready)
            .map_err(|_| ApiError::Internal("the engine was set twice".into()))
    }

    /// The engine, or 503 while it loads.
    pub fn ready(&self) -> Result<&Ready, ApiError> {
        self.ready.get().ok_or_else(ApiError::not_ready)
    }

    /// Whether the engine is loaded and every lane is healthy.
    pub fn is_healthy(&self) -> bool {
        self.ready.get().is_some_and(|r| r.client.is_healthy())
    }

    /// Idle time after which a stream sends a keep-alive comment.
    pub fn keep_alive(&self) -> Duration {
        Duration::from_secs_f64(self.config.server.sse_keep_alive_s.clamp(0.01, 3600.0))
    }
}
