//! Token texts and log-probabilities in the completions and chat formats.

use std::collections::BTreeMap;
use std::sync::Arc;

use dashmap::DashMap;

use super::types::{ChatTokenLogprob, CompletionLogprobs, TopLogprob};
use crate::engine::TokenInfo;
use crate::tokenizer::Tokenizer;

/// Most token texts cached per server.
const CACHE_LIMIT: usize = 1 << 20;

/// A token as shown in logprobs: its text (with the leading space a word-initial piece
/// carries) and its bytes. A piece that is part of a UTF-8 character reads `bytes:\xNN`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenText {
    pub text: String,
    pub bytes: Vec<u8>,
}

/// Cached token texts of one tokenizer.
pub struct TokenTexts {
    tokenizer: Arc<Tokenizer>,
    /// A plain token decoded before each one, so SentencePiece keeps its leading space.
    context: Option<u32>,
    cache: DashMap<u32, Arc<TokenText>>,
}

impl TokenTexts {
    /// Texts of `tokenizer`'s tokens, computed on first use.
    pub fn new(tokenizer: &Arc<Tokenizer>) -> Self {
        let context = tokenizer
            .encode("a", false)
            .ok()
            .and_then(|ids| ids.last().copied());
        Self {
            tokenizer: tokenizer.clone(),
            context,
            cache: DashMap::new(),
        }
    }

    /// The text of `id`.
    pub fn get(&self, id: u32) -> Arc<TokenText> {
        if let Some(t) = self.cache.get(&id) {
            return t.clone();
        }
        let t = Arc::new(self.compute(id));
        if self.cache.len() < CACHE_LIMIT {
            self.cache.insert(id, t.clone());
        }
        t
    }

    fn compute(&self, id: u32) -> TokenText {
        let tok = &self.tokenizer;
        let piece = tok.id_to_piece(id).unwrap_or_default();
        if let Some(b) = byte_piece(&piece) {
            return from_bytes(vec![b]);
        }
        let decode = |ids: &[u32]| tok.decode(ids, false).unwrap_or_default();
        let text = match self.context {
            Some(c) => {
                let (both, ctx) = (decode(&[c, id]), decode(&[c]));
                both.strip_prefix(ctx.as_str())
                    .map(str::to_string)
                    .unwrap_or_else(|| decode(&[id]))
            }
            None => decode(&[id]),
        };
        if !text.contains('\u{FFFD}') {
            let bytes = text.as_bytes().to_vec();
            return TokenText { text, bytes };
        }
        match byte_level_bytes(&piece) {
            Some(bytes) => from_bytes(bytes),
            None => TokenText {
                bytes: piece.as_bytes().to_vec(),
                text: piece,
            },
        }
    }

    /// Completions logprobs for `tokens`, whose first one starts at char offset `offset`.
    /// Each token's alternatives include the token itself (up to `logprobs + 1` entries, as
    /// OpenAI and vLLM return them). Returns the offset after the last token.
    pub fn completion(
        &self,
        tokens: &[TokenInfo],
        mut offset: usize,
        out: &mut CompletionLogprobs,
    ) -> usize {
        for t in tokens {
            let text = self.get(t.id);
            out.tokens.push(text.text.clone());
            out.token_logprobs.push(Some(finite(t.logprob)));
            out.text_offset.push(offset);
            offset += text.text.chars().count();
            let mut top: BTreeMap<String, f32> = t
                .top
                .iter()
                .map(|&(id, lp)| (self.get(id).text.clone(), finite(lp)))
                .collect();
            top.entry(text.text.clone()).or_insert(finite(t.logprob));
            out.top_logprobs.push(Some(top));
        }
        offset
    }

    /// Completions logprobs of an echoed prompt: its first token `first` (no logprob:
    /// nothing precedes it, so `null`s), then `rest`, each given the tokens before it.
    /// `offsets` (one per prompt token) place them in the echoed text; without them they
    /// count token texts from 0.
    pub fn completion_prompt(
        &self,
        first: u32,
        rest: &[TokenInfo],
        offsets: Option<&[usize]>,
        out: &mut CompletionLogprobs,
    ) {
        let start = out.tokens.len();
        let text = self.get(first);
        out.tokens.push(text.text.clone());
        out.token_logprobs.push(None);
        out.top_logprobs.push(None);
        out.text_offset.push(0);
        self.completion(rest, text.text.chars().count(), out);
        if let Some(o) = offsets.filter(|o| o.len() == rest.len() + 1) {
            out.text_offset[start..].copy_from_slice(o);
        }
    }

    /// Chat logprobs for `tokens`.
    pub fn chat(&self, tokens: &[TokenInfo]) -> Vec<ChatTokenLogprob> {
        tokens
            .iter()
            .map(|t| {
                let text = self.get(t.id);
                ChatTokenLogprob {
                    token: text.text.clone(),
                    logprob: finite(t.logprob),
                    bytes: Some(text.bytes.clone()),
                    top_logprobs: t
                        .top
                        .iter()
                        .map(|&(id, lp)| {
                            let alt = self.get(id);
                            TopLogprob {
                                token: alt.text.clone(),
                                logprob: finite(lp),
                                bytes: Some(alt.bytes.clone()),
                            }
                        })
                        .collect(),
                }
            })
            .collect()
    }
}

/// JSON has no infinities: a token with zero probability reads as a very small log-probability.
fn finite(lp: f32) -> f32 {
    if lp.is_finite() { lp } else { -9999.0 }
}

/// `<0xNN>`: a SentencePiece byte-fallback piece.
fn byte_piece(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// Text for raw bytes: the string when they are valid UTF-8, else `bytes:\xNN...`.
fn from_bytes(bytes: Vec<u8>) -> TokenText {
    let text = match std::str::from_utf8(&bytes) {
        Ok(s) => s.to_string(),
        Err(_) => {
            let hex: String = bytes.iter().map(|b| format!("\\x{b:02x}")).collect();
            format!("bytes:{hex}")
        }
    };
    TokenText { text, bytes }
}

/// The bytes of a GPT-2 byte-level piece (each char stands for one byte), if it is one.
fn byte_level_bytes(piece: &str) -> Option<Vec<u8>> {
    piece.chars().map(byte_level_char_to_byte).collect()
}

/// Inverse of GPT-2's `bytes_to_unicode`: printable Latin-1 bytes map to themselves, the
/// other 68 bytes to U+0100 and up, in byte order.
fn byte_level_char_to_byte(c: char) -> Option<u8> {
    let printable =
        |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let cp = c as u32;
    if cp < 256 {
        return printable(cp).then_some(cp as u8);
    }
    let n = cp.checked_sub(256)?;
    (0u32..256)
        .filter(|&b| !printable(b))
        .nth(n as usize)
        .map(|b| b as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_pieces_and_byte_level_chars() {
        assert_eq!(byte_piece("<0x0A>"), Some(10));
        assert_eq!(byte_piece("<0x0A"), None);
        assert_eq!(byte_level_char_to_byte('Ġ'), Some(b' '));
        assert_eq!(byte_level_char_to_byte('Ċ'), Some(b'\n'));
        assert_eq!(byte_level_char_to_byte('a'), Some(b'a'));
        assert_eq!(from_bytes(vec![0xE4]).text, "bytes:\\xe4");
        assert_eq!(from_bytes(vec![b'\n']).text, "\n");
    }
}
