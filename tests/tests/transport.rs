//! The transports of `ctx mount`: FUSE over io_uring where the kernel offers it, `/dev/fuse`
//! otherwise, and never silently. The kernel offers io_uring to a new FUSE connection only
//! while `/sys/module/fuse/parameters/enable_uring` is Y; the test sets it for its duration
//! (other tests mounting meanwhile with `auto` may get `/dev/fuse`, which serves them the same)
//! and restores it.

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tests::served::Served;

const PARAM: &str = "/sys/module/fuse/parameters/enable_uring";

/// Tests that change `enable_uring` take turns.
static PARAM_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

struct Restore(String);

impl Drop for Restore {
    fn drop(&mut self) {
        let _ = fs::write(PARAM, self.0.trim());
    }
}

/// `name value` lines of a `status` file.
fn status(s: &Served, path: &str) -> Vec<(String, String)> {
    let text = fs::read_to_string(s.p(path)).expect("status");
    text.lines().filter_map(|l| l.split_once(' ').map(|(a, b)| (a.to_owned(), b.to_owned()))).collect()
}

fn field(st: &[(String, String)], name: &str) -> String {
    st.iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.clone())
        .unwrap_or_else(|| panic!("no {name} in {st:?}"))
}

/// The names of a process's threads.
fn threads(pid: u32) -> Vec<String> {
    fs::read_dir(format!("/proc/{pid}/task"))
        .expect("tasks")
        .filter_map(|t| fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|c| c.trim().to_owned())
        .collect()
}

#[test]
fn the_ring_serves_requests_where_the_kernel_offers_it_and_auto_says_when_it_falls_back() {
    let _turn = PARAM_LOCK.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let old = fs::read_to_string(PARAM).expect("this kernel has FUSE over io_uring");
    let _restore = Restore(old);
    fs::write(PARAM, "Y").unwrap();

    // io_uring: the host view and an agent view are served from the rings.
    let s = Served::start_with(&["--transport", "uring"]);
    fs::create_dir_all(s.storage.join("home/0")).unwrap();
    let data: Vec<u8> = (0..3 << 20).map(|i: u32| (i % 251) as u8).collect();
    fs::File::create(s.p("home/0/f")).unwrap().write_all(&data).unwrap();
    assert_eq!(fs::read(s.p("home/0/f")).unwrap(), data, "what was written reads back");
    for i in 0..50 {
        fs::write(s.p(&format!("home/0/n{i}")), i.to_string()).unwrap();
    }
    assert_eq!(fs::read_dir(s.p("home/0")).unwrap().count(), 51);
    let st = status(&s, "status");
    assert_eq!(field(&st, "transport"), "uring", "{st:?}");
    let ring: u64 = field(&st, "transport.ring_requests").parse().unwrap();
    let dev: u64 = field(&st, "transport.dev_requests").parse().unwrap();
    assert!(ring > 100, "the ring served the requests: {st:?}");
    assert!(dev < ring, "/dev/fuse carried only INIT, forgets and the first requests: {st:?}");
    let pid = s.child.as_ref().unwrap().id();
    let names = threads(pid);
    assert!(names.iter().any(|n| n.starts_with("fuse-ring-")), "ring threads: {names:?}");
    // The kernel's side: FUSE over io_uring starts no kernel thread of its own; what it did is
    // in the completion queues of the daemon's rings (each fetch it answered, each commit).
    let completions: u64 = fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .unwrap()
        .filter_map(|e| fs::read_to_string(e.ok()?.path()).ok())
        .filter_map(|t| t.lines().find_map(|l| l.strip_prefix("CqTail:")?.trim().parse::<u64>().ok()))
        .sum();
    assert!(
        completions >= 100,
        "the kernel completed the rings' commands: {completions} for {ring} requests"
    );

    fs::create_dir_all(s.storage.join("agent/ringer.d")).unwrap();
    fs::write(s.storage.join("agent/ringer"), "#!/bin/sh\necho ok\n").unwrap();
    fs::set_permissions(s.storage.join("agent/ringer"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(s.storage.join("agent/ringer.d/label"), "ringer_t\n").unwrap();
    fs::write(s.storage.join("agent/ringer.d/uid"), "1000\n").unwrap();
    fs::write(s.storage.join("agent/ringer.d/policy"), "").unwrap();
    let v = s.dir.path().join("view");
    s.view("ringer", "s1", &v);
    let vs = fs::read_to_string(v.join("status")).unwrap();
    assert!(vs.lines().any(|l| l == "transport uring"), "{vs}");
    assert!(vs.lines().any(|l| l == "view agent ringer session s1"), "{vs}");
    // The view's own counters: the requests of I/O through it are the ring's, not /dev/fuse's.
    let counters = || {
        let st: Vec<(String, String)> = fs::read_to_string(v.join("status"))
            .unwrap()
            .lines()
            .filter_map(|l| l.split_once(' ').map(|(k, v)| (k.to_owned(), v.to_owned())))
            .collect();
        let n = |k: &str| field(&st, k).parse::<u64>().unwrap();
        (n("transport.ring_requests"), n("transport.dev_requests"))
    };
    let (ring0, dev0) = counters();
    for i in 0..100 {
        let _ = fs::metadata(v.join(format!("agent/nothing-{i}")));
        let _ = fs::read_dir(v.join("agent")).map(|d| d.count());
    }
    let (ring1, dev1) = counters();
    assert!(ring1 >= ring0 + 100, "the view's ring served its I/O: {ring0} -> {ring1}");
    assert!(dev1 - dev0 < 10, "and /dev/fuse next to none of it: {dev0} -> {dev1}");
    drop(s);

    // Not offered: `uring` refuses (69, naming the switch); `auto` serves /dev/fuse and says so.
    fs::write(PARAM, "N").unwrap();
    let d = tempfile::tempdir_in("/var/tmp").unwrap();
    let out = Command::new(tests::bin("ctx"))
        .args(["mount", "--transport", "uring", "--source"])
        .arg(d.path().join("storage"))
        .arg("--control")
        .arg(d.path().join("c.sock"))
        .arg(d.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(69), "{}", tests::shown(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("io_uring") && err.contains("enable_uring"), "{err}");

    let mnt = d.path().join("ctx");
    fs::create_dir(&mnt).unwrap();
    let log = d.path().join("log");
    let mut child = Command::new(tests::bin("ctx"))
        .args(["mount", "--transport", "auto", "--source"])
        .arg(d.path().join("storage"))
        .arg("--control")
        .arg(d.path().join("c.sock"))
        .arg(&mnt)
        .stdout(Stdio::null())
        .stderr(fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while fs::read(mnt.join("status")).is_err() || !d.path().join("c.sock").exists() {
        assert!(t.elapsed() < Duration::from_secs(10), "ctx mount did not come up");
        std::thread::sleep(Duration::from_millis(20));
    }
    let st = fs::read_to_string(mnt.join("status")).unwrap();
    assert!(st.lines().any(|l| l == "transport dev"), "{st}");
    assert!(st.lines().any(|l| l == "transport.ring_requests 0"), "{st}");
    let _ = rustix::process::kill_process(
        rustix::process::Pid::from_child(&child),
        rustix::process::Signal::TERM,
    );
    child.wait().unwrap();
    let said = fs::read_to_string(&log).unwrap();
    assert!(said.contains("FUSE over io_uring is not available") && said.contains("enable_uring"), "{said}");
    assert!(said.contains("(dev)"), "the serving line names the transport: {said}");
}
