//! A step's metadata packed into one `u32` buffer, uploaded with one copy per step.
//!
//! ```text
//! words: | token_ids [T] | positions [T] | slots [T] | seqinfo [S x 4] | block tables |
//!        | logits_rows [L] | attention items [I x 6] | split rows [R x 3] |
//! seqinfo:  q_start, q_len, ctx_len, offset of the sequence's table in `block tables`
//! item:     seq, row0, nrows, kv_begin, kv_end, part (NO_PART: written directly)
//! split:    row, first part, number of parts (merged by attn_combine)
//! ```
//! Items cut each sequence's rows into tiles of `ROWS_PER_ITEM`. When the batch would give
//! the GPU too few blocks, long decode rows are split along the context (flash-decoding)
//! into parts of at least `MIN_SPLIT` positions.

use crate::backend::{BatchPlan, KvShape};

/// Query rows per attention item.
pub const ROWS_PER_ITEM: u32 = 8;
/// Marks an item that writes its output directly.
pub const NO_PART: u32 = u32::MAX;
/// Shortest context segment of a split-K part.
const MIN_SPLIT: u32 = 128;
/// Most parts one row is split into.
const MAX_PARTS: u32 = 64;

/// Where each array starts in the packed buffer (in words), and how long it is.
#[derive(Debug, Clone, Copy, Default)]
pub struct Layout {
    pub tokens: usize,
    pub positions: usize,
    pub slots: usize,
    pub seqinfo: usize,
    pub tables: usize,
    pub logits_rows: usize,
    pub items: usize,
    pub splits: usize,
    pub words: usize,
    pub n_tokens: usize,
    pub n_logits: usize,
    pub n_items: usize,
    pub n_splits: usize,
    /// Split-K partial slots (each holds every query head of one row).
    pub n_parts: usize,
    /// Most query rows in one item.
    pub max_item_rows: u32,
    /// Largest token id (checked against the vocab by `embed`).
    pub max_token: u32,
}

/// Packs `plan` (already validated against `kv`) into `words`. `sm_count` steers split-K.
pub fn pack(plan: &BatchPlan, kv: &KvShape, sm_count: usize, words: &mut Vec<u32>) -> Layout {
    words.clear();
    let mut l = Layout {
        n_tokens: plan.num_tokens(),
        ..Layout::default()
    };
    l.tokens = words.len();
    words.extend_from_slice(&plan.token_ids);
    l.positions = words.len();
    words.extend_from_slice(&plan.positions);
    l.slots = words.len();
    words.extend_from_slice(&plan.slot_mapping);
    l.seqinfo = words.len();
    let mut table_off = 0u32;
    for s in &plan.seqs {
        words.extend_from_slice(&[s.q_start, s.q_len, s.ctx_len, table_off]);
        table_off += s.block_table.len() as u32;
    }
    l.tables = words.len();
    for s in &plan.seqs {
        words.extend_from_slice(&s.block_table);
    }
    l.logits_rows = words.len();
    let rows = plan.logits_rows();
    l.n_logits = rows.len();
    words.extend_from_slice(&rows);

    let mut items: Vec<[u32; 6]> = Vec::new();
    for (i, s) in plan.seqs.iter().enumerate() {
        let first_pos = s.ctx_len - s.q_len;
        let mut r = 0;
        while r < s.q_len {
            let n = ROWS_PER_ITEM.min(s.q_len - r);
            items.push([i as u32, s.q_start + r, n, 0, first_pos + r + n, NO_PART]);
            r += n;
        }
    }
    let (items, splits, n_parts) = split_long_rows(items, kv.n_kv_heads, sm_count);
    l.max_item_rows = items.iter().map(|it| it[2]).max().unwrap_or(0);
    l.items = words.len();
    l.n_items = items.len();
    words.extend(items.iter().flatten());
    l.splits = words.len();
    l.n_splits = splits.len();
    words.extend(splits.iter().flatten());
    l.n_parts = n_parts;
    l.words = words.len();
    l.max_token = plan.token_ids.iter().copied().max().unwrap_or(0);
    l
}

/// Splits single-row items with long contexts into parts when the batch fills fewer than
/// two waves of blocks. Returns (items, split rows, number of parts).
fn split_long_rows(
    items: Vec<[u32; 6]>,
    n_kv: usize,
    sm_count: usize,
) -> (Vec<[u32; 6]>, Vec<[u32; 3]>, usize) {
    let blocks = items.len() * n_kv.max(1);
    let target = 2 * sm_count.max(1);
    if blocks >= target {
        return (items, Vec::new(), 0);
    }
    let want = target.div_ceil(blocks.max(1)) as u32;
    let mut out = Vec::with_capacity(items.len());
    let mut splits = Vec::new();
    let mut parts = 0u32;
    for it in items {
        let ctx = it[4];
        if it[2] != 1 || ctx < 2 * MIN_SPLIT {
            out.push(it);
            continue;
        }
        let n = want.min(ctx / MIN_SPLIT).min(MAX_PARTS);
        let seg = ctx.div_ceil(n).div_ceil(64) * 64;
        let n = ctx.div_ceil(seg);
        if n < 2 {
            out.push(it);
            continue;
        }
        splits.push([it[1], parts, n]);
        for k in 0..n {
            out.push([
                it[0],
                it[1],
                1,
                k * seg,
                ((k + 1) * seg).min(ctx),
                parts + k,
            ]);
        }
        parts += n;
    }
    (out, splits, parts as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::SeqSlice;

    fn plan(seqs: &[(u32, u32)]) -> BatchPlan {
        let mut p = BatchPlan {
            block_size: 16,
            ..Default::default()
        };
        let mut row = 0;
        for &(q_len, ctx) in seqs {
            p.seqs.push(SeqSlice {
                q_start: row,
                q_len,
                ctx_len: ctx,
                block_table: (0..ctx.div_ceil(16)).collect(),
                wants_logits: true,
            });
            p.token_ids.extend(std::iter::repeat_n(1, q_len as usize));
            row += q_len;
        }
        p.fill_positions_and_slots();
        p
    }

    fn shape() -> KvShape {
        KvShape {
            num_layers: 1,
            num_blocks: 1024,
            block_size: 16,
            n_kv_heads: 8,
            head_dim: 128,
        }
    }

    #[test]
    fn items_tile_rows_and_cover_causal_ranges() {
        let mut w = Vec::new();
        let l = pack(&plan(&[(40, 50), (1, 7)]), &shape(), 1, &mut w);
        let items: Vec<&[u32]> = w[l.items..l.items + 6 * l.n_items].chunks(6).collect();
        assert_eq!(items.len(), 6);
        assert_eq!(items[0], &[0, 0, 8, 0, 18, NO_PART]);
        assert_eq!(items[4], &[0, 32, 8, 0, 50, NO_PART]);
        assert_eq!(items[5], &[1, 40, 1, 0, 7, NO_PART]);
        assert_eq!(l.n_splits, 0);
        assert_eq!(l.max_item_rows, 8);
    }

    #[test]
    fn long_decode_rows_split_into_covering_parts() {
        let mut w = Vec::new();
        let l = pack(&plan(&[(1, 5000)]), &shape(), 132, &mut w);
        assert_eq!(l.n_splits, 1);
        let items: Vec<&[u32]> = w[l.items..l.items + 6 * l.n_items].chunks(6).collect();
        assert_eq!(items.len(), l.n_parts);
        assert_eq!(items[0][3], 0);
        assert_eq!(items.last().unwrap()[4], 5000);
        for pair in items.windows(2) {
            assert_eq!(pair[0][4], pair[1][3], "parts are contiguous");
        }
        assert_eq!(&w[l.splits..l.splits + 3], &[0, 0, l.n_parts as u32]);
    }
}
