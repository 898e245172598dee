//! The per-device execution lane: one OS thread that owns the backend, weights, KV pool,
//! scheduler and block manager. Everything else talks to it through bounded channels.
//! The loop is `schedule()` -> `forward(batch)` -> `update(outputs)`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::mpsc;

use super::blocks::BlockPool;
use super::scheduler::{Scheduler, SchedulerConfig, SeqId, Sequence, Step};
use super::stats::LaneStats;
use super::{EngineConfig, EngineError, FinishReason, GenerateRequest, TokenInfo};
use crate::backend::{Backend, BackendError, KvShape};
use crate::model::ModelFiles;
use crate::runner::{Llama, LoadError};
use crate::sampling::{SampleRow, SamplingParams, uniform};

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
    pub req: GenerateRequest,
    pub seed: u64,
    /// Token ids that end a choice (EOS unless ignored, plus the request's stop ids).
    pub stop_ids: Vec<u32>,
    pub events: mpsc::Sender<LaneEvent>,
    pub arrival: u64,
}

/// Events from a lane to one request's output processor.
#[derive(Debug)]
pub(crate) enum LaneEvent {
    /// The request got its first step.
    Scheduled {
        at: Instant,
    },
    Token {
        choice: usize,
        info: TokenInfo,
        finish: Option<FinishReason>,
    },
    Failed(EngineError),
}

/// What the lane knows about a running choice beyond the scheduler's view.
struct SeqRt {
    choice: usize,
    req: Arc<ReqRt>,
}

struct ReqRt {
    params: SamplingParams,
    max_tokens: usize,
    stop_ids: Vec<u32>,
    seed: u64,
    events: mpsc::Sender<LaneEvent>,
    scheduled: std::sync::atomic::AtomicBool,
}

/// Sizes reported by a lane once it is ready.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LaneReady {
    pub num_blocks: usize,
}

/// KV blocks for a lane: `kv_blocks` if set, else what `budget_bytes` holds (K and V of
/// `elem_bytes` each),
/// capped at what `max_num_seqs` full-length sequences could use.
pub(crate) fn kv_blocks(
    files: &ModelFiles,
    cfg: &EngineConfig,
    max_len: usize,
    budget_bytes: usize,
    elem_bytes: usize,
) -> usize {
    if let Some(n) = cfg.kv_blocks {
        return n;
    }
    let s = &files.spec;
    let per_block = 2 * s.n_layers * cfg.block_size * s.kv_dim() * elem_bytes;
    let cap = cfg.max_num_seqs * max_len.div_ceil(cfg.block_size);
    (budget_bytes / per_block.max(1)).min(cap).max(1)
}

struct Lane<B: Backend> {
    backend: B,
    model: Llama<B>,
    kv: B::Kv,
    sched: Scheduler,
    seqs: HashMap<SeqId, SeqRt>,
    rx: mpsc::Receiver<LaneMsg>,
    stats: Arc<Mutex<LaneStats>>,
    max_len: usize,
    index: usize,
}

/// Everything a lane thread needs besides its backend.
pub(crate) struct LaneCtx {
    pub files: Arc<ModelFiles>,
    pub cfg: EngineConfig,
    pub max_len: usize,
    pub index: usize,
    pub rx: mpsc::Receiver<LaneMsg>,
    pub stats: Arc<Mutex<LaneStats>>,
    pub ready: std::sync::mpsc::SyncSender<Result<LaneReady, EngineError>>,
}

/// Runs a lane on the current thread: builds the backend, loads the model, reports
/// readiness through `ctx.ready`, then serves until shutdown.
pub(crate) fn run<B: Backend>(make: impl FnOnce() -> Result<B, BackendError>, ctx: LaneCtx) {
    let LaneCtx {
        files,
        cfg,
        max_len,
        index,
        rx,
        stats,
        ready,
    } = ctx;
    let built = (|| -> Result<Lane<B>, LoadError> {
        let mut backend = make()?;
        let model = Llama::load(
            &mut backend,
            &files,
            cfg.max_num_batched_tokens,
            cfg.max_num_seqs,
        )?;
        // After the weights and scratch: a GPU reports what is left of its memory budget.
        let budget = backend
            .kv_budget_bytes(cfg.gpu_memory_utilization)
            .unwrap_or(cfg.cpu_kv_cache_bytes);
        let num_blocks = kv_blocks(&files, &cfg, max_len, budget, backend.kv_element_bytes());
        let s = &files.spec;
        let shape = KvShape {
            num_layers: s.n_layers,
            num_blocks,
            block_size: cfg.block_size,
            n_kv_heads: s.n_kv_heads,
            head_dim: s.head_dim,
        };
        let kv = backend.alloc_kv(&shape)?;
        let sched_cfg = SchedulerConfig {
            max_num_seqs: cfg.max_num_seqs,
            max_num_batched_tokens: cfg.max_num_batched_tokens,
            block_size: cfg.block_size,
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
        }
        Ok(Lane {
            backend,
            model,
            kv,
            sched,
            seqs: HashMap::new(),
            rx,
            stats,
            max_len,
            index,
        })
    })();
    let mut lane = match built {
        Ok(l) => l,
        Err(e) => {
            let _ = ready.send(Err(EngineError::Load(e.to_string())));
            return;
        }
    };
    let _ = ready.send(Ok(LaneReady {
        num_blocks: lane.sched.pool().num_blocks(),
    }));
    drop(files);
    lane.serve();
}

impl<B: Backend> Lane<B> {
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
            if let Some(step) = self.sched.schedule() {
                let t0 = Instant::now();
                let prefill = step.seqs.iter().any(|s| s.num_tokens > 1);
                match self.step(&step) {
                    // A step that succeeds after a failure makes the lane healthy again.
                    Ok(()) => self.stats.lock().expect("stats lock").healthy = true,
                    Err(e) => self.fail_all(e),
                }
                self.publish(&step, prefill, t0.elapsed().as_secs_f64());
            } else {
                self.publish_idle();
            }
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
                self.finish(id);
                true
            }
            LaneMsg::Submit(r) => {
                let rt = Arc::new(ReqRt {
                    params: r.req.params.clone(),
                    max_tokens: r.req.max_tokens,
                    stop_ids: r.stop_ids,
                    seed: r.seed,
                    events: r.events,
                    scheduled: false.into(),
                });
                for c in 0..r.req.n {
                    let id = SeqId(r.first.0 + c as u64);
                    let after = (c > 0).then_some(r.first);
                    self.sched.add(Sequence::new(
                        id,
                        r.req.prompt_ids.clone(),
                        r.req.priority,
                        r.arrival,
                        after,
                    ));
                    self.seqs.insert(
                        id,
                        SeqRt {
                            choice: c,
                            req: rt.clone(),
                        },
                    );
                }
                true
            }
        }
    }

    fn finish(&mut self, id: SeqId) {
        self.sched.remove(id);
        self.seqs.remove(&id);
    }

    /// Frees every sequence whose client has gone away.
    fn drop_abandoned(&mut self) {
        let gone: Vec<SeqId> = self
            .seqs
            .iter()
            .filter(|(_, rt)| rt.req.events.is_closed())
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            self.finish(id);
        }
    }

    fn step(&mut self, step: &Step) -> Result<(), BackendError> {
        let now = Instant::now();
        for p in &step.seqs {
            let rt = &self.seqs[&p.id].req;
            if !rt
                .scheduled
                .swap(true, std::sync::atomic::Ordering::Relaxed)
            {
                let _ = rt.events.try_send(LaneEvent::Scheduled { at: now });
            }
        }
        let logits = self
            .model
            .forward(&mut self.backend, &mut self.kv, &step.plan)?;
        self.sched.on_computed(step);
        let sampling: Vec<SeqId> = step
            .seqs
            .iter()
            .filter(|p| p.wants_logits)
            .map(|p| p.id)
            .collect();
        let sampled = {
            let mut rows = Vec::with_capacity(sampling.len());
            for id in &sampling {
                let seq = self.sched.get(*id).expect("scheduled sequence is held");
                let req = &self.seqs[id].req;
                rows.push(SampleRow {
                    params: &req.params,
                    uniform: uniform(
                        req.seed ^ self.seqs[id].choice as u64,
                        seq.output().len() as u64,
                    ),
                    prompt: &seq.tokens[..seq.prompt_len],
                    output: seq.output(),
                });
            }
            self.backend.sample(logits, &rows)?
        };
        for (id, s) in sampling.into_iter().zip(sampled) {
            self.sched.push_token(id, s.token);
            let seq = self.sched.get(id).expect("held");
            let rt = &self.seqs[&id];
            let finish = if rt.req.stop_ids.contains(&s.token) {
                Some(FinishReason::Stop)
            } else if seq.output().len() >= rt.req.max_tokens || seq.tokens.len() >= self.max_len {
                Some(FinishReason::Length)
            } else {
                None
            };
            let info = TokenInfo {
                id: s.token,
                logprob: s.logprob,
                top: s.top,
            };
            let _ = rt.req.events.try_send(LaneEvent::Token {
                choice: rt.choice,
                info,
                finish,
            });
            if finish.is_some() {
                self.finish(id);
            }
        }
        Ok(())
    }

    /// A device or model error: fail every request of this lane, free everything, keep serving.
    /// Ends one sequence with an error event.
    fn fail_one(&mut self, id: SeqId, e: EngineError) {
        if let Some(rt) = self.seqs.get(&id) {
            let _ = rt.req.events.try_send(LaneEvent::Failed(e));
        }
        self.finish(id);
    }

    fn fail_all(&mut self, e: BackendError) {
        tracing::error!(device = %self.backend.name(), error = %e, "lane step failed");
        let lane_err = EngineError::LaneFailed {
            lane: self.index,
            message: e.to_string(),
        };
        if !matches!(e, BackendError::InvalidBatch(_)) {
            self.stats.lock().expect("stats lock").healthy = false;
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
        st.prefix_cache_queries = self.sched.counters.prefix_queries;
        st.prefix_cache_hits = self.sched.counters.prefix_hits;
        st.preemptions = self.sched.counters.preemptions;
    }
}
