//! The filesystem's own requests, served without a kernel: listings and the buffers kept
//! between them.

use std::ffi::CString;
use std::sync::{Arc, Mutex};

use fuse_backend_rs::api::filesystem::{Context, FileSystem};

use super::{
    Config, CtxFs, Handle, LISTING_ENTRIES_KEPT, LISTING_NAMES_KEPT, Listing, ROOT, lock, spare_dirs,
};

fn storage() -> (tempfile::TempDir, CtxFs) {
    let dir = tempfile::tempdir().unwrap();
    let fs = CtxFs::new(Config::new(dir.path().to_owned(), Vec::new())).unwrap();
    (dir, fs)
}

/// The inode of `path` (names below the root), looked up one name at a time.
fn look(fs: &CtxFs, path: &str) -> u64 {
    path.split('/').fold(ROOT, |parent, name| {
        fs.lookup(&Context::default(), parent, &CString::new(name).unwrap()).unwrap().inode
    })
}

/// The names a READDIR of handle `h` of `ino` answers, from offset 0.
fn names(fs: &CtxFs, ino: u64, h: u64) -> std::io::Result<Vec<String>> {
    let mut seen = Vec::new();
    fs.readdir(&Context::default(), ino, h, 4096, 0, &mut |e| {
        seen.push(String::from_utf8_lossy(e.name).into_owned());
        Ok(1)
    })?;
    Ok(seen)
}

#[test]
fn a_listing_that_failed_partway_is_never_served_later() {
    let (dir, fs) = storage();
    let d = dir.path().join("home/0/d");
    std::fs::create_dir_all(&d).unwrap();
    let ino = look(&fs, "home/0/d");
    let (h, _) = fs.opendir(&Context::default(), ino, 0).unwrap();
    let h = h.unwrap();
    // The directory is gone when the listing is taken: it fails after `.` and `..`.
    std::fs::remove_dir(&d).unwrap();
    assert!(names(&fs, ino, h).is_err());
    // Back, with an entry: the next READDIR of the same handle lists again.
    std::fs::create_dir(&d).unwrap();
    std::fs::write(d.join("x"), "").unwrap();
    assert_eq!(names(&fs, ino, h).unwrap(), [".", "..", "x"]);
    fs.releasedir(&Context::default(), ino, 0, h).unwrap();
}

#[test]
fn a_kept_listing_shrinks_to_its_limits() {
    let (dir, fs) = storage();
    let d = dir.path().join("home/0/big");
    std::fs::create_dir_all(&d).unwrap();
    // More entries and more bytes of names than a kept listing keeps room for.
    for i in 0..LISTING_ENTRIES_KEPT + 500 {
        std::fs::write(d.join(format!("{i:0>60}")), "").unwrap();
    }
    let ino = look(&fs, "home/0/big");
    let (h, _) = fs.opendir(&Context::default(), ino, 0).unwrap();
    let h = h.unwrap();
    assert_eq!(names(&fs, ino, h).unwrap().len(), LISTING_ENTRIES_KEPT + 502);
    let handle = fs.handle(h).unwrap();
    let kept = Arc::downgrade(&handle);
    drop(handle);
    fs.releasedir(&Context::default(), ino, 0, h).unwrap();
    // Kept for the next open (a concurrent open may have taken it since: then it was
    // cleared and shrunk before that).
    let handle = kept.upgrade().expect("the closed directory's handle is kept");
    let Handle::Dir(l) = &*lock(&handle) else { panic!("a directory handle") };
    assert!(l.names.capacity() <= LISTING_NAMES_KEPT, "{} bytes of names kept", l.names.capacity());
    assert!(l.entries.capacity() <= LISTING_ENTRIES_KEPT, "{} entries kept", l.entries.capacity());
    // So is a listing that grew elsewhere, handed back directly.
    let big = Listing {
        names: Vec::with_capacity(4 * LISTING_NAMES_KEPT),
        entries: Vec::with_capacity(4 * LISTING_ENTRIES_KEPT),
        taken: true,
    };
    let h = Arc::new(Mutex::new(Handle::Dir(big)));
    let kept = Arc::downgrade(&h);
    fs.spare_dir(h);
    if let Some(h) = kept.upgrade() {
        let Handle::Dir(l) = &*lock(&h) else { panic!("a directory handle") };
        assert!(l.names.capacity() <= LISTING_NAMES_KEPT && l.entries.capacity() <= LISTING_ENTRIES_KEPT);
        assert!(!l.taken, "a kept listing is listed again");
    } else {
        // Not kept only when the spare list was full.
        assert!(lock(spare_dirs()).len() >= super::SPARE_DIRS);
    }
}

#[test]
fn origins_say_where_a_file_comes_from() {
    let o = |p: &str| super::origin_of(std::path::Path::new(p));
    assert_eq!(o("home/1000/agent/coder/session/s1/events.jsonl").as_deref(), Some("session:coder/s1"));
    assert_eq!(o("shared/proj/agent/rev/session/s2/context/refs.jsonl").as_deref(), Some("session:rev/s2"));
    assert_eq!(o("home/1000/notes.txt").as_deref(), Some("home:1000"));
    assert_eq!(o("shared/proj/input/a.png").as_deref(), Some("shared:proj"));
    assert_eq!(o("tool/fs.read.d/log").as_deref(), Some("tool:fs.read"));
    assert_eq!(o("agent/coder.sock").as_deref(), Some("agent:coder"));
    assert_eq!(o("model/p/m.d/status").as_deref(), Some("model:p/m"));
    assert_eq!(o("status"), None);
}

/// A request whose caller has the id -1 (none; found by the `ring_entry` fuzz target, where a
/// MKDIR with uid -1 made the server panic) is refused before anything is made, and a SETATTR
/// that asks for owner -1 likewise.
#[test]
fn a_caller_or_owner_of_id_minus_one_is_refused_and_nothing_is_made() {
    let (dir, fs) = storage();
    std::fs::create_dir_all(dir.path().join("home/0")).unwrap();
    let home = look(&fs, "home/0");
    let nobody = Context { uid: u32::MAX, gid: 0, pid: 1 };
    let name = CString::new("d").unwrap();
    let e = fs.mkdir(&nobody, home, &name, 0o755, 0).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(crate::errno::Why::Invalid.errno()));
    let e = fs.symlink(&Context { uid: 0, gid: u32::MAX, pid: 1 }, &name, home, &name).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(crate::errno::Why::Invalid.errno()));
    assert!(!dir.path().join("home/0/d").exists());
    let d = fs.mkdir(&Context::default(), home, &name, 0o755, 0).unwrap();
    let (mut attr, _) = fs.getattr(&Context::default(), d.inode, None).unwrap();
    attr.st_uid = u32::MAX;
    let valid = fuse_backend_rs::api::filesystem::SetattrValid::UID;
    let e = fs.setattr(&Context::default(), d.inode, attr, None, valid).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(crate::errno::Why::Invalid.errno()));
}
