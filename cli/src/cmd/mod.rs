//! One module per `ctx` command group.

pub mod name;
pub mod object;
pub mod policy;
pub mod queue;
