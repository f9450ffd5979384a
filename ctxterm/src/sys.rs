//! The raw calls ctxterm needs around `fork`: making the child a session leader with the PTY as
//! its controlling terminal.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::Command;

/// Arranges for `cmd`'s child to start a new session, take `tty` as its controlling terminal and
/// die with its parent.
#[allow(unsafe_code)]
pub fn controlling_tty(cmd: &mut Command, tty: &OwnedFd) {
    let raw = tty.as_raw_fd();
    // SAFETY: the closure runs in the forked child before exec and only makes async-signal-safe
    // system calls (setsid, ioctl(TIOCSCTTY), prctl(PR_SET_PDEATHSIG)) through rustix, which
    // allocate nothing; `raw` is an open descriptor inherited by the child (stdin/stdout/stderr
    // are dups of it).
    unsafe {
        cmd.pre_exec(move || {
            rustix::process::setsid().map_err(io::Error::from)?;
            let fd = rustix::fd::BorrowedFd::borrow_raw(raw);
            rustix::process::ioctl_tiocsctty(fd).map_err(io::Error::from)?;
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
                .map_err(io::Error::from)?;
            Ok(())
        });
    }
}
