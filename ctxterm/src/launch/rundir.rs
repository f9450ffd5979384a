//! The run directory, `agent/<agent>/<session>/` in the daemon's runtime directory
//! (`/run/cortexfs/agent/<agent>/<session>/` for the default daemon): `pid` (the supervisor),
//! `log` and `contract.json` (root's, 0600), `exit` (the terminal's status), `term/` and
//! `receipt/` (the agent's socket directories, bound into the sandbox), and what the
//! supervisor prepares there (`workspace`, `mounts/`, `seccomp.bpf`). What stays of a run that
//! ended is its `exit` and its `log`.

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
/// has finished.
pub fn exit_of(control: &Path, agent: &str, session: &str) -> Option<i32> {
    let run = runtime::run_dir(control, agent, session);
    if supervisor(&run).is_some() {
        return None;
    }
    recorded_exit(&run)
}

/// The status recorded in `run/exit`.
pub fn recorded_exit<T: std::str::FromStr>(run: &Path) -> Option<T> {
    Tree::open(run).and_then(|t| t.read_string("exit", 64)).ok()?.trim().parse().ok()
}

fn at(path: &Path) -> impl Fn(std::io::Error) -> Error + '_ {
    move |source| Error::RunDir { path: path.to_path_buf(), source }
}

/// Makes the run directory of `c` afresh: its socket directories are the agent's (0700), and
/// the directories above them can be passed through but not listed (0711). Refused while the
/// run is under way.
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
}

/// Every run the daemon of `control` knows of: those under way and those ended (whose status
/// is kept in their directory), sorted by agent and session.
pub fn runs(control: &Path) -> Vec<RunInfo> {
    let mut out = Vec::new();
    let root = runtime::runs_root(control);
    let Ok(tree) = Tree::open(&root) else { return out };
    for a in tree.names(usize::MAX).unwrap_or_default() {
        let Ok(agent) = tree.sub(&a) else { continue };
        for s in agent.names(usize::MAX).unwrap_or_default() {
            let dir = root.join(&a).join(&s);
            let pid = supervisor(&dir);
            let exit = if pid.is_none() { recorded_exit(&dir) } else { None };
            if pid.is_none() && exit.is_none() {
                continue;
            }
            let since = agent.stat(&s).ok().map(|st| st.st_mtime);
            let (agent_name, session) = (a.to_string_lossy().into_owned(), s.to_string_lossy().into_owned());
            // What runs: its contract (root's), its groups.
            let contract = pid.and_then(|_| read_contract(&dir.join("contract.json")).ok());
            let usage = pid.map(|_| super::cgroups::usage(&format!("{agent_name}.{session}")));
            out.push(RunInfo {
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
    Ok(Tree::open(&run).and_then(|t| t.read_string("exit", 64)).unwrap_or_default().trim().to_owned())
}
