//! `ctx send`: a client of an agent's socket (`agent/NAME.sock`, `ctx man agent-socket`).
//!
//! It sends one user turn and, by default, prints the run's id once the turn is recorded and
//! started (the run goes on without the client). `--wait` follows the run and prints its
//! answer; `--json` prints every frame as it comes. A refusal exits with the code of its
//! errno (`EACCES` 13, `EINVAL` 2, `ENOENT` 1, ...).

use std::io::Write;
use std::path::PathBuf;

use ctxterm::launch::asock;
use serde_json::{Value, json};

use crate::exit::{self, Exit};

/// Arguments of `ctx send`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The agent.
    name: String,
    /// The text of the turn.
    text: String,
    /// The session.
    #[arg(long, default_value = "default")]
    session: String,
    /// The run's id (default: a new one); sending an id again follows that run.
    #[arg(long)]
    id: Option<String>,
    /// A directory bound at /workspace for the run (yours, absolute).
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
    let socket = a.ctx.join("agent").join(format!("{}.sock", a.name));
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
    if let Some(c) = cwd {
        req["cwd"] = json!(c);
    }
    let mut line = req.to_string();
    line.push('\n');
    w.write_all(line.as_bytes()).map_err(|e| Exit::io(format!("agent {}", a.name), &e))?;
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
            "start" => started = true,
            "message" => answer = f["content"].as_str().map(|c| whole_answer(&f, c)),
            "done" => {
                if a.wait
                    && !a.json
                    && let Some(t) = &answer
                {
                    writeln!(out, "{t}")?;
                }
                return match f["status"].as_str() {
                    Some("ok") => Ok(()),
                    Some("cancelled") => Err(Exit::quiet(130).into()),
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
