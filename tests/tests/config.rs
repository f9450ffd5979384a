//! Configuration by commit: what agents are served changes only when a generation is
//! committed, all of it at once; a restart serves the last commit; rollback; the commands'
//! own commits.

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};
use tests::served::Served;

use crate::mount::{ctx, names, object};

fn ok(args: &[&str]) -> String {
    let o = ctx(args);
    assert!(o.status.success(), "ctx {args:?}: {}", tests::shown(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Waits (up to 10 s) until `f` holds, then asserts it.
fn until(what: &str, f: impl Fn() -> bool) {
    let t = Instant::now();
    while !f() && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(f(), "{what}");
}

fn generation(status_file: &Path) -> Option<String> {
    let s = fs::read_to_string(status_file).ok()?;
    s.lines().find_map(|l| l.strip_prefix("generation ")).map(str::to_owned)
}

fn coder(st: &Path) {
    object(
        st,
        "agent",
        "coder",
        &[("label", "coder_t\n"), ("uid", "1000\n"), ("policy", "allow coder_t tool:hello execute\n")],
    );
    object(st, "tool", "hello", &[("policy", "allow coder_t tool:hello execute\n")]);
    object(st, "tool", "other", &[("policy", "allow coder_t tool:other execute\n")]);
    fs::create_dir_all(st.join("home/1000")).unwrap();
}

#[test]
fn an_edit_is_seen_by_no_agent_until_it_is_committed_then_all_at_once() {
    let s = Served::start();
    let st = &s.storage;
    let src = st.to_str().unwrap();
    coder(st);
    assert!(ok(&["config", "commit", "--source", src, "-m", "first generation"]).contains("active"));
    let v = s.dir.path().join("v");
    s.view("coder", "s1", &v);
    assert_eq!(
        generation(&v.join("status")),
        generation(&s.p("status")),
        "the view serves the active generation"
    );
    assert_eq!(names(&v.join("tool")), ["hello", "hello.d"]);

    // Edits of two objects, through the host mount and by hand: staged, seen by no agent.
    fs::write(
        s.p("agent/coder.d/policy"),
        "allow coder_t tool:hello execute\nallow coder_t tool:other execute\n",
    )
    .unwrap();
    fs::write(st.join("tool/hello.d/policy"), "").unwrap();
    assert_eq!(ok(&["config", "status", "--source", src]), "M agent/coder.d/policy\nM tool/hello.d/policy\n");
    assert!(ok(&["config", "diff", "--source", src]).contains("+allow coder_t tool:other execute\n"));
    for _ in 0..3 {
        assert_eq!(names(&v.join("tool")), ["hello", "hello.d"], "an edit is not active");
        assert_eq!(
            fs::read_to_string(v.join("agent/coder.d/policy")).unwrap(),
            "allow coder_t tool:hello execute\n"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The object log is runtime state: listed and appended beside the generation.
    assert!(names(&v.join("agent/coder.d")).contains(&"policy".to_string()));

    // Committed: both changes at once.
    ok(&["config", "commit", "--source", src, "-m", "other for coder, hello for nobody"]);
    until("the commit is served", || names(&v.join("tool")) == ["hello.d", "other", "other.d"]);
    assert_eq!(generation(&v.join("status")), generation(&s.p("status")));
    assert!(ok(&["config", "status", "--source", src]).is_empty());
    let log = ok(&["config", "log", "--source", src]);
    let first = log.lines().next().unwrap();
    assert!(first.contains("uid 0: other for coder, hello for nobody"), "{log}");
    assert_eq!(log.lines().count(), 2, "{log}");

    // A half-written control never becomes active.
    fs::write(st.join("agent/coder.d/policy"), "allow coder_t tool:").unwrap();
    let o = ctx(&["config", "commit", "--source", src, "-m", "torn"]);
    assert_eq!(o.status.code(), Some(2), "{}", tests::shown(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("not committed: agent/coder.d/policy"),
        "{}",
        tests::shown(&o)
    );
    assert_eq!(ok(&["config", "log", "--source", src]).lines().count(), 2);
    assert_eq!(names(&v.join("tool")), ["hello.d", "other", "other.d"]);

    // Rollback: the first generation's authority, as a new commit; the work tree follows.
    ok(&["config", "rollback", "--source", src, "HEAD~1"]);
    until("the rollback is served", || names(&v.join("tool")) == ["hello", "hello.d"]);
    assert_eq!(
        fs::read_to_string(st.join("agent/coder.d/policy")).unwrap(),
        "allow coder_t tool:hello execute\n"
    );
    assert!(ok(&["config", "log", "--source", src]).lines().next().unwrap().contains("rollback to"));

    // A grant commits its own change, with a message that says what and who.
    ok(&["agent", "grant", "--source", src, "coder", "tool:other", "execute"]);
    until("the grant is served", || names(&v.join("tool")).contains(&"other".to_string()));
    let log = ok(&["config", "log", "--source", src]);
    assert!(log.lines().next().unwrap().contains("uid 0: agent grant coder tool:other execute"), "{log}");
    assert!(ok(&["config", "status", "--source", src]).is_empty(), "nothing of the grant is left staged");
}

#[test]
fn a_restart_serves_the_last_commit_whatever_the_work_tree_holds() {
    let mut s = Served::start();
    let st = s.storage.clone();
    let src = st.to_str().unwrap().to_owned();
    coder(&st);
    ok(&["config", "commit", "--source", &src, "-m", "first generation"]);
    let committed = generation(&s.p("status")).unwrap();
    // An edit, then the daemon killed before any commit.
    fs::write(
        s.p("agent/coder.d/policy"),
        "allow coder_t tool:hello execute\nallow coder_t tool:other execute\n",
    )
    .unwrap();
    let mut c = s.child.take().unwrap();
    kill_process(Pid::from_raw(c.id() as i32).unwrap(), Signal::KILL).unwrap();
    c.wait().unwrap();
    s.spawn();
    assert_eq!(generation(&s.p("status")).as_deref(), Some(committed.as_str()));
    let v = s.dir.path().join("v");
    s.view("coder", "s1", &v);
    assert_eq!(names(&v.join("tool")), ["hello", "hello.d"], "the edit is still only staged");

    // A commit interrupted after its generation was written but before it was activated:
    // the restart activates it (the commit is the event, not the link).
    ok(&["config", "commit", "--source", &src, "-m", "other for coder"]);
    let head = generation(&s.p("status")).unwrap();
    assert_ne!(head, committed);
    s.stop();
    let link = ringfs::config::generations_dir(&st).join("active");
    fs::remove_file(&link).unwrap();
    std::os::unix::fs::symlink(&committed, &link).unwrap();
    s.spawn();
    assert_eq!(generation(&s.p("status")).as_deref(), Some(head.as_str()));
    s.view("coder", "s2", &s.dir.path().join("v2"));
    assert_eq!(names(&s.dir.path().join("v2/tool")), ["hello", "hello.d", "other", "other.d"]);
}
