//! Plain snapshots of engine state for the metrics layer (no Prometheus types here).

use std::collections::BTreeMap;

/// Upper bounds (seconds) of the latency histograms for steps and kernels.
pub const DURATION_BUCKETS: &[f64] = &[
    1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5,
    1.0, 2.5,
];

/// A histogram as plain data over [`DURATION_BUCKETS`]: per-bucket (non-cumulative)
/// counts, the last entry counting values above every bound.
#[derive(Debug, Clone, PartialEq)]
pub struct PlainHistogram {
    pub counts: Vec<u64>,
    pub sum: f64,
    pub count: u64,
}

impl Default for PlainHistogram {
    fn default() -> Self {
        Self {
            counts: vec![0; DURATION_BUCKETS.len() + 1],
            sum: 0.0,
            count: 0,
        }
    }
}

impl PlainHistogram {
    /// Records one value.
    pub fn observe(&mut self, v: f64) {
        let i = DURATION_BUCKETS
            .iter()
            .position(|&b| v <= b)
            .unwrap_or(DURATION_BUCKETS.len());
        self.counts[i] += 1;
        self.sum += v;
        self.count += 1;
    }
}

/// One lane's counters, published after every step.
#[derive(Debug, Clone, Default)]
pub struct LaneStats {
    pub device: String,
    pub healthy: bool,
    pub running: usize,
    pub waiting: usize,
    pub kv_total_blocks: usize,
    pub kv_free_blocks: usize,
    /// Prompt tokens looked up in / served from the prefix cache.
    pub prefix_cache_queries: u64,
    pub prefix_cache_hits: u64,
    pub preemptions: u64,
    pub steps: u64,
    /// Tokens computed by forward steps (prefill and decode).
    pub tokens_computed: u64,
    /// Seconds spent in steps, split by whether the step held prefill work.
    pub prefill_step_seconds: f64,
    pub decode_step_seconds: f64,
    /// Step durations by phase (`prefill`: the step held prompt work; `decode`: only decodes).
    pub step_durations: BTreeMap<&'static str, PlainHistogram>,
    /// Device-timed kernel durations by kernel (sampled by the backend).
    pub kernel_durations: BTreeMap<&'static str, PlainHistogram>,
}

/// All lanes.
#[derive(Debug, Clone, Default)]
pub struct EngineStats {
    pub lanes: Vec<LaneStats>,
}

impl EngineStats {
    pub fn running(&self) -> usize {
        self.lanes.iter().map(|l| l.running).sum()
    }
    pub fn waiting(&self) -> usize {
        self.lanes.iter().map(|l| l.waiting).sum()
    }
    /// Fraction of KV blocks in use, 0..=1.
    pub fn kv_usage(&self) -> f64 {
        let total: usize = self.lanes.iter().map(|l| l.kv_total_blocks).sum();
        let free: usize = self.lanes.iter().map(|l| l.kv_free_blocks).sum();
        if total == 0 {
            0.0
        } else {
            (total - free) as f64 / total as f64
        }
    }
    pub fn prefix_cache_queries(&self) -> u64 {
        self.lanes.iter().map(|l| l.prefix_cache_queries).sum()
    }
    pub fn prefix_cache_hits(&self) -> u64 {
        self.lanes.iter().map(|l| l.prefix_cache_hits).sum()
    }
    pub fn preemptions(&self) -> u64 {
        self.lanes.iter().map(|l| l.preemptions).sum()
    }
    pub fn healthy(&self) -> bool {
        !self.lanes.is_empty() && self.lanes.iter().all(|l| l.healthy)
    }
}
