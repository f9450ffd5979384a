//! The portable commit path: `pwrite`, `fsetxattr`, `fsync`, one system call each.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use super::evidence::XATTR;

/// Writes `batch` at `start`, sets the commit evidence, and makes both durable.
///
/// `fsync`, not `fdatasync`: the evidence lives in the inode's extended attributes, which
/// `fdatasync` does not promise to persist.
pub(crate) fn commit(file: &File, start: u64, batch: &[u8], evidence: &[u8]) -> io::Result<()> {
    file.write_all_at(batch, start)?;
    set_evidence(file, evidence)?;
    file.sync_all()
}

/// Sets the commit evidence without syncing.
pub(crate) fn set_evidence(file: &File, evidence: &[u8]) -> io::Result<()> {
    rustix::fs::fsetxattr(file, XATTR, evidence, rustix::fs::XattrFlags::empty()).map_err(io::Error::from)
}
