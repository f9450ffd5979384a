//! The workspace. In an agent's run (`/ctx/status` or `$CTX_ROOT/status` is an agent's view) it
//! is the run's, as the view's `status` names it, whatever the environment says: a variable
//! the agent can set never chooses what a tool may touch; a run without a workspace has none.
//! For people: `CTX_WORKSPACE`, else `/workspace` when it exists, else the current directory.
//! Paths are taken relative to it (absolute ones must lie under it) and opened with
//! `openat2(RESOLVE_BENEATH)` from a descriptor of it, so neither `..` nor a symlink can leave it.

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
                Err(Errno::NOSYS) => {
                    return Err(Error::Internal(
                        "openat2 is not available (Linux 5.6 or later is needed)".into(),
                    ));
                }
                Err(e) => return Err(Error::io(shown.display().to_string(), e)),
            }
        }
    }
}
