//! Faults surface as clear errors and lose nothing: a full filesystem (ENOSPC), a read-only one
//! (EROFS), and a user without permission (EACCES). Uses real mounts (tmpfs) as root.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use ringfs::log::{AppendLog, Options};
use ringfs::queue::{DEFAULT_LEASE, Queue};

/// A tmpfs of `size` mounted on a fresh directory; unmounted (lazily) on drop.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn new(size: &str) -> Tmpfs {
        assert!(rustix::process::geteuid().is_root(), "these tests mount tmpfs and must run as root");
        let dir = tempfile::tempdir().unwrap();
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0755")])
            .arg("tmpfs")
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(st.success(), "mount tmpfs");
        Tmpfs { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn remount(&self, opts: &str) {
        let st =
            Command::new("mount").args(["-o", &format!("remount,{opts}")]).arg(self.path()).status().unwrap();
        assert!(st.success(), "remount {opts}");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.dir.path()).status();
    }
}

fn record(i: usize) -> Vec<u8> {
    format!("{{\"i\":{i},\"pad\":\"{}\"}}\n", "p".repeat(200)).into_bytes()
}

#[test]
fn enospc_refuses_the_batch_and_the_log_goes_on_when_space_returns() {
    let fs_ = Tmpfs::new("256k");
    let p = fs_.path().join("events.jsonl");
    // Ballast to delete later, so there is room to recover.
    fs::write(fs_.path().join("ballast"), vec![0u8; 64 << 10]).unwrap();
    let (log, _) = AppendLog::open(&p, Options::default()).unwrap();
    let mut acked = 0;
    let err = loop {
        match log.append(&record(acked)) {
            Ok(_) => acked += 1,
            Err(e) => break e,
        }
        assert!(acked < 10_000, "a 256 KiB filesystem never filled up");
    };
    let msg = err.to_string();
    assert!(msg.contains("No space left on device"), "{msg}");
    assert_eq!(err.errno(), libc::ENOSPC, "the writer sees ENOSPC itself, not EIO");
    // Not stopped: a later append that still finds no space is refused the same way.
    let again = log.append(&record(acked)).unwrap_err();
    assert_eq!(again.errno(), libc::ENOSPC, "{again}");
    // Make room: appends work again without reopening.
    fs::remove_file(fs_.path().join("ballast")).unwrap();
    for i in 0..10 {
        log.append(&record(acked + i)).unwrap();
    }
    drop(log);
    // Reopen: every acknowledged record is there once, in order, nothing torn.
    let (log, rec) = AppendLog::open(&p, Options::default()).unwrap();
    assert_eq!(rec.torn, None);
    let text = fs::read_to_string(&p).unwrap();
    assert_eq!(text.lines().count(), acked + 10);
    for (i, l) in text.lines().enumerate() {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        assert_eq!(v["i"], i);
    }
    drop(log);
}

fn ctx(args: &[&str]) -> std::process::Output {
    Command::new(tests::bin("ctx")).args(args).output().unwrap()
}

fn hello_package(dir: &Path, size: usize) -> PathBuf {
    fs::create_dir_all(dir).unwrap();
    let mut exe = b"#!/bin/sh\necho hi\n#".to_vec();
    exe.resize(size, b'#');
    exe.push(b'\n');
    fs::write(dir.join("hello"), &exe).unwrap();
    fs::set_permissions(dir.join("hello"), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let sum = Command::new("sha256sum").arg(dir.join("hello")).output().unwrap();
    let sum = String::from_utf8(sum.stdout).unwrap().split_whitespace().next().unwrap().to_owned();
    let m = format!(
        r#"{{"schema":"cortexfs.object/v2","version":"1.0.0","compatibility":{{"cortexfs":"*"}},"class":"tool","name":"hello","executable":{{"path":"hello","sha256":"{sum}"}},"controls":{{}}}}"#
    );
    fs::write(dir.join("m.json"), m).unwrap();
    dir.join("m.json")
}

#[test]
fn enospc_during_install_leaves_no_object() {
    let fs_ = Tmpfs::new("512k");
    let pkg = tempfile::tempdir().unwrap();
    let m = hello_package(pkg.path(), 2 << 20);
    let storage = fs_.path().join("storage");
    fs::create_dir(&storage).unwrap();
    let out = ctx(&["object", "install", "--source", storage.to_str().unwrap(), m.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("ctx: ") && err.contains("No space left on device"), "{err}");
    assert!(!storage.join("tool/hello").exists() && !storage.join("tool/hello.d").exists());
    let left: Vec<_> = fs::read_dir(storage.join("tool")).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "staging cleaned up: {left:?}");
}

#[test]
fn erofs_is_a_clear_error() {
    let fs_ = Tmpfs::new("1m");
    let p = fs_.path().join("messages.jsonl");
    let (log, _) = AppendLog::open(&p, Options::default()).unwrap();
    log.append(b"{\"a\":1}\n").unwrap();
    log.close().unwrap();
    Queue::open(fs_.path().join("queue"), DEFAULT_LEASE).unwrap();
    fs::create_dir(fs_.path().join("s")).unwrap();
    fs_.remount("ro");
    let err = AppendLog::open(&p, Options::default()).unwrap_err().to_string();
    assert!(err.contains("Read-only file system"), "{err}");
    let q = Queue::open(fs_.path().join("queue"), DEFAULT_LEASE).unwrap();
    let err = q.publish("a.req.json", b"{}").unwrap_err().to_string();
    assert!(err.contains("Read-only file system"), "{err}");
    let pkg = tempfile::tempdir().unwrap();
    let m = hello_package(pkg.path(), 100);
    let out =
        ctx(&["object", "install", "--source", fs_.path().join("s").to_str().unwrap(), m.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("Read-only file system"));
    fs_.remount("rw");
    assert_eq!(fs::read(&p).unwrap(), b"{\"a\":1}\n", "nothing lost");
}

#[test]
fn eacces_is_exit_13_for_a_user_without_permission() {
    let storage = tempfile::tempdir().unwrap();
    fs::set_permissions(storage.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let pkg = tempfile::tempdir().unwrap();
    fs::set_permissions(pkg.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let m = hello_package(&pkg.path().join("p"), 100);
    // The test binary's directory must be reachable by nobody.
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(tests::bin("ctx"))
        .args(["object", "install", "--source", storage.path().to_str().unwrap(), m.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(13), "{err}");
    assert!(err.contains("Permission denied"), "{err}");
    assert!(!storage.path().join("tool").exists());
}

/// The same through a journal: a full filesystem refuses the append (ENOSPC as itself) before
/// anything is journaled, the log goes on when space returns, and after the journal is opened
/// again (replayed) the refused records are nowhere and every acknowledged one is there once.
#[test]
fn enospc_through_the_journal_refuses_the_append_and_journals_nothing() {
    use ringfs::log::Journal;
    let fs_ = Tmpfs::new("1m");
    let p = fs_.path().join("events.jsonl");
    let j = Journal::open(fs_.path(), 64 << 10).unwrap();
    fs::write(fs_.path().join("ballast"), vec![0u8; 64 << 10]).unwrap();
    let (log, _) = AppendLog::open_journaled(&j, Path::new("events.jsonl"), Options::default()).unwrap();
    assert!(log.journaled());
    let mut acked = 0;
    let err = loop {
        match log.append(&record(acked)) {
            Ok(_) => acked += 1,
            Err(e) => break e,
        }
        assert!(acked < 10_000, "a 1 MiB filesystem never filled up");
    };
    assert_eq!(err.errno(), libc::ENOSPC, "the writer sees ENOSPC itself: {err}");
    let records = j.stats().records;
    assert_eq!(records, acked as u64, "a refused append is not journaled");
    assert_eq!(log.append(&record(acked)).unwrap_err().errno(), libc::ENOSPC);
    fs::remove_file(fs_.path().join("ballast")).unwrap();
    for i in 0..10 {
        log.append(&record(acked + i)).unwrap();
    }
    drop(log);
    j.close().unwrap();
    drop(j);
    let j = Journal::open(fs_.path(), 64 << 10).unwrap();
    let text = fs::read_to_string(&p).unwrap();
    assert_eq!(text.lines().count(), acked + 10);
    for (i, l) in text.lines().enumerate() {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        assert_eq!(v["i"], i);
    }
    j.close().unwrap();
}
