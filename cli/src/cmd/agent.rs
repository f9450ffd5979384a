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
//! - each `--tool` of an installed tool is also granted in the tool's own policy, as `ctx agent
//!   grant` does (not for `--parent`: a child holds only what its parent holds);
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

use std::path::{Path, PathBuf};

use clap::Subcommand;
use ctxterm::launch::{self, agents};
use policy::agent;
use policy::controls::ObjectClass;
use ringfs::object::publish::{self, Tier};

use crate::cmd::object::DEFAULT_STORAGE;
use crate::cmd::session;
use crate::exit::{self, Exit};
use crate::out;

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
        #[arg(add = clap_complete::ArgValueCompleter::new(crate::cmd::complete::agents))]
        name: String,
        /// Print one JSON object: {"agent", "path", "controls": {NAME: TEXT or null}}.
        #[arg(long)]
        json: bool,
    },
    /// Remove agent/NAME: its executable first, then its controls. Shows the plan unless --yes.
    /// A running agent is refused unless --force, which stops its runs first.
    Rm {
        #[command(flatten)]
        at: At,
        /// The agent.
        #[arg(add = clap_complete::ArgValueCompleter::new(crate::cmd::complete::agents))]
        name: String,
        /// Do it (without this, only print the plan).
        #[arg(long)]
        yes: bool,
        /// Stop the agent's running sessions first (without this, a running agent is refused).
        #[arg(long)]
        force: bool,
        /// The control socket of the daemon whose runs are looked at (its runtime directory
        /// holds them).
        #[arg(long, default_value = policy::runtime::CONTROL_SOCKET)]
        control: PathBuf,
    },
    /// Grant agent NAME a permission: `allow LABEL CLASS:OBJECT PERM` in its policy, and for a
    /// tool in the tool's own policy too (both must agree for the tool to run).
    Grant {
        #[command(flatten)]
        at: At,
        /// The agent.
        #[arg(add = clap_complete::ArgValueCompleter::new(crate::cmd::complete::agents))]
        name: String,
        /// What: CLASS:NAME, e.g. tool:fs.read, shared:proj, mount:/data.
        object: String,
        /// The permission, e.g. execute, read, write.
        perm: String,
    },
    /// Take back a grant: the line leaves the agent's policy (and a tool's own), and a shared
    /// space's group leaves the agent's groups once no grant of a space of that group is left.
    Revoke {
        #[command(flatten)]
        at: At,
        /// The agent.
        #[arg(add = clap_complete::ArgValueCompleter::new(crate::cmd::complete::agents))]
        name: String,
        /// What: CLASS:NAME, as granted.
        object: String,
        /// The permission, as granted.
        perm: String,
    },
    /// Set a control of agent NAME that only the host's operator sets: uid, gid or groups
    /// (gids separated by commas or spaces; "" for none). Runs started from now on take it.
    Set {
        #[command(flatten)]
        at: At,
        /// The agent.
        #[arg(add = clap_complete::ArgValueCompleter::new(crate::cmd::complete::agents))]
        name: String,
        /// The control: uid, gid or groups.
        #[arg(value_parser = ["uid", "gid", "groups"])]
        key: String,
        /// Its new value.
        value: String,
        /// Allow uid 0 (an agent running as root owns the host's files).
        #[arg(long)]
        allow_root: bool,
    },
    /// Start the agent's terminal in a bubblewrap sandbox; returns once it answers.
    Start(StartArgs),
    /// Stop a running agent session: SIGTERM, the grace period, SIGKILL; view and socket removed.
    /// With --all, every running session (of NAME, or of every agent), in parallel.
    Stop {
        /// The agent (with --all: only its sessions; without NAME, every agent's).
        #[arg(required_unless_present = "all", add = clap_complete::ArgValueCompleter::new(crate::cmd::complete::agents))]
        name: Option<String>,
        /// The session.
        #[arg(long, default_value = "default", conflicts_with = "all", add = clap_complete::ArgValueCompleter::new(crate::cmd::complete::sessions))]
        session: String,
        /// Every running session of NAME (or of every agent), stopped in parallel.
        #[arg(long)]
        all: bool,
        /// The control socket of the daemon whose runs these are (its runtime directory holds
        /// them).
        #[arg(long, default_value = policy::runtime::CONTROL_SOCKET)]
        control: PathBuf,
    },
    /// List running agent sessions: AGENT, SESSION, supervisor PID, STATE, SINCE.
    Ps {
        /// Print a JSON array of {"agent","session","pid","state","exit","since","uptime_s",
        /// "profile","model","cpu_ms","memory_bytes","pids"} objects.
        #[arg(long)]
        json: bool,
        /// Ended runs too (STATE `exited N`; SINCE when it ended).
        #[arg(long)]
        all: bool,
        /// The control socket of the daemon whose runs these are (its runtime directory holds
        /// them).
        #[arg(long, default_value = policy::runtime::CONTROL_SOCKET)]
        control: PathBuf,
    },
    /// Show an agent's terminal output (read only).
    Watch {
        /// The agent.
        #[arg(add = clap_complete::ArgValueCompleter::new(crate::cmd::complete::agents))]
        name: String,
        /// The session.
        #[arg(long, default_value = "default", add = clap_complete::ArgValueCompleter::new(crate::cmd::complete::sessions))]
        session: String,
        /// The control socket of the daemon whose runs these are (its runtime directory holds
        /// them).
        #[arg(long, default_value = policy::runtime::CONTROL_SOCKET)]
        control: PathBuf,
    },
    /// Join an agent's terminal: its output, and this terminal's input typed into it.
    Attach {
        /// The agent.
        #[arg(add = clap_complete::ArgValueCompleter::new(crate::cmd::complete::agents))]
        name: String,
        /// The session.
        #[arg(long, default_value = "default", add = clap_complete::ArgValueCompleter::new(crate::cmd::complete::sessions))]
        session: String,
        /// The control socket of the daemon whose runs these are (its runtime directory holds
        /// them).
        #[arg(long, default_value = policy::runtime::CONTROL_SOCKET)]
        control: PathBuf,
    },
    /// Type one line into an agent's terminal.
    Send {
        /// The agent.
        #[arg(add = clap_complete::ArgValueCompleter::new(crate::cmd::complete::agents))]
        name: String,
        /// The session.
        #[arg(long, default_value = "default", add = clap_complete::ArgValueCompleter::new(crate::cmd::complete::sessions))]
        session: String,
        /// The control socket of the daemon whose runs these are (its runtime directory holds
        /// them).
        #[arg(long, default_value = policy::runtime::CONTROL_SOCKET)]
        control: PathBuf,
        /// The line.
        text: String,
    },
    /// Print a session's messages (messages.jsonl).
    History {
        /// The agent.
        #[arg(add = clap_complete::ArgValueCompleter::new(crate::cmd::complete::agents))]
        name: String,
        #[command(flatten)]
        at: SessionAt,
        /// Print the messages as one JSON array.
        #[arg(long)]
        json: bool,
    },
    /// Print a session's terminal output, kept by its terminal (the last MiB at most), also
    /// after the run ended; --follow prints what comes after until the run has ended.
    Logs {
        /// The agent.
        #[arg(add = clap_complete::ArgValueCompleter::new(crate::cmd::complete::agents))]
        name: String,
        #[command(flatten)]
        at: SessionAt,
        /// Go on printing what the terminal writes, until the session's run has ended.
        #[arg(long, short = 'f')]
        follow: bool,
    },
    /// Print a session's latest output (latest.md); --rebuild first rebuilds it from messages.
    Output {
        /// The agent.
        #[arg(add = clap_complete::ArgValueCompleter::new(crate::cmd::complete::agents))]
        name: String,
        #[command(flatten)]
        at: SessionAt,
        /// Rebuild latest.md from the last assistant message first.
        #[arg(long)]
        rebuild: bool,
        /// Print one JSON object: {"agent","session","output"}.
        #[arg(long)]
        json: bool,
    },
    /// Check a session's context pack (context/pack.json and pack.md): shape and provenance.
    Pack {
        /// The agent.
        #[arg(add = clap_complete::ArgValueCompleter::new(crate::cmd::complete::agents))]
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
        #[arg(add = clap_complete::ArgValueCompleter::new(crate::cmd::complete::agents))]
        name: String,
        #[command(flatten)]
        at: SessionAt,
        /// Print a JSON array of {"id","agent","session","status"} objects.
        #[arg(long)]
        json: bool,
    },
    /// Wait until a child ends: exit 0 done, 1 error, 130 cancelled.
    Wait {
        /// The parent agent.
        #[arg(add = clap_complete::ArgValueCompleter::new(crate::cmd::complete::agents))]
        name: String,
        /// The child (agent name or record id).
        child: String,
        #[command(flatten)]
        at: SessionAt,
        /// Give up after this many seconds (exit 69).
        #[arg(long)]
        timeout: Option<u64>,
    },
}

/// A session, seen through the host's /ctx.
#[derive(Debug, clap::Args)]
pub struct SessionAt {
    /// The session.
    #[arg(long, default_value = "default", add = clap_complete::ArgValueCompleter::new(crate::cmd::complete::sessions))]
    session: String,
    /// The host's /ctx mount.
    #[arg(long, default_value = "/ctx")]
    ctx: PathBuf,
}

/// Arguments of `ctx agent start`.
#[derive(Debug, clap::Args)]
pub struct StartArgs {
    /// The agent.
    #[arg(add = clap_complete::ArgValueCompleter::new(crate::cmd::complete::agents))]
    name: String,
    /// The session.
    #[arg(long, default_value = "default", add = clap_complete::ArgValueCompleter::new(crate::cmd::complete::sessions))]
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
    /// Keep the session in the shared space SPACE (`shared/SPACE/agent/NAME/session/S/`):
    /// the policy must grant `shared:SPACE write` and Linux permissions must let the agent
    /// write there. With --resume OTHER, run on OTHER's session in that space.
    #[arg(long, value_name = "SPACE")]
    shared: Option<String>,
    /// Stop the run after SECONDS (over agent/NAME.d/timeout); its session says so.
    #[arg(long, value_name = "SECONDS")]
    timeout: Option<u64>,
    /// The host's /ctx mount.
    #[arg(long, default_value = "/ctx")]
    ctx: PathBuf,
    /// The daemon's control socket.
    #[arg(long, default_value = policy::runtime::CONTROL_SOCKET)]
    control: PathBuf,
    /// Wait until the terminal ends and exit with its status. When standard output is not a
    /// terminal, the command runs headless (as with --headless) unless --tty.
    #[arg(long)]
    wait: bool,
    /// Run the command on this process's standard streams, without a PTY: its output arrives
    /// here as it comes and its status is the exit code (implies --wait).
    #[arg(long, conflicts_with = "tty")]
    headless: bool,
    /// With --wait, keep the agent's terminal (a PTY) even when standard output is not one.
    #[arg(long)]
    tty: bool,
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
    /// A hosted CLI profile: tsh, codex, claude or pi (arguments after -- go to it). Default:
    /// the agent's `profile` control when it names one of these and no command is given.
    #[arg(long)]
    profile: Option<String>,
    /// The command (default: the agent's profile, else tsh).
    #[arg(last = true)]
    cmd: Vec<String>,
}

/// The storage agents and models live in (always the system tier).
#[derive(Debug, clap::Args)]
pub struct At {
    /// The storage directory.
    #[arg(long, default_value = DEFAULT_STORAGE)]
    pub source: PathBuf,
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
    #[arg(long = "shared", value_name = "N:read|write", value_parser = agent::parse_shared)]
    shared: Vec<(String, bool)>,
    /// Bind SOURCE at TARGET; MODE is ro or rw, optionally with options (rw,noexec; ro,- for
    /// none; default nosuid,nodev). TARGET may not be / or under /ctx (repeatable).
    #[arg(
        long = "mount",
        num_args = 3,
        value_names = ["SOURCE", "TARGET", "MODE"],
        action = clap::ArgAction::Append
    )]
    mounts: Vec<String>,
    /// The agent's uid (default: one of its own). Another agent's, or a host account's, is
    /// taken with a warning; 0 only with --allow-root.
    #[arg(long)]
    uid: Option<u32>,
    /// Let --uid 0 make an agent that runs as root.
    #[arg(long)]
    allow_root: bool,
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

fn parse_label(s: &str) -> Result<String, String> {
    policy::v0::check_subject(s).map(|()| s.to_owned())
}

fn parse_model(s: &str) -> Result<String, String> {
    agent::check_model(s).map(|()| s.to_owned())
}

fn parse_tool(s: &str) -> Result<String, String> {
    policy::name::validate(s).map(|()| s.to_owned()).map_err(|e| e.to_string())
}

fn invalid(message: impl Into<String>) -> anyhow::Error {
    Exit::new(exit::INVALID, message).into()
}

fn agent_dir(storage: &Path) -> PathBuf {
    storage.join(ObjectClass::Agent.as_str())
}

/// The host view that serves `storage`, when a daemon does: a `fuse.cortexfs` mount whose
/// source is this storage and whose `status` says `view host`.
pub fn served_at(storage: &Path) -> Option<PathBuf> {
    let storage = std::fs::canonicalize(storage).ok()?;
    // root's: /proc
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let mut r = right.split(' ');
        let (kind, source) = (r.next()?, r.next()?);
        if kind != "fuse.cortexfs" || Path::new(&source.replace("\\040", " ")) != storage {
            return None;
        }
        let mnt = PathBuf::from(left.split(' ').nth(4)?.replace("\\040", " "));
        // root's: the daemon's status file
        let status = std::fs::read_to_string(mnt.join("status")).ok()?;
        (policy::status::field(&status, "view") == Some("host")).then_some(mnt)
    })
}

/// What the command changed in `storage` is what the next command reads through the mount
/// that serves it: waits (at most 3 s) until each of `rels` reads the same through `/ctx` as in
/// the storage (the daemon drops the kernel's copies when its watch sees a change), and, for an
/// agent just made, until its socket is there to drive it.
fn settle(storage: &Path, rels: &[PathBuf], socket: Option<&str>, generation: Option<&str>) {
    let Some(ctx) = served_at(storage) else { return };
    if let Some(id) = generation {
        crate::cmd::config::served(&ctx, id);
    }
    let t = std::time::Instant::now();
    let limit = std::time::Duration::from_secs(3);
    // root's: the storage's objects, and the mount serving them (read only)
    let same = |rel: &PathBuf| std::fs::read(storage.join(rel)).ok() == std::fs::read(ctx.join(rel)).ok();
    while t.elapsed() < limit {
        let sock = socket
            .is_none_or(|n| std::fs::symlink_metadata(ctx.join("agent").join(format!("{n}.sock"))).is_ok());
        if sock && rels.iter().all(same) {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Storage-relative paths as strings.
fn strings(rels: &[PathBuf]) -> Vec<String> {
    rels.iter().map(|r| r.to_string_lossy().into_owned()).collect()
}

/// Commits a grant's or revoke's controls (see [`crate::cmd::config::own_change`]).
fn own_grant(storage: &Path, rels: &[PathBuf], message: &str) -> anyhow::Result<Option<String>> {
    let own: Vec<String> = rels.iter().map(|r| r.to_string_lossy().into_owned()).collect();
    crate::cmd::config::own_change(storage, &own, message)
}

/// The controls a grant or revoke of `object` writes, relative to the storage.
fn grant_rels(name: &str, object: &str) -> Vec<PathBuf> {
    let mut v = vec![
        PathBuf::from(format!("agent/{name}.d/policy")),
        PathBuf::from(format!("agent/{name}.d/groups")),
    ];
    if let Some(tool) = object.strip_prefix("tool:") {
        v.push(PathBuf::from(format!("tool/{tool}.d/policy")));
    }
    v
}

fn new(a: NewArgs) -> anyhow::Result<()> {
    let mut mounts = Vec::new();
    for m in a.mounts.chunks_exact(3) {
        let [source, target, mode] = m else { unreachable!("chunks_exact(3) yields 3 values") };
        mounts.push(
            agent::parse_mount(source, target, mode)
                .map_err(|e| invalid(format!("--mount {source} {target} {mode}: {e}")))?,
        );
    }
    let (name, tools, child) = (a.name.clone(), a.tools.clone(), a.parent.is_some());
    let new = agent::Spec {
        name: a.name,
        label: a.label,
        models: a.models,
        tools: a.tools,
        shared: a.shared,
        mounts,
        uid: a.uid,
        gid: a.gid,
        groups: a.groups,
        parent: a.parent,
        owner: 0,
    };
    let done = agents::create_as(&a.at.source, new, a.allow_root).map_err(exit::launch)?;
    out::line(done)?;
    // The operator's own agent: each installed tool it is given agrees in its own policy too,
    // as `ctx agent grant` writes it. (A child's tools are its parent's to hold, not the
    // tools' to widen: `--parent` leaves tool policies alone.)
    let mut rels = vec![PathBuf::from(format!("agent/{name}.d/policy"))];
    if !child {
        for t in tools.iter().filter(|t| a.at.source.join("tool").join(t).is_file()) {
            for line in
                agents::grant(&a.at.source, &name, &format!("tool:{t}"), "execute").map_err(exit::launch)?
            {
                if !line.contains("already has") {
                    out::line(line)?;
                }
            }
            rels.push(PathBuf::from(format!("tool/{t}.d/policy")));
        }
    }
    let mut own: Vec<String> = vec![format!("agent/{name}"), format!("agent/{name}.d")];
    own.extend(rels.iter().skip(1).map(|r| r.to_string_lossy().into_owned()));
    let g = crate::cmd::config::own_change(&a.at.source, &own, &format!("agent new {name}"))?;
    // Driven at once: `ctx send NAME` right after finds its socket.
    settle(&a.at.source, &rels, Some(&name), g.as_deref());
    Ok(())
}

fn ls(storage: &Path, json: bool) -> anyhow::Result<()> {
    if !storage.is_dir() {
        return Err(invalid(format!("{}: no such storage directory", storage.display())));
    }
    let agents = agents::installed(storage).map_err(exit::launch)?;
    if json {
        let v: Vec<serde_json::Value> = agents
            .iter()
            .map(|a| serde_json::json!({"name": a.name, "label": a.label, "uid": a.uid}))
            .collect();
        return out::line(serde_json::Value::Array(v));
    }
    let mut list = out::Listing::new("NAME\tLABEL\tUID");
    for a in &agents {
        let uid = a.uid.map_or_else(|| "-".to_owned(), |u| u.to_string());
        list.row(format_args!("{}\t{}\t{uid}", a.name, a.label.as_deref().unwrap_or("-")))?;
    }
    Ok(())
}

fn inspect(storage: &Path, name: &str, json: bool) -> anyhow::Result<()> {
    policy::name::validate(name).map_err(|e| invalid(format!("invalid agent name {name:?}: {e}")))?;
    let i = publish::inspect(storage, ObjectClass::Agent, name, Tier::System)
        .map_err(|e| exit::launch(e.into()))?;
    if !i.installed {
        return Err(exit::launch(agents::no_agent(name, storage)));
    }
    let ctl = agent_dir(storage).join(format!("{name}.d"));
    if json {
        let controls: serde_json::Map<String, serde_json::Value> = i
            .controls
            .iter()
            .filter(|c| c.as_str() != "log")
            .map(|c| {
                let v = agents::read_control(&ctl.join(c))
                    .map_or(serde_json::Value::Null, |b| String::from_utf8_lossy(&b).into_owned().into());
                (c.clone(), v)
            })
            .collect();
        return out::line(serde_json::json!({"agent": name, "path": i.path, "controls": controls}));
    }
    for control in i.controls.iter().filter(|c| c.as_str() != "log") {
        out::line(format_args!("== {control} =="))?;
        match agents::read_control(&ctl.join(control)) {
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

/// `ctx agent stop --all [NAME]`: every running session (of NAME), each stopped by a thread of
/// its own; a line per run, in the order they ended. Fails (1) when one could not be stopped.
fn stop_all(control: &Path, name: Option<&str>) -> anyhow::Result<()> {
    let runs: Vec<(String, String)> = launch::running(control)
        .into_iter()
        .filter(|(a, _, _)| name.is_none_or(|n| n == a))
        .map(|(a, s, _)| (a, s))
        .collect();
    let by = operator();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|sc| {
        for (a, s) in &runs {
            let (tx, by) = (tx.clone(), &by);
            sc.spawn(move || {
                let _ = tx.send((a, s, launch::stop(control, a, s, by)));
            });
        }
        drop(tx);
        let mut failed = 0;
        for (a, s, r) in rx {
            match r {
                Ok(code) => out::line(format_args!("stopped agent {a} session {s} (status {code})"))?,
                Err(e) => {
                    failed += 1;
                    eprintln!("ctx: agent {a} session {s}: {e}");
                }
            }
        }
        if failed > 0 {
            return Err(Exit::quiet(exit::FAILURE).into());
        }
        Ok(())
    })
}

/// `ctx agent ps [--all] [--json]`.
fn ps(control: &Path, json: bool, all: bool) -> anyhow::Result<()> {
    let runs: Vec<launch::RunInfo> =
        launch::runs(control).into_iter().filter(|r| all || r.pid.is_some()).collect();
    let state = |r: &launch::RunInfo| match (r.pid, r.exit) {
        (Some(_), _) => "running".to_owned(),
        (None, Some(code)) => format!("exited {code}"),
        (None, None) => "unknown".to_owned(),
    };
    let since = |r: &launch::RunInfo| {
        r.since.and_then(|t| u64::try_from(t).ok()).map(|t| {
            humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_secs(t))
                .to_string()
        })
    };
    let usage = |r: &launch::RunInfo| r.usage.unwrap_or_default();
    if json {
        let v: Vec<serde_json::Value> = runs
            .iter()
            .map(|r| {
                let u = usage(r);
                serde_json::json!({"agent": r.agent, "session": r.session, "pid": r.pid,
                    "state": if r.pid.is_some() { "running" } else { "exited" }, "exit": r.exit, "since": since(r),
                    "uptime_s": r.pid.and(r.since).map(uptime), "profile": r.profile, "model": r.model,
                    "cpu_ms": u.cpu_ns.map(|n| n / 1_000_000), "memory_bytes": u.memory, "pids": u.pids,
                    "tool_calls": r.tool_calls, "last_event": r.last_event.as_ref().map(|(k, _)| k),
                    "last_event_age_s": r.last_event.as_ref().map(|(_, at)| uptime(*at))})
            })
            .collect();
        return out::line(serde_json::Value::Array(v));
    }
    let mut list = out::Listing::new(
        "AGENT\tSESSION\tPID\tSTATE\tSINCE\tUPTIME\tPROFILE\tMODEL\tCPU\tMEM\tPIDS\tTOOLS\tLAST",
    );
    let or_dash = |v: Option<String>| v.unwrap_or_else(|| "-".to_owned());
    for r in &runs {
        let pid = r.pid.map_or_else(|| "-".to_owned(), |p| p.to_string());
        let u = usage(r);
        list.row(format_args!(
            "{}\t{}\t{pid}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
            r.agent,
            r.session,
            state(r),
            or_dash(since(r)),
            or_dash(r.pid.and(r.since).map(|t| format!("{}s", uptime(t)))),
            or_dash(r.profile.clone()),
            or_dash(r.model.clone()),
            or_dash(u.cpu_ns.map(|n| format!("{:.2}s", n as f64 / 1e9))),
            or_dash(u.memory.map(|b| format!("{:.1}MiB", b as f64 / f64::from(1u32 << 20)))),
            or_dash(u.pids.map(|n| n.to_string())),
            or_dash(r.tool_calls.map(|n| n.to_string())),
            or_dash(r.last_event.as_ref().map(|(k, at)| format!("{k},{}s", uptime(*at)))),
        ))?;
    }
    Ok(())
}

/// Seconds from `since` (seconds since the epoch) to now.
fn uptime(since: i64) -> u64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    now.saturating_sub(u64::try_from(since).unwrap_or(0))
}

/// Who an operator's `ctx agent stop` says stopped a run.
fn operator() -> String {
    format!("operator (uid {}, ctx agent stop)", rustix::process::getuid().as_raw())
}

fn rm(storage: &Path, name: &str, yes: bool) -> anyhow::Result<()> {
    let mut own = vec![format!("agent/{name}"), format!("agent/{name}.d")];
    for line in agents::remove(storage, name, yes).map_err(exit::launch)? {
        // The other objects' policies it took the agent's label out of go in the same commit:
        // no grant to a removed label stays in force.
        if let Some((path, _)) = line.strip_prefix("remove ").and_then(|l| l.split_once(':'))
            && !own.iter().any(|o| o == path)
        {
            own.push(path.to_owned());
        }
        out::line(line)?;
    }
    if yes {
        crate::cmd::config::own_change(storage, &own, &format!("agent rm {name}"))?;
    }
    Ok(())
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
                .map(|(name, write)| format!("{name}:{}", if *write { "write" } else { "read" }))
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
        Cmd::Stop { name: Some(name), session, all: false, .. } => {
            through_tool(ctx, "agent.stop", json!({"name": name, "session": session}))
        }
        Cmd::Stop { .. } => Err(Exit::new(
            exit::INVALID,
            "inside an agent's terminal, ctx agent stop takes one NAME (agent.stop stops the runs it started)",
        )
        .into()),
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
        Cmd::Inspect { at, name, json } => inspect(&at.source, &name, json),
        Cmd::Rm { at, name, yes, force, control } => {
            let running: Vec<String> = launch::running(&control)
                .into_iter()
                .filter(|(a, _, _)| *a == name)
                .map(|(_, s, _)| s)
                .collect();
            if !running.is_empty() && !force {
                return Err(Exit::new(
                    exit::FAILURE,
                    format!(
                        "agent {name} is running (session {}): stop it first (ctx agent stop), or --force stops it",
                        running.join(", ")
                    ),
                )
                .into());
            }
            for s in &running {
                if yes {
                    let code = launch::stop(&control, &name, s, &operator()).map_err(exit::launch)?;
                    out::line(format_args!("stopped agent {name} session {s} (status {code})"))?;
                } else {
                    out::line(format_args!("would stop agent {name} session {s}"))?;
                }
            }
            rm(&at.source, &name, yes)
        }
        Cmd::Grant { at, name, object, perm } => {
            let rels = grant_rels(&name, &object);
            crate::cmd::config::unstaged(&at.source, &strings(&rels))?;
            for line in agents::grant(&at.source, &name, &object, &perm).map_err(exit::launch)? {
                out::line(line)?;
            }
            let g = own_grant(&at.source, &rels, &format!("agent grant {name} {object} {perm}"))?;
            settle(&at.source, &rels, None, g.as_deref());
            Ok(())
        }
        Cmd::Revoke { at, name, object, perm } => {
            let rels = grant_rels(&name, &object);
            crate::cmd::config::unstaged(&at.source, &strings(&rels))?;
            for line in agents::revoke(&at.source, &name, &object, &perm).map_err(exit::launch)? {
                out::line(line)?;
            }
            let g = own_grant(&at.source, &rels, &format!("agent revoke {name} {object} {perm}"))?;
            settle(&at.source, &rels, None, g.as_deref());
            Ok(())
        }
        Cmd::Set { at, name, key, value, allow_root } => {
            let rel = format!("agent/{name}.d/{key}");
            crate::cmd::config::unstaged(&at.source, std::slice::from_ref(&rel))?;
            out::line(agents::set(&at.source, &name, &key, &value, allow_root).map_err(exit::launch)?)?;
            let g = crate::cmd::config::own_change(
                &at.source,
                std::slice::from_ref(&rel),
                &format!("agent set {name} {key}"),
            )?;
            settle(&at.source, &[PathBuf::from(rel)], None, g.as_deref());
            Ok(())
        }
        Cmd::Start(a) => {
            let mounts = a
                .mount
                .chunks(3)
                .map(launch::contract::extra_mount)
                .collect::<Result<Vec<_>, _>>()
                .map_err(exit::launch)?;
            let start = launch::Start {
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
                wait: a.wait || a.headless,
                headless: a.headless
                    || (a.wait && !a.tty && !std::io::IsTerminal::is_terminal(&std::io::stdout())),
                grace: a.grace,
                resume: a.resume,
                shared: a.shared,
                timeout: a.timeout,
            };
            match launch::start(&start, &mut std::io::stdout()).map_err(exit::launch)? {
                launch::supervise::Started::Running { agent, session, socket } => {
                    out::line(format_args!("started agent {agent} session {session}"))?;
                    out::line(format_args!("socket {}", socket.display()))?;
                    out::line(format_args!("watch: ctx agent watch {agent} --session {session}"))
                }
                launch::supervise::Started::Ended => Ok(()),
            }
        }
        Cmd::Stop { name: Some(name), session, all: false, control } => {
            let code = launch::stop(&control, &name, &session, &operator()).map_err(exit::launch)?;
            out::line(format_args!("stopped agent {name} session {session} (status {code})"))
        }
        Cmd::Stop { name, all: true, control, .. } => stop_all(&control, name.as_deref()),
        Cmd::Stop { name: None, .. } => Err(Exit::new(exit::INVALID, "ctx agent stop: NAME or --all").into()),
        Cmd::Ps { json, all, control } => ps(&control, json, all),
        Cmd::Watch { name, session, control } => {
            launch::terminal::relay(&control, &name, &session, false, &mut std::io::stdout())
                .map_err(exit::launch)
        }
        Cmd::Attach { name, session, control } => {
            launch::terminal::relay(&control, &name, &session, true, &mut std::io::stdout())
                .map_err(exit::launch)
        }
        Cmd::Send { name, session, text, control } => {
            launch::terminal::send(&control, &name, &session, &text).map_err(exit::launch)
        }
        Cmd::History { name, at, json } => session::history(&at.ctx, &name, &at.session, json),
        Cmd::Logs { name, at, follow } => session::logs(&at.ctx, &name, &at.session, follow),
        Cmd::Output { name, at, rebuild: false, json } => session::output(&at.ctx, &name, &at.session, json),
        Cmd::Output { name, at, rebuild: true, json } => {
            session::rebuild_latest(&at.ctx, &name, &at.session, json)
        }
        Cmd::Pack { name, at, .. } => session::pack_check(&at.ctx, &name, &at.session),
        Cmd::Children { name, at, json } => session::children(&at.ctx, &name, &at.session, json),
        Cmd::Wait { name, child, at, timeout } => session::wait(&at.ctx, &name, &at.session, &child, timeout),
    }
}
