//! Fuzz target: constraint limits and compilation. The first byte picks a JSON Schema or a
//! Lark grammar, the rest is its text. Whatever passes Kiln's limits (`limits.rs`, the
//! engine's own source) is compiled by llguidance on a thread with an eighth of a compile
//! thread's stack: an input within the depth limit that still overflows it is a crash here,
//! long before it could overflow the engine's 64 MiB compile threads.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use llguidance::ParserFactory;
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::ApproximateTokEnv;

#[allow(dead_code)]
#[path = "../../src/engine/constraint/limits.rs"]
mod limits;

/// An eighth of the engine's compile-thread stack (`pool::STACK_BYTES`, 64 MiB).
const STACK: usize = 8 << 20;

fn factory() -> &'static ParserFactory {
    static F: OnceLock<ParserFactory> = OnceLock::new();
    F.get_or_init(|| {
        let mut f = ParserFactory::new_simple(&ApproximateTokEnv::single_byte_env())
            .expect("a byte-level factory");
        f.quiet();
        f.limits_mut().verbose_errors = false;
        f
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&kind, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let cfg = limits::GrammarConfig::default();
    let json = kind % 2 == 0;
    let depth = match json {
        true => limits::schema_depth(text),
        false => limits::lark_depth(text),
    };
    let Ok(depth) = depth else { return };
    if limits::within(text.len(), depth, &cfg).is_err() {
        return;
    }
    let text = text.to_string();
    std::thread::Builder::new()
        .stack_size(STACK)
        .spawn(move || {
            let grammar = match json {
                true => match serde_json::from_str(&text) {
                    Ok(v) => TopLevelGrammar::from_json_schema(v),
                    Err(_) => return,
                },
                false => TopLevelGrammar::from_lark(text),
            };
            if let Ok(mut p) = factory().create_parser(grammar) {
                let _ = p.compute_mask();
            }
        })
        .expect("spawn")
        .join()
        .expect("no panic escapes a compile");
});
