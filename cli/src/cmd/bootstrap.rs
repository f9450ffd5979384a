//! `ctx bootstrap [SOURCE]`: the default layout, the core tools and tsh, installed into storage
//! through the object store. A storage it creates is made a configuration repository, the
//! bootstrapped configuration its first generation; in a storage that is one already, what it
//! installs or replaces is committed as its own change.
//!
//! What it installs and how: `coretools::bootstrap`. Idempotent: an object whose executable and
//! controls already match is left alone. `--check`
//! reports what is missing or outdated (exit 1 if anything is); `--dry-run` says what a
//! bootstrap would do.

use std::path::{Path, PathBuf};

use coretools::bootstrap::{self, Mode};

use crate::cmd::object::DEFAULT_STORAGE;
use crate::exit::{self, Exit};

/// Arguments of `ctx bootstrap`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The storage directory.
    #[arg(default_value = DEFAULT_STORAGE)]
    source: PathBuf,
    /// Where `cortexfs-core` and `tsh` are (default: beside ctx).
    #[arg(long)]
    bin: Option<PathBuf>,
    /// Only report what is missing or outdated; exit 1 if anything is.
    #[arg(long, conflicts_with = "dry_run")]
    check: bool,
    /// Say what would change, change nothing.
    #[arg(long)]
    dry_run: bool,
}

/// Runs `ctx bootstrap`.
pub fn run(a: Args) -> anyhow::Result<()> {
    let bin = match a.bin {
        Some(b) => b,
        None => std::env::current_exe()?.parent().map(Path::to_path_buf).unwrap_or_default(),
    };
    let mode = if a.check {
        Mode::Check
    } else if a.dry_run {
        Mode::DryRun
    } else {
        Mode::Apply
    };
    let new = !a.source.exists();
    let (said, changed) = bootstrap::run(&a.source, &bin, mode).map_err(|e| match &e {
        bootstrap::Error::Missing { .. } => Exit::new(exit::UNAVAILABLE, e.to_string()),
        bootstrap::Error::Storage(ringfs::Error::Io { source, .. })
            if source.kind() == std::io::ErrorKind::PermissionDenied =>
        {
            Exit::new(exit::DENIED, e.to_string())
        }
        bootstrap::Error::Storage(_) => Exit::new(exit::FAILURE, e.to_string()),
    })?;
    for line in &said {
        println!("{line}");
    }
    if mode == Mode::Apply && new {
        let id = ringfs::config::ensure(&a.source).map_err(|e| Exit::new(exit::FAILURE, e.to_string()))?;
        println!("generation {id} active: the configuration is a repository (ctx config)");
    } else if mode == Mode::Apply {
        let objects: Vec<String> = said
            .iter()
            .filter_map(|l| l.strip_prefix("install ").or_else(|| l.strip_prefix("replace ")))
            .map(|o| o.split(' ').next().unwrap_or(o).to_owned())
            .collect();
        if !objects.is_empty() {
            crate::cmd::config::own_objects(&a.source, &objects, "bootstrap: the core tools")?;
        }
    }
    if !changed {
        println!("up to date: {}", a.source.display());
    } else if a.check {
        return Err(Exit::quiet(exit::FAILURE).into());
    }
    Ok(())
}
