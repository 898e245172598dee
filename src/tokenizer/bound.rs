//! Bounds that keep a tokenizer's cost proportional to what a request may use: the most input
//! bytes one token can stand for, token counting that stops once past a limit, and the size of
//! the BPE word caches.

use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::Value;
use tokenizers::models::ModelWrapper;

/// Words each thread's BPE cache keeps (the `tokenizers` crate keeps one cache per thread and
/// per model; its default is 10,000). A SentencePiece vocabulary caches a short prompt whole
/// (~850 bytes each), so a thread's cache stays under ~3.5 MB, and the server's under that
/// times `server.blocking_threads`.
pub const BPE_CACHE_ENTRIES: usize = 4096;

/// Normalizers that never make text shorter in bytes (a prefix is added; `Replace` is checked
/// on its own: a space becoming `▁` is fine, a shorter replacement is not).
const NON_SHRINKING: &[&str] = &["Sequence", "Prepend"];

/// Pre-tokenizers that drop whitespace: any run of it costs no token, so no bound holds.
const DROPS_WHITESPACE: &[&str] = &["Whitespace", "WhitespaceSplit", "BertPreTokenizer"];

/// Most UTF-8 bytes a normalizer can fold into one (NFC/NFKC compose and fold: e.g. a
/// full-width `Ａ` (3 bytes) becomes `A`, a Hangul jamo triple (9 bytes) one syllable (3)).
const SHRINK_FACTOR: usize = 4;

/// Bytes tokenized per piece while counting a long text's tokens.
pub const COUNT_CHUNK_BYTES: usize = 64 * 1024;

/// Tokens a piece boundary may add to the count (a SentencePiece prefix `▁`, a word split
/// where no blank was near), so that a text within the limit is never refused.
const BOUNDARY_SLACK: usize = 8;

/// Whether `text` may hold more than `max_tokens` tokens: each tokenized (and counted in
/// `tokenized`) piece by piece of about [`COUNT_CHUNK_BYTES`], cut before a blank that
/// starts a word (where pre-tokenizers split anyway), stopping as soon as the count passes
/// `max_tokens` plus the boundaries' slack. `Err(counted)`: the tokens counted when it
/// stopped. A text shorter in bytes than `max_tokens` is not counted (a byte is at most one
/// token), nor is anything longer than that tokenized whole before passing this check.
pub(super) fn check_token_count(
    hf: &tokenizers::Tokenizer,
    text: &str,
    max_tokens: usize,
    tokenized: &AtomicU64,
) -> Result<(), TokenCountError> {
    if text.len() <= max_tokens {
        return Ok(());
    }
    let (mut counted, mut start, mut pieces) = (0usize, 0usize, 0usize);
    while start < text.len() {
        let end = piece_end(text, start);
        let piece = &text[start..end];
        tokenized.fetch_add(piece.len() as u64, Ordering::Relaxed);
        let enc = hf
            .encode_fast(piece, false)
            .map_err(|e| TokenCountError::Encode(e.to_string()))?;
        counted += enc.len();
        pieces += 1;
        if counted > max_tokens.saturating_add((pieces - 1) * BOUNDARY_SLACK) {
            return Err(TokenCountError::TooMany(counted));
        }
        start = end;
    }
    Ok(())
}

/// Why [`check_token_count`] refused.
#[derive(Debug)]
pub(super) enum TokenCountError {
    /// More tokens than allowed (the count when it stopped).
    TooMany(usize),
    Encode(String),
}

/// The end of the piece starting at `start`: the first blank after [`COUNT_CHUNK_BYTES`] that
/// follows a non-blank and precedes one (the blank stays with the word after it), else a char
/// boundary one more chunk on.
fn piece_end(text: &str, start: usize) -> usize {
    let bytes = text.as_bytes();
    let from = start + COUNT_CHUNK_BYTES;
    if from >= text.len() {
        return text.len();
    }
    let limit = (from + COUNT_CHUNK_BYTES).min(text.len() - 1);
    for i in from..limit {
        if bytes[i] == b' '
            && !bytes[i - 1].is_ascii_whitespace()
            && !bytes[i + 1].is_ascii_whitespace()
        {
            return i;
        }
    }
    let mut end = limit;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    end
}

/// Replaces the model's BPE cache by one of [`BPE_CACHE_ENTRIES`] words per thread.
pub(super) fn cap_bpe_cache(hf: &mut tokenizers::Tokenizer) {
    if let ModelWrapper::BPE(bpe) = hf.get_model() {
        let mut bpe = bpe.clone();
        bpe.resize_cache(BPE_CACHE_ENTRIES);
        hf.with_model(bpe);
    }
}

/// The most input bytes one token can stand for, or `None` when there is no such bound.
///
/// A token's vocabulary piece is at least as long in UTF-8 as the input it matches: byte-level
/// pieces spell each byte with one or two bytes, SentencePiece pieces spell a space as `▁`
/// (three bytes) and a fallback byte as `<0xXX>`, added tokens are their text. A normalizer
/// that may shorten text multiplies the bound by [`SHRINK_FACTOR`]. A BPE that fuses runs of
/// unknown characters into one token without byte fallback, or a pre-tokenizer that drops
/// whitespace, has no bound.
pub(super) fn bytes_per_token(hf: &tokenizers::Tokenizer) -> Option<usize> {
    let model = serde_json::to_value(hf.get_model()).ok()?;
    let flag = |k: &str| model.get(k).and_then(Value::as_bool).unwrap_or(false);
    if flag("fuse_unk") && !flag("byte_fallback") {
        return None;
    }
    if let Some(pre) = hf.get_pre_tokenizer() {
        let mut kinds = Vec::new();
        types_in(&serde_json::to_value(pre).ok()?, &mut kinds);
        if kinds.iter().any(|k| DROPS_WHITESPACE.contains(&k.as_str())) {
            return None;
        }
    }
    let longest = hf
        .get_vocab(true)
        .keys()
        .map(String::len)
        .max()
        .unwrap_or(1)
        .max(1);
    let shrinks = hf.get_normalizer().is_some_and(|n| {
        serde_json::to_value(n).map_or(true, |v| {
            let mut nodes = Vec::new();
            nodes_in(&v, &mut nodes);
            nodes.iter().any(|n| may_shrink(n))
        })
    });
    Some(if shrinks {
        longest * SHRINK_FACTOR
    } else {
        longest
    })
}

/// Whether one serialized normalizer may make text shorter in bytes.
fn may_shrink(node: &Value) -> bool {
    let kind = node.get("type").and_then(Value::as_str).unwrap_or_default();
    if kind == "Replace" {
        let pattern = node.pointer("/pattern/String").and_then(Value::as_str);
        let content = node.get("content").and_then(Value::as_str);
        return !matches!((pattern, content), (Some(p), Some(c)) if c.len() >= p.len());
    }
    !NON_SHRINKING.contains(&kind)
}

/// Every object with a `"type"` in a serialized component (sequences nest).
fn nodes_in<'a>(v: &'a Value, out: &mut Vec<&'a Value>) {
    match v {
        Value::Object(map) => {
            if map.get("type").is_some_and(Value::is_string) {
                out.push(v);
            }
            map.values().for_each(|x| nodes_in(x, out));
        }
        Value::Array(items) => items.iter().for_each(|x| nodes_in(x, out)),
        _ => {}
    }
}

/// Every `"type"` string in a serialized component.
fn types_in(v: &Value, out: &mut Vec<String>) {
    let mut nodes = Vec::new();
    nodes_in(v, &mut nodes);
    out.extend(
        nodes
            .iter()
            .filter_map(|n| n.get("type").and_then(Value::as_str).map(str::to_string)),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_end_before_a_blank_that_starts_a_word() {
        let text = "ab ".repeat(COUNT_CHUNK_BYTES);
        let end = piece_end(&text, 0);
        assert!(
            (COUNT_CHUNK_BYTES..COUNT_CHUNK_BYTES + 3).contains(&end),
            "{end}"
        );
        assert_eq!(&text[end..end + 3], " ab");
        // No blank at all: a char boundary a chunk further on.
        let text = "é".repeat(COUNT_CHUNK_BYTES * 2);
        let end = piece_end(&text, 0);
        assert!(
            text.is_char_boundary(end) && end > COUNT_CHUNK_BYTES,
            "{end}"
        );
        assert_eq!(piece_end("short", 0), 5);
    }
}
