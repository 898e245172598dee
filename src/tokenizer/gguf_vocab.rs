//! The tokenizer vocabulary stored in GGUF metadata (`tokenizer.ggml.*`), read into a plain struct.

use super::TokenizerError;

/// The GGUF metadata a vocabulary is read from, as typed lookups by key (`None`: absent or
/// of another type). A parsed GGUF header (`model::gguf::GgufFile`) is one; the tokenizer
/// knows nothing of the file format itself.
pub trait GgufMetadata {
    /// A string entry.
    fn meta_str(&self, key: &str) -> Option<&str>;
    /// Any integer entry as u64 (`None` when negative).
    fn meta_u64(&self, key: &str) -> Option<u64>;
    /// A bool entry.
    fn meta_bool(&self, key: &str) -> Option<bool>;
    /// An array of strings (`None` if any element is not a string).
    fn meta_str_array(&self, key: &str) -> Option<Vec<&str>>;
    /// An array of numbers as f32 (`None` if any element is not a number).
    fn meta_f32_array(&self, key: &str) -> Option<Vec<f32>>;
    /// An array of integers as i64 (`None` if any element is not an integer or does not fit).
    fn meta_i64_array(&self, key: &str) -> Option<Vec<i64>>;
}

/// Which tokenizer algorithm a GGUF vocabulary uses (`tokenizer.ggml.model`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VocabModel {
    /// `llama`: SentencePiece BPE with scores and byte fallback (Llama 1/2, Mistral, TinyLlama...).
    Llama,
    /// `gpt2`: byte-level BPE with explicit merges (GPT-2, Llama 3, Qwen2...).
    Gpt2,
}

impl VocabModel {
    /// Parses the `tokenizer.ggml.model` string.
    pub fn parse(name: &str) -> Result<Self, TokenizerError> {
        match name {
            "llama" => Ok(Self::Llama),
            "gpt2" => Ok(Self::Gpt2),
            other => Err(TokenizerError::UnsupportedModel(other.to_string())),
        }
    }
}

/// The type of one vocabulary entry (`tokenizer.ggml.token_type`, llama.cpp numbering).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenType {
    /// 0: undefined, treated as normal.
    Undefined,
    /// 1: an ordinary piece produced by segmentation.
    Normal,
    /// 2: the unknown token (`<unk>`).
    Unknown,
    /// 3: a control token (`<s>`, `<|eot_id|>`): special, never produced from plain text pieces.
    Control,
    /// 4: a user-defined token, matched whole in the input text.
    UserDefined,
    /// 5: an unused (reserved) piece.
    Unused,
    /// 6: a byte-fallback piece such as `<0xE2>`.
    Byte,
}

impl TokenType {
    /// Maps llama.cpp's numbering; values outside 0..=6 are rejected.
    pub fn from_i64(value: i64) -> Option<Self> {
        Some(match value {
            0 => Self::Undefined,
            1 => Self::Normal,
            2 => Self::Unknown,
            3 => Self::Control,
            4 => Self::UserDefined,
            5 => Self::Unused,
            6 => Self::Byte,
            _ => return None,
        })
    }
}

/// Everything Kiln needs from a GGUF file to build a tokenizer; plain data so building can be tested
/// without a file. `scores` and `token_types` are either empty (absent) or as long as `tokens`.
#[derive(Debug, Clone)]
pub struct GgufVocab {
    /// `tokenizer.ggml.model`.
    pub model: VocabModel,
    /// `tokenizer.ggml.pre`: the pre-tokenizer name for `gpt2` vocabularies (`gpt-2`, `llama-bpe`, ...).
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`: the piece of every id.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.scores`: SentencePiece log-probabilities (higher merges first).
    pub scores: Vec<f32>,
    /// `tokenizer.ggml.token_type`.
    pub token_types: Vec<TokenType>,
    /// `tokenizer.ggml.merges`: `"left right"` pairs in priority order (`gpt2` only).
    pub merges: Vec<String>,
    /// `tokenizer.ggml.bos_token_id`.
    pub bos_id: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos_id: Option<u32>,
    /// `tokenizer.ggml.eot_token_id` (end of turn, e.g. `<|eot_id|>`).
    pub eot_id: Option<u32>,
    /// `tokenizer.ggml.eom_token_id` (end of message, e.g. `<|eom_id|>`).
    pub eom_id: Option<u32>,
    /// `tokenizer.ggml.unknown_token_id`.
    pub unk_id: Option<u32>,
    /// `tokenizer.ggml.padding_token_id`.
    pub pad_id: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`.
    pub add_bos: Option<bool>,
    /// `tokenizer.ggml.add_eos_token`.
    pub add_eos: Option<bool>,
    /// `tokenizer.ggml.add_space_prefix` (SentencePiece dummy prefix; llama.cpp defaults it to true).
    pub add_space_prefix: Option<bool>,
    /// `tokenizer.chat_template`.
    pub chat_template: Option<String>,
    /// `tokenizer.chat_template.tool_use` (llama.cpp's name for the template variant used
    /// when a request has tools).
    pub tool_use_template: Option<String>,
}

impl GgufVocab {
    /// A vocabulary with only the model and tokens set; the rest empty or unset.
    pub fn new(model: VocabModel, tokens: Vec<String>) -> Self {
        Self {
            model,
            pre: None,
            tokens,
            scores: Vec::new(),
            token_types: Vec::new(),
            merges: Vec::new(),
            bos_id: None,
            eos_id: None,
            eot_id: None,
            eom_id: None,
            unk_id: None,
            pad_id: None,
            add_bos: None,
            add_eos: None,
            add_space_prefix: None,
            chat_template: None,
            tool_use_template: None,
        }
    }

    /// The type of token `id` (`Normal` where the file gives no types).
    pub fn token_type(&self, id: usize) -> TokenType {
        self.token_types
            .get(id)
            .copied()
            .unwrap_or(TokenType::Normal)
    }

    /// Checks that the arrays agree in length, special ids are in range, the model has what
    /// it needs (scores for `llama`, merges for `gpt2`), and the sizes stay within
    /// [`MAX_VOCAB_TOKENS`], [`MAX_TOKEN_BYTES`] and [`MAX_VOCAB_BYTES`] (building a tokenizer
    /// costs about the square of a token's length: a 1 MB token took minutes).
    pub fn validate(&self) -> Result<(), TokenizerError> {
        let n = self.tokens.len();
        if n == 0 {
            return Err(invalid("tokenizer.ggml.tokens", "the vocabulary is empty"));
        }
        if n > MAX_VOCAB_TOKENS {
            return Err(invalid(
                "tokenizer.ggml.tokens",
                format!("{n} tokens, more than the limit of {MAX_VOCAB_TOKENS}"),
            ));
        }
        check_sizes("tokenizer.ggml.tokens", &self.tokens, MAX_TOKEN_BYTES)?;
        check_sizes(
            "tokenizer.ggml.merges",
            &self.merges,
            2 * MAX_TOKEN_BYTES + 1,
        )?;
        if !self.scores.is_empty() && self.scores.len() != n {
            return Err(invalid(
                "tokenizer.ggml.scores",
                format!("{} scores for {n} tokens", self.scores.len()),
            ));
        }
        if !self.token_types.is_empty() && self.token_types.len() != n {
            return Err(invalid(
                "tokenizer.ggml.token_type",
                format!("{} token types for {n} tokens", self.token_types.len()),
            ));
        }
        let ids = [
            ("tokenizer.ggml.bos_token_id", self.bos_id),
            ("tokenizer.ggml.eos_token_id", self.eos_id),
            ("tokenizer.ggml.eot_token_id", self.eot_id),
            ("tokenizer.ggml.eom_token_id", self.eom_id),
            ("tokenizer.ggml.unknown_token_id", self.unk_id),
            ("tokenizer.ggml.padding_token_id", self.pad_id),
        ];
        for (key, id) in ids {
            if let Some(id) = id.filter(|&id| id as usize >= n) {
                return Err(invalid(
                    key,
                    format!("id {id} is out of range for {n} tokens"),
                ));
            }
        }
        if self.model == VocabModel::Llama && self.scores.is_empty() {
            return Err(TokenizerError::MissingMetadata("tokenizer.ggml.scores"));
        }
        if self.model == VocabModel::Gpt2 && self.merges.is_empty() {
            return Err(TokenizerError::MissingMetadata("tokenizer.ggml.merges"));
        }
        Ok(())
    }
}

/// Reads the `tokenizer.*` metadata of a GGUF file.
///
/// Special-token ids that are absent, unset (`4294967295` or negative) or out of range become
/// `None`, except that a SentencePiece (`llama`) vocabulary then gets llama.cpp's defaults
/// (`<unk>` = 0, `<s>` = 1, `</s>` = 2).
pub fn vocab_from_gguf(file: &(impl GgufMetadata + ?Sized)) -> Result<GgufVocab, TokenizerError> {
    let model_name = file
        .meta_str("tokenizer.ggml.model")
        .ok_or(TokenizerError::MissingMetadata("tokenizer.ggml.model"))?;
    let model = VocabModel::parse(model_name)?;
    let tokens: Vec<String> = file
        .meta_str_array("tokenizer.ggml.tokens")
        .ok_or(TokenizerError::MissingMetadata("tokenizer.ggml.tokens"))?
        .into_iter()
        .map(str::to_owned)
        .collect();
    let mut vocab = GgufVocab::new(model, tokens);
    vocab.pre = file.meta_str("tokenizer.ggml.pre").map(str::to_owned);
    vocab.scores = file
        .meta_f32_array("tokenizer.ggml.scores")
        .unwrap_or_default();
    vocab.token_types = match file.meta_i64_array("tokenizer.ggml.token_type") {
        None => Vec::new(),
        Some(raw) => raw
            .into_iter()
            .map(|t| {
                TokenType::from_i64(t).ok_or_else(|| {
                    invalid("tokenizer.ggml.token_type", format!("unknown type {t}"))
                })
            })
            .collect::<Result<_, _>>()?,
    };
    vocab.merges = file
        .meta_str_array("tokenizer.ggml.merges")
        .map(|m| m.into_iter().map(str::to_owned).collect())
        .unwrap_or_default();

    let n = vocab.tokens.len();
    let id = |key: &'static str| special_id(file.meta_u64(key), n, key);
    vocab.bos_id = id("tokenizer.ggml.bos_token_id");
    vocab.eos_id = id("tokenizer.ggml.eos_token_id");
    vocab.eot_id = id("tokenizer.ggml.eot_token_id");
    vocab.eom_id = id("tokenizer.ggml.eom_token_id");
    vocab.unk_id = id("tokenizer.ggml.unknown_token_id");
    vocab.pad_id = id("tokenizer.ggml.padding_token_id");
    if model == VocabModel::Llama {
        // llama.cpp's SentencePiece defaults, kept where the key is absent, unset or out of range.
        let fallback = |id: u32| ((id as usize) < n).then_some(id);
        vocab.unk_id = vocab.unk_id.or_else(|| fallback(0));
        vocab.bos_id = vocab.bos_id.or_else(|| fallback(1));
        vocab.eos_id = vocab.eos_id.or_else(|| fallback(2));
    }
    vocab.add_bos = file.meta_bool("tokenizer.ggml.add_bos_token");
    vocab.add_eos = file.meta_bool("tokenizer.ggml.add_eos_token");
    vocab.add_space_prefix = file.meta_bool("tokenizer.ggml.add_space_prefix");
    vocab.chat_template = file.meta_str("tokenizer.chat_template").map(str::to_owned);
    vocab.tool_use_template = file
        .meta_str("tokenizer.chat_template.tool_use")
        .map(str::to_owned);
    vocab.validate()?;
    Ok(vocab)
}

/// A special-token id from metadata: `None` when absent, unset (`u32::MAX`) or out of range.
fn special_id(raw: Option<u64>, n_tokens: usize, key: &str) -> Option<u32> {
    let raw = raw?;
    if raw == u64::from(u32::MAX) {
        return None;
    }
    if raw >= n_tokens as u64 {
        tracing::warn!(
            key,
            id = raw,
            n_tokens,
            "special token id out of range, ignored"
        );
        return None;
    }
    u32::try_from(raw).ok()
}

/// Most tokens a vocabulary may hold (the largest in use have about 262,000).
pub const MAX_VOCAB_TOKENS: usize = 1 << 21;

/// Most bytes one token (or half a merge) may have: byte-level vocabularies (GPT-2, Qwen2)
/// have tokens of 256 bytes, a run of 128 spaces; SentencePiece ones about 50.
pub const MAX_TOKEN_BYTES: usize = 1024;

/// Most bytes all tokens (or all merges) together may have (Qwen2's 151,936 tokens: 1.4 MB).
pub const MAX_VOCAB_BYTES: usize = 16 << 20;

/// `items` (tokens or merges of `key`) each at most `max_len` bytes and at most
/// [`MAX_VOCAB_BYTES`] together.
fn check_sizes(key: &'static str, items: &[String], max_len: usize) -> Result<(), TokenizerError> {
    if let Some((i, s)) = items.iter().enumerate().find(|(_, s)| s.len() > max_len) {
        return Err(invalid(
            key,
            format!(
                "entry {i} is {} bytes, more than the limit of {max_len}",
                s.len()
            ),
        ));
    }
    let total: usize = items.iter().map(String::len).sum();
    if total > MAX_VOCAB_BYTES {
        return Err(invalid(
            key,
            format!("{total} bytes in all, more than the limit of {MAX_VOCAB_BYTES}"),
        ));
    }
    Ok(())
}

fn invalid(key: &'static str, reason: impl Into<String>) -> TokenizerError {
    TokenizerError::InvalidMetadata {
        key,
        reason: reason.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::Tokenizer;

    /// A tokenizer's metadata in memory: string entries, tokens, scores.
    struct Meta {
        strings: Vec<(String, String)>,
        tokens: Vec<String>,
        scores: Vec<f32>,
    }

    impl GgufMetadata for Meta {
        fn meta_str(&self, key: &str) -> Option<&str> {
            let hit = self.strings.iter().find(|(k, _)| k == key);
            hit.map(|(_, v)| v.as_str())
        }
        fn meta_u64(&self, _: &str) -> Option<u64> {
            None
        }
        fn meta_bool(&self, _: &str) -> Option<bool> {
            None
        }
        fn meta_str_array(&self, key: &str) -> Option<Vec<&str>> {
            (key == "tokenizer.ggml.tokens")
                .then(|| self.tokens.iter().map(String::as_str).collect())
        }
        fn meta_f32_array(&self, key: &str) -> Option<Vec<f32>> {
            (key == "tokenizer.ggml.scores").then(|| self.scores.clone())
        }
        fn meta_i64_array(&self, _: &str) -> Option<Vec<i64>> {
            None
        }
    }

    /// A five-token SentencePiece vocabulary with these string metadata entries.
    fn vocab_file(strings: &[(&str, &str)]) -> Meta {
        vocab_file_of(&["<unk>", "<s>", "</s>", "a", "b"], strings)
    }

    /// [`vocab_file`] with these tokens.
    fn vocab_file_of(tokens: &[&str], strings: &[(&str, &str)]) -> Meta {
        Meta {
            strings: [("tokenizer.ggml.model", "llama")]
                .iter()
                .chain(strings)
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            tokens: tokens.iter().map(|t| t.to_string()).collect(),
            scores: (0..tokens.len()).map(|i| -(i as f32)).collect(),
        }
    }

    #[test]
    fn a_megabyte_token_is_refused_at_once() {
        let long = "a".repeat(1 << 20);
        let start = std::time::Instant::now();
        let file = vocab_file_of(&["<unk>", "<s>", "</s>", &long, "b"], &[]);
        match vocab_from_gguf(&file) {
            Err(TokenizerError::InvalidMetadata { key, reason }) => {
                assert_eq!(key, "tokenizer.ggml.tokens");
                assert!(reason.contains("entry 3 is 1048576 bytes"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        assert!(start.elapsed().as_secs_f64() < 1.0, "{:?}", start.elapsed());
        let edge = "a".repeat(MAX_TOKEN_BYTES);
        let file = vocab_file_of(&["<unk>", "<s>", "</s>", &edge, "b"], &[]);
        assert!(
            vocab_from_gguf(&file).is_ok(),
            "a token at the limit is fine"
        );
    }

    #[test]
    fn tool_use_chat_template_is_read_from_its_own_key() {
        let file = vocab_file(&[
            ("tokenizer.chat_template", "DEFAULT"),
            ("tokenizer.chat_template.tool_use", "TOOLS"),
        ]);
        let vocab = vocab_from_gguf(&file).unwrap();
        assert_eq!(vocab.chat_template.as_deref(), Some("DEFAULT"));
        assert_eq!(vocab.tool_use_template.as_deref(), Some("TOOLS"));
        let tok = Tokenizer::from_gguf_vocab(vocab).unwrap();
        assert_eq!(tok.chat_template(), Some("DEFAULT"));
        assert_eq!(tok.tool_use_template(), Some("TOOLS"));

        let plain = vocab_from_gguf(&vocab_file(&[("tokenizer.chat_template", "DEFAULT")]));
        let tok = Tokenizer::from_gguf_vocab(plain.unwrap()).unwrap();
        assert_eq!(tok.chat_template(), Some("DEFAULT"));
        assert_eq!(tok.tool_use_template(), None);
    }
}
