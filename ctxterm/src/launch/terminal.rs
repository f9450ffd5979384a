//! Clients of a run's terminal socket (`/run/cortexfs/agent/<agent>/<session>/term/main.sock`):
//! watching or joining it, and typing a line into it.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use policy::runtime;

use super::{Error, Result, rundir};

fn connect_to(agent: &str, session: &str) -> Result<UnixStream> {
    let sock = runtime::run_dir(agent, session).join("term/main.sock");
    UnixStream::connect(&sock)
        .map_err(|e| Error::Unavailable(format!("{}: {e} (is the agent running?)", sock.display())))
}

/// Relays the terminal to `out` until it ends (`attach`: and this process's stdin into it);
/// fails with the terminal's status when it is not 0.
pub fn relay(agent: &str, session: &str, attach: bool, out: &mut dyn Write) -> Result<()> {
    let mut s = connect_to(agent, session)?;
    s.write_all(if attach { b"attach\n" } else { b"watch\n" })?;
    if attach {
        let mut w = s.try_clone()?;
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            let mut stdin = std::io::stdin();
            while let Ok(n) = stdin.read(&mut buf) {
                if n == 0 || w.write_all(&buf[..n]).is_err() {
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
    // The terminal ended: its status is the watcher's too, once the supervisor recorded it.
    let run = runtime::run_dir(agent, session);
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(5) {
        if let Some(code) = rundir::recorded_exit::<u8>(&run) {
            return if code == 0 { Ok(()) } else { Err(Error::Status(code)) };
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// Types one line into the terminal.
pub fn send(agent: &str, session: &str, text: &str) -> Result<()> {
    let mut s = connect_to(agent, session)?;
    s.write_all(b"attach\n")?;
    s.write_all(text.as_bytes())?;
    s.write_all(b"\r")?;
    s.flush()?;
    // Give the terminal a moment to take the bytes before the connection closes.
    std::thread::sleep(Duration::from_millis(50));
    Ok(())
}
