//! One module per `ctx` command group.

pub mod bootstrap;
pub mod mount;
pub mod name;
pub mod object;
pub mod policy;
pub mod queue;
pub mod tool;
pub mod view;
