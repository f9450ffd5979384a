//! The commands that read sessions (spec §6, `home/<uid>/agent/<agent>/session/<s>/`; the
//! launcher prepares them, `ctxterm::launch::session`): `ctx agent
//! history|output|children|wait|pack|output --rebuild`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ctxterm::launch::receipt;

use crate::exit::{self, Exit};

fn uid_of(ctx: &Path, agent: &str) -> anyhow::Result<u32> {
    exit::agent_at(ctx, agent)?;
    let t = ctxterm::launch::contract::read_control(ctx, agent, "uid").map_err(crate::exit::launch)?;
    t.trim().parse().map_err(|_| {
        Exit::new(exit::INVALID, format!("agent/{agent}.d/uid: {:?} is not a number", t.trim())).into()
    })
}

/// The session directory as seen through the host mount `ctx`.
fn dir(ctx: &Path, uid: u32, agent: &str, session: &str) -> PathBuf {
    policy::runtime::session_dir(ctx, uid, agent, session)
}

/// Reads at most `max` bytes of the file `rel` of the session directory `d`: the session is
/// the agent's tree, so the file is opened beneath it ([`ctxterm::beneath`]), never through a
/// link the agent planted.
fn read_in(d: &Path, rel: &str, max: u64) -> std::io::Result<Vec<u8>> {
    ctxterm::beneath::Tree::open(d)?.read(rel, max)
}

/// The most of a session file `ctx` reads at once (a larger one is cut here).
const SESSION_FILE_MAX: u64 = 256 << 20;

/// `ctx agent history`: the session's messages, as recorded.
pub fn history(ctx: &Path, agent: &str, session: &str, json: bool) -> anyhow::Result<()> {
    let d = dir(ctx, uid_of(ctx, agent)?, agent, session);
    let p = d.join("messages.jsonl");
    let t = read_in(&d, "messages.jsonl", SESSION_FILE_MAX).map_err(|e| Exit::io(p.display(), &e))?;
    if json {
        let mut all = Vec::new();
        for (i, line) in t.split(|&b| b == b'\n').enumerate().filter(|(_, l)| !l.is_empty()) {
            let v: serde_json::Value = serde_json::from_slice(line).map_err(|e| {
                Exit::new(exit::FAILURE, format!("{}:{}: not a JSON message: {e}", p.display(), i + 1))
            })?;
            all.push(v);
        }
        return crate::out::line(serde_json::Value::Array(all));
    }
    std::io::Write::write_all(&mut std::io::stdout(), &t)?;
    Ok(())
}

/// `ctx agent logs`: the terminal output the session's terminal kept (`terminal.log.1` then
/// `terminal.log`, the last [`KEPT_OUTPUT`](ctxterm::term::KEPT_OUTPUT) bytes of them); with
/// `follow`, what the terminal writes after, until the session is no longer `active`.
pub fn logs(ctx: &Path, agent: &str, session: &str, follow: bool) -> anyhow::Result<()> {
    use std::io::{Read, Seek, Write};
    let d = dir(ctx, uid_of(ctx, agent)?, agent, session);
    let t = ctxterm::beneath::Tree::open(&d).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => {
            Exit::new(exit::INVALID, format!("agent {agent} has no session {session}"))
        }
        _ => Exit::new(exit::FAILURE, format!("{}: {e}", d.display())),
    })?;
    let (log, max) = (policy::runtime::TERMINAL_LOG, ctxterm::term::KEPT_OUTPUT);
    let open = || t.open_regular(log, rustix::fs::OFlags::RDONLY);
    let mut cur = match open() {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(Exit::new(
                exit::FAILURE,
                format!("agent {agent} session {session}: no terminal output kept (a run with a terminal keeps it)"),
            )
            .into());
        }
        Err(e) => return Err(Exit::io(d.join(log).display(), &e).into()),
    };
    let previous = match t.read(format!("{log}.1"), max) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(Exit::io(d.join(format!("{log}.1")).display(), &e).into()),
    };
    let mut now = Vec::new();
    (&mut cur).take(max).read_to_end(&mut now).map_err(|e| Exit::io(d.join(log).display(), &e))?;
    let mut all = previous;
    all.extend_from_slice(&now);
    let from = all.len().saturating_sub(usize::try_from(max).unwrap_or(usize::MAX));
    let mut out = std::io::stdout().lock();
    out.write_all(&all[from..])?;
    out.flush()?;
    if !follow {
        return Ok(());
    }
    // The position read to, in the file the terminal writes now; a new file at the name is
    // the terminal's next half (the old one went to `.1`, its rest read before switching).
    let ino = |f: &std::fs::File| f.metadata().map(|m| std::os::unix::fs::MetadataExt::ino(&m)).ok();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = cur.read(&mut buf).map_err(|e| Exit::io(d.join(log).display(), &e))?;
        if n > 0 {
            out.write_all(&buf[..n])?;
            out.flush()?;
            continue;
        }
        let moved = open().ok().filter(|f| ino(f) != ino(&cur));
        if let Some(f) = moved {
            // What was written to the old file before it went, then the new one from its start.
            std::io::copy(&mut cur, &mut out)?;
            cur = f;
            cur.rewind()?;
            continue;
        }
        let state = t.read_string("state", 64).unwrap_or_default();
        if state.trim() != "active" {
            // The run has ended: what it wrote last is in the file already.
            std::io::copy(&mut (&mut cur).take(max), &mut out)?;
            out.flush()?;
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `ctx agent output`: the session's `latest.md`.
pub fn output(ctx: &Path, agent: &str, session: &str, json: bool) -> anyhow::Result<()> {
    let d = dir(ctx, uid_of(ctx, agent)?, agent, session);
    let p = d.join("latest.md");
    let t = read_in(&d, "latest.md", SESSION_FILE_MAX).map_err(|e| Exit::io(p.display(), &e))?;
    if json {
        return output_json(agent, session, &String::from_utf8_lossy(&t));
    }
    std::io::Write::write_all(&mut std::io::stdout(), &t)?;
    Ok(())
}

fn output_json(agent: &str, session: &str, text: &str) -> anyhow::Result<()> {
    crate::out::line(serde_json::json!({"agent": agent, "session": session, "output": text}))
}

fn children_of(ctx: &Path, agent: &str, session: &str) -> anyhow::Result<Vec<receipt::ChildRecord>> {
    Ok(receipt::records(&dir(ctx, uid_of(ctx, agent)?, agent, session)))
}

/// `ctx agent children`: ID, AGENT, SESSION, STATUS.
pub fn children(ctx: &Path, agent: &str, session: &str, json: bool) -> anyhow::Result<()> {
    let all = children_of(ctx, agent, session)?;
    if json {
        let v: Vec<serde_json::Value> = all
            .iter()
            .map(|c| serde_json::json!({"id": c.id, "agent": c.agent, "session": c.session, "status": c.status}))
            .collect();
        return crate::out::line(serde_json::Value::Array(v));
    }
    let mut list = crate::out::Listing::new("ID\tAGENT\tSESSION\tSTATUS");
    for c in all {
        list.row(format_args!("{}\t{}\t{}\t{}", c.id, c.agent, c.session, c.status))?;
    }
    Ok(())
}

/// `ctx agent wait`: until the child (by agent name or record id) ends; exit 0 done, 1 error,
/// 130 cancelled.
pub fn wait(ctx: &Path, agent: &str, session: &str, child: &str, timeout: Option<u64>) -> anyhow::Result<()> {
    let t = std::time::Instant::now();
    loop {
        let found = children_of(ctx, agent, session)?.into_iter().find(|c| c.id == child || c.agent == child);
        let Some(receipt::ChildRecord { status, .. }) = found else {
            return Err(Exit::new(
                exit::FAILURE,
                format!("agent {agent} session {session} has no child {child}"),
            )
            .into());
        };
        match status.as_str() {
            "done" => return Ok(()),
            "error" => return Err(Exit::quiet(exit::FAILURE).into()),
            "cancelled" => return Err(Exit::quiet(130).into()),
            _ => {}
        }
        if timeout.is_some_and(|s| t.elapsed() > Duration::from_secs(s)) {
            return Err(Exit::new(exit::UNAVAILABLE, format!("child {child} is still {status}")).into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

struct OnDisk(PathBuf);

impl policy::pack::Session for OnDisk {
    fn line(&self, file: &str, n: usize) -> Option<Vec<u8>> {
        let text = read_in(&self.0, file, SESSION_FILE_MAX).ok()?;
        text.split(|b| *b == b'\n').nth(n - 1).filter(|l| !l.is_empty()).map(<[u8]>::to_vec)
    }
    fn child(&self, id: &str) -> bool {
        ctxterm::beneath::Tree::open(&self.0)
            .is_ok_and(|t| t.sub(Path::new("context/child").join(id)).is_ok())
    }
    fn sha256(&self, bytes: &[u8]) -> String {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(bytes))
    }
}

/// `ctx agent pack --check`: the session's `context/pack.json` (shape and provenance) and its
/// `pack.md`; every problem listed, exit 2 if any.
pub fn pack_check(ctx: &Path, agent: &str, session: &str) -> anyhow::Result<()> {
    let d = dir(ctx, uid_of(ctx, agent)?, agent, session);
    let p = d.join("context/pack.json");
    let bytes = read_in(&d, "context/pack.json", SESSION_FILE_MAX).map_err(|e| Exit::io(p.display(), &e))?;
    let mut problems: Vec<String> = Vec::new();
    if read_in(&d, "context/pack.md", 0).is_err() {
        problems.push("context/pack.md is missing (the pack is pack.json and pack.md, side by side)".into());
    }
    match policy::pack::inspect_context_pack_json(&bytes) {
        Err(errs) => problems.extend(errs.iter().map(ToString::to_string)),
        Ok(pack) => {
            if let Err(errs) =
                policy::pack::validate_context_pack_source(&pack, agent, session, &OnDisk(d.clone()))
            {
                problems.extend(errs.iter().map(ToString::to_string));
            }
            if problems.is_empty() {
                println!("ok: {} items, {}", pack.items.len(), p.display());
                return Ok(());
            }
        }
    }
    for pr in &problems {
        println!("{}: {pr}", p.display());
    }
    Err(Exit::quiet(exit::INVALID).into())
}

/// `ctx agent output --rebuild`: `latest.md` from the last assistant message of
/// `messages.jsonl` (its `content`, or `text`), replaced whole.
pub fn rebuild_latest(ctx: &Path, agent: &str, session: &str, json: bool) -> anyhow::Result<()> {
    let d = dir(ctx, uid_of(ctx, agent)?, agent, session);
    let text = ctxterm::launch::session::rebuild_latest(&d).map_err(exit::launch)?;
    if json {
        return output_json(agent, session, &text);
    }
    print!("{text}");
    Ok(())
}
