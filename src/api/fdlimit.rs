//! The process's open-file limit: raised to its hard limit at start, and the connection bound
//! kept under it so that accepting sockets can never starve the server of descriptors.

/// Descriptors kept free for everything but client sockets (model files, logs, the engine).
pub const RESERVED_FDS: u64 = 256;

/// The soft and hard `RLIMIT_NOFILE`, or `None` where it cannot be read.
#[allow(clippy::unnecessary_cast)] // `rlim_t` is not `u64` on every target.
pub fn nofile() -> Option<(u64, u64)> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `getrlimit` writes one `rlimit` through a valid, exclusive pointer.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    (rc == 0).then_some((lim.rlim_cur as u64, lim.rlim_max as u64))
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (at most 2^20); returns the limits before and after.
#[allow(clippy::unnecessary_cast)] // `rlim_t` is not `u64` on every target.
pub fn raise_nofile() -> std::io::Result<(u64, u64)> {
    let (soft, hard) = nofile().ok_or_else(std::io::Error::last_os_error)?;
    // An unlimited hard limit cannot be the soft one (the kernel caps it at `nr_open`).
    let target = hard.min(1 << 20);
    if soft >= target {
        return Ok((soft, soft));
    }
    let lim = libc::rlimit {
        rlim_cur: target as libc::rlim_t,
        rlim_max: hard as libc::rlim_t,
    };
    // SAFETY: `setrlimit` reads one valid `rlimit`; raising the soft limit up to the hard
    // limit needs no privilege and affects only this process.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((soft, target))
}

/// `wanted` connections, lowered so that they and [`RESERVED_FDS`] fit the soft limit.
pub fn connection_bound(wanted: usize) -> usize {
    match nofile() {
        Some((soft, _)) => {
            let room = soft.saturating_sub(RESERVED_FDS).max(16);
            wanted.min(usize::try_from(room).unwrap_or(usize::MAX))
        }
        None => wanted,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_read_and_bound_fits() {
        let (soft, hard) = nofile().expect("getrlimit");
        assert!(soft <= hard);
        let bound = connection_bound(usize::MAX) as u64;
        assert!(bound + RESERVED_FDS <= soft.max(16 + RESERVED_FDS));
        assert_eq!(connection_bound(3), 3);
    }
}
