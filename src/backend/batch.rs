//! Plain-data description of one forward step: what the scheduler hands the model.
//!
//! Tokens of all sequences are flattened; sequence `s` owns rows
//! `q_start .. q_start + q_len`. Its context after the step is `ctx_len` tokens, the last
//! `q_len` of which are the new ones, so token `i` of the chunk sits at position
//! `ctx_len - q_len + i` and attends to positions `0 ..= that`.
//!
//! ```text
//! rows:      | seq0 prefill chunk (q_len=5) | seq1 decode (1) | seq2 decode (1) |
//! seq0 ctx:  [ cached 3 tokens | 5 new ]       ctx_len = 8
//! slot(pos) = block_table[pos / block_size] * block_size + pos % block_size
//! ```
//!
//! Logits rows: the last row of each sequence that wants logits, and every row of the
//! sequences in `every_row_logits` (prompt logprobs), in row order.

use super::BackendError;

/// One sequence's share of a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeqSlice {
    /// First row of this sequence in the flattened batch.
    pub q_start: u32,
    /// Number of new tokens this step.
    pub q_len: u32,
    /// Tokens in the cache after this step (computed before + `q_len`).
    pub ctx_len: u32,
    /// Physical block of each logical block of the sequence.
    pub block_table: Vec<u32>,
    /// Whether the last row of this chunk produces logits (and a sampled token).
    pub wants_logits: bool,
}

/// A whole step: flattened tokens plus per-sequence slices.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchPlan {
    /// `[T]` token ids.
    pub token_ids: Vec<u32>,
    /// `[T]` absolute positions.
    pub positions: Vec<u32>,
    /// `[T]` cache slot of each token.
    pub slot_mapping: Vec<u32>,
    pub seqs: Vec<SeqSlice>,
    pub block_size: u32,
    /// Indices into `seqs` (ascending) of the sequences whose every row produces logits,
    /// not only the last: prompt logprobs need the prediction at each prompt position.
    pub every_row_logits: Vec<u32>,
}

impl BatchPlan {
    /// Number of flattened tokens.
    pub fn num_tokens(&self) -> usize {
        self.token_ids.len()
    }
    /// Whether every row of sequence `i` produces logits.
    pub fn every_row(&self, i: usize) -> bool {
        self.every_row_logits.binary_search(&(i as u32)).is_ok()
    }
    /// Rows that produce logits, in row order: the last row of each sequence that wants
    /// logits, and every row of the sequences in `every_row_logits`.
    pub fn logits_rows(&self) -> Vec<u32> {
        let mut rows = Vec::with_capacity(self.seqs.len());
        for (i, s) in self.seqs.iter().enumerate() {
            if self.every_row(i) {
                rows.extend(s.q_start..s.q_start + s.q_len);
            } else if s.wants_logits {
                rows.push(s.q_start + s.q_len - 1);
            }
        }
        rows
    }
    /// `logits_rows().len()`, without building the list.
    pub fn num_logits_rows(&self) -> usize {
        self.seqs
            .iter()
            .enumerate()
            .map(|(i, s)| {
                if self.every_row(i) {
                    s.q_len as usize
                } else {
                    s.wants_logits as usize
                }
            })
            .sum()
    }
    /// Builds positions and slot mappings from the slices and the flattened tokens.
    pub fn fill_positions_and_slots(&mut self) {
        let bs = self.block_size;
        self.positions.clear();
        self.slot_mapping.clear();
        for s in &self.seqs {
            for i in 0..s.q_len {
                let pos = s.ctx_len - s.q_len + i;
                self.positions.push(pos);
                self.slot_mapping
                    .push(s.block_table[(pos / bs) as usize] * bs + pos % bs);
            }
        }
    }
    /// Checks the plan against the cache shape: rows contiguous, tables long enough,
    /// blocks in range. Backends call this before trusting any index.
    pub fn validate(&self, kv: &KvShape) -> Result<(), BackendError> {
        let t = self.token_ids.len();
        let bad = |m: String| Err(BackendError::InvalidBatch(m));
        if self.positions.len() != t || self.slot_mapping.len() != t {
            return bad(format!(
                "{} tokens but {} positions, {} slots",
                t,
                self.positions.len(),
                self.slot_mapping.len()
            ));
        }
        if self.block_size as usize != kv.block_size {
            return bad(format!(
                "block size {} != cache block size {}",
                self.block_size, kv.block_size
            ));
        }
        let mut row = 0u32;
        for (i, s) in self.seqs.iter().enumerate() {
            if s.q_start != row || s.q_len == 0 || s.q_len > s.ctx_len {
                return bad(format!("sequence {i}: bad slice {s:?} at row {row}"));
            }
            row += s.q_len;
            let need = (s.ctx_len as usize).div_ceil(kv.block_size);
            if s.block_table.len() < need {
                return bad(format!(
                    "sequence {i}: {} blocks for {} tokens",
                    s.block_table.len(),
                    s.ctx_len
                ));
            }
            if let Some(b) = s.block_table[..need]
                .iter()
                .find(|&&b| b as usize >= kv.num_blocks)
            {
                return bad(format!("sequence {i}: block {b} out of range"));
            }
        }
        if row as usize != t {
            return bad(format!("slices cover {row} rows of {t}"));
        }
        let e = &self.every_row_logits;
        if e.windows(2).any(|w| w[0] >= w[1])
            || e.last().is_some_and(|&i| i as usize >= self.seqs.len())
        {
            return bad(format!(
                "every-row logits sequences {e:?} not ascending in range"
            ));
        }
        if let Some(s) = self
            .slot_mapping
            .iter()
            .find(|&&s| s as usize >= kv.num_slots())
        {
            return bad(format!("slot {s} out of range"));
        }
        Ok(())
    }
}

/// Shape of the paged KV pool: per layer, K and V each `[num_blocks, block_size, n_kv_heads, head_dim]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvShape {
    pub num_layers: usize,
    pub num_blocks: usize,
    pub block_size: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
}

impl KvShape {
    /// Token slots per layer.
    pub fn num_slots(&self) -> usize {
        self.num_blocks * self.block_size
    }
    /// Floats per slot (one of K or V).
    pub fn slot_width(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(every_row_logits: Vec<u32>) -> BatchPlan {
        let slice = |q_start, q_len, wants_logits| SeqSlice {
            q_start,
            q_len,
            ctx_len: q_len,
            block_table: vec![0],
            wants_logits,
        };
        let mut p = BatchPlan {
            token_ids: vec![1; 9],
            seqs: vec![slice(0, 1, true), slice(1, 5, false), slice(6, 3, true)],
            block_size: 16,
            every_row_logits,
            ..Default::default()
        };
        p.fill_positions_and_slots();
        p
    }

    #[test]
    fn every_row_sequences_give_each_row_in_row_order() {
        let kv = KvShape {
            num_layers: 1,
            num_blocks: 1,
            block_size: 16,
            n_kv_heads: 1,
            head_dim: 1,
        };
        let p = plan(vec![]);
        assert_eq!((p.logits_rows(), p.num_logits_rows()), (vec![0, 8], 2));
        let p = plan(vec![1, 2]);
        assert_eq!(p.logits_rows(), vec![0, 1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(p.num_logits_rows(), 9);
        assert!(p.validate(&kv).is_ok());
        for bad in [vec![2, 1], vec![1, 1], vec![3]] {
            assert!(plan(bad.clone()).validate(&kv).is_err(), "{bad:?}");
        }
    }
}
