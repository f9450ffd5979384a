//! `ctx mount --virtiofs` against QEMU's C virtiofsd, measured inside one guest, in one run.
//!
//! Builds a tree (1,000 files of 4 KiB and one 64 MiB file under `home/0/bench/`) in a fresh
//! `ctx bootstrap` storage under /var/tmp and copies that storage. Four vhost-user daemons serve
//! it: `ctx mount --virtiofs` with the host view and with an agent's view of the storage, and
//! `/usr/lib/qemu/virtiofsd` exporting the copy with `cache=auto` (its default) and with
//! `cache=always`. One QEMU guest (software emulation, the host's cloud kernel, one vCPU) mounts
//! all four and runs a small static C program (compiled here with `cc`) that times, round by
//! round with the order of the mounts rotated:
//!
//! - stat: `stat` of the same file, again and again;
//! - stat, forced: `statx(AT_STATX_FORCE_SYNC)` of the same file (one GETATTR each);
//! - open + read 4 KiB + close of the same file;
//! - readdir: open, list all 1,000 entries, close;
//! - sequential read: open the 64 MiB file, read it in 1 MiB `read`s, close;
//! - sequential read, uncached: the same after dropping the guest's pages of the file
//!   (`posix_fadvise(DONTNEED)`, not timed).
//!
//! Each (row, mount) runs for about 250 ms of guest time per round (the iteration count is
//! sized in a warm-up round and then fixed). The table gives the median over the rounds, the
//! ratio virtiofsd time / ctx time (1.0x or more: ctx as fast as virtiofsd or faster), and the
//! requests per iteration the ctx daemons counted (their `status` files). Needs root, QEMU, the
//! cloud kernel, busybox, cpio, `cc`, virtiofsd and the release binaries; prints "not run"
//! otherwise.

#[allow(dead_code)]
#[path = "../../tests/src/vm.rs"]
mod vm;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const VIRTIOFSD: &str = "/usr/lib/qemu/virtiofsd";
const FILES: usize = 1000;
const SMALL: usize = 4096;
const BIG: usize = 64 << 20;
const ROUNDS: usize = 7;
/// Guest time each (row, mount) is measured for, per round.
const BUDGET_MS: u32 = 250;
/// Rows: the guest program's name, most iterations per round, what the table calls it.
const ROWS: [(&str, usize, &str); 6] = [
    ("stat", 100_000, "stat (same file)"),
    ("stat_forced", 10_000, "stat, forced GETATTR (`AT_STATX_FORCE_SYNC`)"),
    ("open_read_close", 10_000, "open + read 4 KiB + close"),
    ("readdir", 1000, "readdir of 1,000 entries"),
    ("seqread", 100, "sequential read of 64 MiB, 1 MiB reads"),
    ("seqread_uncached", 100, "sequential read of 64 MiB, uncached in the guest"),
];
/// Mount tags, in the guest program's order.
const TARGETS: [&str; 4] = ["ctx", "agent", "auto", "always"];

/// The guest side: times each row on each mount given as NAME=DIR.
const GUEST_C: &str = r#"
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static void die(const char *what, const char *path) {
  printf("BENCH-FAIL %s %s\n", what, path);
  fflush(stdout);
  exit(1);
}

static char buf[1 << 20];

/* The `requests` counter of ROOT/status (ctx only), or -1. */
static long requests(const char *root) {
  char path[512], line[256];
  snprintf(path, sizeof path, "%s/status", root);
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  long n = -1;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "requests %ld", &n) == 1) break;
  fclose(f);
  return n;
}

/* Nanoseconds per iteration of row OP on the tree under ROOT, N iterations. */
static double row(const char *op, const char *root, int n) {
  char path[512];
  double t0 = now_ns();
  if (!strcmp(op, "stat")) {
    snprintf(path, sizeof path, "%s/home/0/bench/f0000", root);
    struct stat st;
    for (int i = 0; i < n; i++)
      if (stat(path, &st)) die("stat", path);
  } else if (!strcmp(op, "stat_forced")) {
    snprintf(path, sizeof path, "%s/home/0/bench/f0000", root);
    struct statx stx;
    for (int i = 0; i < n; i++)
      if (statx(AT_FDCWD, path, AT_STATX_FORCE_SYNC, STATX_BASIC_STATS, &stx)) die("statx", path);
  } else if (!strcmp(op, "open_read_close")) {
    snprintf(path, sizeof path, "%s/home/0/bench/f0000", root);
    for (int i = 0; i < n; i++) {
      int fd = open(path, O_RDONLY);
      if (fd < 0) die("open", path);
      if (read(fd, buf, 4096) != 4096) die("read", path);
      close(fd);
    }
  } else if (!strcmp(op, "readdir")) {
    snprintf(path, sizeof path, "%s/home/0/bench", root);
    for (int i = 0; i < n; i++) {
      DIR *d = opendir(path);
      if (!d) die("opendir", path);
      int k = 0;
      while (readdir(d)) k++;
      closedir(d);
      if (k != 1003) die("readdir count", path);
    }
  } else if (!strcmp(op, "seqread") || !strcmp(op, "seqread_uncached")) {
    snprintf(path, sizeof path, "%s/home/0/bench/big", root);
    int uncached = !strcmp(op, "seqread_uncached");
    double untimed = 0;
    for (int i = 0; i < n; i++) {
      int fd = open(path, O_RDONLY);
      if (fd < 0) die("open", path);
      if (uncached) {
        double d0 = now_ns();
        if (posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)) die("fadvise", path);
        untimed += now_ns() - d0;
      }
      ssize_t r;
      long total = 0;
      while ((r = read(fd, buf, sizeof buf)) > 0) total += r;
      if (r < 0 || total != BIG) die("read", path);
      close(fd);
    }
    t0 += untimed;
  } else {
    die("unknown row", op);
  }
  return (now_ns() - t0) / n;
}

/* guestbench ROUNDS BUDGET_MS OP:MAX... -- NAME=ROOT...
   Round 0 is a warm-up that also sizes each (row, mount): doubling iteration counts until a run
   takes 100 ms gives the time of one iteration, and the measured rounds then run
   BUDGET_MS / that many iterations (1 to MAX). Prints, per measured round:
   RESULT OP NAME ROUND NS_PER_ITERATION REQUESTS_PER_ITERATION (-1: no status file). */
int main(int argc, char **argv) {
  int rounds = atoi(argv[1]);
  double budget = atof(argv[2]) * 1e6;
  int first = 3, sep = first;
  while (sep < argc && strcmp(argv[sep], "--")) sep++;
  int ops = sep - first, targets = argc - sep - 1;
  static int iters[32][8];
  for (int r = 0; r <= rounds; r++) {
    for (int o = 0; o < ops; o++) {
      char op[64];
      snprintf(op, sizeof op, "%s", argv[first + o]);
      char *colon = strchr(op, ':');
      int max = atoi(colon + 1);
      *colon = 0;
      for (int k = 0; k < targets; k++) {
        int t = (k + r) % targets;
        char name[64];
        snprintf(name, sizeof name, "%s", argv[sep + 1 + t]);
        char *eq = strchr(name, '=');
        *eq = 0;
        const char *root = eq + 1;
        if (r == 0) {
          int n = 1;
          double ns;
          while ((ns = row(op, root, n)) * n < 1e8 && n < max) n *= 2;
          double want = budget / ns;
          iters[o][t] = want < 1 ? 1 : want > max ? max : (int)want;
          continue;
        }
        int n = iters[o][t];
        long r1 = requests(root), r2 = requests(root);
        double ns = row(op, root, n);
        long r3 = requests(root);
        double per = r1 < 0 ? -1 : (double)(r3 - r2 - (r2 - r1)) / n;
        printf("RESULT %s %s %d %.1f %.3f\n", op, name, r, ns, per);
        fflush(stdout);
      }
    }
  }
  printf("BENCH-DONE\n");
  return 0;
}
"#;

/// A daemon this bench started; ended on drop.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_child(&self.0),
            rustix::process::Signal::TERM,
        );
        let _ = self.0.wait();
    }
}

fn wait_socket(p: &Path) {
    let t = Instant::now();
    while !fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_socket()) {
        assert!(t.elapsed() < Duration::from_secs(10), "{} did not appear", p.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn run(c: &mut Command) {
    let out = c.output().expect("spawn");
    assert!(out.status.success(), "{c:?}: {}", String::from_utf8_lossy(&out.stderr));
}

fn unmet() -> Option<String> {
    if let Some(why) = bench::unmet(&["ctx", "tsh", "cortexfs-core"]) {
        return Some(why);
    }
    if let Some(why) = vm::unmet() {
        return Some(why);
    }
    if !Path::new(VIRTIOFSD).exists() {
        return Some(format!("{VIRTIOFSD} is missing (Debian qemu-system-common)"));
    }
    if Command::new("cc").arg("--version").output().is_err() {
        return Some("cc is missing (Debian gcc)".to_owned());
    }
    None
}

/// The storage with the bench tree and an agent `bench` (uid 0) whose view shows `home/0/`.
fn tree(dir: &Path) -> PathBuf {
    let st = dir.join("storage");
    run(Command::new(bench::bin_dir().join("ctx")).arg("bootstrap").arg(&st));
    let b = st.join("home/0/bench");
    fs::create_dir_all(&b).expect("bench dir");
    let small: Vec<u8> = (0..SMALL).map(|i| (i % 251) as u8).collect();
    for i in 0..FILES {
        fs::write(b.join(format!("f{i:04}")), &small).expect("small file");
    }
    let big: Vec<u8> = (0..BIG).map(|i| (i % 253) as u8).collect();
    fs::write(b.join("big"), big).expect("big file");
    fs::create_dir_all(st.join("agent/bench.d")).expect("agent");
    fs::write(st.join("agent/bench"), "#!/bin/sh\n").expect("agent");
    fs::set_permissions(st.join("agent/bench"), fs::Permissions::from_mode(0o755)).expect("chmod");
    fs::write(st.join("agent/bench.d/label"), "bench_t\n").expect("label");
    fs::write(st.join("agent/bench.d/uid"), "0\n").expect("uid");
    fs::write(st.join("agent/bench.d/policy"), "").expect("policy");
    st
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn shown(op: &str, ns: f64) -> String {
    match op {
        "seqread" | "seqread_uncached" => {
            format!("{:.1} ms ({:.2} GiB/s)", ns / 1e6, BIG as f64 / (ns / 1e9) / f64::from(1u32 << 30))
        }
        "readdir" => format!("{:.0} us", ns / 1e3),
        _ => format!("{:.1} us", ns / 1e3),
    }
}

fn main() {
    if let Some(why) = unmet() {
        println!("virtiofs: not run ({why})");
        return;
    }
    let bins = bench::bin_dir();
    let dir = tempfile::tempdir_in("/var/tmp").expect("temp dir");
    let st = tree(dir.path());
    let copy = dir.path().join("copy");
    run(Command::new("cp").arg("-a").arg(&st).arg(&copy));
    let program = dir.path().join("guestbench");
    let source = dir.path().join("guestbench.c");
    fs::write(&source, GUEST_C).expect("source");
    run(Command::new("cc")
        .args(["-O2", "-static", &format!("-DBIG={BIG}L"), "-o"])
        .arg(&program)
        .arg(&source));

    let sock = |t: &str| dir.path().join(format!("{t}.sock"));
    let ctx = |extra: &[&str], t: &str| {
        let child = Command::new(bins.join("ctx"))
            .args(["mount", "--virtiofs"])
            .arg(sock(t))
            .arg("--source")
            .arg(&st)
            .args(extra)
            .stderr(Stdio::null())
            .spawn()
            .expect("ctx mount --virtiofs");
        Daemon(child)
    };
    let virtiofsd = |cache: &str, t: &str| {
        let child = Command::new(VIRTIOFSD)
            .arg(format!("--socket-path={}", sock(t).display()))
            .arg("-o")
            .arg(format!("source={}", copy.display()))
            .arg("-o")
            .arg(format!("cache={cache}"))
            .stderr(Stdio::null())
            .spawn()
            .expect("virtiofsd");
        Daemon(child)
    };
    let _daemons = [
        ctx(&[], "ctx"),
        ctx(&["--agent", "bench", "--session", "b1"], "agent"),
        virtiofsd("auto", "auto"),
        virtiofsd("always", "always"),
    ];
    for t in TARGETS {
        wait_socket(&sock(t));
    }

    let rows: Vec<String> = ROWS.iter().map(|(op, n, _)| format!("{op}:{n}")).collect();
    let mounts: Vec<String> = TARGETS.iter().map(|t| format!("{t}=/mnt/{t}")).collect();
    let script = format!(
        "for t in {targets}; do mkdir -p /mnt/$t; mount -t virtiofs $t /mnt/$t || echo BENCH-FAIL mount $t; done\n\
         /bin/guestbench {ROUNDS} {BUDGET_MS} {rows} -- {mounts}\n",
        targets = TARGETS.join(" "),
        rows = rows.join(" "),
        mounts = mounts.join(" "),
    );
    let kit =
        vm::Kit::build(dir.path(), &script, &[("/bin/guestbench", &program, 0o755)]).expect("initramfs");
    let socks: Vec<PathBuf> = TARGETS.iter().map(|t| sock(t)).collect();
    let devices: Vec<vm::Device> =
        TARGETS.iter().zip(&socks).map(|(t, s)| vm::Device { socket: s, tag: t }).collect();
    let started = Instant::now();
    let mut guest = vm::Vm::boot(&kit, &devices, 1, "", false).expect("boot");
    guest.expect("BENCH-DONE", Duration::from_secs(900)).expect("the guest benchmark");
    let elapsed = started.elapsed();
    let _ = guest.wait(Duration::from_secs(60));
    let transcript = guest.transcript();
    assert!(!transcript.contains("BENCH-FAIL"), "{transcript}");

    // (op, target) -> (ns samples, requests per iteration samples)
    let mut samples: BTreeMap<(String, String), (Vec<f64>, Vec<f64>)> = BTreeMap::new();
    for l in transcript.lines().filter_map(|l| l.strip_prefix("RESULT ")) {
        let f: Vec<&str> = l.split_whitespace().collect();
        let [op, target, _round, ns, per] = f[..] else { continue };
        let e = samples.entry((op.to_owned(), target.to_owned())).or_default();
        e.0.push(ns.parse().expect("ns"));
        e.1.push(per.parse().expect("requests"));
    }
    let med = |op: &str, t: &str| -> (f64, f64) {
        let (ns, per) = samples.get(&(op.to_owned(), t.to_owned())).cloned().expect("samples");
        (median(ns), median(per))
    };
    println!(
        "virtiofs: one guest (1 vCPU, tcg), {ROUNDS} rounds after a warm-up, medians; guest run {:.0} s",
        elapsed.as_secs_f64()
    );
    println!(
        "| row | virtiofsd cache=auto | virtiofsd cache=always | ctx host view | ctx agent view | \
         host vs auto | host vs always | agent vs auto | requests/iteration host, agent |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (op, _, label) in ROWS {
        let (auto, _) = med(op, "auto");
        let (always, _) = med(op, "always");
        let (host, host_req) = med(op, "ctx");
        let (agent, agent_req) = med(op, "agent");
        println!(
            "| {label} | {} | {} | {} | {} | {:.2}x | {:.2}x | {:.2}x | {host_req:.2}, {agent_req:.2} |",
            shown(op, auto),
            shown(op, always),
            shown(op, host),
            shown(op, agent),
            auto / host,
            always / host,
            auto / agent,
        );
    }
}
