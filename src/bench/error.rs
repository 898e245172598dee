//! The bench's error type (its own file, so the bench's modules import it without a
//! cycle through `bench/mod.rs`).

use std::path::PathBuf;

/// Errors that stop a run before or after its requests (a failed request is a record).
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("invalid {flag}: {message}")]
    Invalid { flag: &'static str, message: String },
    #[error("dataset {path}: {message}")]
    Dataset { path: PathBuf, message: String },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("{url}: {message}")]
    Server { url: String, message: String },
    #[error("model: {0}")]
    Model(String),
    #[error(transparent)]
    Engine(#[from] crate::engine::EngineError),
}
