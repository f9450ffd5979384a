//! Durable appends through `/ctx`: 64 writer processes append whole 200-byte JSON lines to one
//! session's `events.jsonl`, against the same writes with one `fdatasync` per record on the
//! backing disk, in one run.
//!
//! The bench serves a storage under `CORTEXFS_BENCH_DIR` (default `/var/tmp`, the disk under
//! test) through an in-process host mount, once per transport (`/dev/fuse`, then FUSE over
//! io_uring when the kernel offers it). Each writer is this program started again
//! (`CORTEXFS_BENCH_WRITER`): it opens the log `O_WRONLY|O_APPEND` and writes one record per
//! `write(2)` for `CORTEXFS_BENCH_SECS` (default 2), timing each; a write through `/ctx`
//! returns once its record is durable (the log's group commit). Baselines, on a file of the
//! backing disk beside the storage: the same 64 processes each doing `write` + `fdatasync` per
//! record, and one process doing so alone (the latency of one `fdatasync`).
//!
//! Reports records/s, its ratio to one `fdatasync` per record (one process: each record waits
//! for its own sync) and to the 64-process baseline (whose syncs the filesystem's journal may
//! share), and p50/p99 latency with p99 against one `fdatasync` alone (p50). `CORTEXFS_BENCH_WRITERS` sets the writer count.
//! Needs root and /dev/fuse; prints "not run" otherwise.

use bench::record;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use server::transport::Transport;
use server::transport::pool::Pool;
use server::{Config, CtxFs};

const LOG: &str = "home/0/agent/bench/session/s/events.jsonl";

fn now_ms() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis())
}

/// A writer process: `PATH ID START_MS SECS SYNC`; prints one latency in ns per line.
fn writer(spec: &str) {
    let parts: Vec<&str> = spec.split(',').collect();
    let [path, id, start, secs, sync] = parts.as_slice() else { panic!("bad writer spec {spec}") };
    let (id, start): (usize, u128) = (id.parse().expect("id"), start.parse().expect("start"));
    let secs: f64 = secs.parse().expect("secs");
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .custom_flags(libc_o_cloexec())
        .open(path)
        .expect("open the log");
    while now_ms() < start {
        std::thread::sleep(Duration::from_micros(200));
    }
    let t = Instant::now();
    let mut lat = Vec::new();
    let mut i = 0;
    while t.elapsed().as_secs_f64() < secs {
        let r = record(id, i);
        let t0 = Instant::now();
        let n = f.write(&r).expect("write");
        assert_eq!(n, r.len(), "a whole record per write");
        if *sync == "1" {
            f.sync_data().expect("fdatasync");
        }
        lat.push(t0.elapsed().as_nanos());
        i += 1;
    }
    let mut out = String::new();
    for l in lat {
        out.push_str(&l.to_string());
        out.push('\n');
    }
    std::io::stdout().write_all(out.as_bytes()).expect("stdout");
}

fn libc_o_cloexec() -> i32 {
    rustix::fs::OFlags::CLOEXEC.bits() as i32
}

struct Cell {
    records: usize,
    secs: f64,
    lat: Vec<u128>,
}

impl Cell {
    fn rate(&self) -> f64 {
        self.records as f64 / self.secs
    }
    fn pct(&self, p: f64) -> f64 {
        let i = ((self.lat.len() as f64 - 1.0) * p).round() as usize;
        self.lat[i] as f64 / 1e3
    }
}

/// Runs `n` writer processes on `path` for `secs`.
fn run(path: &Path, n: usize, secs: f64, sync: bool) -> Cell {
    run_on(&|_| path.to_path_buf(), n, secs, sync)
}

/// Runs `n` writer processes, writer `i` on `path(i)`, for `secs`.
fn run_on(path: &dyn Fn(usize) -> PathBuf, n: usize, secs: f64, sync: bool) -> Cell {
    let exe = std::env::current_exe().expect("exe");
    let start = now_ms() + 300 + n as u128 * 5;
    let children: Vec<_> = (0..n)
        .map(|id| {
            let spec = format!("{},{id},{start},{secs},{}", path(id).display(), u8::from(sync));
            Command::new(&exe)
                .env("CORTEXFS_BENCH_WRITER", spec)
                .stdout(Stdio::piped())
                .spawn()
                .expect("spawn a writer")
        })
        .collect();
    let mut lat = Vec::new();
    for c in children {
        let out = c.wait_with_output().expect("writer");
        assert!(out.status.success(), "a writer failed");
        lat.extend(String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| l.parse::<u128>().ok()));
    }
    lat.sort_unstable();
    Cell { records: lat.len(), secs, lat }
}

fn main() {
    if let Ok(spec) = std::env::var("CORTEXFS_BENCH_WRITER") {
        writer(&spec);
        return;
    }
    if std::env::args().any(|a| a == "--list" || a == "--test") {
        return;
    }
    if !rustix::process::geteuid().is_root() || !Path::new("/dev/fuse").exists() {
        println!("appends_ctx: needs root and /dev/fuse; not run");
        return;
    }
    let secs: f64 = std::env::var("CORTEXFS_BENCH_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(2.0);
    // One writer count, or several (`1,8,64`), each a table of its own.
    let counts: Vec<usize> = std::env::var("CORTEXFS_BENCH_WRITERS")
        .unwrap_or_else(|_| "64".into())
        .split(',')
        .filter_map(|w| w.trim().parse().ok())
        .filter(|w| *w > 0)
        .collect();
    let base = std::env::var("CORTEXFS_BENCH_DIR").unwrap_or_else(|_| "/var/tmp".into());
    let top = tempfile::tempdir_in(base).expect("bench dir");
    let native = top.path().join("native.jsonl");
    std::fs::write(&native, b"").expect("native file");
    let storage = top.path().join("storage");
    let mnt = top.path().join("ctx");
    std::fs::create_dir(&mnt).expect("mnt");
    let cores = std::thread::available_parallelism().map_or(2, |c| c.get());
    let mut report = bench::Report::new(
        "appends_ctx",
        "CORTEXFS_BENCH_WRITERS=1,8,64,256 cargo bench -p bench --bench appends_ctx",
        &format!(
            "Durable appends of 200-byte records from writer processes, {secs} s per cell, on the disk of {}: \
             write + fdatasync per record on the disk, against appends through `/ctx` (acknowledged once \
             durable) to one session's `events.jsonl` and to a session per writer.",
            top.path().display()
        ),
    );
    let alone = run(&native, 1, secs, true);
    let one = alone.pct(0.5);
    // Per variant: records/s over one process's per-record fdatasync, per writer count.
    let mut ratios: Vec<(String, Vec<Option<f64>>)> = Vec::new();
    for (wi, &writers) in counts.iter().enumerate() {
        std::fs::write(&native, b"").expect("native file");
        let baseline = run(&native, writers, secs, true);
        let mut rows = Vec::new();
        let mut row = |name: &str, c: &Cell, plotted: Option<&str>| {
            rows.push(vec![
                name.to_owned(),
                format!("{:.0}", c.rate()),
                format!("{:.2}x", c.rate() / alone.rate()),
                format!("{:.2}x", c.rate() / baseline.rate()),
                format!("{:.0}", c.pct(0.5)),
                format!("{:.0}", c.pct(0.99)),
                format!("{:.2}x", c.pct(0.99) / one),
            ]);
            if let Some(series) = plotted {
                let at = match ratios.iter().position(|(n, _)| n == series) {
                    Some(i) => i,
                    None => {
                        ratios.push((series.to_owned(), vec![None; counts.len()]));
                        ratios.len() - 1
                    }
                };
                ratios[at].1[wi] = Some(c.rate() / alone.rate());
            }
        };
        row("write + fdatasync per record, 1 process", &alone, None);
        row(
            &format!("write + fdatasync per record, {writers} processes"),
            &baseline,
            Some("N processes, own fdatasync"),
        );
        for transport in [Transport::Dev, Transport::Uring] {
            let pool = match Pool::with_transport(cores, transport) {
                Ok(p) => p,
                Err(e) => {
                    println!("appends_ctx: /ctx over {}: not run ({e})", transport.name());
                    continue;
                }
            };
            let config = Config::new(storage.clone(), Vec::new());
            let logs = Arc::clone(&config.logs);
            let fs = CtxFs::new(config).expect("fs");
            let data = fs.data().expect("data fs");
            let host = pool.mount_host(Arc::new(fs), Arc::new(data), &mnt).expect("mount");
            let log: PathBuf = mnt.join(LOG);
            std::fs::create_dir_all(log.parent().expect("parent")).expect("session dir");
            let c = run(&log, writers, secs, false);
            let lines = std::fs::read_to_string(&log).expect("read the log").lines().count();
            assert!(lines >= c.records, "every acknowledged record is in the log");
            let name = format!("/ctx over {}, one session's events.jsonl", transport.name());
            row(&name, &c, Some(&format!("{}: one file", transport.name())));
            // The same writers, each on a session of its own: what the kernel's one-writer-at-a-time
            // lock on a FUSE file's appends costs the single file.
            let own = |i: usize| mnt.join(format!("home/0/agent/bench/session/w{i}/events.jsonl"));
            for i in 0..writers {
                std::fs::create_dir_all(own(i).parent().expect("parent")).expect("session dir");
            }
            let c = run_on(&own, writers, secs, false);
            let name = format!("/ctx over {}, a session per writer", transport.name());
            row(&name, &c, Some(&format!("{}: a session per writer", transport.name())));
            pool.unmount_host(host).expect("unmount");
            pool.shutdown();
            // The journal's last checkpoint, and its lock let go for the next transport.
            logs.close();
            let _ = std::fs::remove_dir_all(storage.join("home/0/agent"));
        }
        report.table(
            &format!("{writers} writer processes"),
            &[
                "variant",
                "records/s",
                "/ per-record fdatasync",
                &format!("/ per-record fdatasync, {writers} processes"),
                "p50 us",
                "p99 us",
                "p99 / one fdatasync",
            ],
            rows,
        );
    }
    report.plot(bench::Plot {
        id: "writers".into(),
        title: "Durable appends over one process's per-record fdatasync, by writer count".into(),
        x: "writer processes".into(),
        y: "records/s over one process's per-record fdatasync".into(),
        categories: counts.iter().map(|w| format!("{w} writers")).collect(),
        series: ratios,
        mark: Some((30.0, "goal: 30x (a session per writer, 64 writers)".into())),
    });
    report.save();
}
