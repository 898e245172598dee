//! Runs `tests/anthropic_sdk.py` (the real `anthropic` Python package) against in-process
//! servers: the general suite on stories260K, the tools and thinking suite on the random
//! Llama-2-vocabulary model with Qwen-style markup tokens. Skipped, with a note, where
//! `python3` cannot import `anthropic`, unless `KILN_REQUIRE_ANTHROPIC_SDK=1` (CI sets it
//! once it installed the package).

mod api_support;
mod markup_support;

use std::process::Command;

use api_support::*;

const KEY: &str = "sk-kiln-test";

fn python_with_anthropic() -> Option<String> {
    let python = std::env::var("KILN_PYTHON").unwrap_or_else(|_| "python3".into());
    let ok = Command::new(&python)
        .args(["-c", "import anthropic"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!(
            "SKIPPED: python3 cannot import anthropic (pip install anthropic to run this test)"
        );
        if std::env::var("KILN_REQUIRE_ANTHROPIC_SDK").is_ok_and(|v| v == "1") {
            panic!("KILN_REQUIRE_ANTHROPIC_SDK=1 but the anthropic package is missing");
        }
    }
    ok.then_some(python)
}

/// Runs the script's `suite` (with `extra` arguments) against `s`, serving `model`; asserts
/// every check passed.
async fn run_suite(python: String, s: &TestServer, model: &str, suite: &str, extra: &[String]) {
    let script = kiln::config::project_root().join("tests/anthropic_sdk.py");
    let mut args = vec![s.base.clone(), KEY.into(), model.into(), suite.into()];
    args.extend_from_slice(extra);
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .arg(script)
            .args(args)
            .env_remove("ANTHROPIC_API_KEY")
            .env_remove("ANTHROPIC_AUTH_TOKEN")
            .env_remove("ANTHROPIC_BASE_URL")
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
        "anthropic SDK suite {suite} failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains(" passed, 0 failed"), "{stdout}");
}

#[tokio::test]
async fn anthropic_python_sdk_suite() {
    let Some(python) = python_with_anthropic() else {
        return;
    };
    let mut cfg = test_config();
    cfg.server.api_keys = vec![KEY.into()];
    let s = start(cfg);
    run_suite(python, &s, "stories260K.gguf", "test", &[]).await;
}

/// Tools (a forced call, streamed and not, its `tool_result` sent back) and `thinking`
/// (through the reasoning parser, no parser configured: the request turns it on). The bias
/// makes the random model open the thinking, think `Hmm` a few times (penalties wear it
/// down) until `</think>`'s smaller bias wins; then the tool grammar holds.
#[tokio::test]
async fn anthropic_python_sdk_tools_and_thinking() {
    let Some(python) = python_with_anthropic() else {
        return;
    };
    let mut cfg = test_config();
    cfg.server.api_keys = vec![KEY.into()];
    let s = markup_support::start_patched(cfg);
    let hmm = markup_support::patched_tokenizer()
        .token_to_id("▁Hmm")
        .expect("in the vocabulary");
    let bias = serde_json::json!({markup_support::THINK_OPEN.to_string(): 60, hmm.to_string(): 50,
                                  markup_support::THINK_CLOSE.to_string(): 40});
    let model = "llama-2-tiny-random.gguf";
    run_suite(python, &s, model, "markup", &[bias.to_string()]).await;
}
