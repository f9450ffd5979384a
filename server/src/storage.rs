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
        let mut rest = rel.as_os_str().as_bytes();
        if rest.len() > REL_MAX {
            // The daemon keeps each known inode's whole path: a bound on it is a bound on that.
            return Err(Why::NameTooLong.into());
        }
        if rest.len() <= STEP {
            return Ok(open(&self.root, rel, flags, mode)?);
        }
        let mut dir: Option<OwnedFd> = None;
        while rest.len() > STEP {
            // The last `/` within the step; a name is at most 255 bytes, so there is one.
            let cut = rest[..=STEP]
                .iter()
                .rposition(|&b| b == b'/')
                .ok_or_else(|| io::Error::from(Why::NameTooLong))?;
            let head = Path::new(std::ffi::OsStr::from_bytes(&rest[..cut]));
            let next = open(dir.as_ref().unwrap_or(&self.root), head, OFlags::PATH | OFlags::DIRECTORY, 0)?;
            dir = Some(next);
            rest = &rest[cut + 1..];
        }
        let last = Path::new(std::ffi::OsStr::from_bytes(rest));
        Ok(open(dir.as_ref().unwrap_or(&self.root), last, flags, mode)?)
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
