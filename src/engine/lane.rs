//! The per-device execution lane: one OS thread that owns the backend, weights, KV pool,
//! scheduler and block manager. Everything else talks to it through bounded channels.
//! The loop is `schedule()` -> `forward(batch)` -> `update(outputs)`.
//! A tensor-parallel lane runs shard 0 on this thread and its other shards on threads of
//! their own (`runner::tp::Peers`), each handed the same plan every step.

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::blocks::BlockPool;
use super::constraint::Grammar;
use super::request::LaneEvent;
use super::scheduler::{Scheduler, SchedulerConfig, SeqId, Sequence, Step};
use super::shards;
use super::stats::LaneStats;
use super::validate::ValidRequest;
use super::{EngineConfig, EngineError};
use crate::backend::{Backend, BackendError};
use crate::model::ModelFiles;
use crate::runner::Llama;
use crate::runner::tp::Peers;

/// Messages into a lane.
pub(crate) enum LaneMsg {
    Submit(Box<NewRequest>),
    /// Stop one choice early (stop string found by the output processor).
    Abort(SeqId),
    Shutdown,
}

/// A request as handed to a lane.
pub(crate) struct NewRequest {
    /// Sequence id of choice 0; choice `c` is `first + c`.
    pub first: SeqId,
    pub req: ValidRequest,
    pub events: mpsc::Sender<LaneEvent>,
    pub arrival: u64,
}

/// What the router reads of a lane without locking its stats: cheap atomics the lane keeps.
#[derive(Debug, Default)]
pub(crate) struct LaneLoad {
    /// Free KV blocks after the last step, less what was routed here since.
    pub free_blocks: AtomicUsize,
    pub healthy: AtomicBool,
    /// When the step in progress began ([`now_ms`]); 0 between steps.
    pub step_since_ms: AtomicU64,
    /// The step in progress has outrun the step timeout (a hung device or collective):
    /// the engine's watchdog failed this lane's requests and the router sends it no more.
    /// Cleared if the step ever returns.
    pub hung: AtomicBool,
    /// Every request routed here and not yet dropped (keyed by its first sequence id): the
    /// watchdog fails them through these when the lane hangs, since the lane cannot.
    pub waiters: Mutex<HashMap<u64, mpsc::WeakSender<LaneEvent>>>,
}

impl LaneLoad {
    /// Declares the lane hung: unhealthy, and every waiting request fails with `err`
    /// (a stream whose buffer is full finds out from [`LaneLoad::hung`] once drained).
    pub(crate) fn declare_hung(&self, err: &EngineError) {
        self.healthy.store(false, Ordering::Relaxed);
        self.hung.store(true, Ordering::Release);
        let waiters: Vec<_> = self.waiters.lock().expect("waiters lock").drain().collect();
        for (_, w) in waiters {
            if let Some(tx) = w.upgrade() {
                let _ = tx.try_send(LaneEvent::Failed(err.clone()));
            }
        }
    }
}

/// Milliseconds since the first call in this process, plus one (0 means "no step").
pub(crate) fn now_ms() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1
}

/// Sizes reported by a lane once it is ready.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LaneReady {
    pub num_blocks: usize,
}

struct Lane<'scope, B: Backend> {
    backend: B,
    model: Llama<B>,
    kv: B::Kv,
    /// Shards 1..N of a tensor-parallel lane (this thread runs shard 0).
    peers: Option<Peers<'scope>>,
    sched: Scheduler,
    rx: mpsc::Receiver<LaneMsg>,
    stats: Arc<Mutex<LaneStats>>,
    load: Arc<LaneLoad>,
    index: usize,
    stall_timeout: Duration,
}

/// Everything a lane thread needs besides its backend.
pub(crate) struct LaneCtx {
    pub files: Arc<ModelFiles>,
    pub cfg: EngineConfig,
    pub max_len: usize,
    pub index: usize,
    pub rx: mpsc::Receiver<LaneMsg>,
    pub stats: Arc<Mutex<LaneStats>>,
    pub load: Arc<LaneLoad>,
    pub ready: std::sync::mpsc::SyncSender<Result<LaneReady, EngineError>>,
}

/// A backend constructor run on the thread of the shard it serves.
pub(crate) type Maker<B> = Box<dyn FnOnce() -> Result<B, BackendError> + Send>;

/// Runs a lane on the current thread: builds the backend, loads the model, reports
/// readiness through `ctx.ready`, then serves until shutdown.
pub(crate) fn run<B: Backend>(make: impl FnOnce() -> Result<B, BackendError>, ctx: LaneCtx) {
    run_sharded(make, Vec::<Maker<B>>::new(), ctx)
}

/// [`run`] for a tensor-parallel lane: `makers[0]` builds shard 0's backend here, the others
/// each build theirs on a thread of their own (`cfg.tensor_parallel_size` in all).
pub(crate) fn run_group<B: Backend>(mut makers: Vec<Maker<B>>, ctx: LaneCtx) {
    if makers.is_empty() {
        let _ = ctx
            .ready
            .send(Err(EngineError::Load("a lane needs a backend".into())));
        return;
    }
    let lead = makers.remove(0);
    run_sharded(lead, makers, ctx)
}

fn run_sharded<B, F>(make: impl FnOnce() -> Result<B, BackendError>, peers: Vec<F>, ctx: LaneCtx)
where
    B: Backend,
    F: FnOnce() -> Result<B, BackendError> + Send,
{
    let LaneCtx {
        files,
        cfg,
        max_len,
        index,
        rx,
        stats,
        load,
        ready,
    } = ctx;
    std::thread::scope(|scope| {
        let built = shards::load(scope, make, peers, &files, &cfg, max_len, index);
        let (backend, model, kv, peers, num_blocks) = match built {
            Ok(l) => l,
            Err(e) => {
                let _ = ready.send(Err(EngineError::Load(e.to_string())));
                return;
            }
        };
        let sched_cfg = SchedulerConfig {
            max_num_seqs: cfg.max_num_seqs,
            max_num_batched_tokens: cfg.batched_tokens(),
            block_size: cfg.block_size,
            window: files.spec.variant.kv_window(files.spec.n_layers),
        };
        let sched = Scheduler::new(
            sched_cfg,
            BlockPool::new(num_blocks, cfg.enable_prefix_caching),
        );
        {
            let mut st = stats.lock().expect("stats lock");
            st.device = backend.name();
            st.healthy = true;
            st.kv_total_blocks = num_blocks;
            st.kv_free_blocks = num_blocks;
            load.healthy.store(true, Ordering::Relaxed);
        }
        let lane = Lane {
            backend,
            model,
            kv,
            peers,
            sched,
            rx,
            stats,
            load,
            index,
            stall_timeout: Duration::from_secs_f64(cfg.stream_stall_timeout_s.clamp(0.001, 1e9)),
        };
        serve_lane(lane, ready, files);
    })
}

/// Reports the lane ready and serves until shutdown.
fn serve_lane<B: Backend>(
    mut lane: Lane<'_, B>,
    ready: std::sync::mpsc::SyncSender<Result<LaneReady, EngineError>>,
    files: std::sync::Arc<ModelFiles>,
) {
    let _ = ready.send(Ok(LaneReady {
        num_blocks: lane.sched.pool().num_blocks(),
    }));
    drop(files);
    lane.publish_idle();
    // A panic anywhere in the loop leaves the lane's state unknown: it reports itself
    // unhealthy and fails what it holds and everything sent to it afterwards.
    if let Err(panic) = catch_unwind(AssertUnwindSafe(|| lane.serve())) {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        lane.die(&what);
    }
}

impl<B: Backend> Lane<'_, B> {
    fn serve(&mut self) {
        loop {
            if self.sched.is_idle() {
                match self.rx.blocking_recv() {
                    Some(msg) => {
                        if !self.handle(msg) {
                            return;
                        }
                    }
                    None => return,
                }
            }
            while let Ok(msg) = self.rx.try_recv() {
                if !self.handle(msg) {
                    return;
                }
            }
            self.drop_abandoned();
            self.abort_stalled();
            if let Some(step) = self.sched.schedule() {
                let t0 = Instant::now();
                let prefill = step.seqs.iter().any(|s| s.num_tokens > 1);
                self.load.step_since_ms.store(now_ms(), Ordering::Release);
                let result = self.step(&step);
                self.load.step_since_ms.store(0, Ordering::Release);
                if self.load.hung.swap(false, Ordering::AcqRel) {
                    tracing::warn!(
                        lane = self.index,
                        secs = t0.elapsed().as_secs_f64(),
                        "a step declared hung has returned; the lane serves again"
                    );
                }
                match result {
                    // A step that succeeds after a failure makes the lane healthy again.
                    Ok(()) => self.set_healthy(true),
                    Err(e) => self.fail_all(e),
                }
                self.publish(&step, prefill, t0.elapsed().as_secs_f64());
            } else {
                self.publish_idle();
                if !self.sched.is_idle() {
                    // Every held sequence waits for its client to read: poll again shortly.
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
    }

    fn set_healthy(&self, healthy: bool) {
        self.stats.lock().expect("stats lock").healthy = healthy;
        self.load.healthy.store(healthy, Ordering::Relaxed);
    }

    /// After a panic: unhealthy for good; fails every held and every later request.
    fn die(&mut self, what: &str) {
        tracing::error!(lane = self.index, panic = %what, "lane panicked; it serves no more");
        if let Some(p) = &self.peers {
            p.abort();
        }
        let err = EngineError::LaneFailed {
            lane: self.index,
            // The panic's own text (a file, a line, internal state) stays in the log above.
            message: "the lane panicked; the server log has the cause".into(),
        };
        if let Ok(mut st) = self.stats.lock() {
            st.healthy = false;
        }
        self.load.healthy.store(false, Ordering::Relaxed);
        let _ = catch_unwind(AssertUnwindSafe(|| {
            for id in self.sched.ids() {
                self.fail_one(id, err.clone());
            }
        }));
        while let Some(msg) = self.rx.blocking_recv() {
            match msg {
                LaneMsg::Submit(r) => {
                    let _ = r.events.try_send(LaneEvent::Failed(err.clone()));
                }
                LaneMsg::Abort(_) => {}
                LaneMsg::Shutdown => return,
            }
        }
    }

    /// Aborts requests whose stream buffer has been full for the stall timeout (their blocks
    /// are freed; the client sees `Stalled`). Requests with a full buffer pause, and give their
    /// seats and blocks back while others wait (`Scheduler::schedule`).
    fn abort_stalled(&mut self) {
        let now = Instant::now();
        let stalled: Vec<SeqId> = self
            .sched
            .sequences()
            .filter(|s| {
                s.request
                    .paused_for(now)
                    .is_some_and(|d| d >= self.stall_timeout)
            })
            .map(|s| s.id)
            .collect();
        let idle_s = self.stall_timeout.as_secs_f64();
        for id in stalled {
            self.fail_one(id, EngineError::Stalled { idle_s });
        }
    }

    /// Applies one message; `false` means shut down.
    fn handle(&mut self, msg: LaneMsg) -> bool {
        match msg {
            LaneMsg::Shutdown => {
                for id in self.sched.ids() {
                    self.fail_one(id, EngineError::ShuttingDown);
                }
                false
            }
            LaneMsg::Abort(id) => {
                self.sched.remove(id);
                true
            }
            LaneMsg::Submit(r) => {
                let NewRequest {
                    first,
                    req,
                    events,
                    arrival,
                } = *r;
                let (prompt, request, priority) = req.into_lane(events);
                let request = std::rc::Rc::new(request);
                for c in 0..request.n {
                    let id = SeqId(first.0 + c as u64);
                    let after = (c > 0).then_some(first);
                    self.sched.add(Sequence::new(
                        id,
                        prompt.clone(),
                        request.clone(),
                        c,
                        (priority, arrival),
                        after,
                    ));
                }
                true
            }
        }
    }

    /// Frees every sequence whose client has gone away.
    fn drop_abandoned(&mut self) {
        let gone: Vec<SeqId> = self
            .sched
            .sequences()
            .filter(|s| s.request.is_abandoned())
            .map(|s| s.id)
            .collect();
        for id in gone {
            self.sched.remove(id);
        }
    }

    /// `schedule()` -> forward + sample -> `update()`; the lane only turns outputs into events.
    fn step(&mut self, step: &Step) -> Result<(), BackendError> {
        let now = Instant::now();
        for s in self.sched.running() {
            // A request's first step is its first choice's first chunk (the others wait for
            // its prompt), which starts right after the cached prefix the scheduler found.
            s.request.mark_scheduled(now, s.num_computed);
        }
        // The token masks of constrained rows are computed on the rayon pool's long-lived
        // threads while the device runs the forward on this one; the sampler needs them only
        // afterwards (the scope waits for them, and a panic there resumes here).
        let grammars = self.sched.grammars_to_mask(step);
        let (model, backend, kv) = (&mut self.model, &mut self.backend, &mut self.kv);
        let peers = self.peers.as_ref();
        rayon::in_place_scope(|scope| {
            if !grammars.is_empty() {
                scope.spawn(|_| compute_masks(grammars));
            }
            match peers {
                Some(p) => p.step(&step.plan, || model.forward(backend, kv, &step.plan)),
                None => model.forward(backend, kv, &step.plan),
            }
            .map(drop)
        })?;
        if self.sched.wants_hidden(step) {
            // Embeddings: the final-norm rows of the logits rows, downloaded to be pooled.
            let rows = step.plan.num_logits_rows();
            let hidden = self.backend.to_host(self.model.hidden_rows(), rows)?;
            self.sched
                .pool_hidden(step, &hidden, self.model.spec.hidden);
        }
        let logits = self.model.logits();
        let sampled = self.backend.sample(logits, &self.sched.sample_rows(step))?;
        for out in self.sched.update(step, sampled) {
            out.emit();
        }
        Ok(())
    }

    /// Ends one sequence with an error event (one per request) and frees it.
    fn fail_one(&mut self, id: SeqId, e: EngineError) {
        if let Some(seq) = self.sched.get(id) {
            seq.request.fail(e);
        }
        self.sched.remove(id);
    }

    /// A device or model error: fail every request of this lane, free everything, keep serving.
    fn fail_all(&mut self, e: BackendError) {
        tracing::error!(device = %self.backend.name(), error = %e, "lane step failed");
        let lane_err = EngineError::LaneFailed {
            lane: self.index,
            message: e.to_string(),
        };
        if !matches!(e, BackendError::InvalidBatch(_)) {
            self.set_healthy(false);
        }
        for id in self.sched.ids() {
            self.fail_one(id, lane_err.clone());
        }
    }

    fn publish(&mut self, step: &Step, prefill: bool, secs: f64) {
        let kernels = match self.backend.take_kernel_timings() {
            Ok(k) => k,
            Err(e) => {
                tracing::warn!(error = %e, "reading kernel timings failed");
                Vec::new()
            }
        };
        let mut st = self.stats.lock().expect("stats lock");
        st.steps += 1;
        st.tokens_computed += step.plan.num_tokens() as u64;
        if prefill {
            st.prefill_step_seconds += secs
        } else {
            st.decode_step_seconds += secs
        }
        let phase = if prefill { "prefill" } else { "decode" };
        st.step_durations.entry(phase).or_default().observe(secs);
        for (kernel, secs) in kernels {
            st.kernel_durations.entry(kernel).or_default().observe(secs);
        }
        drop(st);
        self.publish_idle();
    }

    fn publish_idle(&self) {
        let mut st = self.stats.lock().expect("stats lock");
        st.running = self.sched.num_running();
        st.waiting = self.sched.num_waiting();
        st.kv_free_blocks = self.sched.pool().num_free();
        self.load
            .free_blocks
            .store(st.kv_free_blocks, Ordering::Relaxed);
        st.prefix_cache_queries = self.sched.counters.prefix_queries;
        st.prefix_cache_hits = self.sched.counters.prefix_hits;
        st.preemptions = self.sched.counters.preemptions;
    }
}

/// Each grammar's mask for its next token, on the rayon pool when there are several.
fn compute_masks(mut grammars: Vec<&mut Grammar>) {
    use rayon::prelude::*;
    if grammars.len() == 1 {
        grammars[0].compute_mask();
    } else {
        grammars.par_iter_mut().for_each(|g| g.compute_mask());
    }
}
