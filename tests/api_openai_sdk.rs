//! Runs `tests/openai_sdk.py` (the real `openai` Python package) against an in-process
//! server. Skipped, with a note, where `python3` cannot import `openai`; CI installs it.

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
    let script = kiln::config::project_root().join("tests/openai_sdk.py");
    let base = s.base.clone();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .arg(script)
            .args([base.as_str(), "sk-kiln-test", "stories260K.gguf"])
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
        "openai SDK suite failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains(" passed, 0 failed"), "{stdout}");
}
