//! Disk ceilings per agent (`agent/<n>.d/limits`: `disk`, `files`), counted by the daemon.
//!
//! What an agent writes through `/ctx` is charged to it: file growth (by size: a sparse file
//! costs its size), session log appends, and each file, directory, link or node it makes in its
//! home or a shared space; what it removes of its own is credited. Over a ceiling, its writes
//! and creations are answered EDQUOT, and nobody else's: every view of the agent (one per run)
//! shares one account, made when the first view of a run whose limits name a ceiling starts,
//! from a count of its files under `home/<uid>/` then (sizes and entries, no link followed).
//! A ceiling is checked before a write; growth is charged as the write asks, whether or not the
//! storage takes all of it. The workspace (a bind mount of a host directory) is not served by
//! the daemon and is not counted.

use std::collections::HashMap;
use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};

use crate::errno::{Why, err};
use crate::storage::Storage;

/// No ceiling.
const NONE: u64 = u64::MAX;
/// The most directories a count of a home walks into (a deeper tree is counted to there).
const WALK_DIRS: usize = 1 << 20;

/// The accounts of one daemon's agents, by agent name.
#[derive(Debug, Default)]
pub struct Quotas {
    by_agent: Mutex<HashMap<String, Arc<Account>>>,
}

/// One agent's usage and ceilings.
#[derive(Debug)]
pub struct Account {
    /// The agent's uid: what it removes is credited when the file was its own.
    pub uid: u32,
    disk: AtomicU64,
    files: AtomicU64,
    bytes: AtomicI64,
    count: AtomicI64,
}

impl Quotas {
    /// The account of `agent` (uid `uid`) under `limits`, made (and its home counted) when
    /// this is its first view with a ceiling; `None` when the limits name none.
    pub fn account(
        &self,
        storage: &Storage,
        agent: &str,
        uid: u32,
        limits: &policy::limits::Limits,
    ) -> Option<Arc<Account>> {
        if limits.disk.is_none() && limits.files.is_none() {
            return None;
        }
        let mut all = self.by_agent.lock().unwrap_or_else(|p| p.into_inner());
        let a = all.entry(agent.to_owned()).or_insert_with(|| {
            let (bytes, count) = count_home(storage, uid);
            Arc::new(Account {
                uid,
                disk: AtomicU64::new(NONE),
                files: AtomicU64::new(NONE),
                bytes: AtomicI64::new(bytes),
                count: AtomicI64::new(count),
            })
        });
        // The limits as this run's start found them.
        a.disk.store(limits.disk.unwrap_or(NONE), Ordering::Relaxed);
        a.files.store(limits.files.unwrap_or(NONE), Ordering::Relaxed);
        Some(Arc::clone(a))
    }
}

/// The account of the agent a view serves, from its `limits` and `uid` controls as they are
/// now; `None` when its limits name no ceiling (or cannot be read: the launch refuses a run
/// whose limits do not parse).
pub fn for_view(quotas: &Quotas, storage: &Storage, agent: &str) -> Option<Arc<Account>> {
    let read = |control: &str| -> Option<Vec<u8>> {
        use std::io::Read;
        let rel = Path::new("agent").join(format!("{agent}.d")).join(control);
        let fd = storage.open_rel(&rel, OFlags::RDONLY, 0).ok()?;
        let mut v = Vec::new();
        std::fs::File::from(fd).take(policy::controls::CONTROL_MAX as u64).read_to_end(&mut v).ok()?;
        Some(v)
    };
    let limits = policy::limits::parse(&read("limits").unwrap_or_default()).ok()?;
    let uid: u32 = String::from_utf8(read("uid")?).ok()?.trim().parse().ok()?;
    quotas.account(storage, agent, uid, &limits)
}

fn over(used: &AtomicI64, add: u64, limit: u64) -> bool {
    let add = i64::try_from(add).unwrap_or(i64::MAX);
    let before = used.fetch_add(add, Ordering::Relaxed);
    if limit != NONE && before.saturating_add(add) > i64::try_from(limit).unwrap_or(i64::MAX) && add > 0 {
        used.fetch_sub(add, Ordering::Relaxed);
        return true;
    }
    false
}

impl Account {
    /// Charges `bytes` of growth; EDQUOT (nothing charged) when it would pass the ceiling.
    pub fn grow(&self, bytes: u64) -> io::Result<()> {
        if over(&self.bytes, bytes, self.disk.load(Ordering::Relaxed)) {
            return Err(err(Why::OverQuota));
        }
        Ok(())
    }

    /// Credits `bytes` (a file shrunk or removed, a charge not used).
    pub fn shrink(&self, bytes: u64) {
        self.bytes.fetch_sub(i64::try_from(bytes).unwrap_or(i64::MAX), Ordering::Relaxed);
    }

    /// Charges one new file; EDQUOT when it would pass the ceiling.
    pub fn add_file(&self) -> io::Result<()> {
        if over(&self.count, 1, self.files.load(Ordering::Relaxed)) {
            return Err(err(Why::OverQuota));
        }
        Ok(())
    }

    /// Credits one file.
    pub fn remove_file(&self) {
        self.count.fetch_sub(1, Ordering::Relaxed);
    }

    /// Bytes and files charged now.
    pub fn usage(&self) -> (i64, i64) {
        (self.bytes.load(Ordering::Relaxed), self.count.load(Ordering::Relaxed))
    }
}

/// The sizes of the regular files and the number of entries under `home/<uid>/`, no link
/// followed, each directory opened beneath the one above it.
fn count_home(storage: &Storage, uid: u32) -> (i64, i64) {
    let Ok(top) = storage.dir(&Path::new("home").join(uid.to_string())) else { return (0, 0) };
    let (mut bytes, mut count) = (0i64, 0i64);
    let mut stack: Vec<OwnedFd> = vec![top];
    let mut dirs = 0;
    while let Some(dir) = stack.pop() {
        let Ok(entries) = rustix::fs::Dir::read_from(&dir) else { continue };
        for e in entries.flatten() {
            let name = e.file_name();
            if name.to_bytes() == b"." || name.to_bytes() == b".." {
                continue;
            }
            let Ok(st) = rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW) else { continue };
            count += 1;
            match FileType::from_raw_mode(st.st_mode) {
                FileType::RegularFile => bytes += st.st_size,
                FileType::Directory if dirs < WALK_DIRS => {
                    dirs += 1;
                    let flags = OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC;
                    if let Ok(fd) = rustix::fs::openat(&dir, name, flags, Mode::empty()) {
                        stack.push(fd);
                    }
                }
                _ => {}
            }
        }
    }
    (bytes, count)
}

impl super::CtxFs {
    /// Charges the growth of the file `fd` to `end` bytes to the view's agent (nothing without
    /// a ceiling); the bytes charged, to credit back when the write fails.
    pub(super) fn charge_to(&self, fd: impl std::os::fd::AsFd, end: u64) -> io::Result<u64> {
        let Some(q) = &self.quota else { return Ok(0) };
        let size = u64::try_from(rustix::fs::fstat(fd)?.st_size).unwrap_or(0);
        let growth = end.saturating_sub(size);
        q.grow(growth)?;
        Ok(growth)
    }

    /// Charges `bytes` (a session log's append) to the view's agent.
    pub(super) fn charge_bytes(&self, bytes: u64) -> io::Result<()> {
        self.quota.as_ref().map_or(Ok(()), |q| q.grow(bytes))
    }

    /// Credits `bytes` back to the view's agent.
    pub(super) fn credit_bytes(&self, bytes: u64) {
        if let Some(q) = &self.quota {
            q.shrink(bytes);
        }
    }

    /// Runs `make` (which makes one file, directory, node or link) charged to the view's
    /// agent: EDQUOT before it when the agent has all the files its ceiling allows.
    pub(super) fn charged<T>(&self, make: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
        let Some(q) = &self.quota else { return make() };
        q.add_file()?;
        make().inspect_err(|_| q.remove_file())
    }

    /// Credits what a removal of `st` gave back, when it was the agent's own.
    pub(super) fn credit_removal(&self, st: &rustix::fs::Stat) {
        let Some(q) = &self.quota else { return };
        if st.st_uid != q.uid {
            return;
        }
        q.remove_file();
        if FileType::from_raw_mode(st.st_mode) == FileType::RegularFile && st.st_nlink <= 1 {
            q.shrink(u64::try_from(st.st_size).unwrap_or(0));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ceiling_refuses_growth_past_it_and_credits_come_back() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("home/1000/sub")).unwrap();
        std::fs::write(d.path().join("home/1000/sub/f"), vec![0u8; 1000]).unwrap();
        std::os::unix::fs::symlink("/etc", d.path().join("home/1000/l")).unwrap();
        let storage = Storage::open(d.path()).unwrap();
        let limits = policy::limits::Limits { disk: Some(4096), files: Some(5), ..Default::default() };
        let q = Quotas::default();
        let a = q.account(&storage, "a", 1000, &limits).unwrap();
        assert_eq!(a.usage(), (1000, 3), "sub, sub/f and the link; the link not followed");
        a.grow(3000).unwrap();
        assert_eq!(a.grow(97).unwrap_err().raw_os_error(), Some(Why::OverQuota.errno()));
        assert_eq!(a.usage().0, 4000, "a refused charge is not kept");
        a.shrink(1000);
        a.grow(97).unwrap();
        a.add_file().unwrap();
        a.add_file().unwrap();
        assert!(a.add_file().is_err());
        a.remove_file();
        a.add_file().unwrap();
        assert!(
            q.account(&storage, "b", 1000, &policy::limits::Limits::default()).is_none(),
            "no ceiling, no account"
        );
    }
}
