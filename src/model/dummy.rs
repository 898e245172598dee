//! Dummy weights of one weight type at real sizes, for benchmarks of models no file here
//! holds (a Llama-3-70B shape in bf16 is 141 GB): every matrix is the leading bytes of one
//! shared pool of valid random elements of its type, so making a model costs neither host
//! memory nor time. Speed does not depend on the values; only their type and size count.

use std::sync::Mutex;

use rayon::prelude::*;

use super::ModelError;
use super::source::TensorSource;
use crate::backend::HostTensor;
use crate::backend::quant::GgmlType;
use crate::backend::tensor::SharedBytes;

/// Dummy matrices of type `ty` (bf16, or quantized blocks with small valid scales; a
/// matrix whose rows do not fill whole blocks of `ty` is bf16), norm weights 1, other
/// vectors 0. Every matrix shares the pool's bytes, so matrices of one model hold the
/// same leading values.
pub struct PooledDummy {
    ty: GgmlType,
    /// The pool of each type made so far (grown by replacing it; tensors keep theirs).
    pools: Mutex<Vec<(GgmlType, SharedBytes)>>,
}

impl PooledDummy {
    /// Matrices in `ty` (BF16, F16, Q8_0, Q4_0, Q4_K, Q6_K).
    pub fn new(ty: GgmlType) -> Result<Self, ModelError> {
        match ty {
            GgmlType::BF16
            | GgmlType::F16
            | GgmlType::Q8_0
            | GgmlType::Q4_0
            | GgmlType::Q4K
            | GgmlType::Q6K => Ok(Self {
                ty,
                pools: Mutex::new(Vec::new()),
            }),
            other => Err(ModelError::Format(format!(
                "dummy weights of type {other} are not made"
            ))),
        }
    }

    /// At least `len` bytes of valid `ty` elements (whole blocks from offset 0).
    fn pool(&self, ty: GgmlType, len: usize) -> SharedBytes {
        let mut pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, p)) = pools.iter().find(|(t, p)| *t == ty && p.len() >= len) {
            return p.slice(0..len).expect("inside the pool");
        }
        let bytes = SharedBytes::from_vec(random_elements(ty, len, 0x9e37_79b9_7f4a_7c15));
        pools.retain(|(t, _)| *t != ty);
        pools.push((ty, bytes.clone()));
        bytes
    }
}

/// Fills `out` with xorshift bytes seeded by `salt`, in parallel.
fn random_bytes(out: &mut [u8], salt: u64) {
    out.par_chunks_mut(1 << 16)
        .enumerate()
        .for_each(|(c, chunk)| {
            let mut x = salt ^ (c as u64 + 1).wrapping_mul(0xd1b5_4a32_d192_ed03);
            for o in chunk.chunks_mut(8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                o.copy_from_slice(&x.to_le_bytes()[..o.len()]);
            }
        });
}

/// `len` bytes (whole blocks) of valid elements of `ty`, drawn from `salt`: bf16 / f16
/// values of magnitude 2^-7..2^-4 with random signs; quantized blocks with random quants
/// and small scales (the benchmarks' random weights too).
pub fn random_elements(ty: GgmlType, len: usize, salt: u64) -> Vec<u8> {
    let mut v = vec![0u8; len];
    random_bytes(&mut v, salt);
    let f16 = |x: f32| half::f16::from_f32(x).to_le_bytes();
    let block = ty.block_bytes().unwrap_or(1) as usize;
    v.par_chunks_exact_mut(block.max(2)).for_each(|b| match ty {
        // Sign and 7 mantissa bits random, exponent 120..=123.
        GgmlType::BF16 => {
            let r = u16::from_le_bytes([b[0], b[1]]);
            let bits = (r & 0x807f) | ((120 + ((r >> 7) & 3)) << 7);
            b.copy_from_slice(&bits.to_le_bytes());
        }
        // Sign and 10 mantissa bits random, exponent 8..=11 (2^-7..2^-4).
        GgmlType::F16 => {
            let r = u16::from_le_bytes([b[0], b[1]]);
            let bits = (r & 0x83ff) | ((8 + ((r >> 10) & 3)) << 10);
            b.copy_from_slice(&bits.to_le_bytes());
        }
        GgmlType::Q8_0 => b[..2].copy_from_slice(&f16(0.002)),
        GgmlType::Q4_0 => b[..2].copy_from_slice(&f16(0.002)),
        GgmlType::Q4K => {
            b[..2].copy_from_slice(&f16(0.001));
            b[2..4].copy_from_slice(&f16(0.001));
        }
        GgmlType::Q6K => b[208..210].copy_from_slice(&f16(0.0002)),
        _ => {}
    });
    v
}

impl TensorSource for PooledDummy {
    /// Its type, and BF16 for matrices whose rows are not whole blocks of it.
    fn weight_types(&self) -> Option<Vec<GgmlType>> {
        Some(vec![self.ty, GgmlType::BF16, GgmlType::F32])
    }

    fn fetch(&self, name: &str, shape: &[usize]) -> Result<Option<Vec<f32>>, ModelError> {
        match self.fetch_host(name, shape)? {
            Some(t) => Ok(t.into_f32()?.values().map(<[f32]>::to_vec)),
            None => Ok(None),
        }
    }

    fn fetch_host(&self, name: &str, shape: &[usize]) -> Result<Option<HostTensor>, ModelError> {
        let n: usize = shape.iter().product();
        if shape.len() < 2 || name.ends_with("norm.weight") || name.ends_with(".bias") {
            let v = if name.ends_with("norm.weight") {
                1.0
            } else {
                0.0
            };
            return Ok(Some(HostTensor::new(shape.to_vec(), vec![v; n])));
        }
        let cols = *shape.last().unwrap_or(&1) as u64;
        let block = self.ty.block_size().unwrap_or(1);
        let ty = match cols.is_multiple_of(block) {
            true => self.ty,
            false => GgmlType::BF16,
        };
        let len = ty.byte_size(n as u64)? as usize;
        let t = HostTensor::raw_shared(shape.to_vec(), ty, self.pool(ty, len))?;
        Ok(Some(t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooled_matrices_are_finite_and_of_the_asked_type() {
        for ty in [GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4K] {
            let src = PooledDummy::new(ty).unwrap();
            let w = src
                .fetch_host("blk.0.attn_q.weight", &[4, 512])
                .unwrap()
                .unwrap();
            assert_eq!(w.weight_type(), ty);
            let v = w.into_f32().unwrap();
            let v = v.values().unwrap();
            assert!(v.iter().all(|x| x.is_finite() && x.abs() < 1.0), "{ty}");
            assert!(v.iter().any(|x| *x != 0.0), "{ty}");
            // A bigger matrix grows the pool; a smaller one shares its leading bytes.
            let big = src
                .fetch_host("token_embd.weight", &[64, 512])
                .unwrap()
                .unwrap();
            assert_eq!(big.shape, vec![64, 512]);
            let norm = src
                .fetch_host("blk.0.attn_norm.weight", &[512])
                .unwrap()
                .unwrap();
            assert_eq!(norm.values().unwrap(), &[1.0; 512][..]);
        }
        // Rows that do not fill whole blocks fall back to bf16.
        let q4k = PooledDummy::new(GgmlType::Q4K).unwrap();
        let odd = q4k
            .fetch_host("blk.0.ffn_down.weight", &[8, 96])
            .unwrap()
            .unwrap();
        assert_eq!(odd.weight_type(), GgmlType::BF16);
        assert!(PooledDummy::new(GgmlType::F32).is_err());
    }
}
