//! Model files (GGUF, Hugging Face directories, dummy weights) and the model spec read from
//! them. Loading the weights onto a backend and running them is `runner`'s job.

pub mod dummy;
pub mod family;
pub mod gguf;
mod gguf_spec;
mod hf_spec;
pub mod moe;
pub mod pooling;
pub mod source;
pub mod spec;
pub mod variant;

use std::path::{Path, PathBuf};
use std::sync::Arc;

/// GGML element types and dequantizers (they live with the backend's host tensors).
pub use crate::backend::quant;
use crate::tokenizer::Tokenizer;
pub use pooling::Pooling;
pub use source::{DummySource, SafetensorsSource, TensorSource};
pub use spec::{ModelSpec, RopeLayout, RopeSpec, SpecField};

/// Errors from finding, parsing and loading a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Gguf(#[from] gguf::GgufError),
    #[error("model format: {0}")]
    Format(String),
    #[error("weight: {0}")]
    Quant(#[from] quant::QuantError),
    #[error("model spec: {0}")]
    Spec(String),
    #[error("weight shape: {0}")]
    Shape(String),
    #[error("missing tensor '{0}'")]
    Missing(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
}

impl ModelError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        ModelError::Io {
            path: path.display().to_string(),
            source,
        }
    }
}

/// How to read `--model`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LoadFormat {
    /// GGUF file or Hugging Face directory, by looking at the path.
    #[default]
    Auto,
    Gguf,
    Hf,
    /// Random weights at the shapes of a `config.json` (file or directory).
    Dummy,
    /// Dummy weights with bf16 matrices, made without host memory or time: for benchmarks
    /// at sizes like a Llama-3-70B.
    #[value(name = "dummy-bf16")]
    #[serde(rename = "dummy-bf16")]
    DummyBf16,
    /// The same with Q8_0 matrices.
    #[value(name = "dummy-q8_0")]
    #[serde(rename = "dummy-q8_0")]
    DummyQ8_0,
    /// The same with Q4_K matrices (bf16 where rows do not fill 256-element blocks).
    #[value(name = "dummy-q4_k")]
    #[serde(rename = "dummy-q4_k")]
    DummyQ4K,
}

impl LoadFormat {
    /// The matrix type of a pooled dummy format.
    fn dummy_type(self) -> Option<quant::GgmlType> {
        match self {
            LoadFormat::DummyBf16 => Some(quant::GgmlType::BF16),
            LoadFormat::DummyQ8_0 => Some(quant::GgmlType::Q8_0),
            LoadFormat::DummyQ4K => Some(quant::GgmlType::Q4K),
            _ => None,
        }
    }
}

/// A model opened but not yet uploaded: its spec, tokenizer and a tensor source.
pub struct ModelFiles {
    /// Display name (file or directory name).
    pub name: String,
    pub spec: ModelSpec,
    pub tokenizer: Option<Tokenizer>,
    pub source: Box<dyn TensorSource>,
}

impl std::fmt::Debug for ModelFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelFiles")
            .field("name", &self.name)
            .field("spec", &self.spec)
            .finish()
    }
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}

/// A tokenizer being built on a thread of its own ([`ModelFiles::open_overlapped`]).
pub struct PendingTokenizer(std::thread::JoinHandle<Result<Option<Tokenizer>, ModelError>>);

impl PendingTokenizer {
    /// Waits for the tokenizer (`None`: the model has none).
    pub fn join(self) -> Result<Option<Tokenizer>, ModelError> {
        self.0
            .join()
            .unwrap_or_else(|_| Err(ModelError::Tokenizer("tokenizer thread panicked".into())))
    }
}

/// `Auto` resolved: a directory is a Hugging Face model, anything else a GGUF file.
fn resolve(path: &Path, format: LoadFormat) -> LoadFormat {
    match format {
        LoadFormat::Auto if path.is_dir() => LoadFormat::Hf,
        LoadFormat::Auto => LoadFormat::Gguf,
        f => f,
    }
}

/// A GGUF file's tokenizer (from its metadata).
fn gguf_tokenizer(g: &gguf::GgufFile) -> Result<Tokenizer, ModelError> {
    Tokenizer::from_gguf(g).map_err(|e| ModelError::Tokenizer(e.to_string()))
}

/// Where a dummy model's config and tokenizer live.
fn dummy_dir(path: &Path) -> &Path {
    if path.is_dir() {
        path
    } else {
        path.parent().unwrap_or(Path::new("."))
    }
}

impl ModelFiles {
    /// Opens a model: parses headers, config and tokenizer; tensors are read later by `runner::load_weights`.
    pub fn open(path: &Path, format: LoadFormat) -> Result<Self, ModelError> {
        Self::open_with(path, format, true).map(|(files, _)| files)
    }

    /// [`ModelFiles::open`] with the tokenizer left out of the files and built on a thread of
    /// its own, so start-up overlaps it with loading the weights (a Llama-3 vocabulary takes
    /// 0.6-0.8 s, ten times the GGUF header). `kiln serve` starts this way.
    pub fn open_overlapped(
        path: &Path,
        format: LoadFormat,
    ) -> Result<(Self, PendingTokenizer), ModelError> {
        let (files, gguf) = Self::open_with(path, format, false)?;
        // A GGUF tokenizer reads the header the files parsed (shared with the thread); the
        // others read tokenizer.json next to the config.
        let dir = match resolve(path, format) {
            LoadFormat::Hf => path.to_path_buf(),
            _ => dummy_dir(path).to_path_buf(),
        };
        let handle = std::thread::Builder::new()
            .name("kiln-tokenizer".into())
            .spawn(move || match gguf {
                Some(g) => gguf_tokenizer(&g).map(Some),
                None => hf_tokenizer(&dir),
            })
            .map_err(|e| ModelError::Tokenizer(format!("cannot start its thread: {e}")))?;
        Ok((files, PendingTokenizer(handle)))
    }

    /// The files (with their tokenizer when `with_tokenizer`) and, for a GGUF file, its parsed
    /// header, which the files' tensor source shares.
    fn open_with(
        path: &Path,
        format: LoadFormat,
        with_tokenizer: bool,
    ) -> Result<(Self, Option<Arc<gguf::GgufFile>>), ModelError> {
        let format = resolve(path, format);
        let files = match format {
            LoadFormat::Gguf => {
                let t0 = std::time::Instant::now();
                let g = Arc::new(gguf::GgufFile::open(path)?);
                let spec = ModelSpec::from_gguf(&g)?;
                let header_s = t0.elapsed().as_secs_f64();
                for name in g.nonfinite_tensors() {
                    tracing::warn!(
                        "{}: tensor '{name}' holds NaN or infinite values",
                        path.display()
                    );
                }
                let tokenizer = match with_tokenizer {
                    true => Some(gguf_tokenizer(&g)?),
                    false => None,
                };
                if with_tokenizer {
                    tracing::debug!(
                        header_s,
                        tokenizer_s = t0.elapsed().as_secs_f64() - header_s,
                        "start-up: GGUF header and tokenizer"
                    );
                }
                let source = Box::new(g.clone());
                return Ok((
                    Self {
                        name: file_name(path),
                        spec,
                        tokenizer,
                        source,
                    },
                    Some(g),
                ));
            }
            LoadFormat::Hf => {
                let mut spec = hf_spec_at(&path.join("config.json"))?;
                spec.variant.pooling = pooling::from_hf_dir(path)?;
                let tokenizer = match with_tokenizer {
                    true => hf_tokenizer(path)?,
                    false => None,
                };
                if !path.join("tokenizer.json").exists() {
                    tracing::warn!("no tokenizer.json in {}: token ids only", path.display());
                }
                let source = SafetensorsSource::open(path)?.for_arch(&spec.arch);
                Self {
                    name: file_name(path),
                    spec,
                    tokenizer,
                    source: Box::new(source),
                }
            }
            LoadFormat::Dummy
            | LoadFormat::DummyBf16
            | LoadFormat::DummyQ8_0
            | LoadFormat::DummyQ4K => {
                let spec = hf_spec_at(path)?;
                let tokenizer = match with_tokenizer {
                    true => hf_tokenizer(dummy_dir(path))?,
                    false => None,
                };
                let source: Box<dyn TensorSource> = match format.dummy_type() {
                    Some(ty) => Box::new(dummy::PooledDummy::new(ty)?),
                    None => Box::new(DummySource { seed: 0 }),
                };
                Self {
                    name: file_name(path),
                    spec,
                    tokenizer,
                    source,
                }
            }
            LoadFormat::Auto => unreachable!("resolved above"),
        };
        Ok((files, None))
    }
}

/// The spec of a Hugging Face `config.json` (`config`, or `config/config.json` for a folder).
fn hf_spec_at(config: &Path) -> Result<ModelSpec, ModelError> {
    let config: PathBuf = if config.is_dir() {
        config.join("config.json")
    } else {
        config.to_path_buf()
    };
    let text = std::fs::read_to_string(&config).map_err(|e| ModelError::io(&config, e))?;
    ModelSpec::from_hf_config(&text)
}

/// `dir`'s `tokenizer.json` (with `tokenizer_config.json` when present); `None` without one.
fn hf_tokenizer(dir: &Path) -> Result<Option<Tokenizer>, ModelError> {
    let tok_path = dir.join("tokenizer.json");
    if !tok_path.exists() {
        return Ok(None);
    }
    let cfg = dir.join("tokenizer_config.json");
    let cfg = cfg.exists().then_some(cfg);
    Tokenizer::from_file(&tok_path, cfg.as_deref())
        .map(Some)
        .map_err(|e| ModelError::Tokenizer(e.to_string()))
}
