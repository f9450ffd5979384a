//! Exit codes and the error that carries one.
//!
//! | code | meaning |
//! |---|---|
//! | 0 | ok |
//! | 1 | failure |
//! | 2 | usage or invalid input |
//! | 13 | permission denied |
//! | 69 | service unavailable |
//! | 70 | internal error |

use std::fmt;
use std::io;

pub use policy::exit::{DENIED, FAILURE, INTERNAL, INVALID, OK, UNAVAILABLE};

/// An error that ends the program with a chosen exit code. A `Quiet` error has already said all
/// it has to say (diagnostics on stdout) and prints nothing more.
#[derive(Debug)]
pub struct Exit {
    /// The exit code.
    pub code: u8,
    /// The message for stderr, if any.
    pub message: Option<String>,
}

impl Exit {
    /// An exit with a message.
    pub fn new(code: u8, message: impl Into<String>) -> Exit {
        Exit { code, message: Some(message.into()) }
    }

    /// An exit whose output has already been written.
    pub fn quiet(code: u8) -> Exit {
        Exit { code, message: None }
    }

    /// Maps an I/O error met while reading an input named on the command line.
    pub fn io(what: impl fmt::Display, e: &io::Error) -> Exit {
        let code = match e.kind() {
            io::ErrorKind::PermissionDenied => DENIED,
            io::ErrorKind::NotFound | io::ErrorKind::IsADirectory | io::ErrorKind::InvalidInput => INVALID,
            _ => FAILURE,
        };
        Exit::new(code, format!("{what}: {e}"))
    }
}

impl fmt::Display for Exit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message.as_deref().unwrap_or(""))
    }
}

impl std::error::Error for Exit {}

impl From<ctxterm::launch::Error> for Exit {
    fn from(e: ctxterm::launch::Error) -> Exit {
        if e.quiet() { Exit::quiet(e.code()) } else { Exit::new(e.code(), e.to_string()) }
    }
}

/// A launcher failure as the error `ctx` reports.
pub fn launch(e: ctxterm::launch::Error) -> anyhow::Error {
    Exit::from(e).into()
}

/// Checks that agent `name` is served at the host mount `ctx`: the one refusal for an agent
/// that is not there (1), and for a mount that is not there (69), whatever the command.
pub fn agent_at(ctx: &std::path::Path, name: &str) -> anyhow::Result<()> {
    policy::name::validate(name)
        .map_err(|e| Exit::new(INVALID, format!("invalid agent name {name:?}: {e}")))?;
    // root's: the host mount's objects (no agent writes there)
    if std::fs::symlink_metadata(ctx.join("agent").join(name)).is_ok() {
        return Ok(());
    }
    // root's: as above
    if std::fs::symlink_metadata(ctx.join("status")).is_err() {
        return Err(
            Exit::new(UNAVAILABLE, format!("nothing is served at {} (ctx mount)", ctx.display())).into()
        );
    }
    Err(launch(ctxterm::launch::agents::no_agent(name, ctx)))
}
