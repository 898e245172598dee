//! Head sizes with attention instantiations of their own: one dimension of the attention
//! sources' compile units (as [`QType`](crate::backend::gpu::qtype::QType) is of the
//! quantized ones), with the decode pass sizes a GQA group launches.

/// Head sizes with a dedicated attention instantiation; `Any` takes any size up to 256.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AttnHead {
    D64,
    D80,
    D96,
    D128,
    D256,
    Any,
}

impl AttnHead {
    /// Largest head size the generic variant handles.
    pub const MAX_ANY: usize = 256;

    pub fn for_head_dim(d: usize) -> AttnHead {
        match d {
            64 => AttnHead::D64,
            80 => AttnHead::D80,
            96 => AttnHead::D96,
            128 => AttnHead::D128,
            256 => AttnHead::D256,
            _ => AttnHead::Any,
        }
    }
    /// Whether the head size has a tensor-core variant (`Kernel::AttentionTc`).
    pub fn has_tc(self) -> bool {
        matches!(
            self,
            AttnHead::D64 | AttnHead::D80 | AttnHead::D96 | AttnHead::D128
        )
    }
    /// Whether the head size has a decode variant (`Kernel::AttentionDecode`).
    pub fn has_decode(self) -> bool {
        matches!(self, AttnHead::D64 | AttnHead::D128 | AttnHead::D256)
    }
    /// Query vectors per pass of the decode variant, largest last (head size 256: at most
    /// 4, whose registers fit).
    pub fn decode_sizes(self) -> &'static [u32] {
        match self {
            AttnHead::D256 => &[1, 2, 4],
            _ => &[1, 2, 4, 8],
        }
    }
    /// The decode variant's pass size for items of at most `vectors` query vectors (rows
    /// times the GQA group): the smallest of [`AttnHead::decode_sizes`] that holds them, or
    /// `None` where none does (such items take the tensor-core or the portable variant).
    pub fn decode_pass(self, vectors: usize) -> Option<u32> {
        self.decode_sizes()
            .iter()
            .copied()
            .find(|&q| q as usize >= vectors)
    }
    /// The decode pass sizes a model whose KV heads each serve `group` query heads can
    /// launch: an item of `r` rows has `r * group` query vectors, so a pass smaller than the
    /// group never runs (Llama-3-8B, group 4, runs passes of 4 and 8 only).
    pub fn decode_passes(self, group: usize) -> Vec<u32> {
        let mut v: Vec<u32> = (1..)
            .map(|rows: usize| rows.saturating_mul(group.max(1)))
            .map_while(|vectors| self.decode_pass(vectors))
            .collect();
        v.dedup();
        v
    }
    /// Query vectors per pass the variant is instantiated for, largest last.
    pub fn group_sizes(self) -> &'static [u32] {
        &[1, 4, 8]
    }
    pub(crate) fn tag(self) -> &'static str {
        match self {
            AttnHead::D64 => "64",
            AttnHead::D80 => "80",
            AttnHead::D96 => "96",
            AttnHead::D128 => "128",
            AttnHead::D256 => "256",
            AttnHead::Any => "any",
        }
    }
}
