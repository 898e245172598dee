//! Sampled kernel durations from device events, the raw samples behind
//! `kiln_kernel_duration_seconds{device,kernel}`. Every `period`-th step, each launch (and
//! each cuBLAS call) is bracketed by two events; [`Timer::take`] reads them out.

use super::runtime::{Runtime, dev_err};
use crate::backend::BackendError;

/// Most launches recorded between two reads; later ones in the same window go untimed.
const MAX_PENDING: usize = 8192;

/// One kernel's device time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KernelTiming {
    /// The op name (`attention`, `matmul`, `rms_norm`, ...).
    pub kernel: &'static str,
    pub seconds: f64,
}

/// Event pairs around sampled launches.
pub struct Timer<R: Runtime> {
    period: Option<u64>,
    active: bool,
    events: Vec<R::Event>,
    pending: Vec<&'static str>,
}

impl<R: Runtime> Timer<R> {
    /// Times every `period`-th step; `None` never times.
    pub fn new(period: Option<u64>) -> Timer<R> {
        Timer {
            period: period.filter(|&p| p > 0),
            active: false,
            events: Vec::new(),
            pending: Vec::new(),
        }
    }

    pub fn set_period(&mut self, period: Option<u64>) {
        self.period = period.filter(|&p| p > 0);
    }

    /// Called once per step (by `prepare`): decides whether this step is timed.
    pub fn begin_step(&mut self, step: u64) {
        self.active = self.period.is_some_and(|p| step.is_multiple_of(p));
    }

    /// Records the start event of a launch; `Some(index)` when this launch is timed.
    pub fn start(&mut self, rt: &R, op: &'static str) -> Result<Option<usize>, BackendError> {
        if !self.active || self.pending.len() >= MAX_PENDING {
            return Ok(None);
        }
        let i = self.pending.len();
        while self.events.len() < 2 * (i + 1) {
            self.events.push(rt.new_event().map_err(dev_err("timing"))?);
        }
        rt.record(&self.events[2 * i]).map_err(dev_err("timing"))?;
        self.pending.push(op);
        Ok(Some(i))
    }

    /// Records the end event of timed launch `i`.
    pub fn end(&mut self, i: Option<usize>, rt: &R) -> Result<(), BackendError> {
        match i {
            Some(i) => rt
                .record(&self.events[2 * i + 1])
                .map_err(dev_err("timing")),
            None => Ok(()),
        }
    }

    /// The durations recorded since the last call (waits for them to complete).
    pub fn take(&mut self, rt: &R) -> Result<Vec<KernelTiming>, BackendError> {
        let mut out = Vec::with_capacity(self.pending.len());
        for (i, &kernel) in self.pending.iter().enumerate() {
            let ms = rt
                .elapsed_ms(&self.events[2 * i], &self.events[2 * i + 1])
                .map_err(dev_err("timing"))?;
            out.push(KernelTiming {
                kernel,
                seconds: ms as f64 * 1e-3,
            });
        }
        self.pending.clear();
        Ok(out)
    }
}
