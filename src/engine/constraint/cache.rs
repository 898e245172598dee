//! Compiled grammars kept for reuse, bounded by the memory they hold. An entry enters
//! unserved when its constraint compiles and becomes served when a request carrying it is
//! admitted; unserved entries (their request failed, or has not been admitted yet) may take
//! a quarter of the budget and are evicted first, then the least recently used.

use std::collections::HashMap;

use llguidance::Matcher;

struct Entry {
    matcher: Matcher,
    /// What the compile left allocated, plus the key.
    bytes: usize,
    used: u64,
    served: bool,
}

pub(crate) struct Cache {
    map: HashMap<String, Entry>,
    clock: u64,
    budget: usize,
    bytes: usize,
    unserved_bytes: usize,
}

impl Cache {
    pub fn new(budget: usize) -> Self {
        Self {
            map: HashMap::new(),
            clock: 0,
            budget,
            bytes: 0,
            unserved_bytes: 0,
        }
    }

    /// A fresh copy of the matcher compiled for `key`.
    pub fn get(&mut self, key: &str) -> Option<Matcher> {
        self.clock += 1;
        let e = self.map.get_mut(key)?;
        e.used = self.clock;
        Some(e.matcher.deep_clone())
    }

    /// Keeps `matcher` (which took `bytes` to compile) unserved; one larger than the unserved
    /// share of the budget is not kept.
    pub fn insert(&mut self, key: String, matcher: Matcher, bytes: usize) {
        let bytes = bytes + key.len();
        if self.map.contains_key(&key) || bytes > self.budget / 4 {
            return;
        }
        while self.unserved_bytes + bytes > self.budget / 4 && self.evict(false) {}
        while self.bytes + bytes > self.budget && (self.evict(false) || self.evict(true)) {}
        self.clock += 1;
        self.bytes += bytes;
        self.unserved_bytes += bytes;
        let used = self.clock;
        self.map.insert(
            key,
            Entry {
                matcher,
                bytes,
                used,
                served: false,
            },
        );
    }

    /// A request with `key`'s constraint was admitted.
    pub fn served(&mut self, key: &str) {
        if let Some(e) = self.map.get_mut(key)
            && !e.served
        {
            e.served = true;
            self.unserved_bytes -= e.bytes;
        }
    }

    /// Drops the least recently used entry that is `served` (or not); false if none is.
    fn evict(&mut self, served: bool) -> bool {
        let Some(key) = self
            .map
            .iter()
            .filter(|(_, e)| e.served == served)
            .min_by_key(|(_, e)| e.used)
            .map(|(k, _)| k.clone())
        else {
            return false;
        };
        let e = self.map.remove(&key).expect("the key was just found");
        self.bytes -= e.bytes;
        if !e.served {
            self.unserved_bytes -= e.bytes;
        }
        true
    }

    /// Entries and the bytes they hold.
    pub fn size(&self) -> (usize, usize) {
        (self.map.len(), self.bytes)
    }
}
