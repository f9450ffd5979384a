//! Transports: how FUSE requests reach [`crate::CtxFs`]. Each one takes the same filesystem.
//! - [`pool`]: `/dev/fuse`, served by one thread pool for every connection, and with it
//! - [`uring`]: FUSE over io_uring, where the kernel offers it;
//! - [`virtiofs`]: vhost-user virtio-fs, one socket per virtual machine.

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

pub mod pool;
#[allow(unsafe_code)]
pub mod uring;
pub mod virtiofs;

/// Which transport serves a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// FUSE over io_uring when the kernel offers it, else `/dev/fuse` (and the log says so).
    Auto,
    /// FUSE over io_uring, or nothing.
    Uring,
    /// `read(2)` and `write(2)` on `/dev/fuse`.
    Dev,
}

impl Transport {
    /// The name `ctx mount --transport` and `status` use.
    pub fn name(self) -> &'static str {
        match self {
            Transport::Auto => "auto",
            Transport::Uring => "uring",
            Transport::Dev => "dev",
        }
    }
}

impl std::str::FromStr for Transport {
    type Err = String;

    fn from_str(s: &str) -> Result<Transport, String> {
        match s {
            "auto" => Ok(Transport::Auto),
            "uring" => Ok(Transport::Uring),
            "dev" => Ok(Transport::Dev),
            _ => Err(format!("unknown transport {s:?} (auto, uring or dev)")),
        }
    }
}

/// How one connection is served, and how many requests came each way: what its `status`
/// file shows.
#[derive(Debug, Default)]
pub struct Wire {
    uring: AtomicU8,
    /// Requests read from `/dev/fuse` (with io_uring: INIT, FORGET, INTERRUPT, and what came
    /// before every queue had an entry).
    pub dev_requests: AtomicU64,
    /// Requests served from a ring.
    pub ring_requests: AtomicU64,
}

impl Wire {
    /// Records the transport INIT settled on.
    pub fn set(&self, t: Transport) {
        self.uring.store(u8::from(t == Transport::Uring), Ordering::Relaxed);
    }

    /// The transport serving the connection: `Uring` or `Dev`.
    pub fn transport(&self) -> Transport {
        if self.uring.load(Ordering::Relaxed) == 1 { Transport::Uring } else { Transport::Dev }
    }
}
