//! CortexFS layer 1: the only code that makes state durable.
//!
//! - [`object`]: the object store; today [`object::check`] (a manifest and the files it names).
//!
//! Still to come here: the append log (group-commit JSONL appends for `messages.jsonl`,
//! `events.jsonl` and `.d/log`, with torn-tail recovery), hash-bound atomic publish of objects,
//! and the shared-space job queue; io_uring paths with portable twins chosen at run time.
//!
//! Depends on `policy` only; the server, `ctx` and the integration tests depend on it.

pub mod object;
