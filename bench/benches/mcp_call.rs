//! One MCP tool call end to end: a tool projected by ctxmcp and run through tsh in a real agent
//! view, against a minimal client calling the same MCP tool, in one run.
//!
//! Starts `ctx mount` on fresh storage under /var/tmp, projects the tools of
//! `@modelcontextprotocol/server-filesystem` with `ctxmcp project`, installs
//! `fs.read_text_file` with `ctx object install`, grants it to an agent and creates its view.
//! Then, interleaved round by round, it times (spawn to exit, the server's start included):
//!
//! - minimal client: spawn the server, `initialize`, `notifications/initialized`, `tools/call`,
//!   close stdin and wait (hand-written lines, no JSON library);
//! - ctxmcp call: `ctxmcp call ... read_text_file` from the native disk (negotiation checks,
//!   timeouts, shutdown; no tsh, no FUSE);
//! - tsh: `tsh fs.read_text_file {...}` (both policies, the run from the view, two durable
//!   records, the locator and config read, then the same call);
//!
//! and prints p50/p99 of each with the ratio to the minimal client. Needs root, /dev/fuse, the
//! release binaries (`make bench`) and the npm server (scripts/install-test-tools); prints
//! "not run" otherwise.

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

const ROUNDS: usize = 100;
const WARMUP: usize = 5;
const NODE: &str = "/usr/bin/node";
const SERVER: &str = "/usr/lib/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js";

/// A named way to make one call, returning its duration in microseconds, and its samples.
type Case<'a> = (&'static str, Box<dyn Fn() -> f64 + 'a>, Vec<f64>);

fn timed(cmd: &mut Command) -> f64 {
    let t = Instant::now();
    let out = cmd.stderr(Stdio::null()).output().expect("spawn");
    let e = t.elapsed().as_secs_f64() * 1e6;
    assert!(out.status.success(), "{cmd:?} failed: {}", out.status);
    assert_eq!(out.stdout, b"mcp\n", "{cmd:?}");
    e
}

/// Reads lines until one answers request `id`.
fn answer(r: &mut impl BufRead, id: u32) -> String {
    let want = format!("\"id\":{id}");
    let mut line = String::new();
    loop {
        line.clear();
        assert!(r.read_line(&mut line).expect("read") > 0, "the server closed its output");
        if line.contains(&want) {
            return line;
        }
    }
}

fn minimal(work: &Path, file: &Path) -> f64 {
    let t = Instant::now();
    let mut cmd = Command::new(NODE);
    // The environment ctxmcp gives a server: node's start depends on it (NODE_EXTRA_CA_CERTS
    // alone costs tens of milliseconds).
    cmd.env_clear();
    for k in ["HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER"] {
        if let Some(v) = std::env::var_os(k) {
            cmd.env(k, v);
        }
    }
    let mut child = cmd
        .arg(SERVER)
        .arg(work)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the server");
    let mut stdin = child.stdin.take().expect("piped");
    let mut out = BufReader::new(child.stdout.take().expect("piped"));
    stdin
        .write_all(
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{\"protocolVersion\":\
              \"2025-11-25\",\"capabilities\":{},\"clientInfo\":{\"name\":\"bench\",\"version\":\"0\"}}}\n",
        )
        .expect("write");
    answer(&mut out, 1);
    let call = format!(
        "{{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}}\n\
         {{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/call\",\"params\":{{\"name\":\"read_text_file\",\
         \"arguments\":{{\"path\":\"{}\"}}}}}}\n",
        file.display()
    );
    stdin.write_all(call.as_bytes()).expect("write");
    let line = answer(&mut out, 2);
    assert!(line.contains("\"text\":\"mcp\\n\""), "{line}");
    drop(stdin);
    child.wait().expect("wait");
    t.elapsed().as_secs_f64() * 1e6
}

fn main() {
    if let Some(why) = bench::unmet(&["ctx", "tsh", "ctxmcp"]) {
        println!("mcp_call: not run ({why})");
        return;
    }
    if !Path::new(NODE).exists() || !Path::new(SERVER).exists() {
        println!("mcp_call: not run (needs {NODE} and {SERVER}: scripts/install-test-tools)");
        return;
    }
    let bins = bench::bin_dir();
    let m = bench::Mounted::start();
    let (dir, storage) = (m.dir.path(), m.storage.clone());
    let work = dir.join("work");
    fs::create_dir_all(&work).expect("work");
    let file = work.join("x.txt");
    fs::write(&file, "mcp\n").expect("file");
    let cfg = dir.join("mcp.json");
    fs::write(
        &cfg,
        format!(
            "{{\"mcpServers\":{{\"fs\":{{\"command\":\"{NODE}\",\"args\":[\"{SERVER}\",\"{}\"]}}}}}}",
            work.display()
        ),
    )
    .expect("config");
    let out = Command::new(bins.join("ctxmcp"))
        .args(["project", "--server", "fs", "--config"])
        .arg(&cfg)
        .arg("--runtime-config")
        .arg(&cfg)
        .arg("--out")
        .arg(dir.join("candidates"))
        .stderr(Stdio::null())
        .output()
        .expect("ctxmcp project");
    assert!(out.status.success(), "ctxmcp project: {}", out.status);
    let manifest = dir.join("candidates/fs.read_text_file/manifest.json");
    m.ctx(&["object", "install", "--source", &storage.to_string_lossy(), &manifest.to_string_lossy()]);
    let grant = "allow bench_t tool:fs.read_text_file execute\n";
    fs::write(storage.join("tool/fs.read_text_file.d/policy"), grant).expect("grant");
    fs::create_dir_all(storage.join("agent/bench.d")).expect("agent");
    fs::write(storage.join("agent/bench"), "#!/bin/sh\n").expect("agent");
    fs::set_permissions(storage.join("agent/bench"), fs::Permissions::from_mode(0o755)).expect("chmod");
    fs::write(storage.join("agent/bench.d/label"), "bench_t\n").expect("label");
    fs::write(storage.join("agent/bench.d/uid"), "0\n").expect("uid");
    fs::write(storage.join("agent/bench.d/policy"), grant).expect("policy");
    fs::create_dir_all(storage.join("home/0")).expect("home");
    let view = dir.join("view");
    m.ctx(&[
        "view",
        "create",
        "--agent",
        "bench",
        "--session",
        "b1",
        "--path",
        &view.to_string_lossy(),
        "--workspace",
        &work.to_string_lossy(),
        "--control",
        &m.control.to_string_lossy(),
    ]);
    let input = format!("{{\"path\":\"{}\"}}", file.display());

    let mut cases: Vec<Case> = vec![
        ("minimal client", Box::new(|| minimal(&work, &file)), Vec::new()),
        (
            "ctxmcp call (native disk)",
            Box::new(|| {
                let mut c = Command::new(bins.join("ctxmcp"));
                c.args(["call", "--server", "fs", "--config"]).arg(&cfg).args(["read_text_file", &input]);
                timed(c.stdin(Stdio::null()))
            }),
            Vec::new(),
        ),
        (
            "tsh fs.read_text_file (agent view)",
            Box::new(|| {
                let mut c = Command::new(bins.join("tsh"));
                c.args(["fs.read_text_file", &input])
                    .env_clear()
                    .env("PATH", "/usr/bin:/bin")
                    .env("CTX_WORKSPACE", &work)
                    .env("CTX_ROOT", &view)
                    .env("CTX_PATH", view.join("tool"))
                    .current_dir(&work)
                    .stdin(Stdio::null());
                timed(&mut c)
            }),
            Vec::new(),
        ),
    ];
    for round in 0..ROUNDS + WARMUP {
        for (_, call, samples) in cases.iter_mut() {
            let e = call();
            if round >= WARMUP {
                samples.push(e);
            }
        }
    }
    let mut base = (0.0, 0.0);
    println!("mcp_call: {ROUNDS} interleaved rounds, one read_text_file call each, server start included");
    println!("{:<36} {:>9} {:>9} {:>11} {:>11}", "case", "p50 us", "p99 us", "p50 ratio", "p99 ratio");
    for (i, (name, _, samples)) in cases.iter_mut().enumerate() {
        let (p50, p99) = (bench::pct(samples, 0.5), bench::pct(samples, 0.99));
        if i == 0 {
            base = (p50, p99);
        }
        println!("{name:<36} {p50:>9.0} {p99:>9.0} {:>10.2}x {:>10.2}x", p50 / base.0, p99 / base.1);
    }
}
