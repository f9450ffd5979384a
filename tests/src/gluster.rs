//! A GlusterFS volume of this machine for the multi-host tests: glusterd and its two brick
//! processes run in a network namespace the test creates (glusterd refuses loopback bricks), on
//! addresses that exist only inside it; the volume (replica 2) is mounted through the FUSE client
//! twice, as two hosts would mount it. Everything is torn down on drop.
//!
//! Needs Debian's `glusterfs-server` (make test installs it) and root.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The address glusterd and the bricks listen on, inside the namespace only.
const ADDR: &str = "10.231.7.1";
const VOLUME: &str = "cfsq";

/// One volume at a time: glusterd keeps some state host-wide (`/var/run/gluster`).
static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// One running volume and its two client mounts.
#[derive(Debug)]
pub struct Gluster {
    netns: String,
    dir: tempfile::TempDir,
    /// The two client mounts ("host A" and "host B").
    pub mounts: [PathBuf; 2],
    _one: std::sync::MutexGuard<'static, ()>,
}

fn run(what: &str, cmd: &mut Command) -> Output {
    let o = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(o.status.success(), "{what}: {}", crate::shown(&o));
    o
}

impl Gluster {
    /// Starts glusterd in a fresh network namespace, creates and starts the volume and mounts it
    /// twice. Panics with what failed (and where its log is) when any step does.
    pub fn start() -> Gluster {
        assert!(
            Path::new("/usr/sbin/glusterd").exists(),
            "glusterfs-server is required (make test installs it)"
        );
        let one = ONE.lock().unwrap_or_else(|p| p.into_inner());
        let netns = format!("cfs-gl-{}", std::process::id());
        let dir = tempfile::tempdir_in("/var/tmp").expect("temp dir");
        let d = dir.path().to_path_buf();
        let d = d.as_path();
        for sub in ["work", "log", "b1", "b2", "m1", "m2"] {
            fs::create_dir_all(d.join(sub)).expect("gluster dirs");
        }
        run("ip netns add", Command::new("ip").args(["netns", "add", &netns]));
        let g = Gluster { netns, mounts: [d.join("m1"), d.join("m2")], dir, _one: one };
        let ip = |args: &[&str]| run("ip", Command::new("ip").arg("-n").arg(&g.netns).args(args));
        ip(&["link", "set", "lo", "up"]);
        ip(&["link", "add", "gl0", "type", "veth", "peer", "name", "gl1"]);
        ip(&["addr", "add", &format!("{ADDR}/24"), "dev", "gl0"]);
        ip(&["link", "set", "gl0", "up"]);
        ip(&["link", "set", "gl1", "up"]);
        let vol = d.join("glusterd.vol");
        fs::write(
            &vol,
            format!(
                "volume management\n    type mgmt/glusterd\n    option working-directory {}\n    \
                 option transport-type socket\n    option transport.socket.listen-port 24007\n    \
                 option transport.socket.bind-address {ADDR}\n    option ping-timeout 0\n    \
                 option event-threads 1\nend-volume\n",
                d.join("work").display()
            ),
        )
        .expect("glusterd.vol");
        run(
            "glusterd",
            g.netns_cmd("glusterd")
                .arg("-f")
                .arg(&vol)
                .arg("-l")
                .arg(d.join("log/glusterd.log"))
                .arg(format!("--pid-file={}", d.join("glusterd.pid").display())),
        );
        let t = Instant::now();
        loop {
            let o = g.gluster(&["peer", "status"]);
            if o.status.success() {
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(20), "glusterd did not answer: {}", crate::shown(&o));
            std::thread::sleep(Duration::from_millis(200));
        }
        let brick = |b: &str| format!("{ADDR}:{}", d.join(b).join("brick").display());
        let o = g.gluster(&["volume", "create", VOLUME, "replica", "2", &brick("b1"), &brick("b2"), "force"]);
        assert!(o.status.success(), "volume create: {}", crate::shown(&o));
        // Writes need both bricks, as docs/deployment.md advises for a queue: two replicas that
        // go on writing to one diverge and leave it to the heal. With a brick down the volume
        // is read-only until it is back.
        for (k, v) in [("cluster.quorum-type", "fixed"), ("cluster.quorum-count", "2")] {
            let o = g.gluster(&["volume", "set", VOLUME, k, v]);
            assert!(o.status.success(), "volume set {k} {v}: {}", crate::shown(&o));
        }
        g.start_volume();
        for (i, m) in g.mounts.iter().enumerate() {
            run(
                "mount -t glusterfs",
                g.netns_cmd("mount")
                    .args(["-t", "glusterfs", "-o"])
                    // What one host changes, the other sees at once (docs/deployment.md).
                    .arg(format!(
                        "entry-timeout=0,attribute-timeout=0,negative-timeout=0,log-file={}",
                        d.join(format!("log/m{}.log", i + 1)).display()
                    ))
                    .arg(format!("{ADDR}:/{VOLUME}"))
                    .arg(m),
            );
        }
        g
    }

    /// A command run in the volume's network namespace (and the host's mount namespace).
    fn netns_cmd(&self, program: &str) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net=/run/netns/{}", self.netns)).arg(program);
        c
    }

    /// Runs the gluster CLI against this glusterd (through its socket in /var/run/gluster).
    pub fn gluster(&self, args: &[&str]) -> Output {
        self.netns_cmd("gluster")
            .arg("--mode=script")
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("gluster")
    }

    /// (Re)starts the volume: every brick process that is not running is started.
    pub fn start_volume(&self) {
        let o = self.gluster(&["volume", "start", VOLUME, "force"]);
        assert!(o.status.success(), "volume start: {}", crate::shown(&o));
    }

    /// The pid of the brick process serving brick `n` (1 or 2).
    pub fn brick_pid(&self, n: usize) -> Option<i32> {
        let want = self.dir.path().join(format!("b{n}")).join("brick");
        for e in fs::read_dir("/proc").ok()?.flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
            let Ok(cmd) = fs::read(e.path().join("cmdline")) else { continue };
            let args: Vec<&[u8]> = cmd.split(|&b| b == 0).collect();
            if args.first().is_some_and(|a| a.ends_with(b"glusterfsd"))
                && args
                    .windows(2)
                    .any(|w| w[0] == b"--brick-name" && w[1] == want.as_os_str().as_encoded_bytes())
            {
                return Some(pid);
            }
        }
        None
    }

    /// Two "hosts": for each client mount, a `ctx mount` (`--cache-timeout 0`) on a storage of
    /// its own that binds the mount as `shared/<space>` (docs/deployment.md). Drop them before
    /// the volume.
    pub fn hosts(&self, space: &str) -> Vec<(Bind, crate::served::Served)> {
        self.mounts
            .iter()
            .map(|m| {
                let mut s = crate::served::Served::unstarted(&["--cache-timeout", "0"]);
                let bind = Bind::new(m, s.storage.join("shared").join(space));
                s.spawn();
                (bind, s)
            })
            .collect()
    }

    /// The directory of the test's logs.
    pub fn logs(&self) -> PathBuf {
        self.dir.path().join("log")
    }
}

/// A bind of a client mount at `shared/<space>` of a daemon's storage, as a host
/// attaches a distributed space (docs/deployment.md); unmounted on drop.
#[derive(Debug)]
pub struct Bind(PathBuf);

impl Bind {
    /// Binds `from` at `at` (made when missing).
    pub fn new(from: &Path, at: PathBuf) -> Bind {
        fs::create_dir_all(&at).expect("bind point");
        let o = Command::new("mount").arg("--bind").arg(from).arg(&at).output().expect("mount");
        assert!(o.status.success(), "mount --bind: {}", crate::shown(&o));
        Bind(at)
    }
}

impl Drop for Bind {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

impl Drop for Gluster {
    fn drop(&mut self) {
        for m in &self.mounts {
            let _ = Command::new("umount").arg("-l").arg(m).status();
        }
        let _ = self.gluster(&["volume", "stop", VOLUME, "force"]);
        // glusterd and every brick of this volume: they live in the namespace.
        let pids = Command::new("ip").args(["netns", "pids", &self.netns]).output();
        if let Ok(o) = pids {
            for p in String::from_utf8_lossy(&o.stdout).split_whitespace() {
                if let Ok(pid) = p.parse::<i32>()
                    && let Some(pid) = rustix::process::Pid::from_raw(pid)
                {
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(200));
        let _ = Command::new("ip").args(["netns", "del", &self.netns]).status();
    }
}
