//! Ending a stream from elsewhere (`POST /v1/responses/{id}/cancel`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures_util::task::AtomicWaker;

/// Ends a `MergedStream` (`generation.rs`) early from elsewhere (`POST /v1/responses/{id}/cancel`): its engine
/// requests are aborted and it ends as if each open choice finished with `Abort`.
#[derive(Debug, Clone, Default)]
pub struct Cancel(Arc<CancelInner>);

#[derive(Debug, Default)]
struct CancelInner {
    flag: AtomicBool,
    waker: AtomicWaker,
}

impl Cancel {
    /// Cancels the stream (idempotent); it ends at its next poll.
    pub fn cancel(&self) {
        self.0.flag.store(true, Ordering::Release);
        self.0.waker.wake();
    }

    /// Wakes the stream's task at the next [`Cancel::cancel`].
    pub fn register(&self, waker: &std::task::Waker) {
        self.0.waker.register(waker);
    }

    /// Whether [`Cancel::cancel`] was called.
    pub fn is_cancelled(&self) -> bool {
        self.0.flag.load(Ordering::Acquire)
    }
}
