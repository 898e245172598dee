//! Decode steps recorded into graphs and replayed: the first step of a padded shape runs
//! eagerly (making every lazy allocation), the second is recorded and replayed, later ones
//! replay. Any allocation a recording could address bumps the backend's `generation`, which
//! retires every graph before the next step.

use std::collections::{HashMap, HashSet};

use super::meta::GraphKey;
use super::runtime::{self, Runtime};
use super::{GpuBackend, GpuBatch};
use crate::backend::{BackendError, BatchPlan};

/// How decode steps ran: recorded into a graph, or replayed from one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GraphStats {
    pub captures: u64,
    pub replays: u64,
    /// Recordings the runtime refused (the step then ran eagerly).
    pub failures: u64,
    /// Why the last refused recording failed.
    pub last_failure: Option<String>,
}

/// Recording attempts per shape before it stays eager.
const GRAPH_TRIES: u32 = 3;

/// The recorded graphs of one backend and what it knows of each shape.
pub(super) struct Graphs<R: Runtime> {
    /// Decode steps may be recorded ([`super::GpuOptions::graphs`]).
    pub on: bool,
    /// Recorded decode graphs of the current generation, by shape.
    recorded: HashMap<GraphKey, R::Graph>,
    /// Shapes run eagerly once in the current generation: recorded when they recur.
    seen: HashSet<GraphKey>,
    /// Failed recordings by shape; a shape that failed `GRAPH_TRIES` times stays eager.
    failed: HashMap<GraphKey, u32>,
    /// The backend generation the recorded graphs belong to.
    generation: u64,
    pub stats: GraphStats,
}

impl<R: Runtime> Graphs<R> {
    pub fn new(on: bool) -> Graphs<R> {
        Graphs {
            on,
            recorded: HashMap::new(),
            seen: HashSet::new(),
            failed: HashMap::new(),
            generation: 0,
            stats: GraphStats::default(),
        }
    }
}

impl<R: Runtime> GpuBackend<R> {
    /// The graph shape `plan` runs at (padded to `row_cap` rows), when graphs are on and
    /// the shape has not failed to record too often.
    pub(super) fn graph_key(&self, plan: &BatchPlan, row_cap: usize) -> Option<GraphKey> {
        let kv = self.step.kv_shape?;
        if !self.graphs.on {
            return None;
        }
        GraphKey::for_plan(plan, &kv, self.ctx.caps.sms, row_cap)
            .filter(|k| self.graphs.failed.get(k).is_none_or(|&n| n < GRAPH_TRIES))
    }

    /// Runs `ops` for step `b`: eagerly, or from its shape's graph (recording it first on
    /// the shape's second step).
    pub(super) fn run_graphed(
        &mut self,
        b: &GpuBatch,
        mut ops: impl FnMut(&mut Self) -> Result<(), BackendError>,
    ) -> Result<(), BackendError> {
        self.layout(b)?;
        let Some(key) = b.graph else {
            return ops(self);
        };
        if self.graphs.generation != self.ctx.generation {
            self.graphs.recorded.clear();
            self.graphs.seen.clear();
            self.graphs.generation = self.ctx.generation;
        }
        if let Some(g) = self.graphs.recorded.get(&key) {
            let dev = &mut self.ctx.dev;
            dev.timed("decode_graph", |rt| {
                rt.replay(g).map_err(runtime::dev_err("decode_graph"))
            })?;
            self.graphs.stats.replays += 1;
            return Ok(());
        }
        // The first step of a shape runs eagerly: it makes every lazy allocation (rope
        // tables, workspaces) that a recording must not.
        if self.graphs.seen.insert(key) {
            return ops(self);
        }
        let generation = self.ctx.generation;
        self.ctx
            .dev
            .rt
            .begin_capture()
            .map_err(runtime::dev_err("graph capture"))?;
        self.ctx.dev.capturing = true;
        self.ctx.dev.capture_rows = key.rows;
        let recorded = ops(self);
        self.ctx.dev.capturing = false;
        let graph = self.ctx.dev.rt.end_capture();
        match (recorded, graph) {
            (Ok(()), Ok(g)) if generation == self.ctx.generation => {
                self.ctx.dev.timed("decode_graph", |rt| {
                    rt.replay(&g).map_err(runtime::dev_err("decode_graph"))
                })?;
                self.graphs.recorded.insert(key, g);
                self.graphs.stats.captures += 1;
                Ok(())
            }
            (recorded, graph) => {
                // Nothing recorded ran: run the step eagerly; the shape is recorded again on
                // a later step, up to GRAPH_TRIES attempts.
                let why = recorded
                    .err()
                    .map(|e| e.to_string())
                    .or(graph.err().map(|e| e.to_string()));
                let why = why.unwrap_or_else(|| "the buffers moved while it recorded".into());
                tracing::warn!(?key, reason = %why, "decode graph not recorded; running eagerly");
                self.graphs.stats.last_failure = Some(why);
                *self.graphs.failed.entry(key).or_default() += 1;
                self.graphs.stats.failures += 1;
                ops(self)
            }
        }
    }
}
