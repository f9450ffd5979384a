//! `ctx config`: the storage's configuration generations (status, diff, commit, log,
//! rollback). A commit is the only event that changes what agents are served.

use std::path::{Path, PathBuf};

use clap::Subcommand;
use ringfs::config::{self as generations, Commit, Error};

use crate::cmd::object::DEFAULT_STORAGE;
use crate::exit::{self, Exit};
use crate::out;

/// `ctx config` subcommands.
#[derive(Debug, Subcommand)]
pub enum Cmd {
    /// The staged changes against the active generation (A added, M modified, D deleted).
    Status(At),
    /// The staged changes, line by line.
    Diff(At),
    /// Activate the staged configuration as a new generation (the first commit makes the
    /// storage's configuration a repository).
    Commit {
        #[command(flatten)]
        at: At,
        /// What changed and why.
        #[arg(short, long)]
        message: String,
        /// Only the staged changes at or below these storage paths (`agent/coder.d/mount`,
        /// `tool/hello`); the rest stays staged. All of them when none is given.
        paths: Vec<String>,
    },
    /// The generations, newest first: id, time, who, what.
    Log {
        #[command(flatten)]
        at: At,
        /// At most this many.
        #[arg(short = 'n', long, default_value_t = 20)]
        max: usize,
    },
    /// Activate an older generation's configuration as a new commit (the work tree follows).
    Rollback {
        #[command(flatten)]
        at: At,
        /// The generation: an id, a prefix of one (4 hex digits or more), or HEAD~N.
        rev: String,
    },
}

/// Where the storage is.
#[derive(Debug, clap::Args)]
pub struct At {
    /// The storage directory.
    #[arg(long, default_value = DEFAULT_STORAGE)]
    pub source: PathBuf,
}

/// Who makes a change from this command line: the user, by uid (and by name through sudo).
pub fn who() -> String {
    let uid = rustix::process::getuid().as_raw();
    match std::env::var("SUDO_USER") {
        Ok(u) if !u.is_empty() => format!("uid {uid} (sudo by {u})"),
        _ => format!("uid {uid}"),
    }
}

fn failed(e: Error) -> anyhow::Error {
    let code = match e {
        Error::Invalid(_) | Error::NoRevision(_) => exit::INVALID,
        Error::Io { .. } | Error::Git(_) => exit::FAILURE,
    };
    Exit::new(code, e.to_string()).into()
}

/// Commits the staged changes below `paths` (a command's own change) when the storage's
/// configuration is a repository, with `message` saying what and who; returns the new
/// generation. Nothing is done for a storage that is not one.
pub fn own_change(storage: &Path, paths: &[String], message: &str) -> anyhow::Result<Option<String>> {
    if !generations::has_repository(storage) {
        return Ok(None);
    }
    let who = who();
    let c = Commit { message: &format!("{message}\n\nby {who}"), who: &who, only: Some(paths) };
    generations::commit_own(storage, &c).map_err(failed)
}

/// Refuses (1) before a command edits `files` for a commit of its own when any of them holds
/// a staged change already: that change would go active under the command's message.
pub fn unstaged(storage: &Path, files: &[String]) -> anyhow::Result<()> {
    let staged = generations::staged_in(storage, files).map_err(failed)?;
    if staged.is_empty() {
        return Ok(());
    }
    Err(Exit::new(
        exit::FAILURE,
        format!(
            "{} {} staged changes of {}: commit them (ctx config commit -m MSG PATH) or put them back first (ctx config diff)",
            staged.join(", "),
            if staged.len() == 1 { "has" } else { "have" },
            if staged.len() == 1 { "its own" } else { "their own" },
        ),
    )
    .into())
}

/// [`own_change`] of the system tier's objects `objects` (`tool/x`, `model/p/m`): each with its
/// control directory; then waits until the daemon serving the storage, if any, serves it.
pub fn own_objects(storage: &Path, objects: &[String], message: &str) -> anyhow::Result<()> {
    own_objects_and(storage, objects, &[], message)
}

/// [`own_objects`] with the repository paths `more` (a package's record, `package/NAME.json`).
pub fn own_objects_and(
    storage: &Path,
    objects: &[String],
    more: &[String],
    message: &str,
) -> anyhow::Result<()> {
    let mut paths: Vec<String> = objects.iter().flat_map(|o| [o.clone(), format!("{o}.d")]).collect();
    paths.extend(more.iter().cloned());
    if let Some(id) = own_change(storage, &paths, message)?
        && let Some(ctx) = crate::cmd::agent::served_at(storage)
    {
        served(&ctx, &id);
    }
    Ok(())
}

/// Waits (up to 3 s) until the daemon serving `storage` at `ctx` serves generation `id`.
pub fn served(ctx: &Path, id: &str) {
    if ctxterm::launch::contract::served(ctx, id) {
        return;
    }
    tracing::warn!(
        generation = id,
        ctx = %ctx.display(),
        "the generation is committed and active, but the daemon has not said it serves it yet"
    );
}

/// Runs `ctx config ...`.
pub fn run(cmd: Cmd) -> anyhow::Result<()> {
    match cmd {
        Cmd::Status(at) => {
            let changes = generations::status(&at.source).map_err(failed)?;
            if !generations::is_repository(&at.source) {
                out::line(
                    "not a repository yet: agents are served the storage as it is (ctx config commit makes the first generation)",
                )?;
            }
            for c in changes {
                out::line(format_args!("{} {}", c.kind, c.path))?;
            }
            Ok(())
        }
        Cmd::Diff(at) => {
            let d = generations::diff(&at.source).map_err(failed)?;
            for l in d.lines() {
                out::line(l)?;
            }
            Ok(())
        }
        Cmd::Commit { at, message, paths } => {
            if message.trim().is_empty() {
                return Err(
                    Exit::new(exit::INVALID, "a commit needs a message (-m): what changed and why").into()
                );
            }
            for p in &paths {
                if !generations::tracked(p) {
                    return Err(Exit::new(
                        exit::INVALID,
                        format!("{p}: not configuration (a path below tool/, agent/ or model/, not a log or a socket)"),
                    )
                    .into());
                }
            }
            let who = who();
            let c = Commit { message: &message, who: &who, only: (!paths.is_empty()).then_some(&paths[..]) };
            match generations::commit(&at.source, &c).map_err(failed)? {
                Some(id) => {
                    if let Some(ctx) = crate::cmd::agent::served_at(&at.source) {
                        served(&ctx, &id);
                    }
                    out::line(format_args!("generation {id} active"))
                }
                None => out::line("nothing staged: the active generation stays"),
            }
        }
        Cmd::Log { at, max } => {
            for g in generations::log(&at.source, max).map_err(failed)? {
                let when = humantime::format_rfc3339_seconds(
                    std::time::UNIX_EPOCH + std::time::Duration::from_secs(g.time.max(0) as u64),
                );
                let first = g.message.lines().next().unwrap_or("");
                out::line(format_args!("{} {when} {}: {first}", &g.id[..12], g.who))?;
            }
            Ok(())
        }
        Cmd::Rollback { at, rev } => {
            let id = generations::rollback(&at.source, &rev, &who()).map_err(failed)?;
            if let Some(ctx) = crate::cmd::agent::served_at(&at.source) {
                served(&ctx, &id);
            }
            out::line(format_args!("generation {id} active (the configuration of {rev})"))
        }
    }
}
