//! Many `/dev/fuse` connections, one small pool of threads.
//!
//! Every mounted connection (the host view and each agent view) registers its `/dev/fuse`
//! descriptor with one epoll instance, one-shot: a worker that wakes for a connection reads one
//! request, re-arms it (so another worker can take that connection's next request at once), and
//! handles the request with the connection's own `Server`. So a thousand views cost a thousand
//! descriptors and a little memory each, not a thousand threads. The two busy connections (the
//! host view and its data connection) have two threads each that block in `read` instead, so
//! that their requests cost a `read` and a `writev`, without the epoll calls; with FUSE over
//! io_uring the rings serve them, and the pool only what still comes by `/dev/fuse`.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;

use fuse_backend_rs::api::server::Server;
use fuse_backend_rs::transport::{FuseBuf, FuseDevWriter, Reader};
use rustix::event::epoll::{self, EventData, EventFlags};
use rustix::event::{EventfdFlags, eventfd};
use rustix::fs::OFlags;
use rustix::mount::{FsMountFlags, FsOpenFlags, MountAttrFlags, MoveMountFlags, OpenTreeFlags, UnmountFlags};

use super::uring::{self, Load, Rings};
use super::{Transport, Wire};
use crate::CtxFs;

/// Largest request: 1 MiB of data plus headers (the mount's max_read is 1 MiB + 4 KiB).
const BUF: usize = (1 << 20) + 8192;
/// Threads of their own for each busy connection (the host view and its data connection)
/// served by `/dev/fuse`.
const BUSY_READERS: usize = 2;
/// The token of the wake-up eventfd.
const WAKE: u64 = 0;

/// One connection: its `/dev/fuse` descriptor, its server, and how it is served.
pub(crate) struct Conn {
    pub(crate) file: File,
    pub(crate) server: Server<Arc<CtxFs>>,
    /// The filesystem the server serves, for the requests served around it (deferred writes).
    pub(crate) fs: Arc<CtxFs>,
    /// The connection's transport and counters, which its `status` shows.
    pub(crate) wire: Arc<Wire>,
    /// The rings' entries it asks for, when it asks for them.
    ring: Option<Load>,
}

#[cfg(any(test, feature = "fuzz"))]
impl Conn {
    /// A connection to `fs` with no kernel behind it (its descriptor is `/dev/null`), for
    /// serving requests in place (tests, the ring decoder's fuzz target).
    pub(crate) fn detached(fs: Arc<CtxFs>) -> Conn {
        let wire = Arc::clone(fs.wire());
        // root's: the null device
        let file = File::open("/dev/null").expect("/dev/null");
        Conn { file, server: Server::new(Arc::clone(&fs)), fs, wire, ring: None }
    }
}

struct Inner {
    epoll: OwnedFd,
    wake: OwnedFd,
    conns: RwLock<HashMap<u64, Arc<Conn>>>,
    next: AtomicU64,
    stop: AtomicBool,
    rings: Option<Rings>,
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
    /// The connection's `/dev/fuse` descriptor (the served one is a duplicate).
    dev: File,
    /// Where it is mounted: the directory above, open, and the name there (unmounted through
    /// them, never by a path resolved later).
    at: Option<(OwnedFd, OsString)>,
    /// A detached mount (mounted nowhere): its root, whose parts are bound elsewhere.
    mnt: Option<OwnedFd>,
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

    /// The host view's own connection (not the data connection of its `home/` and `shared/`).
    pub fn token(&self) -> u64 {
        self.main.token
    }
}

/// The directories of the host view served by its data connection.
pub const DATA_DIRS: [&str; 2] = ["home", "shared"];

/// The directory above the mount point `path` (an operator's: resolved as given, as
/// mount(8) resolves it), open, and the mount point's name in it.
pub fn open_parent(path: &Path) -> Result<(OwnedFd, OsString), String> {
    let shown = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let real = path.canonicalize().map_err(|e| shown(&e))?;
    let (Some(parent), Some(name)) = (real.parent(), real.file_name()) else {
        return Err(shown(&"not a mount point for a view"));
    };
    // root's: an operator's mount point
    let fd = rustix::fs::open(
        parent,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(|e| shown(&e))?;
    Ok((fd, name.to_os_string()))
}

/// Attaches the detached mount `mount` on the directory `dir` is open on, descriptor to
/// descriptor.
fn move_onto(mount: impl AsFd, dir: impl AsFd) -> rustix::io::Result<()> {
    let both = MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH | MoveMountFlags::MOVE_MOUNT_T_EMPTY_PATH;
    rustix::mount::move_mount(mount, "", dir, "", both)
}

/// A new FUSE connection mounted with the mount API, attached nowhere yet: its `/dev/fuse`
/// descriptor (non-blocking) and the detached mount. The options are those `mount.fuse`
/// gives a server run by root: `allow_other` and `default_permissions`, `nosuid`, `nodev`,
/// `noatime`, requests of at most 1 MiB of data.
fn fuse_mount(source: &str) -> io::Result<(File, OwnedFd)> {
    // root's: the FUSE device
    let dev = std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse")?;
    let fsfd = rustix::mount::fsopen("fuse", FsOpenFlags::FSOPEN_CLOEXEC)?;
    let fd = dev.as_raw_fd().to_string();
    let uid = rustix::process::getuid().as_raw().to_string();
    let gid = rustix::process::getgid().as_raw().to_string();
    let max_read = (BUF - 4096).to_string();
    for (key, value) in [
        ("source", source),
        ("subtype", "cortexfs"),
        ("fd", fd.as_str()),
        ("rootmode", "40000"),
        ("user_id", uid.as_str()),
        ("group_id", gid.as_str()),
        ("max_read", max_read.as_str()),
    ] {
        rustix::mount::fsconfig_set_string(&fsfd, key, value)
            .map_err(|e| io::Error::new(io::Error::from(e).kind(), format!("mount option {key}: {e}")))?;
    }
    for flag in ["default_permissions", "allow_other"] {
        rustix::mount::fsconfig_set_flag(&fsfd, flag)?;
    }
    rustix::mount::fsconfig_create(&fsfd)?;
    let mnt = rustix::mount::fsmount(
        &fsfd,
        FsMountFlags::FSMOUNT_CLOEXEC,
        MountAttrFlags::MOUNT_ATTR_NOSUID
            | MountAttrFlags::MOUNT_ATTR_NODEV
            | MountAttrFlags::MOUNT_ATTR_NOATIME,
    )?;
    rustix::fs::fcntl_setfl(&dev, OFlags::NONBLOCK)?;
    Ok((dev, mnt))
}

fn rearm(inner: &Inner, conn: &Conn, token: u64) {
    let flags = EventFlags::IN | EventFlags::ONESHOT;
    if let Err(e) = epoll::modify(&inner.epoll, &conn.file, EventData::new_u64(token), flags) {
        tracing::debug!(error = %e, token, "re-arming a connection failed");
    }
}

/// Serves one request read from `conn` (`req`), replying through `wbuf`.
fn serve_one(inner: &Inner, conn: &Arc<Conn>, req: &mut [u8], wbuf: &mut [u8]) {
    conn.wire.dev_requests.fetch_add(1, Ordering::Relaxed);
    let opcode = |r: &[u8]| (r.len() >= 8).then(|| u32::from_ne_bytes([r[4], r[5], r[6], r[7]]));
    if let (Some(load), Some(rings)) = (conn.ring, &inner.rings)
        && opcode(req) == Some(uring::OP_INIT)
    {
        init(conn, rings, load, req, wbuf);
        return;
    }
    if opcode(req) == Some(uring::OP_WRITE) && deferred_write(conn, req) {
        return;
    }
    let reader = match Reader::from_fuse_buffer(FuseBuf::new(req)) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(error = %e, "bad request buffer");
            return;
        }
    };
    let writer = match FuseDevWriter::<()>::new(conn.file.as_raw_fd(), wbuf) {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!(error = %e, "bad reply buffer");
            return;
        }
    };
    if let Err(e) = conn.server.handle_message(reader, writer.into(), None, None) {
        tracing::debug!(error = %e, "request failed");
    }
}

/// A thread of its own for a busy connection served by `/dev/fuse`: blocking reads, so a
/// request costs a `read` and a `writev` and no epoll call. Ends when the connection does.
fn reader(inner: &Inner, conn: &Arc<Conn>, token: u64) {
    crate::fs::prepare_thread();
    let mut rbuf = vec![0u8; BUF];
    let mut wbuf = vec![0u8; BUF];
    loop {
        let n = match rustix::io::read(&conn.file, &mut rbuf) {
            Ok(n) => n,
            Err(rustix::io::Errno::INTR | rustix::io::Errno::NOENT | rustix::io::Errno::AGAIN) => continue,
            Err(rustix::io::Errno::NODEV) => {
                if let Ok(mut c) = inner.conns.write() {
                    c.remove(&token);
                }
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, token, "reading /dev/fuse failed");
                return;
            }
        };
        serve_one(inner, conn, &mut rbuf[..n], &mut wbuf);
    }
}

fn worker(inner: &Inner) {
    crate::fs::prepare_thread();
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
            serve_one(inner, &conn, &mut rbuf[..n], &mut wbuf);
        }
    }
}

/// Serves a WRITE request (`fuse_in_header`, `fuse_write_in`, data) to a log without waiting
/// for it to be durable: the reply is written to `/dev/fuse` by the thread that commits it.
/// False when it is not a write to a log.
fn deferred_write(conn: &Arc<Conn>, req: &[u8]) -> bool {
    let Some(w) = uring::WriteRequest::parse(&req[..req.len().min(80)], req.get(80..).unwrap_or(&[])) else {
        return false;
    };
    let c = Arc::clone(conn);
    let unique = w.unique;
    conn.fs.write_deferred(
        w.ino,
        w.fh,
        w.offset,
        w.flags,
        w.data,
        crate::fs::WriteDone::Call(Box::new(move |r| {
            let mut out = [0u8; 24];
            let n = uring::write_reply(&mut out, unique, r);
            // ENOENT: the request was interrupted and is gone.
            let _ = rustix::io::write(&c.file, &out[..n]);
        })),
    )
}

/// Answers INIT on a connection that asks for the rings: the reply fuse-backend-rs writes
/// (into memory: a buffered writer without a descriptor) accepts FUSE over io_uring when the
/// kernel offered it, and the connection's entries are registered once the kernel has it.
fn init(conn: &Arc<Conn>, rings: &Rings, load: Load, req: &mut [u8], wbuf: &mut [u8]) {
    let offered = uring::offered(req);
    let Ok(reader) = Reader::from_fuse_buffer(FuseBuf::new(req)) else { return };
    let len = {
        let Ok(mut w) = FuseDevWriter::<()>::new(-1, wbuf) else { return };
        let Ok(w) = w.split_at(0) else { return };
        // The commit into no descriptor fails after the reply is in `wbuf`.
        let _ = conn.server.handle_message(reader, w.into(), None, None);
        u32::from_ne_bytes([wbuf[0], wbuf[1], wbuf[2], wbuf[3]]) as usize
    };
    let Some(reply) = wbuf.get_mut(..len) else { return };
    let accepted = offered && uring::accept(reply);
    if let Err(e) = rustix::io::write(&conn.file, reply) {
        tracing::warn!(error = %e, "cannot answer INIT");
        return;
    }
    if accepted {
        conn.wire.set(Transport::Uring);
        rings.attach(conn, load);
        tracing::info!(load = ?load, "connection served over io_uring");
    } else {
        conn.wire.set(Transport::Dev);
        tracing::warn!(
            reason = %uring::offered_by_kernel().err().unwrap_or_else(|| "not offered in INIT".into()),
            "FUSE over io_uring is not available: this connection is served by /dev/fuse"
        );
    }
}

impl Pool {
    /// Starts `threads` workers serving `/dev/fuse`.
    pub fn new(threads: usize) -> io::Result<Pool> {
        Pool::with_transport(threads, Transport::Dev)
    }

    /// Starts `threads` workers serving `/dev/fuse`, and with [`Transport::Uring`] or
    /// [`Transport::Auto`] (when the kernel offers it) the rings of FUSE over io_uring, which
    /// then serve every connection mounted after INIT. `Uring` fails when the kernel does not
    /// offer it; `Auto` falls back to `/dev/fuse` and says so in the log.
    pub fn with_transport(threads: usize, transport: Transport) -> io::Result<Pool> {
        let rings = match (transport, uring::offered_by_kernel()) {
            (Transport::Dev, _) => None,
            (Transport::Uring, Ok(())) => Some(Rings::new().map_err(|e| {
                io::Error::new(io::ErrorKind::Unsupported, format!("cannot make io_uring rings: {e}"))
            })?),
            (Transport::Auto, Ok(())) => match Rings::new() {
                Ok(r) => Some(r),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot make io_uring rings: serving /dev/fuse");
                    None
                }
            },
            (Transport::Uring, Err(why)) => {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!("no FUSE over io_uring: {why}"),
                ));
            }
            (Transport::Auto, Err(why)) => {
                tracing::warn!(reason = %why, "FUSE over io_uring is not available: serving /dev/fuse");
                None
            }
        };
        let epoll = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        let wake = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        epoll::add(&epoll, &wake, EventData::new_u64(WAKE), EventFlags::IN)?;
        let inner = Arc::new(Inner {
            epoll,
            wake,
            conns: RwLock::new(HashMap::new()),
            next: AtomicU64::new(WAKE + 1),
            stop: AtomicBool::new(false),
            rings,
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

    /// The transport new connections get: `Uring` when the rings run.
    pub fn transport(&self) -> Transport {
        if self.inner.rings.is_some() { Transport::Uring } else { Transport::Dev }
    }

    /// Number of connections served.
    pub fn connections(&self) -> usize {
        self.inner.conns.read().map_or(0, |c| c.len())
    }

    /// Mounts `fs` at `mountpoint` and serves it from the pool. The mount's source is the
    /// storage it serves and its type `fuse.cortexfs`, as `mount -t fuse.cortexfs STORAGE DIR`
    /// and an fstab line name them. `mountpoint` is the operator's: it is resolved as given;
    /// a directory in a tree another uid can write is mounted on with [`Pool::mount_at`].
    pub fn mount(&self, fs: Arc<CtxFs>, mountpoint: &Path) -> io::Result<Attached> {
        let (parent, name) = open_parent(mountpoint).map_err(io::Error::other)?;
        self.mount_as(fs, Some((parent, name.as_os_str())), mountpoint, Load::Idle)
    }

    /// Mounts `fs` on the directory `name` in the directory `parent` is open on (`shown` is its
    /// path, for listings and logs), opened beneath `parent` with no symlink: the mount lands
    /// on that directory, and is unmounted through `parent`, never by a path resolved later.
    pub fn mount_at(
        &self,
        fs: Arc<CtxFs>,
        parent: BorrowedFd<'_>,
        name: &OsStr,
        shown: &Path,
    ) -> io::Result<Attached> {
        let parent = parent.try_clone_to_owned()?;
        self.mount_as(fs, Some((parent, name)), shown, Load::Idle)
    }

    /// Mounts `fs` with the mount API (`fsopen`, `fsmount`) on the directory `name` in
    /// `parent` (opened beneath it), or nowhere when `at` is `None` (a detached mount, whose
    /// parts are bound elsewhere: [`Attached::mnt`]), and serves it, asking the rings for as
    /// many entries as `load` says.
    fn mount_as(
        &self,
        fs: Arc<CtxFs>,
        at: Option<(OwnedFd, &OsStr)>,
        shown: &Path,
        load: Load,
    ) -> io::Result<Attached> {
        let (dev, mnt) = fuse_mount(&fs.storage_path().display().to_string())?;
        let shown_err = |e: rustix::io::Errno| {
            io::Error::new(io::Error::from(e).kind(), format!("mounting on {}: {e}", shown.display()))
        };
        let (at, mnt) = match at {
            Some((parent, name)) => {
                let dir = rustix::fs::openat2(
                    &parent,
                    name,
                    OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    rustix::fs::Mode::empty(),
                    ringfs::beneath::BENEATH,
                )
                .map_err(shown_err)?;
                move_onto(&mnt, &dir).map_err(shown_err)?;
                // The mount's own descriptor is not kept: it would keep the mount busy for
                // an operator's umount(8).
                (Some((parent, name.to_os_string())), None)
            }
            None => (None, Some(mnt)),
        };
        let file = dev.try_clone()?;
        let token = self.inner.next.fetch_add(1, Ordering::Relaxed);
        let wire = Arc::clone(fs.wire());
        let ring = self.inner.rings.as_ref().map(|_| load);
        let conn = Arc::new(Conn { file, server: Server::new(Arc::clone(&fs)), fs, wire, ring });
        // Into the table first: a worker may wake for the INIT request the moment the
        // descriptor is armed, and must find the connection.
        self.inner
            .conns
            .write()
            .map_err(|_| io::Error::other("connection table poisoned"))?
            .insert(token, Arc::clone(&conn));
        if load == Load::Busy && self.inner.rings.is_none() {
            // Served by `/dev/fuse` alone and busy: threads of its own, blocking in `read`.
            rustix::fs::fcntl_setfl(&conn.file, rustix::fs::OFlags::empty())?;
            for i in 0..BUSY_READERS {
                let (inner, conn) = (Arc::clone(&self.inner), Arc::clone(&conn));
                std::thread::Builder::new()
                    .name(format!("fuse-{token}.{i}"))
                    .spawn(move || reader(&inner, &conn, token))?;
            }
        } else {
            epoll::add(
                &self.inner.epoll,
                conn.file.as_fd(),
                EventData::new_u64(token),
                EventFlags::IN | EventFlags::ONESHOT,
            )?;
        }
        Ok(Attached { token, dev, at, mnt, mountpoint: shown.to_path_buf() })
    }

    /// Mounts the host view at `mountpoint`: `fs` serves it, and `data` (a
    /// [`CtxFs::data`] over the same storage) serves everything beneath its `home/` and
    /// `shared/`, so that plain files there are opened, read and closed without a request once
    /// cached. The data connection is mounted nowhere: its `home` and `shared` are cloned from
    /// the detached mount (`open_tree`) and moved onto the host view's, and those two are all
    /// that reach it.
    pub fn mount_host(&self, fs: Arc<CtxFs>, data: Arc<CtxFs>, mountpoint: &Path) -> io::Result<HostMount> {
        let data_fs = Arc::clone(&data);
        let (parent, name) = open_parent(mountpoint).map_err(io::Error::other)?;
        let main = self.mount_as(fs, Some((parent, name.as_os_str())), mountpoint, Load::Busy)?;
        let mounted = (|| {
            // Mounted nowhere: its `home` and `shared` are cloned from the detached mount and
            // moved onto the host view's, descriptor to descriptor.
            let data = self.mount_as(data, None, mountpoint, Load::Busy)?;
            let mut binds = Vec::new();
            let bound = DATA_DIRS.iter().try_for_each(|d| {
                let detached =
                    data.mnt.as_ref().ok_or_else(|| io::Error::other("the data mount is attached"))?;
                let tree = rustix::mount::open_tree(
                    detached,
                    *d,
                    OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC,
                )?;
                // root's: the host view just mounted, served by this daemon
                let to = rustix::fs::openat(
                    rustix::fs::CWD,
                    mountpoint.join(d),
                    OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    rustix::fs::Mode::empty(),
                )?;
                move_onto(&tree, &to)?;
                binds.push(mountpoint.join(d));
                Ok::<(), io::Error>(())
            });
            if let Err(e) = bound {
                for b in binds.iter().rev() {
                    let _ = rustix::mount::unmount(b, UnmountFlags::DETACH);
                }
                let _ = self.unmount(data);
                return Err(e);
            }
            self.forward_changes(&data_fs, data.token)?;
            Ok((data, binds))
        })();
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
        self.drop_entries(a.token, fs, false);
    }

    /// [`Pool::invalidate_entries`] of the host view's own connection `token`
    /// ([`HostMount::token`]), but for its `home` and `shared`: the data connection is bound
    /// over those two entries, and the kernel detaches what is mounted on an entry it drops.
    pub fn invalidate_entries_of(&self, token: u64, fs: &CtxFs) {
        self.drop_entries(token, fs, true);
    }

    fn drop_entries(&self, token: u64, fs: &CtxFs, host: bool) {
        let Some(conn) = self.inner.conns.read().ok().and_then(|c| c.get(&token).cloned()) else { return };
        let mut buf = vec![0u8; 4096 + 64];
        for (parent, name) in fs.known_entries() {
            if host
                && parent == fuse_backend_rs::api::filesystem::ROOT_ID
                && DATA_DIRS.iter().any(|d| d.as_bytes() == name.as_bytes())
            {
                continue;
            }
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
    pub fn unmount(&self, a: Attached) -> io::Result<()> {
        if let Some(conn) = self.inner.conns.write().ok().and_then(|mut c| c.remove(&a.token)) {
            let _ = epoll::delete(&self.inner.epoll, &conn.file);
        }
        // Closed first, so that nothing waits on a request the pool no longer serves.
        drop(a.dev);
        let Some((parent, name)) = &a.at else { return Ok(()) };
        let path = Path::new(&ringfs::beneath::through(parent)).join(name);
        // The last level is not followed.
        match rustix::mount::unmount(&path, UnmountFlags::DETACH | UnmountFlags::NOFOLLOW) {
            // Unmounted already (umount(8), or a dead connection cleaned).
            Ok(()) | Err(rustix::io::Errno::INVAL) => Ok(()),
            Err(e) => Err(io::Error::new(
                io::Error::from(e).kind(),
                format!("unmounting {}: {e}", a.mountpoint.display()),
            )),
        }
    }

    /// Stops the workers (after every connection was unmounted).
    pub fn shutdown(mut self) {
        self.inner.stop.store(true, Ordering::Relaxed);
        let _ = rustix::io::write(&self.inner.wake, &1u64.to_ne_bytes());
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        if let Some(inner) = Arc::get_mut(&mut self.inner)
            && let Some(r) = inner.rings.as_mut()
        {
            r.shutdown();
        }
    }
}
