//! `ctx agent start|stop|ps` and the terminal socket, with real bubblewrap sandboxes: checked
//! from inside (identity, environment, /workspace, /ctx as the agent's view, host files, no
//! network), exit status, stop, and watch/attach with two clients at once.

use std::fs;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use tests::served::Served;

fn text(o: &Output) -> String {
    tests::shown(o)
}

struct World {
    s: Served,
    work: PathBuf,
}

impl World {
    fn new() -> World {
        World::on(Served::start())
    }

    /// A world whose storage is a disk of its own of `size` (a test that writes without
    /// bound fills that, never the host's).
    fn on_own_disk(size: &str) -> World {
        World::on(Served::start_on_own_disk(size))
    }

    fn on(s: Served) -> World {
        assert!(Path::new("/usr/bin/bwrap").exists(), "bubblewrap is required (make test installs it)");
        let st = s.storage.to_str().unwrap().to_owned();
        let ctx = |args: &[&str]| {
            let o = Command::new(tests::bin("ctx")).args(args).output().unwrap();
            assert!(o.status.success(), "{args:?}: {}", text(&o));
        };
        ctx(&["bootstrap", &st]);
        ctx(&[
            "agent", "new", "coder", "--tool", "fs.stat", "--uid", "1000", "--gid", "1000", "--source", &st,
        ]);
        ctx(&["agent", "new", "outsider", "--uid", "2000", "--gid", "2000", "--source", &st]);
        fs::write(s.storage.join("tool/fs.stat.d/policy"), "allow coder_t tool:fs.stat execute\n").unwrap();
        fs::create_dir_all(s.storage.join("home/2000")).unwrap();
        let work = s.dir.path().join("work");
        fs::create_dir_all(&work).unwrap();
        fs::write(work.join("a.txt"), "hi\n").unwrap();
        rustix::fs::chown(
            &work,
            Some(rustix::fs::Uid::from_raw(1000)),
            Some(rustix::fs::Gid::from_raw(1000)),
        )
        .unwrap();
        World { s, work }
    }

    /// Grants coder the tool `name`, in both policies.
    fn grant_tool(&self, name: &str) {
        let policy = self.s.storage.join("agent/coder.d/policy");
        let mut p = fs::read_to_string(&policy).unwrap();
        p.push_str(&format!("allow coder_t tool:{name} execute\n"));
        fs::write(&policy, p).unwrap();
        fs::write(
            self.s.storage.join(format!("tool/{name}.d/policy")),
            format!("allow coder_t tool:{name} execute\n"),
        )
        .unwrap();
    }

    /// `ctx agent start coder --session SESSION` on this world, with `extra`, up to `--`.
    fn command(&self, session: &str, extra: &[&str]) -> Command {
        let mut c = Command::new(tests::bin("ctx"));
        c.args(["agent", "start", "coder", "--session", session, "--ctx"])
            .arg(&self.s.mnt)
            .arg("--control")
            .arg(&self.s.control)
            .arg("--cwd")
            .arg(&self.work)
            .args(extra)
            .arg("--");
        c
    }

    /// `ctx agent stop coder --session SESSION` on this world.
    fn stop(&self, session: &str) -> Output {
        Command::new(tests::bin("ctx"))
            .args(["agent", "stop", "coder", "--session", session, "--control"])
            .arg(&self.s.control)
            .output()
            .unwrap()
    }

    fn start(&self, session: &str, extra: &[&str], cmd: &[&str]) -> Output {
        self.command(session, extra).args(cmd).env("SECRET_TOKEN", "operator-secret").output().unwrap()
    }
}

/// The pids cgroup of coder's run of session `s` (v2 or v1, whichever has the controller).
fn pids_group(s: &str) -> PathBuf {
    ["/sys/fs/cgroup/unified/cortexfs", "/sys/fs/cgroup/cortexfs", "/sys/fs/cgroup/pids/cortexfs"]
        .iter()
        .map(|r| Path::new(r).join(format!("coder.{s}")))
        .find(|d| d.join("pids.max").exists())
        .expect("the run's pids group")
}

fn session(tag: &str) -> String {
    // Runs are host-wide: the module's letter keeps its sessions apart from other modules'.
    format!("{tag}{}s", std::process::id())
}

#[test]
fn the_sandbox_is_the_agents_world_and_nothing_else() {
    let w = World::new();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let script = format!(
        "id -u > /workspace/uid; id -g > /workspace/gid; env > /workspace/env; ls /ctx > /workspace/root; \
         grep NoNewPrivs /proc/self/status > /workspace/nnp; id -G > /workspace/groups; \
         grep -E '^Cap(Inh|Prm|Eff|Amb)' /proc/self/status > /workspace/caps; \
         ls -l /proc/$$/fd > /workspace/fdl; ls /proc/$$/fd > /workspace/fds; \
         ls /ctx/tool > /workspace/tools; ls /ctx/home > /workspace/homes; \
         test -e {storage} && echo visible > /workspace/storage; \
         /ctx/bin/tsh fs.stat a.txt > /workspace/stat; \
         python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), 2)' 2>/dev/null && echo yes > /workspace/net; \
         exit 7",
        storage = w.s.storage.display()
    );
    // Started holding a descriptor of its own (7, not close-on-exec): none reaches the sandbox.
    let ctx = w.command(&session("s"), &["--wait"]);
    let out = Command::new("/bin/sh")
        .args(["-c", "exec 7</dev/null; exec \"$@\"", "sh"])
        .arg(ctx.get_program())
        .args(ctx.get_args())
        .args(["/bin/sh", "-c", &script])
        .env("SECRET_TOKEN", "operator-secret")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(7), "the terminal's status reaches --wait: {}", text(&out));
    let read = |f: &str| fs::read_to_string(w.work.join(f)).unwrap_or_default();
    assert_eq!((read("uid"), read("gid")), ("1000\n".into(), "1000\n".into()));
    assert_eq!(read("nnp"), "NoNewPrivs:\t1\n");
    // The agent's ids and nothing of root's: no supplementary group, no capability, no
    // descriptor but the shell's own streams (and the one it keeps for itself).
    assert_eq!(read("groups"), "1000\n");
    for l in read("caps").lines() {
        assert!(l.ends_with("\t0000000000000000"), "{}", read("caps"));
    }
    assert_eq!(read("caps").lines().count(), 4, "{}", read("caps"));
    let fds: Vec<String> = read("fds").lines().map(str::to_owned).collect();
    // The shell's own (dash keeps a redirected stream's original at 10 and up) aside, only
    // its three streams: nothing the daemon, the launcher or ctxterm held.
    let leaked: Vec<&String> =
        fds.iter().filter(|f| f.parse::<u32>().is_ok_and(|n| (3..10).contains(&n) || n > 11)).collect();
    assert!(leaked.is_empty(), "{fds:?} {}", read("fdl"));
    let env: Vec<String> = read("env").lines().map(|l| l.split('=').next().unwrap().to_owned()).collect();
    let allowed = [
        "CTX_ROOT",
        "CTX_HOME",
        "CTX_AGENT",
        "CTX_SESSION",
        "CTX_PATH",
        "CTX_WORKSPACE",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "TERM",
        "LANG",
        "PATH",
        "PWD",
        "SHLVL",
        "OLDPWD",
        "_",
    ];
    for k in &env {
        assert!(allowed.contains(&k.as_str()), "{k} leaked into the sandbox: {env:?}");
    }
    assert!(env.iter().any(|k| k == "CTX_AGENT") && !read("env").contains("operator-secret"));
    assert_eq!(read("root"), "agent\nbin\nhome\nmodel\nshared\nstatus\ntool\n");
    assert!(read("tools").lines().any(|l| l == "fs.stat"), "{}", read("tools"));
    assert!(!read("tools").lines().any(|l| l == "fs.write"), "a tool the agent may not run is absent");
    assert!(!read("homes").contains("2000"), "another agent's home is invisible: {}", read("homes"));
    assert_eq!(read("storage"), "", "the storage is not reachable");
    assert!(read("stat").contains("\"size\":3"), "tsh runs tools in the sandbox: {}", read("stat"));
    assert_eq!(read("net"), "", "no network without the grant");
    let owner = std::os::unix::fs::MetadataExt::uid(&fs::metadata(w.work.join("uid")).unwrap());
    assert_eq!(owner, 1000, "workspace files belong to the agent");
    let events = fs::read_to_string(
        w.s.storage.join(format!("home/1000/agent/coder/session/{}/events.jsonl", session("s"))),
    )
    .unwrap();
    assert!(events.contains("\"object\":\"tool/fs.stat\""), "{events}");
    drop(listener);
}

#[test]
fn stop_leaves_nothing_behind_and_two_clients_share_the_terminal() {
    let w = World::new();
    let s = session("t");
    let out = w.start(&s, &[], &["/bin/sh"]);
    assert!(out.status.success(), "{}", text(&out));
    let sock = w.s.run_dir("coder", &s).join("term/main.sock");
    let abi = w.s.p(&format!("home/1000/agent/coder/session/{s}/terminal/main.sock"));
    assert_eq!(fs::read_link(&abi).unwrap(), Path::new(&sock), "the session's terminal/main.sock");
    let ps = Command::new(tests::bin("ctx"))
        .args(["agent", "ps", "--control"])
        .arg(&w.s.control)
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&ps.stdout).lines().any(|l| l.starts_with(&format!("coder\t{s}\t"))),
        "{}",
        text(&ps)
    );
    let ps = Command::new(tests::bin("ctx"))
        .args(["agent", "ps", "--json", "--control"])
        .arg(&w.s.control)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&ps.stdout).unwrap();
    assert!(
        v.as_array()
            .unwrap()
            .iter()
            .any(|r| r["agent"] == "coder" && r["session"] == s.as_str() && r["pid"].is_u64()),
        "{v}"
    );

    let mut watcher = UnixStream::connect(&sock).unwrap();
    watcher.write_all(b"watch\n").unwrap();
    let mut attacher = UnixStream::connect(&sock).unwrap();
    attacher.write_all(b"attach\n").unwrap();
    std::thread::sleep(Duration::from_millis(200));
    watcher.write_all(b"echo NOPE$((2+2))\n").unwrap();
    attacher.write_all(b"echo MARK$((1+1)); sleep 1000 & echo started\n").unwrap();
    let seen = |c: &mut UnixStream, want: &str| {
        c.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
        let t = Instant::now();
        let mut all = String::new();
        let mut buf = [0u8; 4096];
        while t.elapsed() < Duration::from_secs(10) && !all.contains(want) {
            if let Ok(n) = c.read(&mut buf) {
                all.push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        }
        all
    };
    let out = seen(&mut watcher, "MARK2");
    assert!(out.contains("MARK2"), "the watcher sees what the attacher typed ran: {out}");
    assert!(!out.contains("NOPE4"), "a watcher cannot type: {out}");

    let mut watch = Command::new(tests::bin("ctx"))
        .args(["agent", "watch", "coder", "--session", &s, "--control"])
        .arg(&w.s.control)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let out = w.stop(&s);
    assert!(out.status.success(), "{}", text(&out));
    let ended: serde_json::Value = serde_json::from_slice(
        &Command::new(tests::bin("ctx"))
            .args(["agent", "ps", "--all", "--json", "--control"])
            .arg(&w.s.control)
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let recorded = ended.as_array().unwrap().iter().find(|r| r["session"] == s.as_str()).unwrap()["exit"]
        .as_i64()
        .unwrap() as i32;
    assert_ne!(recorded, 0, "stopped by a signal");
    assert_eq!(watch.wait().unwrap().code(), Some(recorded), "the status reaches watchers");
    let left = Command::new("pgrep").args(["-f", "sleep 1000"]).output().unwrap();
    assert!(left.stdout.is_empty(), "no process left behind: {}", text(&left));
    assert!(!Path::new(&sock).exists(), "the socket is gone");
    let views = fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!views.contains(&format!("{} ", w.s.view_dir("coder", &s).display())), "the view is gone");
    let ps = Command::new(tests::bin("ctx"))
        .args(["agent", "ps", "--control"])
        .arg(&w.s.control)
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&ps.stdout).contains(&s));
}

/// The gateway of the sandbox's network namespace (pasta maps it to the host's loopback).
const GATEWAY: &str = "import socket, struct\n\
    routes = [l.split() for l in open('/proc/net/route').read().splitlines()[1:]]\n\
    gw = [socket.inet_ntoa(struct.pack('<L', int(f[2], 16))) for f in routes if f[1] == '00000000'][0]\n";

#[test]
fn a_network_grant_gives_egress_through_pasta() {
    let _net = tests::NETWORK.lock().unwrap_or_else(|p| p.into_inner());
    let w = World::new();
    let policy = w.s.storage.join("agent/coder.d/policy");
    let mut p = fs::read_to_string(&policy).unwrap();
    p.push_str("allow coder_t network:default connect\n");
    fs::write(&policy, p).unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for c in listener.incoming().flatten() {
            let mut c = c;
            let _ = c.write_all(b"hello from the host");
        }
    });
    let script = format!(
        "{GATEWAY}s = socket.create_connection((gw, {port}), 5)\n\
         open('/workspace/net', 'w').write(s.recv(100).decode())\n"
    );
    let out = w.start(
        &session("n"),
        &["--wait"],
        &["/bin/sh", "-c", "python3 -c \"$0\" 2>/workspace/err", &script],
    );
    let err = fs::read_to_string(w.work.join("err")).unwrap_or_default();
    assert!(out.status.success(), "{}\n{err}", text(&out));
    assert_eq!(fs::read_to_string(w.work.join("net")).unwrap(), "hello from the host");
}

#[test]
fn a_network_grant_the_host_cannot_serve_starts_without_a_network_and_says_so() {
    use std::os::unix::fs::PermissionsExt;
    let w = World::new();
    let policy = w.s.storage.join("agent/coder.d/policy");
    let mut p = fs::read_to_string(&policy).unwrap();
    p.push_str("allow coder_t network:default connect\n");
    fs::write(&policy, p).unwrap();
    // A host whose /dev/net/tun the agent cannot open (root's only, for the length of the run).
    let _net = tests::NETWORK.lock().unwrap_or_else(|p| p.into_inner());
    struct Restore(u32);
    impl Drop for Restore {
        fn drop(&mut self) {
            let _ = fs::set_permissions("/dev/net/tun", fs::Permissions::from_mode(self.0));
        }
    }
    let mode = fs::metadata("/dev/net/tun").unwrap().permissions().mode() & 0o7777;
    let _restore = Restore(mode);
    fs::set_permissions("/dev/net/tun", fs::Permissions::from_mode(0o600)).unwrap();
    let s = session("nt");
    let out = w.start(
        &s,
        &["--wait"],
        &["/bin/sh", "-c", "sed -n '3,$s/:.*//p' /proc/net/dev | tr -d ' ' > /workspace/links"],
    );
    assert!(out.status.success(), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("warning") && stderr.contains("is not open to uid 1000"), "{}", text(&out));
    assert_eq!(
        fs::read_to_string(w.work.join("links")).unwrap(),
        "lo\n",
        "the sandbox's network is unshared"
    );
    let events =
        fs::read_to_string(w.s.storage.join(format!("home/1000/agent/coder/session/{s}/events.jsonl")))
            .unwrap();
    let warning =
        events.lines().find(|l| l.contains("\"run.warning\"")).unwrap_or_else(|| panic!("{events}"));
    assert!(warning.contains("/dev/net/tun") && warning.contains("no network"), "{warning}");
}

#[test]
fn the_tsh_path_sees_a_read_only_ctx_and_a_command_of_its_own_a_writable_one() {
    let w = World::new();
    w.grant_tool("shell.exec");
    // The command-less tsh path: what tsh runs cannot change /ctx, but the run's records land.
    let s = session("ro");
    let own = format!("/ctx/home/1000/agent/coder/session/{s}");
    fs::write(
        w.work.join("probe.sh"),
        format!(
            "cat /ctx/status > /workspace/status; touch /ctx/home/1000/made 2> /workspace/err; echo $? > /workspace/rc; \
             echo note > {own}/note.md; echo $? > /workspace/own; touch /workspace/done\n"
        ),
    )
    .unwrap();
    let out = w.start(&s, &[], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let sent = Command::new(tests::bin("ctx"))
        .args([
            "agent",
            "send",
            "coder",
            "--session",
            &s,
            "shell.exec /bin/sh /workspace/probe.sh",
            "--control",
        ])
        .arg(&w.s.control)
        .output()
        .unwrap();
    assert!(sent.status.success(), "{}", text(&sent));
    let t = Instant::now();
    while !w.work.join("done").exists() && t.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let read = |f: &str| fs::read_to_string(w.work.join(f)).unwrap_or_default();
    assert!(read("status").lines().any(|l| l == "ctx records"), "{}", read("status"));
    assert_ne!(read("rc").trim(), "0", "a write outside the run's records is refused");
    assert!(read("err").contains("Read-only file system"), "{}", read("err"));
    assert!(!w.s.storage.join("home/1000/made").exists());
    assert_eq!(read("own"), "0\n", "the run's own session is its to write");
    let t = Instant::now();
    let events = w.s.storage.join(format!("home/1000/agent/coder/session/{s}/events.jsonl"));
    while !fs::read_to_string(&events).unwrap_or_default().contains("shell.exec")
        && t.elapsed() < Duration::from_secs(10)
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(fs::read_to_string(&events).unwrap().contains("\"tool.call\""), "tsh records its calls");
    let stop = w.stop(&s);
    assert!(stop.status.success(), "{}", text(&stop));
    // A command of its own: the view is checked and writable.
    let out = w.start(
        &session("rw"),
        &["--wait"],
        &["/bin/sh", "-c", "grep '^ctx ' /ctx/status > /workspace/status2 && touch /ctx/home/1000/made"],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(read("status2"), "ctx read-write\n");
    assert!(w.s.storage.join("home/1000/made").exists());
}

#[test]
fn hosted_cli_profiles_run_in_the_sandbox_without_network() {
    let w = World::new();
    for (profile, want) in [
        ("codex", "codex-cli 0.171.0"),
        ("claude", "2.1.332 (Claude Code)"),
        ("pi", "0.73.1"),
        ("gemini", "0.61.0"),
    ] {
        let out = w.start(&session(profile), &["--wait", "--profile", profile], &["--version"]);
        assert!(out.status.success(), "{profile}: {}", text(&out));
        let said =
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(said.contains(want), "{profile}: {}", text(&out));
        // No model is set up here: the CLI starts with its own configuration, and says so.
        assert!(String::from_utf8_lossy(&out.stderr).contains("names no model"), "{profile}: {}", text(&out));
        probe_network(&w, profile);
    }
    let out = w.start(&session("x"), &["--profile", "nope"], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
}

/// Starts `profile`'s CLI on its terminal and probes the network from the sandbox's own
/// network namespace while the CLI runs: it has only a loopback device, and a listener on the
/// host's loopback, reachable from the host, is not reachable from there.
fn probe_network(w: &World, profile: &str) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::net::TcpStream::connect(("127.0.0.1", port)).expect("the listener answers on the host");
    let s = session(&format!("n{profile}"));
    let out = w.start(&s, &["--profile", profile, "--pids", "64"], &[]);
    assert!(out.status.success(), "{profile}: {}", text(&out));
    let group = pids_group(&s);
    let ours = fs::read_link("/proc/self/ns/net").unwrap();
    // The CLI itself: a process of the run, in a network namespace that is not the host's.
    let t = Instant::now();
    let pid = loop {
        let procs = fs::read_to_string(group.join("cgroup.procs")).unwrap_or_default();
        let found = procs.lines().find(|pid| {
            let ns = fs::read_link(format!("/proc/{pid}/ns/net")).ok();
            let cmd = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            ns.is_some_and(|ns| ns != ours) && String::from_utf8_lossy(&cmd).contains(profile)
        });
        if let Some(pid) = found {
            break pid.to_owned();
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "{profile}: no CLI process of the run in its own network namespace: {procs}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let devices = fs::read_to_string(format!("/proc/{pid}/net/dev")).unwrap();
    let names: Vec<&str> =
        devices.lines().skip(2).filter_map(|l| l.split(':').next()).map(str::trim).collect();
    assert_eq!(names, ["lo"], "{profile}: {devices}");
    let probe = Command::new("nsenter")
        .arg(format!("--net=/proc/{pid}/ns/net"))
        .args(["--", "/bin/bash", "-c", &format!("exec 3<>/dev/tcp/127.0.0.1/{port}")])
        .output()
        .unwrap();
    assert!(!probe.status.success(), "{profile}: the host's listener answered inside: {}", text(&probe));
    // The probe ran and its connection failed (not nsenter).
    assert!(
        String::from_utf8_lossy(&probe.stderr).contains("Connection refused"),
        "{profile}: {}",
        text(&probe)
    );
    let stop = w.stop(&s);
    assert!(stop.status.success(), "{profile}: {}", text(&stop));
}

#[test]
fn bad_mounts_are_refused_and_ceilings_applied() {
    let w = World::new();
    for bad in
        [["/tmp", "/", "ro"], ["/tmp", "/ctx/x", "ro"], ["tmp", "/data", "ro"], ["/tmp", "/data", "rx"]]
    {
        let mut args = vec!["--mount"];
        args.extend(bad);
        let out = w.start(&session("m"), &args, &["/bin/true"]);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {}", text(&out));
    }
    // The agent's own mount table is applied (its policy grants it); a mount the policy does
    // not grant is refused before anything starts.
    let data = w.s.dir.path().join("data");
    fs::create_dir_all(&data).unwrap();
    fs::write(data.join("f"), "mounted\n").unwrap();
    let st = w.s.storage.to_str().unwrap();
    let d = data.to_str().unwrap();
    let out = Command::new(tests::bin("ctx"))
        .args([
            "agent", "new", "mounter", "--uid", "1000", "--gid", "1000", "--mount", d, "/data", "ro",
            "--source", st,
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let out = Command::new(tests::bin("ctx"))
        .args(["agent", "start", "mounter", "--session", &session("mt"), "--wait", "--ctx"])
        .arg(&w.s.mnt)
        .arg("--control")
        .arg(&w.s.control)
        .arg("--cwd")
        .arg(&w.work)
        .args([
            "--",
            "/bin/sh",
            "-c",
            "cat /data/f > /workspace/m; touch /data/g 2>/dev/null || echo ro >> /workspace/m",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(fs::read_to_string(w.work.join("m")).unwrap(), "mounted\nro\n");
    let out = w.start(&session("mu"), &["--mount", d, "/extra", "ro"], &["/bin/true"]);
    assert_eq!(out.status.code(), Some(13), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("mount:/extra"), "{}", text(&out));

    // Resource ceilings go through cgroup v2 or v1, whichever has the controller.
    let s = session("c");
    let out = w.start(&s, &["--pids", "64"], &["/bin/sleep", "100"]);
    assert!(out.status.success(), "{}", text(&out));
    let group = pids_group(&s);
    assert_eq!(fs::read_to_string(group.join("pids.max")).unwrap().trim(), "64");
    assert!(
        !fs::read_to_string(group.join("cgroup.procs")).unwrap().trim().is_empty(),
        "the sandbox is in it"
    );
    let out = w.stop(&s);
    assert!(out.status.success(), "{}", text(&out));
    assert!(!group.exists(), "the group goes with the run");
}

/// `ctx agent start --wait -- /nonexistent` exited 69 and said nothing: the sandbox's terminal
/// owner wrote why on its own stderr, which no client reads. It says it on the terminal now.
#[test]
fn a_command_that_cannot_start_says_why() {
    let w = World::new();
    for how in [&["--wait"][..], &["--wait", "--tty"]] {
        let out = w.start(&session("ns"), how, &["/nonexistent"]);
        assert_eq!(out.status.code(), Some(69), "{how:?}: {}", text(&out));
        let said =
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(said.contains("cannot run /nonexistent") && said.contains("No such file"), "{how:?}: {said}");
    }
    // Headless, the reason is on stderr.
    let out = w.start(&session("ns"), &["--headless"], &["/nonexistent"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot run /nonexistent"), "{}", text(&out));
}

/// `--wait` from a program (stdout not a terminal) runs the command on the caller's streams:
/// no PTY, stdout and stderr apart, the command's status as the exit code; `--tty` keeps the
/// agent's terminal.
#[test]
fn a_run_waited_on_by_a_program_is_headless_unless_it_asks_for_a_terminal() {
    let w = World::new();
    let script = "test -t 1 && echo tty || echo notty; echo to-stderr >&2; exit 7";
    let out = w.start(&session("hl"), &["--wait"], &["/bin/sh", "-c", script]);
    assert_eq!(out.status.code(), Some(7), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "notty\n", "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("to-stderr"), "{}", text(&out));
    let out = w.start(&session("hl"), &["--wait", "--tty"], &["/bin/sh", "-c", script]);
    assert_eq!(out.status.code(), Some(7), "{}", text(&out));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("tty\r\n") && !said.contains("notty") && said.contains("to-stderr"), "{said}");
}

/// A model on this host's loopback (the scripted endpoint), `model/main` pointing at it, granted
/// to coder, and its key in a secret store of the test's own (`CTX_SECRETS`).
fn with_model(w: &World, api: &str, ep: &tests::model_endpoint::Endpoint, key: &str) -> PathBuf {
    let base = match api {
        "anthropic-messages" | "google-gemini" => format!("http://127.0.0.1:{}", ep.port),
        _ => format!("http://127.0.0.1:{}/v1", ep.port),
    };
    with_model_at(w, api, &base, key)
}

/// As [`with_model`], for a model at `base`.
fn with_model_at(w: &World, api: &str, base: &str, key: &str) -> PathBuf {
    let st = w.s.storage.to_str().unwrap();
    let secrets = w.s.dir.path().join("secrets");
    let ctx = |args: &[&str]| {
        let mut c = Command::new(tests::bin("ctx"));
        c.args(args)
            .env("CTX_SECRETS", &secrets)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = c.spawn().unwrap();
        // Only `secret set` reads its input; the others may have exited before it is written.
        match child.stdin.take().unwrap().write_all(key.as_bytes()) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
            r => r.unwrap(),
        }
        let o = child.wait_with_output().unwrap();
        assert!(o.status.success(), "{args:?}: {}", text(&o));
    };
    ctx(&["model", "add", "local/m1", "--api", api, "--base-url", base, "--id", "m-1", "--source", st]);
    ctx(&["model", "alias", "main", "local/m1", "--source", st]);
    ctx(&["agent", "grant", "coder", "model:main", "use", "--source", st]);
    ctx(&["secret", "set", "local"]);
    secrets
}

/// Runs coder with `profile` and `args`, its key from `secrets`, headless.
fn run_cli(w: &World, s: &str, profile: &str, secrets: &Path, args: &[&str]) -> Output {
    w.command(s, &["--wait", "--profile", profile]).args(args).env("CTX_SECRETS", secrets).output().unwrap()
}

/// The tool events of a session.
fn tool_calls(w: &World, s: &str) -> Vec<String> {
    let events =
        fs::read_to_string(w.s.storage.join(format!("home/1000/agent/coder/session/{s}/events.jsonl")))
            .unwrap_or_default();
    events.lines().filter(|l| l.contains("\"tool.call\"")).map(str::to_owned).collect()
}

#[test]
fn codex_does_a_real_turn_through_its_profile_and_continues_from_its_home() {
    let ep = tests::model_endpoint::Endpoint::start("tsh fs.stat /workspace/a.txt", "CHECKED");
    let w = World::new();
    let secrets = with_model(&w, "openai-responses", &ep, "sk-codex-test-key");
    let s = session("cxturn");
    let prompt = "stat a.txt";
    let out = run_cli(
        &w,
        &s,
        "codex",
        &secrets,
        &["exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", prompt],
    );
    assert!(out.status.success(), "{}", text(&out));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("CHECKED"), "the final answer reaches the caller: {}", text(&out));
    assert!(tool_calls(&w, &s).iter().any(|l| l.contains("fs.stat")), "{:?}", tool_calls(&w, &s));
    let seen = ep.seen();
    assert!(seen.iter().all(|r| r.key.as_deref() == Some("sk-codex-test-key")), "{seen:?}");
    assert!(seen.iter().all(|r| r.body["model"] == "m-1"), "{seen:?}");
    // A second run resumes the conversation the first left in the agent's home.
    let out = run_cli(
        &w,
        &s,
        "codex",
        &secrets,
        &[
            "exec",
            "--skip-git-repo-check",
            "--dangerously-bypass-approvals-and-sandbox",
            "resume",
            "--last",
            "again",
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    let last = ep.seen().last().unwrap().body.to_string();
    assert!(last.contains(prompt) && last.contains("again"), "the second turn carries the first: {last}");
}

#[test]
fn claude_does_a_real_turn_through_its_profile_and_continues_from_its_home() {
    let ep = tests::model_endpoint::Endpoint::start("tsh fs.stat /workspace/a.txt", "CHECKED");
    let w = World::new();
    let secrets = with_model(&w, "anthropic-messages", &ep, "sk-ant-claude-test-key");
    let s = session("clturn");
    let prompt = "stat a.txt";
    let out = run_cli(&w, &s, "claude", &secrets, &["-p", "--dangerously-skip-permissions", prompt]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("CHECKED"), "{}", text(&out));
    assert!(tool_calls(&w, &s).iter().any(|l| l.contains("fs.stat")), "{:?}", tool_calls(&w, &s));
    let seen = ep.seen();
    assert!(seen.iter().any(|r| r.path.ends_with("/messages")), "{seen:?}");
    assert!(seen.iter().all(|r| r.key.as_deref() == Some("sk-ant-claude-test-key")), "{seen:?}");
    let out =
        run_cli(&w, &s, "claude", &secrets, &["-p", "--dangerously-skip-permissions", "--continue", "again"]);
    assert!(out.status.success(), "{}", text(&out));
    let last = ep.seen().iter().rev().find(|r| r.path.ends_with("/v1/messages")).unwrap().body.to_string();
    assert!(last.contains(prompt) && last.contains("again"), "the second turn carries the first: {last}");
}

#[test]
fn a_model_is_used_only_with_its_grant_and_reached_without_a_network_alone() {
    let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let q = other.local_addr().unwrap().port();
    let probe = format!(
        "for p in {{PORT}} {q}; do (exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null && echo \"port-$p-open\" || echo \"port-$p-closed\"; done; \
         grep -c . /proc/net/route | sed 's/^/routes-/'; command -v tsh"
    );
    let ep = tests::model_endpoint::Endpoint::start(&probe, "PROBED");
    let w = World::new();
    let secrets = with_model(&w, "openai-responses", &ep, "sk-egress-key");
    let s = session("egress");
    let args = ["exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", "probe"];
    let out = run_cli(&w, &s, "codex", &secrets, &args);
    assert!(out.status.success(), "{}", text(&out));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains(&format!("port-{}-open", ep.port)), "the model is reached: {said}");
    assert!(said.contains(&format!("port-{q}-closed")), "another loopback listener is not: {said}");
    assert!(said.contains("routes-1"), "no route out of the sandbox (only the header line): {said}");
    assert!(said.contains("/ctx/bin/tsh"), "a login shell finds tsh: {said}");
    // Without the grant, nothing starts.
    let policy = w.s.storage.join("agent/coder.d/policy");
    let granted = fs::read_to_string(&policy).unwrap();
    fs::write(&policy, granted.replace("allow coder_t model:main use\n", "")).unwrap();
    let out = run_cli(&w, &session("nogrant"), "codex", &secrets, &args);
    assert_eq!(out.status.code(), Some(13), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("model:main use"), "{}", text(&out));
    // A model of its own policy must grant the agent too.
    fs::write(&policy, &granted).unwrap();
    fs::write(w.s.storage.join("model/local/m1.d/policy"), "allow someone_t model:local/m1 use\n").unwrap();
    let out = run_cli(&w, &session("modelpol"), "codex", &secrets, &args);
    assert_eq!(out.status.code(), Some(13), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("model/local/m1.d/policy"), "{}", text(&out));
}

/// Every process on the host: (pid, parent pid).
fn processes() -> Vec<(u32, u32)> {
    let mut out = Vec::new();
    for e in fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let Some(after) = stat.rsplit_once(") ").map(|(_, a)| a) else { continue };
        let ppid = after.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
        out.push((pid, ppid));
    }
    out
}

/// Files under `dir` holding `needle` (sockets, FIFOs and devices are not read).
fn files_holding(dir: &Path, needle: &[u8], out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let Ok(t) = e.file_type() else { continue };
        if t.is_dir() {
            files_holding(&e.path(), needle, out);
        } else if t.is_file()
            && fs::read(e.path()).is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle))
        {
            out.push(e.path());
        }
    }
}

#[test]
fn a_models_key_reaches_the_clis_environment_and_nowhere_else() {
    let key = format!("sk-leak-probe-{}", std::process::id());
    let ep = tests::model_endpoint::Endpoint::start("sleep 4; tsh fs.stat /workspace/a.txt", "DONE");
    let w = World::new();
    let secrets = with_model(&w, "openai-responses", &ep, &key);
    let s = session("leak");
    let run = w
        .command(&s, &["--wait", "--profile", "codex"])
        .args(["exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", "go"])
        .env("CTX_SECRETS", &secrets)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // While the model's command runs (the first request has been answered with it).
    let t = Instant::now();
    while ep.seen().is_empty() && t.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(1500));
    let needle = key.as_bytes();
    let procs = processes();
    let cmdline = |pid: u32| fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    // The CLI's tree: what descends from the run's ctxterm, below it.
    let term: Vec<u32> = procs
        .iter()
        .filter(|(pid, _)| {
            let c = cmdline(*pid);
            let argv: Vec<&[u8]> = c.split(|b| *b == 0).collect();
            let env = fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            argv[0].ends_with(b"/ctxterm")
                && argv.contains(&&b"--key-env"[..])
                && env.split(|b| *b == 0).any(|v| v == format!("CTX_SESSION={s}").as_bytes())
        })
        .map(|(pid, _)| *pid)
        .collect();
    assert_eq!(term.len(), 1, "the run's ctxterm: {term:?}");
    let mut tree: Vec<u32> = Vec::new();
    let mut grew = true;
    while grew {
        grew = false;
        for (pid, ppid) in &procs {
            if (term.contains(ppid) || tree.contains(ppid)) && !tree.contains(pid) {
                tree.push(*pid);
                grew = true;
            }
        }
    }
    assert!(!tree.is_empty(), "the CLI runs");
    let mut found = Vec::new();
    let mut in_cli = 0;
    for (pid, _) in &procs {
        if cmdline(*pid).windows(needle.len()).any(|w| w == needle) {
            found.push(format!("/proc/{pid}/cmdline"));
        }
        let env = fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        if env.windows(needle.len()).any(|w| w == needle) {
            if tree.contains(pid) {
                in_cli += 1;
            } else {
                found.push(format!(
                    "/proc/{pid}/environ ({})",
                    String::from_utf8_lossy(&cmdline(*pid)).replace('\0', " ")
                ));
            }
        }
    }
    assert!(in_cli > 0, "the CLI has its key");
    let mut files = Vec::new();
    files_holding(&w.s.storage, needle, &mut files);
    files_holding(&w.s.rt().join("agent"), needle, &mut files);
    files_holding(Path::new("/run/cortexfs"), needle, &mut files);
    let out = run.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    files_holding(&w.s.storage, needle, &mut files);
    files_holding(&w.s.rt().join("agent"), needle, &mut files);
    files_holding(Path::new("/run/cortexfs"), needle, &mut files);
    assert!(!text(&out).contains(&key));
    assert!(found.is_empty() && files.is_empty(), "the key is elsewhere: {found:?} {files:?}");
}

#[test]
fn pi_does_a_real_turn_through_its_profile_and_continues_from_its_home() {
    let ep = tests::model_endpoint::Endpoint::start("tsh fs.stat /workspace/a.txt", "CHECKED");
    let w = World::new();
    let secrets = with_model(&w, "openai-responses", &ep, "sk-pi-test-key");
    let s = session("piturn");
    let out = run_cli(&w, &s, "pi", &secrets, &["-p", "stat a.txt"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("CHECKED"), "{}", text(&out));
    assert!(tool_calls(&w, &s).iter().any(|l| l.contains("fs.stat")), "{:?}", tool_calls(&w, &s));
    assert!(ep.seen().iter().all(|r| r.key.as_deref() == Some("sk-pi-test-key")), "{:?}", ep.seen());
    let models = w.s.storage.join("home/1000/agent/coder/home/.pi/agent/models.json");
    assert!(!fs::read_to_string(&models).unwrap().contains("sk-pi-test-key"), "the route, never the key");
    let out = run_cli(&w, &s, "pi", &secrets, &["-p", "-c", "again"]);
    assert!(out.status.success(), "{}", text(&out));
    let last = ep.seen().last().unwrap().body.to_string();
    assert!(
        last.contains("stat a.txt") && last.contains("again"),
        "the second turn carries the first: {last}"
    );
}

/// A fourth CLI from npm, added as a profile file alone (`ctxterm/profiles/gemini.toml`): its
/// turn reaches the scripted endpoint in Gemini's wire format with the agent's key, runs its
/// shell tool through tsh in the sandbox, and a second turn resumes the same conversation.
#[test]
fn gemini_does_a_real_turn_through_its_profile_file_and_resumes_its_conversation() {
    let ep = tests::model_endpoint::Endpoint::start("tsh fs.stat /workspace/a.txt", "CHECKED");
    let w = World::new();
    let secrets = with_model(&w, "google-gemini", &ep, "gm-test-key");
    let s = session("gmturn");
    let id = "0b6f1c1e-6a3e-4c1f-9d59-1d2c3b4a5f60";
    let out = run_cli(&w, &s, "gemini", &secrets, &["--session-id", id, "-p", "stat a.txt"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("CHECKED"), "{}", text(&out));
    assert!(tool_calls(&w, &s).iter().any(|l| l.contains("fs.stat")), "{:?}", tool_calls(&w, &s));
    let seen = ep.seen();
    assert!(seen.iter().any(|r| r.path.ends_with("/models/m-1:streamGenerateContent")), "{seen:?}");
    assert!(seen.iter().all(|r| r.key.as_deref() == Some("gm-test-key")), "{seen:?}");
    let out = run_cli(&w, &s, "gemini", &secrets, &["--resume", id, "-p", "again"]);
    assert!(out.status.success(), "{}", text(&out));
    let last = ep.seen().last().unwrap().body.to_string();
    assert!(
        last.contains("stat a.txt") && last.contains("again"),
        "the second turn carries the first: {last}"
    );
}

/// The agent's home is the agent's to change: a symlink it leaves where its profile keeps
/// configuration is replaced, never followed by the (root) launcher.
#[test]
fn a_symlink_in_the_agents_home_is_never_followed_by_the_launcher() {
    let ep = tests::model_endpoint::Endpoint::start("true", "OK");
    let w = World::new();
    let secrets = with_model(&w, "openai-responses", &ep, "sk-link-key");
    let outside = w.s.dir.path().join("outside");
    fs::create_dir_all(&outside).unwrap();
    let home = w.s.storage.join("home/1000/agent/coder/home");
    fs::create_dir_all(home.join(".pi")).unwrap();
    std::os::unix::fs::symlink(&outside, home.join(".pi/agent")).unwrap();
    let out = run_cli(&w, &session("link"), "pi", &secrets, &["-p", "hi"]);
    assert!(fs::read_dir(&outside).unwrap().next().is_none(), "nothing was written outside: {}", text(&out));
    // The home itself a link, as the agent's first run finds it (in a world of its own, whose
    // mount has never seen this home as a directory): refused, and the link's target
    // untouched.
    let w = World::new();
    let secrets = with_model(&w, "openai-responses", &ep, "sk-link-key");
    let outside = w.s.dir.path().join("outside");
    fs::create_dir_all(&outside).unwrap();
    let home = w.s.storage.join("home/1000/agent/coder/home");
    fs::create_dir_all(home.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(&outside, &home).unwrap();
    let who = |p: &Path| {
        use std::os::unix::fs::MetadataExt;
        let m = fs::metadata(p).unwrap();
        (m.uid(), m.gid(), m.mode())
    };
    let before = who(&outside);
    let out = run_cli(&w, &session("link2"), "pi", &secrets, &["-p", "hi"]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("coder/home"),
        "refused for its home: {}",
        text(&out)
    );
    assert_eq!(who(&outside), before, "the link's target keeps its owner, group and mode");
    assert!(fs::read_dir(&outside).unwrap().next().is_none());
}

/// A model elsewhere (a listener in a network namespace of the test's own, as another host),
/// an agent without a network: the run's proxy takes it to its model and refuses anything
/// else, each refusal an event; nothing reaches the other host directly.
#[test]
fn a_model_elsewhere_is_reached_through_the_runs_proxy_and_nothing_else_is() {
    let e = tests::elsewhere::Elsewhere::new();
    let other = e.listen();
    let op = other.local_addr().unwrap().port();
    let a = e.addr;
    let probe = format!(
        "curl -s -o /dev/null -w 'plain-%{{http_code}}' http://{a}:{op}/; echo; \
         curl -s -o /dev/null -w 'tunnel-%{{http_connect}}' https://{a}:{op}/; echo; \
         (exec 3<>/dev/tcp/{a}/{{PORT}}) 2>/dev/null && echo direct-open || echo direct-closed"
    );
    let ep = tests::model_endpoint::Endpoint::on(e.listen(), &probe, "PROBED");
    let w = World::new();
    let secrets = with_model_at(&w, "openai-responses", &format!("http://{a}:{}/v1", ep.port), "sk-far-key");
    let s = session("far");
    let args = ["exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", "probe"];
    let out = run_cli(&w, &s, "codex", &secrets, &args);
    assert!(out.status.success(), "{}", text(&out));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("PROBED"), "the model is reached through the proxy: {}", text(&out));
    assert!(said.contains("plain-403") && said.contains("tunnel-403"), "another port is refused: {said}");
    assert!(said.contains("direct-closed"), "no way around the proxy: {said}");
    assert!(ep.seen().iter().all(|r| r.key.as_deref() == Some("sk-far-key")), "{:?}", ep.seen());
    let events =
        fs::read_to_string(w.s.storage.join(format!("home/1000/agent/coder/session/{s}/events.jsonl")))
            .unwrap();
    let refused: Vec<&str> = events.lines().filter(|l| l.contains("\"net.refused\"")).collect();
    assert!(refused.len() >= 2 && refused.iter().any(|l| l.contains(&format!("{a}:{op}"))), "{events}");
    // The model's own log follows every run's use of it: each connection to it with its bytes,
    // and the refusals.
    let log = fs::read_to_string(w.s.mnt.join("model/local/m1.d/log")).unwrap();
    let lines: Vec<serde_json::Value> = log.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let uses: Vec<&serde_json::Value> =
        lines.iter().filter(|v| v["type"] == "model.use" && v["session"] == s.as_str()).collect();
    assert!(!uses.is_empty(), "{log}");
    assert!(
        uses.iter().all(|u| u["status"] == 200 && u["agent"] == "coder")
            && uses.iter().any(|u| u["bytes_up"].as_u64() > Some(0) && u["bytes_down"].as_u64() > Some(0)),
        "{log}"
    );
    assert!(lines.iter().filter(|v| v["type"] == "net.refused").count() >= 2, "{log}");
    // And its status counts them live.
    let status = fs::read_to_string(w.s.mnt.join("model/local/m1.d/status")).unwrap();
    let field = |k: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{k} ")))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    assert!(field("calls") >= 1 && field("refused") >= 2 && field("bytes_down") > 0, "{status}");
    drop(other);
}

/// A start that fails leaves nothing behind: no view, no supervisor, no socket directories;
/// its session does not say running; and the same session starts again at once (it was seen
/// needing `ctx view rm` first). Failed here two ways: a `--cwd` that is not there, and a cpu
/// ceiling the kernel refuses (the supervisor fails after the view was made).
#[test]
fn a_start_that_fails_removes_what_it_made_and_the_session_starts_again() {
    let w = World::new();
    let gone = w.s.dir.path().join("no-such-dir");
    for (tag, extra) in [
        ("failcwd", vec!["--cwd".to_owned(), gone.display().to_string()]),
        ("failcpu", vec!["--cpu".to_owned(), "1000000000000".to_owned()]),
    ] {
        let s = session(tag);
        failed_start_leaves_nothing(&w, &s, &extra);
    }
}

fn failed_start_leaves_nothing(w: &World, s: &str, extra: &[String]) {
    let o = Command::new(tests::bin("ctx"))
        .args(["agent", "start", "coder", "--session", s, "--ctx"])
        .arg(&w.s.mnt)
        .arg("--control")
        .arg(&w.s.control)
        .args(extra)
        .args(["--wait", "--", "/bin/true"])
        .output()
        .unwrap();
    assert!(!o.status.success(), "{extra:?} fails the start: {}", text(&o));
    let views = fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !views.contains(&format!("{} ", w.s.view_dir("coder", s).display())),
        "no view stays: {}",
        text(&o)
    );
    let run = w.s.run_dir("coder", s);
    for left in ["pid", "contract.json", "term", "receipt", "prepared"] {
        assert!(!run.join(left).exists(), "{left} stays in {}", run.display());
    }
    // Every hierarchy: the v1 controllers' and the unified one.
    for h in ["memory/", "pids/", "cpu/", ""] {
        let g = PathBuf::from(format!("/sys/fs/cgroup/{h}cortexfs/coder.{s}"));
        assert!(!g.exists(), "its cgroup stays: {}", g.display());
    }
    let state = fs::read_to_string(w.s.storage.join(format!("home/1000/agent/coder/session/{s}/state")))
        .unwrap_or_default();
    assert_ne!(state.trim(), "running", "the session does not say running");
    let again = w.start(s, &["--wait"], &["/bin/sh", "-c", "echo again"]);
    assert!(again.status.success(), "the same session starts again: {}", text(&again));
    assert!(String::from_utf8_lossy(&again.stdout).contains("again"), "{}", text(&again));
}

/// Two daemons on one host, each with its storage and an agent of the same name, run the same
/// session at once: each run's state is its daemon's (it was seen shared, the second start
/// refused, and `ps`/`stop` acting on the other daemon's runs); `ps` and `stop` act on one
/// daemon's runs only.
#[test]
fn two_daemons_agents_of_one_name_run_apart_and_ps_and_stop_see_their_own() {
    let daemons = [Served::start(), Served::start()];
    let s = session("twin");
    let mut pids = Vec::new();
    for d in &daemons {
        let st = d.storage.to_str().unwrap();
        for args in [vec!["bootstrap", st], vec!["agent", "new", "twin", "--source", st]] {
            let o = Command::new(tests::bin("ctx")).args(&args).output().unwrap();
            assert!(o.status.success(), "{args:?}: {}", text(&o));
        }
        let work = d.dir.path().join("work");
        fs::create_dir_all(&work).unwrap();
        fs::set_permissions(&work, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
        let o = Command::new(tests::bin("ctx"))
            .args(["agent", "start", "twin", "--session", &s, "--ctx"])
            .arg(&d.mnt)
            .arg("--control")
            .arg(&d.control)
            .arg("--cwd")
            .arg(&work)
            .args(["--", "/bin/sh", "-c", "sleep 1000"])
            .output()
            .unwrap();
        assert!(o.status.success(), "each daemon's run starts: {}", text(&o));
        let pid = fs::read_to_string(d.run_dir("twin", &s).join("pid")).unwrap();
        pids.push(pid.trim().to_owned());
    }
    assert_ne!(pids[0], pids[1], "two supervisors");
    let uids: Vec<String> =
        daemons.iter().map(|d| fs::read_to_string(d.storage.join("agent/twin.d/uid")).unwrap()).collect();
    assert_ne!(uids[0], uids[1], "two storages never give one uid");
    let ps = |d: &Served| {
        let o = Command::new(tests::bin("ctx"))
            .args(["agent", "ps", "--control"])
            .arg(&d.control)
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter(|l| l.contains(&s))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    for (d, pid) in daemons.iter().zip(&pids) {
        let listed = ps(d);
        assert!(
            listed.len() == 1 && listed[0].starts_with(&format!("twin\t{s}\t{pid}\trunning\t")),
            "each daemon lists its own run: {listed:?}"
        );
    }
    let stop = |d: &Served| {
        Command::new(tests::bin("ctx"))
            .args(["agent", "stop", "twin", "--session", &s, "--control"])
            .arg(&d.control)
            .output()
            .unwrap()
    };
    let o = stop(&daemons[0]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(ps(&daemons[0]).is_empty(), "the first daemon's run stopped");
    assert_eq!(ps(&daemons[1]).len(), 1, "the other daemon's run goes on");
    let o = stop(&daemons[1]);
    assert!(o.status.success(), "{}", text(&o));
}

/// A run whose supervisor was killed (kill -9) leaves its view mounted; the next start of the
/// session takes it down and starts (it was seen refused until `ctx view rm`), and `ctx doctor
/// --fix-runs` removes a killed run's view with its state.
#[test]
fn a_killed_runs_view_never_keeps_its_session_from_starting_again() {
    let w = World::new();
    let mounted = |s: &str| {
        fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .contains(&format!("{} ", w.s.view_dir("coder", s).display()))
    };
    let kill_run = |s: &str| {
        let out = w.start(s, &[], &["/bin/sh", "-c", "sleep 1000"]);
        assert!(out.status.success(), "{}", text(&out));
        let pid: i32 =
            fs::read_to_string(w.s.run_dir("coder", s).join("pid")).unwrap().trim().parse().unwrap();
        rustix::process::kill_process(
            rustix::process::Pid::from_raw(pid).unwrap(),
            rustix::process::Signal::KILL,
        )
        .unwrap();
        let t = Instant::now();
        while Path::new(&format!("/proc/{pid}")).exists() && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(mounted(s), "the killed run's view stays mounted");
    };
    let s = session("killed");
    kill_run(&s);
    let again = w.start(&s, &["--wait"], &["/bin/sh", "-c", "echo again"]);
    assert!(again.status.success(), "the session starts again: {}", text(&again));
    assert!(!mounted(&s), "and its view goes with its end");
    let s = session("killdoc");
    kill_run(&s);
    let o = Command::new(tests::bin("ctx"))
        .args(["doctor", "--fix-runs", "--control"])
        .arg(&w.s.control)
        .output()
        .unwrap();
    assert!(!mounted(&s), "ctx doctor --fix-runs removes the view: {}", text(&o));
    assert!(!w.s.run_dir("coder", &s).exists(), "and the run's state");
}

/// The most threads any one process has named `egress-conn` (a run's proxy connections).
fn most_proxy_threads() -> usize {
    let mut most = 0;
    for p in fs::read_dir("/proc").unwrap().flatten() {
        let Ok(tasks) = fs::read_dir(p.path().join("task")) else { continue };
        let n = tasks
            .flatten()
            .filter(|t| fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == "egress-conn"))
            .count();
        most = most.max(n);
    }
    most
}

/// An agent that opens hundreds of connections to its run's proxy and sends nothing on them
/// (as one did, holding 2,000 and 1,835 root threads) gets 64 (the proxy's
/// `CONNS_MAX`) served at once: the next is answered 503, reported once as `net.refused`, and the
/// supervisor's proxy threads stay bounded while they are held.
#[test]
fn an_agent_holding_many_proxy_connections_gets_a_bounded_share_of_root() {
    let e = tests::elsewhere::Elsewhere::new();
    let probe = "P=${HTTPS_PROXY##*:}; for i in $(seq 300); do exec {f}<>/dev/tcp/127.0.0.1/$P || break; done; \
                 exec {g}<>/dev/tcp/127.0.0.1/$P; echo \"last-$(timeout 5 head -c 12 <&$g)\"; \
                 touch /workspace/held; sleep 6; echo held-$i";
    let ep = tests::model_endpoint::Endpoint::on(e.listen(), probe, "HELD");
    let w = World::new();
    let secrets =
        with_model_at(&w, "openai-responses", &format!("http://{}:{}/v1", e.addr, ep.port), "sk-held");
    let s = session("held");
    let args = ["exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", "hold"];
    let most = std::thread::scope(|sc| {
        let watch = sc.spawn(|| {
            let until = Instant::now() + Duration::from_secs(120);
            while !w.work.join("held").exists() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(100));
            }
            (0..20)
                .map(|_| {
                    std::thread::sleep(Duration::from_millis(100));
                    most_proxy_threads()
                })
                .max()
                .unwrap_or(0)
        });
        let out = run_cli(&w, &s, "codex", &secrets, &args);
        assert!(out.status.success(), "{}", text(&out));
        let said = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(said.contains("HELD") && said.contains("held-300"), "all 300 opened: {}", text(&out));
        assert!(said.contains("last-HTTP/1.1 503"), "past the limit, 503 at once: {said}");
        watch.join().unwrap()
    });
    assert!(w.work.join("held").exists());
    let max = 2 * 64 + 2;
    assert!((1..=max).contains(&most), "{most} proxy threads while 300 connections were held (bound {max})");
    let events =
        fs::read_to_string(w.s.storage.join(format!("home/1000/agent/coder/session/{s}/events.jsonl")))
            .unwrap();
    let refused: Vec<&str> =
        events.lines().filter(|l| l.contains("\"net.refused\"") && l.contains("open at once")).collect();
    assert_eq!(refused.len(), 1, "one report for the burst: {events}");
}

/// The agent's instructions (`system.md`) reach the CLI of its next run: here the model, in
/// the first run, has the agent rewrite them through `agent.update`; the second run's requests
/// carry the new ones.
#[test]
fn an_agent_update_of_system_md_is_what_the_next_runs_cli_is_told() {
    let ep = tests::model_endpoint::Endpoint::start(
        "echo 'Answer like a ship captain.' | tsh agent.update system.md",
        "UPDATED",
    );
    let w = World::new();
    let secrets = with_model(&w, "openai-responses", &ep, "sk-update-key");
    let st = w.s.storage.to_str().unwrap();
    let o = tests::run("ctx", &["agent", "grant", "coder", "tool:agent.update", "execute", "--source", st]);
    assert!(o.status.success(), "{}", text(&o));
    let args = ["exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", "go"];
    let out = run_cli(&w, &session("upd1"), "codex", &secrets, &args);
    assert!(out.status.success(), "{}", text(&out));
    let first = ep.seen().first().unwrap().body.to_string();
    assert!(!first.contains("ship captain"), "{first}");
    assert_eq!(
        fs::read_to_string(w.s.storage.join("agent/coder.d/system.md")).unwrap().trim(),
        "Answer like a ship captain."
    );
    let n = ep.seen().len();
    let out = run_cli(&w, &session("upd2"), "codex", &secrets, &args);
    assert!(out.status.success(), "{}", text(&out));
    let next = ep.seen()[n].body.to_string();
    assert!(next.contains("Answer like a ship captain."), "the next run is told: {next}");
}

/// `tmux ARGS` on the test's own tmux server `sock`.
fn tmux(sock: &Path, args: &[&str]) -> Output {
    Command::new("tmux").arg("-S").arg(sock).args(args).output().unwrap()
}

/// Waits until `f` holds (60 s at most: the CLIs of other tests load the machine meanwhile).
fn until(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(60), "waited in vain for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// [`until`], and on a timeout the pane's screen: what the attached client said.
fn until_on(sock: &Path, what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "waited in vain for {what}; the pane:\n{}",
            screen(sock)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `ctx agent attach` from a terminal (a tmux pane): the agent's PTY takes the pane's size on
/// attach and on resize, typed keys reach it once, Ctrl-] detaches and leaves the run going,
/// and the pane's terminal is as it was.
#[test]
fn attach_is_a_terminal_with_a_size_and_a_detach_key() {
    const PROGRAM: &str = "import os, signal, sys\n\
        def size(*_):\n    c, r = os.get_terminal_size(0)\n    open('/workspace/size', 'w').write('%dx%d' % (c, r))\n\
        signal.signal(signal.SIGWINCH, size)\nsize()\n\
        for line in sys.stdin:\n    open('/workspace/lines', 'a').write('got:' + line)\n";
    let w = World::new();
    let s = session("tmux");
    let out = w.start(&s, &[], &["/usr/bin/python3", "-c", PROGRAM]);
    assert!(out.status.success(), "{}", text(&out));
    let read = |f: &str| fs::read_to_string(w.work.join(f)).unwrap_or_default();
    until("the default size", || read("size") == "80x24");
    let sock = w.s.dir.path().join("tmux.sock");
    let ctx = tests::bin("ctx");
    let script = w.s.dir.path().join("attach.sh");
    fs::write(
        &script,
        format!(
            "stty -g > {dir}/before; {ctx} agent attach coder --session {s} --control {control}; st=$?; stty -g > {dir}/after; \
             echo \"status $st\" > {dir}/status.tmp; mv {dir}/status.tmp {dir}/status; sleep 30\n",
            dir = w.s.dir.path().display(),
            ctx = ctx.display(),
            control = w.s.control.display()
        ),
    )
    .unwrap();
    let o = tmux(&sock, &["-f", "/dev/null", "new-session", "-d", "-s", "t", "-x", "100", "-y", "30"]);
    assert!(o.status.success(), "{}", text(&o));
    tmux(&sock, &["set", "-g", "status", "off"]);
    let o = tmux(&sock, &["respawn-pane", "-k", "-t", "t", &format!("sh {}", script.display())]);
    assert!(o.status.success(), "{}", text(&o));
    until_on(&sock, "the pane's size", || read("size") == "100x30");
    tmux(&sock, &["resize-window", "-t", "t", "-x", "120", "-y", "40"]);
    until_on(&sock, "the new size", || read("size") == "120x40");
    tmux(&sock, &["send-keys", "-t", "t", "hello", "Enter"]);
    until_on(&sock, "the line", || read("lines").contains("got:hello"));
    // Echoed once, by the agent's PTY: the local terminal is raw (a cooked one echoes too).
    let screen =
        String::from_utf8_lossy(&tmux(&sock, &["capture-pane", "-p", "-t", "t"]).stdout).into_owned();
    assert_eq!(screen.matches("hello").count(), 1, "{screen}");
    tmux(&sock, &["send-keys", "-t", "t", "C-]"]);
    let dir = w.s.dir.path().to_path_buf();
    until_on(&sock, "the client to leave", || dir.join("status").exists());
    assert_eq!(fs::read_to_string(dir.join("status")).unwrap(), "status 0\n");
    assert_eq!(read("lines"), "got:hello\n", "typed once");
    assert_eq!(
        fs::read_to_string(dir.join("before")).unwrap(),
        fs::read_to_string(dir.join("after")).unwrap(),
        "the local terminal is restored"
    );
    let ps = Command::new(&ctx).args(["agent", "ps", "--control"]).arg(&w.s.control).output().unwrap();
    assert!(String::from_utf8_lossy(&ps.stdout).contains(&s), "the run keeps going: {}", text(&ps));
    tmux(&sock, &["kill-server"]);
    let o = Command::new(&ctx)
        .args(["agent", "stop", "coder", "--session", &s, "--control"])
        .arg(&w.s.control)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
}

/// The widest line of a tmux pane, in characters.
fn widest(sock: &Path) -> usize {
    let screen = String::from_utf8_lossy(&tmux(sock, &["capture-pane", "-p", "-t", "t"]).stdout).into_owned();
    screen.lines().map(|l| l.trim_end().chars().count()).max().unwrap_or(0)
}

fn screen(sock: &Path) -> String {
    String::from_utf8_lossy(&tmux(sock, &["capture-pane", "-p", "-t", "t"]).stdout).into_owned()
}

/// A hosted CLI's interactive screen, attached from a tmux pane of 100x30: it renders at that
/// size, follows a resize to 120x36, gets a typed prompt once (the model sees it), and keeps
/// running after Ctrl-] detaches. `ready` is text of its prompt screen; `before` keys answer
/// what the CLI asks first.
fn interactive(profile: &str, api: &str, ready: &str, before: &[(&str, &str)]) {
    let ep = tests::model_endpoint::Endpoint::start("true", "OK");
    let w = World::new();
    let secrets = with_model(&w, api, &ep, "sk-interactive-key");
    let s = session(&format!("i{profile}"));
    let out = w.command(&s, &["--profile", profile]).env("CTX_SECRETS", &secrets).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let sock = w.s.dir.path().join("tmux.sock");
    let ctx = tests::bin("ctx");
    let o = tmux(&sock, &["-f", "/dev/null", "new-session", "-d", "-s", "t", "-x", "100", "-y", "30"]);
    assert!(o.status.success(), "{}", text(&o));
    tmux(&sock, &["set", "-g", "status", "off"]);
    let attach = format!(
        "{} agent attach coder --session {s} --control {}; sleep 60",
        ctx.display(),
        w.s.control.display()
    );
    tmux(&sock, &["respawn-pane", "-k", "-t", "t", &attach]);
    for (wait_for, keys) in before {
        until(&format!("{profile}: {wait_for}"), || screen(&sock).contains(wait_for));
        // Shown is not yet listening: give the CLI a moment to take keys.
        std::thread::sleep(Duration::from_millis(1500));
        for k in keys.split(' ') {
            tmux(&sock, &["send-keys", "-t", "t", k]);
            std::thread::sleep(Duration::from_millis(300));
        }
    }
    let t = Instant::now();
    while !screen(&sock).contains(ready) {
        assert!(t.elapsed() < Duration::from_secs(20), "{profile}'s prompt:\n{}", screen(&sock));
        std::thread::sleep(Duration::from_millis(50));
    }
    until(&format!("{profile} at 100 columns"), || (91..=100).contains(&widest(&sock)));
    tmux(&sock, &["resize-window", "-t", "t", "-x", "120", "-y", "36"]);
    until(&format!("{profile} at 120 columns"), || (111..=120).contains(&widest(&sock)));
    std::thread::sleep(Duration::from_millis(1500));
    tmux(&sock, &["send-keys", "-t", "t", "-l", "hello there"]);
    std::thread::sleep(Duration::from_millis(500));
    tmux(&sock, &["send-keys", "-t", "t", "Enter"]);
    let asked = || ep.seen().iter().filter(|r| r.body.to_string().contains("hello there")).count();
    until(&format!("{profile}'s request"), || asked() > 0);
    for r in ep.seen().iter().filter(|r| r.body.to_string().contains("hello")) {
        assert_eq!(r.body.to_string().matches("hello").count(), 1, "typed once: {}", r.body);
    }
    tmux(&sock, &["send-keys", "-t", "t", "C-]"]);
    until("the client to leave", || screen(&sock).contains("detached"));
    let ps = Command::new(&ctx).args(["agent", "ps", "--control"]).arg(&w.s.control).output().unwrap();
    assert!(String::from_utf8_lossy(&ps.stdout).contains(&s), "{profile} keeps running: {}", text(&ps));
    tmux(&sock, &["kill-server"]);
    let _ = Command::new(&ctx)
        .args(["agent", "stop", "coder", "--session", &s, "--control"])
        .arg(&w.s.control)
        .output();
}

#[test]
fn interactive_codex_and_claude_code_are_usable_attached_from_a_terminal() {
    interactive("codex", "openai-responses", "Ask Codex to do anything", &[]);
    interactive("claude", "anthropic-messages", "API Usage Billing", &[("trust this folder", "Down Enter")]);
}

/// Root's walk through a run's session directory crosses no mount: with a filesystem mounted
/// on the session's `context/` (on the host mount, where the launcher works), a start is
/// refused and the mounted filesystem's root keeps its owner and mode.
#[test]
fn a_mount_in_a_session_is_never_crossed_by_the_launcher() {
    use std::os::unix::fs::MetadataExt;
    let w = World::new();
    let s = session("xdev");
    let out = w.start(&s, &["--wait"], &["/bin/true"]);
    assert!(out.status.success(), "{}", text(&out));
    let context = w.s.mnt.join(format!("home/1000/agent/coder/session/{s}/context"));
    assert!(context.is_dir());
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m,mode=0755", "cfs-xdev"])
        .arg(&context)
        .status()
        .unwrap();
    assert!(mounted.success());
    let who = || fs::metadata(&context).map(|m| (m.uid(), m.gid(), m.mode())).unwrap();
    let before = who();
    let out = w.start(&s, &["--wait"], &["/bin/true"]);
    let after = who();
    let names: Vec<_> = fs::read_dir(&context).unwrap().flatten().map(|e| e.file_name()).collect();
    let _ = Command::new("umount").arg(&context).status();
    assert!(!out.status.success(), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("context"), "{}", text(&out));
    assert_eq!(after, before, "the mount's root keeps its owner, group and mode");
    assert!(names.is_empty(), "nothing was made in it: {names:?}");
}

/// The `run.end` events of session `s` of coder, and its `state`.
fn ends_of(w: &World, s: &str) -> (Vec<serde_json::Value>, String) {
    let dir = w.s.storage.join(format!("home/1000/agent/coder/session/{s}"));
    let events = fs::read_to_string(dir.join("events.jsonl")).unwrap_or_default();
    let ends = events
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["type"] == "run.end")
        .collect();
    (ends, fs::read_to_string(dir.join("state")).unwrap_or_default())
}

/// Every run ends with one `run.end` event: an operator's stop says `stopped`, who stopped it,
/// the exit code and how long it ran, and leaves the session `stopped`; a run that ends by
/// itself says `done`. `ctx agent rm` refuses an agent while it runs; `--force --yes` stops it
/// first.
#[test]
fn a_stopped_run_says_who_stopped_it_and_a_running_agent_is_not_removed() {
    let w = World::new();
    let st = w.s.storage.to_str().unwrap().to_owned();
    let rm = |extra: &[&str]| {
        Command::new(tests::bin("ctx"))
            .args(["agent", "rm", "coder", "--source", &st, "--control"])
            .arg(&w.s.control)
            .args(extra)
            .output()
            .unwrap()
    };
    let s = session("end");
    let out = w.start(&s, &[], &["/bin/sleep", "600"]);
    assert!(out.status.success(), "{}", text(&out));
    let o = rm(&["--yes"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("is running") && text(&o).contains(&s), "{}", text(&o));
    assert!(w.s.storage.join("agent/coder").exists(), "a running agent is kept");
    let o = w.stop(&s);
    assert!(o.status.success(), "{}", text(&o));
    let (ends, state) = ends_of(&w, &s);
    assert_eq!(state, "stopped\n");
    assert_eq!(ends.len(), 1, "{ends:?}");
    assert_eq!(ends[0]["status"], "stopped");
    assert!(ends[0]["stopped_by"].as_str().is_some_and(|b| b.contains("operator")), "{}", ends[0]);
    assert!(
        ends[0]["code"].is_i64() && ends[0]["duration_ms"].as_f64().is_some_and(|d| d > 0.0),
        "{}",
        ends[0]
    );

    let s2 = session("end2");
    let out = w.start(&s2, &["--wait"], &["/bin/true"]);
    assert!(out.status.success(), "{}", text(&out));
    let (ends, state) = ends_of(&w, &s2);
    assert_eq!(state, "done\n");
    assert_eq!(ends.len(), 1, "{ends:?}");
    assert_eq!(
        (&ends[0]["status"], &ends[0]["code"], &ends[0]["stopped_by"]),
        (&"done".into(), &0.into(), &serde_json::Value::Null)
    );

    // Ended runs are listed with --all; stop --all stops every running one, in parallel.
    let ctx = |args: &[&str]| {
        Command::new(tests::bin("ctx")).args(args).arg("--control").arg(&w.s.control).output().unwrap()
    };
    let (a, b) = (session("end4"), session("end5"));
    // One makes a tool call, then waits; the other only waits.
    let out = w.start(&a, &[], &["/bin/sh", "-c", "/ctx/bin/tsh fs.stat a.txt > /dev/null; exec sleep 600"]);
    assert!(out.status.success(), "{}", text(&out));
    let out = w.start(&b, &[], &["/bin/sleep", "600"]);
    assert!(out.status.success(), "{}", text(&out));
    let row = |ps: &str| ps.lines().find(|l| l.starts_with(&format!("coder\t{a}\t"))).map(str::to_owned);
    let t = Instant::now();
    let mut ps = String::new();
    while t.elapsed() < Duration::from_secs(30) {
        ps = String::from_utf8_lossy(&ctx(&["agent", "ps"]).stdout).into_owned();
        if row(&ps).is_some_and(|l| l.split('\t').nth(11) == Some("1")) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        ps.starts_with(
            "AGENT\tSESSION\tPID\tSTATE\tSINCE\tUPTIME\tPROFILE\tMODEL\tCPU\tMEM\tPIDS\tTOOLS\tLAST\n"
        ),
        "{ps}"
    );
    // Each running run with its uptime, what its groups say it uses (the ceilings a run gets by
    // default: memory and processes; CPU time only under a CPU ceiling), its tool calls and its
    // session's last event.
    let line = row(&ps).unwrap();
    let f: Vec<&str> = line.split('\t').collect();
    assert_eq!(f.len(), 13, "{line}");
    assert!(f[5].ends_with('s') && f[4] != "-", "{line}");
    assert!(f[9].ends_with("MiB") && f[10].parse::<u32>().is_ok_and(|n| n >= 1), "{line}");
    assert_eq!(f[11], "1", "one tool call: {line}");
    assert!(f[12].starts_with("tool.call,") && f[12].ends_with('s'), "{line}");
    let js: serde_json::Value = serde_json::from_slice(&ctx(&["agent", "ps", "--json"]).stdout).unwrap();
    let run = js.as_array().unwrap().iter().find(|r| r["session"] == a.as_str()).unwrap();
    assert!(run["memory_bytes"].as_u64().is_some_and(|b| b > 0) && run["uptime_s"].is_u64(), "{run}");
    assert_eq!(
        (run["tool_calls"].as_u64(), run["last_event"].as_str()),
        (Some(1), Some("tool.call")),
        "{run}"
    );
    assert!(!ps.contains(&s2) && ps.contains(&format!("coder\t{a}\t")), "{ps}");
    let all = String::from_utf8_lossy(&ctx(&["agent", "ps", "--all"]).stdout).into_owned();
    assert!(all.lines().any(|l| l.starts_with(&format!("coder\t{s2}\t-\texited 0\t"))), "{all}");
    let o = ctx(&["agent", "stop", "--all", "coder"]);
    assert!(o.status.success(), "{}", text(&o));
    for s in [&a, &b] {
        assert!(text(&o).contains(&format!("stopped agent coder session {s} ")), "{}", text(&o));
        assert_eq!(ends_of(&w, s).1, "stopped\n");
    }
    assert!(!String::from_utf8_lossy(&ctx(&["agent", "ps"]).stdout).contains("coder\t"));

    let s3 = session("end3");
    let out = w.start(&s3, &[], &["/bin/sleep", "600"]);
    assert!(out.status.success(), "{}", text(&out));
    let o = rm(&["--force", "--yes"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains(&format!("stopped agent coder session {s3}")), "{}", text(&o));
    assert!(!w.s.storage.join("agent/coder").exists(), "removed once stopped");
    assert_eq!(ends_of(&w, &s3).1, "stopped\n");
}

/// The processes whose command line names `s` (a session's unique name): a launcher, a
/// supervisor, a sandbox of its run.
fn processes_naming(s: &str) -> Vec<(i32, String)> {
    let mut found = Vec::new();
    for e in fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
        let cmd = fs::read(e.path().join("cmdline")).unwrap_or_default();
        let line = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if line.contains(s) {
            found.push((pid, line));
        }
    }
    found
}

/// A cancelled agent-socket turn ran on for good when its `ctx agent start` was terminated
/// between starting the supervisor and recording its pid: nothing could find the run to stop
/// it. Whenever the launcher is terminated, what runs of the run has a supervisor on record
/// (its pid in the run directory), and a stop ends all of it.
#[test]
fn a_launcher_terminated_at_any_moment_leaves_no_run_that_cannot_be_stopped() {
    let w = World::new();
    let mut hit = 0;
    for i in 0..24u64 {
        let s = session(&format!("term{i}"));
        let run = w.s.run_dir("coder", &s);
        let mut cmd = w.command(&s, &["--headless"]);
        cmd.args(["/bin/sh", "-c", "sleep 1000"]).stdout(std::process::Stdio::null());
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let mut child = cmd.spawn().unwrap();
        // The contract is written just before the supervisor starts: terminate the launcher
        // then, a little later each time.
        let t = Instant::now();
        while !run.join("contract.json").exists() && t.elapsed() < Duration::from_secs(30) {
            std::hint::spin_loop();
        }
        let until = Instant::now() + Duration::from_micros(i * 150);
        while Instant::now() < until {
            std::hint::spin_loop();
        }
        let pg = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
        let _ = rustix::process::kill_process_group(pg, rustix::process::Signal::TERM);
        let _ = child.wait();
        let log = || fs::read_to_string(run.join("log")).unwrap_or_default();
        // Whatever of the run goes on has its supervisor on record (a child of the launcher
        // not yet the supervisor it is becoming still carries the launcher's command line).
        let t = Instant::now();
        loop {
            let left = processes_naming(&s);
            let recorded: Option<i32> =
                fs::read_to_string(run.join("pid")).ok().and_then(|p| p.trim().parse().ok());
            let on_record = recorded
                .is_some_and(|p| left.iter().any(|(pid, line)| *pid == p && line.contains(" supervise ")));
            if left.is_empty() || on_record {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "round {i}: {left:?} run, the run directory names {recorded:?}\n{}",
                log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        if !processes_naming(&s).is_empty() {
            hit += 1;
            let o = w.stop(&s);
            assert!(o.status.success(), "round {i}: {}\n{}", text(&o), log());
        }
        let t = Instant::now();
        while !processes_naming(&s).is_empty() {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "round {i}: {:?} did not stop\n{}",
                processes_naming(&s),
                log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    eprintln!("{hit} of 24 rounds left a run going");
}

/// A finished terminal's output was gone with the run: the terminal keeps it in its session
/// (its last MiB at most), `ctx agent logs` shows it after the run ended, and `--follow`
/// follows a run under way until it ends.
#[test]
fn agent_logs_shows_a_runs_last_output_after_it_ended_and_follows_one_under_way() {
    let w = World::new();
    let logs = |s: &str, follow: bool| {
        let mut c = Command::new(tests::bin("ctx"));
        c.args(["agent", "logs", "coder", "--session", s, "--ctx"]).arg(&w.s.mnt);
        if follow {
            c.arg("--follow");
        }
        c
    };
    // More than is kept (about 1.5 MB of numbered lines), then a last line.
    let s = session("logs");
    let o = w.start(
        &s,
        &["--wait", "--tty"],
        &["/bin/sh", "-c", "i=0; while [ $i -lt 100000 ]; do echo out-$i; i=$((i+1)); done; echo LAST-LINE"],
    );
    assert!(o.status.success(), "{}", text(&o));
    let o = logs(&s, false).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.trim_end().ends_with("LAST-LINE"),
        "the last output is shown: {:?}",
        &out[out.len().saturating_sub(200)..]
    );
    assert!(o.stdout.len() as u64 <= 1 << 20, "at most a MiB is kept: {}", o.stdout.len());
    assert!(o.stdout.len() as u64 >= 1 << 19, "at least half a MiB is kept: {}", o.stdout.len());
    assert!(!out.contains("\nout-1\r\n") && !out.starts_with("out-0"), "the oldest output is not kept");
    // A session that is not there: said so, exit 2; one whose runs had no terminal: exit 1.
    let o = logs(&session("never"), false).output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("has no session"), "{}", text(&o));
    let quiet = session("quiet");
    assert!(w.start(&quiet, &["--headless"], &["/bin/true"]).status.success());
    let o = logs(&quiet, false).output().unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no terminal output kept"), "{}", text(&o));
    // Following a run under way: its output as it comes, and the end of the run ends it.
    let s = session("follow");
    let o = w.start(
        &s,
        &[],
        &[
            "/bin/sh",
            "-c",
            "echo first-tick; while [ ! -e /workspace/go ]; do sleep 0.1; done; echo second-tick",
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    let mut f = logs(&s, true).stdout(std::process::Stdio::piped()).spawn().unwrap();
    // A follower that does not end is killed after two minutes (while it is still ours).
    let (pid, ended) = (f.id(), std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)));
    let e2 = std::sync::Arc::clone(&ended);
    let guard = std::thread::spawn(move || {
        let t = Instant::now();
        while !e2.load(std::sync::atomic::Ordering::SeqCst) {
            if t.elapsed() > Duration::from_secs(120) {
                let _ = rustix::process::kill_process(
                    rustix::process::Pid::from_raw(pid as i32).unwrap(),
                    rustix::process::Signal::KILL,
                );
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    let mut r = std::io::BufReader::new(f.stdout.take().unwrap());
    let mut seen = String::new();
    while !seen.contains("first-tick") {
        let mut l = String::new();
        assert!(std::io::BufRead::read_line(&mut r, &mut l).unwrap() > 0, "ended early: {seen:?}");
        seen.push_str(&l);
    }
    fs::write(w.work.join("go"), "").unwrap();
    r.read_to_string(&mut seen).unwrap();
    let st = f.wait().unwrap();
    ended.store(true, std::sync::atomic::Ordering::SeqCst);
    guard.join().unwrap();
    assert!(st.success(), "{st:?}: {seen}");
    assert!(seen.contains("second-tick"), "what came after is followed: {seen:?}");
}

/// `tail -f /ctx/agent/coder.d/log` stayed silent while coder worked: every run of an agent
/// writes its start and its end to the agent's log, and a start refused before it ran says so
/// there too, whichever session it was on.
#[test]
fn every_run_of_an_agent_writes_its_start_end_and_refusals_to_the_agents_log() {
    let w = World::new();
    let s = session("olog");
    let o = w.start(&s, &["--wait"], &["/bin/sh", "-c", "exit 3"]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    // A start refused: the session is running already.
    let refused = session("orefused");
    let o = w.start(&refused, &[], &["/bin/sh", "-c", "sleep 1000"]);
    assert!(o.status.success(), "{}", text(&o));
    let o = w.start(&refused, &[], &["/bin/true"]);
    assert!(!o.status.success(), "a second start of a running session is refused: {}", text(&o));
    let o = w.stop(&refused);
    assert!(o.status.success(), "{}", text(&o));
    let log = fs::read_to_string(w.s.mnt.join("agent/coder.d/log")).unwrap();
    let lines: Vec<serde_json::Value> =
        log.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}"))).collect();
    let of = |s: &str, kind: &str| lines.iter().filter(|v| v["session"] == s && v["type"] == kind).count();
    assert_eq!((of(&s, "run.start"), of(&s, "run.end")), (1, 1), "{log}");
    let end = lines.iter().find(|v| v["session"] == s.as_str() && v["type"] == "run.end").unwrap();
    assert_eq!((end["status"].as_str(), end["code"].as_i64()), (Some("error"), Some(3)), "{end}");
    assert_eq!(of(&refused, "run.refused"), 1, "{log}");
    let why = lines.iter().find(|v| v["session"] == refused.as_str() && v["type"] == "run.refused").unwrap();
    assert!(
        why["reason"].as_str().is_some_and(|r| !r.is_empty()) && why["code"].as_i64() != Some(0),
        "{why}"
    );
    // The run that went: started, then stopped by the operator.
    assert_eq!(of(&refused, "run.start"), 1, "{log}");
    let end = lines.iter().find(|v| v["session"] == refused.as_str() && v["type"] == "run.end").unwrap();
    assert_eq!(end["status"], "stopped", "{end}");
}

/// Asynchronous tool calls in a real sandbox: `tsh submit` returns while the tool runs, the
/// result lands in the session's outbox (`async/done/`, result first), `tsh collect` reads it
/// with the tool's output and status, and the facts are in `events.jsonl`.
#[test]
fn a_long_shell_exec_is_submitted_and_collected_with_its_facts() {
    let w = World::new();
    w.grant_tool("shell.exec");
    let s = session("async");
    // The tool waits for a file only the script makes after its first collect: no timing.
    let script = "cd /workspace; \
         id=$(/ctx/bin/tsh submit shell.exec /bin/sh -c 'while [ ! -e /workspace/go ]; do sleep 0.05; done; echo late-answer; echo to-stderr >&2; exit 3'); \
         echo \"$id\" > id; \
         /ctx/bin/tsh collect \"$id\" > early 2> early.err; echo $? > early.rc; \
         /ctx/bin/tsh jobs > jobs.running; \
         touch go; \
         /ctx/bin/tsh collect --wait \"$id\" > late 2> late.err; echo $? > late.rc; \
         /ctx/bin/tsh jobs > jobs.done; \
         /ctx/bin/tsh submit fs.write x 2> denied.err; echo $? > denied.rc; \
         dead=$(/ctx/bin/tsh submit shell.exec /bin/sh -c 'read -r _ _ _ gp _ < /proc/$PPID/stat; kill -9 $gp'); \
         /ctx/bin/tsh collect --wait \"$dead\" 2> dead.err; echo $? > dead.rc";
    let out = w.start(&s, &["--wait"], &["/bin/sh", "-c", script]);
    assert!(out.status.success(), "{}", text(&out));
    let read = |f: &str| fs::read_to_string(w.work.join(f)).unwrap_or_default();
    let id = read("id").trim().to_owned();
    assert!(id.starts_with('a'), "submit prints the id: {id:?} {}", text(&out));
    assert_eq!(read("early.rc"), "69\n", "not finished yet: {}", read("early.err"));
    assert!(read("jobs.running").contains(&format!("{id}\trunning\tshell.exec")), "{}", read("jobs.running"));
    assert_eq!(read("late"), "late-answer\n", "the tool's output: {}", read("late.err"));
    assert_eq!(read("late.err"), "to-stderr\n");
    assert_eq!(read("late.rc"), "3\n", "the tool's exit status");
    assert!(read("jobs.done").contains(&format!("{id}\tfailed\tshell.exec")), "{}", read("jobs.done"));
    assert_eq!(read("denied.rc"), "13\n", "a submission is checked as a run: {}", read("denied.err"));
    // A worker killed while its tool ran: its lease is no longer locked, and collect files the
    // job as failed instead of waiting for good.
    assert_eq!(read("dead.rc"), "1\n", "{}", read("dead.err"));
    assert!(read("dead.err").contains("recovered after its lease expired"), "{}", read("dead.err"));
    // The outbox: the request and its result beside it, nothing left claimed.
    let dir = w.s.storage.join(format!("home/1000/agent/coder/session/{s}/async"));
    let result: serde_json::Value =
        serde_json::from_slice(&fs::read(dir.join(format!("failed/{id}.req.json.result"))).unwrap()).unwrap();
    assert_eq!(
        (result["exit"].as_i64(), result["stdout"].as_str()),
        (Some(3), Some("late-answer\n")),
        "{result}"
    );
    assert!(dir.join(format!("failed/{id}.req.json")).is_file());
    assert_eq!(fs::read_dir(dir.join("claimed")).unwrap().count(), 0);
    // The facts: submitted, run (with its id), collected.
    let events =
        fs::read_to_string(w.s.storage.join(format!("home/1000/agent/coder/session/{s}/events.jsonl")))
            .unwrap();
    let facts: Vec<serde_json::Value> = events
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|e| e["async"] == id.as_str())
        .collect();
    let kinds: Vec<&str> = facts.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["tool.submit", "tool.call", "tool.collect"], "{events}");
    assert_eq!((facts[1]["object"].as_str(), facts[1]["exit"].as_i64()), (Some("tool/shell.exec"), Some(3)));
    assert!(
        events.contains("\"tool.call\"") && events.contains("\"denied\""),
        "the refusal is recorded: {events}"
    );
    let log = fs::read_to_string(w.s.storage.join("tool/shell.exec.d/log")).unwrap_or_default();
    assert!(log.contains(&format!("\"async\":\"{id}\"")), "the tool's log: {log}");
}

/// An HTTP/1.1 GET of `url` (`http://127.0.0.1:PORT/...`): the status line and the whole answer.
fn http_get(url: &str) -> String {
    let rest = url.strip_prefix("http://").expect("an http URL");
    let (authority, target) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let mut c = std::net::TcpStream::connect(authority).unwrap();
    write!(c, "GET {target} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n").unwrap();
    let mut answer = String::new();
    c.read_to_string(&mut answer).unwrap();
    answer
}

/// `ctx model login`: Authorization Code + PKCE against a provider the test starts; the tokens
/// are kept in root's secret store only, and a run refreshes an expired access token before
/// the real CLI uses it.
#[test]
fn oauth_login_keeps_tokens_in_the_store_and_a_run_refreshes_them() {
    use std::io::BufRead;
    // Every access token it gives has expired at once: each run refreshes.
    let provider = tests::oauth_endpoint::Provider::start(0);
    let ep = tests::model_endpoint::Endpoint::start("tsh fs.stat /workspace/a.txt", "CHECKED");
    let w = World::new();
    let st = w.s.storage.to_str().unwrap().to_owned();
    let secrets = w.s.dir.path().join("secrets");
    let ctx = |args: &[&str]| {
        let o = Command::new(tests::bin("ctx")).args(args).env("CTX_SECRETS", &secrets).output().unwrap();
        assert!(o.status.success(), "{args:?}: {}", text(&o));
        o
    };
    let (base, auth) = (format!("http://127.0.0.1:{}/v1", ep.port), provider.base());
    ctx(&[
        "model",
        "add",
        "local/m1",
        "--api",
        "openai-responses",
        "--base-url",
        &base,
        "--id",
        "m-1",
        "--oauth-authorize",
        &format!("{auth}/authorize"),
        "--oauth-token",
        &format!("{auth}/token"),
        "--oauth-client-id",
        "cortexfs-test",
        "--source",
        &st,
    ]);
    ctx(&["model", "alias", "main", "local/m1", "--source", &st]);
    ctx(&["agent", "grant", "coder", "model:main", "use", "--source", &st]);
    let codex = ["exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", "stat a.txt"];
    // Not signed in: refused before anything runs, saying how to sign in.
    let out = run_cli(&w, &session("oa0"), "codex", &secrets, &codex);
    assert_eq!(out.status.code(), Some(69), "{}", text(&out));
    assert!(text(&out).contains("ctx model login local"), "{}", text(&out));
    // The sign-in: the test is the person's browser.
    let mut login = Command::new(tests::bin("ctx"))
        .args(["model", "login", "local", "--timeout", "60", "--source", &st])
        .env("CTX_SECRETS", &secrets)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = std::io::BufReader::new(login.stderr.take().unwrap());
    let url = loop {
        let mut l = String::new();
        assert!(err.read_line(&mut l).unwrap() > 0, "ctx model login printed no address");
        if l.starts_with("http://") {
            break l.trim().to_owned();
        }
    };
    assert!(url.contains("code_challenge_method=S256") && url.contains("client_id=cortexfs-test"), "{url}");
    let approved = http_get(&url);
    let to = approved
        .lines()
        .find_map(|l| l.strip_prefix("Location: "))
        .unwrap_or_else(|| panic!("no redirect: {approved}"))
        .trim()
        .to_owned();
    assert!(to.starts_with("http://127.0.0.1:") && to.contains("/callback?code="), "{to}");
    let back = http_get(&to);
    assert!(back.starts_with("HTTP/1.1 200") && back.contains("signed in"), "{back}");
    let done = login.wait_with_output().unwrap();
    assert!(done.status.success(), "{}", text(&done));
    assert!(String::from_utf8_lossy(&done.stdout).contains("signed in to local"), "{}", text(&done));
    let grants = provider.grants();
    assert_eq!(grants.len(), 1, "{grants:?}");
    assert_eq!((grants[0].form["grant_type"].as_str(), grants[0].status), ("authorization_code", 200));
    assert_eq!(grants[0].form["code_verifier"].len(), 43, "a PKCE verifier of 32 random bytes");
    let kept = |account: &str| fs::read_to_string(secrets.join("cortexfs:local").join(account)).unwrap();
    let (first_access, first_refresh) = (kept("oauth:access"), kept("oauth:refresh"));
    let mode = fs::metadata(secrets.join("cortexfs:local/oauth:access")).unwrap().permissions();
    assert_eq!(std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777, 0o600);
    // A run: the access token has expired, so it is refreshed first and the CLI gets the new one.
    let out = run_cli(&w, &session("oa1"), "codex", &secrets, &codex);
    assert!(out.status.success(), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("CHECKED"), "{}", text(&out));
    let grants = provider.grants();
    assert_eq!(grants.len(), 2, "{grants:?}");
    assert_eq!(grants[1].form["grant_type"], "refresh_token");
    assert_eq!(grants[1].form["refresh_token"], first_refresh, "the kept refresh token");
    let access = kept("oauth:access");
    assert_ne!(access, first_access, "a new access token is kept");
    let seen = ep.seen();
    assert!(!seen.is_empty() && seen.iter().all(|r| r.key.as_deref() == Some(access.as_str())), "{seen:?}");
    // The tokens are nowhere in the storage.
    let found = Command::new("grep").args(["-rl", &access, &st]).output().unwrap();
    assert!(found.stdout.is_empty(), "{}", String::from_utf8_lossy(&found.stdout));
}

/// A disk ceiling per agent (`limits`: `disk`, `files`), counted by the daemon: an agent over
/// it gets EDQUOT in its home, a removal gives room back, and another agent and the host write
/// on. (Every write here is a few MiB: nothing fills the host's disk if the ceiling failed.)
#[test]
fn an_agent_over_its_disk_ceiling_gets_edquot_and_nobody_else_does() {
    // On a disk of the test's own: were the ceiling not kept, the agent fills that one.
    let w = World::on_own_disk("2g");
    fs::write(w.s.storage.join("agent/coder.d/limits"), "disk=1M\nfiles=40\n").unwrap();
    let script = "h=/ctx/home/1000; \
         dd if=/dev/zero of=$h/big bs=64k count=32 2> /workspace/dd.err; echo $? > /workspace/dd.rc; \
         stat -c %s $h/big > /workspace/size; \
         i=0; while [ $i -lt 60 ]; do mkdir $h/d$i 2> /workspace/mk.err || break; i=$((i+1)); done; echo $i > /workspace/made; \
         rm $h/big; rmdir $h/d0; \
         dd if=/dev/zero of=$h/again bs=64k count=8 2> /workspace/again.err; echo $? > /workspace/again.rc; \
         mkdir $h/after 2> /workspace/after.err; echo $? > /workspace/after.rc";
    let out = w.start(&session("dq"), &["--wait"], &["/bin/sh", "-c", script]);
    assert!(out.status.success(), "{}", text(&out));
    let read = |f: &str| fs::read_to_string(w.work.join(f)).unwrap_or_default();
    assert_ne!(read("dd.rc"), "0\n", "2 MiB past a 1 MiB ceiling: {}", read("dd.err"));
    assert!(read("dd.err").contains("Disk quota exceeded"), "{}", read("dd.err"));
    let size: u64 = read("size").trim().parse().unwrap();
    assert!(size > 0 && size <= 1 << 20, "the file stopped at the ceiling: {size}");
    let made: u32 = read("made").trim().parse().unwrap();
    assert!(made > 0 && made < 60, "mkdir stopped at the files ceiling: {made}");
    assert!(read("mk.err").contains("Disk quota exceeded"), "{}", read("mk.err"));
    assert_eq!(read("again.rc"), "0\n", "a removal gives room back: {}", read("again.err"));
    assert_eq!(read("after.rc"), "0\n", "and a file back: {}", read("after.err"));
    // The host writes on in the agent's home, and another agent (no ceiling) in its own.
    fs::write(w.s.mnt.join("home/1000/host-file"), vec![0u8; 2 << 20]).unwrap();
    let out = Command::new(tests::bin("ctx"))
        .args(["agent", "start", "outsider", "--session", &session("dq2"), "--wait", "--ctx"])
        .arg(&w.s.mnt)
        .arg("--control")
        .arg(&w.s.control)
        .args(["--", "/bin/sh", "-c", "dd if=/dev/zero of=/ctx/home/2000/big bs=64k count=32 2>&1"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(fs::metadata(w.s.storage.join("home/2000/big")).unwrap().len(), 2 << 20);
}

/// `ctx top` in a terminal (a tmux pane): every running agent of a 20-agent fleet, each a real
/// sandbox idle in tsh; the one that makes a tool call comes first with its count and event;
/// one that stops leaves the screen; `q` quits and leaves the terminal as it was.
#[test]
fn ctx_top_shows_the_running_fleet_by_activity_and_follows_a_stop() {
    let w = World::new();
    let (st, ctx) = (w.s.storage.to_str().unwrap().to_owned(), tests::bin("ctx"));
    let s = session("top");
    let mut fleet = vec!["coder".to_owned()];
    for i in 1..20 {
        let name = format!("fleet{i:02}");
        let uid = (3000 + i).to_string();
        let o = Command::new(&ctx)
            .args(["agent", "new", &name, "--uid", &uid, "--gid", &uid, "--source", &st])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o));
        fleet.push(name);
    }
    let start = |name: &str| {
        let mut c = Command::new(&ctx);
        c.args(["agent", "start", name, "--session", &s, "--ctx"])
            .arg(&w.s.mnt)
            .arg("--control")
            .arg(&w.s.control);
        if name == "coder" {
            c.arg("--cwd").arg(&w.work);
        } else {
            c.arg("--no-default-workspace");
        }
        let o = c.output().unwrap();
        assert!(o.status.success(), "{name}: {}", text(&o));
    };
    fleet.iter().for_each(|a| start(a));
    let sock = w.s.dir.path().join("top.sock");
    let o = tmux(&sock, &["-f", "/dev/null", "new-session", "-d", "-s", "t", "-x", "140", "-y", "40"]);
    assert!(o.status.success(), "{}", text(&o));
    tmux(&sock, &["set", "-g", "status", "off"]);
    let dir = w.s.dir.path().to_path_buf();
    let script = dir.join("top.sh");
    fs::write(
        &script,
        format!(
            "stty -g > {d}/before; {ctx} top --interval 200 --control {c}; st=$?; stty -g > {d}/after; \
             echo \"status $st\" > {d}/status.tmp; mv {d}/status.tmp {d}/status; sleep 30\n",
            d = dir.display(),
            ctx = ctx.display(),
            c = w.s.control.display()
        ),
    )
    .unwrap();
    tmux(&sock, &["respawn-pane", "-k", "-t", "t", &format!("sh {}", script.display())]);
    let shown = |name: &str| screen(&sock).lines().any(|l| l.split_whitespace().next() == Some(name));
    until_on(&sock, "every running agent", || fleet.iter().all(|a| shown(a)));
    assert!(screen(&sock).contains("20 running"), "{}", screen(&sock));
    // coder makes a tool call: it comes first, with its count and its event.
    let sent = Command::new(&ctx)
        .args(["agent", "send", "coder", "--session", &s, "fs.stat /workspace/a.txt", "--control"])
        .arg(&w.s.control)
        .output()
        .unwrap();
    assert!(sent.status.success(), "{}", text(&sent));
    let first = || {
        let sc = screen(&sock);
        sc.lines().nth(2).map(str::to_owned).unwrap_or_default()
    };
    until_on(&sock, "coder first, with its tool call", || {
        let l = first();
        l.starts_with("coder") && l.contains("tool.call") && l.split_whitespace().any(|w| w == "1")
    });
    // fleet07 stops: it leaves the screen.
    let o = Command::new(&ctx)
        .args(["agent", "stop", "fleet07", "--session", &s, "--control"])
        .arg(&w.s.control)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    until_on(&sock, "fleet07 gone", || !shown("fleet07") && screen(&sock).contains("19 running"));
    tmux(&sock, &["send-keys", "-t", "t", "q"]);
    until_on(&sock, "top to quit", || dir.join("status").exists());
    assert_eq!(fs::read_to_string(dir.join("status")).unwrap(), "status 0\n");
    assert_eq!(
        fs::read_to_string(dir.join("before")).unwrap(),
        fs::read_to_string(dir.join("after")).unwrap()
    );
    tmux(&sock, &["kill-server"]);
    // Without a terminal it says to use --once, which prints the table.
    let o = Command::new(&ctx).args(["top", "--control"]).arg(&w.s.control).output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let o = Command::new(&ctx).args(["top", "--once", "--control"]).arg(&w.s.control).output().unwrap();
    let table = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(table.starts_with("AGENT\tSESSION") && table.lines().count() == 20, "{table}");
    for a in fleet.iter().filter(|a| *a != "fleet07") {
        let o = Command::new(&ctx)
            .args(["agent", "stop", a, "--session", &s, "--control"])
            .arg(&w.s.control)
            .output()
            .unwrap();
        assert!(o.status.success(), "{a}: {}", text(&o));
    }
}
