//! Where weights come from: GGUF files, Hugging Face safetensors directories, or random dummies.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use rand::{RngExt, SeedableRng};
use safetensors::{Dtype, SafeTensors};

use super::ModelError;
use super::family;
use super::gguf::GgufFile;
use crate::backend::HostTensor;
use crate::backend::quant::GgmlType;
use crate::backend::tensor::SharedBytes;

/// A source of named tensors. Names are GGUF-style (`blk.0.attn_q.weight`); shapes are
/// row-major `[rows, cols]` (GGUF `[ne0, ne1]` reversed) or `[len]`.
pub trait TensorSource: Send + Sync {
    /// The tensor's values, or `None` when the file has no such tensor.
    /// Errors when it exists with a different shape or cannot be decoded.
    fn fetch(&self, name: &str, shape: &[usize]) -> Result<Option<Vec<f32>>, ModelError>;

    /// The tensor in the file's own type (quantized blocks, f16, bf16) where the source can
    /// hand it over without converting; by default [`TensorSource::fetch`]'s f32 values.
    fn fetch_host(&self, name: &str, shape: &[usize]) -> Result<Option<HostTensor>, ModelError> {
        Ok(self
            .fetch(name, shape)?
            .map(|v| HostTensor::new(shape.to_vec(), v)))
    }

    /// The types the source's matrices come in (the GPU backend waits at start for those
    /// types' kernels only: its quantized matmuls, and the float ones only where a matrix is
    /// stored in a float type); `None` when unknown (every type's kernels are waited for).
    /// Vectors (norm weights, biases) are left out: every backend keeps them in its own
    /// float type.
    fn weight_types(&self) -> Option<Vec<GgmlType>> {
        None
    }
}

fn shape_error(name: &str, want: &[usize], got: &[usize]) -> ModelError {
    ModelError::Shape(format!(
        "tensor '{name}': expected shape {want:?}, file has {got:?}"
    ))
}

/// The info of GGUF tensor `name`, checked against `shape` (dims of 1 ignored).
fn gguf_info<'a>(
    g: &'a GgufFile,
    name: &str,
    shape: &[usize],
) -> Result<Option<&'a super::gguf::TensorInfo>, ModelError> {
    let Some(info) = g.tensor(name) else {
        return Ok(None);
    };
    let got: Vec<usize> = info.dims.iter().rev().map(|&d| d as usize).collect();
    let squeeze = |s: &[usize]| s.iter().copied().filter(|&d| d != 1).collect::<Vec<_>>();
    if squeeze(&got) != squeeze(shape) {
        return Err(shape_error(name, shape, &got));
    }
    Ok(Some(info))
}

/// A source shared with another owner (the GGUF header the tokenizer thread also reads).
impl<S: TensorSource + ?Sized> TensorSource for Arc<S> {
    fn fetch(&self, name: &str, shape: &[usize]) -> Result<Option<Vec<f32>>, ModelError> {
        (**self).fetch(name, shape)
    }

    fn fetch_host(&self, name: &str, shape: &[usize]) -> Result<Option<HostTensor>, ModelError> {
        (**self).fetch_host(name, shape)
    }

    fn weight_types(&self) -> Option<Vec<GgmlType>> {
        (**self).weight_types()
    }
}

impl TensorSource for GgufFile {
    fn weight_types(&self) -> Option<Vec<GgmlType>> {
        let mut types: Vec<GgmlType> = Vec::new();
        for t in self.tensors().iter().filter(|t| t.dims.len() >= 2) {
            if !types.contains(&t.ggml_type) {
                types.push(t.ggml_type);
            }
        }
        Some(types)
    }

    fn fetch(&self, name: &str, shape: &[usize]) -> Result<Option<Vec<f32>>, ModelError> {
        match gguf_info(self, name, shape)? {
            Some(_) => Ok(Some(self.tensor_f32(name)?)),
            None => Ok(None),
        }
    }

    /// The tensor's bytes shared with the file's mapping (no copy); F32 as values.
    fn fetch_host(&self, name: &str, shape: &[usize]) -> Result<Option<HostTensor>, ModelError> {
        let Some(info) = gguf_info(self, name, shape)? else {
            return Ok(None);
        };
        let ty = info.ggml_type;
        if !ty.is_supported() {
            return Err(ModelError::Format(format!(
                "tensor '{name}' has type {ty}, which Kiln cannot compute"
            )));
        }
        let bytes = self
            .tensor_shared(info)
            .ok_or_else(|| ModelError::Format(format!("tensor '{name}': data outside the file")))?;
        HostTensor::raw_shared(shape.to_vec(), ty, bytes)
            .map(Some)
            .map_err(|e| ModelError::Format(format!("tensor '{name}': {e}")))
    }
}

/// A Hugging Face directory's safetensors files, memory-mapped.
pub struct SafetensorsSource {
    /// Shared so that raw tensors handed out by `fetch_host` can borrow the mapping.
    maps: Vec<Arc<Mmap>>,
    /// HF tensor name -> index into `maps`.
    index: HashMap<String, usize>,
    /// The spec's architecture (tensor names differ by family).
    arch: String,
}

impl SafetensorsSource {
    /// Maps every `*.safetensors` file of `dir` (sharded checkpoints included).
    pub fn open(dir: &Path) -> Result<Self, ModelError> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|e| ModelError::io(dir, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(ModelError::Format(format!(
                "no *.safetensors files in {}",
                dir.display()
            )));
        }
        let mut maps = Vec::new();
        let mut index = HashMap::new();
        for (i, path) in files.iter().enumerate() {
            let file = std::fs::File::open(path).map_err(|e| ModelError::io(path, e))?;
            // SAFETY: the map is read-only and model files are not modified while Kiln runs;
            // every byte is validated by the safetensors parser before use.
            let map = unsafe { Mmap::map(&file) }.map_err(|e| ModelError::io(path, e))?;
            let st = SafeTensors::deserialize(&map)
                .map_err(|e| ModelError::Format(format!("{}: {e}", path.display())))?;
            for name in st.names() {
                index.insert(name.to_string(), i);
            }
            maps.push(Arc::new(map));
        }
        Ok(Self {
            maps,
            index,
            arch: "llama".into(),
        })
    }

    /// Names tensors as architecture `arch` does (Gemma's norms, Phi-3's fused tensors).
    pub fn for_arch(mut self, arch: &str) -> Self {
        self.arch = arch.to_string();
        self
    }

    /// The HF name of GGUF tensor `name` as this directory stores it: Gemma 3's multimodal
    /// checkpoints put the language model under `language_model.` or `model.language_model.`.
    fn resolve(&self, name: &str) -> Option<(String, usize)> {
        let hf = hf_name_for(&self.arch, name);
        let nested = hf.strip_prefix("model.").map(|rest| {
            [
                format!("language_model.{hf}"),
                format!("model.language_model.{rest}"),
            ]
        });
        std::iter::once(hf.clone())
            .chain(nested.into_iter().flatten())
            .find_map(|n| self.index.get(&n).map(|&i| (n, i)))
    }
}

/// Maps a GGUF tensor name to its Hugging Face name (Llama-family names).
pub fn hf_name(gguf: &str) -> String {
    family::llama().hf_name(gguf)
}

/// Maps a GGUF tensor name to its Hugging Face name in architecture `arch` (an unknown one
/// reads Llama's names).
pub fn hf_name_for(arch: &str, gguf: &str) -> String {
    family::by_arch(arch)
        .unwrap_or(family::llama())
        .hf_name(gguf)
}

impl SafetensorsSource {
    /// Runs `f` on HF tensor `hf`'s dtype, shape and bytes (inside the mapping); `None` when
    /// the directory has no such tensor (for a family's derived tensors).
    pub fn hf_view<T>(
        &self,
        hf: &str,
        f: impl FnOnce(Dtype, &[usize], &[u8]) -> Result<T, ModelError>,
    ) -> Result<Option<T>, ModelError> {
        let Some(&i) = self.index.get(hf) else {
            return Ok(None);
        };
        let st = SafeTensors::deserialize(&self.maps[i])
            .map_err(|e| ModelError::Format(e.to_string()))?;
        let view = st
            .tensor(hf)
            .map_err(|e| ModelError::Format(format!("{hf}: {e}")))?;
        f(view.dtype(), view.shape(), view.data()).map(Some)
    }

    /// GGUF tensor `name` made by the family from tensors stored in another layout.
    fn derived(&self, name: &str, shape: &[usize]) -> Result<Option<HostTensor>, ModelError> {
        match family::by_arch(&self.arch).and_then(|f| f.hf_tensors.derived) {
            Some(make) => make(self, name, shape),
            None => Ok(None),
        }
    }

    /// Runs `f` on GGUF tensor `name`'s HF name, dtype, bytes (inside the mapping) and
    /// file index, after checking its shape; `None` when the directory has no such tensor.
    fn with_view<T>(
        &self,
        name: &str,
        shape: &[usize],
        f: impl FnOnce(&str, Dtype, &[u8], usize) -> Result<T, ModelError>,
    ) -> Result<Option<T>, ModelError> {
        let Some((hf, i)) = self.resolve(name) else {
            return Ok(None);
        };
        let st = SafeTensors::deserialize(&self.maps[i])
            .map_err(|e| ModelError::Format(e.to_string()))?;
        let view = st
            .tensor(&hf)
            .map_err(|e| ModelError::Format(format!("{hf}: {e}")))?;
        if view.shape() != shape {
            return Err(shape_error(&hf, shape, view.shape()));
        }
        f(&hf, view.dtype(), view.data(), i).map(Some)
    }
}

fn unsupported_dtype(hf: &str, dtype: Dtype) -> ModelError {
    ModelError::Format(format!("tensor '{hf}': unsupported dtype {dtype:?}"))
}

impl TensorSource for SafetensorsSource {
    /// The plain types (F32, F16, BF16), and MXFP4 where a checkpoint stores experts so
    /// (gpt-oss's `*_blocks`).
    fn weight_types(&self) -> Option<Vec<GgmlType>> {
        let mut types = vec![GgmlType::F32, GgmlType::F16, GgmlType::BF16];
        if self.index.keys().any(|k| k.ends_with("_blocks")) {
            types.push(GgmlType::Mxfp4);
        }
        Some(types)
    }

    fn fetch(&self, name: &str, shape: &[usize]) -> Result<Option<Vec<f32>>, ModelError> {
        if let Some(t) = self.derived(name, shape)? {
            return Ok(Some(t.into_f32()?.values().unwrap_or_default().to_vec()));
        }
        self.with_view(name, shape, |hf, dtype, bytes, _| {
            Ok(match dtype {
                Dtype::F32 => bytes
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
                Dtype::F16 => bytes
                    .chunks_exact(2)
                    .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                    .collect(),
                Dtype::BF16 => bytes
                    .chunks_exact(2)
                    .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                    .collect(),
                other => return Err(unsupported_dtype(hf, other)),
            })
        })
    }

    /// F16 and BF16 tensors as their bytes shared with the file's mapping (no copy); F32 as
    /// values.
    fn fetch_host(&self, name: &str, shape: &[usize]) -> Result<Option<HostTensor>, ModelError> {
        if let Some(t) = self.derived(name, shape)? {
            return Ok(Some(t));
        }
        self.with_view(name, shape, |hf, dtype, bytes, i| {
            let ty = match dtype {
                Dtype::F32 => GgmlType::F32,
                Dtype::F16 => GgmlType::F16,
                Dtype::BF16 => GgmlType::BF16,
                other => return Err(unsupported_dtype(hf, other)),
            };
            let map = &self.maps[i];
            // `bytes` lies inside `map` (the parser's view of it): its offset there.
            let outside = || ModelError::Format(format!("tensor '{hf}': data outside the file"));
            let start = (bytes.as_ptr() as usize)
                .checked_sub(map.as_ptr() as usize)
                .ok_or_else(outside)?;
            let owner: Arc<dyn AsRef<[u8]> + Send + Sync> = map.clone();
            let shared = SharedBytes::new(owner, start..start + bytes.len()).ok_or_else(outside)?;
            HostTensor::raw_shared(shape.to_vec(), ty, shared)
                .map_err(|e| ModelError::Format(format!("tensor '{hf}': {e}")))
        })
    }
}

/// Random weights at the real shapes (for benchmarks): matrices uniform in ±1/sqrt(cols),
/// norm weights 1, biases 0. Deterministic for a given seed.
pub struct DummySource {
    pub seed: u64,
}

impl TensorSource for DummySource {
    fn weight_types(&self) -> Option<Vec<GgmlType>> {
        Some(vec![GgmlType::F32])
    }

    fn fetch(&self, name: &str, shape: &[usize]) -> Result<Option<Vec<f32>>, ModelError> {
        let n: usize = shape.iter().product();
        if name.ends_with("norm.weight") {
            return Ok(Some(vec![1.0; n]));
        }
        if name.ends_with(".bias") {
            return Ok(Some(vec![0.0; n]));
        }
        let cols = *shape.last().unwrap_or(&1) as f32;
        let a = 1.0 / cols.sqrt();
        let name_hash = name.bytes().fold(0xcbf29ce484222325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x100000001b3)
        });
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(self.seed ^ name_hash);
        Ok(Some((0..n).map(|_| rng.random_range(-a..a)).collect()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::HostData;
    use safetensors::tensor::TensorView;

    #[test]
    fn half_tensors_arrive_raw_from_the_mapping_and_f32_as_values() {
        let bf: Vec<u8> = [1.5f32, -2.0, 0.25, 3.0, 7.0, -0.5, 0.0, 1.0]
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
            .collect();
        let f16: Vec<u8> = [0.5f32, 2.0, -4.0, 1.0]
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
            .collect();
        let f32b: Vec<u8> = [1.0f32, 2.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        let i64b = vec![0u8; 16];
        let q = "model.layers.0.self_attn.q_proj.weight";
        let file = safetensors::serialize(
            [
                (q, TensorView::new(Dtype::BF16, vec![2, 4], &bf).unwrap()),
                (
                    "model.layers.0.self_attn.k_proj.weight",
                    TensorView::new(Dtype::F16, vec![1, 4], &f16).unwrap(),
                ),
                (
                    "model.norm.weight",
                    TensorView::new(Dtype::F32, vec![2], &f32b).unwrap(),
                ),
                (
                    "model.layers.0.self_attn.v_proj.weight",
                    TensorView::new(Dtype::I64, vec![1, 2], &i64b).unwrap(),
                ),
            ],
            None,
        )
        .unwrap();
        let dir = std::env::temp_dir().join(format!("kiln-st-raw-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("model.safetensors"), &file).unwrap();
        let src = SafetensorsSource::open(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();

        let t = src
            .fetch_host("blk.0.attn_q.weight", &[2, 4])
            .unwrap()
            .unwrap();
        let HostData::Raw { ty, bytes } = &t.data else {
            panic!("bf16 arrived as {}", t.type_label());
        };
        assert_eq!(
            (*ty, t.shape.clone(), &bytes[..]),
            (GgmlType::BF16, vec![2, 4], &bf[..])
        );
        // The bytes are the mapping's own, not a copy.
        let map = src.maps[0].as_ptr_range();
        assert!(map.contains(&bytes.as_ptr()));
        assert_eq!(t.byte_len(), bf.len());
        let f32_values = src.fetch("blk.0.attn_q.weight", &[2, 4]).unwrap().unwrap();
        assert_eq!(t.into_f32().unwrap().values().unwrap(), &f32_values[..]);

        let k = src
            .fetch_host("blk.0.attn_k.weight", &[1, 4])
            .unwrap()
            .unwrap();
        assert_eq!((k.weight_type(), k.byte_len()), (GgmlType::F16, 8));
        assert_eq!(
            k.into_f32().unwrap().values().unwrap(),
            &[0.5, 2.0, -4.0, 1.0]
        );
        let norm = src.fetch_host("output_norm.weight", &[2]).unwrap().unwrap();
        assert_eq!(norm.values().unwrap(), &[1.0, 2.0]);

        assert!(src.fetch_host("blk.0.attn_q.weight", &[4, 2]).is_err());
        let err = src.fetch_host("blk.0.attn_v.weight", &[1, 2]).unwrap_err();
        assert!(err.to_string().contains("I64"), "{err}");
        assert!(
            src.fetch_host("blk.1.attn_q.weight", &[2, 4])
                .unwrap()
                .is_none()
        );
    }
}
