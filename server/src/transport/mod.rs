//! Transports: how FUSE requests reach [`crate::CtxFs`]. Each one takes the same filesystem;
//! today there is `/dev/fuse` ([`fusedev`]); FUSE-over-io_uring and vhost-user virtio-fs go
//! beside it.

pub mod fusedev;
pub mod pool;
