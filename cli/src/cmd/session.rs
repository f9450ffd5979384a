//! Sessions (spec §6): `home/<uid>/agent/<agent>/session/<s>/` with `state`, `created_at`,
//! `updated_at`, `cwd`, `latest.md`, `messages.jsonl`, `events.jsonl`, `context/` and
//! `terminal/main.sock` (a symlink to the run's socket, spec §7); and the
//! commands that read them: `ctx agent history|output|children|wait`.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::exit::{self, Exit};

fn now() -> String {
    format!("{}\n", humantime::format_rfc3339_seconds(SystemTime::now()))
}

fn uid_of(ctx: &Path, agent: &str) -> anyhow::Result<u32> {
    let t = crate::cmd::launch::read_control(ctx, agent, "uid")?;
    t.trim().parse().map_err(|_| {
        Exit::new(exit::INVALID, format!("agent/{agent}.d/uid: {:?} is not a number", t.trim())).into()
    })
}

/// The session directory as seen through the host mount `ctx`.
pub fn dir(ctx: &Path, uid: u32, agent: &str, session: &str) -> PathBuf {
    ctx.join("home").join(uid.to_string()).join("agent").join(agent).join("session").join(session)
}

/// Creates (or reopens) a session for a run: every file of the layout, owned by the agent.
pub fn prepare(ctx: &Path, uid: u32, gid: u32, agent: &str, session: &str, cwd: &str) -> anyhow::Result<()> {
    let d = dir(ctx, uid, agent, session);
    std::fs::create_dir_all(d.join("context")).map_err(|e| Exit::io(d.display(), &e))?;
    let own = |p: &Path| {
        let _ =
            rustix::fs::chown(p, Some(rustix::fs::Uid::from_raw(uid)), Some(rustix::fs::Gid::from_raw(gid)));
    };
    let mut up = d.clone();
    while up.starts_with(ctx.join("home").join(uid.to_string())) {
        own(&up);
        if !up.pop() {
            break;
        }
    }
    own(&d.join("context"));
    let put = |name: &str, text: &str, keep: bool| -> anyhow::Result<()> {
        let p = d.join(name);
        if keep && p.exists() {
            return Ok(());
        }
        std::fs::write(&p, text).map_err(|e| Exit::io(p.display(), &e))?;
        own(&p);
        Ok(())
    };
    put("created_at", &now(), true)?;
    put("updated_at", &now(), false)?;
    put("state", "active\n", false)?;
    put("cwd", &format!("{cwd}\n"), false)?;
    put("latest.md", "", true)?;
    // The terminal's ABI path (spec §7): a symlink to the socket in the run's runtime directory.
    let term = d.join("terminal");
    std::fs::create_dir_all(&term).map_err(|e| Exit::io(term.display(), &e))?;
    own(&term);
    let link = term.join("main.sock");
    let _ = std::fs::remove_file(&link);
    let target = Path::new(crate::cmd::launch::RUNTIME).join(agent).join(session).join("term/main.sock");
    std::os::unix::fs::symlink(&target, &link).map_err(|e| Exit::io(link.display(), &e))?;
    for log in ["messages.jsonl", "events.jsonl"] {
        let p = d.join(log);
        if !p.exists() {
            std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .open(&p)
                .map_err(|e| Exit::io(p.display(), &e))?;
            own(&p);
        }
    }
    Ok(())
}

/// Marks a session's run as ended with `code`.
pub fn finish(ctx: &Path, uid: u32, agent: &str, session: &str, code: i32) {
    let d = dir(ctx, uid, agent, session);
    let _ = std::fs::write(d.join("state"), if code == 0 { "done\n" } else { "error\n" });
    let _ = std::fs::write(d.join("updated_at"), now());
}

/// `ctx agent history`: the session's messages, as recorded.
pub fn history(ctx: &Path, agent: &str, session: &str) -> anyhow::Result<()> {
    let p = dir(ctx, uid_of(ctx, agent)?, agent, session).join("messages.jsonl");
    let t = std::fs::read(&p).map_err(|e| Exit::io(p.display(), &e))?;
    std::io::Write::write_all(&mut std::io::stdout(), &t)?;
    Ok(())
}

/// `ctx agent output`: the session's `latest.md`.
pub fn output(ctx: &Path, agent: &str, session: &str) -> anyhow::Result<()> {
    let p = dir(ctx, uid_of(ctx, agent)?, agent, session).join("latest.md");
    let t = std::fs::read(&p).map_err(|e| Exit::io(p.display(), &e))?;
    std::io::Write::write_all(&mut std::io::stdout(), &t)?;
    Ok(())
}

/// A child record: (id, agent, session, status).
fn children_of(
    ctx: &Path,
    agent: &str,
    session: &str,
) -> anyhow::Result<Vec<(String, String, String, String)>> {
    let d = dir(ctx, uid_of(ctx, agent)?, agent, session).join("context").join("child");
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(&d) else { return Ok(out) };
    for e in entries.flatten() {
        let read = |n: &str| std::fs::read_to_string(e.path().join(n)).unwrap_or_default().trim().to_owned();
        out.push((
            e.file_name().to_string_lossy().into_owned(),
            read("agent"),
            read("session"),
            read("status"),
        ));
    }
    out.sort();
    Ok(out)
}

/// `ctx agent children`: ID, AGENT, SESSION, STATUS.
pub fn children(ctx: &Path, agent: &str, session: &str) -> anyhow::Result<()> {
    for (id, a, s, st) in children_of(ctx, agent, session)? {
        println!("{id}\t{a}\t{s}\t{st}");
    }
    Ok(())
}

/// `ctx agent wait`: until the child (by agent name or record id) ends; exit 0 done, 1 error,
/// 130 cancelled.
pub fn wait(ctx: &Path, agent: &str, session: &str, child: &str, timeout: Option<u64>) -> anyhow::Result<()> {
    let t = std::time::Instant::now();
    loop {
        let found =
            children_of(ctx, agent, session)?.into_iter().find(|(id, a, _, _)| id == child || a == child);
        let Some((_, _, _, status)) = found else {
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
        let text = std::fs::read(self.0.join(file)).ok()?;
        text.split(|b| *b == b'\n').nth(n - 1).filter(|l| !l.is_empty()).map(<[u8]>::to_vec)
    }
    fn child(&self, id: &str) -> bool {
        self.0.join("context/child").join(id).is_dir()
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
    let bytes = std::fs::read(&p).map_err(|e| Exit::io(p.display(), &e))?;
    let mut problems: Vec<String> = Vec::new();
    if !d.join("context/pack.md").is_file() {
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
pub fn rebuild_latest(ctx: &Path, agent: &str, session: &str) -> anyhow::Result<()> {
    let d = dir(ctx, uid_of(ctx, agent)?, agent, session);
    let msgs = std::fs::read_to_string(d.join("messages.jsonl")).map_err(|e| Exit::io(d.display(), &e))?;
    let last = msgs
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["role"] == "assistant")
        .filter_map(|v| v["content"].as_str().or_else(|| v["text"].as_str()).map(str::to_owned))
        .next_back()
        .unwrap_or_default();
    let mut text = last;
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    let tmp = d.join(format!(".latest.md.{}", std::process::id()));
    std::fs::write(&tmp, &text).map_err(|e| Exit::io(tmp.display(), &e))?;
    std::fs::rename(&tmp, d.join("latest.md")).map_err(|e| Exit::io(d.join("latest.md").display(), &e))?;
    print!("{text}");
    Ok(())
}
