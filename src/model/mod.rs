//! Model files (GGUF, Hugging Face directories, dummy weights), the model spec and the llama forward.

pub mod gguf;
pub mod llama;
pub mod quant;
pub mod source;
pub mod spec;
pub mod weights;

use std::path::{Path, PathBuf};

use indicatif::{ProgressBar, ProgressStyle};

use crate::tokenizer::Tokenizer;
pub use source::{DummySource, SafetensorsSource, TensorSource};
pub use spec::{ModelSpec, RopeLayout, RopeSpec};
pub use weights::{HostTensor, LayerWeights, ModelWeights};

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

impl ModelFiles {
    /// Opens a model: parses headers, config and tokenizer; tensors are read later by `load_weights`.
    pub fn open(path: &Path, format: LoadFormat) -> Result<Self, ModelError> {
        let format = match format {
            LoadFormat::Auto if path.is_dir() => LoadFormat::Hf,
            LoadFormat::Auto => LoadFormat::Gguf,
            f => f,
        };
        match format {
            LoadFormat::Gguf => {
                let g = gguf::GgufFile::open(path)?;
                let spec = ModelSpec::from_gguf(&g)?;
                for name in g.nonfinite_tensors() {
                    tracing::warn!(
                        "{}: tensor '{name}' holds NaN or infinite values",
                        path.display()
                    );
                }
                let tokenizer =
                    Tokenizer::from_gguf(&g).map_err(|e| ModelError::Tokenizer(e.to_string()))?;
                Ok(Self {
                    name: file_name(path),
                    spec,
                    tokenizer: Some(tokenizer),
                    source: Box::new(g),
                })
            }
            LoadFormat::Hf => {
                let (spec, tokenizer) = hf_spec_and_tokenizer(path)?;
                if tokenizer.is_none() {
                    tracing::warn!("no tokenizer.json in {}: token ids only", path.display());
                }
                let source = SafetensorsSource::open(path)?;
                Ok(Self {
                    name: file_name(path),
                    spec,
                    tokenizer,
                    source: Box::new(source),
                })
            }
            LoadFormat::Dummy => {
                let dir = if path.is_dir() {
                    path
                } else {
                    path.parent().unwrap_or(Path::new("."))
                };
                let (spec, tokenizer) = hf_spec_and_tokenizer_at(path, dir)?;
                Ok(Self {
                    name: file_name(path),
                    spec,
                    tokenizer,
                    source: Box::new(DummySource { seed: 0 }),
                })
            }
            LoadFormat::Auto => unreachable!("resolved above"),
        }
    }

    /// Reads every tensor in forward order, handing each to `upload` (which may move it to a
    /// device and drop the host copy). Shows a progress bar on a terminal.
    pub fn load_weights<W, E>(
        &self,
        mut upload: impl FnMut(HostTensor) -> Result<W, E>,
    ) -> Result<ModelWeights<W>, E>
    where
        E: From<ModelError>,
    {
        let s = &self.spec;
        let bar = ProgressBar::new(s.n_layers as u64 + 2);
        bar.set_style(
            ProgressStyle::with_template("loading {msg} [{bar:30}] {pos}/{len} layers {elapsed}")
                .expect("static template")
                .progress_chars("=> "),
        );
        bar.set_message(self.name.clone());
        let src = &*self.source;
        let get = |name: &str, shape: Vec<usize>| -> Result<HostTensor, ModelError> {
            let data = src
                .fetch(name, &shape)?
                .ok_or_else(|| ModelError::Missing(name.to_string()))?;
            Ok(HostTensor::new(shape, data))
        };
        let (h, q, kv, ff) = (s.hidden, s.q_dim(), s.kv_dim(), s.intermediate);
        let embed = upload(get("token_embd.weight", vec![s.vocab_size, h])?)?;
        bar.inc(1);
        let mut layers = Vec::with_capacity(s.n_layers);
        for i in 0..s.n_layers {
            let n = |leaf: &str| format!("blk.{i}.{leaf}");
            let wqkv = HostTensor::concat_rows(&[
                get(&n("attn_q.weight"), vec![q, h])?,
                get(&n("attn_k.weight"), vec![kv, h])?,
                get(&n("attn_v.weight"), vec![kv, h])?,
            ]);
            let bqkv = if s.qkv_bias {
                let mut b = get(&n("attn_q.bias"), vec![q])?.data;
                b.extend(get(&n("attn_k.bias"), vec![kv])?.data);
                b.extend(get(&n("attn_v.bias"), vec![kv])?.data);
                Some(upload(HostTensor::new(vec![b.len()], b))?)
            } else {
                None
            };
            let w_gate_up = HostTensor::concat_rows(&[
                get(&n("ffn_gate.weight"), vec![ff, h])?,
                get(&n("ffn_up.weight"), vec![ff, h])?,
            ]);
            layers.push(LayerWeights {
                attn_norm: upload(get(&n("attn_norm.weight"), vec![h])?)?,
                wqkv: upload(wqkv)?,
                bqkv,
                wo: upload(get(&n("attn_output.weight"), vec![h, q])?)?,
                ffn_norm: upload(get(&n("ffn_norm.weight"), vec![h])?)?,
                w_gate_up: upload(w_gate_up)?,
                w_down: upload(get(&n("ffn_down.weight"), vec![h, ff])?)?,
            });
            bar.inc(1);
        }
        let norm = upload(get("output_norm.weight", vec![h])?)?;
        let output = if s.tied_embeddings {
            None
        } else {
            Some(upload(get("output.weight", vec![s.vocab_size, h])?)?)
        };
        bar.inc(1);
        bar.finish_and_clear();
        Ok(ModelWeights {
            embed,
            layers,
            norm,
            output,
        })
    }
}

fn hf_spec_and_tokenizer(dir: &Path) -> Result<(ModelSpec, Option<Tokenizer>), ModelError> {
    hf_spec_and_tokenizer_at(&dir.join("config.json"), dir)
}

fn hf_spec_and_tokenizer_at(
    config: &Path,
    dir: &Path,
) -> Result<(ModelSpec, Option<Tokenizer>), ModelError> {
    let config: PathBuf = if config.is_dir() {
        config.join("config.json")
    } else {
        config.to_path_buf()
    };
    let text = std::fs::read_to_string(&config).map_err(|e| ModelError::io(&config, e))?;
    let spec = ModelSpec::from_hf_config(&text)?;
    let tok_path = dir.join("tokenizer.json");
    let tokenizer = if tok_path.exists() {
        let cfg = dir.join("tokenizer_config.json");
        let cfg = cfg.exists().then_some(cfg);
        Some(
            Tokenizer::from_file(&tok_path, cfg.as_deref())
                .map_err(|e| ModelError::Tokenizer(e.to_string()))?,
        )
    } else {
        None
    };
    Ok((spec, tokenizer))
}
