//! How a journal should flush, on the disk under test (`CORTEXFS_BENCH_DIR`, default
//! `/var/tmp`): one 200-byte record written and made durable, p50 and p99 over
//! `CORTEXFS_BENCH_N` records (default 2000), five ways:
//!
//! - appended to a growing file, then `fdatasync` (what a log with a sync of its own does);
//! - written over a preallocated, zero-filled file, then `fdatasync` (the journal's ring);
//! - the same with `sync_file_range(WAIT_BEFORE|WRITE|WAIT_AFTER)` before the `fdatasync`;
//! - `pwritev2(RWF_DSYNC)` over the zero-filled file;
//! - `pwrite` over the zero-filled file opened `O_DSYNC`.
//!
//! Reports each against the first.
#![allow(unsafe_code)]

use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::time::Instant;

fn main() {
    if std::env::args().any(|a| a == "--list" || a == "--test") {
        return;
    }
    let n: usize = std::env::var("CORTEXFS_BENCH_N").ok().and_then(|s| s.parse().ok()).unwrap_or(2000);
    let base = std::env::var("CORTEXFS_BENCH_DIR").unwrap_or_else(|_| "/var/tmp".into());
    let dir = tempfile::tempdir_in(base).expect("bench dir");
    let rec = bench::record(0, 0);
    let ring_len = (n * 256) as u64;
    let zeroed = |name: &str, flags: i32| {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .custom_flags(flags)
            .open(dir.path().join(name))
            .expect("create");
        f.write_all_at(&vec![0u8; ring_len as usize], 0).expect("zero-fill");
        f.sync_all().expect("sync");
        f
    };
    let mut rows = Vec::new();
    let mut measure = |name: &str, step: &mut dyn FnMut(u64)| {
        let mut lat: Vec<f64> = (0..n)
            .map(|i| {
                let t = Instant::now();
                step(i as u64 * 256);
                t.elapsed().as_nanos() as f64 / 1e3
            })
            .collect();
        rows.push((name.to_owned(), bench::pct(&mut lat, 0.5), bench::pct(&mut lat, 0.99)));
    };
    let append =
        OpenOptions::new().append(true).create(true).open(dir.path().join("append")).expect("create");
    measure("append + fdatasync", &mut |_| {
        std::io::Write::write_all(&mut &append, &rec).expect("write");
        append.sync_data().expect("fdatasync");
    });
    let over = zeroed("over", 0);
    measure("overwrite zero-filled + fdatasync", &mut |at| {
        over.write_all_at(&rec, at).expect("write");
        over.sync_data().expect("fdatasync");
    });
    let sfr = zeroed("sfr", 0);
    measure("overwrite + sync_file_range + fdatasync", &mut |at| {
        sfr.write_all_at(&rec, at).expect("write");
        let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE
            | libc::SYNC_FILE_RANGE_WRITE
            | libc::SYNC_FILE_RANGE_WAIT_AFTER;
        // SAFETY: a plain system call on a descriptor this function owns; no memory is passed.
        let r = unsafe { libc::sync_file_range(sfr.as_raw_fd(), at as i64, rec.len() as i64, flags) };
        assert_eq!(r, 0, "sync_file_range: {}", std::io::Error::last_os_error());
        sfr.sync_data().expect("fdatasync");
    });
    let dsync = zeroed("rwf", 0);
    measure("pwritev2(RWF_DSYNC) over zero-filled", &mut |at| {
        rustix::io::pwritev2(&dsync, &[std::io::IoSlice::new(&rec)], at, rustix::io::ReadWriteFlags::DSYNC)
            .expect("pwritev2");
    });
    let odsync = zeroed("odsync", rustix::fs::OFlags::DSYNC.bits() as i32);
    measure("pwrite over zero-filled, O_DSYNC", &mut |at| {
        odsync.write_all_at(&rec, at).expect("write");
    });
    let first = rows[0].1;
    let mut report = bench::Report::new(
        "journal_flush",
        "cargo bench -p bench --bench journal_flush",
        &format!(
            "One 200-byte record made durable, {n} times each way, on the disk of {}: a growing file against \
             the journal's zero-filled ring.",
            dir.path().display()
        ),
    );
    report.table(
        "a record made durable",
        &["way", "p50 us", "p99 us", "p50 / append + fdatasync"],
        rows.iter()
            .map(|(name, p50, p99)| {
                vec![name.clone(), format!("{p50:.0}"), format!("{p99:.0}"), format!("{:.2}x", p50 / first)]
            })
            .collect(),
    );
    report.save();
}
