//! The GPU kernel cache on disk: one compiled image per file behind a header that is checked
//! before a lane loads it (format, key, body length, CRC-32 of the body), written under a
//! temporary name and renamed into place. A file that fails the check (cut short, garbled,
//! empty, an older format) is recompiled and overwritten, with a warning.
//!
//! Plain file code with no device in it, so it builds and is tested without a GPU feature.

use std::io;
use std::path::Path;

/// The first bytes of every cache file (the format's version is in it).
pub const MAGIC: &[u8] = b"kiln-kernel-v2\n";

/// Why a cache file's bytes were refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    /// Shorter than a header, or not this format (another tool's file, an older version).
    #[error("no kiln-kernel-v2 header")]
    Header,
    /// Written for other source text or compile options (a hash collision of the file name).
    #[error("written for another key")]
    Key,
    /// The body is not as long as the header says (a write cut short).
    #[error("body of {found} bytes, header says {expected}")]
    Length { expected: u64, found: u64 },
    /// The body's CRC-32 differs from the header's (garbled on disk).
    #[error("body checksum mismatch")]
    Checksum,
}

/// A cache file's bytes for `image` compiled under `key`:
/// `MAGIC`, `key`, `\n`, body length (u64 LE), CRC-32 of the body (u32 LE), body.
pub fn encode(key: &str, image: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(MAGIC.len() + key.len() + 13 + image.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(key.as_bytes());
    out.push(b'\n');
    out.extend_from_slice(&(image.len() as u64).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(image).to_le_bytes());
    out.extend_from_slice(image);
    out
}

/// The image inside a cache file's `bytes` written under `key`, once every header field
/// checks out.
pub fn decode<'a>(bytes: &'a [u8], key: &str) -> Result<&'a [u8], Invalid> {
    let rest = bytes.strip_prefix(MAGIC).ok_or(Invalid::Header)?;
    let rest = rest
        .strip_prefix(key.as_bytes())
        .and_then(|r| r.strip_prefix(b"\n"))
        .ok_or(Invalid::Key)?;
    let (len, rest) = rest.split_first_chunk::<8>().ok_or(Invalid::Header)?;
    let (crc, body) = rest.split_first_chunk::<4>().ok_or(Invalid::Header)?;
    let expected = u64::from_le_bytes(*len);
    if body.len() as u64 != expected {
        return Err(Invalid::Length {
            expected,
            found: body.len() as u64,
        });
    }
    if crc32fast::hash(body) != u32::from_le_bytes(*crc) {
        return Err(Invalid::Checksum);
    }
    Ok(body)
}

/// The image cached at `path` under `key`; `Ok(None)` when there is no such file (or it
/// cannot be read), `Err` when it is there but fails the check.
pub fn load(path: &Path, key: &str) -> Result<Option<Vec<u8>>, Invalid> {
    let Ok(bytes) = std::fs::read(path) else {
        return Ok(None);
    };
    decode(&bytes, key).map(|image| Some(image.to_vec()))
}

/// Writes `image` to `path` atomically: a temporary file in the same directory, then a
/// rename over whatever was there (a reader sees the old file or the new one, never half).
pub fn store(path: &Path, key: &str, image: &[u8]) -> io::Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| io::Error::other("cache path without a directory"))?;
    std::fs::create_dir_all(dir)?;
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let tmp = path.with_extension(format!("tmp{}-{nonce}", std::process::id()));
    let written =
        std::fs::write(&tmp, encode(key, image)).and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// The image for `key`: from `path` when a file there passes the check (`true`: cached),
/// otherwise from `compile`, then stored at `path` (a failed store only costs a later
/// recompile). A file failing the check is logged as a warning and overwritten.
pub fn load_or_compile<E>(
    path: Option<&Path>,
    key: &str,
    compile: impl FnOnce() -> Result<Vec<u8>, E>,
) -> Result<(Vec<u8>, bool), E> {
    if let Some(p) = path {
        match load(p, key) {
            Ok(Some(image)) => return Ok((image, true)),
            Ok(None) => {}
            Err(why) => tracing::warn!(
                path = %p.display(),
                %why,
                "kernel cache file failed its check; recompiling and overwriting it"
            ),
        }
    }
    let image = compile()?;
    if let Some(p) = path
        && let Err(e) = store(p, key, &image)
    {
        tracing::debug!(path = %p.display(), error = %e, "kernel cache not written");
    }
    Ok((image, false))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::convert::Infallible;

    const KEY: &str = "0123456789abcdef";

    fn image() -> Vec<u8> {
        (0..10_000u32).map(|i| (i * 7 + i / 13) as u8).collect()
    }

    #[test]
    fn an_encoded_image_decodes_under_its_key_only() {
        let file = encode(KEY, &image());
        assert_eq!(decode(&file, KEY), Ok(image().as_slice()));
        assert_eq!(decode(&file, "fedcba9876543210"), Err(Invalid::Key));
        assert_eq!(decode(&encode(KEY, &[]), KEY), Ok(&[][..]));
    }

    #[test]
    fn truncated_garbled_empty_and_old_files_are_refused() {
        let file = encode(KEY, &image());
        let half = &file[..file.len() / 2];
        assert!(matches!(decode(half, KEY), Err(Invalid::Length { .. })));
        let mut garbled = file.clone();
        let at = garbled.len() - 100;
        garbled[at] ^= 0x40;
        assert_eq!(decode(&garbled, KEY), Err(Invalid::Checksum));
        let mut longer = file.clone();
        longer.push(0);
        assert!(matches!(decode(&longer, KEY), Err(Invalid::Length { .. })));
        assert_eq!(decode(&[], KEY), Err(Invalid::Header));
        assert_eq!(decode(&file[..MAGIC.len() + 5], KEY), Err(Invalid::Key));
        assert_eq!(
            decode(&file[..MAGIC.len() + KEY.len() + 4], KEY),
            Err(Invalid::Header),
            "cut inside the length field"
        );
        let v1 = [
            b"kiln-kernel-v1\n".as_slice(),
            KEY.as_bytes(),
            b"\n",
            &image(),
        ]
        .concat();
        assert_eq!(decode(&v1, KEY), Err(Invalid::Header));
    }

    /// A fresh directory under the system's temporary one.
    fn temp_dir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("kiln-kcache-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_bad_file_is_recompiled_and_overwritten() {
        let dir = temp_dir("bad");
        let path = dir.join("cuda-unit-0123456789abcdef.bin");
        let good = encode(KEY, &image());
        let mut garbled = good.clone();
        garbled[good.len() - 1] ^= 1;
        for (what, bytes) in [
            ("truncated", good[..good.len() / 2].to_vec()),
            ("garbled", garbled),
            ("empty", Vec::new()),
        ] {
            std::fs::write(&path, &bytes).unwrap();
            let compiles = Cell::new(0);
            let compile = || {
                compiles.set(compiles.get() + 1);
                Ok::<_, Infallible>(image())
            };
            let (got, cached) = load_or_compile(Some(&path), KEY, compile).unwrap();
            assert_eq!((got, cached, compiles.get()), (image(), false, 1), "{what}");
            assert_eq!(std::fs::read(&path).unwrap(), good, "{what}: rewritten");
            let (got, cached) = load_or_compile(Some(&path), KEY, compile).unwrap();
            assert_eq!((got, cached, compiles.get()), (image(), true, 1), "{what}");
        }
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert_eq!(left.len(), 1, "no temporary file is left behind");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn no_file_or_no_directory_compiles() {
        let dir = temp_dir("none");
        let path = dir.join("sub/x.bin");
        let (got, cached) =
            load_or_compile(Some(&path), KEY, || Ok::<_, Infallible>(image())).unwrap();
        assert_eq!((got, cached), (image(), false));
        assert_eq!(
            load(&path, KEY),
            Ok(Some(image())),
            "stored, directory created"
        );
        let (got, cached) = load_or_compile(None, KEY, || Ok::<_, Infallible>(vec![1])).unwrap();
        assert_eq!((got, cached), (vec![1], false));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
