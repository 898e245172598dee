//! The bound on requests in flight (`server.max_in_flight`): past it a request is answered at
//! once with 503, `Retry-After` and an OpenAI error body, never queued. A request holds its
//! place from the moment its headers are read until its response body ends: a stream until
//! its last frame or until its client goes away. `/health` and `/metrics` are exempt, so
//! monitoring keeps working under overload.

use std::pin::Pin;
use std::task::{Context, Poll};

use actix_web::body::{BodySize, BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::web::{Bytes, Data};
use actix_web::{Error, ResponseError};

use super::errors::ApiError;
use super::inflight::{EXEMPT_PATHS, Permit, RETRY_AFTER_S};
use super::state::AppState;

/// Counts every request but the exempt ones; refuses those past the cap with 503. Runs inside
/// [`super::auth::guard`], so refused keys never take a place and refusals are counted as errors.
pub async fn limit<B: MessageBody + 'static>(
    req: ServiceRequest,
    next: Next<B>,
) -> Result<ServiceResponse<BoxBody>, Error> {
    let state = req.app_data::<Data<AppState>>().cloned();
    let Some(state) = state.filter(|_| !EXEMPT_PATHS.contains(&req.path())) else {
        return next
            .call(req)
            .await
            .map(ServiceResponse::map_into_boxed_body);
    };
    let Some(permit) = state.in_flight.try_acquire() else {
        state.metrics.observe_overloaded();
        let e = ApiError::ServerOverloaded {
            max_in_flight: state.in_flight.cap(),
            retry_after_s: RETRY_AFTER_S,
        };
        return Ok(req.into_response(e.error_response()));
    };
    let res = next.call(req).await?.map_into_boxed_body();
    if res.response().body().size() != BodySize::Stream {
        // The whole body is in memory: the work is done, only the writing is left.
        return Ok(res);
    }
    Ok(res.map_body(|_, body| {
        BoxBody::new(CountedBody {
            inner: body,
            permit: Some(permit),
        })
    }))
}

/// A stream body that holds its request's place until its end, an error, or its drop (the
/// client went away).
struct CountedBody {
    inner: BoxBody,
    permit: Option<Permit>,
}

impl MessageBody for CountedBody {
    type Error = Box<dyn std::error::Error>;

    fn size(&self) -> BodySize {
        self.inner.size()
    }

    fn poll_next(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_next(cx);
        if matches!(polled, Poll::Ready(None | Some(Err(_)))) {
            self.permit = None;
        }
        polled
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::inflight::InFlight;

    #[test]
    fn a_stream_frees_its_place_at_its_end() {
        let f = InFlight::new(1);
        let body = BoxBody::new(actix_web::body::BodyStream::new(
            futures_util::stream::iter([Ok::<_, std::io::Error>(Bytes::from_static(b"x"))]),
        ));
        let mut counted = CountedBody {
            inner: body,
            permit: f.try_acquire(),
        };
        let waker = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        let mut pin = Pin::new(&mut counted);
        assert!(matches!(
            pin.as_mut().poll_next(&mut cx),
            Poll::Ready(Some(Ok(_)))
        ));
        assert_eq!(f.current(), 1, "held while frames remain");
        assert!(matches!(pin.as_mut().poll_next(&mut cx), Poll::Ready(None)));
        assert_eq!(
            f.current(),
            0,
            "freed at the end, before the body is dropped"
        );
    }
}
