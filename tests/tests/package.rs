//! Packages and manuals as operators use them: `ctx install` of the example package (two tools
//! and an agent) whose tools then run through tsh in the agent's sandboxed view, `ctx
//! uninstall`, a package failing part way leaving nothing visible; `ctx man` with and without
//! the installed manuals, `ctx bootstrap --check` finding a page changed on one side, and the
//! generated man pages rendering with `man -l`.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use tests::served::Served;

fn ctx(args: &[&str]) -> Output {
    Command::new(tests::bin("ctx")).args(args).output().unwrap()
}

fn ok(o: &Output) -> String {
    assert!(o.status.success(), "{}", tests::shown(o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/package")
}

fn listed(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .map(|r| r.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn a_package_installs_runs_through_tsh_in_an_agent_view_and_uninstalls() {
    assert!(Path::new("/usr/bin/bwrap").exists(), "bubblewrap is required (make test installs it)");
    let s = Served::start();
    let st = s.storage.to_str().unwrap();
    ok(&ctx(&["bootstrap", st]));
    let pkg = example();
    let said = ok(&ctx(&["install", pkg.to_str().unwrap(), "--source", st, "--dry-run"]));
    assert!(said.contains("would install agent/reviewer"), "{said}");
    assert!(!s.mnt.join("tool/kit.count").exists(), "a dry run installs nothing");
    let said = ok(&ctx(&["install", pkg.to_str().unwrap(), "--source", st]));
    assert!(said.contains("installed package review-kit 0.1.0"), "{said}");
    for p in ["tool/kit.count", "tool/kit.todo", "agent/reviewer"] {
        assert!(s.mnt.join(p).exists(), "{p} is served");
    }
    assert_eq!(
        fs::read_to_string(s.mnt.join("tool/kit.todo.d/origin")).unwrap(),
        "package:review-kit@0.1.0\n"
    );
    let again = ctx(&["install", pkg.to_str().unwrap(), "--source", st]);
    assert_eq!(again.status.code(), Some(1), "{}", tests::shown(&again));
    assert!(String::from_utf8_lossy(&again.stderr).contains("already installed"), "{}", tests::shown(&again));
    let listed = ok(&ctx(&["install", "--list", "--source", st]));
    assert!(
        listed.starts_with("PACKAGE\tVERSION\tSTATE\tTIER\tOBJECTS\nreview-kit\t0.1.0\tinstalled\tsystem\t"),
        "{listed}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&ok(&ctx(&["install", "--list", "--json", "--source", st]))).unwrap();
    assert_eq!(
        (v[0]["package"].as_str(), v[0]["state"].as_str()),
        (Some("review-kit"), Some("installed")),
        "{v}"
    );

    // The agent the package brought runs the package's tools through tsh in its own view.
    let work = s.dir.path().join("work");
    fs::create_dir_all(&work).unwrap();
    fs::write(work.join("notes.txt"), "one\nTODO: two\nthree\n").unwrap();
    // A package never names its agent's identity: the host gave it one of its own.
    let uid: u32 =
        fs::read_to_string(s.storage.join("agent/reviewer.d/uid")).unwrap().trim().parse().unwrap();
    assert!(policy::ids::AGENT_IDS.contains(&uid), "{uid}");
    let id = Some(rustix::fs::Uid::from_raw(uid));
    rustix::fs::chown(&work, id, Some(rustix::fs::Gid::from_raw(uid))).unwrap();
    let session = format!("pk{}", std::process::id());
    let out = Command::new(tests::bin("ctx"))
        .args(["agent", "start", "reviewer", "--session", &session, "--wait", "--ctx"])
        .arg(&s.mnt)
        .arg("--control")
        .arg(&s.control)
        .arg("--cwd")
        .arg(&work)
        .args([
            "--",
            "/bin/sh",
            "-c",
            "cd /workspace; /ctx/bin/tsh kit.count notes.txt > count; /ctx/bin/tsh kit.todo notes.txt > todo; \
             ls /ctx/tool > tools",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", tests::shown(&out));
    assert_eq!(
        fs::read_to_string(work.join("count")).unwrap().split_whitespace().collect::<Vec<_>>()[..3],
        ["3", "4", "20"]
    );
    assert_eq!(fs::read_to_string(work.join("todo")).unwrap(), "notes.txt:2:TODO: two\n");
    let tools = fs::read_to_string(work.join("tools")).unwrap();
    assert!(
        tools.contains("kit.count") && !tools.contains("fs.write"),
        "the view shows granted tools only: {tools}"
    );
    let events = fs::read_to_string(
        s.storage.join(format!("home/{uid}/agent/reviewer/session/{session}/events.jsonl")),
    )
    .unwrap();
    for t in ["tool/kit.count", "tool/kit.todo"] {
        assert!(
            events.lines().any(|l| l.contains("\"tool.call\"") && l.contains(t)),
            "{t} is recorded: {events}"
        );
    }

    let plan = ok(&ctx(&["uninstall", "review-kit", "--source", st]));
    assert!(plan.contains("would remove tool/kit.count"), "{plan}");
    assert!(s.mnt.join("tool/kit.count").exists(), "a plan removes nothing");
    ok(&ctx(&["uninstall", "review-kit", "--source", st, "--yes"]));
    // Storage changed behind the daemon: the host view follows within its --cache-timeout (1 s).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    for p in ["tool/kit.count", "tool/kit.count.d", "tool/kit.todo", "agent/reviewer", "agent/reviewer.d"] {
        assert!(!s.storage.join(p).exists(), "{p} is gone from storage");
        while s.mnt.join(p).exists() {
            assert!(std::time::Instant::now() < deadline, "{p} is still served");
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
    let gone = ctx(&["uninstall", "review-kit", "--source", st, "--yes"]);
    assert_eq!(gone.status.code(), Some(1), "{}", tests::shown(&gone));
}

/// A failure after some of the package's objects were published (here: the agents' directory is
/// read-only, so the two tools go out and the agent cannot) takes back what went out.
#[test]
fn a_package_failing_part_way_leaves_nothing_visible() {
    let s = Served::start();
    let st = s.storage.to_str().unwrap();
    let agents = s.storage.join("agent");
    fs::create_dir_all(&agents).unwrap();
    let ro = |args: &[&str]| {
        let o = Command::new("mount").args(args).arg(&agents).arg(&agents).output().unwrap();
        assert!(o.status.success(), "mount {args:?}: {}", tests::shown(&o));
    };
    ro(&["--bind"]);
    ro(&["-o", "remount,bind,ro"]);
    let out = ctx(&["install", example().to_str().unwrap(), "--source", st]);
    let _ = Command::new("umount").arg(&agents).status();
    assert_eq!(out.status.code(), Some(1), "{}", tests::shown(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("agent/reviewer") && err.contains("nothing of the package is left"), "{err}");
    let tools: Vec<String> =
        listed(&s.mnt.join("tool")).into_iter().filter(|n| n.starts_with("kit.")).collect();
    assert!(tools.is_empty(), "left visible: {tools:?}");
    let stored: Vec<String> =
        listed(&s.storage.join("tool")).into_iter().filter(|n| n.contains("kit.")).collect();
    assert!(stored.is_empty(), "left in storage: {stored:?}");
    assert!(ok(&ctx(&["install", "--list", "--source", st])).is_empty(), "no record is left");
    // The same package installs once the storage allows it.
    ok(&ctx(&["install", example().to_str().unwrap(), "--source", st]));
}

#[test]
fn a_bad_package_writes_nothing_and_says_why() {
    let d = tempfile::tempdir().unwrap();
    let pkg = d.path().join("pkg");
    let cp = Command::new("cp").arg("-a").arg(example()).arg(&pkg).status().unwrap();
    assert!(cp.success());
    fs::write(pkg.join("policy/kit.todo"), "allow reviewer_t tool:* execute\n").unwrap();
    let st = d.path().join("storage");
    let out = ctx(&["install", pkg.to_str().unwrap(), "--source", st.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", tests::shown(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("tool[1].controls.policy"),
        "{}",
        tests::shown(&out)
    );
    assert!(!st.exists(), "nothing written");
    let out = ctx(&["install", d.path().join("nope").to_str().unwrap(), "--source", st.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", tests::shown(&out));
    assert!(!st.exists(), "nothing written");
}

#[test]
fn man_reads_the_installed_manuals_and_falls_back_to_its_own() {
    let spec = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/spec");
    let model = fs::read_to_string(spec.join("model-abi.md")).unwrap();
    // Nothing installed: the built-in copy, which is docs/spec's.
    let out = ctx(&["man", "model", "--ctx", "/nonexistent"]);
    assert_eq!(ok(&out).trim_end(), model.trim_end());
    let out = ctx(&["man", "no-such-topic"]);
    assert_eq!(out.status.code(), Some(2), "{}", tests::shown(&out));
    assert!(ok(&ctx(&["man"])).contains("agent-socket"), "no topic lists them");

    // Installed by bootstrap, read through /ctx.
    let s = Served::start();
    let st = s.storage.to_str().unwrap();
    ok(&ctx(&["bootstrap", st]));
    let page = s.mnt.join("shared/cortexfs-docs/man/ctx.model-abi.md");
    assert_eq!(fs::read_to_string(&page).unwrap(), model);
    assert!(s.mnt.join("shared/cortexfs-docs/README.md").exists());
    ok(&ctx(&["bootstrap", st, "--check"]));

    // A page changed on one side only: man shows the installed one and says it differs;
    // bootstrap --check names it; bootstrap puts it back.
    fs::write(s.mnt.join("shared/cortexfs-docs/man/ctx.model-abi.md"), "# changed\n").unwrap();
    fs::write(s.mnt.join("shared/cortexfs-docs/man/ctx.old.md"), "# gone\n").unwrap();
    let out = ctx(&["man", "provider", "--ctx", s.mnt.to_str().unwrap()]);
    assert_eq!(ok(&out), "# changed\n");
    assert!(String::from_utf8_lossy(&out.stderr).contains("differs"), "{}", tests::shown(&out));
    let out = ctx(&["man", "provider", "--ctx", s.mnt.to_str().unwrap(), "--builtin"]);
    assert_eq!(ok(&out).trim_end(), model.trim_end());
    let out = ctx(&["bootstrap", st, "--check"]);
    assert_eq!(out.status.code(), Some(1), "{}", tests::shown(&out));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("outdated man/ctx.model-abi.md") && said.contains("stale man/ctx.old.md"),
        "{said}"
    );
    ok(&ctx(&["bootstrap", st]));
    ok(&ctx(&["bootstrap", st, "--check"]));
    assert_eq!(fs::read_to_string(&page).unwrap(), model);
}

#[test]
fn generated_man_pages_render_and_completions_exist() {
    let d = tempfile::tempdir().unwrap();
    let man = d.path().join("man");
    let comp = d.path().join("completions");
    ok(&ctx(&["generate", "man", man.to_str().unwrap()]));
    ok(&ctx(&["generate", "completions", comp.to_str().unwrap()]));
    for page in ["ctx.1", "ctx-install.1", "ctx-agent-start.1", "ctx-man.1"] {
        assert!(man.join(page).exists(), "{page}");
    }
    let out = Command::new("man")
        .args(["-l", "-P", "cat"])
        .arg(man.join("ctx-install.1"))
        .env("MANWIDTH", "80")
        .output()
        .unwrap();
    let shown = ok(&out);
    assert!(shown.contains("ctx-install") && shown.contains("--dry-run"), "{shown}");
    for f in ["ctx.bash", "_ctx", "ctx.fish"] {
        let text = fs::read_to_string(comp.join(f)).unwrap();
        assert!(text.contains("uninstall"), "{f}");
    }
}
