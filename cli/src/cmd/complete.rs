//! Shell completions: `ctx completions bash|zsh|fish` prints the script a shell loads. The
//! script asks `ctx` itself for each completion (`COMPLETE=SHELL ctx -- WORDS`), so commands,
//! flags and values come from this `ctx`, and agent and session names from what the daemon
//! serves at `/ctx` (or `$CTX_MOUNT`) at that moment.

use std::ffi::OsStr;
use std::path::Path;

use clap_complete::CompletionCandidate;
use clap_complete::env::EnvCompleter;

/// The host mount the names are read from: `$CTX_MOUNT`, else `/ctx`.
fn ctx() -> std::path::PathBuf {
    std::env::var_os("CTX_MOUNT").map_or_else(|| "/ctx".into(), Into::into)
}
/// The most names a completion reads from one directory.
const NAMES_MAX: usize = 4096;

/// Arguments of `ctx completions`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The shell.
    #[arg(value_enum)]
    shell: Shell,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum Shell {
    Bash,
    Zsh,
    Fish,
}

/// Runs `ctx completions SHELL`: the script, on standard output. Load it with
/// `source <(ctx completions bash)` (or zsh), `ctx completions fish | source`, or install it
/// (`make install` does).
pub fn run(a: Args) -> anyhow::Result<()> {
    let shell: &dyn EnvCompleter = match a.shell {
        Shell::Bash => &clap_complete::env::Bash,
        Shell::Zsh => &clap_complete::env::Zsh,
        Shell::Fish => &clap_complete::env::Fish,
    };
    let mut out = std::io::stdout().lock();
    shell.write_registration(VAR, "ctx", "ctx", "ctx", &mut out)?;
    Ok(())
}

/// The variable that asks `ctx` for completions.
pub const VAR: &str = "COMPLETE";

/// Names of the directory `dir` that start with `current`, at most [`NAMES_MAX`] read.
fn names(dir: &Path, current: &OsStr, keep: impl Fn(&str) -> bool) -> Vec<String> {
    let current = current.to_string_lossy();
    // root's or the caller's: read only, names listed (nothing is opened below)
    let Ok(rd) = std::fs::read_dir(dir) else { return Vec::new() };
    rd.take(NAMES_MAX)
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with(current.as_ref()) && keep(n))
        .collect()
}

/// Agent names: the objects in `/ctx/agent/`.
pub fn agents(current: &OsStr) -> Vec<CompletionCandidate> {
    let mut v = names(&ctx().join("agent"), current, |n| {
        !n.ends_with(".d") && !n.ends_with(".sock") && !n.starts_with('.')
    });
    v.sort();
    v.into_iter().map(CompletionCandidate::new).collect()
}

/// Session names: those of every agent in the homes under `/ctx/home/` the caller may list.
pub fn sessions(current: &OsStr) -> Vec<CompletionCandidate> {
    let home = ctx().join("home");
    let mut v: Vec<String> = Vec::new();
    'homes: for uid in names(&home, OsStr::new(""), |_| true) {
        for agent in names(&home.join(&uid).join("agent"), OsStr::new(""), |_| true) {
            let dir = home.join(&uid).join("agent").join(agent).join("session");
            v.extend(names(&dir, current, |n| !n.starts_with('.')));
            if v.len() >= NAMES_MAX {
                break 'homes;
            }
        }
    }
    v.sort();
    v.dedup();
    v.into_iter().map(CompletionCandidate::new).collect()
}
