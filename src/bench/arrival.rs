//! When requests are sent: Poisson arrivals at a rate (or all at once), capped in flight.

use std::future::Future;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::ProgressBar;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::record::{Failure, RequestRecord};

/// Requests per second: Poisson arrivals at a finite rate, or every request at once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RequestRate {
    Poisson(f64),
    Infinite,
}

impl FromStr for RequestRate {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s.eq_ignore_ascii_case("inf") {
            return Ok(RequestRate::Infinite);
        }
        match s.parse::<f64>() {
            Ok(r) if r.is_infinite() && r > 0.0 => Ok(RequestRate::Infinite),
            Ok(r) if r.is_finite() && r > 0.0 => Ok(RequestRate::Poisson(r)),
            _ => Err(format!("'{s}' is not a positive number or 'inf'")),
        }
    }
}

impl std::fmt::Display for RequestRate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RequestRate::Poisson(r) => write!(f, "{r}"),
            RequestRate::Infinite => write!(f, "inf"),
        }
    }
}

/// How requests arrive.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Arrival {
    /// Mean arrivals per second.
    pub rate: RequestRate,
    /// Most requests in flight; the rest wait in arrival order.
    pub max_concurrency: Option<usize>,
    /// Seed of the arrival times.
    pub seed: u64,
    /// The run ends this long after its start, whatever is still in flight.
    pub max_duration: Option<Duration>,
}

impl Arrival {
    /// Arrival offsets from the start for `n` requests: exponential gaps at the rate (the
    /// first request at 0), reproducible from the seed; all zero at an infinite rate.
    pub fn offsets(&self, n: usize) -> Vec<Duration> {
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed ^ 0x5eed_a771);
        let mut t = 0.0f64;
        (0..n)
            .map(|i| {
                if let (RequestRate::Poisson(r), true) = (self.rate, i > 0) {
                    let u: f64 = rng.random();
                    t += -(1.0 - u).ln() / r;
                }
                Duration::from_secs_f64(t)
            })
            .collect()
    }
}

/// Runs `n` requests through `send` (given the index and the run start), honouring the
/// arrival schedule, the concurrency cap and the run's maximum duration (requests in flight
/// then are dropped, and they and those not sent are recorded as `unfinished`). Returns the
/// records in index order and the wall time from the start to the last request's end.
pub async fn drive<F, Fut>(
    n: usize,
    arrival: &Arrival,
    progress: &ProgressBar,
    send: F,
) -> (Vec<RequestRecord>, Duration)
where
    F: Fn(usize, Instant) -> Fut,
    Fut: Future<Output = RequestRecord> + Send + 'static,
{
    let offsets = arrival.offsets(n);
    let limit = arrival
        .max_concurrency
        .map(|c| Arc::new(Semaphore::new(c.max(1))));
    let start = Instant::now();
    let deadline = arrival.max_duration.map(|d| start + d);
    let mut tasks = JoinSet::new();
    let mut records = Vec::with_capacity(n);
    for (i, at) in offsets.into_iter().enumerate() {
        if deadline.is_some_and(|d| start + at >= d) {
            break;
        }
        tokio::time::sleep_until((start + at).into()).await;
        let limit = limit.clone();
        let fut = send(i, start);
        let progress = progress.clone();
        tasks.spawn(async move {
            let _permit = match limit {
                Some(s) => s.acquire_owned().await.ok(),
                None => None,
            };
            let record = fut.await;
            progress.inc(1);
            record
        });
        while let Some(joined) = tasks.try_join_next() {
            collect(joined, &mut records);
        }
    }
    loop {
        let next = match deadline {
            Some(d) => match tokio::time::timeout_at(d.into(), tasks.join_next()).await {
                Ok(next) => next,
                Err(_) => {
                    tasks.abort_all();
                    break;
                }
            },
            None => tasks.join_next().await,
        };
        match next {
            Some(joined) => collect(joined, &mut records),
            None => break,
        }
    }
    let wall = start.elapsed();
    records.sort_by_key(|r| r.index);
    let lost = if deadline.is_some_and(|d| Instant::now() >= d) {
        Failure::new(
            "unfinished",
            "in flight or not yet sent when --max-duration-s ended the run",
        )
    } else {
        Failure::new("bench_task_panicked", "the request task panicked")
    };
    fill_lost(&mut records, n, lost);
    (records, wall)
}

fn collect(
    joined: Result<RequestRecord, tokio::task::JoinError>,
    records: &mut Vec<RequestRecord>,
) {
    match joined {
        Ok(r) => records.push(r),
        Err(e) if e.is_cancelled() => {}
        Err(e) => tracing::error!(error = %e, "a benchmark request task failed"),
    }
}

/// Records `failure` for any index without a record (its task died, or the run ended first),
/// so every request is accounted for.
fn fill_lost(records: &mut Vec<RequestRecord>, n: usize, failure: Failure) {
    if records.len() == n {
        return;
    }
    let have: std::collections::HashSet<usize> = records.iter().map(|r| r.index).collect();
    for index in (0..n).filter(|i| !have.contains(i)) {
        records.push(RequestRecord {
            index,
            start_ms: 0.0,
            ttft_ms: None,
            itl_ms: Vec::new(),
            tpot_ms: None,
            e2e_ms: 0.0,
            prompt_tokens: 0,
            output_tokens: 0,
            usage_reported: false,
            expected_prompt_tokens: None,
            requested_output_tokens: 0,
            error: Some(failure.clone()),
        });
    }
    records.sort_by_key(|r| r.index);
}
