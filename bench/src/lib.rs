//! Shared set-up of the whole-system benchmarks: the release binaries and a real `ctx mount`.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The directory holding the binaries of this build profile (`target/release` for benches).
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("bench path");
    exe.parent().and_then(Path::parent).expect("target/<profile>").to_path_buf()
}

/// Why a whole-system benchmark cannot run here (not root, no /dev/fuse, binaries missing).
pub fn unmet(bins: &[&str]) -> Option<String> {
    let dir = bin_dir();
    let missing: Vec<&&str> = bins.iter().filter(|b| !dir.join(b).exists()).collect();
    if !rustix::process::geteuid().is_root() || !Path::new("/dev/fuse").exists() || !missing.is_empty() {
        return Some(format!("needs root, /dev/fuse and release binaries; missing {missing:?}"));
    }
    None
}

/// The `p` quantile (0..=1) of `v`, which it sorts.
pub fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// A `ctx mount` on fresh storage under /var/tmp, bootstrapped; stopped on drop.
#[derive(Debug)]
pub struct Mounted {
    child: Child,
    /// The temporary directory holding everything.
    pub dir: tempfile::TempDir,
    /// The storage.
    pub storage: PathBuf,
    /// The mount point.
    pub mnt: PathBuf,
    /// The daemon's control socket.
    pub control: PathBuf,
}

impl Mounted {
    /// Mounts, waits for `status`, runs `ctx bootstrap`.
    pub fn start() -> Mounted {
        let bins = bin_dir();
        let dir = tempfile::tempdir_in("/var/tmp").expect("temp dir");
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
        let storage = dir.path().join("storage");
        let mnt = dir.path().join("ctx");
        let control = dir.path().join("control.sock");
        fs::create_dir(&mnt).expect("mount point");
        let child = Command::new(bins.join("ctx"))
            .arg("mount")
            .arg("--source")
            .arg(&storage)
            .arg(&mnt)
            .arg("--control")
            .arg(&control)
            .stdout(Stdio::null())
            .spawn()
            .expect("ctx mount");
        let m = Mounted { child, dir, storage, mnt, control };
        let t = Instant::now();
        while fs::read(m.mnt.join("status")).is_err() {
            assert!(t.elapsed() < Duration::from_secs(10), "ctx mount did not come up");
            std::thread::sleep(Duration::from_millis(20));
        }
        m.ctx(&["bootstrap", &m.storage.to_string_lossy()]);
        m
    }

    /// Runs `ctx ARGS` and requires success.
    pub fn ctx(&self, args: &[&str]) {
        let out = Command::new(bin_dir().join("ctx")).args(args).output().expect("spawn ctx");
        assert!(out.status.success(), "ctx {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_child(&self.child),
            rustix::process::Signal::TERM,
        );
        let _ = self.child.wait();
        let _ = Command::new("umount").arg("-l").arg(&self.mnt).stderr(Stdio::null()).status();
    }
}

/// A 200-byte JSON line, as a session's event: writer `w`'s record `i`.
pub fn record(w: usize, i: usize) -> Vec<u8> {
    let mut r = format!(
        "{{\"ts\":\"2026-06-22T12:00:00Z\",\"type\":\"tool.call\",\"agent\":\"coder\",\"thread\":{w},\"i\":{i},\"pad\":\""
    );
    while r.len() < 198 {
        r.push('x');
    }
    r.push_str("\"}\n");
    r.into_bytes()
}
