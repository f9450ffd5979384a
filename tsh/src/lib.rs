//! The CortexFS tool shell (spec §3).
//!
//! - [`context`]: the `/ctx` root, the agent terminal context read from the view's `status`, and
//!   the `CTX_PATH` in force (`.tshrc`, environment, default; injected in an agent terminal);
//! - [`resolve`]: lookup through `CTX_PATH`, cached in [`cache`], the W-TinyLFU resolution cache;
//! - [`run`]: a tool run: both policies, hooks, the process, the `tool.call` record;
//! - [`shell`]: the built-ins and the working set (`load`, `pin`);
//! - [`submit`]: asynchronous calls (`submit`, `collect`, `jobs`) on the queue's primitives.
//!
//! tsh talks to `/ctx` as files, like any client, and never links the server.

#![forbid(unsafe_code)]

pub mod cache;
pub mod context;
pub mod resolve;
pub mod run;
pub mod shell;
pub mod submit;

/// Why a command failed, with its stable exit code.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fail {
    /// Exit 1: the command failed.
    Failed(String),
    /// Exit 2: usage or invalid input.
    Usage(String),
    /// Exit 13: refused by authority (a policy or a hook).
    Denied(String),
    /// Exit 69: unavailable here (no agent terminal context).
    Unavailable(String),
}

impl Fail {
    /// The stable exit code.
    pub fn code(&self) -> i32 {
        use policy::exit;
        i32::from(match self {
            Fail::Failed(_) => exit::FAILURE,
            Fail::Usage(_) => exit::INVALID,
            Fail::Denied(_) => exit::DENIED,
            Fail::Unavailable(_) => exit::UNAVAILABLE,
        })
    }

    /// The message.
    pub fn message(&self) -> &str {
        match self {
            Fail::Failed(m) | Fail::Usage(m) | Fail::Denied(m) | Fail::Unavailable(m) => m,
        }
    }
}
