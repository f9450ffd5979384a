//! Many agent views from one daemon: threads and memory per view.
//!
//! Mounts the host view plus N agent views of one storage in this process, all served by one
//! thread pool (as `ctx mount` does), touches every view, and reports the thread count and the
//! resident memory growth per view, once per transport (`/dev/fuse` pool, then FUSE over
//! io_uring when the kernel offers it). Needs root and /dev/fuse. `CORTEXFS_BENCH_VIEWS` sets
//! N (default 1000).

use std::sync::Arc;
use std::time::Instant;

use server::transport::Transport;
use server::transport::pool::Pool;
use server::{Config, CtxFs, ViewSpec};

fn status_field(name: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find_map(|l| {
            l.strip_prefix(name).map(|v| v.split_whitespace().next().unwrap_or("0").parse().unwrap_or(0))
        })
        .unwrap_or(0)
}

fn main() {
    if std::env::args().any(|a| a == "--list" || a == "--test") {
        return;
    }
    if !rustix::process::geteuid().is_root() || !std::path::Path::new("/dev/fuse").exists() {
        println!("server_views: needs root and /dev/fuse; not run");
        return;
    }
    let n: usize = std::env::var("CORTEXFS_BENCH_VIEWS").ok().and_then(|s| s.parse().ok()).unwrap_or(1000);
    let cores = std::thread::available_parallelism().map_or(2, |c| c.get());
    let dir = tempfile::tempdir_in("/var/tmp").expect("dir");
    let storage = dir.path().join("storage");
    let config = Config::new(storage.clone(), Vec::new());
    // One agent with a label and a policy, as views are usually of real agents.
    std::fs::create_dir_all(storage.join("agent/coder.d")).expect("agent dir");
    std::fs::write(storage.join("agent/coder"), b"#!/bin/sh\n").expect("agent");
    std::fs::write(storage.join("agent/coder.d/label"), b"coder_t\n").expect("label");
    std::fs::write(storage.join("agent/coder.d/policy"), b"allow coder_t tool:hello execute\n")
        .expect("policy");
    let mut report = bench::Report::new(
        "server_views",
        "cargo bench -p bench --bench server_views",
        &format!(
            "{n} agent views mounted in one daemon, over each transport: the threads serving them, the \
             memory and mappings each view adds, and the time to create them and to touch each once."
        ),
    );
    let (mut rows, mut names, mut rss) = (Vec::new(), Vec::new(), Vec::new());
    for transport in [Transport::Dev, Transport::Uring] {
        match Pool::with_transport(cores, transport) {
            Ok(pool) => {
                let (row, kib) = run(&pool, transport, n, cores, dir.path(), &config);
                rows.push(row);
                names.push(transport.name().to_owned());
                rss.push(Some(kib));
                pool.shutdown();
            }
            Err(e) => println!("server_views: {}: not run ({e})", transport.name()),
        }
    }
    report.table(
        "views",
        &[
            "transport",
            "views",
            "serving threads",
            "process threads",
            "limit (2 x cores + 4)",
            "RSS growth per view",
            "mappings per view",
            "create",
            "touch all",
        ],
        rows,
    );
    report.plot(bench::Plot {
        id: "rss".into(),
        title: format!("Memory each of {n} views adds"),
        x: "transport".into(),
        y: "RSS growth per view (KiB)".into(),
        categories: names,
        series: vec![("RSS per view".into(), rss)],
        mark: None,
    });
    report.save();
}

fn mappings() -> usize {
    std::fs::read_to_string("/proc/self/maps").map_or(0, |m| m.lines().count())
}

/// Mounts `n` views over `pool`; returns the table's row and the RSS growth per view in KiB.
fn run(
    pool: &Pool,
    transport: Transport,
    n: usize,
    cores: usize,
    dir: &std::path::Path,
    config: &Config,
) -> (Vec<String>, f64) {
    let dir = dir.join(transport.name());
    std::fs::create_dir(&dir).expect("dir");
    let host_mnt = dir.join("host");
    std::fs::create_dir(&host_mnt).expect("mnt");
    let host = pool.mount(Arc::new(CtxFs::new(config.clone()).expect("fs")), &host_mnt).expect("mount");
    let _ = std::fs::read(host_mnt.join("status"));
    let threads0 = status_field("Threads:");
    let rss0 = status_field("VmRSS:");
    let maps0 = mappings();
    let t = Instant::now();
    let mut views = Vec::with_capacity(n);
    for i in 0..n {
        let p = dir.join(format!("v{i}"));
        std::fs::create_dir(&p).expect("view dir");
        let spec = ViewSpec {
            agent: "coder".into(),
            session: format!("s{i}"),
            workspace: None,
            session_of: None,
            space: None,
            records_only: false,
        };
        let fs = CtxFs::new(Config { view: Some(spec), ..config.clone() }).expect("fs");
        views.push((pool.mount(Arc::new(fs), &p).expect("mount view"), p));
    }
    let created = t.elapsed();
    let t = Instant::now();
    for (_, p) in &views {
        std::fs::read(p.join("status")).expect("view answers");
        let _ = std::fs::read_dir(p.join("tool")).expect("tool/").count();
    }
    let touched = t.elapsed();
    for (_, p) in &views {
        let st = std::fs::read_to_string(p.join("status")).expect("status");
        assert!(
            st.lines().any(|l| l == format!("transport {}", transport.name())),
            "{} serves its view: {st}",
            transport.name()
        );
    }
    let threads = status_field("Threads:");
    let rss = status_field("VmRSS:");
    let maps = mappings();
    let kib = (rss.saturating_sub(rss0)) as f64 / n as f64;
    let row = vec![
        transport.name().to_owned(),
        n.to_string(),
        pool.threads().to_string(),
        format!("{threads} (was {threads0})"),
        (2 * cores + 4).to_string(),
        format!("{kib:.1} KiB"),
        format!("{:.1}", maps.saturating_sub(maps0) as f64 / n as f64),
        format!("{:.2} ms/view", created.as_secs_f64() * 1e3 / n as f64),
        format!("{:.2} ms/view", touched.as_secs_f64() * 1e3 / n as f64),
    ];
    for (a, _) in views {
        pool.unmount(a).expect("unmount view");
    }
    pool.unmount(host).expect("unmount");
    (row, kib)
}
