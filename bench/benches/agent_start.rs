//! `ctx agent start` to a ready terminal, and agents started per second with 50 concurrent
//! sessions, against a bare bubblewrap sandbox in the same run.
//!
//! Starts `ctx mount` on fresh storage, bootstraps it, creates an agent (uid 1000) and a
//! workspace. Then:
//! - ready latency: 40 rounds of `ctx agent start` (returns once the terminal socket answers;
//!   the command is `sleep`), then `ctx agent stop`; beside it, `bwrap` with the same namespaces
//!   running `/bin/true`, the floor any sandboxed start pays;
//! - 50 concurrent sessions: 50 `ctx agent start` at once, time until all are ready, then all
//!   stopped.
//!
//! Needs root, /dev/fuse, bubblewrap and the release binaries (`make bench` builds them).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

const ROUNDS: usize = 40;
const CONCURRENT: usize = 50;

fn main() {
    if let Some(why) = bench::unmet(&["ctx", "tsh", "ctxterm", "cortexfs-core"]) {
        println!("agent_start: not run ({why})");
        return;
    }
    if !Path::new("/usr/bin/bwrap").exists() {
        println!("agent_start: not run (bubblewrap missing)");
        return;
    }
    let m = bench::Mounted::start();
    let st = m.storage.to_string_lossy().into_owned();
    m.ctx(&["agent", "new", "bench", "--uid", "1000", "--gid", "1000", "--source", &st]);
    let work = m.dir.path().join("work");
    std::fs::create_dir_all(&work).expect("work");
    rustix::fs::chown(&work, Some(rustix::fs::Uid::from_raw(1000)), Some(rustix::fs::Gid::from_raw(1000)))
        .expect("chown");
    let ctx = bench::bin_dir().join("ctx");
    let start = |session: &str| {
        let mut c = Command::new(&ctx);
        c.args(["agent", "start", "bench", "--session", session, "--ctx"])
            .arg(&m.mnt)
            .arg("--control")
            .arg(&m.control)
            .arg("--cwd")
            .arg(&work)
            .args(["--", "/bin/sleep", "1000"])
            .stdout(Stdio::null());
        c
    };
    let stop = |session: &str| {
        let st = Command::new(&ctx)
            .args(["agent", "stop", "bench", "--session", session, "--control"])
            .arg(&m.control)
            .stdout(Stdio::null())
            .status();
        assert!(st.is_ok_and(|s| s.success()), "stop {session}");
    };

    let mut ready = Vec::new();
    let mut bare = Vec::new();
    // Each start's steps, from its run directory's `timings` (the launcher's, then the
    // supervisor's): step name, then milliseconds per round.
    let mut steps: Vec<(String, Vec<f64>)> = Vec::new();
    let run_dir = |session: &str| m.control.parent().expect("runtime").join("agent/bench").join(session);
    for i in 0..ROUNDS + 3 {
        let s = format!("r{i}");
        let t = Instant::now();
        assert!(start(&s).status().expect("spawn").success(), "start {s}");
        let e = t.elapsed().as_secs_f64() * 1e3;
        let timings = std::fs::read_to_string(run_dir(&s).join("timings")).unwrap_or_default();
        stop(&s);
        if i >= 3 {
            for l in timings.lines() {
                let Some((name, us)) = l.split_once(' ') else { continue };
                let ms = us.parse::<f64>().unwrap_or(0.0) / 1e3;
                match steps.iter_mut().find(|(n, _)| n == name) {
                    Some((_, v)) => v.push(ms),
                    None => steps.push((name.to_owned(), vec![ms])),
                }
            }
        }
        let t = Instant::now();
        let st = Command::new("setpriv")
            .args(["--reuid=1000", "--regid=1000", "--clear-groups", "--", "bwrap", "--die-with-parent"])
            .args(["--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net"])
            .args([
                "--ro-bind",
                "/usr",
                "/usr",
                "--symlink",
                "usr/bin",
                "/bin",
                "--symlink",
                "usr/lib",
                "/lib",
            ])
            .args(["--symlink", "usr/lib64", "/lib64", "--proc", "/proc", "--dev", "/dev", "--", "/bin/true"])
            .status()
            .expect("bwrap");
        let b = t.elapsed().as_secs_f64() * 1e3;
        assert!(st.success(), "bare bwrap");
        if i >= 3 {
            ready.push(e);
            bare.push(b);
        }
    }

    let t = Instant::now();
    let mut children: Vec<_> =
        (0..CONCURRENT).map(|i| start(&format!("c{i}")).spawn().expect("spawn start")).collect();
    for c in &mut children {
        assert!(c.wait().expect("wait").success(), "concurrent start");
    }
    let all = t.elapsed().as_secs_f64();
    for i in 0..CONCURRENT {
        stop(&format!("c{i}"));
    }

    println!("agent_start: {ROUNDS} rounds after 3 warm-up, milliseconds");
    println!("{:<44} {:>8} {:>8}", "case", "p50 ms", "p99 ms");
    let (r50, r99) = (bench::pct(&mut ready, 0.5), bench::pct(&mut ready, 0.99));
    let (b50, b99) = (bench::pct(&mut bare, 0.5), bench::pct(&mut bare, 0.99));
    println!("{:<44} {r50:>8.1} {r99:>8.1}", "ctx agent start to a ready terminal");
    println!("{:<44} {b50:>8.1} {b99:>8.1}", "bare bwrap running /bin/true (floor)");
    println!("ready / bare at p50: {:.1}x", r50 / b50);
    println!("where a start's time goes (p50 ms per step; sup-* are the supervisor's, from its own start):");
    for (name, v) in &mut steps {
        println!("  {name:<42} {:>8.2}", bench::pct(v, 0.5));
    }
    println!(
        "{CONCURRENT} concurrent starts: all ready in {:.2} s, {:.1} agents/s",
        all,
        CONCURRENT as f64 / all
    );
}
