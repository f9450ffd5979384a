//! `ctx doctor`: what this host needs for CortexFS, each check with what to do when it fails
//! (`ctxterm::launch::doctor`). Exit 0 only when every check holds, 1 otherwise.

use std::path::PathBuf;

use ctxterm::launch::doctor::{self, Host};

use crate::cmd::object::DEFAULT_STORAGE;
use crate::exit::{self, Exit};
use crate::out;

/// Arguments of `ctx doctor`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The storage.
    #[arg(long, default_value = DEFAULT_STORAGE)]
    source: PathBuf,
    /// The host's /ctx mount.
    #[arg(long, default_value = "/ctx")]
    ctx: PathBuf,
    /// The daemon's control socket.
    #[arg(long, default_value = policy::runtime::CONTROL_SOCKET)]
    control: PathBuf,
    /// Print a JSON array of {"name","ok","detail","fix"}.
    #[arg(long)]
    json: bool,
    /// Remove the run state of supervisors that are gone (each run's mounts are detached
    /// first; nothing is removed across a mount), then check.
    #[arg(long)]
    fix_runs: bool,
}

/// Runs `ctx doctor`.
pub fn run(a: Args) -> anyhow::Result<()> {
    if a.fix_runs {
        for (d, r) in doctor::fix_runs(&a.control) {
            match r {
                Ok(()) => eprintln!("ctx: removed {}", d.display()),
                Err(e) => eprintln!("ctx: {} stays: {e}", d.display()),
            }
        }
    }
    let checks = doctor::run(&Host { storage: &a.source, ctx: &a.ctx, control: &a.control });
    if a.json {
        out::line(serde_json::to_string(&checks)?)?;
    } else {
        for c in &checks {
            out::line(format_args!("{} {}: {}", if c.ok { "ok  " } else { "FAIL" }, c.name, c.detail))?;
            if let Some(fix) = &c.fix {
                out::line(format_args!("     fix: {fix}"))?;
            }
        }
    }
    if checks.iter().all(|c| c.ok) { Ok(()) } else { Err(Exit::quiet(exit::FAILURE).into()) }
}
