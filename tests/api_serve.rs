//! The `kiln serve` binary end to end: flags and `KILN_*` variables, readiness, and a graceful
//! drain on SIGTERM (an in-flight stream finishes, then the process exits 0).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
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

async fn wait_ready(base: &str, c: &reqwest::Client) {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(60) {
        if let Ok(r) = c.get(format!("{base}/health")).send().await
            && r.status().is_success()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("kiln serve did not become ready");
}

#[tokio::test]
async fn serve_binary_answers_and_drains_on_sigterm() {
    let port = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args([
            "serve",
            "--port",
            &port.to_string(),
            "--kv-blocks",
            "512",
            "--api-key",
            "sk-flag",
        ])
        .env("KILN_API_KEY", "sk-env")
        .env("KILN_MAX_NUM_SEQS", "4")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut guard = Guard(child);
    let base = format!("http://127.0.0.1:{port}");
    let c = reqwest::Client::new();
    wait_ready(&base, &c).await;
    let models = c
        .get(format!("{base}/v1/models"))
        .bearer_auth("sk-env")
        .send()
        .await
        .unwrap();
    assert_eq!(
        models.status().as_u16(),
        401,
        "the flag overrides KILN_API_KEY"
    );
    let models = c
        .get(format!("{base}/v1/models"))
        .bearer_auth("sk-flag")
        .send()
        .await
        .unwrap();
    assert_eq!(models.status().as_u16(), 200);
    let body = json!({"prompt": "Once", "max_tokens": 1500, "ignore_eos": true, "stream": true});
    let res = c
        .post(format!("{base}/v1/completions"))
        .bearer_auth("sk-flag")
        .json(&body)
        .send()
        .await
        .unwrap();
    let mut stream = res.bytes_stream();
    let mut raw = stream.next().await.unwrap().unwrap().to_vec();
    let pid = guard.0.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    while let Some(chunk) = stream.next().await {
        raw.extend_from_slice(&chunk.unwrap());
    }
    let text = String::from_utf8(raw).unwrap();
    assert!(
        text.ends_with("data: [DONE]\n\n"),
        "the in-flight stream is drained: {}",
        &text[text.len().saturating_sub(300)..]
    );
    assert!(text.contains("\"finish_reason\":\"length\""));
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
    assert!(
        c.get(format!("{base}/health")).send().await.is_err(),
        "the port is closed"
    );
}
