//! The control socket: a root-only Unix socket of the `ctx mount` daemon through which
//! `ctx view` creates, lists and removes agent views.
//!
//! Protocol: one JSON object per line each way.
//! - `{"op":"create","agent":A,"session":S,"path":P?}` -> `{"ok":true,"path":P}`; the view is a
//!   new FUSE mount at P (default `/run/cortexfs/view/A/S`) carrying A's authority.
//! - `{"op":"ls"}` -> `{"ok":true,"views":[{"agent":A,"session":S,"path":P}...]}`
//! - `{"op":"rm","path":P}` -> `{"ok":true}`
//! - failures: `{"ok":false,"error":MESSAGE}`
//!
//! Only peers with uid 0 (checked with `SO_PEERCRED`, not claimed) are served.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use crate::transport::pool::{Attached, Pool};
use crate::{Config, CtxFs, ViewSpec};

/// The default control socket.
pub const DEFAULT_SOCKET: &str = "/run/cortexfs/control.sock";
/// Where views are mounted by default.
pub const DEFAULT_VIEW_ROOT: &str = "/run/cortexfs/view";

struct View {
    spec: ViewSpec,
    mount: Attached,
}

/// The views a daemon serves, all from one thread pool.
pub struct Views {
    base: Config,
    pool: Arc<Pool>,
    views: Mutex<Vec<View>>,
}

impl std::fmt::Debug for Views {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Views").field("count", &self.count()).finish()
    }
}

impl Views {
    /// Views of the storage and binaries in `base`, served by `pool`.
    pub fn new(base: Config, pool: Arc<Pool>) -> Views {
        Views { base, pool, views: Mutex::new(Vec::new()) }
    }

    /// Number of live views.
    pub fn count(&self) -> usize {
        self.views.lock().map_or(0, |v| v.len())
    }

    fn create(&self, agent: &str, session: &str, path: Option<&str>) -> Result<PathBuf, String> {
        policy::name::validate(agent).map_err(|e| format!("invalid agent name {agent:?}: {e}"))?;
        policy::name::validate(session).map_err(|e| format!("invalid session name {session:?}: {e}"))?;
        let path = match path {
            Some(p) => {
                policy::path::check_absolute(p).map_err(|e| format!("view path: {e}"))?;
                PathBuf::from(p)
            }
            None => Path::new(DEFAULT_VIEW_ROOT).join(agent).join(session),
        };
        let mut views = self.views.lock().map_err(|_| "view table poisoned".to_owned())?;
        if views.iter().any(|v| v.mount.mountpoint() == path) {
            return Err(format!("{} already serves a view", path.display()));
        }
        if path.starts_with(DEFAULT_VIEW_ROOT) {
            // Views are reached by binding them into sandboxes: the root may be passed through
            // but not listed, and each agent's directory is its own (0700, the agent's uid), so
            // only that agent's sandbox (and root) can reach its views.
            std::fs::create_dir_all(DEFAULT_VIEW_ROOT).map_err(|e| format!("{DEFAULT_VIEW_ROOT}: {e}"))?;
            std::fs::set_permissions(DEFAULT_VIEW_ROOT, std::fs::Permissions::from_mode(0o711))
                .map_err(|e| format!("{DEFAULT_VIEW_ROOT}: {e}"))?;
            let own = Path::new(DEFAULT_VIEW_ROOT).join(agent);
            std::fs::create_dir_all(&own).map_err(|e| format!("{}: {e}", own.display()))?;
            std::fs::set_permissions(&own, std::fs::Permissions::from_mode(0o700))
                .map_err(|e| format!("{}: {e}", own.display()))?;
            let uid_file = self.base.storage.join("agent").join(format!("{agent}.d")).join("uid");
            if let Some(uid) =
                std::fs::read_to_string(uid_file).ok().and_then(|t| t.trim().parse::<u32>().ok())
            {
                rustix::fs::chown(&own, Some(rustix::fs::Uid::from_raw(uid)), None)
                    .map_err(|e| format!("{}: {e}", own.display()))?;
            }
        }
        std::fs::create_dir_all(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let spec = ViewSpec { agent: agent.to_owned(), session: session.to_owned() };
        let fs = CtxFs::new(Config { view: Some(spec.clone()), ..self.base.clone() })
            .map_err(|e| format!("opening storage: {e}"))?;
        let mount =
            self.pool.mount(Arc::new(fs), &path).map_err(|e| format!("mounting {}: {e}", path.display()))?;
        tracing::info!(agent, session, path = %path.display(), "view created");
        views.push(View { spec, mount });
        self.base.view_count.store(views.len() as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(path)
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
        tracing::info!(path, "view removed");
        Ok(())
    }

    fn list(&self) -> Value {
        let views = self.views.lock().map(|v| {
            v.iter()
                .map(|v| json!({"agent": v.spec.agent, "session": v.spec.session, "path": v.mount.mountpoint()}))
                .collect::<Vec<_>>()
        });
        json!({"ok": true, "views": views.unwrap_or_default()})
    }

    /// Unmounts every view.
    pub fn shutdown(&self) {
        if let Ok(mut views) = self.views.lock() {
            for v in views.drain(..) {
                let _ = self.pool.unmount(v.mount);
            }
        }
    }

    fn handle(&self, req: &Value) -> Value {
        let s = |k: &str| req.get(k).and_then(Value::as_str);
        let r = match s("op") {
            Some("create") => match (s("agent"), s("session")) {
                (Some(a), Some(se)) => self.create(a, se, s("path")).map(|p| json!({"ok": true, "path": p})),
                _ => Err("create needs agent and session".to_owned()),
            },
            Some("rm") => match s("path") {
                Some(p) => self.remove(p).map(|()| json!({"ok": true})),
                None => Err("rm needs path".to_owned()),
            },
            Some("ls") => Ok(self.list()),
            _ => Err("unknown op (create, rm, ls)".to_owned()),
        };
        r.unwrap_or_else(|e| json!({"ok": false, "error": e}))
    }
}

fn serve_client(views: &Views, stream: UnixStream) {
    let root = rustix::net::sockopt::socket_peercred(&stream).is_ok_and(|c| c.uid.is_root());
    let Ok(mut out) = stream.try_clone() else { return };
    if !root {
        let _ = writeln!(
            out,
            "{}",
            json!({"ok": false, "error": "permission denied: the control socket serves root only"})
        );
        return;
    }
    for line in BufReader::new(stream).lines() {
        let Ok(line) = line else { return };
        let reply = match serde_json::from_str::<Value>(&line) {
            Ok(req) => views.handle(&req),
            Err(e) => json!({"ok": false, "error": format!("invalid request: {e}")}),
        };
        if writeln!(out, "{reply}").is_err() {
            return;
        }
    }
}

/// Listens on `socket` (mode 0600) and serves requests on a thread per client.
pub fn listen(socket: &Path, views: Arc<Views>) -> std::io::Result<()> {
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::remove_file(socket) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = UnixListener::bind(socket)?;
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

/// Sends one request to the control socket and returns the reply.
pub fn request(socket: &Path, req: &Value) -> std::io::Result<Value> {
    let mut s = UnixStream::connect(socket)?;
    writeln!(s, "{req}")?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line)?;
    serde_json::from_str(&line).map_err(std::io::Error::other)
}
