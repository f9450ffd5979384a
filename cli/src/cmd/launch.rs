//! `ctx agent start|stop|ps|watch|attach`: an agent's terminal in a bubblewrap sandbox.
//!
//! `start` derives the launch contract from the agent object (read through the host mount) and
//! its policy before anything is spawned, asks the daemon for the agent's view, then starts a
//! supervisor (`ctx agent supervise`, its own process group) and returns once the terminal
//! socket answers. The supervisor runs, as the agent's uid/gid/groups with no_new_privs:
//!
//! ```text
//! setpriv ... -- [pasta --config-net --] bwrap --die-with-parent --unshare-user --unshare-pid
//!   --unshare-ipc --unshare-uts [--unshare-net] --ro-bind /usr /usr ... --bind VIEW /ctx
//!   --bind CWD /workspace --bind TERM /run/cortexfs/terminal --clearenv --setenv ...
//!   -- /ctx/bin/ctxterm --socket /run/cortexfs/terminal/main.sock -- CMD
//! ```
//!
//! The sandbox is set up by bwrap running as the agent's uid, so it binds only what that uid can
//! reach: its own view (`/run/cortexfs/view/<agent>/`, 0700, the agent's), its socket directory,
//! the workspace. The storage is never bound. The network
//! is unshared unless the agent's policy allows `network:default connect` and pasta and
//! `/dev/net/tun` are present. `stop` sends SIGTERM to the supervisor, which forwards it, waits
//! the grace period, kills what is left (the sandbox's PID namespace dies with its first
//! process), removes the view and the socket, and records the exit status.
//!
//! Runtime state lives in `/run/cortexfs/agent/<agent>/<session>/`: `pid` (the supervisor),
//! `log`, `exit`, and `term/main.sock`.

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use policy::v0::{Class, Permission, Policy, Query};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::exit::{self, Exit};

/// Where runtime state is kept.
pub const RUNTIME: &str = "/run/cortexfs/agent";
/// The socket's path inside the sandbox.
const SANDBOX_SOCKET: &str = "/run/cortexfs/terminal/main.sock";

/// A hosted CLI launch profile: which program runs in the terminal and what it needs. CortexFS
/// runs these CLIs as they are; it never re-implements their model loop, sessions or approvals.
#[derive(Debug)]
pub struct Profile {
    /// `--profile NAME`.
    pub name: &'static str,
    /// The program, as seen inside the sandbox (host `/usr` is bound read-only).
    pub program: &'static str,
    /// Environment it needs (its state under the sandbox's private `HOME`).
    pub env: &'static [(&'static str, &'static str)],
    /// Where it comes from, for the error when it is missing.
    pub install: &'static str,
}

/// The profiles. Each CLI runs on the terminal's PTY.
pub const PROFILES: &[Profile] = &[
    Profile { name: "tsh", program: "/ctx/bin/tsh", env: &[], install: "ctx mount serves it in /ctx/bin" },
    Profile {
        name: "codex",
        program: "/usr/bin/codex",
        env: &[("CODEX_HOME", "/home/agent/.codex")],
        install: "npm install -g @openai/codex",
    },
    Profile {
        name: "claude",
        program: "/usr/bin/claude",
        env: &[("CLAUDE_CONFIG_DIR", "/home/agent/.claude"), ("DISABLE_AUTOUPDATER", "1")],
        install: "npm install -g @anthropic-ai/claude-code",
    },
    Profile {
        name: "pi",
        program: "/usr/bin/pi",
        env: &[],
        install: "npm install -g @mariozechner/pi-coding-agent",
    },
];

/// One bind of the mount table, with its flags.
#[derive(Debug, Serialize, Deserialize)]
struct Bind {
    source: PathBuf,
    target: PathBuf,
    rw: bool,
    nosuid: bool,
    nodev: bool,
    noexec: bool,
}

/// The umask of everything in a sandbox: files an agent creates are not writable by others.
pub const SANDBOX_UMASK: u32 = 0o022;

/// Variables the launcher sets that an agent's `env` control may not change.
pub const RESERVED_ENV: &[&str] = &[
    "CTX_ROOT",
    "CTX_HOME",
    "CTX_AGENT",
    "CTX_SESSION",
    "CTX_PATH",
    "CTX_WORKSPACE",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "PATH",
];

/// Everything a sandbox is started from, decided before anything is spawned.
#[derive(Debug, Serialize, Deserialize)]
pub struct Contract {
    agent: String,
    session: String,
    uid: u32,
    gid: u32,
    groups: Vec<u32>,
    network: bool,
    view: PathBuf,
    workspace: Option<PathBuf>,
    /// The mount table: the agent's own, then the operator's `--mount`s.
    mounts: Vec<Bind>,
    /// The working directory inside the sandbox (the agent's `cwd`).
    cwd: String,
    /// Seconds the run may last (the agent's `timeout`, or `--timeout`).
    timeout: Option<u64>,
    env: Vec<(String, String)>,
    cmd: Vec<String>,
    runtime: PathBuf,
    control: PathBuf,
    grace: u64,
    /// The agent whose session this run resumes (`--resume`), when it is not the run's own.
    session_of: Option<String>,
    /// The command starts once the first client connects (`start --wait` is that client).
    wait_client: bool,
    /// Resource ceilings (see `policy::limits`): memory in bytes, processes, CPU percent.
    memory: Option<u64>,
    pids: Option<u64>,
    cpu: Option<u64>,
    /// The storage the daemon serves (from its `status`), for when /ctx no longer answers.
    storage: Option<PathBuf>,
    /// The host's /ctx mount.
    ctx: PathBuf,
}

fn invalid(msg: impl Into<String>) -> anyhow::Error {
    Exit::new(exit::INVALID, msg).into()
}

/// An agent's control `name`, read through the host mount `ctx`.
pub fn read_control(ctx: &Path, agent: &str, name: &str) -> anyhow::Result<String> {
    let p = ctx.join("agent").join(format!("{agent}.d")).join(name);
    std::fs::read_to_string(&p).map_err(|e| Exit::io(p.display(), &e).into())
}

/// Parses `--mount SRC TGT ro|rw`.
pub fn extra_mount(spec: &[String]) -> anyhow::Result<(PathBuf, PathBuf, bool)> {
    let [src, tgt, mode] = spec else { return Err(invalid("--mount takes SOURCE TARGET ro|rw")) };
    let rw = match mode.as_str() {
        "ro" => false,
        "rw" => true,
        m => return Err(invalid(format!("--mount {src} {tgt} {m}: the mode is ro or rw"))),
    };
    for p in [src, tgt] {
        policy::path::check_absolute(p).map_err(|e| invalid(format!("--mount {src} {tgt}: {p}: {e}")))?;
    }
    let t = Path::new(tgt);
    if t == Path::new("/") || t.starts_with("/ctx") {
        return Err(invalid(format!("--mount {src} {tgt}: the target may not replace / or /ctx")));
    }
    if !Path::new(src).exists() {
        return Err(invalid(format!("--mount {src} {tgt}: {src} does not exist")));
    }
    Ok((PathBuf::from(src), PathBuf::from(tgt), rw))
}

/// The options of `ctx agent start`.
#[derive(Debug)]
pub struct Start {
    /// The agent.
    pub agent: String,
    /// The session.
    pub session: String,
    /// The working directory bound at /workspace.
    pub cwd: Option<PathBuf>,
    /// Extra mounts.
    pub mounts: Vec<(PathBuf, PathBuf, bool)>,
    /// No /workspace.
    pub no_workspace: bool,
    /// The command (default: tsh), or the profile's arguments.
    pub cmd: Vec<String>,
    /// A launch profile.
    pub profile: Option<String>,
    /// The host mount.
    pub ctx: PathBuf,
    /// The daemon's control socket.
    pub control: PathBuf,
    /// Wait for the terminal to end and exit with its status.
    pub wait: bool,
    /// Seconds between SIGTERM and SIGKILL at stop.
    pub grace: u64,
    /// Resume this other agent's session `session` (needs `session:<other>/<session> resume`).
    pub resume: Option<String>,
    /// Stop the run after this many seconds, over the agent's `timeout`.
    pub timeout: Option<u64>,
    /// The sandbox's memory ceiling in bytes, over the agent's `limits`.
    pub memory: Option<u64>,
    /// Its ceiling on processes and threads, over the agent's `limits`.
    pub pids: Option<u64>,
    /// Its CPU ceiling in percent of one CPU, over the agent's `limits`.
    pub cpu: Option<u64>,
    /// Start without any ceiling (where the host cannot apply them).
    pub no_ceilings: bool,
}

fn runtime_dir(agent: &str, session: &str) -> PathBuf {
    Path::new(RUNTIME).join(agent).join(session)
}

fn alive(pid: i32) -> bool {
    rustix::process::Pid::from_raw(pid).is_some_and(|p| rustix::process::test_kill_process(p).is_ok())
}

/// The recorded exit status of a finished agent session, if it has finished.
pub fn exit_of(agent: &str, session: &str) -> Option<i32> {
    let runtime = runtime_dir(agent, session);
    if supervisor(&runtime).is_some() {
        return None;
    }
    std::fs::read_to_string(runtime.join("exit")).ok()?.trim().parse().ok()
}

fn supervisor(runtime: &Path) -> Option<i32> {
    let pid: i32 = std::fs::read_to_string(runtime.join("pid")).ok()?.trim().parse().ok()?;
    alive(pid).then_some(pid)
}

/// Whether pasta can give `uid` a network: pasta installed, `/dev/net/tun` present and open to
/// that uid (pasta runs as the agent).
fn network_ready(uid: u32) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    if !Path::new("/usr/bin/pasta").exists() {
        return Err("/usr/bin/pasta is missing (Debian package passt)".into());
    }
    let tun = std::fs::metadata("/dev/net/tun").map_err(|e| format!("/dev/net/tun: {e}"))?;
    let open_to = |shift: u32| tun.mode() >> shift & 0o6 == 0o6;
    if !(open_to(0) || (tun.uid() == uid && open_to(6))) {
        return Err(format!(
            "/dev/net/tun (mode {:o}) is not open to uid {uid}: chmod 0666 /dev/net/tun (scripts/host-setup)",
            tun.mode() & 0o777
        ));
    }
    Ok(())
}

/// What sandboxes need from the host, each missing piece with what to do about it.
pub fn preflight() -> Result<(), String> {
    let read = |p: &str| std::fs::read_to_string(p).ok().map(|t| t.trim().to_owned());
    if !Path::new("/usr/bin/bwrap").exists() {
        return Err("bubblewrap is not installed: apt-get install bubblewrap".into());
    }
    if !Path::new("/dev/fuse").exists() {
        return Err("/dev/fuse is missing: agent views are FUSE mounts (modprobe fuse)".into());
    }
    if read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns").as_deref() == Some("1") {
        return Err("AppArmor blocks unprivileged user namespaces (kernel.apparmor_restrict_unprivileged_userns=1): \
                    sysctl -w kernel.apparmor_restrict_unprivileged_userns=0, or give bwrap an AppArmor profile \
                    that allows userns"
            .into());
    }
    if read("/proc/sys/kernel/unprivileged_userns_clone").as_deref() == Some("0") {
        return Err(
            "unprivileged user namespaces are disabled: sysctl -w kernel.unprivileged_userns_clone=1".into(),
        );
    }
    if read("/proc/sys/user/max_user_namespaces").as_deref() == Some("0") {
        return Err("user namespaces are disabled (user.max_user_namespaces=0): sysctl -w user.max_user_namespaces=15000".into());
    }
    Ok(())
}

/// Derives the contract: identity, network, mounts and environment.
fn contract(s: &Start) -> anyhow::Result<Contract> {
    preflight().map_err(|why| Exit::new(exit::UNAVAILABLE, format!("cannot start sandboxes here: {why}")))?;
    policy::name::validate(&s.agent).map_err(|e| invalid(format!("agent {:?}: {e}", s.agent)))?;
    policy::name::validate(&s.session).map_err(|e| invalid(format!("session {:?}: {e}", s.session)))?;
    if !s.ctx.join("agent").join(&s.agent).exists() {
        return Err(Exit::new(exit::FAILURE, format!("no agent {} in {}", s.agent, s.ctx.display())).into());
    }
    let num = |name: &str| -> anyhow::Result<u32> {
        let t = read_control(&s.ctx, &s.agent, name)?;
        t.trim()
            .parse()
            .map_err(|_| invalid(format!("agent/{}.d/{name}: {:?} is not a number", s.agent, t.trim())))
    };
    let (uid, gid) = (num("uid")?, num("gid")?);
    if uid == 0 {
        eprintln!(
            "ctx: warning: agent {} runs as uid 0: in its sandbox it is root over everything bound there \
             (give it its own uid: agent/{}.d/uid)",
            s.agent, s.agent
        );
    }
    let groups = read_control(&s.ctx, &s.agent, "groups")
        .unwrap_or_default()
        .split_ascii_whitespace()
        .map(|g| g.parse::<u32>().map_err(|_| invalid(format!("agent/{}.d/groups: {g:?}", s.agent))))
        .collect::<anyhow::Result<Vec<u32>>>()?;
    let label = read_control(&s.ctx, &s.agent, "label")?.trim().to_owned();
    let policy = Policy::from_text(read_control(&s.ctx, &s.agent, "policy")?.as_bytes())
        .map_err(|_| invalid(format!("agent/{}.d/policy does not parse (ctx policy check)", s.agent)))?;
    let granted = policy.allows(&Query {
        subject: &label,
        class: Class::Network,
        object: "default",
        permission: Permission::Connect,
    });
    if granted {
        network_ready(uid).map_err(|why| {
            Exit::new(
                exit::UNAVAILABLE,
                format!("agent {}: its policy grants network:default connect, but {why}", s.agent),
            )
        })?;
    }
    let network = granted;
    // Mounts: the agent's own table, then the operator's --mount; each one authorized by the
    // agent's policy (`mount:TARGET read`, and `write` for rw), or nothing starts.
    let table = read_control(&s.ctx, &s.agent, "mount").unwrap_or_default();
    let table = policy::mount::parse(table.as_bytes()).map_err(|errs| {
        let why: Vec<String> = errs.iter().map(ToString::to_string).collect();
        invalid(format!("agent/{}.d/mount: {}", s.agent, why.join("; ")))
    })?;
    let mut mounts: Vec<Bind> = table
        .iter()
        .map(|m| Bind {
            source: PathBuf::from(&m.source),
            target: PathBuf::from(&m.target),
            rw: m.mode == policy::mount::MountMode::Rw,
            nosuid: m.options.nosuid,
            nodev: m.options.nodev,
            noexec: m.options.noexec,
        })
        .collect();
    mounts.extend(s.mounts.iter().map(|(source, target, rw)| Bind {
        source: source.clone(),
        target: target.clone(),
        rw: *rw,
        nosuid: true,
        nodev: true,
        noexec: false,
    }));
    for Bind { source: src, target: tgt, rw, .. } in &mounts {
        let target = tgt.to_string_lossy();
        let allows = |permission| {
            policy.allows(&Query { subject: &label, class: Class::Mount, object: &target, permission })
        };
        if !allows(Permission::Read) || (*rw && !allows(Permission::Write)) {
            return Err(Exit::new(
                exit::DENIED,
                format!(
                    "mount {} at {target} ({}): the agent's policy does not allow {label} mount:{target} {}",
                    src.display(),
                    if *rw { "rw" } else { "ro" },
                    if *rw { "read and write" } else { "read" }
                ),
            )
            .into());
        }
        if !src.exists() {
            return Err(invalid(format!("mount {}: the source does not exist", src.display())));
        }
    }
    let workspace = if s.no_workspace {
        None
    } else {
        Some(match &s.cwd {
            Some(c) => c.clone(),
            None => std::env::current_dir()?,
        })
    };
    let home = format!("/ctx/home/{uid}");
    // CTX_PATH: the agent's `path`, then the tool directories of the shared spaces it may see.
    let path_control = read_control(&s.ctx, &s.agent, "path").unwrap_or_default();
    let mut ctx_path: Vec<String> = if path_control.trim().is_empty() {
        vec!["/ctx/tool".to_owned(), format!("{home}/tool")]
    } else {
        policy::tshconf::parse_ctx_path(path_control.trim())
            .map_err(|e| invalid(format!("agent/{}.d/path: {e}", s.agent)))?
    };
    for space in policy.objects(&label, Class::Shared) {
        let dir = format!("/ctx/shared/{space}/tool");
        if !ctx_path.contains(&dir) {
            ctx_path.push(dir);
        }
    }
    let mut env = vec![
        ("CTX_ROOT".to_owned(), "/ctx".to_owned()),
        ("CTX_HOME".to_owned(), home.clone()),
        ("CTX_AGENT".to_owned(), s.agent.clone()),
        ("CTX_SESSION".to_owned(), s.session.clone()),
        ("CTX_PATH".to_owned(), ctx_path.join(":")),
        ("HOME".to_owned(), "/home/agent".to_owned()),
        ("USER".to_owned(), s.agent.clone()),
        ("LOGNAME".to_owned(), s.agent.clone()),
        ("SHELL".to_owned(), "/ctx/bin/tsh".to_owned()),
        ("TERM".to_owned(), std::env::var("TERM").unwrap_or_else(|_| "xterm-256color".into())),
        ("LANG".to_owned(), "C.UTF-8".to_owned()),
        ("PATH".to_owned(), "/usr/bin:/bin".to_owned()),
    ];
    if workspace.is_some() {
        env.push(("CTX_WORKSPACE".to_owned(), "/workspace".to_owned()));
    }
    // The agent's own variables: KEY=VALUE lines; the launcher's are not theirs to change.
    for line in read_control(&s.ctx, &s.agent, "env").unwrap_or_default().lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (k, v) = line
            .split_once('=')
            .filter(|(k, _)| !k.is_empty() && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'))
            .ok_or_else(|| invalid(format!("agent/{}.d/env: {line:?} is not KEY=VALUE", s.agent)))?;
        if RESERVED_ENV.contains(&k) {
            return Err(invalid(format!(
                "agent/{}.d/env: {k} is set by the launcher and cannot be changed (reserved: {})",
                s.agent,
                RESERVED_ENV.join(" ")
            )));
        }
        env.retain(|(key, _)| key != k);
        env.push((k.to_owned(), v.to_owned()));
    }
    let cwd = match read_control(&s.ctx, &s.agent, "cwd").unwrap_or_default().trim() {
        "" | "/workspace" if workspace.is_none() => "/".to_owned(),
        "" => "/workspace".to_owned(),
        c => {
            policy::path::check_absolute(c).map_err(|e| invalid(format!("agent/{}.d/cwd: {e}", s.agent)))?;
            c.to_owned()
        }
    };
    let timeout = match s.timeout {
        Some(t) => Some(t),
        None => match read_control(&s.ctx, &s.agent, "timeout").unwrap_or_default().trim() {
            "" => None,
            t => Some(t.parse::<u64>().ok().filter(|&t| t > 0).ok_or_else(|| {
                invalid(format!("agent/{}.d/timeout: {t:?} is not a number of seconds", s.agent))
            })?),
        },
    };
    let cmd = match &s.profile {
        Some(name) => {
            let p = PROFILES.iter().find(|p| p.name == name).ok_or_else(|| {
                let known: Vec<&str> = PROFILES.iter().map(|p| p.name).collect();
                invalid(format!("unknown profile {name:?} (known: {})", known.join(" ")))
            })?;
            if p.program.starts_with("/usr/") && !Path::new(p.program).exists() {
                return Err(Exit::new(
                    exit::UNAVAILABLE,
                    format!("profile {}: {} is missing ({})", p.name, p.program, p.install),
                )
                .into());
            }
            env.extend(p.env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
            std::iter::once(p.program.to_owned()).chain(s.cmd.iter().cloned()).collect()
        }
        None if s.cmd.is_empty() => vec!["/ctx/bin/tsh".to_owned()],
        None => s.cmd.clone(),
    };
    let limits = ceilings(s)?;
    let session_of = match &s.resume {
        Some(owner) => Some(resumable(s, owner, &label, &policy, uid)?),
        None => None,
    };
    Ok(Contract {
        agent: s.agent.clone(),
        session: s.session.clone(),
        uid,
        gid,
        groups,
        network,
        view: Path::new(server::control::DEFAULT_VIEW_ROOT).join(&s.agent).join(&s.session),
        workspace,
        mounts,
        cwd,
        timeout,
        env,
        cmd,
        runtime: runtime_dir(&s.agent, &s.session),
        control: s.control.clone(),
        grace: s.grace,
        session_of,
        wait_client: s.wait,
        memory: limits.memory,
        pids: limits.pids,
        cpu: limits.cpu,
        storage: std::fs::read_to_string(s.ctx.join("status"))
            .ok()
            .and_then(|t| policy::status::field(&t, "storage").map(PathBuf::from)),
        ctx: s.ctx.clone(),
    })
}

/// Checks that the run of `s` may resume `owner`'s session: the agent's policy grants
/// `session:<owner>/<session> resume`, the session exists, and Linux permissions let the
/// agent write it (the owner's uid is the agent's). Returns the owner.
fn resumable(s: &Start, owner: &str, label: &str, policy: &Policy, uid: u32) -> anyhow::Result<String> {
    policy::name::validate(owner).map_err(|e| invalid(format!("--resume {owner:?}: {e}")))?;
    let object = format!("{owner}/{}", s.session);
    let q = Query { subject: label, class: Class::Session, object: &object, permission: Permission::Resume };
    if !policy.allows(&q) {
        return Err(Exit::new(
            exit::DENIED,
            format!("agent/{}.d/policy does not allow {label} session:{object} resume", s.agent),
        )
        .into());
    }
    let owner_uid: u32 = read_control(&s.ctx, owner, "uid")?
        .trim()
        .parse()
        .map_err(|_| invalid(format!("agent/{owner}.d/uid is not a number")))?;
    if owner_uid != uid {
        return Err(Exit::new(
            exit::DENIED,
            format!(
                "session {object} belongs to uid {owner_uid}, agent {} runs as {uid}: Linux permissions \
                 would refuse its writes (give both agents one uid to share sessions)",
                s.agent
            ),
        )
        .into());
    }
    let dir = crate::cmd::session::dir(&s.ctx, uid, owner, &s.session);
    if !dir.is_dir() {
        return Err(Exit::new(exit::FAILURE, format!("agent {owner} has no session {}", s.session)).into());
    }
    Ok(owner.to_owned())
}

/// The run's ceilings: the agent's `limits` (or the defaults), under the flags; none with
/// `--no-ceilings`. Refused (69) when the host cannot apply one.
fn ceilings(s: &Start) -> anyhow::Result<policy::limits::Limits> {
    if s.no_ceilings {
        return Ok(policy::limits::Limits { memory: None, pids: None, cpu: None });
    }
    let text = read_control(&s.ctx, &s.agent, "limits").unwrap_or_default();
    let mut l = policy::limits::parse(text.as_bytes())
        .map_err(|e| invalid(format!("agent/{}.d/limits: {e}", s.agent)))?;
    l.memory = s.memory.or(l.memory);
    l.pids = s.pids.or(l.pids);
    l.cpu = s.cpu.or(l.cpu);
    ctxterm::cgroups::plan(&l).map_err(|why| {
        Exit::new(
            exit::UNAVAILABLE,
            format!(
                "resource ceilings cannot be applied here: {why}; mount the controller (cgroup v2 or v1), \
                 or start without ceilings with --no-ceilings"
            ),
        )
    })?;
    Ok(l)
}

impl Contract {
    /// The agent whose session directory the run uses: its own, or the one it resumes.
    fn session_owner(&self) -> &str {
        self.session_of.as_deref().unwrap_or(&self.agent)
    }
}

/// Prepares the run of `s` and starts its supervisor; returns the contract and the supervisor.
fn spawn(s: &Start) -> anyhow::Result<(Contract, std::process::Child)> {
    let c = contract(s)?;
    if let Some(pid) = supervisor(&c.runtime) {
        return Err(Exit::new(
            exit::FAILURE,
            format!("agent {} session {} is running (pid {pid})", c.agent, c.session),
        )
        .into());
    }
    let _ = std::fs::remove_dir_all(&c.runtime);
    let term = c.runtime.join("term");
    std::fs::create_dir_all(&term)?;
    let receipt = c.runtime.join("receipt");
    std::fs::create_dir_all(&receipt)?;
    rustix::fs::chown(
        &receipt,
        Some(rustix::fs::Uid::from_raw(c.uid)),
        Some(rustix::fs::Gid::from_raw(c.gid)),
    )?;
    std::fs::set_permissions(
        &receipt,
        <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o700),
    )?;
    // The agent reaches its socket directory (and only it) through directories it cannot list.
    {
        use std::os::unix::fs::PermissionsExt;
        let mut d = c.runtime.clone();
        while d.starts_with("/run/cortexfs") && d != Path::new("/run") {
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o711))?;
            d.pop();
        }
    }
    rustix::fs::chown(&term, Some(rustix::fs::Uid::from_raw(c.uid)), Some(rustix::fs::Gid::from_raw(c.gid)))?;
    // The session, in the agent's home, owned by the agent.
    let cwd = c.workspace.as_ref().map_or_else(|| "/".to_owned(), |_| "/workspace".to_owned());
    crate::cmd::session::prepare(&s.ctx, c.uid, c.gid, c.session_owner(), &c.session, &cwd)?;
    crate::cmd::view::call(
        &c.control,
        json!({
            "op": "create",
            "agent": c.agent,
            "session": c.session,
            "path": c.view,
            "session_of": c.session_of,
            // What the run's tools may touch comes from here, never from the agent's environment.
            "workspace": c.workspace.as_ref().map(|_| "/workspace"),
        }),
    )?;
    // Run state is root's: the contract names the command line, which other users have no
    // business reading; it goes when the run ends.
    let private = |p: &Path| {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(p)
    };
    let contract_file = c.runtime.join("contract.json");
    private(&contract_file)?.write_all(&serde_json::to_vec_pretty(&c)?)?;
    let log = private(&c.runtime.join("log"))?;
    let child = Command::new(std::env::current_exe()?)
        .args(["agent", "supervise"])
        .arg(&contract_file)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .spawn()?;
    std::fs::write(c.runtime.join("pid"), child.id().to_string())?;
    Ok((c, child))
}

/// How a run's terminal came up.
enum Ready {
    /// It answers; with `wait`, this client is its first watcher.
    Up(Option<std::os::unix::net::UnixStream>),
    /// The supervisor ended before the terminal answered, with the terminal's status if any.
    Ended(Option<u8>),
}

/// Waits until the terminal of the run `c` answers on its socket, or its supervisor ends.
fn ready(c: &Contract, child: &mut std::process::Child, wait: bool) -> anyhow::Result<Ready> {
    let sock = c.runtime.join("term/main.sock");
    let t = Instant::now();
    loop {
        if let Ok(mut conn) = std::os::unix::net::UnixStream::connect(&sock) {
            if wait {
                // The terminal waits for this first client: all of its output is shown here.
                conn.write_all(b"watch\n")?;
                return Ok(Ready::Up(Some(conn)));
            }
            return Ok(Ready::Up(None));
        }
        if let Ok(Some(_)) = child.try_wait() {
            // Ended before we saw its socket: a short command, or a sandbox that could not start.
            let code =
                std::fs::read_to_string(c.runtime.join("exit")).ok().and_then(|t| t.trim().parse().ok());
            return Ok(Ready::Ended(code));
        }
        if t.elapsed() > Duration::from_secs(15) {
            return Err(Exit::new(
                exit::UNAVAILABLE,
                format!("the terminal did not answer on {}", sock.display()),
            )
            .into());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn ended_at_once(c: &Contract) -> anyhow::Error {
    let log = std::fs::read_to_string(c.runtime.join("log")).unwrap_or_default();
    Exit::new(exit::FAILURE, format!("the terminal ended at once:\n{log}")).into()
}

/// Starts the run of `s` for the receipt server (`agent.start`): returns its supervisor, a
/// child of the caller's, once the terminal answers.
pub fn start_owned(s: &Start) -> anyhow::Result<std::process::Child> {
    let (c, mut child) = spawn(s)?;
    match ready(&c, &mut child, false)? {
        Ready::Up(_) | Ready::Ended(Some(0)) => Ok(child),
        Ready::Ended(_) => Err(ended_at_once(&c)),
    }
}

/// Runs `ctx agent start`.
pub fn start(s: Start) -> anyhow::Result<()> {
    let (c, mut child) = spawn(&s)?;
    let sock = c.runtime.join("term/main.sock");
    let watcher = match ready(&c, &mut child, s.wait)? {
        Ready::Up(w) => w,
        Ready::Ended(Some(0)) if s.wait => return Ok(()),
        Ready::Ended(Some(code)) if s.wait => return Err(Exit::quiet(code).into()),
        Ready::Ended(_) => return Err(ended_at_once(&c)),
    };
    if let Some(mut conn) = watcher {
        let _ = std::io::copy(&mut conn, &mut std::io::stdout());
        let st = child.wait()?;
        let code: u8 = std::fs::read_to_string(c.runtime.join("exit"))
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(if st.success() { 0 } else { 1 });
        if code != 0 {
            return Err(Exit::quiet(code).into());
        }
        return Ok(());
    }
    println!("started agent {} session {}", c.agent, c.session);
    println!("socket {}", sock.display());
    println!("watch: ctx agent watch {} --session {}", c.agent, c.session);
    Ok(())
}

/// Runs the supervisor (`ctx agent supervise CONTRACT`).
pub fn supervise(contract_file: &Path) -> anyhow::Result<()> {
    let c: Contract = serde_json::from_slice(&std::fs::read(contract_file)?)?;
    // Signals asking the run to stop arrive on a pipe, so that one poll waits for them and for
    // the sandbox to end (its pidfd).
    let (signals, signalled) =
        rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC | rustix::pipe::PipeFlags::NONBLOCK)?;
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT, signal_hook::consts::SIGHUP] {
        signal_hook::low_level::pipe::register(sig, signalled.try_clone()?)?;
    }
    drop(signalled);
    let run = crate::cmd::receipt::Run {
        agent: c.agent.clone(),
        session: c.session.clone(),
        uid: c.uid,
        ctx: c.ctx.clone(),
        control: c.control.clone(),
        workspace: c.workspace.clone(),
    };
    let children = crate::cmd::receipt::Children::default();
    crate::cmd::receipt::serve(run.clone(), &c.runtime.join("receipt/main.sock"), children.clone())?;
    // The sandbox starts inside its groups: a shell joins them, then execs setpriv.
    let limits = policy::limits::Limits { memory: c.memory, pids: c.pids, cpu: c.cpu };
    let groups = ctxterm::cgroups::create(&format!("{}.{}", c.agent, c.session), &limits)
        .map_err(|e| Exit::new(exit::UNAVAILABLE, format!("resource ceilings: {e}")))?;
    let procs: Vec<String> = groups.procs().iter().map(|p| p.display().to_string()).collect();
    let mut cmd = if procs.is_empty() {
        Command::new("setpriv")
    } else {
        let mut sh = Command::new("/bin/sh");
        sh.args(["-c", "IFS=:; for p in $0; do echo $$ > \"$p\" || exit 69; done; unset IFS; exec \"$@\""])
            .arg(procs.join(":"))
            .arg("setpriv");
        sh
    };
    cmd.arg(format!("--reuid={}", c.uid)).arg(format!("--regid={}", c.gid));
    if c.groups.is_empty() {
        cmd.arg("--clear-groups");
    } else {
        let g: Vec<String> = c.groups.iter().map(u32::to_string).collect();
        cmd.arg(format!("--groups={}", g.join(",")));
    }
    // No --no-new-privs here: pasta needs to map its namespace first; bwrap sets no_new_privs
    // for everything in the sandbox (checked by the tests).
    cmd.arg("--");
    if c.network {
        cmd.args(["pasta", "--config-net", "--quiet", "--"]);
    }
    // The operator's workspace, for an agent with an identity of its own: an idmapped bind that
    // shows the workspace owner's ids as the agent's (ctxterm::idmap).
    let idmapped = c.runtime.join("workspace");
    let workspace = match &c.workspace {
        Some(w) => {
            use std::os::unix::fs::MetadataExt;
            let m = std::fs::metadata(w).map_err(|e| Exit::io(w.display(), &e))?;
            if (m.uid(), m.gid()) == (c.uid, c.gid) {
                Some(w.clone())
            } else {
                std::fs::create_dir_all(&idmapped)?;
                let attrs = ctxterm::binds::Attrs {
                    idmap: Some(((m.uid(), m.gid()), (c.uid, c.gid))),
                    nosuid: true,
                    nodev: true,
                    ..Default::default()
                };
                match ctxterm::binds::bind(w, &idmapped, &attrs) {
                    Ok(()) => Some(idmapped.clone()),
                    Err(e) => {
                        eprintln!("ctx: {e}; binding it as it is (the agent has what mode bits give it)");
                        Some(w.clone())
                    }
                }
            }
        }
        None => None,
    };
    // The seccomp filter reaches bwrap as descriptor 3, opened by a shell right before it execs
    // bwrap (pasta, when it runs, closes the descriptors it inherits).
    let filter = c.runtime.join("seccomp.bpf");
    std::fs::write(&filter, ctxterm::seccomp::program()?)?;
    cmd.args(["/bin/sh", "-c", "exec \"$@\" 3<\"$0\""]).arg(&filter);
    cmd.arg("bwrap").args([
        "--seccomp",
        "3",
        "--disable-userns",
        "--die-with-parent",
        "--unshare-user",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
    ]);
    // The agent's ids inside too (under pasta, the process starting bwrap is its namespace's root).
    cmd.arg("--uid").arg(c.uid.to_string()).arg("--gid").arg(c.gid.to_string());
    if !c.network {
        cmd.arg("--unshare-net");
    }
    cmd.args(["--ro-bind", "/usr", "/usr"]);
    for (link, target) in
        [("usr/bin", "/bin"), ("usr/sbin", "/sbin"), ("usr/lib", "/lib"), ("usr/lib64", "/lib64")]
    {
        if Path::new(target).is_symlink() {
            cmd.args(["--symlink", link, target]);
        } else if Path::new(target).exists() {
            cmd.args(["--ro-bind", target, target]);
        }
    }
    cmd.args(["--ro-bind", "/etc", "/etc", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]);
    cmd.args(["--dir", "/home/agent", "--hostname", &c.agent]);
    cmd.arg("--bind").arg(&c.view).arg("/ctx");
    cmd.arg("--bind").arg(c.runtime.join("term")).arg("/run/cortexfs/terminal");
    cmd.arg("--bind").arg(c.runtime.join("receipt")).arg("/run/cortexfs/receipt");
    if let Some(w) = &workspace {
        cmd.arg("--bind").arg(w).arg("/workspace");
    }
    cmd.arg("--chdir").arg(&c.cwd);
    // The mount table, each bind prepared with its flags (bwrap's own binds cannot say noexec).
    let prepared = c.runtime.join("mounts");
    for (i, b) in c.mounts.iter().enumerate() {
        let at = prepared.join(i.to_string());
        std::fs::create_dir_all(&prepared)?;
        if b.source.is_dir() {
            std::fs::create_dir_all(&at)?;
        } else {
            std::fs::File::create(&at)?;
        }
        let attrs = ctxterm::binds::Attrs {
            nosuid: b.nosuid,
            nodev: b.nodev,
            noexec: b.noexec,
            rdonly: !b.rw,
            idmap: None,
        };
        ctxterm::binds::bind(&b.source, &at, &attrs)
            .map_err(|e| Exit::new(exit::UNAVAILABLE, format!("mount {}: {e}", b.target.display())))?;
        cmd.arg(if b.rw { "--bind" } else { "--ro-bind" }).arg(&at).arg(&b.target);
    }
    cmd.arg("--clearenv");
    for (k, v) in &c.env {
        cmd.args(["--setenv", k, v]);
    }
    cmd.args(["--new-session", "--", "/ctx/bin/ctxterm", "--socket", SANDBOX_SOCKET]);
    if c.wait_client {
        cmd.arg("--wait-client");
    }
    cmd.arg("--");
    cmd.args(&c.cmd);
    cmd.env_clear().env("PATH", "/usr/bin:/bin").stdin(Stdio::null());
    // Inherited through setpriv and bwrap by everything in the sandbox.
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(SANDBOX_UMASK));
    let mut child = cmd.spawn().map_err(|e| Exit::new(exit::UNAVAILABLE, format!("setpriv/bwrap: {e}")))?;
    let started = Instant::now();
    let mut timed_out = false;
    let pid = rustix::process::Pid::from_child(&child);
    let pidfd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())
        .map_err(|e| Exit::new(exit::INTERNAL, format!("pidfd_open: {e}")))?;
    let mut killed_at: Option<Instant> = None;
    let mut stopping = false;
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
            Err(e) => return Err(Exit::new(exit::INTERNAL, format!("poll: {e}")).into()),
        }
        let (ended, asked) = (!fds[0].revents().is_empty(), !fds[1].revents().is_empty());
        if ended && let Some(st) = child.try_wait()? {
            break st;
        }
        if asked {
            let mut drain = [0u8; 64];
            while rustix::io::read(&signals, &mut drain).is_ok_and(|n| n > 0) {}
            stopping = true;
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
            if !lost && !view_answers(&c.view) {
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
    let code = tsh::run::code_of(status);
    // Owned children go with their parent; their history stays.
    run.reap(&children);
    let owned: Vec<(String, String)> = children
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .map(|o| (o.agent.clone(), o.session.clone()))
        .collect();
    for (child, session) in owned {
        run.cancel(&child, &session);
    }
    if lost {
        lost_view(&c, code);
    } else if timed_out {
        let _ = ended_event(
            &c,
            "run.timeout",
            &format!("the run's timeout ({} s) ran out; it was stopped", c.timeout.unwrap_or(0)),
            code,
        );
        crate::cmd::session::finish(&c.ctx, c.uid, c.session_owner(), &c.session, code.max(1));
    } else {
        crate::cmd::session::finish(&c.ctx, c.uid, c.session_owner(), &c.session, code);
    }
    let _ = std::fs::write(c.runtime.join("exit"), format!("{code}\n"));
    let _ = crate::cmd::view::call(&c.control, json!({"op": "rm", "path": c.view}));
    // A view of a daemon that is gone is no one's to remove but ours.
    if matches!(rustix::fs::statfs(&c.view), Err(rustix::io::Errno::NOTCONN)) {
        let _ = rustix::mount::unmount(&c.view, rustix::mount::UnmountFlags::DETACH);
    }
    let _ = std::fs::remove_dir(&c.view);
    if idmapped.exists() {
        let _ = rustix::mount::unmount(&idmapped, rustix::mount::UnmountFlags::DETACH);
        let _ = std::fs::remove_dir(&idmapped);
    }
    for i in 0..c.mounts.len() {
        let _ = rustix::mount::unmount(prepared.join(i.to_string()), rustix::mount::UnmountFlags::DETACH);
    }
    let _ = std::fs::remove_dir_all(&prepared);
    // What stays of a run is its status (`exit`) and the supervisor's own log (0600).
    let _ = std::fs::remove_dir_all(c.runtime.join("term"));
    let _ = std::fs::remove_dir_all(c.runtime.join("receipt"));
    let _ = std::fs::remove_file(contract_file);
    let _ = std::fs::remove_file(c.runtime.join("seccomp.bpf"));
    let _ = std::fs::remove_file(c.runtime.join("pid"));
    groups.remove();
    eprintln!("agent {} session {}: terminal ended with status {code}", c.agent, c.session);
    Ok(())
}

/// Whether the view at `path` is still a mount its daemon answers on: a dead one gives
/// ENOTCONN, and one that a restarted daemon cleaned away is no FUSE mount any more.
fn view_answers(path: &Path) -> bool {
    const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;
    rustix::fs::statfs(path).is_ok_and(|st| st.f_type == FUSE_SUPER_MAGIC)
}

/// Appends an event saying why a run ended to its session, through /ctx.
fn ended_event(c: &Contract, kind: &str, reason: &str, code: i32) -> std::io::Result<()> {
    let dir = crate::cmd::session::dir(&c.ctx, c.uid, c.session_owner(), &c.session);
    let ts = humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string();
    let event = json!({"ts": ts, "type": kind, "agent": c.agent, "session": c.session,
        "status": "error", "reason": reason, "code": code});
    std::fs::OpenOptions::new()
        .append(true)
        .open(dir.join("events.jsonl"))
        .and_then(|mut f| f.write_all(format!("{event}\n").as_bytes()))
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
        crate::cmd::session::finish(&c.ctx, c.uid, c.session_owner(), &c.session, code.max(1));
    } else if let Some(storage) = &c.storage {
        let d = storage.join(format!("home/{}/agent/{}/session/{}", c.uid, c.session_owner(), c.session));
        let _ = std::fs::write(d.join("state"), "error\n");
    }
}

/// Runs `ctx agent stop`.
pub fn stop(agent: &str, session: &str) -> anyhow::Result<()> {
    let runtime = runtime_dir(agent, session);
    let Some(pid) = supervisor(&runtime) else {
        return Err(
            Exit::new(exit::FAILURE, format!("agent {agent} session {session} is not running")).into()
        );
    };
    let grace = std::fs::read(runtime.join("contract.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<Contract>(&b).ok())
        .map_or(5, |c| c.grace);
    if let Some(p) = rustix::process::Pid::from_raw(pid) {
        let _ = rustix::process::kill_process(p, rustix::process::Signal::TERM);
    }
    let t = Instant::now();
    while alive(pid) {
        if t.elapsed() > Duration::from_secs(grace + 5) {
            return Err(Exit::new(exit::FAILURE, format!("the supervisor (pid {pid}) did not stop")).into());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let code = std::fs::read_to_string(runtime.join("exit")).unwrap_or_default();
    println!("stopped agent {agent} session {session} (status {})", code.trim());
    Ok(())
}

/// Runs `ctx agent ps`: AGENT SESSION PID.
pub fn ps() -> anyhow::Result<()> {
    let Ok(agents) = std::fs::read_dir(RUNTIME) else { return Ok(()) };
    for a in agents.flatten() {
        let Ok(sessions) = std::fs::read_dir(a.path()) else { continue };
        for s in sessions.flatten() {
            if let Some(pid) = supervisor(&s.path()) {
                println!("{}\t{}\t{pid}", a.file_name().to_string_lossy(), s.file_name().to_string_lossy());
            }
        }
    }
    Ok(())
}

/// Runs `ctx agent watch|attach`: relays the terminal to this one until it ends.
pub fn connect(agent: &str, session: &str, attach: bool) -> anyhow::Result<()> {
    let sock = runtime_dir(agent, session).join("term/main.sock");
    let mut s = std::os::unix::net::UnixStream::connect(&sock).map_err(|e| {
        Exit::new(exit::UNAVAILABLE, format!("{}: {e} (is the agent running?)", sock.display()))
    })?;
    s.write_all(if attach { b"attach\n" } else { b"watch\n" })?;
    if attach {
        let mut w = s.try_clone()?;
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            let mut stdin = std::io::stdin();
            while let Ok(n) = stdin.read(&mut buf) {
                if n == 0 || w.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        });
    }
    let mut out = std::io::stdout();
    let mut buf = [0u8; 8192];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                out.write_all(&buf[..n])?;
                out.flush()?;
            }
        }
    }
    // The terminal ended: its status is the watcher's too, once the supervisor recorded it.
    let exit_file = runtime_dir(agent, session).join("exit");
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(5) {
        if let Some(code) = std::fs::read_to_string(&exit_file).ok().and_then(|t| t.trim().parse::<u8>().ok())
        {
            return if code == 0 { Ok(()) } else { Err(Exit::quiet(code).into()) };
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// Types one line into the terminal (`ctx send`).
pub fn send(agent: &str, session: &str, text: &str) -> anyhow::Result<()> {
    let sock = runtime_dir(agent, session).join("term/main.sock");
    let mut s = std::os::unix::net::UnixStream::connect(&sock).map_err(|e| {
        Exit::new(exit::UNAVAILABLE, format!("{}: {e} (is the agent running?)", sock.display()))
    })?;
    s.write_all(b"attach\n")?;
    s.write_all(text.as_bytes())?;
    s.write_all(b"\r")?;
    s.flush()?;
    // Give the terminal a moment to take the bytes before the connection closes.
    std::thread::sleep(Duration::from_millis(50));
    Ok(())
}
