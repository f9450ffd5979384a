//! `ctx policy`, `ctx object check` and `ctx validate-name` as users run them.

use std::fs;
use std::path::Path;
use std::process::Command;

use tests::run;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn policy_check_reports_every_bad_line_with_its_number() {
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("bad.policy");
    fs::write(
        &f,
        "allow coder_t tool:fs.read execute\n\n# comment\nallow coder_t agent:* create\nallow coder_t network:foo connect\nallow coder_t widget:x use\nallow coder_t tool:fs.read run\nallow coder_t tool:fs.stat execute\nallow coder_t tool:x\n",
    )
    .unwrap();
    let out = run("ctx", &["policy", "check", f.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    let want = [3, 4, 5, 6, 7, 9];
    assert_eq!(lines.len(), want.len(), "{stdout}");
    for (l, n) in lines.iter().zip(want) {
        assert!(l.starts_with(&format!("{}:{n}: error: ", f.display())), "{l}");
        assert!(l.ends_with("(EINVAL)"), "{l}");
    }
    assert!(lines[1].contains("object"), "{}", lines[1]);
    assert!(lines[3].contains("class"), "{}", lines[3]);
    assert!(lines[4].contains("permission"), "{}", lines[4]);
}

#[test]
fn policy_check_good_file_and_several_files() {
    let d = tempfile::tempdir().unwrap();
    let good = d.path().join("good.policy");
    let bad = d.path().join("bad.policy");
    fs::write(&good, "allow coder_t tool:fs.read execute\n").unwrap();
    fs::write(&bad, "nonsense\n").unwrap();
    let out = run("ctx", &["policy", "check", good.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0));
    assert!(out.stdout.is_empty());
    let out = run("ctx", &["policy", "check", good.to_str().unwrap(), bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stdout).starts_with(&format!("{}:1: error:", bad.display())));
    let out = run("ctx", &["policy", "check", "--json", good.to_str().unwrap(), bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((v[0]["file"].as_str(), v[0]["line"].as_u64()), (bad.to_str(), Some(1)), "{v}");
    let out = run("ctx", &["policy", "check", "/nonexistent/file"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).starts_with("ctx: cannot read /nonexistent/file"));
}

#[test]
fn policy_test_allow_and_deny() {
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("p");
    fs::write(&f, "allow coder_t tool:fs.read execute\nallow coder_t agent:reviewer create\n").unwrap();
    let f = f.to_str().unwrap();
    let out = run("ctx", &["policy", "test", f, "coder_t", "tool:fs.read", "execute"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(text(&out.stdout).starts_with("allow"));
    let out = run("ctx", &["policy", "test", f, "coder_t", "tool:shell.exec", "execute"]);
    assert_eq!(out.status.code(), Some(13));
    assert!(text(&out.stdout).starts_with("deny: no rule grants coder_t tool:shell.exec execute"));
    let out = run("ctx", &["policy", "test", f, "coder_t", "agent:reviewer", "start"]);
    assert_eq!(out.status.code(), Some(13));
    assert!(text(&out.stdout).contains("rules grant only create"));
    let out = run("ctx", &["policy", "test", f, "coder_t", "agent:*", "create"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("EINVAL"));
    let out = run("ctx", &["policy", "test", f, "coder_t", "tool:fs.read", "use"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn validate_name() {
    assert_eq!(run("ctx", &["validate-name", "fs.read"]).status.code(), Some(0));
    for bad in ["", ".", "..", "a/b", "x.sock", "x.d", &"a".repeat(65)] {
        let out = run("ctx", &["validate-name", bad]);
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        assert!(text(&out.stderr).starts_with("ctx: invalid name"));
    }
    assert_eq!(run("ctx", &["validate-name", "--mcp", "github.search"]).status.code(), Some(0));
    assert_eq!(run("ctx", &["validate-name", "--mcp", "github"]).status.code(), Some(2));
}

#[test]
fn usage_errors_exit_2_and_help_exits_0() {
    assert_eq!(run("ctx", &["bogus"]).status.code(), Some(2));
    assert_eq!(run("ctx", &["policy", "check"]).status.code(), Some(2));
    for args in [
        &["--help"][..],
        &["policy", "--help"],
        &["policy", "check", "--help"],
        &["policy", "test", "--help"],
        &["object", "check", "--help"],
        &["validate-name", "--help"],
    ] {
        let out = run("ctx", args);
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        assert!(text(&out.stdout).contains("Usage:"), "{args:?}");
    }
    let out = run("ctx", &["--version"]);
    assert_eq!(text(&out.stdout).trim(), format!("ctx {}", env!("CARGO_PKG_VERSION")));
}

#[test]
fn object_check_lists_every_problem() {
    let d = tempfile::tempdir().unwrap();
    let m = d.path().join("m.json");
    fs::write(
        &m,
        r#"{"schema":"cortexfs.object/v1","version":"x","compatibility":{"cortexfs":"*"},"class":"tool","name":"a/b","executable":{"path":"../x","sha256":"00"}}"#,
    )
    .unwrap();
    let out = run("ctx", &["object", "check", m.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let stdout = text(&out.stdout);
    for field in ["schema", "version", "name", "executable.path", "executable.sha256", "controls"] {
        assert!(stdout.contains(&format!(": {field}: ")), "{field} in {stdout}");
    }
}

/// `ctx policy check /dev/zero` grew to 2.7 GB, and `ctx queue ls` of a missing directory
/// created a queue there.
#[test]
fn inputs_are_bounded_and_listing_creates_nothing() {
    let o = Command::new(tests::bin("ctx")).args(["policy", "check", "/dev/zero"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", tests::shown(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("larger than 65536 bytes"), "{}", tests::shown(&o));
    let d = tempfile::tempdir().unwrap();
    let missing = d.path().join("missing");
    // Only a publish makes a queue: listing, claiming, working, finishing and recovering a
    // directory that holds none (a typo) is an error, and makes nothing.
    for args in [
        &["ls"][..],
        &["claim", "--worker", "w1"],
        &["recover"],
        &["finish", "j.req.json", "--worker", "w1", "--result", "/dev/null"],
        &["work", "--worker", "w1", "--", "/bin/cat"],
    ] {
        let mut c = Command::new(tests::bin("ctx"));
        c.arg("queue").arg(args[0]).arg(&missing).args(&args[1..]);
        let o = c.output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", tests::shown(&o));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("no queue there"),
            "{args:?}: {}",
            tests::shown(&o)
        );
        assert!(!missing.exists(), "{args:?} created {}", missing.display());
    }
}

/// `cortexfs-core --version` exited 2.
#[test]
fn every_binary_says_its_version() {
    for bin in ["ctx", "tsh", "ctxterm", "cortexfs-core", "ctxmcp"] {
        let o = Command::new(tests::bin(bin)).arg("--version").output().unwrap();
        assert!(o.status.success(), "{bin}: {}", tests::shown(&o));
        assert!(
            String::from_utf8_lossy(&o.stdout).contains(env!("CARGO_PKG_VERSION")),
            "{bin}: {}",
            tests::shown(&o)
        );
    }
}

/// A usage error said `error: ...` (clap's own words) instead of `prog: ...`.
#[test]
fn usage_errors_say_which_program_and_exit_2() {
    for (bin, args) in
        [("ctx", &["agent", "nosuch"][..]), ("ctxterm", &["--nosuch"][..]), ("ctxmcp", &["--nosuch"][..])]
    {
        let o = Command::new(tests::bin(bin)).args(args).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{bin}: {}", tests::shown(&o));
        assert!(
            String::from_utf8_lossy(&o.stderr).starts_with(&format!("{bin}: ")),
            "{bin}: {}",
            tests::shown(&o)
        );
    }
}

/// `ctx doctor --json`'s exit code and the names of the checks that failed, each of which must
/// say what to do.
fn failed_checks(o: &std::process::Output) -> (Option<i32>, Vec<String>) {
    let v: serde_json::Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|_| panic!("{}", tests::shown(o)));
    let failed = v
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["ok"] == false)
        .inspect(|c| assert!(c["fix"].is_string(), "a failure says what to do: {c}"))
        .map(|c| c["name"].as_str().unwrap().to_owned())
        .collect();
    (o.status.code(), failed)
}

/// `ctx doctor` on a healthy host says so (exit 0), and names each precondition broken here,
/// with what to do (exit 1).
#[test]
fn doctor_reports_each_broken_precondition() {
    use std::os::unix::fs::PermissionsExt;
    let s = tests::served::Served::start();
    let doctor = |storage: &Path, ctx: &Path, control: &Path| {
        let o = Command::new(tests::bin("ctx"))
            .args(["doctor", "--json", "--source"])
            .arg(storage)
            .arg("--ctx")
            .arg(ctx)
            .arg("--control")
            .arg(control)
            .output()
            .unwrap();
        failed_checks(&o)
    };
    let _net = tests::NETWORK.lock().unwrap_or_else(|p| p.into_inner());
    let (storage, mnt, control) = (s.storage.clone(), s.mnt.clone(), s.control.clone());
    assert_eq!(doctor(&storage, &mnt, &control), (Some(0), vec![]));
    let nowhere = s.dir.path().join("nowhere");
    assert_eq!(doctor(&nowhere, &mnt, &control), (Some(1), vec!["storage".to_owned()]));
    assert_eq!(doctor(&storage, &mnt, &nowhere), (Some(1), vec!["daemon".to_owned()]));
    fs::create_dir_all(&nowhere).unwrap();
    assert_eq!(doctor(&storage, &nowhere, &control), (Some(1), vec!["mount".to_owned()]));
    // A grant to a label no agent holds.
    fs::create_dir_all(storage.join("tool/t.d")).unwrap();
    fs::write(storage.join("tool/t.d/policy"), "allow ghost_t tool:t execute\n").unwrap();
    assert_eq!(doctor(&storage, &mnt, &control), (Some(1), vec!["labels".to_owned()]));
    fs::remove_dir_all(storage.join("tool/t.d")).unwrap();
    // The run state of a supervisor that is gone.
    let mut gone = Command::new("true").spawn().unwrap();
    let pid = gone.id();
    gone.wait().unwrap();
    let run = s.rt().join("agent").join(tests::unique("doctor")).join("s");
    fs::create_dir_all(&run).unwrap();
    fs::write(run.join("pid"), pid.to_string()).unwrap();
    assert_eq!(doctor(&storage, &mnt, &control), (Some(1), vec!["runs".to_owned()]));
    fs::remove_dir_all(run.parent().unwrap()).unwrap();
    // /dev/net/tun that agents cannot open.
    let mode = fs::metadata("/dev/net/tun").unwrap().permissions().mode() & 0o7777;
    fs::set_permissions("/dev/net/tun", fs::Permissions::from_mode(0o600)).unwrap();
    let broken = doctor(&storage, &mnt, &control);
    fs::set_permissions("/dev/net/tun", fs::Permissions::from_mode(mode)).unwrap();
    assert_eq!(broken, (Some(1), vec!["network".to_owned()]));
    drop(_net);

    // The rest are broken for one doctor only, in a mount namespace of its own (other tests'
    // sandboxes and daemons keep the host's).
    let alone = |setup: &str| {
        let script = format!(
            "mount --make-rprivate / && {setup} && exec \"$0\" doctor --json --source \"$1\" --ctx \"$2\" --control \"$3\""
        );
        let o = Command::new("unshare")
            .args(["-m", "--", "/bin/sh", "-c", &script])
            .arg(tests::bin("ctx"))
            .args([&storage, &mnt, &control])
            .output()
            .unwrap();
        failed_checks(&o)
    };
    // No bubblewrap (nor pasta: both live in /usr/bin).
    let (code, failed) = alone("mount -t tmpfs none /usr/bin");
    assert_eq!(code, Some(1));
    assert!(failed.contains(&"sandboxes".to_owned()), "{failed:?}");
    // No cgroup controllers.
    assert_eq!(alone("umount -R /sys/fs/cgroup"), (Some(1), vec!["ceilings".to_owned()]));
    // A view whose daemon was killed.
    let view = s.rt().join("view").join(tests::unique("doctor-dead"));
    let dead = format!(
        "mkdir -p {v} && {{ \"$0\" mount --source {st} {v} --control {v}.sock >/dev/null 2>&1 & }} && \
         for i in $(seq 100); do [ -e {v}/status ] && break; sleep 0.05; done && kill -9 $! && sleep 0.2",
        v = view.display(),
        st = s.dir.path().join("dead-storage").display(),
    );
    let broken = alone(&dead);
    let _ = fs::remove_dir(&view);
    let _ = fs::remove_file(view.with_extension("sock"));
    assert_eq!(broken, (Some(1), vec!["views".to_owned()]));
}

/// `ctx object install --source /nonexistent` made a new storage there, and a relative storage
/// that did not exist failed with an empty path in its message.
#[test]
fn installs_never_create_a_storage() {
    let d = tempfile::tempdir().unwrap();
    let hello = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/objects/hello/hello.manifest.json");
    let package = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/package");
    for args in [&["object", "install", "--source"][..], &["install", "--source"][..]] {
        for missing in [d.path().join("missing"), "relative-missing".into()] {
            let what = if args[0] == "object" { &hello } else { &package };
            let o = Command::new(tests::bin("ctx"))
                .current_dir(d.path())
                .args(args)
                .arg(&missing)
                .arg(what)
                .output()
                .unwrap();
            assert_eq!(o.status.code(), Some(2), "{args:?} {}", tests::shown(&o));
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(
                err.contains(&format!("{}: no such storage directory", missing.display())),
                "{}",
                tests::shown(&o)
            );
            assert!(!d.path().join(&missing).exists(), "{} was created", missing.display());
        }
    }
}

/// `ctx secret`: values from stdin only, files of root's only, `ls` never shows a value; and
/// `ctx model`: a strict route, aliases, and no removal while an alias points at a model.
#[test]
fn secrets_and_models_from_the_command_line() {
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::tempdir().unwrap();
    let store = d.path().join("secrets");
    let ctx = |args: &[&str], input: &str| {
        let mut c = std::process::Command::new(tests::bin("ctx"))
            .args(args)
            .env("CTX_SECRETS", &store)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        c.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
        c.wait_with_output().unwrap()
    };
    let o = ctx(&["secret", "set", "acme"], "sk-value-42\n");
    assert!(o.status.success(), "{}", tests::shown(&o));
    let f = store.join("cortexfs:acme/api-key");
    assert_eq!(std::fs::read(&f).unwrap(), b"sk-value-42", "stored without its newline");
    assert_eq!(std::fs::metadata(&f).unwrap().permissions().mode() & 0o777, 0o600);
    assert_eq!(std::fs::metadata(&store).unwrap().permissions().mode() & 0o777, 0o700);
    let o = ctx(&["secret", "ls"], "");
    assert_eq!(text(&o.stdout), "SERVICE\tACCOUNT\ncortexfs:acme\tapi-key\n");
    let o = ctx(&["secret", "ls", "--json"], "");
    assert_eq!(text(&o.stdout).trim(), r#"[{"account":"api-key","service":"cortexfs:acme"}]"#);
    assert!(!text(&o.stdout).contains("sk-value"));
    assert_eq!(ctx(&["secret", "set", "acme", "--account", "oauth:access"], "t").status.code(), Some(0));
    assert_eq!(ctx(&["secret", "set", "acme", "--account", "password"], "t").status.code(), Some(2));
    assert_eq!(ctx(&["secret", "set", "../x"], "t").status.code(), Some(2));
    assert_eq!(ctx(&["secret", "set", "acme"], "").status.code(), Some(2), "an empty secret");
    std::fs::set_permissions(&store, std::fs::Permissions::from_mode(0o755)).unwrap();
    assert_eq!(ctx(&["secret", "set", "acme"], "x").status.code(), Some(13), "a store others can read");
    std::fs::set_permissions(&store, std::fs::Permissions::from_mode(0o700)).unwrap();
    assert_eq!(ctx(&["secret", "rm", "acme"], "").status.code(), Some(0));
    assert_eq!(ctx(&["secret", "rm", "acme"], "").status.code(), Some(1));

    let storage = d.path().join("storage");
    std::fs::create_dir_all(&storage).unwrap();
    let st = storage.to_str().unwrap();
    let add = |extra: &[&str]| {
        let mut a = vec!["model", "add", "acme/big", "--source", st];
        a.extend(extra);
        ctx(&a, "")
    };
    assert_eq!(add(&["--api", "nope", "--base-url", "http://h"]).status.code(), Some(2));
    assert_eq!(add(&["--api", "openai-chat", "--base-url", "http://u@h"]).status.code(), Some(2));
    let o = add(&["--api", "openai-chat", "--base-url", "https://api.acme.test/v1", "--id", "big-2"]);
    assert!(o.status.success(), "{}", tests::shown(&o));
    assert_eq!(
        std::fs::read_to_string(storage.join("model/acme/big.d/driver")).unwrap(),
        "api=openai-chat\nbase_url=https://api.acme.test/v1\n"
    );
    assert_eq!(add(&["--api", "openai-chat", "--base-url", "http://h"]).status.code(), Some(1), "exists");
    assert_eq!(ctx(&["model", "alias", "main", "acme/none", "--source", st], "").status.code(), Some(1));
    assert!(ctx(&["model", "alias", "main", "acme/big", "--source", st], "").status.success());
    let o = ctx(&["model", "ls", "--json", "--source", st], "");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["models"][0]["id"], "big-2");
    assert_eq!(v["aliases"]["main"], "acme/big");
    let o = ctx(&["model", "rm", "acme/big", "--source", st], "");
    assert_eq!(o.status.code(), Some(1), "main points at it: {}", tests::shown(&o));
}

/// Completions and man pages were behind a hidden `ctx generate` and nothing installed them
/// (`man ctx`: no entry). `make install-files` (what `make install` runs after its release
/// build) puts the binaries, the man pages and the completions of bash, zsh and fish under a
/// prefix: `man ctx` and `man ctx-agent-start` read there, and bash completes ctx's commands
/// and the agents the daemon serves.
#[test]
fn make_install_puts_man_pages_and_completions_under_the_prefix() {
    let prefix = tempfile::tempdir().unwrap();
    let p = prefix.path();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let from = tests::bin("ctx").parent().unwrap().to_path_buf();
    let o = Command::new("make")
        .current_dir(root)
        .args(["-s", "install-files"])
        .arg(format!("PREFIX={}", p.display()))
        .arg(format!("FROM={}", from.display()))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", tests::shown(&o));
    for f in [
        "bin/ctx",
        "bin/tsh",
        "bin/ctxterm",
        "share/man/man1/ctx.1",
        "share/man/man1/ctx-agent-start.1",
        "share/bash-completion/completions/ctx",
        "share/zsh/site-functions/_ctx",
        "share/fish/vendor_completions.d/ctx.fish",
    ] {
        assert!(p.join(f).is_file(), "{f} installed");
    }
    for page in ["ctx", "ctx-agent-start"] {
        let o = Command::new("man")
            .env("MANPATH", p.join("share/man"))
            .args(["-P", "cat", page])
            .output()
            .unwrap();
        assert!(
            o.status.success() && text(&o.stdout).contains(&format!("{page}(1)")),
            "{}",
            tests::shown(&o)
        );
    }
    let help = run("ctx", &["--help"]);
    assert!(text(&help.stdout).contains("completions"), "listed in --help");
    // bash, with the installed script: a command, then an agent the daemon serves.
    let s = tests::served::Served::start();
    let st = s.storage.to_str().unwrap();
    assert!(run("ctx", &["agent", "new", "complme", "--source", st]).status.success());
    let complete = |words: &str, cword: usize, cur: &str| {
        let script = format!(
            "source {}; COMP_WORDS=({words}); COMP_CWORD={cword}; _clap_complete_ctx ctx {cur} x; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            p.join("share/bash-completion/completions/ctx").display()
        );
        let path = format!("{}:{}", p.join("bin").display(), std::env::var("PATH").unwrap_or_default());
        let o = Command::new("bash")
            .args(["-c", &script])
            .env("PATH", path)
            .env("CTX_MOUNT", &s.mnt)
            .output()
            .unwrap();
        text(&o.stdout)
    };
    assert!(complete("ctx agent sta", 2, "sta").lines().any(|l| l.trim() == "start"));
    let t = std::time::Instant::now();
    loop {
        if complete("ctx agent start comp", 3, "comp").lines().any(|l| l.trim() == "complme") {
            break;
        }
        assert!(t.elapsed() < std::time::Duration::from_secs(10), "the agent is completed");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // A session of it, as the daemon serves it.
    let uid = fs::read_to_string(s.storage.join("agent/complme.d/uid")).unwrap();
    fs::create_dir_all(s.storage.join(format!("home/{}/agent/complme/session/sess-done", uid.trim())))
        .unwrap();
    let t = std::time::Instant::now();
    while !complete("ctx agent history complme --session sess", 5, "sess")
        .lines()
        .any(|l| l.trim() == "sess-done")
    {
        assert!(t.elapsed() < std::time::Duration::from_secs(10), "the session is completed");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Every `ctx` command line in the README's and the docs' shell blocks parses as written: its
/// subcommands, flags and values are ctx's (run with `--help` before any `--`, which stops
/// before doing anything). A block that names a flag or command ctx no longer has fails here.
#[test]
fn every_ctx_command_line_in_the_readme_and_docs_parses() {
    const EXTRACT: &str = r##"
import json, re, shlex, sys
out = []
for path in sys.argv[1:]:
    block = False
    pending = ""
    for n, line in enumerate(open(path, encoding="utf-8"), 1):
        if line.strip().startswith("```"):
            block = line.strip() in ("```sh", "```bash", "```console") if not block else False
            continue
        if not block:
            continue
        line = pending + line.rstrip("\n")
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        text = line.strip()
        if text.startswith("$ "):
            text = text[2:]
        for part in re.split(r"\|\||&&|;", text):
            part = part.strip()
            if not part.startswith("ctx "):
                continue
            lex = shlex.shlex(part, posix=True, punctuation_chars="|&<>")
            lex.whitespace_split = True
            lex.commenters = "#"
            words = []
            try:
                for w in lex:
                    if w and set(w) <= set("|&<>"):
                        break
                    words.append(w)
            except ValueError:
                continue
            out.append({"file": path, "line": n, "argv": words[1:]})
print(json.dumps(out))
"##;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut files = vec![root.join("README.md")];
    for dir in ["docs", "docs/spec"] {
        for e in fs::read_dir(root.join(dir)).unwrap().flatten() {
            if e.path().extension().is_some_and(|x| x == "md") {
                files.push(e.path());
            }
        }
    }
    let o = Command::new("python3").args(["-c", EXTRACT]).args(&files).output().unwrap();
    assert!(o.status.success(), "{}", tests::shown(&o));
    let lines: Vec<serde_json::Value> = serde_json::from_slice(&o.stdout).unwrap();
    assert!(lines.len() > 40, "the README and docs show ctx: {}", lines.len());
    let mut bad = Vec::new();
    for l in &lines {
        let argv: Vec<String> =
            l["argv"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_owned()).collect();
        // `ctx tool NAME ARGS...` hands everything after it to the tool.
        let cut = if argv.first().is_some_and(|a| a == "tool") {
            1
        } else {
            argv.iter().position(|a| a == "--").unwrap_or(argv.len())
        };
        let mut args: Vec<&str> = argv[..cut].iter().map(String::as_str).collect();
        args.push("--help");
        let out = run("ctx", &args);
        if out.status.code() != Some(0) {
            bad.push(format!(
                "{}:{}: ctx {}: {}",
                l["file"],
                l["line"],
                argv.join(" "),
                text(&out.stderr).trim()
            ));
        }
    }
    assert!(bad.is_empty(), "{} lines do not parse:\n{}", bad.len(), bad.join("\n"));
}

/// `ctx man` printed raw Markdown with no pager: on a terminal it pages through `$PAGER` (a
/// shell command, as git and man run it); into a pipe it prints.
#[test]
fn ctx_man_pages_through_the_pager_on_a_terminal() {
    let said = tests::pty::run(
        tests::bin("ctx").to_str().unwrap(),
        &["man", "policy", "--builtin"],
        &[("PAGER", "sed 's/^/PAGED: /'")],
        None,
    );
    assert!(said.lines().take(3).all(|l| l.starts_with("PAGED: ")), "{said}");
    let piped = run("ctx", &["man", "policy", "--builtin"]);
    assert!(!text(&piped.stdout).contains("PAGED"), "a pipe gets the text itself");
}
