//! Tensors on the host on their way to a backend, typed by weight type: plain f32 values or
//! a file's own elements (f16, bf16, GGUF quantized blocks) as the file stores them.

use super::quant::{self, GgmlType, QuantError};

/// What a [`HostTensor`] holds.
#[derive(Debug, Clone, PartialEq)]
pub enum HostData {
    /// Plain values.
    F32(Vec<f32>),
    /// Row-major little-endian elements or blocks of `ty` (never `F32`: that is `F32` above),
    /// exactly as a model file stores them; rows hold whole blocks.
    Raw { ty: GgmlType, bytes: Vec<u8> },
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
        let n = shape.iter().product::<usize>() as u64;
        let cols = *shape.last().unwrap_or(&1) as u64;
        let block = ty.block_size().ok_or(QuantError::Unsupported(ty))?;
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

    /// The weight type of the elements.
    pub fn weight_type(&self) -> GgmlType {
        match &self.data {
            HostData::F32(_) => GgmlType::F32,
            HostData::Raw { ty, .. } => *ty,
        }
    }

    /// The values, when the tensor holds plain f32.
    pub fn values(&self) -> Option<&[f32]> {
        match &self.data {
            HostData::F32(v) => Some(v),
            HostData::Raw { .. } => None,
        }
    }

    /// The tensor as plain f32 values (dequantizing raw data).
    pub fn into_f32(self) -> Result<HostTensor, QuantError> {
        match self.data {
            HostData::F32(_) => Ok(self),
            HostData::Raw { ty, bytes } => {
                let n = self.shape.iter().product::<usize>() as u64;
                let values = quant::dequantize_to_vec(ty, &bytes, n)?;
                Ok(HostTensor::new(self.shape, values))
            }
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

    /// Stacks matrices with equal column counts along rows. Parts of one weight type stay of
    /// that type (their rows hold whole blocks); mixed parts are stacked as f32.
    pub fn concat_rows(parts: Vec<HostTensor>) -> Result<HostTensor, QuantError> {
        let cols = parts.first().map_or(0, HostTensor::cols);
        let rows = parts.iter().map(HostTensor::rows).sum();
        let ty = parts.first().map_or(GgmlType::F32, HostTensor::weight_type);
        let same = parts.iter().all(|p| p.weight_type() == ty);
        if same && ty != GgmlType::F32 {
            let mut bytes = Vec::new();
            for p in parts {
                debug_assert_eq!(p.cols(), cols);
                if let HostData::Raw { bytes: b, .. } = p.data {
                    bytes.extend_from_slice(&b);
                }
            }
            return HostTensor::raw(vec![rows, cols], ty, bytes);
        }
        let mut data = Vec::with_capacity(rows * cols);
        for p in parts {
            debug_assert_eq!(p.cols(), cols);
            if let HostData::F32(v) = p.into_f32()?.data {
                data.extend_from_slice(&v);
            }
        }
        Ok(HostTensor::new(vec![rows, cols], data))
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
            (ab.weight_type(), ab.shape.clone()),
            (GgmlType::F16, vec![2, 4])
        );
        let f = ab.into_f32().unwrap();
        assert_eq!(
            f.values().unwrap(),
            &[1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0]
        );
        let mixed = HostTensor::concat_rows(vec![a, HostTensor::new(vec![1, 4], vec![3.0; 4])]);
        assert_eq!(mixed.unwrap().values().unwrap()[4..], [3.0; 4]);
    }
}
