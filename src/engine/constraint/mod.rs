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
mod tests {
    use super::*;
    use crate::model::gguf::GgufFile;
    use std::sync::Arc;

    /// The tokenizer and grammars of the Llama-2-vocabulary fixture.
    fn tiny() -> (Tokenizer, Grammars) {
        let path = crate::config::resolve_path(std::path::Path::new(
            "../shared/models/llama-2-tiny-random.gguf",
        ));
        let file = GgufFile::open(&path).expect("fixture");
        let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
        let g = Grammars::new(
            &tok,
            tok.vocab_size(),
            tok.eos_ids(),
            &GrammarConfig::default(),
        )
        .expect("grammars");
        (tok, g)
    }

    fn allowed(g: &Grammar, id: u32) -> bool {
        g.mask().expect("mask")[id as usize / 32] >> (id % 32) & 1 == 1
    }

    /// Feeds `text` (split greedily over the trie) through `g`; whether the grammar ended.
    fn feed(gs: &Grammars, g: &mut Grammar, text: &str) -> bool {
        let toks = gs
            .factory
            .tok_env()
            .tok_trie()
            .greedy_tokenize(text.as_bytes());
        let mut done = false;
        for t in toks {
            g.compute_mask();
            assert!(allowed(g, t), "{text:?}: token {t} refused");
            done = g.consume(t).expect("consume");
        }
        done
    }

    #[test]
    fn choice_accepts_its_strings_only_and_is_cached() {
        let (tok, gs) = tiny();
        let c = Constraint::Choice(vec!["yes".into(), "no way".into()]);
        let mut g = gs.compile(&c, "guided_choice").unwrap();
        g.compute_mask();
        let maybe = tok.token_to_id("maybe").expect("in the vocabulary");
        assert!(!allowed(&g, maybe));
        let mut other = g.fork();
        assert!(
            feed(&gs, &mut g, "no way"),
            "the whole choice ends the grammar"
        );
        assert!(!feed(&gs, &mut other, "no"), "a prefix does not");
        assert_eq!(gs.cache_size().0, 1);
        gs.compile(&c, "guided_choice").unwrap();
        assert_eq!(gs.cache_size().0, 1, "the second compile is a cache hit");
    }

    #[test]
    fn json_schema_masks_until_only_eos_is_left() {
        let (tok, gs) = tiny();
        let schema = r#"{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"],"additionalProperties":false}"#;
        let c = Constraint::JsonSchema(schema.into());
        let mut g = gs.compile(&c, "response_format").unwrap();
        g.compute_mask();
        let space = tok.token_to_id("▁").expect("in the vocabulary");
        assert!(!allowed(&g, space), "compact JSON: no leading whitespace");
        let done = feed(&gs, &mut g, r#"{"a":12}"#);
        g.compute_mask();
        let eos = tok.eos_ids()[0];
        assert!(done || allowed(&g, eos));
        assert_eq!(
            g.mask()
                .unwrap()
                .iter()
                .map(|w| w.count_ones())
                .sum::<u32>(),
            1,
            "only EOS"
        );
        assert_eq!(g.consume(eos), Ok(true));
    }

    /// Whether `g` (after `text`) allows `next` (split greedily over the trie) to start.
    fn allows_next(gs: &Grammars, g: &Grammar, next: &str) -> bool {
        let t = gs
            .factory
            .tok_env()
            .tok_trie()
            .greedy_tokenize(next.as_bytes())[0];
        let mut g = g.fork();
        g.compute_mask();
        allowed(&g, t)
    }

    #[test]
    fn constraint_applies_after_the_reasoning() {
        let (tok, gs) = tiny();
        let schema = r#"{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"],"additionalProperties":false}"#;
        let answer = Box::new(Constraint::JsonSchema(schema.into()));
        let eos = tok.eos_ids()[0];
        // The prompt opened `<think>`: anything (JSON-breaking text too) until `</think>`.
        let c = Constraint::AfterReasoning {
            opened: true,
            answer: answer.clone(),
        };
        let mut g = gs.compile(&c, "response_format").unwrap();
        assert!(!feed(&gs, &mut g, "Hmm, \"a\" is {not} JSON yet... 1 < 2"));
        assert!(allows_next(&gs, &g, "hello"), "the thought is free text");
        assert!(!feed(&gs, &mut g, "</think>\n\n"));
        assert!(!allows_next(&gs, &g, "hello"), "the answer is constrained");
        let done = feed(&gs, &mut g, r#"{"a":7}"#);
        g.compute_mask();
        assert!(done || allowed(&g, eos));
        // Not opened: an optional `<think>` block, or the answer at once.
        let c = Constraint::AfterReasoning {
            opened: false,
            answer,
        };
        let mut g = gs.compile(&c, "response_format").unwrap();
        assert!(
            !allows_next(&gs, &g, "hello"),
            "no free text before `<think>`"
        );
        let mut direct = g.fork();
        feed(&gs, &mut direct, r#"{"a":1}"#);
        direct.compute_mask();
        assert!(allowed(&direct, eos));
        feed(&gs, &mut g, "<think>\nfree } text\n</think>\n");
        assert!(!allows_next(&gs, &g, "hello"));
        feed(&gs, &mut g, r#"{"a":2}"#);
        g.compute_mask();
        assert!(allowed(&g, eos));
    }

    #[test]
    fn bad_constraints_name_the_param() {
        let (_, gs) = tiny();
        for (c, what) in [
            (Constraint::JsonSchema("{not json".into()), "not valid JSON"),
            (Constraint::JsonSchema("[1]".into()), "JSON object"),
            (Constraint::Regex("a(b".into()), "compile"),
            (Constraint::Choice(vec![]), "empty"),
            (
                Constraint::JsonSchema(r#"{"type":"nonsense"}"#.into()),
                "compile",
            ),
            (Constraint::Lark("start: ???".into()), "compile"),
        ] {
            match gs.compile(&c, "x") {
                Err(EngineError::InvalidRequest {
                    param: Some("x"),
                    message,
                }) => assert!(message.contains(what), "{c:?}: {message}"),
                other => panic!("{c:?}: {other:?}"),
            }
        }
    }

    /// Runs `f` on a thread with a compile thread's stack, as the engine compiles.
    fn on_compile_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        std::thread::Builder::new()
            .stack_size(pool::STACK_BYTES)
            .spawn(f)
            .expect("spawn")
            .join()
            .expect("the compile thread")
    }

    /// `n` definitions, each a `$ref` to the next inside `anyOf` (the crash of issue 37).
    fn ref_chain(n: usize) -> String {
        let defs: Vec<String> = (0..n)
            .map(|i| match i + 1 < n {
                true => format!(
                    r##""d{i}":{{"anyOf":[{{"$ref":"#/$defs/d{}"}},{{"type":"null"}}]}}"##,
                    i + 1
                ),
                false => format!(r#""d{i}":{{"type":"integer"}}"#),
            })
            .collect();
        format!(
            r##"{{"$ref":"#/$defs/d0","$defs":{{{}}}}}"##,
            defs.join(",")
        )
    }

    fn lark_chain(n: usize) -> String {
        let rules: String = (0..n)
            .map(|i| format!("r{i}: \"x\" r{}\n", i + 1))
            .collect();
        format!("start: r0\n{rules}r{n}: \"end\"\n")
    }

    #[test]
    fn deep_constraints_are_refused_by_name_and_the_deepest_allowed_compiles() {
        let depth_error = |r: Result<Grammar, EngineError>| match r {
            Err(EngineError::InvalidRequest {
                param: Some("x"),
                message,
            }) => message,
            other => panic!("{other:?}"),
        };
        let (_, gs) = tiny();
        let gs = Arc::new(gs);
        let g = gs.clone();
        on_compile_stack(move || {
            for c in [
                Constraint::JsonSchema(ref_chain(300)),
                Constraint::JsonSchema(ref_chain(20_000)),
                Constraint::Lark(lark_chain(700)),
                Constraint::Lark(format!("start: %json {}", ref_chain(300))),
                Constraint::Lark(format!(
                    "start: {}\"a\"{}",
                    "(".repeat(5000),
                    ")".repeat(5000)
                )),
            ] {
                let m = depth_error(g.compile(&c, "x"));
                assert!(m.contains("engine.grammar.max_depth"), "{m}");
            }
            // Just inside the limit: compiles (on the compile thread's stack) and works.
            let max = GrammarConfig::default().max_depth;
            let n = (1..200).rev().find(|&n| {
                let v: Value = serde_json::from_str(&ref_chain(n)).unwrap();
                limits::json_depth(&v) <= max
            });
            let c = Constraint::JsonSchema(ref_chain(n.unwrap()));
            let mut m = g
                .compile(&c, "x")
                .expect("the deepest allowed schema compiles");
            m.compute_mask();
            assert!(m.mask().is_some());
            let m = g.compile(&Constraint::Lark(lark_chain(max - 2)), "x");
            assert!(m.is_ok(), "{m:?}");
        });
        // The regex parser bounds its own nesting: an error, never a crash.
        let rx = Constraint::Regex(format!("{}a{}", "(".repeat(100_000), ")".repeat(100_000)));
        assert!(gs.compile(&rx, "x").is_err());
    }

    #[test]
    fn unsatisfiable_constraints_are_refused_at_compile() {
        let (_, gs) = tiny();
        for c in [
            Constraint::JsonSchema(r#"{"type":"integer","minimum":5,"maximum":3}"#.into()),
            Constraint::JsonSchema(r#"{"allOf":[{"type":"string"},{"type":"integer"}]}"#.into()),
            Constraint::JsonSchema("false".into()),
        ] {
            match gs.compile(&c, "x") {
                Err(EngineError::InvalidRequest {
                    param: Some("x"),
                    message,
                }) => {
                    assert!(
                        !message.contains("tokens:") && message.len() < 500,
                        "{message}"
                    )
                }
                other => panic!("{c:?}: {other:?}"),
            }
        }
        assert_eq!(gs.cache_size().0, 0, "nothing that failed is cached");
    }

    #[test]
    fn the_cache_is_bounded_by_bytes_and_keeps_what_served() {
        let (tok, _) = tiny();
        let cfg = GrammarConfig {
            cache_bytes: 8 << 20,
            ..GrammarConfig::default()
        };
        let gs = Grammars::new(&tok, tok.vocab_size(), tok.eos_ids(), &cfg).unwrap();
        let schema = |i: usize| {
            let props: Vec<String> = (0..20)
                .map(|p| format!(r#""k{i}_{p}":{{"type":"string","maxLength":{}}}"#, p + 3))
                .collect();
            Constraint::JsonSchema(format!(
                r#"{{"type":"object","properties":{{{}}}}}"#,
                props.join(",")
            ))
        };
        let first = schema(0);
        gs.compile(&first, "x").unwrap();
        let (_, one) = gs.cache_size();
        assert!(one > 10_000, "a compiled schema is measured: {one} bytes");
        gs.served(&first);
        let mut peak = 0;
        for i in 1..1000 {
            gs.compile(&schema(i), "x").unwrap();
            if i % 100 == 0 {
                gs.served(&schema(i));
            }
            peak = peak.max(gs.cache_size().1);
        }
        let (n, bytes) = gs.cache_size();
        assert!(peak <= cfg.cache_bytes, "{peak} > {}", cfg.cache_bytes);
        assert!(
            n > 10 && bytes > cfg.cache_bytes / 4,
            "the budget is used: {n} entries, {bytes} bytes"
        );
        // Unserved grammars went first (a quarter of the budget at most): the served ones
        // (11, far less than the budget) are all still there.
        assert!(11 * one < cfg.cache_bytes / 2, "{one}");
        assert!(gs.cached(&first).is_some());
        assert!(gs.cached(&schema(900)).is_some());
    }

    /// Stack a compile touches at the deepest allowed `$ref` chain and Lark rule chain (the
    /// Rss of the thread's stack mapping): `cargo test --release --lib stack_per_level --
    /// --ignored --nocapture`.
    #[test]
    #[ignore]
    fn stack_per_level() {
        fn stack_rss_kb() -> u64 {
            let local = 0u8;
            let here = std::hint::black_box(&local) as *const u8 as usize;
            let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
            let mut inside = false;
            for line in smaps.lines() {
                if let Some((range, _)) = line.split_once(' ')
                    && let Some((a, b)) = range.split_once('-')
                    && let (Ok(a), Ok(b)) =
                        (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
                {
                    inside = (a..b).contains(&here);
                } else if inside && let Some(kb) = line.strip_prefix("Rss:") {
                    return kb.trim().trim_end_matches(" kB").trim().parse().unwrap();
                }
            }
            0
        }
        let (_, gs) = tiny();
        let gs = Arc::new(gs);
        for (label, c) in [
            (
                "json $ref chain of 80",
                Constraint::JsonSchema(ref_chain(80)),
            ),
            (
                "json $ref chain of 40",
                Constraint::JsonSchema(ref_chain(40)),
            ),
            ("lark chain of 250", Constraint::Lark(lark_chain(250))),
            ("lark chain of 120", Constraint::Lark(lark_chain(120))),
        ] {
            let g = gs.clone();
            let kb = on_compile_stack(move || {
                let before = stack_rss_kb();
                g.compile(&c, "x").unwrap();
                stack_rss_kb() - before
            });
            println!("{label}: {kb} KiB of stack");
        }
    }

    /// CPU cost of one mask (ms per row) along a JSON document, for the 32k Llama-2 and the
    /// 128k Llama-3 vocabularies: `cargo test --release --lib mask_cost -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn mask_cost() {
        use crate::config::resolve_path;
        use std::path::Path;
        let (l2, _) = tiny();
        let dir = resolve_path(Path::new("../shared/models/tokenizers/llama3.2"));
        let l3 = Tokenizer::from_gpt2_files(
            &dir.join("encoder.json"),
            &dir.join("vocab.bpe"),
            crate::tokenizer::PreTokenizer::Llama3,
        )
        .expect("llama3 files");
        let schema = r#"{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},"tags":{"type":"array","items":{"type":"string"}},"address":{"type":"object","properties":{"street":{"type":"string"},"zip":{"type":"string","pattern":"^[0-9]{5}$"}},"required":["street","zip"]}},"required":["name","age","tags","address"]}"#;
        let doc = r#"{"name":"Ada Lovelace","age":36,"tags":["math","engines","poetry"],"address":{"street":"12 St James's Square","zip":"10001"}}"#;
        for (label, tok, eos) in [("llama-2 32k", &l2, 2u32), ("llama-3 128k", &l3, 127999)] {
            let t0 = std::time::Instant::now();
            let gs =
                Grammars::new(tok, tok.vocab_size(), &[eos], &GrammarConfig::default()).unwrap();
            let trie_ms = t0.elapsed().as_secs_f64() * 1e3;
            let t0 = std::time::Instant::now();
            let c = Constraint::JsonSchema(schema.into());
            let mut g = gs.compile(&c, "x").unwrap();
            let compile_ms = t0.elapsed().as_secs_f64() * 1e3;
            let t0 = std::time::Instant::now();
            gs.compile(&c, "x").unwrap();
            let cached_ms = t0.elapsed().as_secs_f64() * 1e3;
            let toks = gs
                .factory
                .tok_env()
                .tok_trie()
                .greedy_tokenize(doc.as_bytes());
            let (mut total, mut worst) = (0.0f64, 0.0f64);
            for &t in &toks {
                let t0 = std::time::Instant::now();
                g.compute_mask();
                let ms = t0.elapsed().as_secs_f64() * 1e3;
                total += ms;
                worst = worst.max(ms);
                assert!(allowed(&g, t));
                g.consume(t).unwrap();
            }
            println!(
                "{label}: trie {trie_ms:.0} ms, compile {compile_ms:.1} ms (cached {cached_ms:.2} ms), mask {:.3} ms/row mean, {worst:.3} ms worst over {} tokens",
                total / toks.len() as f64,
                toks.len()
            );
            large_schema_cost(label, &gs);
        }
    }

    /// Compile (first and cached) and first mask of `tests/data/large_schema.json` (an order
    /// document: 9 `$defs`, 120 properties, patterns, formats, `anyOf`).
    fn large_schema_cost(label: &str, gs: &Grammars) {
        let path = crate::config::project_root().join("tests/data/large_schema.json");
        let text = std::fs::read_to_string(path).expect("large schema");
        let c = Constraint::JsonSchema(text);
        let t0 = std::time::Instant::now();
        let mut g = gs.compile(&c, "x").expect("the large schema compiles");
        let compile_ms = t0.elapsed().as_secs_f64() * 1e3;
        let t0 = std::time::Instant::now();
        g.compute_mask();
        let mask_ms = t0.elapsed().as_secs_f64() * 1e3;
        let t0 = std::time::Instant::now();
        let mut cached = gs.compile(&c, "x").expect("cached");
        let cached_ms = t0.elapsed().as_secs_f64() * 1e3;
        let t0 = std::time::Instant::now();
        cached.compute_mask();
        let cached_mask_ms = t0.elapsed().as_secs_f64() * 1e3;
        println!(
            "{label}: large schema: compile {compile_ms:.1} ms + first mask {mask_ms:.2} ms; cached {cached_ms:.2} ms + first mask {cached_mask_ms:.2} ms"
        );
    }
}
