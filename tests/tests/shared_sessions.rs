//! Shared sessions with real sandboxes: `ctx shared new` makes a space two agents of one group
//! use without any chown by hand; both write events into one shared session; a third agent
//! without the grant sees nothing of the space; a turn sent through the agent socket with
//! `scope: shared` lands there too.

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tests::served::Served;

fn ctx(args: &[&str]) -> Output {
    Command::new(tests::bin("ctx")).args(args).output().unwrap()
}

fn ok(o: Output, what: &str) -> Output {
    assert!(o.status.success(), "{what}: {}", tests::shown(&o));
    o
}

fn events(s: &Served, rel: &str) -> Vec<Value> {
    fs::read_to_string(s.storage.join(rel))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn two_agents_write_one_shared_session_and_a_third_sees_nothing_of_it() {
    let s = Served::start();
    let st = s.storage.to_str().unwrap().to_owned();
    let mnt = s.mnt.to_str().unwrap().to_owned();
    ok(ctx(&["bootstrap", &st]), "bootstrap");
    // Two agents of group 3300, with their own uids, and one without the space.
    for (name, uid, groups) in [("sha", "1501", "3300"), ("shb", "1502", "3300"), ("shc", "1503", "")] {
        let mut a =
            vec!["agent", "new", name, "--uid", uid, "--gid", uid, "--tool", "fs.stat", "--source", &st];
        if !groups.is_empty() {
            a.extend(["--groups", groups]);
        }
        ok(ctx(&a), "agent new");
    }
    fs::write(
        s.storage.join("tool/fs.stat.d/policy"),
        "allow sha_t tool:fs.stat execute\nallow shb_t tool:fs.stat execute\nallow shc_t tool:fs.stat execute\n",
    )
    .unwrap();
    let o = ok(ctx(&["shared", "new", "team", "--group", "3300", "--source", &st]), "shared new");
    assert!(String::from_utf8_lossy(&o.stdout).contains("created shared/team"), "{}", tests::shown(&o));
    let m = fs::metadata(s.storage.join("shared/team/queue/pending")).unwrap();
    assert_eq!((m.gid(), m.mode() & 0o7777), (3300, 0o2770));
    // Without the grant, a shared session is refused before anything is made.
    let sess = tests::unique("sh");
    let work = s.dir.path().join("work");
    fs::create_dir_all(&work).unwrap();
    fs::write(work.join("a.txt"), "hi\n").unwrap();
    let start = |agent: &str, extra: &[&str], script: &str| {
        let mut c = Command::new(tests::bin("ctx"));
        c.args(["agent", "start", agent, "--session", &sess, "--ctx", &mnt, "--control"])
            .arg(&s.control)
            .arg("--cwd")
            .arg(&work)
            .arg("--wait")
            .args(extra)
            .args(["--", "/bin/sh", "-c", script]);
        c.output().unwrap()
    };
    let o = start("sha", &["--shared", "team"], "true");
    assert_eq!(o.status.code(), Some(13), "{}", tests::shown(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("shared:team write"), "{}", tests::shown(&o));
    assert!(!s.storage.join("shared/team/agent/sha").exists());
    for a in ["sha", "shb"] {
        ok(ctx(&["agent", "grant", a, "shared:team", "write", "--source", &st]), "grant");
    }
    let o = ok(ctx(&["shared", "ls", "--json", "--source", &st]), "shared ls");
    let ls: Value = serde_json::from_slice(&o.stdout).unwrap();
    let team = ls.as_array().unwrap().iter().find(|v| v["space"] == "team").unwrap();
    assert_eq!(
        team["agents"],
        json!([{"agent": "sha", "access": "write"}, {"agent": "shb", "access": "write"}])
    );
    // The first agent's run keeps its session in the space, and its tool call is recorded there.
    let o = start("sha", &["--shared", "team"], "/ctx/bin/tsh fs.stat /workspace/a.txt");
    assert!(o.status.success(), "{}", tests::shown(&o));
    let rel = format!("shared/team/agent/sha/session/{sess}");
    let ev = events(&s, &format!("{rel}/events.jsonl"));
    assert!(ev.iter().any(|e| e["type"] == "tool.call" && e["agent"] == "sha"), "{ev:?}");
    assert!(!s.storage.join(format!("home/1501/agent/sha/session/{sess}")).exists(), "not in its home");
    // The second, another uid of the group, runs on that same session (granted resume) and
    // reads what the first wrote.
    ok(ctx(&["agent", "grant", "shb", &format!("session:sha/{sess}"), "resume", "--source", &st]), "grant");
    let script = format!("/ctx/bin/tsh fs.stat /workspace/a.txt && grep -c sha /ctx/{rel}/events.jsonl");
    let o = start("shb", &["--shared", "team", "--resume", "sha"], &script);
    assert!(o.status.success(), "{}", tests::shown(&o));
    assert_ne!(String::from_utf8_lossy(&o.stdout).trim(), "0", "{}", tests::shown(&o));
    let ev = events(&s, &format!("{rel}/events.jsonl"));
    for a in ["sha", "shb"] {
        assert!(ev.iter().any(|e| e["type"] == "tool.call" && e["agent"] == a), "{a}: {ev:?}");
    }
    // The third sees nothing of the space, and cannot keep a session there.
    let o = start(
        "shc",
        &[],
        "ls /ctx/shared; ls /ctx/shared/team 2>&1; cat /ctx/shared/team/agent/sha/session/*/events.jsonl 2>&1; true",
    );
    let seen = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && !seen.contains("team\n") && seen.contains("No such file"),
        "{}",
        tests::shown(&o)
    );
    assert!(!seen.contains("tool.call"), "{seen}");
    let o = start("shc", &["--shared", "team"], "true");
    assert_eq!(o.status.code(), Some(13), "{}", tests::shown(&o));
    // A turn through the agent socket with scope shared is recorded in the space.
    fs::write(s.storage.join("agent/sha.d/profile"), "tsh\n").unwrap();
    let sock = s.mnt.join("agent/sha.sock");
    let t = Instant::now();
    while fs::read_link(&sock).is_err() {
        assert!(t.elapsed() < Duration::from_secs(10), "no agent socket");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut w = UnixStream::connect(&sock).unwrap();
    let mut r = BufReader::new(w.try_clone().unwrap());
    let turn = json!({"op": "send", "id": "sh1", "session": sess, "scope": "shared", "space": "team",
        "cwd": work, "input": "fs.stat /workspace/a.txt"});
    w.write_all(format!("{turn}\n").as_bytes()).unwrap();
    let mut last = Value::Null;
    while last["type"] != "done" {
        let mut l = String::new();
        assert!(r.read_line(&mut l).unwrap() > 0);
        last = serde_json::from_str(&l).unwrap();
    }
    assert_eq!(last["status"], "ok", "{last}");
    let msgs = events(&s, &format!("{rel}/messages.jsonl"));
    assert_eq!(msgs.iter().filter(|m| m["id"] == "sh1").count(), 2, "{msgs:?}");
    // A space is removed only empty, or with --force.
    assert_eq!(ctx(&["shared", "rm", "team", "--source", &st]).status.code(), Some(1));
    ok(ctx(&["shared", "rm", "team", "--force", "--source", &st]), "shared rm --force");
    assert!(!s.storage.join("shared/team").exists());
}

/// `ctx shared rm --force` removes the space beneath the storage and never across a mount or
/// through a link: a directory bound inside the space (as a run's leftover bind would be) and
/// a link an agent planted there keep what they show; the space stays until the mount goes.
#[test]
fn removing_a_space_never_crosses_a_mount_or_follows_a_link() {
    let d = tempfile::tempdir().unwrap();
    let st = d.path().join("storage");
    let st_s = st.to_str().unwrap();
    ok(ctx(&["bootstrap", st_s]), "bootstrap");
    ok(ctx(&["shared", "new", "gone", "--group", "3310", "--source", st_s]), "shared new");
    let space = st.join("shared/gone");
    for (rel, mode) in [("", 0o2770), ("tool", 0o2750), ("data", 0o2770), ("queue/pending", 0o2770)] {
        let m = fs::metadata(space.join(rel)).unwrap();
        assert_eq!((m.mode() & 0o7777, m.gid()), (mode, 3310), "{rel}: made with its owner and mode");
    }
    let precious = d.path().join("precious");
    fs::create_dir_all(&precious).unwrap();
    fs::write(precious.join("keep"), "the operator's\n").unwrap();
    std::os::unix::fs::symlink(&precious, space.join("data/link")).unwrap();
    fs::create_dir_all(space.join("data/bound")).unwrap();
    let bound =
        Command::new("mount").arg("--bind").arg(&precious).arg(space.join("data/bound")).status().unwrap();
    assert!(bound.success());
    let o = ctx(&["shared", "rm", "gone", "--force", "--source", st_s]);
    let _ = Command::new("umount").arg("-l").arg(space.join("data/bound")).status();
    assert_eq!(
        fs::read_to_string(precious.join("keep")).unwrap(),
        "the operator's\n",
        "{}",
        tests::shown(&o)
    );
    assert!(!o.status.success(), "a mount inside stops the removal: {}", tests::shown(&o));
    ok(ctx(&["shared", "rm", "gone", "--force", "--source", st_s]), "once the mount is gone");
    assert!(!space.exists());
    assert_eq!(fs::read_to_string(precious.join("keep")).unwrap(), "the operator's\n");
}

/// The README's shared-space block, as written: `grant ... shared:team write` did not add the
/// space's group (the README said it did), so the start was refused 13; no grant could be
/// taken back. Each line runs as the README has it (with this test's storage, mount and
/// control socket), then the revoke takes the grant and the group back.
#[test]
fn the_readmes_shared_space_block_works_as_written_and_grants_undo() {
    let s = Served::start();
    let (st, mnt) = (s.storage.to_str().unwrap().to_owned(), s.mnt.to_str().unwrap().to_owned());
    let control = s.control.to_str().unwrap().to_owned();
    let work = s.dir.path().join("work");
    fs::create_dir_all(&work).unwrap();
    ok(ctx(&["bootstrap", &st]), "bootstrap");
    ok(ctx(&["agent", "new", "coder", "--uid", "1521", "--gid", "1521", "--source", &st]), "coder");
    let at = |args: &[&str], tail: &[&str]| {
        Command::new(tests::bin("ctx")).current_dir(&work).args(args).args(tail).output().unwrap()
    };
    let (src, run) = (["--source", st.as_str()], ["--ctx", mnt.as_str(), "--control", control.as_str()]);
    ok(at(&["shared", "new", "team", "--group", "3300"], &src), "shared new");
    let o = ok(at(&["agent", "grant", "coder", "shared:team", "write"], &src), "grant");
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("agent/coder.d/groups: added 3300"),
        "{}",
        tests::shown(&o)
    );
    ok(at(&["agent", "new", "critic", "--uid", "1522", "--gid", "1522"], &src), "critic");
    ok(at(&["agent", "grant", "critic", "shared:team", "write"], &src), "grant critic");
    ok(at(&["agent", "grant", "critic", "session:coder/review", "resume"], &src), "grant resume");
    ok(at(&["agent", "start", "coder", "--shared", "team", "--session", "review"], &run), "start coder");
    assert!(s.storage.join("shared/team/agent/coder/session/review").is_dir());
    ok(
        at(
            &["agent", "start", "critic", "--shared", "team", "--resume", "coder", "--session", "review"],
            &run,
        ),
        "start critic",
    );
    let stop = ["--control", control.as_str()];
    ok(at(&["agent", "stop", "critic", "--session", "review"], &stop), "stop critic");
    ok(at(&["agent", "stop", "coder", "--session", "review"], &stop), "stop coder");
    let groups =
        |a: &str| fs::read_to_string(s.storage.join(format!("agent/{a}.d/groups"))).unwrap_or_default();
    assert_eq!(groups("critic").trim(), "3300");
    let o = ok(at(&["agent", "revoke", "critic", "shared:team", "write"], &src), "revoke");
    let said = String::from_utf8_lossy(&o.stdout);
    assert!(
        said.contains("removed allow critic_t shared:team write") && said.contains("removed 3300"),
        "{said}"
    );
    assert_eq!(groups("critic").trim(), "");
    let policy = fs::read_to_string(s.storage.join("agent/critic.d/policy")).unwrap();
    assert!(!policy.contains("shared:team") && policy.contains("session:coder/review resume"), "{policy}");
    let o = at(
        &["agent", "start", "critic", "--shared", "team", "--session", "r2", "--wait"],
        &[&run[..], &["--", "/bin/true"]].concat(),
    );
    assert_eq!(o.status.code(), Some(13), "{}", tests::shown(&o));
    // A revoke of what was never granted says so and changes nothing.
    let o = ok(at(&["agent", "revoke", "critic", "shared:team", "write"], &src), "revoke again");
    assert!(String::from_utf8_lossy(&o.stdout).contains("has no allow critic_t shared:team write"));
    // What only the operator sets: groups and ids, uid 0 only when meant.
    let o = ok(at(&["agent", "set", "coder", "groups", "3300,3301"], &src), "set groups");
    assert!(String::from_utf8_lossy(&o.stdout).contains("3300 3301"));
    assert_eq!(groups("coder").trim(), "3300 3301");
    assert_eq!(at(&["agent", "set", "coder", "uid", "0"], &src).status.code(), Some(2));
    assert_eq!(at(&["agent", "set", "coder", "label", "x_t"], &src).status.code(), Some(2));
    assert_eq!(at(&["agent", "set", "nosuch", "gid", "5"], &src).status.code(), Some(1));
}

/// A grant written to the storage was read through the mount a moment later as it was before
/// (the kernel's copy, until the daemon's watch dropped it): the README's `grant` then `start`
/// was refused 13, and `ctx send` right after `ctx agent new` found no socket. Each command
/// returns once the mount serving the storage shows what it wrote.
#[test]
fn what_a_command_writes_is_what_the_next_one_reads_through_the_mount() {
    let s = Served::start();
    let (st, mnt) = (s.storage.to_str().unwrap().to_owned(), s.mnt.clone());
    ok(ctx(&["bootstrap", &st]), "bootstrap");
    for i in 0..20 {
        let name = format!("quick{i}");
        ok(ctx(&["agent", "new", &name, "--source", &st]), "agent new");
        assert!(
            fs::symlink_metadata(mnt.join(format!("agent/{name}.sock"))).is_ok(),
            "{name}: its socket at once"
        );
        ok(ctx(&["agent", "grant", &name, "tool:fs.read", "execute", "--source", &st]), "grant");
        let seen = fs::read_to_string(mnt.join(format!("agent/{name}.d/policy"))).unwrap();
        assert!(seen.contains(&format!("allow {name}_t tool:fs.read execute")), "{name}: {seen}");
        let tool = fs::read_to_string(mnt.join("tool/fs.read.d/policy")).unwrap();
        assert!(tool.contains(&format!("allow {name}_t tool:fs.read execute")), "{name}: {tool}");
        ok(ctx(&["agent", "revoke", &name, "tool:fs.read", "execute", "--source", &st]), "revoke");
        let seen = fs::read_to_string(mnt.join(format!("agent/{name}.d/policy"))).unwrap();
        assert!(!seen.contains("tool:fs.read"), "{name}: {seen}");
    }
}
