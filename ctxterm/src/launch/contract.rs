//! The launch contract: everything a sandbox is started from, derived from the agent object
//! (read through the host mount) and its policy before anything is spawned. Every agent control
//! counts: identity (`uid`, `gid`, `groups`), `label` and `policy` (network, mounts, shared
//! tool directories), `mount`, `cwd`, `env` (the launcher's variables, [`RESERVED_ENV`], cannot
//! be overridden), `path` (CTX_PATH, plus the tool directories of granted shared spaces),
//! `limits` and `timeout`. The sandbox's umask is [`SANDBOX_UMASK`].

use std::path::{Path, PathBuf};

use policy::runtime;
use policy::v0::{Class, Permission, Policy, Query};
use serde::{Deserialize, Serialize};

use super::{Error, Result, models, profiles};

/// One bind of the mount table, with its flags.
#[derive(Debug, Serialize, Deserialize)]
pub struct Bind {
    pub source: PathBuf,
    pub target: PathBuf,
    pub rw: bool,
    /// A `hide` line: nothing bound, the target covered by an empty read-only one.
    #[serde(default)]
    pub hide: bool,
    pub nosuid: bool,
    pub nodev: bool,
    pub noexec: bool,
}

/// The umask of everything in a sandbox: files an agent creates are not writable by others.
pub const SANDBOX_UMASK: u32 = 0o022;

/// Where a run's workspace is bound in its sandbox.
pub const WORKSPACE: &str = "/workspace";

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
    pub agent: String,
    pub session: String,
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    pub network: bool,
    pub view: PathBuf,
    pub workspace: Option<PathBuf>,
    /// The mount table: the agent's own, then the operator's `--mount`s.
    pub mounts: Vec<Bind>,
    /// The working directory inside the sandbox (the agent's `cwd`).
    pub cwd: String,
    /// Seconds the run may last (the agent's `timeout`, or `--timeout`).
    pub timeout: Option<u64>,
    pub env: Vec<(String, String)>,
    pub cmd: Vec<String>,
    pub runtime: PathBuf,
    pub control: PathBuf,
    pub grace: u64,
    /// The agent whose session this run resumes (`--resume`), when it is not the run's own.
    pub session_of: Option<String>,
    /// The shared space the session is in (`--shared`): `shared/<space>/agent/<a>/session/<s>/`.
    #[serde(default)]
    pub space: Option<String>,
    /// The command starts once the first client connects (`start --wait` is that client).
    pub wait_client: bool,
    /// Resource ceilings (see `policy::limits`): memory in bytes, processes, CPU percent.
    pub memory: Option<u64>,
    pub pids: Option<u64>,
    pub cpu: Option<u64>,
    /// The storage the daemon serves (from its `status`), for when /ctx no longer answers.
    pub storage: Option<PathBuf>,
    /// The host's /ctx mount.
    pub ctx: PathBuf,
    /// The command-less tsh path: the view is read-only but for the run's records. A command
    /// of its own gets a writable one, once it is seen to be a read-write CortexFS mount.
    #[serde(default)]
    pub records_only: bool,
    /// What the run starts without, and why (each one a `run.warning` event in the session).
    #[serde(default)]
    pub warnings: Vec<String>,
    /// The agent's persistent home as the run's view shows it, bound at `/home/agent` (a
    /// command of its own; the tsh path keeps a private tmpfs there).
    #[serde(default)]
    pub home: Option<PathBuf>,
    /// Directories the profile needs in that home.
    #[serde(default)]
    pub home_dirs: Vec<String>,
    /// Files the profile writes into that home before the run (relative path, contents).
    #[serde(default)]
    pub home_files: Vec<(String, String)>,
    /// Files the profile makes in that home when they are missing.
    #[serde(default)]
    pub home_seed: Vec<(String, String)>,
    /// The model the run's CLI is pointed at (`PROVIDER/MODEL`).
    #[serde(default)]
    pub model: Option<String>,
    /// The profile the run was started with, and its command before the operator's arguments
    /// (the program, its wiring to the model, the agent's instructions): a socket turn that
    /// joins the run runs this with the turn's arguments.
    #[serde(default)]
    pub profile: Option<(String, Vec<String>)>,
    /// The variable the CLI reads its key from. The key itself is never in the contract.
    #[serde(default)]
    pub key_env: Option<String>,
    /// The key: handed to the supervisor through a pipe, never written down.
    #[serde(skip)]
    pub key: Option<Key>,
    /// A port of the host's loopback the run reaches its model on, without a network (pasta
    /// splices that one port into an otherwise empty namespace).
    #[serde(default)]
    pub egress: Option<u16>,
    /// The model's base URL when it is elsewhere and the policy grants no network: the
    /// supervisor serves the run an egress proxy to that `host:port` alone (see
    /// [`super::egress`]) and splices the proxy's port in.
    #[serde(default)]
    pub proxy: Option<String>,
    /// The command runs on the caller's streams, without a PTY.
    #[serde(default)]
    pub headless: bool,
}

/// A model key in memory, and the variables of the caller's it may have come from (the
/// supervisor never inherits them); never printed.
pub struct Key {
    /// The key.
    pub value: Vec<u8>,
    /// The route's variables.
    pub vars: Vec<String>,
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(..)")
    }
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::Invalid(msg.into())
}

/// Where the configuration of the runs of `ctx`'s daemon is read: the active generation of
/// its storage when the storage's configuration is a repository (a staged edit, made through
/// `/ctx` or by hand, gives a run nothing until it is committed), else the host mount itself.
pub fn config_root(ctx: &Path) -> Result<PathBuf> {
    // root's: the daemon's status file
    let status =
        crate::beneath::Tree::open(ctx).and_then(|t| t.read_string("status", 64 << 10)).unwrap_or_default();
    let field = |f: &str| policy::status::field(&status, f).map(str::to_owned);
    let (Some(id), Some(storage)) = (field("generation"), field("storage")) else {
        return Ok(ctx.to_path_buf());
    };
    ringfs::config::active(Path::new(&storage)).ok_or_else(|| {
        Error::Unavailable(format!(
            "{storage}: generation {id} is active but not checked out in {}",
            ringfs::config::generations_dir(Path::new(&storage)).display()
        ))
    })
}

/// Waits (up to 3 s) until the daemon serving the host mount `ctx` says in its `status` that it
/// serves configuration generation `id`; whether it did.
pub fn served(ctx: &Path, id: &str) -> bool {
    let t = std::time::Instant::now();
    loop {
        // root's: the daemon's status file
        let status = crate::beneath::Tree::open(ctx)
            .and_then(|t| t.read_string("status", 64 << 10))
            .unwrap_or_default();
        if policy::status::field(&status, "generation") == Some(id) {
            return true;
        }
        if t.elapsed() >= std::time::Duration::from_secs(3) {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// An agent's control `name`, from `root`: the configuration a run is derived from (see
/// [`config_root`]); read beneath it, never through a symlink, at most a control's bound.
pub fn read_control(root: &Path, agent: &str, name: &str) -> Result<String> {
    let rel = Path::new("agent").join(format!("{agent}.d")).join(name);
    let max = policy::controls::CONTROL_MAX;
    let bytes = ringfs::config::read_config(root, &rel, max as u64 + 1)
        .map_err(|source| Error::Control { path: root.join(&rel), source })?;
    if bytes.len() > max {
        return Err(invalid(format!("{}: over {max} bytes", rel.display())));
    }
    String::from_utf8(bytes).map_err(|_| invalid(format!("{}: not UTF-8 text", rel.display())))
}

/// Parses `--mount SRC TGT ro|rw`.
pub fn extra_mount(spec: &[String]) -> Result<(PathBuf, PathBuf, bool)> {
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
    /// A launch profile (default: the agent's `profile` control when it names a hosted CLI
    /// and no command is given).
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
    /// Run the command on the caller's streams, without a PTY (with `wait`).
    pub headless: bool,
    /// Run on a session in this shared space (`--shared SPACE`).
    pub shared: Option<String>,
}

/// Whether pasta can give `uid` a network: pasta installed, `/dev/net/tun` present and open to
/// that uid (pasta runs as the agent).
pub fn network_ready(uid: u32) -> Result<(), String> {
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

/// The shell of a sandbox: bash where the host has it.
fn shell() -> &'static str {
    if Path::new("/bin/bash").exists() { "/bin/bash" } else { "/bin/sh" }
}

/// Derives the contract of the run `s` asks for.
pub fn derive(s: &Start) -> Result<Contract> {
    preflight().map_err(Error::Host)?;
    policy::name::validate(&s.agent).map_err(|e| invalid(format!("agent {:?}: {e}", s.agent)))?;
    policy::name::validate(&s.session).map_err(|e| invalid(format!("session {:?}: {e}", s.session)))?;
    // One generation for the whole run: every control, the model and its route are read from
    // the configuration active now, never from a staged edit, never from two commits.
    let root = config_root(&s.ctx)?;
    if std::fs::symlink_metadata(root.join("agent").join(&s.agent)).is_err() {
        return Err(super::agents::no_agent(&s.agent, &s.ctx));
    }
    let num = |name: &str| -> Result<u32> {
        let t = read_control(&root, &s.agent, name)?;
        t.trim()
            .parse()
            .map_err(|_| invalid(format!("agent/{}.d/{name}: {:?} is not a number", s.agent, t.trim())))
    };
    let (uid, gid) = (num("uid")?, num("gid")?);
    if uid == u32::MAX || gid == u32::MAX {
        // -1 is "no change" to setresuid and setresgid: the sandbox would stay root's.
        return Err(invalid(format!("agent/{}.d/uid or gid: 4294967295 (-1) is no identity", s.agent)));
    }
    if uid == 0 {
        eprintln!(
            "ctx: warning: agent {} runs as uid 0: in its sandbox it is root over everything bound there \
             (give it its own uid: agent/{}.d/uid)",
            s.agent, s.agent
        );
    }
    let groups = read_control(&root, &s.agent, "groups")
        .unwrap_or_default()
        .split_ascii_whitespace()
        .map(|g| g.parse::<u32>().map_err(|_| invalid(format!("agent/{}.d/groups: {g:?}", s.agent))))
        .collect::<Result<Vec<u32>>>()?;
    let label = read_control(&root, &s.agent, "label")?.trim().to_owned();
    let policy = Policy::from_text(read_control(&root, &s.agent, "policy")?.as_bytes())
        .map_err(|_| invalid(format!("agent/{}.d/policy does not parse (ctx policy check)", s.agent)))?;
    if let Some(space) = &s.shared {
        shared_session_allowed(&s.ctx, &s.agent, space, (&label, &policy), (uid, gid, &groups))?;
    }
    let granted = policy.allows(&Query {
        subject: &label,
        class: Class::Network,
        object: "default",
        permission: Permission::Connect,
    });
    // A grant the host cannot serve (no pasta, no usable /dev/net/tun) starts the run without
    // a network, and the session says why.
    let mut warnings = Vec::new();
    let network = match granted.then(|| network_ready(uid)) {
        Some(Err(why)) => {
            warnings.push(format!(
                "its policy grants network:default connect, but {why}: the run has no network"
            ));
            false
        }
        Some(Ok(())) => true,
        None => false,
    };
    // Mounts: the agent's own table, then the operator's --mount; each one authorized by the
    // agent's policy (`mount:TARGET read`, and `write` for rw), or nothing starts.
    let table = read_control(&root, &s.agent, "mount").unwrap_or_default();
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
            hide: m.mode == policy::mount::MountMode::Hide,
            nosuid: m.options.nosuid,
            nodev: m.options.nodev,
            noexec: m.options.noexec,
        })
        .collect();
    // The operator's --mount onto /workspace names the run's workspace (as --cwd does): it is
    // the operator's to give and needs no grant; read-only, it is bound so over the workspace.
    let mut given_workspace = None;
    for (source, target, rw) in &s.mounts {
        if target == Path::new(WORKSPACE) {
            if s.no_workspace {
                return Err(invalid("--mount onto /workspace and --no-default-workspace: choose one"));
            }
            if let Some(c) = s.cwd.as_ref().filter(|c| *c != source) {
                return Err(invalid(format!(
                    "--cwd {} and --mount {} /workspace name two workspaces: give one",
                    c.display(),
                    source.display()
                )));
            }
            given_workspace = Some(source.clone());
            if *rw {
                continue;
            }
        }
        mounts.push(Bind {
            source: source.clone(),
            target: target.clone(),
            rw: *rw,
            hide: false,
            nosuid: true,
            nodev: true,
            noexec: false,
        });
    }
    for Bind { source: src, target: tgt, rw, hide, .. } in &mounts {
        if *hide {
            // Hiding narrows what the agent sees: no grant needed.
            continue;
        }
        let target = tgt.to_string_lossy();
        if given_workspace.as_ref().is_some_and(|w| w == src) && tgt == Path::new(WORKSPACE) {
            continue;
        }
        let allows = |permission| {
            policy.allows(&Query { subject: &label, class: Class::Mount, object: &target, permission })
        };
        if !allows(Permission::Read) || (*rw && !allows(Permission::Write)) {
            return Err(Error::Denied(format!(
                "mount {} at {target} ({}): the agent's policy does not allow {label} mount:{target} {}",
                src.display(),
                if *rw { "rw" } else { "ro" },
                if *rw { "read and write" } else { "read" }
            )));
        }
        if !src.exists() {
            return Err(invalid(format!("mount {}: the source does not exist", src.display())));
        }
    }
    let workspace = if s.no_workspace {
        None
    } else {
        Some(match (&given_workspace, &s.cwd) {
            (Some(w), _) => w.clone(),
            (None, Some(c)) => c.clone(),
            (None, None) => std::env::current_dir()?,
        })
    };
    let home = format!("/ctx/home/{uid}");
    // CTX_PATH: the agent's `path`, then the tool directories of the shared spaces it may see.
    let path_control = read_control(&root, &s.agent, "path").unwrap_or_default();
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
        ("SHELL".to_owned(), shell().to_owned()),
        ("TERM".to_owned(), std::env::var("TERM").unwrap_or_else(|_| "xterm-256color".into())),
        ("LANG".to_owned(), "C.UTF-8".to_owned()),
        ("PATH".to_owned(), "/ctx/bin:/usr/local/bin:/usr/bin:/bin".to_owned()),
    ];
    if workspace.is_some() {
        env.push(("CTX_WORKSPACE".to_owned(), WORKSPACE.to_owned()));
    }
    // The agent's own variables: KEY=VALUE lines; the launcher's are not theirs to change.
    for line in read_control(&root, &s.agent, "env").unwrap_or_default().lines() {
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
    let cwd = match read_control(&root, &s.agent, "cwd").unwrap_or_default().trim() {
        "" | "/workspace" if workspace.is_none() => "/".to_owned(),
        "" => WORKSPACE.to_owned(),
        c => {
            policy::path::check_absolute(c).map_err(|e| invalid(format!("agent/{}.d/cwd: {e}", s.agent)))?;
            c.to_owned()
        }
    };
    let timeout = match s.timeout {
        Some(t) => Some(t),
        None => match read_control(&root, &s.agent, "timeout").unwrap_or_default().trim() {
            "" => None,
            t => Some(t.parse::<u64>().ok().filter(|&t| t > 0).ok_or_else(|| {
                invalid(format!("agent/{}.d/timeout: {t:?} is not a number of seconds", s.agent))
            })?),
        },
    };
    let (mut model, mut key_env, mut key, mut egress, mut proxy) = (None, None, None, None, None);
    let (mut home_dirs, mut home_files, mut home_seed) = (Vec::new(), Vec::new(), Vec::new());
    let mut profile = None;
    // No --profile and no command: the agent's `profile` control says what runs, as it does
    // for a turn sent to its socket (a hosted CLI; anything else runs tsh).
    let chosen = s.profile.clone().or_else(|| {
        let own = read_control(&root, &s.agent, "profile").unwrap_or_default();
        let own = own.lines().next().unwrap_or("").trim();
        (s.cmd.is_empty() && profiles::hosted(own)).then(|| own.to_owned())
    });
    let cmd = match &chosen {
        Some(name) => {
            let p = profiles::get(name)?;
            if p.program.starts_with("/usr/") && !Path::new(&p.program).exists() {
                return Err(Error::Unavailable(format!(
                    "profile {}: {} is missing ({})",
                    p.name, p.program, p.install
                )));
            }
            env.extend(p.env.iter().map(|(k, v)| (k.clone(), v.clone())));
            home_dirs = p.dirs.clone();
            home_seed = p.seed.iter().map(|(f, t)| (f.clone(), t.clone())).collect();
            let mut args: Vec<String> = p.args.clone();
            // The agent's model (or main): none at all leaves the CLI with its own configuration.
            let named = read_control(&root, &s.agent, "model").unwrap_or_default();
            let named = named.lines().next().unwrap_or("").trim().to_owned();
            let unset = named.is_empty() && models::alias_target(&root, "main").is_none();
            if p.hosted && unset {
                warnings.push(format!(
                    "profile {}: the agent names no model and model/main is not set: the CLI runs with \
                     its own configuration (ctx model add, ctx model alias main)",
                    p.name
                ));
            } else if p.hosted {
                let m = models::for_launch(&root, &s.agent, &label, &policy, &named)?;
                let w = profiles::wire(p, &m)?;
                if !network && m.driver.base_url.is_loopback() {
                    egress = Some(m.driver.base_url.port);
                } else if !network {
                    proxy = Some(m.driver.base_url.to_string());
                }
                key = models::key(&m)?.map(|value| Key { value, vars: m.driver.key_vars() });
                key_env = w.key_env.filter(|_| key.is_some());
                for (k, v) in w.env {
                    env.retain(|(key, _)| *key != k);
                    env.push((k, v));
                }
                args.extend(w.args);
                home_files = w.files;
                model = Some(m.name);
            }
            // The agent's instructions, as the CLI takes them: an agent.update shows in the next run.
            let system = read_control(&root, &s.agent, "system.md").unwrap_or_default();
            args.extend(profiles::instruct(p, &system));
            let base: Vec<String> = std::iter::once(p.program.clone()).chain(args).collect();
            profile = Some((p.name.clone(), base.clone()));
            base.into_iter().chain(s.cmd.iter().cloned()).collect()
        }
        None if s.cmd.is_empty() => vec!["/ctx/bin/tsh".to_owned()],
        None => s.cmd.clone(),
    };
    let records_only = s.cmd.is_empty() && chosen.as_deref().is_none_or(|p| p == "tsh");
    let limits = ceilings(s, &root)?;
    let session_of = match &s.resume {
        Some(owner) => Some(resumable(s, &root, owner, &label, &policy, (uid, gid, &groups))?),
        None => None,
    };
    Ok(Contract {
        agent: s.agent.clone(),
        session: s.session.clone(),
        uid,
        gid,
        groups,
        network,
        view: runtime::view_dir(&s.control, &s.agent, &s.session),
        workspace,
        mounts,
        cwd,
        timeout,
        env,
        cmd,
        runtime: runtime::run_dir(&s.control, &s.agent, &s.session),
        control: s.control.clone(),
        grace: s.grace,
        session_of,
        space: s.shared.clone(),
        wait_client: s.wait,
        memory: limits.memory,
        pids: limits.pids,
        cpu: limits.cpu,
        storage: std::fs::read_to_string(s.ctx.join("status"))
            .ok()
            .and_then(|t| policy::status::field(&t, "storage").map(PathBuf::from)),
        ctx: s.ctx.clone(),
        records_only,
        warnings,
        home: (!records_only).then(|| {
            runtime::agent_home(&runtime::view_dir(&s.control, &s.agent, &s.session), uid, &s.agent)
        }),
        home_dirs,
        home_files,
        home_seed,
        model,
        profile,
        key_env,
        key,
        egress,
        proxy,
        headless: s.headless && s.wait,
    })
}

/// Checks that the run of `s` may resume `owner`'s session: the agent's policy grants
/// `session:<owner>/<session> resume`, the session exists, and Linux permissions let the
/// agent write it (in a home: the owner's uid is the agent's; in a shared space: the session
/// directory's mode bits let the agent's uid, gid or groups write it). Returns the owner.
fn resumable(
    s: &Start,
    root: &Path,
    owner: &str,
    label: &str,
    policy: &Policy,
    ids: (u32, u32, &[u32]),
) -> Result<String> {
    let (uid, gid, groups) = ids;
    policy::name::validate(owner).map_err(|e| invalid(format!("--resume {owner:?}: {e}")))?;
    let object = format!("{owner}/{}", s.session);
    let q = Query { subject: label, class: Class::Session, object: &object, permission: Permission::Resume };
    if !policy.allows(&q) {
        return Err(Error::Denied(format!(
            "agent/{}.d/policy does not allow {label} session:{object} resume",
            s.agent
        )));
    }
    if let Some(space) = &s.shared {
        let dir = s.ctx.join(runtime::shared_session_path(space, owner, &s.session));
        if !dir.is_dir() {
            return Err(Error::State(format!(
                "agent {owner} has no session {} in shared/{space}",
                s.session
            )));
        }
        may_write(&dir, uid, gid, groups).map_err(Error::Denied)?;
        return Ok(owner.to_owned());
    }
    let owner_uid: u32 = read_control(root, owner, "uid")?
        .trim()
        .parse()
        .map_err(|_| invalid(format!("agent/{owner}.d/uid is not a number")))?;
    if owner_uid != uid {
        return Err(Error::Denied(format!(
            "session {object} belongs to uid {owner_uid}, agent {} runs as {uid}: Linux permissions \
                 would refuse its writes (give both agents one uid to share sessions, or share the \
                 session in a shared space: --shared)",
            s.agent
        )));
    }
    let dir = runtime::session_dir(&s.ctx, uid, owner, &s.session);
    if !dir.is_dir() {
        return Err(Error::State(format!("agent {owner} has no session {}", s.session)));
    }
    Ok(owner.to_owned())
}

/// Checks that a run of `agent` may keep its session in the shared space `space`: the agent's
/// policy grants `shared:<space> write` (which is also what makes the space visible in its
/// view), the space exists, and Linux permissions let the agent's identity create in it.
pub fn shared_session_allowed(
    ctx: &Path,
    agent: &str,
    space: &str,
    authority: (&str, &Policy),
    ids: (u32, u32, &[u32]),
) -> Result<()> {
    let ((label, policy), (uid, gid, groups)) = (authority, ids);
    policy::name::validate(space).map_err(|e| invalid(format!("--shared {space:?}: {e}")))?;
    let q = Query { subject: label, class: Class::Shared, object: space, permission: Permission::Write };
    if !policy.allows(&q) {
        return Err(Error::Denied(format!(
            "agent/{agent}.d/policy does not allow {label} shared:{space} write"
        )));
    }
    let root = ctx.join("shared").join(space);
    if !root.is_dir() {
        return Err(Error::State(format!("no shared space {space} (ctx shared new {space})")));
    }
    let agents = root.join("agent");
    may_write(if agents.is_dir() { &agents } else { &root }, uid, gid, groups).map_err(Error::Denied)
}

/// Whether mode bits let `uid` (with `gid` and `groups`) create in the directory `dir`.
pub fn may_write(dir: &Path, uid: u32, gid: u32, groups: &[u32]) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let bits = if uid == 0 {
        0o7
    } else if m.uid() == uid {
        m.mode() >> 6
    } else if m.gid() == gid || groups.contains(&m.gid()) {
        m.mode() >> 3
    } else {
        m.mode()
    };
    if bits & 0o3 == 0o3 {
        return Ok(());
    }
    Err(format!(
        "Linux permissions: {} (mode {:o}, {}:{}) is not writable by uid {uid} gid {gid} groups {groups:?}",
        dir.display(),
        m.mode() & 0o7777,
        m.uid(),
        m.gid()
    ))
}

/// The run's ceilings: the agent's `limits` (or the defaults), under the flags; none with
/// `--no-ceilings`. Refused (69) when the host cannot apply one.
fn ceilings(s: &Start, root: &Path) -> Result<policy::limits::Limits> {
    if s.no_ceilings {
        return Ok(policy::limits::Limits { memory: None, pids: None, cpu: None, disk: None, files: None });
    }
    let text = read_control(root, &s.agent, "limits").unwrap_or_default();
    let mut l = policy::limits::parse(text.as_bytes())
        .map_err(|e| invalid(format!("agent/{}.d/limits: {e}", s.agent)))?;
    l.memory = s.memory.or(l.memory);
    l.pids = s.pids.or(l.pids);
    l.cpu = s.cpu.or(l.cpu);
    super::cgroups::plan(&l).map_err(|why| {
        Error::Unavailable(format!(
            "resource ceilings cannot be applied here: {why}; mount the controller (cgroup v2 or v1), \
                 or start without ceilings with --no-ceilings"
        ))
    })?;
    Ok(l)
}

impl Contract {
    /// The agent whose session directory the run uses: its own, or the one it resumes.
    pub fn session_owner(&self) -> &str {
        self.session_of.as_deref().unwrap_or(&self.agent)
    }

    /// The run's session directory under `root` (`/ctx`, or the storage): in the session
    /// owner's home, or in the shared space.
    pub fn session_dir(&self, root: &Path) -> PathBuf {
        match &self.space {
            Some(space) => {
                root.join(runtime::shared_session_path(space, self.session_owner(), &self.session))
            }
            None => runtime::session_dir(root, self.uid, self.session_owner(), &self.session),
        }
    }
}
