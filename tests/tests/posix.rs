//! POSIX behaviour of `home/` and `shared/` on a real `ctx mount`: the public suites pjdfstest and
//! fsx (installed by `make test` through `scripts/install-test-tools`; missing tools fail these
//! tests), and our own checks for what they miss: unlink of open files, rename of directories
//! over directories, readdir during creates, large sparse files, and regressions of bugs the
//! suites found.

use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// What pjdfstest does not verify on this mount, by test name (a substring), with the reason.
/// pjdfstest reports these as skipped; any other skip or any failure fails the test.
const EXCLUDED: &[(&str, &str)] = &[
    (
        "erofs",
        "the EROFS cases remount the file system read-only with mount(8), which for a \
         fuse.ctx mount calls a FUSE mount helper that `ctx` does not provide; EROFS for a \
         read-only mount comes from the VFS (mnt_want_write) before any request reaches the server",
    ),
    (
        "link::link_count_max",
        "LINK_MAX of a FUSE file system is unknown to pathconf(3); the limit is the backing \
         file system's, which the server passes through",
    ),
];

/// pjdfstest features this file system has (`pjdfstest -l`). Not listed: chflags and its
/// SF_SNAPSHOT flag, NFSv4 ACLs and st_birthtime, which Linux does not have (their cases are not
/// built on Linux).
const PJDFSTEST_FEATURES: &[&str] = &["posix_fallocate", "rename_ctime", "utime_now", "utimensat"];

use tests::served::{Served, errno};

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// Runs a shell script as `nobody` (uid and gid 65534, no supplementary groups).
fn as_nobody(script: &str) -> Output {
    Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--", "sh", "-c", script])
        .output()
        .unwrap()
}

/// A public suite's binary, installed by `make test` (scripts/install-test-tools) into cargo's
/// bin directory. Missing, it fails the test: on this machine kind the suites always run.
fn suite(name: &str) -> PathBuf {
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cargo")));
    let path = std::env::var_os("PATH").unwrap_or_default();
    cargo_home
        .map(|h| h.join("bin"))
        .into_iter()
        .chain(std::env::split_paths(&path))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "{name} is not installed, so POSIX conformance cannot be checked: run `make test` \
                 (scripts/install-test-tools installs it) or `cargo install --locked pjdfstest@0.2.2 \
                 fsx@0.3.2` (pjdfstest needs Debian libacl1-dev)"
            )
        })
}

/// The result of one pjdfstest case.
#[derive(Debug, PartialEq)]
enum Case {
    Passed,
    Failed(String),
    Skipped(String),
}

/// Parses pjdfstest's report: `<name> ok|FAILED|skipped`, each failure or skip followed by
/// tab-indented reasons (and a backtrace, ignored).
fn parse_pjdfstest(out: &str) -> BTreeMap<String, Case> {
    let mut cases = BTreeMap::new();
    let mut last: Option<String> = None;
    for line in out.lines() {
        if let Some(reason) = line.strip_prefix('\t') {
            if let Some(Case::Failed(r) | Case::Skipped(r)) = last.as_ref().and_then(|n| cases.get_mut(n)) {
                if !r.is_empty() {
                    r.push_str("; ");
                }
                r.push_str(reason.trim());
            }
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        let case = match words.as_slice() {
            [name, "ok"] => Some((name, Case::Passed)),
            [name, "FAILED"] | [name, "PASSED", "UNEXPECTEDLY"] | [name, "failed", "as", "expected"] => {
                Some((name, Case::Failed(String::new())))
            }
            [name, "skipped"] => Some((name, Case::Skipped(String::new()))),
            _ => None,
        };
        if let Some((name, case)) = case {
            cases.insert((*name).to_owned(), case);
            last = Some((*name).to_owned());
        } else if !line.starts_with(' ') {
            last = None;
        }
    }
    cases
}

fn excluded(name: &str) -> Option<&'static str> {
    EXCLUDED.iter().find(|(pattern, _)| name.contains(pattern)).map(|(_, why)| *why)
}

/// Runs the whole pjdfstest suite in `dir` (on the mount) and judges it.
fn pjdfstest(s: &Served, dir: &Path) {
    let bin = suite("pjdfstest");
    // The suite switches to two unprivileged users, each named with its primary group.
    let (nobody_group, daemon_group) = (primary_group("nobody"), primary_group("daemon"));
    let config = s.dir.path().join(format!("pjdfstest-{}.toml", dir.file_name().unwrap().to_string_lossy()));
    let features: String = PJDFSTEST_FEATURES.iter().map(|f| format!("{f} = {{}}\n")).collect();
    fs::write(
        &config,
        format!(
            "[features]\n{features}\n[settings]\nnaptime = 0.01\nallow_remount = false\n\n\
             [dummy_auth]\nentries = [[\"nobody\", \"{nobody_group}\"], [\"daemon\", \"{daemon_group}\"]]\n"
        ),
    )
    .unwrap();
    // A directory on another file system, for the EXDEV cases.
    let second = s.dir.path().join("second");
    fs::create_dir_all(&second).unwrap();
    fs::set_permissions(&second, fs::Permissions::from_mode(0o777)).unwrap();
    let out = Command::new(&bin)
        .arg("-c")
        .arg(&config)
        .arg("-p")
        .arg(dir)
        .arg("-s")
        .arg(&second)
        .env("NO_COLOR", "1")
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    let cases = parse_pjdfstest(&report);
    let passed = cases.values().filter(|c| **c == Case::Passed).count();
    let mut failed = Vec::new();
    let mut skipped = 0;
    for (name, case) in &cases {
        match (case, excluded(name)) {
            (Case::Passed, _) => {}
            (Case::Skipped(_), Some(_)) => skipped += 1,
            (Case::Skipped(why), None) => {
                failed.push(format!("{name}: skipped without a documented reason: {why}"))
            }
            (Case::Failed(why), _) => failed.push(format!("{name}: {why}")),
        }
    }
    eprintln!(
        "pjdfstest on {}: {} cases, {passed} passed, {} failed, {skipped} excluded (skipped)",
        dir.display(),
        cases.len(),
        failed.len()
    );
    // A suite that stopped early (or printed nothing we understand) must not pass as clean.
    assert!(
        cases.len() >= 390 && report.contains("Summary:"),
        "pjdfstest did not run to the end ({} cases):\n{report}\n{}",
        cases.len(),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(failed.is_empty(), "pjdfstest failures in {}:\n{}", dir.display(), failed.join("\n"));
}

/// The name of the primary group of `user` (nobody's is `nogroup` on Debian).
fn primary_group(user: &str) -> String {
    let field = |file: &str, key: &str, at: usize| -> Option<String> {
        let text = fs::read_to_string(file).ok()?;
        text.lines()
            .map(|l| l.split(':').collect::<Vec<_>>())
            .find(|f| f.get(at) == Some(&key))
            .map(|f| f.join(":"))
    };
    let gid = field("/etc/passwd", user, 0).and_then(|l| l.split(':').nth(3).map(str::to_owned));
    let gid = gid.unwrap_or_else(|| panic!("pjdfstest needs the user {user}"));
    let group = field("/etc/group", &gid, 2).unwrap_or_else(|| panic!("no group {gid} for {user}"));
    group.split(':').next().unwrap().to_owned()
}

#[test]
fn pjdfstest_passes_in_home_and_shared() {
    let s = Served::start();
    let home = s.data_dir("home/pjdfstest", 0o777, 0);
    let shared = s.data_dir("shared/pjdfstest", 0o777, 0);
    pjdfstest(&s, &home);
    pjdfstest(&s, &shared);
}

/// Runs fsx with `config` for `ops` operations from `seed` on `file`, optionally as nobody.
fn fsx(s: &Served, config: &str, file: &Path, seed: u32, ops: u32, nobody: bool) {
    let bin = suite("fsx");
    let cfg = s.dir.path().join(format!("fsx-{seed}.toml"));
    fs::write(&cfg, config).unwrap();
    // Artifacts (.fsxlog, .fsxgood) go beside the file under test, readable after a failure.
    let artifacts = file.parent().unwrap();
    let mut cmd = if nobody {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"]).arg(&bin);
        c
    } else {
        Command::new(&bin)
    };
    let t = Instant::now();
    let out = cmd
        .arg("-N")
        .arg(ops.to_string())
        .arg("-S")
        .arg(seed.to_string())
        .arg("-f")
        .arg(&cfg)
        .arg("-P")
        .arg(artifacts)
        .arg(file)
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap();
    let report = text(&out);
    eprintln!(
        "fsx seed {seed}, {ops} operations on {} in {:.1} s: {}",
        file.display(),
        t.elapsed().as_secs_f64(),
        if out.status.success() { "ok" } else { "FAILED" }
    );
    assert!(
        out.status.success() && report.contains("All operations completed A-OK!"),
        "fsx seed {seed} failed on {}:\n{}",
        file.display(),
        report.lines().rev().take(60).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n")
    );
}

/// Every operation fsx has: pread/pwrite, mmap reads and writes, msync(MS_INVALIDATE),
/// ftruncate, fsync, fdatasync, posix_fallocate, hole punching, sendfile, posix_fadvise,
/// copy_file_range and close/reopen.
const FSX_ALL_OPS: &str = "[weights]
close_open = 1
read = 10
write = 10
mapread = 10
mapwrite = 10
invalidate = 1
truncate = 2
fsync = 1
fdatasync = 1
posix_fallocate = 1
punch_hole = 1
sendfile = 1
posix_fadvise = 1
copy_file_range = 1
";

#[test]
fn fsx_finds_no_corruption() {
    let s = Served::start();
    let home = s.data_dir("home/65534", 0o755, 65534);
    let shared = s.data_dir("shared/fsx", 0o777, 0);
    // As nobody in its home: the default 256 KiB file, small operations.
    fsx(&s, &format!("flen = 262144\n{FSX_ALL_OPS}"), &home.join("fsx.small"), 1, 20_000, true);
    fsx(&s, &format!("flen = 262144\n{FSX_ALL_OPS}"), &home.join("fsx.small2"), 2, 20_000, true);
    // As root in a shared space: a 16 MiB file, operations up to 1 MiB (many FUSE requests each).
    let big = format!("flen = 16777216\n[opsize]\nmax = 1048576\n{FSX_ALL_OPS}");
    fsx(&s, &big, &shared.join("fsx.big"), 3, 5_000, false);
}

#[test]
fn unlink_of_an_open_file_keeps_it_usable_through_the_fd() {
    let s = Served::start();
    let d = s.data_dir("home/0", 0o755, 0);
    let path = d.join("open");
    let mut f = fs::OpenOptions::new().read(true).write(true).create_new(true).open(&path).unwrap();
    f.write_all(b"before unlink\n").unwrap();
    fs::remove_file(&path).unwrap();
    assert_eq!(errno(fs::metadata(&path)), libc::ENOENT);
    // Still readable and writable, and fstat says it has no name.
    assert_eq!(f.metadata().unwrap().nlink(), 0);
    f.write_all(b"after unlink\n").unwrap();
    let mut back = String::new();
    f.seek(SeekFrom::Start(0)).unwrap();
    f.read_to_string(&mut back).unwrap();
    assert_eq!(back, "before unlink\nafter unlink\n");
    // A new file of the same name is another file.
    fs::write(&path, b"new").unwrap();
    assert_ne!(fs::metadata(&path).unwrap().ino(), f.metadata().unwrap().ino());
    f.write_all_at(b"B", 0).unwrap();
    assert_eq!(fs::read(&path).unwrap(), b"new");
    // Its attributes still change through the fd.
    f.set_len(6).unwrap();
    assert_eq!(f.metadata().unwrap().len(), 6);
    f.set_permissions(fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(f.metadata().unwrap().mode() & 0o7777, 0o600);
    let mut buf = [0u8; 6];
    f.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(&buf, b"Before");
    drop(f);
    assert_eq!(fs::read_dir(s.storage.join("home/0")).unwrap().count(), 1, "only the new file is left");
}

#[test]
fn rename_of_a_directory_over_a_directory() {
    let s = Served::start();
    let d = s.data_dir("shared/p", 0o755, 0);
    fs::create_dir_all(d.join("a/x")).unwrap();
    fs::write(d.join("a/x/inner"), b"inner").unwrap();
    fs::create_dir(d.join("empty")).unwrap();
    fs::create_dir_all(d.join("full/y")).unwrap();
    // Over an empty directory: replaced; everything below moves along.
    let a_ino = fs::metadata(d.join("a")).unwrap().ino();
    fs::rename(d.join("a"), d.join("empty")).unwrap();
    assert_eq!(errno(fs::metadata(d.join("a"))), libc::ENOENT);
    assert_eq!(fs::metadata(d.join("empty")).unwrap().ino(), a_ino);
    assert_eq!(fs::read(d.join("empty/x/inner")).unwrap(), b"inner");
    fs::write(d.join("empty/x/new"), b"new").unwrap();
    assert_eq!(fs::read(s.storage.join("shared/p/empty/x/new")).unwrap(), b"new");
    // Over a non-empty directory: ENOTEMPTY, nothing moves.
    assert_eq!(errno(fs::rename(d.join("empty"), d.join("full"))), libc::ENOTEMPTY);
    assert!(fs::metadata(d.join("full/y")).unwrap().is_dir());
    assert_eq!(fs::read(d.join("empty/x/inner")).unwrap(), b"inner");
    // Over a file, or a file over a directory.
    fs::write(d.join("file"), b"f").unwrap();
    assert_eq!(errno(fs::rename(d.join("empty"), d.join("file"))), libc::ENOTDIR);
    assert_eq!(errno(fs::rename(d.join("file"), d.join("full"))), libc::EISDIR);
    // Into its own subdirectory.
    assert_eq!(errno(fs::rename(d.join("empty"), d.join("empty/x/loop"))), libc::EINVAL);
    // RENAME_EXCHANGE of two directories swaps what is below them too.
    let cwd = rustix::fs::open(
        &d,
        rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::RDONLY,
        rustix::fs::Mode::empty(),
    )
    .unwrap();
    rustix::fs::renameat_with(&cwd, "empty", &cwd, "full", rustix::fs::RenameFlags::EXCHANGE).unwrap();
    assert_eq!(fs::read(d.join("full/x/inner")).unwrap(), b"inner");
    assert!(fs::metadata(d.join("empty/y")).unwrap().is_dir());
    assert_eq!(errno(fs::metadata(d.join("full/y"))), libc::ENOENT);
}

#[test]
fn readdir_while_another_thread_creates_files() {
    const N: usize = 2000;
    let s = Served::start();
    let d = s.data_dir("home/0/many", 0o755, 0);
    let creator = {
        let d = d.clone();
        std::thread::spawn(move || {
            for i in 0..N {
                fs::File::create(d.join(format!("f{i:05}"))).unwrap();
            }
        })
    };
    let mut listings = 0;
    loop {
        let done = creator.is_finished();
        let mut seen = HashSet::new();
        for e in fs::read_dir(&d).unwrap() {
            let name = e.unwrap().file_name().into_string().unwrap();
            assert!(name.starts_with('f') && name.len() == 6, "unexpected entry {name:?}");
            assert!(seen.insert(name.clone()), "{name} listed twice in one pass");
        }
        listings += 1;
        if done {
            assert_eq!(seen.len(), N, "every file is listed at the end");
            break;
        }
    }
    creator.join().unwrap();
    assert!(listings > 1, "listed while creating");
}

#[test]
fn large_sparse_file_at_4_gib() {
    const AT: u64 = 4 << 30;
    let s = Served::start();
    let d = s.data_dir("home/0", 0o755, 0);
    let path = d.join("sparse");
    let f = fs::OpenOptions::new().read(true).write(true).create_new(true).open(&path).unwrap();
    f.write_all_at(b"the end", AT).unwrap();
    drop(f);
    let meta = fs::metadata(&path).unwrap();
    assert_eq!(meta.len(), AT + 7);
    assert!(meta.blocks() < 1024, "holes take no space: {} blocks of 512 bytes", meta.blocks());
    let f = fs::File::open(&path).unwrap();
    for at in [0, 4096, 1 << 30, (2 << 30) + 12345, AT - 4096] {
        let mut buf = vec![0xffu8; 4096];
        f.read_exact_at(&mut buf, at).unwrap();
        assert!(buf.iter().all(|&b| b == 0), "the hole at {at} reads as zeros");
    }
    let mut tail = Vec::new();
    (&f).seek(SeekFrom::Start(AT - 3)).unwrap();
    (&f).read_to_end(&mut tail).unwrap();
    assert_eq!(tail, b"\0\0\0the end");
    // Extending by truncate is sparse too; shrinking below 4 GiB drops the data.
    let w = fs::OpenOptions::new().write(true).open(&path).unwrap();
    w.set_len(8 << 30).unwrap();
    assert_eq!(fs::metadata(&path).unwrap().len(), 8 << 30);
    w.set_len(AT).unwrap();
    let meta = fs::metadata(&path).unwrap();
    assert_eq!((meta.len(), meta.blocks() < 1024), (AT, true));
    assert_eq!(fs::metadata(s.storage.join("home/0/sparse")).unwrap().len(), AT);
}

/// Names beginning with a dot were hidden everywhere, so dotfiles (`.tshrc`, `.git`, a queue's
/// temporary files) could be created in home/ but then not found; pjdfstest could not start.
#[test]
fn dotfiles_in_home_and_shared_are_ordinary_files() {
    let s = Served::start();
    let d = s.data_dir("home/0", 0o755, 0);
    fs::write(d.join(".tshrc"), b"CTX_PATH=/ctx/tool\n").unwrap();
    fs::create_dir(d.join(".git")).unwrap();
    let names: Vec<String> =
        fs::read_dir(&d).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    assert!(names.contains(&".tshrc".to_owned()) && names.contains(&".git".to_owned()), "{names:?}");
    assert_eq!(fs::read(d.join(".tshrc")).unwrap(), b"CTX_PATH=/ctx/tool\n");
    let q = s.data_dir("shared/q", 0o755, 0);
    fs::write(q.join(".job.tmp"), b"x").unwrap();
    fs::rename(q.join(".job.tmp"), q.join("job")).unwrap();
    assert_eq!(fs::read(q.join("job")).unwrap(), b"x");
    // Staging residue among objects stays hidden.
    fs::create_dir(s.storage.join("tool/.cortexfs-stage.x.1.2")).unwrap();
    assert_eq!(fs::read_dir(s.p("tool")).unwrap().count(), 0);
}

/// New entries took the server's umask on top of the caller's, and always the caller's group.
#[test]
fn new_entries_get_the_asked_mode_and_a_setgid_directory_group() {
    let s = Served::start();
    let d = s.data_dir("shared/team", 0o777, 0);
    let out = as_nobody(&format!(
        "umask 0; cd {}; mkdir open && touch open/f && mkfifo open/p && stat -c '%a %u:%g' open open/f open/p",
        d.display()
    ));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "777 65534:65534\n666 65534:65534\n666 65534:65534\n",
        "{}",
        text(&out)
    );
    // In a set-group-ID directory, entries take its group; directories keep the bit.
    rustix::fs::chown(s.storage.join("shared/team"), None, Some(rustix::fs::Gid::from_raw(1234))).unwrap();
    fs::set_permissions(s.storage.join("shared/team"), fs::Permissions::from_mode(0o2777)).unwrap();
    std::thread::sleep(Duration::from_millis(1100)); // the attribute timeout of storage entries
    let out = as_nobody(&format!(
        "umask 022; cd {}; touch g && mkdir sub && stat -c '%a %u:%g' g sub",
        d.display()
    ));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "644 65534:1234\n2755 65534:1234\n", "{}", text(&out));
}

/// Hard links had an inode each, so they showed different inode numbers and stale link counts.
#[test]
fn hard_links_share_one_inode() {
    let s = Served::start();
    let d = s.data_dir("home/0", 0o755, 0);
    fs::write(d.join("a"), b"a").unwrap();
    fs::hard_link(d.join("a"), d.join("b")).unwrap();
    let (a, b) = (fs::metadata(d.join("a")).unwrap(), fs::metadata(d.join("b")).unwrap());
    assert_eq!((a.ino(), a.nlink()), (b.ino(), 2));
    fs::write(d.join("b"), b"via b").unwrap();
    assert_eq!(fs::read(d.join("a")).unwrap(), b"via b");
    fs::remove_file(d.join("a")).unwrap();
    assert_eq!(fs::metadata(d.join("b")).unwrap().nlink(), 1, "seen at once, not after a timeout");
    fs::rename(d.join("b"), d.join("c")).unwrap();
    assert_eq!(fs::read(d.join("c")).unwrap(), b"via b");
}

/// With atomic O_TRUNC the server truncated at OPEN, before the kernel's ETXTBSY check of
/// open(O_RDONLY | O_TRUNC), so a running program lost its executable (and died of SIGBUS) while
/// the caller was told ETXTBSY. Controls still take O_TRUNC as "replace whole".
#[test]
fn truncating_open_of_a_running_executable_fails_and_keeps_it() {
    let s = Served::start();
    let d = s.data_dir("home/0/tool", 0o755, 0);
    let exe = d.join("sleeper");
    fs::copy("/bin/sleep", &exe).unwrap();
    fs::set_permissions(&exe, fs::Permissions::from_mode(0o755)).unwrap();
    let size = fs::metadata(&exe).unwrap().len();
    let mut child = Command::new(&exe).arg("30").spawn().unwrap();
    for _ in 0..20 {
        let r = fs::OpenOptions::new().read(true).custom_flags(libc::O_TRUNC).open(&exe);
        assert_eq!(errno(r), libc::ETXTBSY);
        assert_eq!(errno(fs::OpenOptions::new().write(true).open(&exe)), libc::ETXTBSY);
    }
    assert_eq!(fs::metadata(s.storage.join("home/0/tool/sleeper")).unwrap().len(), size, "not truncated");
    std::thread::sleep(Duration::from_millis(100));
    assert!(child.try_wait().unwrap().is_none(), "the program still runs");
    child.kill().unwrap();
    child.wait().unwrap();
    // Once it is gone, O_TRUNC truncates.
    fs::OpenOptions::new().write(true).truncate(true).open(&exe).unwrap();
    assert_eq!(fs::metadata(&exe).unwrap().len(), 0);

    // A control opened with O_TRUNC is replaced whole on close; truncate(2) alone is refused.
    let dir = s.storage.join("tool/t.d");
    fs::create_dir_all(&dir).unwrap();
    fs::write(s.storage.join("tool/t"), b"#!/bin/sh\n").unwrap();
    fs::write(dir.join("description"), b"old\n").unwrap();
    let control = s.p("tool/t.d/description");
    fs::write(&control, b"new\n").unwrap();
    assert_eq!(fs::read(&control).unwrap(), b"new\n");
    assert_eq!(
        errno(fs::OpenOptions::new().write(true).open(&control).and_then(|f| f.set_len(0))),
        libc::EPERM
    );
    assert_eq!(fs::read(&control).unwrap(), b"new\n");
}

/// chmod went through chmodat(2), which follows a symlink: a symlink put in storage where a
/// file the kernel knows was made the server (root) change the mode of what it points to.
#[test]
fn chmod_never_follows_a_symlink_swapped_into_storage() {
    let s = Served::start();
    let d = s.data_dir("home/0", 0o755, 0);
    let outside = s.dir.path().join("outside");
    fs::write(&outside, b"secret").unwrap();
    fs::set_permissions(&outside, fs::Permissions::from_mode(0o600)).unwrap();
    let f = fs::File::create(d.join("f")).unwrap();
    let backing = s.storage.join("home/0/f");
    fs::remove_file(&backing).unwrap();
    std::os::unix::fs::symlink(&outside, &backing).unwrap();
    assert_ne!(errno(f.set_permissions(fs::Permissions::from_mode(0o666))), 0);
    assert_eq!(fs::metadata(&outside).unwrap().mode() & 0o7777, 0o600, "the target is untouched");
}

/// Every unlink scanned all of a file's known links (`rm -rf` of 16,000 links took 14.4 s), and
/// every rename scanned every known entry. Pins what must stay right now that neither scans:
/// each link of a file with 16,000 goes, renamed files and directories (with known entries
/// below them) are found at their new paths and not at their old ones.
#[test]
fn sixteen_thousand_links_go_and_renames_move_what_the_kernel_knows() {
    let s = Served::start();
    let d = s.mnt.join("home/0/links");
    fs::create_dir_all(&d).unwrap();
    fs::write(d.join("f"), "one file\n").unwrap();
    for i in 0..16_000 {
        fs::hard_link(d.join("f"), d.join(format!("l{i}"))).unwrap();
    }
    assert_eq!(fs::metadata(d.join("l15999")).unwrap().nlink(), 16_001);
    let rm = Command::new("rm").arg("-rf").arg(&d).output().unwrap();
    assert!(rm.status.success(), "{}", text(&rm));
    assert!(!s.storage.join("home/0/links").exists());

    let r = s.mnt.join("home/0/r");
    fs::create_dir_all(r.join("dir/sub")).unwrap();
    for i in 0..2_000 {
        fs::write(r.join(format!("k{i}")), format!("{i}\n")).unwrap();
    }
    fs::write(r.join("dir/sub/deep"), "deep\n").unwrap();
    for i in 0..2_000 {
        fs::metadata(r.join(format!("k{i}"))).unwrap();
    }
    assert_eq!(fs::read_to_string(r.join("dir/sub/deep")).unwrap(), "deep\n");
    // A file renamed again and again (an editor's atomic save, a queue's publish).
    fs::write(r.join("a"), "a\n").unwrap();
    for i in 0..100 {
        fs::rename(
            r.join(if i == 0 { "a".to_owned() } else { format!("a{}", i - 1) }),
            r.join(format!("a{i}")),
        )
        .unwrap();
    }
    assert_eq!(fs::read_to_string(r.join("a99")).unwrap(), "a\n");
    assert!(!r.join("a98").exists() && !r.join("a").exists());
    // A directory renamed with a known entry below it, then a file over a known file.
    fs::rename(r.join("dir"), r.join("moved")).unwrap();
    assert_eq!(fs::read_to_string(r.join("moved/sub/deep")).unwrap(), "deep\n");
    assert!(!r.join("dir").exists());
    fs::write(r.join("moved/sub/deep"), "changed\n").unwrap();
    assert_eq!(fs::read_to_string(s.storage.join("home/0/r/moved/sub/deep")).unwrap(), "changed\n");
    fs::rename(r.join("k1"), r.join("k2")).unwrap();
    assert_eq!(fs::read_to_string(r.join("k2")).unwrap(), "1\n");
    assert!(!r.join("k1").exists());
}

/// `readdir` gave `d_ino` 2^64-1 for every entry (so `os.scandir(...).inode()` never equalled
/// `st_ino`) and typed FIFOs and devices as regular files (`find -type p` found nothing, and a
/// walker trusting `d_type` opened a FIFO and blocked). Each entry's `d_ino` is its `st_ino`,
/// its type the backing file's.
#[test]
fn readdir_gives_each_entry_its_st_ino_and_its_true_type() {
    let s = Served::start();
    let d = s.data_dir("home/0", 0o755, 0);
    let script = r#"
import os, stat, sys
d = sys.argv[1]
open(os.path.join(d, "file"), "w").close()
os.mkdir(os.path.join(d, "dir"))
os.mkfifo(os.path.join(d, "fifo"))
os.symlink("file", os.path.join(d, "link"))
os.mknod(os.path.join(d, "null"), 0o600 | stat.S_IFCHR, os.makedev(1, 3))
for e in sorted(os.scandir(d), key=lambda e: e.name):
    st = os.lstat(e.path)
    kind = stat.S_IFMT(st.st_mode)
    typed = {"file": e.is_file(follow_symlinks=False), "dir": e.is_dir(follow_symlinks=False),
             "link": e.is_symlink()}
    print(e.name, e.inode() == st.st_ino, kind == stat.S_IFIFO, kind == stat.S_IFCHR,
          typed["file"], typed["dir"], typed["link"])
"#;
    let o = Command::new("python3").args(["-c", script]).arg(&d).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let got = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(
        got,
        "dir True False False False True False\n\
         fifo True True False False False False\n\
         file True False False True False False\n\
         link True False False False False True\n\
         null True False True False False False\n",
        "name, d_ino == st_ino, FIFO, char device, then what d_type says: file, dir, link"
    );
    let o = Command::new("find").arg(&d).args(["-type", "p"]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), d.join("fifo").to_str().unwrap());
    // The root's entries and CortexFS's own agree too.
    let o = Command::new("python3")
        .args(["-c", "import os,sys\nfor e in os.scandir(sys.argv[1]): print(e.name, e.inode() == os.lstat(e.path).st_ino)"])
        .arg(&s.mnt)
        .output()
        .unwrap();
    let root = String::from_utf8_lossy(&o.stdout);
    assert!(root.lines().count() == 7 && root.lines().all(|l| l.ends_with(" True")), "{root}");
}

/// `fstat`/`fchmod` of an open directory after `rmdir`, of an unlinked FIFO, and `stat(".")`
/// in a removed working directory answered ENOENT; ext4 answers with the object (`st_nlink`
/// 0 for the directory). Every open object keeps its attributes after its last name is gone.
#[test]
fn open_objects_keep_their_attributes_after_their_last_name_goes() {
    let s = Served::start();
    let d = s.data_dir("home/0", 0o755, 0);
    let script = r#"
import os, sys
d = sys.argv[1]
gone = os.path.join(d, "gone")
os.mkdir(gone)
fd = os.open(gone, os.O_RDONLY | os.O_DIRECTORY)
os.rmdir(gone)
st = os.fstat(fd)
os.fchmod(fd, 0o700)
print("dir", st.st_nlink, oct(os.fstat(fd).st_mode & 0o7777))
fifo = os.path.join(d, "fifo")
os.mkfifo(fifo)
ff = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
os.unlink(fifo)
print("fifo", os.fstat(ff).st_nlink)
cwd = os.path.join(d, "cwd")
os.mkdir(cwd)
os.chdir(cwd)
os.rmdir(cwd)
print("cwd", os.stat(".").st_nlink)
"#;
    let o = Command::new("python3").args(["-c", script]).arg(&d).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "dir 0 0o700\nfifo 0\ncwd 0\n");
}
