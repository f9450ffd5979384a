//! (d) Worker processes race over a queue while being killed and stalled: 4 workers
//! (`ctx queue work ... -- JOB`, a job that writes its request, its worker's name and a nonce),
//! 2,000 jobs, at least 200 kill -9 and 50 stalls past the
//! lease (SIGSTOP, recover, SIGCONT). No job lost, none committed twice, every result beside its
//! request, nothing left in pending/ or claimed/.
//!
//! Twice: on a plain directory, and through `/ctx/shared/<space>/queue` of a real mount, two
//! workers on the host and two in agent sandboxes (each its own uid, granted `shared:<space>
//! write`, working through its own view), the recoverer on the host mount.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use ringfs::queue::Queue;
use tests::race::{JOB, Worker, host_worker, publish_all, race};
use tests::served::Served;

#[test]
fn workers_killed_and_stalled_lose_nothing_and_commit_once() {
    let lease = Duration::from_millis(150);
    let d = tempfile::tempdir_in("/var/tmp").unwrap();
    let qdir = d.path().join("queue");
    let q = Queue::open(&qdir, lease).unwrap();
    publish_all(&q);
    race(&q, &qdir, lease, |i, _| host_worker(&qdir, format!("w{i}")), 4, |_| {}, Duration::from_secs(600));
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
        // A run waited on by a program writes to that program's streams: a file here, which
        // nothing has to drain while the race runs.
        let log = work.join(format!("{name}.log"));
        let out = fs::File::create(&log).unwrap();
        let started = Command::new(tests::bin("ctx"))
            .args(["agent", "start", agent, "--session", &name, "--wait", "--ctx"])
            .arg(&s.mnt)
            .arg("--control")
            .arg(&s.control)
            .arg("--cwd")
            .arg(&work)
            .args(["--", "/bin/sh", "-c"])
            // Its `done J` lines go to the log with the rest: the race counts every commit.
            .arg(format!(
                "exec /ctx/bin/ctx queue work /ctx/shared/race/queue --worker {name} --no-lock -- {} {} '{}' {name}",
                JOB[0],
                JOB[1],
                JOB[2].replace('\'', "'\\''")
            ))
            .stdout(Stdio::from(out.try_clone().unwrap()))
            .stderr(Stdio::from(out))
            .spawn()
            .unwrap();
        Worker { started, name, sandboxed: true, log: Some(log) }
    };
    race(&q, &qdir, lease, spawn, 4, |_| {}, Duration::from_secs(600));
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
