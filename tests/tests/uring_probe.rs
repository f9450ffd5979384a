//! The io_uring commit path is chosen by a run-time probe: where io_uring is disabled for a
//! process (`/proc/sys/kernel/io_uring_disabled`), asking for it fails clearly at open and the
//! portable twin works. The sysctl is set to 1 (rings only for privileged processes) for the
//! test's duration, so that only the unprivileged child is affected, then restored.

use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};

const SYSCTL: &str = "/proc/sys/kernel/io_uring_disabled";

struct Restore(String);

impl Drop for Restore {
    fn drop(&mut self) {
        let _ = fs::write(SYSCTL, &self.0);
    }
}

fn as_nobody(args: &[&str]) -> Command {
    let mut c = Command::new("setpriv");
    c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(tests::bin("log-appender"))
        .args(args);
    c
}

#[test]
fn uring_disabled_fails_clearly_and_the_portable_twin_works() {
    let old = fs::read_to_string(SYSCTL).expect("this kernel has io_uring_disabled");
    let _restore = Restore(old.clone());
    let d = tempfile::tempdir_in("/var/tmp").unwrap();
    fs::set_permissions(d.path(), fs::Permissions::from_mode(0o777)).unwrap();
    let log = d.path().join("events.jsonl");
    fs::write(SYSCTL, "1").unwrap();

    let out = as_nobody(&[log.to_str().unwrap(), "0", "1", "uring"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unsupported storage: io_uring unavailable"), "{err}");
    assert!(!log.exists() || fs::metadata(&log).unwrap().len() == 0, "nothing written");

    let mut child =
        as_nobody(&[log.to_str().unwrap(), "0", "2", "portable"]).stdout(Stdio::piped()).spawn().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "ready");
    for _ in 0..20 {
        assert!(lines.next().unwrap().unwrap().starts_with("ack 0 "));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    fs::write(SYSCTL, old.trim()).unwrap();
    let text = fs::read_to_string(&log).unwrap();
    assert!(text.lines().count() >= 20);
}
