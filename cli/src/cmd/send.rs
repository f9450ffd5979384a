//! `ctx send`: a client of an agent's socket (`agent/NAME.sock`, `ctx man agent-socket`).
//!
//! It sends one user turn and, by default, prints the run's id once the turn is recorded and
//! started (the run goes on without the client). `--wait` follows the run and prints its
//! answer (the run's id and, on a terminal, what the run says on the side go to standard
//! error); `--json` prints every frame as it comes. While it follows, Ctrl-C (or SIGTERM)
//! cancels the run; a second one leaves at once. A refusal exits with the code of its errno
//! (`EACCES` 13, `EINVAL` 2, `ENOENT` 1, ...). `ctx cancel` cancels a run from anywhere.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

use ctxterm::launch::asock;
use serde_json::{Value, json};

use crate::exit::{self, Exit};
use crate::out;

/// Arguments of `ctx send`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The agent.
    #[arg(add = clap_complete::ArgValueCompleter::new(crate::cmd::complete::agents))]
    name: String,
    /// The text of the turn.
    text: String,
    /// The session.
    #[arg(long, default_value = "default", add = clap_complete::ArgValueCompleter::new(crate::cmd::complete::sessions))]
    session: String,
    /// The session is the agent's in shared space SPACE (`shared/SPACE/agent/NAME/session/S/`,
    /// as `ctx agent start --shared`).
    #[arg(long, value_name = "SPACE")]
    shared: Option<String>,
    /// The run's id (default: a new one); sending an id again follows that run.
    #[arg(long)]
    id: Option<String>,
    /// A directory bound at /workspace for the run (yours). Without it: the workspace of the
    /// session's running terminal when the turn joins it, else the current directory.
    #[arg(long)]
    cwd: Option<PathBuf>,
    /// A file the turn refers to, by its path as the agent sees it (repeatable).
    #[arg(long = "file", value_name = "PATH")]
    files: Vec<String>,
    /// Follow the run and print its answer; the exit code is the run's (0 ok, 1 error, 130
    /// cancelled).
    #[arg(long)]
    wait: bool,
    /// Print every frame (JSON lines) as it comes, up to the run's end.
    #[arg(long)]
    json: bool,
    /// The host's /ctx mount.
    #[arg(long, default_value = "/ctx")]
    ctx: PathBuf,
}

/// The exit code of a refusal's errno name.
fn code_of(errno: &str) -> u8 {
    match errno {
        "EACCES" | "EPERM" => exit::DENIED,
        "EINVAL" | "EMSGSIZE" | "ENOTDIR" => exit::INVALID,
        "EAGAIN" | "ENOTSUP" => exit::UNAVAILABLE,
        _ => exit::FAILURE,
    }
}

fn refused(name: &str, f: &Value) -> anyhow::Error {
    let code = f["code"].as_str().unwrap_or("EIO");
    let msg = f["message"].as_str().unwrap_or("");
    Exit::new(code_of(code), format!("agent {name}: {code}: {msg}")).into()
}

/// `ctx send NAME TEXT`. The exit code: 0 when the run ended well, the code of the refusal's
/// or the run's error otherwise (13 `EACCES`, 2 `EINVAL`, 69 unavailable, 1 any other), 130
/// when it was cancelled.
pub fn run(a: Args) -> anyhow::Result<()> {
    exit::agent_at(&a.ctx, &a.name)?;
    let socket = a.ctx.join("agent").join(format!("{}.sock", a.name));
    // An agent made a moment ago gets its socket once the daemon's watch sees it.
    let t = std::time::Instant::now();
    // root's: the host mount's objects
    while std::fs::symlink_metadata(&socket).is_err() && t.elapsed() < std::time::Duration::from_secs(5) {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let (mut w, mut r, hello) = asock::connect(&socket)
        .map_err(|e| Exit::new(exit::UNAVAILABLE, format!("cannot reach agent {}: {e}", a.name)))?;
    if hello["type"] == "error" {
        return Err(refused(&a.name, &hello));
    }
    let id = match a.id {
        Some(id) => id,
        None => format!(
            "send-{}-{}",
            std::process::id(),
            humantime::format_rfc3339_nanos(std::time::SystemTime::now())
        ),
    };
    let cwd = match &a.cwd {
        Some(c) => Some(
            // root's: the caller's own --cwd, which the daemon then opens without following a link
            std::fs::canonicalize(c)
                .map_err(|e| Exit::io(format!("--cwd {}", c.display()), &e))?
                .display()
                .to_string(),
        ),
        None => None,
    };
    let mut req = json!({"op": "send", "id": id, "session": a.session, "input": a.text, "files": a.files});
    if let Some(space) = &a.shared {
        req["scope"] = json!("shared");
        req["space"] = json!(space);
    }
    match cwd {
        Some(c) => req["cwd"] = json!(c),
        // Without --cwd: the workspace of the run the turn joins, else this directory.
        None => {
            if let Ok(here) = std::env::current_dir() {
                req["here"] = json!(here.display().to_string());
            }
        }
    }
    let mut line = req.to_string();
    line.push('\n');
    w.write_all(line.as_bytes()).map_err(|e| Exit::io(format!("agent {}", a.name), &e))?;
    if a.wait || a.json {
        cancel_on_signal(socket.clone(), a.name.clone(), id.clone());
    }
    let follow = a.wait && !a.json;
    let spinner = (follow && std::io::stderr().is_terminal()).then(|| {
        let pb = indicatif::ProgressBar::new_spinner();
        pb.enable_steady_tick(std::time::Duration::from_millis(120));
        pb.set_message(format!("agent {}: run {id}", a.name));
        pb
    });
    let say = |line: &str| match &spinner {
        Some(pb) => pb.println(line),
        None => eprintln!("{line}"),
    };
    let mut out = std::io::stdout().lock();
    if a.json {
        writeln!(out, "{hello}")?;
    }
    let (mut answer, mut started, mut failed) = (None, false, None::<Value>);
    loop {
        let f = asock::read_frame(&mut r)
            .map_err(|e| Exit::new(exit::FAILURE, format!("agent {}: {e}", a.name)))?
            .ok_or_else(|| {
                Exit::new(exit::FAILURE, format!("agent {}: the socket closed before the run ended", a.name))
            })?;
        if a.json {
            writeln!(out, "{f}")?;
        }
        match f["type"].as_str().unwrap_or("") {
            // Refused before the run started: nothing ran.
            "error" if !started => return Err(refused(&a.name, &f)),
            "error" => failed = Some(f),
            "start" if !a.wait && !a.json => {
                writeln!(out, "{id}")?;
                return Ok(());
            }
            "start" => {
                started = true;
                if follow {
                    let joined = if f["joined"] == true { ", in the session's running terminal" } else { "" };
                    say(&format!("ctx: run {id}{joined} (ctx cancel {} {id})", a.name));
                }
            }
            "progress" => {
                if let Some(pb) = &spinner {
                    for l in f["text"].as_str().unwrap_or("").lines().filter(|l| !l.trim().is_empty()) {
                        pb.println(l);
                    }
                }
            }
            "message" => answer = f["content"].as_str().map(|c| whole_answer(&f, c)),
            "done" => {
                if let Some(pb) = &spinner {
                    pb.finish_and_clear();
                }
                if a.wait
                    && !a.json
                    && let Some(t) = &answer
                {
                    writeln!(out, "{t}")?;
                }
                return match f["status"].as_str() {
                    Some("ok") => Ok(()),
                    Some("cancelled") => Err(Exit::new(130, format!("run {id} was cancelled")).into()),
                    _ => Err(match &failed {
                        Some(f) => refused(&a.name, f),
                        None => Exit::new(
                            exit::FAILURE,
                            format!("agent {}: run {id} ended with an error", a.name),
                        )
                        .into(),
                    }),
                };
            }
            _ => {}
        }
    }
}

/// The answer of a `message` frame: its `content`, or, when the answer was too large for one
/// line and is kept whole in a file beside the session (`content_file`), that file's text when
/// this caller may read it (opened beneath the session's directory, never through a link),
/// else the first bytes and where the rest is.
fn whole_answer(f: &Value, content: &str) -> String {
    let Some(file) = f["content_file"].as_str().map(std::path::Path::new) else { return content.to_owned() };
    let bytes = f["content_bytes"].as_u64().unwrap_or(0).min(asock::ANSWER_READ_MAX);
    // Only a name the daemon gives such a file, read beneath its directory.
    let read = file
        .parent()
        .zip(file.file_name().and_then(|n| n.to_str()).filter(|n| asock::answer_file_name(n)))
        .and_then(|(dir, name)| {
            ctxterm::beneath::Tree::open(dir).and_then(|t| t.read_string(name, bytes)).ok()
        });
    match read {
        Some(whole) => whole,
        None => format!("{content}\n[the whole answer, {bytes} bytes, is {}]", file.display()),
    }
}

/// On SIGINT or SIGTERM while a run is followed: asks the agent's socket to cancel run `id`
/// (the run's `done` then ends the client, 130), and says so; a second signal leaves at once.
fn cancel_on_signal(socket: PathBuf, name: String, id: String) {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGINT, SIGTERM]) else { return };
    let _ = std::thread::Builder::new().name("cancel".into()).spawn(move || {
        let mut asked = false;
        for _ in signals.forever() {
            if asked {
                std::process::exit(130);
            }
            asked = true;
            eprintln!("ctx: cancelling run {id} of agent {name} (again to leave now)");
            if let Err(e) = cancel_one(&socket, &id) {
                eprintln!("ctx: cannot cancel run {id}: {e}");
            }
        }
    });
}

/// Sends `cancel` for run `id` on a connection of its own; whether it was running.
fn cancel_one(socket: &Path, id: &str) -> Result<bool, String> {
    let (mut w, mut r, hello) = asock::connect(socket)?;
    if hello["type"] == "error" {
        return Err(hello["message"].as_str().unwrap_or("refused").to_owned());
    }
    let mut line = json!({"op": "cancel", "id": id}).to_string();
    line.push('\n');
    w.write_all(line.as_bytes()).map_err(|e| e.to_string())?;
    loop {
        let f = asock::read_frame(&mut r)?.ok_or("the socket closed before the answer")?;
        match f["type"].as_str() {
            Some("cancelling") => return Ok(f["running"] == true),
            Some("error") => {
                return Err(format!(
                    "{}: {}",
                    f["code"].as_str().unwrap_or("EIO"),
                    f["message"].as_str().unwrap_or("")
                ));
            }
            _ => {}
        }
    }
}

/// Arguments of `ctx cancel`.
#[derive(Debug, clap::Args)]
pub struct CancelArgs {
    /// The agent.
    #[arg(add = clap_complete::ArgValueCompleter::new(crate::cmd::complete::agents))]
    name: String,
    /// The run's id (as `ctx send` printed it); without it, every run of --session going on
    /// through the agent's socket.
    id: Option<String>,
    /// The session whose runs are cancelled when no id is given.
    #[arg(long, default_value = "default", add = clap_complete::ArgValueCompleter::new(crate::cmd::complete::sessions))]
    session: String,
    /// The host's /ctx mount.
    #[arg(long, default_value = "/ctx")]
    ctx: PathBuf,
}

/// `ctx cancel NAME [ID]`: cancels a run started through the agent's socket. Exit 0 when it
/// was cancelled (or had ended: said), 1 when there is no such run.
pub fn cancel(a: CancelArgs) -> anyhow::Result<()> {
    exit::agent_at(&a.ctx, &a.name)?;
    let socket = a.ctx.join("agent").join(format!("{}.sock", a.name));
    let unreachable = |e: String| Exit::new(exit::UNAVAILABLE, format!("cannot reach agent {}: {e}", a.name));
    let ids = match &a.id {
        Some(id) => vec![id.clone()],
        None => {
            let (mut w, mut r, hello) = asock::connect(&socket).map_err(unreachable)?;
            if hello["type"] == "error" {
                return Err(refused(&a.name, &hello));
            }
            w.write_all(b"{\"op\":\"status\"}\n").map_err(|e| Exit::io(format!("agent {}", a.name), &e))?;
            let f = asock::read_frame(&mut r)
                .map_err(unreachable)?
                .ok_or_else(|| unreachable("closed".into()))?;
            let ids: Vec<String> = f["runs"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|r| r["session"] == a.session.as_str() && r["state"] == "running")
                .filter_map(|r| r["id"].as_str().map(str::to_owned))
                .collect();
            if ids.is_empty() {
                return Err(Exit::new(
                    exit::FAILURE,
                    format!("agent {}: no run of session {} goes on through its socket", a.name, a.session),
                )
                .into());
            }
            ids
        }
    };
    for id in ids {
        match cancel_one(&socket, &id) {
            Ok(true) => out::line(format_args!("cancelling run {id}"))?,
            Ok(false) => out::line(format_args!("run {id} had ended"))?,
            Err(e) if e.starts_with("ENOENT") => {
                return Err(Exit::new(
                    exit::FAILURE,
                    format!("agent {}: no run {id} through its socket", a.name),
                )
                .into());
            }
            Err(e) => return Err(unreachable(e).into()),
        }
    }
    Ok(())
}
