//! Clients of a run's terminal socket (`/run/cortexfs/agent/<agent>/<session>/term/main.sock`):
//! watching or joining it, and typing a line into it.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use policy::runtime;

use super::{Error, Result, rundir};

/// Connects to the run's terminal socket. Its directory is the agent's (bound into the
/// sandbox), so the socket is reached beneath the run's directory without following a link,
/// and only when it is a socket of the run's uid (the contract, root's, says which).
fn connect_to(control: &Path, agent: &str, session: &str) -> Result<UnixStream> {
    let run = runtime::run_dir(control, agent, session);
    if rundir::supervisor(&run).is_none() {
        return Err(Error::State(format!("agent {agent} session {session} is not running")));
    }
    let unavailable = |e: &dyn std::fmt::Display| {
        Error::Unavailable(format!("{}: {e} (is the agent running?)", run.join("term/main.sock").display()))
    };
    let c = rundir::read_contract(&run.join("contract.json")).map_err(|e| unavailable(&e))?;
    crate::beneath::Tree::open(&run)
        .and_then(|t| t.connect("term/main.sock", c.uid))
        .map_err(|e| unavailable(&e))
}

/// The key that detaches an attached client and leaves the run going: Ctrl-] (as telnet's).
pub const DETACH_KEY: u8 = 0x1d;

/// This process's terminal in raw mode until dropped (or a signal that ends the client), so
/// that every key goes to the agent's terminal as typed: Ctrl-C included, echo by the agent's
/// PTY alone.
struct Raw {
    saved: rustix::termios::Termios,
}

impl Raw {
    fn enter() -> Option<Raw> {
        let stdin = std::io::stdin();
        let saved = rustix::termios::tcgetattr(&stdin).ok()?;
        let mut raw = saved.clone();
        raw.make_raw();
        rustix::termios::tcsetattr(&stdin, rustix::termios::OptionalActions::Now, &raw).ok()?;
        // A signal that ends the client restores the terminal first.
        let restore = saved.clone();
        if let Ok(mut signals) = signal_hook::iterator::Signals::new([
            signal_hook::consts::SIGTERM,
            signal_hook::consts::SIGHUP,
            signal_hook::consts::SIGINT,
            signal_hook::consts::SIGQUIT,
        ]) {
            std::thread::spawn(move || {
                if let Some(sig) = signals.forever().next() {
                    let _ = rustix::termios::tcsetattr(
                        std::io::stdin(),
                        rustix::termios::OptionalActions::Now,
                        &restore,
                    );
                    std::process::exit(128 + sig);
                }
            });
        }
        Some(Raw { saved })
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        let _ =
            rustix::termios::tcsetattr(std::io::stdin(), rustix::termios::OptionalActions::Now, &self.saved);
    }
}

/// This process's window size, if it has a terminal.
fn window() -> Option<(u16, u16)> {
    let ws = rustix::termios::tcgetwinsize(std::io::stdout())
        .or_else(|_| rustix::termios::tcgetwinsize(std::io::stdin()))
        .ok()?;
    (ws.ws_col > 0 && ws.ws_row > 0).then_some((ws.ws_col, ws.ws_row))
}

/// Relays the terminal to `out` until it ends (`attach`: and this process's stdin into it);
/// fails with the terminal's status when it is not 0. Attached from a terminal, the local
/// terminal is raw for the length of it (restored on every way out), the window size goes to
/// the agent's PTY when attaching and on each SIGWINCH, and [`DETACH_KEY`] leaves the run
/// going. The run is one of the daemon whose control socket is `control`.
pub fn relay(control: &Path, agent: &str, session: &str, attach: bool, out: &mut dyn Write) -> Result<()> {
    // The run this relays: its end is the one whose status is taken.
    let supervisor = rundir::supervisor(&runtime::run_dir(control, agent, session));
    let mut s = connect_to(control, agent, session)?;
    let size = if attach { window() } else { None };
    match (attach, size) {
        (true, Some((c, r))) => s.write_all(format!("attach {c}x{r}\n").as_bytes())?,
        (true, None) => s.write_all(b"attach\n")?,
        (false, _) => s.write_all(b"watch\n")?,
    }
    let detached = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let raw = if attach && std::io::IsTerminal::is_terminal(&std::io::stdin()) { Raw::enter() } else { None };
    if raw.is_some() {
        let (control, agent, session) = (control.to_owned(), agent.to_owned(), session.to_owned());
        if let Ok(mut winch) = signal_hook::iterator::Signals::new([signal_hook::consts::SIGWINCH]) {
            std::thread::spawn(move || {
                for _ in winch.forever() {
                    if let (Some((c, r)), Ok(mut conn)) = (window(), connect_to(&control, &agent, &session)) {
                        let _ = conn.write_all(format!("resize {c}x{r}\n").as_bytes());
                    }
                }
            });
        }
    }
    if attach {
        let mut w = s.try_clone()?;
        let (detach, watch_for_key) = (std::sync::Arc::clone(&detached), raw.is_some());
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            let mut stdin = std::io::stdin();
            while let Ok(n) = stdin.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let key = if watch_for_key { buf[..n].iter().position(|b| *b == DETACH_KEY) } else { None };
                let upto = key.unwrap_or(n);
                if w.write_all(&buf[..upto]).is_err() {
                    break;
                }
                if key.is_some() {
                    detach.store(true, std::sync::atomic::Ordering::SeqCst);
                    let _ = w.shutdown(std::net::Shutdown::Both);
                    break;
                }
            }
        });
    }
    let mut buf = [0u8; 8192];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                out.write_all(&buf[..n])?;
                out.flush()?;
            }
        }
    }
    drop(raw);
    if detached.load(std::sync::atomic::Ordering::SeqCst) {
        eprintln!(
            "\r\nctx: detached from agent {agent} session {session}; it keeps running (ctx agent attach {agent} --session {session})"
        );
        return Ok(());
    }
    // The terminal ended: its status is the watcher's too, once the supervisor recorded it.
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(5) {
        if let Some(e) = rundir::ended(control, agent, session, supervisor) {
            return match u8::try_from(e.exit).unwrap_or(1) {
                0 => Ok(()),
                code => Err(Error::Status(code)),
            };
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// Types one line into the terminal of a run of the daemon of `control`.
pub fn send(control: &Path, agent: &str, session: &str, text: &str) -> Result<()> {
    let mut s = connect_to(control, agent, session)?;
    s.write_all(b"attach\n")?;
    s.write_all(text.as_bytes())?;
    s.write_all(b"\r")?;
    s.flush()?;
    // Give the terminal a moment to take the bytes before the connection closes.
    std::thread::sleep(Duration::from_millis(50));
    Ok(())
}
