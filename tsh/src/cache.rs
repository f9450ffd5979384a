//! The resolution cache: a small W-TinyLFU keyed by tool name (spec §3).
//!
//! Layout, for `capacity` unpinned entries and `window_percent` (1..=99):
//!
//! - a **window** LRU of `max(1, ceil(capacity * window_percent / 100))` entries, where every new
//!   entry starts;
//! - a segmented **main** LRU holding the rest, split into **protected** (80% of main, rounded
//!   down) and **probation** (what main holds beyond protected). An entry hit in probation moves
//!   to protected; protected overflow is demoted to the front of probation;
//! - a 4-bit count-min **sketch** of access frequency, sized for `max(128, capacity)` entries and
//!   halved (aged) every ten times that many recorded accesses. Every lookup ([`WTinyLfu::get`],
//!   hit or miss) is recorded; [`WTinyLfu::insert`] is not, as a miss has just been recorded by
//!   the lookup that preceded it. Counters grow by conservative update (only those at the key's
//!   minimum), which measured slightly better than growing all four (see `bench/README.md`).
//!
//! When the window overflows, its least recent entry (the *candidate*) goes to probation while
//! main has room. Once main is full the candidate meets probation's least recent entry (the
//! *victim*): the candidate is admitted, and the victim evicted, iff the sketch estimates the
//! candidate strictly more frequent; on a tie the incumbent stays and the candidate is evicted.
//! Every eviction hands back the evicted key and value, so tsh can say which tool left.
//!
//! **Pinned** entries live beside the policy: they are never evicted, never counted against
//! `capacity`, and found by the same lookup. [`WTinyLfu::unpin`] puts an entry back under the
//! policy as if it had just been inserted.
//!
//! Every operation is O(1): entries sit in one dense `Vec` and are linked into the three lists by
//! index; a [`hashbrown::HashTable`] maps a key's hash to its index. The sketch and the table share
//! one seeded [`foldhash`] hash per operation (fixed, not per-process random), so the same inputs
//! and seed give the same hits and evictions on every run of a build. The sketch takes one word
//! (16 counters) per entry it is sized for, rounded up to a power of two: 1 KiB at the default
//! capacity, 8 MiB at the largest allowed (1,000,000), allocated zeroed.

use std::borrow::Borrow;
use std::fmt;
use std::hash::{BuildHasher, Hash};

use foldhash::quality::FixedState;
use hashbrown::HashTable;
use policy::tshconf::TshConfig;

/// No node: the end of a list.
const NIL: u32 = u32::MAX;

/// Least number of entries the sketch is sized for.
const SKETCH_MIN_ENTRIES: usize = 128;

/// The sketch is halved after this many recorded accesses per entry it is sized for.
const SKETCH_SAMPLE_FACTOR: u64 = 10;

/// Which part of the cache an entry is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Region {
    Window = 0,
    Probation = 1,
    Protected = 2,
    /// Outside the policy: in no list.
    Pinned = 3,
}

#[derive(Debug)]
struct Node<K, V> {
    key: K,
    value: V,
    hash: u64,
    /// Towards the most recent end of the node's list.
    prev: u32,
    /// Towards the least recent end.
    next: u32,
    region: Region,
}

/// A doubly linked list threaded through `nodes` by index; `head` is the most recent.
#[derive(Clone, Copy, Debug)]
struct List {
    head: u32,
    tail: u32,
    len: u32,
}

impl List {
    const EMPTY: List = List { head: NIL, tail: NIL, len: 0 };
}

/// A W-TinyLFU cache with pinning; see the [module documentation](self).
pub struct WTinyLfu<K, V> {
    hasher: FixedState,
    /// Hash of a key to its index in `nodes`.
    table: HashTable<u32>,
    /// Every entry, pinned or not, densely.
    nodes: Vec<Node<K, V>>,
    /// Window, probation and protected, indexed by [`Region`].
    lists: [List; 3],
    capacity: u32,
    window_cap: u32,
    main_cap: u32,
    protected_cap: u32,
    sketch: Sketch,
}

impl<K, V> fmt::Debug for WTinyLfu<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WTinyLfu")
            .field("capacity", &self.capacity)
            .field("window", &self.lists[Region::Window as usize].len)
            .field("probation", &self.lists[Region::Probation as usize].len)
            .field("protected", &self.lists[Region::Protected as usize].len)
            .field("pinned", &self.pinned_len())
            .finish_non_exhaustive()
    }
}

impl<K, V> WTinyLfu<K, V> {
    /// Most unpinned entries held.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Size of the admission window in entries.
    pub fn window_capacity(&self) -> u32 {
        self.window_cap
    }

    /// Unpinned entries held (never more than [`capacity`](Self::capacity)).
    pub fn len(&self) -> usize {
        self.lists.iter().map(|l| l.len as usize).sum()
    }

    /// Whether no unpinned entry is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Pinned entries held.
    pub fn pinned_len(&self) -> usize {
        self.nodes.len() - self.len()
    }
}

impl<K: Hash + Eq, V> WTinyLfu<K, V> {
    /// A cache sized by tsh's configuration (`cache_capacity`, `window_percent`); `seed` seeds
    /// the hash, so equal seeds and inputs give equal results.
    pub fn new(config: &TshConfig, seed: u64) -> WTinyLfu<K, V> {
        WTinyLfu::with_capacity(config.cache_capacity, config.window_percent, seed)
    }

    /// A cache of `capacity` unpinned entries with a window of `window_percent` of it.
    /// `capacity` below 1 is taken as 1 and `window_percent` is clamped to 1..=99, the ranges
    /// the configuration allows.
    pub fn with_capacity(capacity: u32, window_percent: u32, seed: u64) -> WTinyLfu<K, V> {
        let config = TshConfig {
            cache_capacity: capacity.max(1),
            window_percent: window_percent.clamp(1, 99),
            ..TshConfig::default()
        };
        let capacity = config.cache_capacity;
        // window_percent <= 99 keeps the window within the capacity.
        let window_cap = config.window().min(capacity);
        let main_cap = capacity - window_cap;
        let protected_cap = u32::try_from(u64::from(main_cap) * 80 / 100).unwrap_or(main_cap);
        let sketch_entries = usize::try_from(capacity).unwrap_or(usize::MAX);
        WTinyLfu {
            hasher: FixedState::with_seed(seed),
            table: HashTable::new(),
            nodes: Vec::new(),
            lists: [List::EMPTY; 3],
            capacity,
            window_cap,
            main_cap,
            protected_cap,
            sketch: Sketch::new(sketch_entries),
        }
    }

    /// Looks `key` up, records the access in the frequency sketch (hit or miss) and updates
    /// recency.
    pub fn get<Q>(&mut self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.hasher.hash_one(key);
        self.sketch.increment(hash);
        let i = self.find(hash, key)?;
        match self.nodes[i as usize].region {
            Region::Window | Region::Protected => self.touch(i),
            Region::Probation => {
                self.unlink(i);
                self.push_front(i, Region::Protected);
                if self.lists[Region::Protected as usize].len > self.protected_cap {
                    let demoted = self.lists[Region::Protected as usize].tail;
                    self.unlink(demoted);
                    self.push_front(demoted, Region::Probation);
                }
            }
            Region::Pinned => {}
        }
        Some(&self.nodes[i as usize].value)
    }

    /// The value for `key`, without recording an access or changing recency.
    pub fn peek<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let i = self.find(self.hasher.hash_one(key), key)?;
        Some(&self.nodes[i as usize].value)
    }

    /// Whether `key` is pinned.
    pub fn is_pinned<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.find(self.hasher.hash_one(key), key)
            .is_some_and(|i| self.nodes[i as usize].region == Region::Pinned)
    }

    /// Records an access to `key` in the sketch without a lookup (for sets that share this
    /// cache's notion of popularity, such as the tools loaded with `tsh load`).
    pub fn record<Q>(&mut self, key: &Q)
    where
        Q: Hash + ?Sized,
    {
        self.sketch.increment(self.hasher.hash_one(key));
    }

    /// The sketch's estimate of how often `key` was looked up recently (0..=15).
    pub fn frequency<Q>(&self, key: &Q) -> u8
    where
        Q: Hash + ?Sized,
    {
        self.sketch.frequency(self.hasher.hash_one(key))
    }

    /// Inserts or replaces `key`. A new key enters the window; if that pushes an entry out of
    /// the cache, the evicted key and value are returned. Replacing a present key's value (pinned
    /// or not) changes nothing else and evicts nothing.
    pub fn insert(&mut self, key: K, value: V) -> Option<(K, V)> {
        let hash = self.hasher.hash_one(&key);
        if let Some(i) = self.find(hash, &key) {
            self.nodes[i as usize].value = value;
            return None;
        }
        let i = self.push_node(key, value, hash);
        self.push_front(i, Region::Window);
        self.overflow_window()
    }

    /// Pins `key` to `value`: it leaves the policy (no longer counted or evictable) until
    /// [`unpin`](Self::unpin)ned.
    pub fn pin(&mut self, key: K, value: V) {
        let hash = self.hasher.hash_one(&key);
        if let Some(i) = self.find(hash, &key) {
            if self.nodes[i as usize].region != Region::Pinned {
                self.unlink(i);
                self.nodes[i as usize].region = Region::Pinned;
            }
            self.nodes[i as usize].value = value;
        } else {
            self.push_node(key, value, hash);
        }
    }

    /// Moves a pinned `key` back under the policy, at the front of the window as a new entry
    /// would be. Returns the entry that this pushed out of the cache, if any. A key that is not
    /// pinned is left alone.
    pub fn unpin<Q>(&mut self, key: &Q) -> Option<(K, V)>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let i = self.find(self.hasher.hash_one(key), key)?;
        if self.nodes[i as usize].region != Region::Pinned {
            return None;
        }
        self.push_front(i, Region::Window);
        self.overflow_window()
    }

    /// Removes `key`, pinned or not, and returns its value.
    pub fn remove<Q>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let i = self.find(self.hasher.hash_one(key), key)?;
        Some(self.evict(i).1)
    }

    fn find<Q>(&self, hash: u64, key: &Q) -> Option<u32>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let nodes = &self.nodes;
        self.table.find(hash, |&j| nodes[j as usize].key.borrow() == key).copied()
    }

    /// Adds a node in no list (pinned) and indexes it.
    fn push_node(&mut self, key: K, value: V, hash: u64) -> u32 {
        let i = u32::try_from(self.nodes.len()).expect("fewer than 2^32 - 1 entries fit in memory");
        self.nodes.push(Node { key, value, hash, prev: NIL, next: NIL, region: Region::Pinned });
        let nodes = &self.nodes;
        self.table.insert_unique(hash, i, |&j| nodes[j as usize].hash);
        i
    }

    /// After an entry entered the window: moves the window's overflow to main, through
    /// admission once main is full.
    fn overflow_window(&mut self) -> Option<(K, V)> {
        if self.lists[Region::Window as usize].len <= self.window_cap {
            return None;
        }
        let candidate = self.lists[Region::Window as usize].tail;
        self.unlink(candidate);
        let main_len =
            self.lists[Region::Probation as usize].len + self.lists[Region::Protected as usize].len;
        // Main is never all protected once full (protected_cap < main_cap), so the victim is
        // probation's tail; with no main at all (capacity 1) there is none.
        let victim = self.lists[Region::Probation as usize].tail;
        self.push_front(candidate, Region::Probation);
        if main_len < self.main_cap {
            return None;
        }
        if victim == NIL {
            return Some(self.evict(candidate));
        }
        let candidate_freq = self.sketch.frequency(self.nodes[candidate as usize].hash);
        let victim_freq = self.sketch.frequency(self.nodes[victim as usize].hash);
        let loser = if candidate_freq > victim_freq { victim } else { candidate };
        Some(self.evict(loser))
    }

    /// Moves a listed node to the front of its list.
    fn touch(&mut self, i: u32) {
        let region = self.nodes[i as usize].region;
        if self.lists[region as usize].head != i {
            self.unlink(i);
            self.push_front(i, region);
        }
    }

    /// Takes a listed node out of its list; its region is left stale until it is pushed again.
    fn unlink(&mut self, i: u32) {
        let Node { prev, next, region, .. } = self.nodes[i as usize];
        let list = &mut self.lists[region as usize];
        if prev == NIL {
            list.head = next;
        } else {
            self.nodes[prev as usize].next = next;
        }
        if next == NIL {
            list.tail = prev;
        } else {
            self.nodes[next as usize].prev = prev;
        }
        list.len -= 1;
    }

    fn push_front(&mut self, i: u32, region: Region) {
        let list = &mut self.lists[region as usize];
        let head = list.head;
        let node = &mut self.nodes[i as usize];
        node.prev = NIL;
        node.next = head;
        node.region = region;
        if head == NIL {
            list.tail = i;
        } else {
            self.nodes[head as usize].prev = i;
        }
        list.head = i;
        list.len += 1;
    }

    /// Removes node `i` from its list (if any), the table and `nodes`. The last node moves
    /// into slot `i`, and its links and table entry follow it.
    fn evict(&mut self, i: u32) -> (K, V) {
        if self.nodes[i as usize].region != Region::Pinned {
            self.unlink(i);
        }
        let hash = self.nodes[i as usize].hash;
        if let Ok(entry) = self.table.find_entry(hash, |&j| j == i) {
            entry.remove();
        }
        let node = self.nodes.swap_remove(i as usize);
        let moved = u32::try_from(self.nodes.len()).expect("indices fit in u32");
        if moved != i {
            let Node { prev, next, region, hash, .. } = self.nodes[i as usize];
            if region != Region::Pinned {
                let list = &mut self.lists[region as usize];
                if prev == NIL {
                    list.head = i;
                } else {
                    self.nodes[prev as usize].next = i;
                }
                if next == NIL {
                    list.tail = i;
                } else {
                    self.nodes[next as usize].prev = i;
                }
            }
            if let Some(slot) = self.table.find_mut(hash, |&j| j == moved) {
                *slot = i;
            }
        }
        (node.key, node.value)
    }
}

/// A count-min sketch of 4-bit counters, four per key, laid out as in Caffeine: a key's four
/// counters sit in one 64-byte block (8 words), counter `k` in word `2k` or `2k + 1` of it.
#[derive(Debug)]
struct Sketch {
    words: Vec<u64>,
    block_mask: u64,
    accesses: u64,
    sample: u64,
}

impl Sketch {
    /// Sized for `entries` (at least [`SKETCH_MIN_ENTRIES`]): one word of 16 counters per entry,
    /// rounded up to a power of two.
    fn new(entries: usize) -> Sketch {
        let entries = entries.max(SKETCH_MIN_ENTRIES);
        let words = entries.checked_next_power_of_two().unwrap_or(1 << 30).min(1 << 30);
        Sketch {
            words: vec![0; words],
            block_mask: (words as u64 >> 3) - 1,
            accesses: 0,
            sample: SKETCH_SAMPLE_FACTOR * entries as u64,
        }
    }

    /// Word index and bit shift of each of the key's four counters. The block comes from the
    /// low bits of the hash, the counters within it from the high 32 bits.
    #[inline]
    fn slots(&self, hash: u64) -> [(usize, u32); 4] {
        let block = ((hash & self.block_mask) << 3) as usize;
        let spread = (hash >> 32) as u32;
        std::array::from_fn(|k| {
            let h = spread >> (k * 8);
            let word = block + (k << 1) + (h & 1) as usize;
            (word, ((h >> 1) & 15) << 2)
        })
    }

    fn increment(&mut self, hash: u64) {
        // Conservative update: only the counters at the minimum grow, which keeps keys that
        // share counters with a popular one from inheriting its count.
        let slots = self.slots(hash);
        let min = slots.iter().map(|&(word, shift)| (self.words[word] >> shift) & 15).min();
        if let Some(min @ 0..15) = min {
            for (word, shift) in slots {
                if (self.words[word] >> shift) & 15 == min {
                    self.words[word] += 1 << shift;
                }
            }
        }
        self.accesses += 1;
        if self.accesses >= self.sample {
            self.age();
        }
    }

    fn frequency(&self, hash: u64) -> u8 {
        let min = self.slots(hash).iter().map(|&(word, shift)| (self.words[word] >> shift) & 15).min();
        min.unwrap_or(0) as u8
    }

    /// Halves every counter.
    fn age(&mut self) {
        for w in &mut self.words {
            *w = (*w >> 1) & 0x7777_7777_7777_7777;
        }
        self.accesses = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    impl<K: Hash + Eq, V> WTinyLfu<K, V> {
        /// Walks every list both ways and checks sizes, regions, links and the table.
        fn check(&self) {
            let mut listed = 0;
            for (r, list) in self.lists.iter().enumerate() {
                let mut n = 0;
                let mut prev = NIL;
                let mut i = list.head;
                while i != NIL {
                    let node = &self.nodes[i as usize];
                    assert_eq!(node.region as usize, r);
                    assert_eq!(node.prev, prev);
                    prev = i;
                    i = node.next;
                    n += 1;
                }
                assert_eq!(list.tail, prev);
                assert_eq!(list.len, n);
                listed += n as usize;
            }
            assert_eq!(listed, self.len());
            assert!(self.len() <= self.capacity as usize);
            assert!(self.lists[Region::Window as usize].len <= self.window_cap);
            assert!(self.lists[Region::Protected as usize].len <= self.protected_cap);
            assert_eq!(self.table.len(), self.nodes.len());
            for (i, node) in self.nodes.iter().enumerate() {
                assert_eq!(self.find(node.hash, &node.key), Some(i as u32));
            }
        }
    }

    fn cache(capacity: u32, window_percent: u32) -> WTinyLfu<String, u32> {
        WTinyLfu::with_capacity(capacity, window_percent, 7)
    }

    #[test]
    fn window_size_follows_the_formula() {
        for capacity in [1, 2, 3, 10, 32, 64, 99, 100, 101, 1000, 1_000_000] {
            for percent in [1, 2, 10, 20, 33, 50, 80, 98, 99] {
                let c = cache(capacity, percent);
                let expect = (u64::from(capacity) * u64::from(percent)).div_ceil(100).max(1);
                assert_eq!(u64::from(c.window_capacity()), expect, "{capacity} {percent}");
                let config =
                    TshConfig { cache_capacity: capacity, window_percent: percent, ..TshConfig::default() };
                assert_eq!(WTinyLfu::<String, u32>::new(&config, 0).window_capacity(), config.window());
                assert!(c.window_capacity() <= capacity);
                assert_eq!(c.main_cap, capacity - c.window_capacity());
                assert_eq!(c.protected_cap, c.main_cap * 4 / 5);
            }
        }
        assert_eq!(cache(32, 1).window_capacity(), 1);
        assert_eq!(cache(1000, 1).window_capacity(), 10);
        assert_eq!(cache(1000, 99).window_capacity(), 990);
        // Out-of-range percentages are clamped to the configuration's bounds 1..=99.
        assert_eq!(cache(1000, 0).window_capacity(), 10);
        assert_eq!(cache(1000, 100).window_capacity(), 990);
        assert_eq!(cache(0, 50).capacity(), 1);
    }

    #[test]
    fn admission_frequent_candidate_displaces_rare_victim_and_ties_keep_the_incumbent() {
        // Capacity 2 at 50%: a window of one, a main of one (all probation).
        let mut c = cache(2, 50);
        assert_eq!(c.insert("a".into(), 1), None);
        assert_eq!(c.insert("b".into(), 2), None); // a moves to probation: main had room.
        // Tie (never looked up, both 0): the incumbent a stays, the candidate b is evicted.
        assert_eq!(c.frequency("b"), c.frequency("a"));
        assert_eq!(c.insert("c".into(), 3), Some(("b".into(), 2)));
        assert_eq!(c.peek("a"), Some(&1));
        // d is looked up three times (misses count), then inserted; c is evicted on the tie.
        for _ in 0..3 {
            assert_eq!(c.get("d"), None);
        }
        assert_eq!(c.insert("d".into(), 4), Some(("c".into(), 3)));
        // d leaves the window as the candidate, beats the rare victim a, and a is named.
        assert!(c.frequency("d") > c.frequency("a"));
        assert_eq!(c.insert("e".into(), 5), Some(("a".into(), 1)));
        assert_eq!(c.peek("d"), Some(&4));
        assert_eq!(c.peek("e"), Some(&5));
        c.check();
    }

    #[test]
    fn ties_keep_the_incumbent_at_equal_nonzero_frequency() {
        let mut c = cache(2, 50);
        for k in ["a", "b"] {
            c.get(k);
            c.get(k);
        }
        c.insert("a".into(), 1);
        c.insert("b".into(), 2);
        assert_eq!(c.frequency("a"), 2);
        assert_eq!(c.frequency("b"), 2);
        c.get("c"); // c: 1, loses to a.
        assert_eq!(c.insert("c".into(), 3), Some(("b".into(), 2)));
        assert_eq!(c.insert("x".into(), 0), Some(("c".into(), 3)));
        c.get("x");
        c.get("x");
        // x (2) ties a (2): x is evicted, a stays.
        assert_eq!(c.insert("y".into(), 0), Some(("x".into(), 0)));
        assert_eq!(c.peek("a"), Some(&1));
    }

    #[test]
    fn probation_hit_promotes_and_protected_overflow_demotes() {
        // Capacity 11 at 10%: window 2, main 9, protected 7.
        let mut c = cache(11, 10);
        for i in 0..11 {
            assert_eq!(c.insert(format!("k{i}"), i), None);
        }
        assert_eq!(c.len(), 11);
        for i in 0..9 {
            assert_eq!(c.get(&format!("k{i}")), Some(&i));
        }
        assert_eq!(c.lists[Region::Protected as usize].len, 7);
        assert_eq!(c.lists[Region::Probation as usize].len, 2);
        c.check();
    }

    #[test]
    fn capacity_one_keeps_the_newest() {
        let mut c = cache(1, 99);
        assert_eq!(c.insert("a".into(), 1), None);
        assert_eq!(c.insert("b".into(), 2), Some(("a".into(), 1)));
        assert_eq!(c.len(), 1);
        c.check();
    }

    #[test]
    fn pinned_entries_do_not_count_and_unpin_returns_to_the_window() {
        let mut c = cache(2, 50);
        c.pin("p".into(), 0);
        c.insert("a".into(), 1);
        c.insert("b".into(), 2);
        assert_eq!((c.len(), c.pinned_len()), (2, 1));
        assert!(c.is_pinned("p"));
        assert_eq!(c.get("p"), Some(&0));
        for i in 0..50 {
            c.insert(format!("x{i}"), i);
        }
        assert_eq!(c.peek("p"), Some(&0));
        // Pinning a cached entry takes it out of the count.
        let held = c.nodes.iter().find(|n| n.region == Region::Window).map(|n| n.key.clone()).unwrap();
        c.pin(held.clone(), 9);
        assert_eq!((c.len(), c.pinned_len()), (1, 2));
        // Unpinning puts it back in the window, which pushes one entry out.
        assert_eq!(c.insert("y".into(), 1), None);
        assert!(c.unpin(held.as_str()).is_some());
        assert!(!c.is_pinned(held.as_str()));
        assert!(c.unpin("p").is_some());
        assert_eq!(c.unpin("p"), None, "p is no longer pinned");
        assert_eq!(c.len(), 2);
        c.check();
    }

    #[test]
    fn sketch_saturates_and_ages() {
        let mut s = Sketch::new(1);
        assert_eq!(s.words.len(), 128);
        assert_eq!(s.sample, 1280);
        let h = 0x1234_5678_9abc_def0;
        for _ in 0..20 {
            s.increment(h);
        }
        assert_eq!(s.frequency(h), 15);
        for i in 0..(1280 - 20 - 1u64) {
            s.increment(i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        }
        assert!(s.frequency(h) >= 15);
        s.increment(1); // the 1280th access halves every counter
        assert_eq!(s.accesses, 0);
        assert_eq!(s.frequency(h), 7);
    }

    #[derive(Clone, Debug)]
    enum Op {
        Get(u8),
        Insert(u8),
        Pin(u8),
        Unpin(u8),
        Remove(u8),
    }

    fn op(keys: u8) -> impl Strategy<Value = Op> {
        prop_oneof![
            10 => (0..keys).prop_map(Op::Get),
            10 => (0..keys).prop_map(Op::Insert),
            1 => (0..keys).prop_map(Op::Pin),
            1 => (0..keys).prop_map(Op::Unpin),
            1 => (0..keys).prop_map(Op::Remove),
        ]
    }

    /// Runs `ops`, checking the invariants after each; returns what every step observed.
    fn run(capacity: u32, percent: u32, seed: u64, ops: &[Op]) -> Vec<Option<(String, u32)>> {
        let mut c = WTinyLfu::with_capacity(capacity, percent, seed);
        let mut pinned = std::collections::BTreeSet::new();
        let mut seen = Vec::new();
        for (step, op) in ops.iter().enumerate() {
            let step = step as u32;
            let out = match *op {
                Op::Get(k) => c.get(&format!("t{k}")).map(|&v| (String::new(), v)),
                Op::Insert(k) => c.insert(format!("t{k}"), step),
                Op::Pin(k) => {
                    pinned.insert(format!("t{k}"));
                    c.pin(format!("t{k}"), step);
                    None
                }
                Op::Unpin(k) => {
                    pinned.remove(&format!("t{k}"));
                    c.unpin(format!("t{k}").as_str())
                }
                Op::Remove(k) => {
                    pinned.remove(&format!("t{k}"));
                    c.remove(format!("t{k}").as_str()).map(|v| (String::new(), v))
                }
            };
            if let (Op::Insert(_) | Op::Unpin(_), Some((evicted, _))) = (op, &out) {
                assert!(!pinned.contains(evicted), "pinned {evicted} evicted");
                assert!(c.peek(evicted.as_str()).is_none(), "{evicted} evicted but present");
            }
            assert!(c.len() <= capacity as usize);
            assert_eq!(c.pinned_len(), pinned.len());
            for p in &pinned {
                assert!(c.is_pinned(p.as_str()), "{p} lost its pin");
            }
            c.check();
            seen.push(out);
        }
        seen
    }

    proptest! {
        #[test]
        fn unpinned_size_never_exceeds_capacity_and_pins_hold(
            capacity in 1u32..40,
            percent in 1u32..=99,
            ops in proptest::collection::vec(op(64), 1..600),
        ) {
            run(capacity, percent, 1, &ops);
        }

        #[test]
        fn same_seed_gives_the_same_hits(
            capacity in 1u32..40,
            percent in 1u32..=99,
            seed in any::<u64>(),
            ops in proptest::collection::vec(op(64), 1..600),
        ) {
            prop_assert_eq!(run(capacity, percent, seed, &ops), run(capacity, percent, seed, &ops));
        }

        #[test]
        fn eviction_names_a_key_that_was_held(
            capacity in 1u32..20,
            keys in proptest::collection::vec(0u16..200, 1..400),
        ) {
            let mut c = WTinyLfu::with_capacity(capacity, 20, 3);
            let mut held = std::collections::HashSet::new();
            for k in keys {
                let key = format!("t{k}");
                if c.get(&key).is_none() {
                    held.insert(key.clone());
                    if let Some((evicted, _)) = c.insert(key, k) {
                        prop_assert!(held.remove(&evicted), "{} was not held", evicted);
                    }
                }
                prop_assert_eq!(held.len(), c.len());
            }
        }
    }
}
