//! The workspace. In an agent's run (`/ctx/status` or `$CTX_ROOT/status` is an agent's view) it
//! is the run's, as the view's `status` names it, whatever the environment says: a variable
//! the agent can set never chooses what a tool may touch; a run without a workspace has none.
//! For people: `CTX_WORKSPACE`, else `/workspace` when it exists, else the current directory.
//! Paths are taken relative to it (absolute ones must lie under it) and opened with
//! `openat2(RESOLVE_BENEATH)` from a descriptor of it, so neither `..` nor a symlink can leave it.
//! Where openat2 is refused (an agent's sandbox refuses it: its mode is beyond the seccomp
//! filter's sight, and would make setuid files), the same confinement is kept by resolving the
//! path one component at a time beneath the descriptor (`cap_primitives::fs::open`).

use std::env;
use std::ffi::OsStr;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use crate::{Error, Result};

/// The workspace, open.
#[derive(Debug)]
pub(crate) struct Workspace {
    root: PathBuf,
    canonical: Option<PathBuf>,
    fd: OwnedFd,
}

impl Workspace {
    /// The workspace directory, absolute.
    fn root() -> Result<PathBuf> {
        let roots = [env::var_os("CTX_ROOT").map(PathBuf::from), Some(PathBuf::from("/ctx"))];
        for root in roots.into_iter().flatten() {
            let Ok(status) = std::fs::read_to_string(root.join("status")) else { continue };
            if let Ok(policy::status::View::Agent { name, workspace, .. }) = policy::status::view(&status) {
                return workspace
                    .ok_or_else(|| Error::Unavailable(format!("the run of agent {name} has no workspace")));
            }
        }
        let cwd = || env::current_dir().map_err(|e| Error::io("current directory", e));
        match env::var_os("CTX_WORKSPACE").filter(|v| !v.is_empty()) {
            Some(v) if Path::new(&v).is_absolute() => Ok(v.into()),
            Some(v) => Ok(cwd()?.join(v)),
            None if Path::new("/workspace").is_dir() => Ok("/workspace".into()),
            None => cwd(),
        }
    }

    /// Opens the workspace.
    pub(crate) fn open() -> Result<Workspace> {
        let root = Self::root()?;
        let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let fd = rustix::fs::open(&root, flags, Mode::empty())
            .map_err(|e| Error::io(format!("workspace {}", root.display()), e))?;
        let canonical = std::fs::canonicalize(&root).ok().filter(|c| *c != root);
        Ok(Workspace { root, canonical, fd })
    }

    /// The workspace directory.
    pub(crate) fn path(&self) -> &Path {
        &self.root
    }

    /// `path` relative to the workspace: absolute paths must lie under it, component by component
    /// (as given, or with the workspace's symlinks resolved).
    fn relative<'a>(&self, path: &'a Path) -> Result<&'a Path> {
        let bytes = path.as_os_str().as_bytes();
        if bytes.is_empty() || bytes.contains(&0) {
            return Err(Error::Invalid(format!("{:?}: not a path", path.as_os_str())));
        }
        if path.is_relative() {
            return Ok(path);
        }
        [Some(&self.root), self.canonical.as_ref()]
            .into_iter()
            .flatten()
            .find_map(|root| path.strip_prefix(root).ok())
            .map(|rel| if rel.as_os_str().is_empty() { Path::new(".") } else { rel })
            .ok_or_else(|| Error::Escape(path.display().to_string()))
    }

    /// Opens `path` beneath the workspace (`O_CLOEXEC` is added).
    pub(crate) fn open_at(&self, path: &Path, flags: OFlags, mode: Mode) -> Result<OwnedFd> {
        self.beneath(self.relative(path)?, path, flags, mode)
    }

    /// The directory that holds `path`, open (`O_PATH`), and the name `path` has in it.
    pub(crate) fn parent<'a>(&self, path: &'a Path) -> Result<(OwnedFd, &'a OsStr)> {
        let rel = self.relative(path)?;
        let Some(Component::Normal(name)) = rel.components().next_back() else {
            return Err(Error::Invalid(format!("{}: not a file name", path.display())));
        };
        let dir = rel.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let fd = self.beneath(dir, path, OFlags::PATH | OFlags::DIRECTORY, Mode::empty())?;
        Ok((fd, name))
    }

    fn beneath(&self, rel: &Path, shown: &Path, flags: OFlags, mode: Mode) -> Result<OwnedFd> {
        let flags = flags | OFlags::CLOEXEC;
        let mut tries = 0;
        loop {
            match rustix::fs::openat2(&self.fd, rel, flags, mode, ResolveFlags::BENEATH) {
                Ok(fd) => return Ok(fd),
                // A rename raced the lookup: the kernel asks for a retry.
                Err(Errno::AGAIN) if tries < 8 => tries += 1,
                Err(Errno::XDEV) => return Err(Error::Escape(shown.display().to_string())),
                Err(Errno::NOSYS) => return self.beneath_by_components(rel, shown, flags, mode),
                Err(e) => return Err(Error::io(shown.display().to_string(), e)),
            }
        }
    }

    /// [`Workspace::beneath`] without openat2: each component opened beneath the one before,
    /// symlinks followed only while they stay beneath the workspace.
    fn beneath_by_components(&self, rel: &Path, shown: &Path, flags: OFlags, mode: Mode) -> Result<OwnedFd> {
        use cap_primitives::fs::{FollowSymlinks, OpenOptions, OpenOptionsExt};
        let start = std::fs::File::from(
            self.fd.try_clone().map_err(|e| Error::io(format!("workspace {}", self.root.display()), e))?,
        );
        let access = flags & OFlags::RWMODE;
        let mut o = OpenOptions::new();
        o.read(access != OFlags::WRONLY)
            .write(access != OFlags::RDONLY)
            .append(flags.contains(OFlags::APPEND))
            .truncate(flags.contains(OFlags::TRUNC))
            .create(flags.contains(OFlags::CREATE))
            .create_new(flags.contains(OFlags::CREATE | OFlags::EXCL))
            ._cap_fs_ext_maybe_dir(true)
            ._cap_fs_ext_follow(if flags.contains(OFlags::NOFOLLOW) {
                FollowSymlinks::No
            } else {
                FollowSymlinks::Yes
            });
        let rest = flags & (OFlags::PATH | OFlags::DIRECTORY);
        o.custom_flags(rest.bits() as i32).mode(mode.as_raw_mode());
        match cap_primitives::fs::open(&start, rel, &o) {
            Ok(f) => Ok(OwnedFd::from(f)),
            // What cap_primitives answers for a path that would leave the tree.
            Err(e)
                if e.kind() == std::io::ErrorKind::PermissionDenied && e.to_string().contains("outside") =>
            {
                Err(Error::Escape(shown.display().to_string()))
            }
            Err(e) => Err(Error::io(shown.display().to_string(), e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A workspace with a file, a directory, a link inside it and a link out of it, and a file
    /// beside it.
    fn tree() -> (tempfile::TempDir, Workspace) {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("ws");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("a.txt"), "hi\n").unwrap();
        std::fs::write(d.path().join("outside"), "no\n").unwrap();
        std::os::unix::fs::symlink("a.txt", root.join("in")).unwrap();
        std::os::unix::fs::symlink(d.path().join("outside"), root.join("out")).unwrap();
        std::os::unix::fs::symlink("../../outside", root.join("sub/up")).unwrap();
        let fd = rustix::fs::open(&root, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
            .unwrap();
        (d, Workspace { root, canonical: None, fd })
    }

    fn read(fd: OwnedFd) -> String {
        std::io::read_to_string(std::fs::File::from(fd)).unwrap()
    }

    /// Without openat2 (as in an agent's sandbox) a path is confined as with it: what stays
    /// inside opens, through links too; what leaves, by `..` or by a link, is an escape.
    #[test]
    fn without_openat2_paths_stay_beneath_the_workspace() {
        let (_d, ws) = tree();
        type Open = fn(&Workspace, &Path, &Path, OFlags, Mode) -> Result<OwnedFd>;
        let ways: [(&str, Open); 2] =
            [("openat2", Workspace::beneath), ("by components", Workspace::beneath_by_components)];
        for (how, open) in ways {
            let o = |p: &str, f: OFlags| open(&ws, Path::new(p), Path::new(p), f, Mode::empty());
            assert_eq!(read(o("a.txt", OFlags::RDONLY).unwrap()), "hi\n", "{how}");
            assert_eq!(read(o("in", OFlags::RDONLY).unwrap()), "hi\n", "{how}: a link inside");
            assert_eq!(read(o("sub/../a.txt", OFlags::RDONLY).unwrap()), "hi\n", "{how}");
            for p in ["../outside", "out", "sub/up", "sub/../../outside"] {
                let r = o(p, OFlags::RDONLY);
                assert!(matches!(r, Err(Error::Escape(_))), "{how}: {p} left the workspace: {r:?}");
            }
            assert!(o("sub", OFlags::RDONLY | OFlags::DIRECTORY).is_ok(), "{how}");
            // The link itself, not followed.
            let l = o("out", OFlags::PATH | OFlags::NOFOLLOW).unwrap();
            let st = rustix::fs::fstat(&l).unwrap();
            assert_eq!(
                rustix::fs::FileType::from_raw_mode(st.st_mode),
                rustix::fs::FileType::Symlink,
                "{how}"
            );
            let name = format!("new-{}", how.len());
            let create = || {
                let new = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL;
                open(&ws, Path::new(&name), Path::new(&name), new, Mode::from_raw_mode(0o600))
            };
            let f = create().unwrap();
            assert_eq!(rustix::fs::fstat(&f).unwrap().st_mode & 0o777, 0o600, "{how}");
            assert!(create().is_err(), "{how}: made once");
        }
    }
}
