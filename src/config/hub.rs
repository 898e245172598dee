//! `hf:OWNER/REPO[/FILE]` model references, resolved through the standard Hugging Face cache.

use std::path::{Path, PathBuf};

use hf_hub::api::sync::ApiBuilder;
use hf_hub::{Cache, Repo};

/// Files of a Hugging Face model directory fetched when a repo has no GGUF file named.
const HF_DIR_FILES: &[&str] = &[
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "chat_template.jinja",
];

/// Errors from resolving a hub reference.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("invalid model reference `{0}` (expected hf:OWNER/REPO[/FILE])")]
    BadReference(String),
    #[error("`{what}` is not in the Hugging Face cache at {cache} and HF_HUB_OFFLINE is set")]
    NotCached { what: String, cache: PathBuf },
    #[error("hf:{repo}: {message}")]
    Repo { repo: String, message: String },
    #[error("download from the Hugging Face hub failed: {0}")]
    Download(String),
}

/// Where the cache lives and whether the network may be used (`HF_HUB_CACHE` or
/// `HF_HOME/hub` or `~/.cache/huggingface/hub`; `HF_HUB_OFFLINE`; `HF_TOKEN`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubSettings {
    pub cache_dir: PathBuf,
    pub offline: bool,
    pub token: Option<String>,
}

impl HubSettings {
    /// Reads the standard Hugging Face environment variables (once, at start).
    pub fn from_env() -> Self {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let cache_dir = var("HF_HUB_CACHE")
            .map(PathBuf::from)
            .or_else(|| var("HF_HOME").map(|h| PathBuf::from(h).join("hub")))
            .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".cache/huggingface/hub")))
            .unwrap_or_else(|| PathBuf::from(".cache/huggingface/hub"));
        let offline = var("HF_HUB_OFFLINE").is_some_and(|v| {
            matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on")
        });
        Self {
            cache_dir,
            offline,
            token: var("HF_TOKEN"),
        }
    }
}

/// A parsed `hf:` reference.
#[derive(Debug, Clone, PartialEq, Eq)]
struct HubRef {
    repo_id: String,
    file: Option<String>,
}

fn parse(reference: &str) -> Option<HubRef> {
    let rest = reference.strip_prefix("hf:")?;
    let mut parts = rest.splitn(3, '/');
    let (owner, repo) = (parts.next()?, parts.next()?);
    let file = parts.next().filter(|f| !f.is_empty()).map(str::to_string);
    let ok = |s: &str| {
        !s.is_empty()
            && s != "."
            && s != ".."
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    };
    let file_ok = file.as_deref().is_none_or(|f| {
        f.split('/')
            .all(|seg| !seg.is_empty() && seg != ".." && seg != ".")
    });
    (ok(owner) && ok(repo) && file_ok).then(|| HubRef {
        repo_id: format!("{owner}/{repo}"),
        file,
    })
}

/// A local model path for `reference`: plain paths are resolved like config paths; `hf:`
/// references are looked up in the cache and downloaded (with progress) unless offline.
/// Without `/FILE`, the repo's single GGUF file or its Hugging Face directory is used.
pub fn resolve_model(reference: &str, hub: &HubSettings) -> Result<PathBuf, HubError> {
    if !reference.starts_with("hf:") {
        return Ok(super::resolve_path(Path::new(reference)));
    }
    let r = parse(reference).ok_or_else(|| HubError::BadReference(reference.to_string()))?;
    let cache = Cache::new(hub.cache_dir.clone());
    let repo = Repo::model(r.repo_id.clone());
    if let Some(file) = &r.file {
        if let Some(path) = cache.repo(repo.clone()).get(file) {
            return Ok(path);
        }
        if hub.offline {
            return Err(HubError::NotCached {
                what: format!("{}/{file}", r.repo_id),
                cache: hub.cache_dir.clone(),
            });
        }
        return download(hub, &r.repo_id, std::slice::from_ref(file));
    }
    match cached_snapshot(&hub.cache_dir, &repo) {
        Some(dir) => pick_in_dir(&dir, &r.repo_id),
        None if hub.offline => Err(HubError::NotCached {
            what: r.repo_id.clone(),
            cache: hub.cache_dir.clone(),
        }),
        None => download_repo(hub, &r.repo_id),
    }
}

/// `models--OWNER--REPO/snapshots/<refs/main>` if the cache has it.
fn cached_snapshot(cache_dir: &Path, repo: &Repo) -> Option<PathBuf> {
    let root = cache_dir.join(repo.folder_name());
    let commit = std::fs::read_to_string(root.join("refs").join(repo.revision())).ok()?;
    let dir = root.join("snapshots").join(commit.trim());
    dir.is_dir().then_some(dir)
}

/// In a snapshot: the HF directory if it has `config.json`, else its only `.gguf` file.
fn pick_in_dir(dir: &Path, repo_id: &str) -> Result<PathBuf, HubError> {
    if dir.join("config.json").is_file() {
        return Ok(dir.to_path_buf());
    }
    let mut ggufs: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| HubError::Repo {
            repo: repo_id.into(),
            message: e.to_string(),
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "gguf"))
        .collect();
    ggufs.sort();
    match ggufs.len() {
        1 => Ok(ggufs.remove(0)),
        0 => Err(HubError::Repo {
            repo: repo_id.into(),
            message: "neither config.json nor a .gguf file found".into(),
        }),
        _ => Err(HubError::Repo {
            repo: repo_id.into(),
            message: format!(
                "several .gguf files; name one as hf:{repo_id}/FILE: {}",
                names(&ggufs)
            ),
        }),
    }
}

fn names(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Downloads `files` of `repo_id` into the cache; returns the path of the first.
fn download(hub: &HubSettings, repo_id: &str, files: &[String]) -> Result<PathBuf, HubError> {
    let api = ApiBuilder::from_cache(Cache::new(hub.cache_dir.clone()))
        .with_progress(true)
        .with_token(hub.token.clone())
        .build()
        .map_err(|e| HubError::Download(e.to_string()))?;
    let repo = api.model(repo_id.to_string());
    let mut first = None;
    for f in files {
        let path = repo
            .get(f)
            .map_err(|e| HubError::Download(format!("{repo_id}/{f}: {e}")))?;
        first.get_or_insert(path);
    }
    first.ok_or_else(|| HubError::Repo {
        repo: repo_id.into(),
        message: "nothing to download".into(),
    })
}

/// Lists the repo and downloads its GGUF file or its Hugging Face directory.
fn download_repo(hub: &HubSettings, repo_id: &str) -> Result<PathBuf, HubError> {
    let api = ApiBuilder::from_cache(Cache::new(hub.cache_dir.clone()))
        .with_token(hub.token.clone())
        .build()
        .map_err(|e| HubError::Download(e.to_string()))?;
    let info = api
        .model(repo_id.to_string())
        .info()
        .map_err(|e| HubError::Download(format!("{repo_id}: {e}")))?;
    let files: Vec<String> = info.siblings.into_iter().map(|s| s.rfilename).collect();
    let ggufs: Vec<&String> = files.iter().filter(|f| f.ends_with(".gguf")).collect();
    if files.iter().any(|f| f == "config.json") {
        let wanted: Vec<String> = files
            .iter()
            .filter(|f| {
                HF_DIR_FILES.contains(&f.as_str())
                    || f.ends_with(".safetensors")
                    || f.ends_with(".safetensors.index.json")
            })
            .cloned()
            .collect();
        let config = download(hub, repo_id, &wanted)?;
        return Ok(config.parent().map(Path::to_path_buf).unwrap_or(config));
    }
    match ggufs.as_slice() {
        [one] => download(hub, repo_id, &[(*one).clone()]),
        [] => Err(HubError::Repo {
            repo: repo_id.into(),
            message: "neither config.json nor a .gguf file in the repo".into(),
        }),
        many => Err(HubError::Repo {
            repo: repo_id.into(),
            message: format!(
                "several .gguf files; name one as hf:{repo_id}/FILE: {}",
                many.iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_references() {
        assert_eq!(
            parse("hf:owner/repo"),
            Some(HubRef {
                repo_id: "owner/repo".into(),
                file: None
            })
        );
        assert_eq!(
            parse("hf:o/r/sub/m.gguf").unwrap().file.as_deref(),
            Some("sub/m.gguf")
        );
        for bad in [
            "hf:",
            "hf:owner",
            "hf:/r",
            "hf:o/r/../x",
            "hf:o/../x",
            "hf:o w/r",
        ] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn offline_miss_is_an_error_naming_the_cache() {
        let hub = HubSettings {
            cache_dir: PathBuf::from("/nonexistent/kiln-hub"),
            offline: true,
            token: None,
        };
        let err = resolve_model("hf:a/b/c.gguf", &hub).unwrap_err();
        assert!(matches!(err, HubError::NotCached { .. }), "{err}");
        let err = resolve_model("hf:a/b", &hub).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/kiln-hub"), "{err}");
    }
}
