//! `ctx view ...`: agent views served by the running `ctx mount` daemon.

use std::path::PathBuf;

use clap::Subcommand;
use ctxterm::launch::view;
use policy::runtime::ControlRequest;

use crate::exit;
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
        #[arg(long, default_value = "default", add = clap_complete::ArgValueCompleter::new(crate::cmd::complete::sessions))]
        session: String,
        /// Where to mount it (default /run/cortexfs/view/AGENT/SESSION).
        #[arg(long)]
        path: Option<PathBuf>,
        /// The run's workspace, as the agent sees it (shown as `workspace` in the view's
        /// status): the directory the core tools work in. Without it they have none.
        #[arg(long)]
        workspace: Option<PathBuf>,
        /// The daemon's control socket.
        #[arg(long, default_value = policy::runtime::CONTROL_SOCKET)]
        control: PathBuf,
    },
    /// List views: AGENT SESSION PATH.
    Ls {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// The daemon's control socket.
        #[arg(long, default_value = policy::runtime::CONTROL_SOCKET)]
        control: PathBuf,
    },
    /// Remove the view mounted at PATH; other views are untouched.
    Rm {
        /// The view's mount point.
        path: PathBuf,
        /// The daemon's control socket.
        #[arg(long, default_value = policy::runtime::CONTROL_SOCKET)]
        control: PathBuf,
    },
}

/// Runs the command.
pub fn run(cmd: Cmd) -> anyhow::Result<()> {
    let call = |control: &std::path::Path, req| view::call(control, &req).map_err(exit::launch);
    match cmd {
        Cmd::Create { agent, session, path, workspace, control } => {
            let shown = |p: Option<PathBuf>| p.map(|p| p.display().to_string());
            let (path, workspace) = (shown(path), shown(workspace));
            let r = call(
                &control,
                ControlRequest::Create {
                    agent,
                    session,
                    path,
                    session_of: None,
                    workspace,
                    records_only: false,
                    space: None,
                },
            )?;
            out::line(r.path.unwrap_or_default())
        }
        Cmd::Ls { json, control } => {
            let views = call(&control, ControlRequest::Ls {})?.views.unwrap_or_default();
            if json {
                return out::line(serde_json::to_value(&views)?);
            }
            let mut list = out::Listing::new("AGENT\tSESSION\tPATH");
            for v in views {
                list.row(format_args!("{}\t{}\t{}", v.agent, v.session, v.path))?;
            }
            Ok(())
        }
        Cmd::Rm { path, control } => {
            call(&control, ControlRequest::Rm { path: path.display().to_string() })?;
            Ok(())
        }
    }
}
