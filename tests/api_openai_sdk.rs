//! Runs `tests/openai_sdk.py` (the real `openai` Python package) against in-process
//! servers: the general suite on stories260K, the structured-output suite on the random
//! Llama-2-vocabulary model. Skipped, with a note, where `python3` cannot import `openai`; CI installs it.

mod api_support;

use std::process::Command;

use api_support::*;

fn python_with_openai() -> Option<String> {
    let python = std::env::var("KILN_PYTHON").unwrap_or_else(|_| "python3".into());
    let ok = Command::new(&python)
        .args(["-c", "import openai"])
        .output()
        .is_ok_and(|o| o.status.success());
    ok.then_some(python)
}

/// Runs the script's `suite` against `s`, serving `model`; asserts every check passed.
async fn run_suite(python: String, s: &TestServer, model: &str, suite: &str) {
    let script = kiln::config::project_root().join("tests/openai_sdk.py");
    let args = [
        s.base.clone(),
        "sk-kiln-test".into(),
        model.into(),
        suite.into(),
    ];
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .arg(script)
            .args(args)
            .output()
            .expect("run python")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "openai SDK suite {suite} failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains(" passed, 0 failed"), "{stdout}");
}

#[tokio::test]
async fn openai_python_sdk_suite() {
    let Some(python) = python_with_openai() else {
        eprintln!("SKIPPED: python3 cannot import openai (pip install openai to run this test)");
        if std::env::var("KILN_REQUIRE_OPENAI_SDK").is_ok_and(|v| v == "1") {
            panic!("KILN_REQUIRE_OPENAI_SDK=1 but the openai package is missing");
        }
        return;
    };
    let mut cfg = test_config();
    cfg.server.api_keys = vec!["sk-kiln-test".into()];
    let s = start(cfg);
    run_suite(python, &s, "stories260K.gguf", "test").await;
}

/// `chat.completions.parse(response_format=<Pydantic model>)` and the vLLM fields, on the
/// random-weight model with the full Llama-2 vocabulary (its free output is gibberish, so a
/// parsed object proves the constraint).
#[tokio::test]
async fn openai_python_sdk_structured_outputs() {
    let Some(python) = python_with_openai() else {
        eprintln!("SKIPPED: python3 cannot import openai (pip install openai to run this test)");
        if std::env::var("KILN_REQUIRE_OPENAI_SDK").is_ok_and(|v| v == "1") {
            panic!("KILN_REQUIRE_OPENAI_SDK=1 but the openai package is missing");
        }
        return;
    };
    let mut cfg = test_config();
    cfg.server.api_keys = vec!["sk-kiln-test".into()];
    let path = kiln::config::resolve_path(std::path::Path::new(
        "../shared/models/llama-2-tiny-random.gguf",
    ));
    let files = kiln::model::ModelFiles::open(&path, kiln::model::LoadFormat::Gguf).unwrap();
    let s = start_with(files, cfg);
    run_suite(python, &s, "llama-2-tiny-random.gguf", "structured").await;
}
