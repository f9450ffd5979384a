//! Starting a run and supervising it.
//!
//! [`start`] derives the contract, prepares the run directory, the session and the view, and
//! starts the supervisor (`ctxterm supervise CONTRACT`, in a process group of its own); it
//! returns once the terminal answers. [`supervise`] serves the run's receipt socket,
//! starts the sandbox inside its cgroups and waits on the sandbox's pidfd and a signal pipe,
//! with a housekeeping tick once a second (owned children that ended, whether the view still
//! answers, the run's timeout). A stop (signal, timeout, lost view) is SIGTERM, the grace
//! period, then SIGKILL. At the end it records the status in the session and the run
//! directory and releases everything the run held.

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use policy::runtime::ControlRequest;
use serde_json::json;

use super::receipt::{self, Children, Run};
use super::rundir::Timings;
use super::{Contract, Error, Result, Start, cgroups, contract, rundir, sandbox, session, view};
use crate::beneath::Tree;

/// The supervisor of a run: `ctxterm supervise CONTRACT`, the `ctxterm` beside the running
/// program (`ctx`, or the supervisor of a parent run starting a child).
fn supervisor_program() -> Result<std::path::PathBuf> {
    let me = std::env::current_exe()?;
    let p = me.with_file_name("ctxterm");
    // root's: beside this program
    if !p.is_file() {
        return Err(Error::Unavailable(format!(
            "{} is missing: the supervisor of a run is ctxterm, installed beside {}",
            p.display(),
            me.display()
        )));
    }
    Ok(p)
}

/// The exit code of a process status: its code, or 128 + the signal that ended it.
pub fn code_of(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

/// Prepares the run of `s` and starts its supervisor; returns the contract and the supervisor.
/// A start that fails removes what it made: the view, and the run's directory (unless another
/// start of the session got its supervisor going meanwhile).
fn spawn(s: &Start, t: &mut Timings) -> Result<(Contract, std::process::Child)> {
    spawn_run(s, t)
        .inspect_err(|e| refused(&s.ctx, &s.agent, &s.session, &e.to_string(), i32::from(e.code())))
}

fn spawn_run(s: &Start, t: &mut Timings) -> Result<(Contract, std::process::Child)> {
    let c = contract::derive(s)?;
    t.step("contract");
    rundir::prepare(&c)?;
    t.step("rundir");
    let mut view_made = false;
    match launch(s, &c, &mut view_made, t) {
        Ok(child) => Ok((c, child)),
        Err(e) => {
            if view_made {
                view::remove(&c.control, &c.view);
            }
            if rundir::supervisor(&c.runtime).is_none() {
                rundir::unmount_below(&c.runtime);
                if let Err(r) = rundir::remove(&c.runtime) {
                    eprintln!("ctx: agent {} session {}: {r}", c.agent, c.session);
                }
            }
            Err(e)
        }
    }
}

/// The part of [`spawn`] after the run's directory is made: the session, the home, the view
/// (`view_made` set once it exists), the contract, the supervisor.
fn launch(s: &Start, c: &Contract, view_made: &mut bool, t: &mut Timings) -> Result<std::process::Child> {
    // The session, in the agent's home, owned by the agent.
    let cwd = if c.workspace.is_some() { "/workspace" } else { "/" };
    session::prepare(
        &s.ctx,
        &c.session_dir(&s.ctx),
        c.uid,
        c.gid,
        c.space.is_some(),
        cwd,
        &c.runtime.join("term/main.sock"),
    )?;
    t.step("session");
    // The agent's persistent home, with what its profile keeps there.
    if c.home.is_some() {
        let h = session::prepare_home(&s.ctx, c.uid, c.gid, &c.agent)?;
        prepare_profile(&h, c).map_err(|source| Error::Session { path: h.clone(), source })?;
        t.step("home");
    }
    for w in &c.warnings {
        eprintln!("ctx: warning: agent {}: {w}", c.agent);
        let dir = c.session_dir(&s.ctx);
        let event = json!({"ts": session::timestamp(), "type": "run.warning", "agent": c.agent,
            "session": c.session, "reason": w});
        session::append_event(&dir, &event)
            .map_err(|source| Error::Session { path: dir.join("events.jsonl"), source })?;
    }
    // No supervisor runs this session (rundir::prepare saw to it): a view still at its path is
    // a killed run's, and goes (a start that finds nothing there asks the daemon nothing).
    // root's: the daemon's view directory, which no sandbox binds
    if std::fs::symlink_metadata(&c.view).is_ok() {
        view::remove(&c.control, &c.view);
    }
    view::call(
        &c.control,
        &ControlRequest::Create {
            agent: c.agent.clone(),
            session: c.session.clone(),
            path: Some(c.view.display().to_string()),
            session_of: c.session_of.clone(),
            // What the run's tools may touch comes from here, never from the agent's environment.
            workspace: c.workspace.as_ref().map(|_| "/workspace".to_owned()),
            records_only: c.records_only,
            space: c.space.clone(),
        },
    )?;
    *view_made = true;
    t.step("view");
    // A command of its own gets a writable /ctx only once the view is seen to be one: a
    // read-write CortexFS FUSE mount whose daemon says so, for this run.
    if !c.records_only
        && let Err(why) = view::writable(&c.view, &c.agent, &c.session)
    {
        return Err(Error::Unavailable(format!("the view at {}: {why}", c.view.display())));
    }
    t.step("view-check");
    // Run state is root's: the contract names the command line, which other users have no
    // business reading; it goes when the run ends.
    let contract_file = rundir::write_contract(c)?;
    let log_path = c.runtime.join("log");
    let log = rundir::private(&log_path)?;
    let err = log.try_clone().map_err(|source| Error::RunDir { path: log_path.clone(), source })?;
    let mut sup = Command::new(supervisor_program()?);
    sup.arg("supervise").arg(&contract_file).process_group(0);
    // A stop asked before the supervisor is on record (its pid, written here and by itself)
    // and takes signals waits for it: a launcher terminated now leaves no run nobody can stop.
    crate::sys::hold_stop_signals(&mut sup);
    // A headless run's command writes to the caller's streams: the supervisor gets them and
    // keeps its own log on the side.
    if !c.headless {
        sup.stdin(Stdio::null()).stdout(log).stderr(err);
    }
    // The key goes to the supervisor through a pipe of its own, never its arguments or
    // environment (from which the route's variables are removed).
    let key_pipe = match &c.key {
        Some(k) => Some(key_pipe(&k.value)?),
        None => None,
    };
    if let Some(r) = &key_pipe {
        sup.arg("--key-fd").arg(std::os::fd::AsRawFd::as_raw_fd(r).to_string());
    }
    for v in KEY_VARIABLES.iter().copied().chain(c.key.iter().flat_map(|k| k.vars.iter().map(String::as_str)))
    {
        sup.env_remove(v);
    }
    let mut child = sup.spawn().map_err(|e| Error::Supervise(format!("starting the supervisor: {e}")))?;
    t.step("supervisor-spawn");
    drop(key_pipe);
    if let Err(e) = rundir::write_pid(c, child.id()) {
        // A supervisor that ran its whole run already took its directory with it.
        if matches!(child.try_wait(), Ok(Some(_))) {
            return Ok(child);
        }
        let _ = child.kill();
        let _ = child.wait();
        return Err(e);
    }
    Ok(child)
}

/// Makes the directories and writes the files `c`'s profile keeps in the agent's home `h`.
/// The home is the agent's to change: nothing here follows a symlink (the home is opened
/// without following any, each directory below it by name without following it), files are
/// made new and renamed over whatever is at their name, and everything is the agent's.
fn prepare_profile(h: &Path, c: &Contract) -> std::io::Result<()> {
    use rustix::fs::OFlags;
    let own = |f: &std::fs::File| {
        rustix::fs::fchown(f, Some(rustix::fs::Uid::from_raw(c.uid)), Some(rustix::fs::Gid::from_raw(c.gid)))
    };
    let home = Tree::open(h)?;
    let dir_of = |rel: &str| -> std::io::Result<Tree> {
        let mut t = home.sub(".")?;
        for part in rel.split('/').filter(|p| !p.is_empty()) {
            t = t.make_dirs(part, 0o700)?;
            t.chown(c.uid, c.gid)?;
        }
        Ok(t)
    };
    let made = OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY;
    for d in &c.home_dirs {
        dir_of(d)?;
    }
    for (rel, text) in &c.home_seed {
        let (dir, name) = rel.rsplit_once('/').unwrap_or(("", rel.as_str()));
        match dir_of(dir)?.file(name, made, 0o600) {
            Ok(mut f) => {
                own(&f)?;
                f.write_all(text.as_bytes())?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    for (rel, text) in &c.home_files {
        let (dir, name) = rel.rsplit_once('/').unwrap_or(("", rel.as_str()));
        let t = dir_of(dir)?;
        let tmp = format!(".{name}.cortexfs.{}", std::process::id());
        let _ = t.remove(&tmp);
        let mut f = t.file(&tmp, made, 0o600)?;
        own(&f)?;
        f.write_all(text.as_bytes())?;
        t.rename(&tmp, name)?;
    }
    Ok(())
}

/// Serves the run `c` its egress proxy to the model at `url`, splices the proxy's port into
/// the sandbox and points the CLI at it; each refused request is a `net.refused` event.
fn proxy(c: &mut Contract, url: &str) -> Result<()> {
    let url = policy::model::Url::parse(url).map_err(Error::Invalid)?;
    let report = ModelReport {
        session: c.session_dir(&c.ctx),
        model: c.model.as_ref().map(|m| c.ctx.join("model").join(format!("{m}.d"))),
        agent: c.agent.clone(),
        name: c.session.clone(),
    };
    let port = super::egress::serve(super::egress::Allowed { url }, super::egress::Limits::default(), report)
        .map_err(|e| Error::Supervise(format!("the egress proxy: {e}")))?;
    c.egress = Some(port);
    let at = format!("http://127.0.0.1:{port}");
    for k in ["HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"] {
        c.env.push((k.to_owned(), at.clone()));
    }
    c.env.push(("NO_PROXY".to_owned(), "localhost,127.0.0.1,::1".to_owned()));
    c.env.push(("no_proxy".to_owned(), "localhost,127.0.0.1,::1".to_owned()));
    Ok(())
}

/// Where a run's egress proxy reports: refusals to the session (`net.refused`) and to the
/// model's log, each use of the model's route to the model's log (`model.use`), so that
/// `tail -f /ctx/model/<p>/<m>.d/log` follows every run's use of it.
struct ModelReport {
    session: std::path::PathBuf,
    /// The model's control directory, through /ctx (`model/<p>/<m>.d`).
    model: Option<std::path::PathBuf>,
    agent: String,
    name: String,
}

impl ModelReport {
    fn to_model(&self, event: &serde_json::Value) {
        if let Some(d) = &self.model {
            let _ = session::append_line(d, "log", event);
        }
    }
}

impl super::egress::Report for ModelReport {
    fn refused(&self, what: &str) {
        let event = json!({"ts": session::timestamp(), "type": "net.refused", "agent": self.agent,
            "session": self.name, "request": what,
            "reason": "the run reaches its model alone (no network:default connect)"});
        let _ = session::append_event(&self.session, &event);
        self.to_model(&event);
    }

    fn used(&self, u: &super::egress::Use) {
        self.to_model(&json!({"ts": session::timestamp(), "type": "model.use", "agent": self.agent,
            "session": self.name, "request": u.request, "status": u.status, "bytes_up": u.up,
            "bytes_down": u.down, "duration_ms": (u.duration.as_secs_f64() * 1e6).round() / 1e3}));
    }
}

/// Variables that conventionally hold model keys: never passed to a supervisor.
const KEY_VARIABLES: [&str; 2] = ["OPENAI_API_KEY", "ANTHROPIC_API_KEY"];

/// A pipe holding `key`, its read end inheritable (the supervisor reads it to its end).
fn key_pipe(key: &[u8]) -> Result<std::os::fd::OwnedFd> {
    let fail = |e: rustix::io::Errno| Error::Supervise(format!("the key's pipe: {e}"));
    let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(fail)?;
    if key.len() > 64 * 1024 {
        return Err(Error::Invalid("a model key is at most 64 KiB".into()));
    }
    std::fs::File::from(w).write_all(key).map_err(|e| Error::Supervise(format!("the key's pipe: {e}")))?;
    rustix::io::fcntl_setfd(&r, rustix::io::FdFlags::empty()).map_err(fail)?;
    Ok(r)
}

/// Makes the FIFO the sandbox takes the key from (the agent's, mode 0600) and writes the key
/// into it once, when the sandbox opens it; the FIFO goes once read.
fn serve_key(c: &Contract, key: Vec<u8>) -> Result<()> {
    let fifo = sandbox::key_fifo(c);
    let _ = std::fs::remove_file(&fifo); // root's: the run directory
    let shown = fifo.display().to_string();
    let fail = |e: std::io::Error| Error::Supervise(format!("{shown}: {e}"));
    // root's: the run directory
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &fifo,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .map_err(|e| fail(e.into()))?;
    // root's: the run directory
    rustix::fs::chownat(
        rustix::fs::CWD,
        &fifo,
        Some(rustix::fs::Uid::from_raw(c.uid)),
        Some(rustix::fs::Gid::from_raw(c.gid)),
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )
    .map_err(|e| fail(e.into()))?;
    std::thread::Builder::new()
        .name("key".into())
        .spawn(move || {
            // The FIFO is opened by name only as one: nothing in its place is written to.
            let (Some(dir), Some(name)) = (fifo.parent(), fifo.file_name()) else { return };
            let Ok(dir) = Tree::open(dir) else { return };
            let opened = rustix::fs::openat2(
                &dir,
                name,
                rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
                rustix::fs::ResolveFlags::BENEATH
                    | rustix::fs::ResolveFlags::NO_SYMLINKS
                    | rustix::fs::ResolveFlags::NO_MAGICLINKS
                    | rustix::fs::ResolveFlags::NO_XDEV,
            );
            if let Ok(fd) = opened {
                let _ = dir.remove(name);
                if rustix::fs::fstat(&fd)
                    .is_ok_and(|st| rustix::fs::FileType::from_raw_mode(st.st_mode).is_fifo())
                {
                    let _ = std::fs::File::from(fd).write_all(&key);
                }
            }
        })
        .map_err(fail)?;
    Ok(())
}

/// How a run's terminal came up.
enum Ready {
    /// It answers; with `wait`, this client is its first watcher.
    Up(Option<std::os::unix::net::UnixStream>),
    /// The supervisor ended before the terminal answered, with the terminal's status if any.
    Ended(Option<u8>),
}

/// Waits until the terminal of the run `c` answers on its socket, or its supervisor ends.
fn ready(c: &Contract, child: &mut std::process::Child, wait: bool) -> Result<Ready> {
    let sock = c.runtime.join("term/main.sock");
    let t = Instant::now();
    // The terminal's directory is the agent's: its socket is connected to beneath the run's
    // directory, only when it is a socket of the agent's uid.
    let run = Tree::open(&c.runtime).map_err(|e| Error::Supervise(e.to_string()))?;
    loop {
        if let Ok(mut conn) = run.connect("term/main.sock", c.uid) {
            if wait {
                // The terminal waits for this first client: all of its output is shown here.
                conn.write_all(b"watch\n")?;
                return Ok(Ready::Up(Some(conn)));
            }
            return Ok(Ready::Up(None));
        }
        if let Ok(Some(st)) = child.try_wait() {
            // Ended before we saw its socket: a short command, or a sandbox that could not start.
            // The supervisor's status is the run's.
            return Ok(Ready::Ended(Some(u8::try_from(code_of(st)).unwrap_or(1))));
        }
        if t.elapsed() > Duration::from_secs(15) {
            return Err(Error::NoAnswer(sock));
        }
        // A connect that is refused costs microseconds: looking every millisecond answers a
        // start as soon as its terminal does.
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A run that ended before its terminal answered, with what its supervisor (`pid`) said: the
/// end of its log, as the record of ended runs keeps it.
fn ended_at_once(c: &Contract, pid: u32) -> Error {
    let log = rundir::ended(&c.control, &c.agent, &c.session, i32::try_from(pid).ok()).map(|e| e.log);
    // A supervisor that could not record its end (it failed before reading its contract)
    // leaves its log in the run's directory.
    let log = log.or_else(|| std::fs::read_to_string(c.runtime.join("log")).ok()); // root's: the run directory
    Error::EndedAtOnce(log.unwrap_or_default())
}

/// Starts the run of `s` for the receipt server (`agent.start`): returns its supervisor, a
/// child of the caller's, once the terminal answers.
pub fn start_owned(s: &Start) -> Result<std::process::Child> {
    let mut t = Timings::default();
    let (c, mut child) = spawn(s, &mut t)?;
    t.keep(&c.runtime);
    match ready(&c, &mut child, false)? {
        Ready::Up(_) | Ready::Ended(Some(0)) => Ok(child),
        Ready::Ended(_) => Err(ended_at_once(&c, child.id())),
    }
}

/// How a started run went: under way (its terminal answers), or ended (with `wait`).
#[derive(Debug)]
pub enum Started {
    /// The terminal answers on this socket.
    Running {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
        /// The terminal socket.
        socket: std::path::PathBuf,
    },
    /// The run ended with status 0 (with `wait`: after its output was copied to `out`).
    Ended,
}

/// Starts the run of `s`. With `s.wait`, copies the terminal's output to `out` until it ends
/// and fails with [`Error::Status`] when its status is not 0.
pub fn start(s: &Start, out: &mut dyn Write) -> Result<Started> {
    let mut t = Timings::default();
    let (c, mut child) = spawn(s, &mut t)?;
    if c.headless {
        // The command ran on our streams; its status is the run's.
        let st = child.wait()?;
        return match code_of(st) {
            0 => Ok(Started::Ended),
            code => Err(Error::Status(u8::try_from(code).unwrap_or(1))),
        };
    }
    let sock = c.runtime.join("term/main.sock");
    let watcher = match ready(&c, &mut child, s.wait)? {
        Ready::Up(w) => {
            // The wait covers the supervisor's steps (its own lines) and the sandbox's start.
            t.step("ready");
            t.keep(&c.runtime);
            w
        }
        Ready::Ended(Some(0)) if s.wait => return Ok(Started::Ended),
        Ready::Ended(Some(code)) if s.wait => return Err(Error::Status(code)),
        Ready::Ended(_) => return Err(ended_at_once(&c, child.id())),
    };
    if let Some(mut conn) = watcher {
        let _ = std::io::copy(&mut conn, out);
        let st = child.wait()?;
        let code = u8::try_from(code_of(st)).unwrap_or(1);
        if code != 0 {
            return Err(Error::Status(code));
        }
        return Ok(Started::Ended);
    }
    Ok(Started::Running { agent: c.agent.clone(), session: c.session.clone(), socket: sock })
}

/// Runs the supervisor of the run whose contract is at `contract_file`. However the run ends,
/// even when it could not start (a workspace that is not there, a cgroup refused), what it made
/// goes: the view, the sandbox's binds, the socket directories, its cgroups; its session says
/// how it ended, and the daemon's record of ended runs holds its status (70 when it could not
/// run), which is also what this returns (the supervisor's exit status).
pub fn supervise(contract_file: &Path, key_fd: Option<i32>) -> Result<i32> {
    // Started with the stop signals held: they go to a pipe, then the supervisor puts itself
    // on record (its launcher may be gone before it could), then takes them.
    let fail = |what: &str, e: std::io::Error| Error::Supervise(format!("{what}: {e}"));
    let (signals, signalled) =
        rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC | rustix::pipe::PipeFlags::NONBLOCK)
            .map_err(|e| fail("pipe", e.into()))?;
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT, signal_hook::consts::SIGHUP] {
        let w = signalled.try_clone().map_err(|e| fail("pipe", e))?;
        signal_hook::low_level::pipe::register(sig, w).map_err(|e| fail("signals", e))?;
    }
    drop(signalled);
    let mut t = Timings::default();
    let mut c = rundir::read_contract(contract_file)?;
    rundir::write_pid(&c, std::process::id())?;
    t.step("sup-contract");
    // What the sandbox leaves when its first process goes (a namespace's init whose parent
    // died before it could ask to die with it) comes here, not to init.
    rustix::process::set_child_subreaper(Some(rustix::process::getpid()))
        .map_err(|e| fail("PR_SET_CHILD_SUBREAPER", e.into()))?;
    crate::sys::release_stop_signals().map_err(|e| fail("signals", e))?;
    let mut groups = None;
    let r = serve_run(&mut c, key_fd, signals, &mut groups, &mut t);
    let code = match &r {
        Ok(code) => *code,
        Err(e) => {
            eprintln!("agent {} session {}: the run could not go on: {e}", c.agent, c.session);
            let _ = ended_event(&c, "run.failed", &e.to_string(), 70);
            object_log(
                &c,
                &json!({"ts": session::timestamp(), "type": "run.failed", "agent": c.agent,
                    "session": c.session, "reason": e.to_string(), "code": 70}),
            );
            run_end(&c, "error", 70, None, Duration::ZERO);
            session::finish(&c.session_dir(&c.ctx), 70);
            70
        }
    };
    // Its status and the end of its log go to the daemon's record of ended runs at once, for
    // the watchers of its terminal.
    eprintln!("agent {} session {}: terminal ended with status {code}", c.agent, c.session);
    if let Err(e) = rundir::record_end(&c, std::process::id() as i32, code) {
        eprintln!("agent {} session {}: {e}", c.agent, c.session);
    }
    view::remove(&c.control, &c.view);
    sandbox::release(&c);
    if let Some(g) = groups {
        g.remove();
    }
    // Nothing of the run stays in the runtime directory: its directory goes (the socket
    // directories are the agent's: removed beneath it, never through a link or across a
    // mount), first out of its name, so that a new run of the session never meets its rest.
    let _ = contract_file;
    rundir::retire(&c.runtime);
    // What went wrong is in its log and its session; its status says how it ended.
    drop(r);
    Ok(code)
}

/// Serves the run `c` until it ends; returns its status. The cgroups made go to `groups`.
fn serve_run(
    c: &mut Contract,
    key_fd: Option<i32>,
    signals: std::os::fd::OwnedFd,
    groups: &mut Option<cgroups::Groups>,
    t: &mut Timings,
) -> Result<i32> {
    let fail = |what: &str, e: std::io::Error| Error::Supervise(format!("{what}: {e}"));
    let key = match key_fd {
        Some(fd) => Some(crate::term::read_secret_fd(fd).map_err(|e| fail("--key-fd", e))?),
        None => None,
    };
    // A headless run's command gets the streams this supervisor was started with; the
    // supervisor's own words go to its log.
    let streams = if c.headless {
        let keep = |fd: std::os::fd::BorrowedFd<'_>| {
            rustix::io::fcntl_dupfd_cloexec(fd, 3).map_err(|e| fail("keeping the caller's streams", e.into()))
        };
        let kept =
            (keep(rustix::stdio::stdin())?, keep(rustix::stdio::stdout())?, keep(rustix::stdio::stderr())?);
        // root's: the run directory
        let log = std::fs::OpenOptions::new()
            .append(true)
            .open(c.runtime.join("log"))
            .map_err(|e| fail("log", e))?;
        let null = std::fs::File::open("/dev/null").map_err(|e| fail("/dev/null", e))?; // root's: /dev
        rustix::stdio::dup2_stdin(&null).map_err(|e| fail("dup2", e.into()))?;
        rustix::stdio::dup2_stdout(&log).map_err(|e| fail("dup2", e.into()))?;
        rustix::stdio::dup2_stderr(&log).map_err(|e| fail("dup2", e.into()))?;
        Some(kept)
    } else {
        None
    };
    // Signals asking the run to stop arrive on `signals`, so that one poll waits for them and
    // for the sandbox to end (its pidfd).
    let run = Run {
        agent: c.agent.clone(),
        session: c.session.clone(),
        uid: c.uid,
        dir: c.session_dir(&c.ctx),
        ctx: c.ctx.clone(),
        control: c.control.clone(),
        workspace: c.workspace.clone(),
    };
    let children = Children::default();
    receipt::serve(run.clone(), &c.runtime.join("receipt/main.sock"), children.clone())
        .map_err(|e| fail("the receipt socket", e))?;
    t.step("sup-receipt");
    let limits =
        policy::limits::Limits { memory: c.memory, pids: c.pids, cpu: c.cpu, disk: None, files: None };
    let groups = groups.insert(
        cgroups::create(&format!("{}.{}", c.agent, c.session), &limits)
            .map_err(|e| Error::Cgroups(e.to_string()))?,
    );
    t.step("sup-cgroups");
    if let Some(u) = c.proxy.clone() {
        proxy(c, &u)?;
    }
    let mut cmd = sandbox::command(c, &groups.procs())?;
    t.step("sup-sandbox-command");
    if let Some((i, o, e)) = streams {
        cmd.stdin(Stdio::from(i)).stdout(Stdio::from(o)).stderr(Stdio::from(e));
    }
    if let Some(k) = key {
        serve_key(c, k)?;
    }
    let mut child = cmd.spawn().map_err(Error::Spawn)?;
    // The descriptors its child needed (the groups' files, the filter) go now.
    drop(cmd);
    t.step("sup-sandbox-spawn");
    t.keep(&c.runtime);
    let started = Instant::now();
    object_log(
        c,
        &json!({"ts": session::timestamp(), "type": "run.start", "agent": c.agent, "session": c.session,
            "pid": std::process::id(), "profile": c.profile.as_ref().map(|p| &p.0), "model": c.model,
            "headless": c.headless, "workspace": c.workspace.is_some(), "shared": c.space}),
    );
    let mut timed_out = false;
    let pid = rustix::process::Pid::from_child(&child);
    let pidfd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())
        .map_err(|e| fail("pidfd_open", e.into()))?;
    let mut killed_at: Option<Instant> = None;
    let mut stopping = false;
    // Asked to stop by a signal (an operator's `ctx agent stop`, a parent's `agent.stop`).
    let mut signalled = false;
    let mut lost = false;
    let mut checked = Instant::now();
    // Housekeeping (children that ended, whether the view still answers) once a second; the
    // sandbox's end and signals wake the wait at once.
    const TICK: Duration = Duration::from_secs(1);
    let status = loop {
        let wait = match killed_at {
            // Until the grace ends, then while SIGKILL takes effect.
            Some(t) => Duration::from_secs(c.grace)
                .saturating_sub(t.elapsed())
                .clamp(Duration::from_millis(20), TICK),
            None => TICK.saturating_sub(checked.elapsed()),
        };
        let timeout = rustix::event::Timespec::try_from(wait)
            .unwrap_or(rustix::event::Timespec { tv_sec: 1, tv_nsec: 0 });
        let mut fds = [
            rustix::event::PollFd::new(&pidfd, rustix::event::PollFlags::IN),
            rustix::event::PollFd::new(&signals, rustix::event::PollFlags::IN),
        ];
        match rustix::event::poll(&mut fds, Some(&timeout)) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(fail("poll", e.into())),
        }
        let (ended, asked) = (!fds[0].revents().is_empty(), !fds[1].revents().is_empty());
        if ended && let Some(st) = child.try_wait()? {
            break st;
        }
        if asked {
            let mut drain = [0u8; 64];
            while rustix::io::read(&signals, &mut drain).is_ok_and(|n| n > 0) {}
            stopping = true;
            signalled = !timed_out && !lost;
        }
        if !stopping && c.timeout.is_some_and(|t| started.elapsed() >= Duration::from_secs(t)) {
            timed_out = true;
            stopping = true;
            eprintln!("agent {} session {}: its timeout ran out: stopping the run", c.agent, c.session);
        }
        if checked.elapsed() >= TICK {
            checked = Instant::now();
            run.reap(&children);
            // A view whose daemon is gone is a world that no longer answers: the run is
            // stopped and its session says why.
            if !lost && !view::answers(&c.view) {
                lost = true;
                stopping = true;
                eprintln!(
                    "agent {} session {}: its view is gone (the daemon ended): stopping the run",
                    c.agent, c.session
                );
            }
        }
        if stopping {
            match killed_at {
                None => {
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
                    killed_at = Some(Instant::now());
                }
                Some(t) if t.elapsed() >= Duration::from_secs(c.grace) => {
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                }
                Some(_) => {}
            }
        }
    };
    let code = code_of(status);
    // The sandbox's processes that outlived it came to this supervisor (a subreaper): a run
    // ends with all of them, first, so that none asks for a child any more.
    let outlived = end_orphans(&receipt::supervisor_pids(&children));
    if outlived > 0 {
        eprintln!(
            "agent {} session {}: {outlived} of its processes outlived the sandbox: killed",
            c.agent, c.session
        );
    }
    // Owned children go with their parent; their history stays.
    run.reap(&children);
    for (child, session) in receipt::owned(&children) {
        run.cancel(&child, &session);
    }
    let ran = started.elapsed();
    if lost {
        lost_view(c, code);
        run_end(c, "error", code, Some("the daemon (the run's view ended)"), ran);
    } else if timed_out {
        let reason = format!("the run's timeout ({} s) ran out; it was stopped", c.timeout.unwrap_or(0));
        let _ = ended_event(c, "run.timeout", &reason, code);
        run_end(c, "error", code, Some("its timeout"), ran);
        session::finish(&c.session_dir(&c.ctx), code.max(1));
    } else if signalled {
        // Who asked, as `ctx agent stop` or `agent.stop` wrote it in the run's directory
        // (root's) before signalling.
        let by = Tree::open(&c.runtime)
            .and_then(|t| t.read_string(rundir::STOPPED_BY, 256))
            .map(|s| s.trim().to_owned())
            .unwrap_or_default();
        let by = if by.is_empty() { "a signal".to_owned() } else { by };
        run_end(c, "stopped", code, Some(&by), ran);
        session::finish_as(&c.session_dir(&c.ctx), "stopped");
    } else {
        run_end(c, if code == 0 { "done" } else { "error" }, code, None, ran);
        session::finish(&c.session_dir(&c.ctx), code);
    }
    Ok(code)
}

/// Kills and reaps every child of this process but those in `keep`, until none is left (a
/// child killed may leave children of its own, which come here), for at most ten seconds (a
/// process killed in an uninterruptible wait, on a daemon that no longer answers, may never
/// go): returns how many were killed.
fn end_orphans(keep: &[i32]) -> usize {
    let me = std::process::id() as i32;
    let mut killed = std::collections::BTreeSet::new();
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(10) {
        let left: Vec<i32> = children_of(me).into_iter().filter(|p| !keep.contains(p)).collect();
        if left.is_empty() {
            break;
        }
        for pid in left {
            let Some(p) = rustix::process::Pid::from_raw(pid) else { continue };
            if killed.insert(pid) {
                let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
            }
            let _ = rustix::process::waitpid(Some(p), rustix::process::WaitOptions::NOHANG);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    killed.len()
}

/// The pids of the children of `parent`, from `/proc` (each process's `stat`).
fn children_of(parent: i32) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() }; // root's: /proc
    let mut out = Vec::new();
    for e in dir.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
        // The name in parentheses may hold anything: the fields after its last ')' are the
        // state, then the parent's pid.
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else { continue }; // root's: /proc
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<i32>().ok());
        if ppid == Some(parent) {
            out.push(pid);
        }
    }
    out
}

/// Appends the one `run.end` event of a run to its session: how it ended (`done`, `error`,
/// `stopped`), its exit code, who stopped it, and how long it ran.
fn run_end(c: &Contract, state: &str, code: i32, by: Option<&str>, ran: Duration) {
    let event = json!({"ts": session::timestamp(), "type": "run.end", "agent": c.agent, "session": c.session,
        "status": state, "code": code, "stopped_by": by,
        "duration_ms": (ran.as_secs_f64() * 1e6).round() / 1e3});
    if let Err(e) = session::append_event(&c.session_dir(&c.ctx), &event) {
        eprintln!("agent {} session {}: cannot record run.end: {e}", c.agent, c.session);
    }
    object_log(c, &event);
}

/// Appends `event` to the agent's own log (`agent/<n>.d/log`, through /ctx), where every run of
/// the agent is followed whichever session it is on; a failure is said in the supervisor's log.
fn object_log(c: &Contract, event: &serde_json::Value) {
    let dir = c.ctx.join("agent").join(format!("{}.d", c.agent));
    if let Err(e) = session::append_line(&dir, "log", event) {
        eprintln!(
            "agent {} session {}: cannot record {} in agent/{}.d/log: {e}",
            c.agent, c.session, event["type"], c.agent
        );
    }
}

/// Appends a refused start of `agent`'s session `session` (`why`, exit code `code`) to the
/// agent's log, through the host's /ctx `ctx`: a refusal that made no run is seen there too.
pub fn refused(ctx: &Path, agent: &str, session: &str, why: &str, code: i32) {
    let dir = ctx.join("agent").join(format!("{agent}.d"));
    let event = json!({"ts": session::timestamp(), "type": "run.refused", "agent": agent,
        "session": session, "reason": why, "code": code});
    let _ = session::append_line(&dir, "log", &event);
}

/// Appends an event saying why a run ended to its session, through /ctx.
fn ended_event(c: &Contract, kind: &str, reason: &str, code: i32) -> std::io::Result<()> {
    let dir = c.session_dir(&c.ctx);
    let event = json!({"ts": session::timestamp(), "type": kind, "agent": c.agent, "session": c.session,
        "status": "error", "reason": reason, "code": code});
    session::append_event(&dir, &event)
        .inspect_err(|e| eprintln!("agent {} session {}: cannot record {kind}: {e}", c.agent, c.session))
}

/// Marks the session of a run stopped because its view died: `state` error and a `run.lost`
/// event, through the host's /ctx once a daemon answers there again (up to 15 s), else the
/// state directly in the storage the run started on.
fn lost_view(c: &Contract, code: i32) {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(15) && rustix::fs::statfs(c.ctx.join("status")).is_err() {
        std::thread::sleep(Duration::from_millis(100));
    }
    let reason = "the run's view ended (its daemon is gone); the run was stopped";
    if ended_event(c, "run.lost", reason, code).is_ok() {
        session::finish(&c.session_dir(&c.ctx), code.max(1));
    } else if let Some(storage) = &c.storage {
        let d = c.session_dir(storage);
        let _ = Tree::open(&d).and_then(|t| t.write("state", b"error\n", 0o644));
    }
}
