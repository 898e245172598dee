//! The threads that compile constraints: a few, each with a stack sized for the deepest
//! constraint [`super::limits`] admits, fed by a bounded queue. Compiles run here, never on
//! the tokenizing pool or an HTTP worker, so a slow one delays only other constrained
//! requests; a compile that panics fails its own request (its result channel closes).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};

/// Stack of a compile thread. Reserved address space: only the pages a deep compile touches
/// become memory. llguidance 1.9.1 touched 8.6 KiB per `$ref` followed (about 2.9 KiB per
/// level of [`super::limits::json_depth`]) and 3.1 KiB per Lark rule naming the next
/// (`constraint::tests::stack_per_level`): the default depth limit (256) needs under 1 MiB,
/// [`super::limits::MAX_DEPTH_LIMIT`] (4096) about 14 MiB, four times within this.
pub const STACK_BYTES: usize = 64 << 20;

type Job = Box<dyn FnOnce() + Send>;

/// A fixed set of compile threads behind a bounded queue.
pub(crate) struct CompilePool {
    tx: SyncSender<Job>,
}

/// The queue is full: every thread is busy and `queue` more compiles wait.
#[derive(Debug)]
pub(crate) struct PoolFull;

impl CompilePool {
    /// `threads` threads named `kiln-grammar-N`, at most `queue` jobs waiting.
    pub fn new(threads: usize, queue: usize) -> std::io::Result<Self> {
        let (tx, rx) = sync_channel::<Job>(queue);
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..threads.max(1) {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("kiln-grammar-{i}"))
                .stack_size(STACK_BYTES)
                .spawn(move || work(&rx))?;
        }
        Ok(Self { tx })
    }

    /// Queues `job`; it runs on a compile thread. A panic in it is caught there (whatever
    /// the job would have sent is dropped, so its caller sees a closed channel).
    pub fn spawn(&self, job: impl FnOnce() + Send + 'static) -> Result<(), PoolFull> {
        match self.tx.try_send(Box::new(job)) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => Err(PoolFull),
        }
    }
}

fn work(rx: &Mutex<Receiver<Job>>) {
    loop {
        // The lock is held only while waiting for the next job, never while it runs.
        let job = match rx.lock() {
            Ok(rx) => rx.recv(),
            Err(_) => return,
        };
        let Ok(job) = job else { return };
        if catch_unwind(AssertUnwindSafe(job)).is_err() {
            tracing::warn!("a constraint compile panicked; its request failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;
    use std::time::Duration;

    #[test]
    fn jobs_run_panics_fail_alone_and_the_queue_is_bounded() {
        let pool = CompilePool::new(1, 2).unwrap();
        let (tx, rx) = channel();
        let t = tx.clone();
        pool.spawn(move || {
            let _keep = t;
            panic!("boom");
        })
        .unwrap();
        pool.spawn(move || tx.send(7).unwrap()).unwrap();
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(10)),
            Ok(7),
            "the thread survived"
        );
        // Block the one thread, fill the queue: the next spawn is refused.
        let (hold_tx, hold_rx) = channel::<()>();
        let (started_tx, started_rx) = channel();
        pool.spawn(move || {
            started_tx.send(()).unwrap();
            let _ = hold_rx.recv();
        })
        .unwrap();
        started_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        pool.spawn(|| {}).unwrap();
        pool.spawn(|| {}).unwrap();
        assert!(pool.spawn(|| {}).is_err(), "a third waiting job is refused");
        drop(hold_tx);
    }

    #[test]
    fn the_stack_holds_deep_recursion() {
        fn down(n: usize) -> usize {
            let pad = std::hint::black_box([n as u8; 4096]);
            if n == 0 {
                pad[0] as usize
            } else {
                down(n - 1) + pad[1] as usize - pad[1] as usize
            }
        }
        let pool = CompilePool::new(1, 1).unwrap();
        let (tx, rx) = channel();
        // 48 MiB of frames: far past a default thread's 2 MiB.
        pool.spawn(move || tx.send(down(12 << 10)).unwrap())
            .unwrap();
        assert_eq!(rx.recv_timeout(Duration::from_secs(30)), Ok(0));
    }
}
