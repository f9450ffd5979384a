//! `ctx shared new|ls|rm SPACE`: shared spaces in the storage (spec §8).
//!
//! A space is `shared/<space>/` with `tool/`, `data/`, `queue/` (the queue's directories) and
//! `agent/` (its shared sessions). Who may use it is decided as for anything else: Linux
//! identity and mode bits, then the view (an agent sees `shared/<space>` only with a
//! `shared:<space> read|write` grant), then the policy. `new` gives it an owner, a group and a
//! mode (default root, the group given, 2770: the group's members read and write, what they
//! make keeps the group), so an agent whose `groups` hold that group and whose policy grants
//! `shared:<space> write` uses it without any chown by hand.

use std::path::{Path, PathBuf};

use policy::v0::{Class, Permission, Policy, Query};

use crate::cmd::object::DEFAULT_STORAGE;
use crate::exit::{self, Exit};
use crate::out;

/// `ctx shared`.
#[derive(Debug, clap::Subcommand)]
pub enum Cmd {
    /// Create a shared space: tool/, data/, queue/ and agent/, with an owner, group and mode.
    New {
        /// The space's name.
        space: String,
        /// Its group (gid): agents with it in their groups may use the space.
        #[arg(long, default_value_t = 0)]
        group: u32,
        /// Its owner (uid).
        #[arg(long, default_value_t = 0)]
        owner: u32,
        /// Its mode, octal (set-group-ID keeps the group on what is made inside).
        #[arg(long, default_value = "2770", value_parser = parse_mode)]
        mode: u32,
        /// The storage.
        #[arg(long, default_value = DEFAULT_STORAGE)]
        source: PathBuf,
    },
    /// List shared spaces: owner, group, mode, and the agents granted each.
    Ls {
        /// One JSON object per space, in an array.
        #[arg(long)]
        json: bool,
        /// The storage.
        #[arg(long, default_value = DEFAULT_STORAGE)]
        source: PathBuf,
    },
    /// Remove a shared space; one that holds data, jobs or sessions only with --force.
    Rm {
        /// The space's name.
        space: String,
        /// Remove it with everything in it.
        #[arg(long)]
        force: bool,
        /// The storage.
        #[arg(long, default_value = DEFAULT_STORAGE)]
        source: PathBuf,
    },
}

fn parse_mode(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s, 8)
        .ok()
        .filter(|m| *m <= 0o7777)
        .ok_or_else(|| format!("{s:?} is not an octal mode (e.g. 2770)"))
}

fn valid(space: &str) -> anyhow::Result<()> {
    policy::name::validate(space)
        .map_err(|e| Exit::new(exit::INVALID, format!("invalid space name {space:?}: {e}")).into())
}

/// The agents of `storage` whose policy grants `shared:<space>` write, or else read.
fn granted(storage: &Path, space: &str) -> Vec<(String, &'static str)> {
    // root's: the storage's agent/ and the agents' controls
    let Ok(rd) = std::fs::read_dir(storage.join("agent")) else { return Vec::new() };
    let mut v = Vec::new();
    for e in rd.flatten() {
        let Some(name) = e.file_name().to_str().and_then(|n| n.strip_suffix(".d")).map(str::to_owned) else {
            continue;
        };
        // root's: an agent's controls in the storage
        let read = |c: &str| std::fs::read_to_string(e.path().join(c)).unwrap_or_default();
        let label = read("label").trim().to_owned();
        let Ok(p) = Policy::from_text(read("policy").as_bytes()) else { continue };
        let allows = |permission| {
            p.allows(&Query { subject: &label, class: Class::Shared, object: space, permission })
        };
        if allows(Permission::Write) {
            v.push((name, "write"));
        } else if allows(Permission::Read) {
            v.push((name, "read"));
        }
    }
    v.sort();
    v
}

/// `ctx shared ...`.
pub fn run(c: Cmd) -> anyhow::Result<()> {
    match c {
        Cmd::New { space, group, owner, mode, source } => {
            valid(&space)?;
            let root = source.join("shared");
            // root's: the storage's shared/
            if !root.is_dir() {
                return Err(Exit::new(
                    exit::FAILURE,
                    format!("{} is not a storage with shared/ (ctx bootstrap)", source.display()),
                )
                .into());
            }
            // Made beneath the storage's shared/ (root's), every level root's (0700) until all
            // are made; owners and modes are then set on descriptors, the space's own directory
            // last: nothing is done by name in a directory its owner could already change.
            let dir = root.join(&space);
            let shared = ctxterm::beneath::Tree::open(&root).map_err(|e| Exit::io(root.display(), &e))?;
            let top = match shared.make_dir(&space, 0o700) {
                Ok(t) => t,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    return Err(
                        Exit::new(exit::FAILURE, format!("shared space {space} already exists")).into()
                    );
                }
                Err(e) => return Err(Exit::io(dir.display(), &e).into()),
            };
            let mut made = Vec::new();
            for d in ["tool", "data", "queue", "agent"] {
                made.push((
                    d.to_owned(),
                    top.make_dirs(d, 0o700).map_err(|e| Exit::io(dir.join(d).display(), &e))?,
                ));
            }
            for d in ringfs::queue::DIRS {
                let rel = format!("queue/{d}");
                made.push((
                    rel.clone(),
                    top.make_dirs(&rel, 0o700).map_err(|e| Exit::io(dir.join(&rel).display(), &e))?,
                ));
            }
            made.push((String::new(), top));
            for (rel, t) in &made {
                let shown = dir.join(rel);
                t.chown(owner, group).map_err(|e| Exit::io(shown.display(), &e))?;
                // tool/ is the space's to install into, not its members' to write.
                let m = if rel == "tool" { mode & !0o022 | 0o050 } else { mode };
                t.chmod(m).map_err(|e| Exit::io(shown.display(), &e))?;
            }
            out::line(format!(
                "created shared/{space} (owner {owner}, group {group}, mode {mode:o}): grant it with \
                 ctx agent grant NAME shared:{space} write, and give the agent group {group}"
            ))
        }
        Cmd::Ls { json, source } => {
            let mut rows = Vec::new();
            let mut list = out::Listing::new("SPACE\tOWNER\tGROUP\tMODE\tAGENTS");
            let root = source.join("shared");
            let shared = ctxterm::beneath::Tree::open(&root).map_err(|e| Exit::io(root.display(), &e))?;
            let mut names: Vec<String> = shared
                .names(usize::MAX)
                .map_err(|e| Exit::io(root.display(), &e))?
                .into_iter()
                .filter_map(|n| n.into_string().ok())
                .collect();
            names.sort();
            for n in names {
                // Its own status, never a link's target.
                let Ok(m) = shared.stat(&n) else { continue };
                if rustix::fs::FileType::from_raw_mode(m.st_mode) != rustix::fs::FileType::Directory {
                    continue;
                }
                let agents = granted(&source, &n);
                if json {
                    let agents: Vec<_> =
                        agents.iter().map(|(a, p)| serde_json::json!({"agent": a, "access": p})).collect();
                    rows.push(serde_json::json!({"space": n, "owner": m.st_uid, "group": m.st_gid,
                        "mode": format!("{:o}", m.st_mode & 0o7777), "agents": agents}));
                } else {
                    let shown: Vec<String> = agents.iter().map(|(a, p)| format!("{a}:{p}")).collect();
                    list.row(format!(
                        "{n}\t{}\t{}\t{:o}\t{}",
                        m.st_uid,
                        m.st_gid,
                        m.st_mode & 0o7777,
                        if shown.is_empty() { "-".to_owned() } else { shown.join(",") }
                    ))?;
                }
            }
            if json {
                out::line(serde_json::Value::Array(rows))?;
            }
            Ok(())
        }
        Cmd::Rm { space, force, source } => {
            valid(&space)?;
            let dir = source.join("shared").join(&space);
            let root = source.join("shared");
            let Ok(top) = ctxterm::beneath::Tree::open(&root).and_then(|t| t.sub(&space)) else {
                return Err(Exit::new(exit::FAILURE, format!("no shared space {space}")).into());
            };
            if !force {
                let busy = first_file(&top);
                if let Some(p) = busy {
                    return Err(Exit::new(
                        exit::FAILURE,
                        format!("shared/{space} is not empty ({}): remove it with --force", p.display()),
                    )
                    .into());
                }
            }
            // Beneath the storage's shared/ (root's), never following a link or crossing a mount.
            drop(top);
            ctxterm::beneath::Tree::open(&root)
                .and_then(|t| t.remove_all(&space))
                .map_err(|e| Exit::io(dir.display(), &e))?;
            out::line(format!("removed shared/{space}"))
        }
    }
}

/// The first entry (not a directory) below the tree `top`, if any: walked beneath it, never
/// through a link.
fn first_file(top: &ctxterm::beneath::Tree) -> Option<PathBuf> {
    let mut stack = vec![PathBuf::new()];
    while let Some(d) = stack.pop() {
        let t = if d.as_os_str().is_empty() { top.sub(".").ok()? } else { top.sub(&d).ok()? };
        for n in t.names(usize::MAX).ok()? {
            let rel = d.join(&n);
            match top.stat(&rel) {
                Ok(st)
                    if rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Directory =>
                {
                    stack.push(rel)
                }
                _ => return Some(top.path().join(rel)),
            }
        }
    }
    None
}
