//! Append log tests, run against both commit engines.

use std::fs;
use std::sync::Arc;

use super::evidence::{Evidence, Mark, XATTR};
use super::*;

fn engines() -> Vec<Engine> {
    // On this machine kind io_uring works; a machine where it does not must say so loudly.
    match uring_available() {
        Ok(()) => vec![Engine::Portable, Engine::Uring],
        Err(why) => panic!("io_uring is required to test both engines here: {why}"),
    }
}

fn opts(engine: Engine) -> Options {
    Options { engine, ..Options::default() }
}

fn lines(n: usize, tag: &str) -> Vec<String> {
    (0..n).map(|i| format!("{{\"tag\":\"{tag}\",\"i\":{i}}}\n")).collect()
}

#[test]
fn append_read_reopen() {
    for engine in engines() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("messages.jsonl");
        let (log, rec) = AppendLog::open(&p, opts(engine)).unwrap();
        assert!(rec.created && rec.torn.is_none());
        assert_eq!(log.append(b"{\"a\":1}\n").unwrap(), 8);
        assert_eq!(log.append(b"{\"b\":2}\n{\"c\":3}\n").unwrap(), 24);
        let mut buf = [0u8; 64];
        assert_eq!(log.read_at(&mut buf, 0).unwrap(), 24);
        assert_eq!(log.read_at(&mut buf, 30).unwrap(), 0);
        drop(log);
        let (log, rec) = AppendLog::open(&p, opts(engine)).unwrap();
        assert_eq!((rec.created, rec.adopted, rec.torn, rec.mark.end), (false, false, None, 24));
        assert_eq!(log.len(), 24);
        assert_eq!(fs::read(&p).unwrap(), b"{\"a\":1}\n{\"b\":2}\n{\"c\":3}\n");
    }
}

#[test]
fn refusals_write_nothing() {
    for engine in engines() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("events.jsonl");
        let (log, _) = AppendLog::open(&p, Options { max_line: 16, engine }).unwrap();
        log.append(b"{\"ok\":1}\n").unwrap();
        for bad in [
            &b""[..],
            b"{\"a\":1}",
            b"{\"a\":1}\n{\"b\":",
            b"{\"a\":1}\n{\"b\":\n",
            b"\n",
            b"{\"a\":1}\n\n",
            b"not json\n",
            b"{\"long\":\"0123456789\"}\n",
            b"{\"a\":1} {\"b\":2}\n",
        ] {
            assert!(matches!(log.append(bad), Err(Error::Invalid(_))), "{:?}", String::from_utf8_lossy(bad));
        }
        assert!(matches!(log.append_at(3, b"{\"x\":1}\n"), Err(Error::NotAtEnd { offset: 3, end: 9 })));
        assert_eq!(log.append_at(9, b"{\"x\":1}\n").unwrap(), 17);
        assert_eq!(fs::read(&p).unwrap(), b"{\"ok\":1}\n{\"x\":1}\n");
    }
}

#[test]
fn concurrent_appenders_share_syncs() {
    for engine in engines() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("log");
        let log = Arc::new(AppendLog::open(&p, opts(engine)).unwrap().0);
        let threads: Vec<_> = (0..16)
            .map(|t| {
                let log = Arc::clone(&log);
                std::thread::spawn(move || {
                    for l in lines(50, &format!("t{t}")) {
                        log.append(l.as_bytes()).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let text = fs::read_to_string(&p).unwrap();
        let mut got: Vec<&str> = text.lines().collect();
        assert_eq!(got.len(), 800);
        got.sort();
        got.dedup();
        assert_eq!(got.len(), 800, "every line exactly once");
        assert!(log.batches() < 800, "{engine:?}: {} batches for 800 appends", log.batches());
    }
}

#[test]
fn torn_tail_is_cut_and_kept() {
    for engine in engines() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("log");
        let (log, _) = AppendLog::open(&p, opts(engine)).unwrap();
        log.append(b"{\"a\":1}\n").unwrap();
        drop(log);
        // What a crash leaves of an unacknowledged batch: bytes past the evidence.
        let mut f = fs::OpenOptions::new().append(true).open(&p).unwrap();
        std::io::Write::write_all(&mut f, b"{\"b\":2}\n{\"c\":").unwrap();
        drop(f);
        assert_eq!(verify(&p).unwrap(), (log_mark(b"{\"a\":1}\n"), 13));
        let (log, rec) = AppendLog::open(&p, opts(engine)).unwrap();
        assert_eq!(rec.torn, Some((8, 13)));
        assert_eq!(fs::read(&p).unwrap(), b"{\"a\":1}\n");
        let side = fs::read(torn_path(&p)).unwrap();
        assert_eq!(side, b"{\"torn_at\":8,\"len\":13}\n{\"b\":2}\n{\"c\":\n");
        log.append(b"{\"d\":4}\n").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"{\"a\":1}\n{\"d\":4}\n");
    }
}

fn log_mark(bytes: &[u8]) -> Mark {
    Mark { end: bytes.len() as u64, crc: crc32fast::hash(bytes) }
}

fn set_evidence(p: &std::path::Path, ev: Evidence) {
    let f = fs::File::open(p).unwrap();
    rustix::fs::fsetxattr(&f, XATTR, &ev.encode(), rustix::fs::XattrFlags::empty()).unwrap();
}

#[test]
fn evidence_ahead_of_data_falls_back_to_prev() {
    // The evidence of an in-flight batch became durable, its bytes did not (or only partly).
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("log");
    let acked = b"{\"a\":1}\n";
    let inflight = b"{\"a\":1}\n{\"b\":2}\n";
    for on_disk in [&acked[..], &inflight[..12], b"{\"a\":1}\n\0\0\0\0\0\0\0\0", b"{\"a\":1}\n{\"b\":3}\n"] {
        fs::write(&p, on_disk).unwrap();
        set_evidence(&p, Evidence { prev: log_mark(acked), cur: log_mark(inflight) });
        let (log, rec) = AppendLog::open(&p, Options::default()).unwrap();
        assert_eq!(rec.mark, log_mark(acked), "{:?}", String::from_utf8_lossy(on_disk));
        assert_eq!(log.len(), 8);
        drop(log);
        assert_eq!(fs::read(&p).unwrap(), acked);
        let _ = fs::remove_file(torn_path(&p));
    }
    // When the in-flight batch is complete it is kept.
    fs::write(&p, inflight).unwrap();
    set_evidence(&p, Evidence { prev: log_mark(acked), cur: log_mark(inflight) });
    assert_eq!(AppendLog::open(&p, Options::default()).unwrap().1.mark, log_mark(inflight));
}

#[test]
fn damage_inside_acknowledged_data_is_reported_not_cut() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("log");
    let (log, _) = AppendLog::open(&p, Options::default()).unwrap();
    for l in lines(20, "x") {
        log.append(l.as_bytes()).unwrap();
    }
    drop(log);
    let good = fs::read(&p).unwrap();
    for pos in [0, 5, good.len() / 2, good.len() - 2] {
        let mut bad = good.clone();
        bad[pos] ^= 0x01;
        fs::write(&p, &bad).unwrap();
        let err = AppendLog::open(&p, Options::default()).unwrap_err();
        assert!(matches!(err, Error::Damaged { .. }), "{pos}: {err}");
        assert_eq!(fs::read(&p).unwrap(), bad, "nothing changed");
        assert!(verify(&p).is_err());
    }
    // Shorter than acknowledged.
    fs::write(&p, &good[..good.len() - 10]).unwrap();
    assert!(matches!(AppendLog::open(&p, Options::default()), Err(Error::Damaged { .. })));
    assert!(!torn_path(&p).exists());
}

#[test]
fn foreign_files_adopted_or_refused() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("log");
    fs::write(&p, b"{\"a\":1}\n").unwrap();
    let (log, rec) = AppendLog::open(&p, Options::default()).unwrap();
    assert!(rec.adopted);
    log.append(b"{\"b\":2}\n").unwrap();
    drop(log);
    let q = d.path().join("other");
    fs::write(&q, b"{\"a\":1}\n{\"b\"").unwrap();
    assert!(matches!(AppendLog::open(&q, Options::default()), Err(Error::Damaged { .. })));
    assert_eq!(fs::read(&q).unwrap(), b"{\"a\":1}\n{\"b\"");
}

#[test]
fn one_owner_at_a_time() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("log");
    let (_log, _) = AppendLog::open(&p, Options::default()).unwrap();
    assert!(matches!(AppendLog::open(&p, Options::default()), Err(Error::Busy { .. })));
}

#[test]
fn symlinks_refused() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("log");
    std::os::unix::fs::symlink("/etc/passwd", &p).unwrap();
    assert!(AppendLog::open(&p, Options::default()).is_err());
}

#[test]
fn crash_leaves_earlier_batches_covered() {
    // Without a clean close, every batch but the last is covered by `prev`; damage there is
    // reported.
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("log");
    let (log, _) = AppendLog::open(&p, Options::default()).unwrap();
    for l in lines(10, "x") {
        log.append(l.as_bytes()).unwrap();
    }
    log.crash();
    let mut bad = fs::read(&p).unwrap();
    bad[3] ^= 0x04;
    fs::write(&p, &bad).unwrap();
    assert!(matches!(AppendLog::open(&p, Options::default()), Err(Error::Damaged { .. })));
}

#[test]
fn crash_then_damaged_last_batch_is_taken_for_a_torn_tail() {
    // The one ambiguity of any log: after a crash, damage inside the last batch looks exactly
    // like a torn write of it. It is cut, and kept in the sidecar.
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("log");
    let (log, _) = AppendLog::open(&p, Options::default()).unwrap();
    log.append(b"{\"a\":1}\n").unwrap();
    log.append(b"{\"b\":2}\n").unwrap();
    log.crash();
    let mut bad = fs::read(&p).unwrap();
    bad[10] ^= 0x01;
    fs::write(&p, &bad).unwrap();
    let (_log, rec) = AppendLog::open(&p, Options::default()).unwrap();
    assert_eq!(rec.torn, Some((8, 8)));
    assert!(fs::read(torn_path(&p)).unwrap().ends_with(&[&bad[8..], b"\n"].concat()));
}

/// A small tmpfs of its own, unmounted on drop: a disk that can be filled.
struct SmallDisk(tempfile::TempDir);

impl SmallDisk {
    fn new(size: &str) -> SmallDisk {
        let d = tempfile::tempdir().unwrap();
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(d.path())
            .status()
            .unwrap()
            .success();
        assert!(ok, "mounting a small tmpfs needs root (tests run as root here)");
        SmallDisk(d)
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(self.0.path()).status();
    }
}

#[test]
fn a_full_disk_refuses_appends_as_enospc_and_the_log_goes_on_when_space_returns() {
    for engine in engines() {
        let disk = SmallDisk::new("1m");
        let p = disk.0.path().join("events.jsonl");
        let (log, _) = AppendLog::open(&p, opts(engine)).unwrap();
        let first = lines(10, "before");
        for l in &first {
            log.append(l.as_bytes()).unwrap();
        }
        let acked = log.len();
        // Fill what is left, including the space the log reserved ahead.
        let filler = disk.0.path().join("filler");
        let mut f = fs::File::create(&filler).unwrap();
        let chunk = vec![b'x'; 4096];
        while std::io::Write::write_all(&mut f, &chunk).is_ok() {}
        drop(f);
        let big = format!("{{\"pad\":\"{}\"}}\n", "y".repeat(600 * 1024));
        let mut refused = 0;
        for _ in 0..4 {
            match log.append(big.as_bytes()) {
                Ok(_) => {}
                Err(e) => {
                    assert_eq!(e.errno(), rustix::io::Errno::NOSPC.raw_os_error(), "{engine:?}: {e}");
                    refused += 1;
                }
            }
        }
        assert!(refused > 0, "{engine:?}: a full disk refused nothing");
        let before_space = log.len();
        assert!(before_space >= acked);
        fs::remove_file(&filler).unwrap();
        let after = lines(5, "after");
        for l in &after {
            log.append(l.as_bytes()).unwrap_or_else(|e| panic!("{engine:?}: appends work again: {e}"));
        }
        let end = log.len();
        drop(log);
        let (log, rec) = AppendLog::open(&p, opts(engine)).unwrap();
        assert_eq!((rec.torn, rec.mark.end), (None, end), "{engine:?}");
        let mut buf = vec![0u8; end as usize];
        log.read_at(&mut buf, 0).unwrap();
        let text = String::from_utf8(buf).unwrap();
        for l in first.iter().chain(&after) {
            assert_eq!(text.matches(l.as_str()).count(), 1, "{engine:?}: {l} kept once");
        }
        assert!(text.lines().all(|l| serde_json::from_str::<serde_json::Value>(l).is_ok()));
    }
}

#[test]
fn appends_that_wait_on_no_thread_are_each_told_once_when_durable() {
    for engine in engines() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("events.jsonl");
        let (log, _) = AppendLog::open(&p, opts(engine)).unwrap();
        let log = Arc::new(log);
        let (tx, rx) = std::sync::mpsc::channel::<(usize, u64)>();
        // Deferred appends from 4 threads, mixed with blocking appends from 2 more.
        std::thread::scope(|s| {
            for t in 0..4 {
                let (log, tx) = (Arc::clone(&log), tx.clone());
                s.spawn(move || {
                    for (i, l) in lines(200, &format!("d{t}")).into_iter().enumerate() {
                        let tx = tx.clone();
                        log.append_then(
                            None,
                            l.as_bytes(),
                            super::Done::Call(Box::new(move |r| {
                                let end = r.expect("durable");
                                tx.send((t * 1000 + i, end)).unwrap();
                            })),
                        );
                    }
                });
            }
            for t in 0..2 {
                let log = Arc::clone(&log);
                s.spawn(move || {
                    for l in lines(100, &format!("b{t}")) {
                        log.append(l.as_bytes()).unwrap();
                    }
                });
            }
        });
        drop(tx);
        let mut told: Vec<(usize, u64)> = rx.iter().collect();
        assert_eq!(told.len(), 800, "every deferred append is told, once");
        told.sort_unstable();
        told.dedup_by_key(|t| t.0);
        assert_eq!(told.len(), 800);
        let text = fs::read_to_string(&p).unwrap();
        assert_eq!(text.lines().count(), 1000);
        // Each told end is past the append's own line, within the file.
        for (_, end) in &told {
            assert!(*end <= text.len() as u64);
        }
        // A refused deferred append is told at once, and nothing is written.
        let refused = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let r = Arc::clone(&refused);
        log.append_then(
            None,
            b"not json\n",
            super::Done::Call(Box::new(move |res| r.store(res.is_err(), Ordering::SeqCst))),
        );
        assert!(refused.load(Ordering::SeqCst));
        assert_eq!(fs::read_to_string(&p).unwrap().lines().count(), 1000);
        assert!(log.batches() < 1000, "appends were batched: {} batches", log.batches());
    }
}

/// Found in review: a receiver that panicked ended the telling of its batch (the appends after
/// it in the batch were never told) and the committer thread that told it (once both had,
/// deferred appends of every log were queued for no one).
#[test]
fn a_receiver_that_panics_stops_no_committer() {
    let d = tempfile::tempdir().unwrap();
    let (log, _) = AppendLog::open(d.path().join("events.jsonl"), Options::default()).unwrap();
    let log = Arc::new(log);
    for i in 0..4 {
        let (tx, rx) = std::sync::mpsc::channel::<bool>();
        log.append_then(None, b"{\"panics\":true}\n", Done::Call(Box::new(|_| panic!("a receiver panics"))));
        log.append_then(
            None,
            b"{\"told\":true}\n",
            Done::Call(Box::new(move |r| tx.send(r.is_ok()).unwrap())),
        );
        let told = rx.recv_timeout(std::time::Duration::from_secs(10));
        assert_eq!(told, Ok(true), "round {i}: the append after a panicking receiver is told");
    }
    assert_eq!(log.len(), 4 * (16 + 14));
}
