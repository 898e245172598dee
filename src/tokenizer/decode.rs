//! Ids to text through the `tokenizers` decoder, with byte-fallback runs decoded like `from_utf8_lossy`.

use std::collections::HashSet;

use tokenizers::{Decoder, DecoderWrapper};

use super::TokenizerError;

/// Whether `decoder` turns `<0xXX>` pieces into bytes.
pub(super) fn has_byte_fallback(decoder: &DecoderWrapper) -> bool {
    match decoder {
        DecoderWrapper::ByteFallback(_) => true,
        DecoderWrapper::Sequence(seq) => seq.get_decoders().iter().any(has_byte_fallback),
        _ => false,
    }
}

/// Decodes `ids` (already range-checked) with the tokenizer's own decoder; with
/// `skip_special`, the ids in `skipped` are left out.
///
/// `tokenizers`' `ByteFallback` replaces every byte of a run of byte pieces with U+FFFD as soon
/// as the run holds one invalid sequence, so a valid character could turn into U+FFFD when more
/// byte pieces follow. Splitting each run at UTF-8 chunk boundaries first (an empty piece ends a
/// run) keeps valid characters as they are and makes a decode of `ids` a prefix of a decode of
/// `ids + more` whenever it does not end in U+FFFD, which streaming relies on.
pub(super) fn decode(
    hf: &tokenizers::Tokenizer,
    skipped: &HashSet<u32>,
    byte_fallback: bool,
    ids: &[u32],
    skip_special: bool,
) -> Result<String, TokenizerError> {
    let mut pieces: Vec<String> = ids
        .iter()
        .filter(|id| !(skip_special && skipped.contains(id)))
        .filter_map(|&id| hf.id_to_token(id))
        .collect();
    if byte_fallback {
        pieces = split_byte_runs(pieces);
    }
    match hf.get_decoder() {
        Some(decoder) => decoder
            .decode(pieces)
            .map_err(|e| TokenizerError::Decode(e.to_string())),
        None => Ok(pieces.join(" ")),
    }
}

/// The byte of a `<0xXX>` piece.
fn piece_byte(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// Ends each run of byte pieces after every valid stretch and every invalid sequence.
fn split_byte_runs(pieces: Vec<String>) -> Vec<String> {
    let mut out = Vec::with_capacity(pieces.len());
    let mut run_bytes = Vec::new();
    let mut run_pieces = Vec::new();
    for piece in pieces {
        match piece_byte(&piece) {
            Some(byte) => {
                run_bytes.push(byte);
                run_pieces.push(piece);
            }
            None => {
                flush_run(&mut out, &mut run_bytes, &mut run_pieces);
                out.push(piece);
            }
        }
    }
    flush_run(&mut out, &mut run_bytes, &mut run_pieces);
    out
}

fn flush_run(out: &mut Vec<String>, bytes: &mut Vec<u8>, pieces: &mut Vec<String>) {
    let mut rest = pieces.drain(..);
    for chunk in bytes.utf8_chunks() {
        for len in [chunk.valid().len(), chunk.invalid().len()] {
            if len > 0 {
                out.extend(rest.by_ref().take(len));
                out.push(String::new());
            }
        }
    }
    bytes.clear();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn runs_split_at_utf8_chunks() {
        let got = split_byte_runs(strings(&["a", "<0x15>", "<0xE2>", "<0x41>", "b"]));
        assert_eq!(
            got,
            strings(&["a", "<0x15>", "", "<0xE2>", "", "<0x41>", "", "b"])
        );
        let got = split_byte_runs(strings(&["<0xE2>", "<0x82>", "<0xAC>"]));
        assert_eq!(got, strings(&["<0xE2>", "<0x82>", "<0xAC>", ""]));
        assert_eq!(piece_byte("<0x0A>"), Some(10));
        assert_eq!(piece_byte("<0x0A"), None);
        assert_eq!(piece_byte("<0x0AB>"), None);
    }
}
