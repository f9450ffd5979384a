//! `ctx view ...`: agent views served by the running `ctx mount` daemon.

use std::path::PathBuf;

use clap::Subcommand;
use serde_json::json;

use crate::exit::{self, Exit};
use crate::out;

/// View commands (root only: they talk to the daemon's control socket).
#[derive(Debug, Subcommand)]
pub enum Cmd {
    /// Mount a new view carrying an agent's authority; prints its path.
    Create {
        /// The agent.
        #[arg(long)]
        agent: String,
        /// The session.
        #[arg(long, default_value = "default")]
        session: String,
        /// Where to mount it (default /run/cortexfs/view/AGENT/SESSION).
        #[arg(long)]
        path: Option<PathBuf>,
        /// The run's workspace, as the agent sees it (shown as `workspace` in the view's
        /// status): the directory the core tools work in. Without it they have none.
        #[arg(long)]
        workspace: Option<PathBuf>,
        /// The daemon's control socket.
        #[arg(long, default_value = server::control::DEFAULT_SOCKET)]
        control: PathBuf,
    },
    /// List views: AGENT SESSION PATH.
    Ls {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// The daemon's control socket.
        #[arg(long, default_value = server::control::DEFAULT_SOCKET)]
        control: PathBuf,
    },
    /// Remove the view mounted at PATH; other views are untouched.
    Rm {
        /// The view's mount point.
        path: PathBuf,
        /// The daemon's control socket.
        #[arg(long, default_value = server::control::DEFAULT_SOCKET)]
        control: PathBuf,
    },
}

/// Sends one request to the daemon's control socket; a refusal becomes an error.
pub fn call(control: &std::path::Path, req: serde_json::Value) -> anyhow::Result<serde_json::Value> {
    let reply = server::control::request(control, &req).map_err(|e| {
        let code =
            if e.kind() == std::io::ErrorKind::PermissionDenied { exit::DENIED } else { exit::UNAVAILABLE };
        Exit::new(
            code,
            format!("cannot reach the daemon at {}: {e} (is `ctx mount` running?)", control.display()),
        )
    })?;
    if reply["ok"] != true {
        let msg = reply["error"].as_str().unwrap_or("unknown error").to_owned();
        let code = if msg.starts_with("permission denied") { exit::DENIED } else { exit::FAILURE };
        return Err(Exit::new(code, msg).into());
    }
    Ok(reply)
}

/// Runs the command.
pub fn run(cmd: Cmd) -> anyhow::Result<()> {
    match cmd {
        Cmd::Create { agent, session, path, workspace, control } => {
            let r = call(
                &control,
                json!({"op": "create", "agent": agent, "session": session, "path": path, "workspace": workspace}),
            )?;
            out::line(r["path"].as_str().unwrap_or(""))
        }
        Cmd::Ls { json, control } => {
            let r = call(&control, json!({"op": "ls"}))?;
            if json {
                return out::line(&r["views"]);
            }
            for v in r["views"].as_array().into_iter().flatten() {
                out::line(format_args!(
                    "{}\t{}\t{}",
                    v["agent"].as_str().unwrap_or(""),
                    v["session"].as_str().unwrap_or(""),
                    v["path"].as_str().unwrap_or("")
                ))?;
            }
            Ok(())
        }
        Cmd::Rm { path, control } => {
            call(&control, json!({"op": "rm", "path": path}))?;
            Ok(())
        }
    }
}
