//! Streaming detokenization: text for each new token id, never half a UTF-8 character.

use super::{Tokenizer, TokenizerError};

/// How many prompt tokens before the first generated one serve as decoding context.
const PROMPT_CONTEXT: usize = 5;

/// Turns a stream of token ids into text pieces, the way vLLM and TGI do.
///
/// Each `push` decodes a short window of already emitted tokens (the prefix) with and without the
/// new ones and returns the difference, but only once that text does not end in U+FFFD: byte
/// tokens of a character still being spelled out are held back. Decoding a window rather than
/// single tokens keeps context-dependent decoding right (SentencePiece's leading-space strip,
/// byte-level pieces that split a character).
///
/// Guarantee: without prompt ids, the pieces returned by `push` and then `finish` concatenate to
/// `tokenizer.decode(all_pushed_ids, skip_special)`. With prompt ids they are the text the
/// generated ids add after the prompt (e.g. a leading space that SentencePiece would strip at
/// the very start is kept).
#[derive(Debug, Clone)]
pub struct IncrementalDecoder {
    tokenizer: Tokenizer,
    skip_special: bool,
    /// Ids from the start of the decoding window on; older ids are dropped.
    ids: Vec<u32>,
    /// `ids[..read_offset]` has been emitted; `ids[..read_offset]` is the prefix window.
    read_offset: usize,
}

impl IncrementalDecoder {
    /// A decoder with no context: the first piece is decoded as the start of a text.
    pub fn new(tokenizer: &Tokenizer, skip_special: bool) -> Self {
        Self::with_prompt(tokenizer, &[], skip_special)
    }

    /// A decoder whose output continues `prompt_ids` (their last few ids are used as context).
    pub fn with_prompt(tokenizer: &Tokenizer, prompt_ids: &[u32], skip_special: bool) -> Self {
        let context = &prompt_ids[prompt_ids.len().saturating_sub(PROMPT_CONTEXT)..];
        Self {
            tokenizer: tokenizer.clone(),
            skip_special,
            ids: context.to_vec(),
            read_offset: context.len(),
        }
    }

    /// Adds one id; returns the newly completed text (possibly empty). An id outside the
    /// vocabulary is an error and leaves the decoder unchanged.
    pub fn push(&mut self, id: u32) -> Result<String, TokenizerError> {
        self.tokenizer.check_id(id)?;
        self.ids.push(id);
        let prefix = self
            .tokenizer
            .decode(&self.ids[..self.read_offset], self.skip_special)?;
        let full = self.tokenizer.decode(&self.ids, self.skip_special)?;
        if full.len() <= prefix.len() || full.ends_with('\u{FFFD}') {
            return Ok(String::new());
        }
        let piece = suffix_after(&full, &prefix).to_string();
        self.advance();
        Ok(piece)
    }

    /// Returns whatever is still held back (lossy: incomplete characters become U+FFFD); later
    /// pushes continue after it.
    pub fn finish(&mut self) -> String {
        if self.read_offset == self.ids.len() {
            return String::new();
        }
        let decode = |ids: &[u32]| {
            self.tokenizer
                .decode(ids, self.skip_special)
                .unwrap_or_default()
        };
        let prefix = decode(&self.ids[..self.read_offset]);
        let full = decode(&self.ids);
        let piece = if full.len() > prefix.len() {
            suffix_after(&full, &prefix).to_string()
        } else {
            String::new()
        };
        self.advance();
        piece
    }

    /// The emitted tail becomes the next prefix window; everything before it is forgotten.
    fn advance(&mut self) {
        self.ids.drain(..self.read_offset);
        self.read_offset = self.ids.len();
    }
}

/// `full` minus its first `prefix.len()` bytes, moved forward to a character boundary if the
/// prefix is not a true prefix (never expected; keeps slicing panic-free).
fn suffix_after<'a>(full: &'a str, prefix: &str) -> &'a str {
    let mut cut = prefix.len();
    while !full.is_char_boundary(cut) {
        cut += 1;
    }
    &full[cut..]
}
