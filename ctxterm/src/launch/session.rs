//! Session preparation (spec §6): `home/<uid>/agent/<agent>/session/<s>/` with `state`,
//! `created_at`, `updated_at`, `cwd`, `latest.md`, `messages.jsonl`, `events.jsonl`,
//! `context/` and `terminal/main.sock` (a symlink to the run's socket, spec §7), every file
//! owned by the agent; the state a run leaves when it ends; and the events that say why a run
//! was stopped.

use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::SystemTime;

use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags};

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
    use rustix::fs::{Mode, OFlags};
    let h = runtime::agent_home(ctx, uid, agent);
    // Made level by level beneath /ctx/home (a mount of its own on the host: the data
    // connection): the levels below `home/<uid>` are the agent's.
    let homes = ctx.join("home");
    let rel = h.strip_prefix(&homes).map_err(|_| at(&h)(std::io::ErrorKind::InvalidInput.into()))?;
    crate::beneath::Tree::open(&homes).and_then(|t| t.make_dirs(rel, 0o755)).map_err(at(&h))?;
    let flags = OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC;
    let fd = crate::beneath::open_dir(&h, flags).map_err(|e| at(&h)(e.into()))?;
    rustix::fs::fchown(&fd, Some(rustix::fs::Uid::from_raw(uid)), Some(rustix::fs::Gid::from_raw(gid)))
        .map_err(|e| at(&h)(e.into()))?;
    rustix::fs::fchmod(&fd, Mode::from_raw_mode(0o700)).map_err(|e| at(&h)(e.into()))?;
    Ok(h)
}

/// Opens the directory `d` without following a symlink anywhere on its path: a session's
/// directories are the agents' to change, and root never follows what an agent planted.
pub fn open_dir(d: &Path) -> std::io::Result<OwnedFd> {
    let flags = OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC;
    crate::beneath::open_dir(d, flags).map_err(Into::into)
}

/// How a name of a level the agent owns is resolved: beneath its directory, through no link
/// and across no mount.
const OWNED: ResolveFlags = crate::beneath::BENEATH;

/// Opens (or makes) the directory `name` in `dir`, a level the agent owns: not following a
/// symlink, not crossing a mount.
fn sub_dir(dir: &OwnedFd, name: &str) -> std::io::Result<OwnedFd> {
    level(dir, name, OWNED)
}

/// Opens (or makes) the directory `name` in `dir` with `resolve`.
fn level(dir: &OwnedFd, name: &str, resolve: ResolveFlags) -> std::io::Result<OwnedFd> {
    match rustix::fs::mkdirat(dir, name, Mode::from_raw_mode(0o755)) {
        Ok(()) | Err(rustix::io::Errno::EXIST) => {}
        Err(e) => return Err(e.into()),
    }
    let flags = OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC;
    rustix::fs::openat2(dir, name, flags, Mode::empty(), resolve).map_err(Into::into)
}

/// Opens the file `name` of `dir` for writing (`flags` added), never through a symlink, and
/// only when it is a regular file: a FIFO or device planted in its place is refused (opened
/// non-blocking, so it cannot hold the opener).
fn file_at(dir: &OwnedFd, name: &str, flags: OFlags) -> std::io::Result<std::fs::File> {
    regular(dir, name, OFlags::WRONLY | flags, Mode::from_raw_mode(0o644))
}

/// Opens `name` of `dir` with `flags`, never through a symlink, non-blocking until it is
/// known to be a regular file; anything else is refused with `EINVAL`.
fn regular(dir: &OwnedFd, name: &str, flags: OFlags, mode: Mode) -> std::io::Result<std::fs::File> {
    // openat2 takes a mode only for a file it may create (EINVAL otherwise).
    let mode = if flags.contains(OFlags::CREATE) { mode } else { Mode::empty() };
    let f = rustix::fs::openat2(
        dir,
        name,
        flags | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
        mode,
        OWNED,
    )?;
    if rustix::fs::FileType::from_raw_mode(rustix::fs::fstat(&f)?.st_mode)
        != rustix::fs::FileType::RegularFile
    {
        return Err(rustix::io::Errno::INVAL.into());
    }
    rustix::fs::fcntl_setfl(&f, rustix::fs::fcntl_getfl(&f)? & !OFlags::NONBLOCK)?;
    Ok(std::fs::File::from(f))
}

/// A name no other file of this process made: the time in nanoseconds and a count.
pub fn unique_stamp() -> String {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let t = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_nanos();
    format!("{t}.{}.{}", std::process::id(), N.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
}

/// Creates (or reopens) the session directory `d` of a run of `agent`, through the host
/// mount `ctx`: every file of the layout, owned by the agent (`uid`, `gid`). In a home, the
/// directories up to the home are the agent's too. In a shared space (`shared`), what is made
/// keeps the space's group and is open to that group (directories 2770, files 0660), so the
/// agents the space's group admits share it. Nothing is followed through a symlink: every
/// directory is opened beneath the one before it, every file with `O_NOFOLLOW`, and owners
/// and modes are set on descriptors.
#[allow(clippy::too_many_arguments)]
pub fn prepare(
    ctx: &Path,
    d: &Path,
    uid: u32,
    gid: u32,
    shared: bool,
    cwd: &str,
    terminal: &Path,
) -> Result<()> {
    let rel =
        d.strip_prefix(ctx).map_err(|_| at(d)(std::io::Error::from(std::io::ErrorKind::InvalidInput)))?;
    let parts: Vec<&str> = rel.iter().filter_map(|c| c.to_str()).collect();
    // The levels the run owns: below `home/` (the home itself too), or below the space's
    // `agent/` directory (`shared/<space>/agent/`).
    let first_owned = if shared { 3 } else { 1 };
    let mut fd = open_dir(ctx).map_err(at(ctx))?;
    let mut group = gid;
    let own = |fd: &OwnedFd, dir: bool, group: u32| -> std::io::Result<()> {
        if shared {
            // Made now (root's, through the host mount): the agent's, in the space's group.
            // What another agent of the space made stays theirs.
            if rustix::fs::fstat(fd)?.st_uid == 0 {
                rustix::fs::fchown(
                    fd,
                    Some(rustix::fs::Uid::from_raw(uid)),
                    Some(rustix::fs::Gid::from_raw(group)),
                )?;
                rustix::fs::fchmod(fd, Mode::from_raw_mode(if dir { 0o2770 } else { 0o660 }))?;
            }
            Ok(())
        } else {
            rustix::fs::fchown(
                fd,
                Some(rustix::fs::Uid::from_raw(uid)),
                Some(rustix::fs::Gid::from_raw(group)),
            )
            .map_err(Into::into)
        }
    };
    for (i, part) in parts.iter().enumerate() {
        // Above the levels the run owns, the operator's mounts are crossed (`home/` and
        // `shared/` are the data connection's; a space may be a volume of its own).
        let resolve = if i >= first_owned { OWNED } else { OWNED.difference(ResolveFlags::NO_XDEV) };
        fd = level(&fd, part, resolve).map_err(at(d))?;
        if shared && i == 1 {
            // `shared/<space>`: its group is the space's.
            group = rustix::fs::fstat(&fd).map_err(|e| at(d)(e.into()))?.st_gid;
        }
        if i >= first_owned {
            own(&fd, true, group).map_err(at(d))?;
        }
    }
    let dir = fd;
    let context = sub_dir(&dir, "context").map_err(at(&d.join("context")))?;
    own(&context, true, group).map_err(at(d))?;
    let put = |name: &str, text: &str, keep: bool| -> Result<()> {
        let p = d.join(name);
        if keep && rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW).is_ok() {
            return Ok(());
        }
        let mut f = file_at(&dir, name, OFlags::CREATE | OFlags::TRUNC).map_err(at(&p))?;
        f.write_all(text.as_bytes()).map_err(at(&p))?;
        own(&OwnedFd::from(f), false, group).map_err(at(&p))?;
        Ok(())
    };
    put("created_at", &now(), true)?;
    put("updated_at", &now(), false)?;
    put("state", "active\n", false)?;
    put("cwd", &format!("{cwd}\n"), false)?;
    put("latest.md", "", true)?;
    // The terminal's ABI path (spec §7): a symlink to the socket in the run's directory.
    let term = sub_dir(&dir, "terminal").map_err(at(&d.join("terminal")))?;
    own(&term, true, group).map_err(at(d))?;
    let _ = rustix::fs::unlinkat(&term, "main.sock", AtFlags::empty());
    rustix::fs::symlinkat(terminal, &term, "main.sock")
        .map_err(|e| at(&d.join("terminal/main.sock"))(e.into()))?;
    for log in ["messages.jsonl", "events.jsonl"] {
        let p = d.join(log);
        if rustix::fs::statat(&dir, log, AtFlags::SYMLINK_NOFOLLOW).is_err() {
            let f = file_at(&dir, log, OFlags::CREATE | OFlags::APPEND).map_err(at(&p))?;
            own(&OwnedFd::from(f), false, group).map_err(at(&p))?;
        }
    }
    Ok(())
}

/// Marks the run of the session whose directory is `d` as ended with `code`.
pub fn finish(d: &Path, code: i32) {
    finish_as(d, if code == 0 { "done" } else { "error" });
}

/// Marks the session `state` (`done`, `error`, `stopped`) now.
pub fn finish_as(d: &Path, state: &str) {
    let Ok(dir) = open_dir(d) else { return };
    let put = |name: &str, text: &str| {
        if let Ok(mut f) = file_at(&dir, name, OFlags::TRUNC) {
            let _ = f.write_all(text.as_bytes());
        }
    };
    put("state", &format!("{state}\n"));
    put("updated_at", &now());
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
    file_at(&open_dir(dir)?, log, OFlags::APPEND)?.write_all(line.as_bytes())
}

/// Reads the file `name` of the session directory `dir` (at most `max` bytes), never through
/// a symlink.
pub fn read_file(dir: &Path, name: &str, max: u64) -> std::io::Result<String> {
    use std::io::Read;
    let d = open_dir(dir)?;
    let mut s = String::new();
    regular(&d, name, OFlags::RDONLY, Mode::empty())?.take(max).read_to_string(&mut s)?;
    Ok(s)
}

/// Writes the file `name` of the session directory `dir` whole (made new, then renamed over
/// the old one), owned as the directory is; never through a symlink.
pub fn replace_file(dir: &Path, name: &str, text: &str) -> std::io::Result<()> {
    let d = open_dir(dir)?;
    let tmp = format!(".{name}.{}", std::process::id());
    let _ = rustix::fs::unlinkat(&d, tmp.as_str(), AtFlags::empty());
    let mut f = file_at(&d, &tmp, OFlags::CREATE | OFlags::EXCL)?;
    f.write_all(text.as_bytes())?;
    let st = rustix::fs::fstat(&d)?;
    let _ = rustix::fs::fchown(
        &f,
        Some(rustix::fs::Uid::from_raw(st.st_uid)),
        Some(rustix::fs::Gid::from_raw(st.st_gid)),
    );
    drop(f);
    rustix::fs::renameat(&d, tmp.as_str(), &d, name)?;
    Ok(())
}

/// Appends `lines` (whole JSON lines) to the session's `context/refs.jsonl` in one write, made
/// (and `context/` with it) as the session directory's owner's when missing; synced. Never
/// through a symlink.
pub fn append_ref_lines(dir: &Path, lines: &str) -> std::io::Result<()> {
    let d = open_dir(dir)?;
    let owner = rustix::fs::fstat(&d)?;
    let give = |fd: &dyn std::os::fd::AsFd| {
        rustix::fs::fchown(
            fd,
            Some(rustix::fs::Uid::from_raw(owner.st_uid)),
            Some(rustix::fs::Gid::from_raw(owner.st_gid)),
        )
    };
    let made = rustix::fs::mkdirat(&d, "context", Mode::from_raw_mode(0o755)).is_ok();
    let context = sub_dir(&d, "context")?;
    if made {
        give(&context)?;
    }
    // Made here: the session's owner's. Already there: taken only when it is the session
    // owner's own file with one name (never a file of another user linked in its place).
    let f = match file_at(&context, "refs.jsonl", OFlags::APPEND | OFlags::CREATE | OFlags::EXCL) {
        Ok(f) => {
            give(&f)?;
            f
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let f = file_at(&context, "refs.jsonl", OFlags::APPEND)?;
            let st = rustix::fs::fstat(&f)?;
            if st.st_nlink != 1 || st.st_uid != owner.st_uid {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::PermissionDenied,
                    "context/refs.jsonl is not the session owner's own file",
                ));
            }
            f
        }
        Err(e) => return Err(e),
    };
    (&f).write_all(lines.as_bytes())?;
    f.sync_data()
}

/// Now, as events stamp it.
pub fn timestamp() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

/// Rebuilds a session's `latest.md` from the last assistant message of its `messages.jsonl`
/// (its `content`, or `text`), replaced whole; returns the text.
pub fn rebuild_latest(dir: &Path) -> Result<String> {
    let msgs = dir.join("messages.jsonl");
    let text = read_file(dir, "messages.jsonl", 64 << 20).map_err(at(&msgs))?;
    let mut last = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["role"] == "assistant")
        .filter_map(|v| {
            let text = v["content"].as_str().or_else(|| v["text"].as_str())?.to_owned();
            Some(match v["content_file"].as_str() {
                Some(f) => {
                    format!("{text}\n[cortexfs: the whole answer, {} bytes, is {f}]", v["content_bytes"])
                }
                None => text,
            })
        })
        .next_back()
        .unwrap_or_default();
    if !last.is_empty() && !last.ends_with('\n') {
        last.push('\n');
    }
    let latest = dir.join("latest.md");
    replace_file(dir, "latest.md", &last).map_err(at(&latest))?;
    Ok(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A FIFO an agent planted where a session file goes neither holds root's writer or reader
    /// (each would block until the agent opened the other end) nor is written: refused.
    #[test]
    fn a_fifo_in_place_of_a_session_file_is_refused_without_blocking() {
        let d = tempfile::tempdir().unwrap();
        for name in ["state", "updated_at", "messages.jsonl", "latest.md"] {
            // root's: the test's own temporary directory
            rustix::fs::mknodat(
                rustix::fs::CWD,
                d.path().join(name).as_path(),
                rustix::fs::FileType::Fifo,
                Mode::from_raw_mode(0o666),
                0,
            )
            .unwrap();
        }
        let dir = d.path().to_owned();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            finish(&dir, 0);
            let read = read_file(&dir, "messages.jsonl", 100).map_err(|e| e.raw_os_error());
            let append =
                append_line(&dir, "messages.jsonl", &serde_json::json!({})).map_err(|e| e.raw_os_error());
            let _ = tx.send((read, append));
        });
        let (read, append) = rx.recv_timeout(std::time::Duration::from_secs(20)).expect("nothing blocks");
        assert_eq!(read, Err(Some(libc_einval())));
        // Opened for writing with no reader: ENXIO before any type check.
        assert!(append.is_err(), "{append:?}");
    }

    /// The session's own files are appended to, read and replaced as regular files (an open
    /// without `O_CREAT` takes no mode: openat2 refuses one).
    #[test]
    fn a_session_file_is_appended_read_and_replaced() {
        let d = tempfile::tempdir().unwrap();
        // root's: the test's own temporary directory
        std::fs::write(d.path().join("events.jsonl"), "").unwrap();
        append_event(d.path(), &serde_json::json!({"n": 1})).unwrap();
        append_line(d.path(), "events.jsonl", &serde_json::json!({"n": 2})).unwrap();
        assert_eq!(read_file(d.path(), "events.jsonl", 100).unwrap(), "{\"n\":1}\n{\"n\":2}\n");
        replace_file(d.path(), "latest.md", "hi\n").unwrap();
        assert_eq!(read_file(d.path(), "latest.md", 100).unwrap(), "hi\n");
    }

    fn libc_einval() -> i32 {
        rustix::io::Errno::INVAL.raw_os_error()
    }
}
