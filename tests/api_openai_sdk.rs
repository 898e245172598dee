//! Runs `tests/openai_sdk.py` (the real `openai` Python package) against in-process
//! servers: the general suite on stories260K, the structured-output suite on the random
//! Llama-2-vocabulary model, the reasoning suite on that model with Qwen-style markup tokens, the
//! embeddings suite on stories260K with embeddings on. Skipped, with a note, where `python3` cannot import `openai`; CI installs it.

mod api_support;
mod markup_support;

use std::process::Command;

use api_support::*;
use kiln::config::ReasoningParser;

fn python_with_openai() -> Option<String> {
    let python = std::env::var("KILN_PYTHON").unwrap_or_else(|_| "python3".into());
    let ok = Command::new(&python)
        .args(["-c", "import openai"])
        .output()
        .is_ok_and(|o| o.status.success());
    ok.then_some(python)
}

/// Runs the script's `suite` (with `extra` arguments) against `s`, serving `model`; asserts
/// every check passed.
async fn run_suite(python: String, s: &TestServer, model: &str, suite: &str, extra: &[String]) {
    let script = kiln::config::project_root().join("tests/openai_sdk.py");
    let mut args = vec![
        s.base.clone(),
        "sk-kiln-test".into(),
        model.into(),
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
    run_suite(python, &s, "stories260K.gguf", "test", &[]).await;
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
    run_suite(python, &s, "llama-2-tiny-random.gguf", "structured", &[]).await;
}

/// Reasoning plus a constrained tool call through the SDK, streamed and not: `think` parser,
/// `<think>` and `</think>` special tokens. The bias makes the model open the thinking, think
/// `Hmm` a few times (penalties wear it down) until `</think>`'s smaller bias wins; then the
/// tool grammar holds.
#[tokio::test]
async fn openai_python_sdk_reasoning_then_tool_call() {
    let Some(python) = python_with_openai() else {
        eprintln!("SKIPPED: python3 cannot import openai (pip install openai to run this test)");
        if std::env::var("KILN_REQUIRE_OPENAI_SDK").is_ok_and(|v| v == "1") {
            panic!("KILN_REQUIRE_OPENAI_SDK=1 but the openai package is missing");
        }
        return;
    };
    let mut cfg = test_config();
    cfg.server.api_keys = vec!["sk-kiln-test".into()];
    cfg.model.reasoning_parser = Some(ReasoningParser::Think);
    let s = markup_support::start_patched(cfg);
    let hmm = markup_support::patched_tokenizer()
        .token_to_id("▁Hmm")
        .expect("in the vocabulary");
    let bias = serde_json::json!({markup_support::THINK_OPEN.to_string(): 60, hmm.to_string(): 50,
                                  markup_support::THINK_CLOSE.to_string(): 40});
    let model = "llama-2-tiny-random.gguf";
    run_suite(python, &s, model, "reasoning", &[bias.to_string()]).await;
}

/// `embeddings.create` through the SDK on a server with embeddings on: its default base64
/// decoded by the SDK against `encoding_format="float"`, `dimensions`, token-id inputs, and
/// the error classes it raises; and langchain's `OpenAIEmbeddings` where `langchain-openai` is
/// installed (CI installs it).
#[tokio::test]
async fn openai_python_sdk_embeddings() {
    let Some(python) = python_with_openai() else {
        eprintln!("SKIPPED: python3 cannot import openai (pip install openai to run this test)");
        if std::env::var("KILN_REQUIRE_OPENAI_SDK").is_ok_and(|v| v == "1") {
            panic!("KILN_REQUIRE_OPENAI_SDK=1 but the openai package is missing");
        }
        return;
    };
    let mut cfg = test_config();
    cfg.server.api_keys = vec!["sk-kiln-test".into()];
    cfg.model.embeddings = true;
    let s = start(cfg);
    run_suite(python, &s, "stories260K.gguf", "embeddings", &[]).await;
}
