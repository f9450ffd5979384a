//! The CortexFS tool shell.
//!
//! It will hold `CTX_PATH` resolution, the W-TinyLFU resolution cache, `load`/`pin` of tool
//! metadata and tool runs that append `tool.call` events. It talks to `/ctx` as files, like any
//! client, and never links the server. Depends on `policy` only.

#![forbid(unsafe_code)]
