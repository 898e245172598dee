//! The OpenAI-compatible HTTP API on actix-web: routes, wire types, SSE, errors, auth, server.

pub mod auth;
pub mod cancel;
pub mod chat;
pub mod clock;
pub mod completions;
mod drain;
pub mod embeddings;
pub mod errors;
pub mod extract;
pub mod fdlimit;
pub mod generation;
pub mod health;
pub mod inflight;
pub mod logprobs;
pub mod messages;
pub mod models;
pub mod openapi;
pub mod overload;
pub mod request_id;
pub mod responses;
pub mod serve;
pub mod sse;
pub mod state;
pub mod structured;
pub mod tokenize;
pub mod tools;
pub mod types;
pub mod validate;

use std::net::{SocketAddr, TcpListener};
use std::thread::JoinHandle;
use std::time::Duration;

use actix_cors::Cors;
use actix_web::dev::ServerHandle;
use actix_web::middleware::{Condition, from_fn};
use actix_web::web::{self, Data};
use actix_web::{App, HttpRequest, HttpServer};
use utoipa::OpenApi;
use utoipa_swagger_ui::SwaggerUi;

pub use drain::Drain;
pub use errors::ApiError;
pub use openapi::{ApiDoc, openapi_json};
pub use state::AppState;

use crate::config::ServerConfig;

/// Id, creation time, model name and fingerprint shared by every chunk of one response.
#[derive(Debug, Clone)]
pub struct ResponseMeta {
    pub id: String,
    pub created: u64,
    pub model: String,
    /// The `system_fingerprint` (empty from [`ResponseMeta::new`]).
    pub fingerprint: String,
}

impl ResponseMeta {
    /// A fresh `PREFIX-<32 hex digits>` id stamped now.
    pub fn new(prefix: &str, model: &str) -> Self {
        Self {
            id: format!("{prefix}-{:032x}", rand::random::<u128>()),
            created: clock::unix_now(),
            model: model.to_string(),
            fingerprint: String::new(),
        }
    }

    /// [`ResponseMeta::new`] for the served model, with its `system_fingerprint`.
    pub fn served(prefix: &str, ready: &state::Ready) -> Self {
        Self {
            fingerprint: ready.fingerprint.clone(),
            ..Self::new(prefix, &ready.model_name)
        }
    }
}

/// Runs CPU work (tokenizing, template rendering) on actix's blocking pool, off the workers.
pub async fn blocking<T, F>(f: F) -> Result<T, ApiError>
where
    F: FnOnce() -> Result<T, ApiError> + Send + 'static,
    T: Send + 'static,
{
    web::block(f)
        .await
        .map_err(|e| ApiError::Internal(format!("blocking task failed: {e}")))?
}

async fn not_found(req: HttpRequest) -> Result<actix_web::HttpResponse, ApiError> {
    Err(ApiError::RouteNotFound {
        method: req.method().to_string(),
        path: req.path().to_string(),
    })
}

/// Registers every route (used by the server and by in-process tests).
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(completions::completions)
        .service(chat::chat_completions)
        .service(messages::create_message)
        .service(messages::count_tokens)
        .service(embeddings::embeddings)
        .service(responses::create_response)
        .service(responses::input_items)
        .service(responses::cancel_response)
        .service(responses::get_response)
        .service(responses::delete_response)
        .service(models::list_models)
        .service(models::retrieve_model)
        .service(tokenize::tokenize)
        .service(tokenize::detokenize)
        .service(tokenize::tokenizer_info)
        .service(health::health)
        .service(health::metrics)
        .service(SwaggerUi::new("/docs/{_:.*}").url("/openapi.json", ApiDoc::openapi()))
        .route(
            "/docs",
            web::get().to(|| async {
                actix_web::HttpResponse::PermanentRedirect()
                    .insert_header(("Location", "/docs/"))
                    .finish()
            }),
        );
}

fn cors(server: &ServerConfig) -> Cors {
    let mut c = Cors::default()
        .allowed_methods(["GET", "POST", "DELETE", "OPTIONS"])
        // Whatever headers an allowed origin's preflight asks for (the OpenAI and Anthropic
        // JS SDKs send `X-Stainless-*`, `anthropic-version`, `x-api-key`): the origin list is
        // the policy, as vLLM's `allowed_headers = ["*"]`.
        .allow_any_header()
        .max_age(3600);
    for origin in &server.cors_allowed_origins {
        c = if origin == "*" {
            c.allow_any_origin()
        } else {
            c.allowed_origin(origin)
        };
    }
    c
}

/// A running HTTP server on its own thread (with its own actix system).
pub struct Server {
    addr: SocketAddr,
    handle: ServerHandle,
    stop: tokio::sync::mpsc::Sender<()>,
    thread: JoinHandle<std::io::Result<()>>,
}

/// Sizes derived from the config once, for all workers.
struct Sizing {
    workers: usize,
    /// Connections per worker (actix counts them per worker).
    connections: usize,
    /// Blocking threads per worker.
    blocking: usize,
}

impl Sizing {
    fn new(server: &ServerConfig) -> Self {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let workers = if server.workers == 0 {
            cores
        } else {
            server.workers
        };
        let total_connections = fdlimit::connection_bound(server.max_connections);
        if total_connections < server.max_connections {
            tracing::warn!(
                max_connections = total_connections,
                configured = server.max_connections,
                "server.max_connections lowered to fit the open-file limit"
            );
        }
        let blocking = if server.blocking_threads == 0 {
            cores
        } else {
            server.blocking_threads
        };
        Self {
            workers,
            connections: total_connections.div_ceil(workers).max(1),
            blocking: blocking.div_ceil(workers).max(1),
        }
    }
}

impl Server {
    /// Serves `state` on `listener` (bind `127.0.0.1:0` for an ephemeral port). The state is
    /// built once by the caller; the per-worker factory only clones its `Arc`. Bound to a
    /// loopback address, only loopback `Host` names (and `server.allowed_hosts`) are served.
    pub fn start(state: Data<AppState>, listener: TcpListener) -> std::io::Result<Server> {
        let addr = listener.local_addr()?;
        let server_cfg = state.config.server.clone();
        let sizing = Sizing::new(&server_cfg);
        let hosts = addr
            .ip()
            .is_loopback()
            .then(|| auth::LoopbackHosts::new(&server_cfg.allowed_hosts));
        let (drain, stopper, stop) = drain::channel();
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("kiln-http".into())
            .spawn(move || {
                actix_web::rt::System::new().block_on(async move {
                    let cors_on = !server_cfg.cors_allowed_origins.is_empty();
                    let factory_cfg = server_cfg.clone();
                    let built = HttpServer::new(move || {
                        let mut app = App::new().app_data(state.clone()).app_data(drain.clone());
                        if let Some(h) = &hosts {
                            app = app.app_data(h.clone());
                        }
                        app.wrap(from_fn(overload::limit))
                            .wrap(from_fn(auth::guard))
                            .wrap(from_fn(messages::rewrite))
                            .wrap(Condition::new(cors_on, cors(&factory_cfg)))
                            .wrap(from_fn(request_id::tag))
                            .configure(routes)
                            .default_service(web::to(not_found))
                    })
                    .workers(sizing.workers)
                    .max_connections(sizing.connections)
                    .worker_max_blocking_threads(sizing.blocking)
                    .disable_signals()
                    .shutdown_timeout(server_cfg.shutdown_timeout_s)
                    .h1_allow_half_closed(false)
                    // Stream tokens as they come: without TCP_NODELAY a small SSE frame on a
                    // kept-alive connection waits ~40 ms for the client's delayed ACK.
                    .on_connect(|conn, _ext| {
                        if let Some(sock) = conn.downcast_ref::<actix_web::rt::net::TcpStream>() {
                            let _ = sock.set_nodelay(true);
                        }
                    })
                    .listen(listener);
                    let server = match built {
                        Ok(s) => s.run(),
                        Err(e) => {
                            let _ = tx.send(Err(e));
                            return Ok(());
                        }
                    };
                    let drain_limit = Duration::from_secs(server_cfg.shutdown_timeout_s);
                    actix_web::rt::spawn(stopper.run(server.handle(), drain_limit));
                    let _ = tx.send(Ok(server.handle()));
                    server.await
                })
            })?;
        let handle = rx
            .recv()
            .map_err(|_| std::io::Error::other("the HTTP server thread exited during start"))??;
        Ok(Server {
            addr,
            handle,
            stop,
            thread,
        })
    }

    /// Stops the server as SIGTERM does: no new connections, in-flight requests finish, and
    /// streams still open after `server.shutdown_timeout_s` end with an error frame and
    /// `[DONE]`. Returns at once; [`Server::join`] waits for the end.
    pub fn shutdown(&self) {
        let _ = self.stop.try_send(());
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A handle to stop the server at once (`stop(true)` waits for in-flight requests up to
    /// the shutdown timeout but does not end open streams cleanly; see [`Server::shutdown`]).
    pub fn handle(&self) -> ServerHandle {
        self.handle.clone()
    }

    /// Waits until the server stops (SIGTERM, SIGINT, or [`ServerHandle::stop`]).
    pub fn join(self) -> std::io::Result<()> {
        self.thread
            .join()
            .map_err(|_| std::io::Error::other("the HTTP server thread panicked"))?
    }
}
