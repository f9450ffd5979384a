//! The inodes a connection's kernel knows: for each, the storage paths that reach it (hard
//! links share one), its kernel lookup count, the backing file's identity and stamp, and the
//! backing file kept open for it.

#[allow(clippy::wildcard_imports)]
use super::*;

/// The storage paths that reach an inode: one serves requests, more than one for hard links,
/// none once unlinked. Adding and removing one costs the same however many links there are.
#[derive(Debug, Default)]
pub(super) struct Paths {
    pub(super) first: Option<Arc<Path>>,
    pub(super) more: std::collections::HashSet<Arc<Path>>,
}

impl Paths {
    pub(super) fn one(p: Arc<Path>) -> Paths {
        Paths { first: Some(p), more: std::collections::HashSet::new() }
    }

    /// The path that serves requests.
    pub(super) fn first(&self) -> Option<&Arc<Path>> {
        self.first.as_ref().or_else(|| self.more.iter().next())
    }

    pub(super) fn is_empty(&self) -> bool {
        self.first.is_none() && self.more.is_empty()
    }

    pub(super) fn push(&mut self, p: Arc<Path>) {
        if self.first.is_none() {
            self.first = Some(p);
        } else {
            self.more.insert(p);
        }
    }

    pub(super) fn remove(&mut self, p: &Path) {
        if self.first.as_deref() == Some(p) {
            self.first = self.more.iter().next().cloned();
            if let Some(f) = &self.first {
                self.more.remove(f);
            }
        } else {
            self.more.remove(p);
        }
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &Arc<Path>> {
        self.first.iter().chain(self.more.iter())
    }
}

/// One inode the kernel knows.
#[derive(Debug)]
pub(super) struct Node {
    /// The storage paths that reach it: one serves requests, more than one for hard links,
    /// none once unlinked (then only its open handles reach it).
    pub(super) paths: Paths,
    /// A directory (others have nothing below them to move with a rename).
    pub(super) dir: bool,
    /// Kernel lookups not yet forgotten.
    pub(super) lookups: u64,
    /// The backing file's `(st_dev, st_ino)`, so that hard links share one inode.
    pub(super) key: Option<(u64, u64)>,
    /// The backing file as it was when the kernel last had to drop its cached pages (data) or
    /// listing (directory); an open that finds it unchanged lets the kernel keep its cache.
    pub(super) stamp: Option<Stamp>,
    /// The backing file of a data inode, kept open until the kernel forgets the inode: for
    /// attributes without a path walk (`O_PATH` is enough), and, with zero-message open, for
    /// reads and writes that come without a handle. An unlinked file that the kernel still
    /// knows is reached only this way.
    pub(super) fd: Option<(Arc<File>, Access)>,
}

/// What a kept backing file may be used for, least first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Access {
    /// `O_PATH`: attributes only.
    Path,
    Read,
    Write,
}

/// Backing files kept open in nodes, across all connections of the process, for inodes still
/// reached by a path (those of unlinked files do not count: they cannot be reopened).
pub(super) static FDS_KEPT: AtomicUsize = AtomicUsize::new(0);

/// At most half the descriptors the process may open are kept in nodes; past it, a request
/// opens its file for itself.
pub(super) fn fd_budget() -> usize {
    static BUDGET: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *BUDGET.get_or_init(|| {
        let soft = rustix::process::getrlimit(rustix::process::Resource::Nofile).current.unwrap_or(1024);
        usize::try_from(soft / 2).unwrap_or(usize::MAX)
    })
}

/// What changes when a file's contents or a directory's entries change behind the kernel's
/// back: the backing inode, its size, and its modification and change times.
pub(super) type Stamp = (u64, i64, i64, u64, i64, u64);

pub(super) fn stamp_of(st: &rustix::fs::Stat) -> Stamp {
    (st.st_ino, st.st_size, st.st_mtime, st.st_mtime_nsec, st.st_ctime, st.st_ctime_nsec)
}

#[derive(Debug)]
pub(super) struct Inodes {
    pub(super) nodes: HashMap<u64, Node>,
    /// Paths are shared with the nodes: a request takes one without an allocation.
    pub(super) by_path: HashMap<Arc<Path>, u64>,
    pub(super) by_key: HashMap<(u64, u64), u64>,
    pub(super) next: u64,
}

impl Drop for Inodes {
    fn drop(&mut self) {
        // A connection that ends (unmount, a guest's new session) gives back its share of the
        // descriptor budget.
        let kept = self.nodes.values().filter(|n| n.fd.is_some() && !n.paths.is_empty()).count();
        FDS_KEPT.fetch_sub(kept, Ordering::Relaxed);
    }
}

impl Inodes {
    /// The path that serves requests for `ino`: ENOENT once unlinked, ESTALE when forgotten.
    pub(super) fn get(&self, ino: u64) -> io::Result<Arc<Path>> {
        let node = self.nodes.get(&ino).ok_or_else(|| err(Why::Stale))?;
        node.paths.first().cloned().ok_or_else(|| err(Why::NotFound))
    }

    /// A path of the known inode of backing file `key`, if any.
    pub(super) fn path_of_key(&self, key: (u64, u64)) -> Option<Arc<Path>> {
        self.nodes.get(self.by_key.get(&key)?)?.paths.first().cloned()
    }

    /// The inode of `rel`, whose `lstat` is `st`, counting one more kernel lookup. With `linked`
    /// (the caller checked that the known inode of the same backing file is still reached by its
    /// path), a path that names another hard link of a known file gets that file's inode.
    pub(super) fn remember(&mut self, rel: &Path, st: &rustix::fs::Stat, linked: bool) -> u64 {
        let key = (st.st_dev, st.st_ino);
        if let Some(&ino) = self.by_path.get(rel) {
            if let Some(node) = self.nodes.get_mut(&ino)
                && node.key.is_none_or(|k| k == key)
            {
                node.lookups += 1;
                return ino;
            }
            // The path was replaced behind the server's back: it names a new file now.
            self.detach(rel);
        }
        if linked
            && let Some(&ino) = self.by_key.get(&key)
            && let Some(node) = self.nodes.get_mut(&ino)
        {
            let rel: Arc<Path> = Arc::from(rel);
            node.paths.push(Arc::clone(&rel));
            node.lookups += 1;
            self.by_path.insert(rel, ino);
            return ino;
        }
        let ino = self.next;
        self.next += 1;
        let rel: Arc<Path> = Arc::from(rel);
        self.nodes.insert(
            ino,
            Node {
                paths: Paths::one(Arc::clone(&rel)),
                dir: rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Directory,
                lookups: 1,
                key: Some(key),
                stamp: None,
                fd: None,
            },
        );
        self.by_path.insert(rel, ino);
        self.by_key.insert(key, ino);
        ino
    }

    /// Records `stamp` (`None`: unknown) as what the kernel caches for `ino` from now on, and
    /// says whether it equals what was recorded before (then the kernel's cache is current).
    pub(super) fn restamp(&mut self, ino: u64, stamp: Option<Stamp>) -> bool {
        let Some(node) = self.nodes.get_mut(&ino) else { return false };
        let same = stamp.is_some() && node.stamp == stamp;
        node.stamp = stamp;
        same
    }

    pub(super) fn forget(&mut self, ino: u64, n: u64) {
        if ino < DYNAMIC_FIRST {
            return;
        }
        let Some(node) = self.nodes.get_mut(&ino) else { return };
        node.lookups = node.lookups.saturating_sub(n);
        if node.lookups > 0 {
            return;
        }
        let node = self.nodes.remove(&ino).expect("present");
        if node.fd.is_some() && !node.paths.is_empty() {
            FDS_KEPT.fetch_sub(1, Ordering::Relaxed);
        }
        for p in node.paths.iter() {
            if self.by_path.get(&**p) == Some(&ino) {
                self.by_path.remove(&**p);
            }
        }
        if let Some(k) = node.key
            && self.by_key.get(&k) == Some(&ino)
        {
            self.by_key.remove(&k);
        }
    }

    /// The backing file kept open for `ino`, and what it may be used for.
    pub(super) fn cached_fd(&self, ino: u64) -> Option<(Arc<File>, Access)> {
        self.nodes.get(&ino)?.fd.clone()
    }

    /// Keeps `f` open for `ino` (replacing one of less access), unless the budget is spent and
    /// `pin` (the file is about to be unlinked) is not set.
    pub(super) fn keep_fd(&mut self, ino: u64, f: &Arc<File>, access: Access, pin: bool) {
        let Some(node) = self.nodes.get_mut(&ino) else { return };
        if node.paths.is_empty() || node.fd.as_ref().is_some_and(|(_, a)| *a >= access) {
            return;
        }
        if node.fd.is_none() {
            if FDS_KEPT.load(Ordering::Relaxed) >= fd_budget() && !pin {
                return;
            }
            FDS_KEPT.fetch_add(1, Ordering::Relaxed);
        }
        node.fd = Some((Arc::clone(f), access));
    }

    /// `rel` no longer names its inode (unlinked, or replaced by a rename).
    pub(super) fn detach(&mut self, rel: &Path) {
        let Some(ino) = self.by_path.remove(rel) else { return };
        let Some(node) = self.nodes.get_mut(&ino) else { return };
        node.paths.remove(rel);
        if node.paths.is_empty() && node.fd.is_some() {
            // Kept for the unlinked file, outside the budget.
            FDS_KEPT.fetch_sub(1, Ordering::Relaxed);
        }
        if node.paths.is_empty()
            && let Some(k) = node.key
            && self.by_key.get(&k) == Some(&ino)
        {
            // The file may be gone; its backing inode number may be reused.
            self.by_key.remove(&k);
        }
    }

    /// After a rename, `from` and everything below it live at `to`; what `to` named is gone.
    pub(super) fn moved(&mut self, from: &Path, to: &Path) {
        self.detach(to);
        // Only a directory has entries below it: a known file's rename moves one path,
        // whatever else is known.
        let affected: Vec<(Arc<Path>, u64)> = match self.by_path.get(from) {
            Some(&ino) if self.nodes.get(&ino).is_some_and(|n| !n.dir) => vec![(Arc::from(from), ino)],
            _ => self
                .by_path
                .iter()
                .filter(|(p, _)| p.starts_with(from))
                .map(|(p, &i)| (p.clone(), i))
                .collect(),
        };
        for (p, ino) in affected {
            let rest = p.strip_prefix(from).expect("filtered by prefix");
            // `join("")` would add a trailing slash.
            let new: Arc<Path> =
                if rest.as_os_str().is_empty() { Arc::from(to) } else { Arc::from(to.join(rest)) };
            self.by_path.remove(&*p);
            self.by_path.insert(Arc::clone(&new), ino);
            if let Some(node) = self.nodes.get_mut(&ino) {
                node.paths.remove(&p);
                node.paths.push(new);
            }
        }
    }
}
