//! Shared spaces beyond one host, on GlusterFS (`tests::gluster`): the properties the queue
//! protocol relies on, checked on the volume through two client mounts as two hosts see it.

use std::fs;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::Duration;

use ringfs::queue::Queue;
use rustix::process::{Pid, Signal, kill_process};
use tests::race::{host_worker, publish_all, race};
use tests::served::Served;

use rustix::fs::{FlockOperation, RenameFlags};
use rustix::io::Errno;
use tests::gluster::{Bind, Gluster};

/// What docs/deployment.md lists, checked on the volume.
#[test]
fn the_queues_properties_on_glusterfs() {
    let g = Gluster::start();
    let [a, b] = &g.mounts;
    // Both mounts are one volume.
    fs::write(a.join("seen"), b"from a\n").unwrap();
    assert_eq!(fs::read(b.join("seen")).unwrap(), b"from a\n");

    // Publishing without replacing: renameat2(RENAME_NOREPLACE) is refused outright here...
    fs::write(a.join("x"), b"x").unwrap();
    let da = fs::File::open(a).unwrap();
    let noreplace = rustix::fs::renameat_with(da.as_fd(), "x", da.as_fd(), "y", RenameFlags::NOREPLACE);
    assert_eq!(noreplace, Err(Errno::INVAL), "GlusterFS 10 refuses RENAME_NOREPLACE");
    // ...a hard link within the mount is the exclusive publish (EEXIST on a taken name, seen from
    // the other mount too), and a plain rename within a directory is atomic.
    fs::hard_link(a.join("x"), a.join("y")).unwrap();
    assert_eq!(fs::metadata(b.join("y")).unwrap().ino(), fs::metadata(b.join("x")).unwrap().ino());
    let taken = fs::hard_link(b.join("x"), b.join("seen")).unwrap_err();
    assert_eq!(taken.raw_os_error(), Some(libc::EEXIST));
    fs::rename(a.join("y"), a.join("z")).unwrap();
    // The other mount's client caches may show the old name for a moment; the protocol decides
    // by what the volume does (link, mkdir, rename), never by a lookup.
    let t = std::time::Instant::now();
    while b.join("y").exists() || !b.join("z").exists() {
        // A guard against a hang, not a measure: generous, whatever the machine's load.
        assert!(
            t.elapsed() < std::time::Duration::from_secs(30),
            "the rename never showed on the other mount"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    eprintln!("glusterfs: a rename showed on the other mount after {:?}", t.elapsed());

    // Exclusive mkdir across the two mounts.
    fs::create_dir(a.join("claim")).unwrap();
    assert_eq!(fs::create_dir(b.join("claim")).unwrap_err().raw_os_error(), Some(libc::EEXIST));

    // A lease's flock holds across the mounts.
    fs::write(a.join("lease"), b"w").unwrap();
    let held = fs::File::open(a.join("lease")).unwrap();
    rustix::fs::flock(&held, FlockOperation::NonBlockingLockExclusive).unwrap();
    let other = fs::File::open(b.join("lease")).unwrap();
    assert_eq!(rustix::fs::flock(&other, FlockOperation::NonBlockingLockShared), Err(Errno::WOULDBLOCK));
    // Closing releases it (a FUSE release is sent after close returns).
    drop(held);
    let t = std::time::Instant::now();
    while rustix::fs::flock(&other, FlockOperation::NonBlockingLockShared) == Err(Errno::WOULDBLOCK) {
        // A guard against a hang, not a measure.
        assert!(t.elapsed() < std::time::Duration::from_secs(30), "the lock was never released");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }

    // fsync of files and directories is served (durability across a power cut is GlusterFS's
    // replication's to keep; this machine cannot cut it).
    let f = fs::OpenOptions::new().create(true).truncate(true).write(true).open(a.join("synced")).unwrap();
    f.sync_all().unwrap();
    fs::File::open(a).unwrap().sync_all().unwrap();
    eprintln!("glusterfs: NOREPLACE refused; link, exclusive mkdir, flock and fsync hold across mounts");

    // So the queue publishes by link and moves by a checked rename there: a job is published
    // once, and nothing is left in inbox/.
    fs::write(a.join("j.req.json"), b"{}").unwrap();
    let publish = || {
        std::process::Command::new(tests::bin("ctx"))
            .args(["queue", "publish"])
            .arg(a.join("queue"))
            .arg(a.join("j.req.json"))
            .output()
            .unwrap()
    };
    let out = publish();
    assert!(out.status.success(), "{}", tests::shown(&out));
    assert_eq!(fs::read(b.join("queue/pending/j.req.json")).unwrap(), b"{}");
    let again = publish();
    assert_eq!(again.status.code(), Some(1), "published twice: {}", tests::shown(&again));
    let left: Vec<_> = fs::read_dir(a.join("queue/inbox")).unwrap().flatten().collect();
    assert!(left.is_empty(), "the publish left {left:?}");
}

/// Two "hosts": two CortexFS daemons with storages of their own, each with one client mount of
/// the same GlusterFS volume bound as `shared/gq`. Workers on both hosts work one queue through
/// their own `/ctx` while workers, one daemon and one brick process are killed: none lost, none
/// committed twice.
#[test]
fn two_daemons_on_one_glusterfs_volume_lose_nothing_and_commit_once() {
    let lease = Duration::from_millis(1500);
    let g = Gluster::start();
    let mut hosts: Vec<(Bind, Served)> = g.hosts("gq");
    let qdirs: Vec<PathBuf> = hosts.iter().map(|(_, s)| s.p("shared/gq/queue")).collect();
    // Published on host A's mount of the volume; recovered through host A's daemon.
    let published = Queue::open(g.mounts[0].join("queue"), lease).unwrap();
    publish_all(&published);
    assert!(published.without_noreplace(), "GlusterFS 10 refuses RENAME_NOREPLACE");
    let q = Queue::open(&qdirs[0], lease).unwrap();
    let spawn = |i: usize, generation: usize| {
        let host = i / 2;
        host_worker(&qdirs[host], format!("{}{i}g{generation}", ["a", "b"][host]))
    };
    let brick = 2; // the volume is read-only while it is down (quorum: both bricks)
    let chaos = |round: usize| match round {
        40 => {
            let pid = g.brick_pid(brick).expect("brick process");
            let _ = kill_process(Pid::from_raw(pid).unwrap(), Signal::KILL);
            eprintln!("round {round}: killed brick {brick}");
        }
        120 => {
            g.start_volume();
            eprintln!("round {round}: brick {brick} back: {:?}", g.brick_pid(brick));
        }
        200 => {
            let s = &mut hosts[1].1;
            if let Some(mut c) = s.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
            std::thread::sleep(Duration::from_millis(300));
            s.spawn();
            eprintln!("round {round}: killed daemon B (kill -9) and started it again");
        }
        _ => {}
    };
    let t = std::time::Instant::now();
    race(&q, &qdirs[0], lease, spawn, 4, chaos, Duration::from_secs(1500));
    eprintln!("two hosts over glusterfs: {} jobs in {:?} with chaos", tests::race::JOBS, t.elapsed());
}

/// A result its worker moved beside the request on one host, which the other host's client
/// still resolves under its old name in the claim (GlusterFS answers the first lookup of a name
/// moved by another client from its own table, the next ones ENOENT): recovery on the other host
/// sees the move fail on the taken name, finds no such file in the claim any more, and the claim
/// does not list it. That is one result, not two.
#[test]
fn a_result_moved_on_one_host_is_no_second_result_on_the_other() {
    let g = Gluster::start();
    let [a, b] = &g.mounts;
    let on_b = Queue::open(b.join("queue"), Duration::ZERO).unwrap();
    // The other host has learnt that the volume refuses RENAME_NOREPLACE.
    on_b.publish("probe.req.json", b"{}").unwrap();
    assert!(on_b.without_noreplace(), "GlusterFS 10 refuses RENAME_NOREPLACE");
    let job = "j.req.json";
    let result = "j.req.json.result";
    // A committed job whose worker, on host A, wrote its result in the claim and died.
    let q = a.join("queue");
    fs::create_dir(q.join("claimed").join(job)).unwrap();
    fs::write(q.join("done").join(job), b"{}").unwrap();
    fs::write(q.join("claimed").join(job).join(result), b"{\"by\":\"a\"}").unwrap();
    // Host B sees the result in the claim; then host A's recovery moves it beside the request.
    assert_eq!(fs::read(b.join("queue/claimed").join(job).join(result)).unwrap(), b"{\"by\":\"a\"}");
    fs::rename(q.join("claimed").join(job).join(result), q.join("done").join(result)).unwrap();
    let r = on_b.recover(ringfs::queue::Policy::Requeue).unwrap();
    assert!(r.conflicts.is_empty(), "one result was taken for two: {r:?}");
    assert_eq!(fs::read(q.join("done").join(result)).unwrap(), b"{\"by\":\"a\"}");
    // (Asked by a listing: host A's client, too, answers a lookup of the removed name once.)
    let claims: Vec<_> = fs::read_dir(q.join("claimed")).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(claims.is_empty(), "the finished claim is removed: {claims:?} {r:?}");
}
