//! Plain snapshots of engine state for the metrics layer (no Prometheus types here).

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
