//! The deployment files in `docker/` against the real server: every metric the Grafana
//! dashboard queries is exported by Kiln's `/metrics`, and the compose, Prometheus, Grafana
//! provisioning and Dockerfiles parse and carry what an AMD (and NVIDIA) deployment needs.

mod api_support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use api_support::*;
use serde_json::{Value, json};
use serde_norway::Value as Yaml;

fn docker(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("docker")
        .join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(docker(path)).unwrap_or_else(|e| panic!("docker/{path}: {e}"))
}

fn yaml(path: &str) -> Yaml {
    serde_norway::from_str(&read(path)).unwrap_or_else(|e| panic!("docker/{path} is not YAML: {e}"))
}

fn dashboard() -> Value {
    serde_json::from_str(&read("grafana/dashboards/kiln.json"))
        .expect("docker/grafana/dashboards/kiln.json is not JSON")
}

/// Every PromQL text of the dashboard: panel target `expr`s and template-variable queries.
fn queries(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                match (k.as_str(), x) {
                    ("expr" | "definition", Value::String(s)) => out.push(s.clone()),
                    ("query", Value::String(s)) if s.contains('(') => out.push(s.clone()),
                    _ => queries(x, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| queries(x, out)),
        _ => {}
    }
}

/// The `kiln_*` metric names in a PromQL expression.
fn metric_names(expr: &str) -> Vec<String> {
    let b = expr.as_bytes();
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b':';
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if expr[i..].starts_with("kiln_") && (i == 0 || !word(b[i - 1])) {
            let end = (i..b.len()).find(|&j| !word(b[j])).unwrap_or(b.len());
            out.push(expr[i..end].to_string());
            i = end;
        } else {
            i += 1;
        }
    }
    out
}

/// `# TYPE <name> <type>` lines of an exposition.
fn declared(exposition: &str) -> Vec<(String, String)> {
    exposition
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            Some((it.next()?.to_string(), it.next()?.to_string()))
        })
        .collect()
}

/// Why `name` does not resolve to a declared family, if it does not.
fn missing(name: &str, types: &[(String, String)]) -> Option<String> {
    let ty = |n: &str| types.iter().find(|(m, _)| m == n).map(|(_, t)| t.as_str());
    if ty(name).is_some() {
        return None;
    }
    for (suffix, kinds) in [
        ("_bucket", &["histogram"][..]),
        ("_sum", &["histogram", "summary"][..]),
        ("_count", &["histogram", "summary"][..]),
    ] {
        if let Some(base) = name.strip_suffix(suffix) {
            return match ty(base) {
                Some(t) if kinds.contains(&t) => None,
                Some(t) => Some(format!("{name}: {base} is a {t}, not a {kinds:?}")),
                None => Some(format!("{name}: no `# TYPE {base}` in /metrics")),
            };
        }
    }
    Some(format!("{name}: no `# TYPE {name}` in /metrics"))
}

#[test]
fn metric_name_helpers() {
    assert_eq!(
        metric_names(
            "histogram_quantile(0.9, sum by (le) (rate(kiln_a_bucket{job=~\"$job\"}[5m]))) / kiln_b"
        ),
        ["kiln_a_bucket", "kiln_b"]
    );
    assert!(metric_names("rate(not_kiln_x[1m])").is_empty());
    let t = vec![
        ("kiln_h".to_string(), "histogram".to_string()),
        ("kiln_c_total".to_string(), "counter".to_string()),
    ];
    assert_eq!(missing("kiln_h_bucket", &t), None);
    assert_eq!(missing("kiln_h_count", &t), None);
    assert_eq!(missing("kiln_c_total", &t), None);
    assert!(missing("kiln_c_total_bucket", &t).is_some());
    assert!(missing("kiln_nope", &t).is_some());
}

#[tokio::test]
async fn dashboard_queries_only_metrics_kiln_exports() {
    let s = shared();
    let model = s.state.ready().expect("ready").model_name.clone();
    let (status, _, body) = post(
        &s.base,
        "/v1/completions",
        &json!({"model": model, "prompt": "Once upon a time", "max_tokens": 4, "temperature": 0}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, text) = get(&s.base, "/metrics").await;
    assert_eq!(status, 200, "{text}");
    let types = declared(&text);

    let mut exprs = Vec::new();
    queries(&dashboard(), &mut exprs);
    assert!(
        exprs.len() >= 15,
        "too few queries in the dashboard: {exprs:?}"
    );
    let mut names = BTreeSet::new();
    for e in &exprs {
        let n = metric_names(e);
        assert!(!n.is_empty(), "dashboard query names no kiln_ metric: {e}");
        names.extend(n);
    }
    let problems: Vec<String> = names.iter().filter_map(|n| missing(n, &types)).collect();
    assert!(
        problems.is_empty(),
        "the dashboard queries metrics Kiln does not export (metrics only observed on a GPU \
         must still be declared with HELP/TYPE):\n  {}\n/metrics declares: {:?}",
        problems.join("\n  "),
        types.iter().map(|(n, _)| n).collect::<Vec<_>>()
    );
}

#[test]
fn dashboard_has_the_promised_panels() {
    let d = dashboard();
    let panels = d["panels"].as_array().expect("panels");
    let find = |needle: &str| {
        panels.iter().find(|p| {
            let mut e = Vec::new();
            queries(p, &mut e);
            e.iter().any(|x| x.contains(needle))
        })
    };
    for needle in [
        "kiln_request_success_total",
        "kiln_requests_running",
        "kiln_requests_waiting",
        "kiln_prompt_tokens_total",
        "kiln_generation_tokens_total",
        "kiln_kv_cache_usage_ratio",
        "kiln_preemptions_total",
        "kiln_prefix_cache_hits_total",
        "kiln_prefix_cache_queries_total",
    ] {
        assert!(find(needle).is_some(), "no panel queries {needle}");
    }
    for h in [
        "kiln_time_to_first_token_seconds_bucket",
        "kiln_inter_token_latency_seconds_bucket",
    ] {
        let p = find(h).unwrap_or_else(|| panic!("no panel queries {h}"));
        let mut e = Vec::new();
        queries(p, &mut e);
        assert!(
            e.iter().any(|x| x.contains("histogram_quantile")),
            "{h}: no percentiles"
        );
    }
    let heat = find("kiln_kernel_duration_seconds_bucket").expect("no kernel latency panel");
    assert!(
        panels.iter().any(|p| p["type"] == "heatmap"
            && p.to_string()
                .contains("kiln_kernel_duration_seconds_bucket")),
        "per-kernel latency must be a heatmap: {heat}"
    );
    // Panels reach Prometheus through the provisioned datasource.
    let ds = yaml("grafana/provisioning/datasources/prometheus.yaml");
    let uid = ds["datasources"][0]["uid"]
        .as_str()
        .expect("datasource uid");
    assert!(
        d.to_string().contains(uid),
        "dashboard never names datasource {uid}"
    );
}

fn strings(v: &Yaml) -> Vec<String> {
    v.as_sequence()
        .map(|s| {
            s.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn compose_runs_kiln_on_amd_with_monitoring() {
    let c = yaml("compose.yaml");
    let kiln = &c["services"]["kiln"];
    assert_eq!(
        kiln["build"]["dockerfile"].as_str(),
        Some("docker/Dockerfile.rocm")
    );
    let devices = strings(&kiln["devices"]);
    for d in ["/dev/kfd", "/dev/dri"] {
        assert!(
            devices
                .iter()
                .any(|x| x == d || x.starts_with(&format!("{d}:"))),
            "{d} not passed: {devices:?}"
        );
    }
    let groups = strings(&kiln["group_add"]);
    for g in ["video", "render"] {
        assert!(
            groups.iter().any(|x| x == g),
            "group {g} missing: {groups:?}"
        );
    }
    assert!(
        kiln["command"].as_sequence().is_some_and(|s| s
            .iter()
            .any(|x| x.as_str().is_some_and(|x| x.contains("rocm:0")))),
        "kiln must serve --device rocm:0"
    );
    let hc = serde_json::to_string(&kiln["healthcheck"]["test"]).unwrap();
    assert!(
        hc.contains("/health") && hc.contains("8000"),
        "healthcheck: {hc}"
    );
    let ports = serde_json::to_string(&kiln["ports"]).unwrap();
    assert!(ports.contains(":8000"), "port 8000 not published: {ports}");
    let models_ro = kiln["volumes"]
        .as_sequence()
        .expect("kiln volumes")
        .iter()
        .any(|v| match v {
            Yaml::String(s) => s.ends_with(":/models:ro"),
            m => m["target"].as_str() == Some("/models") && m["read_only"].as_bool() == Some(true),
        });
    assert!(
        models_ro,
        "the model directory must be mounted read-only at /models"
    );

    assert!(
        c["services"]["prometheus"]["image"]
            .as_str()
            .is_some_and(|i| i.contains("prometheus"))
    );
    assert!(
        c["services"]["grafana"]["image"]
            .as_str()
            .is_some_and(|i| i.contains("grafana"))
    );
    let gv = strings(&c["services"]["grafana"]["volumes"]).join(" ");
    assert!(
        gv.contains("./grafana/provisioning:/etc/grafana/provisioning"),
        "{gv}"
    );
    assert!(
        gv.contains("./grafana/dashboards:/var/lib/grafana/dashboards"),
        "{gv}"
    );
    let provider = yaml("grafana/provisioning/dashboards/kiln.yaml");
    assert_eq!(
        provider["providers"][0]["options"]["path"].as_str(),
        Some("/var/lib/grafana/dashboards")
    );
    let ds = yaml("grafana/provisioning/datasources/prometheus.yaml");
    assert_eq!(
        ds["datasources"][0]["url"].as_str(),
        Some("http://prometheus:9090")
    );
    let pv = strings(&c["services"]["prometheus"]["volumes"]).join(" ");
    assert!(
        pv.contains("./prometheus.yml:/etc/prometheus/prometheus.yml"),
        "{pv}"
    );
}

#[test]
fn compose_nvidia_override_uses_cuda() {
    let c = yaml("compose.nvidia.yaml");
    let kiln = &c["services"]["kiln"];
    assert_eq!(
        kiln["build"]["dockerfile"].as_str(),
        Some("docker/Dockerfile.cuda")
    );
    let gpus = kiln["gpus"].as_str() == Some("all");
    let reserved = serde_json::to_string(&kiln["deploy"]["resources"]["reservations"]["devices"])
        .unwrap()
        .contains("nvidia");
    assert!(
        gpus && reserved,
        "NVIDIA override needs gpus: all and a device reservation"
    );
    assert!(
        serde_json::to_string(&kiln["command"])
            .unwrap()
            .contains("cuda:0")
    );
}

#[test]
fn prometheus_scrapes_kiln() {
    let p = yaml("prometheus.yml");
    let jobs = p["scrape_configs"].as_sequence().expect("scrape_configs");
    let kiln = jobs
        .iter()
        .find(|j| {
            j["static_configs"].as_sequence().is_some_and(|s| {
                s.iter()
                    .any(|c| strings(&c["targets"]).iter().any(|t| t == "kiln:8000"))
            })
        })
        .expect("no scrape job targets kiln:8000");
    assert!(matches!(
        kiln["metrics_path"].as_str(),
        None | Some("/metrics")
    ));
}

#[test]
fn dockerfiles_build_and_serve_each_backend() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for (file, feature, device, base) in [
        ("Dockerfile.rocm", "--features rocm", "rocm:0", "rocm/"),
        (
            "Dockerfile.cuda",
            "--features cuda",
            "cuda:0",
            "nvidia/cuda",
        ),
    ] {
        let text = read(file);
        let froms: Vec<&str> = text.lines().filter(|l| l.starts_with("FROM ")).collect();
        assert!(froms.len() >= 2, "{file}: not multi-stage");
        assert!(text.contains(feature), "{file}: no {feature}");
        assert!(
            text.contains(device) && text.contains("0.0.0.0"),
            "{file}: serve flags"
        );
        assert!(text.contains(base), "{file}: runtime base {base}");
        assert!(text.contains("/health"), "{file}: no health check");
        // Every build-context path copied in exists (globs aside), so the build cannot
        // fail on a file the repository no longer has.
        for l in text
            .lines()
            .filter(|l| l.starts_with("COPY ") && !l.contains("--from="))
        {
            let parts: Vec<&str> = l.split_whitespace().skip(1).collect();
            for src in &parts[..parts.len() - 1] {
                if !src.contains('*') {
                    assert!(root.join(src).exists(), "{file}: COPY {src}: no such path");
                }
            }
        }
    }
}
