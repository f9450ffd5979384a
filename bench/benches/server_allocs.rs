//! Heap allocations per request on the daemon's steady-state paths, counted by a global
//! allocator that counts: the host view served in this process (as `ctx mount` serves it,
//! over each transport), a client thread in the same process making the requests, and the
//! count of allocations (every thread's, the client's included) divided by the requests the
//! server counted. The client's calls allocate nothing (paths are made beforehand), so the
//! count is the daemon's. After a warm-up round.
//!
//! - getattr: `statx` with `AT_STATX_FORCE_SYNC` (one GETATTR each);
//! - lookup: `statx` of a name the kernel does not keep (entry timeout 0);
//! - readdir: open, list and close a directory of 100 entries;
//! - read: `pread` of 4 KiB of a control (`agent/a.d/label`) opened once, and of a data file,
//!   each after `posix_fadvise(DONTNEED)`, so that it reaches the daemon;
//! - append: `write` of one JSON line to a session's `events.jsonl` opened once.
//!
//! Needs root and /dev/fuse; prints "not run" otherwise.

#![allow(unsafe_code)] // the counting allocator

use std::alloc::{GlobalAlloc, Layout, System};
use std::ffi::CString;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rustix::fs::{AtFlags, Mode, OFlags, StatxFlags};
use server::transport::Transport;
use server::transport::pool::Pool;
use server::{Config, CtxFs};

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const N: u64 = 2000;

fn requests(mnt: &Path) -> u64 {
    let s = std::fs::read_to_string(mnt.join("status")).expect("status");
    s.lines().find_map(|l| l.strip_prefix("requests ")?.parse().ok()).expect("requests line")
}

/// Allocations per request of `f`, run `N` times after `N / 10` warm-up runs, and the
/// requests each run made (a run the kernel answers from its caches makes none).
fn per_request(mnt: &Path, mut f: impl FnMut()) -> String {
    for _ in 0..N / 10 {
        f();
    }
    let r0 = requests(mnt);
    let a0 = ALLOCS.load(Ordering::Relaxed);
    for _ in 0..N {
        f();
    }
    let a = ALLOCS.load(Ordering::Relaxed) - a0;
    // Less the `status` read that measures the end (the server counts it before it answers);
    // the daemon's allocations for it are after `a`.
    let r = requests(mnt).saturating_sub(r0 + 1);
    if r == 0 {
        return "no request".into();
    }
    format!("{:.1} ({:.1})", a as f64 / r as f64, r as f64 / N as f64)
}

fn main() {
    if std::env::args().any(|a| a == "--list" || a == "--test") {
        return;
    }
    if !rustix::process::geteuid().is_root() || !Path::new("/dev/fuse").exists() {
        println!("server_allocs: needs root and /dev/fuse; not run");
        return;
    }
    let top = tempfile::tempdir_in("/var/tmp").expect("dir");
    let storage = top.path().join("storage");
    for i in 0..100 {
        let d = storage.join("home/0/dir");
        std::fs::create_dir_all(&d).expect("dir");
        std::fs::write(d.join(format!("f{i:03}")), b"x").expect("file");
    }
    std::fs::create_dir_all(storage.join("agent/a.d")).expect("agent");
    std::fs::write(storage.join("agent/a"), b"#!/bin/sh\n").expect("agent");
    std::fs::write(storage.join("agent/a.d/label"), b"a_t\n").expect("label");
    std::fs::create_dir_all(storage.join("home/0/agent/a/session/s")).expect("session");
    std::fs::write(storage.join("home/0/data"), [7u8; 4096]).expect("data");
    let mnt = top.path().join("ctx");
    std::fs::create_dir(&mnt).expect("mnt");
    println!("Allocations per request (requests per call):\n");
    println!(
        "| transport | getattr | lookup | readdir (open, list, close) | read of a control | read of data | append |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for transport in [Transport::Dev, Transport::Uring] {
        let pool = match Pool::with_transport(2, transport) {
            Ok(p) => p,
            Err(e) => {
                println!("| {}: not run ({e}) | | | | | | |", transport.name());
                continue;
            }
        };
        let config = Config { cache_timeout: Duration::ZERO, ..Config::new(storage.clone(), Vec::new()) };
        let fs = CtxFs::new(config).expect("fs");
        let data = fs.data().expect("data");
        let host = pool.mount_host(Arc::new(fs), Arc::new(data), &mnt).expect("mount");
        let dir = mnt.join("home/0/dir");
        let dirfd = rustix::fs::open(&dir, OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty()).expect("dir");
        let name = CString::new("f000").expect("name");
        let getattr = per_request(&mnt, || {
            rustix::fs::statx(&dirfd, name.as_c_str(), AtFlags::STATX_FORCE_SYNC, StatxFlags::BASIC_STATS)
                .expect("statx");
        });
        let names: Vec<CString> = (0..100).map(|i| CString::new(format!("f{i:03}")).expect("name")).collect();
        let mut i = 0;
        let lookup = per_request(&mnt, || {
            i = (i + 1) % names.len();
            rustix::fs::statx(&dirfd, names[i].as_c_str(), AtFlags::empty(), StatxFlags::BASIC_STATS)
                .expect("statx");
        });
        let dir_c = CString::new(dir.as_os_str().as_encoded_bytes()).expect("path");
        let readdir = per_request(&mnt, || {
            let fd = rustix::fs::open(dir_c.as_c_str(), OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
                .expect("opendir");
            let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 8192];
            let mut it = rustix::fs::RawDir::new(&fd, &mut buf);
            while let Some(e) = it.next() {
                e.expect("entry");
            }
        });
        let control = std::fs::File::open(mnt.join("agent/a.d/label")).expect("control");
        let mut b = [0u8; 4096];
        // Each read drops the pages first, so that it reaches the daemon.
        let uncached = |f: &std::fs::File, b: &mut [u8]| {
            rustix::fs::fadvise(f, 0, None, rustix::fs::Advice::DontNeed).expect("fadvise");
            f.read_at(b, 0).expect("read");
        };
        let read = per_request(&mnt, || uncached(&control, &mut b));
        let data = std::fs::File::open(mnt.join("home/0/data")).expect("data");
        let read_data = per_request(&mnt, || uncached(&data, &mut b));
        let log = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(mnt.join("home/0/agent/a/session/s/events.jsonl"))
            .expect("log");
        let line = b"{\"type\":\"bench\"}\n";
        let append = per_request(&mnt, || {
            (&log).write_all(line).expect("append");
        });
        println!(
            "| {} | {getattr} | {lookup} | {readdir} | {read} | {read_data} | {append} |",
            transport.name()
        );
        drop((control, data, log, dirfd));
        pool.unmount_host(host).expect("unmount");
        pool.shutdown();
    }
}
