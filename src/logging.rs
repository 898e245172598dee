//! The process's log output: lines go to stderr, and a line stderr refuses (a full disk, a
//! closed pipe) is dropped and counted instead of panicking the thread that logged it.
//!
//! tracing-subscriber's fmt layer `eprintln!`s when its writer fails, and `eprintln!` panics
//! when stderr itself is what failed, so a full disk ended the process at start and cut every
//! stream that logged a warning. The writer here never reports an error to the layer.

use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};

use tracing_subscriber::fmt::MakeWriter;

/// Log lines dropped because their write failed, since the process started (one subscriber
/// per process, so one count; read by `metrics` as `kiln_log_lines_dropped_total`).
static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Log lines dropped so far because the log output refused them.
pub fn dropped_lines() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

/// Installs the process's subscriber: `KILN_LOG` filter (default `info`), lines to stderr
/// through [`DropOnError`].
pub fn init(filter: tracing_subscriber::EnvFilter) {
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(DropOnError::new(io::stderr))
        .log_internal_errors(false)
        .init();
}

/// A [`MakeWriter`] whose writers swallow write errors: each failed line adds one to
/// [`dropped_lines`] and reports success, so the caller never sees (nor prints) an error.
#[derive(Clone, Copy, Debug)]
pub struct DropOnError<F> {
    open: F,
}

impl<F> DropOnError<F> {
    /// Lines go to the writer `open` returns (called once per line).
    pub fn new(open: F) -> Self {
        Self { open }
    }
}

impl<'a, F, W> MakeWriter<'a> for DropOnError<F>
where
    F: Fn() -> W + 'a,
    W: Write,
{
    type Writer = LineWriter<W>;

    fn make_writer(&'a self) -> Self::Writer {
        LineWriter((self.open)())
    }
}

/// One line's writer (see [`DropOnError`]).
#[derive(Debug)]
pub struct LineWriter<W>(W);

impl<W: Write> Write for LineWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_all(buf)?;
        Ok(buf.len())
    }

    /// The fmt layer writes a whole formatted line in one call: a line that does not get out
    /// whole is one dropped line.
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        if self.0.write_all(buf).is_err() {
            DROPPED.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        let _ = self.0.flush();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sink that refuses everything, as stderr on a full disk does.
    struct Full;

    impl Write for Full {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::Error::from_raw_os_error(28))
        }
        fn flush(&mut self) -> io::Result<()> {
            Err(io::Error::from_raw_os_error(28))
        }
    }

    #[test]
    fn a_refused_line_is_dropped_and_counted() {
        let subscriber = tracing_subscriber::fmt()
            .with_writer(DropOnError::new(|| Full))
            .finish();
        let before = dropped_lines();
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!("one");
            tracing::error!(field = 3, "two");
        });
        // Other tests may drop lines too (the count is per process): at least these two.
        assert!(dropped_lines() >= before + 2);
    }

    #[test]
    fn a_written_line_passes_through() {
        let mut out = LineWriter(Vec::new());
        out.write_all(b"line\n").unwrap();
        out.flush().unwrap();
        assert_eq!(out.0, b"line\n");
    }
}
