//! Every Prometheus metric Kiln exports, defined here and nowhere else (names follow vLLM's).
//!
//! Request-level metrics are observed by the API as responses finish; engine gauges and
//! counters are read from an [`EngineStats`] snapshot at scrape time.

use prometheus::core::Collector;
use prometheus::proto::MetricFamily;
use prometheus::{
    Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::engine::stats::{DURATION_BUCKETS, PlainHistogram};
use crate::engine::{EngineStats, FinishReason, RequestTimings, Usage};

/// Metric names, in one place.
pub mod names {
    pub const REQUESTS_RUNNING: &str = "kiln_requests_running";
    pub const REQUESTS_WAITING: &str = "kiln_requests_waiting";
    pub const KV_CACHE_USAGE: &str = "kiln_kv_cache_usage_ratio";
    pub const PREFIX_CACHE_QUERIES: &str = "kiln_prefix_cache_queries_total";
    pub const PREFIX_CACHE_HITS: &str = "kiln_prefix_cache_hits_total";
    pub const PREEMPTIONS: &str = "kiln_preemptions_total";
    pub const LANE_HEALTHY: &str = "kiln_lane_healthy";
    pub const PROMPT_TOKENS: &str = "kiln_prompt_tokens_total";
    pub const GENERATION_TOKENS: &str = "kiln_generation_tokens_total";
    pub const REQUEST_SUCCESS: &str = "kiln_request_success_total";
    pub const REQUEST_ERRORS: &str = "kiln_request_errors_total";
    pub const TTFT: &str = "kiln_time_to_first_token_seconds";
    pub const ITL: &str = "kiln_inter_token_latency_seconds";
    pub const E2E: &str = "kiln_e2e_request_latency_seconds";
    pub const QUEUE_TIME: &str = "kiln_request_queue_time_seconds";
    pub const CLIENT_DISCONNECTS: &str = "kiln_http_requests_client_disconnected_total";
    pub const IN_FLIGHT: &str = "kiln_http_requests_in_flight";
    pub const OVERLOADED: &str = "kiln_http_requests_overloaded_total";
    pub const BUILD_INFO: &str = "kiln_build_info";
    pub const STEP_DURATION: &str = "kiln_step_duration_seconds";
    pub const KERNEL_DURATION: &str = "kiln_kernel_duration_seconds";
    pub const LOG_LINES_DROPPED: &str = "kiln_log_lines_dropped_total";
}

const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
const ITL_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
    7.5, 10.0, 20.0, 40.0, 80.0,
];
const REQUEST_BUCKETS: &[f64] = &[
    0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
    60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
];

/// The backends compiled into this binary, e.g. `cpu,cuda`.
pub fn compiled_backends() -> String {
    let mut b = vec!["cpu"];
    if cfg!(feature = "cuda") {
        b.push("cuda");
    }
    if cfg!(feature = "rocm") {
        b.push("rocm");
    }
    b.join(",")
}

/// The request-level metrics of one server (one registry per server, so tests can run
/// several servers in one process).
pub struct Metrics {
    registry: Registry,
    ttft: Histogram,
    itl: Histogram,
    e2e: Histogram,
    queue: Histogram,
    prompt_tokens: IntCounter,
    generation_tokens: IntCounter,
    success: IntCounterVec,
    errors: IntCounterVec,
    disconnects: IntCounter,
    in_flight: IntGauge,
    overloaded: IntCounter,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

fn histogram(name: &str, help: &str, buckets: &[f64]) -> Histogram {
    Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets.to_vec()))
        .expect("static histogram definition")
}

impl Metrics {
    /// Registers every metric in a fresh registry.
    pub fn new() -> Self {
        use names::*;
        let counter = |name: &str, help: &str| IntCounter::new(name, help).expect("static counter");
        let counter_vec = |name: &str, help: &str, label: &str| {
            IntCounterVec::new(Opts::new(name, help), &[label]).expect("static counter")
        };
        let m = Self {
            registry: Registry::new(),
            ttft: histogram(TTFT, "Time to first token in seconds.", TTFT_BUCKETS),
            itl: histogram(
                ITL,
                "Time between consecutive output tokens in seconds.",
                ITL_BUCKETS,
            ),
            e2e: histogram(
                E2E,
                "End-to-end request latency in seconds.",
                REQUEST_BUCKETS,
            ),
            queue: histogram(
                QUEUE_TIME,
                "Time requests spent waiting before being scheduled.",
                REQUEST_BUCKETS,
            ),
            prompt_tokens: counter(PROMPT_TOKENS, "Prompt tokens processed."),
            generation_tokens: counter(GENERATION_TOKENS, "Tokens generated."),
            success: counter_vec(
                REQUEST_SUCCESS,
                "Finished choices by finish reason.",
                "finished_reason",
            ),
            errors: counter_vec(REQUEST_ERRORS, REQUEST_ERRORS_HELP, "type"),
            disconnects: counter(
                CLIENT_DISCONNECTS,
                "Requests whose client went away before the end.",
            ),
            in_flight: IntGauge::new(
                IN_FLIGHT,
                "Requests in flight (all but /health and /metrics), bounded by server.max_in_flight.",
            )
            .expect("static gauge"),
            overloaded: counter(
                OVERLOADED,
                "Requests refused at once with 503 because server.max_in_flight were in flight.",
            ),
        };
        let build_info = IntGaugeVec::new(
            Opts::new(BUILD_INFO, "Kiln version and compiled backends."),
            &["version", "backends"],
        )
        .expect("static gauge");
        build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION"), &compiled_backends()])
            .set(1);
        let collectors: Vec<Box<dyn Collector>> = vec![
            Box::new(m.ttft.clone()),
            Box::new(m.itl.clone()),
            Box::new(m.e2e.clone()),
            Box::new(m.queue.clone()),
            Box::new(m.prompt_tokens.clone()),
            Box::new(m.generation_tokens.clone()),
            Box::new(m.success.clone()),
            Box::new(m.errors.clone()),
            Box::new(m.disconnects.clone()),
            Box::new(m.in_flight.clone()),
            Box::new(m.overloaded.clone()),
            Box::new(build_info),
        ];
        for c in collectors {
            m.registry.register(c).expect("metric names are unique");
        }
        m
    }

    /// A finished request: token counts and latencies.
    pub fn observe_done(&self, usage: &Usage, timings: &RequestTimings) {
        self.prompt_tokens.inc_by(usage.prompt_tokens as u64);
        self.generation_tokens
            .inc_by(usage.completion_tokens as u64);
        self.ttft.observe(timings.ttft.as_secs_f64());
        self.e2e.observe(timings.e2e.as_secs_f64());
        self.queue.observe(timings.queue.as_secs_f64());
        for gap in &timings.inter_token {
            self.itl.observe(gap.as_secs_f64());
        }
    }

    /// A choice ended.
    pub fn observe_finish(&self, reason: FinishReason) {
        self.success.with_label_values(&[reason.as_str()]).inc();
    }

    /// A request failed with this OpenAI error type (`invalid_request_error`, ...).
    pub fn observe_error(&self, error_type: &str) {
        self.errors.with_label_values(&[error_type]).inc();
    }

    /// A client went away before its response ended.
    pub fn observe_disconnect(&self) {
        self.disconnects.inc();
    }

    /// A request refused because `server.max_in_flight` requests were in flight.
    pub fn observe_overloaded(&self) {
        self.overloaded.inc();
    }

    /// The requests in flight now (set at scrape time).
    pub fn set_in_flight(&self, n: usize) {
        self.in_flight.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// Prometheus text exposition of everything, engine gauges read from `stats`.
    pub fn render(&self, stats: Option<&EngineStats>) -> String {
        let mut families = self.registry.gather();
        families.extend(process_families());
        if let Some(s) = stats {
            families.extend(engine_families(s));
        }
        families.sort_by(|a, b| a.name().cmp(b.name()));
        let mut out = Vec::new();
        // Encoding into a Vec cannot fail for well-formed families.
        let _ = TextEncoder::new().encode(&families, &mut out);
        let mut text = String::from_utf8(out).unwrap_or_default();
        // Families with no series yet (kernel timings before GPU work, error counts before
        // the first error) are still declared, so dashboards and checks can rely on every name.
        for (name, help, kind) in [
            (names::STEP_DURATION, STEP_HELP, "histogram"),
            (names::KERNEL_DURATION, KERNEL_HELP, "histogram"),
            (names::REQUEST_ERRORS, REQUEST_ERRORS_HELP, "counter"),
        ] {
            if !text.contains(&format!("# TYPE {name} ")) {
                text.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
            }
        }
        text
    }
}

/// Families of process-wide counts (one log output per process, not per server).
fn process_families() -> Vec<MetricFamily> {
    let dropped = IntCounter::new(
        names::LOG_LINES_DROPPED,
        "Log lines dropped because the log output (stderr) refused them: a full disk, a closed pipe.",
    )
    .expect("static counter");
    dropped.inc_by(crate::logging::dropped_lines());
    dropped.collect()
}

/// Families built from a snapshot, so the engine never imports Prometheus types.
fn engine_families(s: &EngineStats) -> Vec<MetricFamily> {
    use names::*;
    let mut out = Vec::new();
    let gauge_i = |name: &str, help: &str, v: usize| {
        let g = IntGauge::new(name, help).expect("static gauge");
        g.set(v as i64);
        g.collect()
    };
    let counter = |name: &str, help: &str, v: u64| {
        let c = IntCounter::new(name, help).expect("static counter");
        c.inc_by(v);
        c.collect()
    };
    out.extend(gauge_i(
        REQUESTS_RUNNING,
        "Requests running on a lane.",
        s.running(),
    ));
    out.extend(gauge_i(
        REQUESTS_WAITING,
        "Requests waiting to be scheduled.",
        s.waiting(),
    ));
    let kv = Gauge::new(KV_CACHE_USAGE, "Fraction of KV cache blocks in use (0..1).")
        .expect("static gauge");
    kv.set(s.kv_usage());
    out.extend(kv.collect());
    out.extend(counter(
        PREFIX_CACHE_QUERIES,
        "Prompt tokens looked up in the prefix cache.",
        s.prefix_cache_queries(),
    ));
    out.extend(counter(
        PREFIX_CACHE_HITS,
        "Prompt tokens served from the prefix cache.",
        s.prefix_cache_hits(),
    ));
    out.extend(counter(
        PREEMPTIONS,
        "Requests preempted for lack of KV blocks.",
        s.preemptions(),
    ));
    let healthy = GaugeVec::new(
        Opts::new(LANE_HEALTHY, "1 while a lane serves, 0 after it failed."),
        &["lane", "device"],
    )
    .expect("static gauge");
    for (i, l) in s.lanes.iter().enumerate() {
        healthy
            .with_label_values(&[&i.to_string(), &l.device])
            .set(if l.healthy { 1.0 } else { 0.0 });
    }
    out.extend(healthy.collect());
    let steps = s.lanes.iter().flat_map(|l| {
        l.step_durations
            .iter()
            .map(move |(phase, h)| (vec![("device", l.device.as_str()), ("phase", *phase)], h))
    });
    out.extend(histogram_family(STEP_DURATION, STEP_HELP, steps));
    let kernels = s.lanes.iter().flat_map(|l| {
        l.kernel_durations
            .iter()
            .map(move |(k, h)| (vec![("device", l.device.as_str()), ("kernel", *k)], h))
    });
    out.extend(histogram_family(KERNEL_DURATION, KERNEL_HELP, kernels));
    out
}

const REQUEST_ERRORS_HELP: &str = "Failed requests by OpenAI error type.";
const STEP_HELP: &str = "Duration of engine steps by phase.";
const KERNEL_HELP: &str = "Device-timed kernel durations (sampled).";

/// A histogram family from plain snapshot histograms (`None` without series: the text
/// encoder refuses empty families; `render` declares those names itself).
fn histogram_family<'a>(
    name: &str,
    help: &str,
    series: impl Iterator<Item = (Vec<(&'a str, &'a str)>, &'a PlainHistogram)>,
) -> Option<MetricFamily> {
    use prometheus::proto::{Bucket, LabelPair, Metric, MetricType};
    let mut family = MetricFamily::default();
    family.set_name(name.to_string());
    family.set_help(help.to_string());
    family.set_field_type(MetricType::HISTOGRAM);
    for (labels, h) in series {
        let mut hist = prometheus::proto::Histogram::default();
        hist.set_sample_count(h.count);
        hist.set_sample_sum(h.sum);
        let mut cumulative = 0;
        let buckets = DURATION_BUCKETS
            .iter()
            .zip(&h.counts)
            .map(|(&bound, &c)| {
                cumulative += c;
                let mut b = Bucket::default();
                b.set_upper_bound(bound);
                b.set_cumulative_count(cumulative);
                b
            })
            .collect();
        hist.set_bucket(buckets);
        let mut m = Metric::default();
        m.set_label(
            labels
                .into_iter()
                .map(|(k, v)| {
                    let mut l = LabelPair::default();
                    l.set_name(k.to_string());
                    l.set_value(v.to_string());
                    l
                })
                .collect(),
        );
        m.set_histogram(hist);
        family.mut_metric().push(m);
    }
    (!family.get_metric().is_empty()).then_some(family)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::LaneStats;
    use std::time::Duration;

    #[test]
    fn renders_every_name() {
        let m = Metrics::new();
        let timings = RequestTimings {
            queue: Duration::from_millis(1),
            ttft: Duration::from_millis(5),
            inter_token: vec![Duration::from_millis(2); 3],
            e2e: Duration::from_millis(11),
        };
        m.observe_done(
            &Usage {
                prompt_tokens: 7,
                completion_tokens: 4,
                cached_tokens: 0,
            },
            &timings,
        );
        m.observe_finish(FinishReason::Length);
        m.observe_error("invalid_request_error");
        m.observe_disconnect();
        m.observe_overloaded();
        m.set_in_flight(3);
        let stats = EngineStats {
            lanes: vec![LaneStats {
                device: "cpu".into(),
                healthy: true,
                running: 2,
                kv_total_blocks: 10,
                kv_free_blocks: 5,
                prefix_cache_queries: 32,
                prefix_cache_hits: 16,
                ..LaneStats::default()
            }],
        };
        let mut stats = stats;
        let decode = stats.lanes[0].step_durations.entry("decode").or_default();
        decode.observe(0.0009);
        decode.observe(0.2);
        let text = m.render(Some(&stats));
        for line in [
            "kiln_requests_running 2",
            "kiln_requests_waiting 0",
            "kiln_kv_cache_usage_ratio 0.5",
            "kiln_prefix_cache_queries_total 32",
            "kiln_prefix_cache_hits_total 16",
            "kiln_preemptions_total 0",
            "kiln_prompt_tokens_total 7",
            "kiln_generation_tokens_total 4",
            "kiln_request_success_total{finished_reason=\"length\"} 1",
            "kiln_request_errors_total{type=\"invalid_request_error\"} 1",
            "kiln_http_requests_client_disconnected_total 1",
            "kiln_http_requests_overloaded_total 1",
            "kiln_http_requests_in_flight 3",
            "# TYPE kiln_log_lines_dropped_total counter",
            "kiln_time_to_first_token_seconds_count 1",
            "kiln_inter_token_latency_seconds_count 3",
            "kiln_e2e_request_latency_seconds_count 1",
            "kiln_request_queue_time_seconds_count 1",
            "kiln_lane_healthy{device=\"cpu\",lane=\"0\"} 1",
            "# TYPE kiln_prefix_cache_hits_total counter",
            "# TYPE kiln_kernel_duration_seconds histogram",
            "kiln_step_duration_seconds_bucket{device=\"cpu\",phase=\"decode\",le=\"0.001\"} 1",
            "kiln_step_duration_seconds_count{device=\"cpu\",phase=\"decode\"} 2",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
        assert!(text.contains("kiln_build_info{backends=\"cpu"), "{text}");
    }
}
