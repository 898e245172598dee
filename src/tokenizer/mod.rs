//! Tokenizer: the `tokenizers` crate, loaded from `tokenizer.json` or built from GGUF metadata.

mod bound;
mod builder;
pub mod chat;
mod decode;
mod gguf_vocab;
mod hf;
mod incremental;

use std::collections::HashSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

pub use bound::{BPE_CACHE_ENTRIES, COUNT_CHUNK_BYTES};
pub use builder::{LLAMA3_PATTERN, O200K_PATTERN, PreTokenizer, QWEN2_PATTERN};
pub use gguf_vocab::{GgufMetadata, GgufVocab, TokenType, VocabModel, vocab_from_gguf};
pub use incremental::IncrementalDecoder;

/// Texts of special tokens that end generation besides the declared EOS (llama.cpp's list).
const END_OF_GENERATION: &[&str] = &[
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end_of_text|>",
    "<|endoftext|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<EOT>",
];

/// Special tokens that are reply markup rather than control: tool calls (Hermes/Qwen,
/// Mistral, Llama 3.1) and reasoning (Qwen3, DeepSeek-R1). Decoding keeps them even when
/// special tokens are skipped, so the tool-call and reasoning parsers see them whether a
/// vocabulary marks them special or not.
pub const REPLY_MARKUP: &[&str] = &[
    "<tool_call>",
    "</tool_call>",
    "[TOOL_CALLS]",
    "<|python_tag|>",
    "<think>",
    "</think>",
];

/// The harmony format's message markup (gpt-oss, o200k_harmony): kept by decoding like
/// [`REPLY_MARKUP`] so the harmony parser reads channels and recipients, as llama.cpp renders
/// them. In a harmony vocabulary `<|end|>` closes a message, not the turn: `<|return|>` and
/// `<|call|>` end generation instead (see [`Tokenizer::eos_ids`]).
pub const HARMONY_MARKUP: &[&str] = &[
    "<|start|>",
    "<|channel|>",
    "<|message|>",
    "<|constrain|>",
    "<|end|>",
];

/// The special tokens that end a harmony turn; a vocabulary with both is a harmony one.
const HARMONY_END_OF_TURN: &[&str] = &["<|return|>", "<|call|>"];

/// EOS texts tried when no EOS is declared at all (an HF directory without `tokenizer_config.json`).
const FALLBACK_EOS: &[&str] = &["</s>", "<eos>"];

/// Errors from loading a tokenizer or running it; each names the file, key or id at fault.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid JSON in {path}: {source}")]
    Json {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("cannot load tokenizer {path}: {message}")]
    Load { path: PathBuf, message: String },
    #[error("invalid tokenizer config {path}: {message}")]
    Config { path: PathBuf, message: String },
    #[error("GGUF tokenizer metadata lacks `{0}`")]
    MissingMetadata(&'static str),
    #[error("GGUF tokenizer metadata `{key}` is invalid: {reason}")]
    InvalidMetadata { key: &'static str, reason: String },
    #[error("unsupported tokenizer model `{0}` (supported: llama, gpt2)")]
    UnsupportedModel(String),
    #[error(
        "unsupported pre-tokenizer `{0}` (supported: default, gpt-2, llama-bpe, llama3, qwen2, gpt-4o)"
    )]
    UnsupportedPreTokenizer(String),
    #[error("cannot build tokenizer: {0}")]
    Build(String),
    #[error("encoding failed: {0}")]
    Encode(String),
    #[error("decoding failed: {0}")]
    Decode(String),
    #[error("token id {id} is outside the vocabulary (size {vocab_size})")]
    UnknownId { id: u32, vocab_size: usize },
    #[error(
        "the text has more than {max_tokens} tokens ({counted} counted when tokenizing stopped)"
    )]
    TooManyTokens { counted: usize, max_tokens: usize },
    #[error("the text is {bytes} bytes; at most {max_bytes} bytes can fit in {max_tokens} tokens")]
    TooLong {
        bytes: usize,
        max_bytes: usize,
        max_tokens: usize,
    },
}

/// A loaded tokenizer. Cheap to clone (shared), `Send + Sync`.
///
/// Special tokens written in the input text (`<s>`, `<|eot_id|>`) are encoded as those tokens.
#[derive(Clone)]
pub struct Tokenizer {
    inner: Arc<Inner>,
}

struct Inner {
    hf: tokenizers::Tokenizer,
    bos_id: Option<u32>,
    eos_ids: Vec<u32>,
    add_bos_default: bool,
    /// The token the model's own tokenizer appends to an input (see
    /// [`Tokenizer::eos_appended`]).
    eos_appended: Option<u32>,
    chat_template: Option<String>,
    tool_use_template: Option<String>,
    special: HashSet<u32>,
    /// Special tokens left out by `decode(.., skip_special)`: all but [`REPLY_MARKUP`] (and
    /// [`HARMONY_MARKUP`] in a harmony vocabulary).
    skipped: HashSet<u32>,
    /// The decoder turns `<0xXX>` pieces into bytes (see `decode::decode`).
    byte_fallback: bool,
    vocab_size: usize,
    /// Most input bytes one token can stand for; `None` when no bound holds (see `bound`).
    bytes_per_token: Option<usize>,
    /// Bytes handed to the tokenizer by [`Tokenizer::encode`] and the bounded count.
    tokenized: AtomicU64,
}

/// What a loader knows beyond the `tokenizers` pipeline.
struct Meta {
    bos_id: Option<u32>,
    eos_ids: Vec<u32>,
    add_bos_default: bool,
    eos_appended: Option<u32>,
    chat_template: Option<String>,
    tool_use_template: Option<String>,
}

impl Tokenizer {
    /// Loads a Hugging Face `tokenizer.json`, with BOS/EOS, `add_bos_token` and the chat template
    /// from `tokenizer_config.json` when given (a `chat_template.jinja` next to `tokenizer.json`
    /// is used when the config has none). Without `add_bos_token`, BOS is added by default
    /// when the file's post-processor would add it.
    pub fn from_file(
        tokenizer_json: &Path,
        tokenizer_config_json: Option<&Path>,
    ) -> Result<Self, TokenizerError> {
        let hf =
            tokenizers::Tokenizer::from_file(tokenizer_json).map_err(|e| TokenizerError::Load {
                path: tokenizer_json.to_path_buf(),
                message: e.to_string(),
            })?;
        let config = tokenizer_config_json.map(hf::read_config).transpose()?;
        let lookup = |token: &str, key: &str| {
            hf.token_to_id(token).ok_or_else(|| TokenizerError::Config {
                path: tokenizer_config_json
                    .unwrap_or(tokenizer_json)
                    .to_path_buf(),
                message: format!("{key} {token:?} is not in the vocabulary"),
            })
        };
        let post_processor_bos = post_processor_bos(&hf);
        let eos_appended = post_processor_eos(&hf);
        let meta = match config {
            Some(cfg) => {
                let bos_id = cfg
                    .bos_token
                    .as_deref()
                    .map(|t| lookup(t, "bos_token"))
                    .transpose()?;
                let eos_ids = match cfg.eos_token.as_deref() {
                    Some(t) => vec![lookup(t, "eos_token")?],
                    None => Vec::new(),
                };
                let add_bos_default = cfg
                    .add_bos_token
                    .unwrap_or(bos_id.is_some() && post_processor_bos == bos_id);
                let chat_template = match cfg.chat_template {
                    Some(t) => Some(t),
                    None => hf::sibling_chat_template(tokenizer_json)?,
                };
                Meta {
                    bos_id,
                    eos_ids,
                    add_bos_default,
                    eos_appended,
                    chat_template,
                    tool_use_template: cfg.tool_use_template,
                }
            }
            None => Meta {
                bos_id: post_processor_bos,
                eos_ids: Vec::new(),
                add_bos_default: post_processor_bos.is_some(),
                eos_appended,
                chat_template: hf::sibling_chat_template(tokenizer_json)?,
                tool_use_template: None,
            },
        };
        Ok(Self::assemble(hf, meta, None))
    }

    /// Builds the tokenizer described by a GGUF file's `tokenizer.*` metadata.
    pub fn from_gguf(file: &(impl GgufMetadata + ?Sized)) -> Result<Self, TokenizerError> {
        Self::from_gguf_vocab(vocab_from_gguf(file)?)
    }

    /// Builds a tokenizer from a GGUF vocabulary: SentencePiece (`llama`) as BPE with byte
    /// fallback and merges derived from the scores, or byte-level BPE (`gpt2`) with the split
    /// regex named by `pre`. EOS ids are `eos`, `eot`, `eom` and known end-of-turn specials.
    pub fn from_gguf_vocab(vocab: GgufVocab) -> Result<Self, TokenizerError> {
        vocab.validate()?;
        let hf = builder::from_gguf_vocab(&vocab)?;
        let meta = Meta {
            bos_id: vocab.bos_id,
            eos_ids: [vocab.eos_id, vocab.eot_id, vocab.eom_id]
                .into_iter()
                .flatten()
                .collect(),
            add_bos_default: vocab.add_bos.unwrap_or(vocab.model == VocabModel::Llama),
            eos_appended: vocab.eos_id.filter(|_| vocab.add_eos == Some(true)),
            chat_template: vocab.chat_template,
            tool_use_template: vocab.tool_use_template,
        };
        Ok(Self::assemble(hf, meta, Some(vocab.tokens.len())))
    }

    /// Loads GPT-2 style `encoder.json` + `vocab.bpe` as byte-level BPE split by `pre`
    /// (e.g. [`PreTokenizer::Llama3`] for Llama 3's files). No BOS; no special tokens.
    pub fn from_gpt2_files(
        encoder_json: &Path,
        vocab_bpe: &Path,
        pre: PreTokenizer,
    ) -> Result<Self, TokenizerError> {
        let hf = hf::gpt2_files(encoder_json, vocab_bpe, pre)?;
        let meta = Meta {
            bos_id: None,
            eos_ids: Vec::new(),
            add_bos_default: false,
            eos_appended: None,
            chat_template: None,
            tool_use_template: None,
        };
        Ok(Self::assemble(hf, meta, None))
    }

    fn assemble(mut hf: tokenizers::Tokenizer, mut meta: Meta, vocab_size: Option<usize>) -> Self {
        bound::cap_bpe_cache(&mut hf);
        let bytes_per_token = bound::bytes_per_token(&hf);
        let added = hf.get_added_tokens_decoder();
        let special: HashSet<u32> = added
            .iter()
            .filter(|(_, t)| t.special)
            .map(|(id, _)| *id)
            .collect();
        let by_text = |texts: &[&str]| -> Vec<u32> {
            texts
                .iter()
                .filter_map(|t| hf.token_to_id(t))
                .filter(|id| special.contains(id))
                .collect()
        };
        let harmony_ends = by_text(HARMONY_END_OF_TURN);
        let harmony = harmony_ends.len() == HARMONY_END_OF_TURN.len();
        let mut markup: HashSet<u32> = by_text(REPLY_MARKUP).into_iter().collect();
        if harmony {
            markup.extend(by_text(HARMONY_MARKUP));
        }
        let skipped = special.difference(&markup).copied().collect();
        if meta.eos_ids.is_empty() {
            meta.eos_ids = by_text(FALLBACK_EOS);
        }
        let mut ends = by_text(END_OF_GENERATION);
        if harmony {
            ends.retain(|id| !markup.contains(id));
            ends.extend(harmony_ends);
        }
        for id in ends {
            if !meta.eos_ids.contains(&id) {
                meta.eos_ids.push(id);
            }
        }
        let mut seen = HashSet::new();
        meta.eos_ids.retain(|id| seen.insert(*id));
        let vocab_size = vocab_size.unwrap_or_else(|| {
            hf.get_vocab(true)
                .values()
                .max()
                .map_or(0, |&max| max as usize + 1)
        });
        let byte_fallback = hf.get_decoder().is_some_and(decode::has_byte_fallback);
        Self {
            inner: Arc::new(Inner {
                byte_fallback,
                hf,
                bos_id: meta.bos_id,
                eos_ids: meta.eos_ids,
                add_bos_default: meta.add_bos_default,
                eos_appended: meta.eos_appended,
                chat_template: meta.chat_template,
                tool_use_template: meta.tool_use_template,
                special,
                skipped,
                vocab_size,
                bytes_per_token,
                tokenized: AtomicU64::new(0),
            }),
        }
    }

    /// Token ids of `text`, with BOS first when `add_bos` is set and the vocabulary has one.
    /// Special tokens written in the text are parsed as such; nothing else is added.
    pub fn encode(&self, text: &str, add_bos: bool) -> Result<Vec<u32>, TokenizerError> {
        self.inner
            .tokenized
            .fetch_add(text.len() as u64, Ordering::Relaxed);
        let encoding = self
            .inner
            .hf
            .encode_fast(text, false)
            .map_err(|e| TokenizerError::Encode(e.to_string()))?;
        let mut ids = Vec::with_capacity(encoding.len() + 1);
        if add_bos && let Some(bos) = self.inner.bos_id {
            ids.push(bos);
        }
        ids.extend_from_slice(encoding.get_ids());
        Ok(ids)
    }

    /// Like [`Tokenizer::encode`], but text longer than `max_tokens` tokens could ever hold
    /// (see [`Tokenizer::max_text_bytes`]) is refused with [`TokenizerError::TooLong`] before
    /// any tokenizing, so a huge prompt costs no more than its length check; and a long text is
    /// first counted piece by piece, refused with [`TokenizerError::TooManyTokens`] once the
    /// count passes `max_tokens` (so a long-context model never tokenizes megabytes whole to
    /// refuse them). The ids of a text within the limit are those of `encode`.
    pub fn encode_within(
        &self,
        text: &str,
        add_bos: bool,
        max_tokens: usize,
    ) -> Result<Vec<u32>, TokenizerError> {
        let max_bytes = self.max_text_bytes(max_tokens);
        if text.len() > max_bytes {
            return Err(TokenizerError::TooLong {
                bytes: text.len(),
                max_bytes,
                max_tokens,
            });
        }
        let budget = max_tokens.saturating_sub(usize::from(add_bos));
        bound::check_token_count(&self.inner.hf, text, budget, &self.inner.tokenized).map_err(
            |e| match e {
                bound::TokenCountError::TooMany(counted) => TokenizerError::TooManyTokens {
                    counted,
                    max_tokens,
                },
                bound::TokenCountError::Encode(m) => TokenizerError::Encode(m),
            },
        )?;
        self.encode(text, add_bos)
    }

    /// Bytes of text tokenized so far (whole encodes and the bounded counts), for tests and
    /// diagnostics.
    pub fn bytes_tokenized(&self) -> u64 {
        self.inner.tokenized.load(Ordering::Relaxed)
    }

    /// The longest text (in bytes) that can encode to at most `max_tokens` tokens: `max_tokens`
    /// times the most input bytes any one token stands for (`usize::MAX` when the vocabulary
    /// gives no such bound, e.g. unknown runs fused into one token).
    pub fn max_text_bytes(&self, max_tokens: usize) -> usize {
        self.inner
            .bytes_per_token
            .map_or(usize::MAX, |b| b.saturating_mul(max_tokens))
    }

    /// The text of `ids`; special tokens are left out when `skip_special` is set, except
    /// reply markup ([`REPLY_MARKUP`], e.g. `<tool_call>`; [`HARMONY_MARKUP`] for gpt-oss)
    /// that the reply parsers read. Invalid UTF-8 (e.g. an incomplete byte sequence) becomes
    /// U+FFFD, valid characters around it stay.
    /// SentencePiece vocabularies drop the one leading space that encoding added, so
    /// `decode(encode(s))` gives back `s`. Ids outside the vocabulary are an error.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, TokenizerError> {
        for &id in ids {
            self.check_id(id)?;
        }
        let inner = &*self.inner;
        decode::decode(
            &inner.hf,
            &inner.skipped,
            inner.byte_fallback,
            ids,
            skip_special,
        )
    }

    fn check_id(&self, id: u32) -> Result<(), TokenizerError> {
        if (id as usize) < self.inner.vocab_size {
            Ok(())
        } else {
            Err(TokenizerError::UnknownId {
                id,
                vocab_size: self.inner.vocab_size,
            })
        }
    }

    /// The beginning-of-sequence id, if the vocabulary has one.
    pub fn bos_id(&self) -> Option<u32> {
        self.inner.bos_id
    }

    /// Ids that end generation: the declared EOS first, then end-of-turn tokens
    /// (`<|eot_id|>`, `<|end_of_text|>`, `<|im_end|>`...) present as special tokens; in a
    /// harmony vocabulary `<|return|>` and `<|call|>`, not `<|end|>`. No duplicates.
    pub fn eos_ids(&self) -> &[u32] {
        &self.inner.eos_ids
    }

    /// Whether prompts get BOS by default (`add_bos_token`; for GGUF without the key: true for
    /// SentencePiece vocabularies, false for byte-level BPE).
    pub fn add_bos_default(&self) -> bool {
        self.inner.add_bos_default
    }

    /// The end-of-sequence token the model's tokenizer appends to an input by default, if
    /// any: a Hugging Face post-processor's trailing special token (Qwen3-Embedding's
    /// `<|endoftext|>`), or GGUF's EOS with `tokenizer.ggml.add_eos_token`. Prompts for
    /// generation never get it; embedding inputs do (a last-token embedding is read there).
    pub fn eos_appended(&self) -> Option<u32> {
        self.inner.eos_appended
    }

    /// One past the largest token id.
    pub fn vocab_size(&self) -> usize {
        self.inner.vocab_size
    }

    /// The Jinja chat template shipped with the model, if any.
    pub fn chat_template(&self) -> Option<&str> {
        self.inner.chat_template.as_deref()
    }

    /// The `tool_use` template of a `tokenizer_config.json` that lists several, or a GGUF's
    /// `tokenizer.chat_template.tool_use` (Hugging Face picks it when a request has tools).
    pub fn tool_use_template(&self) -> Option<&str> {
        self.inner.tool_use_template.as_deref()
    }

    /// The raw vocabulary piece of `id` (e.g. `▁Hello`, `Ġworld`, `<0x0A>`), not decoded text.
    pub fn id_to_piece(&self, id: u32) -> Option<String> {
        self.inner.hf.id_to_token(id)
    }

    /// The id of a vocabulary piece or added token, matched exactly.
    pub fn token_to_id(&self, piece: &str) -> Option<u32> {
        self.inner.hf.token_to_id(piece)
    }

    /// The wrapped `tokenizers` pipeline (e.g. to read every token's bytes).
    pub fn hf(&self) -> &tokenizers::Tokenizer {
        &self.inner.hf
    }

    /// Whether `id` is a special (control) token such as BOS, EOS or `<|eot_id|>`.
    pub fn is_special(&self, id: u32) -> bool {
        self.inner.special.contains(&id)
    }
}

impl fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.inner.vocab_size)
            .field("bos_id", &self.inner.bos_id)
            .field("eos_ids", &self.inner.eos_ids)
            .field("add_bos_default", &self.inner.add_bos_default)
            .field("chat_template", &self.inner.chat_template.is_some())
            .finish()
    }
}

/// The special token the file's post-processor puts last (Qwen3-Embedding's `<|endoftext|>`),
/// if any: what encoding with special tokens adds after the text's own tokens.
fn post_processor_eos(hf: &tokenizers::Tokenizer) -> Option<u32> {
    let with = hf.encode_fast("a", true).ok()?;
    let without = hf.encode_fast("a", false).ok()?;
    let (with, without) = (with.get_ids(), without.get_ids());
    let last = *with.last()?;
    let special = hf
        .get_added_tokens_decoder()
        .get(&last)
        .is_some_and(|t| t.special);
    (special && with.len() > without.len() && without.last() != Some(&last)).then_some(last)
}

/// The special token the file's post-processor puts first (Llama-style BOS), if any.
fn post_processor_bos(hf: &tokenizers::Tokenizer) -> Option<u32> {
    let with = hf.encode_fast("", true).ok()?;
    let first = *with.get_ids().first()?;
    let special = hf
        .get_added_tokens_decoder()
        .get(&first)
        .is_some_and(|t| t.special);
    special.then_some(first)
}
