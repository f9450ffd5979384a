//! The run directory, `agent/<agent>/<session>/` in the daemon's runtime directory
//! (`/run/cortexfs/agent/<agent>/<session>/` for the default daemon): `pid` (the supervisor),
//! `log` and `contract.json` (root's, 0600), `stopped_by` (who asked it to stop), `term/` and
//! `receipt/` (the agent's socket directories, bound into the sandbox), and what the
//! supervisor prepares there (`workspace`, `mounts/`, `seccomp.bpf`). Nothing of a run stays
//! there once it has ended: its status, when it ended and the end of its log go to the daemon's
//! bounded record of ended runs ([`ENDED`]), then the directory goes.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use policy::runtime;

use crate::beneath::Tree;

use super::{Contract, Error, Result};

/// Whether `pid` runs: it exists and is not a zombie (a supervisor killed with its parent
/// stays one until whoever inherited it reaps it, which may be never).
pub(crate) fn alive(pid: i32) -> bool {
    let exists =
        rustix::process::Pid::from_raw(pid).is_some_and(|p| rustix::process::test_kill_process(p).is_ok());
    // /proc/PID/stat: "PID (COMM) STATE ...", COMM may hold anything but ends at the last ')'.
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat")) // root's: /proc
        .ok()
        .and_then(|s| s.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next()));
    exists && !matches!(state, Some('Z' | 'X'))
}

/// The pid of the supervisor of the run whose directory is `run`, while it runs.
pub fn supervisor(run: &Path) -> Option<i32> {
    let pid: i32 = Tree::open(run).and_then(|t| t.read_string("pid", 64)).ok()?.trim().parse().ok()?;
    alive(pid).then_some(pid)
}

/// The recorded exit status of a finished agent session of the daemon of `control`, if it
/// has finished (its last run's).
pub fn exit_of(control: &Path, agent: &str, session: &str) -> Option<i32> {
    let run = runtime::run_dir(control, agent, session);
    if supervisor(&run).is_some() {
        return None;
    }
    ended(control, agent, session, None).map(|e| e.exit)
}

/// Removes the directory of an ended run: its `pid` first (it names no supervisor from then
/// on), then, moved out of its name to a hidden one of its own, the rest (the agent's socket
/// directories beneath it, never through a link or across a mount). The agent's directory
/// stays (one per agent, not per run): removing it could race another session's start.
pub fn retire(run: &Path) {
    let _ = std::fs::remove_file(run.join("pid")); // root's: the run directory
    let (Some(parent), Some(name)) = (run.parent(), run.file_name()) else { return };
    let gone = parent.join(format!(".{}.ended.{}", name.to_string_lossy(), std::process::id()));
    let moved = std::fs::rename(run, &gone).is_ok(); // root's: the daemon's runtime directory
    let target = if moved { gone } else { run.to_path_buf() };
    if let Err(e) = remove(&target) {
        eprintln!("{e}");
    }
}

/// The daemon's record of ended runs, in its runtime directory (root's, 0600): a JSON line per
/// run ([`Ended`]), appended by its supervisor as it ends. Past [`ENDED_MAX`] bytes it goes to
/// `ended.jsonl.1` (the one before is dropped), so what ended runs leave in the runtime
/// directory is bounded however many there were.
pub const ENDED: &str = "ended.jsonl";
/// The size at which [`ENDED`] is turned over.
pub const ENDED_MAX: u64 = 1 << 20;
/// How much of the end of a supervisor's log its [`Ended`] line keeps.
const LOG_KEPT: u64 = 2048;

/// A run that ended, as the daemon's record of ended runs holds it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Ended {
    /// The agent.
    pub agent: String,
    /// The session.
    pub session: String,
    /// Its supervisor's pid.
    pub pid: i32,
    /// The status it ended with.
    pub exit: i32,
    /// When it ended, seconds since the epoch.
    pub ended: i64,
    /// The end of its supervisor's log (what it said; never the command line).
    pub log: String,
}

/// Records the end of the run of `c` (supervisor `pid`, status `code`) in the daemon's record
/// of ended runs, with the end of its log.
pub fn record_end(c: &Contract, pid: i32, code: i32) -> Result<()> {
    let dir = runtime::daemon_dir(&c.control);
    let path = dir.join(ENDED);
    let log = Tree::open(&c.runtime)
        .and_then(|t| t.tail("log", LOG_KEPT))
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    let ended = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let e = Ended {
        agent: c.agent.clone(),
        session: c.session.clone(),
        pid,
        exit: code,
        ended: i64::try_from(ended).unwrap_or(i64::MAX),
        log,
    };
    let mut line = serde_json::to_vec(&e).map_err(|e| Error::Supervise(e.to_string()))?;
    line.push(b'\n');
    let open = || {
        use std::os::unix::fs::OpenOptionsExt;
        // root's: the daemon's runtime directory
        std::fs::OpenOptions::new().append(true).create(true).mode(0o600).open(&path).map_err(at(&path))
    };
    // One appender at a time, on the file that is at the name once locked (another may have
    // turned it over while this one waited), so that the turn-over loses no line.
    use std::os::unix::fs::MetadataExt;
    let mut tries = 0;
    let mut f = loop {
        let f = open()?;
        rustix::fs::flock(&f, rustix::fs::FlockOperation::LockExclusive).map_err(|e| at(&path)(e.into()))?;
        let current = std::fs::metadata(&path).map(|m| m.ino()).ok(); // root's: the daemon's runtime directory
        tries += 1;
        if current == f.metadata().map(|m| m.ino()).ok() || tries > 16 {
            break f;
        }
    };
    if f.metadata().map_or(0, |m| m.len()) >= ENDED_MAX {
        let mut old = path.clone().into_os_string();
        old.push(".1");
        std::fs::rename(&path, &old).map_err(at(&path))?; // root's: the daemon's runtime directory
        // The new file is taken locked too: an appender that waited on the old one looks again.
        let new = open()?;
        rustix::fs::flock(&new, rustix::fs::FlockOperation::LockExclusive)
            .map_err(|e| at(&path)(e.into()))?;
        f = new;
    }
    f.write_all(&line).map_err(at(&path))
}

/// The ended runs the daemon of `control` records, oldest first.
fn ended_runs(control: &Path) -> Vec<Ended> {
    let dir = runtime::daemon_dir(control);
    let mut out = Vec::new();
    for name in [format!("{ENDED}.1"), ENDED.to_owned()] {
        // root's: the daemon's runtime directory
        let Ok(text) = Tree::open(dir).and_then(|t| t.read_string(&name, 2 * ENDED_MAX)) else { continue };
        out.extend(text.lines().filter_map(|l| serde_json::from_str::<Ended>(l).ok()));
    }
    out
}

/// The last recorded end of `agent` `session` of the daemon of `control` (of the run whose
/// supervisor was `pid`, when given).
pub fn ended(control: &Path, agent: &str, session: &str, pid: Option<i32>) -> Option<Ended> {
    ended_runs(control)
        .into_iter()
        .rev()
        .find(|e| e.agent == agent && e.session == session && pid.is_none_or(|p| p == e.pid))
}

fn at(path: &Path) -> impl Fn(std::io::Error) -> Error + '_ {
    move |source| Error::RunDir { path: path.to_path_buf(), source }
}

/// Makes the run directory of `c` afresh: its socket directories are the agent's (0700), and
/// the directories above them can be passed through but not listed (0711). Refused while the
/// run is under way.
/// How long each step of a start took, kept in the run's directory (`timings`): one `STEP
/// MICROSECONDS` line per step, the launcher's then the supervisor's (its own clock from its
/// start), for `agent_start`'s breakdown and for an operator asking why a start was slow.
#[derive(Debug)]
pub struct Timings {
    at: Instant,
    lines: String,
}

impl Default for Timings {
    fn default() -> Timings {
        Timings { at: Instant::now(), lines: String::new() }
    }
}

impl Timings {
    /// The step `name` ended now.
    pub fn step(&mut self, name: &str) {
        let now = Instant::now();
        self.lines.push_str(&format!("{name} {}\n", now.duration_since(self.at).as_micros()));
        self.at = now;
    }

    /// Adds the steps so far to the run directory's `timings`.
    pub fn keep(&mut self, runtime: &Path) {
        let lines = std::mem::take(&mut self.lines);
        let flags = rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::APPEND | rustix::fs::OFlags::CREATE;
        if let Ok(mut f) = Tree::open(runtime).and_then(|t| t.file(TIMINGS, flags, 0o600)) {
            let _ = f.write_all(lines.as_bytes());
        }
    }
}

/// The file of a run's directory that holds its start's [`Timings`].
pub const TIMINGS: &str = "timings";

pub fn prepare(c: &Contract) -> Result<()> {
    if let Some(pid) = supervisor(&c.runtime) {
        return Err(Error::State(format!("agent {} session {} is running (pid {pid})", c.agent, c.session)));
    }
    // A run whose supervisor was killed (kill -9) left its mounts (the idmapped workspace)
    // behind: they go before its directory does, or it cannot.
    unmount_below(&c.runtime);
    remove(&c.runtime)?;
    let agents = (Some(rustix::fs::Uid::from_raw(c.uid)), Some(rustix::fs::Gid::from_raw(c.gid)));
    // From the daemon's runtime directory (its control socket's, root's and writable by no one
    // else) down, each level is root's: made (0711: passed through, not listed) beneath the
    // one above it; the socket directories below it are the agent's (0700).
    let base = runtime::daemon_dir(&c.control);
    let rel = c.runtime.strip_prefix(base).map_err(|_| {
        Error::Internal(format!("{}: not below the daemon's {}", c.runtime.display(), base.display()))
    })?;
    let mut t = Tree::open(base).map_err(at(&c.runtime))?;
    let st = t.stat("").map_err(at(base))?;
    if st.st_uid != 0 || st.st_mode & 0o022 != 0 {
        return Err(Error::State(format!(
            "{}: the daemon's runtime directory must be root's and writable by no one else",
            base.display()
        )));
    }
    for part in rel.components() {
        t = t.make_dirs(part, 0o711).map_err(at(&c.runtime))?;
        t.chmod(0o711).map_err(at(&c.runtime))?;
    }
    for dir in ["term", "receipt"] {
        let d = t.make_dirs(dir, 0o700).map_err(at(&c.runtime))?;
        rustix::fs::fchown(&d, agents.0, agents.1).map_err(|e| at(&c.runtime)(e.into()))?;
        d.chmod(0o700).map_err(at(&c.runtime))?;
    }
    Ok(())
}

/// Removes the run directory `run` and what is below it (the agent's socket directories too),
/// never through a link and never across a mount: a mount still there stops the removal with
/// `EXDEV`, and what it shows is not touched.
pub fn remove(run: &Path) -> Result<()> {
    let (Some(parent), Some(name)) = (run.parent(), run.file_name()) else { return Ok(()) };
    match crate::beneath::Tree::open(parent) {
        Ok(p) => p.remove_all(name).map_err(at(run)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(at(run)(e)),
    }
}

/// Detaches every mount at or below `dir`, deepest first (`/proc/self/mountinfo`).
pub fn unmount_below(dir: &Path) {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else { return }; // root's: /proc
    let mut points: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        // mountinfo escapes space, tab, newline and backslash as octal.
        .map(|p| {
            PathBuf::from(
                p.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\"),
            )
        })
        .filter(|p| p.starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for p in points {
        let _ = rustix::mount::unmount(&p, rustix::mount::UnmountFlags::DETACH);
    }
}

/// Creates (or truncates) a file of the run directory that only root reads (0600).
pub fn private(path: &Path) -> Result<std::fs::File> {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(at(path)(std::io::ErrorKind::InvalidInput.into()));
    };
    Tree::open(dir).and_then(|t| t.write(name, b"", 0o600)).map_err(at(path))
}

/// Writes the contract of the run to `contract.json`; returns its path.
pub fn write_contract(c: &Contract) -> Result<PathBuf> {
    let path = c.runtime.join("contract.json");
    let bytes = serde_json::to_vec_pretty(c).map_err(|e| Error::Internal(format!("contract: {e}")))?;
    private(&path)?.write_all(&bytes).map_err(at(&path))?;
    Ok(path)
}

/// Reads a contract back.
pub fn read_contract(path: &Path) -> Result<Contract> {
    let bytes = std::fs::read(path).map_err(at(path))?; // root's: the run directory
    serde_json::from_slice(&bytes).map_err(|e| Error::Supervise(format!("{}: {e}", path.display())))
}

/// Records the supervisor's pid.
pub fn write_pid(c: &Contract, pid: u32) -> Result<()> {
    let p = c.runtime.join("pid");
    Tree::open(&c.runtime)
        .and_then(|t| t.write("pid", pid.to_string().as_bytes(), 0o600))
        .map(drop)
        .map_err(at(&p))
}

/// The runs of the daemon of `control` under way: (agent, session, supervisor pid), sorted.
pub fn running(control: &Path) -> Vec<(String, String, i32)> {
    runs(control).into_iter().filter_map(|r| Some((r.agent, r.session, r.pid?))).collect()
}

/// The file of a run's directory that says who asked it to stop (read by its supervisor for
/// the session's `run.end` event).
pub const STOPPED_BY: &str = "stopped_by";

/// One run of a daemon, running or ended, as `ctx agent ps --all` lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunInfo {
    /// The agent.
    pub agent: String,
    /// The session.
    pub session: String,
    /// Its supervisor's pid while it runs.
    pub pid: Option<i32>,
    /// The status it ended with, once ended.
    pub exit: Option<i32>,
    /// When its directory last changed (started, or ended), seconds since the epoch.
    pub since: Option<i64>,
    /// The profile it was started with, while it runs.
    pub profile: Option<String>,
    /// The model its CLI is pointed at, while it runs.
    pub model: Option<String>,
    /// What its groups say it uses, while it runs.
    pub usage: Option<super::cgroups::Usage>,
    /// The tool calls it made, while it runs: its session's `tool.call` events since it started
    /// (counted in the last [`ACTIVITY_TAIL`] bytes of `events.jsonl`).
    pub tool_calls: Option<u64>,
    /// Its session's last event, while it runs: its type and time (seconds since the epoch).
    pub last_event: Option<(String, i64)>,
}

/// How much of a session's `events.jsonl` `ctx agent ps` reads (its end).
pub const ACTIVITY_TAIL: u64 = 1 << 20;

/// What was read of each running session's `events.jsonl` ([`runs_watched`]): a watcher that
/// asks again reads only what was appended since.
#[derive(Debug, Default)]
pub struct Activity {
    seen: std::collections::HashMap<std::path::PathBuf, Seen>,
    touched: std::collections::HashSet<std::path::PathBuf>,
}

#[derive(Debug, Clone)]
struct Seen {
    /// The run's start it counts from, and how much of the file it has read.
    since: Option<i64>,
    len: u64,
    calls: u64,
    last: Option<(String, i64)>,
}

/// A running run's tool calls since `since` and its last event, from the end of its session's
/// `events.jsonl`, read through the host's `/ctx` beneath the session directory; with `known`,
/// only what was appended since it was last read.
fn activity(c: &Contract, since: Option<i64>, known: &mut Activity) -> (Option<u64>, Option<(String, i64)>) {
    use std::os::unix::fs::FileExt;
    let dir = c.session_dir(&c.ctx);
    let Ok(file) = Tree::open(&dir).and_then(|t| t.open_regular("events.jsonl", rustix::fs::OFlags::RDONLY))
    else {
        return (None, None);
    };
    // Read up to the length seen now; what is appended meanwhile waits for the next look.
    let Ok(len) = file.metadata().map(|m| m.len()) else { return (None, None) };
    let read_at = |from: u64| {
        let mut b = vec![0u8; (len - from) as usize];
        file.read_exact_at(&mut b, from).map(|()| b)
    };
    let before = known.seen.get(&dir).filter(|s| s.since == since && s.len <= len).cloned();
    let seen = match before {
        Some(s) if s.len == len => s,
        // Appended since: read the new lines only (whole ones; a line being written waits).
        Some(s) if len - s.len <= ACTIVITY_TAIL => {
            let Ok(mut more) = read_at(s.len) else { return (None, None) };
            let whole = more.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
            more.truncate(whole);
            let (mut calls, mut last) = (s.calls, s.last);
            fold(more.split(|&b| b == b'\n').filter(|l| !l.is_empty()), since, &mut calls, &mut last);
            Seen { since, len: s.len + whole as u64, calls, last }
        }
        _ => {
            let start = len.saturating_sub(ACTIVITY_TAIL);
            let Ok(events) = read_at(start) else { return (None, None) };
            let cut = start > 0;
            let whole = events.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
            let mut lines = events[..whole].split(|&b| b == b'\n').filter(|l| !l.is_empty());
            if cut {
                // The first line of a tail that starts mid-file is a piece of one.
                lines.next();
            }
            let (mut calls, mut last) = (0u64, None);
            fold(lines, since, &mut calls, &mut last);
            Seen { since, len: start + whole as u64, calls, last }
        }
    };
    let out = (Some(seen.calls), seen.last.clone());
    known.touched.insert(dir.clone());
    known.seen.insert(dir, seen);
    out
}

/// Counts the tool calls among `lines` since `since` and keeps the last event.
fn fold<'a>(
    lines: impl Iterator<Item = &'a [u8]>,
    since: Option<i64>,
    calls: &mut u64,
    last: &mut Option<(String, i64)>,
) {
    for l in lines {
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(l) else { continue };
        let at = v["ts"]
            .as_str()
            .and_then(|t| humantime::parse_rfc3339_weak(t).ok())
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .and_then(|d| i64::try_from(d.as_secs()).ok());
        let kind = v["type"].as_str().unwrap_or("?").to_owned();
        if kind == "tool.call" && at.zip(since).is_some_and(|(a, s)| a >= s) {
            *calls += 1;
        }
        if let Some(at) = at {
            *last = Some((kind, at));
        }
    }
}

impl RunInfo {
    fn ended(e: Ended) -> RunInfo {
        RunInfo {
            agent: e.agent,
            session: e.session,
            pid: None,
            exit: Some(e.exit),
            since: Some(e.ended),
            profile: None,
            model: None,
            usage: None,
            tool_calls: None,
            last_event: None,
        }
    }
}

/// Every run the daemon of `control` knows of: those under way and those ended (each session's
/// last, from the record of ended runs), sorted by agent and session.
pub fn runs(control: &Path) -> Vec<RunInfo> {
    runs_watched(control, &mut Activity::default())
}

/// [`runs`], for a watcher that asks again and again (`ctx top`): each session's events are
/// read from where `known` left them.
pub fn runs_watched(control: &Path, known: &mut Activity) -> Vec<RunInfo> {
    let mut out = Vec::new();
    let root = runtime::runs_root(control);
    // The ended ones, each session's last: from the daemon's record of ended runs.
    let mut last: std::collections::BTreeMap<(String, String), Ended> = std::collections::BTreeMap::new();
    for e in ended_runs(control) {
        last.insert((e.agent.clone(), e.session.clone()), e);
    }
    let Ok(tree) = Tree::open(&root) else {
        out.extend(last.into_values().map(RunInfo::ended));
        return out;
    };
    for a in tree.names(usize::MAX).unwrap_or_default() {
        let Ok(agent) = tree.sub(&a) else { continue };
        for s in agent.names(usize::MAX).unwrap_or_default() {
            let dir = root.join(&a).join(&s);
            let Some(pid) = supervisor(&dir) else { continue };
            let pid = Some(pid);
            let exit = None;
            last.remove(&(a.to_string_lossy().into_owned(), s.to_string_lossy().into_owned()));
            let since = agent.stat(&s).ok().map(|st| st.st_mtime);
            let (agent_name, session) = (a.to_string_lossy().into_owned(), s.to_string_lossy().into_owned());
            // What runs: its contract (root's), its groups, its session's events.
            let contract = pid.and_then(|_| read_contract(&dir.join("contract.json")).ok());
            let usage = pid.map(|_| super::cgroups::usage(&format!("{agent_name}.{session}")));
            let (tool_calls, last_event) =
                contract.as_ref().map_or((None, None), |c| activity(c, since, known));
            out.push(RunInfo {
                tool_calls,
                last_event,
                profile: contract.as_ref().and_then(|c| c.profile.as_ref().map(|p| p.0.clone())),
                model: contract.and_then(|c| c.model),
                agent: agent_name,
                session,
                pid,
                exit,
                since,
                usage,
            });
        }
    }
    out.extend(last.into_values().map(RunInfo::ended));
    // Sessions no run read this time are forgotten.
    let touched = std::mem::take(&mut known.touched);
    known.seen.retain(|p, _| touched.contains(p));
    out.sort_by(|x, y| (&x.agent, &x.session).cmp(&(&y.agent, &y.session)));
    out
}

/// Stops a run: SIGTERM to its supervisor, which stops the sandbox (grace, then SIGKILL) and
/// records its status, with `by` as who stopped it; returns that status once the supervisor has
/// ended.
pub fn stop(control: &Path, agent: &str, session: &str, by: &str) -> Result<String> {
    let run = runtime::run_dir(control, agent, session);
    let Some(pid) = supervisor(&run) else {
        return Err(Error::State(format!("agent {agent} session {session} is not running")));
    };
    if let Ok(t) = Tree::open(&run) {
        let _ = t.write(STOPPED_BY, by.as_bytes(), 0o600);
    }
    let grace = read_contract(&run.join("contract.json")).map_or(5, |c| c.grace);
    let Some(p) = rustix::process::Pid::from_raw(pid) else {
        return Err(Error::State(format!("agent {agent} session {session}: bad pid {pid}")));
    };
    // Its end is waited for on a pidfd (opened before the signal, so a reused pid cannot fool it).
    let fd = rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty());
    let _ = rustix::process::kill_process(p, rustix::process::Signal::TERM);
    let limit = Duration::from_secs(grace + 5);
    let t = Instant::now();
    match fd {
        Ok(fd) => loop {
            let left = limit.saturating_sub(t.elapsed());
            let timeout = rustix::event::Timespec::try_from(left)
                .unwrap_or(rustix::event::Timespec { tv_sec: 1, tv_nsec: 0 });
            let mut fds = [rustix::event::PollFd::new(&fd, rustix::event::PollFlags::IN)];
            match rustix::event::poll(&mut fds, Some(&timeout)) {
                Ok(n) if n > 0 => break,
                Ok(_) => return Err(Error::State(format!("the supervisor (pid {pid}) did not stop"))),
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(Error::Supervise(format!("poll: {e}"))),
            }
        },
        // A kernel without pidfds: look again until it is gone.
        Err(_) => {
            while alive(pid) {
                if t.elapsed() > limit {
                    return Err(Error::State(format!("the supervisor (pid {pid}) did not stop")));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
    Ok(ended(control, agent, session, Some(pid)).map(|e| e.exit.to_string()).unwrap_or_default())
}
