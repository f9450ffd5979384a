//! CortexFS layer 2: the `/ctx` projection.
//!
//! - [`fs`]: `CtxFs`, the fuse-backend-rs `FileSystem` that projects storage as `/ctx`.
//! - [`area`]: what each storage path is in the ABI (objects, controls, session logs, data).
//! - [`storage`]: the backing storage, reached only beneath its root and never through symlinks.
//! - [`transport`]: the transports behind one seam: `/dev/fuse` (`transport::pool`) and
//!   vhost-user virtio-fs for virtual machines (`transport::virtiofs`).
//!
//! Depends on `policy` and `ringfs`; never on launch, terminal or tool execution. Only the `ctx`
//! binary depends on it. Still to come: the FUSE-over-io_uring transport.

pub mod area;
pub mod control;
pub mod errno;
pub mod fs;
pub mod storage;
pub mod transport;
pub mod view;

pub use fs::{Changes, Config, CtxFs, SharedLogs};
pub use view::ViewSpec;
