//! `[responses]`: where `POST /v1/responses` keeps stored responses and how many it keeps.

use std::path::PathBuf;

use serde::Deserialize;

/// The Responses API's store (an SQLite file, bounded on every write).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ResponsesConfig {
    /// The SQLite file; unset: `$XDG_DATA_HOME/kiln/responses.sqlite3`
    /// (`~/.local/share/kiln/responses.sqlite3` without it). Opened on the first use.
    pub store_path: Option<PathBuf>,
    /// Stored responses kept at most; the oldest go first.
    pub max_entries: usize,
    /// Seconds a stored response is kept; 0 keeps them until `max_entries` pushes them out.
    pub max_age_s: u64,
}

impl Default for ResponsesConfig {
    fn default() -> Self {
        Self {
            store_path: None,
            max_entries: 10_000,
            max_age_s: 30 * 24 * 3600,
        }
    }
}

impl ResponsesConfig {
    /// `store_path`, or the default under `$XDG_DATA_HOME` (`$HOME/.local/share`); `None`
    /// when neither variable is set.
    pub fn resolved_store_path(&self) -> Option<PathBuf> {
        if let Some(p) = &self.store_path {
            return Some(p.clone());
        }
        let base = std::env::var_os("XDG_DATA_HOME")
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))?;
        Some(base.join("kiln").join("responses.sqlite3"))
    }
}
