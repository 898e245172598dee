//! A step's metadata packed into one `u32` buffer, uploaded with one copy per step.
//!
//! ```text
//! words: | token_ids [T] | positions [T] | slots [T] | seqinfo [S x 4] | block tables |
//!        | logits_rows [L] | attention items [I x 6] | split rows [R x 3] | part splits [P] |
//!        | merge counters [R x KV heads] |
//! seqinfo:  q_start, q_len, ctx_len, offset of the sequence's table in `block tables`
//! item:     seq, row0, nrows, kv_begin, kv_end, part (NO_PART: written directly)
//! split:    row, first part, number of parts (merged by attn_combine, or by the decode
//!           attention's last part block of each KV head)
//! part split: the split row of each split-K part
//! merge counters: zeros, one per split row and KV head (the decode attention's folded merge
//!           counts its finished parts there and leaves them zero again)
//! ```
//! Items cut each sequence's rows into tiles of `ROWS_PER_ITEM` (`TC_ROWS_PER_ITEM` for the
//! tensor-core attention's long steps). When the batch would give the GPU too few blocks,
//! long decode rows are split along the context (flash-decoding) into parts of at least
//! `min_split` positions ([`MIN_SPLIT`] by default).

use crate::backend::{BatchPlan, KvShape};

/// Query rows per attention item.
pub const ROWS_PER_ITEM: u32 = 16;
/// Query rows per item for the tensor-core attention when the step has enough of them: its
/// pass takes 128 query vectors (32 rows of a GQA group of 4) and its blocks fit two to an SM.
pub const TC_ROWS_PER_ITEM: u32 = 32;
/// Marks an item that writes its output directly.
pub const NO_PART: u32 = u32::MAX;
/// Shortest context segment of a split-K part by default: 64 positions (`attn_min_split`
/// in `GpuTuning`, a multiple of 64, for tuning). At batch 1, context ~600, 64 against 128
/// took Qwen3-30B-A3B's attention (4 KV heads) from 0.953 to 0.782 ms a step on an H100.
#[cfg(test)]
const MIN_SPLIT: u32 = 64;
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
    /// The split row of each part (`n_parts` words).
    pub part_splits: usize,
    /// `n_counters` zero words: the folded merge's counters (split row x KV head).
    pub counters: usize,
    pub n_counters: usize,
    pub words: usize,
    pub n_tokens: usize,
    pub n_logits: usize,
    pub n_items: usize,
    pub n_splits: usize,
    /// Split-K partial slots (each holds every query head of one row).
    pub n_parts: usize,
    /// Most parts of one split row.
    pub max_parts: u32,
    /// Most query rows in one item.
    pub max_item_rows: u32,
    /// Largest token id (checked against the vocab by `embed`).
    pub max_token: u32,
}

/// The query rows an item of a step may take ([`pack`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ItemRows {
    /// [`ROWS_PER_ITEM`]: the portable attention's items.
    Portable,
    /// The tensor-core attention runs the step's long items, so they take
    /// [`TC_ROWS_PER_ITEM`] rows where that still fills a wave of its blocks (two per SM).
    TensorCore,
    /// One row each, so the decode variant takes every item: while the tensor-core
    /// attention still compiles after start-up (`Class::Later` in kernels.rs).
    One,
}

/// Packs `plan` (already validated against `kv`) into `words`. `sm_count` steers split-K,
/// into parts of at least `min_split` positions; `item_rows`, the rows an item may take.
pub fn pack(
    plan: &BatchPlan,
    kv: &KvShape,
    sm_count: usize,
    min_split: u32,
    item_rows: ItemRows,
    words: &mut Vec<u32>,
) -> Layout {
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

    let tc_items: usize = plan
        .seqs
        .iter()
        .map(|s| s.q_len.div_ceil(TC_ROWS_PER_ITEM) as usize)
        .sum();
    let per_item = match item_rows {
        ItemRows::One => 1,
        ItemRows::TensorCore if tc_items * kv.n_kv_heads.max(1) >= 2 * sm_count.max(1) => {
            TC_ROWS_PER_ITEM
        }
        _ => ROWS_PER_ITEM,
    };
    let mut items: Vec<[u32; 6]> = Vec::new();
    for (i, s) in plan.seqs.iter().enumerate() {
        let first_pos = s.ctx_len - s.q_len;
        let mut r = 0;
        while r < s.q_len {
            let n = per_item.min(s.q_len - r);
            items.push([i as u32, s.q_start + r, n, 0, first_pos + r + n, NO_PART]);
            r += n;
        }
    }
    let (items, splits, n_parts) = split_long_rows(items, kv.n_kv_heads, sm_count, min_split);
    l.max_item_rows = items.iter().map(|it| it[2]).max().unwrap_or(0);
    l.items = words.len();
    l.n_items = items.len();
    words.extend(items.iter().flatten());
    l.splits = words.len();
    l.n_splits = splits.len();
    words.extend(splits.iter().flatten());
    l.part_splits = words.len();
    for (i, sp) in splits.iter().enumerate() {
        words.extend(std::iter::repeat_n(i as u32, sp[2] as usize));
    }
    l.counters = words.len();
    l.n_counters = splits.len() * kv.n_kv_heads;
    words.extend(std::iter::repeat_n(0, l.n_counters));
    l.n_parts = n_parts;
    l.max_parts = splits.iter().map(|sp| sp[2]).max().unwrap_or(0);
    l.words = words.len();
    l.max_token = plan.token_ids.iter().copied().max().unwrap_or(0);
    l
}

/// Rows a graph-replayed decode step is padded to: the smallest bucket that holds it.
const GRAPH_BUCKETS: [u32; 19] = [
    1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256,
];
/// A padding row's slot: `write_kv` skips it.
pub const SKIP_SLOT: u32 = u32::MAX;

/// The shape a decode step replays at: rows after padding, split-K parts per row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GraphKey {
    pub rows: u32,
    pub parts: u32,
    /// The model's KV heads (the folded merge's counters per split row).
    pub kv_heads: u32,
}

impl GraphKey {
    /// The key of `plan` when it is a decode step (every sequence one token that wants
    /// logits) that fits a bucket of at most `row_cap` rows; `None` runs it eagerly.
    pub fn for_plan(
        plan: &BatchPlan,
        kv: &KvShape,
        sm_count: usize,
        row_cap: usize,
    ) -> Option<GraphKey> {
        let n = plan.seqs.len() as u32;
        let decode = |(i, s): (usize, &crate::backend::SeqSlice)| {
            s.q_len == 1 && s.wants_logits && s.q_start == i as u32
        };
        if n == 0 || !plan.seqs.iter().enumerate().all(decode) {
            return None;
        }
        let rows = *GRAPH_BUCKETS.iter().find(|&&b| b >= n)?;
        if rows as usize > row_cap {
            return None;
        }
        // Enough parts per row that the step fills two waves of blocks whatever the
        // context; parts beyond a short context are empty and exit at once.
        let blocks = rows as usize * kv.n_kv_heads.max(1);
        let target = 2 * sm_count.max(1);
        let parts = if blocks >= target {
            1
        } else {
            (target.div_ceil(blocks) as u32).min(MAX_PARTS)
        };
        Some(GraphKey {
            rows,
            parts,
            kv_heads: kv.n_kv_heads as u32,
        })
    }
}

/// Packs decode step `plan` at the fixed shape `key`: every array but the block tables has
/// the same length and offset for every step of that key, so the kernels recorded in a
/// graph read this step's values from the addresses they were recorded with. Rows past the
/// plan's are padding: token 0 at position 0, a skipped KV write, a one-position context in
/// block 0 (read, never written), logits computed and ignored. Parts are at least
/// `min_split` positions long.
pub fn pack_graph(plan: &BatchPlan, key: GraphKey, min_split: u32, words: &mut Vec<u32>) -> Layout {
    words.clear();
    let b = key.rows as usize;
    let n = plan.seqs.len();
    let mut l = Layout {
        n_tokens: b,
        n_logits: b,
        max_item_rows: 1,
        max_token: plan.token_ids.iter().copied().max().unwrap_or(0),
        ..Layout::default()
    };
    let pad = b - n;
    l.tokens = words.len();
    words.extend_from_slice(&plan.token_ids);
    words.extend(std::iter::repeat_n(0, pad));
    l.positions = words.len();
    words.extend_from_slice(&plan.positions);
    words.extend(std::iter::repeat_n(0, pad));
    l.slots = words.len();
    words.extend_from_slice(&plan.slot_mapping);
    words.extend(std::iter::repeat_n(SKIP_SLOT, pad));
    l.logits_rows = words.len();
    words.extend(0..b as u32);
    // Tables go last (their length varies); padding rows share one entry: block 0.
    let mut table_off = 1u32;
    l.seqinfo = words.len();
    for (i, s) in plan.seqs.iter().enumerate() {
        words.extend_from_slice(&[i as u32, 1, s.ctx_len, table_off]);
        table_off += s.block_table.len() as u32;
    }
    for i in n..b {
        words.extend_from_slice(&[i as u32, 1, 1, 0]);
    }
    let p = key.parts;
    l.items = words.len();
    let ctx = |i: usize| plan.seqs.get(i).map_or(1, |s| s.ctx_len);
    for i in 0..b {
        let c = ctx(i);
        if p == 1 {
            words.extend_from_slice(&[i as u32, i as u32, 1, 0, c, NO_PART]);
            continue;
        }
        let seg = c.div_ceil(p).div_ceil(64).max(min_split / 64) * 64;
        for k in 0..p {
            let (lo, hi) = ((k * seg).min(c), ((k + 1) * seg).min(c));
            words.extend_from_slice(&[i as u32, i as u32, 1, lo, hi, i as u32 * p + k]);
        }
    }
    l.n_items = b * p as usize;
    l.splits = words.len();
    if p > 1 {
        for i in 0..b as u32 {
            words.extend_from_slice(&[i, i * p, p]);
        }
        l.n_splits = b;
        l.n_parts = b * p as usize;
        l.max_parts = p;
    }
    l.part_splits = words.len();
    l.counters = words.len();
    if p > 1 {
        for i in 0..b as u32 {
            words.extend(std::iter::repeat_n(i, p as usize));
        }
        l.counters = words.len();
        l.n_counters = b * key.kv_heads as usize;
        words.extend(std::iter::repeat_n(0, l.n_counters));
    }
    l.tables = words.len();
    words.push(0);
    for s in &plan.seqs {
        words.extend_from_slice(&s.block_table);
    }
    l.words = words.len();
    l
}

/// Splits single-row items with long contexts into parts when the batch fills fewer than
/// two waves of blocks. Returns (items, split rows, number of parts).
fn split_long_rows(
    items: Vec<[u32; 6]>,
    n_kv: usize,
    sm_count: usize,
    min_split: u32,
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
        if it[2] != 1 || ctx < 2 * min_split {
            out.push(it);
            continue;
        }
        let n = want.min(ctx / min_split).min(MAX_PARTS);
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
        let l = pack(
            &plan(&[(40, 50), (1, 7)]),
            &shape(),
            1,
            MIN_SPLIT,
            ItemRows::Portable,
            &mut w,
        );
        let items: Vec<&[u32]> = w[l.items..l.items + 6 * l.n_items].chunks(6).collect();
        // 40 rows in tiles of 16 (16, 16, 8), each up to its last row's position.
        assert_eq!(items.len(), 4);
        assert_eq!(items[0], &[0, 0, 16, 0, 26, NO_PART]);
        assert_eq!(items[2], &[0, 32, 8, 0, 50, NO_PART]);
        assert_eq!(items[3], &[1, 40, 1, 0, 7, NO_PART]);
        assert_eq!(l.n_splits, 0);
        assert_eq!(l.max_item_rows, 16);
    }

    #[test]
    fn items_of_one_row_while_the_tensor_core_attention_compiles() {
        let mut w = Vec::new();
        let l = pack(
            &plan(&[(40, 50), (1, 7)]),
            &shape(),
            132,
            MIN_SPLIT,
            ItemRows::One,
            &mut w,
        );
        let items: Vec<&[u32]> = w[l.items..l.items + 6 * l.n_items].chunks(6).collect();
        // A row an item, each up to its own position (the prompt's first row sees 11).
        assert_eq!((l.n_items, l.max_item_rows), (41, 1));
        assert_eq!(items[0], &[0, 0, 1, 0, 11, NO_PART]);
        assert_eq!(items[39], &[0, 39, 1, 0, 50, NO_PART]);
        assert_eq!(items[40], &[1, 40, 1, 0, 7, NO_PART]);
    }

    #[test]
    fn tensor_core_items_take_32_rows_when_the_step_fills_a_wave() {
        let mut w = Vec::new();
        // 2048 rows: 64 items of 32 rows x 8 KV heads fill two blocks on each of 132 SMs.
        let l = pack(
            &plan(&[(2048, 2048)]),
            &shape(),
            132,
            MIN_SPLIT,
            ItemRows::TensorCore,
            &mut w,
        );
        assert_eq!((l.n_items, l.max_item_rows), (64, TC_ROWS_PER_ITEM));
        let items: Vec<&[u32]> = w[l.items..l.items + 6 * l.n_items].chunks(6).collect();
        assert_eq!(items[1], &[0, 32, 32, 0, 64, NO_PART]);
        // Fewer rows, or no tensor-core attention: items of 16.
        let l = pack(
            &plan(&[(512, 512)]),
            &shape(),
            132,
            MIN_SPLIT,
            ItemRows::TensorCore,
            &mut w,
        );
        assert_eq!(l.max_item_rows, ROWS_PER_ITEM);
        let l = pack(
            &plan(&[(2048, 2048)]),
            &shape(),
            132,
            MIN_SPLIT,
            ItemRows::Portable,
            &mut w,
        );
        assert_eq!(l.max_item_rows, ROWS_PER_ITEM);
    }

    #[test]
    fn graph_layout_is_fixed_per_key_and_pads_rows() {
        let kv = shape();
        let short = plan(&[(1, 5), (1, 300), (1, 40)]);
        let long = plan(&[(1, 900), (1, 2000), (1, 33)]);
        let key = GraphKey::for_plan(&short, &kv, 132, 64).unwrap();
        assert_eq!(key, GraphKey::for_plan(&long, &kv, 132, 64).unwrap());
        assert_eq!(key.rows, 4);
        assert!(key.parts > 1);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        let (la, lb) = (
            pack_graph(&short, key, MIN_SPLIT, &mut a),
            pack_graph(&long, key, MIN_SPLIT, &mut b),
        );
        // Everything a recorded launch addresses sits at the same offset, with the same count.
        let fixed = |l: &Layout| {
            (
                l.tokens,
                l.positions,
                l.slots,
                l.seqinfo,
                l.logits_rows,
                l.items,
                l.splits,
                l.part_splits,
                l.counters,
                l.tables,
            )
        };
        assert_eq!(fixed(&la), fixed(&lb));
        assert_eq!(
            (la.n_items, la.n_splits, la.n_parts),
            (lb.n_items, lb.n_splits, lb.n_parts)
        );
        assert_eq!(la.n_tokens, 4);
        assert_eq!(a[la.slots + 3], SKIP_SLOT, "the padding row writes no KV");
        assert_eq!(lb.n_counters, 4 * 8, "a merge counter per row and KV head");
        assert!(
            b[lb.counters..lb.counters + lb.n_counters]
                .iter()
                .all(|&c| c == 0)
        );
        // Part k of row i belongs to split row i (attn_dec_merge finds its split this way).
        let ps = &b[lb.part_splits..lb.part_splits + lb.n_parts];
        for (k, &s) in ps.iter().enumerate() {
            let sp = &b[lb.splits + 3 * s as usize..lb.splits + 3 * s as usize + 3];
            assert!((sp[1]..sp[1] + sp[2]).contains(&(k as u32)));
        }
        // Each real row's parts cover its context exactly once, in order.
        let p = key.parts as usize;
        for (i, ctx) in [900u32, 2000, 33].into_iter().enumerate() {
            let items: Vec<&[u32]> = b[lb.items + 6 * p * i..lb.items + 6 * p * (i + 1)]
                .chunks(6)
                .collect();
            assert_eq!(items[0][3], 0);
            assert_eq!(items[p - 1][4], ctx);
            for w in items.windows(2) {
                assert_eq!(w[0][4], w[1][3]);
            }
            let t = b[lb.seqinfo + 4 * i + 3] as usize;
            assert_eq!(b[lb.tables + t], long.seqs[i].block_table[0]);
        }
        // Prefill steps, and steps past the capacity, run eagerly.
        assert!(GraphKey::for_plan(&plan(&[(3, 3)]), &kv, 132, 64).is_none());
        assert!(GraphKey::for_plan(&plan(&[(1, 3); 5]), &kv, 132, 4).is_none());
    }

    #[test]
    fn long_decode_rows_split_into_covering_parts() {
        let mut w = Vec::new();
        let l = pack(
            &plan(&[(1, 5000)]),
            &shape(),
            132,
            MIN_SPLIT,
            ItemRows::TensorCore,
            &mut w,
        );
        assert_eq!(l.n_splits, 1);
        let items: Vec<&[u32]> = w[l.items..l.items + 6 * l.n_items].chunks(6).collect();
        assert_eq!(items.len(), l.n_parts);
        assert_eq!(items[0][3], 0);
        assert_eq!(items.last().unwrap()[4], 5000);
        for pair in items.windows(2) {
            assert_eq!(pair[0][4], pair[1][3], "parts are contiguous");
        }
        assert_eq!(&w[l.splits..l.splits + 3], &[0, 0, l.n_parts as u32]);
        // Every part names its split row.
        assert!(
            w[l.part_splits..l.part_splits + l.n_parts]
                .iter()
                .all(|&s| s == 0)
        );
    }
}
