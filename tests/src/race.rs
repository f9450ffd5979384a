//! Racing queue workers while killing and stalling them, for the queue tests: [`race`] drives
//! any mix of workers (on a host mount, or in agent sandboxes) over one queue and checks that no
//! job is lost and none is committed twice.

#![allow(clippy::unwrap_used)] // a test driver: it fails loudly by design

use std::fs;
use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use ringfs::queue::{Policy, Queue};
use rustix::process::{Pid, Signal, kill_process};

/// The jobs of a race.
pub const JOBS: usize = 2000;

/// One worker: the process started, and the `ctx queue work` process to signal (the same on the
/// host; inside the sandbox for an agent's worker, found by its unique worker name).
#[derive(Debug)]
pub struct Worker {
    /// The process started.
    pub started: Child,
    /// Its worker name (unique).
    pub name: String,
    /// Whether it runs in a sandbox (then the process to signal is found by name).
    pub sandboxed: bool,
    /// A file its output goes to instead of pipes (nobody reads a pipe while the race runs).
    pub log: Option<std::path::PathBuf>,
}

impl Worker {
    /// The pid of the `ctx queue work` process, waiting up to 30 s for a sandbox to start it;
    /// `None` when it is gone.
    fn target(&mut self) -> Option<i32> {
        if !self.sandboxed {
            // A worker that ended (reaped here) is not there to signal, whatever its pid says.
            return self.started.try_wait().ok().flatten().is_none().then_some(self.started.id() as i32);
        }
        // Generous: a guard against a worker that never shows, not a measure of a start.
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(30) {
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

    /// Sends `s` to the worker process: `true` when it was delivered, `false` when the worker
    /// had already ended (it found the queue empty). A worker still running that cannot be found
    /// fails the race: a signal never counts unless it was sent.
    pub fn signal(&mut self, s: Signal) -> bool {
        match self.target() {
            Some(pid) => match kill_process(Pid::from_raw(pid).unwrap(), s) {
                Ok(()) => true,
                Err(rustix::io::Errno::SRCH) => false,
                Err(e) => panic!("{}: signal {s:?} to {pid}: {e}", self.name),
            },
            None if self.started.try_wait().ok().flatten().is_some() => false,
            None => panic!("{}: running, but its worker process was not found in 30 s", self.name),
        }
    }

    /// Waits for it to end; its output (a sandbox's terminal merges both streams).
    pub fn output(mut self) -> String {
        let mut s = String::new();
        // A worker killed part way through a line leaves it without its newline: each stream
        // ends a line of its own, so that the next one's first line is read as written.
        let end_line = |s: &mut String| {
            if !s.is_empty() && !s.ends_with('\n') {
                s.push('\n');
            }
        };
        if let Some(mut e) = self.started.stderr.take() {
            let _ = e.read_to_string(&mut s);
            end_line(&mut s);
        }
        if let Some(mut o) = self.started.stdout.take() {
            let _ = o.read_to_string(&mut s);
            end_line(&mut s);
        }
        let _ = self.started.wait();
        if let Some(l) = &self.log {
            for line in fs::read_to_string(l).unwrap_or_default().lines() {
                s.push_str(&format!("{}: {line}\n", self.name));
            }
            let _ = fs::remove_file(l);
        }
        s
    }
}

/// The pid of the process whose argv is `ctx queue work ... --worker NAME ...`.
pub fn find_worker(name: &str) -> Option<i32> {
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

/// Races `workers` (spawned by `spawn(slot, generation)`) over the queue `q` holding JOBS jobs (more
/// are published while its signals are owed), killing and stalling them; then checks the outcome.
///
/// `chaos(round)` runs once a round, for kills beyond the workers' (a daemon, a brick). A race
/// that has not finished within `limit` is stuck: it fails with what it left where.
pub fn race(
    q: &Queue,
    qdir: &Path,
    lease: Duration,
    mut spawn: impl FnMut(usize, usize) -> Worker,
    n: usize,
    mut chaos: impl FnMut(usize),
    limit: Duration,
) {
    let mut rng = StdRng::seed_from_u64(2026);
    let mut generation = 0;
    let mut next = |slot: usize| {
        generation += 1;
        spawn(slot, generation)
    };
    let mut workers: Vec<Worker> = (0..n).map(&mut next).collect();
    let (mut kills, mut stalls) = (0, 0);
    // Jobs whose request was put back in pending/ after their commit, as a move by link and
    // unlink stopped between the two (and then requeued) leaves it: run again, their second
    // commit must be refused.
    let mut copies: Vec<String> = Vec::new();
    // The jobs published: JOBS to begin with, more while the race still owes signals.
    let mut jobs = JOBS;
    let mut errors = String::new();
    // What each recovery did, to tell where a lost job went.
    let mut seen: Vec<String> = Vec::new();
    let start = Instant::now();
    let mut round = 0;
    let mut idle_rounds = 0;
    loop {
        round += 1;
        chaos(round);
        // Unreadable while chaos takes the filesystem away (a brick down: no quorum).
        let done = fs::read_dir(qdir.join("done")).map_or(0, |d| d.count() / 2);
        let empty = |d: &str| fs::read_dir(qdir.join(d)).is_ok_and(|mut r| r.next().is_none());
        // Done once every job is, and no copy waits in pending/ to be run and refused.
        // While signals are still owed, the queue never runs dry: more jobs are published.
        if (kills < 200 || stalls < 50) && done + 200 > jobs {
            for _ in 0..200 {
                if q.publish(&format!("job-{jobs:05}.req.json"), format!("{{\"job\":{jobs}}}").as_bytes())
                    .is_err()
                {
                    break;
                }
                jobs += 1;
            }
        }
        if done >= jobs && empty("pending") {
            // Signals count only when delivered: a race whose jobs were all done first did not
            // do what it claims.
            assert!(
                kills >= 200 && stalls >= 50,
                "every job was done after only {kills} kill -9 and {stalls} stalls (200 and 50 wanted)"
            );
            break;
        }
        // Nothing left to work while jobs are missing: lost, no need to wait for the limit.
        let idle = done > 0 && done < jobs && empty("pending") && empty("claimed");
        idle_rounds = if idle { idle_rounds + 1 } else { 0 };
        if start.elapsed() > limit || idle_rounds > 20 {
            let left = stuck(qdir, jobs);
            panic!(
                "stuck: {done} done, {kills} kills, {stalls} stalls\n{left}\nrecoveries:\n{}\nworkers said:\n{errors}",
                about(&left, &seen, &errors),
                errors = errors.lines().filter(|l| !l.contains(": done job-")).collect::<Vec<_>>().join("\n")
            );
        }
        if copies.len() < 10 && round % 20 == 0 {
            // While chaos takes the filesystem away the copy waits for a later round.
            let committed: Vec<String> = fs::read_dir(qdir.join("done"))
                .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
                .unwrap_or_default();
            if let Some(job) = committed.iter().find(|j| j.ends_with(".req.json") && !copies.contains(j))
                && let Ok(req) = fs::read(qdir.join("done").join(job))
            {
                // Written aside, then linked in: a reader of pending/ never sees it half made.
                let tmp = qdir.join("inbox").join(format!(".copy.{job}"));
                if fs::write(&tmp, req).is_ok() && fs::hard_link(&tmp, qdir.join("pending").join(job)).is_ok()
                {
                    copies.push(job.clone());
                }
                let _ = fs::remove_file(&tmp);
            }
        }
        // Workers that found the queue empty start again first, so that a signal finds one.
        for (j, w) in workers.iter_mut().enumerate() {
            if w.started.try_wait().unwrap().is_some() {
                let old = std::mem::replace(w, next(j));
                errors.push_str(&old.output());
            }
        }
        let i = rng.random_range(0..workers.len());
        if stalls < 50 && rng.random_bool(0.2) {
            if workers[i].signal(Signal::STOP) {
                std::thread::sleep(lease + Duration::from_millis(rng.random_range(20..80)));
                recover(q, round, &mut seen, &mut errors);
                // One that had ended as it was stopped (a zombie takes the signal) was not
                // stalled: not counted.
                if workers[i].signal(Signal::CONT) {
                    stalls += 1;
                }
            }
        } else if kills < 200 {
            std::thread::sleep(Duration::from_millis(rng.random_range(2..20)));
            let killed = workers[i].signal(Signal::KILL);
            let old = std::mem::replace(&mut workers[i], next(i));
            errors.push_str(&old.output());
            kills += usize::from(killed);
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
            recover(q, round, &mut seen, &mut errors);
        }
    }
    for mut w in workers {
        let _ = w.signal(Signal::KILL);
        errors.push_str(&w.output());
    }
    std::thread::sleep(lease);
    let r = q.reconcile(Policy::Requeue).unwrap();
    assert!(r.requeued.is_empty(), "jobs requeued after all were done: {:?}", r.requeued);
    // A job run again from its copy keeps its second result in its claim, for inspection, and
    // recovery says so; nothing else is a conflict.
    let copied = |what: &str| copies.iter().any(|j| what.contains(j.as_str()));
    let others: Vec<&String> = r.conflicts.iter().filter(|c| !copied(c)).collect();
    assert!(others.is_empty(), "{others:?}");
    // A second commit is refused only for the jobs put back after their commit, or to a worker
    // through `/ctx` (its paths say so) that was stalled past its lease and fenced: the kernel's
    // cached entries (for up to their timeout) still show it its request and its claim, so the
    // VFS answers EEXIST for the taken destination where the storage itself would say its
    // request is gone, and no lookup through the cache can tell it otherwise. Its commit is
    // refused either way; that every job is committed once is checked below.
    for line in errors.lines().filter(|l| l.contains("already exists")) {
        assert!(
            copies.iter().any(|j| line.contains(j.as_str())) || line.contains(": /ctx/"),
            "a commit refused that had no copy: {line}"
        );
    }
    assert!(!copies.is_empty(), "copies of committed jobs were put back");

    let l = q.list().unwrap();
    assert!(
        l.pending.is_empty()
            && l.claimed.iter().all(|c| copied(c))
            && l.failed.is_empty()
            && l.problems.is_empty(),
        "{l:?}"
    );
    if l.done.len() != jobs {
        let left = stuck(qdir, jobs);
        panic!("jobs lost: {} done\n{left}\nrecoveries:\n{}", l.done.len(), about(&left, &seen, &errors));
    }
    // Commit once: every worker's `done J` lines are kept (its log), each job has at most one
    // across all workers and hosts, and its result is the one that worker wrote (the job
    // writes its request, then the worker's name and a nonce: its own pid).
    let mut committed: std::collections::HashMap<String, Vec<String>> = std::collections::HashMap::new();
    for line in errors.lines() {
        if let Some((worker, rest)) = line.split_once(": done ") {
            committed.entry(rest.trim().to_owned()).or_default().push(worker.to_owned());
        }
    }
    let twice: Vec<_> = committed.iter().filter(|(_, w)| w.len() > 1).collect();
    assert!(twice.is_empty(), "jobs committed more than once: {twice:?}");
    // A kill between a commit and its line loses the line: at most one per kill. Fewer lines
    // than that are lines not kept (a worker whose output is thrown away).
    assert!(
        committed.len() + kills >= jobs,
        "{} done lines kept for {jobs} jobs and {kills} kills",
        committed.len()
    );
    for i in 0..jobs {
        let job = format!("job-{i:05}.req.json");
        let req = fs::read(qdir.join("done").join(&job)).unwrap();
        let res = fs::read(qdir.join("done").join(format!("{job}.result"))).unwrap();
        assert!(res.starts_with(&req), "{job}: the result beside it is its own");
        let by = String::from_utf8_lossy(&res[req.len()..]).trim().to_owned();
        let mut words = by.split(' ');
        let (Some("by"), Some(worker), Some(nonce)) = (words.next(), words.next(), words.next()) else {
            panic!("{job}: a result without its worker and nonce: {by:?}");
        };
        if let Some(w) = committed.get(&job) {
            assert_eq!(w, &[worker.to_owned()], "{job}: committed by {w:?}, but the result is {worker}'s");
        }
        assert!(nonce.parse::<u32>().is_ok(), "{job}: a nonce that is the job's pid: {by}");
    }
    assert!(!committed.is_empty(), "the workers' done lines were kept");
    let left: Vec<_> = fs::read_dir(qdir.join("claimed"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|c| !copied(c))
        .collect();
    assert!(left.is_empty(), "claimed/ holds more than the second runs of copies: {left:?}");
    eprintln!(
        "{jobs} jobs, {n} workers, {kills} kill -9, {stalls} stalls, {} committed jobs put back, {:?}",
        copies.len(),
        start.elapsed()
    );
}

/// What a stuck race left: every job not both in `done/` with its result, where its entries
/// are, and what is in `claimed/` and `lease/`.
fn stuck(qdir: &Path, jobs: usize) -> String {
    let names = |d: &str| -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(qdir.join(d))
            .map(|r| r.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        v.sort();
        v
    };
    let done = names("done");
    let pending = names("pending");
    // Every entry of the queue below its state directories, for finding a job's files.
    let mut all = Vec::new();
    for d in ringfs::queue::DIRS {
        for n in names(d) {
            all.push(format!("{d}/{n}"));
            for m in names(&format!("{d}/{n}")) {
                all.push(format!("{d}/{n}/{m}"));
            }
        }
    }
    let mut out = String::new();
    for i in 0..jobs {
        let job = format!("job-{i:05}.req.json");
        let (req, res) = (done.contains(&job), done.contains(&format!("{job}.result")));
        if !(req && res || pending.contains(&job)) {
            let at: Vec<&String> = all.iter().filter(|p| p.contains(&job)).collect();
            out.push_str(&format!("{job}: request in done/ {req}, result in done/ {res}; entries: {at:?}\n"));
        }
    }
    for d in ["inbox", "pending", "claimed", "lease", "failed"] {
        let n = names(d);
        out.push_str(&format!("{d}/ ({}): {:?}\n", n.len(), &n[..n.len().min(20)]));
        if d == "claimed" || d == "lease" {
            for c in n.iter().take(20) {
                out.push_str(&format!("  {d}/{c}: {:?}\n", names(&format!("{d}/{c}"))));
            }
        }
    }
    out
}

/// A recovery during the race: what it did, or (while chaos takes the filesystem's quorum
/// away, say) why it could not; the last recovery, after the race, must succeed.
fn recover(q: &Queue, round: usize, seen: &mut Vec<String>, errors: &mut String) {
    // As an operator after crashes: workers killed between their claim and their lease leave
    // incomplete pairs, which only an explicit reconciliation settles.
    match q.reconcile(Policy::Requeue) {
        Ok(r) => seen.push(format!("round {round}: {r:?}")),
        Err(e) => errors.push_str(&format!("recovery in round {round}: {e}\n")),
    }
}

/// The recoveries and workers' lines that name a job `left` lists as missing.
fn about(left: &str, seen: &[String], errors: &str) -> String {
    let jobs: Vec<&str> = left
        .lines()
        .filter(|l| l.contains(": request in done/"))
        .filter_map(|l| l.split(':').next())
        .collect();
    let mut out = String::new();
    for j in jobs.iter().take(10) {
        for l in seen.iter().map(String::as_str).chain(errors.lines()) {
            if l.contains(j) {
                out.push_str(&format!("{j}: {}\n", pick(l, j)));
            }
        }
    }
    out
}

/// The part of a long `Recovered` line around `job`.
fn pick(line: &str, job: &str) -> String {
    let at = line.find(job).unwrap_or(0);
    let from = line[..at].rfind(['[', ',']).unwrap_or(0);
    let round = line.split(':').next().unwrap_or("");
    format!("{round}: ...{}", &line[from..(at + job.len() + 60).min(line.len())])
}

/// Publishes [`JOBS`] jobs.
pub fn publish_all(q: &Queue) {
    for i in 0..JOBS {
        q.publish(&format!("job-{i:05}.req.json"), format!("{{\"job\":{i}}}").as_bytes()).unwrap();
    }
}

/// The job each worker runs: the request, then `by WORKER NONCE` (the worker's name, given
/// as the next argument, and the job process's pid), so that every result says who wrote it.
pub const JOB: [&str; 3] = ["/bin/sh", "-c", "cat; printf '\\nby %s %s\\n' \"$0\" \"$$\""];

/// A worker on a host mount: `ctx queue work` on `q`.
pub fn host_worker(q: &Path, name: String) -> Worker {
    // What it did (`done J`, `fenced J`), to a file nobody has to drain while the race runs.
    // One file per worker process: a worker's name may come back in its next generation.
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let log = std::env::temp_dir().join(format!("race-{}-{name}-{n}.log", std::process::id()));
    let started = Command::new(crate::bin("ctx"))
        .args(["queue", "work"])
        .arg(q)
        .args(["--worker", &name, "--no-lock", "--"])
        .args(JOB)
        .arg(&name)
        .stdout(Stdio::from(fs::File::create(&log).unwrap()))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    Worker { started, name, sandboxed: false, log: Some(log) }
}
