//! CortexFS layer 1: the only code that makes state durable.
//!
//! - [`log`]: the append log for `messages.jsonl`, `events.jsonl` and `.d/log`: group-commit
//!   JSONL appends, acknowledged only when durable, with torn-tail recovery from commit evidence.
//! - [`object`]: the object store; today [`object::check`] (a manifest and the files it names).
//! - [`error`]: the crate's one error type.
//!
//! Still to come here: hash-bound atomic publish of objects and the shared-space job queue.
//! io_uring paths have portable twins chosen at run time.
//!
//! Depends on `policy` only; the server, `ctx` and the integration tests depend on it.

pub mod error;
pub mod log;
pub mod object;
pub mod queue;

pub use error::{Error, Result};
