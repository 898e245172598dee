//! The KV block pool: a flat list of blocks with reference counts, an intrusive free list
//! in eviction order, and a prefix cache over full blocks keyed by (parent hash, token ids).
//!
//! ```text
//! free list:  head -> [unhashed freed] ... [cached, least recently freed] ... <- tail
//! allocate() pops from the head; a cached block it takes leaves the prefix cache.
//! ```

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

/// Index of a physical KV block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockId(pub u32);

const NO_LINK: u32 = u32::MAX;

#[derive(Debug, Clone)]
struct Block {
    ref_count: u32,
    /// Prefix-cache key when the block is full and registered.
    key: Option<BlockKey>,
    prev: u32,
    next: u32,
    in_free_list: bool,
}

/// Identity of a full block: its hash chain value plus the exact contents (no false hits).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct BlockKey {
    hash: u64,
    parent: u64,
    tokens: Box<[u32]>,
}

/// Hash of a full block given its parent's hash (0 for the first block).
pub fn block_hash(parent: u64, tokens: &[u32]) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

/// The pool. Policy (who gets blocks, whom to preempt) lives in the scheduler.
#[derive(Debug)]
pub struct BlockPool {
    blocks: Vec<Block>,
    head: u32,
    tail: u32,
    num_free: usize,
    cache: HashMap<u64, u32>,
    caching: bool,
}

impl BlockPool {
    /// A pool of `num_blocks` free blocks.
    pub fn new(num_blocks: usize, caching: bool) -> Self {
        let n = num_blocks as u32;
        let blocks = (0..n)
            .map(|i| Block {
                ref_count: 0,
                key: None,
                prev: if i == 0 { NO_LINK } else { i - 1 },
                next: if i + 1 == n { NO_LINK } else { i + 1 },
                in_free_list: true,
            })
            .collect();
        Self {
            blocks,
            head: if n == 0 { NO_LINK } else { 0 },
            tail: if n == 0 { NO_LINK } else { n - 1 },
            num_free: num_blocks,
            cache: HashMap::new(),
            caching,
        }
    }

    /// Total blocks.
    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }
    /// Blocks no sequence holds (cached ones included: they are evictable).
    pub fn num_free(&self) -> usize {
        self.num_free
    }
    /// Full blocks currently in the prefix cache.
    pub fn num_cached(&self) -> usize {
        self.cache.len()
    }

    fn unlink(&mut self, i: u32) {
        let (prev, next) = (self.blocks[i as usize].prev, self.blocks[i as usize].next);
        if prev == NO_LINK {
            self.head = next
        } else {
            self.blocks[prev as usize].next = next
        }
        if next == NO_LINK {
            self.tail = prev
        } else {
            self.blocks[next as usize].prev = prev
        }
        let b = &mut self.blocks[i as usize];
        b.prev = NO_LINK;
        b.next = NO_LINK;
        b.in_free_list = false;
        self.num_free -= 1;
    }

    fn push_back(&mut self, i: u32) {
        let b = &mut self.blocks[i as usize];
        b.prev = self.tail;
        b.next = NO_LINK;
        b.in_free_list = true;
        if self.tail == NO_LINK {
            self.head = i
        } else {
            self.blocks[self.tail as usize].next = i
        }
        self.tail = i;
        self.num_free += 1;
    }

    fn push_front(&mut self, i: u32) {
        let b = &mut self.blocks[i as usize];
        b.prev = NO_LINK;
        b.next = self.head;
        b.in_free_list = true;
        if self.head == NO_LINK {
            self.tail = i
        } else {
            self.blocks[self.head as usize].prev = i
        }
        self.head = i;
        self.num_free += 1;
    }

    /// Takes `n` blocks (evicting cached ones least recently freed first), or `None` when
    /// fewer than `n` are free; then nothing changes.
    pub fn allocate(&mut self, n: usize) -> Option<Vec<BlockId>> {
        if n > self.num_free {
            return None;
        }
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let i = self.head;
            self.unlink(i);
            let b = &mut self.blocks[i as usize];
            if let Some(key) = b.key.take() {
                self.cache.remove(&key.hash);
            }
            b.ref_count = 1;
            out.push(BlockId(i));
        }
        Some(out)
    }

    /// Longest run of cached full blocks that prefixes `tokens` (whole blocks of
    /// `block_size`), each with one more reference. Returns the blocks and their hashes.
    pub fn take_cached_prefix(
        &mut self,
        tokens: &[u32],
        block_size: usize,
    ) -> (Vec<BlockId>, Vec<u64>) {
        let (mut blocks, mut hashes) = (Vec::new(), Vec::new());
        if !self.caching {
            return (blocks, hashes);
        }
        let mut parent = 0u64;
        for chunk in tokens.chunks_exact(block_size) {
            let h = block_hash(parent, chunk);
            let Some(&i) = self.cache.get(&h) else { break };
            let hit = self.blocks[i as usize]
                .key
                .as_ref()
                .is_some_and(|k| k.parent == parent && *k.tokens == *chunk);
            if !hit {
                break;
            }
            if self.blocks[i as usize].in_free_list {
                self.unlink(i);
            }
            self.blocks[i as usize].ref_count += 1;
            blocks.push(BlockId(i));
            hashes.push(h);
            parent = h;
        }
        (blocks, hashes)
    }

    /// Records that `block` now holds exactly `tokens` after a prefix hashing to `parent`.
    /// Returns the block's hash (the parent of the next block).
    pub fn register_full(&mut self, block: BlockId, parent: u64, tokens: &[u32]) -> u64 {
        let hash = block_hash(parent, tokens);
        if self.caching
            && self.blocks[block.0 as usize].key.is_none()
            && !self.cache.contains_key(&hash)
        {
            self.blocks[block.0 as usize].key = Some(BlockKey {
                hash,
                parent,
                tokens: tokens.into(),
            });
            self.cache.insert(hash, block.0);
        }
        hash
    }

    /// Drops one reference to each block (in reverse, so a sequence's tail is evicted
    /// before its head). Freed cached blocks stay findable until evicted.
    pub fn release(&mut self, blocks: &[BlockId]) {
        for &BlockId(i) in blocks.iter().rev() {
            let b = &mut self.blocks[i as usize];
            debug_assert!(b.ref_count > 0, "double free of block {i}");
            b.ref_count = b.ref_count.saturating_sub(1);
            if b.ref_count == 0 {
                if b.key.is_some() {
                    self.push_back(i)
                } else {
                    self.push_front(i)
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocate_release_returns_everything() {
        let mut p = BlockPool::new(4, true);
        let a = p.allocate(3).unwrap();
        assert_eq!(p.num_free(), 1);
        assert!(p.allocate(2).is_none());
        assert_eq!(p.num_free(), 1, "failed allocation changes nothing");
        p.release(&a);
        assert_eq!(p.num_free(), 4);
        assert_eq!(p.allocate(4).unwrap().len(), 4);
    }

    #[test]
    fn prefix_cache_hits_full_blocks_and_evicts_lru() {
        let mut p = BlockPool::new(4, true);
        let toks: Vec<u32> = (0..10).collect();
        let a = p.allocate(3).unwrap();
        let h0 = p.register_full(a[0], 0, &toks[0..4]);
        p.register_full(a[1], h0, &toks[4..8]);
        p.release(&a);
        assert_eq!(p.num_free(), 4);
        let (hit, _) = p.take_cached_prefix(&toks, 4);
        assert_eq!(hit, vec![a[0], a[1]]);
        assert_eq!(p.num_free(), 2);
        // A different first block misses entirely.
        let other: Vec<u32> = (100..110).collect();
        p.release(&hit);
        assert!(p.take_cached_prefix(&other, 4).0.is_empty());
        // Allocating everything evicts the cached blocks.
        let all = p.allocate(4).unwrap();
        assert_eq!(p.num_cached(), 0);
        p.release(&all);
        assert!(p.take_cached_prefix(&toks, 4).0.is_empty());
    }

    #[test]
    fn shared_blocks_need_every_reference_released() {
        let mut p = BlockPool::new(2, true);
        let toks = [1, 2];
        let a = p.allocate(1).unwrap();
        p.register_full(a[0], 0, &toks);
        let (b, _) = p.take_cached_prefix(&toks, 2);
        assert_eq!(b, a);
        p.release(&a);
        assert_eq!(p.num_free(), 1);
        p.release(&b);
        assert_eq!(p.num_free(), 2);
    }
}
