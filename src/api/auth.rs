//! The edge guard: header size limit, `Host` names (DNS rebinding), API keys (constant-time;
//! `Authorization: Bearer` or `x-api-key`), OpenAI bodies for 405, and the errors metric (one
//! place sees every error response).

use actix_web::body::{BodySize, BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::ConnectionType;
use actix_web::http::header::{AUTHORIZATION, HOST};
use actix_web::http::{StatusCode, Version};
use actix_web::middleware::Next;
use actix_web::web::Data;
use actix_web::{Error, ResponseError};
use subtle::{Choice, ConstantTimeEq};

use super::drain::Drain;
use super::errors::{ApiError, ErrorType};
use super::state::AppState;

/// Routes reachable without a key.
const OPEN_PATHS: &[&str] = &["/health"];

/// The header Anthropic's clients send their key in (taken on every route, as a bearer
/// token is).
pub const X_API_KEY: &str = "x-api-key";

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

/// Whether an `x-api-key: KEY` header (Anthropic's) carries one of `keys`, compared as
/// [`authorized`] compares them.
pub fn api_key_authorized(header: Option<&str>, keys: &[String]) -> bool {
    let Some(token) = header.map(str::trim).filter(|t| !t.is_empty()) else {
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

/// The `Host` policy of a server bound to a loopback address: loopback names, plus the
/// configured `allowed_hosts` (`*` for any). Servers bound elsewhere install none.
#[derive(Debug, Clone)]
pub struct LoopbackHosts {
    allowed: Vec<String>,
}

impl LoopbackHosts {
    /// Loopback names plus `allowed` (compared without port, ignoring case).
    pub fn new(allowed: &[String]) -> Self {
        Self {
            allowed: allowed.iter().map(|h| h.to_ascii_lowercase()).collect(),
        }
    }

    /// Whether a request with this `Host` header value may be served. A request without a
    /// `Host` (HTTP/1.0) comes from no browser and is served.
    pub fn allows(&self, host: Option<&str>) -> bool {
        let Some(host) = host else {
            return true;
        };
        let name = host_name(host).to_ascii_lowercase();
        let name = name.strip_suffix('.').unwrap_or(&name);
        if name == "localhost" || self.allowed.iter().any(|a| a == "*" || a == name) {
            return true;
        }
        let ip = name.trim_start_matches('[').trim_end_matches(']');
        ip.parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
    }
}

/// `example.com:8000` -> `example.com`, `[::1]:8000` -> `[::1]`.
fn host_name(host: &str) -> &str {
    let host = host.trim();
    if host.starts_with('[') {
        return host.find(']').map_or(host, |i| &host[..=i]);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

/// Checks a request before any handler runs; after it, gives every error an OpenAI body and
/// counts it, sends streams to HTTP/1.0 clients close-delimited (they cannot read chunked
/// encoding), and lets the drain cut streams at shutdown.
pub async fn guard<B: MessageBody + 'static>(
    req: ServiceRequest,
    next: Next<B>,
) -> Result<ServiceResponse<BoxBody>, Error> {
    let Some(state) = req.app_data::<Data<AppState>>().cloned() else {
        return next
            .call(req)
            .await
            .map(ServiceResponse::map_into_boxed_body);
    };
    if let Some(e) = reject(&req, &state) {
        state.metrics.observe_error(e.error_type());
        return Ok(req.into_response(e.error_response()));
    }
    let (method, path) = (req.method().to_string(), req.path().to_string());
    let http10 = req.version() == Version::HTTP_10;
    let drain = req.app_data::<Drain>().cloned();
    let res = next.call(req).await?.map_into_boxed_body();
    if let Some(t) = res.response().extensions().get::<ErrorType>() {
        state.metrics.observe_error(t.0);
    } else if res.status().is_client_error() || res.status().is_server_error() {
        let e = route_error(res.status(), method, path);
        state.metrics.observe_error(e.error_type());
        let (req, _) = res.into_parts();
        return Ok(ServiceResponse::new(req, e.error_response()));
    }
    if res.response().body().size() != BodySize::Stream {
        return Ok(res);
    }
    Ok(res.map_body(|head, body| {
        if http10 {
            head.no_chunking(true);
            head.set_connection_type(ConnectionType::Close);
        }
        match &drain {
            Some(d) if super::messages::is_route(&path) => {
                d.wrap_ending(body, super::messages::cut_ending)
            }
            Some(d) => d.wrap(body),
            None => body,
        }
    }))
}

/// A request refused before it reaches a handler: headers too large, a `Host` a loopback
/// server does not answer for, or a missing or wrong API key.
fn reject(req: &ServiceRequest, state: &AppState) -> Option<ApiError> {
    let server = &state.config.server;
    let header_bytes: usize = req
        .headers()
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len())
        .sum();
    if header_bytes > server.max_header_bytes {
        return Some(ApiError::HeadersTooLarge {
            limit: server.max_header_bytes,
        });
    }
    if let Some(hosts) = req.app_data::<LoopbackHosts>() {
        let host = req.headers().get(HOST).map(|h| h.to_str().unwrap_or("?"));
        // An absolute-form target (`GET http://name/path`) names the host it is for, ahead
        // of `Host` (RFC 9112 3.2.2), so it is checked the same way.
        let target = req.uri().host();
        if let Some(bad) = [host, target]
            .into_iter()
            .flatten()
            .find(|h| !hosts.allows(Some(h)))
        {
            return Some(ApiError::HostNotAllowed {
                host: bad.to_string(),
            });
        }
    }
    if !server.api_keys.is_empty() && !OPEN_PATHS.contains(&req.path()) {
        let header = |name| req.headers().get(name).and_then(|v| v.to_str().ok());
        let ok = authorized(header(AUTHORIZATION.as_str()), &server.api_keys)
            || api_key_authorized(header(X_API_KEY), &server.api_keys);
        return (!ok).then_some(ApiError::Unauthorized);
    }
    None
}

/// The OpenAI error for a failure actix or a library answered without one (an unknown
/// method on a route, a static file that is not there, a malformed path).
fn route_error(status: StatusCode, method: String, path: String) -> ApiError {
    match status {
        StatusCode::NOT_FOUND => ApiError::RouteNotFound { method, path },
        StatusCode::METHOD_NOT_ALLOWED => ApiError::MethodNotAllowed { method, path },
        s if s.is_server_error() => ApiError::Internal(format!("{method} {path} failed ({s})")),
        s => ApiError::InvalidRequest {
            param: None,
            message: format!(
                "{method} {path}: {}",
                s.canonical_reason().unwrap_or("invalid request")
            ),
            code: "invalid_request",
        },
    }
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
        assert!(api_key_authorized(Some("sk-one"), &keys));
        assert!(api_key_authorized(Some(" sk-two "), &keys));
        assert!(!api_key_authorized(Some("Bearer sk-one"), &keys));
        assert!(!api_key_authorized(Some(""), &keys));
        assert!(!api_key_authorized(None, &keys));
    }

    #[test]
    fn loopback_hosts() {
        let only = LoopbackHosts::new(&[]);
        for ok in [
            "localhost",
            "LOCALHOST:8000",
            "localhost.",
            "127.0.0.1",
            "127.0.0.1:1234",
            "[::1]",
            "[::1]:8000",
        ] {
            assert!(only.allows(Some(ok)), "{ok}");
        }
        assert!(only.allows(None));
        for bad in [
            "evil.example",
            "evil.example:8000",
            "127.0.0.1.nip.io",
            "",
            "[::2]:80",
        ] {
            assert!(!only.allows(Some(bad)), "{bad}");
        }
        let some = LoopbackHosts::new(&["Kiln.Internal".into()]);
        assert!(some.allows(Some("kiln.internal:8000")));
        assert!(!some.allows(Some("other.internal")));
        assert!(LoopbackHosts::new(&["*".into()]).allows(Some("anything")));
    }
}
