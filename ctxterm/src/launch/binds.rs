//! Binds prepared outside the sandbox, with what bubblewrap's own binds cannot say: mount
//! flags (`nosuid`, `nodev`, `noexec`, read-only) and an idmapping. The launcher makes each one
//! under the run's directory (`open_tree` clone, `mount_setattr`, `move_mount`) and binds that
//! into the sandbox, where its flags are locked (a mount namespace of another user namespace
//! cannot clear them).
//!
//! The operator's workspace for an agent with an identity of its own is an idmapped bind.
//!
//! An agent runs as its own uid, but the workspace it is handed belongs to the operator. The
//! launcher binds it at `/workspace` through an idmapped mount (Linux 5.12+, on filesystems
//! that support it: ext4, xfs, btrfs, tmpfs and others) whose mapping shows the workspace
//! owner's uid and gid as the agent's: the agent reads and edits the operator's files as their
//! owner, and whatever it creates or changes is stored as the operator's. Nothing else is
//! mapped: files of other owners show as the overflow id (nobody) and keep their mode bits.
//! Where the filesystem cannot be idmapped, [`bind`] says why and the launcher falls back to a
//! plain bind (the agent then has only what mode bits give its own uid).
#![allow(unsafe_code)]

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rustix::mount::{MoveMountFlags, OpenTreeFlags};

/// Why the idmapped bind could not be made.
#[derive(Debug, thiserror::Error)]
#[error("bind of {what}: {why}")]
pub struct Error {
    what: String,
    why: String,
}

fn fail(what: &Path, why: impl std::fmt::Display) -> Error {
    Error { what: what.display().to_string(), why: why.to_string() }
}

/// A user namespace whose mapping is `uid`/`gid` (on disk) -> `as_uid`/`as_gid` (shown).
fn userns(uid: u32, gid: u32, as_uid: u32, as_gid: u32) -> Result<OwnedFd, String> {
    // A process that only holds the namespace while its mapping is written and opened.
    let mut holder = Command::new("unshare")
        .args(["--user", "--", "sleep", "30"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("unshare: {e}"))?;
    let proc = format!("/proc/{}", holder.id());
    let ours = std::fs::read_link("/proc/self/ns/user").map_err(|e| e.to_string())?;
    let t = Instant::now();
    let result = (|| {
        while std::fs::read_link(format!("{proc}/ns/user")).map_err(|e| e.to_string())? == ours {
            if t.elapsed() > Duration::from_secs(5) {
                return Err("the namespace holder did not unshare".to_owned());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        std::fs::write(format!("{proc}/uid_map"), format!("{uid} {as_uid} 1\n"))
            .map_err(|e| format!("uid_map: {e}"))?;
        std::fs::write(format!("{proc}/gid_map"), format!("{gid} {as_gid} 1\n"))
            .map_err(|e| format!("gid_map: {e}"))?;
        std::fs::File::open(format!("{proc}/ns/user")).map(OwnedFd::from).map_err(|e| e.to_string())
    })();
    let _ = holder.kill();
    let _ = holder.wait();
    result
}

/// What a prepared bind applies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Attrs {
    /// Show the owner `(uid, gid)` as `(as_uid, as_gid)`.
    pub idmap: Option<((u32, u32), (u32, u32))>,
    /// `nosuid`.
    pub nosuid: bool,
    /// `nodev`.
    pub nodev: bool,
    /// `noexec`.
    pub noexec: bool,
    /// Read-only.
    pub rdonly: bool,
}

/// Binds `source` at `target` (an existing empty directory) with `attrs`.
pub fn bind(source: &Path, target: &Path, attrs: &Attrs) -> Result<(), Error> {
    let ns = match attrs.idmap {
        Some(((uid, gid), (as_uid, as_gid))) => {
            Some(userns(uid, gid, as_uid, as_gid).map_err(|e| fail(source, e))?)
        }
        None => None,
    };
    let mut set = 0;
    for (on, flag) in [
        (ns.is_some(), libc::MOUNT_ATTR_IDMAP),
        (attrs.nosuid, libc::MOUNT_ATTR_NOSUID),
        (attrs.nodev, libc::MOUNT_ATTR_NODEV),
        (attrs.noexec, libc::MOUNT_ATTR_NOEXEC),
        (attrs.rdonly, libc::MOUNT_ATTR_RDONLY),
    ] {
        if on {
            set |= flag;
        }
    }
    let tree = rustix::mount::open_tree(
        rustix::fs::CWD,
        source,
        OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC,
    )
    .map_err(|e| fail(source, format!("open_tree: {e}")))?;
    let attr = libc::mount_attr {
        attr_set: set,
        attr_clr: 0,
        propagation: 0,
        userns_fd: ns.as_ref().map_or(0, |n| n.as_raw_fd() as u64),
    };
    // SAFETY: mount_setattr(2) reads `size_of::<mount_attr>()` bytes from `&attr`, which is a
    // live, initialized `struct mount_attr`; the path is a NUL-terminated empty string and
    // `tree` an open descriptor for the whole call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_fd().as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            &attr as *const libc::mount_attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        let why = if ns.is_some() { " (the filesystem may not support idmapped mounts)" } else { "" };
        return Err(fail(source, format!("mount_setattr: {e}{why}")));
    }
    rustix::mount::move_mount(
        tree.as_fd(),
        "",
        rustix::fs::CWD,
        target,
        MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
    )
    .map_err(|e| fail(source, format!("move_mount: {e}")))?;
    Ok(())
}
