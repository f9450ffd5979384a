//! Session preparation (spec §6): `home/<uid>/agent/<agent>/session/<s>/` with `state`,
//! `created_at`, `updated_at`, `cwd`, `latest.md`, `messages.jsonl`, `events.jsonl`,
//! `context/` and `terminal/main.sock` (a symlink to the run's socket, spec §7), every file
//! owned by the agent; the state a run leaves when it ends; and the events that say why a run
//! was stopped.

use std::io::Write;
use std::path::Path;
use std::time::SystemTime;

use policy::runtime;

use super::{Error, Result};

fn now() -> String {
    format!("{}\n", humantime::format_rfc3339_seconds(SystemTime::now()))
}

fn at(path: &Path) -> impl Fn(std::io::Error) -> Error + '_ {
    move |source| Error::Session { path: path.to_path_buf(), source }
}

/// Creates (or keeps) the agent's persistent home through the host mount `ctx`: mode 0700,
/// owned by the agent; returns its path there. The home is the agent's to change: it is
/// opened without following a symlink anywhere on its path before it is changed.
pub fn prepare_home(ctx: &Path, uid: u32, gid: u32, agent: &str) -> Result<std::path::PathBuf> {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    let h = runtime::agent_home(ctx, uid, agent);
    if let Some(parent) = h.parent() {
        std::fs::create_dir_all(parent).map_err(at(parent))?;
    }
    match std::fs::create_dir(&h) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(at(&h)(e)),
    }
    let flags = OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC;
    let fd = rustix::fs::openat2(rustix::fs::CWD, &h, flags, Mode::empty(), ResolveFlags::NO_SYMLINKS)
        .map_err(|e| at(&h)(e.into()))?;
    rustix::fs::fchown(&fd, Some(rustix::fs::Uid::from_raw(uid)), Some(rustix::fs::Gid::from_raw(gid)))
        .map_err(|e| at(&h)(e.into()))?;
    rustix::fs::fchmod(&fd, Mode::from_raw_mode(0o700)).map_err(|e| at(&h)(e.into()))?;
    Ok(h)
}

/// Creates (or reopens) the session directory `d` of a run of `agent`, through the host
/// mount `ctx`: every file of the layout, owned by the agent (`uid`, `gid`). In a home, the
/// directories up to the home are the agent's too. In a shared space (`shared`), what is made
/// keeps the space's group (its directories are set-group-ID) and is open to that group
/// (directories 2770, files 0660), so the agents the space's group admits share it.
#[allow(clippy::too_many_arguments)]
pub fn prepare(
    ctx: &Path,
    d: &Path,
    uid: u32,
    gid: u32,
    shared: bool,
    agent: &str,
    session: &str,
    cwd: &str,
) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    // Up to the home (`home/<uid>`), or the space's `agent/` directory.
    let top = if shared {
        d.ancestors().nth(3).map(Path::to_path_buf).unwrap_or_else(|| d.to_path_buf())
    } else {
        ctx.join("home").join(uid.to_string())
    };
    if shared {
        std::fs::create_dir_all(&top).map_err(at(&top))?;
    }
    let group = match shared {
        false => gid,
        // The space's group, whoever made the directory.
        true => std::fs::metadata(top.parent().unwrap_or(&top)).map_err(at(&top))?.gid(),
    };
    std::fs::create_dir_all(d.join("context")).map_err(at(d))?;
    let own = |p: &Path| {
        if shared {
            // Made now (root's, through the host mount): the agent's, in the space's group.
            // What another agent of the space made stays theirs.
            if std::fs::symlink_metadata(p).is_ok_and(|m| m.uid() == 0 && !m.file_type().is_symlink()) {
                use std::os::unix::fs::PermissionsExt;
                let _ = rustix::fs::chown(
                    p,
                    Some(rustix::fs::Uid::from_raw(uid)),
                    Some(rustix::fs::Gid::from_raw(group)),
                );
                let mode = if p.is_dir() { 0o2770 } else { 0o660 };
                let _ = std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode));
            }
        } else {
            let _ = rustix::fs::chown(
                p,
                Some(rustix::fs::Uid::from_raw(uid)),
                Some(rustix::fs::Gid::from_raw(group)),
            );
        }
    };
    let mut up = d.to_path_buf();
    // The home itself is the agent's; the space's `agent/` directory is the space's.
    while up.starts_with(&top) && !(shared && up == top) {
        own(&up);
        if !up.pop() {
            break;
        }
    }
    own(&d.join("context"));
    let put = |name: &str, text: &str, keep: bool| -> Result<()> {
        let p = d.join(name);
        if keep && p.exists() {
            return Ok(());
        }
        std::fs::write(&p, text).map_err(at(&p))?;
        own(&p);
        Ok(())
    };
    put("created_at", &now(), true)?;
    put("updated_at", &now(), false)?;
    put("state", "active\n", false)?;
    put("cwd", &format!("{cwd}\n"), false)?;
    put("latest.md", "", true)?;
    // The terminal's ABI path (spec §7): a symlink to the socket in the run's directory.
    let term = d.join("terminal");
    std::fs::create_dir_all(&term).map_err(at(&term))?;
    own(&term);
    let link = term.join("main.sock");
    let _ = std::fs::remove_file(&link);
    let target = runtime::run_dir(agent, session).join("term/main.sock");
    std::os::unix::fs::symlink(&target, &link).map_err(at(&link))?;
    for log in ["messages.jsonl", "events.jsonl"] {
        let p = d.join(log);
        if !p.exists() {
            std::fs::OpenOptions::new().append(true).create(true).open(&p).map_err(at(&p))?;
            own(&p);
        }
    }
    Ok(())
}

/// Marks the run of the session whose directory is `d` as ended with `code`.
pub fn finish(d: &Path, code: i32) {
    let _ = std::fs::write(d.join("state"), if code == 0 { "done\n" } else { "error\n" });
    let _ = std::fs::write(d.join("updated_at"), now());
}

/// Appends one event line to a session's `events.jsonl`: durable when it returns.
pub fn append_event(dir: &Path, event: &serde_json::Value) -> std::io::Result<()> {
    append_line(dir, "events.jsonl", event)
}

/// Appends `value` as one JSON line to the session log `log` (`events.jsonl` or
/// `messages.jsonl`) of the session directory `dir`: durable when it returns (through /ctx).
pub fn append_line(dir: &Path, log: &str, value: &serde_json::Value) -> std::io::Result<()> {
    let mut line = value.to_string();
    line.push('\n');
    std::fs::OpenOptions::new()
        .append(true)
        .open(dir.join(log))
        .and_then(|mut f| f.write_all(line.as_bytes()))
}

/// Now, as events stamp it.
pub fn timestamp() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

/// Rebuilds a session's `latest.md` from the last assistant message of its `messages.jsonl`
/// (its `content`, or `text`), replaced whole; returns the text.
pub fn rebuild_latest(dir: &Path) -> Result<String> {
    let msgs = dir.join("messages.jsonl");
    let text = std::fs::read_to_string(&msgs).map_err(at(&msgs))?;
    let mut last = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["role"] == "assistant")
        .filter_map(|v| v["content"].as_str().or_else(|| v["text"].as_str()).map(str::to_owned))
        .next_back()
        .unwrap_or_default();
    if !last.is_empty() && !last.ends_with('\n') {
        last.push('\n');
    }
    let tmp = dir.join(format!(".latest.md.{}", std::process::id()));
    std::fs::write(&tmp, &last).map_err(at(&tmp))?;
    let latest = dir.join("latest.md");
    std::fs::rename(&tmp, &latest).map_err(at(&latest))?;
    Ok(last)
}
