//! ctxmcp against real MCP servers installed from npm (scripts/install-test-tools):
//! `@modelcontextprotocol/server-filesystem` listed, projected, installed with `ctx object
//! install` and called through tsh in an agent view; `@modelcontextprotocol/server-everything`
//! for structured content, tool errors, timeouts and the server's environment.

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::{Value, json};
use tests::served::Served;

const NODE: &str = "/usr/bin/node";
const FILESYSTEM: &str = "/usr/lib/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js";
const EVERYTHING: &str = "/usr/lib/node_modules/@modelcontextprotocol/server-everything/dist/index.js";

fn need(script: &str) {
    assert!(
        Path::new(NODE).exists() && Path::new(script).exists(),
        "{script} is missing: run scripts/install-test-tools (make test does)"
    );
}

fn text(o: &Output) -> String {
    tests::shown(o)
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn ctx(args: &[&str]) -> Output {
    Command::new(tests::bin("ctx")).args(args).output().unwrap()
}

fn ctxmcp(args: &[&str]) -> Output {
    Command::new(tests::bin("ctxmcp")).args(args).stdin(Stdio::null()).output().unwrap()
}

/// A config with the filesystem server (serving `root`) as `fs` and the everything server as
/// `every`; the everything server gets a secret in its env.
fn config(dir: &Path, root: &Path) -> PathBuf {
    let cfg = json!({"mcpServers": {
        "fs": {"command": NODE, "args": [FILESYSTEM, root]},
        "every": {"command": NODE, "args": [EVERYTHING], "env": {"EVERY_TOKEN": "tok-do-not-copy"}},
    }});
    let p = dir.join("mcp.json");
    fs::write(&p, serde_json::to_vec_pretty(&cfg).unwrap()).unwrap();
    p
}

#[test]
fn filesystem_tools_are_projected_installed_and_called_through_tsh() {
    need(FILESYSTEM);
    let s = Served::start();
    let st = s.storage.clone();
    let out = ctx(&["bootstrap", st.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let work = s.dir.path().join("work");
    fs::create_dir_all(work.join("sub")).unwrap();
    fs::write(work.join("f.txt"), "hello from mcp\n").unwrap();
    let cfg = config(s.dir.path(), &work);
    let cfg_s = cfg.to_str().unwrap();

    let out = ctxmcp(&["list", "--config", cfg_s, "--server", "fs"]);
    assert!(out.status.success(), "{}", text(&out));
    for t in ["fs.read_text_file\t", "fs.list_directory\t"] {
        assert!(stdout(&out).lines().any(|l| l.starts_with(t)), "{t}: {}", text(&out));
    }

    let cand = s.dir.path().join("candidates");
    let out = ctxmcp(&[
        "project",
        "--config",
        cfg_s,
        "--server",
        "fs",
        "--runtime-config",
        cfg_s,
        "--out",
        cand.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let manifests: Vec<String> = stdout(&out).lines().map(str::to_owned).collect();
    assert!(manifests.len() >= 2, "{}", text(&out));
    for m in &manifests {
        let out = ctx(&["object", "install", "--source", st.to_str().unwrap(), m]);
        assert!(out.status.success(), "{m}: {}", text(&out));
    }
    let tools = ["fs.read_text_file", "fs.list_directory"];
    for t in tools {
        assert_eq!(
            fs::read(st.join(format!("tool/{t}.d/policy"))).unwrap(),
            b"",
            "{t}: installed, not granted"
        );
        let loc = fs::read(st.join(format!("tool/{t}.d/mcp"))).unwrap();
        assert_eq!(policy::controls::parse_mcp_locator(&loc).unwrap().config, cfg_s);
    }

    // An agent whose policy grants both tools; the tools' own policies do not yet.
    fs::create_dir_all(st.join("agent/coder.d")).unwrap();
    fs::write(st.join("agent/coder"), "#!/bin/sh\nexit 0\n").unwrap();
    fs::set_permissions(st.join("agent/coder"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(st.join("agent/coder.d/label"), "coder_t\n").unwrap();
    fs::write(st.join("agent/coder.d/uid"), "0\n").unwrap();
    let grants: String = tools.iter().map(|t| format!("allow coder_t tool:{t} execute\n")).collect();
    fs::write(st.join("agent/coder.d/policy"), grants).unwrap();
    let view = s.dir.path().join("view");
    s.view_in("coder", "s1", &view, Some(&work));
    let tsh = |args: &[&str], stdin: Option<&str>| {
        let mut c = Command::new(tests::bin("tsh"));
        c.args(args)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("CTX_ROOT", &view)
            .env("CTX_PATH", view.join("tool"))
            .env("CTX_WORKSPACE", &work)
            .current_dir(&work)
            .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().unwrap();
        if let Some(input) = stdin {
            // tsh may refuse (and exit) before it reads its input.
            let _ = child.stdin.take().unwrap().write_all(input.as_bytes());
        }
        child.wait_with_output().unwrap()
    };
    let read = json!({"path": work.join("f.txt")}).to_string();
    let out = tsh(&["fs.read_text_file", &read], None);
    assert_eq!(out.status.code(), Some(13), "installing granted nothing: {}", text(&out));

    for t in tools {
        fs::write(st.join(format!("tool/{t}.d/policy")), format!("allow coder_t tool:{t} execute\n"))
            .unwrap();
    }
    // Written behind the daemon's back: the view shows it once the daemon's watch has seen it.
    let t0 = std::time::Instant::now();
    while !tools.iter().all(|t| {
        fs::read_to_string(view.join(format!("tool/{t}.d/policy"))).is_ok_and(|p| p.contains("allow coder_t"))
    }) {
        assert!(t0.elapsed() < std::time::Duration::from_secs(10), "the view shows the new policies");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = tsh(&["fs.read_text_file", &read], None);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(stdout(&out), "hello from mcp\n");
    let out = tsh(&["fs.list_directory"], Some(&json!({"path": work}).to_string()));
    assert!(out.status.success(), "{}", text(&out));
    let listing = stdout(&out);
    assert!(
        listing.lines().any(|l| l == "[FILE] f.txt") && listing.lines().any(|l| l == "[DIR] sub"),
        "{listing}"
    );

    // Native mode: structured content as one JSON line, in stdout frames.
    let out = tsh(&["--json", "fs.read_text_file"], Some(&read));
    assert!(out.status.success(), "{}", text(&out));
    let data: String = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|f| f["type"] == "stdout")
        .map(|f| f["data"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(serde_json::from_str::<Value>(&data).unwrap(), json!({"content": "hello from mcp\n"}));

    // The server refuses a path outside its root: the tool's error, exit 1, on stderr.
    let out = tsh(&["fs.read_text_file", r#"{"path":"/etc/hostname"}"#], None);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("ctxmcp: fs.read_text_file: "), "{}", text(&out));

    // Every call is an ordinary tool call in the session's events.
    let events = fs::read_to_string(st.join("home/0/agent/coder/session/s1/events.jsonl")).unwrap();
    let ev: Vec<Value> = events.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let summary: Vec<(&str, &str)> =
        ev.iter().map(|e| (e["object"].as_str().unwrap(), e["status"].as_str().unwrap())).collect();
    assert_eq!(summary[0], ("tool/fs.read_text_file", "denied"));
    assert_eq!(summary[1], ("tool/fs.read_text_file", "ok"));
    assert_eq!(summary[2], ("tool/fs.list_directory", "ok"));
}

#[test]
fn everything_server_structured_content_errors_timeouts_and_environment() {
    need(EVERYTHING);
    let d = tempfile::tempdir().unwrap();
    let cfg = config(d.path(), d.path());
    let cfg = cfg.to_str().unwrap();
    let call = |args: &[&str]| {
        let mut a = vec!["call", "--config", cfg, "--server", "every"];
        a.extend(args);
        ctxmcp(&a)
    };

    let out = ctxmcp(&["list", "--json", "--config", cfg, "--server", "every"]);
    assert!(out.status.success(), "{}", text(&out));
    let listed: Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<&str> = listed.as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    for t in ["every.echo", "every.get-structured-content", "every.get-sum", "every.get-env"] {
        assert!(names.contains(&t), "{t} in {names:?}");
    }

    let out = call(&["--structured", "get-structured-content", r#"{"location":"New York"}"#]);
    assert!(out.status.success(), "{}", text(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["temperature"].is_number() && v["conditions"].is_string(), "{v}");
    assert_eq!(stdout(&out).lines().count(), 1);

    let out = call(&["get-sum", r#"{"a":2,"b":40}"#]);
    assert_eq!(stdout(&out), "The sum of 2 and 40 is 42.\n", "{}", text(&out));

    let out = call(&["echo"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("ctxmcp: echo: "), "{}", text(&out));
    let out = call(&["no-such-tool"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not found"), "{}", text(&out));

    let out = call(&["--timeout", "1", "trigger-long-running-operation", r#"{"duration":30,"steps":3}"#]);
    assert_eq!(out.status.code(), Some(69), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("request cancelled"), "{}", text(&out));

    // The server sees the config's env and a few safe variables, not ours.
    let out = Command::new(tests::bin("ctxmcp"))
        .args(["call", "--config", cfg, "--server", "every", "get-env"])
        .env("CTXMCP_TEST_LEAK", "ours")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let env: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(env["EVERY_TOKEN"], "tok-do-not-copy");
    assert!(env.get("CTXMCP_TEST_LEAK").is_none(), "{env}");
}
