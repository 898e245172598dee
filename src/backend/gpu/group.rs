//! Tensor parallelism on the GPU: the backend joins its lane's group through the runtime's
//! communicator (NCCL), bootstrapped over the host group (rank 0 makes the unique id, the
//! others read it), and runs the collectives on its own stream, so they are recorded into
//! the decode graphs with the rest of the step.
//!
//! The logits gather follows the vocabulary split of `runner::shard` (parts of
//! `ceil(V / N)` columns, the last one shorter): every rank sends its part padded to the
//! full part width, the runtime gathers them rank-major (`[N, n, ceil(V / N)]`), and one
//! strided copy per rank moves each block to its columns of `out` (`[n, V]`).

use std::time::{Duration, Instant};

use super::device::DevBuf;
use super::runtime::{self, Runtime};
use super::{GpuBackend, GpuTensor, check_rows, ensure, invalid};
use crate::backend::{BackendError, GroupMember};

/// How long a rank waits in the communicator's init for the others to join.
const JOIN_TIMEOUT: Duration = Duration::from_secs(300);

/// This backend's membership of a tensor-parallel group.
pub(super) struct GpuGroup<R: Runtime> {
    member: GroupMember,
    comm: R::Comm,
    /// A narrower part padded to the full part width (all-gather's send buffer).
    send: Option<DevBuf>,
    /// The rank-major gathered parts.
    recv: Option<DevBuf>,
}

/// Columns of rank `rank`'s vocabulary part: `runner::shard::Shard::vocab`'s rule.
fn part_cols(total: usize, size: usize, rank: usize) -> (usize, usize) {
    let part = total.div_ceil(size.max(1));
    let start = (rank * part).min(total);
    (start, ((rank + 1) * part).min(total) - start)
}

impl<R: Runtime> GpuBackend<R> {
    /// Devices `R` sees (0 where its libraries do not load).
    pub fn device_count() -> usize {
        R::device_count().unwrap_or(0)
    }

    /// Joins `member`'s group: rank 0 makes the communicator id, the host group hands it
    /// to the others, and every rank joins on its own thread with its device current.
    pub(super) fn join(&mut self, member: GroupMember) -> Result<(), BackendError> {
        // Every kernel module is loaded before the communicator exists: loading one on a GPU
        // while a peer's collective waits there can deadlock (NCCL's rule on concurrent
        // implicitly synchronizing calls), and no step can start before all ranks joined.
        self.ctx.kernels.wait_model(&self.ctx.dev.rt)?;
        let id = match member.rank {
            0 => R::comm_id().map_err(|e| {
                member.abort();
                runtime::dev_err("communicator id")(e)
            })?,
            _ => Vec::new(),
        };
        let id = member.broadcast_bytes(&id)?;
        // Every rank waits in the runtime's init for the others: it gives up when one of
        // them breaks the host group (it failed), or after JOIN_TIMEOUT, and then breaks
        // the group itself so the others give up too.
        let deadline = Instant::now() + JOIN_TIMEOUT;
        let give_up = || member.is_broken() || Instant::now() > deadline;
        let comm = self
            .ctx
            .dev
            .rt
            .comm_join_or_give_up(&id, member.rank, member.size, &give_up)
            .map_err(|e| {
                member.abort();
                runtime::dev_err("communicator init")(e)
            })?;
        tracing::info!(
            backend = R::NAME,
            rank = member.rank,
            size = member.size,
            ordinal = self.ctx.dev.ordinal,
            "joined the tensor-parallel group"
        );
        self.group = Some(GpuGroup {
            member,
            comm,
            send: None,
            recv: None,
        });
        Ok(())
    }

    /// In-place sum of `x`'s first `n` rows over the group.
    pub(super) fn launch_all_reduce(
        &mut self,
        x: &mut GpuTensor,
        n: usize,
    ) -> Result<(), BackendError> {
        self.settle_qx()?;
        check_rows("all_reduce_sum", n, x.rows)?;
        let Some(g) = self.group.as_ref() else {
            return Ok(());
        };
        let (dt, ptr, count) = (self.ctx.dt, x.buf.ptr(), n * x.cols);
        if count == 0 || g.member.size == 1 {
            return Ok(());
        }
        self.ctx.dev.timed("all_reduce", |rt| {
            // SAFETY: `x` holds at least `n` rows of `cols` elements of the storage type.
            unsafe { rt.all_reduce_sum(&g.comm, dt, ptr, count) }
                .map_err(runtime::dev_err("all_reduce"))
        })
    }

    /// `out[:n] = [part of rank 0 | part of rank 1 | ...]` by columns.
    pub(super) fn launch_all_gather(
        &mut self,
        part: &GpuTensor,
        n: usize,
        out: &mut GpuTensor,
    ) -> Result<(), BackendError> {
        self.settle_qx()?;
        check_rows("all_gather", n, part.rows)?;
        check_rows("all_gather", n, out.rows)?;
        let Some(g) = self.group.as_mut() else {
            return Err(invalid("all_gather outside a tensor-parallel group".into()));
        };
        let (size, rank) = (g.member.size, g.member.rank);
        let total = out.cols;
        let width = total.div_ceil(size);
        if part.cols != part_cols(total, size, rank).1 {
            return Err(invalid(format!(
                "all_gather: rank {rank} holds {} of {total} columns, expected {}",
                part.cols,
                part_cols(total, size, rank).1
            )));
        }
        if n == 0 {
            return Ok(());
        }
        let es = self.ctx.dt.size();
        let (dt, row) = (self.ctx.dt, width * es);
        let recv = ensure(
            &self.ctx.dev,
            &mut g.recv,
            size * n * row,
            "all_gather",
            &mut self.ctx.generation,
        )?;
        let send = match part.cols == width {
            true => part.buf.ptr(),
            false => ensure(
                &self.ctx.dev,
                &mut g.send,
                n * row,
                "all_gather",
                &mut self.ctx.generation,
            )?,
        };
        let src = (part.buf.ptr(), part.cols * es);
        self.ctx.dev.timed("all_gather", |rt| {
            let err = runtime::dev_err("all_gather");
            // SAFETY: `send` holds `n` rows of `width` elements (the part itself, or the
            // padding buffer sized above, filled from the part's `n` rows); `recv` holds
            // `size` such blocks; each block's columns land inside `out`'s `n` rows.
            unsafe {
                if send != src.0 {
                    rt.copy_2d(send, row, src.0, src.1, src.1, n)
                        .map_err(&err)?;
                }
                rt.all_gather(&g.comm, dt, send, recv, n * width)
                    .map_err(&err)?;
                for r in 0..size {
                    let (start, cols) = part_cols(total, size, r);
                    let dst = out.buf.ptr() + (start * es) as u64;
                    let block = recv + (r * n * row) as u64;
                    rt.copy_2d(dst, total * es, block, row, cols * es, n)
                        .map_err(&err)?;
                }
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::part_cols;

    #[test]
    fn parts_follow_the_shard_vocabulary_split() {
        let parts: Vec<_> = (0..4).map(|r| part_cols(10, 4, r)).collect();
        assert_eq!(parts, vec![(0, 3), (3, 3), (6, 3), (9, 1)]);
        assert_eq!(part_cols(8, 2, 1), (4, 4));
    }
}
