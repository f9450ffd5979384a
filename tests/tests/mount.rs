//! `ctx mount` for real: the root ABI, status and bin, objects and controls, session logs through
//! group commit, POSIX data in home/, extended attributes, refusals as root and as `nobody`,
//! clean stop on SIGTERM and recovery of a dead mount.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use rustix::process::{Pid, Signal, kill_process};

use tests::served::{Served, errno};

fn install_hello(s: &Served) {
    let out = Command::new(tests::bin("ctx"))
        .args(["object", "install", "--source", s.storage.to_str().unwrap()])
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/objects/hello/hello.manifest.json"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn root_abi_status_and_bin() {
    let mut s = Served::start();
    let mut names: Vec<String> =
        fs::read_dir(&s.mnt).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["agent", "bin", "home", "model", "shared", "status", "tool"]);
    assert_eq!(errno(fs::create_dir(s.p("mcp"))), libc::EROFS);
    assert_eq!(errno(fs::write(s.p("audit"), b"x")), libc::EROFS);
    assert_eq!(errno(fs::remove_dir(s.p("tool"))), libc::EROFS);
    let status = fs::read_to_string(s.p("status")).unwrap();
    assert!(status.starts_with(&format!("version {}\n", env!("CARGO_PKG_VERSION"))), "{status}");
    assert!(status.contains("requests ") && status.contains("op.lookup "), "{status}");
    assert_eq!(errno(fs::write(s.p("status"), b"x")), libc::EACCES);
    let out = Command::new(s.p("bin/ctx")).arg("--version").output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), format!("ctx {}", env!("CARGO_PKG_VERSION")));
    assert_eq!(errno(fs::write(s.p("bin/ctx"), b"x")), libc::EACCES);
    assert_eq!(s.stop(), Some(0), "SIGTERM stops it cleanly");
    assert!(fs::read_dir(&s.mnt).unwrap().next().is_none(), "unmounted");
}

#[test]
fn objects_and_controls() {
    let s = Served::start();
    install_hello(&s);
    // Residue and staging never show.
    fs::create_dir(s.storage.join("tool/ghost.d")).unwrap();
    fs::create_dir(s.storage.join("tool/.cortexfs-stage.x.1.2")).unwrap();
    std::thread::sleep(Duration::from_millis(1100)); // entry timeout of storage listings
    let mut names: Vec<String> =
        fs::read_dir(s.p("tool")).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["hello", "hello.d"]);
    let out = Command::new(s.p("tool/hello")).arg("world").output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello, world\n", "the kernel execs through the mount");
    assert_eq!(errno(fs::OpenOptions::new().write(true).open(s.p("tool/hello"))), libc::EPERM);
    assert_eq!(errno(fs::write(s.p("tool/new"), b"x")), libc::EPERM);

    // A valid policy replaces the old one; an invalid one fails and the old stays.
    let policy = s.p("tool/hello.d/policy");
    fs::write(&policy, b"allow coder_t tool:hello execute\nallow reviewer_t tool:hello execute\n").unwrap();
    assert_eq!(
        fs::read(&policy).unwrap(),
        b"allow coder_t tool:hello execute\nallow reviewer_t tool:hello execute\n"
    );
    assert_eq!(errno(fs::write(&policy, b"allow coder_t agent:* create\n")), libc::EINVAL);
    // `.d/program` is a JSON Schema, checked as one when written.
    let program = s.p("tool/hello.d/program");
    fs::write(&program, br#"{"type":"object","properties":{"n":{"type":"integer"}}}"#).unwrap();
    // A control is checked whole when it is closed: dd reports errors from close.
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("printf '{{\"type\":\"integr\"}}' | dd of={} status=none", program.display()))
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("Invalid argument"), "{out:?}");
    assert_eq!(fs::read(&program).unwrap(), br#"{"type":"object","properties":{"n":{"type":"integer"}}}"#);
    // Without a trailing newline the last line is checked when the file is closed.
    // dd reports errors from close.
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("printf 'allow coder_t network:foo connect' | dd of={} status=none", policy.display()))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Invalid argument"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(fs::read_to_string(&policy).unwrap().contains("reviewer_t"), "old policy kept");
    // Writes must start at 0 and stay under 64 KiB.
    let f = fs::OpenOptions::new().write(true).open(s.p("tool/hello.d/description")).unwrap();
    assert_eq!(errno(std::os::unix::fs::FileExt::write_at(&f, b"x", 5)), libc::EINVAL);
    drop(f);
    assert_eq!(errno(fs::write(s.p("tool/hello.d/description"), vec![b'a'; 65 * 1024])), libc::EFBIG);
    // Runtime controls are read-only; unknown controls cannot be created or renamed into.
    assert_eq!(errno(fs::write(s.p("tool/hello.d/status"), b"ok")), libc::EACCES);
    assert_eq!(errno(fs::write(s.p("tool/hello.d/bogus"), b"x")), libc::EPERM);
    assert_eq!(errno(fs::rename(&policy, s.p("tool/hello.d/bogus"))), libc::EPERM);
    assert_eq!(errno(fs::remove_file(&policy)), libc::EPERM);
    // Extended attributes say what things are; setting fails.
    assert_eq!(xattr(&s.p("tool/hello")), "object");
    assert_eq!(xattr(&policy), "control");
    assert_eq!(xattr(&s.p("tool/hello.d/status")), "runtime-control");
    assert_eq!(xattr(&s.p("status")), "status");
    let c = std::ffi::CString::new(policy.to_str().unwrap()).unwrap();
    let set = rustix::fs::setxattr(c.as_c_str(), "user.cortexfs.kind", b"x", rustix::fs::XattrFlags::empty());
    assert_eq!(set.err().map(|e| e.raw_os_error()), Some(libc::EPERM));
}

fn xattr(p: &Path) -> String {
    let mut buf = [0u8; 64];
    let n = rustix::fs::getxattr(p, "user.cortexfs.kind", &mut buf).unwrap();
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[test]
fn session_logs_take_whole_lines_at_the_end_durably() {
    let s = Served::start();
    let dir = s.p("home/0/agent/coder/session/default");
    fs::create_dir_all(&dir).unwrap();
    let m = dir.join("messages.jsonl");
    let mut f = fs::OpenOptions::new().append(true).create(true).open(&m).unwrap();
    f.write_all(b"{\"role\":\"user\",\"text\":\"hi\"}\n").unwrap();
    // Durable when the write returns: the storage file and its commit evidence hold it.
    let backing = s.storage.join("home/0/agent/coder/session/default/messages.jsonl");
    let (mark, torn) = ringfs::log::verify(&backing).unwrap();
    assert_eq!((mark.end, torn), (28, 0));
    assert_eq!(errno(f.write_all(b"not json\n")), libc::EINVAL);
    assert_eq!(errno(f.write_all(b"{\"partial\":")), libc::EINVAL);
    f.write_all(b"{\"role\":\"agent\",\"text\":\"hello\"}\n{\"role\":\"user\",\"text\":\"bye\"}\n").unwrap();
    drop(f);
    let text = fs::read_to_string(&m).unwrap();
    assert_eq!(text.lines().count(), 3, "{text}");
    // Overwrites and truncation fail.
    let f = fs::OpenOptions::new().write(true).open(&m).unwrap();
    assert_eq!(errno(std::os::unix::fs::FileExt::write_at(&f, b"{}\n", 0)), libc::EINVAL);
    assert_eq!(errno(f.set_len(0)), libc::EPERM);
    assert_eq!(errno(fs::OpenOptions::new().write(true).truncate(true).open(&m)), libc::EPERM);
    assert_eq!(xattr(&m), "session-log");
    assert_eq!(fs::read_to_string(&m).unwrap(), text, "nothing changed");
}

#[test]
fn home_data_is_posix_and_owned_by_the_caller() {
    let s = Served::start();
    fs::create_dir_all(s.storage.join("home/65534")).unwrap();
    rustix::fs::chown(
        s.storage.join("home/65534"),
        Some(rustix::fs::Uid::from_raw(65534)),
        Some(rustix::fs::Gid::from_raw(65534)),
    )
    .unwrap();
    let home = s.p("home/65534");
    // As nobody: create, write, rename, link, mkdir, unlink; files belong to nobody.
    let script = format!(
        "set -e; cd {h}; echo one > a; echo two >> a; mv a b; ln b c; mkdir d; mv b d/e; \
         test \"$(cat d/e)\" = \"one\ntwo\"; rm c; (set -C; echo x > d/e) 2>/dev/null && exit 9; \
         echo ok > /{m}/home/65534/d/f; cat d/f",
        h = home.display(),
        m = s.mnt.strip_prefix("/").unwrap().display()
    );
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--", "sh", "-c", &script])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ok\n");
    let meta = fs::metadata(s.storage.join("home/65534/d/f")).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (65534, 65534), "new files belong to the caller");
    // nobody cannot write root's controls or another home.
    install_hello(&s);
    fs::create_dir_all(s.storage.join("home/0")).unwrap();
    let deny = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--", "sh", "-c"])
        .arg(format!(
            "echo 'allow x_t tool:hello execute' > {}; echo hi > {}/home/0/x",
            s.p("tool/hello.d/policy").display(),
            s.mnt.display()
        ))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&deny.stderr);
    assert!(err.matches("Permission denied").count() == 2, "{err}");
    // O_EXCL on an existing file.
    fs::write(s.p("home/65534/d/g"), b"").unwrap();
    assert_eq!(
        errno(fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(s.p("home/65534/d/g"))),
        libc::EEXIST
    );
}

#[test]
fn refuses_a_non_empty_mount_point_and_recovers_a_dead_mount() {
    let mut s = Served::start();
    // kill -9 leaves a dead mount behind.
    let mut c = s.child.take().unwrap();
    kill_process(Pid::from_raw(c.id() as i32).unwrap(), Signal::KILL).unwrap();
    c.wait().unwrap();
    // Over io_uring the kernel tears the rings down after the process is gone, and a request
    // caught in that ends with ECONNABORTED; ENOTCONN after.
    let e = errno(fs::metadata(s.p("status")));
    assert!([libc::ENOTCONN, libc::ECONNABORTED, libc::ECANCELED].contains(&e), "a dead mount, not {e}");
    s.spawn();
    assert!(fs::read_to_string(s.p("status")).unwrap().starts_with("version"), "dead mount recovered");
    s.stop();
    let full = tempfile::tempdir().unwrap();
    fs::write(full.path().join("keep"), b"x").unwrap();
    let out = Command::new(tests::bin("ctx"))
        .args(["mount", "--source", s.storage.to_str().unwrap(), full.path().to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not empty"));
}

pub(crate) fn ctx(args: &[&str]) -> std::process::Output {
    Command::new(tests::bin("ctx")).args(args).output().unwrap()
}

pub(crate) fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    v.sort();
    v
}

/// Writes an object straight into storage (an executable and its controls).
pub(crate) fn object(storage: &Path, class: &str, name: &str, controls: &[(&str, &str)]) {
    let dir = storage.join(class);
    fs::create_dir_all(dir.join(format!("{name}.d"))).unwrap();
    fs::write(dir.join(name), b"#!/bin/sh\necho ok\n").unwrap();
    fs::set_permissions(dir.join(name), fs::Permissions::from_mode(0o755)).unwrap();
    for (c, body) in controls {
        fs::write(dir.join(format!("{name}.d")).join(c), body).unwrap();
    }
}

#[test]
fn agent_views_show_only_what_the_agent_may_use() {
    let s = Served::start();
    let st = &s.storage;
    object(
        st,
        "agent",
        "coder",
        &[
            ("label", "coder_t\n"),
            ("uid", "1000\n"),
            (
                "policy",
                "allow coder_t tool:hello execute\nallow coder_t tool:mine execute\nallow coder_t shared:proj read\n",
            ),
        ],
    );
    object(st, "agent", "other", &[("label", "other_t\n"), ("uid", "2000\n"), ("policy", "")]);
    object(st, "tool", "hello", &[("policy", "allow coder_t tool:hello execute\n")]);
    object(st, "tool", "hidden", &[("policy", "allow coder_t tool:hidden execute\n")]);
    object(st, "tool", "mine", &[("policy", "allow someone_t tool:mine execute\n")]);
    for d in ["home/1000", "home/2000", "shared/proj/data", "shared/secret"] {
        fs::create_dir_all(st.join(d)).unwrap();
    }
    let control = s.control.to_str().unwrap();
    let v1 = s.dir.path().join("v1");
    let out = ctx(&[
        "view",
        "create",
        "--agent",
        "coder",
        "--session",
        "s1",
        "--path",
        v1.to_str().unwrap(),
        "--control",
        control,
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), v1.to_str().unwrap());
    let v2 = s.dir.path().join("v2");
    assert!(
        ctx(&["view", "create", "--agent", "other", "--path", v2.to_str().unwrap(), "--control", control])
            .status
            .success()
    );

    assert_eq!(names(&v1), ["agent", "bin", "home", "model", "shared", "status", "tool"]);
    // Both policies must allow a tool; anything else does not exist in the view.
    // `mine` is granted by the agent's policy but not its own: its controls are visible (so
    // the refusal can be explained), its executable is not.
    assert_eq!(names(&v1.join("tool")), ["hello", "hello.d", "mine.d"]);
    assert_eq!(errno(fs::metadata(v1.join("tool/hidden"))), libc::ENOENT);
    assert_eq!(errno(fs::metadata(v1.join("tool/hidden.d/policy"))), libc::ENOENT);
    assert_eq!(errno(fs::metadata(v1.join("tool/mine"))), libc::ENOENT);
    assert!(fs::read_to_string(v1.join("tool/mine.d/policy")).unwrap().contains("someone_t"));
    assert_eq!(names(&v1.join("agent")), ["coder", "coder.d"]);
    assert_eq!(names(&v1.join("home")), ["1000"], "another agent's home is invisible");
    assert_eq!(names(&v1.join("shared")), ["proj"]);
    assert_eq!(errno(fs::write(v1.join("shared/proj/data/x"), b"x")), libc::EACCES, "read grant only");
    assert!(names(&v2.join("tool")).is_empty());

    // A policy change takes effect in the live view.
    fs::write(st.join("agent/coder.d/policy"), "allow coder_t tool:hello execute\nallow coder_t tool:hidden execute\nallow coder_t shared:proj write\n").unwrap();
    assert_eq!(names(&v1.join("tool")), ["hello", "hello.d", "hidden", "hidden.d"]);
    fs::write(v1.join("shared/proj/data/x"), b"x").unwrap();
    fs::write(st.join("tool/hello.d/policy"), "").unwrap();
    // The tool's own policy counts too; its controls stay visible (the agent's policy grants
    // it), so a refusal can be explained.
    assert_eq!(names(&v1.join("tool")), ["hello.d", "hidden", "hidden.d"]);
    assert_eq!(errno(fs::metadata(v1.join("tool/hello"))), libc::ENOENT);

    // Mode bits still decide inside a view: nobody can read what the view shows but cannot
    // write root's files, even where the agent's policy grants write.
    let as_nobody = |script: String| {
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--", "sh", "-c", &script])
            .output()
            .unwrap()
    };
    let out = as_nobody(format!("cat {}/tool/hidden.d/policy", v1.display()));
    assert!(String::from_utf8_lossy(&out.stdout).contains("tool:hidden"), "{out:?}");
    let out = as_nobody(format!("echo x > {}/shared/proj/data/y", v1.display()));
    assert!(String::from_utf8_lossy(&out.stderr).contains("Permission denied"), "{out:?}");
    let out = as_nobody(format!("ls {}/home/2000", v1.display()));
    assert!(String::from_utf8_lossy(&out.stderr).contains("No such file"), "{out:?}");

    // Default view paths live under the daemon's runtime directory (its control socket's), in
    // view/, which only root may walk.
    let session = tests::unique("t");
    let out = ctx(&["view", "create", "--agent", "coder", "--session", &session, "--control", control]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let default_path = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert_eq!(Path::new(&default_path), s.view_dir("coder", &session));
    let mode = fs::metadata(s.rt().join("view")).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o711, "passed through, never listed");
    let own = fs::metadata(s.rt().join("view/coder")).unwrap();
    assert_eq!((own.permissions().mode() & 0o777, own.uid()), (0o700, 1000), "the agent's own");
    assert!(ctx(&["view", "rm", &default_path, "--control", control]).status.success());

    // The host status counts views; ls lists them; removing one leaves the other.
    assert!(fs::read_to_string(s.p("status")).unwrap().contains("views 2\n"));
    let ls = ctx(&["view", "ls", "--control", control]);
    assert_eq!(String::from_utf8_lossy(&ls.stdout).lines().count(), 3, "a header and two views");
    assert!(ctx(&["view", "rm", v2.to_str().unwrap(), "--control", control]).status.success());
    assert!(fs::read_dir(&v2).unwrap().next().is_none(), "v2 unmounted");
    assert_eq!(names(&v1.join("tool")), ["hello.d", "hidden", "hidden.d"], "v1 undisturbed");

    // A view whose agent is deleted becomes empty and refuses.
    fs::remove_file(st.join("agent/coder")).unwrap();
    assert!(names(&v1).is_empty());
    assert_eq!(errno(fs::metadata(v1.join("tool"))), libc::ENOENT);

    // The control socket serves root only.
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(tests::bin("ctx"))
        .args(["view", "ls", "--control", control])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(13), "{}", String::from_utf8_lossy(&out.stderr));
}

/// The host view's `home/` and `shared/` are served by a data connection with zero-message
/// open: the kernel keeps a data file's pages across opens, and a directory's listing while
/// unchanged (CACHE_DIR). A change made in storage directly shows when the attributes time out
/// (`--cache-timeout`, 1 s by default) and the changed modification time drops the pages.
#[test]
fn kept_caches_drop_when_storage_changes_behind_the_mount() {
    let s = Served::start();
    fs::create_dir_all(s.storage.join("home/0/c")).unwrap();
    let (file, backing) = (s.p("home/0/c/f"), s.storage.join("home/0/c/f"));
    fs::write(&file, b"one").unwrap();
    for _ in 0..3 {
        assert_eq!(fs::read(&file).unwrap(), b"one", "cached and kept");
    }
    // Three cached opens, reads and closes send nothing: between two reads of `status`, the
    // counters move exactly as much as between two reads of `status` alone.
    let status = || fs::read_to_string(s.p("status")).unwrap();
    let count = |st: &str, op: &str| -> u64 {
        st.lines().find_map(|l| l.strip_prefix(&format!("op.{op} "))?.parse().ok()).unwrap()
    };
    let (s0, s1) = (status(), status());
    for _ in 0..3 {
        assert_eq!(fs::read(&file).unwrap(), b"one");
    }
    let s2 = status();
    for op in ["open", "read", "flush", "release"] {
        assert_eq!(count(&s2, op) - count(&s1, op), count(&s1, op) - count(&s0, op), "{op}");
    }
    // Same size, new contents, written behind the mount.
    fs::write(&backing, b"two").unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(fs::read(&file).unwrap(), b"two", "the attribute timeout drops the kept pages");
    fs::write(&file, b"three").unwrap();
    assert_eq!(fs::read(&file).unwrap(), b"three", "writes through the mount are seen at once");

    let list = |d: &Path| {
        let mut n: Vec<String> =
            fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        n.sort();
        n
    };
    let dir = s.p("home/0/c");
    for _ in 0..3 {
        assert_eq!(list(&dir), ["f"]);
    }
    fs::write(s.storage.join("home/0/c/g"), b"").unwrap();
    assert_eq!(list(&dir), ["f", "g"], "the next opendir drops the kept listing");
    fs::write(s.p("home/0/c/h"), b"").unwrap();
    assert_eq!(list(&dir), ["f", "g", "h"], "creates through the mount are listed at once");
    fs::remove_file(s.storage.join("home/0/c/g")).unwrap();
    assert_eq!(list(&dir), ["f", "h"]);
}

/// An agent view's kernel keeps entries (`--cache-timeout`) and drops them all whenever what
/// the view shows may change: a control published through the daemon, or a change to the
/// objects made in storage directly (seen through inotify).
#[test]
fn view_entries_are_dropped_when_a_policy_changes() {
    // Entries kept far longer than the test waits: only their being dropped can pass it.
    let s = Served::start_with(&["--cache-timeout", "60"]);
    let st = &s.storage;
    object(
        st,
        "agent",
        "coder",
        &[
            ("label", "coder_t\n"),
            ("uid", "0\n"),
            ("policy", "allow coder_t tool:hello execute\nallow coder_t tool:other execute\n"),
        ],
    );
    object(st, "tool", "hello", &[("policy", "allow coder_t tool:hello execute\n")]);
    object(st, "tool", "other", &[("policy", "allow coder_t tool:other execute\n")]);
    let v = s.dir.path().join("v");
    s.view("coder", "s1", &v);
    let gone_soon = |p: &Path, what: &str| {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while fs::metadata(p).is_ok() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
        assert_eq!(errno(fs::metadata(p)), libc::ENOENT, "{what}");
    };

    // Cached: a second stat sends nothing.
    assert!(fs::metadata(v.join("tool/hello")).is_ok());
    let lookups =
        |st: &str| -> u64 { st.lines().find_map(|l| l.strip_prefix("op.lookup ")?.parse().ok()).unwrap() };
    let before = lookups(&fs::read_to_string(v.join("status")).unwrap());
    assert!(fs::metadata(v.join("tool/hello")).is_ok());
    assert_eq!(lookups(&fs::read_to_string(v.join("status")).unwrap()), before + 1, "only status looked up");

    // Revoked in storage directly: the watch drops the entry.
    fs::write(st.join("tool/hello.d/policy"), "").unwrap();
    gone_soon(&v.join("tool/hello"), "a tool's policy emptied in storage");

    // Revoked through the host mount: the published control drops the entry.
    assert!(fs::metadata(v.join("tool/other")).is_ok());
    fs::write(s.p("agent/coder.d/policy"), "allow coder_t tool:hello execute\n").unwrap();
    gone_soon(&v.join("tool/other"), "the agent's policy rewritten through the mount");
}

/// A write through an agent view drops the pages the host's data connection keeps, long before
/// the attributes time out.
#[test]
fn a_view_write_drops_the_hosts_kept_pages() {
    // Attributes kept far longer than the test waits: only the pages being dropped can pass it.
    let s = Served::start_with(&["--cache-timeout", "60"]);
    object(
        &s.storage,
        "agent",
        "coder",
        &[("label", "coder_t\n"), ("uid", "0\n"), ("policy", "allow coder_t shared:proj write\n")],
    );
    fs::create_dir_all(s.storage.join("shared/proj")).unwrap();
    let shared = s.p("shared/proj/f");
    fs::write(&shared, b"host").unwrap();
    for _ in 0..3 {
        assert_eq!(fs::read(&shared).unwrap(), b"host");
    }
    let view = s.dir.path().join("v");
    s.view("coder", "s1", &view);
    // Same size: nothing but the drop can make the host read again.
    fs::write(view.join("shared/proj/f"), b"view").unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while fs::read(&shared).unwrap() != b"view" && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(fs::read(&shared).unwrap(), b"view", "the view's write reaches the host's reader");
}

/// `df` on the mount showed 0 blocks and 0 free (statfs was not answered), so every program
/// that checks for free space saw a full disk.
#[test]
fn df_on_home_and_shared_shows_the_storages_space() {
    let s = Served::start();
    fs::create_dir_all(s.storage.join("shared/p")).unwrap();
    let storage = rustix::fs::statvfs(&s.storage).unwrap();
    assert!(storage.f_blocks > 0);
    for dir in ["", "home", "shared/p"] {
        let seen = rustix::fs::statvfs(s.mnt.join(dir)).unwrap();
        assert_eq!(
            (seen.f_blocks, seen.f_frsize, seen.f_files),
            (storage.f_blocks, storage.f_frsize, storage.f_files),
            "{dir}"
        );
        let near = |a: u64, b: u64| a.abs_diff(b) <= b / 100 + 64;
        assert!(near(seen.f_bavail, storage.f_bavail) && near(seen.f_bfree, storage.f_bfree), "{dir}");
        assert_eq!(seen.f_namemax, storage.f_namemax);
    }
    let df = Command::new("df").arg("-P").arg(s.mnt.join("home")).output().unwrap();
    let line = String::from_utf8_lossy(&df.stdout).lines().nth(1).unwrap_or_default().to_owned();
    let blocks: u64 = line.split_whitespace().nth(1).and_then(|b| b.parse().ok()).unwrap_or(0);
    assert!(df.status.success() && blocks > 0, "{line}");
}

/// Every setxattr on data answered EPERM, so `cp -a` into `home/` exited 1 and `mv` between
/// `home/` and `shared/` complained.
#[test]
fn extended_attributes_on_data_behave_as_on_the_backing_filesystem() {
    use rustix::fs::XattrFlags;
    let s = Served::start();
    fs::create_dir_all(s.storage.join("shared/p")).unwrap();
    let home = s.mnt.join("home/0");
    fs::create_dir_all(&home).unwrap();
    let f = home.join("f");
    fs::write(&f, "data\n").unwrap();
    rustix::fs::setxattr(&f, "user.note", b"kept", XattrFlags::empty()).unwrap();
    let mut buf = [0u8; 64];
    let n = rustix::fs::getxattr(&f, "user.note", &mut buf).unwrap();
    assert_eq!(&buf[..n], b"kept");
    let mut names = [0u8; 256];
    let n = rustix::fs::listxattr(&f, &mut names).unwrap();
    let listed = String::from_utf8_lossy(&names[..n]).replace('\0', " ");
    // CortexFS's own marker is read by name, not listed: a copy elsewhere does not carry it.
    assert!(listed.contains("user.note") && !listed.contains("user.cortexfs.kind"), "{listed}");
    let n = rustix::fs::getxattr(&f, "user.cortexfs.kind", &mut buf).unwrap();
    assert_eq!(&buf[..n], b"data");
    // What the backing file holds is what was set.
    let n = rustix::fs::getxattr(s.storage.join("home/0/f"), "user.note", &mut buf).unwrap();
    assert_eq!(&buf[..n], b"kept");
    // CortexFS's own attribute stays its own (ACLs: `posix_acls_round_trip_...`).
    let own = rustix::fs::setxattr(&f, "user.cortexfs.kind", b"object", XattrFlags::empty());
    assert_eq!(own.err().map(|e| e.raw_os_error()), Some(libc::EPERM));
    // cp -a and mv across home/ and shared/ keep the attribute, and say nothing.
    let cp = Command::new("cp").arg("-a").arg(&f).arg(home.join("g")).output().unwrap();
    assert!(cp.status.success() && cp.stderr.is_empty(), "{}", tests::shown(&cp));
    let n = rustix::fs::getxattr(home.join("g"), "user.note", &mut buf).unwrap();
    assert_eq!(&buf[..n], b"kept");
    let mv = Command::new("mv").arg(home.join("g")).arg(s.mnt.join("shared/p/g")).output().unwrap();
    assert!(mv.status.success() && mv.stderr.is_empty(), "{}", tests::shown(&mv));
    rustix::fs::removexattr(&f, "user.note").unwrap();
    assert_eq!(
        rustix::fs::getxattr(&f, "user.note", &mut buf).err().map(|e| e.raw_os_error()),
        Some(libc::ENODATA)
    );
}

/// Installs `ctx` as mount(8)'s helper of the type `fuse.cortexfs`, replacing any in one
/// rename (tests that run at once each install it, none ever sees it missing).
fn mount_helper() -> &'static Path {
    let helper = Path::new("/usr/sbin/mount.fuse.cortexfs");
    let tmp = format!("/usr/sbin/.mount.fuse.cortexfs.{}", tests::unique("h"));
    std::os::unix::fs::symlink(tests::bin("ctx"), &tmp).unwrap();
    fs::rename(&tmp, helper).unwrap();
    helper
}

/// `ctx mount` could not be used from mount(8) or /etc/fstab, and every instance was named
/// `cortexfs`: a harness that mounted its own instance could not find it.
#[test]
fn mount_8_mounts_a_storage_by_type_and_from_an_fstab_line() {
    // Installed as mount(8) looks for the helper of the type fuse.cortexfs.
    let helper = mount_helper();
    let d = tempfile::tempdir().unwrap();
    let (storage, mnt) = (d.path().join("storage"), d.path().join("mnt"));
    fs::create_dir_all(&mnt).unwrap();
    let mounted = |want: bool| {
        let t = std::time::Instant::now();
        loop {
            let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
            let line =
                info.lines().find(|l| l.split(' ').nth(4) == Some(mnt.to_str().unwrap())).map(str::to_owned);
            if line.is_some() == want || t.elapsed() > Duration::from_secs(10) {
                return line;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let control = d.path().join("control.sock");
    let o = Command::new("mount")
        .args(["-t", "fuse.cortexfs"])
        .arg(&storage)
        .arg(&mnt)
        .arg("-o")
        .arg(format!("cache_timeout=5,nofail,control={}", control.display()))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", tests::shown(&o));
    let line = mounted(true).unwrap();
    let fields: Vec<&str> = line.split(" - ").nth(1).unwrap().split(' ').collect();
    assert_eq!(&fields[..2], ["fuse.cortexfs", storage.to_str().unwrap()], "{line}");
    let status = fs::read_to_string(mnt.join("status")).unwrap();
    assert!(status.contains(&format!("storage {}", storage.display())), "{status}");
    // Unmounted from outside, the daemon stops (its control socket goes with it).
    let o = Command::new("umount").arg("-R").arg(&mnt).output().unwrap();
    assert!(o.status.success(), "{}", tests::shown(&o));
    assert!(mounted(false).is_none());
    let t = std::time::Instant::now();
    while control.exists() && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!control.exists(), "the daemon stopped");
    // An fstab line, and options the helper does not know.
    let fstab = d.path().join("fstab");
    fs::write(
        &fstab,
        format!(
            "{} {} fuse.cortexfs defaults,control={} 0 0\n",
            storage.display(),
            mnt.display(),
            control.display()
        ),
    )
    .unwrap();
    let o = Command::new("mount").arg("-T").arg(&fstab).arg(&mnt).output().unwrap();
    assert!(o.status.success(), "{}", tests::shown(&o));
    assert!(mounted(true).is_some());
    assert!(Command::new("umount").arg("-R").arg(&mnt).status().unwrap().success());
    assert!(mounted(false).is_none());
    let o = Command::new(helper).arg(&storage).arg(&mnt).args(["-o", "bogus"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", tests::shown(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("-o bogus: not an option of cortexfs"));
}

/// `ctx view create --agent nosuch` made a view of nobody's authority.
#[test]
fn a_view_of_an_agent_that_does_not_exist_is_refused() {
    let s = Served::start();
    let control = s.control.to_str().unwrap();
    let out = ctx(&[
        "view",
        "create",
        "--agent",
        "nosuch",
        "--path",
        s.dir.path().join("v").to_str().unwrap(),
        "--control",
        control,
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", tests::shown(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no agent nosuch"), "{}", tests::shown(&out));
    assert!(!is_mounted(&s.dir.path().join("v")));
}

fn is_mounted(p: &Path) -> bool {
    fs::read_to_string("/proc/self/mountinfo").unwrap().lines().any(|l| l.split(' ').nth(4) == p.to_str())
}

/// Under a service manager that asks (systemd's `Type=notify`), the daemon says when /ctx
/// answers and when it stops.
#[test]
fn the_daemon_tells_its_service_manager_when_it_is_ready_and_stopping() {
    let d = tempfile::tempdir().unwrap();
    let sock = d.path().join("notify");
    let manager = std::os::unix::net::UnixDatagram::bind(&sock).unwrap();
    manager.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let mnt = d.path().join("mnt");
    let mut daemon = Command::new(tests::bin("ctx"))
        .args(["mount", "--source"])
        .arg(d.path().join("storage"))
        .arg(&mnt)
        .arg("--control")
        .arg(d.path().join("control.sock"))
        .env("NOTIFY_SOCKET", &sock)
        .spawn()
        .unwrap();
    let mut buf = [0u8; 64];
    let n = manager.recv(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"READY=1");
    assert!(
        fs::read_to_string(mnt.join("status")).unwrap().contains("view host"),
        "ready means /ctx answers"
    );
    kill_process(Pid::from_child(&daemon), Signal::TERM).unwrap();
    let n = manager.recv(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"STOPPING=1");
    assert!(daemon.wait().unwrap().success());
}

/// `ctx path shared NAME` (as the spec's examples use it) and `ctx status`.
#[test]
fn ctx_path_names_places_and_ctx_status_reads_the_daemon() {
    let s = Served::start();
    let m = s.mnt.to_str().unwrap();
    let out = ctx(&["path", "shared", "project-a", "--ctx", m]);
    assert!(out.status.success(), "{}", tests::shown(&out));
    let p = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert_eq!(p, format!("{m}/shared/project-a"));
    fs::create_dir_all(Path::new(&p).join("input")).unwrap();
    assert!(s.storage.join("shared/project-a/input").is_dir());
    assert_eq!(ctx(&["path", "shared", "../etc", "--ctx", m]).status.code(), Some(2));
    let out = ctx(&["status", "--ctx", m, "--json"]);
    assert!(out.status.success(), "{}", tests::shown(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["storage"], s.storage.to_str().unwrap());
    assert_eq!(v["view"], "host");
    assert!(v["requests"].is_u64());
    let out = ctx(&["status", "--ctx", m]);
    assert!(
        String::from_utf8_lossy(&out.stdout).lines().any(|l| l.starts_with("storage ")),
        "{}",
        tests::shown(&out)
    );
    let out = ctx(&["status", "--ctx", s.dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(69), "{}", tests::shown(&out));
}

/// Seen as a lost result in the queue race through `/ctx`: a worker in an agent view held its
/// claim directory open while recovery, on another connection, renamed that directory away and
/// another worker made a new one under the old name. The server reached the worker's directory
/// by its old path, so the worker's writes and renames landed in its successor's directory.
/// A directory moved behind a connection's back is stale there (`ESTALE`), never its successor.
#[test]
fn a_directory_moved_behind_the_mount_is_stale_not_its_successor() {
    use rustix::fs::{AtFlags, Mode, OFlags, RenameFlags};
    use rustix::io::Errno;
    let s = Served::start();
    let (dir, backing) = (s.p("home/0/q/claim"), s.storage.join("home/0/q/claim"));
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join("job"), b"job").unwrap();
    let held = rustix::fs::open(&dir, OFlags::DIRECTORY | OFlags::RDONLY, Mode::empty()).unwrap();
    // Another connection (here: storage directly) fences the directory and a successor takes its
    // name.
    fs::rename(&backing, s.storage.join("home/0/q/fenced")).unwrap();
    fs::create_dir(&backing).unwrap();
    fs::write(backing.join("job"), b"successor's").unwrap();
    fs::write(backing.join("theirs"), b"successor's").unwrap();

    let stale = |r: rustix::io::Result<()>, what: &str| assert_eq!(r, Err(Errno::STALE), "{what}");
    let create = rustix::fs::openat(
        &held,
        "result",
        OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY,
        Mode::from_raw_mode(0o644),
    );
    stale(create.map(drop), "create");
    stale(rustix::fs::mkdirat(&held, "sub", Mode::from_raw_mode(0o755)), "mkdir");
    stale(rustix::fs::symlinkat("x", &held, "link"), "symlink");
    let home = rustix::fs::open(s.p("home/0/q"), OFlags::DIRECTORY | OFlags::RDONLY, Mode::empty()).unwrap();
    stale(rustix::fs::renameat_with(&held, "job", &home, "done", RenameFlags::NOREPLACE), "rename out");
    stale(rustix::fs::renameat_with(&home, "fenced", &held, "in", RenameFlags::NOREPLACE), "rename in");
    stale(rustix::fs::unlinkat(&held, "theirs", AtFlags::empty()), "unlink");
    let look = rustix::fs::openat(&held, "theirs", OFlags::RDONLY, Mode::empty());
    stale(look.map(drop), "lookup");
    // The successor is untouched, and through paths the mount sees it as it is.
    let mut names: Vec<String> =
        fs::read_dir(&backing).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["job", "theirs"]);
    assert_eq!(fs::read(backing.join("job")).unwrap(), b"successor's");
    assert_eq!(
        fs::read(dir.join("theirs")).unwrap(),
        b"successor's",
        "a new path walk finds the new directory"
    );
    assert_eq!(fs::read(s.p("home/0/q/fenced/job")).unwrap(), b"job");
}

/// `mkdir` of 254-byte names in `home/0/` stopped at depth 17 with ENAMETOOLONG and nothing
/// worked at that depth: the server reached every file by its whole path from the storage root,
/// and a path longer than the kernel's `PATH_MAX` cannot be opened in one call.
#[test]
fn paths_longer_than_path_max_work_at_every_depth() {
    let s = Served::start();
    fs::create_dir_all(s.storage.join("home/0")).unwrap();
    let name = "n".repeat(254);
    // Forty levels (about 10 KB of path) by relative steps, as ext4 takes them; at the bottom
    // every namespace and attribute operation on a file and a directory.
    let script = format!(
        "set -e; cd {h}; i=0; while [ $i -lt 40 ]; do mkdir {n}; cd -P {n}; i=$((i+1)); done; \
         echo one > f; echo two >> f; chmod 600 f; chown 65534:65534 f; truncate -s 3 f; test \"$(cat f)\" = one; \
         test \"$(stat -c %a:%s:%u f)\" = 600:3:65534; ln f g; mv g h; ln -s f l; test \"$(readlink l)\" = f; \
         mkdir d; rmdir d; mkfifo p; test -p p; rm f h l p; ls -A; echo end",
        h = s.p("home/0").display(),
        n = name
    );
    let out = Command::new("sh").args(["-c", &script]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && stdout == "end\n", "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    // The storage holds the same tree; `rm -r` through the mount takes it all away again.
    let find = Command::new("find").arg(s.storage.join("home/0")).args(["-mindepth", "1"]).output().unwrap();
    assert_eq!(
        find.stdout.iter().filter(|&&b| b == b'\n').count(),
        40,
        "{}",
        String::from_utf8_lossy(&find.stderr)
    );
    let rm = Command::new("rm").arg("-r").arg(s.p(&format!("home/0/{name}"))).output().unwrap();
    assert!(rm.status.success(), "{}", String::from_utf8_lossy(&rm.stderr));
    assert!(names(&s.storage.join("home/0")).is_empty());
}

/// `fstat`/`fchmod` of an open directory after `rmdir` or a rename over it, of an unlinked FIFO
/// open by `O_PATH`, and `stat(".")` in a removed working directory answered ENOENT; ext4
/// answers them, with `st_nlink` 0.
#[test]
fn open_objects_whose_last_name_is_gone_still_answer() {
    let s = Served::start();
    fs::create_dir_all(s.storage.join("home/0")).unwrap();
    let script = r#"
import os, stat, sys
os.chdir(sys.argv[1])
os.mkdir("d"); fd = os.open("d", os.O_RDONLY | os.O_DIRECTORY); os.rmdir("d")
st = os.fstat(fd); assert stat.S_ISDIR(st.st_mode) and st.st_nlink == 0, st
os.fchmod(fd, 0o700); assert os.fstat(fd).st_mode & 0o777 == 0o700
os.mkdir("e"); os.mkdir("f"); fd = os.open("e", os.O_RDONLY | os.O_DIRECTORY); os.rename("f", "e")
st = os.fstat(fd); assert stat.S_ISDIR(st.st_mode) and st.st_nlink == 0, st
os.fchmod(fd, 0o711); assert os.fstat(fd).st_mode & 0o777 == 0o711
os.mkfifo("p"); fd = os.open("p", os.O_PATH); os.unlink("p")
st = os.fstat(fd); assert stat.S_ISFIFO(st.st_mode) and st.st_nlink == 0, st
os.mkdir("w"); os.chdir("w"); os.rmdir("../w")
st = os.stat("."); assert stat.S_ISDIR(st.st_mode) and st.st_nlink == 0, st
print("end")
"#;
    let out = Command::new("python3").args(["-c", script]).arg(s.p("home/0")).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && stdout == "end\n", "{stdout}{}", String::from_utf8_lossy(&out.stderr));
}

/// POSIX ACLs were refused with EOPNOTSUPP (`setfacl` failed on `home/` and `shared/`, `cp -a`
/// dropped them). They are the kernel's to enforce and the backing file's to keep: set, read,
/// copied, inherited from a default ACL, and granting access mode bits alone would not.
#[test]
fn posix_acls_round_trip_are_copied_inherited_and_enforced() {
    let s = Served::start();
    fs::create_dir_all(s.storage.join("home/0")).unwrap();
    fs::set_permissions(s.storage.join("home/0"), fs::Permissions::from_mode(0o755)).unwrap();
    let sh = |script: &str| {
        let out = Command::new("sh").args(["-c", script]).current_dir(s.p("home/0")).output().unwrap();
        let said = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{script}: {said}{}", String::from_utf8_lossy(&out.stderr));
        said
    };
    sh("umask 077; echo secret > f; setfacl -m u:65534:r f");
    let acl = sh("getfacl -cpn f");
    assert!(acl.contains("user:65534:r--"), "{acl}");
    assert!(acl.contains("mask::r--"), "{acl}");
    // Mode bits alone (0640 with mask r--) keep nobody out; the ACL lets it read.
    let nobody = |script: &str| {
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--", "sh", "-c", script])
            .current_dir(s.p("home/0"))
            .output()
            .unwrap()
    };
    let read = nobody("cat f");
    assert_eq!(
        String::from_utf8_lossy(&read.stdout),
        "secret\n",
        "{}",
        String::from_utf8_lossy(&read.stderr)
    );
    sh("setfacl -b f");
    assert!(!nobody("cat f").status.success(), "without the ACL, mode 0600 refuses nobody");
    // cp -a carries an ACL; the backing file holds it.
    sh("setfacl -m u:65534:rw f; cp -a f g");
    assert_eq!(sh("getfacl -cpn g"), sh("getfacl -cpn f"));
    let backing = Command::new("getfacl").args(["-cpn"]).arg(s.storage.join("home/0/g")).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&backing.stdout), sh("getfacl -cpn f"));
    // A default ACL is inherited by what is made below it, with no umask applied; without one,
    // the creator's umask applies.
    sh("mkdir d; setfacl -d -m u:65534:rwx d; umask 077; touch d/n; mkdir d/e; touch plain");
    let n = sh("getfacl -cpn d/n");
    // The default ACL's entries, masked by the mode asked for (0666): no umask.
    assert!(n.contains("user:65534:rwx") && n.contains("mask::rw-"), "{n}");
    assert!(sh("getfacl -cpn d/e").contains("default:"), "a directory inherits the default ACL as its own");
    assert_eq!(fs::metadata(s.p("home/0/plain")).unwrap().mode() & 0o777, 0o600);
    assert!(nobody("echo more >> d/n").status.success());
}

/// A test suite that mounts its own instance could not use a data area as its test directory:
/// `-o source=` was refused, the mount's root was read-only, and three mounts of one storage
/// were three daemons. `-o area=` mounts one data area as a mount of its own, writable at its
/// root, every such mount of a storage served by the one daemon that serves it.
#[test]
fn mount_8_mounts_a_data_area_writable_at_its_root_from_the_storages_one_daemon() {
    let helper = mount_helper();
    let s = Served::start();
    fs::create_dir_all(s.storage.join("home/0")).unwrap();
    fs::create_dir_all(s.storage.join("shared/p")).unwrap();
    let d = tempfile::tempdir().unwrap();
    let at = |n: &str| d.path().join(n);
    let mount = |area: &str, dir: &Path| {
        fs::create_dir_all(dir).unwrap();
        Command::new("mount")
            .args(["-t", "fuse.cortexfs", "-o"])
            .arg(format!("area={area}"))
            .arg(&s.storage)
            .arg(dir)
            .output()
            .unwrap()
    };
    for (area, dir) in [("home/0", at("a")), ("shared/p", at("b")), ("home/0", at("c"))] {
        let o = mount(area, &dir);
        assert!(o.status.success(), "{area}: {}", tests::shown(&o));
    }
    // Of the type a harness looks for, writable at its root, the storage's own files.
    let findmnt = Command::new("findmnt").args(["-n", "-o", "FSTYPE,OPTIONS"]).arg(at("a")).output().unwrap();
    let shown = String::from_utf8_lossy(&findmnt.stdout).into_owned();
    assert!(
        shown.starts_with("fuse.cortexfs") && shown.contains("nosuid") && shown.contains("nodev"),
        "{shown}"
    );
    fs::create_dir(at("a/made")).unwrap();
    fs::write(at("a/made/f"), "through the area\n").unwrap();
    assert_eq!(fs::read_to_string(s.storage.join("home/0/made/f")).unwrap(), "through the area\n");
    assert_eq!(fs::read_to_string(at("c/made/f")).unwrap(), "through the area\n");
    fs::write(at("b/g"), "shared\n").unwrap();
    assert_eq!(fs::read_to_string(s.p("shared/p/g")).unwrap(), "shared\n");
    // One daemon serves the storage: no other started for these mounts.
    let daemons = Command::new("pgrep")
        .arg("-fc")
        .arg(format!("mount --source {}", s.storage.display()))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&daemons.stdout).trim(), "1");
    // Unmounting one area leaves the others and the daemon.
    assert!(Command::new("umount").arg(at("a")).status().unwrap().success());
    assert_eq!(fs::read_to_string(at("c/made/f")).unwrap(), "through the area\n");
    assert!(fs::read(s.p("status")).is_ok());
    for dir in ["b", "c"] {
        assert!(Command::new("umount").arg(at(dir)).status().unwrap().success());
    }
    // What is not a data area, or not there, or a symlink a user left (to anywhere), is refused.
    fs::create_dir_all(at("x")).unwrap();
    std::os::unix::fs::symlink("/etc", s.storage.join("home/0/link")).unwrap();
    for (area, code) in [("tool", 2), ("home", 2), ("../x", 2), ("home/4242", 1), ("home/0/link", 1)] {
        let o = Command::new(helper)
            .arg(&s.storage)
            .arg(at("x"))
            .arg("-o")
            .arg(format!("area={area}"))
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(code), "{area}: {}", tests::shown(&o));
    }
    // A storage no daemon serves: one is started for it, on a mount point of its own, and
    // stays when the area goes; unmounting that stops it.
    let s2 = d.path().join("s2");
    fs::create_dir_all(s2.join("home/0")).unwrap();
    let control = d.path().join("s2.sock");
    fs::create_dir_all(at("y")).unwrap();
    let o = Command::new("mount")
        .args(["-t", "fuse.cortexfs", "-o"])
        .arg(format!("area=home/0,control={}", control.display()))
        .arg(&s2)
        .arg(at("y"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", tests::shown(&o));
    fs::write(at("y/f"), "second\n").unwrap();
    assert_eq!(fs::read_to_string(s2.join("home/0/f")).unwrap(), "second\n");
    assert!(Command::new("umount").arg(at("y")).status().unwrap().success());
    let name: String = {
        use sha2::Digest;
        let h = sha2::Sha256::digest(fs::canonicalize(&s2).unwrap().as_os_str().as_encoded_bytes());
        h.iter().take(8).map(|b| format!("{b:02x}")).collect()
    };
    let private = Path::new("/run/cortexfs/storage").join(name);
    assert!(private.join("status").is_file(), "the daemon stays at {}", private.display());
    assert!(Command::new("umount").arg("-R").arg(&private).status().unwrap().success());
    let t = std::time::Instant::now();
    while control.exists() && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!control.exists(), "the daemon stopped with its mount");
    let _ = fs::remove_dir(&private);
}
