//! Figures of a run: throughput, latency percentiles and failures, as a table or JSON.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::record::RequestRecord;

/// Distribution of one latency in milliseconds (all zero when there are no values).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    pub count: usize,
    pub mean: f64,
    pub std: f64,
    pub min: f64,
    pub median: f64,
    pub p90: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
}

/// The `q`-th percentile (0..=100) of ascending `sorted`, interpolating linearly between
/// ranks (numpy's default), so percentiles never decrease with `q`. 0 for no values.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    match sorted.len() {
        0 => 0.0,
        1 => sorted[0],
        n => {
            let rank = (q.clamp(0.0, 100.0) / 100.0) * (n - 1) as f64;
            let lo = rank.floor() as usize;
            let hi = (lo + 1).min(n - 1);
            let frac = rank - lo as f64;
            sorted[lo] + (sorted[hi] - sorted[lo]) * frac
        }
    }
}

impl Stats {
    /// Statistics of `values`; non-finite values are ignored.
    pub fn of(values: impl IntoIterator<Item = f64>) -> Self {
        let mut v: Vec<f64> = values.into_iter().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return Self::default();
        }
        v.sort_by(f64::total_cmp);
        let n = v.len() as f64;
        let mean = v.iter().sum::<f64>() / n;
        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
        Self {
            count: v.len(),
            mean,
            std: var.sqrt(),
            min: v[0],
            median: percentile(&v, 50.0),
            p90: percentile(&v, 90.0),
            p95: percentile(&v, 95.0),
            p99: percentile(&v, 99.0),
            max: v[v.len() - 1],
        }
    }
}

/// Every figure of a run. Throughputs are over `duration_s` and count successful requests only.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// From the first arrival to the last request's end.
    pub duration_s: f64,
    pub completed: usize,
    pub failed: usize,
    pub total_input_tokens: usize,
    pub total_output_tokens: usize,
    /// Completed requests per second.
    pub request_throughput: f64,
    pub input_throughput: f64,
    pub output_throughput: f64,
    pub total_token_throughput: f64,
    pub ttft_ms: Stats,
    pub tpot_ms: Stats,
    pub itl_ms: Stats,
    pub e2e_ms: Stats,
    /// Failure counts by [`super::record::Failure::kind`].
    pub failures: BTreeMap<String, usize>,
    /// Completed requests whose token counts came from `usage` (the rest counted chunks).
    pub usage_reported: usize,
    /// Completed requests whose prompt tokens differ from the workload's count (chat
    /// templates add tokens, so expect these with `--endpoint chat`).
    pub prompt_len_mismatches: usize,
    /// Completed requests that generated fewer tokens than asked (EOS without `--ignore-eos`).
    pub short_outputs: usize,
}

impl Summary {
    /// Figures of `records` over a run of `duration`.
    pub fn of(records: &[RequestRecord], duration: Duration) -> Self {
        let ok: Vec<&RequestRecord> = records.iter().filter(|r| r.ok()).collect();
        let mut failures = BTreeMap::new();
        for f in records.iter().filter_map(|r| r.error.as_ref()) {
            *failures.entry(f.kind.clone()).or_insert(0) += 1;
        }
        let duration_s = duration.as_secs_f64();
        let per_s = |x: usize| {
            if duration_s > 0.0 {
                x as f64 / duration_s
            } else {
                0.0
            }
        };
        let total_input_tokens = ok.iter().map(|r| r.prompt_tokens).sum();
        let total_output_tokens = ok.iter().map(|r| r.output_tokens).sum();
        Self {
            duration_s,
            completed: ok.len(),
            failed: records.len() - ok.len(),
            total_input_tokens,
            total_output_tokens,
            request_throughput: per_s(ok.len()),
            input_throughput: per_s(total_input_tokens),
            output_throughput: per_s(total_output_tokens),
            total_token_throughput: per_s(total_input_tokens + total_output_tokens),
            ttft_ms: Stats::of(ok.iter().filter_map(|r| r.ttft_ms)),
            tpot_ms: Stats::of(ok.iter().filter_map(|r| r.tpot_ms)),
            itl_ms: Stats::of(ok.iter().flat_map(|r| r.itl_ms.iter().copied())),
            e2e_ms: Stats::of(ok.iter().map(|r| r.e2e_ms)),
            failures,
            usage_reported: ok.iter().filter(|r| r.usage_reported).count(),
            prompt_len_mismatches: ok
                .iter()
                .filter(|r| {
                    r.expected_prompt_tokens
                        .is_some_and(|e| e != r.prompt_tokens)
                })
                .count(),
            short_outputs: ok
                .iter()
                .filter(|r| r.output_tokens < r.requested_output_tokens)
                .count(),
        }
    }

    /// A fixed-width text table of the figures.
    pub fn table(&self, title: &str) -> String {
        let mut s = String::new();
        let rule = "=".repeat(66);
        let _ = writeln!(s, "{rule}\n{title:^66}\n{rule}");
        let mut row = |k: &str, v: String| {
            let _ = writeln!(s, "{k:<40}{v:>26}");
        };
        row("Successful requests:", self.completed.to_string());
        row("Failed requests:", self.failed.to_string());
        row("Benchmark duration (s):", format!("{:.2}", self.duration_s));
        row("Total input tokens:", self.total_input_tokens.to_string());
        row(
            "Total generated tokens:",
            self.total_output_tokens.to_string(),
        );
        row(
            "Request throughput (req/s):",
            format!("{:.2}", self.request_throughput),
        );
        row(
            "Input token throughput (tok/s):",
            format!("{:.2}", self.input_throughput),
        );
        row(
            "Output token throughput (tok/s):",
            format!("{:.2}", self.output_throughput),
        );
        row(
            "Total token throughput (tok/s):",
            format!("{:.2}", self.total_token_throughput),
        );
        let _ = writeln!(s, "{}", "-".repeat(66));
        let _ = writeln!(
            s,
            "{:<10}{:>12}{:>12}{:>12}{:>12}{:>8}",
            "(ms)", "mean", "median", "p90", "p99", "n"
        );
        for (name, st) in [
            ("TTFT", &self.ttft_ms),
            ("TPOT", &self.tpot_ms),
            ("ITL", &self.itl_ms),
            ("E2E", &self.e2e_ms),
        ] {
            let _ = writeln!(
                s,
                "{name:<10}{:>12.2}{:>12.2}{:>12.2}{:>12.2}{:>8}",
                st.mean, st.median, st.p90, st.p99, st.count
            );
        }
        if !self.failures.is_empty() {
            let _ = writeln!(s, "{}", "-".repeat(66));
            for (kind, n) in &self.failures {
                let _ = writeln!(s, "{:<40}{n:>26}", format!("Failed ({kind}):"));
            }
        }
        let _ = writeln!(s, "{rule}");
        s
    }
}

/// What ran: the settings a reader needs to reproduce or compare a run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    /// `--label`, or the target.
    pub label: String,
    /// The base URL, or `offline`.
    pub target: String,
    pub endpoint: String,
    pub model: String,
    pub dataset: String,
    pub num_prompts: usize,
    pub request_rate: String,
    pub max_concurrency: Option<usize>,
    pub seed: u64,
    pub ignore_eos: bool,
    /// Seconds since the Unix epoch when the run started.
    pub started_unix_s: u64,
    pub kiln_version: String,
}

/// The whole result: settings, figures and every request (what `--json` writes).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub run: RunInfo,
    pub summary: Summary,
    pub requests: Vec<RequestRecord>,
}

impl Report {
    /// The summary of `requests` over `duration`.
    pub fn new(run: RunInfo, requests: Vec<RequestRecord>, duration: Duration) -> Self {
        Self {
            summary: Summary::of(&requests, duration),
            run,
            requests,
        }
    }

    /// Pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }

    /// The table under a title naming the run.
    pub fn table(&self) -> String {
        self.summary
            .table(&format!("kiln bench: {}", self.run.label))
    }
}
