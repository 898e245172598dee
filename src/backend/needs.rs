//! What a model runs, as a backend sees it: the facts a device backend plans its start-up
//! around (which kernels it waits for before the first step), with no model files and no
//! GPU compile plan in sight. `runner::model_needs` derives it from the spec and the
//! weights' source; the GPU backend turns it into its own kernel plan.

use super::quant::GgmlType;

/// The kernels a model will launch, by what they depend on. `Default` (every field its
/// widest value) needs everything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelNeeds {
    /// The model has mixture-of-experts layers: start-up waits for their kernels too (else
    /// they compile at the lowest CPU priority and load on first use).
    pub moe: bool,
    /// The types of the model's matrices: start-up waits only for these types' quantized
    /// kernels, and for the float-weight streaming matmuls only where one is a float type
    /// (the others compile at the lowest priority and load on first use). `None`: every
    /// type.
    pub weight_types: Option<Vec<GgmlType>>,
    /// The model's attention has q/k head norms: start-up waits for the rope that applies
    /// them (else it compiles on first use).
    pub qk_norm: bool,
    /// The model's attention head sizes, likewise for the attention kernels. `None`: all.
    pub head_dims: Option<Vec<usize>>,
    /// Query heads per KV head of one shard's attention: start-up waits only for the decode
    /// attention pass sizes that group can launch. `None`: all.
    pub gqa_group: Option<usize>,
}

impl Default for ModelNeeds {
    fn default() -> Self {
        Self {
            moe: true,
            weight_types: None,
            qk_norm: true,
            head_dims: None,
            gqa_group: None,
        }
    }
}
