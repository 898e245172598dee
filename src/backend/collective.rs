//! Tensor-parallel groups: the shards of one lane, each driven by its own thread, and the
//! collectives they meet in (a sum over all shards, a gather of column blocks). This host
//! group is the CPU backend's collective (shared buffers and a blocking barrier); a GPU
//! backend joins the same group and may use it only to bootstrap its own communicator
//! (NCCL/RCCL: rank 0 makes the unique id, the others read it), then runs the collectives
//! on its stream.
//!
//! Every member calls the collectives in the same order. A member that fails between two
//! collectives calls [`GroupMember::abort`]: the others' waits return an error instead of
//! blocking forever, and the group stays broken until [`HostGroup::reset`].

use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};

use super::BackendError;

/// The rendezvous and shared buffers of one tensor-parallel group.
#[derive(Debug)]
pub struct HostGroup {
    size: usize,
    state: Mutex<Rendezvous>,
    turn: Condvar,
    /// One buffer per rank, written by its owner and read by every member.
    slots: Vec<RwLock<Vec<f32>>>,
    /// Bytes rank 0 hands every member ([`GroupMember::broadcast_bytes`]: a GPU
    /// communicator's unique id).
    blob: RwLock<Vec<u8>>,
}

#[derive(Debug, Default)]
struct Rendezvous {
    /// Members waiting in the current round.
    arrived: usize,
    /// Rounds completed.
    round: u64,
    /// A member gave up: every wait fails until a reset.
    broken: bool,
}

/// One shard's membership: its rank and the group it meets in.
#[derive(Debug, Clone)]
pub struct GroupMember {
    pub rank: usize,
    pub size: usize,
    group: Arc<HostGroup>,
}

const ABORTED_OP: &str = "collective";

fn aborted() -> BackendError {
    BackendError::Device {
        op: ABORTED_OP,
        message: "another shard of the tensor-parallel group failed".into(),
    }
}

/// Whether `e` only says that another member broke the group (not the cause).
pub fn is_aborted(e: &BackendError) -> bool {
    matches!(e, BackendError::Device { op, .. } if *op == ABORTED_OP)
}

impl HostGroup {
    /// A group of `size` (at least 1) members.
    pub fn new(size: usize) -> Arc<HostGroup> {
        let size = size.max(1);
        Arc::new(HostGroup {
            size,
            state: Mutex::new(Rendezvous::default()),
            turn: Condvar::new(),
            slots: (0..size).map(|_| RwLock::new(Vec::new())).collect(),
            blob: RwLock::new(Vec::new()),
        })
    }

    /// The membership of every rank, in rank order.
    pub fn members(self: &Arc<Self>) -> Vec<GroupMember> {
        (0..self.size)
            .map(|rank| GroupMember {
                rank,
                size: self.size,
                group: self.clone(),
            })
            .collect()
    }

    fn lock(&self) -> MutexGuard<'_, Rendezvous> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Breaks the group: waiting members and every later wait get an error.
    pub fn abort(&self) {
        self.lock().broken = true;
        self.turn.notify_all();
    }

    /// Mends a broken group. Call it only while no member is inside a collective (between
    /// steps, once every shard has reported).
    pub fn reset(&self) {
        let mut st = self.lock();
        st.broken = false;
        st.arrived = 0;
    }

    /// Blocks until every member has arrived (a barrier), or fails when the group breaks.
    fn wait(&self) -> Result<(), BackendError> {
        let mut st = self.lock();
        if st.broken {
            return Err(aborted());
        }
        let round = st.round;
        st.arrived += 1;
        if st.arrived == self.size {
            st.arrived = 0;
            st.round += 1;
            self.turn.notify_all();
            return Ok(());
        }
        while st.round == round && !st.broken {
            st = self.turn.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        if st.round != round {
            Ok(())
        } else {
            Err(aborted())
        }
    }

    /// Publishes `data` as `rank`'s slot, waits for everyone, runs `read` over all slots in
    /// rank order, and waits again so no slot is overwritten while another member reads.
    fn exchange(
        &self,
        rank: usize,
        data: &[f32],
        read: impl FnOnce(&[&[f32]]) -> Result<(), BackendError>,
    ) -> Result<(), BackendError> {
        {
            let mut mine = self.slots[rank].write().unwrap_or_else(|p| p.into_inner());
            mine.clear();
            mine.extend_from_slice(data);
        }
        self.wait()?;
        let result = {
            let guards: Vec<_> = self
                .slots
                .iter()
                .map(|s| s.read().unwrap_or_else(|p| p.into_inner()))
                .collect();
            let views: Vec<&[f32]> = guards.iter().map(|g| g.as_slice()).collect();
            read(&views)
        };
        if result.is_err() {
            self.abort();
        }
        self.wait()?;
        result
    }
}

impl GroupMember {
    /// A group of one (no peers): every collective is the identity.
    pub fn solo() -> GroupMember {
        HostGroup::new(1).members().remove(0)
    }

    /// The group this member belongs to.
    pub fn group(&self) -> &Arc<HostGroup> {
        &self.group
    }

    /// Breaks the group (this member will not reach the next collective).
    pub fn abort(&self) {
        self.group.abort();
    }

    /// Whether a member has broken the group (and it is not yet mended): a wait outside
    /// this group (a GPU communicator's set-up) polls it to give up too.
    pub fn is_broken(&self) -> bool {
        self.group.lock().broken
    }

    /// Rank 0's `data` on every member (the others' `data` is ignored): how a GPU group
    /// hands its communicator's unique id around before its first collective.
    pub fn broadcast_bytes(&self, data: &[u8]) -> Result<Vec<u8>, BackendError> {
        if self.size == 1 {
            return Ok(data.to_vec());
        }
        let blob = &self.group.blob;
        if self.rank == 0 {
            *blob.write().unwrap_or_else(|p| p.into_inner()) = data.to_vec();
        }
        self.group.wait()?;
        let got = blob.read().unwrap_or_else(|p| p.into_inner()).clone();
        // Nobody rewrites the blob before everyone has read it.
        self.group.wait()?;
        Ok(got)
    }

    /// `data = sum over ranks of each rank's data`, added in rank order so every member
    /// gets the same bits. Every member passes the same length.
    pub fn all_reduce_sum(&self, data: &mut [f32]) -> Result<(), BackendError> {
        if self.size == 1 {
            return Ok(());
        }
        let len = data.len();
        let mut sum = vec![0.0f32; len];
        self.group.exchange(self.rank, data, |slots| {
            for (r, s) in slots.iter().enumerate() {
                if s.len() != len {
                    return Err(BackendError::InvalidBatch(format!(
                        "all-reduce: rank {r} sent {} values, rank {} {len}",
                        s.len(),
                        self.rank
                    )));
                }
                sum.iter_mut().zip(s.iter()).for_each(|(a, b)| *a += b);
            }
            Ok(())
        })?;
        data.copy_from_slice(&sum);
        Ok(())
    }

    /// Gathers column blocks: each rank holds `rows` rows of its own width (`part`,
    /// row-major); `out` (`[rows, total]`, row-major) gets rank 0's columns first, then rank
    /// 1's, and so on. The widths must add up to `out.len() / rows`.
    pub fn all_gather_cols(
        &self,
        part: &[f32],
        rows: usize,
        out: &mut [f32],
    ) -> Result<(), BackendError> {
        if rows == 0 {
            return Ok(());
        }
        let total = out.len() / rows;
        self.group.exchange(self.rank, part, |slots| {
            let widths: Vec<usize> = slots.iter().map(|s| s.len() / rows).collect();
            if widths.iter().sum::<usize>() != total || slots.iter().any(|s| s.len() % rows != 0) {
                return Err(BackendError::InvalidBatch(format!(
                    "all-gather: parts of widths {widths:?} for {rows} rows of {total} columns"
                )));
            }
            let mut col = 0;
            for (s, &w) in slots.iter().zip(&widths) {
                for (row, src) in s.chunks_exact(w.max(1)).enumerate().take(rows) {
                    out[row * total + col..row * total + col + w].copy_from_slice(&src[..w]);
                }
                col += w;
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `f(member)` on one thread per member of a group of `n`; results in rank order.
    fn on_threads<T: Send>(n: usize, f: impl Fn(GroupMember) -> T + Sync) -> Vec<T> {
        let members = HostGroup::new(n).members();
        std::thread::scope(|s| {
            let handles: Vec<_> = members.into_iter().map(|m| s.spawn(|| f(m))).collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn all_reduce_sums_in_rank_order_and_gather_places_columns() {
        let out = on_threads(3, |m| {
            let mut total = Vec::new();
            for round in 0..20 {
                let mut v = vec![(m.rank + 1) as f32 * 0.1 + round as f32; 5];
                m.all_reduce_sum(&mut v).unwrap();
                total.push(v[0]);
            }
            // Rank r holds 2 rows of r + 1 columns, valued 10 * rank + column.
            let w = m.rank + 1;
            let part: Vec<f32> = (0..2 * w).map(|i| (10 * m.rank + i % w) as f32).collect();
            let mut all = vec![0.0; 2 * 6];
            m.all_gather_cols(&part, 2, &mut all).unwrap();
            (total, all)
        });
        let want: Vec<f32> = (0..20)
            .map(|r| ((0.1f32 + r as f32) + (0.2 + r as f32)) + (0.3 + r as f32))
            .collect();
        let row = [0.0, 10.0, 11.0, 20.0, 21.0, 22.0];
        for (total, all) in &out {
            assert_eq!(total, &want, "same bits on every rank");
            assert_eq!(all[..6], row);
            assert_eq!(all[6..], row);
        }
    }

    #[test]
    fn broadcast_bytes_hands_rank_0s_bytes_to_everyone() {
        let got = on_threads(3, |m| {
            let mine = vec![m.rank as u8 + 7; 4];
            let first = m.broadcast_bytes(&mine).unwrap();
            let second = m.broadcast_bytes(&[m.rank as u8]).unwrap();
            (first, second)
        });
        for (first, second) in got {
            assert_eq!(first, vec![7; 4]);
            assert_eq!(second, vec![0]);
        }
    }

    #[test]
    fn an_aborting_member_releases_the_others_until_reset() {
        let group = HostGroup::new(2);
        let members = group.members();
        let errs = std::thread::scope(|s| {
            let waiting = s.spawn(|| members[0].all_reduce_sum(&mut [1.0]));
            members[1].abort();
            waiting.join().unwrap()
        });
        assert!(errs.is_err());
        assert!(
            members[1].all_reduce_sum(&mut [1.0]).is_err(),
            "stays broken"
        );
        group.reset();
        let sums = on_threads(1, |_| {
            std::thread::scope(|s| {
                let a = s.spawn(|| {
                    let mut v = [1.0];
                    members[0].all_reduce_sum(&mut v).map(|_| v[0])
                });
                let mut v = [2.0];
                members[1].all_reduce_sum(&mut v).unwrap();
                (a.join().unwrap().unwrap(), v[0])
            })
        });
        assert_eq!(sums, vec![(3.0, 3.0)]);
    }
}
