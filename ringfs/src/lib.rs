//! CortexFS layer 1: the only code that makes state durable.
//!
//! - [`log`]: the append log for `messages.jsonl`, `events.jsonl` and `.d/log`: group-commit
//!   JSONL appends, acknowledged only when durable, with torn-tail recovery from commit evidence.
//! - [`object`]: the object store: [`object::check`] (a manifest and the files it names) and
//!   packages (checked, installed, recorded).
//! - [`queue`]: the shared-space job queue, file-native.
//! - [`beneath`]: the one way root touches a tree an agent can write (descriptor-relative,
//!   no symlink, no mount crossed), for the daemon, the launcher and `ctx` alike.
//! - [`error`]: the crate's one error type.
//!
//! io_uring paths have portable twins chosen at run time.
//!
//! Depends on `policy` only; the server, `ctx` and the integration tests depend on it.

pub mod beneath;
pub mod config;
pub mod error;
pub mod log;
pub mod object;
pub mod queue;

pub use error::{Error, Result};
