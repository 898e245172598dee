//! The server where its inputs or surroundings fail (issue 37): stderr on a full device or a
//! closed pipe (the `kiln serve` binary starts, serves, counts the dropped log lines and exits
//! on SIGTERM); chat templates from the model file that loop or double a string (400 naming
//! the template limit, quickly, and the server serves on); error messages that echo no
//! megabytes and no paths; a warning when bound beyond loopback without a key; CORS preflights
//! for the SDKs' headers; absolute-form targets checked like `Host`; a binary run away from
//! its source tree (the built-in config, then `$XDG_CONFIG_HOME/kiln/config.toml`).

mod api_support;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use api_support::{
    assert_error, client, model_files, post, shared, start, start_with, test_config,
};
use kiln::tokenizer::Tokenizer;
use serde_json::json;

/// Kills the server if the test fails before it exits.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn serve(port: u16, stderr: Stdio, extra: &[&str]) -> Guard {
    let child = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["serve", "--port", &port.to_string(), "--kv-blocks", "256"])
        .args(extra)
        .env("KILN_MAX_NUM_SEQS", "4")
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap();
    Guard(child)
}

/// Waits for `/health`, failing early with the exit status if the server died.
async fn wait_ready(guard: &mut Guard, base: &str, c: &reqwest::Client) {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(60) {
        if let Some(status) = guard.0.try_wait().unwrap() {
            panic!("kiln serve exited before it was ready: {status:?}");
        }
        if let Ok(r) = c.get(format!("{base}/health")).send().await
            && r.status().is_success()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("kiln serve did not become ready");
}

fn dropped_lines(metrics: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("kiln_log_lines_dropped_total "))
        .unwrap_or_else(|| panic!("no kiln_log_lines_dropped_total in\n{metrics}"))
        .trim()
        .parse()
        .unwrap()
}

/// Serves one completion, checks the drop counter moved, then SIGTERMs and waits for exit 0.
async fn serves_and_stops_with_a_broken_stderr(mut guard: Guard, port: u16) {
    let base = format!("http://127.0.0.1:{port}");
    let c = reqwest::Client::new();
    wait_ready(&mut guard, &base, &c).await;
    let res = c
        .post(format!("{base}/v1/completions"))
        .json(&json!({"prompt": "Once", "max_tokens": 4}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 200, "{:?}", res.text().await);
    let metrics = c
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        dropped_lines(&metrics) > 0,
        "the start-up lines were dropped and counted"
    );
    let pid = guard.0.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let start = Instant::now();
    let status = loop {
        if let Some(s) = guard.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "kiln serve did not exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status:?}");
}

#[tokio::test]
async fn stderr_on_a_full_device_neither_stops_start_nor_shutdown() {
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let port = free_port();
    let guard = serve(port, Stdio::from(full), &[]);
    serves_and_stops_with_a_broken_stderr(guard, port).await;
}

#[tokio::test]
async fn stderr_on_a_closed_pipe_neither_stops_start_nor_shutdown() {
    let port = free_port();
    let mut guard = serve(port, Stdio::piped(), &[]);
    drop(guard.0.stderr.take());
    serves_and_stops_with_a_broken_stderr(guard, port).await;
}

/// A template that loops past its fuel for the message `loop`, doubles a string past its
/// output cap for `double`, and renders the messages plainly otherwise.
const BOMB_TEMPLATE: &str = "{% if messages[0].content == 'loop' %}\
{% for a in range(100000) %}{% for b in range(100000) %}{{ '' }}{% endfor %}{% endfor %}\
{% elif messages[0].content == 'double' %}{% set ns = namespace(s='ab') %}\
{% for i in range(64) %}{{ ns.s }}{% set ns.s = ns.s ~ ns.s %}{% endfor %}\
{% else %}{% for m in messages %}{{ m.content }}{% endfor %}{% endif %}";

/// The fixture's tokenizer with [`BOMB_TEMPLATE`] as its chat template.
fn bomb_tokenizer() -> Tokenizer {
    let base = model_files().tokenizer.expect("a tokenizer");
    let dir = std::env::temp_dir().join(format!("kiln-api-faults-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("tokenizer.json"),
        base.hf().to_string(false).unwrap(),
    )
    .unwrap();
    let config = json!({"bos_token": "<s>", "eos_token": "</s>", "chat_template": BOMB_TEMPLATE});
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
    Tokenizer::from_file(
        &dir.join("tokenizer.json"),
        Some(&dir.join("tokenizer_config.json")),
    )
    .expect("tokenizer with the bomb template")
}

#[tokio::test]
async fn template_bombs_answer_400_quickly_and_the_server_serves_on() {
    let mut files = model_files();
    files.tokenizer = Some(bomb_tokenizer());
    let s = start_with(files, test_config());
    let chat = |content: &str| json!({"messages": [{"role": "user", "content": content}], "max_tokens": 2});
    for (content, limit) in [("loop", "instruction limit"), ("double", "output limit")] {
        let start = Instant::now();
        let (status, _, body) = post(&s.base, "/v1/chat/completions", &chat(content)).await;
        assert_error(
            status,
            &body,
            400,
            "invalid_request_error",
            Some("messages"),
        );
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(limit), "{content}: {message}");
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{content}: {:?}",
            start.elapsed()
        );
    }
    let (status, _, body) = post(&s.base, "/v1/chat/completions", &chat("Once upon a time")).await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test]
async fn error_messages_echo_no_megabytes_and_cards_no_directories() {
    let s = shared();
    let name = "m".repeat(1 << 20);
    let body = json!({"model": name, "prompt": "Once", "max_tokens": 1});
    let (status, _, body) = post(&s.base, "/v1/completions", &body).await;
    assert_error(status, &body, 404, "not_found_error", Some("model"));
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.len() < 1024, "{} bytes", message.len());
    assert!(message.contains("1048576 bytes"), "{message}");
    let models: serde_json::Value = client()
        .get(format!("{}/v1/models", s.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let root = models["data"][0]["root"].as_str().unwrap();
    assert!(!root.contains('/'), "{root}");
}

#[tokio::test]
async fn cors_preflight_allows_the_headers_sdks_send() {
    let origin = "http://app.example";
    let mut cfg = test_config();
    cfg.server.cors_allowed_origins = vec![origin.into()];
    let s = start(cfg);
    let asked = "content-type, x-stainless-os, x-stainless-lang, x-stainless-retry-count, \
                 anthropic-version, x-api-key, authorization";
    let res = client()
        .request(
            reqwest::Method::OPTIONS,
            format!("{}/v1/chat/completions", s.base),
        )
        .header("origin", origin)
        .header("access-control-request-method", "POST")
        .header("access-control-request-headers", asked)
        .send()
        .await
        .unwrap();
    assert!(res.status().is_success(), "{}", res.status());
    let allowed = res.headers()["access-control-allow-headers"]
        .to_str()
        .unwrap()
        .to_ascii_lowercase();
    for h in asked.split(',').map(str::trim) {
        assert!(allowed.contains(h), "{h} not in {allowed}");
    }
}

/// One raw HTTP/1.1 exchange with the shared server; the status line's code.
fn raw_status(request: &str) -> String {
    use std::io::{Read, Write};
    let addr = shared().base.trim_start_matches("http://").to_string();
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    conn.write_all(request.as_bytes()).unwrap();
    let mut out = Vec::new();
    let _ = conn.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out);
    text.split(' ').nth(1).unwrap_or_default().to_string()
}

#[test]
fn an_absolute_form_target_is_checked_like_host() {
    let ask = |target: &str| {
        raw_status(&format!(
            "GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        ))
    };
    assert_eq!(ask("http://evil.example/v1/models"), "403");
    assert_eq!(ask("http://evil.example:8000/health"), "403");
    assert_eq!(ask("http://localhost/v1/models"), "200");
    assert_eq!(ask("/v1/models"), "200");
}

/// Starts the binary on `host` with `extra` flags until ready, then returns its stderr.
async fn start_up_log(host: &str, extra: &[&str]) -> String {
    use std::io::Read;
    let port = free_port();
    let mut args = vec!["--host", host];
    args.extend_from_slice(extra);
    let mut guard = serve(port, Stdio::piped(), &args);
    let mut stderr = guard.0.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let c = reqwest::Client::new();
    wait_ready(&mut guard, &format!("http://127.0.0.1:{port}"), &c).await;
    drop(guard);
    reader.join().unwrap()
}

#[tokio::test]
async fn a_keyless_server_beyond_loopback_warns_at_start() {
    let warning = "without an API key";
    let log = start_up_log("0.0.0.0", &[]).await;
    assert!(log.contains(warning) && log.contains("WARN"), "{log}");
    let log = start_up_log("0.0.0.0", &["--api-key", "sk-x"]).await;
    assert!(!log.contains(warning), "{log}");
    let log = start_up_log("127.0.0.1", &[]).await;
    assert!(!log.contains(warning), "{log}");
}

/// Starts the binary in `dir` with `XDG_CONFIG_HOME=xdg` and `--model model`; the served
/// model's id once ready.
async fn served_name_from(dir: &std::path::Path, xdg: &std::path::Path, model: &str) -> String {
    let port = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["serve", "--port", &port.to_string(), "--kv-blocks", "256"])
        .args(["--model", model])
        .current_dir(dir)
        .env("XDG_CONFIG_HOME", xdg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut guard = Guard(child);
    let base = format!("http://127.0.0.1:{port}");
    let c = reqwest::Client::new();
    wait_ready(&mut guard, &base, &c).await;
    let models: serde_json::Value = c
        .get(format!("{base}/v1/models"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    models["data"][0]["id"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn a_binary_away_from_its_source_tree_reads_the_built_in_config_then_xdg() {
    let root = std::env::temp_dir().join(format!("kiln-elsewhere-{}", std::process::id()));
    let (dir, xdg) = (root.join("cwd"), root.join("xdg"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::create_dir_all(xdg.join("kiln")).unwrap();
    let model = std::fs::canonicalize(kiln::config::default_model_path()).unwrap();
    let model = model.to_str().unwrap();
    assert_eq!(
        served_name_from(&dir, &xdg, model).await,
        "stories260K.gguf",
        "no config file: the built-in one"
    );
    std::fs::write(
        xdg.join("kiln/config.toml"),
        "[model]\nserved_model_name = \"from-xdg\"\n",
    )
    .unwrap();
    assert_eq!(served_name_from(&dir, &xdg, model).await, "from-xdg");
    // Without --model the default (a path beside a checkout) is not there: a clear error.
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["serve", "--port", &free_port().to_string()])
        .current_dir(&dir)
        .env("XDG_CONFIG_HOME", &xdg)
        .env_remove("KILN_MODEL")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("takes any GGUF"), "{stderr}");
    let _ = std::fs::remove_dir_all(&root);
}

/// A served quantized GGUF truncated and then overwritten on disk: the CPU lane's weights
/// were copied out of the mapping at load, so requests keep their answers and the process
/// lives (before, the next step's read of a mapped page was a SIGBUS).
#[tokio::test]
async fn a_served_quantized_file_truncated_and_overwritten_keeps_serving() {
    let dir = std::env::temp_dir().join(format!("kiln-mapped-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("stories260K-Q8_0.gguf");
    let fixture = kiln::config::project_root().join("../shared/models/stories260K-Q8_0.gguf");
    std::fs::copy(&fixture, &path).unwrap();
    let len = std::fs::metadata(&path).unwrap().len();
    let files = kiln::model::ModelFiles::open(&path, kiln::model::LoadFormat::Gguf).unwrap();
    let s = start_with(files, test_config());
    let body = json!({"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0});
    let (status, _, before) = post(&s.base, "/v1/completions", &body).await;
    assert_eq!(status, 200, "{before}");
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(0).unwrap();
    let (status, _, cut) = post(&s.base, "/v1/completions", &body).await;
    assert_eq!(status, 200, "{cut}");
    file.set_len(len).unwrap();
    std::fs::write(&path, vec![0x5a; len as usize]).unwrap();
    let (status, _, after) = post(&s.base, "/v1/completions", &body).await;
    assert_eq!(status, 200, "{after}");
    for got in [&cut, &after] {
        assert_eq!(got["choices"][0]["text"], before["choices"][0]["text"]);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
