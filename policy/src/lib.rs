//! CortexFS layer 0: the pure foundation every other crate builds on.
//!
//! - [`name`]: object names (`Name`), including MCP-projected `<server>.<tool>` names.
//! - [`v0`]: policy v0 parse (every bad line, with line, field and errno), compile (one hash probe
//!   per check) and evaluate (allow or deny with the reason).
//! - [`authority`]: the six-layer authority intersection in the spec's order.
//! - [`attenuate`]: `agent.create` attenuation: children only ever narrow; [`agent`]: the
//!   generated controls of a new agent and the check of a child against its parent.
//! - [`runtime`]: the runtime ABI: run paths, the session layout, control-socket messages;
//!   [`receipt`]: the receipt socket's messages.
//! - [`mount`], [`tshconf`], [`manifest`], [`package`], [`controls`]: strict parsers for the mount
//!   table, tsh config and `.tshrc`, `cortexfs.object/v2` manifests, `cortexfs.toml` and control
//!   file contents.
//! - [`errno`], [`path`], [`problem`]: errno names, path checks and located problems they share;
//!   [`exit`]: the exit codes of every command.
//!
//! No I/O and no unsafe code; no parser panics on any input (each has a fuzz target in `fuzz/`).
//! Any crate may depend on this one; it depends on no other CortexFS crate.

#![forbid(unsafe_code)]

pub mod agent;
pub mod asock;
pub mod attenuate;
pub mod authority;
pub mod controls;
pub mod errno;
pub mod exit;
pub mod ids;
pub mod limits;
pub mod manifest;
pub mod model;
pub mod mount;
pub mod name;
pub mod pack;
pub mod package;
pub mod path;
pub mod problem;
pub mod profile;
pub mod receipt;
pub mod runtime;
pub mod status;
pub mod tshconf;
pub mod usage;
pub mod v0;

pub use errno::Errno;
pub use name::Name;
pub use v0::{Class, Decision, Permission, Policy, Query, Rule};

/// The CortexFS version manifests and packages are checked against.
pub fn cortexfs_version() -> semver::Version {
    semver::Version::parse(env!("CARGO_PKG_VERSION")).expect("the crate version is semver")
}
