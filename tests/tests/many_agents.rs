//! Many agents on one daemon, each in its own sandbox: appends from many connections to one
//! log, control writes that fail part way, a full disk, and what an agent's view lets it change
//! of its own authority.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use tests::served::{Served, errno};

fn text(o: &Output) -> String {
    tests::shown(o)
}

fn ctx(args: &[&str]) -> Output {
    Command::new(tests::bin("ctx")).args(args).output().unwrap()
}

fn ok(args: &[&str]) {
    let o = ctx(args);
    assert!(o.status.success(), "ctx {args:?}: {}", text(&o));
}

fn session(tag: &str) -> String {
    // Runs are host-wide: the module's letter keeps its sessions apart from other modules'.
    format!("{tag}{}m", std::process::id())
}

/// A daemon with the core tools and a workspace anyone may read.
struct Host {
    s: Served,
    work: PathBuf,
}

impl Host {
    fn new() -> Host {
        assert!(Path::new("/usr/bin/bwrap").exists(), "bubblewrap is required (make test installs it)");
        Host::on(Served::start())
    }

    fn on(s: Served) -> Host {
        ok(&["bootstrap", s.storage.to_str().unwrap()]);
        let work = s.dir.path().join("work");
        fs::create_dir_all(&work).unwrap();
        fs::write(work.join("a.txt"), "hello\n").unwrap();
        // Agents of any uid write their results here.
        fs::set_permissions(&work, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
        Host { s, work }
    }

    fn st(&self) -> &str {
        self.s.storage.to_str().unwrap()
    }

    /// `ctx agent new NAME --uid UID --gid UID` plus `extra`.
    fn agent(&self, name: &str, uid: u32, extra: &[&str]) {
        let uid = uid.to_string();
        let mut args = vec!["agent", "new", name, "--uid", &uid, "--gid", &uid, "--source", self.st()];
        args.extend_from_slice(extra);
        ok(&args);
    }

    /// Grants `tool` to `labels` in the tool's own policy.
    fn tool_policy(&self, tool: &str, labels: &[String]) {
        let p: String = labels.iter().map(|l| format!("allow {l} tool:{tool} execute\n")).collect();
        fs::write(self.s.storage.join(format!("tool/{tool}.d/policy")), p).unwrap();
    }

    fn start(&self, agent: &str, session: &str, extra: &[&str], cmd: &[&str]) -> Command {
        let mut c = Command::new(tests::bin("ctx"));
        c.args(["agent", "start", agent, "--session", session, "--ctx"])
            .arg(&self.s.mnt)
            .arg("--control")
            .arg(&self.s.control)
            .arg("--cwd")
            .arg(&self.work)
            .args(extra)
            .arg("--")
            .args(cmd);
        c
    }

    fn events(&self, uid: u32, agent: &str, session: &str) -> String {
        fs::read_to_string(
            self.s.storage.join(format!("home/{uid}/agent/{agent}/session/{session}/events.jsonl")),
        )
        .unwrap_or_default()
    }
}

/// Every line of `log` is whole JSON; returns how many there are.
fn whole_lines(log: &str) -> usize {
    for l in log.lines() {
        assert!(serde_json::from_str::<serde_json::Value>(l).is_ok(), "a torn or merged line: {l:?}");
    }
    log.lines().count()
}

#[test]
fn appends_from_many_views_and_the_host_all_land_whole() {
    const AGENTS: u32 = 16;
    const CALLS: usize = 400;
    let h = Host::new();
    let names: Vec<String> = (0..AGENTS).map(|i| format!("w{i}")).collect();
    for (i, n) in names.iter().enumerate() {
        h.agent(n, 3100 + i as u32, &["--tool", "fs.read"]);
    }
    h.tool_policy("fs.read", &names.iter().map(|n| format!("{n}_t")).collect::<Vec<_>>());
    let s = session("c");
    let script = format!(
        "n=0; i=0; while [ $i -lt {CALLS} ]; do /ctx/bin/tsh fs.read a.txt >/dev/null 2>>/tmp/err \
         || {{ e=$?; n=$((n+1)); echo \"call $i: tsh exited $e\" >>/tmp/err; }}; \
         i=$((i+1)); done; cat /tmp/err >&2; exit $n"
    );
    let runs: Vec<_> = names
        .iter()
        .map(|n| h.start(n, &s, &["--wait"], &["/bin/sh", "-c", &script]).spawn().unwrap())
        .collect();
    // Meanwhile the host appends to the first agent's session log through its own mount.
    let host_log = h.s.p(&format!("home/3100/agent/w0/session/{s}/events.jsonl"));
    let t = std::time::Instant::now();
    while !host_log.exists() {
        assert!(t.elapsed().as_secs() < 30, "the first session never appeared");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let mut host = fs::OpenOptions::new().append(true).open(&host_log).unwrap();
    for i in 0..300 {
        host.write_all(format!("{{\"type\":\"host.note\",\"i\":{i}}}\n").as_bytes())
            .unwrap_or_else(|e| panic!("host append {i} through the host mount: {e}"));
    }
    for (n, r) in names.iter().zip(runs) {
        let o = r.wait_with_output().unwrap();
        assert!(o.status.success(), "{n}: every call succeeds and is recorded: {}", text(&o));
    }
    let log = fs::read_to_string(h.s.storage.join("tool/fs.read.d/log")).unwrap();
    assert_eq!(whole_lines(&log), AGENTS as usize * CALLS, "one whole line per call in the tool's log");
    for (i, n) in names.iter().enumerate() {
        let ev = h.events(3100 + i as u32, n, &s);
        let calls = ev.lines().filter(|l| l.contains("\"tool.call\"")).count();
        whole_lines(&ev);
        assert_eq!(calls, CALLS, "{n}: every call in the session's events");
    }
    let first = h.events(3100, "w0", &s);
    assert_eq!(first.lines().filter(|l| l.contains("host.note")).count(), 300, "no host append lost");
}

/// Writes `data` to `path` through the mount in `chunk`-byte writes, then closes it; returns
/// the errno of the first write that failed (0: none).
fn write_control(path: &Path, data: &[u8], chunk: usize) -> i32 {
    let f = fs::OpenOptions::new().write(true).truncate(true).open(path).unwrap();
    let mut first = 0;
    for (i, c) in data.chunks(chunk).enumerate() {
        let e = errno(f.write_all_at(c, (i * chunk) as u64));
        if e != 0 {
            first = e;
            break;
        }
        if i == 2 {
            // A child forked now inherits the descriptor and closes it at exec: a FLUSH that
            // is not the writer's close.
            assert!(Command::new("/bin/true").status().unwrap().success());
        }
    }
    first
}

#[test]
fn a_control_handle_that_saw_a_refused_write_publishes_nothing() {
    let h = Host::new();
    h.agent("a", 3200, &[]);
    let system = h.s.p("agent/a.d/system.md");
    let policy = h.s.p("agent/a.d/policy");
    fs::write(&system, "old system\n").unwrap();
    let old_policy = fs::read(&policy).unwrap();
    // 65 KiB in 4 KiB writes: the write past 64 KiB is refused, the first 64 KiB stay unpublished.
    let big = vec![b'x'; 65 * 1024];
    let e = write_control(&system, &big, 4096);
    assert_eq!(e, libc::EFBIG, "the write past the limit is refused");
    let now = fs::read_to_string(&system).unwrap();
    assert!(now == "old system\n", "nothing published at close ({} bytes there)", now.len());
    // A policy of 1,025 lines of 64 bytes.
    let line = format!("allow a_t tool:{} execute\n", "t".repeat(64 - 24));
    assert_eq!(line.len(), 64);
    let e = write_control(&policy, line.repeat(1025).as_bytes(), 64);
    assert_ne!(e, 0, "an oversize policy is refused");
    let now = fs::read(&policy).unwrap();
    assert!(
        now == old_policy,
        "the old policy stays ({} bytes, was {}): {:?}",
        now.len(),
        old_policy.len(),
        String::from_utf8_lossy(&now[..now.len().min(200)])
    );
    // A write at the wrong offset in the middle of a handle's writes.
    let f = fs::OpenOptions::new().write(true).truncate(true).open(&system).unwrap();
    f.write_all_at(b"first part\n", 0).unwrap();
    assert_eq!(errno(f.write_all_at(b"gap\n", 100)), libc::EINVAL);
    drop(f);
    assert_eq!(fs::read_to_string(&system).unwrap(), "old system\n", "a failed pwrite publishes nothing");
    // And a handle without a refusal still publishes.
    fs::write(&system, "new system\n").unwrap();
    assert_eq!(fs::read_to_string(&system).unwrap(), "new system\n");
}

/// Unmounts (lazily) the filesystem at its path when dropped.
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// A daemon whose storage is a tmpfs of `size` of its own (a disk a test may fill), started;
/// the tmpfs goes when the guard is dropped (after the daemon).
fn on_small_tmpfs(size: &str) -> (Served, Unmount) {
    let mut s = Served::unstarted(&[]);
    fs::create_dir_all(&s.storage).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
        .arg(&s.storage)
        .status()
        .unwrap();
    assert!(mounted.success(), "a small tmpfs for the storage");
    let guard = Unmount(s.storage.clone());
    s.spawn();
    (s, guard)
}

#[test]
fn a_full_disk_reaches_the_writer_as_enospc_and_appends_work_again() {
    let (s, _tmpfs) = on_small_tmpfs("8m");
    let work = s.dir.path().join("work");
    fs::create_dir_all(&work).unwrap();
    fs::set_permissions(&work, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let h = Host { work, s };
    let dir = h.s.data_dir("home/0/agent/a/session/full", 0o755, 0);
    let log = dir.join("events.jsonl");
    let mut f = fs::OpenOptions::new().append(true).create(true).mode(0o644).open(&log).unwrap();
    let mut acked = Vec::new();
    for i in 0..20 {
        let l = format!("{{\"type\":\"before\",\"i\":{i}}}\n");
        f.write_all(l.as_bytes()).unwrap();
        acked.push(l);
    }
    // Fill the disk behind the daemon's back.
    let filler = h.s.storage.join("filler");
    let mut fill = fs::File::create(&filler).unwrap();
    while fill.write_all(&[b'x'; 65536]).is_ok() {}
    while fill.write_all(&[b'x'; 512]).is_ok() {}
    drop(fill);
    let big = format!("{{\"type\":\"big\",\"pad\":\"{}\"}}\n", "y".repeat(120 * 1024));
    let mut seen = Vec::new();
    for _ in 0..20 {
        let e = errno(f.write_all(big.as_bytes()));
        seen.push(e);
        if e != 0 {
            break;
        }
    }
    assert_eq!(seen.last(), Some(&libc::ENOSPC), "a full disk is ENOSPC, not EIO: {seen:?}");
    let bigs = seen.iter().filter(|&&e| e == 0).count();
    fs::remove_file(&filler).unwrap();
    for i in 0..20 {
        let l = format!("{{\"type\":\"after\",\"i\":{i}}}\n");
        f.write_all(l.as_bytes()).unwrap_or_else(|e| panic!("appends work again once there is space: {e}"));
        acked.push(l);
    }
    drop(f);
    let kept = fs::read_to_string(h.s.storage.join("home/0/agent/a/session/full/events.jsonl")).unwrap();
    whole_lines(&kept);
    for l in &acked {
        assert_eq!(kept.matches(l.as_str()).count(), 1, "acknowledged {l:?} kept once");
    }
    assert_eq!(kept.lines().filter(|l| l.contains("\"big\"")).count(), bigs, "only acknowledged appends");

    // The same from inside a sandbox, through the agent's view.
    h.agent("filler", 3250, &[]);
    let s = session("fd");
    let events = format!("/ctx/home/3250/agent/filler/session/{s}/events.jsonl");
    let script = format!(
        "import os, time\n\
         def wait(f):\n    while not os.path.exists('/workspace/' + f): time.sleep(0.05)\n\
         open('/workspace/ready', 'w').close(); wait('full')\n\
         fd = os.open('{events}', os.O_WRONLY | os.O_APPEND)\n\
         line = b'{{\"type\":\"big\",\"pad\":\"' + b'z' * (120 << 10) + b'\"}}\\n'\n\
         err = 0\n\
         for i in range(40):\n    try: os.write(fd, line)\n    except OSError as e: err = e.errno; break\n\
         open('/workspace/full.err', 'w').write(str(err)); open('/workspace/tried', 'w').close(); wait('room')\n\
         os.write(fd, b'{{\"type\":\"after\"}}\\n'); open('/workspace/again', 'w').close()\n"
    );
    let run = h
        .start("filler", &s, &["--wait", "--no-ceilings"], &["/usr/bin/python3", "-c", &script])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let wait_for = |f: &str| {
        let t = std::time::Instant::now();
        while !h.work.join(f).exists() {
            assert!(t.elapsed().as_secs() < 60, "{f} never came");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    };
    wait_for("ready");
    let mut fill = fs::File::create(&filler).unwrap();
    while fill.write_all(&[b'x'; 65536]).is_ok() {}
    while fill.write_all(&[b'x'; 512]).is_ok() {}
    drop(fill);
    fs::write(h.work.join("full"), "").unwrap_or_default();
    wait_for("tried");
    fs::remove_file(&filler).unwrap();
    fs::write(h.work.join("room"), "").unwrap();
    let o = run.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let err = fs::read_to_string(h.work.join("full.err")).unwrap_or_default();
    assert_eq!(err, libc::ENOSPC.to_string(), "the agent sees ENOSPC");
    assert!(h.work.join("again").exists(), "and appends again once there is room");
}

/// The longest line a log takes through any connection, newline included (the server's
/// `LINE_MAX`).
const LINE_MAX: usize = (1 << 20) - 4096;

/// A JSON line of `n` bytes, newline included.
fn json_line(n: usize) -> Vec<u8> {
    let mut l = b"\"".to_vec();
    l.resize(n - 2, b'x');
    l.extend_from_slice(b"\"\n");
    l
}

/// One `write(2)` of `data` to `f`: the count, or the errno.
fn write_once(f: &mut fs::File, data: &[u8]) -> Result<usize, i32> {
    f.write(data).map_err(|e| e.raw_os_error().unwrap_or(0))
}

/// A write to a session log through the host mount is stored whole or refused whole however
/// the kernel splits it (it sends a write that starts in a page it has not read in two
/// requests, and one longer than `max_write` in several): a count is acknowledged only for
/// bytes stored, a line too long is refused with EFBIG, a full disk is ENOSPC to the writer
/// (it was seen as short counts of ~2,900 for 4 KB lines, nothing stored and no error); and
/// the host mount and a view (from inside a sandbox) take the same longest line.
#[test]
fn a_log_write_is_stored_whole_or_refused_whole_however_the_kernel_splits_it() {
    let (s, _tmpfs) = on_small_tmpfs("24m");
    let work = s.dir.path().join("work");
    let h = Host { work, s };
    let dir = h.s.data_dir("home/0/agent/a/session/split", 0o755, 0);
    let stored =
        || fs::read(h.s.storage.join("home/0/agent/a/session/split/events.jsonl")).unwrap_or_default();
    let mut f =
        fs::OpenOptions::new().append(true).create(true).mode(0o644).open(dir.join("events.jsonl")).unwrap();
    // The end in the middle of a page: a line across the page's end arrives in two pieces.
    f.write_all(&json_line(1000)).unwrap();
    assert_eq!(write_once(&mut f, &json_line(6000)), Ok(6000), "a line across a page boundary, whole");
    assert_eq!(write_once(&mut f, &json_line(LINE_MAX)), Ok(LINE_MAX), "the longest line, whole");
    assert_eq!(stored().len(), 1000 + 6000 + LINE_MAX);
    // Three lines of 600 KB in one write (split by the kernel at 1 MiB): the count covers
    // whole lines only, each stored; the writer goes on from there.
    let three = json_line(600_000).repeat(3);
    let before = stored().len();
    let n = write_once(&mut f, &three).unwrap();
    assert!(n > 0 && n.is_multiple_of(600_000), "a count of whole lines: {n}");
    assert_eq!(stored().len(), before + n, "exactly what was acknowledged is stored");
    f.write_all(&three[n..]).unwrap();
    assert_eq!(stored().len(), before + three.len());
    // From a page boundary, a line longer than the limit is refused at its first piece.
    let pad = 4096 - stored().len() % 4096;
    if pad < 10 {
        f.write_all(&json_line(pad + 4096)).unwrap();
    } else {
        f.write_all(&json_line(pad)).unwrap();
    }
    assert!(stored().len().is_multiple_of(4096));
    let before = stored();
    for n in [LINE_MAX + 1, 3 << 20] {
        assert_eq!(write_once(&mut f, &json_line(n)), Err(libc::EFBIG), "a {n}-byte line");
        assert_eq!(stored(), before, "nothing of it stored");
    }
    drop(f);
    whole_lines(&String::from_utf8(stored()).unwrap());
    // A full disk: every count is the whole line's, and the writer sees ENOSPC.
    let dir = h.s.data_dir("home/0/agent/a/session/full", 0o755, 0);
    let stored =
        || fs::read(h.s.storage.join("home/0/agent/a/session/full/events.jsonl")).unwrap_or_default();
    let mut f =
        fs::OpenOptions::new().append(true).create(true).mode(0o644).open(dir.join("events.jsonl")).unwrap();
    f.write_all(&json_line(1000)).unwrap();
    let filler = h.s.storage.join("filler");
    let mut fill = fs::File::create(&filler).unwrap();
    while fill.write_all(&[b'x'; 65536]).is_ok() {}
    while fill.write_all(&[b'x'; 512]).is_ok() {}
    drop(fill);
    // 4 KB lines until the disk refuses one, by a program of its own (as it was seen: a
    // process's first writes to the log go through pages its kernel has not read).
    let line = json_line(4000);
    let before = stored().len();
    let script = "import os, sys\n\
        fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND)\n\
        line = b'\"' + b'x' * 3997 + b'\"\\n'\n\
        acked = 0\n\
        for i in range(3000):\n    \
            try: n = os.write(fd, line)\n    \
            except OSError as e: print('error', e.errno, acked); break\n    \
            if n != len(line): print('short', n, acked); break\n    \
            acked += n\n";
    let o =
        Command::new("/usr/bin/python3").args(["-c", script]).arg(dir.join("events.jsonl")).output().unwrap();
    let said = String::from_utf8_lossy(&o.stdout).into_owned();
    let words: Vec<&str> = said.split_whitespace().collect();
    assert_eq!(words.first(), Some(&"error"), "never a short count on a full disk: {said}");
    assert_eq!(words.get(1), Some(&libc::ENOSPC.to_string().as_str()), "a full disk is ENOSPC: {said}");
    let acked: usize = words[2].parse().unwrap();
    assert_eq!(stored().len(), before + acked, "what was acknowledged is stored, and nothing else");
    fs::remove_file(&filler).unwrap();
    f.write_all(&line).unwrap();
    drop(f);
    whole_lines(&String::from_utf8(stored()).unwrap());

    drop(h);
    // The same longest line from inside a sandbox, through the agent's view.
    let h = Host::new();
    h.agent("splitter", 3251, &[]);
    let s = session("sp");
    let events = format!("/ctx/home/3251/agent/splitter/session/{s}/events.jsonl");
    let script = format!(
        "import os\n\
         fd = os.open('{events}', os.O_WRONLY | os.O_APPEND)\n\
         def line(n): return b'\"' + b'x' * (n - 3) + b'\"\\n'\n\
         out = []\n\
         for n in ({LINE_MAX}, {LINE_MAX} + 1, 3 << 20):\n    \
             try: out.append(str(os.write(fd, line(n))))\n    \
             except OSError as e: out.append('E' + str(e.errno))\n\
         open('/workspace/split.out', 'w').write(' '.join(out))\n"
    );
    let o = h
        .start("splitter", &s, &["--wait", "--no-ceilings"], &["/usr/bin/python3", "-c", &script])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let said = fs::read_to_string(h.work.join("split.out")).unwrap();
    assert_eq!(
        said,
        format!("{LINE_MAX} E{} E{}", libc::EFBIG, libc::EFBIG),
        "the view takes the host's limit"
    );
}

#[test]
fn an_agent_running_as_root_cannot_change_its_own_controls_through_its_view() {
    let h = Host::new();
    h.agent("rootboss", 0, &["--allow-root", "--tool", "fs.read"]);
    let controls = h.s.storage.join("agent/rootboss.d");
    let before: Vec<(String, Vec<u8>)> = ["policy", "uid", "label", "mount", "system.md"]
        .iter()
        .map(|c| ((*c).to_owned(), fs::read(controls.join(c)).unwrap_or_default()))
        .collect();
    // Each control read through the view first (a positive control: the view shows them as
    // storage holds them), then each change tried; the errno of each refusal kept.
    let script = r#"
import errno, json, os
d = '/ctx/agent/rootboss.d'
out = {'seen': {c: open(f'{d}/{c}').read() for c in ['policy', 'uid', 'label', 'mount', 'system.md']}}
def w(path, mode, text):
    with open(path, mode) as f:
        f.write(text)
tries = {
    'policy-append': lambda: w(f'{d}/policy', 'a', 'allow rootboss_t tool:fs.write execute\n'),
    'policy-write': lambda: w(f'{d}/policy', 'w', 'allow rootboss_t tool:fs.write execute\n'),
    'uid': lambda: w(f'{d}/uid', 'w', '0\n'),
    'label': lambda: w(f'{d}/label', 'w', 'root_t\n'),
    'mount': lambda: w(f'{d}/mount', 'w', '/ /host rw\n'),
    'system': lambda: w(f'{d}/system.md', 'w', 'hi\n'),
    'chmod': lambda: os.chmod(f'{d}/policy', 0o666),
    'create': lambda: w(f'{d}/cwd', 'w', '/\n'),
    'rename': lambda: os.rename(f'{d}/policy', f'{d}/policy.old'),
    'unlink': lambda: os.unlink(f'{d}/label'),
    'mkdir': lambda: os.mkdir(f'{d}/hooks/pre.d/x'),
}
for name, f in tries.items():
    try:
        f()
        out[name] = 'changed'
    except OSError as e:
        out[name] = errno.errorcode[e.errno]
json.dump(out, open('/workspace/changed.json', 'w'))
"#;
    let o = h
        .start("rootboss", &session("r"), &["--wait"], &["/usr/bin/python3", "-c", script])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let said: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(h.work.join("changed.json")).unwrap()).unwrap();
    for (c, old) in &before {
        assert_eq!(
            said["seen"][c].as_str().map(str::as_bytes),
            Some(&old[..]),
            "{c}: the view shows it as stored"
        );
    }
    for (change, refused) in said.as_object().unwrap().iter().filter(|(k, _)| *k != "seen") {
        assert_eq!(refused.as_str(), Some("EACCES"), "{change}: {said}");
    }
    for (c, old) in before {
        assert_eq!(fs::read(controls.join(&c)).unwrap_or_default(), old, "{c} unchanged");
    }
}

/// A raw request on the run's receipt socket, from inside the sandbox; its reply in `out`.
fn receipt_call(request: &str, out: &str) -> String {
    format!(
        "python3 -c 'import socket,sys\ns=socket.socket(socket.AF_UNIX); s.connect(\"/run/cortexfs/receipt/main.sock\")\n\
         s.sendall(sys.argv[1].encode()+b\"\\n\"); print(s.makefile().readline())' '{request}' > {out} 2>&1"
    )
}

#[test]
fn a_lifecycle_call_that_cannot_be_recorded_fails_and_changes_nothing() {
    let h = Host::new();
    h.agent("upd", 3300, &["--tool", "agent.update"]);
    h.tool_policy("agent.update", &["upd_t".to_owned()]);
    let s = session("u");
    let script = format!(
        "touch /workspace/ready; while [ ! -e /workspace/go ]; do sleep 0.05; done; {}; touch /workspace/done",
        receipt_call(
            r#"{"op":"agent.update","input":{"control":"system.md","content":"changed"}}"#,
            "/workspace/reply"
        )
    );
    let run = h
        .start("upd", &s, &["--wait"], &["/bin/sh", "-c", &script])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let events = h.s.storage.join(format!("home/3300/agent/upd/session/{s}/events.jsonl"));
    // Once the run is under way, the session's events can no longer be appended to.
    let t = std::time::Instant::now();
    while !h.work.join("ready").exists() {
        assert!(t.elapsed().as_secs() < 30, "the run never started");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    fs::remove_file(&events).unwrap();
    fs::create_dir(&events).unwrap();
    let before = fs::read(h.s.storage.join("agent/upd.d/system.md")).unwrap_or_default();
    fs::write(h.work.join("go"), "").unwrap();
    let o = run.wait_with_output().unwrap();
    let log = fs::read_to_string(h.s.run_dir("upd", &s).join("log")).unwrap_or_default();
    assert!(o.status.success(), "{}\nsupervisor: {log}", text(&o));
    let reply: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(h.work.join("reply")).unwrap()).unwrap();
    assert_eq!(reply["ok"], false, "{reply}");
    assert!(reply["error"].as_str().unwrap().contains("not recorded"), "{reply}");
    assert!(
        fs::read(h.s.storage.join("agent/upd.d/system.md")).unwrap_or_default() == before,
        "an unrecorded update is not made"
    );
}

#[test]
fn run_state_is_roots_holds_no_command_line_after_stop_and_goes_with_the_run() {
    let h = Host::new();
    h.agent("quiet", 3400, &[]);
    let s = session("q");
    let secret = "sekrit-4711-cmdline";
    let o = h.start("quiet", &s, &[], &["/bin/sh", "-c", "sleep 1000", secret]).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let run = h.s.run_dir("quiet", &s);
    let contract = run.join("contract.json");
    use std::os::unix::fs::MetadataExt;
    for f in [&contract, &run.join("log")] {
        let m = fs::metadata(f).unwrap();
        assert_eq!((m.uid(), m.mode() & 0o777), (0, 0o600), "{} is root's alone", f.display());
    }
    let other = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "cat"])
        .arg(&contract)
        .output()
        .unwrap();
    assert!(!other.status.success(), "another user cannot read the contract: {}", text(&other));
    let view = h.s.view_dir("quiet", &s);
    assert!(view.exists());
    ok(&["agent", "stop", "quiet", "--session", &s, "--control", h.s.control.to_str().unwrap()]);
    assert!(!contract.exists(), "the contract goes with the run");
    // Nothing of the run stays in the runtime directory: its status and the end of its log are
    // in the daemon's bounded record of ended runs (root's), which holds no command line.
    assert!(!run.exists(), "the run's directory goes with the run");
    let left: Vec<String> = fs::read_dir(run.parent().unwrap())
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    assert!(left.iter().all(|n| !n.contains(&s)), "nothing of the run under another name: {left:?}");
    let ended = h.s.rt().join("ended.jsonl");
    let m = fs::metadata(&ended).unwrap();
    assert_eq!((m.uid(), m.mode() & 0o777), (0, 0o600), "the record of ended runs is root's alone");
    let text = fs::read_to_string(&ended).unwrap();
    let line: serde_json::Value =
        serde_json::from_str(text.lines().find(|l| l.contains(&s)).expect("the run's end is recorded"))
            .unwrap();
    assert!(
        line["exit"].is_i64() && line["log"].as_str().is_some_and(|l| l.contains("terminal ended")),
        "{line}"
    );
    assert!(!text.contains(secret), "the record holds no command line");
    assert!(!view.exists(), "the view's directory goes with the view");
}

#[test]
fn a_child_cannot_take_a_label_that_policies_name_and_rm_names_the_lines_left() {
    let h = Host::new();
    h.agent("boss", 3500, &["--tool", "agent.create", "--tool", "fs.write"]);
    let policy = h.s.storage.join("agent/boss.d/policy");
    let mut p = fs::read_to_string(&policy).unwrap();
    p.push_str("allow boss_t agent:ghostkid create\nallow boss_t agent:twin create\n");
    fs::write(&policy, p).unwrap();
    h.tool_policy("agent.create", &["boss_t".to_owned()]);
    // A label no agent holds, still granted fs.write by the tool's own policy.
    fs::write(h.s.storage.join("tool/fs.write.d/policy"), "allow ghost_t tool:fs.write execute\n").unwrap();
    h.agent("other", 3501, &[]);
    let script = "cd /workspace; \
        /ctx/bin/tsh agent.create '{\"name\":\"ghostkid\",\"label\":\"ghost_t\",\"tools\":[\"fs.write\"]}' > ghost.out 2>&1; \
        echo $? > ghost.code; \
        /ctx/bin/tsh agent.create '{\"name\":\"twin\",\"label\":\"other_t\"}' > twin.out 2>&1; echo $? > twin.code";
    let o = h.start("boss", &session("g"), &["--wait"], &["/bin/sh", "-c", script]).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let read = |f: &str| fs::read_to_string(h.work.join(f)).unwrap_or_default();
    assert_eq!(read("ghost.code").trim(), "13", "{}", read("ghost.out"));
    assert!(read("ghost.out").contains("tool/fs.write.d/policy:1: allow ghost_t"), "{}", read("ghost.out"));
    assert!(!h.s.storage.join("agent/ghostkid").exists(), "no child with the ghost's label");
    assert_eq!(read("twin.code").trim(), "13", "{}", read("twin.out"));
    assert!(read("twin.out").contains("agent/other's"), "{}", read("twin.out"));
    // The operator cannot hand out a label twice either.
    let o = ctx(&["agent", "new", "again", "--label", "other_t", "--source", h.st()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));

    // ctx agent rm names the lines that still grant the label, and removes them with --yes.
    fs::write(
        h.s.storage.join("tool/fs.read.d/policy"),
        "allow boss_t tool:fs.read execute\nallow other_t tool:fs.read execute\n",
    )
    .unwrap();
    let dry = ctx(&["agent", "rm", "other", "--source", h.st()]);
    assert!(dry.status.success(), "{}", text(&dry));
    let out = String::from_utf8_lossy(&dry.stdout).into_owned();
    assert!(
        out.contains("would remove tool/fs.read.d/policy:2: allow other_t tool:fs.read execute"),
        "{out}"
    );
    assert!(h.s.storage.join("agent/other").exists(), "a dry run changes nothing");
    ok(&["agent", "rm", "other", "--yes", "--source", h.st()]);
    assert_eq!(
        fs::read_to_string(h.s.storage.join("tool/fs.read.d/policy")).unwrap(),
        "allow boss_t tool:fs.read execute\n"
    );
}

/// What the sandbox refuses, tried from inside: each line `name errno` (0: it worked).
const SECCOMP_PROBE: &str = r#"
import ctypes, os, errno
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(nr, *args):
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return 0 if r >= 0 else ctypes.get_errno()
term = [int(p) for p in os.listdir('/proc') if p.isdigit() and open('/proc/%s/comm' % p).read().strip() == 'ctxterm'][0]
out = {}
PTRACE_ATTACH = 16
out['ptrace_ctxterm'] = call(101, PTRACE_ATTACH, term, 0, 0)
out['ptrace_pid1'] = call(101, PTRACE_ATTACH, 1, 0, 0)
buf = ctypes.create_string_buffer(64)
class iovec(ctypes.Structure):
    _fields_ = [('base', ctypes.c_void_p), ('len', ctypes.c_size_t)]
local = iovec(ctypes.cast(buf, ctypes.c_void_p), 64)
remote = iovec(0x400000, 64)
out['process_vm_readv'] = call(310, term, ctypes.addressof(local), 1, ctypes.addressof(remote), 1, 0)
try:
    open('/proc/%d/mem' % term, 'rb').read(1); out['proc_mem_ctxterm'] = 0
except OSError as e:
    out['proc_mem_ctxterm'] = e.errno
try:
    open('/proc/%d/environ' % term, 'rb').read(); out['proc_environ_ctxterm'] = 0
except OSError as e:
    out['proc_environ_ctxterm'] = e.errno
c = ctypes.c_char(b'x')
fd = os.open('/dev/tty', os.O_RDWR)
out['tiocsti'] = call(16, fd, 0x5412, ctypes.addressof(c))
out['tiocsti_high_bits'] = call(16, fd, 0x5412 | (1 << 32), ctypes.addressof(c))
out['keyctl'] = call(250, 0, 0, 0, 0)
out['add_key'] = call(248, 0, 0, 0, 0, 0)
out['bpf'] = call(321, 0, 0, 0)
out['perf_event_open'] = call(298, 0, 0, -1, -1, 0)
out['userfaultfd'] = call(323, 0)
out['unshare_user'] = call(272, 0x10000000)
out['unshare_mount'] = call(272, 0x00020000)
out['mount'] = call(165, 0, 0, 0, 0, 0)
out['x32_getpid'] = call(0x40000000 + 39)
out['clone3'] = call(435, 0, 0)
out['getpid'] = call(39)
open('/workspace/sec', 'w').write(''.join('%s %d\n' % kv for kv in out.items()))
"#;

#[test]
fn the_sandbox_cannot_trace_its_terminal_owner_or_reach_the_kernel_surface_it_has_no_use_for() {
    let h = Host::new();
    h.agent("probe", 3600, &[]);
    let o = h
        // On the agent's terminal: the probe tries the PTY and the ctxterm that owns it.
        .start("probe", &session("p"), &["--wait", "--tty"], &["/usr/bin/python3", "-c", SECCOMP_PROBE])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let sec = fs::read_to_string(h.work.join("sec")).unwrap();
    let got: std::collections::HashMap<&str, i32> =
        sec.lines().filter_map(|l| l.split_once(' ')).map(|(k, v)| (k, v.parse().unwrap())).collect();
    for k in [
        "ptrace_ctxterm",
        "ptrace_pid1",
        "process_vm_readv",
        "tiocsti",
        "tiocsti_high_bits",
        "keyctl",
        "add_key",
        "bpf",
        "perf_event_open",
        "userfaultfd",
        "unshare_user",
        "mount",
        "x32_getpid",
    ] {
        assert_eq!(got.get(k), Some(&libc::EPERM), "{k} is refused with EPERM: {sec}");
    }
    assert_eq!(got.get("clone3"), Some(&libc::ENOSYS), "{sec}");
    for k in ["proc_mem_ctxterm", "proc_environ_ctxterm"] {
        assert_ne!(got.get(k), Some(&0), "{k}: ctxterm's memory is not the agent's to read: {sec}");
    }
    assert_eq!(got.get("getpid"), Some(&0), "ordinary calls work: {sec}");
}

#[test]
fn a_receipt_request_off_its_schema_is_refused_before_anything_runs() {
    let h = Host::new();
    h.agent("maker", 3700, &["--tool", "agent.create"]);
    let policy = h.s.storage.join("agent/maker.d/policy");
    let mut p = fs::read_to_string(&policy).unwrap();
    p.push_str("allow maker_t agent:kid create\n");
    fs::write(&policy, p).unwrap();
    h.tool_policy("agent.create", &["maker_t".to_owned()]);
    let script = format!(
        "{}; {}; {}",
        receipt_call(
            r#"{"op":"agent.create","input":{"name":"kid","mounts":[["/tmp","/x","ro","--uid=0"]]}}"#,
            "/workspace/four"
        ),
        receipt_call(
            r#"{"op":"agent.create","input":{"name":"kid","label":"kid_t","uid":0}}"#,
            "/workspace/uid"
        ),
        receipt_call(r#"{"op":"agent.create","input":{"name":"kid","tools":"fs.read"}}"#, "/workspace/type"),
    );
    let o = h.start("maker", &session("m"), &["--wait"], &["/bin/sh", "-c", &script]).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    for f in ["four", "uid", "type"] {
        let reply: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(h.work.join(f)).unwrap()).unwrap();
        assert_eq!((reply["ok"].clone(), reply["code"].clone()), (false.into(), 2.into()), "{f}: {reply}");
        assert!(reply["error"].as_str().unwrap().starts_with("EINVAL"), "{f}: {reply}");
    }
    assert!(!h.s.storage.join("agent/kid").exists(), "nothing was created");
}

#[test]
fn tools_work_in_the_runs_workspace_whatever_the_agents_environment_says() {
    let h = Host::new();
    h.agent("reader", 3800, &["--tool", "fs.read"]);
    h.tool_policy("fs.read", &["reader_t".to_owned()]);
    let host = fs::read_to_string("/etc/hostname").unwrap();
    let script = "cd /workspace; \
        CTX_WORKSPACE=/etc /ctx/bin/tsh fs.read hostname > env.out 2>&1; echo $? > env.code; \
        mkdir -p /tmp/fake; echo 'view host' > /tmp/fake/status; \
        CTX_WORKSPACE=/etc CTX_ROOT=/tmp/fake /ctx/tool/fs.read hostname > direct.out 2>&1; echo $? > direct.code; \
        /ctx/bin/tsh fs.read a.txt > own.out 2>&1";
    let o = h.start("reader", &session("w"), &["--wait"], &["/bin/sh", "-c", script]).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let read = |f: &str| fs::read_to_string(h.work.join(f)).unwrap_or_default();
    for f in ["env", "direct"] {
        assert_ne!(read(&format!("{f}.code")).trim(), "0", "{f}: {}", read(&format!("{f}.out")));
        assert!(!read(&format!("{f}.out")).contains(host.trim()), "{f}: a host file was read");
    }
    assert!(read("own.out").contains("hello"), "the run's workspace works: {}", read("own.out"));
    // A run without a workspace has none to offer its tools.
    let o = h
        .start(
            "reader",
            &session("nw"),
            &["--wait", "--no-default-workspace"],
            &["/bin/sh", "-c", "CTX_WORKSPACE=/etc /ctx/bin/tsh fs.read hostname"],
        )
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(69), "{}", text(&o));
    assert!(!String::from_utf8_lossy(&o.stdout).contains(host.trim()));
}

#[test]
fn ceilings_hold_a_fork_bomb_a_memory_hog_and_a_busy_loop() {
    let h = Host::new();
    h.agent("greedy", 3900, &[]);
    // The agent's own control, with a flag over one of its keys.
    fs::write(h.s.storage.join("agent/greedy.d/limits"), "memory=128M\npids=32\ncpu=20\n").unwrap();
    let bomb = "import os, time\nn = 0\nfor i in range(200):\n    try:\n        if os.fork() == 0:\n            time.sleep(30); os._exit(0)\n        n += 1\n    except OSError:\n        pass\nopen('/workspace/forked', 'w').write(str(n))\n";
    let o =
        h.start("greedy", &session("fb"), &["--wait"], &["/usr/bin/python3", "-c", bomb]).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let forked: u32 = fs::read_to_string(h.work.join("forked")).unwrap().parse().unwrap();
    assert!(forked < 32, "pids=32 holds: {forked} processes forked");
    // The ceilings as configured, read from every hierarchy the host has while a run is up:
    // the flag (300M) over the control's memory (128M), the control's pids and cpu.
    let s = session("cf");
    let mut up = h
        .start(
            "greedy",
            &s,
            &["--wait", "--memory", "300M"],
            &["/bin/sh", "-c", "touch /workspace/up; sleep 5"],
        )
        .spawn()
        .unwrap();
    let t = std::time::Instant::now();
    while !h.work.join("up").exists() {
        assert!(t.elapsed().as_secs() < 60, "the run came up");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let group = format!("cortexfs/greedy.{s}");
    let read = |p: String| fs::read_to_string(&p).ok().map(|v| v.trim().to_owned());
    let mut seen = Vec::new();
    // cgroup v1: one hierarchy per controller.
    if let Some(v) = read(format!("/sys/fs/cgroup/memory/{group}/memory.limit_in_bytes")) {
        assert_eq!(v, (300u64 << 20).to_string(), "the flag's memory ceiling, not the control's");
        seen.push("memory");
    }
    if let Some(v) = read(format!("/sys/fs/cgroup/pids/{group}/pids.max")) {
        assert_eq!(v, "32");
        seen.push("pids");
    }
    if let Some(q) = read(format!("/sys/fs/cgroup/cpu/{group}/cpu.cfs_quota_us")) {
        let period = read(format!("/sys/fs/cgroup/cpu/{group}/cpu.cfs_period_us")).unwrap();
        assert_eq!((q.as_str(), period.as_str()), ("20000", "100000"), "cpu=20: a fifth of one CPU");
        seen.push("cpu");
    }
    // cgroup v2: one unified hierarchy.
    if let Some(v) = read(format!("/sys/fs/cgroup/{group}/memory.max")) {
        assert_eq!(v, (300u64 << 20).to_string(), "the flag's memory ceiling, not the control's");
        assert_eq!(read(format!("/sys/fs/cgroup/{group}/pids.max")).as_deref(), Some("32"));
        assert_eq!(read(format!("/sys/fs/cgroup/{group}/cpu.max")).as_deref(), Some("20000 100000"));
        seen.extend(["memory", "pids", "cpu"]);
    }
    seen.sort_unstable();
    assert_eq!(seen, ["cpu", "memory", "pids"], "every ceiling was found configured");
    assert!(up.wait().unwrap().success());
    // And held: the hog gets no more than the flag's 300 MiB.
    let hog = "mb = 0\nkeep = []\nwhile mb < 1024:\n    keep.append(bytearray(16 << 20)); mb += 16\n    open('/workspace/mem', 'w').write(str(mb))\n";
    let o = h
        .start("greedy", &session("mh"), &["--wait", "--memory", "300M"], &["/usr/bin/python3", "-c", hog])
        .output()
        .unwrap();
    assert_ne!(o.status.code(), Some(0), "the hog does not get its gigabyte: {}", text(&o));
    let mb: u32 = fs::read_to_string(h.work.join("mem")).unwrap().parse().unwrap();
    assert!(mb <= 300, "--memory 300M holds: {mb} MiB allocated");
    // Nothing of theirs is left in any hierarchy the host mounts: the groups go with the runs.
    let roots: Vec<String> = fs::read_to_string("/proc/self/mounts")
        .unwrap()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f.len() > 2 && (f[2] == "cgroup" || f[2] == "cgroup2")).then(|| f[1].to_owned())
        })
        .collect();
    assert!(!roots.is_empty(), "the host mounts cgroup hierarchies");
    for root in &roots {
        let left: Vec<String> = fs::read_dir(format!("{root}/cortexfs"))
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with("greedy."))
                    .collect()
            })
            .unwrap_or_default();
        assert!(left.is_empty(), "the runs' groups are removed from {root}: {left:?}");
    }
    // --no-ceilings starts without any: the bomb forks what the host allows.
    let o = h
        .start("greedy", &session("nc"), &["--wait", "--no-ceilings"], &["/usr/bin/python3", "-c", bomb])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let forked: u32 = fs::read_to_string(h.work.join("forked")).unwrap().parse().unwrap();
    assert!(forked >= 32, "without ceilings: {forked}");
}

#[test]
fn a_daemon_killed_under_eight_agents_loses_no_record_and_leaves_no_dead_view() {
    const AGENTS: u32 = 8;
    let mut h = Host::new();
    let names: Vec<String> = (0..AGENTS).map(|i| format!("k{i}")).collect();
    for (i, n) in names.iter().enumerate() {
        h.agent(n, 4000 + i as u32, &["--tool", "fs.read"]);
    }
    h.tool_policy("fs.read", &names.iter().map(|n| format!("{n}_t")).collect::<Vec<_>>());
    let s = session("k");
    /// Stops whatever is still running when the test ends, passed or not.
    struct Stop<'a>(&'a [String], String, String);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            for n in self.0 {
                let _ = ctx(&["agent", "stop", n, "--session", &self.1, "--control", &self.2]);
            }
        }
    }
    let control = h.s.control.to_str().unwrap().to_owned();
    let _stop = Stop(&names, s.clone(), control.clone());
    // Each agent counts the calls tsh acknowledged (both records durable) in its workspace.
    let script = "i=0; while true; do if /ctx/bin/tsh fs.read a.txt >/dev/null 2>&1; then \
                  i=$((i+1)); echo $i > /workspace/ok.$CTX_AGENT; fi; done";
    for n in &names {
        let o = h.start(n, &s, &[], &["/bin/sh", "-c", script]).output().unwrap();
        assert!(o.status.success(), "{n}: {}", text(&o));
    }
    let t = std::time::Instant::now();
    while names.iter().any(|n| !h.work.join(format!("ok.{n}")).exists()) {
        assert!(t.elapsed().as_secs() < 60, "every agent made a call");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    std::thread::sleep(std::time::Duration::from_millis(500));
    let mut daemon = h.s.child.take().unwrap();
    daemon.kill().unwrap();
    daemon.wait().unwrap();
    h.s.spawn();
    // Every run notices, is stopped, and its session says so.
    let t = std::time::Instant::now();
    loop {
        let ps = ctx(&["agent", "ps", "--control", &control]);
        let running = String::from_utf8_lossy(&ps.stdout).lines().filter(|l| l.contains(&s)).count();
        if running == 0 {
            break;
        }
        assert!(t.elapsed().as_secs() < 60, "{running} runs still going after the daemon died");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let log = fs::read_to_string(h.s.storage.join("tool/fs.read.d/log")).unwrap();
    let logged = whole_lines(&log);
    let mut acked_total = 0;
    for (i, n) in names.iter().enumerate() {
        let uid = 4000 + i as u32;
        let acked: usize =
            fs::read_to_string(h.work.join(format!("ok.{n}"))).unwrap().trim().parse().unwrap();
        acked_total += acked;
        let ev = h.events(uid, n, &s);
        whole_lines(&ev);
        let ok_calls = ev.lines().filter(|l| l.contains("\"tool.call\"") && l.contains("\"ok\"")).count();
        assert!(ok_calls >= acked, "{n}: {acked} acknowledged calls, {ok_calls} recorded");
        assert!(ev.contains("\"run.lost\""), "{n}: the session says the run was lost");
        let state =
            fs::read_to_string(h.s.storage.join(format!("home/{uid}/agent/{n}/session/{s}/state"))).unwrap();
        assert_eq!(state, "error\n", "{n}");
    }
    assert!(logged >= acked_total, "{acked_total} acknowledged, {logged} in the tool's log");
    let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap();
    for n in &names {
        let view = h.s.view_dir(n, &s);
        assert!(!mounts.contains(&format!("{} ", view.display())), "{n}: no view left mounted");
        assert!(!view.exists(), "{n}: no view directory left");
    }
}

#[test]
fn an_agent_with_its_own_uid_works_in_the_operators_workspace_only_as_its_modes_allow() {
    use std::os::unix::fs::MetadataExt;
    let h = Host::new();
    // Created without --uid: an identity of its own from the agents' range.
    ok(&["agent", "new", "editor", "--source", h.st()]);
    let uid: u32 =
        fs::read_to_string(h.s.storage.join("agent/editor.d/uid")).unwrap().trim().parse().unwrap();
    assert!(policy::ids::AGENT_IDS.contains(&uid), "{uid}");
    // The operator's workspace: 1234:1234, not writable by others, with one directory that is.
    let ws = h.s.dir.path().join("operator");
    fs::create_dir_all(ws.join("out")).unwrap();
    fs::write(ws.join("notes.txt"), "mine\n").unwrap();
    for p in [&ws, &ws.join("notes.txt"), &ws.join("out")] {
        rustix::fs::chown(p, Some(rustix::fs::Uid::from_raw(1234)), Some(rustix::fs::Gid::from_raw(1234)))
            .unwrap();
    }
    fs::set_permissions(&ws, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    fs::set_permissions(ws.join("out"), std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let script = "id -u > out/me; cat notes.txt > out/read; echo edited >> notes.txt; echo \"append $?\" > out/codes; \
                  chmod 666 notes.txt; echo \"chmod $?\" >> out/codes; printf 'draft\\n' > out/saved.txt; \
                  stat -c %u notes.txt > out/owner.seen";
    let o = Command::new(tests::bin("ctx"))
        .args(["agent", "start", "editor", "--session", &session("e"), "--wait", "--ctx"])
        .arg(&h.s.mnt)
        .arg("--control")
        .arg(&h.s.control)
        .arg("--cwd")
        .arg(&ws)
        .args(["--", "/bin/sh", "-c", script])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let read = |f: &str| fs::read_to_string(ws.join(f)).unwrap();
    assert_eq!(read("out/me").trim(), uid.to_string(), "the agent ran as itself");
    assert_eq!(read("out/read"), "mine\n", "it reads what others may read");
    assert_ne!(
        read("out/owner.seen").trim(),
        uid.to_string(),
        "inside, the operator's files are not the agent's"
    );
    assert_eq!(read("out/codes"), "append 2\nchmod 1\n", "neither written nor changed");
    assert_eq!(read("notes.txt"), "mine\n");
    let m = fs::metadata(ws.join("notes.txt")).unwrap();
    assert_eq!((m.uid(), m.mode() & 0o7777), (1234, 0o644), "the operator's file keeps its owner and mode");
    let m = fs::metadata(ws.join("out/saved.txt")).unwrap();
    assert_eq!(m.uid(), uid, "what the agent makes is its own, never the operator's");
}

#[test]
fn another_agents_sessions_appear_only_with_the_grants_that_name_them() {
    let h = Host::new();
    // Two agents on one uid: only the view keeps them apart.
    h.agent("bee", 5000, &[]);
    h.agent("wasp", 5000, &[]);
    let (s1, s2) = (session("one"), session("two"));
    for s in [&s1, &s2] {
        let o = h.start("bee", s, &["--wait"], &["/bin/true"]).output().unwrap();
        assert!(o.status.success(), "{}", text(&o));
    }
    let home = "/ctx/home/5000/agent/bee/session";
    let probe = |name: &str| {
        format!(
            "r=''; ls /ctx/home/5000/agent > /workspace/{name}.agents 2>&1; ls {home} > /workspace/{name}.sessions 2>&1; \
             cat {home}/{s1}/state >/dev/null 2>&1 && r=\"$r read1\"; cat {home}/{s2}/state >/dev/null 2>&1 && r=\"$r read2\"; \
             echo '{{\"type\":\"forged\"}}' >> {home}/{s1}/events.jsonl 2>/dev/null && r=\"$r append1\"; \
             echo '{{\"type\":\"forged\"}}' >> {home}/{s2}/events.jsonl 2>/dev/null && r=\"$r append2\"; \
             echo hacked > {home}/{s1}/latest.md 2>/dev/null && r=\"$r latest1\"; \
             echo \"$r\" > /workspace/{name}.did"
        )
    };
    let run = |name: &str, grants: &str| {
        let policy = h.s.storage.join("agent/wasp.d/policy");
        fs::write(&policy, grants).unwrap();
        let o =
            h.start("wasp", &session(name), &["--wait"], &["/bin/sh", "-c", &probe(name)]).output().unwrap();
        assert!(o.status.success(), "{}", text(&o));
        fs::read_to_string(h.work.join(format!("{name}.did"))).unwrap().trim().to_owned()
    };
    let read = |f: &str| fs::read_to_string(h.work.join(f)).unwrap();
    // No grant: bee does not exist for wasp.
    assert_eq!(run("none", ""), "");
    assert!(!read("none.agents").contains("bee"), "{}", read("none.agents"));
    // agent:bee read: all of it, read-only.
    assert_eq!(run("read", "allow wasp_t agent:bee read\n"), "read1 read2");
    assert!(read("read.agents").contains("bee"));
    // session:bee/<s1> read: that session only.
    assert_eq!(run("sread", &format!("allow wasp_t session:bee/{s1} read\n")), "read1");
    assert_eq!(read("sread.sessions").trim(), s1, "only the granted session is listed");
    // session:bee/<s1> write: that one, appendable and writable.
    assert_eq!(run("swrite", &format!("allow wasp_t session:bee/{s1} write\n")), "read1 append1 latest1");
    // agent:bee write: everything.
    assert_eq!(run("write", "allow wasp_t agent:bee write\n"), "read1 read2 append1 append2 latest1");
    let forged = h.events(5000, "bee", &s2).lines().filter(|l| l.contains("forged")).count();
    assert_eq!(forged, 1, "only the agent:bee write run appended to the second session");

    // An agent of its own uid: bee's home appears with the grant, and only bee in it.
    h.agent("ant", 5001, &[]);
    h.agent("moth", 5000, &[]);
    fs::write(h.s.storage.join("agent/ant.d/policy"), "allow ant_t agent:bee read\n").unwrap();
    let script = format!(
        "ls /ctx/home > /workspace/ant.homes; ls /ctx/home/5000/agent > /workspace/ant.agents; \
         cat {home}/{s1}/state > /workspace/ant.state"
    );
    let o = h.start("ant", &session("ant"), &["--wait"], &["/bin/sh", "-c", &script]).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(read("ant.homes").split_whitespace().collect::<Vec<_>>(), ["5000", "5001"]);
    assert_eq!(read("ant.agents").trim(), "bee", "moth and wasp stay hidden");
    assert_eq!(read("ant.state"), "done\n");
}

#[test]
fn resuming_another_agents_session_takes_the_resume_grant_and_a_shared_uid() {
    let h = Host::new();
    h.agent("owner", 5100, &[]);
    h.agent("helper", 5100, &["--tool", "fs.read"]);
    h.agent("stranger", 5101, &["--tool", "fs.read"]);
    h.tool_policy("fs.read", &["helper_t".to_owned(), "stranger_t".to_owned()]);
    let s = session("r");
    let o = h.start("owner", &s, &["--wait"], &["/bin/true"]).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let resume = |who: &str| {
        h.start(who, &s, &["--wait", "--resume", "owner"], &["/bin/sh", "-c", "/ctx/bin/tsh fs.read a.txt"])
            .output()
            .unwrap()
    };
    let policy = |who: &str, extra: &str| {
        fs::write(
            h.s.storage.join(format!("agent/{who}.d/policy")),
            format!("allow {who}_t tool:fs.read execute\n{extra}"),
        )
        .unwrap();
    };
    let o = resume("helper");
    assert_eq!(o.status.code(), Some(13), "no grant: {}", text(&o));
    policy("helper", &format!("allow helper_t session:owner/{s} read\n"));
    let o = resume("helper");
    assert_eq!(o.status.code(), Some(13), "read is not resume: {}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains(&format!("session:owner/{s} resume")),
        "{}",
        text(&o)
    );
    policy("helper", &format!("allow helper_t session:owner/{s} resume\n"));
    let o = resume("helper");
    assert!(o.status.success(), "{}", text(&o));
    let ev = h.events(5100, "owner", &s);
    assert!(
        ev.lines().any(|l| l.contains("\"tool.call\"") && l.contains("\"agent\":\"helper\"")),
        "the helper's call is in the owner's session: {ev}"
    );
    assert!(
        !h.s.storage.join(format!("home/5100/agent/helper/session/{s}")).exists(),
        "no session of its own"
    );
    // Another uid: Linux permissions would refuse its writes, so it does not start.
    policy("stranger", &format!("allow stranger_t session:owner/{s} resume\n"));
    let o = resume("stranger");
    assert_eq!(o.status.code(), Some(13), "{}", text(&o));
}

#[test]
fn every_agent_control_counts_at_launch() {
    use std::os::unix::fs::PermissionsExt;
    let h = Host::new();
    let tree = h.s.dir.path().join("tree");
    fs::create_dir_all(&tree).unwrap();
    fs::write(tree.join("run.sh"), "#!/bin/sh\necho ran\n").unwrap();
    fs::set_permissions(tree.join("run.sh"), fs::Permissions::from_mode(0o755)).unwrap();
    let locked = h.s.dir.path().join("grouponly");
    fs::create_dir_all(&locked).unwrap();
    fs::write(locked.join("f"), "group\n").unwrap();
    // A setuid-root program on a nosuid bind runs as the agent.
    fs::copy("/usr/bin/id", locked.join("suid-id")).unwrap();
    fs::set_permissions(locked.join("suid-id"), fs::Permissions::from_mode(0o4755)).unwrap();
    rustix::fs::chown(&locked, None, Some(rustix::fs::Gid::from_raw(4242))).unwrap();
    fs::set_permissions(&locked, fs::Permissions::from_mode(0o770)).unwrap();
    let t = tree.to_str().unwrap();
    let l = locked.to_str().unwrap();
    h.agent(
        "ctl",
        6000,
        &[
            "--groups",
            "4242",
            "--shared",
            "proj:read",
            "--mount",
            t,
            "/tree",
            "rw,noexec,nosuid,nodev",
            "--mount",
            l,
            "/grouponly",
            "ro",
        ],
    );
    let d = h.s.storage.join("agent/ctl.d");
    fs::write(d.join("env"), "FOO=bar\n# a comment\nLANG=C\n").unwrap();
    fs::write(d.join("cwd"), "/tmp\n").unwrap();
    fs::create_dir_all(h.s.storage.join("shared/proj/tool")).unwrap();
    let g = locked.display();
    let script = format!(
        "pwd > /workspace/pwd; env > /workspace/env; /tree/run.sh > /workspace/exec 2>&1; echo $? >> /workspace/exec; \
         grep ' /tree ' /proc/self/mountinfo > /workspace/tree; touch /workspace/made; \
         ls {g} > /workspace/group 2>&1; {g}/suid-id -u > /workspace/suid 2>&1; \
         grep ' /grouponly ' /proc/self/mountinfo > /workspace/grouponly"
    );
    let o = Command::new("/bin/sh")
        .arg("-c")
        .arg("umask 000; exec \"$@\"")
        .arg("sh")
        .arg(tests::bin("ctx"))
        .args(["agent", "start", "ctl", "--session", &session("c"), "--wait", "--ctx"])
        .arg(&h.s.mnt)
        .arg("--control")
        .arg(&h.s.control)
        .arg("--cwd")
        .arg(&h.work)
        .args(["--", "/bin/sh", "-c", &script.replace(&g.to_string(), "/grouponly")])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let read = |f: &str| fs::read_to_string(h.work.join(f)).unwrap_or_default();
    assert_eq!(read("pwd"), "/tmp\n", "cwd");
    let env = read("env");
    assert!(env.lines().any(|l| l == "FOO=bar"), "env: {env}");
    let ctx_path = env.lines().find_map(|l| l.strip_prefix("CTX_PATH=")).unwrap_or_default().to_owned();
    assert!(
        ctx_path.split(':').any(|p| p == "/ctx/shared/proj/tool"),
        "CTX_PATH has the space's tools: {ctx_path}"
    );
    assert!(read("exec").contains("Permission denied"), "noexec refuses an exec: {}", read("exec"));
    let tree_line = read("tree");
    for flag in ["nosuid", "nodev", "noexec"] {
        assert!(tree_line.contains(flag), "{flag} on /tree: {tree_line}");
    }
    let mode = fs::metadata(h.work.join("made")).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o644, "the sandbox's umask, whatever the operator's");
    assert_eq!(read("group"), "f\nsuid-id\n", "the agent's supplementary group opens what it owns");
    assert_eq!(read("suid"), "6000\n", "a setuid bit on a nosuid bind is ignored");
    assert!(read("grouponly").contains("nosuid"), "{}", read("grouponly"));
    // A reserved variable is refused before anything starts.
    fs::write(d.join("env"), "PATH=/evil\n").unwrap();
    let o = h.start("ctl", &session("r"), &["--wait"], &["/bin/true"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("PATH is set by the launcher"), "{}", text(&o));
    fs::write(d.join("env"), "").unwrap();
    // A run that outlives its timeout is stopped, and its session says so.
    let s = session("t");
    let o = h.start("ctl", &s, &["--wait", "--timeout", "1"], &["/bin/sleep", "30"]).output().unwrap();
    // Stopped, not ended: a sleep that ran out would have ended with 0.
    assert_ne!(o.status.code(), Some(0), "{}", text(&o));
    assert!(h.events(6000, "ctl", &s).contains("\"run.timeout\""), "{}", h.events(6000, "ctl", &s));
    let state =
        fs::read_to_string(h.s.storage.join(format!("home/6000/agent/ctl/session/{s}/state"))).unwrap();
    assert_eq!(state, "error\n");
}

/// Two rounds of 64 starts at once (8 agents of their own uids, 8 sessions each): every
/// `ctx agent start --wait` returns the exit status of its own run (each run's status is
/// different), each session records exactly one `run.end` with that code, and nothing is left
/// running after a round.
#[test]
fn two_rounds_of_64_starts_at_once_each_return_their_own_exit_status() {
    const AGENTS: u32 = 8;
    const SESSIONS: u32 = 8;
    let h = Host::new();
    for a in 0..AGENTS {
        h.agent(&format!("f{a}"), 3710 + a, &[]);
    }
    for round in 0..2 {
        let runs: Vec<_> = (0..AGENTS * SESSIONS)
            .map(|i| {
                let (a, k) = (i / SESSIONS, i % SESSIONS);
                let s = session(&format!("r{round}k{k}"));
                // 100..=227: none is a status ctx itself answers with.
                let code = 100 + round * AGENTS * SESSIONS + i;
                let child = h
                    .start(&format!("f{a}"), &s, &["--wait"], &["/bin/sh", "-c", &format!("exit {code}")])
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap();
                (a, s, code, child)
            })
            .collect();
        for (a, s, code, child) in runs {
            let o = child.wait_with_output().unwrap();
            assert_eq!(o.status.code(), Some(code as i32), "round {round}, f{a} {s}: {}", text(&o));
            let ends: Vec<serde_json::Value> = h
                .events(3710 + a, &format!("f{a}"), &s)
                .lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .filter(|v| v["type"] == "run.end")
                .collect();
            assert_eq!(ends.len(), 1, "round {round}, f{a} {s}: one run.end: {ends:?}");
            assert_eq!(ends[0]["code"], code, "round {round}, f{a} {s}: {}", ends[0]);
        }
        let ps = ctx(&["agent", "ps", "--control", h.s.control.to_str().unwrap()]);
        assert!(ps.status.success(), "{}", text(&ps));
        let left: Vec<&str> = std::str::from_utf8(&ps.stdout).unwrap().lines().skip(1).collect();
        assert!(left.is_empty(), "round {round}: nothing left running: {left:?}");
    }
}
