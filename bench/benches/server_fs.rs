//! The `/ctx` host view against native tmpfs, in one run, on the same tree.
//!
//! Mounts a tmpfs of its own, builds the tree (1,000 files of 4 KiB and one 256 MiB file) twice
//! in it: once as its `home/0/bench/`, once as `home/0/bench/` of a CortexFS storage that this
//! process serves through an in-process mount (one `Pool`, as `ctx mount` does). Both sides
//! then run the same loops; the table gives the median of several rounds and the ratio native
//! time / CortexFS time (1.0x or more: as fast as native).
//!
//! - cached stat: `stat` of the same file, again and again (path walk from the mount point).
//! - cached open + read 4 KiB + close of one file.
//! - readdir: open, list all 1,000 entries, close.
//! - 1 MiB sequential read: open the 256 MiB file, read it in 1 MiB `read`s, close.
//! - uncached requests/s with 2, 8 and 32 client threads: each thread `statx`es its own share of
//!   the 1,000 files with
//!   `AT_STATX_FORCE_SYNC`, which makes the kernel send a GETATTR whatever its caches hold. The
//!   rate is the number of requests the server counted in its `status` file (`requests`) during
//!   the run, divided by the time; it is shown next to the number of client calls.
//!
//! All of it runs twice, once for each transport (`/dev/fuse` pool, then FUSE over io_uring when
//! the kernel offers it), and a last table sets their uncached rates side by side.
//!
//! Needs root and /dev/fuse; prints "not run" otherwise.

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rustix::fs::{AtFlags, Mode, OFlags, StatxFlags};
use server::transport::Transport;
use server::transport::pool::Pool;
use server::{Config, CtxFs};

const FILES: usize = 1000;
const SMALL: usize = 4096;
const BIG: usize = 256 << 20;
const CHUNK: usize = 1 << 20;
const ROUNDS: usize = 7;
/// Client threads of the uncached rows.
const UNCACHED_THREADS: [usize; 3] = [2, 8, 32];

/// Iterations run by `per_op` so far (warm-up included), to give requests per iteration.
static ITERATIONS: AtomicU64 = AtomicU64::new(0);

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Median over `ROUNDS` rounds of the time per iteration of `f`, after one warm-up round.
fn per_op(iters: usize, mut f: impl FnMut()) -> Duration {
    ITERATIONS.fetch_add((iters.min(100) + ROUNDS * iters) as u64, Ordering::Relaxed);
    for _ in 0..iters.min(100) {
        f();
    }
    let rounds = (0..ROUNDS)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..iters {
                f();
            }
            t.elapsed().as_secs_f64() / iters as f64
        })
        .collect();
    Duration::from_secs_f64(median(rounds))
}

fn build(dir: &Path) {
    std::fs::create_dir_all(dir).expect("tree dir");
    let small = vec![b'x'; SMALL];
    for i in 0..FILES {
        std::fs::write(dir.join(format!("f{i:04}")), &small).expect("small file");
    }
    let chunk = vec![b'y'; CHUNK];
    let mut f = std::fs::File::create(dir.join("big")).expect("big file");
    for _ in 0..BIG / CHUNK {
        std::io::Write::write_all(&mut f, &chunk).expect("big write");
    }
}

fn stat_same(dir: &Path) -> Duration {
    let p = CString::new(dir.join("f0001").into_os_string().into_encoded_bytes()).expect("path");
    per_op(200_000, || {
        rustix::fs::stat(p.as_c_str()).expect("stat");
    })
}

fn open_read_close(dir: &Path) -> Duration {
    let p = CString::new(dir.join("f0002").into_os_string().into_encoded_bytes()).expect("path");
    let mut buf = vec![0u8; SMALL];
    per_op(50_000, || {
        let fd =
            rustix::fs::open(p.as_c_str(), OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()).expect("open");
        let n = rustix::io::read(&fd, &mut buf).expect("read");
        assert_eq!(n, SMALL);
    })
}

fn readdir(dir: &Path) -> Duration {
    per_op(500, || {
        let n = std::fs::read_dir(dir).expect("read_dir").count();
        assert_eq!(n, FILES + 1);
    })
}

fn seq_read(dir: &Path) -> Duration {
    let p = dir.join("big");
    let mut buf = vec![0u8; CHUNK];
    per_op(3, || {
        let fd = rustix::fs::open(&p, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()).expect("open");
        let mut total = 0;
        loop {
            let n = rustix::io::read(&fd, &mut buf).expect("read");
            if n == 0 {
                break;
            }
            total += n;
        }
        assert_eq!(total, BIG);
    })
}

/// Forced (uncached) `statx` calls by `threads` threads, each on its own share of the files,
/// for `secs`: (calls, elapsed).
fn uncached(dir: &Path, secs: f64, threads: usize) -> (u64, Duration) {
    let t = Instant::now();
    let calls: u64 = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|w| {
                s.spawn(move || {
                    let dirfd = rustix::fs::open(dir, OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
                        .expect("dir");
                    let names: Vec<CString> = (w * FILES / threads..(w + 1) * FILES / threads)
                        .map(|i| CString::new(format!("f{i:04}")).expect("name"))
                        .collect();
                    let mut n = 0u64;
                    while t.elapsed().as_secs_f64() < secs {
                        for name in &names {
                            rustix::fs::statx(
                                &dirfd,
                                name.as_c_str(),
                                AtFlags::STATX_FORCE_SYNC,
                                StatxFlags::BASIC_STATS,
                            )
                            .expect("statx");
                        }
                        n += names.len() as u64;
                    }
                    n
                })
            })
            .collect();
        workers.into_iter().map(|h| h.join().expect("worker")).sum()
    });
    (calls, t.elapsed())
}

/// libfuse's `passthrough_ll` example (built by `scripts/bench-peers` into `target/peers`)
/// serving `root` at `mnt`: its uncached `statx` calls/s per thread count (one GETATTR each:
/// its entries are cached for 1000 s, its attributes are forced), or `None` when it is not built.
fn peer_rates(root: &Path, mnt: &Path) -> Option<Vec<f64>> {
    let bin = bench::bin_dir().parent()?.join("peers/passthrough_ll");
    if !bin.exists() {
        println!("server_fs: {} is not built (scripts/bench-peers); no libfuse peer", bin.display());
        return None;
    }
    std::fs::create_dir_all(mnt).ok()?;
    let mut child = std::process::Command::new(&bin)
        .args(["-f", "-o"])
        .arg(format!("source={},timeout=1000", root.display()))
        .arg(mnt)
        .stdout(std::process::Stdio::null())
        .spawn()
        .ok()?;
    let t = Instant::now();
    let dev = |p: &Path| std::fs::metadata(p).map(|m| std::os::unix::fs::MetadataExt::dev(&m)).ok();
    while dev(mnt) == dev(root) || dev(mnt).is_none() || dev(&mnt.join("home/0/bench")).is_none() {
        if t.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            let _ = child.wait();
            println!("server_fs: passthrough_ll did not mount; no libfuse peer");
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let dir = mnt.join("home/0/bench");
    let rates = UNCACHED_THREADS
        .iter()
        .map(|&t| {
            let (n, d) = uncached(&dir, 2.0, t);
            n as f64 / d.as_secs_f64()
        })
        .collect();
    let _ = std::process::Command::new("fusermount3").arg("-u").arg(mnt).status();
    let _ = child.kill();
    let _ = child.wait();
    Some(rates)
}

fn requests(mnt: &Path) -> u64 {
    let s = std::fs::read_to_string(mnt.join("status")).expect("status");
    s.lines().find_map(|l| l.strip_prefix("requests ")?.parse().ok()).expect("requests line")
}

fn fmt(d: Duration) -> String {
    let ns = d.as_secs_f64() * 1e9;
    if ns < 10_000.0 { format!("{ns:.0} ns") } else { format!("{:.1} us", ns / 1e3) }
}

fn main() {
    if std::env::args().any(|a| a == "--list" || a == "--test") {
        return;
    }
    if !rustix::process::geteuid().is_root() || !Path::new("/dev/fuse").exists() {
        println!("server_fs: needs root and /dev/fuse; not run");
        return;
    }
    let cores = std::thread::available_parallelism().map_or(2, |c| c.get());
    let top = tempfile::tempdir_in("/var/tmp").expect("dir");
    let tmpfs = top.path().join("tmpfs");
    std::fs::create_dir(&tmpfs).expect("tmpfs dir");
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1g", "benchtmpfs"])
        .arg(&tmpfs)
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        println!("server_fs: cannot mount a tmpfs; not run");
        return;
    }
    // The same depth below each mount point, so that path walks cost the same.
    let native = tmpfs.join("home/0/bench");
    let storage = tmpfs.join("storage");
    build(&native);
    build(&storage.join("home/0/bench"));

    let config = Config::new(storage, Vec::new());
    let mnt = top.path().join("ctx");
    std::fs::create_dir(&mnt).expect("mnt");
    let ctx: PathBuf = mnt.join("home/0/bench");
    let rate = |n: u64, d: Duration| n as f64 / d.as_secs_f64();
    let native_rates: Vec<f64> = UNCACHED_THREADS
        .iter()
        .map(|&t| {
            let (n, d) = uncached(&native, 2.0, t);
            rate(n, d)
        })
        .collect();
    let mut report = bench::Report::new(
        "server_fs",
        "cargo bench -p bench --bench server_fs",
        "A release `CtxFs` served over each transport, against native tmpfs and, for uncached \
         requests, libfuse's `passthrough_ll` example (libfuse 3 from Debian, over `/dev/fuse`) \
         on the same tmpfs. Uncached: `statx` with `AT_STATX_FORCE_SYNC`, one GETATTR each.",
    );
    let peer = peer_rates(&tmpfs, &top.path().join("peer"));
    // (transport, [requests/s per thread count])
    let mut uncached_rows = Vec::new();
    // Per case: native / cortexfs, per transport.
    let mut cached: Vec<(String, Vec<Option<f64>>)> = Vec::new();
    for (ti, transport) in [Transport::Dev, Transport::Uring].into_iter().enumerate() {
        let pool = match Pool::with_transport(cores, transport) {
            Ok(p) => p,
            Err(e) => {
                println!("\nserver_fs: transport {}: {e}; not run", transport.name());
                continue;
            }
        };
        let fs = CtxFs::new(config.clone()).expect("fs");
        let data = fs.data().expect("data fs");
        let host = pool.mount_host(Arc::new(fs), Arc::new(data), &mnt).expect("mount");
        let served_by = std::fs::read_to_string(mnt.join("status")).expect("status");
        assert!(
            served_by.lines().any(|l| l == format!("transport {}", transport.name())),
            "the mount is served by {}: {served_by}",
            transport.name()
        );

        type Case = (&'static str, fn(&Path) -> Duration);
        let cases: [Case; 4] = [
            ("cached stat (same file)", stat_same),
            ("cached open + read 4 KiB + close", open_read_close),
            ("readdir of 1,000 entries", readdir),
            ("256 MiB in 1 MiB reads (open, read all, close)", seq_read),
        ];
        let mut rows = Vec::new();
        for (ci, (name, f)) in cases.into_iter().enumerate() {
            let n = f(&native);
            let (r0, i0) = (requests(&mnt), ITERATIONS.load(Ordering::Relaxed));
            let c = f(&ctx);
            // Less one request: the read of `status` itself.
            let served = requests(&mnt) - r0 - 1;
            let per_iter = served as f64 / (ITERATIONS.load(Ordering::Relaxed) - i0) as f64;
            let extra = if name.starts_with("256") {
                let gib = |d: Duration| BIG as f64 / d.as_secs_f64() / f64::from(1u32 << 30);
                format!(" ({:.2} / {:.2} GiB/s)", gib(n), gib(c))
            } else {
                String::new()
            };
            let ratio = n.as_secs_f64() / c.as_secs_f64();
            rows.push(vec![
                format!("{name}{extra}"),
                fmt(n),
                fmt(c),
                format!("{ratio:.2}x"),
                format!("{per_iter:.3}"),
            ]);
            if cached.len() <= ci {
                cached.push((name.to_owned(), vec![None, None]));
            }
            cached[ci].1[ti] = Some(ratio);
        }
        let mut rates = Vec::new();
        for (&threads, native_rate) in UNCACHED_THREADS.iter().zip(&native_rates) {
            let before = requests(&mnt);
            let (ccalls, ct) = uncached(&ctx, 2.0, threads);
            let served = requests(&mnt) - before;
            rows.push(vec![
                format!("uncached: forced `statx`, {threads} threads"),
                format!("{native_rate:.0} calls/s"),
                format!("{:.0} requests/s ({:.0} calls/s)", rate(served, ct), rate(ccalls, ct)),
                format!("{:.2}x (calls)", rate(ccalls, ct) / native_rate),
                format!("{:.2}", served as f64 / ccalls as f64),
            ]);
            rates.push(rate(served, ct));
        }
        report.table(
            &format!("transport {}", transport.name()),
            &["benchmark", "native tmpfs", "cortexfs", "native / cortexfs", "FUSE requests per iteration"],
            rows,
        );
        uncached_rows.push((transport, rates));
        pool.unmount_host(host).expect("unmount");
        pool.shutdown();
    }
    if let [(_, dev), (_, ring)] = uncached_rows.as_slice() {
        let rows = UNCACHED_THREADS
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let p = peer.as_ref().map_or("not run".to_owned(), |p| format!("{:.0}", p[i]));
                let pr = peer.as_ref().map_or("-".to_owned(), |p| format!("{:.2}x", ring[i] / p[i]));
                vec![
                    t.to_string(),
                    format!("{:.0}", dev[i]),
                    format!("{:.0}", ring[i]),
                    format!("{:.2}x", ring[i] / dev[i]),
                    p,
                    pr,
                ]
            })
            .collect();
        report.table(
            "uncached requests/s by transport",
            &[
                "client threads",
                "/dev/fuse pool",
                "io_uring",
                "io_uring / pool",
                "libfuse passthrough_ll (/dev/fuse)",
                "io_uring / passthrough_ll",
            ],
            rows,
        );
        let threads: Vec<String> = UNCACHED_THREADS.iter().map(|t| format!("{t} threads")).collect();
        let some = |v: &[f64]| v.iter().map(|x| Some(*x)).collect::<Vec<_>>();
        let mut series = vec![("/dev/fuse pool".to_owned(), some(dev)), ("io_uring".to_owned(), some(ring))];
        if let Some(p) = &peer {
            series.push(("libfuse passthrough_ll (/dev/fuse)".to_owned(), some(p)));
        }
        report.plot(bench::Plot {
            id: "uncached".into(),
            title: "Uncached requests/s (forced statx) by transport".into(),
            x: "client threads".into(),
            y: "requests/s".into(),
            categories: threads.clone(),
            series,
            mark: None,
        });
        let ratio: Vec<Option<f64>> = dev.iter().zip(ring).map(|(d, r)| Some(r / d)).collect();
        let mut series = vec![("io_uring / /dev/fuse pool".to_owned(), ratio)];
        if let Some(p) = &peer {
            series.push((
                "io_uring / passthrough_ll".to_owned(),
                ring.iter().zip(p).map(|(r, p)| Some(r / p)).collect(),
            ));
        }
        report.plot(bench::Plot {
            id: "uncached-ratio".into(),
            title: "Uncached requests: io_uring over the /dev/fuse pool and libfuse".into(),
            x: "client threads".into(),
            y: "ratio".into(),
            categories: threads,
            series,
            mark: Some((1.5, "goal: 1.5x the pool".into())),
        });
    }
    let (names, per): (Vec<String>, Vec<Vec<Option<f64>>>) = cached.into_iter().unzip();
    if !names.is_empty() {
        let col = |t: usize| per.iter().map(|v| v[t]).collect::<Vec<_>>();
        report.plot(bench::Plot {
            id: "cached".into(),
            title: "Cached paths: native tmpfs time / CortexFS time".into(),
            x: "benchmark".into(),
            y: "native / cortexfs (1 = as fast as native)".into(),
            categories: names.iter().map(|n| n.split(" (").next().unwrap_or(n).to_owned()).collect(),
            series: vec![("/dev/fuse pool".into(), col(0)), ("io_uring".into(), col(1))],
            mark: Some((1.0, "native".into())),
        });
    }
    report.save();
    let _ = rustix::mount::unmount(&tmpfs, rustix::mount::UnmountFlags::DETACH);
}
