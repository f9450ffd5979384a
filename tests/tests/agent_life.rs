//! The agent lifecycle tools from inside real sandboxes: `agent.create` only narrows,
//! `agent.update` touches only the caller's two self-updatable controls, owned children are
//! recorded and cancelled with their parent, `ctx agent wait` reports how each ended.

use std::fs;
use std::path::Path;
use std::process::{Command, Output};

use tests::served::Served;

fn text(o: &Output) -> String {
    tests::shown(o)
}

fn ctx(args: &[&str]) -> Output {
    Command::new(tests::bin("ctx")).args(args).output().unwrap()
}

#[test]
fn the_seeds_agent_create_request_is_taken_as_written_from_a_sandbox() {
    let s = Served::start();
    let st = s.storage.to_str().unwrap().to_owned();
    assert!(ctx(&["bootstrap", &st]).status.success());
    let src = s.dir.path().join("project");
    fs::create_dir_all(&src).unwrap();
    let src = src.to_str().unwrap();
    let out = ctx(&[
        "agent",
        "new",
        "seeder",
        "--uid",
        "1100",
        "--gid",
        "1100",
        "--tool",
        "agent.create",
        "--tool",
        "fs.read",
        "--model",
        "openai/gpt-5",
        "--shared",
        "project-a:read",
        "--mount",
        src,
        "/data",
        "ro",
        "--source",
        &st,
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let policy = s.storage.join("agent/seeder.d/policy");
    let mut p = fs::read_to_string(&policy).unwrap();
    p.push_str("allow seeder_t agent:scout create\n");
    fs::write(&policy, p).unwrap();
    fs::write(s.storage.join("tool/agent.create.d/policy"), "allow seeder_t tool:agent.create execute\n")
        .unwrap();
    let work = s.dir.path().join("work");
    fs::create_dir_all(&work).unwrap();
    rustix::fs::chown(&work, Some(rustix::fs::Uid::from_raw(1100)), Some(rustix::fs::Gid::from_raw(1100)))
        .unwrap();
    // The request exactly as the seed spells it.
    let request = format!(
        r#"{{"name":"scout","label":"scout_t","model":["openai/gpt-5"],"tools":["fs.read"],"shared":{{"project-a":["read"]}},"mount":[["{src}","/data","ro"]]}}"#
    );
    let out = Command::new(tests::bin("ctx"))
        .args(["agent", "start", "seeder", "--session", &tests::unique("seed"), "--wait", "--ctx"])
        .arg(&s.mnt)
        .arg("--control")
        .arg(&s.control)
        .arg("--cwd")
        .arg(&work)
        .args(["--", "/ctx/bin/tsh", "agent.create", &request])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let control = |c: &str| fs::read_to_string(s.storage.join(format!("agent/scout.d/{c}"))).unwrap();
    assert_eq!(control("parent"), "seeder\n");
    assert_eq!(control("label"), "scout_t\n");
    assert_eq!(control("model"), "openai/gpt-5\n");
    assert_eq!(
        control("policy"),
        "allow scout_t tool:fs.read execute\nallow scout_t model:openai/gpt-5 use\n\
         allow scout_t shared:project-a read\nallow scout_t mount:/data read\n"
    );
    assert_eq!(control("mount"), format!("{src}\t/data\tro\tnosuid,nodev\n"));
    assert_eq!(control("uid"), "1100\n", "a child shares its parent's identity");
}

#[test]
fn agents_create_narrower_children_update_themselves_and_own_their_children() {
    let s = Served::start();
    let st = s.storage.to_str().unwrap().to_owned();
    assert!(ctx(&["bootstrap", &st]).status.success());
    let tools = ["agent.create", "agent.start", "agent.stop", "agent.update", "fs.stat"];
    let mut args = vec!["agent", "new", "chief", "--uid", "1000", "--gid", "1000", "--source", &st];
    for t in &tools {
        args.extend(["--tool", t]);
    }
    let out = ctx(&args);
    assert!(out.status.success(), "{}", text(&out));
    let policy = s.storage.join("agent/chief.d/policy");
    let mut p = fs::read_to_string(&policy).unwrap();
    for perm in ["create", "start", "stop"] {
        p.push_str(&format!("allow chief_t agent:worker {perm}\n"));
    }
    p.push_str("allow chief_t agent:wide create\nallow chief_t agent:twin create\n");
    fs::write(&policy, p).unwrap();
    for t in tools {
        fs::write(s.storage.join(format!("tool/{t}.d/policy")), format!("allow chief_t tool:{t} execute\n"))
            .unwrap();
    }
    let work = s.dir.path().join("work");
    fs::create_dir_all(&work).unwrap();
    rustix::fs::chown(&work, Some(rustix::fs::Uid::from_raw(1000)), Some(rustix::fs::Gid::from_raw(1000)))
        .unwrap();
    let session = tests::unique("b");
    let child_status = format!("/ctx/home/1000/agent/chief/session/{session}/context/child");
    let script = format!(
        r#"cd /workspace
t() {{ /ctx/bin/tsh "$@"; echo "$?" >> /workspace/codes; }}
t agent.create '{{"name":"worker","tools":["fs.stat"]}}' > narrow.out 2>&1
t agent.create '{{"name":"wide","tools":["shell.exec"],"mounts":[["/etc","/x","rw"]]}}' > wide.out 2>&1
t agent.create other > other.out 2>&1
t agent.create '{{"name":"twin","label":"chief_t"}}' > label.out 2>&1
echo "I am the chief now" | t agent.update system.md > upd.out 2>&1
t agent.update '{{"control":"policy","content":"allow chief_t agent:x create"}}' > upd-policy.out 2>&1
head -c 8193 /dev/zero | tr '\0' a | t agent.update prompt.template.md > upd-big.out 2>&1
python3 -c 'import socket,json
s=socket.socket(socket.AF_UNIX); s.connect("/run/cortexfs/receipt/main.sock")
s.sendall(json.dumps({{"op":"agent.update","input":{{"control":"system.md","content":"x","agent":"worker"}}}}).encode()+b"\n")
print(s.makefile().readline())' > raw.out 2>&1
python3 -c 'import socket,json
s=socket.socket(socket.AF_UNIX); s.connect("/run/cortexfs/receipt/main.sock")
s.sendall(json.dumps({{"op":"agent.start","input":{{"name":"worker","session":"../../../../tool"}}}}).encode()+b"\n")
print(s.makefile().readline())' > raw-session.out 2>&1
sh -c 'echo x > /ctx/agent/chief.d/system.md' 2> direct.out; echo "$?" >> /workspace/codes
t agent.start '{{"name":"worker","session":"ok","cmd":["/bin/sh","-c","echo child-answer-ok; echo {{}} > $CTX_HOME/agent/worker/session/ok/context/refs.jsonl; sleep 0.5"]}}' > s1.out 2>&1
t agent.start '{{"name":"worker","session":"bad","cmd":["/bin/sh","-c","sleep 0.5; exit 3"]}}' > s2.out 2>&1
for i in $(seq 100); do
  [ "$(cat {child_status}/worker.ok/status)" = done ] && [ "$(cat {child_status}/worker.bad/status)" = error ] && break
  sleep 0.1
done
t agent.start '{{"name":"worker","session":"long","handoff":"count sheep","cmd":["/bin/sleep","1000"]}}' > s3.out 2>&1
/ctx/bin/ctx agent new worker2 > via-ctx.out 2>&1; echo "$?" >> /workspace/codes
"#
    );
    let out = Command::new(tests::bin("ctx"))
        .args(["agent", "start", "chief", "--session", &session, "--wait", "--ctx"])
        .arg(&s.mnt)
        .arg("--control")
        .arg(&s.control)
        .arg("--cwd")
        .arg(&work)
        .args(["--", "/bin/sh", "-c", &script])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let read = |f: &str| fs::read_to_string(work.join(f)).unwrap_or_default();
    let codes: Vec<String> = read("codes").lines().map(str::to_owned).collect();
    assert_eq!(
        codes,
        ["0", "13", "13", "13", "0", "2", "2", "2", "0", "0", "0", "13"],
        "{codes:?}\n{}",
        read("wide.out")
    );

    // agent.create: a narrower child exists, with its parent; each widening has its reason.
    assert!(s.storage.join("agent/worker").exists());
    assert_eq!(fs::read_to_string(s.storage.join("agent/worker.d/parent")).unwrap(), "chief\n");
    let wide = read("wide.out");
    assert!(wide.contains("the parent does not hold tool:shell.exec execute"), "{wide}");
    assert!(wide.contains("not inside any parent mount"), "{wide}");
    assert!(!s.storage.join("agent/wide").exists());
    assert!(read("other.out").contains("does not hold agent:<child> create"), "{}", read("other.out"));
    assert!(read("label.out").contains("a label belongs to one agent"), "{}", read("label.out"));

    // agent.update: its own system.md only, at most 8 KiB, never as another agent.
    assert_eq!(
        fs::read_to_string(s.storage.join("agent/chief.d/system.md")).unwrap(),
        "I am the chief now\n"
    );
    assert!(read("raw.out").contains("EINVAL"), "{}", read("raw.out"));
    assert!(read("raw-session.out").contains("EINVAL: session"), "{}", read("raw-session.out"));
    assert!(read("direct.out").contains("Permission denied"), "{}", read("direct.out"));
    assert_ne!(fs::read_to_string(s.storage.join("agent/worker.d/system.md")).unwrap(), "x");
    let events =
        fs::read_to_string(s.storage.join(format!("home/1000/agent/chief/session/{session}/events.jsonl")))
            .unwrap();
    assert!(
        events.contains("\"type\":\"tool_call\"") && events.contains("\"type\":\"tool_result\""),
        "{events}"
    );
    assert!(events.contains("\"object\":\"tool/agent.create\""), "{events}");

    // Children: recorded, and the running one cancelled with its parent, history kept.
    let m = s.mnt.to_str().unwrap();
    let list = ctx(&["agent", "children", "chief", "--session", &session, "--ctx", m]);
    let list = String::from_utf8_lossy(&list.stdout).into_owned();
    assert!(list.contains("worker.ok\tworker\tok\tdone"), "{list}");
    assert!(list.contains("worker.bad\tworker\tbad\terror"), "{list}");
    assert!(list.contains("worker.long\tworker\tlong\tcancelled"), "{list}");
    let json = ctx(&["agent", "children", "chief", "--session", &session, "--ctx", m, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert!(
        v.as_array().unwrap().iter().any(|c| c["id"] == "worker.long" && c["status"] == "cancelled"),
        "{v}"
    );
    let wait = |c: &str| ctx(&["agent", "wait", "chief", c, "--session", &session, "--ctx", m]).status.code();
    assert_eq!((wait("worker.ok"), wait("worker.bad"), wait("worker.long")), (Some(0), Some(1), Some(130)));
    let left = Command::new("pgrep").args(["-f", "sleep 1000"]).output().unwrap();
    assert!(left.stdout.is_empty(), "the cancelled child left nothing: {}", text(&left));
    let child_session = s.storage.join("home/1000/agent/worker/session/long");
    assert!(Path::new(&child_session).join("state").exists(), "the child's history stays");
    let rec = s.storage.join(format!("home/1000/agent/chief/session/{session}/context/child/worker.long"));
    assert_eq!(fs::read_to_string(rec.join("handoff.md")).unwrap(), "count sheep");
    for f in ["agent", "session", "status", "result.md", "refs.jsonl"] {
        assert!(rec.join(f).exists(), "{f}");
    }
    assert!(rec.join("artifact").is_dir());
    // What a child produced lands in its record when it ends: its answer (here the end of its
    // terminal's output) and its references.
    let ok_rec = rec.with_file_name("worker.ok");
    let result = fs::read_to_string(ok_rec.join("result.md")).unwrap();
    assert!(result.contains("child-answer-ok"), "{result:?}");
    assert_eq!(fs::read_to_string(ok_rec.join("refs.jsonl")).unwrap().trim(), "{}");
    // `ctx agent new` inside a sandbox goes through agent.create (no grant for worker2: 13); an
    // agent without the lifecycle tools gets "service unavailable" (69).
    assert!(read("via-ctx.out").contains("agent:<child> create"), "{}", read("via-ctx.out"));
    assert!(!s.storage.join("agent/worker2").exists());
    let out = ctx(&["agent", "new", "plain", "--uid", "1000", "--gid", "1000", "--source", &st]);
    assert!(out.status.success(), "{}", text(&out));
    let out = Command::new(tests::bin("ctx"))
        .args(["agent", "start", "plain", "--session", &session, "--wait", "--ctx"])
        .arg(&s.mnt)
        .arg("--control")
        .arg(&s.control)
        .arg("--cwd")
        .arg(&work)
        .args([
            "--",
            "/bin/sh",
            "-c",
            "/ctx/bin/ctx agent new x 2> /workspace/plain.err; echo $? > /workspace/plain; python3 -c 'import socket,json
s=socket.socket(socket.AF_UNIX); s.connect(\"/run/cortexfs/receipt/main.sock\")
s.sendall(json.dumps({\"op\":\"agent.update\",\"input\":{\"control\":\"system.md\",\"content\":\"x\"}}).encode()+b\"\\n\")
print(s.makefile().readline())' > /workspace/plain.raw",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(read("plain"), "69\n", "{}", read("plain.err"));
    assert!(read("plain.err").contains("service unavailable"), "{}", read("plain.err"));
    // The receipt socket checks both policies itself: going around tsh grants nothing.
    assert!(read("plain.raw").contains("\"code\":13"), "{}", read("plain.raw"));
    assert_ne!(fs::read_to_string(s.storage.join("agent/plain.d/system.md")).unwrap(), "x");
    let state =
        fs::read_to_string(s.storage.join(format!("home/1000/agent/chief/session/{session}/state"))).unwrap();
    assert_eq!(state, "done\n");
}

#[test]
fn context_packs_are_checked_and_latest_is_rebuilt_from_messages() {
    use sha2::Digest;
    let s = Served::start();
    let st = s.storage.to_str().unwrap().to_owned();
    assert!(
        ctx(&["agent", "new", "packer", "--uid", "0", "--gid", "0", "--allow-root", "--source", &st])
            .status
            .success()
    );
    let d = s.p("home/0/agent/packer/session/p1");
    fs::create_dir_all(d.join("context/child/w.s2")).unwrap();
    let answer = r#"{"role":"assistant","content":"the answer"}"#;
    let mut f = fs::OpenOptions::new().append(true).create(true).open(d.join("messages.jsonl")).unwrap();
    std::io::Write::write_all(
        &mut f,
        format!("{{\"role\":\"user\",\"content\":\"hi\"}}\n{answer}\n").as_bytes(),
    )
    .unwrap();
    drop(f);
    let sha = hex::encode(sha2::Sha256::digest(answer.as_bytes()));
    let pack = |sha: &str| {
        format!(
            r#"{{"schema":"cortexfs.context-pack/v1","agent":"packer","session":"p1","items":[
            {{"kind":"message","source":"messages.jsonl#2","sha256":"{sha}"}},
            {{"kind":"child","source":"context/child/w.s2"}},
            {{"kind":"note","source":"runtime","text":"keep going"}}]}}"#
        )
    };
    fs::write(d.join("context/pack.json"), pack(&sha)).unwrap();
    let m = s.mnt.to_str().unwrap();
    let check = || ctx(&["agent", "pack", "packer", "--check", "--session", "p1", "--ctx", m]);
    let out = check();
    assert_eq!(out.status.code(), Some(2), "pack.md missing: {}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("pack.md is missing"), "{}", text(&out));
    fs::write(d.join("context/pack.md"), "# working set\n").unwrap();
    let out = check();
    assert!(out.status.success(), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("ok: 3 items"), "{}", text(&out));
    fs::write(d.join("context/pack.json"), pack(&"0".repeat(64))).unwrap();
    let out = check();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("does not match its sha256"), "{}", text(&out));

    let out = ctx(&["agent", "output", "packer", "--rebuild", "--session", "p1", "--ctx", m]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(fs::read_to_string(d.join("latest.md")).unwrap(), "the answer\n");
    let out = ctx(&["agent", "history", "packer", "--session", "p1", "--ctx", m]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 2);
    let out = ctx(&["agent", "history", "packer", "--session", "p1", "--ctx", m, "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v.as_array().map(Vec::len), Some(2), "{v}");
}
