//! The `/dev/fuse` transport: one FUSE session, a small pool of threads each with its own
//! channel, all feeding one `Server`.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use fuse_backend_rs::api::server::Server;
use fuse_backend_rs::transport::{FuseChannel, FuseSession};

use crate::CtxFs;

/// A mounted `/ctx`.
pub struct Mount {
    session: FuseSession,
    threads: Vec<JoinHandle<()>>,
    stopping: Arc<AtomicBool>,
    mountpoint: PathBuf,
}

fn serve(server: &Server<Arc<CtxFs>>, mut ch: FuseChannel, stopping: &AtomicBool) {
    loop {
        match ch.get_request() {
            Ok(Some((reader, writer))) => {
                if let Err(e) = server.handle_message(reader, writer.into(), None, None)
                    && !stopping.load(Ordering::Relaxed)
                {
                    tracing::debug!(error = %e, "request failed");
                }
            }
            Ok(None) => return,
            Err(e) => {
                // On unmount some channels report an epoll error instead of Ok(None).
                if !stopping.load(Ordering::Relaxed) && !e.to_string().contains("epoll error") {
                    tracing::error!(error = %e, "fuse channel failed");
                }
                return;
            }
        }
    }
}

impl std::fmt::Debug for Mount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mount")
            .field("mountpoint", &self.mountpoint)
            .field("threads", &self.threads.len())
            .finish()
    }
}

impl Mount {
    /// Mounts `fs` at `mountpoint` and serves it with `threads` threads.
    pub fn new(fs: Arc<CtxFs>, mountpoint: &Path, threads: usize) -> io::Result<Mount> {
        let mut session = FuseSession::new(mountpoint, "cortexfs", "ctx", false).map_err(io::Error::other)?;
        session.set_allow_other(true);
        session.mount().map_err(io::Error::other)?;
        let server = Arc::new(Server::new(fs));
        let stopping = Arc::new(AtomicBool::new(false));
        let mut handles = Vec::new();
        for i in 0..threads.max(1) {
            let ch = session.new_channel().map_err(io::Error::other)?;
            let (server, stopping) = (Arc::clone(&server), Arc::clone(&stopping));
            handles.push(
                std::thread::Builder::new()
                    .name(format!("fuse-{i}"))
                    .spawn(move || serve(&server, ch, &stopping))?,
            );
        }
        Ok(Mount { session, threads: handles, stopping, mountpoint: mountpoint.to_path_buf() })
    }

    /// The mount point.
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Unmounts and waits for the serving threads.
    pub fn unmount(mut self) -> io::Result<()> {
        self.stopping.store(true, Ordering::Relaxed);
        let r = self.session.umount().map_err(io::Error::other);
        self.session.wake().map_err(io::Error::other)?;
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        r
    }
}
