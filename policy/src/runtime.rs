//! The runtime ABI: where a host keeps what runs, where sessions live, and the messages of the
//! daemon's control socket. Every crate that names one of these takes it from here.
//!
//! Each daemon keeps its runtime state in the directory of its control socket (its *runtime
//! directory*; `/run/cortexfs` for the default daemon), so two daemons on one host, each with
//! its storage, never share a run, a view or an agent socket:
//!
//! ```text
//! /run/cortexfs/control.sock              the daemon's control socket (root only)
//! /run/cortexfs/view/<agent>/<session>/    an agent session's view (a FUSE mount)
//! /run/cortexfs/agent/<agent>/<session>/   a run's state: pid, exit, log, term/, receipt/
//! /run/cortexfs/agent/<agent>.sock         the agent socket (beside its /ctx entry)
//! /run/cortexfs/terminal/main.sock         the terminal socket, as seen inside a sandbox
//! /run/cortexfs/receipt/main.sock          the receipt socket, as seen inside a sandbox
//! home/<uid>/agent/<agent>/session/<s>/    a session, under /ctx or the storage
//! ```

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The root of a host's runtime state.
pub const RUN_ROOT: &str = "/run/cortexfs";
/// The daemon's control socket.
pub const CONTROL_SOCKET: &str = "/run/cortexfs/control.sock";
/// The directory of the terminal socket inside a sandbox.
pub const SANDBOX_TERMINAL: &str = "/run/cortexfs/terminal";
/// The terminal socket inside a sandbox.
pub const SANDBOX_TERMINAL_SOCKET: &str = "/run/cortexfs/terminal/main.sock";
/// Where a sandbox sees its view.
pub const SANDBOX_CTX: &str = "/ctx";
/// The file of a session that keeps its terminal's last output (`<file>.1` its previous half).
pub const TERMINAL_LOG: &str = "terminal.log";
/// The directory of the receipt socket inside a sandbox.
pub const SANDBOX_RECEIPT: &str = "/run/cortexfs/receipt";
/// The receipt socket inside a sandbox.
pub const SANDBOX_RECEIPT_SOCKET: &str = "/run/cortexfs/receipt/main.sock";
/// Most bytes of one control-socket request line.
pub const CONTROL_REQUEST_MAX: usize = 64 * 1024;

/// A session's directory under `root` (`/ctx`, a view, or the storage).
pub fn session_dir(root: &Path, uid: u32, agent: &str, session: &str) -> PathBuf {
    root.join(session_path(uid, agent, session))
}

/// A session's path relative to the root: `home/<uid>/agent/<agent>/session/<session>`.
pub fn session_path(uid: u32, agent: &str, session: &str) -> String {
    format!("home/{uid}/{}", session_in_home(agent, session))
}

/// A shared session's path relative to the root:
/// `shared/<space>/agent/<agent>/session/<session>`.
pub fn shared_session_path(space: &str, agent: &str, session: &str) -> String {
    format!("shared/{space}/{}", session_in_home(agent, session))
}

/// A session's path relative to its uid's home: `agent/<agent>/session/<session>`.
pub fn session_in_home(agent: &str, session: &str) -> String {
    format!("agent/{agent}/session/{session}")
}

/// An agent's persistent home (its `HOME` in runs with a command of their own):
/// `home/<uid>/agent/<agent>/home`.
pub fn agent_home(root: &Path, uid: u32, agent: &str) -> PathBuf {
    root.join(format!("home/{uid}/agent/{agent}/home"))
}

/// The runtime directory of the daemon whose control socket is `control`: the socket's
/// directory.
pub fn daemon_dir(control: &Path) -> &Path {
    control.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new(RUN_ROOT))
}

/// Where the daemon of `control` mounts views by default.
pub fn views_root(control: &Path) -> PathBuf {
    daemon_dir(control).join("view")
}

/// Where the daemon of `control` keeps its runs' state (and its agent sockets).
pub fn runs_root(control: &Path) -> PathBuf {
    daemon_dir(control).join("agent")
}

/// The default view of an agent session of the daemon of `control`.
pub fn view_dir(control: &Path, agent: &str, session: &str) -> PathBuf {
    views_root(control).join(agent).join(session)
}

/// A run's state directory, for the daemon of `control`.
pub fn run_dir(control: &Path, agent: &str, session: &str) -> PathBuf {
    runs_root(control).join(agent).join(session)
}

/// A request to the daemon's control socket, one JSON line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase", deny_unknown_fields)]
pub enum ControlRequest {
    /// A new view of `agent`'s authority for `session`, mounted at `path` (default
    /// [`view_dir`]); `session_of` names the agent whose session it runs on when it is not
    /// its own; `workspace` is where the run's workspace appears inside the sandbox.
    Create {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
        /// Where to mount the view.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        path: Option<String>,
        /// The agent whose session the run resumes.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        session_of: Option<String>,
        /// The workspace's path inside the sandbox.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        workspace: Option<String>,
        /// A view that is read-only but for the run's records: appends to session and object
        /// logs, and the run's own session directory (the command-less tsh path).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        records_only: bool,
        /// The shared space the run's session is in
        /// (`shared/<space>/agent/<agent>/session/<s>/`), when it is not in a home.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        space: Option<String>,
    },
    /// The views being served.
    Ls {},
    /// Unmount and forget the view at `path`.
    Rm {
        /// The view's mount point.
        path: String,
    },
}

impl ControlRequest {
    /// Parses one request line; the error says what is wrong with it.
    pub fn parse(line: &[u8]) -> Result<ControlRequest, String> {
        if line.len() > CONTROL_REQUEST_MAX {
            return Err(format!("invalid request: longer than {CONTROL_REQUEST_MAX} bytes"));
        }
        serde_json::from_slice(line).map_err(|e| format!("invalid request: {e}"))
    }
}

/// A view as `ls` lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ViewEntry {
    /// The agent.
    pub agent: String,
    /// The session.
    pub session: String,
    /// The mount point.
    pub path: String,
}

/// The control socket's reply, one JSON line: `{"ok":true,...}` or `{"ok":false,"error":..}`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControlReply {
    /// Whether the request was done.
    pub ok: bool,
    /// Why not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The mount point of a created view.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The views, for `ls`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub views: Option<Vec<ViewEntry>>,
}

impl ControlReply {
    /// A refusal.
    pub fn refused(error: impl Into<String>) -> ControlReply {
        ControlReply { ok: false, error: Some(error.into()), ..ControlReply::default() }
    }

    /// Whether a refusal is a permission refusal (the daemon says `permission denied: ...`).
    pub fn denied(&self) -> bool {
        self.error.as_deref().is_some_and(|e| e.starts_with("permission denied"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_requests_are_checked_whole() {
        let r = ControlRequest::parse(br#"{"op":"create","agent":"a","session":"s"}"#);
        assert_eq!(
            r,
            Ok(ControlRequest::Create {
                agent: "a".into(),
                session: "s".into(),
                path: None,
                session_of: None,
                workspace: None,
                records_only: false,
                space: None,
            })
        );
        assert_eq!(ControlRequest::parse(br#"{"op":"ls"}"#), Ok(ControlRequest::Ls {}));
        for bad in [
            &br#"{"op":"create","agent":"a"}"#[..],
            br#"{"op":"rm"}"#,
            br#"{"op":"ls","x":1}"#,
            br#"{"op":"format"}"#,
            b"[]",
        ] {
            assert!(ControlRequest::parse(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        assert!(ControlRequest::parse(&vec![b' '; CONTROL_REQUEST_MAX + 1]).is_err());
    }

    #[test]
    fn a_session_lives_under_its_uids_home() {
        assert_eq!(session_path(1000, "coder", "main"), "home/1000/agent/coder/session/main");
        assert_eq!(session_dir(Path::new("/ctx"), 7, "a", "s"), Path::new("/ctx/home/7/agent/a/session/s"));
        let default = Path::new(CONTROL_SOCKET);
        assert_eq!(run_dir(default, "a", "s"), Path::new("/run/cortexfs/agent/a/s"));
        assert_eq!(view_dir(default, "a", "s"), Path::new("/run/cortexfs/view/a/s"));
        // Another daemon's runs and views are its own.
        let other = Path::new("/run/cortexfs-b/control.sock");
        assert_eq!(run_dir(other, "a", "s"), Path::new("/run/cortexfs-b/agent/a/s"));
        assert_eq!(view_dir(other, "a", "s"), Path::new("/run/cortexfs-b/view/a/s"));
    }
}
