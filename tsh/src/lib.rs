//! The CortexFS tool shell.
//!
//! - [`cache`]: the W-TinyLFU resolution cache (tool name to resolved path), with pinning.
//!
//! It will also hold `CTX_PATH` resolution, `load`/`pin` of tool metadata and tool runs that
//! append `tool.call` events. It talks to `/ctx` as files, like any client, and never links the
//! server. Depends on `policy` only (plus small data-structure crates).

#![forbid(unsafe_code)]

pub mod cache;
