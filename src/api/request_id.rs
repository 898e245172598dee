//! The `x-request-id` header on every response, errors included: the client's own id echoed
//! when it is a sane one (at most [`MAX_LEN`] bytes of letters, digits and `-_.:+/=@`), else a
//! fresh one. A bad id is replaced, never refused.

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::middleware::Next;
use actix_web::{Error, HttpMessage};

/// The header, as clients and proxies name it.
pub const HEADER: HeaderName = HeaderName::from_static("x-request-id");

/// The longest client id echoed.
pub const MAX_LEN: usize = 128;

/// The id a request goes by, in its extensions for handlers and logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestId(pub String);

/// The client's id if it may be echoed as is.
fn client_id(value: Option<&HeaderValue>) -> Option<String> {
    let v = value?.to_str().ok()?;
    let ok = !v.is_empty()
        && v.len() <= MAX_LEN
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:+/=@".contains(&b));
    ok.then(|| v.to_string())
}

/// A fresh id: 32 hex digits.
fn fresh_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// Outermost middleware: tags the request and its response (whatever answered it).
pub async fn tag<B: MessageBody + 'static>(
    req: ServiceRequest,
    next: Next<B>,
) -> Result<ServiceResponse<BoxBody>, Error> {
    let id = client_id(req.headers().get(&HEADER)).unwrap_or_else(fresh_id);
    req.extensions_mut().insert(RequestId(id.clone()));
    let value = HeaderValue::from_str(&id).unwrap_or_else(|_| HeaderValue::from_static("-"));
    let mut res = match next.call(req).await {
        Ok(res) => res.map_into_boxed_body(),
        Err(e) => {
            // An error out of an inner middleware: answered here, so it carries the id too.
            let res = e.error_response();
            return Err(
                actix_web::error::InternalError::from_response(e, with_id(res, value)).into(),
            );
        }
    };
    res.headers_mut().insert(HEADER, value);
    Ok(res)
}

fn with_id(mut res: actix_web::HttpResponse, value: HeaderValue) -> actix_web::HttpResponse {
    res.headers_mut().insert(HEADER, value);
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sane_ids_are_echoed_others_replaced() {
        let v = |s: &str| HeaderValue::from_str(s).unwrap();
        assert_eq!(
            client_id(Some(&v("req-1_a.b:c"))),
            Some("req-1_a.b:c".into())
        );
        assert_eq!(
            client_id(Some(&v(&"a".repeat(MAX_LEN)))).map(|s| s.len()),
            Some(MAX_LEN)
        );
        assert_eq!(client_id(Some(&v(&"a".repeat(MAX_LEN + 1)))), None);
        assert_eq!(client_id(Some(&v("has space"))), None);
        assert_eq!(client_id(Some(&v("quote\""))), None);
        assert_eq!(client_id(Some(&v(""))), None);
        assert_eq!(client_id(None), None);
        let id = fresh_id();
        assert_eq!(id.len(), 32);
        assert_eq!(client_id(Some(&v(&id))), Some(id));
    }
}
