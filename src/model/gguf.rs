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

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use crate::backend::quant;
pub use crate::backend::quant::GgmlType;
use crate::backend::tensor::SharedBytes;

/// Most dims a tensor may have (ggml's `GGML_MAX_DIMS`).
pub const MAX_DIMS: u32 = 4;
/// Deepest nesting of metadata arrays (an array of scalars has depth 1).
pub const MAX_ARRAY_DEPTH: usize = 4;
/// Most metadata array elements in one file (4M; real vocabularies hold about 1M in all);
/// bounds the memory the metadata can take whatever the file claims.
pub const MAX_META_VALUES: u64 = 1 << 22;
/// Elements read at each end of a tensor (rounded up to whole blocks) by
/// [`GgufFile::nonfinite_tensors`].
pub const SCAN_ELEMENTS: u64 = 256;
/// Alignment of the data section when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;

const MAGIC: &[u8; 4] = b"GGUF";
/// Smallest encoding of one metadata entry: key length, value type, a 1-byte value.
const MIN_KV_BYTES: u64 = 8 + 4 + 1;
/// Smallest encoding of one tensor info: name length, n_dims, type, offset.
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 4 + 8;

/// A typed GGUF metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<MetaValue>),
}

impl MetaValue {
    /// The GGUF name of the value's type ("u32", "string", "array", ...).
    pub fn type_name(&self) -> &'static str {
        match self {
            MetaValue::U8(_) => "u8",
            MetaValue::I8(_) => "i8",
            MetaValue::U16(_) => "u16",
            MetaValue::I16(_) => "i16",
            MetaValue::U32(_) => "u32",
            MetaValue::I32(_) => "i32",
            MetaValue::U64(_) => "u64",
            MetaValue::I64(_) => "i64",
            MetaValue::F32(_) => "f32",
            MetaValue::F64(_) => "f64",
            MetaValue::Bool(_) => "bool",
            MetaValue::String(_) => "string",
            MetaValue::Array(_) => "array",
        }
    }

    /// Any integer as i128 (exact for every integer type); None for other types.
    fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            MetaValue::U8(v) => v.into(),
            MetaValue::I8(v) => v.into(),
            MetaValue::U16(v) => v.into(),
            MetaValue::I16(v) => v.into(),
            MetaValue::U32(v) => v.into(),
            MetaValue::I32(v) => v.into(),
            MetaValue::U64(v) => v.into(),
            MetaValue::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// Any integer that fits in a u64; None if negative or not an integer.
    pub fn as_u64(&self) -> Option<u64> {
        self.as_i128().and_then(|v| u64::try_from(v).ok())
    }

    /// Any integer that fits in an i64; None if out of range or not an integer.
    pub fn as_i64(&self) -> Option<i64> {
        self.as_i128().and_then(|v| i64::try_from(v).ok())
    }

    /// F32, F64 or any integer as f64 (integers above 2^53 round).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v.into()),
            MetaValue::F64(v) => Some(v),
            _ => self.as_i128().map(|v| v as f64),
        }
    }

    /// The string, if the value is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// The elements, if the value is an array.
    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// Errors from reading a GGUF file; each names what is wrong.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("io error reading {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("malformed GGUF: {0}")]
    Malformed(String),
    #[error("unsupported GGUF: {0}")]
    Unsupported(String),
}

/// One tensor's description: dims in GGUF order (ne0 = innermost / fastest).
#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub name: String,
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Absolute byte offset of the data in the file.
    pub offset: u64,
    /// Exact byte size of the data; `offset + n_bytes` lies inside the file. 0 when the
    /// type id has no known layout (then `GgmlType::block_size` is None).
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Number of elements (product of dims; 1 for a 0-dim tensor). Never overflows for
    /// infos from a parsed file (saturates otherwise).
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().fold(1u64, |acc, &d| acc.saturating_mul(d))
    }
}

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

mod parse {
    //! The parser proper: a bounds-checked cursor and the three sections of the header.

    use super::*;

    /// Everything `GgufFile` keeps besides the bytes.
    pub(super) struct Parsed {
        pub version: u32,
        pub alignment: u64,
        pub data_offset: u64,
        pub metadata: Vec<(String, MetaValue)>,
        pub meta_index: HashMap<String, usize>,
        pub tensors: Vec<TensorInfo>,
        pub tensor_index: HashMap<String, usize>,
    }

    fn bad(msg: impl Into<String>) -> GgufError {
        GgufError::Malformed(msg.into())
    }

    /// Prefixes a Malformed message with where it happened; `what` runs only on error.
    fn ctx<D: std::fmt::Display>(what: impl FnOnce() -> D) -> impl FnOnce(GgufError) -> GgufError {
        move |e| match e {
            GgufError::Malformed(m) => GgufError::Malformed(format!("{}: {m}", what())),
            other => other,
        }
    }

    /// A cursor over untrusted bytes; every read checks the remaining length first.
    struct Reader<'a> {
        buf: &'a [u8],
        pos: usize,
    }

    impl<'a> Reader<'a> {
        fn remaining(&self) -> u64 {
            self.buf.len().saturating_sub(self.pos) as u64
        }

        fn take(&mut self, n: u64) -> Result<&'a [u8], GgufError> {
            let rem = self.remaining();
            let short = || {
                bad(format!(
                    "unexpected end of file at offset {}: need {n} bytes, {rem} remain",
                    self.pos
                ))
            };
            if n > rem {
                return Err(short());
            }
            let end = self.pos.checked_add(n as usize).ok_or_else(short)?;
            let bytes = self.buf.get(self.pos..end).ok_or_else(short)?;
            self.pos = end;
            Ok(bytes)
        }

        fn array<const N: usize>(&mut self) -> Result<[u8; N], GgufError> {
            let bytes = self.take(N as u64)?;
            let mut out = [0u8; N];
            out.copy_from_slice(bytes);
            Ok(out)
        }

        fn u32(&mut self) -> Result<u32, GgufError> {
            self.array().map(u32::from_le_bytes)
        }

        fn u64(&mut self) -> Result<u64, GgufError> {
            self.array().map(u64::from_le_bytes)
        }

        fn string(&mut self) -> Result<String, GgufError> {
            let len = self.u64()?;
            let rem = self.remaining();
            if len > rem {
                return Err(bad(format!(
                    "string length {len} exceeds remaining {rem} bytes"
                )));
            }
            let at = self.pos;
            let bytes = self.take(len)?;
            String::from_utf8(bytes.to_vec())
                .map_err(|e| bad(format!("string at offset {at} is not valid UTF-8: {e}")))
        }
    }

    /// Parses and validates a whole GGUF image.
    pub(super) fn parse(buf: &[u8]) -> Result<Parsed, GgufError> {
        let mut r = Reader { buf, pos: 0 };
        let (version, n_tensors, n_kv) = header(&mut r)?;
        let (metadata, meta_index) = metadata(&mut r, n_kv)?;
        let alignment = alignment(&metadata, &meta_index)?;
        let (mut tensors, tensor_index) = tensor_infos(&mut r, n_tensors)?;
        let data_offset = (r.pos as u64)
            .checked_next_multiple_of(alignment)
            .ok_or_else(|| bad("data section offset overflows"))?;
        place_tensors(&mut tensors, data_offset, alignment, buf.len() as u64)?;
        Ok(Parsed {
            version,
            alignment,
            data_offset,
            metadata,
            meta_index,
            tensors,
            tensor_index,
        })
    }

    /// Magic, version and the two counts.
    fn header(r: &mut Reader<'_>) -> Result<(u32, u64, u64), GgufError> {
        let magic = r.array::<4>().map_err(ctx(|| "header: magic"))?;
        if &magic != MAGIC {
            return Err(bad(format!(
                "bad magic {magic:02x?} (expected \"GGUF\" = [47, 47, 55, 46])"
            )));
        }
        let version = r.u32().map_err(ctx(|| "header: version"))?;
        match version {
            2 | 3 => {}
            1 => {
                return Err(GgufError::Unsupported(
                    "GGUF version 1 is not supported (Kiln reads v2 and v3)".into(),
                ));
            }
            v if matches!(v.swap_bytes(), 1..=3) => {
                return Err(GgufError::Unsupported(format!(
                    "big-endian GGUF (version {}) is not supported",
                    v.swap_bytes()
                )));
            }
            v => {
                return Err(GgufError::Unsupported(format!(
                    "GGUF version {v} is not supported (Kiln reads v2 and v3)"
                )));
            }
        }
        let n_tensors = r.u64().map_err(ctx(|| "header: tensor count"))?;
        let n_kv = r.u64().map_err(ctx(|| "header: metadata count"))?;
        let rem = r.remaining();
        for (what, n, min) in [
            ("metadata count", n_kv, MIN_KV_BYTES),
            ("tensor count", n_tensors, MIN_TENSOR_INFO_BYTES),
        ] {
            if n.checked_mul(min).is_none_or(|need| need > rem) {
                return Err(bad(format!(
                    "header: {what} {n} needs at least {min} bytes each, only {rem} bytes remain"
                )));
            }
        }
        Ok((version, n_tensors, n_kv))
    }

    type Metadata = (Vec<(String, MetaValue)>, HashMap<String, usize>);

    /// The key/value section; keys must be unique.
    fn metadata(r: &mut Reader<'_>, n_kv: u64) -> Result<Metadata, GgufError> {
        // The header checked n_kv * MIN_KV_BYTES <= remaining bytes.
        let mut entries = Vec::with_capacity(n_kv as usize);
        let mut index = HashMap::with_capacity(n_kv as usize);
        let mut budget = MAX_META_VALUES;
        for i in 0..n_kv {
            let key = r
                .string()
                .map_err(ctx(|| format!("metadata entry {i}: key")))?;
            let value = (|| {
                let vtype = r.u32().map_err(ctx(|| "value type"))?;
                value(r, vtype, 0, &mut budget)
            })()
            .map_err(ctx(|| format!("metadata key '{key}'")))?;
            if index.insert(key.clone(), entries.len()).is_some() {
                return Err(bad(format!("duplicate metadata key '{key}'")));
            }
            entries.push((key, value));
        }
        Ok((entries, index))
    }

    /// GGUF value type ids, their names and the fewest bytes one value can take.
    fn value_type(vtype: u32) -> Option<(&'static str, u64)> {
        Some(match vtype {
            0 => ("u8", 1),
            1 => ("i8", 1),
            2 => ("u16", 2),
            3 => ("i16", 2),
            4 => ("u32", 4),
            5 => ("i32", 4),
            6 => ("f32", 4),
            7 => ("bool", 1),
            8 => ("string", 8),
            9 => ("array", 12),
            10 => ("u64", 8),
            11 => ("i64", 8),
            12 => ("f64", 8),
            _ => return None,
        })
    }

    /// One value of type `vtype`; `depth` is the number of enclosing arrays.
    fn value(
        r: &mut Reader<'_>,
        vtype: u32,
        depth: usize,
        budget: &mut u64,
    ) -> Result<MetaValue, GgufError> {
        Ok(match vtype {
            0 => MetaValue::U8(u8::from_le_bytes(r.array()?)),
            1 => MetaValue::I8(i8::from_le_bytes(r.array()?)),
            2 => MetaValue::U16(u16::from_le_bytes(r.array()?)),
            3 => MetaValue::I16(i16::from_le_bytes(r.array()?)),
            4 => MetaValue::U32(r.u32()?),
            5 => MetaValue::I32(i32::from_le_bytes(r.array()?)),
            6 => MetaValue::F32(f32::from_le_bytes(r.array()?)),
            7 => match r.array::<1>()?[0] {
                0 => MetaValue::Bool(false),
                1 => MetaValue::Bool(true),
                b => return Err(bad(format!("bool value {b} is neither 0 nor 1"))),
            },
            8 => MetaValue::String(r.string()?),
            9 => array(r, depth + 1, budget)?,
            10 => MetaValue::U64(r.u64()?),
            11 => MetaValue::I64(i64::from_le_bytes(r.array()?)),
            12 => MetaValue::F64(f64::from_le_bytes(r.array()?)),
            t => return Err(bad(format!("unknown value type {t}"))),
        })
    }

    /// An array at nesting `depth` (1 = top level); its length is checked against the bytes
    /// that remain and the value budget before any allocation.
    fn array(r: &mut Reader<'_>, depth: usize, budget: &mut u64) -> Result<MetaValue, GgufError> {
        if depth > MAX_ARRAY_DEPTH {
            return Err(bad(format!(
                "arrays nested deeper than {MAX_ARRAY_DEPTH} levels"
            )));
        }
        let etype = r.u32().map_err(ctx(|| "array element type"))?;
        let n = r.u64().map_err(ctx(|| "array length"))?;
        let (tname, min) =
            value_type(etype).ok_or_else(|| bad(format!("unknown array element type {etype}")))?;
        let rem = r.remaining();
        if n.checked_mul(min).is_none_or(|need| need > rem) {
            return Err(bad(format!(
                "array length {n} of {tname} needs at least {min} bytes each, only {rem} bytes remain"
            )));
        }
        if n > *budget {
            return Err(bad(format!(
                "array length {n} exceeds the limit of {MAX_META_VALUES} metadata values per file"
            )));
        }
        *budget -= n;
        let mut items = Vec::with_capacity(n as usize);
        for i in 0..n {
            items.push(value(r, etype, depth, budget).map_err(ctx(|| format!("element {i}")))?);
        }
        Ok(MetaValue::Array(items))
    }

    /// `general.alignment` if present: an integer that is a nonzero power of two.
    fn alignment(
        metadata: &[(String, MetaValue)],
        index: &HashMap<String, usize>,
    ) -> Result<u64, GgufError> {
        let Some(&i) = index.get("general.alignment") else {
            return Ok(DEFAULT_ALIGNMENT);
        };
        let value = &metadata[i].1;
        if let Some(a) = value.as_u64().filter(|a| a.is_power_of_two()) {
            return Ok(a);
        }
        Err(bad(match value.as_i128() {
            Some(v) => format!("general.alignment must be a nonzero power of two, found {v}"),
            None => format!(
                "general.alignment must be an integer, found a {}",
                value.type_name()
            ),
        }))
    }

    type Tensors = (Vec<TensorInfo>, HashMap<String, usize>);

    /// The tensor info section; names must be unique. Offsets are still relative here.
    fn tensor_infos(r: &mut Reader<'_>, n_tensors: u64) -> Result<Tensors, GgufError> {
        let rem = r.remaining();
        if n_tensors
            .checked_mul(MIN_TENSOR_INFO_BYTES)
            .is_none_or(|need| need > rem)
        {
            return Err(bad(format!(
                "tensor count {n_tensors} needs at least {MIN_TENSOR_INFO_BYTES} bytes each, \
                 only {rem} bytes remain after the metadata"
            )));
        }
        let mut tensors = Vec::with_capacity(n_tensors as usize);
        let mut index = HashMap::with_capacity(n_tensors as usize);
        for i in 0..n_tensors {
            let name = r.string().map_err(ctx(|| format!("tensor {i}: name")))?;
            let info = tensor_info(r, name)?;
            if index.insert(info.name.clone(), tensors.len()).is_some() {
                return Err(bad(format!("duplicate tensor name '{}'", info.name)));
            }
            tensors.push(info);
        }
        Ok((tensors, index))
    }

    /// Dims, type and relative offset of the tensor called `name`.
    fn tensor_info(r: &mut Reader<'_>, name: String) -> Result<TensorInfo, GgufError> {
        let fields = (|| {
            let n_dims = r.u32().map_err(ctx(|| "n_dims"))?;
            if n_dims > MAX_DIMS {
                return Err(bad(format!(
                    "n_dims {n_dims} exceeds the maximum {MAX_DIMS}"
                )));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for d in 0..n_dims {
                dims.push(r.u64().map_err(ctx(|| format!("dim {d}")))?);
            }
            let type_id = r.u32().map_err(ctx(|| "type"))?;
            let offset = r.u64().map_err(ctx(|| "offset"))?;
            Ok((dims, type_id, offset))
        })();
        let (dims, type_id, offset) = fields.map_err(ctx(|| format!("tensor '{name}'")))?;
        Ok(TensorInfo {
            name,
            dims,
            ggml_type: GgmlType::from_id(type_id),
            offset,
            n_bytes: 0,
        })
    }

    /// Turns relative offsets into absolute ones and computes byte sizes, checking that
    /// every tensor is aligned, holds whole blocks, lies inside the file and overlaps none.
    fn place_tensors(
        tensors: &mut [TensorInfo],
        data_offset: u64,
        alignment: u64,
        file_size: u64,
    ) -> Result<(), GgufError> {
        for t in tensors.iter_mut() {
            place_tensor(t, data_offset, alignment, file_size)
                .map_err(ctx(|| format!("tensor '{}'", t.name)))?;
        }
        let mut by_start: Vec<&TensorInfo> = tensors.iter().filter(|t| t.n_bytes > 0).collect();
        by_start.sort_by_key(|t| t.offset);
        for pair in by_start.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            if a.offset + a.n_bytes > b.offset {
                return Err(bad(format!(
                    "tensor '{}' (data {}..{}) overlaps tensor '{}' (data {}..{})",
                    a.name,
                    a.offset,
                    a.offset + a.n_bytes,
                    b.name,
                    b.offset,
                    b.offset + b.n_bytes
                )));
            }
        }
        Ok(())
    }

    fn place_tensor(
        t: &mut TensorInfo,
        data_offset: u64,
        alignment: u64,
        file_size: u64,
    ) -> Result<(), GgufError> {
        let n_elements = t
            .dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .filter(|&n| n <= i64::MAX as u64)
            .ok_or_else(|| bad(format!("dims {:?} overflow the element count", t.dims)))?;
        if !t.offset.is_multiple_of(alignment) {
            return Err(bad(format!(
                "offset {} is not a multiple of the alignment {alignment}",
                t.offset
            )));
        }
        let ty = t.ggml_type;
        t.n_bytes = match ty.block_size() {
            None => 0,
            Some(block) => {
                let ne0 = t.dims.first().copied().unwrap_or(1);
                if !ne0.is_multiple_of(block) {
                    return Err(bad(format!(
                        "row length {ne0} (dim 0) is not a multiple of the {ty} block size {block}"
                    )));
                }
                ty.byte_size(n_elements).map_err(|e| bad(e.to_string()))?
            }
        };
        let start = data_offset.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(t.n_bytes));
        match (start, end) {
            (Some(start), Some(end)) if end <= file_size => {
                t.offset = start;
                Ok(())
            }
            (Some(start), Some(end)) => Err(bad(format!(
                "data range {start}..{end} exceeds file size {file_size}"
            ))),
            _ => Err(bad(format!(
                "data range {data_offset} + {} + {} bytes overflows",
                t.offset, t.n_bytes
            ))),
        }
    }
}
