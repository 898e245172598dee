//! Runs `tests/responses_sdk.py` (the real `openai` Python package, and the OpenAI Agents SDK)
//! against in-process servers on the random-weight Llama-2-vocabulary model: `responses.create`
//! plain and streamed, a function tool round trip, `retrieve`/`delete`, the error classes, then
//! `previous_response_id` on a second server over the same store file; and an agent with one
//! function tool through the Agents SDK's default Responses model. Skipped, with a note, where
//! `python3` cannot import the package; `KILN_REQUIRE_OPENAI_SDK=1` and
//! `KILN_REQUIRE_AGENTS_SDK=1` (CI sets both) make a missing package a failure.

mod api_support;

use std::process::Command;

use api_support::*;
use kiln::model::{LoadFormat, ModelFiles};

const MODEL: &str = "llama-2-tiny-random.gguf";

fn python_with(module: &str, require_var: &str) -> Option<String> {
    let python = std::env::var("KILN_PYTHON").unwrap_or_else(|_| "python3".into());
    let ok = Command::new(&python)
        .args(["-c", &format!("import {module}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("SKIPPED: python3 cannot import {module}");
        if std::env::var(require_var).is_ok_and(|v| v == "1") {
            panic!("{require_var}=1 but the {module} package is missing");
        }
    }
    ok.then_some(python)
}

fn server(store: &std::path::Path) -> TestServer {
    let mut cfg = test_config();
    cfg.server.api_keys = vec!["sk-kiln-test".into()];
    cfg.responses.store_path = Some(store.to_path_buf());
    let path = kiln::config::project_root().join("../shared/models/llama-2-tiny-random.gguf");
    start_with(ModelFiles::open(&path, LoadFormat::Gguf).unwrap(), cfg)
}

fn store_path(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "kiln-responses-sdk-{name}-{}-{}",
        std::process::id(),
        kiln::api::clock::unix_now()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("responses.sqlite3")
}

/// Runs `suite` against `s`; asserts every check passed; returns its output.
async fn run_suite(python: String, s: &TestServer, suite: &str, extra: &[String]) -> String {
    let script = kiln::config::project_root().join("tests/responses_sdk.py");
    let mut args = vec![
        s.base.clone(),
        "sk-kiln-test".into(),
        MODEL.into(),
        suite.into(),
    ];
    args.extend_from_slice(extra);
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .arg(script)
            .args(args)
            .output()
            .expect("run python")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "responses SDK suite {suite} failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains(" passed, 0 failed"), "{stdout}");
    stdout
}

#[tokio::test]
async fn openai_python_sdk_responses_and_a_restart() {
    let Some(python) = python_with("openai", "KILN_REQUIRE_OPENAI_SDK") else {
        return;
    };
    let store = store_path("restart");
    let id = {
        let a = server(&store);
        let out = run_suite(python.clone(), &a, "responses", &[]).await;
        a.server.handle().stop(true).await;
        a.engine.shutdown();
        out.lines()
            .find_map(|l| l.strip_prefix("STORED "))
            .expect("a stored id")
            .to_string()
    };
    let b = server(&store);
    run_suite(python, &b, "restart", &[id]).await;
}

#[tokio::test]
async fn openai_agents_sdk_runs_an_agent_with_a_function_tool() {
    let Some(python) = python_with("agents", "KILN_REQUIRE_AGENTS_SDK") else {
        return;
    };
    let s = server(&store_path("agents"));
    run_suite(python, &s, "agents", &[]).await;
}
