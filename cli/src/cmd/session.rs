//! Sessions (spec §6): `home/<uid>/agent/<agent>/session/<s>/` with `state`, `created_at`,
//! `updated_at`, `cwd`, `latest.md`, `messages.jsonl`, `events.jsonl` and `context/`; and the
//! commands that read them: `ctx agent history|output|children|wait`.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::exit::{self, Exit};

fn now() -> String {
    format!("{}\n", humantime::format_rfc3339_seconds(SystemTime::now()))
}

fn uid_of(ctx: &Path, agent: &str) -> anyhow::Result<u32> {
    let p = ctx.join("agent").join(format!("{agent}.d")).join("uid");
    let t = std::fs::read_to_string(&p).map_err(|e| Exit::io(p.display(), &e))?;
    t.trim().parse().map_err(|_| Exit::new(exit::INVALID, format!("{}: not a number", p.display())).into())
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
