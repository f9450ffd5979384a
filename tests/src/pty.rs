//! A program run on a terminal of its own (a PTY), as a person runs it: what it wrote there,
//! and its exit status. Python's `pty` module drives the terminal.

use std::process::Command;

/// The driver: runs argv[2:] on a new PTY, sends Ctrl-C once the output holds argv[1] (half a
/// second later; an empty marker sends none), reads to the end (at most 60 s), and prints the
/// output then `EXIT N`.
const DRIVER: &str = r#"
import os, pty, sys, time
marker = sys.argv[1].encode()
pid, fd = pty.fork()
if pid == 0:
    os.execv(sys.argv[2], sys.argv[2:])
out, sent, end = b"", not marker, time.time() + 60
while time.time() < end:
    try:
        b = os.read(fd, 4096)
    except OSError:
        break
    if not b:
        break
    out += b
    if not sent and marker in out:
        time.sleep(0.5)
        os.write(fd, b"\x03")
        sent = True
_, status = os.waitpid(pid, 0)
sys.stdout.write(out.decode(errors="replace"))
print("\nEXIT", os.waitstatus_to_exitcode(status))
"#;

/// Runs `program` with `args` and the variables `env` on a terminal; with `interrupt_after`,
/// types Ctrl-C once the output shows it. Returns the output, ending with a line `EXIT N`.
pub fn run(program: &str, args: &[&str], env: &[(&str, &str)], interrupt_after: Option<&str>) -> String {
    let out = Command::new("python3")
        .args(["-c", DRIVER, interrupt_after.unwrap_or(""), program])
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("python3 drives the terminal");
    String::from_utf8_lossy(&out.stdout).into_owned()
}
