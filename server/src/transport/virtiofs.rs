//! vhost-user virtio-fs: one view of `/ctx` served to one virtual machine over a Unix socket.
//!
//! The VMM (QEMU's `vhost-user-fs-pci`, cloud-hypervisor's `--fs`) connects to the socket and
//! hands over the guest's memory and virtqueues; each descriptor chain is one FUSE request,
//! answered by the same [`CtxFs`] as a local mount, through fuse-backend-rs's
//! `Reader::from_descriptor_chain` and `VirtioFsWriter`. The socket is the identity: whoever
//! connects gets the view the daemon was started with.
//!
//! Lifecycle, so that nothing leaks across guests:
//! - each connection gets its own filesystem state (inode table, open handles), guest memory
//!   mappings and queue threads, all released when the VMM disconnects; the daemon then takes
//!   the next connection on the same socket. A second VMM that connects while one is served
//!   waits in the listen backlog until the first is gone.
//! - a guest reboot (or an unmount and mount) keeps the connection but starts a new FUSE
//!   session with `FUSE_INIT`: the filesystem state of the old session is dropped then, since
//!   the old kernel will never FORGET or RELEASE what it held.
//! - session logs are shared with the daemon's other sessions while open (one writer per log);
//!   when a session or connection ends, logs that no open file holds any more are closed.
//! - [`Stopper::stop`] (SIGTERM in `ctx mount`) stops the queue threads after the request each
//!   one is handling, stops listening and removes the socket.
//!
//! Queue 0 is the high-priority queue (FORGET, INTERRUPT); queues 1.. carry requests, one
//! thread each (the first also takes queue 0). Requests are handled on the queue's thread, with
//! no hand-off.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;

use fuse_backend_rs::abi::fuse_abi::Opcode;
use fuse_backend_rs::api::server::Server;
use fuse_backend_rs::transport::{Reader, VirtioFsWriter};
use rustix::event::{EventfdFlags, PollFd, PollFlags, eventfd, poll};
use vhost::vhost_user::Listener;
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost_user_backend::{VhostUserBackend, VhostUserDaemon, VringRwLock, VringT};
use virtio_bindings::bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
use virtio_queue::{DescriptorChain, QueueT};
use vm_memory::{Address, Bytes, GuestAddressSpace, GuestMemory, GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;

use crate::{Config, CtxFs, SharedLogs};

/// Guest memory as the vhost-user backend library hands it over.
type Mem = GuestMemoryAtomic<GuestMemoryMmap>;
type Vring = VringRwLock<Mem>;

/// Most request queues a VMM may configure (QEMU: `num-request-queues`, default 1).
pub const MAX_REQUEST_QUEUES: usize = 16;
/// Largest virtqueue accepted (QEMU: `queue-size`, default 128).
const MAX_QUEUE_SIZE: usize = 1024;

/// A non-blocking eventfd.
fn event() -> io::Result<Arc<OwnedFd>> {
    Ok(Arc::new(eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?))
}

/// Makes `fd` readable.
fn signal(fd: &OwnedFd) {
    if let Err(e) = rustix::io::write(fd, &1u64.to_ne_bytes()) {
        tracing::error!(error = %e, "cannot signal an event");
    }
}

/// Empties `fd`.
fn drain(fd: &OwnedFd) {
    let mut b = [0u8; 8];
    let _ = rustix::io::read(fd, &mut b);
}

/// The handle that stops a [`Daemon`] from another thread (a signal handler thread).
#[derive(Clone, Debug)]
pub struct Stopper(Arc<OwnedFd>);

impl Stopper {
    /// Asks the daemon to stop.
    pub fn stop(&self) {
        signal(&self.0);
    }
}

/// The connection being served: its thread, and the event that ends its queue threads.
struct Active {
    thread: JoinHandle<Result<(), String>>,
    close: Arc<OwnedFd>,
}

/// A virtio-fs daemon bound to its socket.
#[derive(Debug)]
pub struct Daemon {
    listener: UnixListener,
    path: PathBuf,
    config: Config,
    request_queues: usize,
    stop: Arc<OwnedFd>,
}

/// One FUSE session's filesystem: replaced when the guest starts a new session.
struct Session {
    server: Server<Arc<CtxFs>>,
}

/// The backend of one VMM connection.
struct Backend {
    config: Config,
    session: RwLock<Arc<Session>>,
    /// Whether the current session has served a request (a fresh one needs no replacing).
    used: AtomicBool,
    mem: Mutex<Mem>,
    event_idx: AtomicBool,
    queues: usize,
    /// Written to end the queue threads of this connection.
    close: Arc<OwnedFd>,
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend").field("queues", &self.queues).finish()
    }
}

fn new_session(config: &Config) -> io::Result<Arc<Session>> {
    let fs = CtxFs::new(config.clone())?;
    Ok(Arc::new(Session { server: Server::new(Arc::new(fs)) }))
}

/// The opcode of the FUSE request in `chain`, read from its first readable descriptor.
fn opcode<M: GuestMemory>(mem: &M, chain: &DescriptorChain<&M>) -> Option<u32> {
    let first = chain.clone().readable().next()?;
    if first.len() < 8 {
        return None;
    }
    let op: u32 = mem.read_obj(first.addr().checked_add(4)?).ok()?;
    Some(u32::from_le(op))
}

impl Backend {
    /// The token of the close event in every queue thread's epoll set (above the queues and
    /// the library's own exit event).
    fn close_token(&self) -> u64 {
        self.queues as u64 + 1
    }

    fn session(&self) -> Arc<Session> {
        Arc::clone(&self.session.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// A new FUSE session on this connection: drops everything the last one held.
    fn restart_session(&self) {
        if !self.used.swap(false, Ordering::AcqRel) {
            return;
        }
        match new_session(&self.config) {
            Ok(s) => {
                let old = std::mem::replace(&mut *self.session.write().unwrap_or_else(|p| p.into_inner()), s);
                drop(old);
                close_idle_logs(&self.config.logs);
                tracing::info!("guest started a new FUSE session: state of the previous one dropped");
            }
            Err(e) => tracing::error!(error = %e, "cannot reopen storage for a new FUSE session"),
        }
    }

    /// Handles every available request of `vring`.
    fn process(&self, vring: &Vring) -> io::Result<()> {
        let mem = self.mem.lock().unwrap_or_else(|p| p.into_inner()).memory();
        let mem: &GuestMemoryMmap = &mem;
        loop {
            let chain = vring.get_mut().get_queue_mut().pop_descriptor_chain(mem);
            let Some(chain) = chain else { break };
            let head = chain.head_index();
            if opcode(mem, &chain) == Some(Opcode::Init as u32) {
                self.restart_session();
            }
            self.used.store(true, Ordering::Release);
            let session = self.session();
            let len =
                match (Reader::from_descriptor_chain(mem, chain.clone()), VirtioFsWriter::new(mem, chain)) {
                    (Ok(r), Ok(w)) => match session.server.handle_message(r, w.into(), None, None) {
                        Ok(n) => n,
                        Err(e) => {
                            tracing::debug!(error = %e, "request failed");
                            0
                        }
                    },
                    (Err(e), _) | (_, Err(e)) => {
                        tracing::warn!(error = %e, "malformed descriptor chain from the guest");
                        0
                    }
                };
            vring.add_used(head, u32::try_from(len).unwrap_or(u32::MAX)).map_err(io::Error::other)?;
            if vring.needs_notification().map_err(io::Error::other)? {
                vring.signal_used_queue()?;
            }
        }
        Ok(())
    }
}

impl VhostUserBackend for Backend {
    type Bitmap = ();
    type Vring = Vring;

    fn num_queues(&self) -> usize {
        self.queues
    }

    fn max_queue_size(&self) -> usize {
        MAX_QUEUE_SIZE
    }

    fn features(&self) -> u64 {
        (1 << VIRTIO_F_VERSION_1)
            | (1 << VIRTIO_RING_F_INDIRECT_DESC)
            | (1 << VIRTIO_RING_F_EVENT_IDX)
            | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::REPLY_ACK
            | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS
    }

    fn set_event_idx(&self, enabled: bool) {
        self.event_idx.store(enabled, Ordering::Release);
    }

    fn update_memory(&self, mem: Mem) -> io::Result<()> {
        *self.mem.lock().unwrap_or_else(|p| p.into_inner()) = mem;
        Ok(())
    }

    fn queues_per_thread(&self) -> Vec<u64> {
        // Thread 0: the high-priority queue and the first request queue; then one thread per
        // further request queue.
        let mut masks = vec![0b11];
        masks.extend((2..self.queues).map(|q| 1u64 << q));
        masks
    }

    fn handle_event(
        &self,
        device_event: u16,
        evset: EventSet,
        vrings: &[Vring],
        _thread: usize,
    ) -> io::Result<()> {
        if u64::from(device_event) == self.close_token() {
            // Ends this queue thread's loop (the library stops a thread whose handler fails).
            return Err(io::Error::other("connection closed"));
        }
        if evset != EventSet::IN {
            return Err(io::Error::other(format!("unexpected queue event {evset:?}")));
        }
        let Some(vring) = vrings.get(usize::from(device_event)) else {
            return Err(io::Error::other(format!("event for unknown queue {device_event}")));
        };
        let result = if self.event_idx.load(Ordering::Acquire) {
            // Handle what is there, then re-enable notifications; requests that arrived in
            // between are handled before sleeping again.
            loop {
                vring.disable_notification().map_err(io::Error::other)?;
                self.process(vring)?;
                if !vring.enable_notification().map_err(io::Error::other)? {
                    break Ok(());
                }
            }
        } else {
            self.process(vring)
        };
        if let Err(e) = &result {
            // A broken queue is the guest's problem; the thread keeps serving the others.
            tracing::warn!(error = %e, queue = device_event, "virtqueue failed");
        }
        Ok(())
    }
}

/// Serves one VMM connection until it ends; `close` ends its queue threads early.
fn serve_connection(mut listener: Listener, backend: Arc<Backend>) -> Result<(), String> {
    let mem = Mem::new(GuestMemoryMmap::new());
    let mut daemon = VhostUserDaemon::new("ctx-virtiofs".to_owned(), Arc::clone(&backend), mem)
        .map_err(|e| format!("cannot start the queue threads: {e}"))?;
    for h in daemon.get_epoll_handlers() {
        h.register_listener(backend.close.as_raw_fd(), EventSet::IN, backend.close_token())
            .map_err(|e| format!("cannot watch the close event: {e}"))?;
    }
    let served = daemon.start(&mut listener).map_err(|e| format!("cannot accept the connection: {e}"));
    if served.is_ok() {
        tracing::info!("VMM connected");
        match daemon.wait() {
            Ok(()) => tracing::info!("VMM disconnected"),
            Err(e) => tracing::info!(reason = %e, "VMM disconnected"),
        }
    }
    // Ends the queue threads; dropping the daemon joins them and unmaps the guest's memory.
    signal(&backend.close);
    drop(daemon);
    let logs = Arc::clone(&backend.config.logs);
    drop(backend);
    close_idle_logs(&logs);
    served
}

/// Closes the append logs no open file holds any more (the guest that wrote them is gone);
/// the next append opens its log again.
fn close_idle_logs(logs: &SharedLogs) {
    logs.close_idle();
}

/// Whether a daemon answers on the socket at `path`.
fn in_use(path: &Path) -> bool {
    UnixStream::connect(path).is_ok()
}

impl Daemon {
    /// Binds `socket` (mode 0600) for serving `config`'s view with up to `request_queues`
    /// request queues (1 to [`MAX_REQUEST_QUEUES`]). A stale socket left by a dead daemon is
    /// replaced; a live one, or any other file, is an error.
    pub fn bind(socket: &Path, config: Config, request_queues: usize) -> io::Result<Daemon> {
        if !(1..=MAX_REQUEST_QUEUES).contains(&request_queues) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("request queues must be 1 to {MAX_REQUEST_QUEUES}"),
            ));
        }
        // Fails now, rather than at the first connection, when the storage cannot be served.
        drop(CtxFs::new(config.clone())?);
        match std::fs::symlink_metadata(socket) {
            Ok(m) if !m.file_type().is_socket() => {
                return Err(io::Error::new(io::ErrorKind::AlreadyExists, "exists and is not a socket"));
            }
            Ok(_) if in_use(socket) => {
                return Err(io::Error::new(io::ErrorKind::AddrInUse, "another daemon is serving it"));
            }
            Ok(_) => std::fs::remove_file(socket)?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let listener = UnixListener::bind(socket)?;
        std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))?;
        let stop = event()?;
        Ok(Daemon { listener, path: socket.to_path_buf(), config, request_queues, stop })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A handle that stops [`Daemon::serve`].
    pub fn stopper(&self) -> Stopper {
        Stopper(Arc::clone(&self.stop))
    }

    /// Serves one connection after another until stopped; the socket is removed when the
    /// daemon is dropped.
    pub fn serve(self) -> io::Result<()> {
        let done = event()?;
        let mut active: Option<Active> = None;
        loop {
            let mut fds = vec![
                PollFd::from_borrowed_fd(self.stop.as_fd(), PollFlags::IN),
                PollFd::from_borrowed_fd(done.as_fd(), PollFlags::IN),
            ];
            if active.is_none() {
                fds.push(PollFd::new(&self.listener, PollFlags::IN));
            }
            match poll(&mut fds, None) {
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
            let ready = |i: usize| fds.get(i).is_some_and(|f| !f.revents().is_empty());
            let (stop, ended, incoming) = (ready(0), ready(1), ready(2));
            drop(fds);
            if stop {
                if let Some(Active { thread, close }) = active.take() {
                    // The queue threads finish the request in hand and end; the connection
                    // itself ends with the process.
                    signal(&close);
                    if thread.is_finished() {
                        let _ = thread.join();
                    }
                }
                tracing::info!(socket = %self.path.display(), "stopping");
                return Ok(());
            }
            if ended {
                drain(&done);
                if let Some(Active { thread, .. }) = active.take() {
                    match thread.join() {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => tracing::error!(error = %e, "connection failed"),
                        Err(_) => tracing::error!("connection thread panicked"),
                    }
                }
            }
            if incoming && active.is_none() {
                active = Some(self.spawn_connection(&done)?);
            }
        }
    }

    fn spawn_connection(&self, done: &Arc<OwnedFd>) -> io::Result<Active> {
        let close = event()?;
        let backend = Arc::new(Backend {
            config: self.config.clone(),
            session: RwLock::new(new_session(&self.config)?),
            used: AtomicBool::new(false),
            mem: Mutex::new(Mem::new(GuestMemoryMmap::new())),
            event_idx: AtomicBool::new(false),
            queues: 1 + self.request_queues,
            close: Arc::clone(&close),
        });
        // The connection thread accepts on its own descriptor of the listening socket (with no
        // path, so that dropping it removes nothing).
        let listener = Listener::from(self.listener.try_clone()?);
        let done = Arc::clone(done);
        let thread = std::thread::Builder::new().name("virtiofs-conn".into()).spawn(move || {
            let r = serve_connection(listener, backend);
            signal(&done);
            r
        })?;
        Ok(Active { thread, close })
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_file(&self.path)
            && e.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!(error = %e, socket = %self.path.display(), "cannot remove the socket");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(dir: &Path) -> Config {
        Config::new(dir.join("storage"), Vec::new())
    }

    #[test]
    fn bind_refuses_a_regular_file_and_replaces_a_stale_socket() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let file = dir.path().join("file");
        std::fs::write(&file, "x")?;
        let e = Daemon::bind(&file, config(dir.path()), 1).expect_err("a regular file is not replaced");
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read(&file)?, b"x");

        let sock = dir.path().join("vfs.sock");
        drop(UnixListener::bind(&sock)?); // stale: nobody listens
        let d = Daemon::bind(&sock, config(dir.path()), 1)?;
        let e = Daemon::bind(&sock, config(dir.path()), 1).expect_err("a live socket is not replaced");
        assert_eq!(e.kind(), io::ErrorKind::AddrInUse);
        drop(d);
        Ok(())
    }

    #[test]
    fn stop_ends_serve_and_removes_the_socket() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let sock = dir.path().join("vfs.sock");
        let d = Daemon::bind(&sock, config(dir.path()), 2)?;
        let stop = d.stopper();
        let t = std::thread::spawn(move || d.serve());
        // A client that connects and leaves at once is a disconnect, not an error.
        drop(UnixStream::connect(&sock)?);
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(sock.exists());
        stop.stop();
        t.join().expect("serve thread")?;
        assert!(!sock.exists());
        Ok(())
    }

    #[test]
    fn bind_checks_the_queue_count() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let sock = dir.path().join("vfs.sock");
        for n in [0, MAX_REQUEST_QUEUES + 1] {
            let e = Daemon::bind(&sock, config(dir.path()), n).expect_err("out of range");
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        }
        Ok(())
    }
}
