//! CortexFS layer 2: the `/ctx` projection.
//!
//! It will hold the fuse-backend-rs `FileSystem` that projects storage as `/ctx`, the per-agent
//! views (identity bound to the connection), and the transports behind one seam: `/dev/fuse`,
//! FUSE-over-io_uring and vhost-user virtio-fs.
//!
//! Depends on `policy` and `ringfs`; never on launch, terminal or tool execution (it declares
//! traits for what it needs from above). Only the `ctx` binary depends on it.
