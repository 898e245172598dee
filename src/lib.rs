//! Kiln: an OpenAI-compatible, continuous-batching inference server for Llama-family models.

pub mod alloc;
pub mod api;
pub mod backend;
pub mod bench;
pub mod config;
pub mod engine;
pub mod generate;
pub mod logging;
pub mod metrics;
pub mod model;
pub mod runner;
pub mod sampling;
pub mod tokenizer;
