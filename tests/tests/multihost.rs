//! Shared spaces beyond one host, on GlusterFS (`tests::gluster`): the properties the queue
//! protocol relies on, checked on the volume through two client mounts as two hosts see it.

use std::fs;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;

use rustix::fs::{FlockOperation, RenameFlags};
use rustix::io::Errno;
use tests::gluster::Gluster;

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
        assert!(
            t.elapsed() < std::time::Duration::from_secs(5),
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
        assert!(t.elapsed() < std::time::Duration::from_secs(5), "the lock was never released");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }

    // fsync of files and directories is served (durability across a power cut is GlusterFS's
    // replication's to keep; this machine cannot cut it).
    let f = fs::OpenOptions::new().create(true).truncate(true).write(true).open(a.join("synced")).unwrap();
    f.sync_all().unwrap();
    fs::File::open(a).unwrap().sync_all().unwrap();
    eprintln!("glusterfs: NOREPLACE refused; link, exclusive mkdir, flock and fsync hold across mounts");

    // So the queue refuses to work there, clearly, and leaves nothing behind.
    fs::write(a.join("j.req.json"), b"{}").unwrap();
    let out = std::process::Command::new(tests::bin("ctx"))
        .args(["queue", "publish"])
        .arg(a.join("queue"))
        .arg(a.join("j.req.json"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(69), "{}", tests::shown(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("RENAME_NOREPLACE"), "{}", tests::shown(&out));
    let left: Vec<_> = fs::read_dir(a.join("queue/inbox")).unwrap().flatten().collect();
    assert!(left.is_empty(), "the publish left {left:?}");
}
