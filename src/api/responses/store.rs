//! Stored responses: one SQLite file (`[responses] store_path`), opened on first use and
//! checked then (a schema-version table; a foreign or corrupt file is moved aside with a
//! warning and a fresh store made in its place), bounded by `max_entries` and `max_age_s` on
//! every write. Each row keeps a response's own input items, the response object and the id
//! of the response it continued.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rusqlite::{Connection, OptionalExtension, params};

use super::types::{Item, ResponseObject};
use crate::config::ResponsesConfig;

/// The schema this build writes and reads.
const SCHEMA_VERSION: i64 = 1;
/// Marks the file as Kiln's (the `kiln_meta` table's `app` row).
const APP: &str = "kiln-responses";

/// Errors of the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("the responses store {path}: {message}")]
    Open { path: PathBuf, message: String },
    #[error("the responses store: {0}")]
    Sql(#[from] rusqlite::Error),
    #[error("the responses store holds an unreadable row: {0}")]
    Row(#[from] serde_json::Error),
}

/// One stored response.
#[derive(Debug, Clone)]
pub struct Stored {
    pub response: ResponseObject,
    pub input: Vec<Item>,
}

/// The open store.
pub struct Store {
    conn: Mutex<Connection>,
    max_entries: usize,
    max_age_s: u64,
}

fn open_error(path: &Path, message: impl Into<String>) -> StoreError {
    StoreError::Open {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

/// Whether `conn` is a Kiln store of this schema (`Ok(false)`: an empty database).
fn check(conn: &Connection) -> Result<bool, String> {
    let tables: i64 = conn
        .query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))
        .map_err(|e| e.to_string())?;
    if tables == 0 {
        return Ok(false);
    }
    let meta = |key: &str| -> Result<Option<String>, String> {
        conn.query_row("SELECT value FROM kiln_meta WHERE key = ?1", [key], |r| {
            r.get(0)
        })
        .optional()
        .map_err(|e| format!("not a Kiln responses store ({e})"))
    };
    if meta("app")?.as_deref() != Some(APP) {
        return Err("not a Kiln responses store".into());
    }
    match meta("schema_version")?.and_then(|v| v.parse::<i64>().ok()) {
        Some(SCHEMA_VERSION) => Ok(true),
        v => Err(format!(
            "schema version {v:?}, this build reads {SCHEMA_VERSION}"
        )),
    }
}

fn create(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(&format!(
        "CREATE TABLE kiln_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
         INSERT INTO kiln_meta VALUES ('app', '{APP}'), ('schema_version', '{SCHEMA_VERSION}');
         CREATE TABLE responses (
             id TEXT PRIMARY KEY,
             created_at INTEGER NOT NULL,
             previous_id TEXT,
             input TEXT NOT NULL,
             response TEXT NOT NULL
         );
         CREATE INDEX responses_by_age ON responses (created_at);"
    ))
}

fn connect(path: &Path) -> Result<Connection, StoreError> {
    let conn = Connection::open(path).map_err(|e| open_error(path, e.to_string()))?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    Ok(conn)
}

impl Store {
    /// Opens (or creates) the store of `cfg` at `path`.
    pub fn open(path: &Path, cfg: &ResponsesConfig) -> Result<Self, StoreError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| open_error(path, e.to_string()))?;
        }
        let mut conn = connect(path)?;
        match check(&conn) {
            Ok(true) => {}
            Ok(false) => create(&conn)?,
            Err(why) => {
                drop(conn);
                let aside =
                    path.with_extension(format!("unreadable-{}", crate::api::clock::unix_now()));
                tracing::warn!(path = %path.display(), aside = %aside.display(), reason = %why,
                    "the responses store is not readable; moved aside, starting a fresh one");
                std::fs::rename(path, &aside)
                    .map_err(|e| open_error(path, format!("{why}; moving it aside failed: {e}")))?;
                conn = connect(path)?;
                create(&conn)?;
            }
        }
        Ok(Self {
            conn: Mutex::new(conn),
            max_entries: cfg.max_entries,
            max_age_s: cfg.max_age_s,
        })
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stores (or replaces) `response`, then enforces the bounds.
    pub fn put(&self, response: &ResponseObject, input: &[Item]) -> Result<(), StoreError> {
        let conn = self.conn();
        conn.execute(
            "INSERT OR REPLACE INTO responses (id, created_at, previous_id, input, response)
             VALUES (?1, ?2, ?3, ?4, ?5)",
            params![
                response.id,
                response.created_at as i64,
                response.previous_response_id,
                serde_json::to_string(input)?,
                serde_json::to_string(response)?,
            ],
        )?;
        if self.max_age_s > 0 {
            let oldest = crate::api::clock::unix_now().saturating_sub(self.max_age_s) as i64;
            conn.execute("DELETE FROM responses WHERE created_at < ?1", [oldest])?;
        }
        conn.execute(
            "DELETE FROM responses WHERE rowid IN (SELECT rowid FROM responses
             ORDER BY created_at DESC, rowid DESC LIMIT -1 OFFSET ?1)",
            [self.max_entries as i64],
        )?;
        Ok(())
    }

    /// The stored response `id` (none past `max_age_s`).
    pub fn get(&self, id: &str) -> Result<Option<Stored>, StoreError> {
        let oldest = match self.max_age_s {
            0 => 0,
            age => crate::api::clock::unix_now().saturating_sub(age) as i64,
        };
        let row: Option<(String, String)> = self
            .conn()
            .query_row(
                "SELECT input, response FROM responses WHERE id = ?1 AND created_at >= ?2",
                params![id, oldest],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        row.map(|(input, response)| {
            Ok(Stored {
                input: serde_json::from_str(&input)?,
                response: serde_json::from_str(&response)?,
            })
        })
        .transpose()
    }

    /// Deletes `id`; whether it was there.
    pub fn delete(&self, id: &str) -> Result<bool, StoreError> {
        Ok(self
            .conn()
            .execute("DELETE FROM responses WHERE id = ?1", [id])?
            > 0)
    }

    /// How many responses are stored.
    pub fn len(&self) -> Result<usize, StoreError> {
        let n: i64 = self
            .conn()
            .query_row("SELECT count(*) FROM responses", [], |r| r.get(0))?;
        Ok(n as usize)
    }

    /// Whether nothing is stored.
    pub fn is_empty(&self) -> Result<bool, StoreError> {
        Ok(self.len()? == 0)
    }
}
