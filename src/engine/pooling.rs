//! Embedding requests: prefill-only work for the same lanes and scheduler as generation.
//! Each input is one sequence whose prompt is computed and whose final-norm hidden rows are
//! pooled ([`Pooling`]) as its chunks are computed; it samples nothing, and its blocks are
//! released when its last chunk is done. [`super::EmbedHandle`] waits for the vector.

use crate::model::Pooling;

/// An input to embed, as a caller builds it.
#[derive(Debug, Clone)]
pub struct EmbedRequest {
    pub prompt_ids: Vec<u32>,
    /// The wire field the input came from, named in errors (`input`).
    pub prompt_param: &'static str,
}

/// One input's pooled hidden state (not normalized) and its token count.
#[derive(Debug, Clone, PartialEq)]
pub struct Embedding {
    /// `[hidden]` the pooled final-norm hidden state.
    pub vector: Vec<f32>,
    pub prompt_tokens: usize,
}

/// A sequence's pooling state, kept across its chunks and across a preemption (rows pooled
/// before it are not pooled again, and only they may come from the prefix cache).
#[derive(Debug, Clone)]
pub(crate) struct Pooler {
    kind: Pooling,
    /// Prompt positions pooled so far (mean), or 1 once the first row is kept (CLS).
    done: usize,
    /// `[hidden]` the running sum (mean) or the kept row (CLS, last).
    acc: Vec<f64>,
}

impl Pooler {
    pub fn new(kind: Pooling) -> Self {
        Self {
            kind,
            done: 0,
            acc: Vec::new(),
        }
    }

    /// Whether every row of the next chunk is needed (mean: all rows; CLS: the chunk that
    /// holds the first token); otherwise only the last row of the last chunk is.
    pub fn every_row(&self) -> bool {
        match self.kind {
            Pooling::Mean => true,
            Pooling::Cls => self.done == 0,
            Pooling::Last => false,
        }
    }

    /// Leading tokens of a `len`-token prompt that may come from the prefix cache: those
    /// already pooled (one token is always computed, so a step yields its row).
    pub fn cacheable(&self, len: usize) -> usize {
        let pooled = match self.kind {
            Pooling::Mean => self.done,
            Pooling::Cls if self.done == 0 => 0,
            Pooling::Cls | Pooling::Last => len,
        };
        pooled.min(len.saturating_sub(1))
    }

    /// Pools the rows of one computed chunk: `rows` (`[k, hidden]`, row-major) are the
    /// hidden states of positions `first .. first + k`.
    pub fn take(&mut self, first: usize, rows: &[f32], hidden: usize) {
        if hidden == 0 {
            return;
        }
        if self.acc.len() != hidden {
            self.acc = vec![0.0; hidden];
        }
        for (r, row) in rows.chunks_exact(hidden).enumerate() {
            let pos = first + r;
            match self.kind {
                Pooling::Mean if pos == self.done => {
                    for (a, &v) in self.acc.iter_mut().zip(row) {
                        *a += v as f64;
                    }
                    self.done += 1;
                }
                Pooling::Cls if pos == 0 && self.done == 0 => {
                    self.acc
                        .iter_mut()
                        .zip(row)
                        .for_each(|(a, &v)| *a = v as f64);
                    self.done = 1;
                }
                Pooling::Last => {
                    self.acc
                        .iter_mut()
                        .zip(row)
                        .for_each(|(a, &v)| *a = v as f64);
                }
                _ => {}
            }
        }
    }

    /// The pooled vector of a prompt of `len` tokens, all computed.
    pub fn finish(&self, len: usize) -> Vec<f32> {
        let scale = match self.kind {
            Pooling::Mean => 1.0 / len.max(1) as f64,
            Pooling::Cls | Pooling::Last => 1.0,
        };
        self.acc.iter().map(|&a| (a * scale) as f32).collect()
    }
}

/// `v / |v|` (unchanged when zero).
pub fn normalize(v: &mut [f32]) {
    let norm = v.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x = (*x as f64 / norm) as f32);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows of a 5-token prompt of width 2: row `p` is `[p, 10 p]`.
    fn rows(from: usize, to: usize) -> Vec<f32> {
        (from..to)
            .flat_map(|p| [p as f32, 10.0 * p as f32])
            .collect()
    }

    #[test]
    fn pooling_is_the_same_over_any_chunking_and_a_preemption() {
        for kind in [Pooling::Mean, Pooling::Cls, Pooling::Last] {
            let mut whole = Pooler::new(kind);
            whole.take(0, &rows(0, 5), 2);
            let mut chunked = Pooler::new(kind);
            chunked.take(0, &rows(0, 2), 2);
            // Preempted after two rows: recomputed from its cacheable prefix.
            let from = chunked.cacheable(5);
            chunked.take(from, &rows(from, 3), 2);
            chunked.take(3, &rows(3, 5), 2);
            assert_eq!(whole.finish(5), chunked.finish(5), "{kind:?}");
        }
        let mut mean = Pooler::new(Pooling::Mean);
        mean.take(0, &rows(0, 5), 2);
        assert_eq!(mean.finish(5), vec![2.0, 20.0]);
        let mut cls = Pooler::new(Pooling::Cls);
        cls.take(0, &rows(0, 5), 2);
        assert_eq!(cls.finish(5), vec![0.0, 0.0]);
        let mut last = Pooler::new(Pooling::Last);
        last.take(4, &rows(4, 5), 2);
        assert_eq!(last.finish(5), vec![4.0, 40.0]);
    }

    #[test]
    fn only_pooled_rows_may_come_from_the_cache() {
        let mut mean = Pooler::new(Pooling::Mean);
        assert_eq!(mean.cacheable(8), 0);
        mean.take(0, &rows(0, 3), 2);
        assert_eq!(mean.cacheable(8), 3);
        assert_eq!(Pooler::new(Pooling::Cls).cacheable(8), 0);
        assert_eq!(Pooler::new(Pooling::Last).cacheable(8), 7);
    }
}
