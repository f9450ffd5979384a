//! The one way root touches a tree an agent can write.
//!
//! An agent owns its home, its sessions (and their child records), its run's socket
//! directories and whatever it may write in a workspace or a shared space. Root (the daemon's
//! clients, the supervisor, the receipt server, the launcher and `ctx`) never acts by path
//! below such a directory: a symlink, a bind mount or a socket the agent put there would make
//! root act on something else. Every open, write, read, chown, remove and connect below one
//! goes through a [`Tree`]:
//!
//! - the tree's own directory is opened once, with no symlink anywhere on its path
//!   (`RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS`), and kept as a descriptor;
//! - everything below it is opened beneath that descriptor with `openat2(RESOLVE_BENEATH |
//!   RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV)` and `O_NOFOLLOW`: neither
//!   `..`, a symlink nor a mount point leads out of it;
//! - a file is checked on its descriptor (a regular file, and the owner expected where one is
//!   given) before its bytes are used; owners and modes are set on descriptors;
//! - a socket is opened as an `O_PATH` descriptor the same way, its type and owner checked on
//!   it, and connected through that descriptor (`/proc/self/fd/N`), so what is checked is what
//!   is connected to;
//! - a removal never crosses a mount: [`Tree::remove_all`] stops with `EXDEV` at one.
//!
//! `scripts/layers` fails when a path-based `std::fs`, `File::open`, `OpenOptions` or
//! `UnixStream::connect` call appears in the modules that act on agent trees.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags, Stat};

/// How every path below a kept descriptor is resolved (the session layout's walk uses it too).
pub const BENEATH: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS)
    .union(ResolveFlags::NO_XDEV);

/// How deep [`Tree::remove_all`] goes (each level holds a descriptor while it is emptied).
pub const REMOVE_DEPTH: usize = 256;
/// How many names [`Tree::remove_all`] lists at once.
const REMOVE_BATCH: usize = 1024;

/// A directory of a tree an agent may write, kept open: everything below it is reached
/// beneath this descriptor only.
#[derive(Debug)]
pub struct Tree {
    fd: OwnedFd,
    path: PathBuf,
}

fn err(e: rustix::io::Errno) -> io::Error {
    e.into()
}

/// An error that names the path it happened on (`path: why`).
fn named(path: &Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

fn is_dir(st: &Stat) -> bool {
    FileType::from_raw_mode(st.st_mode) == FileType::Directory
}

impl Tree {
    /// Opens the directory `path` with no symlink anywhere on its path (the tree's own
    /// directory; what is above it is root's).
    pub fn open(path: &Path) -> io::Result<Tree> {
        let flags = OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC;
        let fd = rustix::fs::openat2(
            rustix::fs::CWD,
            path,
            flags,
            Mode::empty(),
            ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        )
        .map_err(|e| named(path, err(e)))?;
        Ok(Tree { fd, path: path.to_path_buf() })
    }

    /// The path the tree was opened at (for messages only: nothing is resolved through it).
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn shown(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.path.join(rel)
    }

    fn at(&self, rel: &Path, flags: OFlags, mode: Mode) -> io::Result<OwnedFd> {
        rustix::fs::openat2(&self.fd, rel, flags | OFlags::NOFOLLOW | OFlags::CLOEXEC, mode, BENEATH)
            .map_err(|e| named(&self.shown(rel), err(e)))
    }

    /// The directory `rel` below this one, beneath it.
    pub fn sub(&self, rel: impl AsRef<Path>) -> io::Result<Tree> {
        let rel = rel.as_ref();
        let fd = self.at(rel, OFlags::DIRECTORY | OFlags::RDONLY, Mode::empty())?;
        Ok(Tree { fd, path: self.shown(rel) })
    }

    /// Makes the directory `name` in this one with `mode`, failing (`EEXIST`) when something is
    /// there already; returns it.
    pub fn make_dir(&self, name: impl AsRef<Path>, mode: u32) -> io::Result<Tree> {
        let name = name.as_ref();
        rustix::fs::mkdirat(&self.fd, name, Mode::from_raw_mode(mode))
            .map_err(|e| named(&self.shown(name), err(e)))?;
        self.sub(name)
    }

    /// The directory `rel` below this one, made (each missing level with `mode`) if missing.
    pub fn make_dirs(&self, rel: impl AsRef<Path>, mode: u32) -> io::Result<Tree> {
        let rel = rel.as_ref();
        let mut t = Tree { fd: rustix::io::dup(&self.fd).map_err(err)?, path: self.path.clone() };
        for part in rel.components() {
            let name = part.as_os_str();
            match rustix::fs::mkdirat(&t.fd, name, Mode::from_raw_mode(mode)) {
                Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(named(&t.shown(name), err(e))),
            }
            t = t.sub(name)?;
        }
        Ok(t)
    }

    /// The status of `rel` (not followed if a symlink), or of the tree itself for `""`.
    pub fn stat(&self, rel: impl AsRef<Path>) -> io::Result<Stat> {
        let rel = rel.as_ref();
        if rel.as_os_str().is_empty() {
            return rustix::fs::fstat(&self.fd).map_err(err);
        }
        rustix::fs::statat(&self.fd, rel, AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| named(&self.shown(rel), err(e)))
    }

    /// Whether anything (a symlink too) is at `rel`.
    pub fn exists(&self, rel: impl AsRef<Path>) -> bool {
        self.stat(rel).is_ok()
    }

    /// Opens the regular file `rel` with `flags` (`O_NOFOLLOW` and `O_CLOEXEC` added; `mode` for
    /// a file it creates). Refused before a byte of it is read or written: anything but a
    /// regular file (`EINVAL`), a file of an owner other than root and the owner of the tree's
    /// own directory, and a file with a second name (`EPERM`: a hard link to a file elsewhere,
    /// which the tree's owner could have made where the kernel lets it).
    pub fn file(&self, rel: impl AsRef<Path>, flags: OFlags, mode: u32) -> io::Result<File> {
        let rel = rel.as_ref();
        // A FIFO is never opened for I/O: it would block root on the agent (O_NONBLOCK means
        // nothing to a regular file).
        // Nor truncated before it is checked: O_TRUNC is applied after the checks.
        let fd = self.at(rel, (flags - OFlags::TRUNC) | OFlags::NONBLOCK, Mode::from_raw_mode(mode))?;
        let st = rustix::fs::fstat(&fd).map_err(err)?;
        let refused = |kind, why: &str| Err(named(&self.shown(rel), io::Error::new(kind, why.to_owned())));
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return refused(io::ErrorKind::InvalidInput, "not a regular file");
        }
        let owner = rustix::fs::fstat(&self.fd).map_err(err)?.st_uid;
        if st.st_uid != 0 && st.st_uid != owner {
            return refused(io::ErrorKind::PermissionDenied, "a file of another owner than the tree's");
        }
        if st.st_nlink > 1 {
            return refused(io::ErrorKind::PermissionDenied, "a file with more than one name");
        }
        rustix::fs::fcntl_setfl(&fd, rustix::fs::fcntl_getfl(&fd).map_err(err)? & !OFlags::NONBLOCK)
            .map_err(err)?;
        if flags.contains(OFlags::TRUNC) {
            // Opened again through its descriptor, with O_TRUNC (a control of the /ctx mount is
            // replaced by an open that truncates, not by a truncate): what was checked is what
            // is truncated.
            let again = flags & !(OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW) | OFlags::CLOEXEC;
            let fd = rustix::fs::open(through(&fd), again, Mode::empty())
                .map_err(|e| named(&self.shown(rel), err(e)))?;
            return Ok(File::from(fd));
        }
        Ok(File::from(fd))
    }

    /// Opens the regular file `rel` with `flags`, beneath the tree with no symlink, whoever
    /// owns it, never creating it: for root's own records of a file (a log the journal replays
    /// into), whose identity the caller checks on the descriptor. Anything but a regular file
    /// is refused (`EINVAL`) before a byte is read or written.
    pub fn open_regular(&self, rel: impl AsRef<Path>, flags: OFlags) -> io::Result<File> {
        let rel = rel.as_ref();
        let fd = self.at(rel, (flags - OFlags::CREATE - OFlags::TRUNC) | OFlags::NONBLOCK, Mode::empty())?;
        let st = rustix::fs::fstat(&fd).map_err(err)?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(named(
                &self.shown(rel),
                io::Error::new(io::ErrorKind::InvalidInput, "not a regular file"),
            ));
        }
        rustix::fs::fcntl_setfl(&fd, rustix::fs::fcntl_getfl(&fd).map_err(err)? & !OFlags::NONBLOCK)
            .map_err(err)?;
        Ok(File::from(fd))
    }

    /// Reads at most `max` bytes of the regular file `rel`.
    pub fn read(&self, rel: impl AsRef<Path>, max: u64) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        self.file(rel, OFlags::RDONLY, 0)?.take(max).read_to_end(&mut out)?;
        Ok(out)
    }

    /// The last `max` bytes (at most) of the regular file `rel`.
    pub fn tail(&self, rel: impl AsRef<Path>, max: u64) -> io::Result<Vec<u8>> {
        use std::io::Seek;
        let mut f = self.file(rel, OFlags::RDONLY, 0)?;
        let len = f.metadata()?.len();
        f.seek(io::SeekFrom::Start(len.saturating_sub(max)))?;
        let mut out = Vec::new();
        f.take(max).read_to_end(&mut out)?;
        Ok(out)
    }

    /// Reads at most `max` bytes of the regular file `rel` as text (invalid UTF-8 replaced).
    pub fn read_string(&self, rel: impl AsRef<Path>, max: u64) -> io::Result<String> {
        Ok(String::from_utf8_lossy(&self.read(rel, max)?).into_owned())
    }

    /// Replaces the contents of the regular file `rel` with `bytes` (created with `mode` if
    /// missing); returns the file, for its owner to be set.
    pub fn write(&self, rel: impl AsRef<Path>, bytes: &[u8], mode: u32) -> io::Result<File> {
        let rel = rel.as_ref();
        let mut f = self.file(rel, OFlags::WRONLY | OFlags::CREATE | OFlags::TRUNC, mode)?;
        f.write_all(bytes).map_err(|e| named(&self.shown(rel), e))?;
        Ok(f)
    }

    /// Appends `bytes` in one write to the existing regular file `rel`.
    pub fn append(&self, rel: impl AsRef<Path>, bytes: &[u8]) -> io::Result<()> {
        let rel = rel.as_ref();
        self.file(rel, OFlags::WRONLY | OFlags::APPEND, 0)?
            .write_all(bytes)
            .map_err(|e| named(&self.shown(rel), e))
    }

    /// Renames `from` to `to`, both in this directory (replacing what `to` names).
    pub fn rename(&self, from: impl AsRef<Path>, to: impl AsRef<Path>) -> io::Result<()> {
        let (from, to) = (from.as_ref(), to.as_ref());
        rustix::fs::renameat(&self.fd, from, &self.fd, to).map_err(|e| named(&self.shown(to), err(e)))
    }

    /// Sets the owner of the tree's own directory.
    pub fn chown(&self, uid: u32, gid: u32) -> io::Result<()> {
        own(&self.fd, uid, gid)
    }

    /// Sets the mode of the tree's own directory.
    pub fn chmod(&self, mode: u32) -> io::Result<()> {
        rustix::fs::fchmod(&self.fd, Mode::from_raw_mode(mode)).map_err(err)
    }

    /// The names in the tree's own directory (not `.` or `..`), at most `max` of them.
    pub fn names(&self, max: usize) -> io::Result<Vec<OsString>> {
        let fd = rustix::fs::openat(
            &self.fd,
            ".",
            OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(err)?;
        let mut out = Vec::new();
        for e in rustix::fs::Dir::read_from(&fd).map_err(err)? {
            let e = e.map_err(err)?;
            let name = e.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            if out.len() == max {
                break;
            }
            out.push(OsStr::from_bytes(name).to_os_string());
        }
        Ok(out)
    }

    /// Removes the entry `name` of the tree's own directory (a file, a symlink, a socket; not
    /// a directory), without following it.
    pub fn remove(&self, name: impl AsRef<Path>) -> io::Result<()> {
        let name = name.as_ref();
        rustix::fs::unlinkat(&self.fd, name, AtFlags::empty()).map_err(|e| named(&self.shown(name), err(e)))
    }

    /// Removes the empty directory `name` of the tree's own directory.
    pub fn remove_dir(&self, name: impl AsRef<Path>) -> io::Result<()> {
        let name = name.as_ref();
        rustix::fs::unlinkat(&self.fd, name, AtFlags::REMOVEDIR).map_err(|e| named(&self.shown(name), err(e)))
    }

    /// Removes `name` and everything below it, never following a symlink and never crossing a
    /// mount: a mount point below it stops the removal with `EXDEV` (unmount it first), and
    /// what was on the other side is not touched. Missing is not an error.
    ///
    /// Root's work is bounded: entries are listed a batch at a time, and a tree deeper than
    /// [`REMOVE_DEPTH`] levels is refused (an error saying so) when the removal reaches that
    /// depth.
    pub fn remove_all(&self, name: impl AsRef<Path>) -> io::Result<()> {
        self.remove_all_at(name.as_ref(), 0)
    }

    fn remove_all_at(&self, name: &Path, depth: usize) -> io::Result<()> {
        let st = match rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(rustix::io::Errno::NOENT) => return Ok(()),
            Err(e) => return Err(named(&self.shown(name), err(e))),
        };
        if !is_dir(&st) {
            return self.remove(name);
        }
        // NO_XDEV refuses a mount point (EXDEV), so nothing on another filesystem is listed.
        let sub = self.sub(name)?;
        if sub.stat("")?.st_dev != self.stat("")?.st_dev {
            return Err(named(&self.shown(name), err(rustix::io::Errno::XDEV)));
        }
        if depth == REMOVE_DEPTH {
            return Err(named(
                &self.shown(name),
                io::Error::other(format!("deeper than {REMOVE_DEPTH} levels: not removed")),
            ));
        }
        loop {
            let batch = sub.names(REMOVE_BATCH)?;
            if batch.is_empty() {
                break;
            }
            for n in batch {
                sub.remove_all_at(Path::new(&n), depth + 1)?;
            }
        }
        self.remove_dir(name)
    }

    /// Connects to the socket `rel`, which must be a socket owned by `owner`: opened as an
    /// `O_PATH` descriptor beneath the tree, checked on it, and connected through it.
    pub fn connect(&self, rel: impl AsRef<Path>, owner: u32) -> io::Result<UnixStream> {
        let rel = rel.as_ref();
        let fd = self.at(rel, OFlags::PATH, Mode::empty())?;
        let st = rustix::fs::fstat(&fd).map_err(err)?;
        if FileType::from_raw_mode(st.st_mode) != FileType::Socket {
            return Err(named(&self.shown(rel), io::Error::new(io::ErrorKind::InvalidInput, "not a socket")));
        }
        if st.st_uid != owner {
            return Err(named(
                &self.shown(rel),
                io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!("owned by uid {}, not uid {owner}", st.st_uid),
                ),
            ));
        }
        UnixStream::connect(through(&fd)).map_err(|e| named(&self.shown(rel), e))
    }

    /// Makes a socket named `name` in the tree's own directory (whatever was there first is
    /// removed, not followed) and listens on it; the socket's file gets owner `uid` (set on the
    /// entry, never through a link).
    pub fn bind(&self, name: &str, uid: u32) -> io::Result<UnixListener> {
        match self.remove(name) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let at = format!("/proc/self/fd/{}/{name}", self.fd.as_raw_fd());
        let l = UnixListener::bind(at).map_err(|e| named(&self.shown(name), e))?;
        rustix::fs::chownat(
            &self.fd,
            name,
            Some(rustix::fs::Uid::from_raw(uid)),
            None,
            AtFlags::SYMLINK_NOFOLLOW,
        )
        .map_err(|e| named(&self.shown(name), err(e)))?;
        Ok(l)
    }
}

impl From<Tree> for OwnedFd {
    fn from(t: Tree) -> OwnedFd {
        t.fd
    }
}

/// Opens the directory `path` with `flags` (`O_DIRECTORY`, `O_NOFOLLOW` and `O_CLOEXEC` added;
/// `O_PATH` for one root may not read) with no symlink or magic link anywhere on its path: the
/// raw form of [`Tree::open`], for callers that map its errors themselves.
pub fn open_dir(path: &Path, flags: OFlags) -> rustix::io::Result<OwnedFd> {
    rustix::fs::openat2(
        rustix::fs::CWD,
        path,
        flags | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
}

impl AsFd for Tree {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// The path that reaches what `fd` is open on through the descriptor itself
/// (`/proc/self/fd/N`), for the calls the kernel offers no descriptor form of.
pub fn through(fd: impl AsFd) -> String {
    format!("/proc/self/fd/{}", fd.as_fd().as_raw_fd())
}

/// Sets the owner of what `fd` is open on.
pub fn own(fd: impl AsFd, uid: u32, gid: u32) -> io::Result<()> {
    rustix::fs::fchown(fd, Some(rustix::fs::Uid::from_raw(uid)), Some(rustix::fs::Gid::from_raw(gid)))
        .map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp() -> (tempfile::TempDir, Tree) {
        let d = tempfile::tempdir().unwrap();
        let t = Tree::open(d.path()).unwrap();
        (d, t)
    }

    #[test]
    fn a_symlink_below_the_tree_is_never_followed() {
        let (d, t) = tmp();
        let outside = tempfile::tempdir().unwrap();
        let target = outside.path().join("x");
        std::fs::write(&target, "root's\n").unwrap();
        std::os::unix::fs::symlink(&target, d.path().join("handoff.md")).unwrap();
        assert!(t.write("handoff.md", b"PWNED\n", 0o644).is_err());
        assert!(t.read("handoff.md", 100).is_err());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "root's\n");
        // A symlinked directory on the way is refused too, and so is `..`.
        std::os::unix::fs::symlink(outside.path(), d.path().join("dir")).unwrap();
        assert!(t.write("dir/x", b"PWNED\n", 0o644).is_err());
        assert!(t.sub("dir").is_err());
        assert!(t.read("../x", 100).is_err());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "root's\n");
    }

    #[test]
    fn only_regular_files_are_read_and_a_fifo_never_blocks() {
        let (d, t) = tmp();
        rustix::fs::mkfifoat(rustix::fs::CWD, d.path().join("f"), Mode::from_raw_mode(0o644)).unwrap();
        assert!(t.read("f", 10).is_err());
        std::fs::create_dir(d.path().join("dir")).unwrap();
        assert!(t.read("dir", 10).is_err());
        t.make_dirs("a/b", 0o755).unwrap().write("c", b"hi", 0o600).unwrap();
        assert_eq!(t.read_string("a/b/c", 10).unwrap(), "hi");
        t.append("a/b/c", b"!").unwrap();
        assert_eq!(t.read_string("a/b/c", 1).unwrap(), "h");
        assert_eq!(t.read_string("a/b/c", 10).unwrap(), "hi!");
    }

    /// A file of a third owner, or with a second name (a hard link to a file elsewhere), is
    /// neither read nor written, whoever made it; root's and the tree owner's files are.
    #[test]
    fn a_file_of_another_owner_or_with_a_second_name_is_refused() {
        let (d, t) = tmp();
        let agent = 4242;
        rustix::fs::chown(d.path(), Some(rustix::fs::Uid::from_raw(agent)), None).unwrap();
        t.write("roots", b"r", 0o644).unwrap();
        let mine = t.write("agents", b"a", 0o644).unwrap();
        own(&mine, agent, agent).unwrap();
        let third = t.write("third", b"t", 0o644).unwrap();
        own(&third, agent + 1, agent + 1).unwrap();
        assert_eq!(t.read_string("roots", 10).unwrap(), "r");
        assert_eq!(t.read_string("agents", 10).unwrap(), "a");
        assert!(t.read("third", 10).is_err());
        assert!(t.write("third", b"PWNED", 0o644).is_err());
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("x"), "root's\n").unwrap();
        std::fs::hard_link(outside.path().join("x"), d.path().join("linked")).unwrap();
        assert!(t.write("linked", b"PWNED\n", 0o644).is_err());
        assert!(t.append("linked", b"PWNED\n").is_err());
        assert!(t.read("linked", 10).is_err());
        assert_eq!(std::fs::read_to_string(outside.path().join("x")).unwrap(), "root's\n");
        assert_eq!(std::fs::read_to_string(d.path().join("third")).unwrap(), "t");
    }

    #[test]
    fn a_socket_is_connected_only_when_it_is_one_of_the_owner_expected() {
        let (d, t) = tmp();
        let _l = std::os::unix::net::UnixListener::bind(d.path().join("s")).unwrap();
        let me = rustix::process::geteuid().as_raw();
        assert!(t.connect("s", me).is_ok());
        assert!(t.connect("s", me + 1).is_err());
        let other = tempfile::tempdir().unwrap();
        let _o = std::os::unix::net::UnixListener::bind(other.path().join("s")).unwrap();
        std::os::unix::fs::symlink(other.path().join("s"), d.path().join("link")).unwrap();
        assert!(t.connect("link", me).is_err(), "a symlink to another socket is refused");
    }

    /// Removal lists a batch of names at a time and stops at its depth.
    #[test]
    fn remove_all_is_bounded_in_names_at_once_and_in_depth() {
        let (d, t) = tmp();
        let wide = t.make_dirs("wide", 0o700).unwrap();
        for i in 0..2500 {
            wide.write(format!("f{i}"), b"", 0o600).unwrap();
        }
        t.remove_all("wide").unwrap();
        assert!(!d.path().join("wide").exists());
        let deep: PathBuf = (0..REMOVE_DEPTH + 2).map(|_| "d").collect();
        t.make_dirs(&deep, 0o700).unwrap();
        let e = t.remove_all("d").unwrap_err();
        assert!(e.to_string().contains("deeper than"), "{e}");
        let shallow: PathBuf = (0..REMOVE_DEPTH).map(|_| "s").collect();
        t.make_dirs(&shallow, 0o700).unwrap();
        t.remove_all("s").unwrap();
        assert!(!d.path().join("s").exists());
    }

    #[test]
    fn remove_all_never_follows_a_symlink() {
        let (d, t) = tmp();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("keep"), "x").unwrap();
        let sub = t.make_dirs("run/term", 0o700).unwrap();
        sub.write("f", b"x", 0o600).unwrap();
        std::os::unix::fs::symlink(outside.path(), d.path().join("run/out")).unwrap();
        t.remove_all("run").unwrap();
        assert!(!d.path().join("run").exists());
        assert!(outside.path().join("keep").exists());
        t.remove_all("run").unwrap();
    }
}
