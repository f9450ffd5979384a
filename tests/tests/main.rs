//! The black-box integration tests, one binary (one link for every area): each module is an
//! area, against real mounts, sandboxes, agent CLIs, MCP servers and guests. Tests that change
//! what the host offers (`/dev/net/tun`) hold [`tests::NETWORK`]; sessions get names no other
//! module uses ([`tests::unique`], or a module letter), since runs are host-wide.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

mod agent_life;
mod agent_object;
mod agent_socket;
mod agent_start;
mod config;
mod demo;
mod escape;
mod faults;
mod faults_fuse;
mod log_crash;
mod log_powerloss;
mod many_agents;
mod mcp;
mod mount;
mod multihost;
mod object_install;
mod package;
mod policy_cli;
mod posix;
mod queue_race;
mod shared_sessions;
mod transport;
mod tsh;
mod uring_probe;
mod virtiofs;
