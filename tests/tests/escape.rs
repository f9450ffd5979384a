//! Root never acts on what an agent controls: each test is a way out of the sandbox a hostile
//! agent tried, reproduced from inside a real sandbox, and what must hold instead.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use tests::served::Served;

fn ctx(args: &[&str]) -> Output {
    Command::new(tests::bin("ctx")).args(args).output().unwrap()
}

fn chown(p: &Path, uid: u32) {
    rustix::fs::chown(p, Some(rustix::fs::Uid::from_raw(uid)), Some(rustix::fs::Gid::from_raw(uid))).unwrap();
}

/// An agent `name` with its own uid and the given tools, each granted in both policies.
fn agent(s: &Served, name: &str, uid: u32, tools: &[&str], extra_policy: &str) {
    let st = s.storage.to_str().unwrap();
    let u = uid.to_string();
    let mut args = vec!["agent", "new", name, "--uid", &u, "--gid", &u, "--source", st];
    for t in tools {
        args.extend(["--tool", t]);
    }
    let out = ctx(&args);
    assert!(out.status.success(), "{}", tests::shown(&out));
    let policy = s.storage.join(format!("agent/{name}.d/policy"));
    let mut p = fs::read_to_string(&policy).unwrap();
    p.push_str(extra_policy);
    fs::write(&policy, p).unwrap();
    for t in tools {
        let tp = s.storage.join(format!("tool/{t}.d/policy"));
        let mut p = fs::read_to_string(&tp).unwrap_or_default();
        p.push_str(&format!("allow {name}_t tool:{t} execute\n"));
        fs::write(tp, p).unwrap();
    }
}

/// A workspace owned by `uid`.
fn workspace(s: &Served, name: &str, uid: u32) -> PathBuf {
    let w = s.dir.path().join(name);
    fs::create_dir_all(&w).unwrap();
    chown(&w, uid);
    w
}

/// `ctx agent start NAME --session SESSION [FLAGS] ... --cwd WORK -- /bin/sh -c SCRIPT`, run.
fn start(s: &Served, name: &str, session: &str, flags: &[&str], work: &Path, script: &str) -> Output {
    Command::new(tests::bin("ctx"))
        .args(["agent", "start", name, "--session", session])
        .args(flags)
        .arg("--ctx")
        .arg(&s.mnt)
        .arg("--control")
        .arg(&s.control)
        .arg("--cwd")
        .arg(work)
        .args(["--", "/bin/sh", "-c", script])
        .output()
        .unwrap()
}

/// Runs `script` in a sandbox of `name` (session `session`), workspace `work`.
fn run_in(s: &Served, name: &str, session: &str, work: &Path, script: &str) -> Output {
    start(s, name, session, &["--wait"], work, script)
}

/// A root-only file of the host with `text` in it.
fn victim(s: &Served, name: &str, text: &str) -> PathBuf {
    let v = s.dir.path().join(name);
    fs::write(&v, text).unwrap();
    fs::set_permissions(&v, fs::Permissions::from_mode(0o600)).unwrap();
    v
}

#[test]
fn child_records_never_write_or_read_through_an_agents_symlink() {
    let s = Served::start();
    let st = s.storage.to_str().unwrap().to_owned();
    assert!(ctx(&["bootstrap", &st]).status.success());
    let uid = 1310;
    agent(
        &s,
        "rparent",
        uid,
        &["agent.start", "agent.stop"],
        "allow rparent_t agent:rkid create\nallow rparent_t agent:rkid start\n",
    );
    agent(&s, "rkid", uid, &[], "");
    fs::write(s.storage.join("agent/rkid.d/parent"), "rparent\n").unwrap();
    let target = victim(&s, "etc-x", "root's own\n");
    let secret = victim(&s, "shadow", "root-only secret\n");
    let work = workspace(&s, "work", uid);
    let session = tests::unique("esc");
    // As seen: the agent plants handoff.md (and the record's status) as symlinks to host files,
    // then asks root to start its child.
    let script = format!(
        r#"D=$CTX_HOME/agent/rparent/session/$CTX_SESSION/context/child/rkid.k1; mkdir -p $D
ln -s {t} $D/handoff.md
ln -s {t} $D/result.md
ln -s {sec} $D/agent
/ctx/bin/tsh agent.start '{{"name":"rkid","session":"k1","handoff":"PWNED\n","cmd":["/bin/true"]}}' > /workspace/start.out 2>&1
echo $? > /workspace/code
# The status link is planted once the record exists: reap and cancel read and write it.
sleep 1; rm -f $D/status; ln -s {t} $D/status; sleep 1"#,
        t = target.display(),
        sec = secret.display()
    );
    let out = run_in(&s, "rparent", &session, &work, &script);
    assert!(out.status.success(), "{}", tests::shown(&out));
    assert_eq!(
        fs::read_to_string(&target).unwrap(),
        "root's own\n",
        "root wrote through the agent's symlink"
    );
    let start = fs::read_to_string(work.join("start.out")).unwrap_or_default();
    assert_ne!(fs::read_to_string(work.join("code")).unwrap().trim(), "0", "the start is refused: {start}");
    // `ctx agent children` reads the records without following the links.
    let m = s.mnt.to_str().unwrap();
    let list = ctx(&["agent", "children", "rparent", "--session", &session, "--ctx", m]);
    let shown = tests::shown(&list);
    assert!(!shown.contains("root-only secret"), "{shown}");
    assert_eq!(fs::read_to_string(&target).unwrap(), "root's own\n");
}

/// Starts `name` (session `session`) with a terminal running `script`, and returns once it
/// answers.
fn start_live(s: &Served, name: &str, session: &str, work: &Path, script: &str) {
    let out = start(s, name, session, &[], work, script);
    assert!(out.status.success(), "{}", tests::shown(&out));
}

#[test]
fn the_operators_line_never_reaches_another_agents_terminal() {
    let s = Served::start();
    let st = s.storage.to_str().unwrap().to_owned();
    assert!(ctx(&["bootstrap", &st]).status.success());
    agent(&s, "tsaa", 1321, &[], "");
    agent(&s, "tsbb", 1322, &[], "");
    let (wa, wb) = (workspace(&s, "wa", 1321), workspace(&s, "wb", 1322));
    let (sa, sb) = (tests::unique("ta"), tests::unique("tb"));
    // bb's terminal runs a shell that does what it is typed.
    start_live(&s, "tsbb", &sb, &wb, "exec /bin/sh -i");
    // As seen: aa replaces its terminal socket with a link to bb's.
    let bb_sock = s.run_dir("tsbb", &sb).join("term/main.sock");
    let bb_sock = bb_sock.display();
    let script = format!(
        "sleep 1; rm -f /run/cortexfs/terminal/main.sock; ln -s {bb_sock} /run/cortexfs/terminal/main.sock; \
         touch /workspace/planted; sleep 60"
    );
    start_live(&s, "tsaa", &sa, &wa, &script);
    for _ in 0..100 {
        if wa.join("planted").exists() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(wa.join("planted").exists(), "aa planted its link");
    let control = s.control.to_str().unwrap();
    let sent =
        ctx(&["agent", "send", "tsaa", "touch /workspace/pwned", "--session", &sa, "--control", control]);
    std::thread::sleep(std::time::Duration::from_millis(500));
    let _ = ctx(&["agent", "stop", "tsaa", "--session", &sa, "--control", control]);
    let _ = ctx(&["agent", "stop", "tsbb", "--session", &sb, "--control", control]);
    assert!(!wb.join("pwned").exists(), "the operator's line ran in bb: {}", tests::shown(&sent));
    assert_eq!(sent.status.code(), Some(69), "{}", tests::shown(&sent));
}

#[test]
fn the_doctors_cleanup_never_deletes_through_a_mount_left_in_a_run() {
    // A run whose supervisor is gone, its workspace still bound in its run directory (a
    // supervisor killed with kill -9 leaves it so).
    let run = PathBuf::from(format!("/run/cortexfs/agent/docfix/{}", tests::unique("d")));
    fs::create_dir_all(run.join("workspace")).unwrap();
    let mut dead = Command::new("true").spawn().unwrap();
    let pid = dead.id();
    dead.wait().unwrap();
    fs::write(run.join("pid"), pid.to_string()).unwrap();
    let work = tempfile::tempdir().unwrap();
    fs::write(work.path().join("precious"), "the operator's\n").unwrap();
    let bound =
        Command::new("mount").arg("--bind").arg(work.path()).arg(run.join("workspace")).status().unwrap();
    assert!(bound.success());
    // An ended run an older daemon kept (its status and log, no pid), unchanged for minutes, is
    // stale too; a directory just made (a run being prepared) is not.
    let old = run.parent().unwrap().join(tests::unique("old"));
    fs::create_dir_all(&old).unwrap();
    fs::write(old.join("exit"), "0\n").unwrap();
    fs::write(old.join("log"), "ended\n").unwrap();
    assert!(Command::new("touch").args(["-d", "5 minutes ago"]).arg(&old).status().unwrap().success());
    let fresh = run.parent().unwrap().join(tests::unique("fresh"));
    fs::create_dir_all(&fresh).unwrap();
    let out = ctx(&["doctor", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let runs = v.as_array().unwrap().iter().find(|c| c["name"] == "runs").cloned().unwrap_or_default();
    assert!(runs["detail"].as_str().unwrap_or("").contains(run.to_str().unwrap()), "{v}");
    let detail = runs["detail"].as_str().unwrap_or("");
    assert!(detail.contains(old.to_str().unwrap()) && !detail.contains(fresh.to_str().unwrap()), "{v}");
    assert!(!runs["fix"].as_str().unwrap_or("").contains("rm -r"), "{runs}");
    let _ = ctx(&["doctor", "--fix-runs"]);
    let mounted = fs::read_to_string("/proc/self/mountinfo").unwrap();
    if mounted.contains(run.to_str().unwrap()) {
        let _ = Command::new("umount").arg("-l").arg(run.join("workspace")).status();
    }
    assert_eq!(fs::read_to_string(work.path().join("precious")).unwrap(), "the operator's\n");
    assert!(!run.exists(), "the stale run's state is gone");
    assert!(!old.exists() && fresh.exists(), "the old ended run goes, the one being prepared stays");
    fs::remove_dir(&fresh).unwrap();
    let _ = fs::remove_dir(run.parent().unwrap());
}

#[test]
fn a_root_owned_workspace_lends_no_ownership_and_keeps_no_setuid_file() {
    let s = Served::start();
    let st = s.storage.to_str().unwrap().to_owned();
    assert!(ctx(&["bootstrap", &st]).status.success());
    agent(&s, "suider", 1331, &[], "");
    // The workspace as `ctx agent start` from a root shell gives it: root's, with one
    // directory anyone may write.
    let work = s.dir.path().join("rootwork");
    fs::create_dir_all(work.join("open")).unwrap();
    fs::set_permissions(&work, fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(work.join("open"), fs::Permissions::from_mode(0o777)).unwrap();
    fs::write(work.join("op.sh"), "echo operator\n").unwrap();
    fs::set_permissions(work.join("op.sh"), fs::Permissions::from_mode(0o644)).unwrap();
    let script = r#"cd /workspace/open
cp /usr/bin/id x; chmod 6755 x; echo "chmod $?" >> codes
chmod 4755 x; echo "chmod-suid $?" >> codes
chmod 777 /workspace/op.sh; echo "chmod-op $?" >> codes
python3 -c 'import os; os.close(os.open("y", os.O_CREAT|os.O_WRONLY, 0o4755))'; echo "create $?" >> codes
python3 -c 'import os; os.mkdir("d", 0o2775)'; echo "mkdir $?" >> codes
python3 -c 'import ctypes, os, struct
libc = ctypes.CDLL(None, use_errno=True)
how = ctypes.create_string_buffer(struct.pack("QQQ", os.O_CREAT | os.O_WRONLY, 0o4755, 0))
r = libc.syscall(437, -100, b"z", how, 24)
print("openat2", r, ctypes.get_errno())' >> codes
touch /workspace/mine; echo "touch-root-dir $?" >> codes
"#;
    let session = tests::unique("su");
    let out = run_in(&s, "suider", &session, &work, script);
    assert!(out.status.success(), "{}", tests::shown(&out));
    let codes = fs::read_to_string(work.join("open/codes")).unwrap();
    use std::os::unix::fs::MetadataExt;
    let walk = |p: &Path| -> Vec<(PathBuf, u32, u32)> {
        let mut out = Vec::new();
        let mut stack = vec![p.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in fs::read_dir(&d).unwrap().flatten() {
                let m = fs::symlink_metadata(e.path()).unwrap();
                if m.is_dir() {
                    stack.push(e.path());
                }
                out.push((e.path(), m.mode(), m.uid()));
            }
        }
        out
    };
    for (p, mode, uid) in walk(&work) {
        assert_eq!(
            mode & 0o6000,
            0,
            "{} is setuid or setgid on the host ({mode:o}); codes:\n{codes}",
            p.display()
        );
        if p.starts_with(work.join("open")) && p != work.join("open") {
            assert_eq!(uid, 1331, "{} is the agent's, not root's", p.display());
        }
    }
    // openat2, whose mode the filter cannot read, is not there: the setuid file is never made.
    assert!(codes.contains(&format!("openat2 -1 {}", libc::ENOSYS)), "{codes}");
    assert!(!work.join("open/z").exists(), "{codes}");
    let op = fs::metadata(work.join("op.sh")).unwrap();
    assert_eq!((op.mode() & 0o7777, op.uid()), (0o644, 0), "the operator's file keeps its mode: {codes}");
    assert!(!work.join("mine").exists(), "root's directory is not the agent's to write: {codes}");
}

#[test]
fn a_headless_runs_terminal_owner_cannot_be_read_robbed_or_bypassed() {
    let s = Served::start();
    let st = s.storage.to_str().unwrap().to_owned();
    assert!(ctx(&["bootstrap", &st]).status.success());
    agent(&s, "prober", 1332, &[], "");
    let work = workspace(&s, "probe", 1332);
    // As seen: in a --wait run, /proc/2/mem (ctxterm) opened read-write, its descriptors taken
    // with pidfd_getfd, and io_uring_setup returning a ring.
    let probe = r#"
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
def call(*a):
    r = libc.syscall(*a)
    return "ok" if r >= 0 else os.strerror(ctypes.get_errno())
out = []
try:
    open("/proc/2/mem", "r+b"); out.append("mem ok")
except OSError as e:
    out.append("mem " + e.strerror)
try:
    fd = os.pidfd_open(2); out.append("getfd " + call(438, fd, 0, 0))
except OSError as e:
    out.append("getfd " + e.strerror)
params = ctypes.create_string_buffer(120)
out.append("uring " + call(425, 8, params))
out.append("enter " + call(426, 0, 0, 0, 0, 0, 0))
open("/workspace/probe.out", "w").write("\n".join(out) + "\n")
"#;
    fs::write(work.join("probe.py"), probe).unwrap();
    chown(&work.join("probe.py"), 1332);
    let out = run_in(&s, "prober", &tests::unique("pr"), &work, "python3 /workspace/probe.py");
    assert!(out.status.success(), "{}", tests::shown(&out));
    let got = fs::read_to_string(work.join("probe.out")).unwrap();
    for l in got.lines() {
        assert!(!l.ends_with(" ok"), "{got}");
    }
    assert!(got.contains("uring Operation not permitted"), "{got}");
    assert!(
        got.contains("getfd Operation not permitted") || got.contains("getfd Permission denied"),
        "{got}"
    );
}

/// A package directory whose one agent ships the given controls (name -> contents).
fn evil_package(dir: &Path, name: &str, controls: &[(&str, &str)]) {
    fs::create_dir_all(dir.join("bin")).unwrap();
    fs::write(dir.join("bin/agent"), "#!/bin/sh\nexec tsh\n").unwrap();
    fs::set_permissions(dir.join("bin/agent"), fs::Permissions::from_mode(0o755)).unwrap();
    let mut toml = format!(
        "[package]\nname = \"{name}\"\nversion = \"1.0.0\"\n\n[[agent]]\nname = \"{name}\"\nexecutable = \"bin/agent\"\n[agent.controls]\n"
    );
    for (c, text) in controls {
        fs::write(dir.join(c), text).unwrap();
        toml.push_str(&format!("{c} = \"{c}\"\n"));
    }
    fs::write(dir.join("cortexfs.toml"), toml).unwrap();
}

#[test]
fn no_way_of_making_an_agent_takes_another_agents_identity_or_root() {
    let s = Served::start();
    let st = s.storage.to_str().unwrap().to_owned();
    assert!(ctx(&["bootstrap", &st]).status.success());
    agent(&s, "idaa", 1341, &["fs.read"], "");
    // As seen: a package's agent wearing aa's label and uid (or uid 0).
    for (i, controls) in [
        vec![("label", "idaa_t\n"), ("uid", "1341\n"), ("gid", "1341\n")],
        vec![("label", "idaa_t\n")],
        vec![("uid", "0\n"), ("gid", "0\n")],
    ]
    .into_iter()
    .enumerate()
    {
        let dir = s.dir.path().join(format!("pkg{i}"));
        let name = format!("idevil{i}");
        evil_package(&dir, &name, &controls);
        let out = ctx(&["install", dir.to_str().unwrap(), "--source", &st]);
        assert_eq!(out.status.code(), Some(2), "{controls:?}: {}", tests::shown(&out));
        assert!(!s.storage.join(format!("agent/{name}")).exists(), "{controls:?}");
    }
    // `agent new`: root only when meant; a uid another agent holds is said aloud.
    let out = ctx(&["agent", "new", "idroot", "--uid", "0", "--gid", "0", "--source", &st]);
    assert_eq!(out.status.code(), Some(2), "{}", tests::shown(&out));
    let out = ctx(&["agent", "new", "idroot", "--uid", "0", "--gid", "0", "--allow-root", "--source", &st]);
    assert!(out.status.success(), "{}", tests::shown(&out));
    let out = ctx(&["agent", "new", "idtwin", "--uid", "1341", "--gid", "1341", "--source", &st]);
    assert!(out.status.success(), "{}", tests::shown(&out));
    assert!(
        tests::shown(&out).contains("agent/idaa"),
        "a shared uid is warned about: {}",
        tests::shown(&out)
    );
    // Two storages on one host never give the same uid.
    let other = Served::start();
    let ost = other.storage.to_str().unwrap().to_owned();
    let first = ctx(&["agent", "new", "fresh1", "--source", &st]);
    let second = ctx(&["agent", "new", "fresh2", "--source", &ost]);
    assert!(first.status.success() && second.status.success());
    let uid = |s: &Served, n: &str| fs::read_to_string(s.storage.join(format!("agent/{n}.d/uid"))).unwrap();
    assert_ne!(uid(&s, "fresh1"), uid(&other, "fresh2"));
}

#[test]
fn a_tool_runs_as_the_object_executed_whatever_its_argv0() {
    let s = Served::start();
    let st = s.storage.to_str().unwrap().to_owned();
    assert!(ctx(&["bootstrap", &st]).status.success());
    agent(&s, "argv0", 1351, &["fs.read"], "");
    let work = workspace(&s, "a0", 1351);
    fs::write(work.join("note"), "hi\n").unwrap();
    chown(&work.join("note"), 1351);
    // As seen: exec -a names shell.exec while the kernel executes fs.read.
    let script = r#"cd /workspace; bash -c 'exec -a /ctx/tool/shell.exec /ctx/tool/fs.read id' > out 2>&1; echo $? > code"#;
    let out = run_in(&s, "argv0", &tests::unique("a0"), &work, script);
    assert!(out.status.success(), "{}", tests::shown(&out));
    let got = fs::read_to_string(work.join("out")).unwrap_or_default();
    assert!(!got.contains("uid="), "shell.exec's code ran from the fs.read object: {got}");
}

/// The daemon made an agent's view directory by path inside the agent's own directory of its
/// view root: a symlink the agent left where its next view goes had root mount the view (the
/// agent's authority, readable through it) on whatever the link named.
#[test]
fn a_view_is_never_mounted_through_a_link_in_the_agents_view_directory() {
    let s = Served::start();
    agent(&s, "vw", 61771, &[], "");
    let control = s.control.to_str().unwrap();
    let made = ctx(&["view", "create", "--agent", "vw", "--session", "s0", "--control", control]);
    assert!(made.status.success(), "{}", tests::shown(&made));
    let own = policy::runtime::views_root(&s.control).join("vw");
    assert_eq!(fs::metadata(&own).unwrap().uid(), 61771, "the agent's view directory is its own");
    // As the agent: a link where the view of session s1 goes.
    let target = s.dir.path().join("elsewhere");
    fs::create_dir_all(&target).unwrap();
    let planted = Command::new("setpriv")
        .args(["--reuid=61771", "--regid=61771", "--clear-groups", "--", "ln", "-s"])
        .arg(&target)
        .arg(own.join("s1"))
        .status()
        .unwrap();
    assert!(planted.success());
    let out = ctx(&["view", "create", "--agent", "vw", "--session", "s1", "--control", control]);
    assert_ne!(out.status.code(), Some(0), "{}", tests::shown(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("s1"), "{}", tests::shown(&out));
    let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.lines().any(|l| l.split(' ').nth(4) == target.to_str()), "mounted through the link");
    assert!(fs::symlink_metadata(own.join("s1")).unwrap().file_type().is_symlink(), "the link is left alone");
    // The view made before is removed through the directory, and the link stays.
    let rm = ctx(&["view", "rm", own.join("s0").to_str().unwrap(), "--control", control]);
    assert!(rm.status.success(), "{}", tests::shown(&rm));
    assert!(!own.join("s0").exists());
}
