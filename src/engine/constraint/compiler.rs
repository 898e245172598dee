//! The engine's constraint compiler: the grammars (token trie and cache, built on first
//! use) and the threads that compile. Requests compile here before they are queued
//! ([`Compiler::prepare`], bounded in time), so admitting one only takes the cached copy.

use std::sync::mpsc;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use super::pool::CompilePool;
use super::{Grammar, GrammarConfig, Grammars};
use crate::engine::{Constraint, EngineError};
use crate::tokenizer::Tokenizer;

pub(crate) struct Compiler {
    grammars: OnceLock<Result<Grammars, String>>,
    pool: CompilePool,
    cfg: GrammarConfig,
    tokenizer: Option<Arc<Tokenizer>>,
    vocab_size: usize,
    eos_ids: Vec<u32>,
}

impl Compiler {
    /// Starts the compile threads; the grammars are built at the first use.
    pub fn new(
        tokenizer: Option<Arc<Tokenizer>>,
        vocab_size: usize,
        eos_ids: Vec<u32>,
        cfg: &GrammarConfig,
    ) -> std::io::Result<Self> {
        Ok(Self {
            grammars: OnceLock::new(),
            pool: CompilePool::new(cfg.threads, cfg.queue)?,
            cfg: cfg.clone(),
            tokenizer,
            vocab_size,
            eos_ids,
        })
    }

    /// The token trie and grammar cache (a second or so for a 128k vocabulary).
    pub fn grammars(&self) -> &Result<Grammars, String> {
        self.grammars.get_or_init(|| {
            let tok = self
                .tokenizer
                .as_ref()
                .ok_or("the model has no tokenizer")?;
            Grammars::new(tok, self.vocab_size, &self.eos_ids, &self.cfg)
        })
    }

    /// Compiles `c` here, on the calling thread: only on a compile thread.
    fn compile(&self, c: &Constraint, param: &'static str) -> Result<Grammar, EngineError> {
        match self.grammars() {
            Ok(g) => g.compile(c, param),
            Err(e) => Err(EngineError::InvalidRequest {
                param: Some(param),
                message: format!("constrained decoding is not available for this model: {e}"),
            }),
        }
    }

    /// `c`'s grammar: the cached copy when [`Compiler::prepare`] (or an earlier request)
    /// compiled it, else compiled on a compile thread while this one waits.
    pub fn grammar(
        self: &Arc<Self>,
        c: &Constraint,
        param: &'static str,
    ) -> Result<Grammar, EngineError> {
        if let Some(Ok(g)) = self.grammars.get()
            && let Some(hit) = g.cached(c)
        {
            return Ok(hit);
        }
        let (tx, rx) = mpsc::channel();
        let (this, c) = (self.clone(), c.clone());
        self.spawn(move || {
            let _ = tx.send(this.compile(&c, param));
        })?;
        rx.recv().unwrap_or_else(|_| Err(crashed(param)))
    }

    /// Compiles `c` on a compile thread and keeps it for the request that follows; a
    /// compile past `engine.grammar.timeout_s` fails with a 400 naming `param` (the thread
    /// finishes it in the background; its result is cached unserved).
    pub async fn prepare(
        self: &Arc<Self>,
        c: &Constraint,
        param: &'static str,
    ) -> Result<(), EngineError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (this, c) = (self.clone(), c.clone());
        self.spawn(move || {
            let _ = tx.send(this.compile(&c, param).map(drop));
        })?;
        let limit = Duration::from_secs_f64(self.cfg.timeout_s);
        match tokio::time::timeout(limit, rx).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(crashed(param)),
            Err(_) => Err(EngineError::InvalidRequest {
                param: Some(param),
                message: format!(
                    "the constraint did not compile within {} s (engine.grammar.timeout_s)",
                    self.cfg.timeout_s
                ),
            }),
        }
    }

    /// A request carrying `c` was admitted: its grammar is kept as served.
    pub fn served(&self, c: &Constraint) {
        if let Some(Ok(g)) = self.grammars.get() {
            g.served(c);
        }
    }

    /// Compiled grammars held and the bytes they hold.
    pub fn cache_size(&self) -> (usize, usize) {
        match self.grammars.get() {
            Some(Ok(g)) => g.cache_size(),
            _ => (0, 0),
        }
    }

    fn spawn(&self, job: impl FnOnce() + Send + 'static) -> Result<(), EngineError> {
        self.pool.spawn(job).map_err(|_| EngineError::Overloaded {
            waiting: self.cfg.queue,
            retry_after_s: 1,
        })
    }
}

/// The compile panicked (caught on its thread): this request fails, the server serves on.
fn crashed(param: &'static str) -> EngineError {
    EngineError::InvalidRequest {
        param: Some(param),
        message: "the constraint could not be compiled".into(),
    }
}
