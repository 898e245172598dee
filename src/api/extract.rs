//! The JSON body extractor: `application/json` only, size- and time-limited, and every type
//! error names the field at fault.

use std::time::Duration;

use actix_web::dev::Payload;
use actix_web::http::header::{CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE, HeaderMap};
use actix_web::web::{BytesMut, Data};
use actix_web::{FromRequest, HttpRequest};
use futures_util::StreamExt;
use futures_util::future::LocalBoxFuture;
use serde::de::DeserializeOwned;
use serde_json::error::Category;

use super::errors::ApiError;
use super::state::AppState;
use super::types::CheckRequest;

/// The body timeout while the server is under pressure ([`under_pressure`]): a body still
/// arriving after this long is dropped with a 408 so that it frees its place and connection.
pub const PRESSED_BODY_TIMEOUT_S: f64 = 1.0;

/// Requests in flight at or past three quarters of `server.max_in_flight` (itself below the
/// connection bound): stalled bodies then hold places others are refused for.
fn under_pressure(state: Option<&Data<AppState>>) -> bool {
    state.is_some_and(|s| s.in_flight.current() * 4 >= s.in_flight.cap() * 3)
}

/// Body limit when no state is configured.
const DEFAULT_LIMIT: usize = 4 << 20;
/// Body timeout (seconds) when no state is configured.
const DEFAULT_TIMEOUT_S: f64 = 30.0;

/// A JSON request body of type `T`. A `Content-Type` other than `application/json` or any
/// `Content-Encoding` is a 415; a body slower than `server.body_timeout_s` a 408. Malformed
/// JSON, a non-object body, a missing field or a field of the wrong type is a 400 whose
/// `param` names the field (`messages[0].content`); so is a combination of fields that
/// [`CheckRequest`] refuses.
#[derive(Debug)]
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned + CheckRequest + 'static> FromRequest for ApiJson<T> {
    type Error = ApiError;
    type Future = LocalBoxFuture<'static, Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let state = req.app_data::<Data<AppState>>().cloned();
        let (limit, timeout_s) = state
            .as_ref()
            .map_or((DEFAULT_LIMIT, DEFAULT_TIMEOUT_S), |s| {
                let server = &s.config.server;
                (server.max_body_bytes, server.body_timeout_s)
            });
        let declared = req
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok());
        let media = check_media(req.headers());
        let mut payload = payload.take();
        Box::pin(async move {
            media?;
            if declared.is_some_and(|n| n > limit) {
                return Err(ApiError::PayloadTooLarge { limit });
            }
            let read = async {
                let mut body = BytesMut::new();
                while let Some(chunk) = payload.next().await {
                    let chunk = chunk.map_err(|e| {
                        ApiError::invalid_with_code(
                            None,
                            format!("cannot read the request body: {e}"),
                            "invalid_body",
                        )
                    })?;
                    if body.len() + chunk.len() > limit {
                        return Err(ApiError::PayloadTooLarge { limit });
                    }
                    body.extend_from_slice(&chunk);
                }
                Ok(body)
            };
            let body = read_within(read, timeout_s, state.as_ref()).await?;
            let value: T = parse_json(&body)?;
            value.check()?;
            Ok(ApiJson(value))
        })
    }
}

/// Awaits `read` for at most `timeout_s`, or [`PRESSED_BODY_TIMEOUT_S`] once the server is
/// [`under_pressure`] (checked as the body arrives): the oldest stalled bodies go first.
async fn read_within<F>(
    read: F,
    timeout_s: f64,
    state: Option<&Data<AppState>>,
) -> Result<BytesMut, ApiError>
where
    F: std::future::Future<Output = Result<BytesMut, ApiError>>,
{
    let start = tokio::time::Instant::now();
    let full = Duration::from_secs_f64(timeout_s);
    let pressed = Duration::from_secs_f64(PRESSED_BODY_TIMEOUT_S.min(timeout_s));
    let mut tick = tokio::time::interval(
        Duration::from_millis(100).min(pressed.max(Duration::from_millis(1))),
    );
    tokio::pin!(read);
    loop {
        tokio::select! {
            body = &mut read => return body,
            _ = tick.tick() => {
                let waited = start.elapsed();
                if waited >= full {
                    return Err(ApiError::BodyTimeout { timeout_s });
                }
                if waited >= pressed && under_pressure(state) {
                    let timeout_s = pressed.as_secs_f64();
                    return Err(ApiError::BodyTimeout { timeout_s });
                }
            }
        }
    }
}

/// 415 unless the body is declared as plain JSON: `Content-Type: application/json` (any
/// parameters, e.g. `; charset=utf-8`) and no `Content-Encoding` (Kiln decodes none).
fn check_media(headers: &HeaderMap) -> Result<(), ApiError> {
    let media = |message: String, code| Err(ApiError::UnsupportedMediaType { message, code });
    let ctype = headers.get(CONTENT_TYPE).map(|v| v.to_str().unwrap_or("?"));
    let essence = ctype.map(|c| c.split(';').next().unwrap_or_default().trim());
    if !essence.is_some_and(|e| e.eq_ignore_ascii_case("application/json")) {
        let got = ctype.map_or("none".to_string(), |c| format!("{c:?}"));
        return media(
            format!(
                "the request body must be sent as `Content-Type: application/json` (got {got})"
            ),
            "unsupported_media_type",
        );
    }
    if let Some(enc) = headers.get(CONTENT_ENCODING) {
        let enc = enc.to_str().unwrap_or("?").trim();
        if !enc.is_empty() && !enc.eq_ignore_ascii_case("identity") {
            return media(
                format!("`Content-Encoding: {enc}` is not supported; send the body uncompressed"),
                "unsupported_content_encoding",
            );
        }
    }
    Ok(())
}

/// Deserializes `body`, turning serde's error into a 400 naming the field.
pub fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::invalid_with_code(
            None,
            "the request body is empty; expected a JSON object",
            "invalid_json",
        ));
    }
    let first = body.iter().find(|b| !b.is_ascii_whitespace());
    if first != Some(&b'{') {
        serde_json::from_slice::<serde::de::IgnoredAny>(body).map_err(|e| describe(".", &e))?;
        return Err(ApiError::invalid_with_code(
            None,
            "the request body must be a JSON object",
            "invalid_type",
        ));
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        describe(&path, &e.into_inner())
    })?;
    de.end().map_err(|e| describe(".", &e))?;
    Ok(value)
}

fn describe(path: &str, e: &serde_json::Error) -> ApiError {
    let root = path == "." || path.is_empty();
    match e.classify() {
        Category::Syntax | Category::Eof | Category::Io => ApiError::invalid_with_code(
            None,
            format!("the request body is not valid JSON: {e}"),
            "invalid_json",
        ),
        Category::Data => {
            let msg = strip_position(&e.to_string());
            if let Some(field) = missing_field(&msg) {
                let param = if root {
                    field.to_string()
                } else {
                    format!("{path}.{field}")
                };
                return ApiError::invalid_with_code(
                    Some(param.clone()),
                    format!("missing required parameter `{param}`"),
                    "missing_required_parameter",
                );
            }
            if root {
                return ApiError::invalid_with_code(
                    None,
                    format!("the request body must be a JSON object of the right shape: {msg}"),
                    "invalid_type",
                );
            }
            let msg = untagged_hint(&msg).map_or(msg, str::to_string);
            ApiError::invalid_with_code(
                Some(path.to_string()),
                format!("invalid `{path}`: {msg}"),
                "invalid_type",
            )
        }
    }
}

/// What the one-of fields accept, in place of serde's "did not match any variant".
fn untagged_hint(msg: &str) -> Option<&'static str> {
    let name = msg.strip_prefix("data did not match any variant of untagged enum ")?;
    Some(match name.trim() {
        "PromptInput" => {
            "expected a string, an array of strings, an array of token ids (non-negative integers) or an array of such arrays"
        }
        "StopSpec" => "expected a string or an array of strings",
        "MessageContent" => "expected a string or an array of content parts",
        _ => return None,
    })
}

/// `missing field `x`` -> `x`.
fn missing_field(msg: &str) -> Option<&str> {
    msg.strip_prefix("missing field `")?.split('`').next()
}

/// Drops serde_json's " at line 1 column 20" suffix.
fn strip_position(msg: &str) -> String {
    match msg.rfind(" at line ") {
        Some(i) => msg[..i].to_string(),
        None => msg.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Inner {
        content: String,
    }

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Req {
        prompt: String,
        #[serde(default)]
        stream: Option<bool>,
        #[serde(default)]
        messages: Vec<Inner>,
    }

    fn param(body: &str) -> (Option<String>, String) {
        let b = parse_json::<Req>(body.as_bytes()).unwrap_err().body().error;
        (b.param, b.code)
    }

    #[test]
    fn errors_name_the_field() {
        assert_eq!(
            param(r#"{"prompt": "x", "stream": "true"}"#),
            (Some("stream".into()), "invalid_type".into())
        );
        assert_eq!(
            param(r#"{"stream": true}"#),
            (Some("prompt".into()), "missing_required_parameter".into())
        );
        assert_eq!(
            param(r#"{"prompt": "x", "messages": [{"content": 5}]}"#),
            (Some("messages[0].content".into()), "invalid_type".into())
        );
        assert_eq!(param(r#"{"prompt": "x""#).1, "invalid_json");
        assert_eq!(param(r#"[1, 2]"#), (None, "invalid_type".into()));
        assert_eq!(param(r#"{"prompt": "x"} trailing"#).1, "invalid_json");
        assert_eq!(param("").1, "invalid_json");
        assert!(parse_json::<Req>(br#"{"prompt": "x", "unknown": 1}"#).is_ok());
    }

    #[test]
    fn only_plain_json_is_accepted() {
        let code = |pairs: &[(&'static str, &'static str)]| {
            let mut h = HeaderMap::new();
            for (k, v) in pairs {
                h.insert(
                    k.parse().unwrap(),
                    actix_web::http::header::HeaderValue::from_static(v),
                );
            }
            check_media(&h).err().map(|e| e.body().error.code)
        };
        assert_eq!(code(&[("content-type", "application/json")]), None);
        assert_eq!(
            code(&[("content-type", "Application/JSON; charset=utf-8")]),
            None
        );
        let ct = Some("unsupported_media_type".to_string());
        assert_eq!(code(&[]), ct);
        assert_eq!(code(&[("content-type", "text/plain")]), ct);
        assert_eq!(
            code(&[("content-type", "application/x-www-form-urlencoded")]),
            ct
        );
        assert_eq!(code(&[("content-type", "application/jsonx")]), ct);
        let enc = |e| {
            code(&[
                ("content-type", "application/json"),
                ("content-encoding", e),
            ])
        };
        assert_eq!(enc("identity"), None);
        assert_eq!(enc("gzip"), Some("unsupported_content_encoding".into()));
        assert_eq!(enc("br"), Some("unsupported_content_encoding".into()));
    }
}
