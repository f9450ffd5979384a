//! Asynchronous tool calls: the spec's submission semantics on the shared queue's primitives.
//!
//! `tsh submit TOOL ARG...` checks the call as a run would (both policies), then submits it:
//! the request is written as a temp file and renamed to `<id>.req.json` (`ringfs::queue`
//! publish) in the session's queue, `async/` beside `events.jsonl`, and a `tool.submit` fact is
//! appended. A worker of its own (tsh, detached in its own process group, the agent's identity
//! and view) claims each pending request with a locked lease, runs the tool exactly as a run
//! would (both policies again, the hooks, the documented environment) with its output
//! captured, and finishes it: the result lands in the outbox, `async/done/` (`async/failed/`
//! when the tool exits non-zero or is refused) as `<id>.req.json.result`, before the request
//! beside it, once the run's `tool.call` fact, with `"async": "<id>"`, is in `events.jsonl`
//! and the tool's log. `tsh collect ID [--wait]` reads the result from the outbox (a result
//! counts once its request is beside it), appends a `tool.collect` fact, and answers with the
//! tool's output and exit status;
//! a worker that died is found by its unlocked lease and its job filed as failed
//! (`Queue::recover`, and `Queue::reconcile` for a claim it never leased). `tsh jobs` lists the
//! session's submissions.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime};

use ringfs::queue::{self, Policy, Queue};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::Fail;
use crate::context::Context;
use crate::resolve::Resolver;
use crate::run::{self, Mode};

/// The session's queue of submissions, beside its `events.jsonl`.
const DIR: &str = "async";
/// Output kept per stream in a result; the rest is counted, not kept.
const KEPT: usize = 1 << 20;
/// The most a request or a result read back may be.
const READ_MAX: u64 = 4 << 20;
/// A worker's lease: it holds a lock on it while it lives, so this only ages the lease of a
/// worker that died.
const LEASE: Duration = Duration::from_secs(2);

#[derive(Debug, Serialize, Deserialize)]
struct Request {
    tool: String,
    args: Vec<String>,
    cwd: Option<String>,
}

fn queue_dir(ctx: &Context) -> Result<PathBuf, Fail> {
    ctx.session_dir()
        .map(|d| d.join(DIR))
        .ok_or_else(|| Fail::Unavailable("submissions need an agent terminal".into()))
}

fn job_of(id: &str) -> Result<String, Fail> {
    let job = format!("{id}.req.json");
    queue::check_job_name(&job).map_err(|e| Fail::Usage(format!("{id}: not a submission id: {e}")))?;
    Ok(job)
}

fn failed(what: &str) -> impl Fn(ringfs::Error) -> Fail + '_ {
    move |e| Fail::Failed(format!("{what}: {e}"))
}

fn now() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

/// `tsh submit TOOL ARG...`: prints the submission's id.
pub fn submit(
    ctx: &Context,
    resolver: &mut Resolver,
    name: &str,
    args: &[OsString],
    out: &mut dyn Write,
) -> Result<i32, Fail> {
    let words: Vec<String> = args
        .iter()
        .map(|a| a.to_str().map(str::to_owned))
        .collect::<Option<_>>()
        .ok_or_else(|| Fail::Usage(format!("submit {name}: arguments must be UTF-8")))?;
    let stamp = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_millis());
    let id = format!("a{stamp}-{}", std::process::id());
    let cleared = run::clear(ctx, resolver, name, args, false, Some(&id))?;
    let dir = queue_dir(ctx)?;
    let q = Queue::open(&dir, LEASE).map_err(failed("opening the session's queue"))?;
    let cwd = std::env::current_dir().ok().map(|p| p.to_string_lossy().into_owned());
    let req = Request { tool: name.to_owned(), args: words, cwd };
    let bytes = serde_json::to_vec(&req).map_err(|e| Fail::Failed(e.to_string()))?;
    q.publish(&job_of(&id)?, &bytes).map_err(failed("submitting"))?;
    let ev = json!({
        "ts": now(), "type": "tool.submit", "agent": cleared.agent_name(), "session": cleared.session(),
        "object": cleared.object(), "async": id,
    });
    run::append_fact(ctx, Some(&cleared.controls()), &ev)?;
    start_worker(&dir)?;
    writeln!(out, "{id}").map_err(|e| Fail::Failed(format!("writing the output: {e}")))?;
    Ok(0)
}

/// Starts a worker: this tsh again, in a process group of its own (a terminal's ^C is not
/// its), with nothing of the terminal; it ends when the queue is empty.
fn start_worker(dir: &std::path::Path) -> Result<(), Fail> {
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe().map_err(|e| Fail::Failed(format!("finding tsh: {e}")))?;
    std::process::Command::new(exe)
        .arg("--async-worker")
        .current_dir(dir)
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map(drop)
        .map_err(|e| Fail::Failed(format!("starting the worker: {e}")))
}

/// Reads up to [`KEPT`] bytes of `src` and counts the rest.
fn keep(mut src: impl Read) -> (Vec<u8>, u64) {
    let mut kept = Vec::new();
    let mut dropped = 0u64;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match src.read(&mut buf) {
            Ok(0) | Err(_) => return (kept, dropped),
            Ok(n) => {
                let room = KEPT.saturating_sub(kept.len()).min(n);
                kept.extend_from_slice(&buf[..room]);
                dropped += (n - room) as u64;
            }
        }
    }
}

/// The worker: claims and runs the session's pending submissions until none is left.
pub fn work(ctx: &Context, resolver: &mut Resolver) -> Result<i32, Fail> {
    let dir = queue_dir(ctx)?;
    let q = Queue::open(&dir, LEASE).map_err(failed("opening the session's queue"))?;
    let worker = format!("tsh-{}", std::process::id());
    while let Some(c) = q.claim(&worker, true).map_err(failed("claiming"))? {
        let id = c.job.trim_end_matches(".req.json").to_owned();
        let req: Result<Request, String> = q
            .request(&c)
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice(&b).map_err(|e| format!("not a submission: {e}")));
        let args: Vec<OsString> =
            req.as_ref().map_or_else(|_| Vec::new(), |r| r.args.iter().map(OsString::from).collect());
        let (result, code, cleared) = match &req {
            Ok(req) => run_one(ctx, resolver, req, &args, &id),
            Err(why) => (json!({"id": id, "status": "error", "reason": why}), None, None),
        };
        // The run's record first, as any run's: a result in the outbox has its fact.
        if let Some((cleared, outcome)) = cleared {
            cleared.conclude(&outcome, Some(&id))?;
        }
        let bytes = serde_json::to_vec(&result).map_err(|e| Fail::Failed(e.to_string()))?;
        q.finish(c, &bytes, code != Some(0)).map_err(failed("finishing"))?;
    }
    Ok(0)
}

type Ran<'a> = (serde_json::Value, Option<i32>, Option<(run::Cleared<'a>, Result<i32, Fail>)>);

/// Runs one submission: the result for the outbox, the exit code, and the call to record.
fn run_one<'a>(
    ctx: &'a Context,
    resolver: &mut Resolver,
    req: &'a Request,
    args: &'a [OsString],
    id: &str,
) -> Ran<'a> {
    let cleared = match run::clear(ctx, resolver, &req.tool, args, true, Some(id)) {
        Ok(c) => c,
        Err(f) => {
            let status = if matches!(f, Fail::Denied(_)) { "denied" } else { "error" };
            let v = json!({"id": id, "tool": req.tool, "status": status, "reason": f.message(), "code": f.code()});
            return (v, Some(f.code()), None);
        }
    };
    let started = Instant::now();
    let mut cmd = cleared.command(Mode::Cli);
    if let Some(cwd) = req.cwd.as_deref().filter(|d| std::path::Path::new(d).is_dir()) {
        cmd.current_dir(cwd);
    }
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let outcome =
        cmd.spawn().map_err(|e| Fail::Failed(format!("{}: {e}", req.tool))).and_then(|mut child| {
            let out = child.stdout.take().map(|o| std::thread::spawn(move || keep(o)));
            let err = child.stderr.take().map(|e| std::thread::spawn(move || keep(e)));
            let o = out.and_then(|t| t.join().ok()).unwrap_or_default();
            let e = err.and_then(|t| t.join().ok()).unwrap_or_default();
            let status = child.wait().map_err(|e| Fail::Failed(format!("{}: {e}", req.tool)))?;
            Ok((run::code_of(status), o, e))
        });
    let ms = (started.elapsed().as_secs_f64() * 1e6).round() / 1e3;
    match outcome {
        Ok((code, (out, out_dropped), (err, err_dropped))) => {
            let v = json!({
                "id": id, "tool": req.tool, "status": if code == 0 { "ok" } else { "error" }, "exit": code,
                "stdout": String::from_utf8_lossy(&out), "stdout_dropped": out_dropped,
                "stderr": String::from_utf8_lossy(&err), "stderr_dropped": err_dropped, "duration_ms": ms,
            });
            (v, Some(code), Some((cleared, Ok(code))))
        }
        Err(f) => {
            let v = json!({"id": id, "tool": req.tool, "status": "error", "reason": f.message()});
            (v, None, Some((cleared, Err(f))))
        }
    }
}

/// Where a submission is.
#[derive(Debug, PartialEq, Eq)]
enum State {
    Pending,
    Running,
    /// Finished: its result, and whether it was filed as failed.
    Finished(Vec<u8>, bool),
    Unknown,
}

fn state(dir: &std::path::Path, job: &str) -> Result<State, Fail> {
    for (sub, failed) in [("done", false), ("failed", true)] {
        // A result counts once its request is beside it.
        if dir.join(sub).join(job).is_file() {
            let p = dir.join(sub).join(format!("{job}.result"));
            let mut bytes = Vec::new();
            std::fs::File::open(&p)
                .and_then(|f| f.take(READ_MAX).read_to_end(&mut bytes))
                .map_err(|e| Fail::Failed(format!("{}: {e}", p.display())))?;
            return Ok(State::Finished(bytes, failed));
        }
    }
    if dir.join("pending").join(job).is_file() {
        return Ok(State::Pending);
    }
    if dir.join("claimed").join(job).is_dir() {
        return Ok(State::Running);
    }
    Ok(State::Unknown)
}

/// `tsh collect ID [--wait] [--json]`: the tool's output and exit status (`--json`: the whole
/// result). 69 while it has not finished (without `--wait`).
pub fn collect(ctx: &Context, id: &str, wait: bool, as_json: bool, out: &mut dyn Write) -> Result<i32, Fail> {
    let job = job_of(id)?;
    let dir = queue_dir(ctx)?;
    if !dir.join("pending").is_dir() {
        return Err(Fail::Failed(format!("{id}: no such submission (this session has none)")));
    }
    let mut pause = Duration::from_millis(10);
    let bytes = loop {
        match state(&dir, &job)? {
            State::Finished(bytes, _) => break bytes,
            State::Unknown => return Err(Fail::Failed(format!("{id}: no such submission"))),
            State::Pending if !wait => {
                return Err(Fail::Unavailable(format!("{id}: submitted, not started yet")));
            }
            State::Running => {
                // A worker that died left its lease unlocked: its job is filed as failed.
                let q = Queue::open(&dir, LEASE).map_err(failed("opening the session's queue"))?;
                q.reconcile(Policy::Fail).map_err(failed("recovering"))?;
                if !wait && state(&dir, &job)? == State::Running {
                    return Err(Fail::Unavailable(format!("{id}: running")));
                }
            }
            State::Pending => {}
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(250));
    };
    let v: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| Fail::Failed(format!("{id}: the result is not JSON: {e}")))?;
    if let Some(agent) = &ctx.agent {
        let mut ev = json!({
            "ts": now(), "type": "tool.collect", "agent": agent.name, "session": agent.session, "async": id,
            "status": v.get("status").cloned().unwrap_or(json!("error")),
        });
        if let Some(tool) = v.get("tool").and_then(|t| t.as_str()) {
            ev["object"] = json!(format!("tool/{tool}"));
        }
        if let Some(code) = v.get("exit") {
            ev["exit"] = code.clone();
        }
        run::append_fact(ctx, None, &ev)?;
    }
    let io = |e: std::io::Error| Fail::Failed(format!("writing the output: {e}"));
    if as_json {
        out.write_all(&bytes).and_then(|()| out.write_all(b"\n")).map_err(io)?;
        return Ok(0);
    }
    let text = |k: &str| v.get(k).and_then(|s| s.as_str()).unwrap_or("").to_owned();
    out.write_all(text("stdout").as_bytes()).map_err(io)?;
    let _ = std::io::stderr().write_all(text("stderr").as_bytes());
    if let Some(code) = v.get("exit").and_then(serde_json::Value::as_i64) {
        return Ok(i32::try_from(code).unwrap_or(1));
    }
    let why = [text("reason"), text("error")].into_iter().find(|w| !w.is_empty()).unwrap_or_default();
    Err(match v.get("status").and_then(|s| s.as_str()) {
        Some("denied") => Fail::Denied(why),
        _ => Fail::Failed(if why.is_empty() { format!("{id}: failed") } else { why }),
    })
}

/// `tsh jobs`: the session's submissions, `ID STATE TOOL`, oldest first.
pub fn jobs(ctx: &Context, out: &mut dyn Write) -> Result<i32, Fail> {
    let dir = queue_dir(ctx)?;
    let io = |e: std::io::Error| Fail::Failed(format!("writing the output: {e}"));
    writeln!(out, "ID\tSTATE\tTOOL").map_err(io)?;
    if !dir.join("pending").is_dir() {
        return Ok(0);
    }
    let l = Queue::open(&dir, LEASE)
        .map_err(failed("opening the session's queue"))?
        .list()
        .map_err(failed("listing"))?;
    let mut rows: Vec<(String, &str, PathBuf)> = Vec::new();
    for (names, st, sub) in [
        (&l.pending, "pending", "pending"),
        (&l.claimed, "running", "claimed"),
        (&l.done, "done", "done"),
        (&l.failed, "failed", "failed"),
    ] {
        for j in names {
            let req = if sub == "claimed" { dir.join(sub).join(j).join(j) } else { dir.join(sub).join(j) };
            rows.push((j.trim_end_matches(".req.json").to_owned(), st, req));
        }
    }
    rows.sort();
    for (id, st, req) in rows {
        let mut bytes = Vec::new();
        let _ = std::fs::File::open(&req).and_then(|f| f.take(READ_MAX).read_to_end(&mut bytes));
        let tool = serde_json::from_slice::<Request>(&bytes).map(|r| r.tool).unwrap_or_else(|_| "?".into());
        writeln!(out, "{id}\t{st}\t{tool}").map_err(io)?;
    }
    Ok(0)
}
