//! The control socket: a root-only Unix socket of the `ctx mount` daemon through which
//! `ctx view` creates, lists and removes agent views.
//!
//! Protocol: one JSON object per line each way ([`policy::runtime::ControlRequest`] and
//! [`policy::runtime::ControlReply`]; a request with an unknown op or field is refused whole).
//! - `{"op":"create","agent":A,"session":S,"path":P?}` -> `{"ok":true,"path":P}`; the view is a
//!   new FUSE mount at P (default `/run/cortexfs/view/A/S`) carrying A's authority.
//! - `{"op":"ls"}` -> `{"ok":true,"views":[{"agent":A,"session":S,"path":P}...]}`
//! - `{"op":"rm","path":P}` -> `{"ok":true}`
//! - failures: `{"ok":false,"error":MESSAGE}`
//!
//! Only peers with uid 0 (checked with `SO_PEERCRED`, not claimed) are served.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use policy::runtime::{self, ControlReply, ControlRequest, ViewEntry};
use ringfs::beneath::Tree;

use crate::transport::pool::{Attached, Pool, open_parent};
use crate::{Config, CtxFs, ViewSpec};

/// The default control socket.
pub const DEFAULT_SOCKET: &str = runtime::CONTROL_SOCKET;
/// Most bytes of one control-socket request line.
const REQUEST_MAX: usize = runtime::CONTROL_REQUEST_MAX;

struct View {
    spec: ViewSpec,
    mount: Attached,
    fs: Arc<CtxFs>,
}

/// The views a daemon serves, all from one thread pool.
pub struct Views {
    base: Config,
    pool: Arc<Pool>,
    /// Where this daemon mounts views by default (`view/` of its runtime directory).
    root: PathBuf,
    views: Mutex<Vec<View>>,
    /// Set by [`Views::watch`]: views keep entries, dropped when what they show may change.
    cache: AtomicBool,
    /// The host view's connection and filesystem ([`Views::serve_host`]): its entries are
    /// dropped with the views' when the storage changes behind the daemon's back.
    host: Mutex<Option<(u64, Arc<CtxFs>)>>,
}

impl std::fmt::Debug for Views {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Views").field("count", &self.count()).finish()
    }
}

impl Views {
    /// Views of the storage and binaries in `base`, served by `pool`, mounted by default under
    /// `root` ([`runtime::views_root`] of the daemon's control socket).
    pub fn new(base: Config, pool: Arc<Pool>, root: PathBuf) -> Views {
        Views {
            base,
            pool,
            root,
            views: Mutex::new(Vec::new()),
            cache: AtomicBool::new(false),
            host: Mutex::new(None),
        }
    }

    /// The host view (the connection `token` of the pool, serving `fs`): what a command
    /// changes in the storage directly (`ctx agent grant`, `ctx config commit`) is read
    /// through the host's `/ctx` as soon as the watch sees it, not once the kernel's cached
    /// entries time out.
    pub fn serve_host(&self, token: u64, fs: Arc<CtxFs>) {
        if let Ok(mut h) = self.host.lock() {
            *h = Some((token, fs));
        }
    }

    /// Lets the kernels of the views created from now on keep entries and attributes, and
    /// drops every view's entries whenever what they show may change: a control published
    /// through any connection of the daemon, or a change in the storage's object directories
    /// (`tool/`, `agent/`, `model/` and the objects' `.d/`) made by other means (`ctx object
    /// install`, `ctx agent new`, an editor), seen through inotify. Two threads: one watches,
    /// one writes the invalidations (never a serving thread: the kernel may wait for a lookup
    /// in flight before it drops an entry).
    pub fn watch(self: &Arc<Views>) -> std::io::Result<()> {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let views = Arc::downgrade(self);
        std::thread::Builder::new().name("view-notify".into()).spawn(move || {
            while rx.recv().is_ok() {
                // Many changes at once (an install) are one invalidation.
                while rx.try_recv().is_ok() {}
                let Some(views) = views.upgrade() else { return };
                let host = views.host.lock().ok().and_then(|h| h.clone());
                if let Some((token, fs)) = host {
                    views.pool.invalidate_entries_of(token, &fs);
                }
                let Ok(list) = views.views.lock() else { return };
                for v in list.iter() {
                    views.pool.invalidate_entries(&v.mount, &v.fs);
                }
            }
        })?;
        let storage = self.base.storage.clone();
        let watcher_tx = tx.clone();
        let epoch = Arc::clone(self.base.changes.epoch());
        let active = self.base.active.clone();
        std::thread::Builder::new().name("storage-watch".into()).spawn(move || {
            if let Err(e) = watch_storage(&storage, &epoch, active.as_deref(), &watcher_tx) {
                epoch.blind();
                tracing::warn!(error = %e, "not watching the storage: views check their policies on every request, and see other changes made behind the daemon's back within the cache timeout");
            }
        })?;
        let tx = Mutex::new(tx);
        self.base.changes.on_authority(Arc::new(move || {
            let _ = tx.lock().map(|t| t.send(()));
        }));
        self.cache.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Number of live views.
    pub fn count(&self) -> usize {
        self.views.lock().map_or(0, |v| v.len())
    }

    // The fields of a create request, each checked here.
    #[allow(clippy::too_many_arguments)]
    fn create(
        &self,
        agent: &str,
        session: &str,
        path: Option<&str>,
        workspace: Option<&str>,
        session_of: Option<&str>,
        records_only: bool,
        space: Option<&str>,
    ) -> Result<PathBuf, String> {
        policy::name::validate(agent).map_err(|e| format!("invalid agent name {agent:?}: {e}"))?;
        policy::name::validate(session).map_err(|e| format!("invalid session name {session:?}: {e}"))?;
        // A view carries an agent's authority: there must be an agent to carry, in the
        // configuration in force (the active generation of a repository).
        // root's: the storage's objects, or its active generation
        if !ringfs::config::read_root(&self.base.storage).join("agent").join(agent).is_file() {
            return Err(format!(
                "no agent {agent} in {} (ctx agent ls lists them)",
                self.base.storage.display()
            ));
        }
        let path = match path {
            Some(p) => {
                policy::path::check_absolute(p).map_err(|e| format!("view path: {e}"))?;
                PathBuf::from(p)
            }
            None => self.root.join(agent).join(session),
        };
        let mut views = self.views.lock().map_err(|_| "view table poisoned".to_owned())?;
        if views.iter().any(|v| v.mount.mountpoint() == path) {
            return Err(format!("{} already serves a view", path.display()));
        }
        let dir = self.view_dir(agent, &path)?;
        let workspace = match workspace {
            Some(w) => {
                policy::path::check_absolute(w).map_err(|e| format!("workspace: {e}"))?;
                Some(PathBuf::from(w))
            }
            None => None,
        };
        if let Some(o) = session_of {
            policy::name::validate(o).map_err(|e| format!("invalid agent name {o:?}: {e}"))?;
        }
        if let Some(s) = space {
            policy::name::validate(s).map_err(|e| format!("invalid shared space name {s:?}: {e}"))?;
        }
        let spec = ViewSpec {
            agent: agent.to_owned(),
            session: session.to_owned(),
            workspace,
            session_of: session_of.map(str::to_owned),
            space: space.map(str::to_owned),
            records_only,
        };
        let mut fs = CtxFs::new(Config { view: Some(spec.clone()), ..self.base.clone() })
            .map_err(|e| format!("opening storage: {e}"))?;
        if self.cache.load(Ordering::Relaxed) {
            fs.cache_entries();
        }
        let fs = Arc::new(fs);
        let mount = self
            .pool
            .mount_at(Arc::clone(&fs), dir.0.as_fd(), &dir.1, &path)
            .map_err(|e| format!("mounting {}: {e}", path.display()))?;
        tracing::info!(agent, session, path = %path.display(), "view created");
        views.push(View { spec, mount, fs });
        self.base.view_count.store(views.len() as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(path)
    }

    /// The directory a view of `agent` is mounted on, made if missing, and open. Under the
    /// daemon's view root it is `ROOT/AGENT/NAME`: the root (0711) is root's and may be passed
    /// through but not listed, and each agent's directory is its own (0700, the agent's uid),
    /// so only that agent's sandbox (and root) can reach its views. Since the agent owns that
    /// directory, the view's is made and opened beneath it ([`ringfs::beneath`]): no symlink,
    /// no mount point, and the mount lands on the directory made. Other paths are the
    /// operator's and are resolved as given. Returns the directory's parent, open, and its name
    /// there.
    fn view_dir(&self, agent: &str, path: &Path) -> Result<(OwnedFd, OsString), String> {
        let root = &self.root;
        let rel = match path.strip_prefix(root) {
            Ok(rel) if rel.as_os_str().is_empty() => None,
            Ok(rel) => Some(rel),
            Err(_) => None,
        };
        let Some(rel) = rel else {
            // root's: an operator's path (or the view root itself)
            std::fs::create_dir_all(path).map_err(|e| format!("{}: {e}", path.display()))?;
            let parent = open_parent(path)?;
            return Ok((parent.0, parent.1));
        };
        let mut parts = rel.components();
        let name = match (parts.next(), parts.next(), parts.next()) {
            (Some(Component::Normal(a)), Some(Component::Normal(name)), None) if a == agent => name,
            _ => return Err(format!("a view under {} is {}/{agent}/NAME", root.display(), root.display())),
        };
        // root's: the daemon's view root
        std::fs::create_dir_all(root).map_err(|e| format!("{}: {e}", root.display()))?;
        let top = Tree::open(root).map_err(|e| e.to_string())?;
        top.chmod(0o711).map_err(|e| format!("{}: {e}", root.display()))?;
        let own = top.make_dirs(agent, 0o700).map_err(|e| e.to_string())?;
        own.chmod(0o700).map_err(|e| format!("{}: {e}", own.path().display()))?;
        let uid_file = Path::new("agent").join(format!("{agent}.d")).join("uid");
        let root = ringfs::config::read_root(&self.base.storage);
        if let Some(uid) = ringfs::config::read_config(&root, &uid_file, 64)
            .ok()
            .and_then(|t| String::from_utf8_lossy(&t).trim().parse::<u32>().ok())
        {
            own.chown(uid, 0).map_err(|e| format!("{}: {e}", own.path().display()))?;
        }
        own.make_dirs(name, 0o755).map_err(|e| e.to_string())?;
        Ok((own.into(), name.to_os_string()))
    }

    fn remove(&self, path: &str) -> Result<(), String> {
        let mut views = self.views.lock().map_err(|_| "view table poisoned".to_owned())?;
        let i = views
            .iter()
            .position(|v| v.mount.mountpoint() == Path::new(path))
            .ok_or_else(|| format!("no view at {path}"))?;
        let v = views.remove(i);
        self.base.view_count.store(views.len() as u64, std::sync::atomic::Ordering::Relaxed);
        self.pool.unmount(v.mount).map_err(|e| format!("unmounting {path}: {e}"))?;
        remove_view_dir(Path::new(path), &self.root);
        tracing::info!(path, "view removed");
        Ok(())
    }

    fn list(&self) -> ControlReply {
        let views = self.views.lock().map(|v| {
            v.iter()
                .map(|v| ViewEntry {
                    agent: v.spec.agent.clone(),
                    session: v.spec.session.clone(),
                    path: v.mount.mountpoint().display().to_string(),
                })
                .collect::<Vec<_>>()
        });
        ControlReply { ok: true, views: Some(views.unwrap_or_default()), ..ControlReply::default() }
    }

    /// Unmounts every view.
    pub fn shutdown(&self) {
        if let Ok(mut views) = self.views.lock() {
            for v in views.drain(..) {
                let _ = self.pool.unmount(v.mount);
            }
        }
    }

    fn handle(&self, req: ControlRequest) -> ControlReply {
        let r = match req {
            ControlRequest::Create { agent, session, path, workspace, session_of, records_only, space } => {
                self.create(
                    &agent,
                    &session,
                    path.as_deref(),
                    workspace.as_deref(),
                    session_of.as_deref(),
                    records_only,
                    space.as_deref(),
                )
                .map(|p| ControlReply {
                    ok: true,
                    path: Some(p.display().to_string()),
                    ..ControlReply::default()
                })
            }
            ControlRequest::Rm { path } => {
                self.remove(&path).map(|()| ControlReply { ok: true, ..ControlReply::default() })
            }
            ControlRequest::Ls {} => Ok(self.list()),
        };
        r.unwrap_or_else(ControlReply::refused)
    }
}

/// One reply line.
fn reply_line(r: &ControlReply) -> String {
    serde_json::to_string(r).unwrap_or_else(|_| r#"{"ok":false,"error":"internal error"}"#.to_owned())
}

fn serve_client(views: &Views, stream: UnixStream) {
    let root = rustix::net::sockopt::socket_peercred(&stream).is_ok_and(|c| c.uid.is_root());
    let Ok(mut out) = stream.try_clone() else { return };
    if !root {
        let _ = writeln!(
            out,
            "{}",
            reply_line(&ControlReply::refused("permission denied: the control socket serves root only"))
        );
        return;
    }
    let mut lines = BufReader::new(stream);
    loop {
        // A request is one line of at most REQUEST_MAX bytes; a longer one ends the client.
        let mut line = String::new();
        match (&mut lines).take(REQUEST_MAX as u64 + 1).read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(n) if n > REQUEST_MAX || !line.ends_with('\n') => {
                let _ = writeln!(
                    out,
                    "{}",
                    reply_line(&ControlReply::refused(format!(
                        "invalid request: longer than {REQUEST_MAX} bytes"
                    )))
                );
                return;
            }
            Ok(_) => {}
        }
        let reply = match ControlRequest::parse(line.trim_end().as_bytes()) {
            Ok(req) => views.handle(req),
            Err(e) => ControlReply::refused(e),
        };
        if writeln!(out, "{}", reply_line(&reply)).is_err() {
            return;
        }
    }
}

/// Removes the directory of a view under the daemon's view root `root` once it is unmounted,
/// and its agent's once empty, beneath the root's descriptor (the agent's directory is the
/// agent's: nothing there is followed); other paths are the operator's and stay.
fn remove_view_dir(dir: &Path, root: &Path) {
    let Ok(rel) = dir.strip_prefix(root) else { return };
    let (Some(agent), Some(name)) = (rel.parent().filter(|a| a.components().count() == 1), rel.file_name())
    else {
        return;
    };
    let Ok(top) = Tree::open(root) else { return };
    if let Ok(own) = top.sub(agent) {
        let _ = own.remove_dir(name);
    }
    let _ = top.remove_dir(agent);
}

/// Detaches every view mounted under `root` (a daemon's view root) whose server is gone (a daemon
/// that crashed or was killed leaves them: `ENOTCONN`), and removes its directory; returns
/// their paths. Views of a daemon still running answer and are left alone.
pub fn clean_dead_views(root: &Path) -> Vec<PathBuf> {
    // root's: /proc
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else { return Vec::new() };
    let mut dead: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|m| PathBuf::from(m.replace("\\040", " ")))
        .filter(|m| m.starts_with(root))
        .filter(|m| {
            matches!(rustix::fs::statfs(m), Err(rustix::io::Errno::NOTCONN | rustix::io::Errno::CONNABORTED))
        })
        .collect();
    dead.sort();
    dead.dedup();
    for m in &dead {
        // Not followed: the last level is in the agent's directory.
        let flags = rustix::mount::UnmountFlags::DETACH | rustix::mount::UnmountFlags::NOFOLLOW;
        if let Err(e) = rustix::mount::unmount(m, flags) {
            tracing::warn!(view = %m.display(), error = %e, "cannot detach a dead view");
            continue;
        }
        remove_view_dir(m, root);
    }
    dead
}

/// Listens on `socket` (mode 0600) and serves requests on a thread per client.
pub fn listen(socket: &Path, views: Arc<Views>) -> std::io::Result<()> {
    if let Some(dir) = socket.parent() {
        // root's: the control socket's directory, root's alone (the lines below too)
        std::fs::create_dir_all(dir)?;
    }
    // root's: as above
    match std::fs::remove_file(socket) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    // root's: as above
    let listener = UnixListener::bind(socket)?;
    // root's: as above
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))?;
    std::thread::Builder::new().name("control".into()).spawn(move || {
        for stream in listener.incoming().flatten() {
            let views = Arc::clone(&views);
            let _ = std::thread::Builder::new()
                .name("control-client".into())
                .spawn(move || serve_client(&views, stream));
        }
    })?;
    Ok(())
}

/// Watches the directories whose changes may change what views show, and reports each batch of
/// events on `tx`: `tool/`, `agent/` and their objects' `.d/` directories, and `model/` with
/// its provider directories and their `.d/` directories. Directories created later are
/// watched as they appear. Around each batch `epoch` is unsettled, so that no view trusts
/// what it read before the batch (see [`crate::view::Epoch`]).
///
/// Watched: entries created, deleted or moved, and files closed after writing (a control
/// rewritten in place counts when it is complete). Not watched: modifications and attribute
/// changes, which is what appends to an object's `log` (and their commit evidence) make on
/// every tool call.
fn watch_storage(
    storage: &Path,
    epoch: &crate::view::Epoch,
    active: Option<&crate::storage::Active>,
    tx: &std::sync::mpsc::Sender<()>,
) -> std::io::Result<()> {
    use rustix::event::{PollFd, PollFlags, poll};
    use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
    let fd = inotify::init(CreateFlags::CLOEXEC)?;
    let mask = WatchFlags::CREATE
        | WatchFlags::DELETE
        | WatchFlags::MOVED_FROM
        | WatchFlags::MOVED_TO
        | WatchFlags::CLOSE_WRITE
        | WatchFlags::MOVE_SELF
        | WatchFlags::DELETE_SELF
        | WatchFlags::ONLYDIR;
    let mut dirs: std::collections::HashMap<i32, (PathBuf, usize)> = std::collections::HashMap::new();
    // Depth below the class directory that is watched: objects' `.d/` (1) in tool/ and agent/;
    // in model/, providers (1) and their models' `.d/` (2).
    fn wanted(class_depth: usize, name: &str, model: bool) -> bool {
        if model { class_depth <= 2 } else { class_depth == 1 && name.ends_with(".d") }
    }
    // A directory that cannot be watched (the watch limit, `fs.inotify.max_user_watches`)
    // would hide its changes: then no view trusts what it read, ever. One that is gone is not
    // missed: its parent reported it.
    let add = |dirs: &mut std::collections::HashMap<i32, (PathBuf, usize)>,
               fd: &std::os::fd::OwnedFd,
               p: &Path,
               depth: usize| {
        match inotify::add_watch(fd, p, mask) {
            Ok(wd) => {
                dirs.insert(wd, (p.to_path_buf(), depth));
            }
            Err(rustix::io::Errno::NOENT | rustix::io::Errno::NOTDIR) => {}
            Err(e) => {
                epoch.blind();
                tracing::warn!(dir = %p.display(), error = %e, "cannot watch: views check their policies on every request");
            }
        }
    };
    fn scan(p: &Path, depth: usize, model: bool, out: &mut Vec<(PathBuf, usize)>) {
        out.push((p.to_path_buf(), depth));
        // root's: the storage's objects (agents write them only through views)
        let Ok(rd) = std::fs::read_dir(p) else { return };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            // root's: as above
            if e.file_type().is_ok_and(|t| t.is_dir()) && wanted(depth + 1, &name, model) {
                scan(&e.path(), depth + 1, model, out);
            }
        }
    }
    let everything = || {
        let mut all = Vec::new();
        for class in ["tool", "agent", "model"] {
            scan(&storage.join(class), 0, class == "model", &mut all);
        }
        all
    };
    for (p, d) in &everything() {
        add(&mut dirs, &fd, p, *d);
    }
    // A commit activates a generation by replacing the `active` link: every view then serves
    // it, its kernel's entries dropped once.
    // Without that watch the storage's own changes are still watched; activations are then
    // seen only when the queue overflows or the daemon restarts, and it says so.
    let generations = match active {
        Some(_) => match inotify::add_watch(
            &fd,
            ringfs::config::generations_dir(storage),
            WatchFlags::MOVED_TO | WatchFlags::CREATE | WatchFlags::ONLYDIR,
        ) {
            Ok(wd) => Some(wd),
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch the configuration generations: commits are not seen until a restart");
                None
            }
        },
        None => None,
    };
    // An activation made before the watch existed (the first commit of a storage taken in at
    // this start, beside the serving) is seen now.
    if generations.is_some() && active.is_some_and(|a| a.reload()) {
        let _ = tx.send(());
    }
    let Some(fd) = epoch.watching(fd) else { return Ok(()) };
    let model_root = storage.join("model");
    let mut buf = vec![std::mem::MaybeUninit::<u8>::uninit(); 64 * 1024];
    loop {
        // Wait for events without taking them: until they are taken in, they keep every view
        // from trusting what it read (the queue is not empty).
        let mut pfd = [PollFd::new(fd, PollFlags::IN)];
        match poll(&mut pfd, None) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
        epoch.unsettled();
        let mut reader = inotify::Reader::new(fd, &mut buf);
        let mut new_dirs = Vec::new();
        let mut relevant = false;
        let mut activated = false;
        loop {
            let ev = match reader.next() {
                Ok(ev) => ev,
                Err(rustix::io::Errno::INTR) => continue,
                Err(rustix::io::Errno::WOULDBLOCK) => break,
                Err(e) => return Err(e.into()),
            };
            // Appends to an object's log (and the commit evidence they set, an attribute change)
            // and staging residue change nothing a view shows: the real name's arrival does.
            let name = ev.file_name().map(|n| n.to_bytes()).unwrap_or_default();
            if Some(ev.wd()) == generations {
                if name == ringfs::config::ACTIVE.as_bytes() && active.is_some_and(|a| a.reload()) {
                    relevant = true;
                    activated = true;
                }
                if reader.is_buffer_empty() {
                    break;
                }
                continue;
            }
            if name == b"log" || name.ends_with(b".torn") || name.first() == Some(&b'.') {
                if reader.is_buffer_empty() {
                    break;
                }
                continue;
            }
            // In an object's `.d/`, what views show follows only these (runtime controls such
            // as `status` and `pid`, written at every agent start, change nothing they show).
            let in_controls =
                dirs.get(&ev.wd()).is_some_and(|(d, _)| d.extension().is_some_and(|e| e == "d"));
            if !in_controls
                || matches!(name, b"policy" | b"label" | b"uid" | b"")
                || ev.events().intersects(ReadFlags::IGNORED | ReadFlags::QUEUE_OVERFLOW)
            {
                relevant = true;
            }
            let made = ev.events().intersects(ReadFlags::CREATE | ReadFlags::MOVED_TO);
            if made
                && ev.events().contains(ReadFlags::ISDIR)
                && let (Some(name), Some((dir, depth))) = (ev.file_name(), dirs.get(&ev.wd()))
            {
                let name = name.to_string_lossy().into_owned();
                if wanted(depth + 1, &name, dir.starts_with(&model_root)) {
                    new_dirs.push((dir.join(&name), depth + 1));
                }
            }
            if ev.events().contains(ReadFlags::IGNORED) {
                dirs.remove(&ev.wd());
            }
            if ev.events().intersects(ReadFlags::MOVE_SELF | ReadFlags::DELETE_SELF)
                && dirs.get(&ev.wd()).is_some_and(|(_, depth)| *depth == 0)
            {
                // A class directory itself moved or removed: its replacement is not watched.
                epoch.blind();
                tracing::warn!(
                    "a class directory of the storage was moved or removed: views check their policies on every request"
                );
            }
            if ev.events().contains(ReadFlags::QUEUE_OVERFLOW) {
                // Events were lost, directories created meanwhile among them, and perhaps an
                // activation: look again.
                new_dirs.extend(everything());
                if active.is_some_and(|a| a.reload()) {
                    relevant = true;
                }
            }
            if reader.is_buffer_empty() {
                break;
            }
        }
        for (p, d) in new_dirs {
            add(&mut dirs, fd, &p, d);
        }
        epoch.settled();
        if relevant && tx.send(()).is_err() {
            return Ok(());
        }
        // The generations before the last few go now, here, rather than in a later commit.
        if activated {
            ringfs::config::prune_kept(storage);
        }
    }
}
