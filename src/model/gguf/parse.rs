//! The parser proper: a bounds-checked cursor and the three sections of the header.

use std::collections::HashMap;

use super::value::{
    DEFAULT_ALIGNMENT, GgufError, MAX_ARRAY_DEPTH, MAX_DIMS, MAX_META_VALUES, MetaValue, TensorInfo,
};
use crate::backend::quant::GgmlType;

const MAGIC: &[u8; 4] = b"GGUF";
/// Smallest encoding of one metadata entry: key length, value type, a 1-byte value.
const MIN_KV_BYTES: u64 = 8 + 4 + 1;
/// Smallest encoding of one tensor info: name length, n_dims, type, offset.
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 4 + 8;

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
