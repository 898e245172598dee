//! The edge guard: header size limit, API keys (constant-time), OpenAI bodies for 405, and
//! the errors metric (one place sees every error response).

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::StatusCode;
use actix_web::http::header::AUTHORIZATION;
use actix_web::middleware::Next;
use actix_web::web::Data;
use actix_web::{Error, ResponseError};
use subtle::{Choice, ConstantTimeEq};

use super::errors::{ApiError, ErrorType};
use super::state::AppState;

/// Routes reachable without a key.
const OPEN_PATHS: &[&str] = &["/health"];

/// Whether the `Authorization: Bearer KEY` header carries one of `keys`. Every key is compared
/// in constant time (only the lengths can be told apart).
pub fn authorized(header: Option<&str>, keys: &[String]) -> bool {
    let Some(token) = header.and_then(bearer) else {
        return false;
    };
    let mut ok = Choice::from(0);
    for k in keys {
        ok |= token.as_bytes().ct_eq(k.as_bytes());
    }
    ok.into()
}

fn bearer(h: &str) -> Option<&str> {
    let (scheme, token) = h.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Checks a request before any handler runs; counts error responses after.
pub async fn guard<B: MessageBody + 'static>(
    req: ServiceRequest,
    next: Next<B>,
) -> Result<ServiceResponse<EitherBody<B>>, Error> {
    let Some(state) = req.app_data::<Data<AppState>>().cloned() else {
        return next
            .call(req)
            .await
            .map(ServiceResponse::map_into_left_body);
    };
    let server = &state.config.server;
    let header_bytes: usize = req
        .headers()
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len())
        .sum();
    let rejection = if header_bytes > server.max_header_bytes {
        Some(ApiError::HeadersTooLarge {
            limit: server.max_header_bytes,
        })
    } else if !server.api_keys.is_empty() && !OPEN_PATHS.contains(&req.path()) {
        let header = req
            .headers()
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        (!authorized(header, &server.api_keys)).then_some(ApiError::Unauthorized)
    } else {
        None
    };
    if let Some(e) = rejection {
        state.metrics.observe_error(e.error_type());
        return Ok(req.into_response(e.error_response()).map_into_right_body());
    }
    let (method, path) = (req.method().to_string(), req.path().to_string());
    let res = next.call(req).await?;
    if let Some(t) = res.response().extensions().get::<ErrorType>() {
        state.metrics.observe_error(t.0);
    } else if res.status() == StatusCode::METHOD_NOT_ALLOWED {
        let e = ApiError::MethodNotAllowed { method, path };
        state.metrics.observe_error(e.error_type());
        let (req, _) = res.into_parts();
        return Ok(ServiceResponse::new(req, e.error_response()).map_into_right_body());
    }
    Ok(res.map_into_left_body())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_keys() {
        let keys = vec!["sk-one".to_string(), "sk-two".to_string()];
        assert!(authorized(Some("Bearer sk-two"), &keys));
        assert!(authorized(Some("bearer  sk-one "), &keys));
        assert!(!authorized(Some("Bearer sk-three"), &keys));
        assert!(!authorized(Some("Basic sk-one"), &keys));
        assert!(!authorized(Some("sk-one"), &keys));
        assert!(!authorized(None, &keys));
        assert!(!authorized(Some("Bearer "), &keys));
    }
}
