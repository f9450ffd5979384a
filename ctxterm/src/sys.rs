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

/// The signals that ask a supervisor to stop its run.
const STOP_SIGNALS: [libc::c_int; 3] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP];

fn stop_set() -> libc::sigset_t {
    // SAFETY: `sigemptyset` initialises the set before `sigaddset` reads it; both only write
    // the set given.
    #[allow(unsafe_code)]
    unsafe {
        let mut set = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
        libc::sigemptyset(set.as_mut_ptr());
        for s in STOP_SIGNALS {
            libc::sigaddset(set.as_mut_ptr(), s);
        }
        set.assume_init()
    }
}

/// Starts `cmd`'s child with the stop signals held (blocked, so kept pending): a stop asked
/// before the child has said where it can be found and how it takes a stop is carried out
/// once it has ([`release_stop_signals`]), never lost and never the default death.
#[allow(unsafe_code)]
pub fn hold_stop_signals(cmd: &mut Command) {
    let set = stop_set();
    // SAFETY: the closure runs in the forked child before exec and makes one async-signal-safe
    // call (sigprocmask) on a set built before the fork; it allocates nothing. The mask is kept
    // across exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Lets the calling thread take the stop signals again (any pending one is delivered now).
/// Called by a process started with [`hold_stop_signals`] once its handlers are in place,
/// before it starts threads of its own.
#[allow(unsafe_code)]
pub fn release_stop_signals() -> io::Result<()> {
    let set = stop_set();
    // SAFETY: `set` is an initialised signal set; the old mask is not asked for.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// Arranges for `cmd`'s child to become the agent before it execs, as `setpriv --reuid
/// --regid --groups|--clear-groups` did, in one process instead of a shell and setpriv: it moves
/// itself into the groups whose `cgroup.procs` files are open as `procs` (writing 0, "this
/// process"), takes `groups` (none: cleared), then `gid`, then `uid` (real, effective and
/// saved, so root's capabilities go with root's uid), finds `filter` (the seccomp program
/// bwrap loads) as descriptor 3, and takes no other descriptor beyond its streams.
#[allow(unsafe_code)]
pub fn become_agent(
    cmd: &mut Command,
    procs: Vec<OwnedFd>,
    (uid, gid, groups): (u32, u32, &[u32]),
    filter: Option<OwnedFd>,
) {
    let groups: Vec<rustix::process::Gid> =
        groups.iter().map(|g| rustix::process::Gid::from_raw(*g)).collect();
    let (uid, gid) = (rustix::process::Uid::from_raw(uid), rustix::process::Gid::from_raw(gid));
    // SAFETY: the closure runs in the forked child (one thread) before exec and makes only
    // async-signal-safe system calls through rustix and libc (write, setgroups, setresgid,
    // setresuid, dup2, fcntl, close_range) on values built before the fork; it allocates
    // nothing. The ids
    // set are per thread in the kernel, and the child has no other thread.
    unsafe {
        cmd.pre_exec(move || {
            for p in &procs {
                rustix::io::write(p, b"0").map_err(io::Error::from)?;
            }
            rustix::thread::set_thread_groups(&groups).map_err(io::Error::from)?;
            rustix::thread::set_thread_res_gid(gid, gid, gid).map_err(io::Error::from)?;
            rustix::thread::set_thread_res_uid(uid, uid, uid).map_err(io::Error::from)?;
            if let Some(f) = &filter {
                if f.as_raw_fd() == 3 {
                    rustix::io::fcntl_setfd(f, rustix::io::FdFlags::empty()).map_err(io::Error::from)?;
                } else if libc::dup2(f.as_raw_fd(), 3) != 3 {
                    return Err(io::Error::last_os_error());
                }
            }
            // Nothing else the supervisor inherited (from the daemon, from whoever started
            // it) reaches the sandbox: every other descriptor is closed at exec (marked rather
            // than closed now, so that a failed exec can still say why).
            let first: libc::c_uint = if filter.is_some() { 4 } else { 3 };
            if libc::syscall(libc::SYS_close_range, first, libc::c_uint::MAX, libc::CLOSE_RANGE_CLOEXEC) != 0
            {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}
