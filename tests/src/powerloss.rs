//! Power-loss simulation: mounts the `powerloss-fs` helper on a fresh directory, drops its
//! unsynced state on request, and injects faults: failing syncs (EIO) and a power cut right
//! after a chosen sync (see `src/bin/powerloss_fs.rs` for the model).

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// How long the daemon may take to mount or to drop its state.
const TIMEOUT: Duration = Duration::from_secs(10);

/// Panics with a clear message unless FUSE can be used here: these tests must never pass by
/// silently skipping.
pub fn require_fuse() {
    if let Err(e) = std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse") {
        panic!(
            "this test needs FUSE: opening /dev/fuse failed ({e}); run it as root on a kernel with \
             the fuse module (it does not skip)"
        );
    }
}

/// A mounted `powerloss-fs`. Dropping it unmounts (lazily, even when the daemon is stuck) and
/// removes the mount point.
#[derive(Debug)]
pub struct PowerlossMount {
    child: Child,
    /// The daemon's command input.
    control: ChildStdin,
    lines: Receiver<String>,
    // Declared last: dropped after `Drop::drop` has unmounted it.
    dir: TempDir,
}

impl PowerlossMount {
    /// Mounts a fresh, empty `powerloss-fs` under /var/tmp and waits until it is ready. `seed`
    /// makes its torn power losses reproducible.
    pub fn start(seed: u64) -> PowerlossMount {
        require_fuse();
        let dir = tempfile::Builder::new().prefix("powerloss-").tempdir_in("/var/tmp").expect("mount point");
        let mut child = Command::new(crate::bin("powerloss-fs"))
            .arg(dir.path())
            .arg(seed.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn powerloss-fs");
        let out = child.stdout.take().expect("stdout is piped");
        let control = child.stdin.take().expect("stdin is piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let m = PowerlossMount { child, control, lines, dir };
        m.expect_line("ready");
        m
    }

    /// The mount point.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Simulates power loss: everything not made durable is gone.
    pub fn power_loss(&self) {
        self.signal(rustix::process::Signal::USR1);
    }

    /// Simulates power loss in which part of the unsynced appends and xattrs reached the disk.
    pub fn torn_power_loss(&self) {
        self.signal(rustix::process::Signal::USR2);
    }

    /// Turns EIO mode on or off: while on, every sync (fsync, fdatasync, `O_SYNC` or `O_DSYNC`
    /// write) fails with EIO and makes nothing durable.
    pub fn set_eio(&self, on: bool) {
        let word = if on { "eio on" } else { "eio off" };
        self.command(word, word);
    }

    /// Arms a power cut: the `n`th successful sync from now (by anyone on this mount) completes,
    /// then the power is cut and every operation fails with EIO until [`restart`](Self::restart).
    pub fn arm_cut(&self, n: u64) {
        self.command(&format!("after {n}"), &format!("armed {n}"));
    }

    /// Turns ghosts on or off: while on, a file renamed away leaves its old name behind for one
    /// lookup, which answers the moved file (then ENOENT); no listing shows it.
    pub fn set_ghosts(&self, on: bool) {
        let word = if on { "ghosts on" } else { "ghosts off" };
        self.command(word, word);
    }

    /// Forgets an armed cut that has not happened.
    pub fn disarm(&self) {
        self.command("disarm", "disarmed");
    }

    /// Ends the failing state after a cut, as a reboot does.
    pub fn restart(&self) {
        self.command("restart", "restarted");
    }

    /// The daemon's fault-injection counters.
    pub fn status(&self) -> Status {
        let line = self.ask("status");
        let field = |k: &str| -> u64 {
            line.split(' ')
                .find_map(|w| w.strip_prefix(k)?.strip_prefix('='))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("powerloss-fs answered {line:?} to status (no {k})"))
        };
        Status {
            syncs: field("syncs"),
            armed: field("armed"),
            down: field("down") == 1,
            eio: field("eio") == 1,
        }
    }

    /// Runs `op` with the power cut right after the `n`th successful sync from now. After a cut
    /// the filesystem is restarted before this returns (its durable state is what survives);
    /// otherwise the armed cut is forgotten.
    pub fn cut_after<T>(&self, n: u64, op: impl FnOnce() -> T) -> (T, Cut) {
        let before = self.status().syncs;
        self.arm_cut(n);
        let out = op();
        let after = self.status();
        if after.down {
            self.restart();
        } else {
            self.disarm();
        }
        (out, Cut { happened: after.down, syncs: after.syncs - before })
    }

    /// Sends one command and checks its answer.
    fn command(&self, cmd: &str, want: &str) {
        let got = self.ask(cmd);
        assert_eq!(got, want, "powerloss-fs answered {got:?} to {cmd:?}");
    }

    /// Sends one command and returns its answer.
    fn ask(&self, cmd: &str) -> String {
        (&self.control).write_all(format!("{cmd}\n").as_bytes()).expect("write to powerloss-fs");
        match self.lines.recv_timeout(TIMEOUT) {
            Ok(line) => line,
            Err(e) => panic!("powerloss-fs did not answer {cmd:?} ({e}); see its stderr above"),
        }
    }

    fn signal(&self, sig: rustix::process::Signal) {
        let pid = rustix::process::Pid::from_child(&self.child);
        rustix::process::kill_process(pid, sig).expect("signal powerloss-fs");
        self.expect_line("dropped");
    }

    fn expect_line(&self, want: &str) {
        match self.lines.recv_timeout(TIMEOUT) {
            Ok(line) if line == want => {}
            Ok(line) => panic!("powerloss-fs printed {line:?}, expected {want:?}"),
            Err(e) => panic!("powerloss-fs did not print {want:?} ({e}); see its stderr above"),
        }
    }
}

/// What [`PowerlossMount::cut_after`] saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cut {
    /// The power was cut (the operation made at least the armed number of syncs).
    pub happened: bool,
    /// Successful syncs made meanwhile, the one before the cut included.
    pub syncs: u64,
}

/// The fault-injection counters of a [`PowerlossMount`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Status {
    /// Successful syncs (fsync and fdatasync of files and directories, `O_SYNC` and `O_DSYNC`
    /// writes) since mounting.
    pub syncs: u64,
    /// Syncs left before an armed cut; 0 when none is armed.
    pub armed: u64,
    /// The power was cut and the filesystem has not been restarted.
    pub down: bool,
    /// Syncs fail with EIO.
    pub eio: bool,
}

impl Drop for PowerlossMount {
    fn drop(&mut self) {
        let pid = rustix::process::Pid::from_child(&self.child);
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        let deadline = Instant::now() + Duration::from_secs(5);
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        // The daemon unmounts on SIGTERM; this covers a daemon that died or hung. EINVAL (not
        // mounted) is the normal case.
        let _ = rustix::mount::unmount(self.dir.path(), rustix::mount::UnmountFlags::DETACH);
    }
}
