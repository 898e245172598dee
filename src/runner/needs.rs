//! What the backend must be ready to run for a model: derived here, where the spec and the
//! backend meet, so the engine hands the backend a [`ModelNeeds`] without looking inside
//! either.

use super::shard::{Shard, shard_spec};
use crate::backend::ModelNeeds;
use crate::model::{ModelSpec, TensorSource};

/// The needs of shard `shard` of the model of `spec` whose weights come from `source`:
/// its matrices' types, whether it has experts and q/k norms, its head size and (one
/// shard's) query heads per KV head.
pub fn model_needs(spec: &ModelSpec, source: &dyn TensorSource, shard: Shard) -> ModelNeeds {
    // Every shard of a group has the same heads (`runner::shard`).
    let local = shard_spec(spec, shard);
    ModelNeeds {
        moe: spec.variant.moe.is_some(),
        weight_types: source.weight_types(),
        qk_norm: spec.variant.qk_norm,
        head_dims: Some(vec![spec.head_dim]),
        gqa_group: Some(local.n_heads / local.n_kv_heads.max(1)),
    }
}
