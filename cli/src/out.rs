//! Writing to stdout: a closed pipe ends the program quietly with exit 0.

use std::io::{self, Write};

/// A human listing: tab-separated rows under one header line of upper-case column names,
/// written with the first row (an empty listing writes nothing). `--json` gives the same rows
/// as objects.
pub struct Listing {
    header: &'static str,
    started: bool,
}

impl Listing {
    /// A listing whose columns are `header` (tab-separated).
    pub fn new(header: &'static str) -> Listing {
        Listing { header, started: false }
    }

    /// Writes one row (its columns tab-separated), the header first.
    pub fn row(&mut self, s: impl std::fmt::Display) -> anyhow::Result<()> {
        if !self.started {
            self.started = true;
            line(self.header)?;
        }
        line(s)
    }
}

/// Writes one line to stdout. A broken pipe exits the process with status 0, as `head` users
/// expect; other errors are returned.
pub fn line(s: impl std::fmt::Display) -> anyhow::Result<()> {
    let mut out = io::stdout().lock();
    match writeln!(out, "{s}") {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => std::process::exit(0),
        r => Ok(r?),
    }
}
