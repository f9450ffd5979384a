//! Root never acts on what an agent controls: each test is a way out of the sandbox a hostile
//! agent tried, reproduced from inside a real sandbox, and what must hold instead.

use std::fs;
use std::os::unix::fs::PermissionsExt;
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

/// Runs `script` in a sandbox of `name` (session `session`), workspace `work`.
fn run_in(s: &Served, name: &str, session: &str, work: &Path, script: &str) -> Output {
    Command::new(tests::bin("ctx"))
        .args(["agent", "start", name, "--session", session, "--wait", "--ctx"])
        .arg(&s.mnt)
        .arg("--control")
        .arg(&s.control)
        .arg("--cwd")
        .arg(work)
        .args(["--", "/bin/sh", "-c", script])
        .output()
        .unwrap()
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
    let out = Command::new(tests::bin("ctx"))
        .args(["agent", "start", name, "--session", session, "--ctx"])
        .arg(&s.mnt)
        .arg("--control")
        .arg(&s.control)
        .arg("--cwd")
        .arg(work)
        .args(["--", "/bin/sh", "-c", script])
        .output()
        .unwrap();
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
    let bb_sock = format!("/run/cortexfs/agent/tsbb/{sb}/term/main.sock");
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
    let sent = ctx(&["agent", "send", "tsaa", "touch /workspace/pwned", "--session", &sa]);
    std::thread::sleep(std::time::Duration::from_millis(500));
    let _ = ctx(&["agent", "stop", "tsaa", "--session", &sa]);
    let _ = ctx(&["agent", "stop", "tsbb", "--session", &sb]);
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
    let bound = Command::new("mount").arg("--bind").arg(work.path()).arg(run.join("workspace")).status().unwrap();
    assert!(bound.success());
    let out = ctx(&["doctor", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let runs = v.as_array().unwrap().iter().find(|c| c["name"] == "runs").cloned().unwrap_or_default();
    assert!(runs["detail"].as_str().unwrap_or("").contains(run.to_str().unwrap()), "{v}");
    assert!(!runs["fix"].as_str().unwrap_or("").contains("rm -r"), "{runs}");
    let _ = ctx(&["doctor", "--fix-runs"]);
    let mounted = fs::read_to_string("/proc/self/mountinfo").unwrap();
    if mounted.contains(run.to_str().unwrap()) {
        let _ = Command::new("umount").arg("-l").arg(run.join("workspace")).status();
    }
    assert_eq!(fs::read_to_string(work.path().join("precious")).unwrap(), "the operator's\n");
    assert!(!run.exists(), "the stale run's state is gone");
    let _ = fs::remove_dir(run.parent().unwrap());
}
