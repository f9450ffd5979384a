#![allow(clippy::unwrap_used)] // tests fail loudly by design

//! Runs the built `cortexfs-core` against temporary workspaces.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use tempfile::TempDir;

const BIN: &str = env!("CARGO_BIN_EXE_cortexfs-core");

/// A workspace with a sibling directory outside it.
struct Ws {
    top: TempDir,
}

impl Ws {
    fn new() -> Ws {
        let top = tempfile::tempdir().unwrap();
        fs::create_dir(top.path().join("ws")).unwrap();
        fs::create_dir(top.path().join("outside")).unwrap();
        fs::write(top.path().join("outside/secret"), "secret\n").unwrap();
        Ws { top }
    }

    fn root(&self) -> PathBuf {
        self.top.path().join("ws")
    }

    fn outside(&self) -> PathBuf {
        self.top.path().join("outside")
    }

    fn file(&self, rel: &str, text: &str) {
        let path = self.root().join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    }

    fn read(&self, rel: &str) -> String {
        fs::read_to_string(self.root().join(rel)).unwrap()
    }

    fn cmd(&self, tool: &str, args: &[&str]) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.arg(tool)
            .args(args)
            .env("CTX_WORKSPACE", self.root())
            .env("CTX_ROOT", self.top.path().join("ctx"))
            .env_remove("CTX_AUTHORIZED_OBJECT")
            .current_dir(self.top.path());
        cmd
    }

    fn run(&self, tool: &str, args: &[&str]) -> Output {
        self.cmd(tool, args).stdin(Stdio::null()).output().unwrap()
    }

    fn run_with(&self, tool: &str, args: &[&str], stdin: &[u8]) -> Output {
        piped(self.cmd(tool, args), stdin)
    }
}

fn piped(mut cmd: Command, stdin: &[u8]) -> Output {
    let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    // The tool may refuse before reading all of it.
    let _ = child.stdin.take().unwrap().write_all(stdin);
    child.wait_with_output().unwrap()
}

fn ok(out: &Output) -> String {
    assert_eq!(out.status.code(), Some(0), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn fails(out: &Output, code: i32) -> String {
    assert_eq!(out.status.code(), Some(code), "stdout: {}", String::from_utf8_lossy(&out.stdout));
    String::from_utf8(out.stderr.clone()).unwrap()
}

#[test]
fn fs_read_cli_and_json() {
    let ws = Ws::new();
    ws.file("a.txt", "hello world");
    assert_eq!(ok(&ws.run("fs.read", &["a.txt"])), "hello world");
    assert_eq!(ok(&ws.run("fs.read", &[r#"{"path": "a.txt", "offset": 6, "length": 3}"#])), "wor");
    assert_eq!(ok(&ws.run_with("fs.read", &[], br#"{"path": "a.txt", "offset": 6}"#)), "world");
    let abs = ws.root().join("a.txt");
    assert_eq!(ok(&ws.run("fs.read", &[abs.to_str().unwrap()])), "hello world");
    let err = fails(&ws.run("fs.read", &["missing"]), 1);
    assert!(err.starts_with("fs.read: missing: "), "{err}");
}

#[test]
fn fs_list_cli_and_json() {
    let ws = Ws::new();
    ws.file("b", "");
    ws.file("a", "");
    ws.file("d/inner", "");
    symlink("d", ws.root().join("link")).unwrap();
    assert_eq!(ok(&ws.run("fs.list", &[])), "a\nb\nd/\nlink\n");
    assert_eq!(ok(&ws.run_with("fs.list", &[], b"{}")), "a\nb\nd/\nlink\n");
    assert_eq!(ok(&ws.run("fs.list", &["d"])), "inner\n");
    assert_eq!(ok(&ws.run("fs.list", &[r#"{"path": "d"}"#])), "inner\n");
    fails(&ws.run("fs.list", &["a"]), 1);
    fails(&ws.run("fs.list", &["a", "b"]), 2);
}

#[test]
fn fs_stat_cli_and_json() {
    let ws = Ws::new();
    ws.file("f", "12345");
    fs::set_permissions(ws.root().join("f"), fs::Permissions::from_mode(0o640)).unwrap();
    symlink(ws.outside().join("secret"), ws.root().join("away")).unwrap();
    let stat =
        |args: &[&str]| -> serde_json::Value { serde_json::from_str(&ok(&ws.run("fs.stat", args))).unwrap() };
    let f = stat(&["f"]);
    assert_eq!(
        (&f["path"], &f["type"], &f["size"], &f["mode"]),
        (&"f".into(), &"file".into(), &5.into(), &"0640".into())
    );
    assert!(f["mtime"].as_i64().unwrap() > 0);
    assert_eq!(stat(&[r#"{"path": "."}"#])["type"], "dir");
    // The final symlink is described, not followed, so it does not count as leaving.
    assert_eq!(stat(&["away"])["type"], "symlink");
    let line = ok(&ws.run("fs.stat", &["f"]));
    assert!(line.ends_with("}\n") && line.lines().count() == 1, "{line}");
}

#[test]
fn fs_write_modes() {
    let ws = Ws::new();
    assert_eq!(ok(&ws.run_with("fs.write", &["new.txt"], b"from stdin")), "wrote 10 bytes to new.txt\n");
    assert_eq!(ws.read("new.txt"), "from stdin");
    let out = ws.run("fs.write", &[r#"{"path": "new.txt", "content": "again", "mode": "append"}"#]);
    assert_eq!(ok(&out), "wrote 5 bytes to new.txt\n");
    assert_eq!(ws.read("new.txt"), "from stdinagain");
    let err = fails(&ws.run("fs.write", &[r#"{"path": "new.txt", "content": "x", "mode": "create"}"#]), 1);
    assert!(err.starts_with("fs.write: new.txt: "), "{err}");
    assert_eq!(ws.read("new.txt"), "from stdinagain");
    ok(&ws.run("fs.write", &[r#"{"path": "fresh", "content": "x", "mode": "create"}"#]));
    assert_eq!(ws.read("fresh"), "x");
    fails(&ws.run("fs.write", &[r#"{"path": "nodir/x", "content": "x"}"#]), 1);
    fails(&ws.run("fs.write", &[]), 2);
}

#[test]
fn fs_write_replace_is_atomic_and_keeps_the_mode() {
    let ws = Ws::new();
    ws.file("d/f", "old");
    fs::set_permissions(ws.root().join("d/f"), fs::Permissions::from_mode(0o600)).unwrap();
    let old_inode = fs::metadata(ws.root().join("d/f")).unwrap();
    ok(&ws.run_with("fs.write", &[], br#"{"path": "d/f", "content": "new"}"#));
    assert_eq!(ws.read("d/f"), "new");
    let new = fs::metadata(ws.root().join("d/f")).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_ne!(old_inode.ino(), new.ino(), "a new file was renamed in");
    assert_eq!(new.mode() & 0o7777, 0o600);
    let names: Vec<_> = fs::read_dir(ws.root().join("d")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["f"], "no temp file is left");
    // A failed rename (over a directory) leaves no temp file either.
    fs::create_dir(ws.root().join("d/sub")).unwrap();
    fails(&ws.run("fs.write", &[r#"{"path": "d/sub", "content": "x"}"#]), 1);
    assert_eq!(fs::read_dir(ws.root().join("d")).unwrap().count(), 2);
}

#[test]
fn invalid_input_is_exit_2() {
    let ws = Ws::new();
    ws.file("a", "");
    for (tool, input) in [
        ("fs.read", "{"),
        ("fs.read", r#"{"path": "a", "extra": 1}"#),
        ("fs.read", r#"{"offset": 1}"#),
        ("fs.read", r#"{"path": "a", "length": -1}"#),
        ("fs.read", r#"{"path": "a", "length": null}"#),
        ("fs.list", r#"{"path": 3}"#),
        ("fs.write", r#"{"path": "a", "content": "x", "mode": "truncate"}"#),
        ("shell.exec", r#"{"cmd": "true", "timeout_ms": 0}"#),
        ("tsh.config", r#"{"set": {"colour": 1}}"#),
    ] {
        let err = fails(&ws.run(tool, &[input]), 2);
        assert!(err.starts_with(&format!("{tool}: input: ")), "{input}: {err}");
        fails(&ws.run_with(tool, &[], input.as_bytes()), 2);
    }
    let big = format!(r#"{{"path": "a", "pad": "{}"}}"#, "x".repeat(1 << 20));
    let err = fails(&ws.run_with("fs.read", &[], big.as_bytes()), 2);
    assert!(err.contains("larger than 1 MiB"), "{err}");
    fails(&ws.run("fs.read", &[]), 2);
    fails(&ws.run("fs.read", &["a", "b"]), 2);
}

#[test]
fn paths_outside_the_workspace_are_refused() {
    let ws = Ws::new();
    ws.file("d/f", "");
    let secret = ws.outside().join("secret");
    symlink(&secret, ws.root().join("abs")).unwrap();
    symlink("../outside/secret", ws.root().join("rel")).unwrap();
    symlink(ws.outside(), ws.root().join("outdir")).unwrap();
    let secret = secret.to_str().unwrap().to_owned();
    let dotdot = format!("{}/../outside/secret", ws.root().display());
    for (tool, path) in [
        ("fs.read", "../outside/secret"),
        ("fs.read", "d/../../outside/secret"),
        ("fs.read", secret.as_str()),
        ("fs.read", dotdot.as_str()),
        ("fs.read", "/etc/passwd"),
        ("fs.read", "abs"),
        ("fs.read", "rel"),
        ("fs.read", "outdir/secret"),
        ("fs.list", "outdir"),
        ("fs.list", ".."),
        ("fs.stat", "outdir/secret"),
        ("fs.stat", "../outside"),
    ] {
        let err = fails(&ws.run(tool, &[path]), 13);
        assert_eq!(err, format!("{tool}: {path}: refused: leaves the workspace\n"));
    }
    for (path, mode) in [
        ("abs", "append"),
        ("rel", "append"),
        ("outdir/new", "create"),
        ("outdir/new", "replace"),
        ("../new", "replace"),
    ] {
        let input = format!(r#"{{"path": "{path}", "content": "x", "mode": "{mode}"}}"#);
        let err = fails(&ws.run("fs.write", &[&input]), 13);
        assert_eq!(err, format!("fs.write: {path}: refused: leaves the workspace\n"));
    }
    // create never follows a final symlink: the name is taken.
    fails(&ws.run("fs.write", &[r#"{"path": "rel", "content": "x", "mode": "create"}"#]), 1);
    assert_eq!(fs::read_to_string(ws.outside().join("secret")).unwrap(), "secret\n");
    assert!(!ws.outside().join("new").exists() && !ws.top.path().join("new").exists());
}

#[test]
fn symlinks_within_the_workspace_are_followed() {
    let ws = Ws::new();
    ws.file("d/target", "inside");
    symlink("d/target", ws.root().join("link")).unwrap();
    symlink("../d", ws.root().join("d/self")).unwrap();
    assert_eq!(ok(&ws.run("fs.read", &["link"])), "inside");
    assert_eq!(ok(&ws.run("fs.read", &["d/self/target"])), "inside");
}

#[test]
fn permission_denied_is_exit_13() {
    let ws = Ws::new();
    ws.file("locked", "x");
    fs::set_permissions(ws.root().join("locked"), fs::Permissions::from_mode(0o000)).unwrap();
    let mut cmd = ws.cmd("fs.read", &["locked"]);
    if rustix::process::geteuid().is_root() {
        // Root reads through mode bits: run the tool as nobody, who may walk in but not read.
        use std::os::unix::process::CommandExt;
        fs::set_permissions(ws.top.path(), fs::Permissions::from_mode(0o755)).unwrap();
        cmd.uid(65534).gid(65534);
    }
    fails(&cmd.stdin(Stdio::null()).output().unwrap(), 13);
}

#[test]
fn shell_exec_status_and_workspace() {
    let ws = Ws::new();
    let pwd = ok(&ws.run("shell.exec", &["pwd"]));
    assert_eq!(Path::new(pwd.trim()).canonicalize().unwrap(), ws.root().canonicalize().unwrap());
    assert_eq!(ok(&ws.run("shell.exec", &[r#"{"cmd": "echo $((1 + 2))"}"#])), "3\n");
    assert_eq!(ok(&ws.run_with("shell.exec", &[], br#"{"cmd": "echo piped"}"#)), "piped\n");
    // CLI arguments are not shell syntax.
    assert_eq!(ok(&ws.run("shell.exec", &["echo", "$HOME", "a b"])), "$HOME a b\n");
    fails(&ws.run("shell.exec", &["sh", "-c", "exit 3"]), 3);
    fails(&ws.run("shell.exec", &[r#"{"cmd": "kill -9 $$"}"#]), 128 + 9);
    fails(&ws.run("shell.exec", &["no-such-command-here"]), 127);
}

#[test]
fn shell_exec_timeout_kills_the_group() {
    let ws = Ws::new();
    let err = fails(&ws.run("shell.exec", &[r#"{"cmd": "sleep 30 & sleep 30", "timeout_ms": 100}"#]), 124);
    assert_eq!(err, "shell.exec: timed out after 100 ms\n");
    // A command that ignores SIGTERM gets SIGKILL.
    fails(&ws.run("shell.exec", &[r#"{"cmd": "trap '' TERM; sleep 30; sleep 30", "timeout_ms": 100}"#]), 124);
    ok(&ws.run("shell.exec", &[r#"{"cmd": "true", "timeout_ms": 60000}"#]));
}

#[test]
fn tsh_config_prints_sets_and_validates() {
    let ws = Ws::new();
    let dir = ws.top.path().join("ctx/tool/tsh.d");
    fs::create_dir_all(&dir).unwrap();
    let defaults = "max_loaded_tools=64\ncache_capacity=32\nwindow_percent=1\n";
    assert_eq!(ok(&ws.run("tsh.config", &[])), defaults);
    fs::write(dir.join("config"), "# tuned\ncache_capacity=48\n").unwrap();
    assert_eq!(ok(&ws.run("tsh.config", &[])), "max_loaded_tools=64\ncache_capacity=48\nwindow_percent=1\n");
    let set = "max_loaded_tools=64\ncache_capacity=64\nwindow_percent=5\n";
    assert_eq!(ok(&ws.run("tsh.config", &["cache_capacity=64", "window_percent=5"])), set);
    assert_eq!(fs::read_to_string(dir.join("config")).unwrap(), set);
    let json = r#"{"set": {"max_loaded_tools": 8}}"#;
    assert_eq!(
        ok(&ws.run("tsh.config", &[json])),
        "max_loaded_tools=8\ncache_capacity=64\nwindow_percent=5\n"
    );

    let before = fs::read_to_string(dir.join("config")).unwrap();
    let err = fails(&ws.run("tsh.config", &["window_percent=7", "cache_capacity=0"]), 2);
    assert_eq!(err, "tsh.config: cache_capacity: 0 is out of range 1..=1000000\n");
    fails(&ws.run("tsh.config", &[r#"{"set": {"cache_capacity": 0}}"#]), 2);
    fails(&ws.run("tsh.config", &["cache_capacity"]), 2);
    assert_eq!(fs::read_to_string(dir.join("config")).unwrap(), before);
}

#[test]
fn dispatch_by_argv0_env_and_first_argument() {
    let ws = Ws::new();
    ws.file("f", "x");
    let link = ws.top.path().join("fs.read");
    symlink(BIN, &link).unwrap();
    let out =
        Command::new(&link).arg("f").env("CTX_WORKSPACE", ws.root()).stdin(Stdio::null()).output().unwrap();
    assert_eq!(ok(&out), "x");
    let out = Command::new(BIN)
        .arg("f")
        .env("CTX_WORKSPACE", ws.root())
        .env("CTX_AUTHORIZED_OBJECT", "tool/fs.read")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(ok(&out), "x");
    let err = fails(&ws.run("nope", &[]), 2);
    assert!(err.starts_with("cortexfs-core: unknown tool \"nope\": expected one of fs.read, "), "{err}");
    let help = ok(&ws.run("fs.write", &["--help"]));
    assert!(
        help.starts_with("usage: fs.write PATH") && help.contains("\"additionalProperties\": false"),
        "{help}"
    );
    let out = Command::new(BIN).stdin(Stdio::null()).env_remove("CTX_AUTHORIZED_OBJECT").output().unwrap();
    fails(&out, 2);
}
