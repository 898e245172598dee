//! The storage type of GPU weights, activations and the KV cache (a config setting).

use rayon::prelude::*;

/// Storage type of weights, activations and the KV cache. Accumulation is always f32.
/// The config key `gpu_dtype` (`bf16`, the default, or `f32`) sets it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// Serving.
    #[default]
    Bf16,
    /// Exact parity with the CPU reference (tests).
    F32,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::Bf16 => 2,
        }
    }
    /// `data` as this type's little-endian bytes (bf16: round to nearest even).
    pub fn encode(self, data: &[f32]) -> Vec<u8> {
        let mut out = vec![0u8; data.len() * self.size()];
        match self {
            DType::F32 => out
                .par_chunks_mut(4)
                .zip(data.par_iter())
                .for_each(|(o, v)| o.copy_from_slice(&v.to_le_bytes())),
            DType::Bf16 => out
                .par_chunks_mut(2)
                .zip(data.par_iter())
                .for_each(|(o, v)| {
                    o.copy_from_slice(&half::bf16::from_f32(*v).to_bits().to_le_bytes())
                }),
        }
        out
    }

    /// The values of this type's little-endian `bytes`.
    pub fn decode(self, bytes: &[u8]) -> Vec<f32> {
        match self {
            DType::F32 => bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            DType::Bf16 => bytes
                .chunks_exact(2)
                .map(|b| half::bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32())
                .collect(),
        }
    }

    /// The kernel-name suffix of the type (`f32`, `bf16`).
    pub fn suffix(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::Bf16 => "bf16",
        }
    }
}
