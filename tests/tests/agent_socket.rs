//! The agent socket (`/ctx/agent/NAME.sock`) with real sandboxes: a client drives two agents at
//! once (Codex against the scripted model endpoint, and a scripted runtime), each turn is
//! recorded in `messages.jsonl` exactly once and survives kill -9 of everything but the
//! storage, and a caller without the grant is refused.

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tests::model_endpoint::Endpoint;
use tests::served::Served;

/// The scripted runtime: answers the first line of its turn; a turn that starts with `wait`
/// says so and waits for `/workspace/go` first.
const RUNTIME: &str = "#!/bin/sh
read -r line
case \"$line\" in
wait*) echo waiting; echo still at it >&2; while [ ! -e /workspace/go ]; do sleep 0.1; done ;;
big*) echo run >> /workspace/runs; head -c 3000000 /dev/zero | tr '\\0' a; echo ;;
esac
echo \"ANSWER: $line\"
";

struct Host {
    s: Served,
    work: PathBuf,
}

fn ctx(args: &[&str], env: &[(&str, &Path)], input: &str) -> Output {
    let mut c = Command::new(tests::bin("ctx"));
    c.args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    for (k, v) in env {
        c.env(k, v);
    }
    let mut child = c.spawn().unwrap();
    match child.stdin.take().unwrap().write_all(input.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        r => r.unwrap(),
    }
    child.wait_with_output().unwrap()
}

fn ok(o: Output, what: &str) -> Output {
    assert!(o.status.success(), "{what}: {}", tests::shown(&o));
    o
}

/// A daemon with agent `sockcx` (Codex, its model the scripted endpoint `ep`) and agent
/// `sockrt` (the scripted runtime), and a workspace holding `a.txt` and the runtime.
fn host(ep: &Endpoint) -> Host {
    host_of(ep, "openai-responses", "codex")
}

/// As [`host`], with sockcx's model speaking `api` and its `profile` the launch profile named.
fn host_of(ep: &Endpoint, api: &str, profile: &str) -> Host {
    let mut s = Served::unstarted(&[]);
    let secrets = s.dir.path().join("secrets");
    s.env.push(("CTX_SECRETS".into(), secrets.display().to_string()));
    s.spawn();
    let st = s.storage.to_str().unwrap().to_owned();
    let env = [("CTX_SECRETS", secrets.as_path())];
    ok(ctx(&["bootstrap", &st], &[], ""), "bootstrap");
    let new = |name: &str, uid: &str, extra: &[&str]| {
        let mut a = vec!["agent", "new", name, "--uid", uid, "--gid", uid, "--source", &st];
        a.extend(extra);
        ok(ctx(&a, &[], ""), "agent new");
    };
    new("sockcx", "1000", &["--tool", "fs.stat"]);
    new("sockrt", "1001", &[]);
    fs::write(s.storage.join("tool/fs.stat.d/policy"), "allow sockcx_t tool:fs.stat execute\n").unwrap();
    let base = match api {
        "openai-responses" | "openai-chat" => format!("http://127.0.0.1:{}/v1", ep.port),
        _ => format!("http://127.0.0.1:{}", ep.port),
    };
    let m = ["model", "add", "local/m1", "--api", api, "--base-url", &base, "--id", "m-1"];
    ok(ctx(&[&m[..], &["--source", &st]].concat(), &env, ""), "model add");
    ok(ctx(&["model", "alias", "main", "local/m1", "--source", &st], &env, ""), "alias");
    ok(ctx(&["agent", "grant", "sockcx", "model:main", "use", "--source", &st], &env, ""), "grant");
    // sockrt's turns are recorded in full; sockcx's as facts (the default).
    ok(
        ctx(&["agent", "grant", "sockrt", "record:turns", "write", "--source", &st], &env, ""),
        "grant record",
    );
    ok(ctx(&["secret", "set", "local"], &env, "sk-socket-key"), "secret");
    fs::write(s.storage.join("agent/sockcx.d/profile"), format!("{profile}\n")).unwrap();
    fs::write(s.storage.join("agent/sockrt.d/profile"), "/workspace/rt.sh\n").unwrap();
    let work = s.dir.path().join("work");
    workspace(&work, 1000);
    Host { s, work }
}

/// A workspace owned by `uid` with `a.txt` and the runtime.
fn workspace(dir: &Path, uid: u32) {
    fs::create_dir_all(dir).unwrap();
    fs::write(dir.join("a.txt"), "hi\n").unwrap();
    fs::write(dir.join("rt.sh"), RUNTIME).unwrap();
    fs::set_permissions(dir.join("rt.sh"), fs::Permissions::from_mode(0o755)).unwrap();
    let id = |n| Some(rustix::fs::Uid::from_raw(n));
    rustix::fs::chown(dir, id(uid), Some(rustix::fs::Gid::from_raw(uid))).unwrap();
}

/// A connection to an agent's socket.
struct Client {
    w: UnixStream,
    r: BufReader<UnixStream>,
    hello: Value,
}

impl Client {
    fn to(h: &Host, agent: &str) -> Client {
        let p = h.s.mnt.join(format!("agent/{agent}.sock"));
        let t = Instant::now();
        while fs::read_link(&p).is_err() {
            assert!(t.elapsed() < Duration::from_secs(10), "{} did not appear", p.display());
            std::thread::sleep(Duration::from_millis(50));
        }
        // A daemon just started may not listen yet where the last one did.
        let w = loop {
            match UnixStream::connect(&p) {
                Ok(w) => break w,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound
                    ) && t.elapsed() < Duration::from_secs(30) =>
                {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => panic!("{}: {e}", p.display()),
            }
        };
        w.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
        let mut c = Client { r: BufReader::new(w.try_clone().unwrap()), w, hello: Value::Null };
        c.hello = c.next();
        c
    }

    fn send(&mut self, v: Value) {
        self.w.write_all(format!("{v}\n").as_bytes()).unwrap();
    }

    fn next(&mut self) -> Value {
        let mut l = String::new();
        assert!(self.r.read_line(&mut l).unwrap() > 0, "the socket closed");
        serde_json::from_str(&l).unwrap_or_else(|e| panic!("{l:?}: {e}"))
    }

    /// Frames up to and including the first that `stop` accepts.
    fn until(&mut self, stop: impl Fn(&Value) -> bool) -> Vec<Value> {
        let mut v = Vec::new();
        loop {
            let f = self.next();
            let end = stop(&f);
            v.push(f);
            if end {
                return v;
            }
        }
    }
}

/// Opens 33 connections to the socket given, printing the first frame of each; then closes
/// one and connects again until greeted (at most 10 s), printing that frame.
const CONNECTIONS: &str = r#"
import socket, sys, time
conns = []
for i in range(33):
    s = socket.socket(socket.AF_UNIX)
    s.connect(sys.argv[1])
    conns.append(s)
    print(s.makefile('r').readline().strip(), flush=True)
conns[0].close()
end = time.time() + 10
while True:
    s = socket.socket(socket.AF_UNIX)
    s.connect(sys.argv[1])
    line = s.makefile('r').readline().strip()
    if '"hello"' in line or time.time() > end:
        print(line)
        break
    s.close()
    time.sleep(0.1)
"#;

fn done(id: &str) -> impl Fn(&Value) -> bool + '_ {
    move |f| f["type"] == "done" && f["id"] == id
}

fn records(h: &Host, uid: u32, agent: &str, s: &str) -> Vec<Value> {
    let p = h.s.storage.join(format!("home/{uid}/agent/{agent}/session/{s}/messages.jsonl"));
    fs::read_to_string(p).unwrap_or_default().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// How many records of `id` with `role` the session holds.
fn count(r: &[Value], id: &str, role: &str) -> usize {
    r.iter().filter(|v| v["id"] == id && v["role"] == role).count()
}

/// Gemini CLI is a launch profile file alone (`ctxterm/profiles/gemini.toml`): socket turns
/// run it headless as its `[turn]` says, the first in a conversation whose id the launcher
/// picks and keeps, the second resuming it, against the scripted endpoint in Gemini's wire
/// format with the agent's key.
#[test]
fn a_gemini_agent_answers_socket_turns_through_its_profile_file_and_resumes_its_conversation() {
    let ep = Endpoint::start("tsh fs.stat /workspace/a.txt", "CHECKED");
    let h = host_of(&ep, "google-gemini", "gemini");
    let s = tests::unique("gm");
    let cwd = h.work.display().to_string();
    let mut c = Client::to(&h, "sockcx");
    c.send(json!({"op": "send", "id": "g1", "session": s, "cwd": cwd, "input": "stat a.txt"}));
    let f = c.until(done("g1"));
    assert_eq!(f.last().unwrap()["status"], "ok", "{f:?}");
    let answer = f.iter().find(|f| f["type"] == "message").unwrap();
    assert!(answer["content"].as_str().unwrap().contains("CHECKED"), "{f:?}");
    let seen = ep.seen();
    assert!(seen.iter().any(|r| r.path.ends_with("/models/m-1:streamGenerateContent")), "{seen:?}");
    assert!(seen.iter().all(|r| r.key.as_deref() == Some("sk-socket-key")), "{seen:?}");
    let dir = h.s.storage.join(format!("home/1000/agent/sockcx/session/{s}"));
    let id = fs::read_to_string(dir.join("cli_session")).unwrap();
    assert_eq!(id.trim().len(), 36, "the conversation the launcher chose: {id}");
    c.send(json!({"op": "send", "id": "g2", "session": s, "cwd": cwd, "input": "again"}));
    assert_eq!(c.until(done("g2")).last().unwrap()["status"], "ok");
    let last = ep.seen().last().unwrap().body.to_string();
    assert!(
        last.contains("stat a.txt") && last.contains("again"),
        "the second turn carries the first: {last}"
    );
}

#[test]
fn a_client_drives_two_agents_at_once_and_each_turn_is_recorded_once() {
    let ep = Endpoint::start("tsh fs.stat /workspace/a.txt", "CHECKED");
    let h = host(&ep);
    let s = tests::unique("sk");
    let cwd = h.work.display().to_string();
    let mut cx = Client::to(&h, "sockcx");
    assert_eq!(cx.hello["protocol"], "cortexfs.agent/1", "{}", cx.hello);
    let mut rt = Client::to(&h, "sockrt");
    // Both agents at once: the runtime's turn waits while Codex does a whole turn.
    rt.send(json!({"op": "send", "id": "rt1", "session": s, "cwd": cwd, "input": "wait for it"}));
    cx.send(json!({"op": "send", "id": "cx1", "session": s, "cwd": cwd, "input": "stat a.txt"}));
    let f = rt.until(|f| f["type"] == "delta" && f["text"].as_str().unwrap_or("").contains("waiting"));
    assert!(f.iter().any(|f| f["type"] == "start"), "{f:?}");
    let f = cx.until(done("cx1"));
    assert_eq!(f.last().unwrap()["status"], "ok", "{f:?}");
    let answer = f.iter().find(|f| f["type"] == "message").unwrap();
    assert!(answer["content"].as_str().unwrap().contains("CHECKED"), "{f:?}");
    assert!(ep.seen().iter().all(|r| r.key.as_deref() == Some("sk-socket-key")));
    // Status from another client, a second turn on the busy session refused, then a cancel.
    let mut other = Client::to(&h, "sockrt");
    other.send(json!({"op": "status", "id": "rt1"}));
    let st = other.next();
    assert_eq!(st["runs"][0]["state"], "running", "{st}");
    other.send(json!({"op": "send", "id": "rt2", "session": s, "cwd": cwd, "input": "more"}));
    let e = other.next();
    assert_eq!((e["type"].as_str(), e["code"].as_str()), (Some("error"), Some("EBUSY")), "{e}");
    other.until(done("rt2"));
    other.send(json!({"op": "cancel", "id": "rt1"}));
    let f = other.until(done("rt1"));
    assert_eq!(f.last().unwrap()["status"], "cancelled", "{f:?}");
    assert_eq!(rt.until(done("rt1")).last().unwrap()["status"], "cancelled");
    other.send(json!({"op": "ping"}));
    assert_eq!(other.next()["type"], "pong");
    other.send(json!({"op": "fly"}));
    let e = other.next();
    assert_eq!((e["type"].as_str(), e["code"].as_str()), (Some("error"), Some("EINVAL")), "{e}");
    // A frame over 1 MiB is refused, and the connection closed.
    let mut big = Client::to(&h, "sockrt");
    let _ = big.w.write_all(&vec![b'x'; (1 << 20) + 16]);
    let e = big.next();
    assert_eq!(e["code"], "EMSGSIZE", "{e}");
    // Codex continues its own conversation of the session.
    cx.send(json!({"op": "send", "id": "cx2", "session": s, "cwd": cwd, "input": "again",
        "files": ["/workspace/a.txt", "/ctx/shared/project-a/input/screenshot.png"]}));
    assert_eq!(cx.until(done("cx2")).last().unwrap()["status"], "ok");
    let last = ep.seen().last().unwrap().body.to_string();
    assert!(
        last.contains("stat a.txt") && last.contains("again"),
        "the second turn carries the first: {last}"
    );
    // The same id again is the same run: replayed, not run.
    let asked = ep.seen().len();
    let mut again = Client::to(&h, "sockcx");
    again.send(json!({"op": "send", "id": "cx1", "session": s, "cwd": cwd, "input": "stat a.txt"}));
    let f = again.until(done("cx1"));
    assert!(f.iter().any(|f| f["type"] == "message" && f["content"].as_str().unwrap().contains("CHECKED")));
    assert_eq!(ep.seen().len(), asked, "nothing reached the model");
    // Resume: the session's records after the ones a client has.
    again.send(json!({"op": "resume", "session": s, "after": 1}));
    let f = again.until(|f| f["type"] == "resumed");
    assert_eq!(f.iter().filter(|f| f["type"] == "record").count(), 3, "{f:?}");
    assert_eq!(f.last().unwrap()["records"], 4);
    // Each turn and answer exactly once; latest.md is the last answer.
    let r = records(&h, 1000, "sockcx", &s);
    for id in ["cx1", "cx2"] {
        assert_eq!((count(&r, id, "user"), count(&r, id, "assistant")), (1, 1), "{id}: {r:?}");
    }
    // The files a turn names are the session's references, once (the replay added none).
    let refs = fs::read_to_string(
        h.s.storage.join(format!("home/1000/agent/sockcx/session/{s}/context/refs.jsonl")),
    )
    .unwrap_or_default();
    let refs: Vec<Value> = refs.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let paths: Vec<&str> = refs.iter().map(|v| v["path"].as_str().unwrap_or("")).collect();
    assert_eq!(paths, ["/workspace/a.txt", "/ctx/shared/project-a/input/screenshot.png"], "{refs:?}");
    assert!(refs.iter().all(|v| v["kind"] == "file" && v["turn"] == "cx2"), "{refs:?}");
    let r = records(&h, 1001, "sockrt", &s);
    assert_eq!((count(&r, "rt1", "user"), count(&r, "rt1", "assistant"), r.len()), (1, 1, 2), "{r:?}");
    // What is recorded of a turn: sockrt's policy records turns in full, sockcx's (no
    // `record:turns` line) keeps the facts of what was asked, never its text.
    let asked =
        |r: &[Value], id: &str| r.iter().find(|v| v["id"] == id && v["role"] == "user").cloned().unwrap();
    assert_eq!(asked(&r, "rt1")["content"], "wait for it", "{r:?}");
    let cx1 = asked(&records(&h, 1000, "sockcx", &s), "cx1");
    assert!(cx1.get("content").is_none() && cx1["recorded"] == "facts", "{cx1}");
    assert_eq!((cx1["bytes"].as_u64(), cx1["sha256"].as_str().map(str::len)), (Some(10), Some(64)), "{cx1}");
    let latest = h.s.storage.join(format!("home/1000/agent/sockcx/session/{s}/latest.md"));
    assert!(fs::read_to_string(latest).unwrap().contains("CHECKED"));
    // The records are what ctx agent history and output show.
    let mnt = h.s.mnt.display().to_string();
    let o = ok(ctx(&["agent", "history", "sockcx", "--session", &s, "--ctx", &mnt], &[], ""), "history");
    assert_eq!(String::from_utf8_lossy(&o.stdout).lines().count(), 4, "{}", tests::shown(&o));
    let o = ok(ctx(&["agent", "output", "sockcx", "--session", &s, "--ctx", &mnt], &[], ""), "output");
    assert!(String::from_utf8_lossy(&o.stdout).contains("CHECKED"), "{}", tests::shown(&o));
    let o =
        ok(ctx(&["agent", "output", "sockcx", "--session", &s, "--ctx", &mnt, "--json"], &[], ""), "output");
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["output"].as_str().unwrap().contains("CHECKED") && v["session"] == s.as_str(), "{v}");
    let o = ok(
        ctx(&["model", "inspect", "main", "--json", "--source", &h.s.storage.display().to_string()], &[], ""),
        "inspect",
    );
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!((v["model"].as_str(), v["aliases"][0].as_str()), (Some("local/m1"), Some("main")), "{v}");
    let args = ["send", "sockrt", "hello", "--session", &s, "--cwd", &cwd, "--ctx", &mnt, "--wait"];
    let o = ok(ctx(&args, &[], ""), "ctx send --wait");
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "ANSWER: hello");
    // Without --cwd, a turn that joins no run works in the caller's directory (the runtime is
    // found at /workspace/rt.sh only so).
    let o = Command::new(tests::bin("ctx"))
        .current_dir(&h.work)
        .args(["send", "sockrt", "from here", "--session", &s, "--ctx", &mnt, "--wait"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "ANSWER: from here", "{}", tests::shown(&o));
    // A caller who is neither root, nor the agent's owner, nor an agent granted
    // agent:sockrt write is refused before anything runs.
    let as_uid = |uid: &str, args: &[&str]| {
        let mut c = Command::new("setpriv");
        c.args(["--reuid", uid, "--regid", uid, "--clear-groups"]).arg(tests::bin("ctx")).args(args);
        c.output().unwrap()
    };
    let o = as_uid("4242", &["send", "sockrt", "hi", "--session", &s, "--ctx", &mnt, "--wait"]);
    assert_eq!(o.status.code(), Some(13), "{}", tests::shown(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("EACCES"), "{}", tests::shown(&o));
    assert_eq!(records(&h, 1001, "sockrt", &s).len(), 6, "nothing was recorded for the refused caller");
    // The uid of an agent whose policy allows agent:sockrt write may drive it.
    let st = h.s.storage.display().to_string();
    ok(
        ctx(&["agent", "new", "sockdrv", "--uid", "4343", "--gid", "4343", "--source", &st], &[], ""),
        "agent new",
    );
    ok(ctx(&["agent", "grant", "sockdrv", "agent:sockrt", "write", "--source", &st], &[], ""), "grant");
    let o = as_uid("4343", &["send", "sockrt", "driven", "--session", &s, "--ctx", &mnt, "--json"]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("\"type\":\"start\""), "{}", tests::shown(&o));
    // One uid holds at most 32 connections; the next is refused, and a slot given back is free.
    let sock = h.s.mnt.join("agent/sockrt.sock");
    let o = Command::new("setpriv")
        .args(["--reuid", "4343", "--regid", "4343", "--clear-groups", "/usr/bin/python3", "-c", CONNECTIONS])
        .arg(&sock)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&o.stdout);
    let lines: Vec<&str> = said.lines().collect();
    assert!(o.status.success() && lines.len() == 34, "{}", tests::shown(&o));
    assert!(lines[..32].iter().all(|l| l.contains("\"hello\"")), "{said}");
    assert!(lines[32].contains("EAGAIN") && lines[32].contains("uid 4343"), "{said}");
    assert!(lines[33].contains("\"hello\""), "a slot given back is free: {said}");
    // Its owner may, with a workspace of its own.
    fs::write(h.s.storage.join("agent/sockrt.d/owner"), "4242\n").unwrap();
    let mine = h.s.dir.path().join("work4242");
    workspace(&mine, 4242);
    let m = mine.display().to_string();
    let o =
        as_uid("4242", &["send", "sockrt", "mine", "--session", &s, "--cwd", &m, "--ctx", &mnt, "--wait"]);
    assert!(o.status.success(), "{}", tests::shown(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "ANSWER: mine");
    // ... but not someone else's directory.
    let o = as_uid("4242", &["send", "sockrt", "x", "--session", &s, "--cwd", &cwd, "--ctx", &mnt, "--wait"]);
    assert_eq!(o.status.code(), Some(13), "{}", tests::shown(&o));
    // The agent's prompt template renders each turn, as it is at the time of the turn.
    fs::write(h.s.storage.join("agent/sockrt.d/prompt.template.md"), "TEMPLATED {{message}}\n").unwrap();
    let args = ["send", "sockrt", "tpl", "--session", &s, "--cwd", &cwd, "--ctx", &mnt, "--wait"];
    let o = ok(ctx(&args, &[], ""), "ctx send with a template");
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "ANSWER: TEMPLATED tpl");
}

/// An agent may plant symlinks in its own sessions; the root daemon preparing a session for a
/// turn (or a run) follows none of them: nothing outside is chowned, written or truncated.
#[test]
fn a_session_prepared_for_a_turn_follows_no_symlink_the_agent_planted() {
    use std::os::unix::fs::MetadataExt;
    let ep = Endpoint::start("true", "unused");
    let h = host(&ep);
    let cwd = h.work.display().to_string();
    let mnt = h.s.mnt.display().to_string();
    let victim_dir = h.s.dir.path().join("victim");
    fs::create_dir(&victim_dir).unwrap();
    fs::set_permissions(&victim_dir, fs::Permissions::from_mode(0o700)).unwrap();
    let victim = victim_dir.join("secret");
    fs::write(&victim, "root's\n").unwrap();
    // The agent's socket is up (the daemon binds it within a second of the agent's making).
    drop(Client::to(&h, "sockrt"));
    let sessions = h.s.storage.join("home/1001/agent/sockrt/session");
    fs::create_dir_all(&sessions).unwrap();
    // The session directory itself a symlink to a root directory.
    let evil = tests::unique("ev");
    std::os::unix::fs::symlink(&victim_dir, sessions.join(&evil)).unwrap();
    let o =
        ctx(&["send", "sockrt", "x", "--session", &evil, "--cwd", &cwd, "--ctx", &mnt, "--wait"], &[], "");
    assert!(!o.status.success(), "{}", tests::shown(&o));
    // A file of the session (its state) a symlink to a root file.
    let sneaky = tests::unique("sn");
    fs::create_dir_all(sessions.join(&sneaky)).unwrap();
    std::os::unix::fs::symlink(&victim, sessions.join(&sneaky).join("state")).unwrap();
    let _ =
        ctx(&["send", "sockrt", "y", "--session", &sneaky, "--cwd", &cwd, "--ctx", &mnt, "--wait"], &[], "");
    let m = fs::metadata(&victim_dir).unwrap();
    assert_eq!((m.uid(), m.mode() & 0o7777), (0, 0o700), "the directory is untouched");
    let m = fs::metadata(&victim).unwrap();
    assert_eq!(m.uid(), 0, "the file is still root's");
    assert_eq!(fs::read_to_string(&victim).unwrap(), "root's\n", "and holds what it held");
    assert!(!victim_dir.join("context").exists() && !victim_dir.join("messages.jsonl").exists());
}

#[test]
fn a_turn_survives_kill_9_of_everything_but_storage_and_is_answered_once() {
    let ep = Endpoint::start("true", "unused");
    let mut h = host(&ep);
    let s = tests::unique("sz");
    let cwd = h.work.display().to_string();
    let mut rt = Client::to(&h, "sockrt");
    rt.send(json!({"op": "send", "id": "k0", "session": s, "cwd": cwd, "input": "first"}));
    assert_eq!(rt.until(done("k0")).last().unwrap()["status"], "ok");
    rt.send(json!({"op": "send", "id": "k1", "session": s, "cwd": cwd, "input": "wait then answer"}));
    rt.until(|f| f["type"] == "delta" && f["text"].as_str().unwrap_or("").contains("waiting"));
    // Everything but the storage: the daemon, the run's ctx agent start, its supervisor and
    // sandbox, all with kill -9. Until the turn runs again, its run state is a dead
    // supervisor's, which `ctx doctor`'s test must not see.
    let _host = tests::NETWORK.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut daemon = h.s.child.take().unwrap();
    daemon.kill().unwrap();
    daemon.wait().unwrap();
    // pgrep: 0 when a process matches, 1 when none does; anything else is a pgrep that did
    // not run, which must not pass for "none left".
    let matching = || {
        let o = Command::new("pgrep").args(["-f", &s]).output().expect("pgrep runs");
        match o.status.code() {
            Some(0) => true,
            Some(1) => false,
            c => panic!("pgrep -f {s}: {c:?}"),
        }
    };
    assert!(matching(), "the run's processes are there to kill");
    let killed = Command::new("pkill").args(["-9", "-f", &s]).status().unwrap();
    assert_eq!(killed.code(), Some(0), "pkill signalled the run's processes");
    drop(rt);
    let t = Instant::now();
    while matching() {
        assert!(t.elapsed() < Duration::from_secs(10), "the run's processes did not die");
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = Command::new("umount").arg("-l").arg(&h.s.mnt).status();
    assert_eq!(
        count(&records(&h, 1001, "sockrt", &s), "k1", "user"),
        1,
        "the turn was recorded before it ran"
    );
    h.s.spawn();
    fs::write(h.work.join("go"), "").unwrap();
    let mut rt = Client::to(&h, "sockrt");
    rt.send(json!({"op": "send", "id": "k1", "session": s, "cwd": cwd, "input": "wait then answer"}));
    let f = rt.until(done("k1"));
    assert_eq!(f.last().unwrap()["status"], "ok", "{f:?}");
    drop(_host);
    // The killed run's mounts (its workspace) went when the turn ran again, and the killed
    // daemon's pin of the turn's working directory when the next daemon started; the new run's
    // and the new pin go when it ends.
    let pins = h.s.dir.path().join("agent/.cwd");
    let t = Instant::now();
    loop {
        let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
        if !info.contains(&format!("/sockrt/{s}/")) && !info.contains(&format!("{}/", pins.display())) {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "mounts stayed behind:\n{info}");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Sent again, to this daemon and to the next: the same run, answered from its record.
    rt.send(json!({"op": "send", "id": "k1", "session": s, "cwd": cwd, "input": "wait then answer"}));
    assert_eq!(rt.until(done("k1")).last().unwrap()["status"], "ok");
    drop(rt);
    h.s.stop();
    let _ = Command::new("umount").arg("-l").arg(&h.s.mnt).status();
    h.s.spawn();
    let mut rt = Client::to(&h, "sockrt");
    rt.send(json!({"op": "send", "id": "k1", "session": s, "cwd": cwd, "input": "wait then answer"}));
    let f = rt.until(done("k1"));
    assert_eq!(
        (&f.last().unwrap()["status"], &f.last().unwrap()["replayed"]),
        (&json!("ok"), &json!(true)),
        "{f:?}"
    );
    let r = records(&h, 1001, "sockrt", &s);
    for id in ["k0", "k1"] {
        assert_eq!((count(&r, id, "user"), count(&r, id, "assistant")), (1, 1), "{id}: {r:?}");
    }
    assert_eq!(r.len(), 4, "{r:?}");
    assert!(r[3]["content"].as_str().unwrap().contains("ANSWER: wait then answer"), "{r:?}");
}

/// An answer larger than a session line (3 MB; the line limit is 1 MiB) is recorded once:
/// kept whole in a file beside the session, its line carrying the first bytes and the file's
/// name. The same id sent again replays it (the runtime ran once), no frame passes the frame
/// limit, and `ctx send --wait` prints the whole answer.
#[test]
fn an_answer_larger_than_a_session_line_is_recorded_once_and_never_run_again() {
    let ep = Endpoint::start("true", "unused");
    let mut h = host(&ep);
    let work = h.s.dir.path().join("big-work");
    workspace(&work, 1001);
    let (s, cwd) = (tests::unique("big"), work.display().to_string());
    let mut c = Client::to(&h, "sockrt");
    c.send(json!({"op": "send", "id": "big1", "session": s, "cwd": cwd, "input": "big"}));
    let f = c.until(done("big1"));
    assert_eq!(f.last().unwrap()["status"], "ok", "{:?}", f.last());
    let m = f.iter().find(|f| f["type"] == "message").expect("a message frame");
    assert!(m.to_string().len() < 1 << 20, "the message frame fits a frame");
    assert_eq!(m["content_bytes"], 3_000_000 + "ANSWER: big".len() + 1, "{}", m["content_bytes"]);
    let file = PathBuf::from(m["content_file"].as_str().expect("content_file"));
    let whole = fs::read_to_string(&file).unwrap();
    assert!(whole.starts_with("aaaa") && whole.ends_with("ANSWER: big") && whole.len() == 3_000_012);
    let r = records(&h, 1001, "sockrt", &s);
    assert_eq!(count(&r, "big1", "assistant"), 1, "recorded once");
    let rec = r.iter().find(|v| v["id"] == "big1" && v["role"] == "assistant").unwrap();
    assert_eq!(rec["content_file"].as_str(), file.file_name().unwrap().to_str());
    // The same id again: the same run, followed (not run again).
    let mut again = Client::to(&h, "sockrt");
    again.send(json!({"op": "send", "id": "big1", "session": s, "cwd": cwd, "input": "big"}));
    let f = again.until(done("big1"));
    assert_eq!(f.last().unwrap()["status"], "ok", "{:?}", f.last());
    assert_eq!(f.iter().find(|f| f["type"] == "message").unwrap()["content_file"], m["content_file"]);
    let o = Command::new(tests::bin("ctx"))
        .args(["send", "sockrt", "big", "--session", &s, "--id", "big1", "--wait", "--cwd", &cwd, "--ctx"])
        .arg(&h.s.mnt)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", tests::shown(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim_end(), whole, "the whole answer printed");
    // A daemon started again answers from the record: replayed, the same file.
    h.s.stop();
    h.s.spawn();
    let mut after = Client::to(&h, "sockrt");
    after.send(json!({"op": "send", "id": "big1", "session": s, "cwd": cwd, "input": "big"}));
    let f = after.until(done("big1"));
    assert_eq!(f.last().unwrap()["replayed"], true, "{:?}", f.last());
    assert_eq!(f.iter().find(|f| f["type"] == "message").unwrap()["content_file"], m["content_file"]);
    assert_eq!(fs::read_to_string(work.join("runs")).unwrap(), "run\n", "the runtime ran once");
    // A record the agent wrote itself (its session is its own) naming a file elsewhere: root's
    // `ctx send --wait` never reads it.
    let secret = h.s.dir.path().join("root-only");
    fs::write(&secret, "ROOT-SECRET\n").unwrap();
    let forged = json!({"ts": "2026-01-01T00:00:00Z", "role": "assistant", "id": "forged", "content": "preview",
        "content_file": secret, "content_bytes": 100, "status": "ok"});
    let log = h.s.mnt.join(format!("home/1001/agent/sockrt/session/{s}/messages.jsonl"));
    fs::OpenOptions::new()
        .append(true)
        .open(&log)
        .unwrap()
        .write_all(format!("{forged}\n").as_bytes())
        .unwrap();
    let o = Command::new(tests::bin("ctx"))
        .args(["send", "sockrt", "x", "--session", &s, "--id", "forged", "--wait", "--cwd", &cwd, "--ctx"])
        .arg(&h.s.mnt)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", tests::shown(&o));
    assert!(
        !String::from_utf8_lossy(&o.stdout).contains("ROOT-SECRET"),
        "root read the agent's path: {}",
        tests::shown(&o)
    );
    assert!(String::from_utf8_lossy(&o.stdout).contains("preview"), "{}", tests::shown(&o));
}

/// The spec's flow as written (`extending-cortexfs`): the agent's terminal is started with the
/// caller's directory mounted at /workspace (no grant needed: it is the workspace), then
/// `ctx send` with no session and no --cwd joins that run, reads the file by its /workspace
/// path, and is answered and recorded once. It failed with 13 (no `mount:/workspace` grant),
/// then as already running.
#[test]
fn the_specs_start_then_send_flow_works_as_written() {
    let ep = Endpoint::start("cat /workspace/a.txt", "CHECKED");
    let h = host(&ep);
    fs::write(h.work.join("a.txt"), "SPEC-FLOW-CONTENT\n").unwrap();
    let (mnt, control) = (h.s.mnt.display().to_string(), h.s.control.display().to_string());
    let secrets = h.s.dir.path().join("secrets");
    let run = |dir: &Path, args: &[&str]| {
        Command::new(tests::bin("ctx"))
            .current_dir(dir)
            .env("CTX_SECRETS", &secrets)
            .args(args)
            .output()
            .unwrap()
    };
    Client::to(&h, "sockcx");
    // ctx agent start coder --session default --mount "$PWD" /workspace rw
    let work = h.work.display().to_string();
    let start = [
        "agent",
        "start",
        "sockcx",
        "--session",
        "default",
        "--mount",
        &work,
        "/workspace",
        "rw",
        "--ctx",
        &mnt,
        "--control",
        &control,
    ];
    ok(run(&h.work, &start), "agent start");
    // ctx send coder "Analyze /workspace/..."
    let o = ok(
        run(Path::new("/"), &["send", "sockcx", "Analyze /workspace/a.txt", "--ctx", &mnt, "--wait"]),
        "send",
    );
    let answer = String::from_utf8_lossy(&o.stdout);
    assert!(answer.contains("CHECKED") && answer.contains("SPEC-FLOW-CONTENT"), "{}", tests::shown(&o));
    let r = records(&h, 1000, "sockcx", "default");
    let id = r.iter().find(|v| v["role"] == "user").and_then(|v| v["id"].as_str()).unwrap().to_owned();
    assert_eq!((count(&r, &id, "user"), count(&r, &id, "assistant"), r.len()), (1, 1, 2), "{r:?}");
    // The terminal's run goes on after the turn; a turn naming another workspace is told why
    // it cannot join, and nothing of it is recorded.
    let o = run(Path::new("/"), &["agent", "ps", "--control", &control]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("sockcx"), "{}", tests::shown(&o));
    let o = run(Path::new("/"), &["send", "sockcx", "elsewhere", "--cwd", "/tmp", "--ctx", &mnt, "--wait"]);
    assert_ne!(o.status.code(), Some(0), "{}", tests::shown(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("EBUSY") && err.contains("its workspace is") && err.contains("ctx agent send"),
        "{err}"
    );
    assert_eq!(records(&h, 1000, "sockcx", "default").len(), 2);
    ok(
        run(Path::new("/"), &["agent", "stop", "sockcx", "--session", "default", "--control", &control]),
        "stop",
    );
}

/// `ctx send --wait` printed nothing while it waited and Ctrl-C left the run going: now it
/// says the run's id, and Ctrl-C (under a PTY, as typed) cancels the run and says so.
#[test]
fn ctrl_c_on_send_wait_cancels_the_run_and_ctx_cancel_cancels_by_id() {
    let ep = Endpoint::start("true", "x");
    let h = host(&ep);
    let s = tests::unique("cc");
    let (cwd, mnt) = (h.work.display().to_string(), h.s.mnt.display().to_string());
    Client::to(&h, "sockrt");
    let said = tests::pty::run(
        tests::bin("ctx").to_str().unwrap(),
        &["send", "sockrt", "wait for me", "--session", &s, "--cwd", &cwd, "--ctx", &mnt, "--wait"],
        &[],
        Some("ctx: run "),
    );
    assert!(said.contains("cancelling run") && said.contains("was cancelled"), "{said}");
    // On a terminal, what the run says on the side shows while it runs.
    assert!(said.contains("still at it"), "progress on the terminal: {said}");
    assert!(said.trim_end().ends_with("EXIT 130"), "{said}");
    let r = records(&h, 1001, "sockrt", &s);
    assert!(r.iter().any(|v| v["role"] == "assistant" && v["status"] == "cancelled"), "{r:?}");
    // ctx cancel: by id, then a session with nothing running, then an unknown id.
    let o = ok(
        ctx(&["send", "sockrt", "wait again", "--session", &s, "--cwd", &cwd, "--ctx", &mnt], &[], ""),
        "send",
    );
    let id = String::from_utf8_lossy(&o.stdout).trim().to_owned();
    let o = ok(ctx(&["cancel", "sockrt", &id, "--ctx", &mnt], &[], ""), "cancel");
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), format!("cancelling run {id}"));
    let mut c = Client::to(&h, "sockrt");
    c.send(json!({"op": "status", "id": id}));
    let t = Instant::now();
    loop {
        let st = c.next();
        if st["runs"][0]["state"] != "running" {
            assert_eq!(st["runs"][0]["state"], "cancelled", "{st}");
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "{st}");
        std::thread::sleep(Duration::from_millis(100));
        c.send(json!({"op": "status", "id": id}));
    }
    // By session: every run of it going on.
    let o = ok(
        ctx(&["send", "sockrt", "wait once more", "--session", &s, "--cwd", &cwd, "--ctx", &mnt], &[], ""),
        "send",
    );
    let id3 = String::from_utf8_lossy(&o.stdout).trim().to_owned();
    let o = ok(ctx(&["cancel", "sockrt", "--session", &s, "--ctx", &mnt], &[], ""), "cancel by session");
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), format!("cancelling run {id3}"));
    let mut follow = Client::to(&h, "sockrt");
    follow.send(json!({"op": "send", "id": id3, "session": s, "input": "wait once more"}));
    assert_eq!(follow.until(done(&id3)).last().unwrap()["status"], "cancelled");
    let o = ctx(&["cancel", "sockrt", "--session", &s, "--ctx", &mnt], &[], "");
    assert_eq!(o.status.code(), Some(1), "{}", tests::shown(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no run of session"), "{}", tests::shown(&o));
    let o = ctx(&["cancel", "sockrt", "nosuch", "--ctx", &mnt], &[], "");
    assert_eq!(o.status.code(), Some(1), "{}", tests::shown(&o));
}

/// The spec's second flow (`ctx agent new reviewer --shared project-a:read`, then `ctx send
/// reviewer "Inspect ..."`) sent the text to tsh as a tool name: an agent with no `profile`
/// is refused with what to write there, and nothing is recorded.
#[test]
fn a_turn_to_an_agent_with_no_profile_names_the_control_and_records_nothing() {
    let ep = Endpoint::start("true", "x");
    let h = host(&ep);
    let st = h.s.storage.display().to_string();
    ok(ctx(&["shared", "new", "project-a", "--group", "3390", "--source", &st], &[], ""), "shared new");
    ok(
        ctx(
            &[
                "agent",
                "new",
                "reviewer",
                "--uid",
                "1091",
                "--gid",
                "1091",
                "--shared",
                "project-a:read",
                "--source",
                &st,
            ],
            &[],
            "",
        ),
        "agent new",
    );
    Client::to(&h, "reviewer");
    let mnt = h.s.mnt.display().to_string();
    let o = ctx(
        &["send", "reviewer", "Inspect /ctx/shared/project-a/input/screenshot.png", "--ctx", &mnt, "--wait"],
        &[],
        "",
    );
    assert_eq!(o.status.code(), Some(2), "{}", tests::shown(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("agent/reviewer.d/profile is empty") && err.contains("echo codex >"), "{err}");
    assert!(records(&h, 1091, "reviewer", "default").is_empty());
}

/// A turn joined to a running terminal is cancelled alone: the cancel ends the turn's command
/// and the terminal runs on (a cancel that came while the turn was being joined used to stop
/// the whole run). A headless run, and a caller whose workspace it is not, are told why.
#[test]
fn cancelling_a_joined_turn_ends_the_turn_and_never_the_terminal() {
    let ep = Endpoint::start("true", "x");
    let h = host(&ep);
    let (mnt, control) = (h.s.mnt.display().to_string(), h.s.control.display().to_string());
    let work = h.work.display().to_string();
    Client::to(&h, "sockrt");
    let start = [
        "agent",
        "start",
        "sockrt",
        "--session",
        "jn",
        "--mount",
        &work,
        "/workspace",
        "rw",
        "--ctx",
        &mnt,
        "--control",
        &control,
    ];
    ok(ctx(&start, &[], ""), "agent start");
    let mut c = Client::to(&h, "sockrt");
    c.send(json!({"op": "send", "id": "j1", "session": "jn", "input": "wait for it"}));
    let f = c.until(|f| f["type"] == "delta" && f["text"].as_str().unwrap_or("").contains("waiting"));
    assert!(f.iter().any(|f| f["type"] == "start" && f["joined"] == true), "{f:?}");
    let mut other = Client::to(&h, "sockrt");
    other.send(json!({"op": "cancel", "id": "j1"}));
    let f = other.until(done("j1"));
    assert_eq!(f.last().unwrap()["status"], "cancelled", "{f:?}");
    let o = ctx(&["agent", "ps", "--json", "--control", &control], &[], "");
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("\"session\":\"jn\""),
        "the terminal runs on: {}",
        tests::shown(&o)
    );
    // The next turn joins it again and is answered.
    c.send(json!({"op": "send", "id": "j2", "session": "jn", "input": "hello"}));
    let f = c.until(done("j2"));
    assert!(f.iter().any(|f| f["type"] == "message" && f["content"] == "ANSWER: hello"), "{f:?}");
    let r = records(&h, 1001, "sockrt", "jn");
    assert_eq!((count(&r, "j1", "assistant"), count(&r, "j2", "assistant")), (1, 1), "{r:?}");
    ok(ctx(&["agent", "stop", "sockrt", "--session", "jn", "--control", &control], &[], ""), "stop");
    // A run started headless has no terminal to take a turn: refused before anything is
    // recorded, saying why.
    let mut run = Command::new(tests::bin("ctx"))
        .args([
            "agent",
            "start",
            "sockrt",
            "--session",
            "hl",
            "--headless",
            "--cwd",
            &work,
            "--ctx",
            &mnt,
            "--control",
            &control,
            "--",
            "/bin/sleep",
            "30",
        ])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while !h.s.run_dir("sockrt", "hl").join("pid").exists() {
        assert!(t.elapsed() < Duration::from_secs(20), "the headless run started");
        std::thread::sleep(Duration::from_millis(50));
    }
    c.send(json!({"op": "send", "id": "h1", "session": "hl", "input": "hello"}));
    let e = c.until(|f| f["type"] == "error");
    let e = e.last().unwrap();
    assert!(e["code"] == "EBUSY" && e["message"].as_str().unwrap().contains("headless"), "{e}");
    assert!(records(&h, 1001, "sockrt", "hl").is_empty());
    let _ = ctx(&["agent", "stop", "sockrt", "--session", "hl", "--control", &control], &[], "");
    let _ = run.wait();
}

/// At most 16 turns of one agent run at once: of 17 sent together, each in a session of its
/// own, 16 run and the 17th is refused at once with `EAGAIN`; once they have ended, a turn runs
/// again.
#[test]
fn seventeen_turns_at_once_run_sixteen_and_refuse_one_with_eagain() {
    let ep = Endpoint::start("true", "unused");
    let h = host(&ep);
    let cwd = h.work.display().to_string();
    let tag = tests::unique("lim");
    // A connection each: a connection's turns follow one another.
    let send = |i: usize| {
        let mut c = Client::to(&h, "sockrt");
        c.send(json!({"op": "send", "id": format!("t{i}"), "session": format!("{tag}{i}"), "cwd": cwd,
            "input": "wait then answer"}));
        c
    };
    let mut running: Vec<Client> = (0..16).map(send).collect();
    for (i, c) in running.iter_mut().enumerate() {
        let f = c.until(|f| {
            f["type"] == "error"
                || f["type"] == "delta" && f["text"].as_str().unwrap_or("").contains("waiting")
        });
        assert_eq!(f.last().unwrap()["type"], "delta", "turn {i} of the first 16 was refused: {f:?}");
    }
    let mut c = send(16);
    let f = c.until(|f| ["error", "done", "delta"].contains(&f["type"].as_str().unwrap_or("")));
    let first = f.last().unwrap();
    assert_eq!((&first["type"], &first["code"]), (&json!("error"), &json!("EAGAIN")), "{f:?}");
    fs::write(h.work.join("go"), "").unwrap();
    for (i, c) in running.iter_mut().enumerate() {
        let id = format!("t{i}");
        assert_eq!(c.until(done(&id)).last().unwrap()["status"], "ok", "turn {i}");
    }
    let mut c = send(17);
    assert_eq!(c.until(done("t17")).last().unwrap()["status"], "ok", "a turn runs again");
}

/// A socket turn's files are appended (as root) to the session's `context/refs.jsonl`, a name
/// in the agent's tree: a file of another user hard-linked there is never written nor given to
/// the agent, and the turn runs and is recorded all the same.
#[test]
fn a_refs_file_linked_to_another_users_file_is_never_written_nor_given_away() {
    let ep = Endpoint::start("true", "x");
    let h = host(&ep);
    let s = tests::unique("rl");
    let cwd = h.work.display().to_string();
    let mut c = Client::to(&h, "sockcx");
    c.send(json!({"op": "send", "id": "rl1", "session": s, "cwd": cwd, "input": "first"}));
    assert_eq!(c.until(done("rl1")).last().unwrap()["status"], "ok");
    // Another user's file, linked in the place of the session's references.
    let other = h.s.storage.join("home/1001/theirs.txt");
    fs::create_dir_all(other.parent().unwrap()).unwrap();
    fs::write(&other, "theirs\n").unwrap();
    rustix::fs::chown(&other, Some(rustix::fs::Uid::from_raw(1001)), Some(rustix::fs::Gid::from_raw(1001)))
        .unwrap();
    let context = h.s.storage.join(format!("home/1000/agent/sockcx/session/{s}/context"));
    fs::create_dir_all(&context).unwrap();
    let _ = fs::remove_file(context.join("refs.jsonl"));
    fs::hard_link(&other, context.join("refs.jsonl")).unwrap();
    c.send(json!({"op": "send", "id": "rl2", "session": s, "cwd": cwd, "input": "second", "files": ["/workspace/a.txt"]}));
    assert_eq!(c.until(done("rl2")).last().unwrap()["status"], "ok");
    use std::os::unix::fs::MetadataExt;
    assert_eq!(fs::read_to_string(&other).unwrap(), "theirs\n", "the other user's file is not written");
    assert_eq!(fs::metadata(&other).unwrap().uid(), 1001, "nor given to the agent");
    let r = records(&h, 1000, "sockcx", &s);
    assert_eq!((count(&r, "rl2", "user"), count(&r, "rl2", "assistant")), (1, 1), "{r:?}");
}
