//! Running a tool: authority, hooks, the process, and the audit record.
//!
//! A run needs an agent terminal context. Before anything is spawned tsh checks the agent's
//! policy (`agent/<agent>.d/policy` must allow `<label> tool:<name> execute`) and the tool's own
//! policy (`<name>.d/policy` beside the hit); the view enforces both again. Then the executables
//! in `<name>.d/hooks/pre.d/` run in name order (any non-zero exit blocks the call), the tool runs
//! with a cleared environment plus the documented variables, argv preserved and stdio inherited
//! (or, in native mode, JSON in and JSONL frames out), and `hooks/post.d/` runs after it.
//!
//! Every call, refused ones included, appends one `tool.call` event to the session's
//! `events.jsonl` and one line to the tool's `.d/log`; on CortexFS both writes return only once
//! durable. Output is never recorded; arguments only when the agent's policy has a line
//! `allow LABEL record:tool-args write` (facts only otherwise).

use std::ffi::OsString;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Instant, SystemTime};

use policy::v0::{Class, Permission, Policy, Query};
use serde_json::json;

use crate::Fail;
use crate::context::{Agent, Context};
use crate::resolve::{Hit, Miss, Resolver, executable};

/// Variables passed from tsh's environment to tools (besides the ones tsh sets).
const PASSED: &[&str] = &["HOME", "USER", "LOGNAME", "TERM", "LANG", "LC_ALL", "TZ"];
/// Most JSON input accepted in native mode.
const NATIVE_INPUT_MAX: u64 = 1 << 20;

/// How the tool is called.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// argv, inherited stdio, plain text.
    Cli,
    /// JSON input on stdin, JSONL frames out (`tsh --json TOOL`).
    Native,
}

/// The outcome of a run, for the audit record.
#[derive(Debug)]
struct Outcome<'a> {
    status: &'static str,
    exit: Option<i32>,
    reason: Option<String>,
    /// The submission this call ran for (`tsh submit`).
    async_id: Option<&'a str>,
    /// The arguments, recorded in full only when the agent's policy says so.
    args: Option<Vec<String>>,
}

fn read_small(path: &Path) -> Result<String, String> {
    let mut s = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(policy::controls::CONTROL_MAX as u64).read_to_string(&mut s))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(s)
}

fn policy_of(policy_file: &Path) -> Result<Policy, String> {
    let text = read_small(policy_file)?;
    Policy::from_text(text.as_bytes()).map_err(|errs| {
        let why: Vec<String> = errs.iter().map(ToString::to_string).collect();
        format!("{}: invalid: {}", policy_file.display(), why.join("; "))
    })
}

fn executes(p: &Policy, label: &str, tool: &str) -> bool {
    p.allows(&Query { subject: label, class: Class::Tool, object: tool, permission: Permission::Execute })
}

fn grants(policy_file: &Path, label: &str, tool: &str) -> Result<bool, String> {
    policy_of(policy_file).map(|p| executes(&p, label, tool))
}

/// The agent's label, from `agent/<name>.d/label` of its view.
fn label(ctx: &Context, agent: &Agent) -> Result<String, Fail> {
    let file = ctx.root.join("agent").join(format!("{}.d", agent.name)).join("label");
    let l = read_small(&file).map_err(Fail::Denied)?;
    let l = l.trim_end_matches('\n').to_owned();
    policy::v0::check_subject(&l)
        .map_err(|e| Fail::Denied(format!("{}: invalid label: {e}", file.display())))?;
    Ok(l)
}

/// Exit code for a finished process: its status, or 128 + signal.
pub fn code_of(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

struct Call<'a> {
    ctx: &'a Context,
    agent: &'a Agent,
    name: &'a str,
    args: &'a [OsString],
}

impl Call<'_> {
    fn env(&self, cmd: &mut Command, hit: &Hit, mode: Mode) {
        cmd.env_clear();
        for k in PASSED {
            if let Some(v) = std::env::var_os(k) {
                cmd.env(k, v);
            }
        }
        cmd.env("PATH", "/usr/bin:/bin")
            .env("CTX_TOOL_MODE", if mode == Mode::Native { "native" } else { "cli" })
            .env("CTX_AUTHORIZED_OBJECT", self.ctx.object_name(&hit.path))
            .env("CTX_ROOT", &self.ctx.root)
            .env("CTX_HOME", &self.ctx.home)
            .env("CTX_AGENT", &self.agent.name)
            .env("CTX_SESSION", &self.agent.session)
            .env("CTX_PATH", self.ctx.path_string());
        if let Some(w) = &self.ctx.workspace {
            cmd.env("CTX_WORKSPACE", w);
        }
    }

    /// Checks both policies; `Ok(hit, args)` when the tool may run, `args` whether the agent's
    /// policy has its arguments recorded in full (`record:tool-args write`).
    fn authorize(&self, resolver: &mut Resolver) -> Result<(Hit, bool), (Fail, Option<PathBuf>)> {
        let label = label(self.ctx, self.agent).map_err(|f| (f, None))?;
        let agent_policy = self.ctx.root.join("agent").join(format!("{}.d", self.agent.name)).join("policy");
        let parsed = policy_of(&agent_policy);
        let args = parsed.as_ref().is_ok_and(|p| {
            p.allows(&Query {
                subject: &label,
                class: Class::Record,
                object: "tool-args",
                permission: Permission::Write,
            })
        });
        match parsed.map(|p| executes(&p, &label, self.name)) {
            Ok(true) => {}
            Ok(false) => {
                return Err((
                    Fail::Denied(format!(
                        "refused by the agent policy: {} does not allow {label} tool:{} execute",
                        agent_policy.display(),
                        self.name
                    )),
                    None,
                ));
            }
            Err(e) => return Err((Fail::Denied(format!("refused by the agent policy: {e}")), None)),
        }
        let hit = match resolver.resolve(self.name) {
            Ok((hit, _)) => hit,
            Err(miss) => return Err(self.explain(&label, &miss)),
        };
        let own = hit.controls().join("policy");
        match grants(&own, &label, self.name) {
            Ok(true) => Ok((hit, args)),
            Ok(false) => Err((
                Fail::Denied(format!(
                    "refused by the tool's own policy: {} does not allow {label} tool:{} execute",
                    own.display(),
                    self.name
                )),
                Some(hit.controls()),
            )),
            Err(e) => {
                Err((Fail::Denied(format!("refused by the tool's own policy: {e}")), Some(hit.controls())))
            }
        }
    }

    /// Why a name the agent's policy grants did not resolve.
    fn explain(&self, label: &str, miss: &Miss) -> (Fail, Option<PathBuf>) {
        for dir in &miss.controls_only {
            let ctl = dir.join(format!("{}.d", self.name));
            if let Ok(false) = grants(&ctl.join("policy"), label, self.name) {
                return (
                    Fail::Denied(format!(
                        "refused by the tool's own policy: {} does not allow {label} tool:{} execute",
                        ctl.join("policy").display(),
                        self.name
                    )),
                    Some(ctl),
                );
            }
        }
        (Fail::Failed(format!("not found in CTX_PATH ({})", self.ctx.path_string())), None)
    }

    /// Runs the hooks of one phase in name order. `Err` names the hook that failed.
    fn hooks(&self, hit: &Hit, phase: &str, exit: Option<i32>) -> Result<(), String> {
        let dir = hit.controls().join("hooks").join(phase);
        let Ok(entries) = std::fs::read_dir(&dir) else { return Ok(()) };
        let mut names: Vec<OsString> = entries.flatten().map(|e| e.file_name()).collect();
        names.sort();
        for n in names {
            let path = dir.join(&n);
            if !executable(&path) {
                continue;
            }
            let mut cmd = Command::new(&path);
            self.env(&mut cmd, hit, Mode::Cli);
            cmd.env("CTX_TOOL_NAME", self.name).args(self.args).stdin(Stdio::null());
            if let Some(code) = exit {
                cmd.env("CTX_TOOL_EXIT", code.to_string());
            }
            // Hook output goes to stderr: stdout belongs to the tool.
            cmd.stdout(std::io::stderr());
            let status = cmd.status().map_err(|e| format!("hook {phase}/{}: {e}", n.to_string_lossy()))?;
            if !status.success() {
                return Err(format!(
                    "blocked by hook {phase}/{} (exit {})",
                    n.to_string_lossy(),
                    code_of(status)
                ));
            }
        }
        Ok(())
    }

    /// The command that runs the tool: argv (`argv[0]` the tool's name) and the documented
    /// environment.
    fn command(&self, hit: &Hit, mode: Mode) -> Command {
        let mut cmd = Command::new(&hit.path);
        {
            use std::os::unix::process::CommandExt;
            cmd.arg0(self.name);
        }
        cmd.args(self.args);
        self.env(&mut cmd, hit, mode);
        cmd
    }

    fn spawn(&self, hit: &Hit, mode: Mode) -> Result<i32, Fail> {
        let mut cmd = self.command(hit, mode);
        match mode {
            Mode::Cli => {
                let status =
                    cmd.status().map_err(|e| Fail::Failed(format!("{}: {e}", hit.path.display())))?;
                Ok(code_of(status))
            }
            Mode::Native => native(cmd, self.name),
        }
    }
}

/// Native mode: the JSON input is read from stdin and handed to the tool; its output comes
/// back as frames: `start`, `stdout`/`stderr` chunks, `exit`.
fn native(mut cmd: Command, name: &str) -> Result<i32, Fail> {
    let mut input = Vec::new();
    std::io::stdin()
        .take(NATIVE_INPUT_MAX + 1)
        .read_to_end(&mut input)
        .map_err(|e| Fail::Failed(format!("reading the JSON input: {e}")))?;
    if input.len() as u64 > NATIVE_INPUT_MAX {
        return Err(Fail::Usage("the JSON input is over 1 MiB".into()));
    }
    serde_json::from_slice::<serde_json::Value>(&input)
        .map_err(|e| Fail::Usage(format!("the input is not JSON: {e}")))?;
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| Fail::Failed(format!("{name}: {e}")))?;
    let out = std::sync::Arc::new(std::sync::Mutex::new(std::io::stdout()));
    let frame = |out: &std::sync::Mutex<std::io::Stdout>, v: serde_json::Value| {
        let mut o = out.lock().unwrap_or_else(|p| p.into_inner());
        let _ = writeln!(o, "{v}").and_then(|()| o.flush());
    };
    frame(&out, json!({"type": "start", "tool": name}));
    let mut stdin = child.stdin.take();
    let writer = std::thread::spawn(move || {
        if let Some(s) = stdin.as_mut() {
            let _ = s.write_all(&input);
        }
    });
    let pump = |src: Box<dyn Read + Send>,
                kind: &'static str,
                out: std::sync::Arc<std::sync::Mutex<std::io::Stdout>>| {
        std::thread::spawn(move || {
            let mut src = src;
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                match src.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => frame(&out, json!({"type": kind, "data": String::from_utf8_lossy(&buf[..n])})),
                }
            }
        })
    };
    let mut pumps = Vec::new();
    if let Some(o) = child.stdout.take() {
        pumps.push(pump(Box::new(o), "stdout", std::sync::Arc::clone(&out)));
    }
    if let Some(e) = child.stderr.take() {
        pumps.push(pump(Box::new(e), "stderr", std::sync::Arc::clone(&out)));
    }
    let _ = writer.join();
    for p in pumps {
        let _ = p.join();
    }
    let status = child.wait().map_err(|e| Fail::Failed(format!("{name}: {e}")))?;
    let code = code_of(status);
    frame(&out, json!({"type": "exit", "status": code}));
    Ok(code)
}

/// Appends one line to a log file. On CortexFS the write returns once the line is durable.
fn append(path: &Path, line: &[u8]) -> Result<(), String> {
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    f.write_all(line).map_err(|e| format!("{}: {e}", path.display()))
}

fn record(
    ctx: &Context,
    agent: &Agent,
    object: &str,
    controls: Option<&Path>,
    started: Instant,
    o: &Outcome<'_>,
) -> Result<(), Fail> {
    let mut ev = json!({
        "ts": humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
        "type": "tool.call",
        "agent": agent.name,
        "session": agent.session,
        "object": object,
        "status": o.status,
        "duration_ms": (started.elapsed().as_secs_f64() * 1000.0 * 1000.0).round() / 1000.0,
    });
    if let Some(code) = o.exit {
        ev["exit"] = json!(code);
    }
    if let Some(r) = &o.reason {
        ev["reason"] = json!(r);
    }
    if let Some(id) = o.async_id {
        ev["async"] = json!(id);
    }
    if let Some(args) = &o.args {
        ev["args"] = json!(args);
    }
    append_fact(ctx, controls, &ev)
}

/// Appends the record `ev` to the session's `events.jsonl` and (given `controls`) the tool's
/// `.d/log`; each returns once durable on CortexFS.
pub(crate) fn append_fact(
    ctx: &Context,
    controls: Option<&Path>,
    ev: &serde_json::Value,
) -> Result<(), Fail> {
    let mut line = ev.to_string().into_bytes();
    line.push(b'\n');
    let log = controls.map(|c| c.join("log"));
    let events = ctx.session_dir().map(|d| d.join("events.jsonl"));
    // One after the other: each waits for its own durable commit. Side by side (a thread for
    // one of them) measured no faster through the storage's journal, whose idle batch is
    // flushed by the first append alone (bench/README.md, tsh end to end).
    let b = match &events {
        // The session directory exists once the first call is recorded.
        Some(p) => append(p, &line).or_else(|e| {
            let missing = p.parent().is_some_and(|d| !d.exists());
            match p.parent() {
                Some(d) if missing && std::fs::create_dir_all(d).is_ok() => append(p, &line),
                _ => Err(e),
            }
        }),
        None => Ok(()),
    };
    let a = log.as_ref().map(|p| append(p, &line));
    let mut errors: Vec<String> = Vec::new();
    if let Some(Err(e)) = a {
        errors.push(e);
    }
    if let Err(e) = b {
        errors.push(e);
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(Fail::Failed(format!("the call was not recorded: {}", errors.join("; "))))
    }
}

/// A call that may run: both policies allowed it and its `pre.d` hooks passed.
pub(crate) struct Cleared<'a> {
    call: Call<'a>,
    hit: Hit,
    object: String,
    started: Instant,
    /// The arguments, when the agent's policy has them recorded in full.
    args: Option<Vec<String>>,
}

/// The agent of the terminal context, or why there is none.
pub(crate) fn agent_of<'a>(ctx: &'a Context, name: &str) -> Result<&'a Agent, Fail> {
    ctx.agent.as_ref().ok_or_else(|| {
        Fail::Unavailable(format!(
            "running {name} needs an agent terminal, and {} serves the host view (tools can be listed \
             and described here; start an agent with `ctx agent start`)",
            ctx.root.display()
        ))
    })
}

/// Checks both policies (and, with `hooks`, runs the `pre.d` hooks); a refusal is recorded
/// (`tool.call`, with `async` when given) and returned.
pub(crate) fn clear<'a>(
    ctx: &'a Context,
    resolver: &mut Resolver,
    name: &'a str,
    args: &'a [OsString],
    hooks: bool,
    async_id: Option<&str>,
) -> Result<Cleared<'a>, Fail> {
    let agent = agent_of(ctx, name)?;
    let started = Instant::now();
    let call = Call { ctx, agent, name, args };
    let (hit, args_in_full) = match call.authorize(resolver) {
        Ok(h) => h,
        Err((fail, controls)) => {
            let status = if matches!(fail, Fail::Denied(_)) { "denied" } else { "error" };
            let object = format!("tool/{name}");
            let o =
                Outcome { status, exit: None, reason: Some(fail.message().to_owned()), async_id, args: None };
            record(ctx, agent, &object, controls.as_deref(), started, &o)?;
            return Err(fail);
        }
    };
    let object = ctx.object_name(&hit.path);
    let args = args_in_full.then(|| args.iter().map(|a| a.to_string_lossy().into_owned()).collect());
    if hooks && let Err(why) = call.hooks(&hit, "pre.d", None) {
        let o =
            Outcome { status: "denied", exit: None, reason: Some(why.clone()), async_id, args: args.clone() };
        record(ctx, agent, &object, Some(&hit.controls()), started, &o)?;
        return Err(Fail::Denied(why));
    }
    Ok(Cleared { call, hit, object, started, args })
}

impl Cleared<'_> {
    /// The object name of the tool, as records give it.
    pub(crate) fn object(&self) -> &str {
        &self.object
    }

    /// The tool's control directory.
    pub(crate) fn controls(&self) -> PathBuf {
        self.hit.controls()
    }

    /// The agent's name.
    pub(crate) fn agent_name(&self) -> &str {
        &self.call.agent.name
    }

    /// The session.
    pub(crate) fn session(&self) -> &str {
        &self.call.agent.session
    }

    /// The command that runs the tool: argv (`argv[0]` the tool's name) and the documented
    /// environment.
    pub(crate) fn command(&self, mode: Mode) -> Command {
        self.call.command(&self.hit, mode)
    }

    /// Runs the `post.d` hooks after `result` and records the call (`tool.call`, with `async`
    /// when given): once durable on CortexFS.
    pub(crate) fn conclude(&self, result: &Result<i32, Fail>, async_id: Option<&str>) -> Result<(), Fail> {
        let post = match result {
            Ok(code) => self.call.hooks(&self.hit, "post.d", Some(*code)).err(),
            Err(_) => None,
        };
        let o = match result {
            Ok(code) => Outcome {
                status: if *code == 0 { "ok" } else { "error" },
                exit: Some(*code),
                reason: post.clone(),
                async_id,
                args: self.args.clone(),
            },
            Err(f) => Outcome {
                status: "error",
                exit: None,
                reason: Some(f.message().to_owned()),
                async_id,
                args: self.args.clone(),
            },
        };
        record(self.call.ctx, self.call.agent, &self.object, Some(&self.hit.controls()), self.started, &o)?;
        if let Some(why) = post {
            eprintln!("tsh: {}: post hook: {why}", self.call.name);
        }
        Ok(())
    }
}

/// Runs `name` with `args` in the agent terminal context. Returns the exit code.
pub fn run(
    ctx: &Context,
    resolver: &mut Resolver,
    name: &str,
    args: &[OsString],
    mode: Mode,
) -> Result<i32, Fail> {
    let cleared = clear(ctx, resolver, name, args, true, None)?;
    let result = cleared.call.spawn(&cleared.hit, mode);
    cleared.conclude(&result, None)?;
    result
}
