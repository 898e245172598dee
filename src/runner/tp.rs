//! A tensor-parallel lane's shards 1..N: one thread each, every one owning its backend, its
//! part of the weights ([`Llama::load_shard`]) and of the KV pool. Rank 0 runs on the lane's
//! own thread; each step the lane hands every peer the same plan, runs rank 0's forward,
//! and collects the peers' results. The shards meet in the backend's collectives
//! ([`Backend::all_reduce_sum`], [`Backend::all_gather`]); sampling stays on rank 0.
//!
//! The threads are scoped to the lane (`std::thread::scope`), so a backend need not be
//! `'static`. A shard that fails breaks the group ([`HostGroup::abort`]) so no other shard
//! waits forever in a collective; the group is mended once every shard has reported.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::{Scope, ScopedJoinHandle};

use super::{Llama, LoadError, Shard};
use crate::backend::collective::is_aborted;
use crate::backend::{
    Backend, BackendError, BatchPlan, GroupMember, HostGroup, HostTensor, KvShape,
};
use crate::model::ModelSpec;

use super::weights::ModelWeights;

/// What a loaded shard reports for sizing the lane's KV pool.
#[derive(Debug, Clone, Copy)]
pub struct ShardSizing {
    /// [`Backend::kv_budget_bytes`] of the shard's device.
    pub kv_budget: Option<usize>,
    /// [`Backend::kv_element_bytes`].
    pub kv_element_bytes: usize,
}

impl ShardSizing {
    /// The sizing of a loaded backend.
    pub fn of<B: Backend>(backend: &B, utilization: f32) -> ShardSizing {
        ShardSizing {
            kv_budget: backend.kv_budget_bytes(utilization),
            kv_element_bytes: backend.kv_element_bytes(),
        }
    }
}

/// Everything a shard loads from: the whole model's host weights and spec, the scratch
/// capacity, and the memory fraction its KV budget is reported for.
#[derive(Clone)]
pub struct ShardSource {
    pub spec: ModelSpec,
    pub host: Arc<ModelWeights<HostTensor>>,
    pub max_tokens: usize,
    pub max_seqs: usize,
    pub utilization: f32,
}

/// Builds a backend, joins it to `member`'s group and loads the member's shard.
pub fn load_shard<B: Backend>(
    make: impl FnOnce() -> Result<B, BackendError>,
    member: GroupMember,
    src: &ShardSource,
) -> Result<(B, Llama<B>), LoadError> {
    let shard = Shard {
        rank: member.rank,
        size: member.size,
    };
    // A shard that cannot open its device or join releases the others from the group's
    // barriers (e.g. rank 0's id exchange) instead of leaving them waiting.
    let group = member.group().clone();
    let joined = make().and_then(|mut backend| {
        if shard.size > 1 {
            backend.join_group(member)?;
        }
        Ok(backend)
    });
    let mut backend = joined.inspect_err(|_| group.abort())?;
    let model = Llama::load_shard(
        &mut backend,
        &src.spec,
        &src.host,
        shard,
        src.max_tokens,
        src.max_seqs,
    )?;
    Ok((backend, model))
}

enum Cmd {
    Kv(KvShape),
    Step(Arc<BatchPlan>),
}

enum Reply {
    Loaded(Result<ShardSizing, String>),
    Ready(Result<(), String>),
    Stepped(Result<(), BackendError>),
}

struct Peer<'scope> {
    tx: Option<Sender<Cmd>>,
    rx: Receiver<Reply>,
    _thread: ScopedJoinHandle<'scope, ()>,
}

/// Ranks 1..N of a lane, each on its own scoped thread.
pub struct Peers<'scope> {
    peers: Vec<Peer<'scope>>,
    group: Arc<HostGroup>,
}

fn gone(rank: usize) -> BackendError {
    BackendError::Device {
        op: "tensor parallel shard",
        message: format!("shard {rank} has stopped"),
    }
}

impl<'scope> Peers<'scope> {
    /// Starts one thread per maker (ranks 1, 2, ... of `group`), each loading its shard of
    /// `src`. Use [`Peers::loaded`] to wait for them.
    pub fn spawn<'env, B, F>(
        scope: &'scope Scope<'scope, 'env>,
        makers: Vec<F>,
        group: &Arc<HostGroup>,
        src: &ShardSource,
    ) -> Result<Peers<'scope>, String>
    where
        B: Backend,
        F: FnOnce() -> Result<B, BackendError> + Send + 'scope,
    {
        let members = group.members();
        let mut peers = Vec::with_capacity(makers.len());
        for (make, member) in makers.into_iter().zip(members.into_iter().skip(1)) {
            let (cmd_tx, cmd_rx) = channel();
            let (reply_tx, reply_rx) = channel();
            let src = src.clone();
            let thread = std::thread::Builder::new()
                .name(format!("kiln-shard-{}", member.rank))
                .spawn_scoped(scope, move || {
                    serve_peer(make, member, src, cmd_rx, reply_tx)
                })
                .map_err(|e| format!("cannot start a shard thread: {e}"))?;
            peers.push(Peer {
                tx: Some(cmd_tx),
                rx: reply_rx,
                _thread: thread,
            });
        }
        Ok(Peers {
            peers,
            group: group.clone(),
        })
    }

    /// Waits until every peer has loaded; their sizing in rank order (ranks 1..N).
    pub fn loaded(&self) -> Result<Vec<ShardSizing>, String> {
        self.peers
            .iter()
            .enumerate()
            .map(|(i, p)| match p.rx.recv() {
                Ok(Reply::Loaded(r)) => r.map_err(|e| format!("shard {}: {e}", i + 1)),
                _ => Err(format!("shard {} stopped while loading", i + 1)),
            })
            .collect()
    }

    /// Allocates every peer's KV pool of `shape` and waits for them.
    pub fn alloc_kv(&self, shape: KvShape) -> Result<(), String> {
        for (i, p) in self.peers.iter().enumerate() {
            let sent =
                p.tx.as_ref()
                    .is_some_and(|tx| tx.send(Cmd::Kv(shape)).is_ok());
            let reply = sent.then(|| p.rx.recv().ok()).flatten();
            match reply {
                Some(Reply::Ready(Ok(()))) => {}
                Some(Reply::Ready(Err(e))) => return Err(format!("shard {}: {e}", i + 1)),
                _ => return Err(format!("shard {} stopped before its KV pool", i + 1)),
            }
        }
        Ok(())
    }

    /// Runs one step on every shard: hands the peers `plan`, runs rank 0's `lead` here,
    /// then waits for the peers. On failure the cause is returned (not another shard's
    /// report that the group broke); the group is mended afterwards.
    pub fn step<T>(
        &self,
        plan: &BatchPlan,
        lead: impl FnOnce() -> Result<T, BackendError>,
    ) -> Result<T, BackendError> {
        let plan = Arc::new(plan.clone());
        let mut errors = Vec::new();
        let mut sent = Vec::with_capacity(self.peers.len());
        for (i, p) in self.peers.iter().enumerate() {
            let ok =
                p.tx.as_ref()
                    .is_some_and(|tx| tx.send(Cmd::Step(plan.clone())).is_ok());
            sent.push(ok);
            if !ok {
                errors.push(gone(i + 1));
            }
        }
        // A missing peer would leave the others waiting in the first collective.
        let mut value = None;
        if errors.is_empty() {
            match lead() {
                Ok(t) => value = Some(t),
                Err(e) => errors.push(e),
            }
        }
        if !errors.is_empty() {
            self.group.abort();
        }
        for (i, p) in self.peers.iter().enumerate().filter(|(i, _)| sent[*i]) {
            match p.rx.recv() {
                Ok(Reply::Stepped(Ok(()))) => {}
                Ok(Reply::Stepped(Err(e))) => errors.push(e),
                _ => errors.push(gone(i + 1)),
            }
        }
        self.group.reset();
        let cause = errors.iter().position(|e| !is_aborted(e)).unwrap_or(0);
        match (value, errors.is_empty()) {
            (Some(t), true) => Ok(t),
            _ if errors.is_empty() => Err(gone(0)),
            _ => Err(errors.swap_remove(cause)),
        }
    }

    /// Breaks the group: a shard waiting in a collective returns an error.
    pub fn abort(&self) {
        self.group.abort();
    }
}

impl Drop for Peers<'_> {
    fn drop(&mut self) {
        self.group.abort();
        for p in &mut self.peers {
            p.tx = None;
        }
    }
}

/// A peer thread: loads its shard, reports, allocates its KV pool, then runs the forward of
/// every plan it is sent until the lane drops its channel.
fn serve_peer<B: Backend>(
    make: impl FnOnce() -> Result<B, BackendError>,
    member: GroupMember,
    src: ShardSource,
    rx: Receiver<Cmd>,
    tx: Sender<Reply>,
) {
    let loaded = load_shard(make, member.clone(), &src);
    let utilization = src.utilization;
    // The host weights are no longer needed here.
    drop(src);
    let (mut backend, mut model) = match loaded {
        Ok(l) => l,
        Err(e) => {
            let _ = tx.send(Reply::Loaded(Err(e.to_string())));
            return;
        }
    };
    let _ = tx.send(Reply::Loaded(Ok(ShardSizing::of(&backend, utilization))));
    let Ok(Cmd::Kv(shape)) = rx.recv() else {
        return;
    };
    let mut kv = match backend.alloc_kv(&shape) {
        Ok(kv) => kv,
        Err(e) => {
            let _ = tx.send(Reply::Ready(Err(e.to_string())));
            return;
        }
    };
    let _ = tx.send(Reply::Ready(Ok(())));
    while let Ok(Cmd::Step(plan)) = rx.recv() {
        let run = catch_unwind(AssertUnwindSafe(|| {
            model.forward(&mut backend, &mut kv, &plan).map(|_| ())
        }));
        let result = run.unwrap_or_else(|_| {
            Err(BackendError::Device {
                op: "tensor parallel shard",
                message: format!("shard {} panicked", member.rank),
            })
        });
        if result.is_err() {
            member.abort();
        }
        if tx.send(Reply::Stepped(result)).is_err() {
            return;
        }
    }
}
