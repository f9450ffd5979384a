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
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
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

/// The host view as [`Pool::mount_host`] mounts it: its own connection, and the data
/// connection bound over its `home/` and `shared/`.
#[derive(Debug)]
pub struct HostMount {
    main: Attached,
    data: Attached,
    binds: Vec<PathBuf>,
}

impl HostMount {
    /// The mount point.
    pub fn mountpoint(&self) -> &Path {
        self.main.mountpoint()
    }
}

/// The directories of the host view served by its data connection.
pub const DATA_DIRS: [&str; 2] = ["home", "shared"];

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

    /// Mounts `fs` at `mountpoint` and serves it from the pool. The mount's source is the
    /// storage it serves and its type `fuse.cortexfs`, as `mount -t fuse.cortexfs STORAGE DIR`
    /// and an fstab line name them.
    pub fn mount(&self, fs: Arc<CtxFs>, mountpoint: &Path) -> io::Result<Attached> {
        let source = fs.storage_path().display().to_string();
        let mut session =
            FuseSession::new(mountpoint, &source, "cortexfs", false).map_err(io::Error::other)?;
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

    /// Mounts the host view at `mountpoint`: `fs` serves it, and `data` (a
    /// [`CtxFs::data`] over the same storage) serves everything beneath its `home/` and
    /// `shared/`, so that plain files there are opened, read and closed without a request once
    /// cached. The data connection is mounted on a private directory, its `home` and `shared`
    /// are bound over the host view's, and the private mount is detached: the two binds are
    /// all that reach it.
    pub fn mount_host(&self, fs: Arc<CtxFs>, data: Arc<CtxFs>, mountpoint: &Path) -> io::Result<HostMount> {
        let data_fs = Arc::clone(&data);
        let main = self.mount(fs, mountpoint)?;
        let private = std::env::temp_dir().join(format!(
            "cortexfs-data.{}.{}",
            std::process::id(),
            self.inner.next.load(Ordering::Relaxed)
        ));
        let mounted = (|| {
            std::fs::create_dir(&private)?;
            let data = self.mount(data, &private)?;
            let mut binds = Vec::new();
            let bound = DATA_DIRS.iter().try_for_each(|d| {
                let to = mountpoint.join(d);
                rustix::mount::mount_bind(private.join(d), &to)?;
                binds.push(to);
                Ok::<(), io::Error>(())
            });
            let detached = rustix::mount::unmount(&private, rustix::mount::UnmountFlags::DETACH);
            if let Err(e) = bound.and(detached.map_err(io::Error::from)) {
                for b in binds.iter().rev() {
                    let _ = rustix::mount::unmount(b, rustix::mount::UnmountFlags::DETACH);
                }
                let _ = self.unmount(data);
                return Err(e);
            }
            self.forward_changes(&data_fs, data.token)?;
            Ok((data, binds))
        })();
        let _ = std::fs::remove_dir(&private);
        match mounted {
            Ok((data, binds)) => Ok(HostMount { main, data, binds }),
            Err(e) => {
                let _ = self.unmount(main);
                Err(e)
            }
        }
    }

    /// Tells the kernel of the data connection `token` (serving `data`) to drop its pages of a
    /// file when another connection of the daemon changed it. The notifications are written by
    /// a thread of their own: the kernel may wait for a read in flight on that connection
    /// before it returns, and the serving threads must stay free to answer it.
    fn forward_changes(&self, data: &Arc<CtxFs>, token: u64) -> io::Result<()> {
        let conn = self
            .inner
            .conns
            .read()
            .ok()
            .and_then(|c| c.get(&token).map(Arc::downgrade))
            .ok_or_else(|| io::Error::other("the data connection is not served"))?;
        let fs = Arc::downgrade(data);
        let (tx, rx) = std::sync::mpsc::channel::<PathBuf>();
        std::thread::Builder::new().name("fuse-notify".into()).spawn(move || {
            let mut buf = vec![0u8; 64];
            for rel in rx {
                let (Some(conn), Some(fs)) = (conn.upgrade(), fs.upgrade()) else { return };
                let Some(ino) = fs.known_inode(&rel) else { continue };
                let Ok(w) = FuseDevWriter::<()>::new(conn.file.as_raw_fd(), &mut buf) else { continue };
                // ENOENT: the kernel no longer has the inode, so nothing is cached.
                let _ = conn.server.notify_inval_inode(w, ino, 0, 0);
            }
        })?;
        let tx = Mutex::new(tx);
        data.changes().on_data(Arc::new(move |rel: &Path| {
            let _ = tx.lock().map(|t| t.send(rel.to_path_buf()));
        }));
        Ok(())
    }

    /// Tells the kernel of connection `a` (serving `fs`) to drop every entry `fs` knows, so that
    /// the next use of each is looked up again. Call it from a thread that does not serve
    /// requests: the kernel waits for lookups in flight in a directory before it drops an entry
    /// there.
    pub fn invalidate_entries(&self, a: &Attached, fs: &CtxFs) {
        let Some(conn) = self.inner.conns.read().ok().and_then(|c| c.get(&a.token).cloned()) else { return };
        let mut buf = vec![0u8; 4096 + 64];
        for (parent, name) in fs.known_entries() {
            let Ok(w) = FuseDevWriter::<()>::new(conn.file.as_raw_fd(), &mut buf) else { continue };
            // ENOENT: the kernel has no such entry cached.
            let _ = conn.server.notify_inval_entry(w, parent, &name);
        }
    }

    /// Unmounts the host view: the binds of its data connection first, then its own.
    pub fn unmount_host(&self, h: HostMount) -> io::Result<()> {
        for b in h.binds.iter().rev() {
            if let Err(e) = rustix::mount::unmount(b, rustix::mount::UnmountFlags::DETACH) {
                tracing::warn!(mountpoint = %b.display(), error = %e, "cannot detach the data bind");
            }
        }
        // The data connection's own mount point was detached when it was bound; its session
        // ends with the binds (an error here only says that there was nothing left to unmount).
        let _ = self.unmount(h.data);
        self.unmount(h.main)
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
