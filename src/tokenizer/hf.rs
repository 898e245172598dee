//! Hugging Face tokenizer files: `tokenizer_config.json` fields and GPT-2 `encoder.json` + `vocab.bpe`.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};
use tokenizers::models::bpe::{Merges, Vocab};

use super::TokenizerError;
use super::builder::{self, PreTokenizer};

/// The `tokenizer_config.json` fields Kiln uses. Wrong-typed fields are errors, not defaults.
#[derive(Debug, Default)]
pub(super) struct HfConfig {
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    pub add_bos_token: Option<bool>,
    pub chat_template: Option<String>,
    /// The `tool_use` entry of a `chat_template` list (used when a request has tools).
    pub tool_use_template: Option<String>,
}

/// Reads `tokenizer_config.json`.
///
/// Token fields may be a string or an added-token object (`{"content": ...}`); `chat_template`
/// may be a string or a list of `{name, template}`, from which the `default` one is taken
/// (and the `tool_use` one kept for requests with tools).
pub(super) fn read_config(path: &Path) -> Result<HfConfig, TokenizerError> {
    let value: Value = read_json(path)?;
    let bad = |message: String| TokenizerError::Config {
        path: path.to_path_buf(),
        message,
    };
    let obj = value
        .as_object()
        .ok_or_else(|| bad("the top level is not a JSON object".into()))?;
    let add_bos_token = match obj.get("add_bos_token") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(other) => return Err(bad(format!("`add_bos_token` is not a boolean: {other}"))),
    };
    let (chat_template, tool_use_template) = chat_template_field(obj).map_err(bad)?;
    Ok(HfConfig {
        bos_token: token_field(obj, "bos_token").map_err(bad)?,
        eos_token: token_field(obj, "eos_token").map_err(bad)?,
        add_bos_token,
        chat_template,
        tool_use_template,
    })
}

/// A special-token field: `null`, a string, or an added-token object with `content`.
fn token_field(obj: &Map<String, Value>, key: &str) -> Result<Option<String>, String> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Object(o)) => match o.get("content") {
            Some(Value::String(s)) => Ok(Some(s.clone())),
            _ => Err(format!("`{key}` object has no string `content`")),
        },
        Some(other) => Err(format!(
            "`{key}` is neither a string nor a token object: {other}"
        )),
    }
}

/// The `default` template and the `tool_use` one (a plain string is the default only).
fn chat_template_field(
    obj: &Map<String, Value>,
) -> Result<(Option<String>, Option<String>), String> {
    match obj.get("chat_template") {
        None | Some(Value::Null) => Ok((None, None)),
        Some(Value::String(s)) => Ok((Some(s.clone()), None)),
        Some(Value::Array(list)) => {
            let (mut default, mut tool_use) = (None, None);
            for entry in list {
                let name = entry.get("name").and_then(Value::as_str);
                let template = entry.get("template").and_then(Value::as_str);
                match (name, template) {
                    (Some("default"), Some(t)) => default = default.or(Some(t.to_string())),
                    (Some("tool_use"), Some(t)) => tool_use = tool_use.or(Some(t.to_string())),
                    (Some(_), Some(_)) => {}
                    _ => {
                        return Err("`chat_template` list entry lacks `name`/`template`".into());
                    }
                }
            }
            Ok((default, tool_use))
        }
        Some(_) => Err("`chat_template` is neither a string nor a list".into()),
    }
}

/// `chat_template.jinja` next to `tokenizer.json` (newer `save_pretrained` output), if present.
pub(super) fn sibling_chat_template(
    tokenizer_json: &Path,
) -> Result<Option<String>, TokenizerError> {
    let Some(dir) = tokenizer_json.parent() else {
        return Ok(None);
    };
    let path = dir.join("chat_template.jinja");
    if !path.is_file() {
        return Ok(None);
    }
    fs::read_to_string(&path)
        .map(Some)
        .map_err(|source| TokenizerError::Io { path, source })
}

/// Loads a GPT-2 style `encoder.json` (piece -> id) and `vocab.bpe` (one merge per line, an
/// optional `#version` header) into a byte-level BPE pipeline.
pub(super) fn gpt2_files(
    encoder_json: &Path,
    vocab_bpe: &Path,
    pre: PreTokenizer,
) -> Result<tokenizers::Tokenizer, TokenizerError> {
    let encoder: HashMap<String, u32> = read_json(encoder_json)?;
    let text = fs::read_to_string(vocab_bpe).map_err(|source| TokenizerError::Io {
        path: vocab_bpe.to_path_buf(),
        source,
    })?;
    let mut merges = Merges::new();
    for (n, line) in text.lines().enumerate() {
        if line.is_empty() || (n == 0 && line.starts_with("#version")) {
            continue;
        }
        let pair = builder::split_merge(line).ok_or_else(|| TokenizerError::Load {
            path: vocab_bpe.to_path_buf(),
            message: format!("line {}: merge {line:?} has no separating space", n + 1),
        })?;
        merges.push(pair);
    }
    let vocab: Vocab = encoder.into_iter().collect();
    builder::byte_level(vocab, merges, pre)
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, TokenizerError> {
    let text = fs::read_to_string(path).map_err(|source| TokenizerError::Io {
        path: PathBuf::from(path),
        source,
    })?;
    serde_json::from_str(&text).map_err(|source| TokenizerError::Json {
        path: PathBuf::from(path),
        source,
    })
}
