//! Many `/dev/fuse` connections, one small pool of threads.
//!
//! Every mounted connection (the host view and each agent view) registers its `/dev/fuse`
//! descriptor with one epoll instance, one-shot: a worker that wakes for a connection reads one
//! request, re-arms it (so another worker can take that connection's next request at once), and
//! handles the request with the connection's own `Server`. So a thousand views cost a thousand
//! descriptors and a little memory each, not a thousand threads.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::thread::JoinHandle;

use fuse_backend_rs::api::server::Server;
use fuse_backend_rs::transport::{FuseBuf, FuseDevWriter, FuseSession, Reader};
use rustix::event::epoll::{self, EventData, EventFlags};
use rustix::event::{EventfdFlags, eventfd};

use crate::CtxFs;

/// Largest request: 1 MiB of data plus headers (the mount's max_read is 1 MiB + 4 KiB).
const BUF: usize = (1 << 20) + 8192;
/// The token of the wake-up eventfd.
const WAKE: u64 = 0;

struct Conn {
    file: File,
    server: Server<Arc<CtxFs>>,
}

struct Inner {
    epoll: OwnedFd,
    wake: OwnedFd,
    conns: RwLock<HashMap<u64, Arc<Conn>>>,
    next: AtomicU64,
    stop: AtomicBool,
}

/// The pool.
pub struct Pool {
    inner: Arc<Inner>,
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("threads", &self.threads.len())
            .field("connections", &self.connections())
            .finish()
    }
}

/// One mounted connection served by the pool.
pub struct Attached {
    token: u64,
    session: FuseSession,
    mountpoint: PathBuf,
}

impl std::fmt::Debug for Attached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attached").field("mountpoint", &self.mountpoint).finish()
    }
}

impl Attached {
    /// The mount point.
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }
}

fn rearm(inner: &Inner, conn: &Conn, token: u64) {
    let flags = EventFlags::IN | EventFlags::ONESHOT;
    if let Err(e) = epoll::modify(&inner.epoll, &conn.file, EventData::new_u64(token), flags) {
        tracing::debug!(error = %e, token, "re-arming a connection failed");
    }
}

fn worker(inner: &Inner) {
    let mut rbuf = vec![0u8; BUF];
    let mut wbuf = vec![0u8; BUF];
    let mut events: Vec<epoll::Event> = Vec::with_capacity(1);
    loop {
        events.clear();
        match epoll::wait(&inner.epoll, rustix::buffer::spare_capacity(&mut events), None) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => {
                tracing::error!(error = %e, "epoll wait failed");
                return;
            }
        }
        for ev in &events {
            let token = ev.data.u64();
            if token == WAKE {
                if inner.stop.load(Ordering::Relaxed) {
                    return;
                }
                continue;
            }
            let Some(conn) = inner.conns.read().ok().and_then(|c| c.get(&token).cloned()) else { continue };
            let n = loop {
                match rustix::io::read(&conn.file, &mut rbuf) {
                    Ok(n) => break Some(n),
                    Err(rustix::io::Errno::INTR | rustix::io::Errno::NOENT) => continue,
                    Err(rustix::io::Errno::AGAIN) => break None,
                    Err(rustix::io::Errno::NODEV) => {
                        // Unmounted: forget the connection.
                        if let Ok(mut c) = inner.conns.write() {
                            c.remove(&token);
                        }
                        break None;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, token, "reading /dev/fuse failed");
                        break None;
                    }
                }
            };
            let alive = inner.conns.read().is_ok_and(|c| c.contains_key(&token));
            if alive {
                rearm(inner, &conn, token);
            }
            let Some(n) = n else { continue };
            let reader = match Reader::from_fuse_buffer(FuseBuf::new(&mut rbuf[..n])) {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(error = %e, "bad request buffer");
                    continue;
                }
            };
            let writer =
                match FuseDevWriter::<()>::new(std::os::fd::AsRawFd::as_raw_fd(&conn.file), &mut wbuf) {
                    Ok(w) => w,
                    Err(e) => {
                        tracing::warn!(error = %e, "bad reply buffer");
                        continue;
                    }
                };
            if let Err(e) = conn.server.handle_message(reader, writer.into(), None, None) {
                tracing::debug!(error = %e, "request failed");
            }
        }
    }
}

impl Pool {
    /// Starts `threads` workers.
    pub fn new(threads: usize) -> io::Result<Pool> {
        let epoll = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        let wake = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        epoll::add(&epoll, &wake, EventData::new_u64(WAKE), EventFlags::IN)?;
        let inner = Arc::new(Inner {
            epoll,
            wake,
            conns: RwLock::new(HashMap::new()),
            next: AtomicU64::new(WAKE + 1),
            stop: AtomicBool::new(false),
        });
        let mut handles = Vec::new();
        for i in 0..threads.max(1) {
            let inner = Arc::clone(&inner);
            handles
                .push(std::thread::Builder::new().name(format!("fuse-{i}")).spawn(move || worker(&inner))?);
        }
        Ok(Pool { inner, threads: handles })
    }

    /// Number of serving threads.
    pub fn threads(&self) -> usize {
        self.threads.len()
    }

    /// Number of connections served.
    pub fn connections(&self) -> usize {
        self.inner.conns.read().map_or(0, |c| c.len())
    }

    /// Mounts `fs` at `mountpoint` and serves it from the pool.
    pub fn mount(&self, fs: Arc<CtxFs>, mountpoint: &Path) -> io::Result<Attached> {
        let mut session = FuseSession::new(mountpoint, "cortexfs", "ctx", false).map_err(io::Error::other)?;
        session.set_allow_other(true);
        session.mount().map_err(io::Error::other)?;
        let file = session
            .get_fuse_file()
            .ok_or_else(|| io::Error::other("mounted session has no /dev/fuse descriptor"))?
            .try_clone()?;
        let token = self.inner.next.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn { file, server: Server::new(fs) });
        // Into the table first: a worker may wake for the INIT request the moment the
        // descriptor is armed, and must find the connection.
        self.inner
            .conns
            .write()
            .map_err(|_| io::Error::other("connection table poisoned"))?
            .insert(token, Arc::clone(&conn));
        epoll::add(
            &self.inner.epoll,
            conn.file.as_fd(),
            EventData::new_u64(token),
            EventFlags::IN | EventFlags::ONESHOT,
        )?;
        Ok(Attached { token, session, mountpoint: mountpoint.to_path_buf() })
    }

    /// Unmounts one connection; the others are untouched.
    pub fn unmount(&self, mut a: Attached) -> io::Result<()> {
        if let Some(conn) = self.inner.conns.write().ok().and_then(|mut c| c.remove(&a.token)) {
            let _ = epoll::delete(&self.inner.epoll, &conn.file);
        }
        a.session.umount().map_err(io::Error::other)
    }

    /// Stops the workers (after every connection was unmounted).
    pub fn shutdown(mut self) {
        self.inner.stop.store(true, Ordering::Relaxed);
        let _ = rustix::io::write(&self.inner.wake, &1u64.to_ne_bytes());
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
