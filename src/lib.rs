//! Kiln: an OpenAI-compatible, continuous-batching inference server for Llama-family models.

pub mod backend;
pub mod model;
pub mod sampling;
pub mod tokenizer;
pub mod generate;
pub mod config;
pub mod engine;
pub mod api;
pub mod metrics;
