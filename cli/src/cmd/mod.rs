//! One module per `ctx` command group.

pub mod agent;
pub mod bootstrap;
pub mod complete;
pub mod config;
pub mod doctor;
pub mod generate;
pub mod man;
pub mod model;
pub mod mount;
pub mod name;
pub mod object;
pub mod package;
pub mod path;
pub mod policy;
pub mod queue;
pub mod send;
pub mod session;
pub mod shared;
pub mod tool;
pub mod top;
pub mod view;
