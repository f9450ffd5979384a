//! Power-loss simulation: mounts the `powerloss-fs` helper on a fresh directory and drops its
//! unsynced state on request (see `src/bin/powerloss_fs.rs` for the model).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
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
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn powerloss-fs");
        let out = child.stdout.take().expect("stdout is piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let m = PowerlossMount { child, lines, dir };
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
