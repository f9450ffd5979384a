//! `ctx mount --virtiofs` against a real guest: QEMU (software emulation) boots the host's
//! Debian cloud kernel with a busybox initramfs whose script mounts the daemons' sockets as
//! virtio-fs and reports on the serial console. Checked from inside the guest: the root
//! listing, controls, tools listed and hidden by an agent view, a durable session append,
//! EROFS at the root; from the host: durability when the guest's write returns, nothing held
//! across a guest reboot or after a disconnect, reconnects, daemon restart, SIGTERM.

use std::fs;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};
use tests::vm::{Device, Kit, Vm};

const BOOT: Duration = Duration::from_secs(90);

fn ctx(args: &[&str]) {
    let out = Command::new(tests::bin("ctx")).args(args).output().unwrap();
    assert!(out.status.success(), "ctx {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

fn require_vm() {
    assert!(
        rustix::process::geteuid().is_root(),
        "virtio-fs tests start QEMU with shared memory: run as root"
    );
    if let Some(why) = tests::vm::unmet() {
        panic!("virtio-fs tests boot a guest: {why}");
    }
}

/// Storage as `ctx bootstrap` leaves it, plus agent `coder` (label `coder_t`, uid 0) granted
/// `fs.stat`, `fs.read` and `fs.list`; the tools' own policies grant `fs.stat`, `fs.read` and
/// `fs.write`. So the agent's view lists `fs.stat` and `fs.read`, and not `fs.write`.
fn storage(dir: &Path) -> PathBuf {
    let st = dir.join("storage");
    ctx(&["bootstrap", st.to_str().unwrap()]);
    for t in ["fs.stat", "fs.read", "fs.write"] {
        fs::write(st.join(format!("tool/{t}.d/policy")), format!("allow coder_t tool:{t} execute\n"))
            .unwrap();
    }
    fs::create_dir_all(st.join("agent/coder.d")).unwrap();
    fs::write(st.join("agent/coder"), "#!/bin/sh\nexit 0\n").unwrap();
    fs::set_permissions(st.join("agent/coder"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(st.join("agent/coder.d/label"), "coder_t\n").unwrap();
    fs::write(st.join("agent/coder.d/uid"), "0\n").unwrap();
    let grants: String = ["fs.stat", "fs.read", "fs.list"]
        .iter()
        .map(|t| format!("allow coder_t tool:{t} execute\n"))
        .collect();
    fs::write(st.join("agent/coder.d/policy"), grants).unwrap();
    fs::create_dir_all(st.join("home/0/agent/coder/session/s1")).unwrap();
    // A new storage's configuration is a repository: the agent and its grants are served once
    // committed.
    ctx(&["config", "commit", "--source", st.to_str().unwrap(), "-m", "coder and its tools"]);
    st
}

/// A running `ctx mount --virtiofs`.
struct Daemon {
    child: Option<Child>,
    socket: PathBuf,
}

impl Daemon {
    fn start(storage: &Path, socket: &Path, view: Option<(&str, &str)>) -> Daemon {
        let mut c = Command::new(tests::bin("ctx"));
        c.args(["mount", "--virtiofs", socket.to_str().unwrap(), "--source", storage.to_str().unwrap()]);
        if let Some((agent, session)) = view {
            c.args(["--agent", agent, "--session", session]);
        }
        let child = c.stdout(Stdio::null()).stderr(Stdio::inherit()).spawn().unwrap();
        let d = Daemon { child: Some(child), socket: socket.to_path_buf() };
        let t = Instant::now();
        // The socket appears when it is bound, and is listened on right after.
        while !fs::symlink_metadata(socket).is_ok_and(|m| m.file_type().is_socket()) {
            assert!(t.elapsed() < Duration::from_secs(10), "ctx mount --virtiofs did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(100));
        d
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// What the daemon holds: threads, descriptors, and guest memory mappings.
    fn usage(&self) -> Usage {
        let p = format!("/proc/{}", self.pid());
        let status = fs::read_to_string(format!("{p}/status")).unwrap();
        let threads =
            status.lines().find_map(|l| l.strip_prefix("Threads:")).unwrap().trim().parse().unwrap();
        let fds = fs::read_dir(format!("{p}/fd")).unwrap().count();
        let maps = fs::read_to_string(format!("{p}/maps")).unwrap();
        let guest_maps = maps.lines().filter(|l| l.contains("memfd:")).count();
        Usage { threads, fds, guest_maps }
    }

    /// Waits until the daemon holds what it held at `baseline` (a guest just went away).
    fn settle(&self, baseline: &Usage) {
        let t = Instant::now();
        loop {
            let now = self.usage();
            if now == *baseline {
                return;
            }
            assert!(t.elapsed() < Duration::from_secs(10), "daemon still holds {now:?}, was {baseline:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Descriptors of the daemon open on `file`.
    /// Descriptors the daemon has open on `file`: opened for I/O (`O_PATH` ones, which the
    /// daemon keeps per known inode for attributes, are counted by `paths_on`).
    fn fds_on(&self, file: &Path) -> usize {
        self.on(file).filter(|&o_path| !o_path).count()
    }

    /// `O_PATH` descriptors the daemon has open on `file`.
    fn paths_on(&self, file: &Path) -> usize {
        self.on(file).filter(|&o_path| o_path).count()
    }

    /// For each descriptor of the daemon naming `file`: whether it is `O_PATH`.
    fn on(&self, file: &Path) -> impl Iterator<Item = bool> {
        let pid = self.pid();
        let file = file.to_path_buf();
        fs::read_dir(format!("/proc/{pid}/fd")).unwrap().flatten().filter_map(move |e| {
            if !fs::read_link(e.path()).is_ok_and(|t| t == file) {
                return None;
            }
            let info =
                fs::read_to_string(format!("/proc/{pid}/fdinfo/{}", e.file_name().to_string_lossy())).ok()?;
            let flags = info.lines().find_map(|l| l.strip_prefix("flags:"))?.trim();
            Some(u32::from_str_radix(flags, 8).ok()? & libc::O_PATH as u32 != 0)
        })
    }

    /// SIGTERM; the exit code and how long stopping took.
    fn stop(&mut self) -> (Option<i32>, Duration) {
        let mut c = self.child.take().unwrap();
        let t = Instant::now();
        kill_process(Pid::from_child(&c), Signal::TERM).unwrap();
        loop {
            if let Some(st) = c.try_wait().unwrap() {
                return (st.code(), t.elapsed());
            }
            if t.elapsed() > Duration::from_secs(10) {
                let _ = c.kill();
                let _ = c.wait();
                return (None, t.elapsed());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill();
    }
}

#[derive(Debug, PartialEq, Eq)]
struct Usage {
    threads: usize,
    fds: usize,
    guest_maps: usize,
}

fn field<'a>(line: &'a str, marker: &str) -> &'a str {
    line.split_once(marker).map_or("", |(_, rest)| rest.trim())
}

fn words(s: &str) -> Vec<&str> {
    s.split_whitespace().collect()
}

/// The guest of `views_controls_append_erofs_and_reboot`: first boot checks and reboots, the
/// second reports that it came back.
const VIEWS: &str = r#"
mkdir -p /a /h
mount -t virtiofs agent /a || echo "CHECK-FAIL mount agent"
mount -t virtiofs host /h || echo "CHECK-FAIL mount host"
if [ -e /h/home/0/rebooted ]; then
  echo "REBOOTED $(ls /a | tr '\n' ' ')"
  exit 0
fi
echo "ROOT-AGENT $(ls /a | tr '\n' ' ')"
echo "ROOT-HOST $(ls /h | tr '\n' ' ')"
echo "STATUS-AGENT $(grep '^view ' /a/status)"
echo "STATUS-HOST $(grep '^view ' /h/status)"
echo "LABEL $(cat /a/agent/coder.d/label)"
echo "TOOL-POLICY $(cat /a/tool/fs.stat.d/policy)"
echo "TOOLS-AGENT $(ls /a/tool | tr '\n' ' ')"
echo "TOOLS-HOST $(ls /h/tool | tr '\n' ' ')"
echo "FS-WRITE-AGENT $(cat /a/tool/fs.write 2>&1 >/dev/null)"
echo "FS-WRITE-HOST $(ls /h/tool/fs.write)"
exec 3< /a/home/0/held
echo "HOLDING $(cat <&3)"
echo '{"a":1}' >> /a/home/0/agent/coder/session/s1/events.jsonl && echo "APPENDED"
n=0
while [ ! -e /a/home/0/ack ] && [ $n -lt 600 ]; do sleep 0.1; n=$((n+1)); done
echo "ACKED"
echo "EROFS-AGENT $(touch /a/new 2>&1)"
echo "EROFS-HOST $(mkdir /h/new 2>&1)"
touch /h/home/0/rebooted && echo "REBOOTING"
reboot -f
"#;

#[test]
fn views_controls_append_erofs_and_reboot() {
    require_vm();
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let st = storage(dir.path());
    let held = st.join("home/0/held");
    fs::write(&held, "held-file\n").unwrap();
    let agent_sock = dir.path().join("agent.sock");
    let host_sock = dir.path().join("host.sock");
    let mut agent = Daemon::start(&st, &agent_sock, Some(("coder", "s1")));
    let mut host = Daemon::start(&st, &host_sock, None);
    let idle = agent.usage();
    let kit = Kit::build(dir.path(), VIEWS, &[]).unwrap();
    let devices = [
        Device { socket: agent_sock.as_path(), tag: "agent" },
        Device { socket: host_sock.as_path(), tag: "host" },
    ];
    let mut vm = Vm::boot(&kit, &devices, 1, "", true).unwrap();

    let root = vm.expect("ROOT-AGENT", BOOT).unwrap();
    assert_eq!(
        words(field(&root, "ROOT-AGENT")),
        ["agent", "bin", "home", "model", "shared", "status", "tool"]
    );
    let root = vm.expect("ROOT-HOST", BOOT).unwrap();
    assert_eq!(
        words(field(&root, "ROOT-HOST")),
        ["agent", "bin", "home", "model", "shared", "status", "tool"]
    );
    assert_eq!(
        field(&vm.expect("STATUS-AGENT", BOOT).unwrap(), "STATUS-AGENT"),
        "view agent coder session s1"
    );
    assert_eq!(field(&vm.expect("STATUS-HOST", BOOT).unwrap(), "STATUS-HOST"), "view host");
    assert_eq!(field(&vm.expect("LABEL", BOOT).unwrap(), "LABEL"), "coder_t");
    assert_eq!(
        field(&vm.expect("TOOL-POLICY", BOOT).unwrap(), "TOOL-POLICY"),
        "allow coder_t tool:fs.stat execute"
    );
    let tools = vm.expect("TOOLS-AGENT", BOOT).unwrap();
    let tools = words(field(&tools, "TOOLS-AGENT"));
    for t in ["fs.stat", "fs.read"] {
        assert!(tools.contains(&t), "{t} is granted by both policies, listed: {tools:?}");
    }
    for t in ["fs.write", "shell.exec", "tsh"] {
        assert!(!tools.contains(&t), "{t} is not granted to coder, listed: {tools:?}");
    }
    let host_tools = vm.expect("TOOLS-HOST", BOOT).unwrap();
    assert!(words(field(&host_tools, "TOOLS-HOST")).contains(&"fs.write"), "{host_tools}");
    let absent = vm.expect("FS-WRITE-AGENT", BOOT).unwrap();
    assert!(
        absent.contains("No such file or directory"),
        "fs.write is absent from the agent's view: {absent}"
    );
    assert_eq!(field(&vm.expect("FS-WRITE-HOST", BOOT).unwrap(), "FS-WRITE-HOST"), "/h/tool/fs.write");

    // A handle the guest holds is a descriptor in the daemon...
    assert_eq!(field(&vm.expect("HOLDING", BOOT).unwrap(), "HOLDING"), "held-file");
    assert_eq!(agent.fds_on(&held), 1, "the guest's open file is held by the agent view's daemon");

    // The append is on the host, covered by the log's commit evidence, once the guest's write
    // has returned; the guest waits for the host's word before going on.
    vm.expect("APPENDED", BOOT).unwrap();
    let log = st.join("home/0/agent/coder/session/s1/events.jsonl");
    let (mark, torn) = ringfs::log::verify(&log).unwrap();
    let len = fs::metadata(&log).unwrap().len();
    assert_eq!((mark.end, torn), (len, 0), "every byte of {} is committed", log.display());
    assert_eq!(fs::read_to_string(&log).unwrap(), "{\"a\":1}\n");
    fs::write(st.join("home/0/ack"), "").unwrap();
    vm.expect("ACKED", BOOT).unwrap();

    let erofs = vm.expect("EROFS-AGENT", BOOT).unwrap();
    assert!(erofs.contains("Read-only file system"), "creating at the agent view's root: {erofs}");
    let erofs = vm.expect("EROFS-HOST", BOOT).unwrap();
    assert!(erofs.contains("Read-only file system"), "creating at the host view's root: {erofs}");
    assert!(!st.join("new").exists());

    // ...and no longer once the guest rebooted: a new FUSE session drops the old one's state.
    vm.expect("REBOOTING", BOOT).unwrap();
    let back = vm.expect("REBOOTED", BOOT).unwrap();
    assert_eq!(
        words(field(&back, "REBOOTED")),
        ["agent", "bin", "home", "model", "shared", "status", "tool"]
    );
    assert_eq!(
        (agent.fds_on(&held), agent.paths_on(&held)),
        (0, 0),
        "the old session's handle, and the descriptor kept for its inode, are released after the reboot\n{}",
        vm.transcript()
    );
    let st_exit = vm.wait(BOOT).unwrap();
    assert!(st_exit.success(), "{st_exit:?}\n{}", vm.transcript());
    assert!(!vm.transcript().contains("CHECK-FAIL"), "{}", vm.transcript());
    assert!(!vm.transcript().contains("VM-ERROR"), "{}", vm.transcript());

    // The guest is gone: threads, descriptors and its memory are released.
    agent.settle(&idle);
    assert_eq!(idle.guest_maps, 0);
    for d in [&mut agent, &mut host] {
        // A daemon that does not end within stop()'s 10 s (a hang guard) has no exit code.
        let (code, _) = d.stop();
        assert_eq!(code, Some(0), "SIGTERM ends the daemon with 0");
        assert!(!d.socket.exists(), "{} is removed", d.socket.display());
    }
}

/// The guest of `reconnect_restart_and_sigterm`: reports its boot and how the view answers.
const SIMPLE: &str = r#"
mkdir -p /ctx
mount -t virtiofs ctx /ctx || echo "CHECK-FAIL mount"
echo "BOOT $(cat /proc/sys/kernel/random/boot_id) $(ls /ctx | tr '\n' ' ')"
if grep -q idle /proc/cmdline; then
  echo "IDLE"
  sleep 600
fi
"#;

#[test]
fn reconnect_restart_and_sigterm() {
    require_vm();
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let st = storage(dir.path());
    let sock = dir.path().join("vm.sock");
    let kit = Kit::build(dir.path(), SIMPLE, &[]).unwrap();
    let dev = [Device { socket: sock.as_path(), tag: "ctx" }];
    let mut d = Daemon::start(&st, &sock, None);
    let idle = d.usage();

    // Guests one after another on the same socket; each leaves nothing behind.
    let mut boots = Vec::new();
    for _ in 0..2 {
        let mut vm = Vm::boot(&kit, &dev, 1, "", false).unwrap();
        let line = vm.expect("BOOT", BOOT).unwrap();
        let mut w = words(field(&line, "BOOT"));
        boots.push(w.remove(0).to_owned());
        assert_eq!(w, ["agent", "bin", "home", "model", "shared", "status", "tool"], "{}", vm.transcript());
        let connected = d.usage();
        assert!(connected.guest_maps > 0, "a connected guest's memory is mapped: {connected:?}");
        assert!(vm.wait(BOOT).unwrap().success(), "{}", vm.transcript());
        d.settle(&idle);
    }
    assert_ne!(boots[0], boots[1], "two different guests were served");

    // A daemon killed outright leaves its socket behind; the next one takes it over.
    d.kill();
    assert!(sock.exists());
    let mut d = Daemon::start(&st, &sock, None);

    // SIGTERM while a guest is connected: the daemon ends cleanly and removes its socket.
    let vm = Vm::boot(&kit, &dev, 1, "idle", false).unwrap();
    vm.expect("IDLE", BOOT).unwrap();
    let (code, _) = d.stop();
    assert_eq!(code, Some(0), "SIGTERM ends the daemon with 0\n{}", vm.transcript());
    assert!(!sock.exists(), "the socket is removed");
    drop(vm);
}
