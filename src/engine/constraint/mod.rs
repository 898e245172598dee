//! Constrained decoding through llguidance: the token trie built once per engine from Kiln's
//! tokenizer, [`Constraint`]s compiled into matchers (within [`limits`], on the threads of
//! [`pool`], cached by their text in a cache bounded by bytes), and the per-sequence
//! [`Grammar`] that yields a token mask each step and consumes sampled tokens.

mod cache;
mod compiler;
pub mod limits;
pub(crate) mod pool;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex};

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;

use super::{Constraint, EngineError};
use crate::tokenizer::Tokenizer;
use cache::Cache;
pub(crate) use compiler::Compiler;
pub use limits::GrammarConfig;

/// The tokenizer as llguidance sees it: every token's bytes in a trie. Text is split into
/// tokens greedily over the trie, which llguidance only needs for grammars that force tokens.
struct TrieEnv {
    trie: TokTrie,
}

impl TokenizerEnv for TrieEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.greedy_tokenize(s)
    }

    fn tokenize_is_canonical(&self) -> bool {
        false
    }
}

/// The bytes of every id below `vocab_size` (special tokens behind llguidance's marker byte;
/// ids the tokenizer lacks are empty and never allowed).
fn token_bytes(tok: &Tokenizer, vocab_size: usize) -> Result<Vec<Vec<u8>>, String> {
    let json = tok
        .hf()
        .to_string(false)
        .map_err(|e| format!("cannot serialize the tokenizer: {e}"))?;
    let json: Value =
        serde_json::from_str(&json).map_err(|e| format!("cannot read the tokenizer: {e}"))?;
    let mut bytes = catch_unwind(AssertUnwindSafe(|| {
        llguidance::token_bytes_from_tokenizer_json(&json)
    }))
    .map_err(|_| "the tokenizer's vocabulary could not be read".to_string())?
    .map_err(|e| format!("unsupported tokenizer: {e}"))?;
    bytes.resize(vocab_size, Vec::new());
    Ok(bytes)
}

/// Compiles [`Constraint`]s for one engine: the token trie, llguidance's parser factory and a
/// bounded cache of compiled grammars keyed by their text.
pub(crate) struct Grammars {
    factory: ParserFactory,
    cache: Mutex<Cache>,
    cfg: GrammarConfig,
    /// How a grammar writes `<think>` and `</think>` for this vocabulary.
    think: ThinkMarkers,
}

/// The reasoning markers as Lark: the special token's id when the vocabulary has the marker
/// as one special token (`<[151668]>`), else the quoted text.
#[derive(Debug, Clone)]
struct ThinkMarkers {
    open: String,
    close: String,
    /// `</think>` is a special token: regular text cannot spell it, so the thought is any text.
    close_is_token: bool,
}

impl ThinkMarkers {
    fn new(tok: &Tokenizer) -> Self {
        let id = |text: &str| tok.token_to_id(text).filter(|&id| tok.is_special(id));
        let lark = |text: &str| match id(text) {
            Some(id) => format!("<[{id}]>"),
            None => serde_json::Value::from(text).to_string(),
        };
        Self {
            open: lark("<think>"),
            close: lark("</think>"),
            close_is_token: id("</think>").is_some(),
        }
    }

    /// The grammar in front of the answer (the sub-grammar named `answer`).
    fn prefix(&self, opened: bool) -> String {
        let thought = if self.close_is_token {
            format!("thought: /(?s:.*)/ {}", self.close)
        } else {
            "thought[suffix=\"</think>\"]: /(?s:.*)/".to_string()
        };
        let start = if opened {
            "start: thought BLANK @answer".to_string()
        } else {
            format!("start: ({} thought BLANK)? @answer", self.open)
        };
        // Blanks after the thought are bounded: a weak model could pad forever.
        format!("{start}\n{thought}\nBLANK: /[ \\t\\r\\n]{{0,4}}/\n")
    }
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars").finish_non_exhaustive()
    }
}

impl Grammars {
    /// Builds the trie of `tok`'s vocabulary padded to `vocab_size` (the model's logits width);
    /// `eos_ids` end a finished grammar; `cfg` bounds what compiles and what is cached.
    pub fn new(
        tok: &Tokenizer,
        vocab_size: usize,
        eos_ids: &[u32],
        cfg: &GrammarConfig,
    ) -> Result<Self, String> {
        let words = token_bytes(tok, vocab_size)?;
        let eos = *eos_ids
            .first()
            .ok_or("the vocabulary has no end-of-sequence token")?;
        let mut info = TokRxInfo::new(vocab_size as u32, eos);
        info.tok_bos = tok.bos_id();
        let trie = TokTrie::from(&info, &words).with_eos_tokens(eos_ids);
        let env: TokEnv = Arc::new(TrieEnv { trie });
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
        factory.quiet();
        // Errors name what failed, not the parser's state or the whole grammar.
        factory.limits_mut().verbose_errors = false;
        Ok(Self {
            factory,
            cache: Mutex::new(Cache::new(cfg.cache_bytes)),
            cfg: cfg.clone(),
            think: ThinkMarkers::new(tok),
        })
    }

    /// A fresh matcher for `c`, from the cache when the same text was compiled before. A
    /// grammar past a limit, one that does not compile and one no text can satisfy are
    /// `InvalidRequest` naming `param`. Deep grammars need a compile thread's stack
    /// ([`pool::STACK_BYTES`]); the engine compiles on those threads.
    pub fn compile(&self, c: &Constraint, param: &'static str) -> Result<Grammar, EngineError> {
        if let Some(hit) = self.cached(c) {
            return Ok(hit);
        }
        let key = key(c);
        let invalid = |message: String| EngineError::InvalidRequest {
            param: Some(param),
            message,
        };
        check_limits(c, &self.cfg).map_err(invalid)?;
        let grammar = top_level(c, &self.think).map_err(invalid)?;
        let (matcher, bytes) = crate::alloc::measured(|| {
            let parser = catch_unwind(AssertUnwindSafe(|| self.factory.create_parser(grammar)))
                .map_err(|_| "the constraint does not compile".to_string())?
                .map_err(|e| format!("the constraint does not compile: {e}"))?;
            let matcher = Matcher::new(Ok(parser));
            match matcher.get_error() {
                Some(e) => Err(format!("the constraint does not compile: {e}")),
                None => Ok(matcher),
            }
        });
        let matcher = matcher.map_err(invalid)?;
        let mut probe = Grammar::new(matcher.deep_clone());
        probe.compute_mask();
        match (&probe.error, probe.mask()) {
            (Some(e), _) => {
                return Err(invalid(format!("the constraint cannot be satisfied: {e}")));
            }
            (None, Some(m)) if m.iter().all(|&w| w == 0) => {
                return Err(invalid(
                    "the constraint cannot be satisfied: no text fits it".into(),
                ));
            }
            _ => {}
        }
        let grammar = Grammar::new(matcher.deep_clone());
        self.cache
            .lock()
            .expect("grammar cache lock")
            .insert(key, matcher, bytes);
        Ok(grammar)
    }

    /// A fresh matcher for `c` if it was compiled before.
    pub fn cached(&self, c: &Constraint) -> Option<Grammar> {
        let m = self
            .cache
            .lock()
            .expect("grammar cache lock")
            .get(&key(c))?;
        Some(Grammar::new(m))
    }

    /// A request carrying `c` was admitted: its compiled grammar has served and is kept.
    pub fn served(&self, c: &Constraint) {
        self.cache
            .lock()
            .expect("grammar cache lock")
            .served(&key(c));
    }

    /// Compiled grammars held and the bytes they hold.
    pub fn cache_size(&self) -> (usize, usize) {
        self.cache.lock().expect("grammar cache lock").size()
    }
}

/// `Err(message)` naming the limit when `c` is larger or deeper than `cfg` allows
/// ([`limits`]; checked before anything compiles).
fn check_limits(c: &Constraint, cfg: &GrammarConfig) -> Result<(), String> {
    fn measure(c: &Constraint) -> Result<(usize, usize), String> {
        Ok(match c {
            Constraint::JsonObject => (0, 1),
            Constraint::JsonSchema(text) => (text.len(), limits::schema_depth(text)?),
            // The regex parser bounds its own nesting (a parse error past it).
            Constraint::Regex(rx) => (rx.len(), 1),
            Constraint::Choice(options) => (options.iter().map(String::len).sum(), 1),
            Constraint::Lark(g) => (g.len(), limits::lark_depth(g)?),
            Constraint::AfterReasoning { answer, .. } => {
                let (bytes, depth) = measure(answer)?;
                (bytes, depth + 2)
            }
        })
    }
    let (bytes, depth) = measure(c)?;
    limits::within(bytes, depth, cfg)
}

/// The cache's key for `c`: its full text.
fn key(c: &Constraint) -> String {
    format!("{c:?}")
}

/// llguidance's grammar for `c`. JSON is compact (no free whitespace between tokens) unless
/// the schema sets its own `x-guidance` options. A constraint after reasoning is two grammars:
/// the free thought, then the answer's grammar referenced as `@answer`.
fn top_level(c: &Constraint, think: &ThinkMarkers) -> Result<TopLevelGrammar, String> {
    Ok(match c {
        Constraint::AfterReasoning { opened, answer } => {
            if matches!(**answer, Constraint::AfterReasoning { .. }) {
                return Err("nested reasoning constraints".into());
            }
            let mut inner = top_level(answer, think)?;
            if inner.grammars.len() != 1 {
                return Err("the answer's grammar has several parts".into());
            }
            inner.grammars[0].name = Some("answer".into());
            let mut prefix = TopLevelGrammar::from_lark(think.prefix(*opened));
            prefix.grammars.extend(inner.grammars);
            prefix
        }
        Constraint::JsonObject => TopLevelGrammar::from_json_schema(compact(serde_json::json!({
            "type": "object"
        }))),
        Constraint::JsonSchema(text) => {
            let schema: Value = serde_json::from_str(text)
                .map_err(|e| format!("the schema is not valid JSON: {e}"))?;
            if !schema.is_object() && !schema.is_boolean() {
                return Err("the schema must be a JSON object".into());
            }
            TopLevelGrammar::from_json_schema(compact(schema))
        }
        Constraint::Regex(rx) => TopLevelGrammar::from_regex(rx),
        Constraint::Choice(options) => {
            if options.is_empty() {
                return Err("the list of choices is empty".into());
            }
            let alts: Vec<String> = options
                .iter()
                .map(|o| serde_json::to_string(o).expect("a string serializes"))
                .collect();
            TopLevelGrammar::from_lark(format!("start: {}", alts.join(" | ")))
        }
        Constraint::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
    })
}

fn compact(mut schema: Value) -> Value {
    if let Some(obj) = schema.as_object_mut() {
        obj.entry("x-guidance")
            .or_insert_with(|| serde_json::json!({"whitespace_flexible": false}));
    }
    schema
}

/// One sequence's matcher and its mask for the next token.
pub(crate) struct Grammar {
    matcher: Matcher,
    /// Bit `t % 32` of word `t / 32`: token `t` may come next. Valid after [`Grammar::compute_mask`].
    mask: Vec<u32>,
    /// Why the matcher failed, if it did.
    error: Option<String>,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammar")
            .field("stopped", &self.matcher.is_stopped())
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl Clone for Grammar {
    fn clone(&self) -> Self {
        self.fork()
    }
}

impl Grammar {
    fn new(matcher: Matcher) -> Self {
        Self {
            matcher,
            mask: Vec::new(),
            error: None,
        }
    }

    /// An independent copy in the same state (one per choice).
    pub fn fork(&self) -> Self {
        Self::new(self.matcher.deep_clone())
    }

    /// Computes the mask of tokens allowed next (only EOS once the grammar is complete).
    /// Slow-ish (tens of µs to ms): run it while the device computes the forward.
    pub fn compute_mask(&mut self) {
        if self.error.is_some() {
            return;
        }
        match self.matcher.compute_mask_or_eos() {
            Ok(v) => {
                let words = v.len().div_ceil(32);
                self.mask.clear();
                self.mask.extend_from_slice(&v.as_slice()[..words]);
            }
            Err(e) => self.error = Some(e.to_string()),
        }
    }

    /// The mask of the last [`Grammar::compute_mask`], `None` once the matcher failed.
    pub fn mask(&self) -> Option<&[u32]> {
        (self.error.is_none() && !self.mask.is_empty()).then_some(&self.mask[..])
    }

    /// Advances over a sampled token. `Ok(true)`: the grammar is complete and the choice ends;
    /// `Err`: the matcher failed (the token did not fit, or a grammar limit was hit).
    pub fn consume(&mut self, token: u32) -> Result<bool, String> {
        if let Some(e) = &self.error {
            return Err(e.clone());
        }
        if self.matcher.is_stopped() {
            return Ok(true);
        }
        match self.matcher.consume_token(token) {
            Ok(()) => Ok(self.matcher.is_stopped()),
            Err(e) => {
                let e = e.to_string();
                self.error = Some(e.clone());
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests;
