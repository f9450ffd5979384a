//! The backing storage, reached only beneath its root and never through a symlink.
//!
//! Every path the server touches is relative to the storage root and resolved with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`, so a symlink planted anywhere in `home/` or
//! `shared/` (or swapped in during a request) can never lead the server outside the storage or
//! through a link. The final component of an operation is always used with `*at` calls and
//! `AT_SYMLINK_NOFOLLOW` (a symlink there is an object of its own, read with `readlink`).

use std::ffi::CStr;
use std::io;

use crate::errno::Why;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use crate::area::Area;
use policy::controls::Owner;

use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags, Stat};

/// The storage root.
#[derive(Debug)]
pub struct Storage {
    path: PathBuf,
    root: OwnedFd,
    /// The device the storage's root is on.
    dev: u64,
    /// Where configuration is served from, in an agent view: the active generation.
    active: Option<Arc<Active>>,
}

/// The active configuration generation of a storage ([`ringfs::config`]): its directory,
/// opened once and swapped for the next when a commit activates another. Agent views serve
/// objects and controls from it, so an edit of the storage is seen by no agent until it is
/// committed, and then all of it at once.
#[derive(Debug)]
pub struct Active {
    storage: PathBuf,
    now: RwLock<Option<(String, Arc<OwnedFd>)>>,
}

impl Active {
    /// The storage's active generation, as its `active` link names it now.
    pub fn open(storage: &Path) -> Arc<Active> {
        let a = Arc::new(Active { storage: storage.to_path_buf(), now: RwLock::new(None) });
        a.reload();
        a
    }

    /// Takes in the generation the `active` link names, if it is another one: returns whether
    /// it changed. A generation that cannot be opened leaves the one served.
    pub fn reload(&self) -> bool {
        let Some(id) = ringfs::config::active_id(&self.storage) else { return false };
        if self.now.read().is_ok_and(|n| n.as_ref().is_some_and(|(i, _)| *i == id)) {
            return false;
        }
        let dir = ringfs::config::generations_dir(&self.storage).join(&id);
        let Ok(fd) = rustix::fs::open(
            &dir,
            OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
        ) else {
            tracing::warn!(generation = %id, "the active generation cannot be opened: the one served stays");
            return false;
        };
        if let Ok(mut n) = self.now.write() {
            *n = Some((id, Arc::new(fd)));
        }
        true
    }

    /// The active generation's id.
    pub fn id(&self) -> Option<String> {
        self.now.read().ok()?.as_ref().map(|(i, _)| i.clone())
    }

    fn root(&self) -> Option<Arc<OwnedFd>> {
        self.now.read().ok()?.as_ref().map(|(_, fd)| Arc::clone(fd))
    }
}

/// The longest path resolved in one `openat2` (below the kernel's `PATH_MAX` of 4,096 bytes).
pub const STEP: usize = 3_072;

/// The longest storage path served (16 KiB: 64 levels of 255-byte names), past which a name
/// is `ENAMETOOLONG`; the inode table holds each known inode's path.
pub const REL_MAX: usize = 16 * 1024;

/// The root layout every storage has.
pub const LAYOUT: [&str; 5] = ["tool", "agent", "model", "home", "shared"];

impl Storage {
    /// Opens the storage at `path`, creating it with the empty root layout when missing.
    pub fn open(path: &Path) -> io::Result<Storage> {
        std::fs::create_dir_all(path)?;
        for d in LAYOUT {
            match std::fs::create_dir(path.join(d)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
        }
        let root =
            rustix::fs::open(path, OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())?;
        let dev = rustix::fs::fstat(&root)?.st_dev;
        Ok(Storage { path: path.to_path_buf(), root, dev, active: None })
    }

    /// Opens the storage at `path` for an agent view: objects and controls come from the
    /// active generation `active`, the rest (data, sessions, logs, sockets) from the storage.
    pub fn open_serving(path: &Path, active: Arc<Active>) -> io::Result<Storage> {
        Ok(Storage { active: Some(active), ..Storage::open(path)? })
    }

    /// The active generation's root when `rel` is configuration served from it: below
    /// `tool/`, `agent/`, `model/`, but not sockets and runtime state (logs, `status`, `pid`),
    /// which are never versioned.
    fn generation_for(&self, rel: &Path) -> Option<Arc<OwnedFd>> {
        let active = self.active.as_ref()?;
        let first = rel.components().next()?;
        if !matches!(first.as_os_str().to_str(), Some("tool" | "agent" | "model")) {
            return None;
        }
        match crate::area::classify(rel) {
            Some(Area::Socket | Area::ObjectLog | Area::Control(Owner::Runtime)) | None => None,
            Some(_) => active.root(),
        }
    }

    /// Whether `rel` is served from the active generation (see [`Storage::open_serving`]).
    pub fn from_generation(&self, rel: &Path) -> bool {
        self.generation_for(rel).is_some()
    }

    /// Opens `rel` beneath the storage itself (never the generation): what runtime entries
    /// of a configuration directory are listed from.
    pub fn work_dir(&self, rel: &Path) -> io::Result<OwnedFd> {
        let rel: &Path = if rel.as_os_str().is_empty() { Path::new(".") } else { rel };
        let how = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
        Ok(rustix::fs::openat2(
            &self.root,
            rel,
            OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
            how,
        )?)
    }

    /// The device the storage's root is on.
    pub fn dev(&self) -> u64 {
        self.dev
    }

    /// The storage directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The storage filesystem's sizes and counts (`statvfs`).
    pub fn statvfs(&self) -> io::Result<rustix::fs::StatVfs> {
        Ok(rustix::fs::fstatvfs(&self.root)?)
    }

    /// Opens `rel` beneath the root without following any symlink.
    ///
    /// A path longer than one resolution takes (the kernel's `PATH_MAX`) is walked in steps of
    /// at most [`STEP`] bytes, each resolved beneath the directory the last one opened: a tree
    /// as deep as the backing filesystem allows is reachable, and every step keeps the same
    /// guarantees (beneath, no symlinks).
    pub fn open_rel(&self, rel: &Path, flags: OFlags, mode: u32) -> io::Result<OwnedFd> {
        use std::os::unix::ffi::OsStrExt;
        let how = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
        let open = |dir: &OwnedFd, rel: &Path, flags: OFlags, mode: u32| {
            let rel: &Path = if rel.as_os_str().is_empty() { Path::new(".") } else { rel };
            rustix::fs::openat2(
                dir,
                rel,
                flags | OFlags::CLOEXEC | OFlags::NOFOLLOW,
                Mode::from_raw_mode(mode),
                how,
            )
        };
        let generation = self.generation_for(rel);
        let root: &OwnedFd = generation.as_deref().unwrap_or(&self.root);
        let mut rest = rel.as_os_str().as_bytes();
        if rest.len() > REL_MAX {
            // The daemon keeps each known inode's whole path: a bound on it is a bound on that.
            return Err(Why::NameTooLong.into());
        }
        if rest.len() <= STEP {
            return Ok(open(root, rel, flags, mode)?);
        }
        let mut dir: Option<OwnedFd> = None;
        while rest.len() > STEP {
            // The last `/` within the step; a name is at most 255 bytes, so there is one.
            let cut = rest[..=STEP]
                .iter()
                .rposition(|&b| b == b'/')
                .ok_or_else(|| io::Error::from(Why::NameTooLong))?;
            let head = Path::new(std::ffi::OsStr::from_bytes(&rest[..cut]));
            let next = open(dir.as_ref().unwrap_or(root), head, OFlags::PATH | OFlags::DIRECTORY, 0)?;
            dir = Some(next);
            rest = &rest[cut + 1..];
        }
        let last = Path::new(std::ffi::OsStr::from_bytes(rest));
        Ok(open(dir.as_ref().unwrap_or(root), last, flags, mode)?)
    }

    /// Opens the directory `rel` (for `*at` calls on its entries).
    pub fn dir(&self, rel: &Path) -> io::Result<OwnedFd> {
        self.open_rel(rel, OFlags::DIRECTORY | OFlags::RDONLY, 0)
    }

    /// `lstat` of `rel`.
    pub fn stat(&self, rel: &Path) -> io::Result<Stat> {
        match split(rel) {
            None => Ok(rustix::fs::fstat(&self.root)?),
            // Configuration is looked up where it is served from, runtime entries beside it
            // in the storage.
            Some(_) if self.from_generation(rel) => {
                Ok(rustix::fs::fstat(self.open_rel(rel, OFlags::PATH | OFlags::NOFOLLOW, 0)?)?)
            }
            Some((parent, name)) => {
                let dir =
                    if self.from_generation(parent) { self.work_dir(parent)? } else { self.dir(parent)? };
                Ok(rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW)?)
            }
        }
    }

    /// The parent directory of `rel` and the final component, ready for `*at` calls.
    pub fn parent_of<'a>(&self, rel: &'a Path) -> io::Result<(OwnedFd, &'a CStrish)> {
        let (parent, name) = split(rel).ok_or_else(|| io::Error::from(Why::Busy))?;
        // A generation is never changed through a view: changes land in the storage.
        if self.from_generation(parent) {
            return Ok((self.work_dir(parent)?, name));
        }
        Ok((self.dir(parent)?, name))
    }
}

/// The final component of a path, as `*at` calls want it.
pub type CStrish = Path;

/// Splits `rel` into parent and final component; `None` for the root itself.
pub fn split(rel: &Path) -> Option<(&Path, &Path)> {
    let name = rel.file_name()?;
    let parent = rel.parent().unwrap_or(Path::new(""));
    Some((parent, Path::new(name)))
}

/// A name from the kernel as a path component: no `/`, not `.` or `..`, not empty.
pub fn component(name: &CStr) -> io::Result<&Path> {
    use std::os::unix::ffi::OsStrExt;
    let b = name.to_bytes();
    if b.is_empty() || b == b"." || b == b".." || b.contains(&b'/') {
        return Err(io::Error::from(Why::Invalid));
    }
    Ok(Path::new(std::ffi::OsStr::from_bytes(b)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tree deeper than `PATH_MAX` is reached in steps, and each step still refuses a symlink.
    #[test]
    fn a_path_longer_than_path_max_is_opened_in_steps_beneath_the_root() {
        let d = tempfile::tempdir().unwrap();
        let s = Storage::open(d.path()).unwrap();
        let name = "d".repeat(250);
        let mut rel = PathBuf::from("home");
        let mut dir = s.dir(&rel).unwrap();
        for _ in 0..30 {
            rustix::fs::mkdirat(&dir, name.as_str(), Mode::from_raw_mode(0o755)).unwrap();
            dir = rustix::fs::openat(&dir, name.as_str(), OFlags::DIRECTORY | OFlags::RDONLY, Mode::empty())
                .unwrap();
            rel.push(&name);
        }
        assert!(rel.as_os_str().len() > 2 * STEP);
        rustix::fs::symlinkat("/etc", &dir, "l").unwrap();
        let f = s.open_rel(&rel.join("f"), OFlags::CREATE | OFlags::WRONLY, 0o600).unwrap();
        assert!(rustix::fs::fstat(&f).unwrap().st_mode & 0o777 == 0o600);
        assert!(s.stat(&rel.join("f")).is_ok());
        assert!(s.open_rel(&rel.join("l/passwd"), OFlags::RDONLY, 0).is_err());
        assert!(s.open_rel(&rel.join("l"), OFlags::RDONLY, 0).is_err());
        // Past REL_MAX, a name is too long (the inode table keeps whole paths).
        let far = PathBuf::from("home").join(vec![name.as_str(); REL_MAX / 250 + 2].join("/"));
        let e = s.open_rel(&far, OFlags::RDONLY, 0).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(Why::NameTooLong.errno()));
    }
}
