//! `ctx agent new|ls|inspect|rm` as users run them, on plain storage (no mount needed).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

use policy::controls::{self, ObjectClass, Owner};
use policy::v0::{Policy, Query};
use tests::run;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn ctx(storage: &Path, args: &[&str]) -> Output {
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--source", storage.to_str().unwrap()]);
    run("ctx", &all)
}

fn ok(out: &Output) -> String {
    assert_eq!(out.status.code(), Some(0), "stdout: {}\nstderr: {}", text(&out.stdout), text(&out.stderr));
    text(&out.stdout)
}

const WRITTEN: &[&str] = &[
    "abi",
    "approval",
    "cwd",
    "env",
    "gid",
    "groups",
    "iso",
    "label",
    "life",
    "meta.json",
    "model",
    "mount",
    "owner",
    "path",
    "policy",
    "prompt.template.md",
    "system.md",
    "uid",
];

#[test]
fn new_writes_every_control_valid_and_grants_exactly_what_was_asked() {
    let d = tempfile::tempdir().unwrap();
    let s = d.path();
    let out = ctx(
        s,
        &[
            "agent",
            "new",
            "coder",
            "--tool",
            "fs.read",
            "--tool",
            "shell.exec",
            "--model",
            "local/smollm2",
            "--model",
            "main",
            "--shared",
            "proj:read",
            "--shared",
            "docs:write",
            "--mount",
            "/srv/data",
            "/data",
            "ro",
            "--mount",
            "/srv/out",
            "/out",
            "rw,noexec",
            "--uid",
            "1000",
            "--gid",
            "1001",
            "--groups",
            "20,30",
        ],
    );
    assert_eq!(ok(&out), "created agent/coder (label coder_t, uid 1000)\n");

    let exe = s.join("agent/coder");
    let mode = fs::metadata(&exe).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o755);
    assert_eq!(fs::read_to_string(&exe).unwrap(), "#!/bin/sh\nexec /ctx/bin/ctx agent start coder \"$@\"\n");

    let ctl = s.join("agent/coder.d");
    for c in WRITTEN {
        let bytes = fs::read(ctl.join(c)).unwrap_or_else(|e| panic!("{c}: {e}"));
        assert!(
            matches!(controls::classify(ObjectClass::Agent, c), Some(Owner::Host | Owner::SelfUpdatable)),
            "{c}"
        );
        controls::validate(ObjectClass::Agent, "coder", c, &bytes).unwrap_or_else(|e| panic!("{c}: {e}"));
    }
    let read = |c: &str| fs::read_to_string(ctl.join(c)).unwrap();
    assert_eq!(read("label"), "coder_t\n");
    assert_eq!(read("uid"), "1000\n");
    assert_eq!(read("gid"), "1001\n");
    assert_eq!(read("groups"), "20 30\n");
    assert_eq!(read("owner"), format!("{}\n", rustix::process::getuid().as_raw()));
    assert_eq!(read("model"), "local/smollm2\n");
    assert_eq!(read("cwd"), "/workspace\n");
    assert_eq!(read("path"), "/ctx/tool:/ctx/home/1000/tool\n");
    assert_eq!(read("life"), "owned\n");
    assert_eq!(read("iso"), "bwrap\n");
    assert_eq!(read("abi"), "1\n");
    assert_eq!(read("approval"), "never\n");
    assert_eq!(read("env"), "");
    let meta: serde_json::Value = serde_json::from_str(&read("meta.json")).unwrap();
    assert_eq!(meta["label"], "coder_t");
    assert_eq!(meta["created_by"], "ctx agent new");

    let mounts = policy::mount::parse(read("mount").as_bytes()).unwrap();
    let shown: Vec<String> = mounts.iter().map(ToString::to_string).collect();
    assert_eq!(shown, ["/srv/data\t/data\tro\tnosuid,nodev", "/srv/out\t/out\trw\tnoexec"]);

    let pol = Policy::from_text(read("policy").as_bytes()).unwrap();
    let granted = [
        ("tool:fs.read", "execute"),
        ("tool:shell.exec", "execute"),
        ("model:local/smollm2", "use"),
        ("model:main", "use"),
        ("shared:proj", "read"),
        ("shared:docs", "read"),
        ("shared:docs", "write"),
        ("mount:/data", "read"),
        ("mount:/out", "read"),
        ("mount:/out", "write"),
    ];
    for (target, perm) in granted {
        assert!(pol.allows(&Query::parse("coder_t", target, perm).unwrap()), "{target} {perm}");
    }
    assert_eq!(pol.rule_count(), granted.len(), "nothing else is granted");
    for (subject, target, perm) in [
        ("coder_t", "shared:proj", "write"),
        ("coder_t", "mount:/data", "write"),
        ("coder_t", "tool:fs.write", "execute"),
        ("coder_t", "network:default", "connect"),
        ("other_t", "tool:fs.read", "execute"),
    ] {
        assert!(!pol.allows(&Query::parse(subject, target, perm).unwrap()), "{subject} {target} {perm}");
    }

    // The published object passes the store's own inspection with no residue.
    let i = ringfs::object::publish::inspect(
        s,
        ObjectClass::Agent,
        "coder",
        ringfs::object::publish::Tier::System,
    )
    .unwrap();
    assert!(i.installed && i.residue.is_empty());
    for c in WRITTEN {
        assert!(i.controls.iter().any(|x| x == c), "{c} in {:?}", i.controls);
    }
}

#[test]
fn defaults_are_an_identity_of_its_own_and_deny_everything() {
    let d = tempfile::tempdir().unwrap();
    let s = d.path();
    // The first agent gets the lowest id of the agents' range that no agent of any storage on
    // this host was given (the host-wide record), as uid and gid.
    let said = ok(&ctx(s, &["agent", "new", "my-bot.v2"]));
    let ctl = s.join("agent/my-bot.v2.d");
    let read = |c: &str| fs::read_to_string(ctl.join(c)).unwrap();
    let first: u32 = read("uid").trim().parse().unwrap();
    assert!(policy::ids::AGENT_IDS.contains(&first), "{first}");
    assert_eq!(said, format!("created agent/my-bot.v2 (label my_bot_v2_t, uid {first})\n"));
    let recorded = fs::read_to_string("/var/lib/cortexfs/agent-ids").unwrap();
    let holders =
        recorded.lines().filter(|l| l.split(' ').next() == Some(first.to_string().as_str())).count();
    assert_eq!(holders, 1, "{first} was given once on this host");
    assert_eq!(read("uid"), format!("{first}\n"));
    assert_eq!(read("gid"), format!("{first}\n"));
    assert_eq!(read("groups"), "");
    assert_eq!(read("policy"), "");
    assert_eq!(read("mount"), "");
    assert_eq!(read("model"), "");
    assert_eq!(read("path"), format!("/ctx/tool:/ctx/home/{first}/tool\n"));
    for c in WRITTEN {
        controls::validate(ObjectClass::Agent, "my-bot.v2", c, read(c).as_bytes())
            .unwrap_or_else(|e| panic!("{c}: {e}"));
    }

    // The next one gets a later id (other storages on this host may take ids meanwhile);
    // --uid still chooses one.
    let out = ctx(s, &["agent", "new", "labelled", "--label", "custom_t"]);
    let next: u32 = fs::read_to_string(s.join("agent/labelled.d/uid")).unwrap().trim().parse().unwrap();
    assert!(next > first && policy::ids::AGENT_IDS.contains(&next), "{next}");
    assert_eq!(ok(&out), format!("created agent/labelled (label custom_t, uid {next})\n"));
    assert_eq!(fs::read_to_string(s.join("agent/labelled.d/gid")).unwrap(), format!("{next}\n"));
    let out = ctx(s, &["agent", "new", "chosen", "--uid", "1234"]);
    assert_eq!(ok(&out), "created agent/chosen (label chosen_t, uid 1234)\n");
    assert_eq!(fs::read_to_string(s.join("agent/labelled.d/label")).unwrap(), "custom_t\n");
}

/// Agents made at once in eight storages of one host get eight different ids: the host-wide
/// record is read and written under its lock.
#[test]
fn agents_made_at_once_in_many_storages_never_share_an_id() {
    let dirs: Vec<tempfile::TempDir> = (0..8).map(|_| tempfile::tempdir().unwrap()).collect();
    let made: Vec<Output> = std::thread::scope(|sc| {
        let hs: Vec<_> =
            dirs.iter().map(|d| sc.spawn(|| ctx(d.path(), &["agent", "new", "same-name"]))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut ids: Vec<u32> = made
        .iter()
        .zip(&dirs)
        .map(|(o, d)| {
            ok(o);
            fs::read_to_string(d.path().join("agent/same-name.d/uid")).unwrap().trim().parse().unwrap()
        })
        .collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 8, "one id each: {ids:?}");
}

/// An id given explicitly (`--uid`) in one storage is recorded host-wide like one the store
/// gives: another storage's next agent never gets it.
#[test]
fn an_id_given_explicitly_in_one_storage_is_never_given_by_another() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let uid = |d: &Path, n: &str| -> u32 {
        fs::read_to_string(d.join(format!("agent/{n}.d/uid"))).unwrap().trim().parse().unwrap()
    };
    // The id storage B would give next: the one after the id it gives now.
    ok(&ctx(b.path(), &["agent", "new", "probe"]));
    let next = uid(b.path(), "probe") + 1;
    ok(&ctx(a.path(), &["agent", "new", "chosen", "--uid", &next.to_string()]));
    let recorded = fs::read_to_string("/var/lib/cortexfs/agent-ids").unwrap();
    let line = format!("{next} {} chosen", a.path().display());
    assert!(recorded.lines().any(|l| l == line), "{line:?} recorded");
    ok(&ctx(b.path(), &["agent", "new", "later"]));
    assert_ne!(uid(b.path(), "later"), next, "storage A's agent holds it");
}

#[test]
fn ls_inspect_and_rm() {
    let d = tempfile::tempdir().unwrap();
    let s = d.path();
    assert_eq!(ok(&ctx(s, &["agent", "ls"])), "", "no agents yet");
    assert_eq!(ok(&ctx(s, &["agent", "ls", "--json"])), "[]\n");
    ok(&ctx(s, &["agent", "new", "zeta", "--uid", "2000"]));
    ok(&ctx(s, &["agent", "new", "alpha", "--uid", "1000", "--tool", "fs.read"]));
    // Residue and hidden entries are not agents.
    fs::create_dir_all(s.join("agent/orphan.d")).unwrap();
    fs::create_dir_all(s.join("agent/.cortexfs-stage.x.1.2")).unwrap();
    fs::write(s.join("agent/.hidden"), "").unwrap();

    assert_eq!(ok(&ctx(s, &["agent", "ls"])), "NAME\tLABEL\tUID\nalpha\talpha_t\t1000\nzeta\tzeta_t\t2000\n");
    let v: serde_json::Value = serde_json::from_str(&ok(&ctx(s, &["agent", "ls", "--json"]))).unwrap();
    assert_eq!(
        v,
        serde_json::json!([
            {"name": "alpha", "label": "alpha_t", "uid": 1000},
            {"name": "zeta", "label": "zeta_t", "uid": 2000},
        ])
    );

    fs::write(s.join("agent/alpha.d/log"), "secret runtime line\n").unwrap();
    let shown = ok(&ctx(s, &["agent", "inspect", "alpha"]));
    for c in WRITTEN {
        assert!(shown.contains(&format!("== {c} ==\n")), "{c} missing from:\n{shown}");
    }
    assert!(shown.contains("== label ==\nalpha_t\n"), "{shown}");
    assert!(shown.contains("== policy ==\nallow alpha_t tool:fs.read execute\n"), "{shown}");
    assert!(!shown.contains("== log =="), "the runtime log is skipped");
    assert!(!shown.contains("secret runtime line"));
    let v: serde_json::Value =
        serde_json::from_str(&ok(&ctx(s, &["agent", "inspect", "alpha", "--json"]))).unwrap();
    assert_eq!(v["agent"], "alpha");
    assert_eq!(v["controls"]["label"], "alpha_t\n");
    assert_eq!(v["controls"]["policy"], "allow alpha_t tool:fs.read execute\n");
    assert!(v["controls"].get("log").is_none(), "the runtime log is skipped: {v}");

    let out = ctx(s, &["agent", "inspect", "nobody-here"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("no agent nobody-here in"), "{}", text(&out.stderr));

    let plan = ok(&ctx(s, &["agent", "rm", "alpha"]));
    assert!(plan.contains("would remove"), "{plan}");
    assert!(plan.contains("dry run"), "{plan}");
    assert!(s.join("agent/alpha").exists() && s.join("agent/alpha.d").exists(), "dry run by default");
    let done = ok(&ctx(s, &["agent", "rm", "alpha", "--yes"]));
    assert!(done.contains("removed agent/alpha"), "{done}");
    assert!(!s.join("agent/alpha").exists() && !s.join("agent/alpha.d").exists());
    assert_eq!(ok(&ctx(s, &["agent", "ls"])), "NAME\tLABEL\tUID\nzeta\tzeta_t\t2000\n");

    let out = ctx(s, &["agent", "rm", "alpha", "--yes"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("no agent alpha in"), "{}", text(&out.stderr));
}

#[test]
fn duplicate_agent_is_refused_and_left_alone() {
    let d = tempfile::tempdir().unwrap();
    let s = d.path();
    ok(&ctx(s, &["agent", "new", "coder", "--tool", "fs.read"]));
    let before = fs::read(s.join("agent/coder.d/policy")).unwrap();
    let out = ctx(s, &["agent", "new", "coder", "--tool", "shell.exec"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert_eq!(text(&out.stderr), "ctx: agent/coder already exists\n");
    assert_eq!(fs::read(s.join("agent/coder.d/policy")).unwrap(), before);
}

#[test]
fn invalid_input_exits_2_and_writes_nothing() {
    let d = tempfile::tempdir().unwrap();
    let s = d.path();
    let cases: &[&[&str]] = &[
        &["agent", "new", "bad/name"],
        &["agent", "new", ".hidden"],
        &["agent", "new", "x.sock"],
        &["agent", "new", "a", "--mount", "/src", "/", "ro"],
        &["agent", "new", "a", "--mount", "/src", "/ctx", "ro"],
        &["agent", "new", "a", "--mount", "/src", "/ctx/tool", "rw"],
        &["agent", "new", "a", "--mount", "src", "/data", "ro"],
        &["agent", "new", "a", "--mount", "/src", "/data", "xx"],
        &["agent", "new", "a", "--mount", "/src", "/data", "ro,xx"],
        &["agent", "new", "a", "--mount", "/s", "/data", "ro", "--mount", "/t", "/data", "rw"],
        &["agent", "new", "a", "--shared", "proj"],
        &["agent", "new", "a", "--shared", "proj:admin"],
        &["agent", "new", "a", "--shared", "../x:read"],
        &["agent", "new", "a", "--tool", "no/slash"],
        &["agent", "new", "a", "--model", "a/b/c"],
        &["agent", "new", "a", "--label", "bad label"],
        &["agent", "new", "a", "--label", "*"],
        &["agent", "new", "a", "--groups", "20,wheel"],
        &["agent", "new", "a", "--uid", "-1"],
    ];
    for args in cases {
        let out = ctx(s, args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out.stderr));
        assert!(!text(&out.stderr).is_empty(), "{args:?} says why");
    }
    let out = ctx(s, &["agent", "new", "bad/name"]);
    assert!(text(&out.stderr).contains("invalid agent name \"bad/name\""), "{}", text(&out.stderr));
    let out = ctx(s, &["agent", "new", "a", "--mount", "/src", "/ctx", "ro"]);
    assert!(text(&out.stderr).contains("/ctx"), "{}", text(&out.stderr));
    let long = "a".repeat(64);
    let out = ctx(s, &["agent", "new", &long]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("--label"), "{}", text(&out.stderr));
    assert!(!s.join("agent/a").exists() && !s.join(format!("agent/{long}")).exists());
    for args in [&["agent", "inspect", "bad/name"][..], &["agent", "rm", "bad/name"]] {
        assert_eq!(ctx(s, args).status.code(), Some(2), "{args:?}");
    }
    // An argument that is not UTF-8 is a usage error said plainly, never a panic (it was exit
    // 70 with a backtrace), for ctx and for its mount(8) helper name alike.
    use std::os::unix::ffi::OsStrExt;
    let bad = std::ffi::OsStr::from_bytes(b"\xff");
    let out = std::process::Command::new(tests::bin("ctx"))
        .args(["agent", "new"])
        .arg(bad)
        .arg("--source")
        .arg(s)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).starts_with("ctx: ") && !text(&out.stderr).contains("panicked"),
        "{}",
        text(&out.stderr)
    );
    let helper = d.path().join("mount.fuse.cortexfs");
    std::os::unix::fs::symlink(tests::bin("ctx"), &helper).unwrap();
    let out = std::process::Command::new(&helper).arg(bad).arg(s).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("not UTF-8") && !text(&out.stderr).contains("panicked"),
        "{}",
        text(&out.stderr)
    );
}

/// Granting a tool took two hand-written lines in two files (the agent's policy and the tool's
/// own); one command writes both, the tool's first, and only once.
#[test]
fn grant_writes_both_sides_once() {
    let d = tempfile::tempdir().unwrap();
    let s = d.path().join("storage");
    let st = s.to_str().unwrap();
    ok(&Command::new(tests::bin("ctx")).args(["bootstrap", st]).output().unwrap());
    ok(&ctx(&s, &["agent", "new", "coder"]));
    let said = ok(&ctx(&s, &["agent", "grant", "coder", "tool:fs.read", "execute"]));
    assert!(said.contains("tool/fs.read.d/policy: added allow coder_t tool:fs.read execute"), "{said}");
    assert_eq!(
        fs::read_to_string(s.join("tool/fs.read.d/policy")).unwrap(),
        "allow coder_t tool:fs.read execute\n"
    );
    assert_eq!(
        fs::read_to_string(s.join("agent/coder.d/policy")).unwrap(),
        "allow coder_t tool:fs.read execute\n"
    );
    let again = ok(&ctx(&s, &["agent", "grant", "coder", "tool:fs.read", "execute"]));
    assert!(again.contains("already has"), "{again}");
    assert_eq!(fs::read_to_string(s.join("agent/coder.d/policy")).unwrap().lines().count(), 1);
    // `ctx agent new --tool` of an installed tool writes its side too.
    let said = ok(&ctx(&s, &["agent", "new", "lister", "--tool", "fs.list"]));
    assert!(said.contains("tool/fs.list.d/policy: added allow lister_t tool:fs.list execute"), "{said}");
    assert_eq!(
        fs::read_to_string(s.join("tool/fs.list.d/policy")).unwrap(),
        "allow lister_t tool:fs.list execute\n"
    );
    // Not a tool: the agent's side only.
    ok(&ctx(&s, &["agent", "grant", "coder", "shared:proj", "read"]));
    assert!(
        fs::read_to_string(s.join("agent/coder.d/policy"))
            .unwrap()
            .ends_with("allow coder_t shared:proj read\n")
    );
    for (args, code) in [
        (&["agent", "grant", "coder", "tool:nosuch", "execute"][..], 1),
        (&["agent", "grant", "coder", "tool:fs.read", "fly"][..], 2),
        (&["agent", "grant", "nobody", "tool:fs.read", "execute"][..], 1),
    ] {
        let o = ctx(&s, args);
        assert_eq!(o.status.code(), Some(code), "{args:?}: {}", tests::shown(&o));
    }
}

/// An unknown agent was 1, 2 or 69 depending on the command, and leaked paths
/// (`/ctx/agent/nosuch.d/uid: No such file or directory`); `ctx object inspect` reported a
/// missing object on stdout. Now it is one message and exit 1 everywhere, and a run that is
/// not there is "not running" (1) for every command that needs one.
#[test]
fn an_unknown_agent_is_one_error_and_one_code_in_every_command() {
    let s = tests::served::Served::start();
    let (st, mnt) = (s.storage.to_str().unwrap(), s.mnt.to_str().unwrap());
    let control = s.control.to_str().unwrap();
    let by_storage: &[&[&str]] = &[
        &["agent", "inspect", "nosuch"],
        &["agent", "rm", "nosuch", "--yes"],
        &["agent", "grant", "nosuch", "tool:x", "execute"],
        &["agent", "revoke", "nosuch", "tool:x", "execute"],
        &["agent", "set", "nosuch", "gid", "5"],
    ];
    for args in by_storage {
        let out = run("ctx", &[args, &["--source", st][..]].concat());
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", text(&out.stderr));
        assert_eq!(
            text(&out.stderr).trim(),
            format!("ctx: no agent nosuch in {st} (ctx agent ls lists them)"),
            "{args:?}"
        );
    }
    let by_mount: &[&[&str]] = &[
        &["agent", "history", "nosuch"],
        &["agent", "output", "nosuch"],
        &["agent", "children", "nosuch"],
        &["send", "nosuch", "hi"],
        &["cancel", "nosuch"],
    ];
    for args in by_mount {
        let out = run("ctx", &[args, &["--ctx", mnt][..]].concat());
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", text(&out.stderr));
        assert_eq!(
            text(&out.stderr).trim(),
            format!("ctx: no agent nosuch in {mnt} (ctx agent ls lists them)"),
            "{args:?}"
        );
    }
    let out = run(
        "ctx",
        &["agent", "start", "nosuch", "--ctx", mnt, "--control", control, "--wait", "--", "/bin/true"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("no agent nosuch in"), "{}", text(&out.stderr));
    for args in
        [&["agent", "watch", "nosuch"][..], &["agent", "send", "nosuch", "hi"], &["agent", "stop", "nosuch"]]
    {
        let out = run("ctx", &[args, &["--control", control][..]].concat());
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", text(&out.stderr));
        assert_eq!(text(&out.stderr).trim(), "ctx: agent nosuch session default is not running", "{args:?}");
    }
    let out = run("ctx", &["object", "inspect", "agent/nosuch", "--source", st]);
    assert_eq!((out.status.code(), text(&out.stdout)), (Some(1), String::new()));
    assert!(text(&out.stderr).contains("no agent/nosuch in"), "{}", text(&out.stderr));
    // Nothing served at the mount named: unavailable, said so.
    let out = run("ctx", &["agent", "history", "nosuch", "--ctx", "/nonexistent"]);
    assert_eq!(out.status.code(), Some(69), "{}", text(&out.stderr));
}

/// Any argument, to any subcommand: `ctx agent new $'\xff'` panicked with exit 70. Every
/// subcommand (found from `--help`, recursively) is given a non-UTF-8 argument and answers
/// with a stable exit code and no panic. `mount` (a daemon) is left out: its mount point
/// may be any bytes.
#[test]
fn every_subcommand_given_a_non_utf8_argument_answers_without_a_panic() {
    use std::os::unix::ffi::OsStrExt;
    let scratch = tempfile::tempdir().unwrap();
    let help = |path: &[String]| {
        let o = Command::new(tests::bin("ctx")).args(path).arg("--help").output().unwrap();
        text(&o.stdout)
    };
    let mut todo = vec![Vec::<String>::new()];
    let mut leaves = Vec::new();
    while let Some(path) = todo.pop() {
        let h = help(&path);
        let subs: Vec<String> = h
            .split("Commands:\n")
            .nth(1)
            .map(|c| {
                c.lines()
                    .take_while(|l| !l.trim().is_empty())
                    .filter_map(|l| l.split_whitespace().next())
                    .filter(|n| *n != "help")
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        if subs.is_empty() {
            leaves.push(path);
        } else {
            for s in subs {
                let mut p = path.clone();
                p.push(s);
                todo.push(p);
            }
        }
    }
    assert!(leaves.len() > 50, "every subcommand: {}", leaves.len());
    let bad = std::ffi::OsStr::from_bytes(b"\xff\xfe");
    for path in leaves.iter().filter(|p| p.first().is_none_or(|c| c != "mount")) {
        let mut child = Command::new(tests::bin("ctx"))
            .args(path)
            .arg(bad)
            .current_dir(scratch.path())
            .env("CTX_SECRETS", scratch.path().join("secrets"))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let t = std::time::Instant::now();
        // A hang, not a time: `bootstrap` of a new storage copies the core tools (debug builds:
        // 170 MB each) and commits them.
        while child.try_wait().unwrap().is_none() {
            if t.elapsed() > std::time::Duration::from_secs(120) {
                let _ = child.kill();
                panic!("ctx {path:?} with a non-UTF-8 argument did not end");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let out = child.wait_with_output().unwrap();
        let code = out.status.code();
        assert!(matches!(code, Some(0 | 1 | 2 | 13 | 69)), "ctx {path:?}: {code:?}: {}", text(&out.stderr));
        assert!(!text(&out.stderr).contains("panicked"), "ctx {path:?}: {}", text(&out.stderr));
    }
}

/// `ctx queue ls` of a typo made a queue there; a command that only reads makes nothing: each
/// is run against an empty storage, mount point, secret store and queue directory, which stay
/// empty.
#[test]
fn commands_that_read_create_nothing() {
    let d = tempfile::tempdir().unwrap();
    let (s, m, q) = (d.path().join("storage"), d.path().join("ctx"), d.path().join("q"));
    for dir in [&s, &m, &q] {
        fs::create_dir_all(dir).unwrap();
    }
    let policy = d.path().join("p.policy");
    fs::write(&policy, "allow a_t tool:x execute\n").unwrap();
    let (st, mt, qt, pt) =
        (s.to_str().unwrap(), m.to_str().unwrap(), q.to_str().unwrap(), policy.to_str().unwrap());
    let reads: &[&[&str]] = &[
        &["agent", "ls", "--source", st],
        &["agent", "ls", "--json", "--source", st],
        &["agent", "inspect", "x", "--source", st],
        &["agent", "history", "x", "--ctx", mt],
        &["agent", "output", "x", "--ctx", mt],
        &["agent", "children", "x", "--ctx", mt],
        &["model", "ls", "--source", st],
        &["model", "inspect", "local/x", "--source", st],
        &["secret", "ls"],
        &["install", "--list", "--source", st],
        &["object", "inspect", "tool/x", "--source", st],
        &["shared", "ls", "--source", st],
        &["queue", "ls", qt],
        &["policy", "check", pt],
        &["status", "--ctx", mt],
        &["path", "tool", "x", "--ctx", mt],
        &["man", "policy", "--ctx", mt],
    ];
    let listing = |root: &Path| -> Vec<String> {
        let mut v = Vec::new();
        let mut todo = vec![root.to_path_buf()];
        while let Some(p) = todo.pop() {
            for e in fs::read_dir(&p).into_iter().flatten().flatten() {
                v.push(e.path().display().to_string());
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    todo.push(e.path());
                }
            }
        }
        v.sort();
        v
    };
    let before = listing(d.path());
    for args in reads {
        let out = Command::new(tests::bin("ctx"))
            .args(*args)
            .env("CTX_SECRETS", d.path().join("secrets"))
            .output()
            .unwrap();
        assert!(!text(&out.stderr).contains("panicked"), "{args:?}");
        assert_eq!(listing(d.path()), before, "ctx {args:?} made something: {}", text(&out.stderr));
    }
}

/// Listings had no header line and some had no `--json`: every human listing has a header of
/// upper-case column names, and `--json` gives the same rows.
#[test]
fn every_listing_has_a_header_and_json() {
    let d = tempfile::tempdir().unwrap();
    let s = d.path().join("storage");
    let st = s.to_str().unwrap();
    let q = d.path().join("q");
    let job = d.path().join("j1.req.json");
    fs::write(&job, "{}").unwrap();
    let run_ok = |args: &[&str]| ok(&run("ctx", args));
    run_ok(&["bootstrap", st]);
    run_ok(&["agent", "new", "lister", "--source", st]);
    run_ok(&[
        "model",
        "add",
        "local/m1",
        "--api",
        "openai-responses",
        "--base-url",
        "http://127.0.0.1:9/v1",
        "--id",
        "m-1",
        "--source",
        st,
    ]);
    run_ok(&["model", "alias", "main", "local/m1", "--source", st]);
    run_ok(&["shared", "new", "team", "--group", "3300", "--source", st]);
    run_ok(&["queue", "publish", q.to_str().unwrap(), job.to_str().unwrap()]);
    let cases: &[(&[&str], &str)] = &[
        (&["agent", "ls", "--source", st], "NAME\tLABEL\tUID"),
        (&["model", "ls", "--source", st], "NAME\tAPI\tBASE_URL\tALIASES"),
        (&["shared", "ls", "--source", st], "SPACE\tOWNER\tGROUP\tMODE\tAGENTS"),
        (&["queue", "ls", q.to_str().unwrap()], "STATE\tJOB\tPROBLEM"),
        (&["man"], "TOPIC\tTITLE\tALIASES"),
    ];
    for (args, header) in cases {
        let out = run_ok(args);
        assert_eq!(out.lines().next(), Some(*header), "ctx {args:?}: {out}");
        assert!(out.lines().count() >= 2, "ctx {args:?}: rows under the header: {out}");
        let mut json: Vec<&str> = args.to_vec();
        json.push("--json");
        let v: serde_json::Value =
            serde_json::from_str(&run_ok(&json)).unwrap_or_else(|e| panic!("ctx {json:?}: {e}"));
        assert!(v.is_array() || v.is_object(), "ctx {json:?}: {v}");
    }
    assert!(
        run_ok(&["model", "ls", "--source", st])
            .contains("local/m1\topenai-responses\thttp://127.0.0.1:9/v1\tmain")
    );
    let v: serde_json::Value =
        serde_json::from_str(&run_ok(&["queue", "recover", q.to_str().unwrap(), "--json"])).unwrap();
    assert!(v["requeued"].is_array() && v["conflicts"].is_array(), "{v}");
    // What only root may be given is given only when meant.
    for args in [&["agent", "set", "lister", "gid", "0"][..], &["agent", "set", "lister", "groups", "20,0"]] {
        let out = run("ctx", &[args, &["--source", st][..]].concat());
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out.stderr));
    }
    run_ok(&["agent", "set", "lister", "gid", "0", "--allow-root", "--source", st]);
}
