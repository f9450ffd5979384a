//! The one error type of ringfs.

use std::io;
use std::path::PathBuf;

/// A ringfs result.
pub type Result<T> = std::result::Result<T, Error>;

/// Everything that can go wrong in ringfs.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A system call failed.
    #[error("{op} {path}: {source}", path = path.display())]
    Io {
        /// What was being done.
        op: &'static str,
        /// On what.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// An append was refused whole: nothing of it was written.
    #[error("append refused: {0}")]
    Invalid(String),
    /// An append at an offset that is not the end of the log.
    #[error("append at offset {offset} refused: the log ends at {end}")]
    NotAtEnd {
        /// The offset asked for.
        offset: u64,
        /// The end of the log (acknowledged plus queued bytes).
        end: u64,
    },
    /// A durability failure stopped this log; nothing after it is acknowledged.
    #[error("{path}: log stopped after a failed sync ({reason}); reopen it to recover", path = path.display())]
    Stopped {
        /// The log.
        path: PathBuf,
        /// The first failure.
        reason: String,
    },
    /// Acknowledged data or its evidence is damaged. Never repaired silently.
    #[error("{path}: damaged: {reason}", path = path.display())]
    Damaged {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// Another process holds the file.
    #[error("{path}: in use by another process", path = path.display())]
    Busy {
        /// The file.
        path: PathBuf,
    },
    /// The request conflicts with what is in storage (already installed, nothing to remove...).
    #[error("{0}")]
    Conflict(String),
    /// The storage lacks something ringfs needs.
    #[error("{path}: unsupported storage: {reason}", path = path.display())]
    Unsupported {
        /// Where it was found out.
        path: PathBuf,
        /// What is missing.
        reason: String,
    },
}

impl Error {
    /// Wraps an I/O error with the operation and path.
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Error {
        Error::Io { op, path: path.into(), source }
    }

    /// The errno a filesystem front end should answer with.
    pub fn errno(&self) -> i32 {
        use rustix::io::Errno;
        match self {
            Error::Io { source, .. } => source.raw_os_error().unwrap_or(Errno::IO.raw_os_error()),
            Error::Invalid(_) | Error::NotAtEnd { .. } => Errno::INVAL.raw_os_error(),
            Error::Stopped { .. } | Error::Damaged { .. } => Errno::IO.raw_os_error(),
            Error::Busy { .. } => Errno::BUSY.raw_os_error(),
            Error::Conflict(_) => Errno::EXIST.raw_os_error(),
            Error::Unsupported { .. } => Errno::NOTSUP.raw_os_error(),
        }
    }
}
