//! Token texts and log-probabilities in the completions and chat formats.
//!
//! Stream chunks build the wire structs ([`CompletionLogprobs`], [`ChatTokenLogprob`]) for
//! the few tokens of each delta. A non-streamed response instead writes its logprobs straight
//! from the tokens ([`CompletionLogprobsJson`], [`ChatLogprobsJson`]: the same JSON, with the
//! texts looked up as they are written) into a body allocated once at its exact size
//! ([`json_response`]), so it costs about its own size, not a string per alternative.

use std::collections::BTreeMap;
use std::io;
use std::sync::Arc;

use actix_web::HttpResponse;
use actix_web::http::header::ContentType;
use dashmap::DashMap;
use serde::ser::{Serialize, SerializeSeq, SerializeStruct, Serializer};

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

/// The tokens of a choice's completions logprobs, in order: an echoed prompt's (its first
/// without a logprob), then the generated ones.
#[derive(Clone, Copy)]
enum Scored<'a> {
    First(u32),
    Token(&'a TokenInfo),
}

/// An echoed prompt's part of a choice's completions logprobs.
#[derive(Clone, Copy)]
pub struct EchoedPrompt<'a> {
    /// Its first token (no logprob).
    pub first: u32,
    /// The others, each given the tokens before it.
    pub rest: &'a [TokenInfo],
    /// Where each prompt token begins in the echoed text (used when there is one per token).
    pub offsets: Option<&'a [usize]>,
}

/// A choice's completions logprobs, serialized as the [`CompletionLogprobs`] that
/// [`TokenTexts::completion_prompt`] then [`TokenTexts::completion`] would build (the same
/// JSON), straight from the tokens.
pub struct CompletionLogprobsJson<'a> {
    texts: &'a TokenTexts,
    prompt: Option<EchoedPrompt<'a>>,
    tokens: &'a [TokenInfo],
    /// Char offset of the first generated token.
    offset: usize,
}

impl<'a> CompletionLogprobsJson<'a> {
    /// Logprobs of `prompt` (when echoed) then of `tokens`, the first of which begins at char
    /// `offset` of the choice's text.
    pub fn new(
        texts: &'a TokenTexts,
        prompt: Option<EchoedPrompt<'a>>,
        tokens: &'a [TokenInfo],
        offset: usize,
    ) -> Self {
        Self {
            texts,
            prompt,
            tokens,
            offset,
        }
    }

    fn scored(&self) -> impl Iterator<Item = Scored<'a>> + 'a {
        let prompt = self.prompt.map(|p| {
            std::iter::once(Scored::First(p.first)).chain(p.rest.iter().map(Scored::Token))
        });
        prompt
            .into_iter()
            .flatten()
            .chain(self.tokens.iter().map(Scored::Token))
    }

    /// `text_offset`: the prompt's from its offsets (or counted from 0), the generated
    /// tokens' counted from `offset`.
    fn offsets(&self) -> impl Iterator<Item = usize> + '_ {
        let chars = |id: u32| self.texts.get(id).text.chars().count();
        let prompt = self.prompt.map(|p| {
            let given = p.offsets.filter(|o| o.len() == p.rest.len() + 1);
            let counted = given.is_none().then(|| {
                let first = std::iter::once(p.first);
                first
                    .chain(p.rest.iter().map(|t| t.id))
                    .scan(0, move |at, id| {
                        let here = *at;
                        *at += chars(id);
                        Some(here)
                    })
            });
            given
                .into_iter()
                .flatten()
                .copied()
                .chain(counted.into_iter().flatten())
        });
        let generated = self.tokens.iter().scan(self.offset, move |at, t| {
            let here = *at;
            *at += chars(t.id);
            Some(here)
        });
        prompt.into_iter().flatten().chain(generated)
    }
}

/// A token's text as a JSON string.
struct Text(Arc<TokenText>);

impl Serialize for Text {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0.text)
    }
}

/// A token's alternatives by text, as the `BTreeMap` of [`CompletionLogprobs`] holds them:
/// sorted by text, the last of equal texts kept, the token itself added when its text is not
/// among them.
struct TopMap<'a>(&'a [(Arc<TokenText>, f32)]);

impl Serialize for TopMap<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(t, lp)| (t.text.as_str(), *lp)))
    }
}

impl TokenTexts {
    /// `t`'s alternatives into `out` as [`TopMap`] writes them.
    fn top_map(&self, t: &TokenInfo, out: &mut Vec<(Arc<TokenText>, f32)>) {
        out.clear();
        out.extend(t.top.iter().map(|&(id, lp)| (self.get(id), finite(lp))));
        // Stable: equal texts stay in their order, and a map keeps the last one's value.
        out.sort_by(|a, b| a.0.text.cmp(&b.0.text));
        let mut kept = 0;
        for i in 0..out.len() {
            if out
                .get(i + 1)
                .is_some_and(|next| next.0.text == out[i].0.text)
            {
                continue;
            }
            out.swap(kept, i);
            kept += 1;
        }
        out.truncate(kept);
        let own = self.get(t.id);
        if let Err(at) = out.binary_search_by(|a| a.0.text.as_str().cmp(&own.text)) {
            out.insert(at, (own, finite(t.logprob)));
        }
    }
}

impl Serialize for CompletionLogprobsJson<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        /// One field's sequence, written from the tokens as it goes.
        struct Field<'b, 'a>(&'b CompletionLogprobsJson<'a>, u8);
        impl Serialize for Field<'_, '_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let (lp, texts) = (self.0, self.0.texts);
                match self.1 {
                    0 => s.collect_seq(lp.scored().map(|t| match t {
                        Scored::First(id) => Text(texts.get(id)),
                        Scored::Token(t) => Text(texts.get(t.id)),
                    })),
                    1 => s.collect_seq(lp.scored().map(|t| match t {
                        Scored::First(_) => None,
                        Scored::Token(t) => Some(finite(t.logprob)),
                    })),
                    2 => {
                        let mut seq = s.serialize_seq(None)?;
                        let mut top = Vec::new();
                        for t in lp.scored() {
                            match t {
                                Scored::First(_) => seq.serialize_element(&None::<()>)?,
                                Scored::Token(t) => {
                                    texts.top_map(t, &mut top);
                                    seq.serialize_element(&Some(TopMap(&top)))?;
                                }
                            }
                        }
                        seq.end()
                    }
                    _ => s.collect_seq(lp.offsets()),
                }
            }
        }
        let mut st = s.serialize_struct("CompletionLogprobs", 4)?;
        st.serialize_field("tokens", &Field(self, 0))?;
        st.serialize_field("token_logprobs", &Field(self, 1))?;
        st.serialize_field("top_logprobs", &Field(self, 2))?;
        st.serialize_field("text_offset", &Field(self, 3))?;
        st.end()
    }
}

/// A choice's chat logprobs, serialized as the `ChatLogprobs { content: Some(..) }` of
/// [`TokenTexts::chat`] (the same JSON), straight from the tokens.
pub struct ChatLogprobsJson<'a> {
    texts: &'a TokenTexts,
    tokens: &'a [TokenInfo],
}

impl<'a> ChatLogprobsJson<'a> {
    /// Logprobs of `tokens`.
    pub fn new(texts: &'a TokenTexts, tokens: &'a [TokenInfo]) -> Self {
        Self { texts, tokens }
    }
}

/// One chat token (or alternative), as [`ChatTokenLogprob`] / [`TopLogprob`] write it.
struct ChatToken<'a> {
    texts: &'a TokenTexts,
    id: u32,
    logprob: f32,
    /// The alternatives (a [`TopLogprob`] has none).
    top: Option<&'a [(u32, f32)]>,
}

impl Serialize for ChatToken<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let text = self.texts.get(self.id);
        let fields = if self.top.is_some() { 4 } else { 3 };
        let name = if self.top.is_some() {
            "ChatTokenLogprob"
        } else {
            "TopLogprob"
        };
        let mut st = s.serialize_struct(name, fields)?;
        st.serialize_field("token", text.text.as_str())?;
        st.serialize_field("logprob", &finite(self.logprob))?;
        st.serialize_field("bytes", &Some(text.bytes.as_slice()))?;
        if let Some(top) = self.top {
            let alts = top.iter().map(|&(id, logprob)| ChatToken {
                texts: self.texts,
                id,
                logprob,
                top: None,
            });
            st.serialize_field("top_logprobs", &Seq(std::cell::Cell::new(Some(alts))))?;
        }
        st.end()
    }
}

/// An iterator written once as a JSON array.
struct Seq<I>(std::cell::Cell<Option<I>>);

impl<I: Iterator<Item = T>, T: Serialize> Serialize for Seq<I> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.take().into_iter().flatten())
    }
}

impl Serialize for ChatLogprobsJson<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let tokens = self.tokens.iter().map(|t| ChatToken {
            texts: self.texts,
            id: t.id,
            logprob: t.logprob,
            top: Some(&t.top),
        });
        let mut st = s.serialize_struct("ChatLogprobs", 1)?;
        st.serialize_field("content", &Some(Seq(std::cell::Cell::new(Some(tokens)))))?;
        st.end()
    }
}

/// A 200 with `value` as its JSON body (as `HttpResponse::json` writes it), allocated once at
/// its exact length: a first pass counts the bytes, the second writes them (a growing buffer
/// would hold up to twice the body).
pub fn json_response<T: Serialize>(value: &T) -> HttpResponse {
    let mut count = Counter(0);
    let written = serde_json::to_writer(&mut count, value).and_then(|()| {
        let mut body = Vec::with_capacity(count.0);
        serde_json::to_writer(&mut body, value).map(|()| body)
    });
    match written {
        Ok(body) => HttpResponse::Ok()
            .content_type(ContentType::json())
            .body(body),
        Err(e) => HttpResponse::from_error(actix_web::error::JsonPayloadError::Serialize(e)),
    }
}

/// A writer that only counts.
struct Counter(usize);

impl io::Write for Counter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
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

/// Token texts of the test model and synthetic tokens, for the tests of the response bodies.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;
    use crate::model::gguf::GgufFile;

    /// Texts of `stories260K.gguf`'s vocabulary (512 tokens: byte pieces, some of which
    /// share their text with a plain piece, and ones that are not UTF-8 alone).
    pub fn texts() -> Arc<TokenTexts> {
        let path = crate::config::resolve_path(std::path::Path::new(crate::config::DEFAULT_MODEL));
        let file = GgufFile::open(&path).expect("fixture");
        let tok = Arc::new(Tokenizer::from_gguf(&file).expect("tokenizer"));
        Arc::new(TokenTexts::new(&tok))
    }

    /// `count` tokens with `top` alternatives each, drawn from a vocabulary of `vocab` by a
    /// generator seeded with `seed`: some alternatives repeat the token, some log-probabilities
    /// are -inf.
    pub fn tokens(count: usize, top: usize, vocab: u32, seed: u64) -> Vec<TokenInfo> {
        let mut x = seed | 1;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let logprob = |r: u64| match r % 50 {
            0 => f32::NEG_INFINITY,
            r => -((r * 7919 % 10007) as f32) / 997.0,
        };
        (0..count)
            .map(|_| {
                let id = (next() % u64::from(vocab)) as u32;
                let start = next() % u64::from(vocab);
                // A quarter of the tokens are among their own alternatives (first).
                let own = next() % 4 == 0;
                let alts = (0..top as u64)
                    .map(|k| {
                        let alt = (start + k * 37) % u64::from(vocab);
                        let r = next();
                        let alt = if own && k == 0 { id } else { alt as u32 };
                        (alt, logprob(r))
                    })
                    .collect();
                let r = next();
                TokenInfo {
                    id,
                    logprob: logprob(r),
                    top: alts,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The JSON of `lp` as `serde_json` writes it.
    fn json(lp: &impl Serialize) -> String {
        serde_json::to_string(lp).expect("json")
    }

    #[test]
    fn completion_logprobs_are_written_as_the_structs_were() {
        let texts = testing::texts();
        let vocab = 512;
        let rest = testing::tokens(40, 5, vocab, 7);
        let generated = testing::tokens(300, 20, vocab, 11);
        let offsets: Vec<usize> = (0..41).map(|i| i * 3).collect();
        for (echo, given) in [(false, None), (true, None), (true, Some(&offsets[..]))] {
            let mut owned = CompletionLogprobs::default();
            let prompt = echo.then(|| {
                texts.completion_prompt(2, &rest, given, &mut owned);
                EchoedPrompt {
                    first: 2,
                    rest: &rest,
                    offsets: given,
                }
            });
            let offset = if echo { 17 } else { 0 };
            texts.completion(&generated, offset, &mut owned);
            let lazy = CompletionLogprobsJson::new(&texts, prompt, &generated, offset);
            assert_eq!(json(&lazy), json(&owned), "echo {echo}, offsets {given:?}");
        }
        // Offsets that do not match the prompt are counted from the texts, as before.
        let mut owned = CompletionLogprobs::default();
        texts.completion_prompt(5, &rest, Some(&offsets[..3]), &mut owned);
        let prompt = EchoedPrompt {
            first: 5,
            rest: &rest,
            offsets: Some(&offsets[..3]),
        };
        let lazy = CompletionLogprobsJson::new(&texts, Some(prompt), &[], 0);
        assert_eq!(json(&lazy), json(&owned));
        // The tokens among their alternatives were covered.
        assert!(owned.top_logprobs.iter().flatten().any(|m| m.len() == 5));
    }

    #[test]
    fn alternatives_with_one_text_keep_the_last_and_the_token_joins_them() {
        let texts = testing::texts();
        // Byte piece <0x41> (id 68) and the plain piece "A" share their text.
        let same: Vec<u32> = (0..512u32)
            .filter(|&id| texts.get(id).text == texts.get(68).text)
            .collect();
        assert!(same.len() >= 2, "{same:?}");
        let t = TokenInfo {
            id: same[0],
            logprob: -0.5,
            top: vec![(same[1], -1.0), (300, -2.0), (same[0], -3.0), (301, -4.0)],
        };
        let mut owned = CompletionLogprobs::default();
        texts.completion(std::slice::from_ref(&t), 0, &mut owned);
        let lazy = CompletionLogprobsJson::new(&texts, None, std::slice::from_ref(&t), 0);
        assert_eq!(json(&lazy), json(&owned));
        let top = owned.top_logprobs[0].as_ref().expect("top");
        assert_eq!(top[&texts.get(same[0]).text], -3.0);
        // Not among its alternatives: the token itself is added.
        let alone = TokenInfo {
            top: vec![(300, -2.0)],
            ..t
        };
        let lazy = CompletionLogprobsJson::new(&texts, None, std::slice::from_ref(&alone), 0);
        let mut owned = CompletionLogprobs::default();
        texts.completion(std::slice::from_ref(&alone), 0, &mut owned);
        assert_eq!(json(&lazy), json(&owned));
        assert_eq!(owned.top_logprobs[0].as_ref().expect("top").len(), 2);
    }

    #[test]
    fn chat_logprobs_are_written_as_the_structs_were() {
        let texts = testing::texts();
        let tokens = testing::tokens(300, 20, 512, 3);
        let owned = super::super::types::ChatLogprobs {
            content: Some(texts.chat(&tokens)),
        };
        assert_eq!(json(&ChatLogprobsJson::new(&texts, &tokens)), json(&owned));
        let none = super::super::types::ChatLogprobs {
            content: Some(texts.chat(&[])),
        };
        assert_eq!(json(&ChatLogprobsJson::new(&texts, &[])), json(&none));
    }

    #[test]
    fn json_response_is_exactly_sized_json() {
        let value = serde_json::json!({"a": [1, 2.5, "x\"y"], "b": null});
        let resp = json_response(&value);
        assert_eq!(resp.status(), 200);
        let ctype = resp.headers().get("content-type").expect("content type");
        assert_eq!(ctype, "application/json");
        let body = actix_web::body::MessageBody::try_into_bytes(resp.into_body()).expect("bytes");
        assert_eq!(
            &body[..],
            serde_json::to_string(&value).expect("json").as_bytes()
        );
    }

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
