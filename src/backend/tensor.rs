//! Tensors on the host on their way to a backend, typed by weight type: plain f32 values or
//! a file's own elements (f16, bf16, GGUF quantized blocks) as the file stores them.

use std::ops::{Deref, Range};
use std::sync::Arc;

use super::quant::{self, GgmlType, QuantError};

/// Read-only bytes shared with their owner (a model file's mapping or an owned buffer):
/// cloning and slicing copy nothing, so weights can stay in the mapped file.
#[derive(Clone)]
pub struct SharedBytes {
    owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
    range: Range<usize>,
}

impl SharedBytes {
    /// `range` of `owner`'s bytes; `None` when the range is not inside them.
    pub fn new(owner: Arc<dyn AsRef<[u8]> + Send + Sync>, range: Range<usize>) -> Option<Self> {
        let len = (*owner).as_ref().len();
        (range.start <= range.end && range.end <= len).then_some(Self { owner, range })
    }

    /// The bytes `range` of these bytes, sharing the owner; `None` when out of range.
    pub fn slice(&self, range: Range<usize>) -> Option<Self> {
        let start = self.range.start.checked_add(range.start)?;
        let end = self.range.start.checked_add(range.end)?;
        (range.start <= range.end && end <= self.range.end).then(|| Self {
            owner: self.owner.clone(),
            range: start..end,
        })
    }

    /// Owns `bytes`.
    pub fn from_vec(bytes: Vec<u8>) -> Self {
        let range = 0..bytes.len();
        Self {
            owner: Arc::new(bytes),
            range,
        }
    }
}

impl Deref for SharedBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &(*self.owner).as_ref()[self.range.clone()]
    }
}

impl PartialEq for SharedBytes {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl std::fmt::Debug for SharedBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SharedBytes({} bytes)", self.len())
    }
}

/// What a [`HostTensor`] holds.
#[derive(Debug, Clone, PartialEq)]
pub enum HostData {
    /// Plain values.
    F32(Vec<f32>),
    /// Row-major little-endian elements or blocks of `ty` (never `F32`: that is `F32` above),
    /// exactly as a model file stores them (often borrowed from its mapping); rows hold
    /// whole blocks.
    Raw { ty: GgmlType, bytes: SharedBytes },
    /// Matrices with equal column counts stacked along rows (fused projections), each part
    /// kept in its own type and storage: no copy, and mixed types (Q4_K over Q6_K) stay
    /// quantized.
    Stacked(Vec<HostTensor>),
}

/// A row-major tensor on the host.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    /// `[rows, cols]` for matrices, `[len]` for vectors.
    pub shape: Vec<usize>,
    pub data: HostData,
}

impl HostTensor {
    /// An f32 tensor; `data.len()` must equal the product of `shape`.
    pub fn new(shape: Vec<usize>, data: Vec<f32>) -> Self {
        debug_assert_eq!(shape.iter().product::<usize>(), data.len());
        Self {
            shape,
            data: HostData::F32(data),
        }
    }

    /// A tensor of `ty`'s raw bytes; the byte count must match the shape and each row must
    /// hold whole blocks.
    pub fn raw(shape: Vec<usize>, ty: GgmlType, bytes: Vec<u8>) -> Result<Self, QuantError> {
        Self::raw_shared(shape, ty, SharedBytes::from_vec(bytes))
    }

    /// The tensor with its raw bytes copied into memory of its own (a part of a stack
    /// likewise): nothing of it reads a model file's mapping any more, so a file truncated
    /// or replaced on disk cannot fault (SIGBUS) its reader.
    pub fn into_owned(self) -> Self {
        let data = match self.data {
            HostData::Raw { ty, bytes } => HostData::Raw {
                ty,
                bytes: SharedBytes::from_vec(bytes.to_vec()),
            },
            HostData::Stacked(parts) => {
                HostData::Stacked(parts.into_iter().map(Self::into_owned).collect())
            }
            f32s => f32s,
        };
        Self {
            shape: self.shape,
            data,
        }
    }

    /// [`HostTensor::raw`] on shared bytes (a model file's mapping): nothing is copied
    /// unless `ty` is `F32`, whose values are read into a vector.
    pub fn raw_shared(
        shape: Vec<usize>,
        ty: GgmlType,
        bytes: SharedBytes,
    ) -> Result<Self, QuantError> {
        let n = shape.iter().product::<usize>() as u64;
        let cols = *shape.last().unwrap_or(&1) as u64;
        let block = ty.block_size().ok_or(QuantError::Unsupported(ty))?;
        if !ty.is_supported() {
            return Err(QuantError::Unsupported(ty));
        }
        if !cols.is_multiple_of(block) {
            return Err(QuantError::PartialBlock {
                ty,
                n_elements: cols,
                block,
            });
        }
        let expected = ty.byte_size(n)?;
        if expected != bytes.len() as u64 {
            return Err(QuantError::ByteCount {
                ty,
                n_elements: n,
                expected,
                got: bytes.len() as u64,
            });
        }
        if ty == GgmlType::F32 {
            let values = quant::dequantize_to_vec(ty, &bytes, n)?;
            return Ok(Self::new(shape, values));
        }
        Ok(Self {
            shape,
            data: HostData::Raw { ty, bytes },
        })
    }

    /// The weight type of the elements (of the first part, for a stack).
    pub fn weight_type(&self) -> GgmlType {
        match &self.data {
            HostData::F32(_) => GgmlType::F32,
            HostData::Raw { ty, .. } => *ty,
            HostData::Stacked(parts) => parts.first().map_or(GgmlType::F32, Self::weight_type),
        }
    }

    /// A short description of the weight types: `Q4_K` or, for a mixed stack, `Q4_K+Q6_K`.
    pub fn type_label(&self) -> String {
        match &self.data {
            HostData::Stacked(parts) => {
                let mut names: Vec<&str> = parts.iter().map(|p| p.weight_type().name()).collect();
                names.dedup();
                names.join("+")
            }
            _ => self.weight_type().to_string(),
        }
    }

    /// Bytes the data takes on the host (shared bytes counted at their size).
    pub fn byte_len(&self) -> usize {
        match &self.data {
            HostData::F32(v) => v.len() * 4,
            HostData::Raw { bytes, .. } => bytes.len(),
            HostData::Stacked(parts) => parts.iter().map(Self::byte_len).sum(),
        }
    }

    /// The values, when the tensor holds plain f32.
    pub fn values(&self) -> Option<&[f32]> {
        match &self.data {
            HostData::F32(v) => Some(v),
            _ => None,
        }
    }

    /// The tensor as plain f32 values (dequantizing raw data, concatenating stacks).
    pub fn into_f32(self) -> Result<HostTensor, QuantError> {
        match self.data {
            HostData::F32(_) => Ok(self),
            HostData::Raw { ty, bytes } => {
                let n = self.shape.iter().product::<usize>() as u64;
                let values = quant::dequantize_to_vec(ty, &bytes, n)?;
                Ok(HostTensor::new(self.shape, values))
            }
            HostData::Stacked(parts) => {
                let mut data = Vec::with_capacity(self.shape.iter().product());
                for p in parts {
                    if let HostData::F32(v) = p.into_f32()?.data {
                        data.extend_from_slice(&v);
                    }
                }
                Ok(HostTensor::new(self.shape, data))
            }
        }
    }

    /// A stack whose parts all hold blocks of one quantized type, as one raw tensor: the
    /// parts' bytes copied once into one buffer (row-major stacks of one type concatenate
    /// exactly). Experts stored one tensor each, and a tensor-parallel shard's rows of every
    /// expert, arrive as such stacks; a device keeps the result as one matrix of the type.
    /// Anything else (plain types, which a device stacks as it uploads them; mixed types)
    /// comes back unchanged.
    pub fn joined(self) -> HostTensor {
        let HostData::Stacked(parts) = &self.data else {
            return self;
        };
        let ty = match parts.first().map(|p| &p.data) {
            Some(HostData::Raw { ty, .. }) if ty.block_size().is_some_and(|b| b > 1) => *ty,
            _ => return self,
        };
        if !parts
            .iter()
            .all(|p| matches!(&p.data, HostData::Raw { ty: t, .. } if *t == ty))
        {
            return self;
        }
        let mut bytes = Vec::with_capacity(self.byte_len());
        for p in parts {
            if let HostData::Raw { bytes: b, .. } = &p.data {
                bytes.extend_from_slice(b);
            }
        }
        HostTensor {
            shape: self.shape,
            data: HostData::Raw {
                ty,
                bytes: SharedBytes::from_vec(bytes),
            },
        }
    }

    /// Number of rows (first dim) of a matrix, or 1 for a vector.
    pub fn rows(&self) -> usize {
        if self.shape.len() == 2 {
            self.shape[0]
        } else {
            1
        }
    }

    /// Number of columns (last dim).
    pub fn cols(&self) -> usize {
        *self.shape.last().unwrap_or(&0)
    }

    /// Stacks matrices with equal column counts along rows. Plain f32 parts are
    /// concatenated; otherwise the parts are kept as they are ([`HostData::Stacked`]).
    pub fn concat_rows(parts: Vec<HostTensor>) -> Result<HostTensor, QuantError> {
        let cols = parts.first().map_or(0, HostTensor::cols);
        let rows = parts.iter().map(HostTensor::rows).sum();
        debug_assert!(parts.iter().all(|p| p.cols() == cols));
        if parts.iter().all(|p| p.values().is_some()) {
            let mut data = Vec::with_capacity(rows * cols);
            for p in &parts {
                data.extend_from_slice(p.values().unwrap_or_default());
            }
            return Ok(HostTensor::new(vec![rows, cols], data));
        }
        let mut flat = Vec::with_capacity(parts.len());
        for p in parts {
            match p.data {
                HostData::Stacked(inner) => flat.extend(inner),
                _ => flat.push(p),
            }
        }
        Ok(HostTensor {
            shape: vec![rows, cols],
            data: HostData::Stacked(flat),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_tensors_check_sizes_and_stack_by_type() {
        let half = |v: f32| half::f16::from_f32(v).to_le_bytes();
        let row = |v: f32| (0..4).flat_map(|_| half(v)).collect::<Vec<u8>>();
        let a = HostTensor::raw(vec![1, 4], GgmlType::F16, row(1.0)).unwrap();
        let b = HostTensor::raw(vec![1, 4], GgmlType::F16, row(2.0)).unwrap();
        assert!(HostTensor::raw(vec![1, 4], GgmlType::F16, vec![0; 6]).is_err());
        let ab = HostTensor::concat_rows(vec![a.clone(), b]).unwrap();
        assert_eq!(
            (ab.weight_type(), ab.shape.clone(), ab.byte_len()),
            (GgmlType::F16, vec![2, 4], 16)
        );
        assert!(matches!(&ab.data, HostData::Stacked(p) if p.len() == 2));
        let f = ab.clone().into_f32().unwrap();
        assert_eq!(
            f.values().unwrap(),
            &[1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0]
        );
        assert_eq!(ab.clone().joined(), ab, "plain parts stay parts");
        // Q8_0 rows of one block (an f16 scale, 32 int8): joined into one raw tensor.
        let q8 = |scale: f32, q: i8| {
            let mut b = half(scale)[..2].to_vec();
            b.extend((0..32).map(|i| (q + i as i8) as u8));
            HostTensor::raw(vec![1, 32], GgmlType::Q8_0, b).unwrap()
        };
        let qs = HostTensor::concat_rows(vec![q8(0.5, -3), q8(2.0, 1), q8(0.25, -20)]).unwrap();
        let joined = qs.clone().joined();
        assert_eq!(
            (
                joined.shape.clone(),
                joined.weight_type(),
                joined.byte_len()
            ),
            (vec![3, 32], GgmlType::Q8_0, 3 * 34)
        );
        assert!(matches!(&joined.data, HostData::Raw { .. }));
        assert_eq!(joined.into_f32().unwrap(), qs.into_f32().unwrap());
        let mixed = HostTensor::concat_rows(vec![a, HostTensor::new(vec![1, 4], vec![3.0; 4])]);
        let mixed = mixed.unwrap();
        assert!(
            matches!(mixed.clone().joined().data, HostData::Stacked(_)),
            "mixed types stay parts"
        );
        assert_eq!(mixed.type_label(), "F16+F32");
        assert_eq!(mixed.into_f32().unwrap().values().unwrap()[4..], [3.0; 4]);
        let plain = HostTensor::concat_rows(vec![
            HostTensor::new(vec![1, 2], vec![1.0, 2.0]),
            HostTensor::new(vec![1, 2], vec![3.0, 4.0]),
        ]);
        assert_eq!(plain.unwrap().values().unwrap(), &[1.0, 2.0, 3.0, 4.0]);
        let owner: Arc<dyn AsRef<[u8]> + Send + Sync> = Arc::new(vec![1u8, 2, 3]);
        assert!(SharedBytes::new(owner.clone(), 1..4).is_none());
        assert_eq!(&*SharedBytes::new(owner, 1..3).unwrap(), &[2, 3]);
    }
}
