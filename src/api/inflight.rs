//! The bound on requests in flight (`server.max_in_flight`): past it a request is answered at
//! once with 503, `Retry-After` and an OpenAI error body, never queued. A request holds its
//! place from the moment its headers are read until its response body ends: a stream until
//! its last frame or until its client goes away. `/health` and `/metrics` are exempt, so
//! monitoring keeps working under overload.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use actix_web::body::{BodySize, BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::web::{Bytes, Data};
use actix_web::{Error, ResponseError};

use super::errors::ApiError;
use super::state::AppState;

/// Routes that are neither counted nor refused.
pub const EXEMPT_PATHS: &[&str] = &["/health", "/metrics"];

/// Seconds a refused client is told to wait (`Retry-After`).
pub const RETRY_AFTER_S: u64 = 1;

/// The in-flight count of one server, shared by all its workers.
#[derive(Debug, Clone)]
pub struct InFlight {
    count: Arc<AtomicUsize>,
    cap: usize,
}

/// One request's place; dropping it frees the place.
#[derive(Debug)]
pub struct Permit {
    count: Arc<AtomicUsize>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::AcqRel);
    }
}

impl InFlight {
    /// A bound of `cap` requests (at least one).
    pub fn new(cap: usize) -> Self {
        Self {
            count: Arc::new(AtomicUsize::new(0)),
            cap: cap.max(1),
        }
    }

    /// The configured cap, lowered to leave a share of `connections` free: requests past the
    /// cap must still get a connection to be told 503 rather than wait in the listen backlog.
    pub fn effective_cap(max_in_flight: usize, connections: usize) -> usize {
        let below = connections.saturating_sub(connections / 8).max(1);
        max_in_flight.min(below).max(1)
    }

    /// A place, or `None` when `cap` requests are in flight (the count is never exceeded,
    /// not even for a moment).
    pub fn try_acquire(&self) -> Option<Permit> {
        self.count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.cap).then_some(n + 1)
            })
            .ok()
            .map(|_| Permit {
                count: self.count.clone(),
            })
    }

    /// Requests in flight now.
    pub fn current(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    /// The bound.
    pub fn cap(&self) -> usize {
        self.cap
    }
}

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

    #[test]
    fn places_are_bounded_and_freed_on_drop() {
        let f = InFlight::new(2);
        let a = f.try_acquire().expect("first");
        let b = f.try_acquire().expect("second");
        assert!(f.try_acquire().is_none(), "past the cap");
        assert_eq!(f.current(), 2, "a refusal takes no place");
        drop(a);
        assert_eq!(f.current(), 1);
        let c = f.try_acquire().expect("a freed place is reused");
        drop((b, c));
        assert_eq!(f.current(), 0);
    }

    #[test]
    fn cap_stays_below_the_connection_bound() {
        assert_eq!(InFlight::effective_cap(4096, 8192), 4096);
        assert_eq!(InFlight::effective_cap(4096, 768), 672);
        assert_eq!(InFlight::effective_cap(2, 768), 2);
        assert_eq!(InFlight::effective_cap(10, 1), 1);
        assert_eq!(InFlight::new(0).cap(), 1);
    }

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
