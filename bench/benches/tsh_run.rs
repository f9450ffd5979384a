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
use std::process::{Command, Stdio};
use std::time::Instant;

const ROUNDS: usize = 400;

/// A named way to start the process, and its samples.
type Case<'a> = (&'static str, Box<dyn Fn() -> Command + 'a>, Vec<f64>);

fn timed(cmd: &mut Command) -> f64 {
    let t = Instant::now();
    let st = cmd.stdout(Stdio::null()).status().expect("spawn");
    let e = t.elapsed().as_secs_f64() * 1e6;
    assert!(st.success(), "{cmd:?} failed: {st}");
    e
}

fn main() {
    if let Some(why) = bench::unmet(&["ctx", "tsh", "cortexfs-core"]) {
        println!("tsh_run: not run ({why})");
        return;
    }
    let bins = bench::bin_dir();
    let m = bench::Mounted::start();
    let (dir, storage, control) = (&m.dir, m.storage.clone(), m.control.clone());
    let ok = |c: &mut Command| assert!(c.status().expect("spawn").success(), "{c:?}");
    fs::write(storage.join("tool/fs.stat.d/policy"), "allow bench_t tool:fs.stat execute\n").expect("grant");
    fs::create_dir_all(storage.join("agent/bench.d")).expect("agent");
    fs::write(storage.join("agent/bench"), "#!/bin/sh\n").expect("agent");
    fs::set_permissions(storage.join("agent/bench"), fs::Permissions::from_mode(0o755)).expect("chmod");
    fs::write(storage.join("agent/bench.d/label"), "bench_t\n").expect("label");
    fs::write(storage.join("agent/bench.d/uid"), "0\n").expect("uid");
    fs::write(storage.join("agent/bench.d/policy"), "allow bench_t tool:fs.stat execute\n").expect("policy");
    fs::create_dir_all(storage.join("home/0")).expect("home");
    let view = dir.path().join("view");
    let work = dir.path().join("work");
    ok(Command::new(bins.join("ctx"))
        .args(["view", "create", "--agent", "bench", "--session", "b1", "--path"])
        .arg(&view)
        .arg("--workspace")
        .arg(&work)
        .arg("--control")
        .arg(&control)
        .stdout(Stdio::null()));
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
    let mut report = bench::Report::new(
        "tsh_run",
        "cargo bench -p bench --bench tsh_run",
        &format!(
            "Whole processes started per call, {ROUNDS} interleaved rounds after 20 of warm-up: a native exec \
             of a static binary against tsh resolving and running a tool through `/ctx` in an agent view."
        ),
    );
    let (mut rows, mut names, mut p50s, mut p99s) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (i, (name, _, samples)) in cases.iter_mut().enumerate() {
        let (p50, p99) = (bench::pct(samples, 0.5), bench::pct(samples, 0.99));
        if i == 0 {
            base = (p50, p99);
        }
        rows.push(vec![
            (*name).to_owned(),
            format!("{p50:.0}"),
            format!("{p99:.0}"),
            format!("{:.2}x", p50 / base.0),
            format!("{:.2}x", p99 / base.1),
        ]);
        names.push((*name).to_owned());
        p50s.push(Some(p50 / base.0));
        p99s.push(Some(p99 / base.1));
    }
    report.table(
        &format!("tsh_run: {ROUNDS} interleaved rounds, whole processes, microseconds"),
        &["case", "p50 us", "p99 us", "p50 ratio", "p99 ratio"],
        rows,
    );
    report.plot(bench::Plot {
        id: "ratios".into(),
        title: "A call through tsh over a native exec".into(),
        x: "case".into(),
        y: "time / native exec".into(),
        categories: names,
        series: vec![("p50".into(), p50s), ("p99".into(), p99s)],
        mark: Some((2.0, "goal: tsh fs.stat at 2.0x (p50)".into())),
    });
    report.save();
}
