//! The server's one errno table: every errno a reply carries is named here, by why it is given.
//!
//! The denial rules, in the order a view applies them:
//!
//! | why | errno | when |
//! |---|---|---|
//! | [`Why::NotFound`] | `ENOENT` | absent, or not visible in this view (the two look the same by design) |
//! | [`Why::NotPermitted`] | `EACCES` | visible, and not permitted: policy, mode bits, a runtime control, a handle without the access |
//! | [`Why::Object`] | `EPERM` | the root ABI's objects and namespace (installed executables, class directories, sockets, CortexFS's own attributes): changed only by their own tools |
//! | [`Why::ReadOnly`] | `EROFS` | the root, a records-only view, a read-only mount of the agent |
//!
//! Every other errno the server answers with is a row of [`Why`] too; an errno the backing
//! filesystem or the storage library gave is passed through unchanged ([`passed`]).
//! `scripts/layers` fails when a `libc::E…` constant appears in `server/src` outside this file.

use std::io;

/// Why a request is refused or failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    /// `ENOENT`: absent, or not visible in this view.
    NotFound,
    /// `EACCES`: visible, not permitted.
    NotPermitted,
    /// `EPERM`: the root ABI's objects and namespace.
    Object,
    /// `EROFS`: served read-only here.
    ReadOnly,
    /// `EINVAL`: malformed: a control's content, an offset, a flag, a request.
    Invalid,
    /// `ENODATA`: no such extended attribute.
    NoAttribute,
    /// `ERANGE`: the caller's buffer is too small for the answer.
    BufferTooSmall,
    /// `EISDIR`: a directory where a file is needed.
    IsDirectory,
    /// `ENOTDIR`: not a directory where one is needed.
    NotDirectory,
    /// `EFBIG`: over a control's or a log line's size limit.
    TooLarge,
    /// `EOPNOTSUPP`: not supported on this kind of file or area.
    Unsupported,
    /// `EIO`: the backing storage failed, or a reply could not be made.
    Io,
    /// `ENOMEM`: no buffer for the request.
    NoMemory,
    /// `ESTALE`: a handle or inode the server no longer knows.
    Stale,
    /// `ENOSYS`: an operation this server does not implement.
    NotImplemented,
    /// `EBUSY`: in use (a mount point, the storage root).
    Busy,
    /// `EBADF`: a file handle that is not open, or not for this.
    BadHandle,
    /// `ENOTCONN`: the connection to the kernel is gone.
    NotConnected,
    /// `ENOSPC`: the storage is full.
    NoSpace,
    /// `ELOOP`: a symbolic link where none may be followed.
    Loop,
    /// `EINTR`: interrupted; tried again.
    Interrupted,
    /// `ECANCELED`: cancelled by the kernel (an unmount).
    Cancelled,
    /// `EAGAIN`: nothing yet; try again.
    TryAgain,
    /// `E2BIG`: an input over its size limit (a list of extended attribute names).
    ArgumentTooLong,
    /// `EEXIST`: a name that is taken.
    Exists,
    /// `ENAMETOOLONG`: a name or path over the kernel's limits.
    NameTooLong,
    /// `EDQUOT`: over the agent's disk ceiling (`limits`: `disk`, `files`).
    OverQuota,
}

impl Why {
    /// The errno.
    pub const fn errno(self) -> i32 {
        match self {
            Why::NotFound => libc::ENOENT,
            Why::NotPermitted => libc::EACCES,
            Why::Object => libc::EPERM,
            Why::ReadOnly => libc::EROFS,
            Why::Invalid => libc::EINVAL,
            Why::NoAttribute => libc::ENODATA,
            Why::BufferTooSmall => libc::ERANGE,
            Why::IsDirectory => libc::EISDIR,
            Why::NotDirectory => libc::ENOTDIR,
            Why::TooLarge => libc::EFBIG,
            Why::Unsupported => libc::EOPNOTSUPP,
            Why::Io => libc::EIO,
            Why::NoMemory => libc::ENOMEM,
            Why::Stale => libc::ESTALE,
            Why::NotImplemented => libc::ENOSYS,
            Why::Busy => libc::EBUSY,
            Why::BadHandle => libc::EBADF,
            Why::NotConnected => libc::ENOTCONN,
            Why::NoSpace => libc::ENOSPC,
            Why::Loop => libc::ELOOP,
            Why::Interrupted => libc::EINTR,
            Why::Cancelled => libc::ECANCELED,
            Why::TryAgain => libc::EAGAIN,
            Why::ArgumentTooLong => libc::E2BIG,
            Why::Exists => libc::EEXIST,
            Why::NameTooLong => libc::ENAMETOOLONG,
            Why::OverQuota => libc::EDQUOT,
        }
    }
}

impl From<Why> for io::Error {
    fn from(w: Why) -> io::Error {
        io::Error::from_raw_os_error(w.errno())
    }
}

impl From<policy::errno::Errno> for Why {
    /// The policy crate's refusals, in this table's terms.
    fn from(e: policy::errno::Errno) -> Why {
        use policy::errno::Errno;
        match e {
            Errno::Eperm => Why::Object,
            Errno::Enoent => Why::NotFound,
            Errno::Eacces => Why::NotPermitted,
            Errno::Eexist => Why::Exists,
            Errno::Einval => Why::Invalid,
            Errno::Enametoolong => Why::NameTooLong,
            Errno::Erofs => Why::ReadOnly,
            Errno::E2big => Why::ArgumentTooLong,
        }
    }
}

/// The error a reply carries for `why`.
pub fn err(why: Why) -> io::Error {
    why.into()
}

/// An errno the backing filesystem or the storage library gave, passed through as it is.
pub fn passed(code: i32) -> io::Error {
    io::Error::from_raw_os_error(code)
}

/// Whether `e` carries the errno of `why`.
pub fn is(e: &io::Error, why: Why) -> bool {
    e.raw_os_error() == Some(why.errno())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The denial rules' errnos, as the manual pages give them.
    #[test]
    fn the_denial_rules() {
        let rows = [
            (Why::NotFound, libc::ENOENT),
            (Why::NotPermitted, libc::EACCES),
            (Why::Object, libc::EPERM),
            (Why::ReadOnly, libc::EROFS),
        ];
        for (why, errno) in rows {
            assert_eq!(why.errno(), errno, "{why:?}");
            assert!(is(&err(why), why));
        }
        assert_eq!(Why::from(policy::errno::Errno::Eacces), Why::NotPermitted);
    }
}
