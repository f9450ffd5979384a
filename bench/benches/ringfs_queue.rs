//! ringfs job queue: full cycles per second (publish, claim + lease, finish; every step synced)
//! with 1 and 4 worker threads, each with its own queue handle, on one queue directory.
//! `CORTEXFS_BENCH_DIR` (default `/var/tmp`) chooses the disk; `CORTEXFS_BENCH_SECS` the time.

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use ringfs::queue::{DEFAULT_LEASE, Queue};

fn main() {
    if std::env::args().any(|a| a == "--list" || a == "--test") {
        return;
    }
    let secs: f64 = std::env::var("CORTEXFS_BENCH_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(3.0);
    let base = std::env::var("CORTEXFS_BENCH_DIR").unwrap_or_else(|_| "/var/tmp".into());
    println!("ringfs queue, {secs} s per row");
    println!();
    println!("| workers | cycles/s | fsyncs/cycle | p50 ms | p99 ms |");
    println!("|---:|---:|---:|---:|---:|");
    for workers in [1usize, 4] {
        let dir = tempfile::tempdir_in(&base).expect("bench dir");
        let root = dir.path().join("queue");
        Queue::open(&root, DEFAULT_LEASE).expect("queue");
        let barrier = Arc::new(Barrier::new(workers));
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                let root = root.clone();
                let barrier = Arc::clone(&barrier);
                std::thread::spawn(move || {
                    let q = Queue::open(&root, DEFAULT_LEASE).expect("queue");
                    let worker = format!("w{w}");
                    let mut lat = Vec::new();
                    barrier.wait();
                    let start = Instant::now();
                    let mut i = 0;
                    while start.elapsed().as_secs_f64() < secs {
                        let t = Instant::now();
                        q.publish(&format!("w{w}-{i}.req.json"), b"{\"n\":1}").expect("publish");
                        // Another worker may take this job first; every finished job is a cycle.
                        if let Some(c) = q.claim(&worker, false).expect("claim") {
                            q.finish(c, b"{\"ok\":true}", false).expect("finish");
                            lat.push(t.elapsed());
                        }
                        i += 1;
                    }
                    (lat, q.syncs(), start.elapsed())
                })
            })
            .collect();
        let mut all: Vec<Duration> = Vec::new();
        let mut syncs = 0;
        let mut wall = Duration::ZERO;
        for h in handles {
            let (lat, s, e) = h.join().expect("worker");
            all.extend(lat);
            syncs += s;
            wall = wall.max(e);
        }
        all.sort();
        let n = all.len();
        println!(
            "| {workers} | {:.0} | {:.1} | {:.2} | {:.2} |",
            n as f64 / wall.as_secs_f64(),
            syncs as f64 / n as f64,
            all[n / 2].as_secs_f64() * 1e3,
            all[(n * 99 / 100).min(n - 1)].as_secs_f64() * 1e3
        );
    }
}
