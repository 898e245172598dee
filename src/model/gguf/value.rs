//! The GGUF format's values: metadata values, tensor infos, errors and the reader's bounds.

use crate::backend::quant::GgmlType;

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
    pub(super) fn as_i128(&self) -> Option<i128> {
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
