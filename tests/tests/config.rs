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
    // The object log is runtime state, never versioned: written in the storage, listed beside
    // the generation's controls.
    fs::write(st.join("agent/coder.d/log"), "{}\n").unwrap();
    until("the object log is listed", || names(&v.join("agent/coder.d")).contains(&"log".to_string()));
    assert!(names(&v.join("agent/coder.d")).contains(&"policy".to_string()));
    assert_eq!(ok(&["config", "status", "--source", src]), "M agent/coder.d/policy\nM tool/hello.d/policy\n");

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
    // A grant never carries a staged edit of the files it writes into force under its name.
    let o = ctx(&["agent", "grant", "--source", src, "coder", "tool:hello", "execute"]);
    assert_eq!(o.status.code(), Some(1), "{}", tests::shown(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("agent/coder.d/policy has staged changes"),
        "{}",
        tests::shown(&o)
    );
    assert_eq!(
        fs::read_to_string(st.join("agent/coder.d/policy")).unwrap(),
        "allow coder_t tool:",
        "untouched"
    );
    assert_eq!(ok(&["config", "log", "--source", src]).lines().count(), 2);

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

/// An agent's own `agent.update` and `agent.create` are commits of their own, naming the agent,
/// its uid and its session; what a run may do is decided by the active generation, never by a
/// staged edit.
#[test]
fn an_agent_update_by_an_agent_is_one_commit_naming_that_agent() {
    let s = Served::start();
    let st = s.storage.to_str().unwrap().to_owned();
    ok(&["bootstrap", &st]);
    ok(&["config", "commit", "--source", &st, "-m", "first generation"]);
    let mut args = vec!["agent", "new", "chief", "--uid", "1000", "--gid", "1000", "--source", &st];
    for t in ["agent.update", "agent.create"] {
        args.extend(["--tool", t]);
    }
    ok(&args);
    ok(&["agent", "grant", "--source", &st, "chief", "agent:worker", "create"]);
    // A widening written by hand and never committed grants nothing.
    let policy = s.storage.join("agent/chief.d/policy");
    let mut p = fs::read_to_string(&policy).unwrap();
    p.push_str("allow chief_t agent:wide create\n");
    fs::write(&policy, p).unwrap();
    let before = ok(&["config", "log", "--source", &st]).lines().count();

    let work = s.dir.path().join("work");
    fs::create_dir_all(&work).unwrap();
    rustix::fs::chown(&work, Some(rustix::fs::Uid::from_raw(1000)), Some(rustix::fs::Gid::from_raw(1000)))
        .unwrap();
    let session = tests::unique("u");
    let script = r#"cd /workspace
t() { /ctx/bin/tsh "$@" > "$1.$#.out" 2>&1; echo "$?" >> /workspace/codes; }
echo "I am the chief now" | t agent.update system.md
t agent.create '{"name":"worker"}'
t agent.create '{"name":"wide"}'
"#;
    let out = std::process::Command::new(tests::bin("ctx"))
        .args(["agent", "start", "chief", "--session", &session, "--wait", "--ctx"])
        .arg(&s.mnt)
        .arg("--control")
        .arg(&s.control)
        .arg("--cwd")
        .arg(&work)
        .args(["--", "/bin/sh", "-c", script])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", tests::shown(&out));
    let codes = fs::read_to_string(work.join("codes")).unwrap_or_default();
    assert_eq!(codes, "0\n0\n13\n", "{codes}");
    assert!(!s.storage.join("agent/wide").exists(), "a staged edit granted nothing");

    // One commit each, naming the agent, its uid and its session.
    let log = ok(&["config", "log", "--source", &st]);
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(lines.len(), before + 2, "{log}");
    let by = format!("agent chief (uid 1000, session {session})");
    assert!(lines[0].contains(&format!("{by}: agent.create worker (a child of chief)")), "{log}");
    assert!(lines[1].contains(&format!("{by}: agent.update agent/chief.d/system.md")), "{log}");
    let active = ringfs::config::active(&s.storage).unwrap();
    assert_eq!(fs::read_to_string(active.join("agent/chief.d/system.md")).unwrap(), "I am the chief now\n");
    assert!(active.join("agent/worker").exists());
    // The hand edit stays staged: the agent's commits took only their own paths.
    assert_eq!(ok(&["config", "status", "--source", &st]), "M agent/chief.d/policy\n");
}

/// Runs `script` with `sh -c` in a sandbox of `agent` whose workspace is `cwd`; returns its
/// output.
fn run_in(s: &Served, agent: &str, cwd: &Path, script: &str) -> String {
    let out = std::process::Command::new(tests::bin("ctx"))
        .args(["agent", "start", agent, "--session", &tests::unique("g"), "--wait", "--ctx"])
        .arg(&s.mnt)
        .arg("--control")
        .arg(&s.control)
        .arg("--cwd")
        .arg(cwd)
        .args(["--", "/bin/sh", "-c", script])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", tests::shown(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `.git` in a workspace is an ordinary subtree that a mount-table line can make read-only or
/// hide; a linked worktree's metadata, outside its workspace, is reachable only through a
/// mount the agent's policy grants. With a real repository and a real `git worktree`.
#[test]
fn git_in_a_workspace_is_narrowed_by_the_mount_table_and_a_worktrees_metadata_needs_its_own_grant() {
    let s = Served::start();
    let st = s.storage.to_str().unwrap().to_owned();
    ok(&["bootstrap", &st]);
    ok(&["config", "commit", "--source", &st, "-m", "first generation"]);
    ok(&["agent", "new", "dev", "--uid", "1000", "--gid", "1000", "--source", &st]);
    let git = String::from_utf8(
        std::process::Command::new("sh").args(["-c", "command -v git"]).output().unwrap().stdout,
    )
    .unwrap()
    .trim()
    .to_owned();
    assert!(git.starts_with("/usr/"), "git is required, under /usr (bound into sandboxes): {git:?}");
    let repo = s.dir.path().join("repo");
    let wt = s.dir.path().join("wt");
    fs::create_dir_all(&repo).unwrap();
    let sh = |script: &str| {
        let o = std::process::Command::new("sh").arg("-c").arg(script).current_dir(&repo).output().unwrap();
        assert!(o.status.success(), "{script}: {}", tests::shown(&o));
    };
    sh(&format!(
        "git init -q -b main . && echo a > a && git add a && git -c user.name=op -c user.email=op@localhost commit -qm a \
         && git worktree add -q -b side {} && chown -R 1000:1000 . {}",
        wt.display(),
        wt.display()
    ));
    let set_mount = |table: &str, why: &str| {
        fs::write(s.storage.join("agent/dev.d/mount"), table).unwrap();
        ok(&["config", "commit", "--source", &st, "-m", why, "agent/dev.d/mount"]);
    };
    let commit = format!("{git} -c user.name=dev -c user.email=dev@localhost commit -qm");
    let tried = |what: &str, cmd: &str| {
        format!("if {cmd} >/dev/null 2>&1; then echo {what} ok; else echo {what} refused; fi\n")
    };

    // Read-only: history readable, nothing written into .git; the work tree itself writable.
    ok(&["agent", "grant", "--source", &st, "dev", "mount:/workspace/.git", "read"]);
    set_mount(&format!("{}/.git\t/workspace/.git\tro\t-\n", repo.display()), ".git read-only for dev");
    let out = run_in(
        &s,
        "dev",
        &repo,
        &[
            tried("log", &format!("{git} log --oneline")),
            tried("write", "echo b > b"),
            tried("add", &format!("{git} add b")),
            tried("touch-git", "touch .git/x"),
        ]
        .concat(),
    );
    assert_eq!(out, "log ok\nwrite ok\nadd refused\ntouch-git refused\n");
    assert!(repo.join("b").exists() && !repo.join(".git/x").exists());

    // Hidden: an empty read-only directory; git finds no repository.
    set_mount("-\t/workspace/.git\thide\t-\n", ".git hidden from dev");
    let out = run_in(
        &s,
        "dev",
        &repo,
        &[
            "echo entries $(ls -A .git | wc -l)\n".to_owned(),
            tried("rev-parse", &format!("{git} rev-parse --git-dir")),
            tried("touch-git", "touch .git/x"),
            tried("read", "cat a"),
        ]
        .concat(),
    );
    assert_eq!(out, "entries 0\nrev-parse refused\ntouch-git refused\nread ok\n");
    assert!(!repo.join(".git/x").exists());

    // A linked worktree: its .git names metadata outside the workspace, which the sandbox has
    // only through a mount of its own, granted.
    set_mount("", "no mounts for dev");
    let work = [
        tried("status", &format!("{git} status --short")),
        tried("commit", &format!("sh -c 'echo c > c && {git} add c && {commit} c'")),
    ]
    .concat();
    assert_eq!(run_in(&s, "dev", &wt, &work), "status refused\ncommit refused\n");
    let meta = repo.join(".git").to_string_lossy().into_owned();
    let table = format!("{meta}\t{meta}\trw\t-\n");
    fs::write(s.storage.join("agent/dev.d/mount"), &table).unwrap();
    let o = ctx(&[
        "config",
        "commit",
        "--source",
        &st,
        "-m",
        "the repository's metadata for dev",
        "agent/dev.d/mount",
    ]);
    assert!(o.status.success(), "{}", tests::shown(&o));
    let refused = ctx(&[
        "agent",
        "start",
        "dev",
        "--session",
        "nogrant",
        "--wait",
        "--ctx",
        s.mnt.to_str().unwrap(),
        "--control",
        s.control.to_str().unwrap(),
        "--cwd",
        wt.to_str().unwrap(),
        "--",
        "/bin/true",
    ]);
    assert_eq!(refused.status.code(), Some(13), "a mount needs its grant: {}", tests::shown(&refused));
    for perm in ["read", "write"] {
        ok(&["agent", "grant", "--source", &st, "dev", &format!("mount:{meta}"), perm]);
    }
    assert_eq!(run_in(&s, "dev", &wt, &work), "status ok\ncommit ok\n");
    sh(&format!(
        "test \"$(git -c safe.directory='*' log -1 --format=%s side)\" = c && test -f {}/c",
        wt.display()
    ));
}

/// `ctx object install|uninstall`, `ctx model add|alias` commit their own change: each is
/// active when the command returns, `ctx config log` says what and who, and nothing is left
/// staged.
#[test]
fn object_installs_and_model_adds_commit_their_own_change() {
    let s = Served::start();
    let st = &s.storage;
    let src = st.to_str().unwrap();
    coder(st);
    ok(&["config", "commit", "--source", src, "-m", "first generation"]);
    let active = || ringfs::config::active(st).unwrap();
    let pkg = s.dir.path().join("pkg");
    let p = tests::object::package(&pkg, "greet", "1.0.0", 64);
    ok(&["object", "install", "--source", src, p.manifest_arg()]);
    assert!(active().join("tool/greet").is_file() && active().join("tool/greet.d/policy").is_file());
    let base = "http://127.0.0.1:9/v1";
    ok(&[
        "model",
        "add",
        "local/m1",
        "--api",
        "openai-chat",
        "--base-url",
        base,
        "--no-key",
        "--source",
        src,
    ]);
    ok(&["model", "alias", "main", "local/m1", "--source", src]);
    assert!(active().join("model/local/m1.d").is_dir());
    assert_eq!(fs::read_link(active().join("model/main")).unwrap(), Path::new("local/m1"));
    ok(&["object", "uninstall", "--source", src, "tool/greet", "--yes"]);
    assert!(!active().join("tool/greet").exists());
    assert_eq!(generation(&s.p("status")), ringfs::config::active_id(st), "the daemon serves it");
    let log = ok(&["config", "log", "--source", src]);
    let firsts: Vec<&str> = log.lines().take(4).map(|l| l.split_once(": ").map_or(l, |(_, m)| m)).collect();
    assert_eq!(
        firsts,
        [
            "object uninstall tool/greet",
            "model alias main local/m1",
            "model add local/m1",
            "object install tool/greet"
        ],
        "{log}"
    );
    assert!(log.lines().next().unwrap().contains("uid 0: "), "{log}");
    assert!(ok(&["config", "status", "--source", src]).is_empty(), "nothing left staged");
}

/// `ctx bootstrap` in a storage whose configuration is a repository commits the tools it
/// replaces, as a change of its own.
#[test]
fn a_bootstrap_in_a_repository_commits_what_it_replaces() {
    let s = Served::start();
    let st = s.storage.clone();
    let src = st.to_str().unwrap();
    ok(&["bootstrap", src]);
    ok(&["config", "commit", "--source", src, "-m", "first generation"]);
    assert!(ringfs::config::active(&st).unwrap().join("tool/fs.stat").is_file());
    fs::write(st.join("tool/fs.stat.d/description"), "tampered\n").unwrap();
    ok(&["config", "commit", "--source", src, "-m", "tampered", "tool/fs.stat.d/description"]);
    assert!(ok(&["bootstrap", src]).contains("replace tool/fs.stat"));
    let log = ok(&["config", "log", "--source", src]);
    assert!(log.lines().next().unwrap().contains("bootstrap: the core tools"), "{log}");
    assert!(ok(&["config", "status", "--source", src]).is_empty(), "nothing left staged");
}

/// A storage that holds configuration and is not a repository becomes one at the daemon's
/// first start, its files as they are the first commit, before anything is served; from then
/// on an edit is staged.
#[test]
fn an_existing_storage_becomes_a_repository_at_the_daemons_first_start() {
    let mut s = Served::unstarted(&[]);
    fs::create_dir_all(&s.storage).unwrap();
    coder(&s.storage);
    assert!(!ringfs::config::is_repository(&s.storage));
    s.spawn();
    let st = s.storage.clone();
    let src = st.to_str().unwrap().to_owned();
    assert!(generation(&s.p("status")).is_some(), "the first generation is served from the start");
    let log = ok(&["config", "log", "--source", &src]);
    assert_eq!(log.lines().count(), 1, "{log}");
    assert!(log.contains("cortexfs: the storage's configuration as it was found"), "{log}");
    let v = s.dir.path().join("v");
    s.view("coder", "s1", &v);
    assert_eq!(names(&v.join("tool")), ["hello", "hello.d"]);
    fs::write(st.join("agent/coder.d/policy"), "allow coder_t tool:other execute\n").unwrap();
    assert_eq!(ok(&["config", "status", "--source", &src]), "M agent/coder.d/policy\n");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(names(&v.join("tool")), ["hello", "hello.d"], "an edit after the migration is staged");
}

/// `ctx bootstrap` of a new storage makes it a repository, the bootstrapped tools its first
/// generation (the core tools, one executable under many names, stored once).
#[test]
fn a_bootstrap_of_a_new_storage_makes_a_repository() {
    let d = tempfile::tempdir_in("/var/tmp").unwrap();
    let st = d.path().join("new");
    let src = st.to_str().unwrap();
    let said = ok(&["bootstrap", src]);
    assert!(said.contains("the configuration is a repository"), "{said}");
    let active = ringfs::config::active(&st).unwrap();
    assert!(active.join("tool/fs.stat").is_file());
    assert!(ok(&["config", "status", "--source", src]).is_empty());
    use std::os::unix::fs::MetadataExt;
    let ino = |t: &str| fs::metadata(active.join("tool").join(t)).unwrap().ino();
    assert_eq!(ino("fs.stat"), ino("fs.read"), "one executable under two names is checked out once");
    let _ = fs::remove_dir_all(ringfs::config::generations_dir(&st).parent().unwrap());
}

/// What a command writes into the storage directly (`ctx agent grant`, a commit) is read
/// through the host's `/ctx` as soon as the daemon's watch sees it, however long the kernel
/// may keep entries: the host view's cached entries are dropped with the agent views'. And a
/// repository's checked-out generations are kept in memory.
#[test]
fn a_change_behind_the_daemons_back_reaches_the_host_mount_before_its_cache_times_out() {
    let s = Served::start_with(&["--cache-timeout", "3600"]);
    coder(&s.storage);
    let src = s.storage.to_str().unwrap();
    let through = s.mnt.join("agent/coder.d/policy");
    until("the host mount reads the policy", || {
        fs::read_to_string(&through).is_ok_and(|p| p == "allow coder_t tool:hello execute\n")
    });
    ok(&["agent", "grant", "coder", "tool:other", "execute", "--source", src]);
    let granted = "allow coder_t tool:hello execute\nallow coder_t tool:other execute\n";
    assert_eq!(fs::read_to_string(&through).unwrap(), granted, "read as soon as the grant returns");
    ok(&["config", "commit", "--source", src, "-m", "first generation"]);
    ok(&["agent", "revoke", "coder", "tool:other", "execute", "--source", src]);
    assert_eq!(fs::read_to_string(&through).unwrap(), "allow coder_t tool:hello execute\n");
    // The host view's `home` and `shared` are the data connection's binds: dropping the host
    // view's entries leaves them (the kernel detaches what is mounted on an entry it drops).
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    for d in ["home", "shared"] {
        let at = s.mnt.join(d);
        assert!(
            info.lines().any(|l| l.split(' ').nth(4) == Some(at.to_str().unwrap())),
            "{} is still bound",
            at.display()
        );
    }
    let statfs = rustix::fs::statfs(ringfs::config::GENERATIONS_ROOT).unwrap();
    let tmpfs: rustix::fs::FsWord = 0x0102_1994;
    assert_eq!(statfs.f_type, tmpfs, "generations are kept in a tmpfs");
}

/// A package's record is configuration too: `ctx install` commits it with the package's
/// objects (`package/NAME.json` in the repository, `.cortexfs/package/` in the storage),
/// `ctx uninstall` commits its removal, and a rollback brings the record back with them.
#[test]
fn a_package_install_commits_its_record_with_its_objects() {
    let s = Served::start();
    let st = &s.storage;
    let src = st.to_str().unwrap();
    coder(st);
    ok(&["config", "commit", "--source", src, "-m", "first generation"]);
    let pkg = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/package");
    ok(&["install", pkg.to_str().unwrap(), "--source", src]);
    let active = || ringfs::config::active(st).unwrap();
    assert!(active().join("package/review-kit.json").is_file(), "the record is in the generation");
    assert!(active().join("tool/kit.count").is_file() && active().join("agent/reviewer").is_file());
    let log = ok(&["config", "log", "--source", src]);
    assert!(log.lines().next().unwrap().ends_with("install package review-kit 0.1.0"), "{log}");
    assert!(ok(&["config", "status", "--source", src]).is_empty(), "nothing left staged");
    let installed = ringfs::config::active_id(st).unwrap();
    ok(&["uninstall", "review-kit", "--source", src, "--yes"]);
    assert!(!active().join("package/review-kit.json").exists());
    assert!(!st.join(".cortexfs/package/review-kit.json").exists());
    assert!(ok(&["config", "status", "--source", src]).is_empty(), "nothing left staged");
    ok(&["config", "rollback", &installed, "--source", src]);
    assert!(st.join(".cortexfs/package/review-kit.json").is_file(), "the record is back in the storage");
    let listed = ok(&["install", "--list", "--source", src]);
    assert!(listed.contains("review-kit\t0.1.0\tinstalled"), "{listed}");
    assert!(active().join("tool/kit.count").is_file());
}
