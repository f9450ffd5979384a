//! The errno values policy decisions and parse errors carry.
//!
//! Linux numbers are spelled out here so that this crate stays free of libc; the FUSE dispatch
//! turns them into replies and the CLI prints their names.

use std::fmt;

/// An errno a refusal or a parse error maps to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Errno {
    /// Operation not permitted.
    Eperm,
    /// No such file or directory: the object is not visible.
    Enoent,
    /// Permission denied.
    Eacces,
    /// File exists.
    Eexist,
    /// Invalid argument: malformed input.
    Einval,
    /// Read-only file system.
    Erofs,
    /// File name too long.
    Enametoolong,
    /// Argument list too long: an input over its size limit.
    E2big,
}

impl Errno {
    /// The symbolic name, as printed by `ctx policy check`.
    pub fn name(self) -> &'static str {
        match self {
            Errno::Eperm => "EPERM",
            Errno::Enoent => "ENOENT",
            Errno::Eacces => "EACCES",
            Errno::Eexist => "EEXIST",
            Errno::Einval => "EINVAL",
            Errno::Erofs => "EROFS",
            Errno::Enametoolong => "ENAMETOOLONG",
            Errno::E2big => "E2BIG",
        }
    }

    /// The Linux errno number.
    pub fn code(self) -> i32 {
        match self {
            Errno::Eperm => 1,
            Errno::Enoent => 2,
            Errno::Eacces => 13,
            Errno::Eexist => 17,
            Errno::Einval => 22,
            Errno::Erofs => 30,
            Errno::Enametoolong => 36,
            Errno::E2big => 7,
        }
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
