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

use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags, Stat};

/// The storage root.
#[derive(Debug)]
pub struct Storage {
    path: PathBuf,
    root: OwnedFd,
    /// The device the storage's root is on.
    dev: u64,
}

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
        Ok(Storage { path: path.to_path_buf(), root, dev })
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
    pub fn open_rel(&self, rel: &Path, flags: OFlags, mode: u32) -> io::Result<OwnedFd> {
        let how = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
        let rel: &Path = if rel.as_os_str().is_empty() { Path::new(".") } else { rel };
        Ok(rustix::fs::openat2(
            &self.root,
            rel,
            flags | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::from_raw_mode(mode),
            how,
        )?)
    }

    /// Opens the directory `rel` (for `*at` calls on its entries).
    pub fn dir(&self, rel: &Path) -> io::Result<OwnedFd> {
        self.open_rel(rel, OFlags::DIRECTORY | OFlags::RDONLY, 0)
    }

    /// `lstat` of `rel`.
    pub fn stat(&self, rel: &Path) -> io::Result<Stat> {
        match split(rel) {
            None => Ok(rustix::fs::fstat(&self.root)?),
            Some((parent, name)) => {
                let dir = self.dir(parent)?;
                Ok(rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW)?)
            }
        }
    }

    /// The parent directory of `rel` and the final component, ready for `*at` calls.
    pub fn parent_of<'a>(&self, rel: &'a Path) -> io::Result<(OwnedFd, &'a CStrish)> {
        let (parent, name) = split(rel).ok_or_else(|| io::Error::from(Why::Busy))?;
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
