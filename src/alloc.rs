//! The process's allocator: the system's, counting per thread the bytes allocated less the
//! bytes freed (one thread-local add per call). [`measured`] tells what a piece of work left
//! allocated: a grammar compile leaves exactly what its matcher keeps (the token trie and
//! tokenizer it shares were built before), which is how the grammar cache counts bytes.
//! [`peak`] tells the most a piece of work held at once (how a response body is checked to
//! cost about its own size).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// The system allocator, counting for [`measured`].
pub struct Counting;

thread_local! {
    static NET: Cell<isize> = const { Cell::new(0) };
    /// The highest `NET` has been since [`peak`] last reset it.
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn note(delta: isize) {
    // `try_with`: a thread being torn down may still allocate.
    let _ = NET.try_with(|n| {
        let now = n.get() + delta;
        n.set(now);
        if delta > 0 {
            let _ = PEAK.try_with(|p| p.set(p.get().max(now)));
        }
    });
}

/// Bytes this thread has allocated less the bytes it freed, since it started (negative when
/// it freed what another thread allocated).
pub fn thread_net_bytes() -> isize {
    NET.with(Cell::get)
}

// SAFETY: every call is forwarded unchanged to `System`, which upholds `GlobalAlloc`'s
// contract; the bookkeeping touches only const-initialized thread-locals without
// destructors, so it never allocates or re-enters the allocator.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            note(layout.size() as isize);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            note(layout.size() as isize);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.dealloc(ptr, layout) };
        note(-(layout.size() as isize));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            note(new_size as isize - layout.size() as isize);
        }
        p
    }
}

/// Runs `f` and returns what it left allocated on this thread (bytes allocated less bytes
/// freed, at least 0).
pub fn measured<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let before = thread_net_bytes();
    let out = f();
    (out, (thread_net_bytes() - before).max(0) as usize)
}

/// Runs `f` and returns the most it held allocated on this thread at any one time (bytes
/// above what the thread held when `f` started, at least 0). Nests: an outer `peak` still
/// sees what an inner one measured.
pub fn peak<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let before = thread_net_bytes();
    let outer = PEAK.with(|p| p.replace(before));
    let out = f();
    let top = PEAK.with(|p| {
        let top = p.get();
        p.set(outer.max(top));
        top
    });
    (out, (top - before).max(0) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_what_is_kept_not_what_is_freed() {
        let (kept, bytes) = measured(|| {
            let _scratch = vec![0u8; 1 << 20];
            vec![1u8; 300_000]
        });
        assert_eq!(kept.len(), 300_000);
        assert!((300_000..310_000).contains(&bytes), "{bytes}");
        let ((), nested) = measured(|| {
            let (v, inner) = measured(|| vec![0u64; 1000]);
            assert!(inner >= 8000);
            drop(v);
        });
        assert!(nested < 1000, "{nested}");
    }

    #[test]
    fn peak_sees_what_was_freed_before_the_end() {
        let (kept, top) = peak(|| {
            let scratch = vec![0u8; 1 << 20];
            drop(scratch);
            let ((), inner) = peak(|| drop(vec![0u8; 100_000]));
            assert!((100_000..110_000).contains(&inner), "{inner}");
            vec![1u8; 300_000]
        });
        assert_eq!(kept.len(), 300_000);
        assert!(((1 << 20)..(1 << 20) + 10_000).contains(&top), "{top}");
    }
}
