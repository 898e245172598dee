//! The count of requests in flight and its bound (`server.max_in_flight`); the middleware
//! that takes and frees places is [`super::overload`].

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

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
}
