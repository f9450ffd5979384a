//! tsh's resolution cache: hit ratio and cost per lookup against other caches and the optimum.
//!
//! Every cache replays the same traces of tool names. A request is one lookup by name; a miss
//! is followed by an insert of the name (a `String`, cloned from the trace) with a `u32` value,
//! as tsh inserts a resolved path after a miss. Caches compared, all in this run:
//!
//! - `tsh`: [`tsh::cache::WTinyLfu`] at tsh's default `window_percent` (1%), seed 0;
//! - `tinyufo` (TinyLFU admission over S3-FIFO), built as `TinyUfo::new(capacity, capacity)`;
//! - `moka` (`moka::sync::Cache::new(capacity)`, a concurrent W-TinyLFU). It applies evictions
//!   in batches, so between batches it holds more than `capacity` entries (at capacity 32 about
//!   50 on average, up to 80 here). `moka, synced` is the same cache with `run_pending_tasks`
//!   after every insert, so that it holds at most `capacity`: its hit ratio is the fair one
//!   (it is not timed);
//! - `LRU` (the `lru` crate);
//! - `OPT`: Belady's MIN computed offline with bypass (on a miss the newcomer is not cached if it
//!   is next used later than everything cached), the best any cache of that size can do when it
//!   may decline to admit, as W-TinyLFU does.
//!
//! Traces (all seeded, so every run replays the same requests; tinyufo and moka hash with random
//! keys, so their hit ratios move by a few hundredths between runs):
//!
//! - `zipf-0.8`, `zipf-1.0`: independent requests, Zipf with that exponent; which tool has which
//!   rank is a seeded shuffle.
//! - `scan-mix`: each request is, with probability 1/2, a tool of a hot set drawn uniformly
//!   (24 tools for the small capacities, 750 for 1,000: three quarters of the smallest cache
//!   the row is for), and otherwise the next tool of a cyclic scan over all other tools (the
//!   way a listing or a batch job walks tools it will not use again soon).
//! - `shift`: Zipf 1.0 whose rank-to-tool assignment is reshuffled every phase (10 phases), so
//!   the popular tools change all at once.
//!
//! Sizes: capacities 32 and 64 replay traces over 2,000 tools, 200,000 requests (100 per
//! tool); capacity 1,000 replays traces over 50,000 tools, 1,000,000 requests. The universes
//! are 30 to 60 times the cache, so that the cache holds a small share of the tools, as tsh's
//! does on a machine with many installed tools.
//!
//! ns/op is the wall time of a whole replay divided by its requests (lookup plus insert on a
//! miss), the best of five replays on fresh caches. Output: two markdown tables. Under
//! `cargo test --benches` (no `--bench` argument) it only replays a small trace as a smoke test.

use std::hint::black_box;
use std::num::NonZeroUsize;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

/// tsh's default `window_percent`.
const WINDOW_PERCENT: u32 = 1;
const REPLAYS: usize = 5;

struct Trace {
    name: &'static str,
    ids: Vec<u32>,
}

/// Inverse-CDF sampler of Zipf ranks 0..n.
struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    fn new(n: usize, s: f64) -> Zipf {
        let mut total = 0.0;
        let cdf = (1..=n)
            .map(|r| {
                total += (r as f64).powf(-s);
                total
            })
            .collect();
        Zipf { cdf }
    }

    fn sample(&self, rng: &mut StdRng) -> usize {
        let total = self.cdf.last().copied().unwrap_or(0.0);
        let u = rng.random::<f64>() * total;
        self.cdf.partition_point(|&c| c <= u).min(self.cdf.len() - 1)
    }
}

fn shuffled(n: usize, rng: &mut StdRng) -> Vec<u32> {
    let mut p: Vec<u32> = (0..n as u32).collect();
    p.shuffle(rng);
    p
}

fn zipf_trace(name: &'static str, universe: usize, len: usize, s: f64, seed: u64) -> Trace {
    let mut rng = StdRng::seed_from_u64(seed);
    let zipf = Zipf::new(universe, s);
    let perm = shuffled(universe, &mut rng);
    Trace { name, ids: (0..len).map(|_| perm[zipf.sample(&mut rng)]).collect() }
}

fn scan_mix(universe: usize, len: usize, hot: usize, seed: u64) -> Trace {
    let mut rng = StdRng::seed_from_u64(seed);
    let perm = shuffled(universe, &mut rng);
    let (hot_set, cold) = perm.split_at(hot);
    let mut next = 0;
    let ids = (0..len)
        .map(|_| {
            if rng.random::<bool>() {
                hot_set[rng.random_range(0..hot)]
            } else {
                next = (next + 1) % cold.len();
                cold[next]
            }
        })
        .collect();
    Trace { name: "scan-mix", ids }
}

fn shift(universe: usize, len: usize, phases: usize, seed: u64) -> Trace {
    let mut rng = StdRng::seed_from_u64(seed);
    let zipf = Zipf::new(universe, 1.0);
    let phase = len / phases;
    let mut perm = shuffled(universe, &mut rng);
    let mut ids = Vec::with_capacity(len);
    for i in 0..len {
        if i > 0 && i % phase == 0 {
            perm = shuffled(universe, &mut rng);
        }
        ids.push(perm[zipf.sample(&mut rng)]);
    }
    Trace { name: "shift", ids }
}

fn traces(universe: usize, len: usize, hot: usize) -> Vec<Trace> {
    vec![
        zipf_trace("zipf-0.8", universe, len, 0.8, 1),
        zipf_trace("zipf-1.0", universe, len, 1.0, 2),
        scan_mix(universe, len, hot, 3),
        shift(universe, len, 10, 4),
    ]
}

/// Tool-like names: `pkg17.tool05`.
fn names(universe: usize) -> Vec<String> {
    (0..universe).map(|i| format!("pkg{}.tool{:02}", i / 16, i % 16)).collect()
}

/// Hits of Belady's MIN with bypass.
fn belady(ids: &[u32], universe: usize, capacity: usize) -> u64 {
    const NEVER: u64 = u64::MAX;
    let mut next = vec![NEVER; ids.len()];
    let mut seen = vec![NEVER; universe];
    for (i, &id) in ids.iter().enumerate().rev() {
        next[i] = seen[id as usize];
        seen[id as usize] = i as u64;
    }
    // For a cached id, when it is next used; NEVER entries are distinct through the id.
    let mut cached: Vec<Option<u64>> = vec![None; universe];
    let mut by_next = std::collections::BTreeSet::new();
    let mut hits = 0;
    for (i, &id) in ids.iter().enumerate() {
        let n = next[i];
        if let Some(old) = cached[id as usize] {
            hits += 1;
            by_next.remove(&(old, id));
            by_next.insert((n, id));
            cached[id as usize] = Some(n);
            continue;
        }
        if n == NEVER {
            continue;
        }
        if by_next.len() == capacity {
            match by_next.last() {
                Some(&(far, fid)) if far > n => {
                    by_next.remove(&(far, fid));
                    cached[fid as usize] = None;
                }
                _ => continue,
            }
        }
        by_next.insert((n, id));
        cached[id as usize] = Some(n);
    }
    hits
}

/// One cache under test: a fresh instance per replay.
trait Replay {
    /// Looks `key` up; inserts it on a miss. Returns whether it hit.
    #[expect(clippy::ptr_arg, reason = "tinyufo looks keys up as &K, and K is String")]
    fn access(&mut self, key: &String, id: u32) -> bool;
}

struct Tsh(tsh::cache::WTinyLfu<String, u32>);
impl Replay for Tsh {
    fn access(&mut self, key: &String, id: u32) -> bool {
        if self.0.get(key.as_str()).is_some() {
            return true;
        }
        black_box(self.0.insert(key.clone(), id));
        false
    }
}

struct Ufo(tinyufo::TinyUfo<String, u32>);
impl Replay for Ufo {
    fn access(&mut self, key: &String, id: u32) -> bool {
        if self.0.get(key).is_some() {
            return true;
        }
        black_box(self.0.put(key.clone(), id, 1));
        false
    }
}

struct Moka(moka::sync::Cache<String, u32>);
impl Replay for Moka {
    fn access(&mut self, key: &String, id: u32) -> bool {
        if self.0.get(key.as_str()).is_some() {
            return true;
        }
        self.0.insert(key.clone(), id);
        false
    }
}

struct MokaSynced(moka::sync::Cache<String, u32>);
impl Replay for MokaSynced {
    fn access(&mut self, key: &String, id: u32) -> bool {
        if self.0.get(key.as_str()).is_some() {
            return true;
        }
        self.0.insert(key.clone(), id);
        self.0.run_pending_tasks();
        false
    }
}

struct Lru(lru::LruCache<String, u32>);
impl Replay for Lru {
    fn access(&mut self, key: &String, id: u32) -> bool {
        if self.0.get(key.as_str()).is_some() {
            return true;
        }
        black_box(self.0.push(key.clone(), id));
        false
    }
}

/// Hits of the first replay and the fastest of `replays` replays' ns per request.
fn measure<C: Replay>(
    trace: &Trace,
    names: &[String],
    replays: usize,
    mut make: impl FnMut() -> C,
) -> (u64, f64) {
    let mut first_hits = None;
    let mut best = Duration::MAX;
    for _ in 0..replays {
        let mut cache = make();
        let start = Instant::now();
        let mut hits = 0u64;
        for &id in &trace.ids {
            hits += u64::from(cache.access(&names[id as usize], id));
        }
        best = best.min(start.elapsed());
        black_box(&cache);
        first_hits.get_or_insert(hits);
    }
    (first_hits.unwrap_or(0), best.as_secs_f64() * 1e9 / trace.ids.len() as f64)
}

struct Row {
    trace: &'static str,
    capacity: usize,
    /// Hit ratios: OPT, tsh, tinyufo, moka, moka synced, LRU.
    hits: [f64; 6],
    /// ns/op: tsh, tinyufo, moka, LRU.
    ns: [f64; 4],
}

fn run(universe: usize, len: usize, hot: usize, capacities: &[usize], rows: &mut Vec<Row>) {
    let names = names(universe);
    for trace in traces(universe, len, hot) {
        for &capacity in capacities {
            let n = trace.ids.len() as f64;
            let cap32 = u32::try_from(capacity).expect("small capacity");
            let opt = belady(&trace.ids, universe, capacity);
            let tsh = measure(&trace, &names, REPLAYS, || {
                Tsh(tsh::cache::WTinyLfu::with_capacity(cap32, WINDOW_PERCENT, 0))
            });
            let ufo = measure(&trace, &names, REPLAYS, || Ufo(tinyufo::TinyUfo::new(capacity, capacity)));
            let moka = measure(&trace, &names, REPLAYS, || Moka(moka::sync::Cache::new(capacity as u64)));
            let synced = measure(&trace, &names, 1, || MokaSynced(moka::sync::Cache::new(capacity as u64)));
            let lru = measure(&trace, &names, REPLAYS, || {
                Lru(lru::LruCache::new(NonZeroUsize::new(capacity).expect("capacity > 0")))
            });
            rows.push(Row {
                trace: trace.name,
                capacity,
                hits: [opt, tsh.0, ufo.0, moka.0, synced.0, lru.0].map(|h| h as f64 / n),
                ns: [tsh.1, ufo.1, moka.1, lru.1],
            });
        }
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let mut rows = Vec::new();
    if !std::env::args().any(|a| a == "--bench") {
        // `cargo test --benches`: replay a small trace through every cache, print nothing.
        run(200, 5_000, 24, &[32], &mut rows);
        println!("tsh_cache: smoke run of {} rows; `cargo bench` measures", rows.len());
        return;
    }
    run(2_000, 200_000, 24, &[32, 64], &mut rows);
    run(50_000, 1_000_000, 750, &[1000], &mut rows);
    rows.sort_by_key(|r| (r.capacity, r.trace));

    println!("Hit ratio (window_percent {WINDOW_PERCENT} for tsh):\n");
    println!(
        "| trace | capacity | OPT | tsh | tinyufo | moka | moka, synced | LRU | tsh gap closed | tsh / LRU hits |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        let [opt, tsh, ufo, moka, synced, lru] = r.hits;
        let closed = if opt > lru { (tsh - lru) / (opt - lru) * 100.0 } else { 100.0 };
        println!(
            "| {} | {} | {:.1}% | {:.1}% | {:.1}% | {:.1}% | {:.1}% | {:.1}% | {:.0}% | {:.2}x |",
            r.trace,
            r.capacity,
            opt * 100.0,
            tsh * 100.0,
            ufo * 100.0,
            moka * 100.0,
            synced * 100.0,
            lru * 100.0,
            closed,
            tsh / lru,
        );
    }
    println!("\nns per request (lookup, plus insert on a miss), best of {REPLAYS}:\n");
    println!("| trace | capacity | tsh | tinyufo | moka | LRU | tsh / LRU |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        let [tsh, ufo, moka, lru] = r.ns;
        println!(
            "| {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2}x |",
            r.trace,
            r.capacity,
            tsh,
            ufo,
            moka,
            lru,
            tsh / lru
        );
    }
}
