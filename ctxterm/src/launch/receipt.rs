//! The receipt socket of an agent run: how the lifecycle tools inside a sandbox (`agent.create`,
//! `agent.start`, `agent.stop`, `agent.update`) reach the host.
//!
//! The supervisor of each run listens on `<runtime>/receipt/main.sock` (bound into the sandbox
//! at `/run/cortexfs/receipt/main.sock`, a directory only the agent's uid may enter). Whatever
//! arrives there is the caller's agent, session and run: requests never name the caller, so an
//! agent cannot act as another. One JSON line in, one out: `{"op":..,"input":{..}}` ->
//! `{"ok":true,"message":..}` or `{"ok":false,"code":N,"error":..}` (codes: 2 invalid, 13
//! refused, 1 failed). Every request is checked whole against its type
//! ([`policy::receipt::Request`]) before anything runs, and served by calls into the launcher
//! and the agent store, never by running a command built from it.
//!
//! Children started here are owned: recorded under the caller's session in
//! `context/child/<child>.<session>/` (`agent session status handoff.md result.md refs.jsonl
//! artifact/`, status `pending active done error cancelled`) and cancelled when the caller's run
//! ends; their history stays.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use policy::receipt::{Create, Reply, Request, SELF_UPDATABLE, StartChild, StopChild, UPDATE_MAX, Update};
use policy::v0::{Class, Permission, Policy, Query};
use serde_json::{Value, json};

use super::{Error, Start, agents, rundir, session, supervise};
use crate::beneath::Tree;

/// Who the run is, and where things are.
#[derive(Clone, Debug)]
pub struct Run {
    /// The caller's agent.
    pub agent: String,
    /// Its session.
    pub session: String,
    /// Its uid (its home holds the session).
    pub uid: u32,
    /// Its session's directory under the host's /ctx.
    pub dir: PathBuf,
    /// The host's /ctx mount.
    pub ctx: PathBuf,
    /// The daemon's control socket.
    pub control: PathBuf,
    /// The run's workspace, which children share.
    pub workspace: Option<PathBuf>,
}

/// A child this run started: agent, session and its supervisor (a child process of this one,
/// reaped when it ends).
#[derive(Debug)]
pub struct Owned {
    /// The child agent.
    pub agent: String,
    /// Its session.
    pub session: String,
    supervisor: Option<std::process::Child>,
}

/// A child record under a session's `context/child/<id>/`, as the receipt server keeps it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ChildRecord {
    /// The record's id (`<child>.<session>`).
    pub id: String,
    /// The child agent.
    pub agent: String,
    /// Its session.
    pub session: String,
    /// `pending`, `active`, `done`, `error` or `cancelled`.
    pub status: String,
}

/// The child records of the session whose directory is `session_dir`, sorted by id. The
/// records are in the agent's tree: read beneath it ([`crate::beneath`]), never through a link.
pub fn records(session_dir: &Path) -> Vec<ChildRecord> {
    let mut out = Vec::new();
    let Ok(children) = Tree::open(session_dir).and_then(|t| t.sub("context/child")) else { return out };
    for name in children.names(RECORDS_MAX).unwrap_or_default() {
        let Ok(rec) = children.sub(&name) else { continue };
        let read = |n: &str| rec.read_string(n, 4096).unwrap_or_default().trim().to_owned();
        out.push(ChildRecord {
            id: name.to_string_lossy().into_owned(),
            agent: read("agent"),
            session: read("session"),
            status: read("status"),
        });
    }
    out.sort();
    out
}

/// At most this many child records are listed.
const RECORDS_MAX: usize = 4096;

/// The children a run started.
pub type Children = Arc<Mutex<Vec<Owned>>>;

/// The (agent, session) of every child a run started.
pub fn owned(children: &Children) -> Vec<(String, String)> {
    children
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .map(|o| (o.agent.clone(), o.session.clone()))
        .collect()
}

/// The pids of the supervisors of the children a run started that have not been waited for.
pub fn supervisor_pids(children: &Children) -> Vec<i32> {
    children
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter_map(|o| o.supervisor.as_ref().map(|s| s.id() as i32))
        .collect()
}

/// The most of a child's result (and of its references) its parent's record takes.
const RESULT_MAX: u64 = 1 << 20;

/// What a child session answered: its `latest.md` when it has one, else the content of its last
/// assistant message, else the last [`RESULT_MAX`]/16 bytes its terminal wrote.
fn child_answer(session: &Tree) -> Vec<u8> {
    if let Ok(b) = session.read("latest.md", RESULT_MAX)
        && !b.iter().all(u8::is_ascii_whitespace)
    {
        return b;
    }
    // Its end: the last lines, whole ones only after the first cut.
    let messages = session.tail("messages.jsonl", 4 * RESULT_MAX).unwrap_or_default();
    let last = messages.split(|b| *b == b'\n').rev().find_map(|l| {
        let v: serde_json::Value = serde_json::from_slice(l).ok()?;
        (v["role"] == "assistant").then(|| v["content"].as_str().map(str::to_owned)).flatten()
    });
    if let Some(text) = last.filter(|t| !t.trim().is_empty()) {
        let mut b = text.into_bytes();
        b.truncate(usize::try_from(RESULT_MAX).unwrap_or(usize::MAX));
        return b;
    }
    let mut out =
        session.read(format!("{}.1", policy::runtime::TERMINAL_LOG), RESULT_MAX).unwrap_or_default();
    out.extend(session.read(policy::runtime::TERMINAL_LOG, RESULT_MAX).unwrap_or_default());
    let keep = usize::try_from(RESULT_MAX / 16).unwrap_or(usize::MAX);
    out.split_off(out.len().saturating_sub(keep))
}

/// The reply to a failed call, with the exit code it carries.
fn failed(e: &Error) -> Reply {
    Reply::refused(i32::from(e.code()), e.to_string())
}

fn refuse(code: i32, error: impl Into<String>) -> Reply {
    Reply::refused(code, error)
}

impl Run {
    fn session_dir(&self) -> PathBuf {
        self.dir.clone()
    }

    /// Reads `rel` of the host's /ctx (at most 1 MiB), beneath it; empty when it cannot.
    fn ctx_read(&self, rel: &str) -> String {
        Tree::open(&self.ctx).and_then(|t| t.read_string(rel, 1 << 20)).unwrap_or_default()
    }

    fn storage(&self) -> Option<String> {
        policy::status::field(&self.ctx_read("status"), "storage").map(str::to_owned)
    }

    /// Configuration at `rel` (`agent/x.d/policy`), as the configuration in force has it: the
    /// active generation when the storage's configuration is a repository (a staged edit grants
    /// nothing); empty when it cannot be read.
    fn config_read(&self, rel: &str) -> String {
        super::contract::config_root(&self.ctx)
            .ok()
            .and_then(|root| ringfs::config::read_config(&root, Path::new(rel), 1 << 20).ok())
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// The caller's control (see [`Run::config_read`]).
    fn own(&self, control: &str) -> String {
        self.config_read(&format!("agent/{}.d/{control}", self.agent))
    }

    /// Commits this run's own change of `paths` when the storage's configuration is a
    /// repository, naming the agent, its uid and its session, and waits (up to 3 s) until the
    /// daemon serves it; says the new generation.
    fn commit(&self, storage: &Path, paths: &[String], what: &str) -> Result<Option<String>, String> {
        if !ringfs::config::has_repository(storage) {
            return Ok(None);
        }
        let who = format!("agent {} (uid {}, session {})", self.agent, self.uid, self.session);
        let message = format!("{what}\n\nby {who}");
        let c = ringfs::config::Commit { message: &message, who: &who, only: Some(paths) };
        let id = ringfs::config::commit_own(storage, &c).map_err(|e| format!("not activated: {e}"))?;
        if let Some(id) = &id {
            super::contract::served(&self.ctx, id);
        }
        Ok(id)
    }

    /// Whether the caller's policy grants `agent:<child> <permission>`.
    fn may(&self, child: &str, permission: Permission) -> bool {
        let label = self.own("label").trim().to_owned();
        Policy::from_text(self.own("policy").as_bytes()).is_ok_and(|p| {
            p.allows(&Query { subject: &label, class: Class::Agent, object: child, permission })
        })
    }

    /// Appends one event to the caller's session; durable when it returns. An event that
    /// cannot be recorded fails the request it records (see [`Run::update`]).
    fn event(&self, v: Value) -> Result<(), String> {
        let dir = self.session_dir();
        session::append_event(&dir, &v)
            .map_err(|e| format!("the call was not recorded: {}: {e}", dir.join("events.jsonl").display()))
    }

    fn update(&self, u: &Update) -> Reply {
        let control = u.control.as_str();
        let content = u.content.as_str();
        let ts = session::timestamp();
        let base =
            json!({"ts": ts, "agent": self.agent, "session": self.session, "object": "tool/agent.update"});
        let mut call = base.clone();
        call["type"] = json!("tool_call");
        call["control"] = json!(control);
        call["bytes"] = json!(content.len());
        // Nothing is done that could not be recorded.
        if let Err(e) = self.event(call) {
            return refuse(1, e);
        }
        let result = if !SELF_UPDATABLE.contains(&control) {
            refuse(
                2,
                format!("EINVAL: {control:?} is not self-updatable (only system.md and prompt.template.md)"),
            )
        } else if content.len() > UPDATE_MAX {
            refuse(2, format!("EINVAL: {} bytes is over the 8 KiB limit", content.len()))
        } else {
            // Written through /ctx: replaced whole when the file is closed; then, where the
            // configuration is a repository, activated as a commit of its own.
            let rel = format!("agent/{}.d/{control}", self.agent);
            match Tree::open(&self.ctx).and_then(|t| t.write(&rel, content.as_bytes(), 0o644).map(drop)) {
                Ok(()) => match self.storage() {
                    Some(storage) => {
                        match self.commit(
                            Path::new(&storage),
                            std::slice::from_ref(&rel),
                            &format!("agent.update {rel}"),
                        ) {
                            Ok(Some(id)) => Reply::done(format!("replaced {rel} (generation {id})")),
                            Ok(None) => Reply::done(format!("replaced {rel}")),
                            Err(e) => refuse(1, format!("{rel}: {e}")),
                        }
                    }
                    None => refuse(69, format!("{rel}: written, but the storage is not in /ctx/status")),
                },
                Err(e) => refuse(1, format!("agent/{}.d/{control}: {e}", self.agent)),
            }
        };
        let mut done = base;
        done["type"] = json!("tool_result");
        done["status"] = json!(if result.ok { "ok" } else { "error" });
        if let Some(e) = result.error.as_deref() {
            done["reason"] = json!(e);
        }
        match self.event(done) {
            Ok(()) => result,
            // Done but not recorded: the caller hears of it as a failure, with what was done.
            Err(e) if result.ok => refuse(
                1,
                format!("{e} (the update itself was made: {})", result.message.as_deref().unwrap_or("")),
            ),
            Err(e) => refuse(1, format!("{e}; {}", result.error.as_deref().unwrap_or(""))),
        }
    }

    fn create(&self, c: &Create) -> Reply {
        let Some(storage) = self.storage() else {
            return refuse(69, "cannot find the storage in /ctx/status");
        };
        match agents::create_child(Path::new(&storage), &self.agent, c) {
            Ok(message) => {
                let paths = [format!("agent/{}", c.name), format!("agent/{}.d", c.name)];
                let what = format!("agent.create {} (a child of {})", c.name, self.agent);
                match self.commit(Path::new(&storage), &paths, &what) {
                    Ok(_) => Reply::done(message),
                    Err(e) => refuse(1, format!("{message}\n{e}")),
                }
            }
            Err(e) => failed(&e),
        }
    }

    /// The record of the child `child` `session` (`context/child/<child>.<session>`), beneath
    /// the session's directory.
    fn child_rel(child: &str, session: &str) -> PathBuf {
        Path::new("context/child").join(format!("{child}.{session}"))
    }

    /// The child's record directory, opened beneath the caller's session.
    fn child_dir(&self, child: &str, session: &str) -> std::io::Result<Tree> {
        Tree::open(&self.session_dir())?.sub(Self::child_rel(child, session))
    }

    /// The child's recorded status (empty when it cannot be read).
    fn child_status(&self, child: &str, session: &str) -> String {
        self.child_dir(child, session)
            .and_then(|d| d.read_string("status", 64))
            .unwrap_or_default()
            .trim()
            .to_owned()
    }

    /// Records the child's status.
    fn set_status(&self, child: &str, session: &str, status: &str) {
        let set = self
            .child_dir(child, session)
            .and_then(|d| d.write("status", format!("{status}\n").as_bytes(), 0o644));
        if let Err(e) = set {
            eprintln!("ctx: agent {child} session {session}: its status: {e}");
        }
    }

    fn start(&self, input: &StartChild, children: &Children) -> Reply {
        let child = input.name.as_str();
        if !self.may(child, Permission::Start) {
            return refuse(13, format!("the caller's policy does not allow agent:{child} start"));
        }
        let parent = self.config_read(&format!("agent/{child}.d/parent"));
        if parent.trim() != self.agent {
            return refuse(
                13,
                format!("agent/{child} is not a child of agent/{} (its parent control)", self.agent),
            );
        }
        let session = input.session.clone().unwrap_or_else(|| format!("{}.{}", self.agent, self.session));
        for (what, v) in [("name", child), ("session", session.as_str())] {
            if let Err(e) = policy::name::validate(v) {
                return refuse(2, format!("EINVAL: {what} {v:?}: {e}"));
            }
        }
        // The record is in the caller's tree: made and written beneath it, never through a
        // link it planted there (a link in its place refuses the start).
        let record = || -> std::io::Result<()> {
            let dir = Tree::open(&self.session_dir())?.make_dirs(Self::child_rel(child, &session), 0o755)?;
            dir.make_dirs("artifact", 0o755)?;
            dir.write("agent", format!("{child}\n").as_bytes(), 0o644)?;
            dir.write("session", format!("{session}\n").as_bytes(), 0o644)?;
            dir.write("status", b"pending\n", 0o644)?;
            dir.write("handoff.md", input.handoff.as_deref().unwrap_or("").as_bytes(), 0o644)?;
            dir.write("result.md", b"", 0o644)?;
            dir.write("refs.jsonl", b"", 0o644)?;
            Ok(())
        };
        if let Err(e) = record() {
            return refuse(1, format!("the child's record: {e}"));
        }
        let started = supervise::start_owned(&Start {
            shared: None,
            agent: child.to_owned(),
            session: session.clone(),
            cwd: self.workspace.clone(),
            mounts: Vec::new(),
            no_workspace: self.workspace.is_none(),
            cmd: input.cmd.clone(),
            profile: None,
            memory: None,
            pids: None,
            cpu: None,
            no_ceilings: false,
            ctx: self.ctx.clone(),
            control: self.control.clone(),
            wait: false,
            headless: false,
            grace: 5,
            resume: None,
            timeout: None,
        });
        self.set_status(child, &session, if started.is_ok() { "active" } else { "error" });
        match started {
            Ok(supervisor) => {
                children.lock().unwrap_or_else(|p| p.into_inner()).push(Owned {
                    agent: child.to_owned(),
                    session: session.clone(),
                    supervisor: Some(supervisor),
                });
                Reply::done(format!("started agent {child} session {session}"))
            }
            Err(e) => failed(&e),
        }
    }

    fn stop(&self, input: &StopChild, children: &Children) -> Reply {
        let child = input.name.as_str();
        if !self.may(child, Permission::Stop) {
            return refuse(13, format!("the caller's policy does not allow agent:{child} stop"));
        }
        let owned: Vec<(String, String)> = children
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|o| o.agent == child && input.session.as_deref().is_none_or(|want| want == o.session))
            .map(|o| (o.agent.clone(), o.session.clone()))
            .collect();
        if owned.is_empty() {
            return refuse(1, format!("this run started no running agent {child}"));
        }
        for (c, s) in &owned {
            self.cancel(c, s);
        }
        Reply::done(format!("stopped agent {child}"))
    }

    /// Stops an owned child and marks it cancelled (unless it had already ended).
    pub fn cancel(&self, child: &str, session: &str) {
        if matches!(self.child_status(child, session).as_str(), "done" | "error" | "cancelled") {
            return;
        }
        let by = format!("agent {} session {}, its parent run", self.agent, self.session);
        if let Err(e) = rundir::stop(&self.control, child, session, &by) {
            eprintln!("ctx: stopping agent {child} session {session}: {e}");
        }
        self.collect(child, session);
        self.set_status(child, session, "cancelled");
    }

    /// Puts what the ended child produced in its record, before its status says it ended:
    /// `result.md` (its session's `latest.md`, else its last assistant message, else the end of
    /// its terminal's output) and `refs.jsonl` (its session's `context/refs.jsonl`), each synced.
    /// Once: a record whose result is written keeps it. The child's session is its agent's
    /// tree, read beneath it and bounded.
    fn collect(&self, child: &str, session: &str) {
        let Ok(rec) = self.child_dir(child, session) else { return };
        if rec.stat("result.md").is_ok_and(|s| s.st_size > 0) {
            return;
        }
        let Ok(uid) = self.config_read(&format!("agent/{child}.d/uid")).trim().parse::<u32>() else { return };
        let Ok(from) = Tree::open(&policy::runtime::session_dir(&self.ctx, uid, child, session)) else {
            return;
        };
        let put = |name: &str, bytes: &[u8]| {
            if let Err(e) = rec.write(name, bytes, 0o644).and_then(|f| f.sync_all()) {
                eprintln!("ctx: agent {child} session {session}: its {name}: {e}");
            }
        };
        put("result.md", &child_answer(&from));
        if let Ok(refs) = from.read("context/refs.jsonl", RESULT_MAX) {
            put("refs.jsonl", &refs);
        }
    }

    /// Records the end of children that finished on their own: `done` (status 0) or `error`.
    pub fn reap(&self, children: &Children) {
        for o in children.lock().unwrap_or_else(|p| p.into_inner()).iter_mut() {
            // A supervisor that ended is waited for (no zombie stays); its status is the run's.
            let mut ended = None;
            if let Some(s) = o.supervisor.as_mut()
                && let Ok(Some(st)) = s.try_wait()
            {
                ended = Some(supervise::code_of(st));
                o.supervisor = None;
            }
            let (child, session) = (&o.agent, &o.session);
            if self.child_status(child, session) != "active" {
                continue;
            }
            if let Some(code) = ended.or_else(|| rundir::exit_of(&self.control, child, session)) {
                self.collect(child, session);
                self.set_status(child, session, if code == 0 { "done" } else { "error" });
            }
        }
    }

    /// Whether both policies let the caller run the lifecycle tool `tool`: the socket can be
    /// reached without tsh, so it checks what tsh checks.
    fn may_run(&self, tool: &str) -> Result<(), Reply> {
        let label = self.own("label").trim().to_owned();
        let q = Query { subject: &label, class: Class::Tool, object: tool, permission: Permission::Execute };
        let agent = Policy::from_text(self.own("policy").as_bytes()).is_ok_and(|p| p.allows(&q));
        if !agent {
            return Err(refuse(
                13,
                format!("refused by the agent policy: it does not allow {label} tool:{tool} execute"),
            ));
        }
        let own = self.config_read(&format!("tool/{tool}.d/policy"));
        if !Policy::from_text(own.as_bytes()).is_ok_and(|p| p.allows(&q)) {
            return Err(refuse(
                13,
                format!("refused by the tool's own policy: tool/{tool}.d/policy does not allow {label}"),
            ));
        }
        Ok(())
    }

    fn handle(&self, req: &Request, children: &Children) -> Reply {
        if let Err(refused) = self.may_run(req.tool()) {
            return refused;
        }
        match req {
            Request::Update(u) => self.update(u),
            Request::Create(c) => self.create(c),
            Request::Start(s) => self.start(s, children),
            Request::Stop(s) => self.stop(s, children),
        }
    }
}

fn serve_one(run: &Run, stream: UnixStream, children: &Children) {
    let Ok(mut w) = stream.try_clone() else { return };
    let mut line = String::new();
    if BufReader::new(stream.take(policy::receipt::REQUEST_MAX as u64)).read_line(&mut line).is_err() {
        return;
    }
    // Checked whole before anything runs (EINVAL: a request is always about the caller itself).
    let reply = match Request::parse(line.trim_end().as_bytes()) {
        Ok(req) => run.handle(&req, children),
        Err(e) => refuse(2, format!("EINVAL: {e}")),
    };
    let mut line = serde_json::to_string(&reply).unwrap_or_else(|_| r#"{"ok":false,"code":70}"#.to_owned());
    line.push('\n');
    let _ = w.write_all(line.as_bytes());
}

/// Serves the receipt socket at `path` on a thread of its own, for the life of the process.
pub fn serve(run: Run, path: &Path, children: Children) -> std::io::Result<()> {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
        return Err(std::io::ErrorKind::InvalidInput.into());
    };
    // The socket's directory is the agent's (bound into its sandbox).
    let listener = Tree::open(dir)?.bind(name, run.uid)?;
    std::thread::Builder::new().name("receipt".into()).spawn(move || {
        for stream in listener.incoming().flatten() {
            serve_one(&run, stream, &children);
        }
    })?;
    Ok(())
}
