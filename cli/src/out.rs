//! Writing to stdout: a closed pipe ends the program quietly with exit 0.

use std::io::{self, Write};

/// Writes one line to stdout. A broken pipe exits the process with status 0, as `head` users
/// expect; other errors are returned.
pub fn line(s: impl std::fmt::Display) -> anyhow::Result<()> {
    let mut out = io::stdout().lock();
    match writeln!(out, "{s}") {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => std::process::exit(0),
        r => Ok(r?),
    }
}
