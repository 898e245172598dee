//! A device error fails the in-flight requests of that lane with a typed error, and the
//! lane keeps serving afterwards (DESIGN invariant 3), with every block returned. A device
//! failing in one shard of a tensor-parallel lane fails that lane's requests and marks it
//! unhealthy, while the process serves on with its other lanes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use kiln::backend::cpu::{CpuBackend, CpuBatch, CpuKv, CpuTensor};
use kiln::backend::{
    Activation, AttnShape, Backend, BackendError, BatchPlan, GroupMember, HostTensor, KvShape,
    Maker, RopeSpec,
};
use kiln::engine::{Engine, EngineConfig, EngineError, GenerateRequest, StreamEvent};
use kiln::model::{LoadFormat, ModelFiles};
use kiln::sampling::{SampleRow, Sampled};

/// The CPU backend with an attention op that fails while `fail` is set, panics while
/// `panic` is set and does not return while `hang` is set (a hung device).
struct Faulty {
    inner: CpuBackend,
    fail: Arc<AtomicBool>,
    panic: Arc<AtomicBool>,
    hang: Arc<AtomicBool>,
}

impl Backend for Faulty {
    type Tensor = CpuTensor;
    type Weight = HostTensor;
    type Kv = CpuKv;
    type Batch = CpuBatch;

    fn name(&self) -> String {
        "faulty-cpu".into()
    }
    fn upload_weight(&mut self, w: HostTensor) -> Result<HostTensor, BackendError> {
        self.inner.upload_weight(w)
    }
    fn alloc(&mut self, rows: usize, cols: usize) -> Result<CpuTensor, BackendError> {
        self.inner.alloc(rows, cols)
    }
    fn alloc_kv(&mut self, shape: &KvShape) -> Result<CpuKv, BackendError> {
        self.inner.alloc_kv(shape)
    }
    fn prepare(&mut self, plan: &BatchPlan) -> Result<CpuBatch, BackendError> {
        self.inner.prepare(plan)
    }
    fn embed(
        &mut self,
        t: &HostTensor,
        first: usize,
        vocab: usize,
        b: &CpuBatch,
        out: &mut CpuTensor,
    ) -> Result<(), BackendError> {
        self.inner.embed(t, first, vocab, b, out)
    }
    fn rms_norm(
        &mut self,
        x: &CpuTensor,
        w: &HostTensor,
        eps: f32,
        n: usize,
        out: &mut CpuTensor,
    ) -> Result<(), BackendError> {
        self.inner.rms_norm(x, w, eps, n, out)
    }
    fn add_rms_norm(
        &mut self,
        x: &CpuTensor,
        r: &mut CpuTensor,
        w: &HostTensor,
        eps: f32,
        n: usize,
        out: &mut CpuTensor,
    ) -> Result<(), BackendError> {
        self.inner.add_rms_norm(x, r, w, eps, n, out)
    }
    fn matmul(
        &mut self,
        x: &CpuTensor,
        w: &HostTensor,
        b: Option<&HostTensor>,
        n: usize,
        out: &mut CpuTensor,
    ) -> Result<(), BackendError> {
        self.inner.matmul(x, w, b, n, out)
    }
    fn rope(
        &mut self,
        qkv: &mut CpuTensor,
        b: &CpuBatch,
        s: &AttnShape,
        r: &RopeSpec,
    ) -> Result<(), BackendError> {
        self.inner.rope(qkv, b, s, r)
    }
    fn write_kv(
        &mut self,
        kv: &mut CpuKv,
        l: usize,
        qkv: &CpuTensor,
        b: &CpuBatch,
        s: &AttnShape,
    ) -> Result<(), BackendError> {
        self.inner.write_kv(kv, l, qkv, b, s)
    }
    fn attention(
        &mut self,
        qkv: &CpuTensor,
        kv: &CpuKv,
        l: usize,
        b: &CpuBatch,
        s: &AttnShape,
        sinks: Option<&HostTensor>,
        out: &mut CpuTensor,
    ) -> Result<(), BackendError> {
        if self.panic.load(Ordering::SeqCst) {
            panic!("injected panic");
        }
        while self.hang.load(Ordering::SeqCst) {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        if self.fail.load(Ordering::SeqCst) {
            return Err(BackendError::Device {
                op: "attention",
                message: "injected fault".into(),
            });
        }
        self.inner.attention(qkv, kv, l, b, s, sinks, out)
    }
    fn glu(
        &mut self,
        act: Activation,
        gu: &CpuTensor,
        n: usize,
        out: &mut CpuTensor,
    ) -> Result<(), BackendError> {
        self.inner.glu(act, gu, n, out)
    }
    fn gather_rows(
        &mut self,
        x: &CpuTensor,
        b: &CpuBatch,
        out: &mut CpuTensor,
    ) -> Result<(), BackendError> {
        self.inner.gather_rows(x, b, out)
    }
    fn sample(
        &mut self,
        logits: &CpuTensor,
        rows: &[SampleRow<'_>],
    ) -> Result<Vec<Sampled>, BackendError> {
        self.inner.sample(logits, rows)
    }
    fn to_host(&mut self, x: &CpuTensor, n: usize) -> Result<Vec<f32>, BackendError> {
        self.inner.to_host(x, n)
    }
    fn join_group(&mut self, member: GroupMember) -> Result<(), BackendError> {
        self.inner.join_group(member)
    }
    fn all_reduce_sum(&mut self, x: &mut CpuTensor, n: usize) -> Result<(), BackendError> {
        self.inner.all_reduce_sum(x, n)
    }
    fn all_gather(
        &mut self,
        part: &CpuTensor,
        n: usize,
        out: &mut CpuTensor,
    ) -> Result<(), BackendError> {
        self.inner.all_gather(part, n, out)
    }
}

async fn outcome(
    client: &kiln::engine::EngineClient,
    prompt: Vec<u32>,
) -> Result<usize, EngineError> {
    let mut req = GenerateRequest::greedy(prompt, 8);
    req.stop.ignore_eos = true;
    let mut s = client.submit(req)?;
    let mut tokens = 0;
    while let Some(ev) = s.next_event().await {
        match ev {
            StreamEvent::Delta { tokens: t, .. } => tokens += t.len(),
            StreamEvent::Error(e) => return Err(e),
            _ => {}
        }
    }
    Ok(tokens)
}

#[tokio::test]
async fn device_error_fails_requests_and_lane_keeps_serving() {
    let files = ModelFiles::open(&kiln::config::default_model_path(), LoadFormat::Gguf).unwrap();
    let fail = Arc::new(AtomicBool::new(true));
    let f2 = fail.clone();
    let make = move || {
        Ok(Faulty {
            inner: CpuBackend::new(),
            fail: f2,
            panic: Arc::default(),
            hang: Arc::default(),
        })
    };
    let engine = Engine::start_with_backends(
        files,
        vec![("faulty".to_string(), make)],
        EngineConfig::default(),
    )
    .unwrap();
    let client = engine.client();
    let err = outcome(&client, vec![1, 400, 401]).await.unwrap_err();
    assert!(
        matches!(err, EngineError::LaneFailed { lane: 0, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("injected fault"), "{err}");
    assert!(
        !client.is_healthy(),
        "a device error marks the lane unhealthy"
    );
    fail.store(false, Ordering::SeqCst);
    assert_eq!(
        outcome(&client, vec![1, 400, 401]).await.unwrap(),
        8,
        "the lane serves again"
    );
    // Stats are published right after the step that finished the request.
    for _ in 0..400 {
        let s = client.stats();
        if s.lanes[0].kv_free_blocks == s.lanes[0].kv_total_blocks && s.healthy() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    panic!(
        "blocks not returned or lane not healthy: {:?}",
        client.stats()
    );
}

#[tokio::test]
async fn a_lane_that_panics_is_unhealthy_and_fails_its_requests() {
    let files = ModelFiles::open(&kiln::config::default_model_path(), LoadFormat::Gguf).unwrap();
    let panic = Arc::new(AtomicBool::new(false));
    let p2 = panic.clone();
    let make = move || {
        Ok(Faulty {
            inner: CpuBackend::new(),
            fail: Arc::default(),
            panic: p2,
            hang: Arc::default(),
        })
    };
    let engine = Engine::start_with_backends(
        files,
        vec![("faulty".to_string(), make)],
        EngineConfig::default(),
    )
    .unwrap();
    let client = engine.client();
    assert_eq!(outcome(&client, vec![1, 400, 401]).await.unwrap(), 8);
    assert!(client.is_healthy());
    panic.store(true, Ordering::SeqCst);
    let err = outcome(&client, vec![1, 400, 402]).await.unwrap_err();
    assert!(
        matches!(err, EngineError::LaneFailed { lane: 0, .. }),
        "{err}"
    );
    assert!(
        !err.to_string().contains("injected panic"),
        "the panic's text stays in the log: {err}"
    );
    assert!(
        !client.is_healthy(),
        "a panicked lane reports itself unhealthy"
    );
    panic.store(false, Ordering::SeqCst);
    for _ in 0..3 {
        let err = outcome(&client, vec![1, 400, 401]).await.unwrap_err();
        assert!(
            matches!(err, EngineError::LaneFailed { lane: 0, .. }),
            "later requests fail with a 5xx error, not hang: {err}"
        );
    }
    assert!(!client.is_healthy(), "a panicked lane stays unhealthy");
}

/// Two lanes of two CPU shards each; shard `failing` of lane 0 fails every step. The two
/// requests sent at once go one to each lane (the router balances free blocks): lane 0's
/// fails with the shard's error and lane 0 turns unhealthy, lane 1's completes. Later
/// requests all go to the healthy lane 1 and complete, and the engine shuts down (no shard
/// is left waiting in a collective).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_shard_fails_its_tp_lane_and_the_other_lane_serves_on() {
    for failing in [1, 0] {
        let files =
            ModelFiles::open(&kiln::config::default_model_path(), LoadFormat::Gguf).unwrap();
        let shard = |fail: bool| -> Maker<Faulty> {
            Box::new(move || {
                Ok(Faulty {
                    inner: CpuBackend::new(),
                    fail: Arc::new(AtomicBool::new(fail)),
                    panic: Arc::default(),
                    hang: Arc::default(),
                })
            })
        };
        let groups = vec![
            (
                "tp-lane-0".to_string(),
                vec![shard(failing == 0), shard(failing == 1)],
            ),
            ("tp-lane-1".to_string(), vec![shard(false), shard(false)]),
        ];
        let cfg = EngineConfig {
            tensor_parallel_size: 2,
            ..EngineConfig::default()
        };
        let engine = Engine::start_with_groups(files, groups, cfg).unwrap();
        let client = engine.client();
        let (a, b) = tokio::join!(
            outcome(&client, vec![1, 400, 401]),
            outcome(&client, vec![1, 402, 403])
        );
        let (failed, served): (Vec<_>, Vec<_>) = [a, b].into_iter().partition(Result::is_err);
        assert_eq!(
            (failed.len(), served.len()),
            (1, 1),
            "shard {failing}: one request per lane"
        );
        let err = failed[0].as_ref().unwrap_err();
        assert!(
            matches!(err, EngineError::LaneFailed { lane: 0, .. }),
            "shard {failing}: {err}"
        );
        assert!(err.to_string().contains("injected fault"), "{err}");
        assert_eq!(served[0].as_ref().unwrap(), &8);
        let stats = client.stats();
        assert!(!stats.lanes[0].healthy, "shard {failing}: lane 0 unhealthy");
        assert!(stats.lanes[1].healthy, "shard {failing}: lane 1 healthy");
        assert!(!client.is_healthy(), "a lane is down: not ready");
        let later = futures_util::future::join_all(
            (0..3).map(|i| outcome(&client, vec![1, 410 + i, 411 + i])),
        )
        .await;
        for r in later {
            assert_eq!(r.unwrap(), 8, "shard {failing}: served by lane 1");
        }
        engine.shutdown();
    }
}

/// Two lanes of two CPU shards; shard 1 of lane 0 stops returning (a hung device), so shard 0
/// waits in the all-reduce for good. The watchdog declares lane 0 hung once its step outruns
/// the step timeout: lane 0's request fails with a 503-class error naming the timeout instead
/// of hanging its client, lane 1 serves that request's twin and every later one, and when
/// the device comes back lane 0 serves again and the engine shuts down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_shard_fails_its_lane_after_the_step_timeout_and_the_others_serve_on() {
    let files = ModelFiles::open(&kiln::config::default_model_path(), LoadFormat::Gguf).unwrap();
    let hang = Arc::new(AtomicBool::new(true));
    let shard = |hang: Arc<AtomicBool>| -> Maker<Faulty> {
        Box::new(move || {
            Ok(Faulty {
                inner: CpuBackend::new(),
                fail: Arc::default(),
                panic: Arc::default(),
                hang,
            })
        })
    };
    let groups = vec![
        (
            "tp-lane-0".to_string(),
            vec![shard(Arc::default()), shard(hang.clone())],
        ),
        (
            "tp-lane-1".to_string(),
            vec![shard(Arc::default()), shard(Arc::default())],
        ),
    ];
    let cfg = EngineConfig {
        tensor_parallel_size: 2,
        step_timeout_s: Some(0.5),
        ..EngineConfig::default()
    };
    let engine = Engine::start_with_groups(files, groups, cfg).unwrap();
    let client = engine.client();
    let t0 = std::time::Instant::now();
    let (a, b) = tokio::join!(
        outcome(&client, vec![1, 400, 401]),
        outcome(&client, vec![1, 402, 403])
    );
    let waited = t0.elapsed().as_secs_f64();
    let (failed, served): (Vec<_>, Vec<_>) = [a, b].into_iter().partition(Result::is_err);
    assert_eq!((failed.len(), served.len()), (1, 1), "one request per lane");
    let err = failed[0].as_ref().unwrap_err();
    assert!(
        matches!(err, EngineError::LaneFailed { lane: 0, .. }) && err.to_string().contains("hung"),
        "{err}"
    );
    assert!(waited < 30.0, "the hung lane's client waited {waited:.1} s");
    assert_eq!(served[0].as_ref().unwrap(), &8);
    let stats = client.stats();
    assert!(!stats.lanes[0].healthy && stats.lanes[1].healthy);
    assert!(!client.is_healthy(), "a lane is hung: not ready");
    for r in
        futures_util::future::join_all((0..3).map(|i| outcome(&client, vec![1, 410 + i]))).await
    {
        assert_eq!(r.unwrap(), 8, "served by lane 1 while lane 0 hangs");
    }
    // The device returns: the step completes, lane 0 is healthy and serves again.
    hang.store(false, Ordering::SeqCst);
    for _ in 0..2000 {
        if client.is_healthy() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert!(
        client.is_healthy(),
        "lane 0 recovered: {:?}",
        client.stats()
    );
    let both =
        futures_util::future::join_all((0..4).map(|i| outcome(&client, vec![1, 420 + i]))).await;
    for r in both {
        assert_eq!(r.unwrap(), 8);
    }
    engine.shutdown();
}
