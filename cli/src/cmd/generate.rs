//! `ctx generate man|completions DIR`: man pages (one per command and subcommand, from the clap
//! definitions) and shell completions, for packagers and `make`.

use std::path::PathBuf;

use clap::ValueEnum;

/// What to generate.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum What {
    /// Man pages, section 1: ctx.1, ctx-agent.1, ctx-agent-start.1...
    Man,
    /// Completions for bash, zsh and fish.
    Completions,
}

/// Arguments of `ctx generate`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// What to write.
    #[arg(value_enum)]
    what: What,
    /// The directory to write into (created if missing).
    dir: PathBuf,
}

/// Runs `ctx generate`.
pub fn run(a: Args, cmd: clap::Command) -> anyhow::Result<()> {
    std::fs::create_dir_all(&a.dir)?;
    match a.what {
        What::Man => clap_mangen::generate_to(cmd, &a.dir)?,
        What::Completions => {
            let mut cmd = cmd;
            for shell in [clap_complete::Shell::Bash, clap_complete::Shell::Zsh, clap_complete::Shell::Fish] {
                clap_complete::generate_to(shell, &mut cmd, "ctx", &a.dir)?;
            }
        }
    }
    Ok(())
}
