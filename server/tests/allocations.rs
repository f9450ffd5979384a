//! No heap allocation per request on the steady-state paths over FUSE-over-io_uring: lookup,
//! getattr, a directory's open, listing and close, reads of a control and of data, and a
//! durable session append. A global allocator counts every allocation of this process (the
//! daemon's threads and this client's alike; the client's calls allocate nothing), after a
//! warm-up round. Needs root, `/dev/fuse` and `enable_uring` (`make test` sets it up).

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
        counted();
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        counted();
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new: usize) -> *mut u8 {
        counted();
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new) }
    }
}

/// While set, the first allocations print where they were made (a failure then says where).
static TRACE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static TRACED: AtomicU64 = AtomicU64::new(0);
thread_local! {
    static TRACING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Counts an allocation, unless it is the tracer's own.
fn counted() {
    if TRACING.with(std::cell::Cell::get) {
        return;
    }
    ALLOCS.fetch_add(1, Ordering::Relaxed);
    if TRACE.load(Ordering::Relaxed) && TRACED.fetch_add(1, Ordering::Relaxed) < 3 {
        TRACING.with(|t| t.set(true));
        let b = std::backtrace::Backtrace::force_capture();
        eprintln!("allocation on thread {:?}:\n{b}", std::thread::current().name());
        TRACING.with(|t| t.set(false));
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const ROUNDS: u64 = 500;

/// Allocations made while `f` runs `ROUNDS` times, after as many warm-up runs.
fn allocations(mut f: impl FnMut()) -> u64 {
    for _ in 0..ROUNDS {
        f();
    }
    let a0 = ALLOCS.load(Ordering::SeqCst);
    TRACE.store(true, Ordering::SeqCst);
    for _ in 0..ROUNDS {
        f();
    }
    TRACE.store(false, Ordering::SeqCst);
    ALLOCS.load(Ordering::SeqCst) - a0
}

#[test]
fn steady_state_requests_over_the_ring_allocate_nothing() {
    assert!(rustix::process::geteuid().is_root(), "this test mounts FUSE: run as root");
    assert!(Path::new("/dev/fuse").exists(), "this test mounts FUSE: /dev/fuse is missing");
    if let Err(why) = server::transport::uring::offered_by_kernel() {
        panic!("FUSE over io_uring is needed here ({why}); scripts/host-setup enables it");
    }
    let top = tempfile::tempdir_in("/var/tmp").unwrap();
    let storage = top.path().join("storage");
    let d = storage.join("home/0/dir");
    std::fs::create_dir_all(&d).unwrap();
    for i in 0..100 {
        std::fs::write(d.join(format!("f{i:03}")), b"x").unwrap();
    }
    std::fs::write(storage.join("home/0/data"), [7u8; 4096]).unwrap();
    std::fs::create_dir_all(storage.join("agent/a.d")).unwrap();
    std::fs::write(storage.join("agent/a"), b"#!/bin/sh\n").unwrap();
    std::fs::write(storage.join("agent/a.d/label"), b"a_t\n").unwrap();
    std::fs::create_dir_all(storage.join("home/0/agent/a/session/s")).unwrap();
    // A session's log as a run finds it: made before, with a line in it.
    let first = b"{\"type\":\"start\"}\n";
    std::fs::write(storage.join("home/0/agent/a/session/s/events.jsonl"), first).unwrap();
    let mnt = top.path().join("ctx");
    std::fs::create_dir(&mnt).unwrap();

    let pool = Pool::with_transport(2, Transport::Uring).unwrap();
    // No caching of entries or attributes: every call below reaches the daemon.
    let config = Config { cache_timeout: Duration::ZERO, ..Config::new(storage.clone(), Vec::new()) };
    let fs = CtxFs::new(config).unwrap();
    let data = fs.data().unwrap();
    let host = pool.mount_host(Arc::new(fs), Arc::new(data), &mnt).unwrap();
    let ring_requests = || {
        let s = std::fs::read_to_string(mnt.join("status")).unwrap();
        s.lines().find_map(|l| l.strip_prefix("transport.ring_requests ")?.parse::<u64>().ok()).unwrap()
    };

    // The daemon's count of requests of one kind (`op.<kind>` in its status).
    let ops = |kind: &str| {
        let s = std::fs::read_to_string(mnt.join("status")).unwrap();
        s.lines().find_map(|l| l.strip_prefix(&format!("op.{kind} "))?.parse::<u64>().ok()).unwrap()
    };
    let dir = mnt.join("home/0/dir");
    let dirfd = rustix::fs::open(&dir, OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty()).unwrap();
    let name = CString::new("f000").unwrap();
    let names: Vec<CString> = (0..100).map(|i| CString::new(format!("f{i:03}")).unwrap()).collect();
    let dir_c = CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
    let control = std::fs::File::open(mnt.join("agent/a.d/label")).unwrap();
    let file = std::fs::File::open(mnt.join("home/0/data")).unwrap();
    let log = std::fs::OpenOptions::new()
        .append(true)
        .open(mnt.join("home/0/agent/a/session/s/events.jsonl"))
        .unwrap();
    let mut b = [0u8; 4096];
    let mut i = 0;
    let mut count = Vec::new();
    let mut reached: Vec<(&str, u64)> = Vec::new();
    let r0 = ring_requests();
    let before = ops("getattr");
    count.push((
        "getattr",
        allocations(|| {
            rustix::fs::statx(&dirfd, name.as_c_str(), AtFlags::STATX_FORCE_SYNC, StatxFlags::BASIC_STATS)
                .unwrap();
        }),
    ));
    reached.push(("getattr", ops("getattr") - before));
    let before = ops("lookup");
    count.push((
        "lookup",
        allocations(|| {
            i = (i + 1) % names.len();
            rustix::fs::statx(&dirfd, names[i].as_c_str(), AtFlags::empty(), StatxFlags::BASIC_STATS)
                .unwrap();
        }),
    ));
    reached.push(("lookup", ops("lookup") - before));
    let before = ops("readdir");
    count.push((
        "readdir",
        allocations(|| {
            let fd = rustix::fs::open(dir_c.as_c_str(), OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
                .unwrap();
            let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 8192];
            let mut it = rustix::fs::RawDir::new(&fd, &mut buf);
            let mut n = 0;
            while let Some(e) = it.next() {
                e.unwrap();
                n += 1;
            }
            assert_eq!(n, 102);
        }),
    ));
    reached.push(("readdir", ops("readdir") - before));
    // Each read drops the pages first, so that it reaches the daemon.
    let mut uncached = |f: &std::fs::File| {
        rustix::fs::fadvise(f, 0, None, rustix::fs::Advice::DontNeed).unwrap();
        f.read_at(&mut b, 0).unwrap()
    };
    let before = ops("read");
    count.push(("read of a control", allocations(|| assert_eq!(uncached(&control), 4))));
    reached.push(("read of a control", ops("read") - before));
    let before = ops("read");
    count.push(("read of data", allocations(|| assert_eq!(uncached(&file), 4096))));
    reached.push(("read of data", ops("read") - before));
    let line = b"{\"type\":\"steady\"}\n";
    // Each append after a fresh look at the log's attributes (as a follower's `stat` makes
    // the kernel take): the kernel then asks for `security.capability` before the write.
    let before = ops("write");
    count.push((
        "durable append",
        allocations(|| {
            rustix::fs::statx(
                &log,
                c"",
                AtFlags::EMPTY_PATH | AtFlags::STATX_FORCE_SYNC,
                StatxFlags::BASIC_STATS,
            )
            .unwrap();
            (&log).write_all(line).unwrap();
        }),
    ));
    reached.push(("durable append", ops("write") - before));
    let served = ring_requests() - r0;
    drop((control, file, log, dirfd));
    pool.unmount_host(host).unwrap();
    let log = std::fs::read(storage.join("home/0/agent/a/session/s/events.jsonl")).unwrap();
    assert_eq!(log.len(), first.len() + 2 * ROUNDS as usize * line.len(), "every append is in the log");
    // 2 x 500 calls of 6 kinds, each one request at least, all of them over the ring.
    assert!(served >= 6 * 2 * ROUNDS, "the ring served {served} requests");
    // Each kind reached the daemon as requests of its own kind, a call at least once each (the
    // total alone could be met by readdir and reads).
    for (kind, n) in &reached {
        assert!(*n >= 2 * ROUNDS, "{kind}: {n} requests of its kind for {} calls", 2 * ROUNDS);
    }
    let allocating: Vec<_> = count.iter().filter(|(_, n)| *n > 0).collect();
    assert!(allocating.is_empty(), "allocations in {ROUNDS} calls after a warm-up: {count:?}");
}
