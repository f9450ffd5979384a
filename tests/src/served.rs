//! A real `ctx mount` on temporary storage, for the mount, view and POSIX tests: started and
//! waited for, stopped with SIGTERM (and lazily unmounted) on drop.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};

/// A running `ctx mount`.
#[derive(Debug)]
pub struct Served {
    /// The daemon, while it runs.
    pub child: Option<Child>,
    /// Its storage.
    pub storage: PathBuf,
    /// Its mount point.
    pub mnt: PathBuf,
    /// Its control socket.
    pub control: PathBuf,
    /// The temporary directory holding all of it.
    pub dir: tempfile::TempDir,
    /// More arguments for `ctx mount`.
    pub args: Vec<String>,
    /// Variables of the daemon's environment (its agent sockets' runs inherit them).
    pub env: Vec<(String, String)>,
    /// The storage is a filesystem of this test's own, unmounted after the daemon stops.
    pub own_disk: bool,
}

impl Served {
    /// Starts `ctx mount` on fresh storage and waits until `/ctx/status` answers.
    pub fn start() -> Served {
        Served::start_with(&[])
    }

    /// Like [`Served::start`], with more arguments for `ctx mount`.
    pub fn start_with(args: &[&str]) -> Served {
        let mut s = Served::unstarted(args);
        s.spawn();
        s
    }

    /// The temporary directories and arguments of a `ctx mount`, not started yet: for a test
    /// that prepares the storage first (e.g. mounts a small filesystem there), then calls
    /// [`Served::spawn`].
    pub fn unstarted(args: &[&str]) -> Served {
        assert!(rustix::process::geteuid().is_root(), "mount tests mount FUSE and switch users: run as root");
        assert!(Path::new("/dev/fuse").exists(), "/dev/fuse is required for mount tests");
        let dir = tempfile::tempdir_in("/var/tmp").expect("temp dir");
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).expect("chmod temp dir");
        let storage = dir.path().join("storage");
        let mnt = dir.path().join("ctx");
        fs::create_dir(&mnt).expect("mount point");
        let control = dir.path().join("control.sock");
        let args = args.iter().map(|a| (*a).to_owned()).collect();
        Served { child: None, storage, mnt, control, dir, args, env: Vec::new(), own_disk: false }
    }

    /// Starts `ctx mount` on a storage that is a tmpfs of `size` of its own (a disk a test may
    /// fill without touching the host's), gone when this is dropped.
    pub fn start_on_own_disk(size: &str) -> Served {
        let mut s = Served::unstarted(&[]);
        fs::create_dir_all(&s.storage).expect("storage");
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "cortexfs-test"])
            .arg(&s.storage)
            .status()
            .expect("mount");
        assert!(mounted.success(), "a tmpfs of {size} for the storage");
        s.own_disk = true;
        s.spawn();
        s
    }

    /// (Re)starts the daemon on the same storage and mount point.
    pub fn spawn(&mut self) {
        let child = Command::new(crate::bin("ctx"))
            .args(["mount", "--source", &self.storage.to_string_lossy(), &self.mnt.to_string_lossy()])
            .args(["--control", &self.control.to_string_lossy()])
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn ctx mount");
        self.child = Some(child);
        let t = Instant::now();
        // Up means serving /ctx and listening on its control socket (bound after the mount).
        // A killed daemon leaves its socket's name: up is when a connection is taken.
        while fs::read(self.mnt.join("status")).is_err()
            || std::os::unix::net::UnixStream::connect(&self.control).is_err()
        {
            // A hang, not a time: a first start on a storage holding configuration commits it
            // first (debug builds of the core tools are 170 MB each).
            assert!(t.elapsed() < Duration::from_secs(60), "ctx mount did not come up");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Mounts a view of `agent` (session `session`) at `path` through the daemon's control
    /// socket; panics with the command's output if it fails.
    pub fn view(&self, agent: &str, session: &str, path: &Path) {
        self.view_in(agent, session, path, None);
    }

    /// Like [`Served::view`], for a run whose workspace is `workspace` (the view's `status`
    /// names it, and the core tools work there).
    pub fn view_in(&self, agent: &str, session: &str, path: &Path, workspace: Option<&Path>) {
        let mut cmd = Command::new(crate::bin("ctx"));
        if let Some(w) = workspace {
            cmd.arg("view").arg("create").arg("--workspace").arg(w);
        } else {
            cmd.args(["view", "create"]);
        }
        let out = cmd
            .args(["--agent", agent, "--session", session, "--path"])
            .arg(path)
            .arg("--control")
            .arg(&self.control)
            .output()
            .expect("spawn ctx view create");
        assert!(out.status.success(), "ctx view create: {}", crate::shown(&out));
    }

    /// The state directory of this daemon's run of `agent` `session` (in its runtime
    /// directory, the control socket's).
    pub fn run_dir(&self, agent: &str, session: &str) -> PathBuf {
        self.rt().join("agent").join(agent).join(session)
    }

    /// The default view of `agent` `session` of this daemon.
    pub fn view_dir(&self, agent: &str, session: &str) -> PathBuf {
        self.rt().join("view").join(agent).join(session)
    }

    /// This daemon's runtime directory: its control socket's.
    pub fn rt(&self) -> PathBuf {
        self.control.parent().expect("the control socket's directory").to_path_buf()
    }

    /// A path under the mount.
    pub fn p(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    /// A directory `rel` under `home/` or `shared/`, made in storage with `mode` and `owner`;
    /// returns its path under the mount.
    pub fn data_dir(&self, rel: &str, mode: u32, owner: u32) -> PathBuf {
        let d = self.storage.join(rel);
        fs::create_dir_all(&d).expect("data dir");
        let id = Some(owner);
        rustix::fs::chown(&d, id.map(rustix::fs::Uid::from_raw), id.map(rustix::fs::Gid::from_raw))
            .expect("chown data dir");
        fs::set_permissions(&d, fs::Permissions::from_mode(mode)).expect("chmod data dir");
        self.p(rel)
    }

    /// Stops the daemon with SIGTERM; returns its exit code.
    pub fn stop(&mut self) -> Option<i32> {
        let mut c = self.child.take()?;
        let _ = kill_process(Pid::from_child(&c), Signal::TERM);
        c.wait().ok()?.code()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.stop();
        let _ = Command::new("umount").arg("-l").arg(&self.mnt).stderr(Stdio::null()).status();
        // The storage's checked-out configuration generations (derived state, in /run).
        if let Some(gens) = ringfs::config::generations_dir(&self.storage).parent() {
            let _ = fs::remove_dir_all(gens);
        }
        if self.own_disk {
            let _ = Command::new("umount").arg("-l").arg(&self.storage).stderr(Stdio::null()).status();
        }
    }
}

/// The errno of a failed operation, 0 when it succeeded.
pub fn errno(r: std::io::Result<impl Sized>) -> i32 {
    r.err().and_then(|e| e.raw_os_error()).unwrap_or(0)
}
