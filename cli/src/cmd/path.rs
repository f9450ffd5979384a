//! `ctx path KIND NAME` and `ctx status`: where things are under `/ctx`, and what the daemon
//! says of itself.

use std::path::PathBuf;

use clap::Subcommand;

use crate::exit::{self, Exit};
use crate::out;

/// What `ctx path` names.
#[derive(Debug, Subcommand)]
pub enum Kind {
    /// A shared space: /ctx/shared/NAME (it need not exist yet: `mkdir -p "$(ctx path shared p)/input"`).
    Shared {
        /// The space.
        name: String,
        #[command(flatten)]
        at: At,
    },
    /// A tool: /ctx/tool/NAME.
    Tool {
        /// The tool.
        name: String,
        #[command(flatten)]
        at: At,
    },
    /// An agent: /ctx/agent/NAME.
    Agent {
        /// The agent.
        #[arg(add = clap_complete::ArgValueCompleter::new(crate::cmd::complete::agents))]
        name: String,
        #[command(flatten)]
        at: At,
    },
    /// A session of an agent: /ctx/home/UID/agent/NAME/session/SESSION (UID from agent/NAME.d/uid).
    Session {
        /// The agent.
        #[arg(add = clap_complete::ArgValueCompleter::new(crate::cmd::complete::agents))]
        name: String,
        /// The session.
        #[arg(long, default_value = "default", add = clap_complete::ArgValueCompleter::new(crate::cmd::complete::sessions))]
        session: String,
        #[command(flatten)]
        at: At,
    },
}

/// The host's /ctx mount.
#[derive(Debug, clap::Args)]
pub struct At {
    /// The host's /ctx mount.
    #[arg(long, default_value = "/ctx")]
    ctx: PathBuf,
}

fn named(what: &str, name: &str) -> anyhow::Result<()> {
    policy::name::validate(name)
        .map_err(|e| Exit::new(exit::INVALID, format!("invalid {what} name {name:?}: {e}")).into())
}

/// Runs `ctx path`.
pub fn run(kind: Kind) -> anyhow::Result<()> {
    let p = match kind {
        Kind::Shared { name, at } => {
            named("shared space", &name)?;
            at.ctx.join("shared").join(name)
        }
        Kind::Tool { name, at } => {
            named("tool", &name)?;
            at.ctx.join("tool").join(name)
        }
        Kind::Agent { name, at } => {
            named("agent", &name)?;
            at.ctx.join("agent").join(name)
        }
        Kind::Session { name, session, at } => {
            named("agent", &name)?;
            named("session", &session)?;
            exit::agent_at(&at.ctx, &name)?;
            let uid = ctxterm::launch::contract::read_control(&at.ctx, &name, "uid").map_err(exit::launch)?;
            let uid: u32 = uid.trim().parse().map_err(|_| {
                Exit::new(exit::INVALID, format!("agent/{name}.d/uid: {:?} is not a number", uid.trim()))
            })?;
            policy::runtime::session_dir(&at.ctx, uid, &name, &session)
        }
    };
    out::line(p.display())
}

/// Runs `ctx status`: the daemon's `status`, aligned, or as one JSON object (`--json`).
pub fn status(ctx: &std::path::Path, json: bool) -> anyhow::Result<()> {
    let p = ctx.join("status");
    let mut text = String::new();
    std::io::Read::read_to_string(
        &mut std::io::Read::take(
            std::fs::File::open(&p).map_err(|e| {
                Exit::new(
                    exit::UNAVAILABLE,
                    format!("{}: {e} (is ctx mount serving {}?)", p.display(), ctx.display()),
                )
            })?,
            1 << 20,
        ),
        &mut text,
    )?;
    let pairs: Vec<(&str, &str)> = text.lines().filter_map(|l| l.split_once(' ')).collect();
    if json {
        let mut m = serde_json::Map::new();
        for (k, v) in &pairs {
            let v = v.parse::<u64>().map_or_else(|_| serde_json::json!(v), |n| serde_json::json!(n));
            m.insert((*k).to_owned(), v);
        }
        return out::line(serde_json::Value::Object(m));
    }
    let width = pairs.iter().filter(|(k, _)| !k.starts_with("op.")).map(|(k, _)| k.len()).max().unwrap_or(0);
    for (k, v) in pairs.iter().filter(|(k, _)| !k.starts_with("op.")) {
        out::line(format_args!("{k:width$}  {v}"))?;
    }
    let ops: Vec<String> =
        pairs.iter().filter_map(|(k, v)| k.strip_prefix("op.").map(|op| format!("{op} {v}"))).collect();
    if !ops.is_empty() {
        out::line(format_args!("{:width$}  {}", "requests by op", ops.join(", ")))?;
    }
    Ok(())
}
