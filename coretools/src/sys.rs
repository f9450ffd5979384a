//! The one raw call the tools need: `close` with its error reported.

use std::fs::File;
use std::io;
use std::os::fd::{IntoRawFd, OwnedFd};

/// Closes `file` and reports what `close(2)` says: a FUSE mount (and NFS) reports errors found
/// when the last write is flushed here, and the `/ctx` mount validates a control here.
#[allow(unsafe_code)]
pub(crate) fn close(file: File) -> io::Result<()> {
    let fd = OwnedFd::from(file).into_raw_fd();
    // SAFETY: `fd` was just released from an `OwnedFd`, so it is open and owned by no one else,
    // and nothing uses it after this call, whatever the call returns.
    unsafe { rustix::io::try_close(fd) }.map_err(io::Error::from)
}
