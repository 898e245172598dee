//! The Responses API's part of the server state (`AppState::responses`): a leaf the handlers
//! use, so `api::state` needs nothing of them.

use std::sync::{Arc, OnceLock};

use dashmap::DashMap;
use tokio::sync::watch;

use super::store::Store;
use super::types::ResponseObject;
use crate::api::cancel::Cancel;
use crate::config::ResponsesConfig;

/// An in-flight response as `GET` and `cancel` see it.
pub struct Running {
    pub cancel: Cancel,
    pub snapshot: ResponseObject,
    pub done: watch::Receiver<Option<ResponseObject>>,
}

/// The Responses API's server state: the store (opened on first use) and the responses in
/// flight.
pub struct Responses {
    pub(super) config: ResponsesConfig,
    pub(super) store: OnceLock<Result<Arc<Store>, String>>,
    pub(super) running: DashMap<String, Running>,
}

impl Responses {
    /// Nothing opened yet.
    pub fn new(config: ResponsesConfig) -> Self {
        Self {
            config,
            store: OnceLock::new(),
            running: DashMap::new(),
        }
    }
}
