//! (d) Worker processes race over a queue while being killed and stalled: 4 workers
//! (`ctx queue work ... -- /bin/cat`), 2,000 jobs, at least 200 kill -9 and 50 stalls past the
//! lease (SIGSTOP, recover, SIGCONT). No job lost, none committed twice, every result beside its
//! request, nothing left in pending/ or claimed/.
//!
//! Twice: on a plain directory, and through `/ctx/shared/<space>/queue` of a real mount, two
//! workers on the host and two in agent sandboxes (each its own uid, granted `shared:<space>
//! write`, working through its own view), the recoverer on the host mount.

use std::fs;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use ringfs::queue::{Policy, Queue};
use rustix::process::{Pid, Signal, kill_process};
use tests::served::Served;

const JOBS: usize = 2000;

/// One worker: the process started, and the `ctx queue work` process to signal (the same on the
/// host; inside the sandbox for an agent's worker, found by its unique worker name).
struct Worker {
    started: Child,
    name: String,
    sandboxed: bool,
}

impl Worker {
    /// The pid of the `ctx queue work` process, waiting up to 5 s for a sandbox to start it;
    /// `None` when it is gone.
    fn target(&mut self) -> Option<i32> {
        if !self.sandboxed {
            return Some(self.started.id() as i32);
        }
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(5) {
            if self.started.try_wait().ok().flatten().is_some() {
                return None;
            }
            if let Some(pid) = find_worker(&self.name) {
                return Some(pid);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }

    fn signal(&mut self, s: Signal) {
        if let Some(pid) = self.target() {
            let _ = kill_process(Pid::from_raw(pid).unwrap(), s);
        }
    }

    /// Waits for it to end; its output (a sandbox's terminal merges both streams).
    fn output(mut self) -> String {
        let mut s = String::new();
        if let Some(mut e) = self.started.stderr.take() {
            let _ = e.read_to_string(&mut s);
        }
        if let Some(mut o) = self.started.stdout.take() {
            let _ = o.read_to_string(&mut s);
        }
        let _ = self.started.wait();
        s
    }
}

/// The pid of the process whose argv is `ctx queue work ... --worker NAME ...`.
fn find_worker(name: &str) -> Option<i32> {
    for e in fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(cmdline) = fs::read(e.path().join("cmdline")) else { continue };
        let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
        if args.windows(2).any(|w| w[0] == b"--worker" && w[1] == name.as_bytes())
            && args.iter().any(|a| *a == b"work")
            && !args.iter().any(|a| *a == b"start")
        {
            return Some(pid);
        }
    }
    None
}

/// Races `workers` (spawned by `spawn(slot, generation)`) over the queue `q` holding JOBS jobs,
/// killing and stalling them; then checks the outcome.
fn race(q: &Queue, qdir: &Path, lease: Duration, mut spawn: impl FnMut(usize, usize) -> Worker, n: usize) {
    let mut rng = StdRng::seed_from_u64(2026);
    let mut generation = 0;
    let mut next = |slot: usize| {
        generation += 1;
        spawn(slot, generation)
    };
    let mut workers: Vec<Worker> = (0..n).map(&mut next).collect();
    let (mut kills, mut stalls) = (0, 0);
    let mut errors = String::new();
    let start = Instant::now();
    loop {
        let done = fs::read_dir(qdir.join("done")).unwrap().count() / 2;
        if done >= JOBS && kills >= 200 && stalls >= 50 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(900),
            "stuck: {done} done, {kills} kills, {stalls} stalls"
        );
        let i = rng.random_range(0..workers.len());
        if stalls < 50 && rng.random_bool(0.2) {
            workers[i].signal(Signal::STOP);
            std::thread::sleep(lease + Duration::from_millis(rng.random_range(20..80)));
            q.recover(Policy::Requeue).unwrap();
            workers[i].signal(Signal::CONT);
            stalls += 1;
        } else if kills < 200 {
            std::thread::sleep(Duration::from_millis(rng.random_range(5..40)));
            workers[i].signal(Signal::KILL);
            let old = std::mem::replace(&mut workers[i], next(i));
            errors.push_str(&old.output());
            kills += 1;
        } else {
            std::thread::sleep(Duration::from_millis(100));
        }
        // Restart workers that found the queue empty, and recover killed workers' claims.
        for (j, w) in workers.iter_mut().enumerate() {
            if w.started.try_wait().unwrap().is_some() {
                let old = std::mem::replace(w, next(j));
                errors.push_str(&old.output());
            }
        }
        if rng.random_bool(0.3) {
            q.recover(Policy::Requeue).unwrap();
        }
    }
    for mut w in workers {
        w.signal(Signal::KILL);
        errors.push_str(&w.output());
    }
    std::thread::sleep(lease);
    let r = q.recover(Policy::Requeue).unwrap();
    assert!(r.requeued.is_empty(), "jobs requeued after all were done: {:?}", r.requeued);
    assert!(r.conflicts.is_empty(), "{:?}", r.conflicts);
    assert!(!errors.contains("already exists"), "a job was committed twice:\n{errors}");

    let l = q.list().unwrap();
    assert!(
        l.pending.is_empty() && l.claimed.is_empty() && l.failed.is_empty() && l.problems.is_empty(),
        "{l:?}"
    );
    assert_eq!(l.done.len(), JOBS, "no job lost");
    for i in 0..JOBS {
        let job = format!("job-{i:05}.req.json");
        let req = fs::read(qdir.join("done").join(&job)).unwrap();
        let res = fs::read(qdir.join("done").join(format!("{job}.result"))).unwrap();
        assert_eq!(req, res, "{job}: the result beside it is its own");
    }
    let left: Vec<_> = fs::read_dir(qdir.join("claimed")).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "claimed/ not empty: {left:?}");
    eprintln!("{JOBS} jobs, {n} workers, {kills} kill -9, {stalls} stalls, {:?}", start.elapsed());
}

fn publish_all(q: &Queue) {
    for i in 0..JOBS {
        q.publish(&format!("job-{i:05}.req.json"), format!("{{\"job\":{i}}}").as_bytes()).unwrap();
    }
}

fn host_worker(q: &Path, name: String) -> Worker {
    let started = Command::new(tests::bin("ctx"))
        .args(["queue", "work"])
        .arg(q)
        .args(["--worker", &name, "--no-lock", "--", "/bin/cat"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    Worker { started, name, sandboxed: false }
}

#[test]
fn workers_killed_and_stalled_lose_nothing_and_commit_once() {
    let lease = Duration::from_millis(150);
    let d = tempfile::tempdir_in("/var/tmp").unwrap();
    let qdir = d.path().join("queue");
    let q = Queue::open(&qdir, lease).unwrap();
    publish_all(&q);
    race(&q, &qdir, lease, |i, _| host_worker(&qdir, format!("w{i}")), 4);
}

/// The same race through `/ctx`: the queue in a shared space of a real mount, two workers on the
/// host mount and two in agent sandboxes, each agent with a uid of its own in the space's group.
#[test]
fn through_ctx_workers_in_sandboxes_and_on_the_host_lose_nothing_and_commit_once() {
    assert!(Path::new("/usr/bin/bwrap").exists(), "bubblewrap is required (make test installs it)");
    let lease = Duration::from_millis(400);
    let s = Served::start();
    let st = s.storage.to_str().unwrap().to_owned();
    let ctx = |args: &[&str]| {
        let o = Command::new(tests::bin("ctx")).args(args).output().unwrap();
        assert!(o.status.success(), "{args:?}: {}", tests::shown(&o));
    };
    ctx(&["bootstrap", &st]);
    const GROUP: u32 = 1290;
    let agents = [("qa", 1291), ("qb", 1292)];
    for (name, uid) in agents {
        let (uid, g) = (uid.to_string(), GROUP.to_string());
        ctx(&[
            "agent",
            "new",
            name,
            "--uid",
            &uid,
            "--gid",
            &uid,
            "--groups",
            &g,
            "--shared",
            "race:write",
            "--source",
            &st,
        ]);
    }
    // The space: the group's, setgid, so what any worker makes stays the group's.
    let space = s.data_dir("shared/race", 0o2775, 0);
    rustix::fs::chown(s.storage.join("shared/race"), None, Some(rustix::fs::Gid::from_raw(GROUP))).unwrap();
    let qdir = space.join("queue");
    let q = Queue::open(&qdir, lease).unwrap();
    for d in ringfs::queue::DIRS {
        fs::set_permissions(qdir.join(d), fs::Permissions::from_mode(0o2775)).unwrap();
    }
    publish_all(&q);
    let work: PathBuf = s.dir.path().join("work");
    fs::create_dir_all(&work).unwrap();
    fs::set_permissions(&work, fs::Permissions::from_mode(0o777)).unwrap();
    let spawn = |i: usize, generation: usize| {
        let name = format!("{}{}g{generation}", ["h", "h", "qa", "qb"][i], std::process::id());
        if i < 2 {
            return host_worker(&qdir, name);
        }
        let agent = ["qa", "qb"][i - 2];
        let started = Command::new(tests::bin("ctx"))
            .args(["agent", "start", agent, "--session", &name, "--wait", "--ctx"])
            .arg(&s.mnt)
            .arg("--control")
            .arg(&s.control)
            .arg("--cwd")
            .arg(&work)
            .args(["--", "/bin/sh", "-c"])
            .arg(format!("exec /ctx/bin/ctx queue work /ctx/shared/race/queue --worker {name} --no-lock -- /bin/cat >/dev/null"))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        Worker { started, name, sandboxed: true }
    };
    race(&q, &qdir, lease, spawn, 4);
    // The sandboxed workers did their share, as themselves.
    let by: Vec<u32> = fs::read_dir(s.storage.join("shared/race/queue/done"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".result"))
        .map(|e| std::os::unix::fs::MetadataExt::uid(&e.metadata().unwrap()))
        .collect();
    for (name, uid) in agents {
        assert!(by.contains(&uid), "agent {name} (uid {uid}) finished no job");
    }
}
