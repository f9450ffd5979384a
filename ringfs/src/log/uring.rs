//! The io_uring commit path: the write, the evidence and the fsync are submitted as one linked
//! chain with a single `io_uring_enter`, on a small ring owned by the committing thread.
//!
//! Chosen at run time by [`probe`]; io_uring can be missing, disabled
//! (`/proc/sys/kernel/io_uring_disabled`) or filtered by seccomp, and then the portable twin in
//! `portable.rs` does the same work.

use std::cell::RefCell;
use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::OnceLock;

use io_uring::{IoUring, opcode, squeue, types};

use super::evidence::XATTR;
use super::portable;

thread_local! {
    static RING: RefCell<Option<IoUring>> = const { RefCell::new(None) };
}

/// Whether this process can use the io_uring path; the reason when it cannot.
pub(crate) fn probe() -> Result<(), String> {
    static PROBE: OnceLock<Result<(), String>> = OnceLock::new();
    PROBE
        .get_or_init(|| {
            let ring = IoUring::new(8).map_err(|e| format!("io_uring unavailable: {e}"))?;
            let mut p = io_uring::Probe::new();
            ring.submitter().register_probe(&mut p).map_err(|e| format!("io_uring probe failed: {e}"))?;
            for (code, name) in [
                (opcode::Write::CODE, "write"),
                (opcode::FSetXattr::CODE, "fsetxattr"),
                (opcode::Fsync::CODE, "fsync"),
            ] {
                if !p.is_supported(code) {
                    return Err(format!("io_uring lacks {name}"));
                }
            }
            Ok(())
        })
        .clone()
}

fn xattr_name() -> &'static CString {
    static NAME: OnceLock<CString> = OnceLock::new();
    NAME.get_or_init(|| CString::new(XATTR).expect("no NUL in the attribute name"))
}

/// Writes `batch` at `start`, sets the commit evidence and fsyncs, as one linked submission.
pub(crate) fn commit(file: &File, start: u64, batch: &[u8], evidence: &[u8]) -> io::Result<()> {
    let (Ok(len), Ok(elen)) = (u32::try_from(batch.len()), u32::try_from(evidence.len())) else {
        return portable::commit(file, start, batch, evidence);
    };
    RING.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(IoUring::new(8)?);
        }
        let ring = slot.as_mut().expect("just created");
        let fd = types::Fd(file.as_raw_fd());
        let name = xattr_name();
        let entries = [
            opcode::Write::new(fd, batch.as_ptr(), len)
                .offset(start)
                .build()
                .flags(squeue::Flags::IO_LINK)
                .user_data(0),
            opcode::FSetXattr::new(fd, name.as_ptr(), evidence.as_ptr().cast(), elen)
                .build()
                .flags(squeue::Flags::IO_LINK)
                .user_data(1),
            opcode::Fsync::new(fd).build().user_data(2),
        ];
        // SAFETY: every pointer in the entries (`batch`, `evidence`, `name`) stays valid until
        // this function returns, and it returns only after the kernel has posted a completion
        // for all three entries (the loop below), or after a submission error, which the kernel
        // reports only when it consumed none of them.
        unsafe {
            ring.submission().push_multiple(&entries).map_err(|_| io::Error::other("io_uring queue full"))?;
        }
        let mut results = [None::<i32>; 3];
        let mut seen = 0;
        while seen < 3 {
            match ring.submit_and_wait(3 - seen) {
                Ok(_) => {}
                Err(e)
                    if e.kind() == io::ErrorKind::Interrupted
                        || e.raw_os_error() == Some(rustix::io::Errno::BUSY.raw_os_error()) =>
                {
                    continue;
                }
                Err(e) if seen == 0 && ring.submission().len() == 3 => {
                    // Nothing was consumed: drop the entries and fail.
                    drop(slot.take());
                    return Err(e);
                }
                Err(e) => return Err(abandon(slot.take(), e)),
            }
            for cqe in ring.completion() {
                let i = usize::try_from(cqe.user_data()).unwrap_or(3);
                if let Some(r) = results.get_mut(i) {
                    *r = Some(cqe.result());
                    seen += 1;
                }
            }
        }
        let [w, x, s] = results.map(|r| r.unwrap_or(-rustix::io::Errno::CANCELED.raw_os_error()));
        if w < 0 {
            return Err(io::Error::from_raw_os_error(-w));
        }
        if usize::try_from(w).ok() != Some(batch.len()) {
            // A short write cut the chain; finish the rest the portable way.
            let done = usize::try_from(w).unwrap_or(0);
            return portable::commit(file, start + done as u64, &batch[done..], evidence);
        }
        if x < 0 {
            return Err(io::Error::from_raw_os_error(-x));
        }
        if s < 0 {
            return Err(io::Error::from_raw_os_error(-s));
        }
        Ok(())
    })
}

/// A ring whose `io_uring_enter` failed after it consumed some entries may still reference the
/// caller's buffers. It is leaked rather than dropped, and the log that owned the commit is marked
/// failed: at worst the kernel writes stale bytes past the acknowledged end, which recovery
/// cuts as a torn tail.
fn abandon(ring: Option<IoUring>, e: io::Error) -> io::Error {
    std::mem::forget(ring);
    io::Error::other(format!("io_uring failed mid-commit: {e}"))
}
