//! Loading a lane's model: the whole of it on one backend, or shard 0 here and shards 1..N
//! on threads of their own (tensor parallelism), then one KV pool per shard, all of the same
//! block count (the fewest any shard's memory budget holds).

use std::thread::Scope;

use super::EngineConfig;
use crate::backend::{Backend, BackendError, HostGroup, KvShape};
use crate::model::{ModelError, ModelFiles, ModelSpec};
use crate::runner::tp::{Peers, ShardSizing, ShardSource, load_shard};
use crate::runner::{Llama, LoadError, Shard, load_weights, shard};

/// What a lane's shard 0 holds once loaded: its backend, model and KV pool, the other
/// shards, and the pool's block count.
pub(super) type Loaded<'scope, B> = (
    B,
    Llama<B>,
    <B as Backend>::Kv,
    Option<Peers<'scope>>,
    usize,
);

fn spec_err(e: String) -> LoadError {
    LoadError::Model(ModelError::Spec(e))
}

/// Builds shard 0's backend with `make` (here) and one peer per maker of `peers` (on
/// threads of `scope`), loads every shard and sizes and allocates the KV pools.
pub(super) fn load<'scope, 'env, B, F>(
    scope: &'scope Scope<'scope, 'env>,
    make: impl FnOnce() -> Result<B, BackendError>,
    peers: Vec<F>,
    files: &ModelFiles,
    cfg: &EngineConfig,
    max_len: usize,
    index: usize,
) -> Result<Loaded<'scope, B>, LoadError>
where
    B: Backend,
    F: FnOnce() -> Result<B, BackendError> + Send + 'scope,
{
    let tp = cfg.tensor_parallel_size.max(1);
    if peers.len() + 1 != tp {
        return Err(spec_err(format!(
            "tensor parallel size {tp} needs {tp} backends for the lane, it has {}",
            peers.len() + 1
        )));
    }
    let t0 = std::time::Instant::now();
    let (mut backend, model, peers, sizes) = if tp == 1 {
        let mut backend = make()?;
        let backend_s = t0.elapsed().as_secs_f64();
        let t1 = std::time::Instant::now();
        let model = Llama::load(&mut backend, files, cfg.batched_tokens(), cfg.max_num_seqs)?;
        tracing::info!(
            lane = index,
            backend_s,
            weights_s = t1.elapsed().as_secs_f64(),
            "start-up: backend opened, weights loaded"
        );
        let size = ShardSizing::of(&backend, cfg.gpu_memory_utilization);
        (backend, model, None, vec![size])
    } else {
        load_group(scope, make, peers, files, cfg)?
    };
    // After the weights and scratch: a GPU reports what is left of its memory
    // budget; the CPU's budget is shared by the lane's shards.
    let local = shard::shard_spec(&files.spec, Shard { rank: 0, size: tp });
    let (blocks, budget) = sizes
        .iter()
        .map(|z| {
            let budget = z.kv_budget.unwrap_or(cfg.cpu_kv_cache_bytes / tp);
            let blocks = kv_blocks(&local, cfg, max_len, budget, z.kv_element_bytes);
            (blocks, budget)
        })
        .min()
        .unwrap_or((1, 0));
    let shape = KvShape {
        num_layers: local.n_layers,
        num_blocks: blocks,
        block_size: cfg.block_size,
        n_kv_heads: local.n_kv_heads,
        head_dim: local.head_dim,
    };
    let t2 = std::time::Instant::now();
    let kv = backend.alloc_kv(&shape)?;
    let kv_s = t2.elapsed().as_secs_f64();
    if let Some(p) = &peers {
        p.alloc_kv(shape).map_err(spec_err)?;
    }
    let elem = backend.kv_element_bytes();
    let pool_bytes = 2 * local.n_layers * blocks * cfg.block_size * local.kv_dim() * elem;
    tracing::info!(
        lane = index,
        device = %backend.name(),
        tensor_parallel = tp,
        blocks,
        tokens = blocks * cfg.block_size,
        bytes = pool_bytes,
        budget_bytes = budget,
        alloc_s = kv_s,
        lane_s = t0.elapsed().as_secs_f64(),
        "KV pool sized from the model and the memory budget (per shard)"
    );
    Ok((backend, model, kv, peers, blocks))
}

/// Loads a tensor-parallel group: the peers on their threads, shard 0 here, from the
/// model's host weights read once. Returns shard 0 and the sizing of every shard.
#[allow(clippy::type_complexity)]
fn load_group<'scope, 'env, B, F>(
    scope: &'scope Scope<'scope, 'env>,
    make: impl FnOnce() -> Result<B, BackendError>,
    makers: Vec<F>,
    files: &ModelFiles,
    cfg: &EngineConfig,
) -> Result<(B, Llama<B>, Option<Peers<'scope>>, Vec<ShardSizing>), LoadError>
where
    B: Backend,
    F: FnOnce() -> Result<B, BackendError> + Send + 'scope,
{
    let tp = makers.len() + 1;
    shard::check(&files.spec, tp).map_err(ModelError::Spec)?;
    let host = load_weights(files, Ok::<_, ModelError>)?;
    let src = ShardSource {
        spec: files.spec.clone(),
        host: std::sync::Arc::new(host),
        max_tokens: cfg.batched_tokens(),
        max_seqs: cfg.max_num_seqs,
        utilization: cfg.gpu_memory_utilization,
    };
    let group = HostGroup::new(tp);
    let peers = Peers::spawn(scope, makers, &group, &src).map_err(spec_err)?;
    let member = group.members().remove(0);
    let lead = load_shard(make, member, &src);
    drop(src);
    // Shard 0's own failure first, else the first peer's.
    let (backend, model) = lead?;
    let mut sizes = vec![ShardSizing::of(&backend, cfg.gpu_memory_utilization)];
    sizes.extend(peers.loaded().map_err(spec_err)?);
    Ok((backend, model, Some(peers), sizes))
}

/// KV blocks for a lane: `kv_blocks` if set, else what `budget_bytes` holds (K and V of
/// `elem_bytes` each, for the kv heads of `spec`, a shard's when sharded),
/// capped at what `max_num_seqs` full-length sequences could use.
fn kv_blocks(
    spec: &ModelSpec,
    cfg: &EngineConfig,
    max_len: usize,
    budget_bytes: usize,
    elem_bytes: usize,
) -> usize {
    if let Some(n) = cfg.kv_blocks {
        return n;
    }
    let s = spec;
    let per_block = 2 * s.n_layers * cfg.block_size * s.kv_dim() * elem_bytes;
    let cap = cfg.max_num_seqs * max_len.div_ceil(cfg.block_size);
    (budget_bytes / per_block.max(1)).min(cap).max(1)
}
