//! Graceful shutdown: SIGTERM (or [`super::Server::shutdown`]) stops accepting, lets in-flight
//! requests finish, and ends streams still open at the drain limit with an error frame and
//! `data: [DONE]` (an Anthropic stream with an `error` event), so that no client sees a broken
//! transfer.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use actix_web::body::{BodySize, BoxBody, MessageBody};
use actix_web::dev::ServerHandle;
use actix_web::web::Bytes;
use tokio::sync::{mpsc, watch};

use super::errors::ApiError;
use super::sse::{DONE, data_frame};

/// Streams are cut this long before actix's own shutdown timeout closes their connections,
/// so the last frames reach the client.
const CUT_MARGIN: Duration = Duration::from_millis(500);

/// The cut signal streams watch (cloned into the app data of every worker).
#[derive(Debug, Clone)]
pub struct Drain {
    cut: watch::Receiver<bool>,
}

/// What stops a server: SIGTERM or a [`super::Server::shutdown`] call (graceful, with the drain
/// limit), or SIGINT (immediate, as before).
pub(super) struct Stopper {
    cut: watch::Sender<bool>,
    requests: mpsc::Receiver<()>,
}

/// A new cut signal, its stopper, and the sender [`super::Server::shutdown`] uses.
pub(super) fn channel() -> (Drain, Stopper, mpsc::Sender<()>) {
    let (cut_tx, cut_rx) = watch::channel(false);
    let (req_tx, req_rx) = mpsc::channel(1);
    (
        Drain { cut: cut_rx },
        Stopper {
            cut: cut_tx,
            requests: req_rx,
        },
        req_tx,
    )
}

impl Stopper {
    /// Waits for a stop request, then stops `server`; streams are cut `CUT_MARGIN` before
    /// `shutdown_timeout` ends. Runs inside the server's actix system.
    pub(super) async fn run(mut self, server: ServerHandle, shutdown_timeout: Duration) {
        let graceful = wait_for_stop(&mut self.requests).await;
        if !graceful {
            let _ = self.cut.send(true);
            server.stop(false).await;
            return;
        }
        tracing::info!(
            drain_s = shutdown_timeout.as_secs_f64(),
            "stopping: draining in-flight requests"
        );
        let cut = self.cut;
        let after = shutdown_timeout.saturating_sub(CUT_MARGIN);
        actix_web::rt::spawn(async move {
            actix_web::rt::time::sleep(after).await;
            let _ = cut.send(true);
        });
        server.stop(true).await;
    }
}

/// `true` for SIGTERM or a shutdown request, `false` for SIGINT.
async fn wait_for_stop(requests: &mut mpsc::Receiver<()>) -> bool {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::warn!(
            "cannot install signal handlers; only an explicit shutdown stops the server"
        );
        let _ = requests.recv().await;
        return true;
    };
    tokio::select! {
        _ = term.recv() => true,
        _ = int.recv() => false,
        _ = requests.recv() => true,
    }
}

/// The frames a cut OpenAI stream ends with: the error frame and `data: [DONE]`.
fn openai_ending(e: &ApiError) -> Vec<Bytes> {
    vec![data_frame(&e.body()), Bytes::from_static(DONE)]
}

impl Drain {
    /// Wraps a streaming body so that it ends with an error frame and `[DONE]` when cut.
    pub fn wrap(&self, inner: BoxBody) -> BoxBody {
        self.wrap_ending(inner, openai_ending)
    }

    /// [`Drain::wrap`] for a stream of another API's shape: when cut, it ends with
    /// `ending`'s frames for the shutdown error.
    pub fn wrap_ending(&self, inner: BoxBody, ending: fn(&ApiError) -> Vec<Bytes>) -> BoxBody {
        let mut cut = self.cut.clone();
        let cut = Box::pin(async move {
            if cut.wait_for(|c| *c).await.is_err() {
                std::future::pending::<()>().await;
            }
        });
        BoxBody::new(DrainBody {
            inner: Some(inner),
            cut,
            tail: VecDeque::new(),
            ending,
        })
    }
}

/// A stream body that is cut at the drain limit (frames are whole `Bytes`, so a cut falls
/// between frames). Dropping the inner body aborts its engine requests.
struct DrainBody {
    inner: Option<BoxBody>,
    cut: Pin<Box<dyn Future<Output = ()>>>,
    tail: VecDeque<Bytes>,
    ending: fn(&ApiError) -> Vec<Bytes>,
}

impl MessageBody for DrainBody {
    type Error = Box<dyn std::error::Error>;

    fn size(&self) -> BodySize {
        BodySize::Stream
    }

    fn poll_next(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, Self::Error>>> {
        let this = &mut *self;
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(this.tail.pop_front().map(Ok));
        };
        if let Poll::Ready(item) = Pin::new(inner).poll_next(cx) {
            return Poll::Ready(item);
        }
        if this.cut.as_mut().poll(cx).is_ready() {
            this.inner = None;
            let e = ApiError::Unavailable {
                message: "the server is shutting down; the stream was cut at the drain limit"
                    .into(),
                code: "shutting_down",
            };
            this.tail.extend((this.ending)(&e));
            return Poll::Ready(this.tail.pop_front().map(Ok));
        }
        Poll::Pending
    }
}
