//! The server where its inputs or surroundings fail (issue 37): stderr on a full device or a
//! closed pipe (the `kiln serve` binary starts, serves, counts the dropped log lines and exits
//! on SIGTERM).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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
