//! tsh through a real mount and a real agent view: resolution, the agent terminal context, both
//! policies, hooks, the durable `tool.call` records, native mode, `ctx bootstrap` and `ctx tool`.

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use tests::served::Served;

fn ctx(args: &[&str]) -> Output {
    Command::new(tests::bin("ctx")).args(args).output().unwrap()
}

fn script(path: &Path, body: &str, mode: u32) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, format!("#!/bin/sh\n{body}\n")).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

fn text(o: &Output) -> String {
    tests::shown(o)
}

struct World {
    s: Served,
    view: PathBuf,
    work: PathBuf,
    host_bin: PathBuf,
}

impl World {
    fn new() -> World {
        let s = Served::start();
        let st = s.storage.clone();
        let out = ctx(&["bootstrap", st.to_str().unwrap()]);
        assert!(out.status.success(), "{}", text(&out));
        // Operators grant tools in each tool's own policy.
        for t in ["fs.stat", "fs.read", "fs.write"] {
            fs::write(st.join(format!("tool/{t}.d/policy")), format!("allow coder_t tool:{t} execute\n"))
                .unwrap();
        }
        // fs.list: the agent's policy grants it, the tool's own policy (empty) does not.
        fs::create_dir_all(st.join("agent/coder.d")).unwrap();
        script(&st.join("agent/coder"), "exit 0", 0o755);
        fs::write(st.join("agent/coder.d/label"), "coder_t\n").unwrap();
        fs::write(st.join("agent/coder.d/uid"), "0\n").unwrap();
        let grants: String = ["fs.stat", "fs.read", "fs.list", "order", "envdump", "onlyhost"]
            .iter()
            .map(|t| format!("allow coder_t tool:{t} execute\n"))
            .collect();
        fs::write(st.join("agent/coder.d/policy"), grants).unwrap();
        // Three personal tool directories for resolution order.
        let home = st.join("home/0");
        fs::create_dir_all(home.join("tool-a")).unwrap();
        fs::write(home.join("tool-a/order"), "#!/bin/sh\necho A\n").unwrap(); // not executable
        for (d, out) in [("tool-b", "B"), ("tool-c", "C")] {
            script(&home.join(d).join("order"), &format!("echo {out}"), 0o755);
            fs::create_dir_all(home.join(d).join("order.d")).unwrap();
            fs::write(home.join(d).join("order.d/policy"), "allow coder_t tool:order execute\n").unwrap();
        }
        script(&home.join("tool-b/envdump"), "env", 0o755);
        fs::create_dir_all(home.join("tool-b/envdump.d")).unwrap();
        fs::write(home.join("tool-b/envdump.d/policy"), "allow coder_t tool:envdump execute\n").unwrap();
        // A host binary of a granted name, on the host PATH only.
        let host_bin = s.dir.path().join("hostbin");
        let marker = s.dir.path().join("host-ran");
        script(&host_bin.join("onlyhost"), &format!("touch {}", marker.display()), 0o755);
        let work = s.dir.path().join("work");
        fs::create_dir_all(&work).unwrap();
        fs::write(work.join("f.txt"), "hello\n").unwrap();
        let view = s.dir.path().join("view");
        s.view_in("coder", "s1", &view, Some(&work));
        World { s, view, work, host_bin }
    }

    /// tsh in the agent's terminal: the view is its /ctx.
    fn agent(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let v = self.view.display();
        let path = format!("{v}/tool:{v}/home/0/tool-a:{v}/home/0/tool-b:{v}/home/0/tool-c");
        self.tsh(&self.view, Some(&path), args, stdin)
    }

    fn tsh(&self, root: &Path, ctx_path: Option<&str>, args: &[&str], stdin: Option<&str>) -> Output {
        let mut c = Command::new(tests::bin("tsh"));
        c.args(args)
            .env_clear()
            .env("PATH", format!("{}:/usr/bin:/bin", self.host_bin.display()))
            .env("CTX_ROOT", root)
            .env("CTX_WORKSPACE", &self.work)
            .env("SECRET_TOKEN", "do-not-pass")
            .current_dir(&self.work)
            .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(p) = ctx_path {
            c.env("CTX_PATH", p);
        }
        let mut child = c.spawn().unwrap();
        if let Some(input) = stdin {
            // tsh may refuse (and exit) before it reads its input.
            let _ = child.stdin.take().unwrap().write_all(input.as_bytes());
        }
        child.wait_with_output().unwrap()
    }

    fn events(&self) -> Vec<serde_json::Value> {
        let p = self.s.storage.join("home/0/agent/coder/session/s1/events.jsonl");
        lines(&p)
    }
}

fn lines(p: &Path) -> Vec<serde_json::Value> {
    let t = fs::read_to_string(p).unwrap_or_default();
    t.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// Every byte of the log at `p` is covered by its commit evidence: acknowledged and durable.
fn committed(p: &Path) {
    let (mark, torn) = ringfs::log::verify(p).unwrap();
    assert_eq!((mark.end, torn), (fs::metadata(p).unwrap().len(), 0), "{} fully committed", p.display());
}

#[test]
fn tsh_runs_tools_only_as_an_agent_and_records_every_call() {
    let w = World::new();
    let st = w.s.storage.clone();

    // A person at the host mount may list and describe, not run (69).
    let host = w.tsh(&w.s.mnt, None, &["tools"], None);
    assert!(host.status.success(), "{}", text(&host));
    let listed = String::from_utf8_lossy(&host.stdout).into_owned();
    for t in ["fs.list", "fs.read", "fs.stat", "fs.write", "shell.exec", "tsh", "tsh.config"] {
        assert!(listed.lines().any(|l| l == t), "{t} in {listed}");
    }
    let json = w.tsh(&w.s.mnt, None, &["tools", "--json"], None);
    assert!(json.status.success(), "{}", text(&json));
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let names: Vec<&str> = v.as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, listed.lines().collect::<Vec<_>>(), "--json lists what tools lists");
    assert!(v[0]["path"].as_str().is_some_and(|p| p.starts_with('/')), "{v}");
    let bad = w.tsh(&w.s.mnt, None, &["tools", "--nosuch"], None);
    assert_eq!(bad.status.code(), Some(2), "{}", text(&bad));
    let out = w.tsh(&w.s.mnt, None, &["describe", "fs.stat"], None);
    assert!(String::from_utf8_lossy(&out.stdout).contains("\"path\""), "{}", text(&out));
    let out = w.tsh(&w.s.mnt, None, &["fs.stat", "f.txt"], None);
    assert_eq!(out.status.code(), Some(69), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("needs an agent terminal"), "{}", text(&out));

    // In the agent's view: runs, prints, and records the call durably.
    let out = w.agent(&["fs.stat", "f.txt"], None);
    assert!(out.status.success(), "{}", text(&out));
    let stat: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(stat["size"], 6);
    let ev = w.events();
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!(
        (
            &ev[0]["type"],
            &ev[0]["agent"],
            &ev[0]["session"],
            &ev[0]["object"],
            &ev[0]["status"],
            &ev[0]["exit"]
        ),
        (&"tool.call".into(), &"coder".into(), &"s1".into(), &"tool/fs.stat".into(), &"ok".into(), &0.into())
    );
    assert!(ev[0]["ts"].as_str().unwrap().ends_with('Z') && ev[0]["duration_ms"].is_number());
    assert!(ev[0].get("args").is_none(), "arguments are not logged");
    let log = st.join("tool/fs.stat.d/log");
    assert_eq!(lines(&log), ev);
    committed(&log);
    committed(&st.join("home/0/agent/coder/session/s1/events.jsonl"));

    // The agent's policy refuses alone: fs.write is granted by its own policy only.
    let out = w.agent(&["fs.write", "g.txt"], Some("x"));
    assert_eq!(out.status.code(), Some(13), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("refused by the agent policy"), "{}", text(&out));
    assert!(!w.work.join("g.txt").exists());
    // The tool's own policy refuses alone: fs.list is granted by the agent's policy only.
    let out = w.agent(&["fs.list"], None);
    assert_eq!(out.status.code(), Some(13), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("refused by the tool's own policy"),
        "{}",
        text(&out)
    );
    let ev = w.events();
    assert_eq!(ev.len(), 3);
    assert_eq!((&ev[1]["object"], &ev[1]["status"]), (&"tool/fs.write".into(), &"denied".into()));
    assert_eq!((&ev[2]["object"], &ev[2]["status"]), (&"tool/fs.list".into(), &"denied".into()));
    assert!(ev[2]["reason"].as_str().unwrap().contains("own policy"));
    assert_eq!(lines(&st.join("tool/fs.list.d/log")).len(), 1, "the denial is in the tool's log too");
    // Each tool's status counts its calls live, from the daemon's memory (the file in storage
    // stays empty).
    let status = |t: &str| fs::read_to_string(w.s.mnt.join(format!("tool/{t}.d/status"))).unwrap();
    assert!(status("fs.stat").contains("calls 1\nerrors 0\ndenied 0\n"), "{}", status("fs.stat"));
    assert!(status("fs.stat").contains("last_status ok\nruns 1\n"), "{}", status("fs.stat"));
    assert!(status("fs.list").contains("calls 1\nerrors 0\ndenied 1\n"), "{}", status("fs.list"));
    assert!(status("fs.read").contains("calls 0\n"), "{}", status("fs.read"));
    assert_eq!(fs::read(st.join("tool/fs.stat.d/status")).unwrap(), b"");
    // A session record says its size, a token estimate and where it comes from, by name; none
    // of these is listed (a copy does not carry them).
    let events = w.s.mnt.join("home/0/agent/coder/session/s1/events.jsonl");
    let attr = |p: &Path, n: &str| {
        let mut v = vec![0u8; 256];
        let k = rustix::fs::getxattr(p, n, &mut v[..]).unwrap_or_else(|e| panic!("{n}: {e}"));
        String::from_utf8_lossy(&v[..k]).into_owned()
    };
    let len = fs::metadata(&events).unwrap().len();
    assert_eq!(attr(&events, "user.cortexfs.size"), len.to_string());
    assert_eq!(attr(&events, "user.cortexfs.tokens"), len.div_ceil(4).to_string());
    assert_eq!(attr(&events, "user.cortexfs.origin"), "session:coder/s1");
    assert_eq!(attr(&w.s.mnt.join("tool/fs.stat.d/log"), "user.cortexfs.origin"), "tool:fs.stat");
    let mut names = vec![0u8; 4096];
    let n = rustix::fs::listxattr(&events, &mut names[..]).unwrap();
    assert!(!String::from_utf8_lossy(&names[..n]).contains("cortexfs"), "{:?}", &names[..n]);

    // Resolution: left to right, a non-executable earlier file is skipped, the .d/ comes from
    // the hit's directory, and the host PATH is never used.
    let out = w.agent(&["order"], None);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "B\n", "{}", text(&out));
    let out = w.agent(&["which", "order"], None);
    assert!(
        String::from_utf8_lossy(&out.stdout).trim_end().ends_with("home/0/tool-b/order"),
        "{}",
        text(&out)
    );
    let out = w.agent(&["onlyhost"], None);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not found in CTX_PATH"), "{}", text(&out));
    assert!(!w.s.dir.path().join("host-ran").exists(), "the host PATH binary never ran");

    // The tool's environment: cleared, plus the documented variables.
    let out = w.agent(&["envdump"], None);
    let env = String::from_utf8_lossy(&out.stdout).into_owned();
    for want in [
        "CTX_TOOL_MODE=cli",
        "PATH=/usr/bin:/bin",
        "CTX_AGENT=coder",
        "CTX_SESSION=s1",
        "CTX_AUTHORIZED_OBJECT=home/0/tool-b/envdump",
    ] {
        assert!(env.lines().any(|l| l == want), "{want} in {env}");
    }
    assert!(!env.contains("SECRET_TOKEN"), "{env}");

    // Hooks: pre.d runs in name order and a failure blocks the call; post.d runs after.
    let hooks = st.join("tool/fs.read.d/hooks");
    let trace = w.s.dir.path().join("hook-trace");
    script(&hooks.join("pre.d/10-first"), &format!("echo pre10 >> {}", trace.display()), 0o755);
    script(
        &hooks.join("post.d/10-after"),
        &format!("echo post:$CTX_TOOL_EXIT >> {}", trace.display()),
        0o755,
    );
    let out = w.agent(&["fs.read", "f.txt"], None);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello\n", "{}", text(&out));
    assert_eq!(fs::read_to_string(&trace).unwrap(), "pre10\npost:0\n");
    script(&hooks.join("pre.d/20-deny"), &format!("echo pre20 >> {}; exit 3", trace.display()), 0o755);
    let out = w.agent(&["fs.read", "f.txt"], None);
    assert_eq!(out.status.code(), Some(13), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("blocked by hook pre.d/20-deny (exit 3)"),
        "{}",
        text(&out)
    );
    assert!(out.stdout.is_empty(), "the tool did not run");
    assert_eq!(fs::read_to_string(&trace).unwrap(), "pre10\npost:0\npre10\npre20\n");
    let last = w.events().pop().unwrap();
    assert_eq!((&last["object"], &last["status"]), (&"tool/fs.read".into(), &"denied".into()));

    // Native mode: JSON in, JSONL frames out.
    let out = w.agent(&["--json", "fs.stat"], Some(r#"{"path":"f.txt"}"#));
    assert!(out.status.success(), "{}", text(&out));
    let frames: Vec<serde_json::Value> =
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(frames.first().unwrap()["type"], "start");
    assert_eq!(frames.last().unwrap()["type"], "exit");
    assert_eq!(frames.last().unwrap()["status"], 0);
    assert!(
        frames.iter().any(|f| f["type"] == "stdout" && f["data"].as_str().unwrap().contains("\"size\":6"))
    );
    let out = w.agent(&["--json", "fs.stat"], Some("not json"));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));

    // A claimed identity that disagrees with the view is refused.
    let mut c = Command::new(tests::bin("tsh"));
    let out = c.args(["tools"]).env("CTX_ROOT", &w.view).env("CTX_AGENT", "root").output().unwrap();
    assert_eq!(out.status.code(), Some(69), "{}", text(&out));

    // Replacing the tool (a new version through the object store) keeps its log: the history
    // stays and the next call's record lands in the same file.
    let before = lines(&log).len();
    fs::write(st.join("tool/fs.stat.d/description"), "changed\n").unwrap();
    let out = ctx(&["bootstrap", st.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("replace tool/fs.stat"), "{}", text(&out));
    let out = w.agent(&["fs.stat", "f.txt"], None);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(lines(&log).len(), before + 1, "history kept, the new call recorded");
    committed(&log);
}

#[test]
fn tshrc_environment_and_default_order_for_people() {
    let w = World::new();
    let m = w.s.mnt.display().to_string();
    let which = |ctx_path: Option<&str>| {
        let out = w.tsh(&w.s.mnt, ctx_path, &["which", "order"], None);
        String::from_utf8_lossy(&out.stdout).trim_end().to_owned()
    };
    let env_path = format!("{m}/home/0/tool-b");
    assert_eq!(which(Some(&env_path)), format!("{m}/home/0/tool-b/order"), "environment");
    // Edited through the mount, as people do (the host's home is cached across opens; see
    // README, "What /ctx shows").
    let tshrc = w.s.mnt.join("home/0/.tshrc");
    fs::write(&tshrc, format!("# data, not shell\nCTX_PATH={m}/home/0/tool-c\n")).unwrap();
    assert_eq!(which(Some(&env_path)), format!("{m}/home/0/tool-c/order"), ".tshrc wins");
    fs::write(&tshrc, "export CTX_PATH=/x\n").unwrap();
    let out = w.tsh(&w.s.mnt, None, &["which", "order"], None);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    fs::remove_file(&tshrc).unwrap();
    let out = w.tsh(&w.s.mnt, None, &["which", "fs.stat"], None);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim_end(), format!("{m}/tool/fs.stat"), "default");
}

#[test]
fn ctx_tool_runs_only_safe_core_clis_and_bootstrap_is_idempotent() {
    let w = World::new();
    let st = w.s.storage.to_str().unwrap().to_owned();
    let run = |args: &[&str]| {
        Command::new(tests::bin("ctx"))
            .args(args)
            .env("CTX_ROOT", &w.s.mnt)
            .env_remove("CTX_PATH")
            .output()
            .unwrap()
    };
    for refused in ["fs.write", "shell.exec", "fs.read"] {
        let out = run(&["tool", refused, "x"]);
        assert_eq!(out.status.code(), Some(13), "{refused}: {}", text(&out));
    }
    let out = run(&["tool", "tsh.config", "cache_capacity=64", "window_percent=5"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(fs::read_to_string(w.s.storage.join("tool/tsh.d/config")).unwrap().contains("cache_capacity=64"));
    let before = fs::read(w.s.storage.join("tool/tsh.d/config")).unwrap();
    let out = run(&["tool", "tsh.config", "cache_capacity=0"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert_eq!(fs::read(w.s.storage.join("tool/tsh.d/config")).unwrap(), before, "unchanged");

    // A second bootstrap changes nothing and keeps the operator's grants and config.
    let out = ctx(&["bootstrap", "--check", &st]);
    assert!(out.status.success(), "{}", text(&out));
    let out = ctx(&["bootstrap", &st]);
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("up to date"), "{}", text(&out));
    // A changed control is put back; the grants stay.
    fs::write(w.s.storage.join("tool/fs.stat.d/description"), "tampered\n").unwrap();
    let out = ctx(&["bootstrap", "--check", &st]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("outdated tool/fs.stat (description)"),
        "{}",
        text(&out)
    );
    let out = ctx(&["bootstrap", "--dry-run", &st]);
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("replace tool/fs.stat"));
    assert_eq!(fs::read_to_string(w.s.storage.join("tool/fs.stat.d/description")).unwrap(), "tampered\n");
    let out = ctx(&["bootstrap", &st]);
    assert!(out.status.success(), "{}", text(&out));
    assert_ne!(fs::read_to_string(w.s.storage.join("tool/fs.stat.d/description")).unwrap(), "tampered\n");
    assert!(fs::read_to_string(w.s.storage.join("tool/fs.stat.d/policy")).unwrap().contains("coder_t"));
    assert!(fs::read_to_string(w.s.storage.join("tool/tsh.d/config")).unwrap().contains("cache_capacity=64"));
}

/// tsh's working set had no test end to end: `load` and `pin` keep tools across tsh processes
/// (the session's `tsh.json`), `max_loaded_tools` (from `tool/tsh.d/config`) unloads the least
/// used unpinned tool past it and says so, a pinned tool is never unloaded (nor unloadable until
/// unpinned), and `unpin` lets the trim take it again.
#[test]
fn load_pin_unpin_and_the_max_loaded_tools_trim_hold_across_tsh_processes() {
    let w = World::new();
    // tsh reads its configuration through the agent's view: granted tool:tsh, it sees it.
    let st = &w.s.storage;
    fs::write(st.join("tool/tsh.d/config"), "max_loaded_tools=2\n").unwrap();
    fs::write(st.join("tool/tsh.d/policy"), "allow coder_t tool:tsh execute\n").unwrap();
    let mut p = fs::read_to_string(st.join("agent/coder.d/policy")).unwrap();
    p.push_str("allow coder_t tool:tsh execute\n");
    fs::write(st.join("agent/coder.d/policy"), p).unwrap();
    let out = |o: &Output| String::from_utf8_lossy(&o.stdout).into_owned();
    // One tsh process: fs.stat used more than fs.read, so past the limit fs.read goes (never
    // the tool just loaded).
    let script = "fs.stat f.txt\nfs.stat f.txt\nload fs.stat\nload fs.read\nload order\nloads\n\
                  pin fs.read\nunload fs.read\npins\n";
    let o = w.agent(&[], Some(script));
    let said = out(&o);
    assert!(said.contains("unloaded fs.read (max_loaded_tools=2)"), "{}", text(&o));
    assert!(said.contains("fs.stat\norder\n"), "loads after the trim: {}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("fs.read is pinned; unpin it first"), "{}", text(&o));
    // Another process: the working set is the session's, pins marked.
    let o = w.agent(&["loads"], None);
    assert_eq!(out(&o), "fs.stat\norder\nfs.read*\n", "{}", text(&o));
    let state: serde_json::Value = serde_json::from_slice(
        &fs::read(w.s.storage.join("home/0/agent/coder/session/s1/tsh.json")).unwrap(),
    )
    .unwrap();
    assert!(state.to_string().contains("fs.read"), "{state}");
    // Past the limit again: an unpinned one goes, the pinned one stays.
    let o = w.agent(&["load", "envdump"], None);
    assert!(out(&o).contains("unloaded fs.stat (max_loaded_tools=2)"), "{}", text(&o));
    assert_eq!(out(&w.agent(&["pins"], None)), "fs.read\n");
    // Unpinned, it counts again: the oldest of the least used goes.
    let o = w.agent(&["unpin", "fs.read"], None);
    assert!(o.status.success() && out(&o).contains("unloaded order (max_loaded_tools=2)"), "{}", text(&o));
    assert_eq!(out(&w.agent(&["loads"], None)), "fs.read\nenvdump\n");
    assert_eq!(out(&w.agent(&["pins"], None)), "");
    let o = w.agent(&["unpin", "fs.read"], None);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
}

/// Tool arguments are recorded only when the agent's policy says so (`record:tool-args
/// write`); otherwise a call is recorded by its facts.
#[test]
fn tool_arguments_are_recorded_only_when_the_policy_says_so() {
    let w = World::new();
    let o = w.agent(&["fs.stat", "f.txt"], None);
    assert!(o.status.success(), "{}", text(&o));
    let last = w.events().pop().unwrap();
    assert!(last.get("args").is_none(), "facts only by default: {last}");
    let policy = w.s.storage.join("agent/coder.d/policy");
    let mut p = fs::read_to_string(&policy).unwrap();
    p.push_str("allow coder_t record:tool-args write\n");
    fs::write(&policy, p).unwrap();
    let o = w.agent(&["fs.stat", "f.txt"], None);
    assert!(o.status.success(), "{}", text(&o));
    let last = w.events().pop().unwrap();
    assert_eq!(last["args"], serde_json::json!(["f.txt"]), "{last}");
    let log = fs::read_to_string(w.s.storage.join("tool/fs.stat.d/log")).unwrap();
    assert!(log.lines().last().unwrap().contains("\"args\":[\"f.txt\"]"), "{log}");
}
