//! Transports: how FUSE requests reach [`crate::CtxFs`]. Each one takes the same filesystem.
//! Today there is `/dev/fuse`, served by one thread pool for every connection ([`pool`]);
//! FUSE-over-io_uring and vhost-user virtio-fs go beside it.

pub mod pool;
