//! `make demo` as a new user runs it: twice in a row, then `make demo-clean`. Each run left one
//! more live terminal and work directory, and nothing took them back.

use std::path::Path;
use std::process::{Command, Output};

fn demo(script: &str, d: &Path) -> Output {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    Command::new("bash")
        .arg(root.join("scripts").join(script))
        .env("CTX_STORAGE", d.join("storage"))
        .env("CTX_MOUNT", d.join("ctx"))
        .env("CTX_CONTROL", d.join("control.sock"))
        .env("CTX_DEMO_DIR", d.join("run"))
        .env("CTX_DEMO_WORK", d.join("work"))
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap()
}

fn runs(d: &Path) -> Vec<String> {
    let o = Command::new(tests::bin("ctx"))
        .args(["agent", "ps", "--json", "--control"])
        .arg(d.join("control.sock"))
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
    v.as_array()
        .into_iter()
        .flatten()
        .map(|r| format!("{}/{}", r["agent"].as_str().unwrap_or(""), r["session"].as_str().unwrap_or("")))
        .collect()
}

/// `sudo make demo` went on to install packages and then failed to find cargo (sudo resets
/// PATH): the first step says what to do when cargo cannot be run.
#[test]
fn make_demo_says_first_how_to_get_cargo() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let o = Command::new("bash")
        .arg(root.join("scripts/need-cargo"))
        .arg("demo")
        .env("CARGO", "cargo-that-is-not-here")
        .env("HOME", "/nonexistent")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(69), "{}", tests::shown(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("cargo is missing: install Rust"),
        "{}",
        tests::shown(&o)
    );
    let o = Command::new("bash")
        .arg(root.join("scripts/need-cargo"))
        .arg("demo")
        .env("CARGO", "true")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", tests::shown(&o));
}

#[test]
fn the_demo_runs_twice_leaves_one_terminal_and_demo_clean_takes_back_what_it_made() {
    let d = tempfile::Builder::new().prefix("cortexfs-demo-test.").tempdir_in("/var/tmp").unwrap();
    std::fs::create_dir_all(d.path().join("ctx")).unwrap();
    for round in 1..=2 {
        let o = demo("demo", d.path());
        let said = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "round {round}: {}", tests::shown(&o));
        assert!(said.contains("coder_t tool:fs.stat execute") || said.contains("fs.stat"), "{said}");
        // The deliberate refusal says why.
        assert!(
            said.contains("refused whole, EINVAL") && said.contains(":1: error:"),
            "round {round}: {said}"
        );
        assert_eq!(runs(d.path()), ["coder/demo-live"], "round {round}: one demo terminal");
    }
    assert!(d.path().join("work/notes.txt").is_file(), "one work directory, made again");
    let o = demo("demo-clean", d.path());
    assert!(o.status.success(), "{}", tests::shown(&o));
    let said = String::from_utf8_lossy(&o.stdout);
    for what in [
        "stopped agent coder session demo-live",
        "removed agent coder",
        "uninstalled review-kit",
        "stopped the server",
    ] {
        assert!(said.contains(what), "{what}: {said}");
    }
    assert!(!d.path().join("work").exists() && !d.path().join("run/demo.state").exists());
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(d.path().join("ctx").to_str().unwrap()), "unmounted");
    assert!(!d.path().join("storage/agent/coder").exists(), "the demo's agent is gone");
}
