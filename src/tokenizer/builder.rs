//! Builds `tokenizers` pipelines: SentencePiece as BPE with byte fallback, and byte-level BPE.

use std::collections::HashMap;

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{BPE, Merges, Vocab};
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormalizerSequence};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence as PreTokenizerSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, DecoderWrapper, PreTokenizerWrapper, SplitDelimiterBehavior};

use super::TokenizerError;
use super::gguf_vocab::{GgufVocab, TokenType, VocabModel};

/// How a byte-level BPE vocabulary splits text before BPE (GGUF `tokenizer.ggml.pre`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreTokenizer {
    /// GPT-2's regex (`gpt-2`, `default`).
    Gpt2,
    /// Llama 3's regex (`llama-bpe`, `llama3`), with whole-word vocabulary hits before merges.
    Llama3,
    /// Qwen2's regex (`qwen2`): Llama 3's with single digits.
    Qwen2,
    /// o200k's regex (`gpt-4o`: GPT-4o, gpt-oss): case-aware words with contractions,
    /// digits in threes, `/` kept with punctuation; whole-word vocabulary hits before merges,
    /// as tiktoken does.
    Gpt4o,
}

impl PreTokenizer {
    /// Maps a GGUF `tokenizer.ggml.pre` name; absent means GPT-2.
    pub fn from_gguf_name(name: Option<&str>) -> Result<Self, TokenizerError> {
        match name {
            None | Some("default" | "gpt-2" | "gpt2") => Ok(Self::Gpt2),
            Some("llama3" | "llama-v3" | "llama-bpe" | "smaug-bpe") => Ok(Self::Llama3),
            Some("qwen2" | "deepseek-r1-qwen") => Ok(Self::Qwen2),
            Some("gpt-4o") => Ok(Self::Gpt4o),
            Some(other) => Err(TokenizerError::UnsupportedPreTokenizer(other.to_string())),
        }
    }

    /// The split regex (`None`: the GPT-2 regex built into `ByteLevel`).
    pub fn pattern(self) -> Option<&'static str> {
        match self {
            Self::Gpt2 => None,
            Self::Llama3 => Some(LLAMA3_PATTERN),
            Self::Qwen2 => Some(QWEN2_PATTERN),
            Self::Gpt4o => Some(O200K_PATTERN),
        }
    }

    /// Whether a piece found whole in the vocabulary skips the merges (`ignore_merges`).
    pub fn ignore_merges(self) -> bool {
        matches!(self, Self::Llama3 | Self::Gpt4o)
    }
}

/// The Llama-3 split regex.
pub const LLAMA3_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The Qwen2 split regex: Llama 3's with single digits.
pub const QWEN2_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The o200k split regex (tiktoken's `o200k_base` `pat_str`, GGUF pre `gpt-4o`).
pub const O200K_PATTERN: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
);

/// SentencePiece's word-boundary marker.
const SPM_SPACE: &str = "\u{2581}";

/// Builds the `tokenizers` pipeline for a GGUF vocabulary (already validated).
pub fn from_gguf_vocab(vocab: &GgufVocab) -> Result<tokenizers::Tokenizer, TokenizerError> {
    let mut tok = match vocab.model {
        VocabModel::Llama => sentencepiece(vocab)?,
        VocabModel::Gpt2 => {
            let merges = vocab
                .merges
                .iter()
                .map(|m| {
                    split_merge(m).ok_or_else(|| TokenizerError::InvalidMetadata {
                        key: "tokenizer.ggml.merges",
                        reason: format!("merge {m:?} has no separating space"),
                    })
                })
                .collect::<Result<Merges, _>>()?;
            let pre = PreTokenizer::from_gguf_name(vocab.pre.as_deref())?;
            byte_level(vocab_map(&vocab.tokens), merges, pre)?
        }
    };
    add_gguf_added_tokens(&mut tok, vocab)?;
    Ok(tok)
}

/// Byte-level BPE (GPT-2 style) splitting text by `pre`.
pub fn byte_level(
    vocab: Vocab,
    merges: Merges,
    pre: PreTokenizer,
) -> Result<tokenizers::Tokenizer, TokenizerError> {
    let model = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(pre.ignore_merges())
        .build()
        .map_err(build_err)?;
    let pre: PreTokenizerWrapper = match pre.pattern() {
        None => ByteLevel::new(false, true, true).into(),
        Some(p) => {
            let split = Split::new(
                SplitPattern::Regex(p.to_string()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(build_err)?;
            PreTokenizerSequence::new(vec![
                split.into(),
                ByteLevel::new(false, true, false).into(),
            ])
            .into()
        }
    };
    let mut tok = tokenizers::Tokenizer::new(model);
    tok.with_pre_tokenizer(Some(pre));
    tok.with_decoder(Some(ByteLevel::new(false, true, true)));
    Ok(tok)
}

/// SentencePiece (`llama`) vocabulary as BPE with byte fallback, the way llama.cpp segments:
/// merges come from the scores, normalizer adds the dummy prefix and maps spaces to `▁`.
fn sentencepiece(vocab: &GgufVocab) -> Result<tokenizers::Tokenizer, TokenizerError> {
    let merges = merges_from_scores(vocab);
    let mut builder = BPE::builder()
        .vocab_and_merges(vocab_map(&vocab.tokens), merges)
        .byte_fallback(true)
        .fuse_unk(true);
    if let Some(unk) = vocab.unk_id {
        builder = builder.unk_token(vocab.tokens[unk as usize].clone());
    }
    let model = builder.build().map_err(build_err)?;

    let add_prefix = vocab.add_space_prefix.unwrap_or(true);
    let replace = Replace::new(" ", SPM_SPACE).map_err(build_err)?;
    let mut normalizers = Vec::new();
    if add_prefix {
        normalizers.push(Prepend::new(SPM_SPACE.to_string()).into());
    }
    normalizers.push(replace.into());

    let mut decoders: Vec<DecoderWrapper> = vec![
        Replace::new(SPM_SPACE, " ").map_err(build_err)?.into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    if add_prefix {
        decoders.push(Strip::new(' ', 1, 0).into());
    }

    let mut tok = tokenizers::Tokenizer::new(model);
    tok.with_normalizer(Some(NormalizerSequence::new(normalizers)))
        .map_err(build_err)?;
    tok.with_decoder(Some(DecoderSequence::new(decoders)));
    Ok(tok)
}

/// SentencePiece-to-BPE merges: every split of a piece into two pieces of the vocabulary is a
/// merge, ranked by the merged piece's score (higher first), ties by the merged id, then the
/// left id. Only pieces segmentation can produce (normal, user-defined) take part.
fn merges_from_scores(vocab: &GgufVocab) -> Merges {
    let mergeable = |id: usize| {
        matches!(
            vocab.token_type(id),
            TokenType::Normal | TokenType::Undefined | TokenType::UserDefined
        )
    };
    let mut ids: HashMap<&str, usize> = HashMap::with_capacity(vocab.tokens.len());
    for (id, piece) in vocab.tokens.iter().enumerate() {
        if mergeable(id) {
            ids.entry(piece.as_str()).or_insert(id);
        }
    }
    // (merged id, left id, right id)
    let mut found: Vec<(usize, usize, usize)> = Vec::new();
    for (id, piece) in vocab.tokens.iter().enumerate() {
        if !mergeable(id) || ids.get(piece.as_str()) != Some(&id) {
            continue;
        }
        for (cut, _) in piece.char_indices().skip(1) {
            let (left, right) = piece.split_at(cut);
            if let (Some(&l), Some(&r)) = (ids.get(left), ids.get(right)) {
                found.push((id, l, r));
            }
        }
    }
    found.sort_by(|a, b| {
        vocab.scores[b.0]
            .total_cmp(&vocab.scores[a.0])
            .then(a.0.cmp(&b.0))
            .then(a.1.cmp(&b.1))
    });
    found
        .into_iter()
        .map(|(_, l, r)| (vocab.tokens[l].clone(), vocab.tokens[r].clone()))
        .collect()
}

/// Control and unknown tokens become special added tokens; user-defined ones plain added tokens.
/// Both are matched whole in the raw text before segmentation, as llama.cpp does.
fn add_gguf_added_tokens(
    tok: &mut tokenizers::Tokenizer,
    vocab: &GgufVocab,
) -> Result<(), TokenizerError> {
    let mut special = Vec::new();
    let mut user = Vec::new();
    for (id, piece) in vocab.tokens.iter().enumerate() {
        if piece.is_empty() {
            continue;
        }
        match vocab.token_type(id) {
            TokenType::Control | TokenType::Unknown => {
                special.push(AddedToken::from(piece.clone(), true).normalized(false));
            }
            TokenType::UserDefined => {
                user.push(AddedToken::from(piece.clone(), false).normalized(false));
            }
            _ => {}
        }
    }
    if !special.is_empty() {
        tok.add_special_tokens(special).map_err(build_err)?;
    }
    if !user.is_empty() {
        tok.add_tokens(user).map_err(build_err)?;
    }
    Ok(())
}

/// Piece -> id; for a piece listed twice the first id wins.
fn vocab_map(tokens: &[String]) -> Vocab {
    let mut map = Vocab::with_capacity(tokens.len());
    for (id, piece) in tokens.iter().enumerate() {
        map.entry(piece.clone()).or_insert(id as u32);
    }
    map
}

/// Splits a `"left right"` merge line at the first space after the first character.
pub fn split_merge(line: &str) -> Option<(String, String)> {
    let first = line.chars().next()?.len_utf8();
    let cut = first + line[first..].find(' ')?;
    Some((line[..cut].to_string(), line[cut + 1..].to_string()))
}

fn build_err(e: impl std::fmt::Display) -> TokenizerError {
    TokenizerError::Build(e.to_string())
}
