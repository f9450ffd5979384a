//! ringfs append log: group commit against per-record fdatasync, in one run.
//!
//! For 1, 4, 16 and 64 concurrent appenders, each appending 200-byte JSON records for a fixed
//! time, it reports records/s and acknowledgement latency p50/p99 of:
//! - `per-record`: the baseline, one write + one fdatasync per record under a mutex;
//! - `group/portable` and `group/uring`: `AppendLog` with each commit engine.
//!
//! Ratios are against the baseline at the same concurrency. Storage: a temporary directory under
//! `CORTEXFS_BENCH_DIR` (default `/var/tmp`), which should be the disk under test.
//! `CORTEXFS_BENCH_SECS` sets the time per cell (default 2); `CORTEXFS_BENCH_APPENDERS` (e.g.
//! `16,64`) the rows.

use bench::record;
use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use ringfs::log::{AppendLog, Engine, Options};

struct Cell {
    records: u64,
    secs: f64,
    lat: Vec<Duration>,
    cpu: f64,
}

/// CPU seconds (user + system) this process has used, from /proc/self/stat.
fn cpu_secs() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<f64> = after.split_whitespace().filter_map(|x| x.parse().ok()).collect();
    // Fields 14 and 15 of the file (utime, stime) are 12 and 13 after the command name.
    (f.get(11).copied().unwrap_or(0.0) + f.get(12).copied().unwrap_or(0.0)) / 100.0
}

impl Cell {
    fn rate(&self) -> f64 {
        self.records as f64 / self.secs
    }
    fn pct(&self, p: f64) -> Duration {
        let i = ((self.lat.len() as f64 - 1.0) * p).round() as usize;
        self.lat[i]
    }
}

type Append = Arc<dyn Fn(&[u8]) + Send + Sync>;

fn run(threads: usize, secs: f64, append: Append) -> Cell {
    let barrier = Arc::new(Barrier::new(threads + 1));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let append = Arc::clone(&append);
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                barrier.wait();
                let start = Instant::now();
                let mut lat = Vec::new();
                let mut i = 0;
                while start.elapsed().as_secs_f64() < secs {
                    let r = record(t, i);
                    let t0 = Instant::now();
                    append(&r);
                    lat.push(t0.elapsed());
                    i += 1;
                }
                lat
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    let cpu0 = cpu_secs();
    let mut lat: Vec<Duration> = handles.into_iter().flat_map(|h| h.join().expect("bench thread")).collect();
    let secs = start.elapsed().as_secs_f64();
    let cpu = cpu_secs() - cpu0;
    lat.sort();
    Cell { records: lat.len() as u64, secs, lat, cpu }
}

fn per_record(dir: &Path) -> Append {
    let f = Mutex::new(File::create(dir.join("baseline.jsonl")).expect("create"));
    Arc::new(move |r: &[u8]| {
        let mut f = f.lock().expect("lock");
        f.write_all(r).expect("write");
        f.sync_data().expect("fdatasync");
    })
}

fn group(dir: &Path, engine: Engine, n: usize) -> (Append, Arc<AppendLog>) {
    let opts = Options { engine, ..Options::default() };
    let log =
        Arc::new(AppendLog::open(dir.join(format!("group-{engine:?}-{n}.jsonl")), opts).expect("open").0);
    let l = Arc::clone(&log);
    (
        Arc::new(move |r: &[u8]| {
            l.append(r).expect("append");
        }),
        log,
    )
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn main() {
    if std::env::args().any(|a| a == "--list" || a == "--test") {
        return; // `cargo test --benches` probes harness=false benches this way.
    }
    let secs: f64 = std::env::var("CORTEXFS_BENCH_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(2.0);
    let base = std::env::var("CORTEXFS_BENCH_DIR").unwrap_or_else(|_| "/var/tmp".into());
    let dir = tempfile::tempdir_in(base).expect("bench dir");
    let uring = ringfs::log::uring_available().is_ok();
    println!("ringfs append log, 200-byte records, {secs} s per cell, dir {}", dir.path().display());
    println!();
    println!("| appenders | variant | records/s | ratio | p50 us | p99 us | records/sync | CPU us/record |");
    println!("|---:|---|---:|---:|---:|---:|---:|---:|");
    let mut engines = vec![("group/portable", Engine::Portable)];
    if uring {
        engines.push(("group/uring", Engine::Uring));
    }
    // CORTEXFS_BENCH_APPENDERS=64 (a list, comma-separated) runs only those rows.
    let counts: Vec<usize> = std::env::var("CORTEXFS_BENCH_APPENDERS")
        .ok()
        .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 4, 16, 64]);
    for n in counts {
        let baseline = run(n, secs, per_record(dir.path()));
        let mut rows = vec![("per-record fdatasync", 1.0, baseline)];
        for &(name, engine) in &engines {
            let (append, log) = group(dir.path(), engine, n);
            let c = run(n, secs, append);
            rows.push((name, c.records as f64 / log.batches() as f64, c));
        }
        let base_rate = rows[0].2.rate();
        for (name, per_sync, c) in &rows {
            println!(
                "| {n} | {name} | {:.0} | {:.1}x | {:.0} | {:.0} | {per_sync:.1} | {:.1} |",
                c.rate(),
                c.rate() / base_rate,
                us(c.pct(0.5)),
                us(c.pct(0.99)),
                c.cpu * 1e6 / c.records as f64
            );
        }
    }
    if !uring {
        println!("\nio_uring unavailable here: group/uring rows skipped");
    }
}
