//! `ctx object install|replace|rollback|uninstall|inspect` as users run them, and (e): installs
//! killed at random moments leave the name either absent or complete and valid, never half.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tests::object::package;
use tests::run;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn install_replace_rollback_uninstall() {
    let d = tempfile::tempdir().unwrap();
    let s = d.path().join("storage");
    fs::create_dir(&s).unwrap();
    let src = s.to_str().unwrap();
    let v1 = package(&d.path().join("v1"), "hello", "1.0.0", 0).manifest;
    let v2 = package(&d.path().join("v2"), "hello", "2.0.0", 0).manifest;
    let out = run("ctx", &["object", "install", "--source", src, v1.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).starts_with("installed tool/hello 1.0.0 at "));
    let exe = s.join("tool/hello");
    let ran = Command::new(&exe).output().unwrap();
    assert_eq!(text(&ran.stdout), "hello 1.0.0\n", "the installed executable runs");

    let out = run("ctx", &["object", "install", "--source", src, v2.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("already installed"), "{}", text(&out.stderr));

    let out = run("ctx", &["object", "replace", "--source", src, v2.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0));
    assert!(text(&out.stdout).contains("dry run"));
    assert_eq!(text(&Command::new(&exe).output().unwrap().stdout), "hello 1.0.0\n");
    let out = run("ctx", &["object", "replace", "--source", src, v2.to_str().unwrap(), "--yes"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&Command::new(&exe).output().unwrap().stdout), "hello 2.0.0\n");
    let out = run("ctx", &["object", "rollback", "--source", src, "tool/hello", "--yes"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&Command::new(&exe).output().unwrap().stdout), "hello 1.0.0\n");
    assert_eq!(fs::read_to_string(s.join("tool/hello.d/description")).unwrap(), "hello 1.0.0\n");

    let out = run("ctx", &["object", "inspect", "--source", src, "tool/hello", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["installed"], true);
    assert_eq!(v["previous"], true);

    let out = run("ctx", &["object", "uninstall", "--source", src, "tool/hello"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(exe.exists(), "dry run by default");
    let out = run("ctx", &["object", "uninstall", "--source", src, "tool/hello", "--yes"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(!exe.exists() && !s.join("tool/hello.d").exists());
}

#[test]
fn bad_manifests_write_nothing() {
    let d = tempfile::tempdir().unwrap();
    let s = d.path().join("storage");
    let m = package(&d.path().join("p"), "hello", "1.0.0", 0).manifest;
    // Digest mismatch: the executable changed after the manifest was written.
    fs::write(d.path().join("p/bin/t"), b"#!/bin/sh\necho evil\n").unwrap();
    let out = run("ctx", &["object", "install", "--source", s.to_str().unwrap(), m.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stdout).contains("does not match its digest"));
    assert!(!s.exists(), "no writes at all");
    // Symlinked executable.
    let m = package(&d.path().join("q"), "hello", "1.0.0", 0).manifest;
    fs::rename(d.path().join("q/bin/t"), d.path().join("q/real")).unwrap();
    std::os::unix::fs::symlink(d.path().join("q/real"), d.path().join("q/bin/t")).unwrap();
    let out = run("ctx", &["object", "install", "--source", s.to_str().unwrap(), m.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(!s.exists());
    // Unknown field.
    let m = package(&d.path().join("r"), "hello", "1.0.0", 0).manifest;
    let t = fs::read_to_string(&m).unwrap().replacen('{', "{\"extra\":1,", 1);
    fs::write(&m, t).unwrap();
    let out = run("ctx", &["object", "install", "--source", s.to_str().unwrap(), m.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stdout).contains("extra: unknown field"));
    assert!(!s.exists());
    // A `.d/program` that is JSON but no JSON Schema.
    let m = package(&d.path().join("u"), "hello", "1.0.0", 0).manifest;
    let t = fs::read_to_string(&m).unwrap().replacen(
        "\"controls\":{",
        "\"controls\":{\"program\":{\"text\":\"{\\\"type\\\":\\\"integr\\\"}\\n\"},",
        1,
    );
    fs::write(&m, &t).unwrap();
    let out = run("ctx", &["object", "install", "--source", s.to_str().unwrap(), m.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{t}: {}{}", text(&out.stdout), text(&out.stderr));
    assert!(text(&out.stdout).contains("not a valid JSON Schema"), "{}", text(&out.stdout));
    assert!(!s.exists());
}

#[test]
fn installs_killed_at_random_moments_are_absent_or_complete() {
    let d = tempfile::tempdir_in("/var/tmp").unwrap();
    let s = d.path().join("storage");
    fs::create_dir(&s).unwrap();
    // A 4 MiB executable makes staging take long enough for kills to land at every step.
    let pkg = package(&d.path().join("pkg"), "big", "1.0.0", 4 << 20);
    let m = &pkg.manifest;
    let mut rng = StdRng::seed_from_u64(99);
    // Time one install to aim the kills.
    let t = std::time::Instant::now();
    let out = run("ctx", &["object", "install", "--source", s.to_str().unwrap(), m.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let full = t.elapsed();
    run("ctx", &["object", "uninstall", "--source", s.to_str().unwrap(), "tool/big", "--yes"]);
    let (mut absent, mut complete, mut residue) = (0, 0, 0);
    for round in 0..200 {
        let mut child = Command::new(tests::bin("ctx"))
            .args(["object", "install", "--source", s.to_str().unwrap(), m.to_str().unwrap()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let wait = rng.random_range(0..full.as_micros().max(1) as u64 * 12 / 10);
        std::thread::sleep(Duration::from_micros(wait));
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_raw(child.id() as i32).unwrap(),
            rustix::process::Signal::KILL,
        );
        child.wait().unwrap();
        match pkg.absent_or_complete(&s) {
            Ok(true) => complete += 1,
            Ok(false) => absent += 1,
            Err(why) => panic!("round {round}: half-installed object: {why}"),
        }
        let insp = run("ctx", &["object", "inspect", "--source", s.to_str().unwrap(), "tool/big", "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&insp.stdout).unwrap();
        if !v["residue"].as_array().unwrap().is_empty() {
            residue += 1;
        }
        // Whatever the kill left, the next install or uninstall brings the name to a clean state.
        if complete > 0 && Path::new(&s.join("tool/big")).exists() {
            let out =
                run("ctx", &["object", "uninstall", "--source", s.to_str().unwrap(), "tool/big", "--yes"]);
            assert_eq!(out.status.code(), Some(0), "round {round}: {}", text(&out.stderr));
        } else {
            let out =
                run("ctx", &["object", "install", "--source", s.to_str().unwrap(), m.to_str().unwrap()]);
            assert_eq!(out.status.code(), Some(0), "round {round}: {}", text(&out.stderr));
            assert_eq!(pkg.absent_or_complete(&s), Ok(true));
            run("ctx", &["object", "uninstall", "--source", s.to_str().unwrap(), "tool/big", "--yes"]);
        }
        let left: Vec<_> = fs::read_dir(s.join("tool")).unwrap().flatten().map(|e| e.file_name()).collect();
        assert!(left.is_empty(), "round {round}: {left:?} left after the next install and uninstall");
    }
    eprintln!(
        "200 kills: {absent} absent, {complete} complete, {residue} with residue (install took {full:?})"
    );
    assert!(absent > 0 && complete > 0, "kills should land both before and after publishing");
}
