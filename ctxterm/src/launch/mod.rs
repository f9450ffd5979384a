//! The launcher: an agent's terminal in a bubblewrap sandbox, one file per step.
//!
//! [`start`] derives the launch [`contract`] from the agent object (read through the host
//! mount) and its policy before anything is spawned, prepares the [`rundir`] and the
//! [`session`], asks the daemon for the agent's [`view`], then starts a supervisor (`ctxterm
//! supervise`, its own process group) and returns once the terminal socket answers. The
//! [`mod@supervise`] step runs the [`sandbox`] command line, as the agent's uid/gid/groups:
//!
//! ```text
//! (child: join cgroups, become the agent, filter on fd 3) [pasta --config-net -- sh: fds 3 4 --] bwrap
//!   --seccomp 3 --disable-userns --die-with-parent --unshare-user --unshare-pid --unshare-ipc
//!   --unshare-uts [--unshare-net] --ro-bind /usr /usr ... --bind VIEW /ctx
//!   --bind WORKSPACE /workspace --bind TERM /run/cortexfs/terminal --clearenv --setenv ...
//!   -- /ctx/bin/ctxterm --socket /run/cortexfs/terminal/main.sock -- CMD
//! ```
//!
//! and serves the run's [`receipt`] socket. The sandbox is set up by bwrap running as the
//! agent's uid, so it binds only what that uid can reach: its own view
//! (`/run/cortexfs/view/<agent>/`, 0700, the agent's), its socket directories, the workspace.
//! The storage is never bound. [`stop`] sends SIGTERM to the supervisor, which forwards it,
//! waits the grace period, kills what is left (the sandbox's PID namespace dies with its first
//! process), removes the view and the socket, and records the exit status.
//!
//! Steps: [`contract`], [`profiles`], [`rundir`], [`session`], [`view`], [`sandbox`] (with
//! [`binds`], [`seccomp`] and [`cgroups`]), [`mod@supervise`], [`receipt`], [`terminal`] (clients of
//! a run's terminal), [`agents`] (agent objects in the storage, which `agent.create` makes).
//! Every step fails with its own variant of [`Error`], which carries its exit code.

pub mod agents;
pub mod asock;
pub mod binds;
pub mod cgroups;
pub mod contract;
pub mod doctor;
pub mod egress;
pub mod models;
pub mod oauth;
pub mod profiles;
pub mod receipt;
pub mod rundir;
pub mod sandbox;
pub mod seccomp;
pub mod secrets;
pub mod session;
pub mod supervise;
pub mod terminal;
pub mod view;

use std::io;
use std::path::PathBuf;

pub use contract::{Contract, RESERVED_ENV, SANDBOX_UMASK, Start};
pub use rundir::{Activity, RunInfo, exit_of, running, runs, runs_watched, stop};
pub use supervise::{start, start_owned, supervise};

/// Exit codes (policy::exit).
use policy::exit::{DENIED, FAILURE, INTERNAL, INVALID, UNAVAILABLE};

/// Why a launch step failed. [`Error::code`] is the exit code the front end reports.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The host lacks what sandboxes need (69).
    #[error("cannot start sandboxes here: {0}")]
    Host(String),
    /// The agent's controls, the request or the flags are invalid (2).
    #[error("{0}")]
    Invalid(String),
    /// The agent's policy, or Linux permissions, refuse it (13).
    #[error("{0}")]
    Denied(String),
    /// Something the run needs is missing on this host: a profile's program, a network the
    /// policy grants (69).
    #[error("{0}")]
    Unavailable(String),
    /// No such agent, session or run, or one that already exists or runs (1).
    #[error("{0}")]
    State(String),
    /// An agent control could not be read.
    #[error("{path}: {source}")]
    Control {
        /// The control.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The run directory could not be prepared.
    #[error("run directory {path}: {source}")]
    RunDir {
        /// What could not be made.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The session could not be prepared.
    #[error("{path}: {source}")]
    Session {
        /// What could not be made.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The daemon's control socket could not be reached (69) or refused the view.
    #[error("{message}")]
    View {
        /// The exit code: 69 unreachable, 13 refused for permission, 1 refused.
        code: u8,
        /// What happened.
        message: String,
    },
    /// The resource ceilings could not be applied (69).
    #[error("resource ceilings: {0}")]
    Cgroups(String),
    /// A bind of the mount table could not be prepared (69).
    #[error("mount {target}: {why}")]
    Bind {
        /// The bind's target in the sandbox.
        target: PathBuf,
        /// Why.
        why: String,
    },
    /// The seccomp filter could not be built (70).
    #[error("seccomp: {0}")]
    Seccomp(String),
    /// The sandbox could not be started (69).
    #[error("the sandbox (bwrap): {0}")]
    Spawn(io::Error),
    /// The terminal did not answer (69).
    #[error("the terminal did not answer on {0}")]
    NoAnswer(PathBuf),
    /// The terminal ended before it answered, with the supervisor's log (1).
    #[error("the terminal ended at once:\n{0}")]
    EndedAtOnce(String),
    /// The terminal ended with this status (reported as it is, with nothing more to say).
    #[error("the terminal ended with status {0}")]
    Status(u8),
    /// The supervisor failed (70).
    #[error("supervise: {0}")]
    Supervise(String),
    /// The storage refused an agent object.
    #[error(transparent)]
    Storage(#[from] ringfs::Error),
    /// A bug: something generated did not check (70).
    #[error("{0}")]
    Internal(String),
    /// Another I/O failure (1, or 13 when permission was denied).
    #[error(transparent)]
    Io(#[from] io::Error),
}

fn io_code(e: &io::Error) -> u8 {
    match e.kind() {
        io::ErrorKind::PermissionDenied => DENIED,
        _ => FAILURE,
    }
}

impl Error {
    /// The exit code of the failure.
    pub fn code(&self) -> u8 {
        match self {
            Error::Host(_) | Error::Unavailable(_) | Error::Cgroups(_) | Error::Bind { .. } => UNAVAILABLE,
            Error::Spawn(_) | Error::NoAnswer(_) => UNAVAILABLE,
            Error::Invalid(_) => INVALID,
            Error::Denied(_) => DENIED,
            Error::State(_) | Error::EndedAtOnce(_) => FAILURE,
            Error::Control { source, .. } => match source.kind() {
                io::ErrorKind::NotFound | io::ErrorKind::IsADirectory | io::ErrorKind::InvalidInput => {
                    INVALID
                }
                _ => io_code(source),
            },
            Error::RunDir { source, .. } | Error::Session { source, .. } | Error::Io(source) => {
                io_code(source)
            }
            Error::View { code, .. } => *code,
            Error::Seccomp(_) | Error::Supervise(_) | Error::Internal(_) => INTERNAL,
            Error::Status(code) => *code,
            Error::Storage(e) => match e {
                ringfs::Error::Io { source, .. } => io_code(source),
                ringfs::Error::Invalid(_) => INVALID,
                _ => FAILURE,
            },
        }
    }

    /// Whether the failure has said all it has to say (the terminal's own status).
    pub fn quiet(&self) -> bool {
        matches!(self, Error::Status(_))
    }
}

/// What a launch step returns.
pub type Result<T, E = Error> = std::result::Result<T, E>;
