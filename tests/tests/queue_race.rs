//! (d) Worker processes race over a queue while being killed and stalled: 4 workers
//! (`ctx queue work ... -- /bin/cat`), 2,000 jobs, at least 200 kill -9 and 50 stalls past the
//! lease (SIGSTOP, recover, SIGCONT). No job lost, none committed twice, every result beside its
//! request, nothing left in pending/ or claimed/.

use std::fs;
use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use ringfs::queue::{Policy, Queue};
use rustix::process::{Pid, Signal, kill_process};

const JOBS: usize = 2000;
const LEASE: Duration = Duration::from_millis(150);

fn spawn_worker(q: &Path, i: usize) -> Child {
    Command::new(tests::bin("ctx"))
        .args([
            "queue",
            "work",
            q.to_str().unwrap(),
            "--worker",
            &format!("w{i}"),
            "--no-lock",
            "--",
            "/bin/cat",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn signal(c: &Child, s: Signal) {
    let _ = kill_process(Pid::from_raw(c.id() as i32).unwrap(), s);
}

fn stderr_of(mut c: Child) -> String {
    let mut s = String::new();
    if let Some(mut e) = c.stderr.take() {
        let _ = e.read_to_string(&mut s);
    }
    let _ = c.wait();
    s
}

#[test]
fn workers_killed_and_stalled_lose_nothing_and_commit_once() {
    let d = tempfile::tempdir_in("/var/tmp").unwrap();
    let qdir = d.path().join("queue");
    let q = Queue::open(&qdir, LEASE).unwrap();
    for i in 0..JOBS {
        q.publish(&format!("job-{i:05}.req.json"), format!("{{\"job\":{i}}}").as_bytes()).unwrap();
    }
    let mut rng = StdRng::seed_from_u64(2026);
    let mut workers: Vec<Child> = (0..4).map(|i| spawn_worker(&qdir, i)).collect();
    let (mut kills, mut stalls) = (0, 0);
    let mut errors = String::new();
    let start = Instant::now();
    loop {
        let done = fs::read_dir(qdir.join("done")).unwrap().count() / 2;
        if done >= JOBS && kills >= 200 && stalls >= 50 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(600),
            "stuck: {done} done, {kills} kills, {stalls} stalls"
        );
        let i = rng.random_range(0..workers.len());
        if stalls < 50 && rng.random_bool(0.2) {
            signal(&workers[i], Signal::STOP);
            std::thread::sleep(LEASE + Duration::from_millis(rng.random_range(20..80)));
            q.recover(Policy::Requeue).unwrap();
            signal(&workers[i], Signal::CONT);
            stalls += 1;
        } else if kills < 200 {
            std::thread::sleep(Duration::from_millis(rng.random_range(5..40)));
            signal(&workers[i], Signal::KILL);
            let old = std::mem::replace(&mut workers[i], spawn_worker(&qdir, i));
            errors.push_str(&stderr_of(old));
            kills += 1;
        } else {
            std::thread::sleep(Duration::from_millis(100));
        }
        // Restart workers that found the queue empty, and recover killed workers' claims.
        for (j, w) in workers.iter_mut().enumerate() {
            if w.try_wait().unwrap().is_some() {
                let old = std::mem::replace(w, spawn_worker(&qdir, j));
                errors.push_str(&stderr_of(old));
            }
        }
        if rng.random_bool(0.3) {
            q.recover(Policy::Requeue).unwrap();
        }
    }
    for w in workers {
        signal(&w, Signal::KILL);
        errors.push_str(&stderr_of(w));
    }
    std::thread::sleep(LEASE);
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
    eprintln!("{JOBS} jobs, {kills} kill -9, {stalls} stalls, {:?}", start.elapsed());
}
