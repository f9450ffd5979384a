//! The receipt socket of an agent run: how the lifecycle tools inside a sandbox (`agent.create`,
//! `agent.start`, `agent.stop`, `agent.update`) reach the host.
//!
//! The supervisor of each run listens on `<runtime>/receipt/main.sock` (bound into the sandbox
//! at `/run/cortexfs/receipt/main.sock`, a directory only the agent's uid may enter). Whatever
//! arrives there is the caller's agent, session and run: requests never name the caller, so an
//! agent cannot act as another. One JSON line in, one out: `{"op":..,"input":{..}}` ->
//! `{"ok":true,"message":..}` or `{"ok":false,"code":N,"error":..}` (codes: 2 invalid, 13
//! refused, 1 failed).
//!
//! Children started here are owned: recorded under the caller's session in
//! `context/child/<child>.<session>/` (`agent session status handoff.md result.md refs.jsonl
//! artifact/`, status `pending active done error cancelled`) and cancelled when the caller's run
//! ends; their history stays.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use policy::v0::{Class, Permission, Policy, Query};
use serde_json::{Value, json};

/// The two controls an agent may replace in itself.
pub const SELF_UPDATABLE: &[&str] = &["system.md", "prompt.template.md"];
/// Most bytes `agent.update` accepts.
pub const UPDATE_MAX: usize = 8 * 1024;

/// Who the run is, and where things are.
#[derive(Clone, Debug)]
pub struct Run {
    /// The caller's agent.
    pub agent: String,
    /// Its session.
    pub session: String,
    /// Its uid (its home holds the session).
    pub uid: u32,
    /// The host's /ctx mount.
    pub ctx: PathBuf,
    /// The daemon's control socket.
    pub control: PathBuf,
    /// The run's workspace, which children share.
    pub workspace: Option<PathBuf>,
}

/// An owned child: agent and session.
pub type Children = Arc<Mutex<Vec<(String, String)>>>;

fn refuse(code: i32, error: impl Into<String>) -> Value {
    json!({"ok": false, "code": code, "error": error.into()})
}

impl Run {
    fn session_dir(&self) -> PathBuf {
        self.ctx
            .join("home")
            .join(self.uid.to_string())
            .join("agent")
            .join(&self.agent)
            .join("session")
            .join(&self.session)
    }

    fn storage(&self) -> Option<String> {
        let status = std::fs::read_to_string(self.ctx.join("status")).ok()?;
        status.lines().find_map(|l| l.strip_prefix("storage ").map(str::to_owned))
    }

    fn own(&self, control: &str) -> String {
        std::fs::read_to_string(self.ctx.join("agent").join(format!("{}.d", self.agent)).join(control))
            .unwrap_or_default()
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
        let mut line = v.to_string();
        line.push('\n');
        let path = self.session_dir().join("events.jsonl");
        std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(&path)
            .and_then(|mut f| f.write_all(line.as_bytes()))
            .map_err(|e| format!("the call was not recorded: {}: {e}", path.display()))
    }

    fn ctx_cmd(&self, args: &[String]) -> (i32, String, String) {
        let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("ctx"));
        match Command::new(exe).args(args).stdin(std::process::Stdio::null()).output() {
            Ok(o) => (
                o.status.code().unwrap_or(1),
                String::from_utf8_lossy(&o.stdout).trim().to_owned(),
                String::from_utf8_lossy(&o.stderr).trim().trim_start_matches("ctx: ").to_owned(),
            ),
            Err(e) => (70, String::new(), e.to_string()),
        }
    }

    fn reply(&self, (code, out, err): (i32, String, String)) -> Value {
        if code == 0 { json!({"ok": true, "message": out}) } else { refuse(code, err) }
    }

    fn update(&self, input: &Value) -> Value {
        let control = input["control"].as_str().unwrap_or("");
        let content = input["content"].as_str().unwrap_or("");
        let ts = humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string();
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
        let unknown: Vec<&String> = input
            .as_object()
            .map(|o| o.keys().filter(|k| !matches!(k.as_str(), "control" | "content")).collect())
            .unwrap_or_default();
        let result = if !unknown.is_empty() {
            refuse(
                2,
                format!(
                    "EINVAL: unknown field {:?} (a request is always about the caller itself)",
                    unknown[0]
                ),
            )
        } else if !SELF_UPDATABLE.contains(&control) {
            refuse(
                2,
                format!("EINVAL: {control:?} is not self-updatable (only system.md and prompt.template.md)"),
            )
        } else if content.len() > UPDATE_MAX {
            refuse(2, format!("EINVAL: {} bytes is over the 8 KiB limit", content.len()))
        } else {
            let path = self.ctx.join("agent").join(format!("{}.d", self.agent)).join(control);
            // Written through /ctx: replaced whole when the file is closed.
            match std::fs::write(&path, content) {
                Ok(()) => {
                    json!({"ok": true, "message": format!("replaced agent/{}.d/{control}", self.agent)})
                }
                Err(e) => refuse(1, format!("agent/{}.d/{control}: {e}", self.agent)),
            }
        };
        let mut done = base;
        done["type"] = json!("tool_result");
        done["status"] = json!(if result["ok"] == true { "ok" } else { "error" });
        if let Some(e) = result["error"].as_str() {
            done["reason"] = json!(e);
        }
        match self.event(done) {
            Ok(()) => result,
            // Done but not recorded: the caller hears of it as a failure, with what was done.
            Err(e) if result["ok"] == true => refuse(
                1,
                format!("{e} (the update itself was made: {})", result["message"].as_str().unwrap_or("")),
            ),
            Err(e) => refuse(1, format!("{e}; {}", result["error"].as_str().unwrap_or(""))),
        }
    }

    fn create(&self, input: &Value) -> Value {
        let Some(name) = input["name"].as_str() else { return refuse(2, "name is required") };
        let Some(storage) = self.storage() else {
            return refuse(69, "cannot find the storage in /ctx/status");
        };
        let mut args: Vec<String> =
            ["agent", "new", name, "--parent", &self.agent, "--source", &storage].map(str::to_owned).to_vec();
        if let Some(l) = input["label"].as_str() {
            args.extend(["--label".into(), l.into()]);
        }
        for (key, flag) in [("tools", "--tool"), ("models", "--model"), ("shared", "--shared")] {
            for v in input[key].as_array().into_iter().flatten().filter_map(Value::as_str) {
                args.extend([flag.into(), v.into()]);
            }
        }
        for m in input["mounts"].as_array().into_iter().flatten() {
            let parts: Vec<&str> = m.as_array().into_iter().flatten().filter_map(Value::as_str).collect();
            args.push("--mount".into());
            args.extend(parts.iter().map(|p| (*p).to_owned()));
        }
        let groups: Vec<String> = input["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_u64)
            .map(|g| g.to_string())
            .collect();
        if !groups.is_empty() {
            args.extend(["--groups".into(), groups.join(",")]);
        }
        self.reply(self.ctx_cmd(&args))
    }

    fn child_dir(&self, child: &str, session: &str) -> PathBuf {
        self.session_dir().join("context").join("child").join(format!("{child}.{session}"))
    }

    fn start(&self, input: &Value, children: &Children) -> Value {
        let Some(child) = input["name"].as_str() else { return refuse(2, "name is required") };
        if !self.may(child, Permission::Start) {
            return refuse(13, format!("the caller's policy does not allow agent:{child} start"));
        }
        let parent =
            std::fs::read_to_string(self.ctx.join("agent").join(format!("{child}.d")).join("parent"))
                .unwrap_or_default();
        if parent.trim() != self.agent {
            return refuse(
                13,
                format!("agent/{child} is not a child of agent/{} (its parent control)", self.agent),
            );
        }
        let session = input["session"]
            .as_str()
            .map_or_else(|| format!("{}.{}", self.agent, self.session), str::to_owned);
        for (what, v) in [("name", child), ("session", session.as_str())] {
            if let Err(e) = policy::name::validate(v) {
                return refuse(2, format!("EINVAL: {what} {v:?}: {e}"));
            }
        }
        let dir = self.child_dir(child, &session);
        let record = || -> std::io::Result<()> {
            std::fs::create_dir_all(dir.join("artifact"))?;
            std::fs::write(dir.join("agent"), format!("{child}\n"))?;
            std::fs::write(dir.join("session"), format!("{session}\n"))?;
            std::fs::write(dir.join("status"), "pending\n")?;
            std::fs::write(dir.join("handoff.md"), input["handoff"].as_str().unwrap_or(""))?;
            std::fs::write(dir.join("result.md"), "")?;
            std::fs::write(dir.join("refs.jsonl"), "")
        };
        if let Err(e) = record() {
            return refuse(1, format!("{}: {e}", dir.display()));
        }
        let mut args: Vec<String> =
            vec!["agent".into(), "start".into(), child.into(), "--session".into(), session.clone()];
        args.extend([
            "--ctx".into(),
            self.ctx.display().to_string(),
            "--control".into(),
            self.control.display().to_string(),
        ]);
        match &self.workspace {
            Some(w) => args.extend(["--cwd".into(), w.display().to_string()]),
            None => args.push("--no-default-workspace".into()),
        }
        let cmd: Vec<String> = input["cmd"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect();
        if !cmd.is_empty() {
            args.push("--".into());
            args.extend(cmd);
        }
        let r = self.ctx_cmd(&args);
        let ok = r.0 == 0;
        let _ = std::fs::write(dir.join("status"), if ok { "active\n" } else { "error\n" });
        if ok {
            children.lock().unwrap_or_else(|p| p.into_inner()).push((child.to_owned(), session.clone()));
            return json!({"ok": true, "message": format!("started agent {child} session {session}")});
        }
        self.reply(r)
    }

    fn stop(&self, input: &Value, children: &Children) -> Value {
        let Some(child) = input["name"].as_str() else { return refuse(2, "name is required") };
        if !self.may(child, Permission::Stop) {
            return refuse(13, format!("the caller's policy does not allow agent:{child} stop"));
        }
        let owned: Vec<(String, String)> = children
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(c, s)| c == child && input["session"].as_str().is_none_or(|want| want == s))
            .cloned()
            .collect();
        if owned.is_empty() {
            return refuse(1, format!("this run started no running agent {child}"));
        }
        for (c, s) in &owned {
            self.cancel(c, s);
        }
        json!({"ok": true, "message": format!("stopped agent {child}")})
    }

    /// Stops an owned child and marks it cancelled (unless it had already ended).
    pub fn cancel(&self, child: &str, session: &str) {
        let dir = self.child_dir(child, session);
        let status = std::fs::read_to_string(dir.join("status")).unwrap_or_default();
        if matches!(status.trim(), "done" | "error" | "cancelled") {
            return;
        }
        let _ =
            self.ctx_cmd(&["agent".into(), "stop".into(), child.into(), "--session".into(), session.into()]);
        let _ = std::fs::write(dir.join("status"), "cancelled\n");
    }

    /// Records the end of children that finished on their own: `done` (status 0) or `error`.
    pub fn reap(&self, children: &Children) {
        for (child, session) in children.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            let dir = self.child_dir(child, session);
            let status = std::fs::read_to_string(dir.join("status")).unwrap_or_default();
            if status.trim() != "active" {
                continue;
            }
            let exit = crate::cmd::launch::exit_of(child, session);
            if let Some(code) = exit {
                let _ = std::fs::write(dir.join("status"), if code == 0 { "done\n" } else { "error\n" });
            }
        }
    }

    /// Whether both policies let the caller run the lifecycle tool `tool`: the socket can be
    /// reached without tsh, so it checks what tsh checks.
    fn may_run(&self, tool: &str) -> Result<(), Value> {
        let label = self.own("label").trim().to_owned();
        let q = Query { subject: &label, class: Class::Tool, object: tool, permission: Permission::Execute };
        let agent = Policy::from_text(self.own("policy").as_bytes()).is_ok_and(|p| p.allows(&q));
        if !agent {
            return Err(refuse(
                13,
                format!("refused by the agent policy: it does not allow {label} tool:{tool} execute"),
            ));
        }
        let own = std::fs::read_to_string(self.ctx.join("tool").join(format!("{tool}.d")).join("policy"))
            .unwrap_or_default();
        if !Policy::from_text(own.as_bytes()).is_ok_and(|p| p.allows(&q)) {
            return Err(refuse(
                13,
                format!("refused by the tool's own policy: tool/{tool}.d/policy does not allow {label}"),
            ));
        }
        Ok(())
    }

    fn handle(&self, req: &Value, children: &Children) -> Value {
        let input = &req["input"];
        if let Some(op) = req["op"].as_str()
            && op.starts_with("agent.")
            && let Err(refused) = self.may_run(op)
        {
            return refused;
        }
        match req["op"].as_str() {
            Some("agent.update") => self.update(input),
            Some("agent.create") => self.create(input),
            Some("agent.start") => self.start(input, children),
            Some("agent.stop") => self.stop(input, children),
            other => refuse(2, format!("unknown request {other:?}")),
        }
    }
}

fn serve_one(run: &Run, stream: UnixStream, children: &Children) {
    let Ok(mut w) = stream.try_clone() else { return };
    let mut line = String::new();
    if BufReader::new(stream.take(256 * 1024)).read_line(&mut line).is_err() {
        return;
    }
    let reply = match serde_json::from_str::<Value>(&line) {
        Ok(req) => run.handle(&req, children),
        Err(e) => refuse(2, format!("not a JSON request: {e}")),
    };
    let mut line = reply.to_string();
    line.push('\n');
    let _ = w.write_all(line.as_bytes());
}

/// Serves the receipt socket at `path` on a thread of its own, for the life of the process.
pub fn serve(run: Run, path: &Path, children: Children) -> std::io::Result<()> {
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path)?;
    std::os::unix::fs::chown(path, Some(run.uid), None)?;
    std::thread::Builder::new().name("receipt".into()).spawn(move || {
        for stream in listener.incoming().flatten() {
            serve_one(&run, stream, &children);
        }
    })?;
    Ok(())
}
