//! Compiling constraints: the cache, the depth limits at work, what cannot be satisfied, and
//! (ignored) what a compile costs in stack and time.

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
                && let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
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
        let gs = Grammars::new(tok, tok.vocab_size(), &[eos], &GrammarConfig::default()).unwrap();
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
