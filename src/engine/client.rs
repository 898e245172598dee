//! The engine's front door: starts lanes, routes requests to the lane with the most free
//! KV blocks, and hands back a stream of events per request.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::thread::JoinHandle;
use std::time::Duration;

use futures_util::Stream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

use super::constraint::Compiler;
use super::hung_error;
use super::lane::{self, LaneLoad, LaneMsg, NewRequest};
use super::output::OutputProcessor;
use super::request::{LaneEvent, step_events};
use super::scheduler::SeqId;
use super::validate::{self, Bounds, MAX_CHOICES, ValidRequest};
use super::{
    Constraint, Device, EmbedHandle, EmbedRequest, EngineConfig, EngineError, EngineStats,
    GenerateRequest, LaneStats, StreamEvent,
};
use crate::backend::{BackendError, DeviceId, GpuOptions};
use crate::model::{ModelFiles, ModelSpec, PendingTokenizer, Pooling};
use crate::tokenizer::Tokenizer;

struct LaneHandle {
    tx: mpsc::Sender<LaneMsg>,
    stats: Arc<Mutex<LaneStats>>,
    /// Free blocks and health, read by the router without locking the stats.
    load: Arc<LaneLoad>,
    num_blocks: usize,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// A step running longer than this is a hung lane (`None`: never).
    step_timeout: Option<Duration>,
}

struct Shared {
    lanes: Vec<LaneHandle>,
    tokenizer: Option<Arc<Tokenizer>>,
    spec: ModelSpec,
    name: String,
    cfg: EngineConfig,
    bounds: Bounds,
    /// One permit per sequence admitted and not yet finished (held by its response
    /// stream): the seats of every lane plus `max_waiting`.
    admission: Arc<Semaphore>,
    permits: usize,
    next_id: AtomicU64,
    /// Turns of the router: among lanes equally loaded, each request starts its preference
    /// one lane further, so requests routed at the same moment (before either one's blocks
    /// are counted, or while a lane republishes its pool) still spread.
    route_turn: AtomicUsize,
    /// Compiles constraints on threads of its own; the token trie and compiled grammars.
    compiler: Arc<Compiler>,
}

/// A running engine; dropping it stops the lanes.
pub struct Engine {
    client: EngineClient,
}

/// A cheap, clonable handle for submitting requests.
#[derive(Clone)]
pub struct EngineClient {
    shared: Arc<Shared>,
}

/// The body of a lane thread: builds its backend and runs the lane.
type LaneBody = Box<dyn FnOnce(lane::LaneCtx) + Send>;

/// The lane body for `device`: the backend comes from `backend::open_group` (a clear error
/// for backends not compiled in), one per shard of the lane's tensor-parallel group, with
/// GPU options from the engine config.
fn device_body(device: Device) -> LaneBody {
    /// Runs a lane on the opened backends.
    struct RunLane(lane::LaneCtx);
    impl crate::backend::WithBackends for RunLane {
        type Output = ();
        fn run<B: crate::backend::Backend + 'static>(self, makers: Vec<crate::backend::Maker<B>>) {
            lane::run_group(makers, self.0)
        }
    }
    let id = match device {
        Device::Cpu => DeviceId::Cpu,
        Device::Cuda(i) => DeviceId::Cuda(i),
        Device::Rocm(i) => DeviceId::Rocm(i),
    };
    Box::new(move |mut ctx: lane::LaneCtx| {
        if ctx.cfg.max_num_batched_tokens.is_none() {
            let memory = crate::backend::total_memory(id);
            let tokens = EngineConfig::default_batched_tokens(memory);
            tracing::info!(
                lane = ctx.index,
                memory_bytes = memory,
                max_num_batched_tokens = tokens,
                "start-up: tokens per step by the device's memory"
            );
            ctx.cfg.max_num_batched_tokens = Some(tokens);
        }
        let c = &ctx.cfg;
        let tp = c.tensor_parallel_size.max(1);
        let shard = crate::runner::Shard { rank: 0, size: tp };
        let opts = GpuOptions {
            dtype: c.gpu_dtype,
            kernel_cache: c.kernel_cache_dir.clone(),
            timing_period: (c.kernel_timing_period > 0).then_some(c.kernel_timing_period),
            gemv: c.gpu_gemv,
            attn_decode: c.gpu_attn_decode,
            needs: crate::runner::model_needs(&ctx.files.spec, &*ctx.files.source, shard),
            tuning: c.gpu_tuning.clone(),
            ..GpuOptions::default()
        };
        let group = vec![id; tp];
        crate::backend::open_group(&group, opts, RunLane(ctx))
    })
}

type ReadyRx = std::sync::mpsc::Receiver<Result<lane::LaneReady, EngineError>>;

/// The step timeout of the lane labelled `label`: `step_timeout_s` when set (0: none), else
/// [`DEFAULT_STEP_TIMEOUT_S`] for device lanes and none for CPU lanes (a long prompt on a
/// large model can legitimately take minutes a step there).
fn step_timeout(cfg: &EngineConfig, label: &str) -> Option<Duration> {
    let s = match cfg.step_timeout_s {
        Some(s) => s,
        None if label == "cpu" => 0.0,
        None => DEFAULT_STEP_TIMEOUT_S,
    };
    (s > 0.0).then(|| Duration::from_secs_f64(s))
}

/// The step timeout of GPU lanes when `step_timeout_s` is unset (seconds).
pub const DEFAULT_STEP_TIMEOUT_S: f64 = 300.0;

/// Watches the lanes with a step timeout: a lane whose step in progress has outrun it
/// (a device or a collective that never returns) is declared hung — its requests fail
/// with `LaneFailed` and the router sends it no more — so the process serves on with its
/// other lanes. Ends with the engine.
fn spawn_watchdog(shared: &Arc<Shared>) {
    let Some(period) = shared
        .lanes
        .iter()
        .filter_map(|l| l.step_timeout)
        .min()
        .map(|t| (t / 4).clamp(Duration::from_millis(10), Duration::from_secs(1)))
    else {
        return;
    };
    let weak = Arc::downgrade(shared);
    let _ = std::thread::Builder::new()
        .name("kiln-watchdog".into())
        .spawn(move || {
            while let Some(sh) = weak.upgrade() {
                for (i, l) in sh.lanes.iter().enumerate() {
                    let (Some(limit), since) =
                        (l.step_timeout, l.load.step_since_ms.load(Ordering::Acquire))
                    else {
                        continue;
                    };
                    let ran = Duration::from_millis(lane::now_ms().saturating_sub(since));
                    if since == 0 || ran < limit || l.load.hung.load(Ordering::Acquire) {
                        continue;
                    }
                    tracing::error!(
                        lane = i,
                        secs = ran.as_secs_f64(),
                        "a step outran the step timeout; the lane is declared hung"
                    );
                    if let Ok(mut st) = l.stats.lock() {
                        st.healthy = false;
                    }
                    l.load.declare_hung(&hung_error(i, Some(ran)));
                }
                drop(sh);
                std::thread::sleep(period);
            }
        });
}

/// The lanes once each reported its load (their KV pools sized), and the first load failure.
fn wait_for_lanes(pending: Vec<(LaneHandle, ReadyRx)>) -> (Vec<LaneHandle>, Option<EngineError>) {
    let mut lanes = Vec::new();
    let mut failure = None;
    for (mut handle, ready) in pending {
        match ready.recv() {
            Ok(Ok(r)) => {
                handle.num_blocks = r.num_blocks;
                handle
                    .load
                    .free_blocks
                    .store(r.num_blocks, Ordering::Relaxed);
            }
            Ok(Err(e)) => failure = Some(e),
            Err(_) => failure = Some(EngineError::Load("lane thread exited during load".into())),
        }
        lanes.push(handle);
    }
    (lanes, failure)
}

fn spawn_lane(
    index: usize,
    label: String,
    body: LaneBody,
    files: Arc<ModelFiles>,
    cfg: &EngineConfig,
    max_len: usize,
) -> Result<(LaneHandle, ReadyRx), EngineError> {
    let step_timeout = step_timeout(cfg, &label);
    let (tx, rx) = mpsc::channel(cfg.max_waiting.max(1) + 64);
    let (ready, ready_rx) = std::sync::mpsc::sync_channel(1);
    let stats = Arc::new(Mutex::new(LaneStats {
        device: label,
        ..Default::default()
    }));
    let load = Arc::new(LaneLoad::default());
    let ctx = lane::LaneCtx {
        files,
        cfg: cfg.clone(),
        max_len,
        index,
        rx,
        stats: stats.clone(),
        load: load.clone(),
        ready,
    };
    let thread = std::thread::Builder::new()
        .name(format!("kiln-lane-{index}"))
        .spawn(move || body(ctx))
        .map_err(|e| EngineError::Load(format!("cannot start lane thread: {e}")))?;
    let handle = LaneHandle {
        tx,
        stats,
        load,
        num_blocks: 0,
        thread: Mutex::new(Some(thread)),
        step_timeout,
    };
    Ok((handle, ready_rx))
}

impl Engine {
    /// Starts one lane per device and waits until every lane has loaded the model.
    pub fn start(
        files: ModelFiles,
        devices: &[Device],
        cfg: EngineConfig,
    ) -> Result<Engine, EngineError> {
        Self::start_overlapped(files, None, devices, cfg)
    }

    /// [`Engine::start`] for files opened by [`ModelFiles::open_overlapped`]: the lanes load
    /// the model while `tokenizer` is still being built, and start-up waits for both.
    pub fn start_overlapped(
        files: ModelFiles,
        tokenizer: Option<PendingTokenizer>,
        devices: &[Device],
        cfg: EngineConfig,
    ) -> Result<Engine, EngineError> {
        let bodies = devices
            .iter()
            .map(|d| (d.to_string(), device_body(*d)))
            .collect();
        Self::start_lanes(files, tokenizer, bodies, cfg)
    }

    /// Starts one lane per backend constructor (run on the lane's own thread), e.g. to
    /// wrap a backend in tests. Labels name the lanes in stats.
    pub fn start_with_backends<B, F>(
        files: ModelFiles,
        makers: Vec<(String, F)>,
        cfg: EngineConfig,
    ) -> Result<Engine, EngineError>
    where
        B: crate::backend::Backend,
        F: FnOnce() -> Result<B, BackendError> + Send + 'static,
    {
        let bodies = makers
            .into_iter()
            .map(|(label, make)| (label, Box::new(move |ctx| lane::run(make, ctx)) as LaneBody))
            .collect();
        Self::start_lanes(files, None, bodies, cfg)
    }

    /// [`Engine::start_with_backends`] for tensor-parallel lanes: per lane, one backend
    /// constructor per shard (`cfg.tensor_parallel_size` of them); shard 0's runs on the
    /// lane's thread, the others on threads of their own.
    pub fn start_with_groups<B: crate::backend::Backend + 'static>(
        files: ModelFiles,
        groups: Vec<(String, Vec<crate::backend::Maker<B>>)>,
        cfg: EngineConfig,
    ) -> Result<Engine, EngineError> {
        let bodies = groups
            .into_iter()
            .map(|(label, makers)| {
                let body = move |ctx| lane::run_group(makers, ctx);
                (label, Box::new(body) as LaneBody)
            })
            .collect();
        Self::start_lanes(files, None, bodies, cfg)
    }

    fn start_lanes(
        files: ModelFiles,
        tokenizer_job: Option<PendingTokenizer>,
        devices: Vec<(String, LaneBody)>,
        cfg: EngineConfig,
    ) -> Result<Engine, EngineError> {
        if devices.is_empty() {
            return Err(EngineError::Load("no devices given".into()));
        }
        if cfg.block_size == 0 || cfg.max_num_seqs == 0 || cfg.max_num_batched_tokens == Some(0) {
            return Err(EngineError::Load(
                "block_size, max_num_seqs and max_num_batched_tokens must be > 0".into(),
            ));
        }
        let max_len = cfg
            .max_model_len
            .unwrap_or(files.spec.max_position)
            .min(files.spec.max_position);
        let ready_tokenizer = files.tokenizer.clone();
        let (spec, name) = (files.spec.clone(), files.name.clone());
        let files = Arc::new(files);
        let mut pending = Vec::new();
        for (i, (label, body)) in devices.into_iter().enumerate() {
            pending.push(spawn_lane(i, label, body, files.clone(), &cfg, max_len)?);
        }
        drop(files);
        let (lanes, mut failure) = wait_for_lanes(pending);
        let tokenizer = match tokenizer_job.map(PendingTokenizer::join) {
            None => ready_tokenizer,
            Some(Ok(t)) => t,
            Some(Err(e)) => {
                failure.get_or_insert(EngineError::Load(format!("tokenizer: {e}")));
                None
            }
        }
        .map(Arc::new);
        let bounds = Bounds {
            vocab_size: spec.vocab_size,
            max_len,
            pool_tokens: lanes.iter().map(|l| l.num_blocks).max().unwrap_or(0) * cfg.block_size,
            eos_ids: tokenizer
                .as_ref()
                .map(|t| t.eos_ids().to_vec())
                .unwrap_or_default(),
        };
        let permits = cfg.max_waiting + lanes.len() * cfg.max_num_seqs;
        let compiler = Compiler::new(
            tokenizer.clone(),
            bounds.vocab_size,
            bounds.eos_ids.clone(),
            &cfg.grammar,
        )
        .map(Arc::new)
        .map_err(|e| EngineError::Load(format!("cannot start the grammar threads: {e}")))?;
        let shared = Shared {
            lanes,
            tokenizer,
            spec,
            name,
            cfg,
            bounds,
            admission: Arc::new(Semaphore::new(permits)),
            permits,
            next_id: AtomicU64::new(1),
            route_turn: AtomicUsize::new(0),
            compiler,
        };
        let engine = Engine {
            client: EngineClient {
                shared: Arc::new(shared),
            },
        };
        if let Some(e) = failure {
            return Err(e);
        }
        spawn_watchdog(&engine.client.shared);
        let warm = engine.client.clone();
        let _ = std::thread::Builder::new()
            .name("kiln-grammars".into())
            .spawn(move || {
                if let Err(e) = warm.shared.compiler.grammars() {
                    tracing::info!("constrained decoding unavailable: {e}");
                }
            });
        Ok(engine)
    }

    pub fn client(&self) -> EngineClient {
        self.client.clone()
    }

    /// Stops every lane (in-flight requests end with an error) and joins the threads.
    pub fn shutdown(&self) {
        for l in &self.client.shared.lanes {
            let _ = l.tx.try_send(LaneMsg::Shutdown);
        }
        for l in &self.client.shared.lanes {
            // A hung lane's thread may never return: leave it (the process exit ends it).
            if l.load.hung.load(Ordering::Acquire) {
                continue;
            }
            if let Some(t) = l.thread.lock().expect("thread lock").take() {
                let _ = t.join();
            }
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl EngineClient {
    pub fn tokenizer(&self) -> Option<Arc<Tokenizer>> {
        self.shared.tokenizer.clone()
    }
    pub fn spec(&self) -> &ModelSpec {
        &self.shared.spec
    }
    pub fn model_name(&self) -> &str {
        &self.shared.name
    }
    /// Prompt plus generated tokens may not exceed this.
    pub fn max_model_len(&self) -> usize {
        self.shared.bounds.max_len
    }
    pub fn config(&self) -> &EngineConfig {
        &self.shared.cfg
    }
    /// A snapshot of every lane.
    pub fn stats(&self) -> EngineStats {
        EngineStats {
            lanes: self
                .shared
                .lanes
                .iter()
                .map(|l| l.stats.lock().expect("stats lock").clone())
                .collect(),
        }
    }
    /// Every lane is loaded, alive and healthy (a lane that panicked or whose thread ended
    /// is not).
    pub fn is_healthy(&self) -> bool {
        self.shared.lanes.iter().all(|l| {
            let alive = l
                .thread
                .lock()
                .expect("thread lock")
                .as_ref()
                .is_some_and(|t| !t.is_finished());
            alive && l.load.healthy.load(Ordering::Relaxed)
        })
    }

    /// Checks every limit of `req` (the one place they are checked) and takes its
    /// constraint's grammar (compiled by [`Self::prepare_constraint`], else compiled now on
    /// a compile thread; a compile error names `response_format`).
    pub fn validate(&self, mut req: GenerateRequest) -> Result<ValidRequest, EngineError> {
        let compiler = &self.shared.compiler;
        let constraint = req.constraint.take();
        let grammar = match &constraint {
            Some(c) => Some(compiler.grammar(c, "response_format")?),
            None => None,
        };
        let valid = validate::validate(req, &self.shared.bounds, grammar)?;
        if let Some(c) = &constraint {
            compiler.served(c);
        }
        Ok(valid)
    }

    /// Compiles `c` on a compile thread, within the limits of `engine.grammar` (depth, size,
    /// time), and caches it for the request that follows. A constraint past a limit, that
    /// does not compile or that no text satisfies is `InvalidRequest` naming `param`; a
    /// full compile queue is `Overloaded`.
    pub async fn prepare_constraint(
        &self,
        c: &Constraint,
        param: &'static str,
    ) -> Result<(), EngineError> {
        self.shared.compiler.prepare(c, param).await
    }

    /// Compiled grammars cached and the bytes they hold (bounded by
    /// `engine.grammar.cache_bytes`).
    pub fn grammar_cache_size(&self) -> (usize, usize) {
        self.shared.compiler.cache_size()
    }

    /// [`Self::prepare_constraint`] for a caller that may block (waits for the compile
    /// thread, with no time limit).
    pub fn check_constraint(&self, c: &Constraint, param: &'static str) -> Result<(), EngineError> {
        self.shared.compiler.grammar(c, param).map(drop)
    }

    /// Validates and queues a request. Fails fast with `Overloaded` when too many wait.
    pub fn submit(&self, req: GenerateRequest) -> Result<ResponseStream, EngineError> {
        self.submit_valid(self.validate(req)?)
    }

    /// The lane with the most free blocks (healthy lanes first, hung ones last; ties go
    /// round the lanes by turns); the blocks the request will need are counted against it at
    /// once, so a burst spreads over the lanes.
    fn route(&self, req: &ValidRequest) -> usize {
        let lanes = &self.shared.lanes;
        let turn = self.shared.route_turn.fetch_add(1, Ordering::Relaxed);
        let n = lanes.len().max(1);
        let i = (0..lanes.len())
            .max_by_key(|&i| {
                let load = &lanes[i].load;
                (
                    load.healthy.load(Ordering::Relaxed),
                    !load.hung.load(Ordering::Relaxed),
                    load.free_blocks.load(Ordering::Relaxed),
                    usize::MAX - (i + n - turn % n) % n,
                )
            })
            .unwrap_or(0);
        let need = req.prompt_ids().len().div_ceil(self.shared.cfg.block_size) + req.n();
        let free = &lanes[i].load.free_blocks;
        let _ = free.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |f| {
            Some(f.saturating_sub(need))
        });
        i
    }

    /// Queues a validated request, holding one admission permit per choice for the life of
    /// its stream; none left is `Overloaded` (429 with Retry-After).
    pub fn submit_valid(&self, mut req: ValidRequest) -> Result<ResponseStream, EngineError> {
        let sh = &self.shared;
        let stops = req.take_stop_strings();
        let processor =
            OutputProcessor::new(sh.tokenizer.as_ref(), req.prompt_ids(), req.n(), stops);
        // A server-chosen bound: one step's events (n tokens, `Scheduled`, a final error)
        // plus the configured buffer; `n` is capped by `MAX_CHOICES`.
        let capacity = sh.cfg.stream_buffer_events.max(1) + step_events(req.n());
        let q = self.enqueue(req, capacity)?;
        Ok(ResponseStream {
            rx: q.rx,
            lane_tx: q.lane_tx,
            first: q.first,
            processor,
            done: false,
            lane: q.lane,
            load: q.load,
            _permit: q.permit,
        })
    }

    /// Checks an embedding input (see [`validate::validate_embed`]), to be pooled by the
    /// model's pooling ([`Pooling::Last`] when its files state none).
    pub fn validate_embed(&self, req: EmbedRequest) -> Result<ValidRequest, EngineError> {
        let sh = &self.shared;
        let pooling = sh.spec.variant.pooling.unwrap_or(Pooling::Last);
        validate::validate_embed(req, &sh.bounds, pooling)
    }

    /// Queues a checked embedding input on a lane like any request: one admission permit,
    /// the same waiting queue, scheduler and batches as generations.
    pub fn submit_embed(&self, req: ValidRequest) -> Result<EmbedHandle, EngineError> {
        if !req.is_embedding() {
            return Err(EngineError::InvalidRequest {
                param: None,
                message: "a generation request was submitted as an embedding".into(),
            });
        }
        let prompt_tokens = req.prompt_ids().len();
        // `Scheduled`, the vector, the finish and a final error.
        let q = self.enqueue(req, step_events(1) + 2)?;
        Ok(EmbedHandle {
            rx: q.rx,
            first: q.first.0,
            lane: q.lane,
            load: q.load,
            prompt_tokens,
            _permit: q.permit,
        })
    }

    /// Takes the request's permits, routes it and hands it to its lane with an event channel
    /// of `capacity`; its lane's waiter list holds the channel until the receiver drops.
    fn enqueue(&self, req: ValidRequest, capacity: usize) -> Result<Queued, EngineError> {
        let sh = &self.shared;
        let overloaded = || EngineError::Overloaded {
            waiting: sh.permits - sh.admission.available_permits(),
            retry_after_s: 1,
        };
        if req.n() > sh.permits {
            return Err(EngineError::InvalidRequest {
                param: Some("n"),
                message: format!("n must be at most {} on this server", sh.permits),
            });
        }
        let permit = sh
            .admission
            .clone()
            .try_acquire_many_owned(req.n() as u32)
            .map_err(|_| overloaded())?;
        let lane = self.route(&req);
        // The router puts hung lanes last: one is chosen only when all are hung.
        if sh.lanes[lane].load.hung.load(Ordering::Acquire) {
            return Err(EngineError::LaneFailed {
                lane,
                message: "every lane is hung (a step outran engine.step_timeout_s)".into(),
            });
        }
        let id = sh.next_id.fetch_add(1, Ordering::Relaxed);
        let first = SeqId(id * MAX_CHOICES as u64);
        let (tx, rx) = mpsc::channel(capacity);
        let msg = NewRequest {
            first,
            req,
            events: tx,
            arrival: id,
        };
        let lane_tx = sh.lanes[lane].tx.clone();
        let load = sh.lanes[lane].load.clone();
        let weak = msg.events.downgrade();
        load.waiters
            .lock()
            .expect("waiters lock")
            .insert(first.0, weak);
        if let Err(e) = lane_tx.try_send(LaneMsg::Submit(Box::new(msg))) {
            if let Ok(mut w) = load.waiters.lock() {
                w.remove(&first.0);
            }
            return Err(match e {
                mpsc::error::TrySendError::Full(_) => overloaded(),
                mpsc::error::TrySendError::Closed(_) => EngineError::ShuttingDown,
            });
        }
        Ok(Queued {
            rx,
            lane_tx,
            first,
            lane,
            load,
            permit,
        })
    }
}

/// A request handed to its lane: what its stream or handle keeps.
struct Queued {
    rx: mpsc::Receiver<LaneEvent>,
    lane_tx: mpsc::Sender<LaneMsg>,
    first: SeqId,
    lane: usize,
    load: Arc<LaneLoad>,
    permit: OwnedSemaphorePermit,
}

/// Events of one request. Dropping it aborts the request; its blocks are freed within a step.
pub struct ResponseStream {
    rx: mpsc::Receiver<LaneEvent>,
    lane_tx: mpsc::Sender<LaneMsg>,
    first: SeqId,
    processor: OutputProcessor,
    done: bool,
    /// The lane serving it, and that lane's load (the watchdog's hung flag and waiter list).
    lane: usize,
    load: Arc<LaneLoad>,
    /// Admission: released when the stream is dropped.
    _permit: OwnedSemaphorePermit,
}

impl Drop for ResponseStream {
    fn drop(&mut self) {
        if let Ok(mut w) = self.load.waiters.lock() {
            w.remove(&self.first.0);
        }
    }
}

impl ResponseStream {
    /// The next event, or `None` after `Done`/`Error`.
    pub async fn next_event(&mut self) -> Option<StreamEvent> {
        std::future::poll_fn(|cx| Pin::new(&mut *self).poll_next(cx)).await
    }

    /// Collects the whole stream.
    pub async fn collect_all(mut self) -> Vec<StreamEvent> {
        let mut v = Vec::new();
        while let Some(e) = self.next_event().await {
            v.push(e);
        }
        v
    }
}

impl Stream for ResponseStream {
    type Item = StreamEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<StreamEvent>> {
        let this = &mut *self;
        loop {
            if let Some(ev) = this.processor.out.pop_front() {
                return Poll::Ready(Some(ev));
            }
            if this.done || this.processor.is_finished() {
                this.done = true;
                this.rx.close();
                return Poll::Ready(None);
            }
            match this.rx.poll_recv(cx) {
                // Declared hung after the failure event could not be queued (a full
                // buffer, now drained): the lane will send nothing more.
                Poll::Pending if this.load.hung.load(Ordering::Acquire) => {
                    this.done = true;
                    return Poll::Ready(Some(StreamEvent::Error(hung_error(this.lane, None))));
                }
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => {
                    this.done = true;
                    return Poll::Ready(Some(StreamEvent::Error(EngineError::ShuttingDown)));
                }
                Poll::Ready(Some(ev)) => {
                    if let Some(choice) = this.processor.push(ev) {
                        let _ = this
                            .lane_tx
                            .try_send(LaneMsg::Abort(SeqId(this.first.0 + choice as u64)));
                    }
                }
            }
        }
    }
}
