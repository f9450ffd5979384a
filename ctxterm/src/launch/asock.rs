//! The agent socket (`agent/<name>.sock`, [`policy::asock`]): how programs drive an agent.
//!
//! The daemon serves one listening socket per agent object in its storage, at
//! `<runtime>/agent/<name>.sock` beside its control socket, and keeps the object's
//! `agent/<name>.sock` in the storage a symlink to it, so `/ctx/agent/<name>.sock` reaches it
//! (spec §11a: "may be a symlink to a runtime path"). A client writes JSONL requests and
//! reads frames back; the first frame names the protocol's version.
//!
//! Who may connect: root; the agent's owner (the uid in `agent/<name>.d/owner`); and a uid
//! that is another agent's whose policy allows `agent:<name> write`. Everyone else is refused
//! with `EACCES` before any request is read (the peer's credentials, `SO_PEERCRED`).
//!
//! A `send` is a user turn, rendered through the agent's `prompt.template.md`. It is appended to the session's `messages.jsonl` (durable) before
//! the `start` frame, then runs as `ctx agent start NAME --headless` with the input on the
//! command's standard input: the agent's `profile` control names the hosted CLI (`codex`,
//! `claude`, `pi`), which runs its own headless mode and resumes its own conversation of the
//! session, or the absolute path (in the sandbox) of a runtime of the agent's own; with none,
//! or `tsh`, the turn is lines of tool calls run by tsh. The command's output
//! comes back as `delta` frames (standard output) and `progress` frames (standard error); when
//! it ends, its output is appended as the assistant message, `latest.md` is rewritten, and
//! `message` and `done` frames follow. A turn is run once per client `id`: sending the id
//! again follows the run, or replays its recorded answer; a turn whose user message was
//! recorded but whose answer was not (everything killed mid-turn) is run again and answered
//! once.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};

use policy::asock::{self, Refusal, Request, Scope};
use policy::runtime;
use policy::v0::{Class, Permission, Policy, Query};
use serde_json::{Value, json};

use super::session;

/// Most bytes of a turn's output kept for its answer (the rest still streams).
const ANSWER_MAX: usize = 4 << 20;
/// Most bytes of a turn's output kept to stream to its followers.
const OUTPUT_KEPT: usize = 16 << 20;
/// Most finished runs kept in memory (older ones answer from their records).
const FINISHED_KEPT: usize = 256;
/// Most bytes of frames the finished runs kept in memory hold, over all agents: past it the
/// oldest are forgotten (they answer from their records).
const FINISHED_BYTES: usize = 64 << 20;
/// A recorded answer whose line would pass this many bytes (the session line limit, and a
/// frame's) is kept whole in a file beside the session; the line carries its first
/// [`ANSWER_PREVIEW`] bytes and the file's name.
const ANSWER_LINE: usize = asock::FRAME_MAX - 4096;
/// The first bytes of an answer kept in a file that its line and its frame carry.
const ANSWER_PREVIEW: usize = 64 << 10;
/// Most connections served at once, over all agents.
const CONNECTIONS_MAX: usize = 256;
/// Most connections of one uid other than root served at once: no caller holds every slot.
pub const CONNECTIONS_PER_UID: usize = 32;
/// Most turns of one agent running at once (each is a sandbox with the agent's ceilings).
pub const RUNNING_PER_AGENT: usize = 16;
/// A connection that sends nothing for this long is closed (a run it started goes on).
const IDLE: std::time::Duration = std::time::Duration::from_secs(600);
/// A follower that takes in nothing of a run's frames for this long is closed.
const STALLED: std::time::Duration = std::time::Duration::from_secs(60);
/// The file in a session that names the hosted CLI's own conversation of it.
pub const CLI_SESSION: &str = "cli_session";

/// Where the daemon whose control socket is `control` keeps agent sockets.
pub fn socket_dir(control: &Path) -> PathBuf {
    control.parent().unwrap_or(Path::new(runtime::RUN_ROOT)).join("agent")
}

/// A run started through a socket, and its frames so far.
struct Turn {
    agent: String,
    session: String,
    state: Mutex<TurnState>,
    changed: Condvar,
}

struct TurnState {
    frames: Vec<Value>,
    /// Bytes of the `delta` and `progress` frames kept.
    kept: usize,
    done: bool,
    cancelled: bool,
    child: Option<u32>,
    /// Whether the turn joined a running terminal's run: then a cancel ends the turn's
    /// command alone, never the run (set before the turn starts, kept to its end).
    in_run: bool,
    /// The connection to that terminal's `ctxterm`, once made: cancelling closes it, which
    /// ends the turn's command.
    joined: Option<UnixStream>,
}

impl Turn {
    /// A turn of `agent` in `session`, with no frame yet.
    fn new(agent: &str, session: &str) -> Turn {
        Turn {
            agent: agent.to_owned(),
            session: session.to_owned(),
            state: Mutex::new(TurnState {
                frames: Vec::new(),
                kept: 0,
                done: false,
                cancelled: false,
                child: None,
                in_run: false,
                joined: None,
            }),
            changed: Condvar::new(),
        }
    }

    /// Keeps a frame for the turn's followers. Output beyond [`OUTPUT_KEPT`] is not kept (the
    /// answer is still recorded whole, up to [`ANSWER_MAX`]): one frame says so.
    fn push(&self, frame: Value) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if matches!(frame["type"].as_str(), Some("delta" | "progress")) {
            let n = frame["text"].as_str().map_or(0, str::len);
            if s.kept + n > OUTPUT_KEPT {
                if s.kept <= OUTPUT_KEPT {
                    s.kept = OUTPUT_KEPT + 1;
                    let id = frame["id"].clone();
                    s.frames.push(json!({"type": "progress", "id": id,
                        "text": format!("[cortexfs: output past {OUTPUT_KEPT} bytes is not streamed]\n")}));
                    self.changed.notify_all();
                }
                return;
            }
            s.kept += n;
        }
        s.frames.push(frame);
        self.changed.notify_all();
    }

    fn finish(&self, frame: Value) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.frames.push(frame);
        s.done = true;
        self.changed.notify_all();
    }

    /// Bytes of text its frames hold.
    fn bytes(&self) -> usize {
        let s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.frames
            .iter()
            .map(|f| {
                64 + ["text", "content", "message"]
                    .iter()
                    .map(|k| f[k].as_str().map_or(0, str::len))
                    .sum::<usize>()
            })
            .sum()
    }

    /// Writes every frame of the turn to `out` as it comes, until its `done`; false when the
    /// client went away (the turn goes on).
    fn follow(&self, out: &mut impl Write) -> bool {
        let mut next = 0;
        loop {
            let (frames, done) = {
                let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
                while s.frames.len() == next && !s.done {
                    s = self.changed.wait(s).unwrap_or_else(|e| e.into_inner());
                }
                (s.frames[next..].to_vec(), s.done)
            };
            next += frames.len();
            for f in frames {
                if frame(out, &f).is_err() {
                    return false;
                }
            }
            if done && next == self.state.lock().unwrap_or_else(|e| e.into_inner()).frames.len() {
                return true;
            }
        }
    }
}

/// The agent sockets of one daemon.
struct Server {
    ctx: PathBuf,
    storage: PathBuf,
    control: PathBuf,
    dir: PathBuf,
    ctx_bin: PathBuf,
    /// Runs by (agent, id).
    turns: Mutex<HashMap<(String, String), Arc<Turn>>>,
    /// The finished runs kept, oldest first.
    finished: Mutex<Finished>,
    /// The run of each (agent, session) that is running.
    busy: Mutex<HashMap<(String, String), String>>,
    /// Connections served now: in all, and per uid other than root.
    connections: Mutex<(usize, HashMap<u32, usize>)>,
}

/// Serves the agent sockets of the storage `storage`, mounted at `ctx`, for the daemon whose
/// control socket is `control`, on a thread of its own.
pub fn spawn(ctx: &Path, storage: &Path, control: &Path) -> std::io::Result<()> {
    let dir = socket_dir(control);
    // root's: the daemon's runtime directory
    std::fs::create_dir_all(&dir)?;
    // Passed through, not listed (the default is the directory of runs, whose names are
    // nobody else's business): connecting needs only the search bit.
    // root's: the daemon's runtime directory
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711))?;
    let server = Arc::new(Server {
        ctx: ctx.to_path_buf(),
        storage: storage.to_path_buf(),
        control: control.to_path_buf(),
        dir,
        ctx_bin: std::env::current_exe()?,
        turns: Mutex::new(HashMap::new()),
        finished: Mutex::new(Finished::default()),
        busy: Mutex::new(HashMap::new()),
        connections: Mutex::new((0, HashMap::new())),
    });
    clear_stale_pins(&server.dir);
    // The agents there now have their sockets before this returns (and so before the daemon
    // says it is up); later ones within a second.
    let mut listeners = HashMap::new();
    server.rescan(&mut listeners);
    std::thread::Builder::new().name("agent-sockets".into()).spawn(move || server.listen(listeners))?;
    Ok(())
}

/// Removes the agent sockets of the daemon whose control socket is `control`, and the
/// storage's `agent/<name>.sock` symlinks that lead to them (the daemon is stopping).
pub fn remove_all(storage: &Path, control: &Path) {
    let dir = socket_dir(control);
    for name in agents(storage) {
        let socket = dir.join(format!("{name}.sock"));
        let link = storage.join("agent").join(format!("{name}.sock"));
        // root's: the storage's agent directory
        if std::fs::read_link(&link).ok().as_deref() == Some(socket.as_path()) {
            // root's: the storage's agent directory
            let _ = std::fs::remove_file(&link);
        }
        // root's: the daemon's runtime directory
        let _ = std::fs::remove_file(&socket);
    }
}

/// The agent objects in `storage`: names with an executable and a control directory.
fn agents(storage: &Path) -> Vec<String> {
    // root's: the storage's agent directory
    let Ok(rd) = std::fs::read_dir(storage.join("agent")) else { return Vec::new() };
    let mut v: Vec<String> = rd
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file())) // root's: a type, no path
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| policy::name::validate(n).is_ok())
        .filter(|n| storage.join("agent").join(format!("{n}.d")).is_dir()) // root's: the storage's agent directory
        .collect();
    v.sort();
    v
}

impl Server {
    fn socket(&self, agent: &str) -> PathBuf {
        self.dir.join(format!("{agent}.sock"))
    }

    /// Keeps a listener per agent object, and the object's `.sock` symlink to it; accepts.
    /// Binds the sockets of agents that appeared, drops those of agents that went.
    fn rescan(&self, listeners: &mut HashMap<String, UnixListener>) {
        // Sockets for the agents in force: one made and not committed has none yet. When the
        // configuration cannot be read, the sockets there stay.
        let Some(root) = self.config() else { return };
        let now = agents(&root);
        listeners.retain(|name, _| {
            let keep = now.contains(name);
            if !keep {
                // root's: the daemon's runtime directory
                let _ = std::fs::remove_file(self.socket(name));
                // root's: the storage's agent directory
                let _ = std::fs::remove_file(self.storage.join("agent").join(format!("{name}.sock")));
            }
            keep
        });
        for name in now {
            if listeners.contains_key(&name) {
                continue;
            }
            match self.bind(&name) {
                Ok(l) => {
                    listeners.insert(name, l);
                }
                Err(e) => tracing::warn!("agent socket of {name}: {e}"),
            }
        }
    }

    fn listen(self: Arc<Self>, mut listeners: HashMap<String, UnixListener>) {
        loop {
            self.rescan(&mut listeners);
            let names: Vec<&String> = listeners.keys().collect();
            let mut fds: Vec<rustix::event::PollFd<'_>> = names
                .iter()
                .map(|n| rustix::event::PollFd::new(&listeners[*n], rustix::event::PollFlags::IN))
                .collect();
            let timeout = rustix::event::Timespec { tv_sec: 1, tv_nsec: 0 };
            if rustix::event::poll(&mut fds, Some(&timeout)).is_err() {
                continue;
            }
            let ready: Vec<String> = fds
                .iter()
                .zip(&names)
                .filter(|(f, _)| !f.revents().is_empty())
                .map(|(_, n)| (*n).clone())
                .collect();
            drop(fds);
            for name in ready {
                let Ok((stream, _)) = listeners[&name].accept() else { continue };
                let Ok(uid) = rustix::net::sockopt::socket_peercred(&stream).map(|c| c.uid.as_raw()) else {
                    continue;
                };
                let _ = stream.set_nonblocking(false);
                let _ = stream.set_read_timeout(Some(IDLE));
                let _ = stream.set_write_timeout(Some(STALLED));
                if let Err(r) = self.admit(uid) {
                    let _ = frame(&mut &stream, &asock::error(None, &r));
                    continue;
                }
                let me = Arc::clone(&self);
                let spawned = std::thread::Builder::new().name(format!("asock-{name}")).spawn(move || {
                    me.serve(&name, uid, stream);
                    me.leave(uid);
                });
                if spawned.is_err() {
                    self.leave(uid);
                }
            }
        }
    }

    /// Counts a connection of `uid` in, or refuses it when the slots are taken.
    fn admit(&self, uid: u32) -> Result<(), Refusal> {
        let mut c = self.connections.lock().unwrap_or_else(|e| e.into_inner());
        if c.0 >= CONNECTIONS_MAX {
            return Err(Refusal {
                code: "EAGAIN",
                message: format!("{CONNECTIONS_MAX} connections are served already"),
            });
        }
        if uid != 0 {
            let mine = c.1.entry(uid).or_default();
            if *mine >= CONNECTIONS_PER_UID {
                return Err(Refusal {
                    code: "EAGAIN",
                    message: format!("uid {uid} has {CONNECTIONS_PER_UID} connections already"),
                });
            }
            *mine += 1;
        }
        c.0 += 1;
        Ok(())
    }

    fn leave(&self, uid: u32) {
        let mut c = self.connections.lock().unwrap_or_else(|e| e.into_inner());
        c.0 -= 1;
        if let Some(mine) = c.1.get_mut(&uid) {
            *mine -= 1;
            if *mine == 0 {
                c.1.remove(&uid);
            }
        }
    }

    fn bind(&self, name: &str) -> std::io::Result<UnixListener> {
        let path = self.socket(name);
        // root's: the daemon's runtime directory
        let _ = std::fs::remove_file(&path);
        // root's: the daemon's runtime directory
        let l = UnixListener::bind(&path)?;
        // Anyone may connect; who may drive the agent is decided by the peer's credentials.
        // root's: the daemon's runtime directory
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))?;
        let link = self.storage.join("agent").join(format!("{name}.sock"));
        // root's: the storage's agent directory
        if std::fs::read_link(&link).ok().as_deref() != Some(path.as_path()) {
            let tmp = self.storage.join("agent").join(format!(".{name}.sock.{}", std::process::id()));
            // root's: the storage's agent directory
            let _ = std::fs::remove_file(&tmp);
            // root's: the storage's agent directory
            std::os::unix::fs::symlink(&path, &tmp)?;
            // root's: the storage's agent directory
            std::fs::rename(&tmp, &link)?;
        }
        Ok(l)
    }

    /// Where the configuration in force is: the active generation once the storage's
    /// configuration is a repository (a staged edit gives an agent nothing), else the storage.
    fn config(&self) -> Option<PathBuf> {
        super::agents::in_force(&self.storage).ok()
    }

    /// An agent's control as the configuration in force has it; empty when it cannot be read.
    fn control(&self, agent: &str, name: &str) -> String {
        let Some(root) = self.config() else { return String::new() };
        let rel = Path::new("agent").join(format!("{agent}.d")).join(name);
        ringfs::config::read_config(&root, &rel, 64 * 1024)
            .map(|b| String::from_utf8_lossy(&b).trim().to_owned())
            .unwrap_or_default()
    }

    /// Whether the agent's policy has it record `what` (`turns`, `tool-args`) in full: a line
    /// `allow LABEL record:WHAT write`. Without it (or with a policy that does not parse), facts
    /// only.
    fn records_in_full(&self, agent: &str, what: &str) -> bool {
        let label = self.control(agent, "label");
        Policy::from_text(self.control(agent, "policy").as_bytes()).is_ok_and(|p| {
            p.allows(&Query {
                subject: &label,
                class: Class::Record,
                object: what,
                permission: Permission::Write,
            })
        })
    }

    /// Whether `uid` may drive `agent`: root, its owner, or an agent of that uid whose policy
    /// allows `agent:<agent> write`.
    fn may_drive(&self, agent: &str, uid: u32) -> Result<(), Refusal> {
        if uid == 0 || self.control(agent, "owner").parse::<u32>().ok() == Some(uid) {
            return Ok(());
        }
        for other in self.config().map(|root| agents(&root)).unwrap_or_default() {
            if self.control(&other, "uid").parse::<u32>().ok() != Some(uid) {
                continue;
            }
            let label = self.control(&other, "label");
            let Ok(p) = Policy::from_text(self.control(&other, "policy").as_bytes()) else { continue };
            let q =
                Query { subject: &label, class: Class::Agent, object: agent, permission: Permission::Write };
            if p.allows(&q) {
                return Ok(());
            }
        }
        Err(Refusal {
            code: "EACCES",
            message: format!(
                "uid {uid} may not drive agent {agent}: it is not its owner, and no agent of that uid is \
                 allowed agent:{agent} write"
            ),
        })
    }

    fn serve(self: &Arc<Self>, agent: &str, uid: u32, stream: UnixStream) {
        let mut out = match stream.try_clone() {
            Ok(s) => s,
            Err(_) => return,
        };
        if let Err(r) = self.may_drive(agent, uid) {
            let _ = frame(&mut out, &asock::error(None, &r));
            return;
        }
        if frame(&mut out, &asock::hello(agent)).is_err() {
            return;
        }
        let mut reader = BufReader::new(stream);
        loop {
            let mut line = Vec::new();
            match (&mut reader).take(asock::FRAME_MAX as u64 + 1).read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            if line.last() != Some(&b'\n') && line.len() > asock::FRAME_MAX {
                let r = Refusal {
                    code: "EMSGSIZE",
                    message: format!("a frame is at most {} bytes", asock::FRAME_MAX),
                };
                let _ = frame(&mut out, &asock::error(None, &r));
                return;
            }
            while line.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                line.pop();
            }
            if line.is_empty() {
                continue;
            }
            let ok = match asock::parse(&line) {
                Err(r) => frame(&mut out, &asock::error(None, &r)).is_ok(),
                Ok(req) => self.request(agent, uid, req, &mut out),
            };
            if !ok {
                return;
            }
        }
    }

    fn turn(&self, agent: &str, id: &str) -> Option<Arc<Turn>> {
        self.turns.lock().unwrap_or_else(|e| e.into_inner()).get(&(agent.to_owned(), id.to_owned())).cloned()
    }

    /// Answers one request; false when the client went away.
    fn request(self: &Arc<Self>, agent: &str, uid: u32, req: Request, out: &mut UnixStream) -> bool {
        match req {
            Request::Ping => frame(out, &json!({"type": "pong"})).is_ok(),
            Request::Status { id } => {
                let turns = self.turns.lock().unwrap_or_else(|e| e.into_inner());
                let runs: Vec<Value> = turns
                    .iter()
                    .filter(|((a, i), _)| a == agent && id.as_ref().is_none_or(|id| id == i))
                    .map(|((_, i), t)| {
                        let s = t.state.lock().unwrap_or_else(|e| e.into_inner());
                        let state = if !s.done {
                            "running"
                        } else {
                            s.frames.last().and_then(|f| f["status"].as_str()).unwrap_or("done")
                        };
                        json!({"id": i, "session": t.session, "state": state})
                    })
                    .collect();
                drop(turns);
                if let Some(id) = &id
                    && runs.is_empty()
                {
                    let r = Refusal { code: "ENOENT", message: format!("no run {id} through this socket") };
                    return frame(out, &asock::error(Some(id), &r)).is_ok();
                }
                frame(out, &json!({"type": "status", "agent": agent, "runs": runs})).is_ok()
            }
            Request::Cancel { id } => {
                let Some(t) = self.turn(agent, &id) else {
                    let r = Refusal { code: "ENOENT", message: format!("no run {id} through this socket") };
                    return frame(out, &asock::error(Some(&id), &r)).is_ok();
                };
                let running = {
                    let mut s = t.state.lock().unwrap_or_else(|e| e.into_inner());
                    if !s.done {
                        s.cancelled = true;
                    }
                    !s.done
                };
                let (in_run, joined) = {
                    let s = t.state.lock().unwrap_or_else(|e| e.into_inner());
                    (s.in_run, s.joined.as_ref().and_then(|j| j.try_clone().ok()))
                };
                if in_run {
                    // A turn in a terminal's run: its command ends (now, or as soon as it is
                    // asked for: the flag is read there), the terminal runs on.
                    if let Some(j) = joined {
                        let _ = j.shutdown(std::net::Shutdown::Both);
                    }
                } else if running {
                    let _ =
                        super::stop(&self.control, &t.agent, &t.session, "a cancel through the agent socket");
                    if let Some(pid) = t.state.lock().unwrap_or_else(|e| e.into_inner()).child
                        && let Some(p) = rustix::process::Pid::from_raw(pid as i32)
                    {
                        let _ = rustix::process::kill_process_group(p, rustix::process::Signal::TERM);
                    }
                }
                frame(out, &json!({"type": "cancelling", "id": id, "running": running})).is_ok()
                    && t.follow(out)
            }
            Request::Resume { session, space, after } => {
                let Some(dir) = self.session_dir(agent, space.as_deref(), &session) else {
                    let r = Refusal { code: "ENOENT", message: format!("agent {agent} has no uid") };
                    return frame(out, &asock::error(None, &r)).is_ok();
                };
                let records = read_records(&dir);
                for (n, r) in records.iter().enumerate().skip(after as usize) {
                    if frame(out, &json!({"type": "record", "n": n + 1, "record": r})).is_err() {
                        return false;
                    }
                }
                let live = self
                    .busy
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get(&busy_key(agent, space.as_deref(), &session))
                    .cloned();
                if let Some(id) = &live
                    && let Some(t) = self.turn(agent, id)
                    && !t.follow(out)
                {
                    return false;
                }
                let n = read_records(&dir).len();
                frame(out, &json!({"type": "resumed", "session": session, "records": n, "followed": live}))
                    .is_ok()
            }
            Request::Send(s) => {
                if let Some(t) = self.turn(agent, &s.id) {
                    return t.follow(out);
                }
                match self.begin(agent, uid, s.clone()) {
                    Ok(t) => t.follow(out),
                    Err(r) => {
                        frame(out, &asock::error(Some(&s.id), &r)).is_ok()
                            && frame(out, &json!({"type": "done", "id": s.id, "status": "error"})).is_ok()
                    }
                }
            }
        }
    }

    /// Binds the directory `c` (the caller's own, unless the caller is root) at a path of the
    /// daemon's runtime directory, from a descriptor opened without following a symlink.
    fn pin(&self, c: &str, caller: u32) -> Result<PathBuf, Refusal> {
        use rustix::fs::OFlags;
        use rustix::mount::{MoveMountFlags, OpenTreeFlags};
        let refuse = |code: &'static str, message: String| Refusal { code, message };
        let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let fd = crate::beneath::open_dir(std::path::Path::new(c), flags).map_err(|e| match e {
            rustix::io::Errno::LOOP | rustix::io::Errno::XDEV => {
                refuse("EACCES", format!("cwd {c}: a path through a symlink is not given to an agent"))
            }
            rustix::io::Errno::NOTDIR => refuse("ENOTDIR", format!("cwd {c} is not a directory")),
            e => refuse("ENOENT", format!("cwd {c}: {e}")),
        })?;
        let st = rustix::fs::fstat(&fd).map_err(|e| refuse("EIO", format!("cwd {c}: {e}")))?;
        if caller != 0 && st.st_uid != caller {
            return Err(refuse("EACCES", format!("cwd {c} is not the caller's (uid {caller}) to give")));
        }
        let tree = rustix::mount::open_tree(
            &fd,
            "",
            OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC | OpenTreeFlags::AT_EMPTY_PATH,
        )
        .map_err(|e| refuse("EIO", format!("cwd {c}: open_tree: {e}")))?;
        let pins = self.dir.join(".cwd");
        let io = |e: std::io::Error| refuse("EIO", format!("{}: {e}", pins.display()));
        // root's: the daemon's runtime directory
        std::fs::create_dir_all(&pins).map_err(io)?;
        // root's: the daemon's runtime directory
        std::fs::set_permissions(&pins, std::fs::Permissions::from_mode(0o711)).map_err(io)?;
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let at = pins.join(format!("{}.{n}", std::process::id()));
        // root's: the daemon's runtime directory
        let _ = std::fs::create_dir(&at);
        rustix::mount::move_mount(&tree, "", rustix::fs::CWD, &at, MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH)
            .map_err(|e| refuse("EIO", format!("cwd {c}: move_mount: {e}")))?;
        Ok(at)
    }

    fn session_dir(&self, agent: &str, space: Option<&str>, session: &str) -> Option<PathBuf> {
        if let Some(space) = space {
            return Some(self.ctx.join(runtime::shared_session_path(space, agent, session)));
        }
        let uid: u32 = self.control(agent, "uid").parse().ok()?;
        Some(runtime::session_dir(&self.ctx, uid, agent, session))
    }

    /// Starts the turn `s` of `agent` for the caller `caller`, or replays its recorded answer.
    fn begin(self: &Arc<Self>, agent: &str, caller: u32, s: asock::Send) -> Result<Arc<Turn>, Refusal> {
        let refuse = |code: &'static str, message: String| Refusal { code, message };
        if s.scope == Scope::Temp {
            return Err(refuse("ENOTSUP", "temp sessions are not served by this release".into()));
        }
        if let Some(c) = &s.cwd {
            // Looked at without following a link anywhere on its path (a caller's tree).
            let m = crate::beneath::Tree::open(std::path::Path::new(c)).and_then(|t| t.stat("")).map_err(
                |e| {
                    if e.raw_os_error() == Some(rustix::io::Errno::NOTDIR.raw_os_error()) {
                        refuse("ENOTDIR", format!("cwd {c} is not a directory"))
                    } else {
                        refuse("ENOENT", format!("cwd {c}: {e}"))
                    }
                },
            )?;
            if caller != 0 && m.st_uid != caller {
                return Err(refuse("EACCES", format!("cwd {c} is not the caller's (uid {caller}) to give")));
            }
        }
        let uid: u32 = self
            .control(agent, "uid")
            .parse()
            .map_err(|_| refuse("EINVAL", format!("agent/{agent}.d/uid is not a number")))?;
        let gid: u32 = self.control(agent, "gid").parse().unwrap_or(uid);
        if let Some(space) = &s.space {
            // Checked before anything is recorded there: the policy, the space, the mode bits.
            let groups: Vec<u32> = self
                .control(agent, "groups")
                .split_ascii_whitespace()
                .filter_map(|g| g.parse().ok())
                .collect();
            let label = self.control(agent, "label");
            let policy = Policy::from_text(self.control(agent, "policy").as_bytes())
                .map_err(|_| refuse("EINVAL", format!("agent/{agent}.d/policy does not parse")))?;
            super::contract::shared_session_allowed(
                &self.ctx,
                agent,
                space,
                (&label, &policy),
                (uid, gid, &groups),
            )
            .map_err(|e| {
                let code = match e.code() {
                    13 => "EACCES",
                    2 => "EINVAL",
                    _ => "ENOENT",
                };
                refuse(code, e.to_string())
            })?;
        }
        let key = busy_key(agent, s.space.as_deref(), &s.session);
        let (busy_key, id) = (key.clone(), s.id.clone());
        {
            let mut busy = self.busy.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(other) = busy.get(&key) {
                return Err(refuse("EBUSY", format!("session {} is running {other}", s.session)));
            }
            if busy.keys().filter(|(a, _)| a == agent).count() >= RUNNING_PER_AGENT {
                return Err(refuse(
                    "EAGAIN",
                    format!("agent {agent} runs {RUNNING_PER_AGENT} turns already"),
                ));
            }
            busy.insert(key.clone(), s.id.clone());
        }
        let t = Arc::new(Turn::new(agent, &s.session));
        self.turns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert((agent.to_owned(), s.id.clone()), Arc::clone(&t));
        let me = Arc::clone(self);
        let run = Arc::clone(&t);
        let name = (agent.to_owned(), s.id.clone());
        let spawned = std::thread::Builder::new().name(format!("turn-{agent}")).spawn(move || {
            let end = me.run(&run, uid, gid, caller, &s);
            me.busy.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
            run.finish(end);
            me.retire(name, &run);
        });
        if let Err(e) = spawned {
            self.busy.lock().unwrap_or_else(|e| e.into_inner()).remove(&busy_key);
            self.turns.lock().unwrap_or_else(|e| e.into_inner()).remove(&(agent.to_owned(), id));
            t.finish(json!({"type": "done", "status": "error"}));
            return Err(refuse("EAGAIN", format!("cannot start the turn: {e}")));
        }
        Ok(t)
    }

    /// Until the turn `t`'s `ctx agent start` has ended: once it is cancelled, stops its run
    /// (SIGTERM to the supervisor, its grace, SIGKILL) as soon as the run is up, and the
    /// launcher's group. One thread per running turn (turns are bounded per agent).
    fn cancel_when_up(&self, t: &Arc<Turn>, agent: &str, session: &str) {
        let (t, control, agent, session) =
            (Arc::clone(t), self.control.clone(), agent.to_owned(), session.to_owned());
        let _ = std::thread::Builder::new().name(format!("cancel-{agent}")).spawn(move || {
            loop {
                std::thread::sleep(std::time::Duration::from_millis(100));
                let (cancelled, child) = {
                    let st = t.state.lock().unwrap_or_else(|e| e.into_inner());
                    (st.cancelled, st.child)
                };
                let Some(pid) = child else { return };
                if cancelled {
                    let stopped =
                        super::stop(&control, &agent, &session, "a cancel through the agent socket").is_ok();
                    if let Some(p) = rustix::process::Pid::from_raw(pid as i32) {
                        let _ = rustix::process::kill_process_group(p, rustix::process::Signal::TERM);
                    }
                    if stopped {
                        return;
                    }
                }
            }
        });
    }

    /// Keeps the finished run `t` (named `name`) among the finished ones; forgets the oldest
    /// past [`FINISHED_KEPT`] runs or [`FINISHED_BYTES`] bytes, unless a newer run of the same
    /// name took its place. Their records answer for them (a send of their id replays the
    /// recorded answer).
    fn retire(&self, name: (String, String), t: &Arc<Turn>) {
        let gone = self.finished.lock().unwrap_or_else(|e| e.into_inner()).push(name, Arc::clone(t));
        let mut turns = self.turns.lock().unwrap_or_else(|e| e.into_inner());
        for (k, old) in gone {
            if turns.get(&k).is_some_and(|cur| Arc::ptr_eq(cur, &old)) {
                turns.remove(&k);
            }
        }
    }

    /// Runs the turn; returns its `done` frame.
    fn run(&self, t: &Arc<Turn>, uid: u32, gid: u32, caller: u32, s: &asock::Send) -> Value {
        let fail = |code: &str, message: String| {
            t.push(json!({"type": "error", "id": s.id, "code": code, "message": message}));
            json!({"type": "done", "id": s.id, "status": "error"})
        };
        let agent = t.agent.as_str();
        let cwd = if s.cwd.is_some() || s.here.is_some() { super::contract::WORKSPACE } else { "/" };
        let dir = match &s.space {
            Some(space) => self.ctx.join(runtime::shared_session_path(space, agent, &s.session)),
            None => runtime::session_dir(&self.ctx, uid, agent, &s.session),
        };
        let profile = self.control(agent, "profile").lines().next().unwrap_or("").trim().to_owned();
        let run_dir = runtime::run_dir(&self.control, agent, &s.session);
        // The agent's template, as it is now: an agent.update of it shows in the next turn. A
        // profile that names no runtime is refused before anything is recorded.
        let prompt = prompt_of(&self.control(agent, "prompt.template.md"), s);
        let (args, prompt_on_stdin, new_cli_session) = match cli_args(&profile, agent, &dir, &prompt) {
            Ok(a) => a,
            Err(m) => return fail("EINVAL", m),
        };
        // A run of the session going on (a terminal started with `ctx agent start`): the turn
        // joins it, or is refused saying why, before anything is recorded.
        let joined = match super::rundir::supervisor(&run_dir) {
            Some(pid) => match joinable(&run_dir, pid, s, &profile, caller) {
                Ok(j) => Some(j),
                Err(r) => return fail(r.code, r.message),
            },
            None => None,
        };
        let term = run_dir.join("term/main.sock");
        if joined.is_none()
            && let Err(e) = session::prepare(&self.ctx, &dir, uid, gid, s.space.is_some(), cwd, &term)
        {
            return fail("EIO", e.to_string());
        }
        let records = read_records(&dir);
        let mine =
            |role: &str| records.iter().find(|r| r["id"] == s.id.as_str() && r["role"] == role).cloned();
        if let Some(answer) = mine("assistant") {
            // Answered before: the same id is the same run.
            t.push(json!({"type": "start", "id": s.id, "replayed": true}));
            let mut m =
                json!({"type": "message", "id": s.id, "role": "assistant", "content": answer["content"]});
            // The record is in the agent's session: a file it names is taken only when it is
            // a name this daemon gives (`answer.<stamp>.md`), so the path is the session's.
            if let Some(f) = answer["content_file"].as_str().filter(|f| answer_file_name(f)) {
                m["content_file"] = json!(dir.join(f));
                m["content_bytes"] =
                    json!(answer["content_bytes"].as_u64().unwrap_or(0).min(ANSWER_MAX as u64));
            }
            t.push(m);
            return json!({"type": "done", "id": s.id, "status": answer["status"].as_str().unwrap_or("ok"),
                "replayed": true});
        }
        if mine("user").is_none() {
            let mut user = json!({"ts": session::timestamp(), "role": "user", "id": s.id, "content": s.input,
                "files": s.files, "from_uid": caller});
            if !self.records_in_full(agent, "turns") {
                // Facts only: what was asked is known by its size and digest, not its text
                // (the policy line `allow LABEL record:turns write` records it in full).
                use sha2::Digest;
                let obj = user.as_object_mut().expect("a JSON object");
                obj.remove("content");
                obj.insert("bytes".into(), json!(s.input.len()));
                obj.insert("sha256".into(), json!(hex::encode(sha2::Sha256::digest(s.input.as_bytes()))));
                obj.insert("recorded".into(), json!("facts"));
            }
            if let Err(e) = append(&dir, &user) {
                return fail("EIO", format!("{}: {e}", dir.join("messages.jsonl").display()));
            }
            // The files a turn names are the session's references too (`context/refs.jsonl`);
            // the turn is recorded already, and runs whether or not they could be written.
            if let Err(e) = refs(&dir, s, caller) {
                eprintln!("ctx: {}: {e}", dir.join("context/refs.jsonl").display());
            }
        }
        let mut start = json!({"type": "start", "id": s.id, "session": s.session});
        if joined.is_some() {
            start["joined"] = json!(true);
            t.state.lock().unwrap_or_else(|e| e.into_inner()).in_run = true;
        }
        t.push(start);
        let (mut runner, stdin, stdout, stderr) = match &joined {
            Some(j) => match join_turn(&run_dir, j, &args) {
                Ok((stream, i, o, e)) => {
                    let mut st = t.state.lock().unwrap_or_else(|e| e.into_inner());
                    st.joined = stream.try_clone().ok();
                    if st.cancelled {
                        let _ = stream.shutdown(std::net::Shutdown::Both);
                    }
                    (Runner::Joined(stream), Some(i), Some(o), Some(e))
                }
                Err(r) => return fail(r.code, r.message),
            },
            None => {
                let mut cmd = Command::new(&self.ctx_bin);
                cmd.args(["agent", "start", agent, "--session", &s.session, "--headless", "--ctx"])
                    .arg(&self.ctx)
                    .arg("--control")
                    .arg(&self.control);
                // The caller's directory, pinned: opened without following a symlink, checked
                // to be the caller's on that descriptor, and bound from it where only root can
                // change what the name leads to; the run binds the pin, never the caller's
                // path again.
                let pin = match (&s.cwd, &s.here) {
                    (Some(c), _) => match self.pin(c, caller) {
                        Ok(p) => Some(Pin(p)),
                        Err(r) => return fail(r.code, r.message),
                    },
                    // The caller's own directory, as `ctx agent start` takes it: when it is
                    // not the caller's to give, the run has no workspace.
                    // The root directory is never taken as a workspace by default (a caller
                    // started from `/`, as services are).
                    (None, Some(h)) if h != "/" => self.pin(h, caller).ok().map(Pin),
                    (None, Some(_)) => None,
                    (None, None) => None,
                };
                match &pin {
                    Some(p) => cmd.arg("--cwd").arg(&p.0),
                    None => cmd.arg("--no-default-workspace"),
                };
                if let Some(space) = &s.space {
                    cmd.args(["--shared", space]);
                }
                if super::profiles::hosted(&profile) {
                    cmd.args(["--profile", &profile]);
                }
                cmd.arg("--").args(&args);
                cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
                std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
                let mut child = match cmd.spawn() {
                    Ok(c) => c,
                    Err(e) => return fail("EAGAIN", format!("ctx agent start: {e}")),
                };
                {
                    // A cancel that came before the child existed stops it now.
                    let mut st = t.state.lock().unwrap_or_else(|e| e.into_inner());
                    st.child = Some(child.id());
                    if st.cancelled
                        && let Some(p) = rustix::process::Pid::from_raw(child.id() as i32)
                    {
                        let _ = rustix::process::kill_process_group(p, rustix::process::Signal::TERM);
                    }
                }
                // A cancel that comes while the run is still being set up (its supervisor not
                // there yet to be stopped) is carried out once it is.
                self.cancel_when_up(t, agent, &s.session);
                let file = |f: Option<std::os::fd::OwnedFd>| f.map(std::fs::File::from);
                let (i, o, e) = (
                    file(child.stdin.take().map(Into::into)),
                    file(child.stdout.take().map(Into::into)),
                    file(child.stderr.take().map(Into::into)),
                );
                (Runner::Spawned(child, pin), i, o, e)
            }
        };
        if let Some(mut i) = stdin {
            let input = if prompt_on_stdin { prompt.clone() } else { String::new() };
            std::thread::spawn(move || {
                let _ = i.write_all(input.as_bytes());
            });
        }
        let err = stderr.map(|e| {
            let id = s.id.clone();
            let text = Arc::new(Mutex::new(String::new()));
            let (turn, t2) = (Arc::clone(t), Arc::clone(&text));
            let h = std::thread::spawn(move || {
                chunks(e, |c| {
                    let mut t = t2.lock().unwrap_or_else(|e| e.into_inner());
                    if t.len() < ANSWER_MAX {
                        t.push_str(c);
                    }
                    drop(t);
                    turn.push(json!({"type": "progress", "id": id, "text": c}));
                });
            });
            (h, text)
        });
        let (mut answer, mut cut) = (String::new(), false);
        if let Some(o) = stdout {
            chunks(o, |c| {
                if answer.len() < ANSWER_MAX {
                    answer.push_str(c);
                } else {
                    cut = true;
                }
                t.push(json!({"type": "delta", "id": s.id, "text": c}));
            });
        }
        let (status, why) = runner.wait();
        if let Some(why) = why {
            t.push(json!({"type": "error", "id": s.id, "code": "EAGAIN", "message": why}));
        }
        {
            // Its pid may be another process's from now on; the connection is closed (a finished
            // turn is kept for its followers, its descriptors not).
            let mut st = t.state.lock().unwrap_or_else(|e| e.into_inner());
            st.child = None;
            st.joined = None;
        }
        let mut stderr = String::new();
        if let Some((h, text)) = err {
            let _ = h.join();
            stderr = text.lock().unwrap_or_else(|e| e.into_inner()).clone();
        }
        let cancelled = t.state.lock().unwrap_or_else(|e| e.into_inner()).cancelled;
        let state = if cancelled {
            "cancelled"
        } else if status == 0 {
            "ok"
        } else {
            "error"
        };
        if status == 0
            && let Some(id) = new_cli_session.or_else(|| {
                super::profiles::find(&profile).and_then(|p| super::profiles::session_on_stderr(p, &stderr))
            })
            && session::read_file(&dir, CLI_SESSION, 128).is_err()
        {
            let _ = session::replace_file(&dir, CLI_SESSION, &format!("{id}\n"));
        }
        let content = answer.trim_end().to_owned();
        let mut record = json!({"ts": session::timestamp(), "role": "assistant", "id": s.id,
            "content": content, "status": state});
        if status != 0 {
            record["exit"] = json!(status);
        }
        if cut {
            // Recorded up to ANSWER_MAX bytes; the rest was streamed only.
            record["content_cut"] = json!(true);
        }
        let mut message = json!({"type": "message", "id": s.id, "role": "assistant", "content": content});
        if record.to_string().len() >= ANSWER_LINE {
            // Too large for one line: kept whole beside the session, the line names it.
            let name = format!("answer.{}.md", session::unique_stamp());
            if let Err(e) = session::replace_file(&dir, &name, &content) {
                return fail("EIO", format!("{}: {e}", dir.join(&name).display()));
            }
            let preview = &content[..content.floor_char_boundary(ANSWER_PREVIEW)];
            record["content"] = json!(preview);
            record["content_file"] = json!(name);
            record["content_bytes"] = json!(content.len());
            message["content"] = json!(preview);
            message["content_file"] = json!(dir.join(&name));
            message["content_bytes"] = json!(content.len());
        }
        if let Err(e) = append(&dir, &record) {
            return fail("EIO", format!("{}: {e}", dir.join("messages.jsonl").display()));
        }
        let _ = session::rebuild_latest(&dir);
        t.push(message);
        if state == "error" {
            let code = match status {
                13 => "EACCES",
                2 => "EINVAL",
                69 => "EAGAIN",
                _ => "EIO",
            };
            t.push(json!({"type": "error", "id": s.id, "code": code,
                "message": format!("the run ended with status {status}")}));
        }
        json!({"type": "done", "id": s.id, "status": state, "exit": status})
    }
}

/// The finished runs kept in memory, oldest first, and the bytes their frames hold.
#[derive(Default)]
struct Finished {
    runs: std::collections::VecDeque<((String, String), Arc<Turn>, usize)>,
    bytes: usize,
}

impl Finished {
    /// Keeps `t`; returns the runs forgotten to stay within [`FINISHED_KEPT`] runs and
    /// [`FINISHED_BYTES`] bytes.
    fn push(&mut self, name: (String, String), t: Arc<Turn>) -> Vec<((String, String), Arc<Turn>)> {
        let n = t.bytes();
        self.runs.push_back((name, t, n));
        self.bytes += n;
        let mut gone = Vec::new();
        while self.runs.len() > FINISHED_KEPT || (self.bytes > FINISHED_BYTES && self.runs.len() > 1) {
            let Some((k, t, n)) = self.runs.pop_front() else { break };
            self.bytes -= n;
            gone.push((k, t));
        }
        gone
    }
}

/// Whether `f` is a name the daemon gives an answer kept beside its session: a plain
/// name, `answer.` then digits and dots, then `.md`.
pub fn answer_file_name(f: &str) -> bool {
    f.strip_prefix("answer.")
        .and_then(|r| r.strip_suffix(".md"))
        .is_some_and(|stamp| !stamp.is_empty() && stamp.bytes().all(|b| b.is_ascii_digit() || b == b'.'))
}

/// The most bytes of an answer a client reads from its file.
pub const ANSWER_READ_MAX: u64 = ANSWER_MAX as u64 + 4096;

/// The key of a session in the map of running ones: the agent, and the session with its space.
fn busy_key(agent: &str, space: Option<&str>, session: &str) -> (String, String) {
    (agent.to_owned(), space.map_or_else(|| session.to_owned(), |sp| format!("{sp}/{session}")))
}

/// Unmounts and removes the pinned working directories (`.cwd/<pid>.<n>`) of daemons that are
/// gone: a daemon killed during a turn cannot unmount its pin, and its successor does.
fn clear_stale_pins(dir: &Path) {
    // root's: the daemon's runtime directory
    let Ok(entries) = std::fs::read_dir(dir.join(".cwd")) else { return };
    for e in entries.flatten() {
        let name = e.file_name();
        let pid = name.to_str().and_then(|n| n.split('.').next()).and_then(|p| p.parse::<i32>().ok());
        if pid.is_some_and(super::rundir::alive) {
            continue;
        }
        let pin = e.path();
        super::rundir::unmount_below(&pin);
        // root's: the daemon's runtime directory
        if let Err(err) = std::fs::remove_dir(&pin) {
            tracing::warn!(pin = %pin.display(), error = %err, "a stale working-directory pin stays");
        }
    }
}

/// How a turn's command runs: a headless run of its own (`ctx agent start --headless`, with the
/// caller's pinned directory), or joined to a running terminal's run (its `ctxterm` runs it).
enum Runner {
    Spawned(std::process::Child, #[allow(dead_code)] Option<Pin>),
    Joined(UnixStream),
}

impl Runner {
    /// Waits for the command's end: its exit code (70 when that cannot be known), and why
    /// it could not run when the terminal's `ctxterm` said so.
    fn wait(&mut self) -> (i32, Option<String>) {
        match self {
            Runner::Spawned(child, _) => (child.wait().map(super::supervise::code_of).unwrap_or(70), None),
            Runner::Joined(stream) => {
                // `exit N`, or `ctxterm: WHY` when the command could not run.
                let mut line = String::new();
                let _ = stream.set_read_timeout(Some(std::time::Duration::from_secs(10)));
                let _ = BufReader::new(&*stream).take(1024).read_line(&mut line);
                match line.trim().strip_prefix("exit ").and_then(|n| n.parse().ok()) {
                    Some(n) => (n, None),
                    None if line.trim().is_empty() => (70, Some("the terminal ended during the turn".into())),
                    None => (70, Some(line.trim().to_owned())),
                }
            }
        }
    }
}

/// What a turn joining a running terminal's run needs: the run's uid (its socket's owner),
/// where the turn runs in its sandbox, and the command the turn's arguments follow.
struct Joinable {
    uid: u32,
    cwd: &'static str,
    base: Vec<String>,
}

/// Whether a turn `s` of an agent whose `profile` is that can join the run going on in
/// `run` (its supervisor `pid`): the same scope, the same workspace (a `cwd` the turn gives
/// must be the run's), and a run of the profile's CLI (for a hosted CLI). A refusal says why
/// and what to do instead.
fn joinable(run: &Path, pid: i32, s: &asock::Send, profile: &str, caller: u32) -> Result<Joinable, Refusal> {
    let busy = |why: String| Refusal {
        code: "EBUSY",
        message: format!(
            "session {} runs (ctx agent start, supervisor pid {pid}) and this turn cannot join it: {why}; \
             type into the terminal with ctx agent send, or send the turn to another session (--session)",
            s.session
        ),
    };
    let c = super::rundir::read_contract(&run.join("contract.json")).map_err(|e| busy(e.to_string()))?;
    if c.space != s.space {
        return Err(busy(match &c.space {
            Some(sp) => format!("it is in shared space {sp} (ctx send --shared {sp})"),
            None => "it is the agent's own session, not a shared space's".into(),
        }));
    }
    if let Some(other) = &c.session_of {
        return Err(busy(format!("it runs on agent {other}'s session (--resume)")));
    }
    // A run started headless has no terminal to take a turn beside it.
    let terminal = crate::beneath::Tree::open(run).and_then(|t| t.stat("term/main.sock"));
    if !terminal
        .is_ok_and(|st| rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Socket)
    {
        return Err(busy("it runs headless, with no terminal to take the turn".into()));
    }
    // Its workspace is the operator's grant to that run: a caller other than root joins it
    // only when it is the caller's own to give, as a --cwd is.
    if caller != 0
        && let Some(w) = &c.workspace
        && !crate::beneath::Tree::open(w).and_then(|t| t.stat("")).is_ok_and(|st| st.st_uid == caller)
    {
        return Err(Refusal {
            code: "EACCES",
            message: format!(
                "session {} runs with workspace {}, which is not the caller's (uid {caller}) to give",
                s.session,
                w.display()
            ),
        });
    }
    if let Some(cwd) = &s.cwd {
        let same = c.workspace.as_ref().is_some_and(|w| {
            // root's: paths compared, nothing opened
            std::fs::canonicalize(w).ok() == std::fs::canonicalize(cwd).ok()
        });
        if !same {
            return Err(busy(match &c.workspace {
                Some(w) => {
                    format!("its workspace is {}, not {cwd} (send without --cwd to work there)", w.display())
                }
                None => "it has no workspace (send without --cwd)".into(),
            }));
        }
    }
    let base = match profile {
        "tsh" => vec!["/ctx/bin/tsh".to_owned()],
        p if p.starts_with('/') => vec![p.to_owned()],
        p => match &c.profile {
            Some((name, base)) if name == p => base.clone(),
            _ => return Err(busy(format!("it was not started with --profile {p}, the agent's profile"))),
        },
    };
    Ok(Joinable {
        uid: c.uid,
        cwd: if c.workspace.is_some() { super::contract::WORKSPACE } else { "/" },
        base,
    })
}

/// Asks the `ctxterm` of the run in `run` to run the turn (`j`'s command, then `args`) beside
/// its terminal: connected beneath the run's directory to a socket of the run's uid, the
/// request sent with the command's standard input, output and error (pipes whose other ends
/// are returned). Closing the connection ends the command.
fn join_turn(
    run: &Path,
    j: &Joinable,
    args: &[String],
) -> Result<(UnixStream, std::fs::File, std::fs::File, std::fs::File), Refusal> {
    use std::os::fd::AsFd;
    let fail =
        |why: String| Refusal { code: "EAGAIN", message: format!("joining the running session: {why}") };
    let mut stream = crate::beneath::Tree::open(run)
        .and_then(|t| t.connect("term/main.sock", j.uid))
        .map_err(|e| fail(e.to_string()))?;
    stream.write_all(b"turn\n").map_err(|e| fail(e.to_string()))?;
    let pipe = || rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(|e| fail(e.to_string()));
    let ((in_r, in_w), (out_r, out_w), (err_r, err_w)) = (pipe()?, pipe()?, pipe()?);
    let argv: Vec<&String> = j.base.iter().chain(args).collect();
    let mut line = json!({"argv": argv, "cwd": j.cwd}).to_string();
    line.push('\n');
    if line.len() > crate::term::TURN_REQUEST_MAX {
        return Err(Refusal {
            code: "EMSGSIZE",
            message: "the turn's command is too long to join a run".into(),
        });
    }
    let fds = [in_r.as_fd(), out_w.as_fd(), err_w.as_fd()];
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(3))];
    let mut anc = rustix::net::SendAncillaryBuffer::new(&mut space);
    anc.push(rustix::net::SendAncillaryMessage::ScmRights(&fds));
    let sent = rustix::net::sendmsg(
        &stream,
        &[std::io::IoSlice::new(line.as_bytes())],
        &mut anc,
        rustix::net::SendFlags::NOSIGNAL,
    )
    .map_err(|e| fail(e.to_string()))?;
    if sent != line.len() {
        return Err(fail("the request was cut".into()));
    }
    Ok((stream, in_w.into(), out_r.into(), err_r.into()))
}

/// A pinned working directory, unmounted and removed when the turn is over.
struct Pin(PathBuf);

impl Drop for Pin {
    fn drop(&mut self) {
        let _ = rustix::mount::unmount(&self.0, rustix::mount::UnmountFlags::DETACH);
        // root's: the daemon's runtime directory
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// The turn's text as the CLI is given it: the agent's `prompt.template.md` rendered with the
/// input (`{{message}}`, as `ctx agent new` writes it) and the files it refers to (`{{files}}`, one `- PATH` line each); with
/// no template, or one that names neither, the template, the input, then the files.
fn prompt_of(template: &str, s: &asock::Send) -> String {
    let files: String = s.files.iter().map(|f| format!("- {f}\n")).collect();
    if template.contains("{{message}}") || template.contains("{{files}}") {
        return template.replace("{{files}}", &files).replace("{{message}}", &s.input);
    }
    let mut p = String::new();
    if !template.trim().is_empty() {
        p.push_str(template.trim_end());
        p.push_str("\n\n");
    }
    p.push_str(&s.input);
    if !files.is_empty() {
        p.push_str("\n\nFiles:\n");
        p.push_str(&files);
    }
    p
}

/// The arguments of a turn for the agent's profile (its launch profile's `turn`), whether the
/// prompt goes on standard input, and the id of a CLI conversation this turn begins (to be
/// recorded when it succeeds).
fn cli_args(
    profile: &str,
    agent: &str,
    dir: &Path,
    prompt: &str,
) -> Result<(Vec<String>, bool, Option<String>), String> {
    // The session's directory is the agent's: an id read back is a word, never an option.
    let known = session::read_file(dir, CLI_SESSION, 128)
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| super::profiles::is_conversation_id(s));
    let known_names = || super::profiles::names().join(", ");
    match profile {
        "" => Err(format!(
            "agent/{agent}.d/profile is empty, so nothing would answer a turn: name its runtime there \
             (a launch profile: {}; tsh for lines of tool calls; or the absolute path of a runtime), \
             e.g. echo codex > /ctx/agent/{agent}.d/profile",
            known_names()
        )),
        // A runtime of the agent's own, by its path in the sandbox.
        p if p.starts_with('/') && policy::path::check_absolute(p).is_ok() => {
            Ok((vec![p.to_owned()], true, None))
        }
        p => match super::profiles::find(p) {
            Some(p) => super::profiles::turn(p, known.as_deref(), prompt, uuid).map_err(|e| e.to_string()),
            None => Err(format!(
                "agent/{agent}.d/profile: {p:?} is a launch profile ({}) or the absolute path of a runtime",
                known_names()
            )),
        },
    }
}

/// A random (version 4) UUID.
fn uuid() -> std::io::Result<String> {
    let mut b = [0u8; 16];
    // root's: /dev
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    Ok(format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..]))
}

/// Reads `r` in pieces of text, handing each to `f` (a piece never splits a character).
fn chunks(mut r: impl Read, mut f: impl FnMut(&str)) {
    let mut buf = vec![0u8; 16 * 1024];
    let mut held = Vec::new();
    loop {
        let n = match r.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        held.extend_from_slice(&buf[..n]);
        let cut = match std::str::from_utf8(&held) {
            Ok(_) => held.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => held.len(),
        };
        if cut > 0 {
            let piece: Vec<u8> = held.drain(..cut).collect();
            f(&String::from_utf8_lossy(&piece));
        }
    }
    if !held.is_empty() {
        f(&String::from_utf8_lossy(&held));
    }
}

/// The records of a session's `messages.jsonl` (lines that are JSON), bounded; never read
/// through a symlink.
fn read_records(dir: &Path) -> Vec<Value> {
    let text = session::read_file(dir, "messages.jsonl", 64 << 20).unwrap_or_default();
    text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

/// Appends one record to a session's `messages.jsonl`: durable when it returns.
fn append(dir: &Path, record: &Value) -> std::io::Result<()> {
    session::append_line(dir, "messages.jsonl", record)
}

/// Appends a line per file the turn `s` names to the session's `context/refs.jsonl` (made
/// when missing, as the agent's): `{"ts","kind":"file","path","turn","from_uid"}`. Synced.
fn refs(dir: &Path, s: &asock::Send, caller: u32) -> std::io::Result<()> {
    if s.files.is_empty() {
        return Ok(());
    }
    let ts = session::timestamp();
    let mut lines = String::new();
    for f in &s.files {
        lines.push_str(
            &json!({"ts": ts, "kind": "file", "path": f, "turn": s.id, "from_uid": caller}).to_string(),
        );
        lines.push('\n');
    }
    session::append_ref_lines(dir, &lines)
}

/// Writes one frame.
fn frame(out: &mut impl Write, v: &Value) -> std::io::Result<()> {
    let mut line = v.to_string();
    line.push('\n');
    out.write_all(line.as_bytes())
}

/// A client: connects to `socket`; returns the stream to write requests to, a reader of its
/// frames, and the first frame (the hello, or the refusal that came instead).
pub fn connect(socket: &Path) -> Result<(UnixStream, BufReader<UnixStream>, Value), String> {
    // root's: /ctx/agent, the objects' directory
    let s = UnixStream::connect(socket).map_err(|e| format!("{}: {e}", socket.display()))?;
    let mut r = BufReader::new(s.try_clone().map_err(|e| e.to_string())?);
    let first =
        read_frame(&mut r)?.ok_or_else(|| format!("{}: closed before its first frame", socket.display()))?;
    Ok((s, r, first))
}

/// Reads one frame (bounded), `None` at the end of the stream.
pub fn read_frame(r: &mut impl BufRead) -> Result<Option<Value>, String> {
    let mut line = Vec::new();
    let n = r.take(asock::FRAME_MAX as u64 + 1).read_until(b'\n', &mut line).map_err(|e| e.to_string())?;
    if n == 0 {
        return Ok(None);
    }
    serde_json::from_slice(&line).map(Some).map_err(|e| format!("a frame that is not JSON: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(text_bytes: usize) -> Arc<Turn> {
        let t = Arc::new(Turn::new("a", "s"));
        t.push(json!({"type": "delta", "id": "x", "text": "a".repeat(text_bytes)}));
        t.finish(json!({"type": "done", "status": "ok"}));
        t
    }

    /// The finished runs kept hold at most FINISHED_BYTES over all agents and at most
    /// FINISHED_KEPT runs: turns of 16 MiB each (the most one keeps) push the oldest out.
    #[test]
    fn finished_runs_are_bounded_for_the_whole_daemon() {
        let mut f = Finished::default();
        let mut gone = 0;
        for i in 0..40 {
            gone += f.push((format!("agent{}", i % 7), format!("id{i}")), turn(OUTPUT_KEPT)).len();
            assert!(f.bytes <= FINISHED_BYTES, "{} bytes kept after {i}", f.bytes);
        }
        assert_eq!(f.runs.len() + gone, 40);
        assert!(f.runs.len() >= 3, "{} kept", f.runs.len());
        assert_eq!(f.runs.back().unwrap().0, ("agent4".to_owned(), "id39".to_owned()), "the newest stays");
        let mut f = Finished::default();
        for i in 0..FINISHED_KEPT + 10 {
            f.push(("a".into(), format!("{i}")), turn(10));
        }
        assert_eq!(f.runs.len(), FINISHED_KEPT);
        assert_eq!(f.runs.front().unwrap().0.1, "10", "the oldest went first");
    }
}
