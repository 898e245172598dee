//! `kiln serve`: config, model, engine, then the HTTP server; SIGTERM drains and exits.

use std::net::TcpListener;
use std::time::Instant;

use actix_web::web::Data;
use anyhow::{Context, Result};

use super::{AppState, Server};
use crate::config::{Config, HubSettings, ServeArgs};
use crate::engine::Engine;
use crate::model::ModelFiles;

/// Loads the model (with progress), starts the lanes and waits until they are ready, then
/// binds and serves until SIGTERM/SIGINT, draining in-flight requests (bounded by
/// `server.shutdown_timeout_s`) before the engine stops.
pub fn run(args: &ServeArgs) -> Result<()> {
    let config = Config::load(args)?;
    match super::fdlimit::raise_nofile() {
        Ok((before, after)) => tracing::info!(
            before,
            after,
            "open-file limit (RLIMIT_NOFILE soft) raised to the hard limit"
        ),
        Err(e) => tracing::warn!(error = %e, "cannot raise the open-file limit"),
    }
    let devices = config.model.parsed_devices()?;
    let path = config.model_path(&HubSettings::from_env())?;
    tracing::info!(
        model = %path.display(),
        devices = ?devices.iter().map(ToString::to_string).collect::<Vec<_>>(),
        backends = %crate::metrics::compiled_backends(),
        version = env!("CARGO_PKG_VERSION"),
        "starting"
    );
    let t0 = Instant::now();
    // The tokenizer builds on a thread of its own while the lanes load the weights.
    let (files, tokenizer) = ModelFiles::open_overlapped(&path, config.model.load_format)
        .with_context(|| crate::config::opening_model(&path))?;
    tracing::info!(
        open_s = t0.elapsed().as_secs_f64(),
        "start-up: model file opened (header; the tokenizer builds alongside the lanes)"
    );
    let engine = Engine::start_overlapped(files, Some(tokenizer), &devices, config.engine.clone())
        .context("starting the engine")?;
    let client = engine.client();
    tracing::info!(
        model = client.model_name(),
        max_model_len = client.max_model_len(),
        load_s = t0.elapsed().as_secs_f64(),
        "engine ready"
    );
    let addr = format!("{}:{}", config.server.host, config.server.port);
    let keyless = config.server.api_keys.is_empty();
    let state = Data::new(AppState::new(config));
    state.set_engine(client)?;
    let listener = TcpListener::bind(&addr).with_context(|| format!("binding {addr}"))?;
    if keyless && !listener.local_addr()?.ip().is_loopback() {
        tracing::warn!(
            %addr,
            "serving beyond loopback without an API key: anyone who can reach this address can \
             use the model; set --api-key (KILN_API_KEY) or bind 127.0.0.1"
        );
    }
    let server = Server::start(state, listener)?;
    tracing::info!("listening on http://{}", server.addr());
    let result = server.join();
    tracing::info!("HTTP server stopped; stopping the engine");
    engine.shutdown();
    result.context("HTTP server")
}
