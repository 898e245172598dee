//! One typed configuration: `config/default.toml` < `KILN_*` environment < command-line flags.

use std::path::{Path, PathBuf};

/// The project root (where `config/` lives) as known at build time.
pub fn project_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Resolves a path from the config: absolute, or relative to the working directory if it
/// exists there, else relative to the project root.
pub fn resolve_path(p: &Path) -> PathBuf {
    if p.is_absolute() || p.exists() { p.to_path_buf() } else { project_root().join(p) }
}

/// The default model: `../shared/models/stories260K.gguf` relative to the project root.
pub fn default_model_path() -> PathBuf {
    resolve_path(Path::new("../shared/models/stories260K.gguf"))
}
