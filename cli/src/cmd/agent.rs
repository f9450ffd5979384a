//! `ctx agent new|ls|inspect|rm`: agent objects in storage (spec §5).
//!
//! `new` writes a complete `agent/<NAME>` object through the object store, like bootstrap does for
//! tools: the controls are generated, validated one by one, staged with a `cortexfs.object/v2`
//! manifest, checked (digests included) and published atomically in the system tier. The
//! executable is a small `/bin/sh` launcher for `ctx agent start NAME`. `rm` uninstalls through
//! the same store and only shows its plan unless `--yes`.
//!
//! Defaults of `new`, chosen so that an agent holds nothing it was not given:
//! - `uid` and `gid` are one id of its own from `policy::ids::AGENT_IDS` (1879113728 and up,
//!   a range no host account uses) unless `--uid`/`--gid` name an identity, so a fresh agent
//!   owns no files on the host and no other agent's; a child shares its parent's; `groups` is
//!   empty;
//! - `label` is the name with `.`, `-` and `+` turned into `_`, plus `_t` (`my-bot` ->
//!   `my_bot_t`);
//! - `policy` grants exactly what the flags ask: `tool:T execute` per `--tool`, `model:M use`
//!   per `--model`, `shared:N read` (and `write`) per `--shared`, and `mount:TARGET read` (and
//!   `write` for `rw`) per `--mount`, so each mount in the table is also authorized;
//! - each `--mount` is `nosuid,nodev` unless its MODE names options (`rw,noexec`, or `ro,-` for
//!   none);
//! - `owner` is the uid running ctx; `cwd` is `/workspace`; `path` is
//!   `/ctx/tool:/ctx/home/<uid>/tool`; `life` `owned`; `iso` `bwrap`; `abi` `1`; `approval`
//!   `never`; `env` empty; `model` the first `--model` (or empty).
//!
//! Exit codes: 0 ok, 1 failure (exists, missing), 2 invalid input, 13 permission denied.

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use clap::Subcommand;
use policy::controls::{self, ObjectClass, Owner};
use policy::mount::{Mount, MountMode, MountOptions};
use policy::v0::Class;
use ringfs::object::publish::{self, Tier};

use crate::cmd::object::DEFAULT_STORAGE;
use crate::cmd::{launch, session};
use crate::exit::{self, Exit};
use crate::out;

/// The uid and gid of `nobody`, for a child whose parent names none.
const NOBODY: u32 = 65534;
/// The options of a `--mount` whose MODE names none.
const DEFAULT_MOUNT_OPTIONS: MountOptions = MountOptions { nosuid: true, nodev: true, noexec: false };

/// Agent objects.
#[derive(Debug, Subcommand)]
pub enum Cmd {
    /// Create agent/NAME with its controls; grants exactly what the flags ask.
    New(NewArgs),
    /// List installed agents: NAME, LABEL and UID, tab-separated, sorted by name.
    Ls {
        #[command(flatten)]
        at: At,
        /// Print a JSON array of {"name","label","uid"} objects.
        #[arg(long)]
        json: bool,
    },
    /// Print every control of agent/NAME (but its log) as `== CONTROL ==` and its contents.
    Inspect {
        #[command(flatten)]
        at: At,
        /// The agent.
        name: String,
    },
    /// Remove agent/NAME: its executable first, then its controls. Shows the plan unless --yes.
    Rm {
        #[command(flatten)]
        at: At,
        /// The agent.
        name: String,
        /// Do it (without this, only print the plan).
        #[arg(long)]
        yes: bool,
    },
    /// Start the agent's terminal in a bubblewrap sandbox; returns once it answers.
    Start(StartArgs),
    /// Stop a running agent session: SIGTERM, the grace period, SIGKILL; view and socket removed.
    Stop {
        /// The agent.
        name: String,
        /// The session.
        #[arg(long, default_value = "default")]
        session: String,
    },
    /// List running agent sessions: AGENT, SESSION, supervisor PID.
    Ps,
    /// Show an agent's terminal output (read only).
    Watch {
        /// The agent.
        name: String,
        /// The session.
        #[arg(long, default_value = "default")]
        session: String,
    },
    /// Join an agent's terminal: its output, and this terminal's input typed into it.
    Attach {
        /// The agent.
        name: String,
        /// The session.
        #[arg(long, default_value = "default")]
        session: String,
    },
    /// Type one line into an agent's terminal.
    Send {
        /// The agent.
        name: String,
        /// The session.
        #[arg(long, default_value = "default")]
        session: String,
        /// The line.
        text: String,
    },
    /// Print a session's messages (messages.jsonl).
    History {
        /// The agent.
        name: String,
        #[command(flatten)]
        at: SessionAt,
    },
    /// Print a session's latest output (latest.md); --rebuild first rebuilds it from messages.
    Output {
        /// The agent.
        name: String,
        #[command(flatten)]
        at: SessionAt,
        /// Rebuild latest.md from the last assistant message first.
        #[arg(long)]
        rebuild: bool,
    },
    /// Check a session's context pack (context/pack.json and pack.md): shape and provenance.
    Pack {
        /// The agent.
        name: String,
        #[command(flatten)]
        at: SessionAt,
        /// Check (the only action: CortexFS never builds packs).
        #[arg(long, required = true)]
        check: bool,
    },
    /// List a session's children: ID, AGENT, SESSION, STATUS.
    Children {
        /// The agent.
        name: String,
        #[command(flatten)]
        at: SessionAt,
    },
    /// Wait until a child ends: exit 0 done, 1 error, 130 cancelled.
    Wait {
        /// The parent agent.
        name: String,
        /// The child (agent name or record id).
        child: String,
        #[command(flatten)]
        at: SessionAt,
        /// Give up after this many seconds (exit 69).
        #[arg(long)]
        timeout: Option<u64>,
    },
    /// The supervisor of one sandbox (started by `start`).
    #[command(hide = true)]
    Supervise {
        /// The launch contract.
        contract: PathBuf,
    },
}

/// A session, seen through the host's /ctx.
#[derive(Debug, clap::Args)]
pub struct SessionAt {
    /// The session.
    #[arg(long, default_value = "default")]
    session: String,
    /// The host's /ctx mount.
    #[arg(long, default_value = "/ctx")]
    ctx: PathBuf,
}

/// Arguments of `ctx agent start`.
#[derive(Debug, clap::Args)]
pub struct StartArgs {
    /// The agent.
    name: String,
    /// The session.
    #[arg(long, default_value = "default")]
    session: String,
    /// The directory bound at /workspace (default: the current directory).
    #[arg(long)]
    cwd: Option<PathBuf>,
    /// An extra mount: SOURCE TARGET ro|rw (TARGET may not be / or under /ctx).
    #[arg(long, num_args = 3, value_names = ["SOURCE", "TARGET", "MODE"])]
    mount: Vec<String>,
    /// No /workspace.
    #[arg(long)]
    no_default_workspace: bool,
    /// Run on agent OTHER's session --session instead of one of this agent's own (the policy
    /// must grant `session:OTHER/SESSION resume`, and both agents must share a uid).
    #[arg(long, value_name = "OTHER")]
    resume: Option<String>,
    /// Stop the run after SECONDS (over agent/NAME.d/timeout); its session says so.
    #[arg(long, value_name = "SECONDS")]
    timeout: Option<u64>,
    /// The host's /ctx mount.
    #[arg(long, default_value = "/ctx")]
    ctx: PathBuf,
    /// The daemon's control socket.
    #[arg(long, default_value = server::control::DEFAULT_SOCKET)]
    control: PathBuf,
    /// Wait until the terminal ends and exit with its status.
    #[arg(long)]
    wait: bool,
    /// Seconds between SIGTERM and SIGKILL when stopping.
    #[arg(long, default_value_t = 5)]
    grace: u64,
    /// Memory ceiling (bytes, or with K, M, G, T), over agent/NAME.d/limits (default 4G).
    #[arg(long, value_parser = policy::limits::parse_size)]
    memory: Option<u64>,
    /// Ceiling on processes and threads, over agent/NAME.d/limits (default 1024).
    #[arg(long)]
    pids: Option<u64>,
    /// CPU ceiling in percent of one CPU, over agent/NAME.d/limits (default none).
    #[arg(long)]
    cpu: Option<u64>,
    /// Start without resource ceilings (a host with no cgroup controller for them refuses
    /// otherwise).
    #[arg(long)]
    no_ceilings: bool,
    /// A hosted CLI profile: tsh, codex, claude or pi (arguments after -- go to it).
    #[arg(long)]
    profile: Option<String>,
    /// The command (default: tsh).
    #[arg(last = true)]
    cmd: Vec<String>,
}

/// The storage agents live in (always the system tier).
#[derive(Debug, clap::Args)]
pub struct At {
    /// The storage directory.
    #[arg(long, default_value = DEFAULT_STORAGE)]
    source: PathBuf,
}

/// Arguments of `ctx agent new`.
#[derive(Debug, clap::Args)]
pub struct NewArgs {
    #[command(flatten)]
    at: At,
    /// The agent's name.
    name: String,
    /// Policy subject (default: NAME with . - + as _, plus _t).
    #[arg(long, value_parser = parse_label)]
    label: Option<String>,
    /// Grant `model:M use`; the first is the agent's model (repeatable).
    #[arg(long = "model", value_name = "M", value_parser = parse_model)]
    models: Vec<String>,
    /// Grant `tool:T execute` (repeatable).
    #[arg(long = "tool", value_name = "T", value_parser = parse_tool)]
    tools: Vec<String>,
    /// Grant a shared space: N:read, or N:write for read and write (repeatable).
    #[arg(long = "shared", value_name = "N:read|write", value_parser = parse_shared)]
    shared: Vec<Shared>,
    /// Bind SOURCE at TARGET; MODE is ro or rw, optionally with options (rw,noexec; ro,- for
    /// none; default nosuid,nodev). TARGET may not be / or under /ctx (repeatable).
    #[arg(
        long = "mount",
        num_args = 3,
        value_names = ["SOURCE", "TARGET", "MODE"],
        action = clap::ArgAction::Append
    )]
    mounts: Vec<String>,
    /// The agent's uid.
    #[arg(long)]
    uid: Option<u32>,
    /// The agent's primary gid.
    #[arg(long)]
    gid: Option<u32>,
    /// Supplementary group ids, comma-separated.
    #[arg(long, value_delimiter = ',', value_name = "G,G")]
    groups: Vec<u32>,
    /// Create the agent as a child of PARENT (agent.create): the child may only narrow PARENT's
    /// world; every widening is refused with its reason (exit 13). Ids default to the parent's.
    #[arg(long, value_parser = parse_tool)]
    parent: Option<String>,
}

/// A `--shared` grant.
#[derive(Clone, Debug)]
struct Shared {
    name: String,
    write: bool,
}

fn parse_label(s: &str) -> Result<String, String> {
    policy::v0::check_subject(s).map(|()| s.to_owned())
}

fn parse_model(s: &str) -> Result<String, String> {
    Class::Model.check_object(s).map(|()| s.to_owned())
}

fn parse_tool(s: &str) -> Result<String, String> {
    policy::name::validate(s).map(|()| s.to_owned()).map_err(|e| e.to_string())
}

fn parse_shared(s: &str) -> Result<Shared, String> {
    let (name, access) = s.rsplit_once(':').ok_or_else(|| format!("{s:?} is not NAME:read or NAME:write"))?;
    policy::name::validate(name).map_err(|e| format!("shared space {name:?}: {e}"))?;
    let write = match access {
        "read" => false,
        "write" => true,
        _ => return Err(format!("access {access:?} is not read or write")),
    };
    Ok(Shared { name: name.to_owned(), write })
}

/// Parses one `--mount SOURCE TARGET MODE`.
fn parse_mount(source: &str, target: &str, mode: &str) -> Result<Mount, String> {
    policy::path::check_absolute(source).map_err(|e| format!("source: {e}"))?;
    policy::mount::check_target(target)?;
    if target.contains(char::is_whitespace) {
        return Err(format!("target {target:?} contains whitespace, which a policy line cannot name"));
    }
    let (mode, options) = match mode.split_once(',') {
        Some((m, o)) => (m, MountOptions::parse(o)?),
        None => (mode, DEFAULT_MOUNT_OPTIONS),
    };
    let mode = MountMode::parse(mode).ok_or_else(|| format!("mode {mode:?} is not ro or rw"))?;
    let m = Mount { source: source.to_owned(), target: target.to_owned(), mode, options };
    policy::mount::parse_line(&m.to_string())
}

/// The label an agent gets without `--label`.
fn default_label(name: &str) -> String {
    let base: String = name.chars().map(|c| if matches!(c, '.' | '-' | '+') { '_' } else { c }).collect();
    format!("{base}_t")
}

fn invalid(message: impl Into<String>) -> anyhow::Error {
    Exit::new(exit::INVALID, message).into()
}

fn check_name(name: &str) -> anyhow::Result<()> {
    policy::name::validate(name).map_err(|e| invalid(format!("invalid agent name {name:?}: {e}")))
}

/// Maps a storage error to an exit.
fn fail(e: ringfs::Error) -> anyhow::Error {
    let code = match &e {
        ringfs::Error::Io { source, .. } if source.kind() == std::io::ErrorKind::PermissionDenied => {
            exit::DENIED
        }
        ringfs::Error::Invalid(_) => exit::INVALID,
        _ => exit::FAILURE,
    };
    Exit::new(code, e.to_string()).into()
}

fn agent_dir(storage: &Path) -> PathBuf {
    storage.join(ObjectClass::Agent.as_str())
}

/// Reads a regular control file without following symlinks, at most [`controls::CONTROL_MAX`]
/// bytes; `None` when it is missing or not a regular file.
fn read_control(path: &Path) -> Option<Vec<u8>> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(path)
        .ok()?;
    if !f.metadata().ok()?.is_file() {
        return None;
    }
    let mut bytes = Vec::new();
    f.take(controls::CONTROL_MAX as u64).read_to_end(&mut bytes).ok()?;
    Some(bytes)
}

/// The ids listed in an `/etc/passwd`- or `/etc/group`-style file (third field).
fn ids_in(path: &str) -> Vec<u32> {
    let mut text = String::new();
    let _ = std::fs::File::open(path).and_then(|f| f.take(16 << 20).read_to_string(&mut text));
    text.lines().filter_map(|l| l.split(':').nth(2)?.parse().ok()).collect()
}

/// The lowest id of [`policy::ids::AGENT_IDS`] that no installed agent, host account or group
/// uses.
fn free_id(storage: &Path) -> anyhow::Result<u32> {
    let mut taken = ids_in("/etc/passwd");
    taken.extend(ids_in("/etc/group"));
    for a in installed(storage)? {
        taken.extend(a.uid);
        let gid: Option<u32> = read_control(&agent_dir(storage).join(format!("{}.d/gid", a.name)))
            .and_then(|b| String::from_utf8(b).ok())
            .and_then(|t| t.trim().parse().ok());
        taken.extend(gid);
    }
    policy::ids::first_free(|id| taken.contains(&id)).ok_or_else(|| {
        Exit::new(exit::FAILURE, "every id of the agents' range is taken: give this one --uid").into()
    })
}

/// An installed agent as `ls` shows it.
struct Listed {
    name: String,
    label: Option<String>,
    uid: Option<u32>,
}

/// Installed agents, sorted by name: executables with a valid name; hidden staging entries,
/// control directories and orphan controls are not agents.
fn installed(storage: &Path) -> anyhow::Result<Vec<Listed>> {
    let dir = agent_dir(storage);
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Exit::io(dir.display(), &e).into()),
    };
    let mut out = Vec::new();
    for e in entries {
        let e = e.map_err(|e| Exit::io(dir.display(), &e))?;
        let Ok(name) = e.file_name().into_string() else { continue };
        if name.starts_with('.')
            || policy::name::validate(&name).is_err()
            || !e.file_type().is_ok_and(|t| t.is_file())
        {
            continue;
        }
        let ctl = dir.join(format!("{name}.d"));
        let first_line = |c: &str| {
            read_control(&ctl.join(c))
                .and_then(|b| String::from_utf8(b).ok())
                .and_then(|s| s.lines().next().map(str::to_owned))
        };
        let label = first_line("label").filter(|l| policy::v0::check_subject(l).is_ok());
        let uid = first_line("uid").and_then(|u| u.trim().parse().ok());
        out.push(Listed { name, label, uid });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// The policy files of a storage: every object's `.d/policy` in `tool/`, `agent/` and
/// `model/` (nested), and in the tool directories of user homes and shared spaces.
fn policy_files(storage: &Path) -> Vec<PathBuf> {
    fn objects(dir: &Path, depth: u32, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for e in entries.flatten() {
            let p = e.path();
            let name = e.file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.') || !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            if name.ends_with(".d") {
                out.push(p.join("policy"));
            } else if depth > 0 {
                objects(&p, depth - 1, out);
            }
        }
    }
    let mut out = Vec::new();
    objects(&storage.join("tool"), 0, &mut out);
    objects(&storage.join("agent"), 0, &mut out);
    objects(&storage.join("model"), 3, &mut out);
    for tier in ["home", "shared"] {
        for e in std::fs::read_dir(storage.join(tier)).into_iter().flatten().flatten() {
            objects(&e.path().join("tool"), 0, &mut out);
        }
    }
    out.retain(|p| p.is_file());
    out.sort();
    out
}

/// Every policy line in `storage` whose subject is `label`, outside `except` (an object's
/// own control directory): (file, line number, line).
fn lines_naming(storage: &Path, label: &str, except: Option<&Path>) -> Vec<(PathBuf, u32, String)> {
    let mut out = Vec::new();
    for f in policy_files(storage) {
        if except.is_some_and(|e| f.starts_with(e)) {
            continue;
        }
        let Some(text) = read_control(&f) else { continue };
        for (n, line) in policy::v0::lines_naming(&text, label) {
            out.push((f.clone(), n, line));
        }
    }
    out
}

fn shown_lines(storage: &Path, lines: &[(PathBuf, u32, String)]) -> String {
    let shown: Vec<String> = lines
        .iter()
        .map(|(f, n, l)| format!("  {}:{n}: {l}", f.strip_prefix(storage).unwrap_or(f).display()))
        .collect();
    shown.join("\n")
}

/// Every control `new` writes, by name.
fn controls_for(a: &NewArgs, label: &str, mounts: &[Mount]) -> BTreeMap<String, Vec<u8>> {
    let mut policy = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    let mut grant = |line: String| {
        if seen.insert(line.clone()) {
            policy.push(line);
        }
    };
    for t in &a.tools {
        grant(format!("allow {label} tool:{t} execute"));
    }
    for m in &a.models {
        grant(format!("allow {label} model:{m} use"));
    }
    for s in &a.shared {
        grant(format!("allow {label} shared:{} read", s.name));
        if s.write {
            grant(format!("allow {label} shared:{} write", s.name));
        }
    }
    for m in mounts {
        grant(format!("allow {label} mount:{} read", m.target));
        if m.mode == MountMode::Rw {
            grant(format!("allow {label} mount:{} write", m.target));
        }
    }
    let lines =
        |v: &[String]| -> Vec<u8> { v.iter().map(|l| format!("{l}\n")).collect::<String>().into_bytes() };
    let mount_lines: Vec<String> = mounts.iter().map(ToString::to_string).collect();
    let groups: Vec<String> = a.groups.iter().map(u32::to_string).collect();
    let groups = if groups.is_empty() { String::new() } else { format!("{}\n", groups.join(" ")) };
    let model = a.models.first().map(|m| format!("{m}\n")).unwrap_or_default();
    let owner = rustix::process::getuid().as_raw();
    let meta = serde_json::json!({"label": label, "created_by": "ctx agent new"});
    let name = &a.name;
    let mut c: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut put = |k: &str, v: String| {
        c.insert(k.to_owned(), v.into_bytes());
    };
    put("label", format!("{label}\n"));
    put("uid", format!("{}\n", a.uid.unwrap_or(NOBODY)));
    put("gid", format!("{}\n", a.gid.unwrap_or(NOBODY)));
    if let Some(p) = &a.parent {
        put("parent", format!("{p}\n"));
    }
    put("groups", groups);
    put("owner", format!("{owner}\n"));
    put("model", model);
    put("cwd", "/workspace\n".into());
    put("path", format!("/ctx/tool:/ctx/home/{}/tool\n", a.uid.unwrap_or(NOBODY)));
    put("env", String::new());
    put("life", "owned\n".into());
    put("iso", "bwrap\n".into());
    put("abi", "1\n".into());
    put("approval", "never\n".into());
    put("meta.json", format!("{meta}\n"));
    put(
        "system.md",
        format!(
            "You are {name}, an agent on a CortexFS host. Your tools are the executables on \
             CTX_PATH; run them through tsh. Your working directory is /workspace.\n"
        ),
    );
    put("prompt.template.md", "{{message}}\n".into());
    c.insert("policy".into(), lines(&policy));
    c.insert("mount".into(), lines(&mount_lines));
    c
}

/// The authority of an installed agent, as `agent.create` checks a child against it.
struct Authority {
    label: String,
    policy: policy::v0::Policy,
    mounts: Vec<Mount>,
    ids: policy::authority::Ids,
}

fn authority_of(storage: &Path, name: &str) -> anyhow::Result<Authority> {
    let dir = agent_dir(storage).join(format!("{name}.d"));
    if std::fs::symlink_metadata(agent_dir(storage).join(name)).is_err() {
        return Err(Exit::new(exit::FAILURE, format!("no agent/{name}")).into());
    }
    let text =
        |c: &str| String::from_utf8(read_control(&dir.join(c)).unwrap_or_default()).unwrap_or_default();
    let num = |c: &str| {
        text(c).trim().parse::<u32>().map_err(|_| invalid(format!("agent/{name}.d/{c} is not a number")))
    };
    let policy = policy::v0::Policy::from_text(text("policy").as_bytes())
        .map_err(|_| invalid(format!("agent/{name}.d/policy does not parse")))?;
    let mounts = policy::mount::parse(text("mount").as_bytes())
        .map_err(|_| invalid(format!("agent/{name}.d/mount does not parse")))?;
    let groups = text("groups").split_whitespace().filter_map(|g| g.parse().ok()).collect();
    Ok(Authority {
        label: text("label").trim().to_owned(),
        policy,
        mounts,
        ids: policy::authority::Ids { uid: num("uid")?, gid: num("gid")?, groups },
    })
}

fn new(a: NewArgs) -> anyhow::Result<()> {
    let done = create(a)?;
    out::line(done)
}

/// `agent.create` from the receipt socket: the child of `parent` that `c` describes, created
/// as `ctx agent new --parent` would (the same checks, the same object), by a call, not a
/// command. Returns what was created.
pub fn create_child(storage: &Path, parent: &str, c: &policy::receipt::Create) -> anyhow::Result<String> {
    let field = |what: &str, r: Result<String, String>| r.map_err(|e| invalid(format!("{what}: {e}")));
    let a = NewArgs {
        at: At { source: storage.to_path_buf() },
        name: c.name.clone(),
        label: c.label.clone().map(|l| field("label", parse_label(&l))).transpose()?,
        models: c.models.iter().map(|m| field("model", parse_model(m))).collect::<anyhow::Result<_>>()?,
        tools: c.tools.iter().map(|t| field("tool", parse_tool(t))).collect::<anyhow::Result<_>>()?,
        shared: c
            .shared
            .spaces()
            .map_err(invalid)?
            .into_iter()
            .map(|(name, write)| {
                policy::name::validate(&name).map_err(|e| invalid(format!("shared space {name:?}: {e}")))?;
                Ok(Shared { name, write })
            })
            .collect::<anyhow::Result<_>>()?,
        mounts: c.mounts.iter().flatten().cloned().collect(),
        uid: None,
        gid: None,
        groups: c.groups.clone(),
        parent: Some(field("parent", parse_tool(parent))?),
    };
    create(a)
}

fn create(mut a: NewArgs) -> anyhow::Result<String> {
    let parent = match &a.parent {
        Some(p) => {
            let auth = authority_of(&a.at.source, p)?;
            a.uid = a.uid.or(Some(auth.ids.uid));
            a.gid = a.gid.or(Some(auth.ids.gid));
            Some(auth)
        }
        None => None,
    };
    let name = a.name.as_str();
    check_name(name)?;
    let label = match &a.label {
        Some(l) => l.clone(),
        None => {
            let l = default_label(name);
            policy::v0::check_subject(&l)
                .map_err(|e| invalid(format!("default label: {e}; name one with --label")))?;
            l
        }
    };
    let mut mounts = Vec::new();
    for m in a.mounts.chunks_exact(3) {
        let [source, target, mode] = m else { unreachable!("chunks_exact(3) yields 3 values") };
        let mount = parse_mount(source, target, mode)
            .map_err(|e| invalid(format!("--mount {source} {target} {mode}: {e}")))?;
        if mounts.iter().any(|o: &Mount| o.target == mount.target) {
            return Err(invalid(format!("--mount: target {target} is mounted twice")));
        }
        mounts.push(mount);
    }
    let storage = &a.at.source;
    let dir = agent_dir(storage);
    if std::fs::symlink_metadata(dir.join(name)).is_ok() {
        return Err(Exit::new(exit::FAILURE, format!("agent/{name} already exists")).into());
    }
    // An agent of its own gets an identity of its own (a child shares its parent's).
    if a.uid.is_none() {
        let id = free_id(storage)?;
        a.uid = Some(id);
        a.gid = a.gid.or(Some(id));
    }
    let controls = controls_for(&a, &label, &mounts);
    if let Some(p) = &parent {
        let rules = policy::v0::parse(controls.get("policy").map_or(&[][..], Vec::as_slice))
            .map_err(|_| Exit::new(exit::INTERNAL, "the generated policy does not parse"))?;
        let ids = policy::authority::Ids {
            uid: a.uid.unwrap_or(NOBODY),
            gid: a.gid.unwrap_or(NOBODY),
            groups: a.groups.clone(),
        };
        let checked = policy::attenuate::check_create(
            &policy::attenuate::Parent {
                subject: &p.label,
                policy: &p.policy,
                mounts: &p.mounts,
                ids: &p.ids,
            },
            &policy::attenuate::Child { name, subject: &label, rules: &rules, mounts: &mounts, ids: &ids },
        );
        if let Err(widenings) = checked {
            let why: Vec<String> = widenings.iter().map(|w| format!("  {w}")).collect();
            return Err(Exit::new(
                exit::DENIED,
                format!(
                    "agent/{name} would be wider than its parent agent/{}:\n{}",
                    a.parent.as_deref().unwrap_or(""),
                    why.join("\n")
                ),
            )
            .into());
        }
    }
    for (control, bytes) in &controls {
        match controls::classify(ObjectClass::Agent, control) {
            Some(Owner::Host | Owner::SelfUpdatable) => {}
            _ => return Err(Exit::new(exit::INTERNAL, format!("agents have no control {control:?}")).into()),
        }
        controls::validate(ObjectClass::Agent, name, control, bytes)
            .map_err(|e| invalid(format!("agent/{name}: control {control}: {e}")))?;
    }
    // A label belongs to one agent: policies grant to labels, so a second agent wearing one
    // would hold whatever the first was granted.
    if let Some(other) = installed(storage)?.into_iter().find(|o| o.label.as_deref() == Some(label.as_str()))
    {
        let code = if parent.is_some() { exit::DENIED } else { exit::INVALID };
        return Err(Exit::new(
            code,
            format!("label {label} is agent/{}'s: a label belongs to one agent", other.name),
        )
        .into());
    }
    // Lines that name a label no agent holds (left by `ctx agent rm`, or written ahead) grant
    // it authority: a child may not take such a label, whatever its parent holds; the
    // operator is told what the new agent will be granted by them.
    let named = lines_naming(storage, &label, None);
    if !named.is_empty() {
        if parent.is_some() {
            return Err(Exit::new(
                exit::DENIED,
                format!(
                    "label {label} is named by policies a child's parent does not control:\n{}",
                    shown_lines(storage, &named)
                ),
            )
            .into());
        }
        eprintln!(
            "ctx: note: these policy lines already grant label {label}:\n{}",
            shown_lines(storage, &named)
        );
    }
    let exe = format!("#!/bin/sh\nexec /ctx/bin/ctx agent start {name} \"$@\"\n");
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let stage = std::env::temp_dir().join(format!("cortexfs-agent.{name}.{}.{nanos}", std::process::id()));
    let checked =
        crate::cmd::object::stage_generated(ObjectClass::Agent, name, exe.as_bytes(), &controls, &stage);
    let done = checked.and_then(|c| {
        publish::install(storage, &c, Tier::System).map_err(|e| match e {
            ringfs::Error::Conflict(_) => {
                Exit::new(exit::FAILURE, format!("agent/{name} already exists")).into()
            }
            e => fail(e),
        })
    });
    let _ = std::fs::remove_dir_all(&stage);
    let done = done?;
    let mut said: Vec<String> =
        done.cleared.iter().map(|p| format!("cleared residue {}", p.display())).collect();
    said.push(format!("created agent/{name} (label {label}, uid {})", a.uid.unwrap_or(NOBODY)));
    Ok(said.join("\n"))
}

fn ls(storage: &Path, json: bool) -> anyhow::Result<()> {
    if !storage.is_dir() {
        return Err(invalid(format!("{}: no such storage directory", storage.display())));
    }
    let agents = installed(storage)?;
    if json {
        let v: Vec<serde_json::Value> = agents
            .iter()
            .map(|a| serde_json::json!({"name": a.name, "label": a.label, "uid": a.uid}))
            .collect();
        return out::line(serde_json::Value::Array(v));
    }
    for a in &agents {
        let uid = a.uid.map_or_else(|| "-".to_owned(), |u| u.to_string());
        out::line(format_args!("{}\t{}\t{uid}", a.name, a.label.as_deref().unwrap_or("-")))?;
    }
    Ok(())
}

fn inspect(storage: &Path, name: &str) -> anyhow::Result<()> {
    check_name(name)?;
    let i = publish::inspect(storage, ObjectClass::Agent, name, Tier::System).map_err(fail)?;
    if !i.installed {
        return Err(Exit::new(
            exit::FAILURE,
            format!("agent/{name} is not installed in {}", agent_dir(storage).display()),
        )
        .into());
    }
    let ctl = agent_dir(storage).join(format!("{name}.d"));
    for control in i.controls.iter().filter(|c| c.as_str() != "log") {
        out::line(format_args!("== {control} =="))?;
        match read_control(&ctl.join(control)) {
            Some(bytes) if bytes.is_empty() => {}
            Some(bytes) => {
                let text = String::from_utf8_lossy(&bytes);
                out::line(text.strip_suffix('\n').unwrap_or(&text))?;
            }
            None => out::line("(not a readable regular file)")?,
        }
    }
    Ok(())
}

fn rm(storage: &Path, name: &str, yes: bool) -> anyhow::Result<()> {
    check_name(name)?;
    let dir = agent_dir(storage);
    if !dir.is_dir() {
        return Err(
            Exit::new(exit::FAILURE, format!("agent/{name} is not installed in {}", dir.display())).into()
        );
    }
    let label = installed(storage)?.into_iter().find(|a| a.name == name).and_then(|a| a.label);
    let own = dir.join(format!("{name}.d"));
    let steps = publish::uninstall(storage, ObjectClass::Agent, name, Tier::System, !yes).map_err(fail)?;
    for s in &steps {
        out::line(format_args!("{}{s}", if yes { "" } else { "would " }))?;
    }
    // Policy lines that still name its label would go to whoever takes the label next.
    if let Some(label) = label {
        let named = lines_naming(storage, &label, Some(&own));
        let files: std::collections::BTreeSet<&PathBuf> = named.iter().map(|(f, _, _)| f).collect();
        for f in files {
            let shown = f.strip_prefix(storage).unwrap_or(f).display();
            for (_, n, l) in named.iter().filter(|(g, _, _)| g == f) {
                out::line(format_args!("{}remove {shown}:{n}: {l}", if yes { "" } else { "would " }))?;
            }
            if yes {
                let text = read_control(f).unwrap_or_default();
                rewrite(f, &policy::v0::without_subject(&text, &label))
                    .map_err(|e| Exit::io(f.display(), &e))?;
            }
        }
    }
    if yes {
        out::line(format_args!("removed agent/{name}"))
    } else {
        out::line("dry run: nothing changed; re-run with --yes to do it")
    }
}

/// Replaces the file `path` whole: a temporary file beside it with the same owner and mode,
/// synced, renamed over it, the directory synced.
fn rewrite(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path)?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        path.file_name().unwrap_or_default().to_string_lossy(),
        std::process::id()
    ));
    let written = (|| {
        let mut f =
            std::fs::OpenOptions::new().write(true).create_new(true).mode(meta.mode() & 0o7777).open(&tmp)?;
        f.write_all(bytes)?;
        std::os::unix::fs::fchown(&f, Some(meta.uid()), Some(meta.gid()))?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Inside an agent's terminal (its `/ctx` is its view), `ctx agent new|start|stop` go through
/// the lifecycle tools, with the agent's authority, never around them.
fn in_agent() -> Option<tsh::context::Context> {
    std::env::var_os("CTX_AGENT")?;
    let ctx = tsh::context::Context::from_env().ok()?;
    ctx.agent.is_some().then_some(ctx)
}

fn through_tool(ctx: &tsh::context::Context, tool: &str, input: serde_json::Value) -> anyhow::Result<()> {
    let resolver = tsh::resolve::Resolver::new(ctx.path.clone(), &policy::tshconf::TshConfig::default());
    if resolver.walk(tool).is_err() {
        return Err(Exit::new(
            exit::UNAVAILABLE,
            format!("service unavailable: {tool} is not installed or not granted to this agent"),
        )
        .into());
    }
    let status =
        std::process::Command::new(ctx.root.join("bin/tsh")).arg(tool).arg(input.to_string()).status()?;
    match status.code() {
        Some(0) => Ok(()),
        Some(c) => Err(Exit::quiet(u8::try_from(c).unwrap_or(exit::FAILURE)).into()),
        None => Err(Exit::quiet(exit::FAILURE).into()),
    }
}

fn routed(ctx: &tsh::context::Context, cmd: Cmd) -> anyhow::Result<()> {
    use serde_json::json;
    match cmd {
        Cmd::New(a) => {
            let mounts: Vec<&[String]> = a.mounts.chunks(3).collect();
            let shared: Vec<String> = a
                .shared
                .iter()
                .map(|s| format!("{}:{}", s.name, if s.write { "write" } else { "read" }))
                .collect();
            let mut v = json!({"name": a.name, "tools": a.tools, "models": a.models, "shared": shared,
                "mounts": mounts, "groups": a.groups});
            if let Some(l) = a.label {
                v["label"] = json!(l);
            }
            through_tool(ctx, "agent.create", v)
        }
        Cmd::Start(a) => {
            through_tool(ctx, "agent.start", json!({"name": a.name, "session": a.session, "cmd": a.cmd}))
        }
        Cmd::Stop { name, session } => {
            through_tool(ctx, "agent.stop", json!({"name": name, "session": session}))
        }
        _ => Ok(()),
    }
}

/// Runs `ctx agent ...`.
pub fn run(cmd: Cmd) -> anyhow::Result<()> {
    if matches!(cmd, Cmd::New(_) | Cmd::Start(_) | Cmd::Stop { .. })
        && let Some(ctx) = in_agent()
    {
        return routed(&ctx, cmd);
    }
    match cmd {
        Cmd::New(a) => new(a),
        Cmd::Ls { at, json } => ls(&at.source, json),
        Cmd::Inspect { at, name } => inspect(&at.source, &name),
        Cmd::Rm { at, name, yes } => rm(&at.source, &name, yes),
        Cmd::Start(a) => {
            let mounts = a.mount.chunks(3).map(launch::extra_mount).collect::<anyhow::Result<Vec<_>>>()?;
            launch::start(launch::Start {
                agent: a.name,
                session: a.session,
                cwd: a.cwd,
                mounts,
                no_workspace: a.no_default_workspace,
                cmd: a.cmd,
                profile: a.profile,
                memory: a.memory,
                pids: a.pids,
                cpu: a.cpu,
                no_ceilings: a.no_ceilings,
                ctx: a.ctx,
                control: a.control,
                wait: a.wait,
                grace: a.grace,
                resume: a.resume,
                timeout: a.timeout,
            })
        }
        Cmd::Stop { name, session } => launch::stop(&name, &session),
        Cmd::Ps => launch::ps(),
        Cmd::Watch { name, session } => launch::connect(&name, &session, false),
        Cmd::Attach { name, session } => launch::connect(&name, &session, true),
        Cmd::Send { name, session, text } => launch::send(&name, &session, &text),
        Cmd::Supervise { contract } => launch::supervise(&contract),
        Cmd::History { name, at } => session::history(&at.ctx, &name, &at.session),
        Cmd::Output { name, at, rebuild: false } => session::output(&at.ctx, &name, &at.session),
        Cmd::Output { name, at, rebuild: true } => session::rebuild_latest(&at.ctx, &name, &at.session),
        Cmd::Pack { name, at, .. } => session::pack_check(&at.ctx, &name, &at.session),
        Cmd::Children { name, at } => session::children(&at.ctx, &name, &at.session),
        Cmd::Wait { name, child, at, timeout } => session::wait(&at.ctx, &name, &at.session, &child, timeout),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_labels() {
        assert_eq!(default_label("coder"), "coder_t");
        assert_eq!(default_label("my-bot.v2+x"), "my_bot_v2_x_t");
        assert!(policy::v0::check_subject(&default_label(&"a".repeat(64))).is_err());
    }

    #[test]
    fn shared_specs() {
        let s = parse_shared("proj:write").unwrap();
        assert!(s.write && s.name == "proj");
        assert!(!parse_shared("proj:read").unwrap().write);
        for bad in ["proj", "proj:rw", ":read", "a/b:read", "x.d:read"] {
            assert!(parse_shared(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn mount_specs() {
        let m = parse_mount("/src", "/data", "rw").unwrap();
        assert_eq!(m.to_string(), "/src\t/data\trw\tnosuid,nodev");
        assert_eq!(parse_mount("/src", "/data", "ro,-").unwrap().to_string(), "/src\t/data\tro\t-");
        assert_eq!(parse_mount("/s", "/d", "ro,noexec").unwrap().to_string(), "/s\t/d\tro\tnoexec");
        for (s, t, m) in [
            ("/s", "/", "ro"),
            ("/s", "/ctx", "ro"),
            ("/s", "/ctx/tool", "rw"),
            ("rel", "/d", "ro"),
            ("/s", "rel", "ro"),
            ("/s", "/d", "xx"),
            ("/s", "/d", "ro,xx"),
            ("/s", "/d/", "ro"),
            ("/s\tx", "/d", "ro"),
            ("/s", "/my dir", "ro"),
        ] {
            assert!(parse_mount(s, t, m).is_err(), "{s} {t} {m}");
        }
    }
}
