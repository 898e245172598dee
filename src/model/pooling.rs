//! How an embedding model pools its hidden states into one vector, as its files state it:
//! GGUF's `<arch>.pooling_type`, or a sentence-transformers directory's `modules.json` and
//! its `Pooling` module's `config.json` (`1_Pooling/config.json`).

use std::path::Path;

use super::ModelError;
use super::gguf::GgufFile;

/// The pooling of an embedding: over the final-norm hidden states of the input's tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// The mean over every token.
    Mean,
    /// The first token's (BERT's `[CLS]`).
    Cls,
    /// The last token's (decoder embedding models: Qwen3-Embedding, e5-mistral). The
    /// default when the files state none.
    Last,
}

impl Pooling {
    /// The name used in logs and errors.
    pub fn as_str(self) -> &'static str {
        match self {
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Last => "last",
        }
    }
}

/// Largest `modules.json` or pooling `config.json` read (they are a few hundred bytes).
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// The pooling a GGUF file states in `<arch>.pooling_type` (llama.cpp's numbering: 0 none,
/// 1 mean, 2 cls, 3 last, 4 rank). Absent or 0 (a generation model's per-token output) is
/// `None`; rank (a reranker's classifier head) and unknown values are refused by key.
pub fn from_gguf(g: &GgufFile, arch: &str) -> Result<Option<Pooling>, ModelError> {
    let key = format!("{arch}.pooling_type");
    match g.meta(&key).map(|v| v.as_u64()) {
        None | Some(Some(0)) => Ok(None),
        Some(Some(1)) => Ok(Some(Pooling::Mean)),
        Some(Some(2)) => Ok(Some(Pooling::Cls)),
        Some(Some(3)) => Ok(Some(Pooling::Last)),
        Some(Some(4)) => Err(ModelError::Spec(format!(
            "{key} 4 (rank: a reranker's classifier head) is not supported"
        ))),
        Some(other) => Err(ModelError::Spec(format!(
            "{key} {other:?} is not a pooling type (0 none, 1 mean, 2 cls, 3 last)"
        ))),
    }
}

/// The pooling a Hugging Face directory states: the `Pooling` module that `modules.json`
/// lists (else `1_Pooling/` when present), read from its `config.json`. `None` when the
/// directory has neither. A module Kiln does not run (`Dense`, ...) and pooling modes other
/// than one of cls, mean and last token are refused by name.
pub fn from_hf_dir(dir: &Path) -> Result<Option<Pooling>, ModelError> {
    let modules = dir.join("modules.json");
    let pooling_dir = if modules.exists() {
        let list = read_json(&modules)?;
        let entries = list
            .as_array()
            .ok_or_else(|| bad(&modules, "not an array"))?;
        let mut found = None;
        for m in entries {
            let kind = m.get("type").and_then(|t| t.as_str()).unwrap_or_default();
            let path = m.get("path").and_then(|p| p.as_str()).unwrap_or_default();
            match kind.rsplit('.').next().unwrap_or_default() {
                "Transformer" | "Normalize" => {}
                "Pooling" => found = Some(dir.join(safe_subdir(&modules, path)?)),
                other => {
                    return Err(bad(
                        &modules,
                        &format!("module `{other}` ({kind}) is not supported"),
                    ));
                }
            }
        }
        found
    } else {
        Some(dir.join("1_Pooling")).filter(|p| p.is_dir())
    };
    match pooling_dir {
        Some(p) => from_pooling_config(&p.join("config.json")).map(Some),
        None => Ok(None),
    }
}

/// A sentence-transformers `Pooling` config: exactly one `pooling_mode_*` key set, of
/// `cls_token`, `mean_tokens` and `lasttoken`.
fn from_pooling_config(path: &Path) -> Result<Pooling, ModelError> {
    let cfg = read_json(path)?;
    let obj = cfg.as_object().ok_or_else(|| bad(path, "not an object"))?;
    let mut modes = Vec::new();
    for (k, v) in obj {
        let Some(mode) = k.strip_prefix("pooling_mode_") else {
            continue;
        };
        if v.as_bool() != Some(true) {
            continue;
        }
        modes.push(match mode {
            "cls_token" => Pooling::Cls,
            "mean_tokens" => Pooling::Mean,
            "lasttoken" => Pooling::Last,
            _ => return Err(bad(path, &format!("`{k}` is not supported"))),
        });
    }
    match modes.as_slice() {
        [one] => Ok(*one),
        [] => Err(bad(path, "no `pooling_mode_*` key is true")),
        _ => Err(bad(path, "more than one `pooling_mode_*` key is true")),
    }
}

/// A module path inside the model directory (no absolute path, no `..`).
fn safe_subdir<'a>(modules: &Path, path: &'a str) -> Result<&'a Path, ModelError> {
    let p = Path::new(path);
    let inside = p
        .components()
        .all(|c| matches!(c, std::path::Component::Normal(_)));
    match inside && !path.is_empty() {
        true => Ok(p),
        false => Err(bad(
            modules,
            &format!("module path {path:?} is outside the model"),
        )),
    }
}

fn read_json(path: &Path) -> Result<serde_json::Value, ModelError> {
    let len = std::fs::metadata(path)
        .map_err(|e| ModelError::io(path, e))?
        .len();
    if len > MAX_CONFIG_BYTES {
        return Err(bad(path, &format!("{len} bytes is too large")));
    }
    let text = std::fs::read_to_string(path).map_err(|e| ModelError::io(path, e))?;
    serde_json::from_str(&text).map_err(|e| bad(path, &e.to_string()))
}

fn bad(path: &Path, message: &str) -> ModelError {
    ModelError::Spec(format!("{}: {message}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory holding `files` (removed when dropped).
    struct Dir(std::path::PathBuf);

    impl Dir {
        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn dir_with(files: &[(&str, &str)]) -> Dir {
        let name = format!("kiln-pooling-{:032x}", rand::random::<u128>());
        let d = Dir(std::env::temp_dir().join(name));
        std::fs::create_dir_all(d.path()).unwrap();
        for (name, text) in files {
            let p = d.path().join(name);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        d
    }

    const MODULES: &str = r#"[{"idx":0,"name":"0","path":"","type":"sentence_transformers.models.Transformer"},
        {"idx":1,"name":"1","path":"1_Pooling","type":"sentence_transformers.models.Pooling"},
        {"idx":2,"name":"2","path":"2_Normalize","type":"sentence_transformers.models.Normalize"}]"#;

    #[test]
    fn sentence_transformers_modules_name_the_pooling() {
        let last = r#"{"word_embedding_dimension": 8, "pooling_mode_cls_token": false,
            "pooling_mode_mean_tokens": false, "pooling_mode_lasttoken": true}"#;
        let d = dir_with(&[("modules.json", MODULES), ("1_Pooling/config.json", last)]);
        assert_eq!(from_hf_dir(d.path()).unwrap(), Some(Pooling::Last));
        let mean = r#"{"pooling_mode_mean_tokens": true}"#;
        let d = dir_with(&[("1_Pooling/config.json", mean)]);
        assert_eq!(from_hf_dir(d.path()).unwrap(), Some(Pooling::Mean));
        let d = dir_with(&[("config.json", "{}")]);
        assert_eq!(from_hf_dir(d.path()).unwrap(), None);
    }

    #[test]
    fn unsupported_modules_and_modes_are_refused_by_name() {
        let max = r#"{"pooling_mode_max_tokens": true}"#;
        let d = dir_with(&[("modules.json", MODULES), ("1_Pooling/config.json", max)]);
        let e = from_hf_dir(d.path()).unwrap_err().to_string();
        assert!(e.contains("pooling_mode_max_tokens"), "{e}");
        let dense = r#"[{"path":"2_Dense","type":"sentence_transformers.models.Dense"}]"#;
        let d = dir_with(&[("modules.json", dense)]);
        let e = from_hf_dir(d.path()).unwrap_err().to_string();
        assert!(e.contains("Dense"), "{e}");
        let escape = r#"[{"path":"../x","type":"sentence_transformers.models.Pooling"}]"#;
        let d = dir_with(&[("modules.json", escape)]);
        assert!(from_hf_dir(d.path()).is_err());
    }
}
