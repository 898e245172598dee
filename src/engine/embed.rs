//! The caller's side of an embedding request: [`EmbedHandle`] waits for the pooled vector
//! its lane sends ([`super::pooling`] pools it).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::{OwnedSemaphorePermit, mpsc};

use super::EngineError;
use super::lane::LaneLoad;
use super::pooling::Embedding;
use super::request::LaneEvent;

/// The answer to one queued embedding. Dropping it abandons the input: its sequence is
/// freed within a step.
pub struct EmbedHandle {
    pub(crate) rx: mpsc::Receiver<LaneEvent>,
    pub(crate) first: u64,
    pub(crate) lane: usize,
    pub(crate) load: Arc<LaneLoad>,
    pub(crate) prompt_tokens: usize,
    pub(crate) _permit: OwnedSemaphorePermit,
}

impl Drop for EmbedHandle {
    fn drop(&mut self) {
        if let Ok(mut w) = self.load.waiters.lock() {
            w.remove(&self.first);
        }
    }
}

impl EmbedHandle {
    /// Waits for the pooled vector.
    pub async fn wait(mut self) -> Result<Embedding, EngineError> {
        loop {
            match self.rx.recv().await {
                Some(LaneEvent::Embedding { vector }) => {
                    return Ok(Embedding {
                        vector,
                        prompt_tokens: self.prompt_tokens,
                    });
                }
                Some(LaneEvent::Failed(e)) => return Err(e),
                Some(_) => {}
                None if self.load.hung.load(Ordering::Acquire) => {
                    return Err(super::hung_error(self.lane, None));
                }
                None => return Err(EngineError::ShuttingDown),
            }
        }
    }
}
