//! Transports: how FUSE requests reach [`crate::CtxFs`]. Each one takes the same filesystem.
//! - [`pool`]: `/dev/fuse`, served by one thread pool for every connection;
//! - [`virtiofs`]: vhost-user virtio-fs, one socket per virtual machine.
//!
//! FUSE-over-io_uring goes beside them.

pub mod pool;
pub mod virtiofs;
