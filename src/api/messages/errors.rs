//! Errors on the Messages routes in Anthropic's shape: `{"type": "error", "error": {"type",
//! "message"}}` with Anthropic's status codes (529 for an overloaded server). One middleware
//! rewrites every Kiln error answered on those paths (handlers, body extraction, the auth
//! and in-flight guards), so no route keeps an OpenAI body.

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::StatusCode;
use actix_web::http::header::{HeaderValue, RETRY_AFTER};
use actix_web::middleware::Next;
use actix_web::{Error, HttpResponse};

use super::types::{AnthropicErrorDetail, AnthropicErrorResponse};
use crate::api::errors::{ApiError, ErrorType};

/// Whether `path` is one of the Anthropic routes.
pub fn is_route(path: &str) -> bool {
    path == "/v1/messages" || path.starts_with("/v1/messages/")
}

/// 529: Anthropic's status for an overloaded service.
fn overloaded() -> StatusCode {
    StatusCode::from_u16(529).unwrap_or(StatusCode::SERVICE_UNAVAILABLE)
}

/// Anthropic's status and `error.type` for `e`.
pub fn status_and_type(e: &ApiError) -> (StatusCode, &'static str) {
    match e {
        ApiError::InvalidRequest { .. }
        | ApiError::MethodNotAllowed { .. }
        | ApiError::BodyTimeout { .. }
        | ApiError::UnsupportedMediaType { .. } => {
            (StatusCode::BAD_REQUEST, "invalid_request_error")
        }
        ApiError::HeadersTooLarge { .. } => (
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "invalid_request_error",
        ),
        ApiError::Unauthorized => (StatusCode::UNAUTHORIZED, "authentication_error"),
        ApiError::HostNotAllowed { .. } => (StatusCode::FORBIDDEN, "permission_error"),
        ApiError::ModelNotFound(_) | ApiError::RouteNotFound { .. } | ApiError::NotFound { .. } => {
            (StatusCode::NOT_FOUND, "not_found_error")
        }
        ApiError::PayloadTooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, "request_too_large"),
        ApiError::Overloaded { .. } => (StatusCode::TOO_MANY_REQUESTS, "rate_limit_error"),
        ApiError::ServerOverloaded { .. } | ApiError::Unavailable { .. } => {
            (overloaded(), "overloaded_error")
        }
        ApiError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "api_error"),
    }
}

/// The `{"type": "error", ...}` body of `e`.
pub fn body(e: &ApiError) -> AnthropicErrorResponse {
    AnthropicErrorResponse {
        kind: "error".into(),
        error: AnthropicErrorDetail {
            kind: status_and_type(e).1.into(),
            message: e.to_string(),
        },
    }
}

/// The whole response for `e`: Anthropic's status and body, `Retry-After` where Kiln sends
/// one, and the OpenAI `error.type` kept for the errors metric.
pub fn response(e: &ApiError) -> HttpResponse {
    let mut res = HttpResponse::build(status_and_type(e).0).json(body(e));
    if let ApiError::Overloaded { retry_after_s, .. }
    | ApiError::ServerOverloaded { retry_after_s, .. } = e
    {
        res.headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(*retry_after_s));
    }
    res.extensions_mut().insert(ErrorType(e.error_type()));
    res
}

/// Runs outside [`crate::api::auth::guard`]: on the Messages paths, an error response that
/// carries its [`ApiError`] is answered again in Anthropic's shape.
pub async fn rewrite<B: MessageBody + 'static>(
    req: ServiceRequest,
    next: Next<B>,
) -> Result<ServiceResponse<BoxBody>, Error> {
    let anthropic = is_route(req.path());
    let res = next.call(req).await?.map_into_boxed_body();
    if !anthropic {
        return Ok(res);
    }
    let Some(e) = res.response().extensions().get::<ApiError>().cloned() else {
        return Ok(res);
    };
    let (req, _) = res.into_parts();
    Ok(ServiceResponse::new(req, response(&e)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_follow_anthropic() {
        let cases = [
            (
                ApiError::invalid("max_tokens", "x"),
                400,
                "invalid_request_error",
            ),
            (ApiError::Unauthorized, 401, "authentication_error"),
            (ApiError::ModelNotFound("m".into()), 404, "not_found_error"),
            (
                ApiError::PayloadTooLarge { limit: 1 },
                413,
                "request_too_large",
            ),
            (
                ApiError::Overloaded {
                    waiting: 1,
                    retry_after_s: 1,
                },
                429,
                "rate_limit_error",
            ),
            (
                ApiError::ServerOverloaded {
                    max_in_flight: 1,
                    retry_after_s: 1,
                },
                529,
                "overloaded_error",
            ),
            (ApiError::Internal("x".into()), 500, "api_error"),
        ];
        for (e, status, kind) in cases {
            let res = response(&e);
            assert_eq!(res.status().as_u16(), status, "{e}");
            let b = serde_json::to_value(body(&e)).unwrap();
            assert_eq!(b["type"], "error");
            assert_eq!(b["error"]["type"], kind);
            assert!(!b["error"]["message"].as_str().unwrap().is_empty());
        }
        assert!(is_route("/v1/messages") && is_route("/v1/messages/count_tokens"));
        assert!(!is_route("/v1/messagesx") && !is_route("/v1/chat/completions"));
    }
}
