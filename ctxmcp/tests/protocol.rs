#![allow(clippy::unwrap_used)] // tests fail loudly by design
//! ctxmcp against a scripted MCP server (tests/scripted_server.py): version negotiation,
//! batching, pagination, timeouts with cancellation, a dead or garbled server, shutdown, and
//! the installed tool served from its locator.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::{Value, json};

const PYTHON: &str = "/usr/bin/python3";

struct Scripted {
    dir: tempfile::TempDir,
}

impl Scripted {
    fn new() -> Scripted {
        assert!(
            Path::new(PYTHON).exists(),
            "{PYTHON} is needed by the scripted server (scripts/debian-packages)"
        );
        Scripted { dir: tempfile::tempdir().unwrap() }
    }

    fn record(&self) -> PathBuf {
        self.dir.path().join("record.jsonl")
    }

    /// Writes a config whose server `s` runs the script with `opts`; returns its path.
    fn config(&self, opts: &[&str]) -> PathBuf {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/scripted_server.py");
        let mut args = vec![script.to_owned(), "--record".into(), self.record().display().to_string()];
        args.extend(opts.iter().map(|s| (*s).to_owned()));
        let cfg = json!({"mcpServers": {"s": {"command": PYTHON, "args": args, "env": {"TOKEN": "hunter2-secret"}}}});
        let p = self.dir.path().join("mcp.json");
        fs::write(&p, cfg.to_string()).unwrap();
        let _ = fs::remove_file(self.record());
        p
    }

    fn ctxmcp(&self, opts: &[&str], args: &[&str]) -> Output {
        let cfg = self.config(opts);
        let (cmd, rest) = args.split_first().unwrap();
        Command::new(env!("CARGO_BIN_EXE_ctxmcp"))
            .arg(cmd)
            .arg("--config")
            .arg(&cfg)
            .args(["--server", "s"])
            .args(rest)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// Every line the server received.
    fn received(&self) -> Vec<Value> {
        let t = fs::read_to_string(self.record()).unwrap_or_default();
        t.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout {}\nstderr {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn never_a_batch(s: &Scripted) {
    for m in s.received() {
        assert!(m.is_object(), "the client sent a batch: {m}");
    }
}

#[test]
fn each_accepted_version_works_and_the_client_speaks_first_2025_11_25() {
    let s = Scripted::new();
    for v in ["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"] {
        let out = s.ctxmcp(&["--version", v], &["list"]);
        assert!(out.status.success(), "{v}: {}", text(&out));
        assert!(stdout(&out).contains("s.echo\tTool echo.\n"), "{v}: {}", text(&out));
        let got = s.received();
        assert_eq!(got[0]["method"], "initialize");
        assert_eq!(got[0]["params"]["protocolVersion"], "2025-11-25");
        assert_eq!(got[1], json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        assert_eq!(got[2]["method"], "tools/list");
        never_a_batch(&s);

        let out = s.ctxmcp(&["--version", v], &["call", "echo", r#"{"x":"y"}"#]);
        assert!(out.status.success(), "{v}: {}", text(&out));
        assert_eq!(stdout(&out), "{\"x\": \"y\"}\n");
        never_a_batch(&s);
    }
}

#[test]
fn draft_unknown_future_and_missing_versions_are_refused() {
    let s = Scripted::new();
    for (v, why) in [
        ("2099-01-01", "protocol version \"2099-01-01\""),
        ("DRAFT-2026-v1", "protocol version \"DRAFT-2026-v1\""),
        ("2024-10-07", "protocol version \"2024-10-07\""),
        ("none", "names no protocolVersion"),
    ] {
        let out = s.ctxmcp(&["--version", v], &["list"]);
        assert_eq!(out.status.code(), Some(69), "{v}: {}", text(&out));
        let e = stderr(&out);
        assert!(e.contains(why), "{v}: {e}");
        let methods: Vec<Value> = s.received().iter().map(|m| m["method"].clone()).collect();
        assert_eq!(methods, [json!("initialize")], "{v}: nothing after a refused version");
    }
}

#[test]
fn batches_are_accepted_only_under_2025_03_26_and_never_sent() {
    let s = Scripted::new();
    let out = s.ctxmcp(&["--version", "2025-03-26", "--batch", "--ping"], &["call", "echo", r#"{"a":1}"#]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(stdout(&out), "{\"a\": 1}\n");
    never_a_batch(&s);
    for v in ["2025-11-25", "2025-06-18", "2024-11-05"] {
        let out = s.ctxmcp(&["--version", v, "--batch"], &["list"]);
        assert_eq!(out.status.code(), Some(69), "{v}: {}", text(&out));
        assert!(
            stderr(&out).contains(&format!("batch, which protocol version {v} does not allow")),
            "{}",
            text(&out)
        );
        never_a_batch(&s);
    }
}

#[test]
fn tools_list_follows_next_cursor() {
    let s = Scripted::new();
    let out = s.ctxmcp(&["--tools", "25", "--page", "10"], &["list"]);
    assert!(out.status.success(), "{}", text(&out));
    let lines: Vec<String> = stdout(&out).lines().map(str::to_owned).collect();
    assert_eq!(lines.len(), 28, "25 + echo, fail, structured: {}", text(&out));
    assert_eq!(lines[0], "s.t0\tTool t0.");
    assert_eq!(lines[24], "s.t24\tTool t24.");
    assert!(stderr(&out).contains("tool \"has space\" cannot be projected"), "{}", text(&out));
    let cursors: Vec<Value> = s
        .received()
        .iter()
        .filter(|m| m["method"] == "tools/list")
        .map(|m| m["params"]["cursor"].clone())
        .collect();
    assert_eq!(cursors, [Value::Null, json!("10"), json!("20")]);

    let out = s.ctxmcp(&["--tools", "3", "--page", "2"], &["list", "--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 6);
    assert_eq!(
        v[0],
        json!({"name": "s.t0", "tool": "t0", "description": "Tool t0.\nSecond line.",
        "schema": {"type": "object", "properties": {"x": {"type": "string"}}}})
    );
}

#[test]
fn a_timed_out_call_is_cancelled() {
    let s = Scripted::new();
    let out = s.ctxmcp(&["--hang"], &["call", "--timeout", "0.5", "echo"]);
    assert_eq!(out.status.code(), Some(69), "{}", text(&out));
    // The timeout's own words, and the cancellation the server received, say it ran out.
    assert!(stderr(&out).contains("tools/call: no answer after 0.5 s (request cancelled)"), "{}", text(&out));
    let got = s.received();
    let call = got.iter().find(|m| m["method"] == "tools/call").unwrap();
    let cancel = got.iter().find(|m| m["method"] == "notifications/cancelled").unwrap();
    assert_eq!(cancel["params"]["requestId"], call["id"]);
    assert!(cancel.get("id").is_none(), "a notification");
}

#[test]
fn a_dead_or_garbled_server_is_a_clear_error_and_its_stderr_passes_through() {
    let s = Scripted::new();
    let out = s.ctxmcp(&["--die"], &["list"]);
    assert_eq!(out.status.code(), Some(69), "{}", text(&out));
    assert!(
        stderr(&out).contains("initialize: the server exited (exit status: 3) before answering"),
        "{}",
        text(&out)
    );
    assert!(stderr(&out).contains("scripted server: started"), "server stderr passes through");

    let out = s.ctxmcp(&["--garbage"], &["list"]);
    assert_eq!(out.status.code(), Some(69), "{}", text(&out));
    assert!(stderr(&out).contains("not JSON-RPC (invalid JSON"), "{}", text(&out));
    assert!(stderr(&out).contains("\"Server ready!\""), "{}", text(&out));

    let cfg = s.dir.path().join("missing.json");
    fs::write(&cfg, r#"{"mcpServers":{"s":{"command":"/nonexistent/server"}}}"#).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ctxmcp"))
        .args(["list", "--server", "s", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(69), "{}", text(&out));
    assert!(stderr(&out).contains("cannot start \"/nonexistent/server\""), "{}", text(&out));

    let out = Command::new(env!("CARGO_BIN_EXE_ctxmcp"))
        .args(["list", "--server", "other", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
}

#[test]
fn results_errors_and_structured_content() {
    let s = Scripted::new();
    let out = s.ctxmcp(&[], &["call", "fail"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(stderr(&out).contains("ctxmcp: fail: it failed on purpose"), "{}", text(&out));
    let out = s.ctxmcp(&[], &["call", "--structured", "structured", r#"{"k":[1]}"#]);
    assert_eq!(stdout(&out), "{\"got\":{\"k\":[1]}}\n", "{}", text(&out));
    let out = s.ctxmcp(&[], &["call", "echo", "not-json"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let out = s.ctxmcp(&[], &["call", "nope"]);
    assert!(out.status.success(), "the scripted server echoes any tool: {}", text(&out));
}

#[test]
fn a_stubborn_server_is_killed() {
    let s = Scripted::new();
    let pidfile = s.dir.path().join("pid");
    let out = s.ctxmcp(&["--stubborn", "--pidfile", pidfile.to_str().unwrap()], &["list"]);
    assert!(out.status.success(), "{}", text(&out));
    let pid = fs::read_to_string(&pidfile).unwrap();
    assert!(!Path::new(&format!("/proc/{pid}")).exists(), "server {pid} is gone");
}

#[test]
fn projected_candidates_serve_their_tool_from_the_locator() {
    let s = Scripted::new();
    let out_dir = s.dir.path().join("out");
    let cfg = s.config(&[]);
    let out = Command::new(env!("CARGO_BIN_EXE_ctxmcp"))
        .args(["project", "--server", "s", "--config"])
        .arg(&cfg)
        .arg("--runtime-config")
        .arg(&cfg)
        .arg("--out")
        .arg(&out_dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(stdout(&out).lines().count(), 3, "{}", text(&out));
    assert!(stderr(&out).contains("skipping tool \"has space\""), "{}", text(&out));
    for entry in walk(&out_dir) {
        let bytes = fs::read(&entry).unwrap();
        assert!(!bytes.windows(14).any(|w| w == b"hunter2-secret"), "{} holds a secret", entry.display());
    }
    let m: Value = serde_json::from_slice(&fs::read(out_dir.join("s.echo/manifest.json")).unwrap()).unwrap();
    assert_eq!(
        (&m["schema"], &m["class"], &m["name"]),
        (&json!("cortexfs.object/v2"), &json!("tool"), &json!("s.echo"))
    );

    // The copy, run under the tool's name as tsh runs it.
    let root = s.dir.path().join("root");
    fs::create_dir_all(root.join("tool/s.echo.d")).unwrap();
    fs::copy(out_dir.join("s.echo/d/mcp"), root.join("tool/s.echo.d/mcp")).unwrap();
    let serve = |mode: &str, input: Option<&str>| {
        use std::os::unix::process::CommandExt;
        let mut c = Command::new(out_dir.join("s.echo/exe"));
        c.arg0("s.echo")
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("CTX_ROOT", &root)
            .env("CTX_AUTHORIZED_OBJECT", "tool/s.echo")
            .env("CTX_TOOL_MODE", mode)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().unwrap();
        if let Some(i) = input {
            std::io::Write::write_all(&mut child.stdin.take().unwrap(), i.as_bytes()).unwrap();
        }
        drop(child.stdin.take());
        child.wait_with_output().unwrap()
    };
    let out = serve("cli", Some(r#"{"x":"from stdin"}"#));
    assert_eq!(stdout(&out), "{\"x\": \"from stdin\"}\n", "{}", text(&out));
    let out = serve("cli", None);
    assert_eq!(stdout(&out), "{}\n", "no input is {{}}: {}", text(&out));
    let out = serve("cli", Some("[1]"));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let out = Command::new(out_dir.join("s.echo/exe")).env_remove("CTX_AUTHORIZED_OBJECT").output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(stderr(&out).contains("run the tool through tsh"), "{}", text(&out));
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() { out.extend(walk(&p)) } else { out.push(p) }
    }
    out
}
