//! `--model hf:OWNER/REPO[/FILE]` offline, through a pre-filled Hugging Face cache laid out
//! as `huggingface_hub` writes it (blobs, snapshot symlinks, `refs/main`).

use std::path::{Path, PathBuf};
use std::process::Command;

use kiln::config::{Config, HubError, HubSettings, resolve_model};
use kiln::model::{LoadFormat, ModelFiles};

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

fn fixtures() -> PathBuf {
    kiln::config::default_model_path()
        .parent()
        .unwrap()
        .to_path_buf()
}

/// `hub/models--OWNER--REPO/{blobs,snapshots/COMMIT,refs/main}` with `files` linked in.
fn add_repo(hub: &Path, repo: &str, files: &[(&str, PathBuf)]) {
    let root = hub.join(format!("models--{}", repo.replace('/', "--")));
    let snapshot = root.join("snapshots").join(COMMIT);
    std::fs::create_dir_all(&snapshot).unwrap();
    std::fs::create_dir_all(root.join("blobs")).unwrap();
    std::fs::create_dir_all(root.join("refs")).unwrap();
    std::fs::write(root.join("refs/main"), COMMIT).unwrap();
    for (i, (name, src)) in files.iter().enumerate() {
        let blob = root.join("blobs").join(format!("blob{i}"));
        std::fs::copy(src, &blob).unwrap();
        std::os::unix::fs::symlink(&blob, snapshot.join(name)).unwrap();
    }
}

/// A fresh cache (HF_HOME layout: `<home>/hub/...`) with a GGUF repo and an HF-format repo.
fn cache(tag: &str) -> PathBuf {
    let home = std::env::temp_dir().join(format!("kiln-hf-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&home);
    let hub = home.join("hub");
    add_repo(
        &hub,
        "kiln-test/stories",
        &[("stories260K.gguf", fixtures().join("stories260K.gguf"))],
    );
    let hf = fixtures().join("stories260K-hf");
    let names = [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ];
    let files: Vec<(&str, PathBuf)> = names.iter().map(|n| (*n, hf.join(n))).collect();
    add_repo(&hub, "kiln-test/stories-hf", &files);
    home
}

fn offline(home: &Path) -> HubSettings {
    HubSettings {
        cache_dir: home.join("hub"),
        offline: true,
        token: None,
    }
}

#[test]
fn resolves_files_repos_and_hf_directories_offline() {
    let home = cache("resolve");
    let hub = offline(&home);
    let snapshot = |repo: &str| home.join("hub").join(repo).join("snapshots").join(COMMIT);
    let file = resolve_model("hf:kiln-test/stories/stories260K.gguf", &hub).unwrap();
    assert_eq!(
        file,
        snapshot("models--kiln-test--stories").join("stories260K.gguf")
    );
    assert_eq!(
        resolve_model("hf:kiln-test/stories", &hub).unwrap(),
        file,
        "the repo's only GGUF"
    );
    let dir = resolve_model("hf:kiln-test/stories-hf", &hub).unwrap();
    assert_eq!(dir, snapshot("models--kiln-test--stories-hf"));
    let gguf = ModelFiles::open(&file, LoadFormat::Auto).unwrap();
    let hf = ModelFiles::open(&dir, LoadFormat::Auto).unwrap();
    assert_eq!(gguf.spec.n_layers, hf.spec.n_layers);
    let mut cfg = Config::default();
    cfg.model.path = "hf:kiln-test/stories".into();
    assert_eq!(cfg.model_path(&hub).unwrap(), file);
    for missing in ["hf:kiln-test/absent", "hf:kiln-test/stories/absent.gguf"] {
        let err = resolve_model(missing, &hub).unwrap_err();
        assert!(matches!(err, HubError::NotCached { .. }), "{err}");
    }
    assert!(matches!(
        resolve_model("hf:nope", &hub),
        Err(HubError::BadReference(_))
    ));
    let _ = std::fs::remove_dir_all(home);
}

#[test]
fn kiln_generate_reads_hf_references_from_hf_home() {
    let home = cache("cli");
    let run = |model: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
            .args([
                "generate",
                "--model",
                model,
                "--prompt",
                "Once upon a time",
                "--max-tokens",
                "12",
            ])
            .env("HF_HOME", &home)
            .env("HF_HUB_OFFLINE", "1")
            .env_remove("HF_HUB_CACHE")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let direct = run(kiln::config::default_model_path().to_str().unwrap());
    assert!(direct.len() > 10);
    assert_eq!(run("hf:kiln-test/stories"), direct);
    assert_eq!(run("hf:kiln-test/stories/stories260K.gguf"), direct);
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args([
            "generate",
            "--model",
            "hf:kiln-test/absent",
            "--prompt",
            "x",
        ])
        .env("HF_HOME", &home)
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("HF_HUB_OFFLINE"));
    let _ = std::fs::remove_dir_all(home);
}
