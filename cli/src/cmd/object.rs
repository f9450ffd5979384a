//! `ctx object ...`: the object lifecycle.

use std::path::PathBuf;

use clap::Subcommand;

use crate::exit::{self, Exit};
use crate::out;

/// Object manifests and installs.
#[derive(Debug, Subcommand)]
pub enum Cmd {
    /// Check a cortexfs.object/v2 manifest and every file it names.
    ///
    /// Prints `MANIFEST: FIELD: PROBLEM` for every problem and exits 2 if there is any;
    /// prints `ok CLASS/NAME VERSION` and exits 0 otherwise.
    Check {
        /// The manifest file.
        manifest: PathBuf,
    },
}

/// Runs the command.
pub fn run(cmd: Cmd) -> anyhow::Result<()> {
    match cmd {
        Cmd::Check { manifest } => match ringfs::object::check(&manifest) {
            Ok(c) => out::line(format_args!(
                "ok {}/{} {}",
                c.manifest.class.as_str(),
                c.manifest.name,
                c.manifest.version
            )),
            Err(problems) => {
                for p in &problems {
                    if p.field.is_empty() {
                        out::line(format_args!("{}: {}", manifest.display(), p.message))?;
                    } else {
                        out::line(format_args!("{}: {}: {}", manifest.display(), p.field, p.message))?;
                    }
                }
                Err(Exit::quiet(exit::INVALID).into())
            }
        },
    }
}
