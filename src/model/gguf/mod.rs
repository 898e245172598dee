//! Bounded GGUF (v2/v3) reader: the file is untrusted input, every size is checked before use.
//!
//! Layout (little-endian):
//!
//! ```text
//! "GGUF" | version u32 | n_tensors u64 | n_kv u64
//! n_kv      x (key: string, value type u32, value)
//! n_tensors x (name: string, n_dims u32, dims u64[n_dims], ggml type u32, offset u64)
//! padding to `general.alignment` (default 32)
//! data section: tensor i lives at data_start + offset_i
//! string = len u64 | utf-8 bytes;  array = element type u32 | count u64 | elements
//! ```
//!
//! Every count, length, dim and offset is checked against the bytes that remain with checked
//! arithmetic before anything is allocated; the parser never panics. Metadata array elements
//! are capped at [`MAX_META_VALUES`] per file (about 128 MB of `MetaValue`s at most), arrays
//! nest at most [`MAX_ARRAY_DEPTH`] deep and tensors have at most [`MAX_DIMS`] dims. Tensors
//! of types Kiln cannot dequantize parse as [`GgmlType::Other`]; only
//! [`GgufFile::tensor_f32`] rejects them.

mod parse;
mod value;

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use crate::backend::quant;
pub use crate::backend::quant::GgmlType;
use crate::backend::tensor::SharedBytes;
pub use value::{
    DEFAULT_ALIGNMENT, GgufError, MAX_ARRAY_DEPTH, MAX_DIMS, MAX_META_VALUES, MetaValue,
    SCAN_ELEMENTS, TensorInfo,
};

/// The bytes a file was parsed from: a read-only mapping or an owned buffer, shared with
/// the tensors handed out by [`GgufFile::tensor_shared`].
enum Storage {
    Mmap(Arc<memmap2::Mmap>),
    Owned(Arc<Vec<u8>>),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mmap(m) => m,
            Storage::Owned(v) => v,
        }
    }

    fn shared(&self) -> Arc<dyn AsRef<[u8]> + Send + Sync> {
        match self {
            Storage::Mmap(m) => m.clone(),
            Storage::Owned(v) => v.clone(),
        }
    }
}

/// A parsed GGUF file. Construction validates everything: each tensor's data range lies
/// inside the file, is aligned, holds whole blocks and overlaps no other tensor.
pub struct GgufFile {
    storage: Storage,
    version: u32,
    alignment: u64,
    data_offset: u64,
    metadata: Vec<(String, MetaValue)>,
    meta_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

impl GgufFile {
    /// Memory-maps `path` read-only and parses it.
    pub fn open(path: &Path) -> Result<Self, GgufError> {
        let io_err = |source| GgufError::Io {
            path: path.display().to_string(),
            source,
        };
        let file = File::open(path).map_err(io_err)?;
        // SAFETY: the mapping is read-only and private to this value. Mapped files must not
        // be modified by another process while Kiln runs (as with every mmap-based loader);
        // the parser treats the bytes as untrusted and reads them only through bounds-checked
        // slices, so even a concurrent change cannot make it read outside the mapping.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io_err)?;
        Self::from_storage(Storage::Mmap(Arc::new(map)))
    }

    /// Parses an in-memory GGUF image (copied; used by tests and fuzzing).
    pub fn parse(bytes: &[u8]) -> Result<Self, GgufError> {
        Self::from_storage(Storage::Owned(Arc::new(bytes.to_vec())))
    }

    /// Parses an owned in-memory GGUF image without copying it.
    pub fn from_vec(bytes: Vec<u8>) -> Result<Self, GgufError> {
        Self::from_storage(Storage::Owned(Arc::new(bytes)))
    }

    fn from_storage(storage: Storage) -> Result<Self, GgufError> {
        let parsed = parse::parse(storage.bytes())?;
        Ok(GgufFile {
            storage,
            version: parsed.version,
            alignment: parsed.alignment,
            data_offset: parsed.data_offset,
            metadata: parsed.metadata,
            meta_index: parsed.meta_index,
            tensors: parsed.tensors,
            tensor_index: parsed.tensor_index,
        })
    }

    /// GGUF version: 2 or 3.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Data alignment (`general.alignment`, default 32); a nonzero power of two.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute offset of the data section (may equal or exceed the file size when the file
    /// has no tensor data).
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// Total size of the file in bytes.
    pub fn file_size(&self) -> u64 {
        self.storage.bytes().len() as u64
    }

    /// All metadata entries in file order; keys are unique.
    pub fn metadata(&self) -> &[(String, MetaValue)] {
        &self.metadata
    }

    /// Raw metadata lookup.
    pub fn meta(&self, key: &str) -> Option<&MetaValue> {
        self.meta_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// String metadata, if present and a string.
    pub fn meta_str(&self, key: &str) -> Option<&str> {
        self.meta(key)?.as_str()
    }

    /// Any integer metadata converted to u64 (None if absent, negative or not an integer).
    pub fn meta_u64(&self, key: &str) -> Option<u64> {
        self.meta(key)?.as_u64()
    }

    /// F32/F64 (or integer) metadata as f64.
    pub fn meta_f64(&self, key: &str) -> Option<f64> {
        self.meta(key)?.as_f64()
    }

    /// Bool metadata, if present and a bool.
    pub fn meta_bool(&self, key: &str) -> Option<bool> {
        match self.meta(key)? {
            MetaValue::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// Array of strings (e.g. `tokenizer.ggml.tokens`); None if any element is not a string.
    pub fn meta_str_array(&self, key: &str) -> Option<Vec<&str>> {
        self.meta(key)?
            .as_array()?
            .iter()
            .map(MetaValue::as_str)
            .collect()
    }

    /// Array of numbers as f32 (e.g. `tokenizer.ggml.scores`); None if any element is not a number.
    pub fn meta_f32_array(&self, key: &str) -> Option<Vec<f32>> {
        let items = self.meta(key)?.as_array()?;
        items.iter().map(|v| v.as_f64().map(|x| x as f32)).collect()
    }

    /// Array of integers as i64 (e.g. `tokenizer.ggml.token_type`); None if any element is
    /// not an integer or does not fit.
    pub fn meta_i64_array(&self, key: &str) -> Option<Vec<i64>> {
        self.meta(key)?
            .as_array()?
            .iter()
            .map(MetaValue::as_i64)
            .collect()
    }

    /// All tensor infos in file order; names are unique.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The info of the tensor called `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// Raw bytes of a tensor (borrowed from the mmap). Infos from this file always lie inside
    /// it; an info whose range does not (one from another file) yields an empty slice.
    pub fn tensor_bytes(&self, info: &TensorInfo) -> &[u8] {
        let range = usize::try_from(info.offset).ok().and_then(|start| {
            let len = usize::try_from(info.n_bytes).ok()?;
            Some(start..start.checked_add(len)?)
        });
        range
            .and_then(|r| self.storage.bytes().get(r))
            .unwrap_or(&[])
    }

    /// Raw bytes of a tensor as a handle that shares the file's mapping (no copy), valid
    /// after this `GgufFile` is dropped; `None` for an info whose range is not in the file.
    pub fn tensor_shared(&self, info: &TensorInfo) -> Option<SharedBytes> {
        let start = usize::try_from(info.offset).ok()?;
        let end = start.checked_add(usize::try_from(info.n_bytes).ok()?)?;
        SharedBytes::new(self.storage.shared(), start..end)
    }

    /// Tensor data dequantized to f32, GGUF order (ne0 fastest).
    pub fn tensor_f32(&self, name: &str) -> Result<Vec<f32>, GgufError> {
        let info = self
            .tensor(name)
            .ok_or_else(|| GgufError::Malformed(format!("tensor '{name}' not found")))?;
        self.dequantize(info)
    }

    /// The data of `info` (a tensor of this file) dequantized to f32, GGUF order.
    pub fn dequantize(&self, info: &TensorInfo) -> Result<Vec<f32>, GgufError> {
        let name = &info.name;
        if !info.ggml_type.is_supported() {
            return Err(GgufError::Unsupported(format!(
                "tensor '{name}' has type {}, which Kiln cannot dequantize",
                info.ggml_type
            )));
        }
        quant::dequantize_to_vec(info.ggml_type, self.tensor_bytes(info), info.n_elements())
            .map_err(|e| GgufError::Malformed(format!("tensor '{name}': {e}")))
    }
}

impl GgufFile {
    /// Names of the tensors whose first or last [`SCAN_ELEMENTS`] values (whole blocks)
    /// hold a NaN or an infinity: a cheap sign of a broken conversion, reported as a warning
    /// by the loader. Types Kiln cannot dequantize are not scanned.
    pub fn nonfinite_tensors(&self) -> Vec<&str> {
        self.tensors
            .iter()
            .filter(|t| self.ends_nonfinite(t))
            .map(|t| t.name.as_str())
            .collect()
    }

    fn ends_nonfinite(&self, t: &TensorInfo) -> bool {
        let ty = t.ggml_type;
        let (Some(block), Some(block_bytes)) = (ty.block_size(), ty.block_bytes()) else {
            return false;
        };
        if !ty.is_supported() || t.n_bytes == 0 {
            return false;
        }
        let blocks = SCAN_ELEMENTS.div_ceil(block).min(t.n_bytes / block_bytes);
        let (len, n_out) = ((blocks * block_bytes) as usize, (blocks * block) as usize);
        let bytes = self.tensor_bytes(t);
        let mut out = vec![0f32; n_out];
        [&bytes[..len], &bytes[bytes.len() - len..]]
            .iter()
            .any(|part| {
                quant::dequantize(ty, part, &mut out).is_ok() && out.iter().any(|v| !v.is_finite())
            })
    }
}

/// The header's metadata, as the tokenizer reads its vocabulary from it.
impl crate::tokenizer::GgufMetadata for GgufFile {
    fn meta_str(&self, key: &str) -> Option<&str> {
        GgufFile::meta_str(self, key)
    }
    fn meta_u64(&self, key: &str) -> Option<u64> {
        GgufFile::meta_u64(self, key)
    }
    fn meta_bool(&self, key: &str) -> Option<bool> {
        GgufFile::meta_bool(self, key)
    }
    fn meta_str_array(&self, key: &str) -> Option<Vec<&str>> {
        GgufFile::meta_str_array(self, key)
    }
    fn meta_f32_array(&self, key: &str) -> Option<Vec<f32>> {
        GgufFile::meta_f32_array(self, key)
    }
    fn meta_i64_array(&self, key: &str) -> Option<Vec<i64>> {
        GgufFile::meta_i64_array(self, key)
    }
}
