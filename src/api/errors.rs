//! The one mapping from errors to HTTP: OpenAI-style `{"error": {...}}` bodies with string codes.

use actix_web::http::StatusCode;
use actix_web::http::header::{HeaderValue, RETRY_AFTER};
use actix_web::{HttpResponse, ResponseError};

use super::types::{ErrorDetail, ErrorResponse};
use crate::engine::EngineError;
use crate::tokenizer::TokenizerError;
use crate::tokenizer::chat::ChatTemplateError;

/// Everything a request can fail with.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ApiError {
    /// 400: the request is malformed or asks for something impossible.
    #[error("{message}")]
    InvalidRequest {
        param: Option<String>,
        message: String,
        code: &'static str,
    },
    /// 401: missing or wrong API key.
    #[error("invalid or missing API key")]
    Unauthorized,
    /// 404: no such model (the name echoed shortened: [`shorten`]).
    #[error("The model `{}` does not exist.", shorten(.0))]
    ModelNotFound(String),
    /// 404: no stored object with this id (`param` names the field or path segment).
    #[error("{what} with id '{}' not found.", shorten(id))]
    NotFound {
        what: &'static str,
        id: String,
        param: &'static str,
    },
    /// 404: no such route.
    #[error("no route for {} {}", shorten(method), shorten(path))]
    RouteNotFound { method: String, path: String },
    /// 405: the route exists with another method.
    #[error("method {} is not allowed for {}", shorten(method), shorten(path))]
    MethodNotAllowed { method: String, path: String },
    /// 403: the `Host` header (or an absolute-form target's host) names a host this server
    /// does not answer for.
    #[error(
        "the Host {:?} is not allowed; a server bound to a loopback address answers only loopback names unless `server.allowed_hosts` lists others",
        shorten(host)
    )]
    HostNotAllowed { host: String },
    /// 408: the request body did not arrive in time.
    #[error("the request body did not arrive within {timeout_s} s")]
    BodyTimeout { timeout_s: f64 },
    /// 415: the body is not plain JSON (wrong `Content-Type` or a `Content-Encoding`).
    #[error("{message}")]
    UnsupportedMediaType { message: String, code: &'static str },
    /// 413: the body is larger than the limit.
    #[error("request body exceeds the limit of {limit} bytes")]
    PayloadTooLarge { limit: usize },
    /// 431: the headers are larger than the limit.
    #[error("request headers exceed the limit of {limit} bytes")]
    HeadersTooLarge { limit: usize },
    /// 429: too many requests are waiting.
    #[error("the server is overloaded ({waiting} requests waiting); retry after {retry_after_s} s")]
    Overloaded { waiting: usize, retry_after_s: u64 },
    /// 503: `server.max_in_flight` requests are in flight; answered at once, never queued.
    #[error(
        "the server is overloaded ({max_in_flight} requests in flight); retry after {retry_after_s} s"
    )]
    ServerOverloaded {
        max_in_flight: usize,
        retry_after_s: u64,
    },
    /// 503: the model is still loading, a lane failed, or the server is stopping.
    #[error("{message}")]
    Unavailable { message: String, code: &'static str },
    /// 500: a bug or an unexpected failure.
    #[error("internal error: {0}")]
    Internal(String),
}

impl ApiError {
    /// A 400 naming `param`.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError::InvalidRequest {
            param: Some(param.into()),
            message: message.into(),
            code: "invalid_value",
        }
    }

    /// A 400 with a specific code.
    pub fn invalid_with_code(
        param: Option<String>,
        message: impl Into<String>,
        code: &'static str,
    ) -> Self {
        ApiError::InvalidRequest {
            param,
            message: message.into(),
            code,
        }
    }

    /// 503 while the engine is not ready.
    pub fn not_ready() -> Self {
        ApiError::Unavailable {
            message: "the model is not ready".into(),
            code: "not_ready",
        }
    }

    /// The OpenAI `error.type`, also the label of the errors metric.
    pub fn error_type(&self) -> &'static str {
        match self {
            ApiError::InvalidRequest { .. }
            | ApiError::MethodNotAllowed { .. }
            | ApiError::PayloadTooLarge { .. }
            | ApiError::HeadersTooLarge { .. }
            | ApiError::HostNotAllowed { .. }
            | ApiError::BodyTimeout { .. }
            | ApiError::UnsupportedMediaType { .. } => "invalid_request_error",
            ApiError::Unauthorized => "authentication_error",
            ApiError::ModelNotFound(_) | ApiError::RouteNotFound { .. } => "not_found_error",
            ApiError::NotFound { .. } => "invalid_request_error",
            ApiError::Overloaded { .. } => "rate_limit_error",
            ApiError::ServerOverloaded { .. } => "server_overloaded",
            ApiError::Unavailable { .. } => "service_unavailable_error",
            ApiError::Internal(_) => "server_error",
        }
    }

    fn code(&self) -> &'static str {
        match self {
            ApiError::InvalidRequest { code, .. }
            | ApiError::Unavailable { code, .. }
            | ApiError::UnsupportedMediaType { code, .. } => code,
            ApiError::HostNotAllowed { .. } => "host_not_allowed",
            ApiError::BodyTimeout { .. } => "request_timeout",
            ApiError::Unauthorized => "invalid_api_key",
            ApiError::ModelNotFound(_) => "model_not_found",
            ApiError::RouteNotFound { .. } | ApiError::NotFound { .. } => "not_found",
            ApiError::MethodNotAllowed { .. } => "method_not_allowed",
            ApiError::PayloadTooLarge { .. } => "payload_too_large",
            ApiError::HeadersTooLarge { .. } => "headers_too_large",
            ApiError::Overloaded { .. } => "overloaded",
            ApiError::ServerOverloaded { .. } => "max_in_flight_exceeded",
            ApiError::Internal(_) => "internal_error",
        }
    }

    fn param(&self) -> Option<String> {
        match self {
            ApiError::InvalidRequest { param, .. } => param.clone(),
            ApiError::ModelNotFound(_) => Some("model".into()),
            ApiError::NotFound { param, .. } => Some((*param).into()),
            _ => None,
        }
    }

    /// The `{"error": {...}}` body.
    pub fn body(&self) -> ErrorResponse {
        ErrorResponse {
            error: ErrorDetail {
                message: cap_message(self.to_string()),
                kind: self.error_type().into(),
                param: self.param(),
                code: self.code().into(),
            },
        }
    }
}

/// Most bytes of a client's own text (a model name, a path, a `Host`) an error message
/// echoes; past it the text is cut and its length said.
const ECHO_BYTES: usize = 256;

/// Most bytes of any error message: whatever a message quotes (a grammar library's error, a
/// tokenizer's), a client never gets megabytes back.
const MESSAGE_BYTES: usize = 4096;

/// `text` whole when short, else its first [`ECHO_BYTES`] (cut at a character) and its size.
pub fn shorten(text: &str) -> std::borrow::Cow<'_, str> {
    if text.len() <= ECHO_BYTES {
        return text.into();
    }
    let cut = text.floor_char_boundary(ECHO_BYTES);
    format!("{}... ({} bytes)", &text[..cut], text.len()).into()
}

/// `message` cut to [`MESSAGE_BYTES`] (at a character), saying so.
fn cap_message(mut message: String) -> String {
    if message.len() > MESSAGE_BYTES {
        let len = message.len();
        message.truncate(message.floor_char_boundary(MESSAGE_BYTES));
        message.push_str(&format!("... (message cut, {len} bytes)"));
    }
    message
}

/// Marks a response as an error of this type, for the errors metric.
#[derive(Debug, Clone, Copy)]
pub struct ErrorType(pub &'static str);

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::InvalidRequest { .. } => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::ModelNotFound(_)
            | ApiError::RouteNotFound { .. }
            | ApiError::NotFound { .. } => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::HostNotAllowed { .. } => StatusCode::FORBIDDEN,
            ApiError::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            ApiError::UnsupportedMediaType { .. } => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::HeadersTooLarge { .. } => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            ApiError::Overloaded { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Unavailable { .. } | ApiError::ServerOverloaded { .. } => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        let mut res = HttpResponse::build(self.status_code()).json(self.body());
        if let ApiError::Overloaded { retry_after_s, .. }
        | ApiError::ServerOverloaded { retry_after_s, .. } = self
        {
            res.headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from(*retry_after_s));
        }
        if matches!(self, ApiError::Unauthorized) {
            res.headers_mut().insert(
                actix_web::http::header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer"),
            );
        }
        res.extensions_mut().insert(ErrorType(self.error_type()));
        // For routes that answer in another API's shape (`messages::errors::rewrite`).
        res.extensions_mut().insert(self.clone());
        res
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::Overloaded {
                waiting,
                retry_after_s,
            } => ApiError::Overloaded {
                waiting,
                retry_after_s: retry_after_s.max(1),
            },
            EngineError::InvalidRequest { param, message } => ApiError::InvalidRequest {
                param: param.map(str::to_string),
                message,
                code: "invalid_value",
            },
            EngineError::ContextLength { param, message } => ApiError::InvalidRequest {
                param: Some(param.to_string()),
                message,
                code: "context_length_exceeded",
            },
            e @ EngineError::LaneFailed { .. } => ApiError::Unavailable {
                message: e.to_string(),
                code: "lane_failed",
            },
            e @ EngineError::Stalled { .. } => ApiError::Unavailable {
                message: e.to_string(),
                code: "stream_stalled",
            },
            e @ EngineError::ShuttingDown => ApiError::Unavailable {
                message: e.to_string(),
                code: "shutting_down",
            },
            EngineError::Load(m) => ApiError::Internal(m),
        }
    }
}

impl From<ChatTemplateError> for ApiError {
    fn from(e: ChatTemplateError) -> Self {
        match e {
            ChatTemplateError::Render(m) | ChatTemplateError::Limit(m) => {
                ApiError::invalid("messages", m)
            }
            ChatTemplateError::Syntax(m) => ApiError::Internal(format!("chat template: {m}")),
        }
    }
}

impl ApiError {
    /// A tokenizer failure while handling `param`: out-of-vocabulary ids are the client's fault.
    pub fn from_tokenizer(param: &str, e: TokenizerError) -> Self {
        match e {
            TokenizerError::UnknownId { .. } | TokenizerError::Encode(_) => {
                ApiError::invalid(param, e.to_string())
            }
            TokenizerError::TooManyTokens {
                counted,
                max_tokens,
            } => ApiError::invalid_with_code(
                Some(param.to_string()),
                format!(
                    "This model's maximum context length is {max_tokens} tokens. However, your {param} resulted in at least {counted} tokens. Please reduce the length of the {param}."
                ),
                "context_length_exceeded",
            ),
            TokenizerError::TooLong {
                bytes,
                max_bytes,
                max_tokens,
            } => ApiError::invalid_with_code(
                Some(param.to_string()),
                format!(
                    "This model's maximum context length is {max_tokens} tokens. However, your {param} is {bytes} bytes, more than {max_tokens} tokens can hold ({max_bytes} bytes at most). Please reduce the length of the {param}."
                ),
                "context_length_exceeded",
            ),
            other => ApiError::Internal(other.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overloaded_has_retry_after_and_openai_body() {
        let e = ApiError::from(EngineError::Overloaded {
            waiting: 3,
            retry_after_s: 2,
        });
        let res = e.error_response();
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(res.headers().get(RETRY_AFTER).unwrap(), "2");
        let body = serde_json::to_value(e.body()).unwrap();
        assert_eq!(body["error"]["type"], "rate_limit_error");
        assert_eq!(body["error"]["code"], "overloaded");
        assert!(body["error"]["param"].is_null());
    }

    #[test]
    fn server_overloaded_is_503_with_retry_after() {
        let e = ApiError::ServerOverloaded {
            max_in_flight: 2,
            retry_after_s: 1,
        };
        let res = e.error_response();
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(res.headers().get(RETRY_AFTER).unwrap(), "1");
        let body = serde_json::to_value(e.body()).unwrap();
        assert_eq!(body["error"]["type"], "server_overloaded");
        assert_eq!(body["error"]["code"], "max_in_flight_exceeded");
        assert!(body["error"]["message"].as_str().unwrap().contains('2'));
    }

    #[test]
    fn engine_invalid_request_names_param() {
        let e = ApiError::from(EngineError::InvalidRequest {
            param: Some("max_tokens"),
            message: "too long".into(),
        });
        assert_eq!(e.status_code(), StatusCode::BAD_REQUEST);
        assert_eq!(e.body().error.param.as_deref(), Some("max_tokens"));
    }
}
