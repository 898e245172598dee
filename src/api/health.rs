//! `GET /health` (no key needed) and `GET /metrics` (Prometheus text).

use actix_web::web::Data;
use actix_web::{HttpResponse, get, route};

use super::errors::ApiError;
use super::state::AppState;
use super::types::{ErrorResponse, HealthResponse};

/// 200 once the model is loaded and every lane is healthy; 503 before and after a lane failure.
/// `HEAD /health` answers the same status (load balancers probe with either).
#[utoipa::path(
    get,
    path = "/health",
    tag = "kiln",
    responses(
        (status = 200, description = "Ready", body = HealthResponse),
        (status = 503, description = "Loading, or a lane failed", body = ErrorResponse),
    )
)]
#[route("/health", method = "GET", method = "HEAD")]
pub async fn health(state: Data<AppState>) -> Result<HttpResponse, ApiError> {
    let ready = state.ready()?;
    if !ready.client.is_healthy() {
        return Err(ApiError::Unavailable {
            message: "a lane failed; see the server log".into(),
            code: "lane_failed",
        });
    }
    Ok(HttpResponse::Ok().json(HealthResponse {
        status: "ok".into(),
    }))
}

/// Prometheus metrics (text exposition format 0.0.4).
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "kiln",
    responses(
        (status = 200, description = "Metrics in Prometheus text format", body = String, content_type = "text/plain"),
        (status = 401, description = "Missing or wrong API key", body = ErrorResponse),
    ),
    security(("bearer" = []))
)]
#[get("/metrics")]
pub async fn metrics(state: Data<AppState>) -> HttpResponse {
    let stats = state.ready().ok().map(|r| r.client.stats());
    state.metrics.set_in_flight(state.in_flight.current());
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(state.metrics.render(stats.as_ref()))
}
