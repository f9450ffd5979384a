//! `tsh fs.stat X` end to end, in a real agent view, against exec of the same binary from
//! native disk, in one run.
//!
//! Starts `ctx mount` on fresh storage under /var/tmp, runs `ctx bootstrap`, grants `fs.stat` to
//! an agent and creates its view. Then, interleaved round by round, it times whole processes
//! (spawn to exit) of:
//!
//! - native: `fs.stat X`, the `cortexfs-core` binary copied to the native disk;
//! - fuse exec: the same tool executed straight from the view (`VIEW/tool/fs.stat X`), no tsh;
//! - tsh which: `tsh which fs.stat` (tsh's start, context and resolution; no run, no record);
//! - tsh run: `tsh fs.stat X` (both policies, the run, and two durable records);
//!
//! and prints p50/p99 of each with the ratio to native. Needs root, /dev/fuse and the release
//! binaries (`cargo build --release --bins`, which `make bench` does); prints "not run" otherwise.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const ROUNDS: usize = 400;

/// A named way to start the process, and its samples.
type Case<'a> = (&'static str, Box<dyn Fn() -> Command + 'a>, Vec<f64>);

fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("bench path");
    exe.parent().and_then(Path::parent).expect("target/<profile>").to_path_buf()
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn timed(cmd: &mut Command) -> f64 {
    let t = Instant::now();
    let st = cmd.stdout(Stdio::null()).status().expect("spawn");
    let e = t.elapsed().as_secs_f64() * 1e6;
    assert!(st.success(), "{cmd:?} failed: {st}");
    e
}

struct Mount {
    child: std::process::Child,
    mnt: PathBuf,
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_child(&self.child),
            rustix::process::Signal::TERM,
        );
        let _ = self.child.wait();
        let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
    }
}

fn main() {
    let bins = bin_dir();
    let missing: Vec<&str> =
        ["ctx", "tsh", "cortexfs-core"].into_iter().filter(|b| !bins.join(b).exists()).collect();
    if !rustix::process::geteuid().is_root() || !Path::new("/dev/fuse").exists() || !missing.is_empty() {
        println!("tsh_run: not run (needs root, /dev/fuse and release binaries; missing {missing:?})");
        return;
    }
    let dir = tempfile::tempdir_in("/var/tmp").expect("temp dir");
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
    let storage = dir.path().join("storage");
    let mnt = dir.path().join("ctx");
    let control = dir.path().join("control.sock");
    fs::create_dir(&mnt).expect("mount point");
    let child = Command::new(bins.join("ctx"))
        .arg("mount")
        .arg("--source")
        .arg(&storage)
        .arg(&mnt)
        .arg("--control")
        .arg(&control)
        .stdout(Stdio::null())
        .spawn()
        .expect("ctx mount");
    let _mount = Mount { child, mnt: mnt.clone() };
    let t = Instant::now();
    while fs::read(mnt.join("status")).is_err() {
        assert!(t.elapsed() < Duration::from_secs(10), "ctx mount did not come up");
        std::thread::sleep(Duration::from_millis(20));
    }
    let ok = |c: &mut Command| assert!(c.status().expect("spawn").success(), "{c:?}");
    ok(Command::new(bins.join("ctx")).arg("bootstrap").arg(&storage).stdout(Stdio::null()));
    fs::write(storage.join("tool/fs.stat.d/policy"), "allow bench_t tool:fs.stat execute\n").expect("grant");
    fs::create_dir_all(storage.join("agent/bench.d")).expect("agent");
    fs::write(storage.join("agent/bench"), "#!/bin/sh\n").expect("agent");
    fs::set_permissions(storage.join("agent/bench"), fs::Permissions::from_mode(0o755)).expect("chmod");
    fs::write(storage.join("agent/bench.d/label"), "bench_t\n").expect("label");
    fs::write(storage.join("agent/bench.d/uid"), "0\n").expect("uid");
    fs::write(storage.join("agent/bench.d/policy"), "allow bench_t tool:fs.stat execute\n").expect("policy");
    fs::create_dir_all(storage.join("home/0")).expect("home");
    let view = dir.path().join("view");
    ok(Command::new(bins.join("ctx"))
        .args(["view", "create", "--agent", "bench", "--session", "b1", "--path"])
        .arg(&view)
        .arg("--control")
        .arg(&control)
        .stdout(Stdio::null()));
    let work = dir.path().join("work");
    fs::create_dir_all(&work).expect("work");
    fs::write(work.join("x"), "x").expect("x");
    let native = dir.path().join("native");
    fs::create_dir_all(&native).expect("native");
    fs::copy(bins.join("cortexfs-core"), native.join("fs.stat")).expect("copy");

    let env = |c: &mut Command| {
        c.env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("CTX_WORKSPACE", &work)
            .env("CTX_ROOT", &view)
            .env("CTX_PATH", view.join("tool"))
            .current_dir(&work);
    };
    let mut cases: Vec<Case> = vec![
        (
            "native exec of fs.stat",
            Box::new(|| {
                let mut c = Command::new(native.join("fs.stat"));
                c.arg("x");
                env(&mut c);
                c
            }),
            Vec::new(),
        ),
        (
            "exec from the view, no tsh",
            Box::new(|| {
                let mut c = Command::new(view.join("tool/fs.stat"));
                c.arg("x");
                env(&mut c);
                c
            }),
            Vec::new(),
        ),
        (
            "tsh which fs.stat",
            Box::new(|| {
                let mut c = Command::new(bins.join("tsh"));
                c.args(["which", "fs.stat"]);
                env(&mut c);
                c
            }),
            Vec::new(),
        ),
        (
            "tsh fs.stat x (run + 2 records)",
            Box::new(|| {
                let mut c = Command::new(bins.join("tsh"));
                c.args(["fs.stat", "x"]);
                env(&mut c);
                c
            }),
            Vec::new(),
        ),
    ];
    for round in 0..ROUNDS + 20 {
        for (_, make, samples) in cases.iter_mut() {
            let e = timed(&mut make());
            if round >= 20 {
                samples.push(e);
            }
        }
    }
    let mut base = (0.0, 0.0);
    println!("tsh_run: {ROUNDS} interleaved rounds, whole processes, microseconds");
    println!("{:<34} {:>9} {:>9} {:>11} {:>11}", "case", "p50 us", "p99 us", "p50 ratio", "p99 ratio");
    for (i, (name, _, samples)) in cases.iter_mut().enumerate() {
        let (p50, p99) = (pct(samples, 0.5), pct(samples, 0.99));
        if i == 0 {
            base = (p50, p99);
        }
        println!("{name:<34} {p50:>9.0} {p99:>9.0} {:>10.2}x {:>10.2}x", p50 / base.0, p99 / base.1);
    }
}
