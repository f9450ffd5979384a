//! ctxterm as its clients see it: watch and attach at once (a watcher cannot type), scrollback
//! for late watchers, the client limit, window size, signal forwarding, exit status, no orphans.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

fn start(dir: &Path, args: &[&str]) -> (Child, PathBuf) {
    let sock = dir.join("main.sock");
    let child =
        Command::new(env!("CARGO_BIN_EXE_ctxterm")).arg("--socket").arg(&sock).args(args).spawn().unwrap();
    let t = Instant::now();
    while !sock.exists() {
        assert!(t.elapsed() < Duration::from_secs(5), "no socket");
        std::thread::sleep(Duration::from_millis(10));
    }
    (child, sock)
}

fn connect(sock: &Path, mode: &str) -> UnixStream {
    // The socket's name exists from its bind, a moment before it listens.
    let t = Instant::now();
    let mut s = loop {
        match UnixStream::connect(sock) {
            Err(e)
                if e.kind() == std::io::ErrorKind::ConnectionRefused
                    && t.elapsed() < Duration::from_secs(5) =>
            {
                std::thread::sleep(Duration::from_millis(10));
            }
            r => break r.unwrap(),
        }
    };
    s.write_all(format!("{mode}\n").as_bytes()).unwrap();
    s
}

/// Reads until `want` appears or the stream ends; returns everything read.
fn read_until(s: &mut UnixStream, want: &str) -> String {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&out).contains(want) {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn watch_and_attach_together() {
    let d = tempfile::tempdir().unwrap();
    let (mut child, sock) =
        start(d.path(), &["--", "sh", "-c", "echo ready; read x; echo \"got $x\"; exit 7"]);
    let mut w = connect(&sock, "watch");
    let mut a = connect(&sock, "attach");
    assert!(read_until(&mut w, "ready").contains("ready"));
    assert!(read_until(&mut a, "ready").contains("ready"));
    w.write_all(b"typed-by-watcher\n").unwrap(); // discarded
    std::thread::sleep(Duration::from_millis(200));
    a.write_all(b"typed-by-attacher\n").unwrap();
    let seen = read_until(&mut w, "got ");
    let seen = seen + &read_until(&mut w, "\n");
    assert!(seen.contains("got typed-by-attacher"), "{seen:?}");
    assert!(!seen.contains("typed-by-watcher"), "{seen:?}");
    assert_eq!(child.wait().unwrap().code(), Some(7), "the child's status");
    assert!(!sock.exists(), "socket removed");
}

#[test]
fn late_watchers_get_scrollback_and_the_window_size_is_set() {
    let d = tempfile::tempdir().unwrap();
    let (mut child, sock) =
        start(d.path(), &["--size", "100x40", "--", "sh", "-c", "stty size; echo early-output; sleep 2"]);
    std::thread::sleep(Duration::from_millis(500));
    let mut w = connect(&sock, "watch");
    let got = read_until(&mut w, "early-output");
    assert!(got.contains("40 100"), "{got:?}");
    assert!(got.contains("early-output"), "{got:?}");
    child.wait().unwrap();
}

#[test]
fn at_most_16_clients_and_bad_modes_refused() {
    let d = tempfile::tempdir().unwrap();
    let (mut child, sock) = start(d.path(), &["--", "sleep", "3"]);
    let clients: Vec<UnixStream> = (0..16).map(|_| connect(&sock, "watch")).collect();
    std::thread::sleep(Duration::from_millis(300));
    let mut extra = connect(&sock, "watch");
    assert!(read_until(&mut extra, "\n").contains("too many clients"));
    let mut bad = connect(&sock, "control");
    assert!(read_until(&mut bad, "\n").contains("unknown mode"));
    drop(clients);
    child.wait().unwrap();
}

#[test]
fn signals_reach_the_child_and_nothing_is_left_behind() {
    let d = tempfile::tempdir().unwrap();
    // A grandchild in the background, recognisable by its unusual sleep time.
    let marker = format!("sleep {}", 7000 + std::process::id() % 1000);
    let script = format!("sh -c '{marker}' & echo started; wait");
    let (mut child, sock) = start(d.path(), &["--", "sh", "-c", &script]);
    let mut w = connect(&sock, "watch");
    read_until(&mut w, "started");
    rustix::process::kill_process(rustix::process::Pid::from_child(&child), rustix::process::Signal::TERM)
        .unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(128 + 15), "{status}");
    std::thread::sleep(Duration::from_millis(200));
    let left = Command::new("pgrep").arg("-f").arg(&marker).output().unwrap();
    assert!(left.stdout.is_empty(), "orphans left: {}", String::from_utf8_lossy(&left.stdout));
}

#[test]
fn a_command_that_cannot_run_is_exit_69() {
    let d = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ctxterm"))
        .arg("--socket")
        .arg(d.path().join("s"))
        .args(["--", "/nonexistent/tool"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(69));
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("ctxterm: cannot run /nonexistent/tool"));
}

#[test]
fn the_last_output_reaches_a_slow_watcher_before_ctxterm_exits() {
    // More than a socket buffer holds (but well within a client's queue, which a client that
    // does not keep up overflows and is dropped by design), printed just before the command
    // exits, to a watcher that is not reading yet: ctxterm exited with it still queued, and the
    // watcher never saw its end. And the first client of --wait-client joined only after the
    // command had started, so output from before it joined beyond the scrollback was lost
    // (seen under load: 355,968 of 400,000 bytes, the end included).
    let d = tempfile::tempdir().unwrap();
    let (mut child, sock) = start(
        d.path(),
        &["--wait-client", "--", "sh", "-c", "head -c 400000 /dev/zero | tr '\\0' x; echo; echo END"],
    );
    let mut w = connect(&sock, "watch");
    std::thread::sleep(Duration::from_millis(700));
    let seen = read_until(&mut w, "END");
    assert!(seen.contains("END"), "{} bytes seen, without the end", seen.len());
    assert!(seen.matches('x').count() >= 400_000, "{} of 400000", seen.matches('x').count());
    assert_eq!(child.wait().unwrap().code(), Some(0));
}
