//! Shared set-up of the whole-system benchmarks: the release binaries and a real `ctx mount`.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The directory holding the binaries of this build profile (`target/release` for benches).
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("bench path");
    exe.parent().and_then(Path::parent).expect("target/<profile>").to_path_buf()
}

/// Why a whole-system benchmark cannot run here (not root, no /dev/fuse, binaries missing).
pub fn unmet(bins: &[&str]) -> Option<String> {
    let dir = bin_dir();
    let missing: Vec<&&str> = bins.iter().filter(|b| !dir.join(b).exists()).collect();
    if !rustix::process::geteuid().is_root() || !Path::new("/dev/fuse").exists() || !missing.is_empty() {
        return Some(format!("needs root, /dev/fuse and release binaries; missing {missing:?}"));
    }
    None
}

/// The `p` quantile (0..=1) of `v`, which it sorts.
pub fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// A `ctx mount` on fresh storage under /var/tmp, bootstrapped; stopped on drop.
#[derive(Debug)]
pub struct Mounted {
    child: Child,
    /// The temporary directory holding everything.
    pub dir: tempfile::TempDir,
    /// The storage.
    pub storage: PathBuf,
    /// The mount point.
    pub mnt: PathBuf,
    /// The daemon's control socket.
    pub control: PathBuf,
}

impl Mounted {
    /// Mounts, waits for `status`, runs `ctx bootstrap`.
    pub fn start() -> Mounted {
        let bins = bin_dir();
        let dir = tempfile::tempdir_in("/var/tmp").expect("temp dir");
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
        let storage = dir.path().join("storage");
        let mnt = dir.path().join("ctx");
        let control = dir.path().join("control.sock");
        fs::create_dir(&mnt).expect("mount point");
        let child = Command::new(bins.join("ctx"))
            .arg("mount")
            .arg("--source")
            .arg(&storage)
            .arg(&mnt)
            .arg("--control")
            .arg(&control)
            .stdout(Stdio::null())
            .spawn()
            .expect("ctx mount");
        let m = Mounted { child, dir, storage, mnt, control };
        let t = Instant::now();
        while fs::read(m.mnt.join("status")).is_err() {
            assert!(t.elapsed() < Duration::from_secs(10), "ctx mount did not come up");
            std::thread::sleep(Duration::from_millis(20));
        }
        m.ctx(&["bootstrap", &m.storage.to_string_lossy()]);
        m
    }

    /// Runs `ctx ARGS` and requires success.
    pub fn ctx(&self, args: &[&str]) {
        let out = Command::new(bin_dir().join("ctx")).args(args).output().expect("spawn ctx");
        assert!(out.status.success(), "ctx {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_child(&self.child),
            rustix::process::Signal::TERM,
        );
        let _ = self.child.wait();
        let _ = Command::new("umount").arg("-l").arg(&self.mnt).stderr(Stdio::null()).status();
    }
}

/// A 200-byte JSON line, as a session's event: writer `w`'s record `i`.
pub fn record(w: usize, i: usize) -> Vec<u8> {
    let mut r = format!(
        "{{\"ts\":\"2026-06-22T12:00:00Z\",\"type\":\"tool.call\",\"agent\":\"coder\",\"thread\":{w},\"i\":{i},\"pad\":\""
    );
    while r.len() < 198 {
        r.push('x');
    }
    r.push_str("\"}\n");
    r.into_bytes()
}

/// What a whole-system benchmark found, for `make bench`'s report (`bench/report.md`): each
/// table as it was printed, and the values of each ratio to plot. [`Report::save`] writes it
/// to `target/bench-results/<bench>.json`, where `bench-report` reads it.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Report {
    /// The benchmark.
    pub bench: String,
    /// The command that made it.
    pub command: String,
    /// What it measured, in a sentence or two.
    pub about: String,
    /// Its tables.
    pub tables: Vec<Table>,
    /// Its plots.
    pub plots: Vec<Plot>,
}

/// A table of a report, in Markdown's columns.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Table {
    /// Its title.
    pub title: String,
    /// Column headings.
    pub header: Vec<String>,
    /// Rows of cells.
    pub rows: Vec<Vec<String>>,
}

/// A grouped bar chart: one group per category, one bar per series.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Plot {
    /// The file name's stem (`<bench>-<id>.svg`).
    pub id: String,
    /// Its title.
    pub title: String,
    /// What the categories are.
    pub x: String,
    /// What the values are.
    pub y: String,
    /// The categories, in order.
    pub categories: Vec<String>,
    /// Each series: its name and one value per category (`None`: not measured).
    pub series: Vec<(String, Vec<Option<f64>>)>,
    /// A value drawn as a line across the chart, with its label (a goal, or parity).
    pub mark: Option<(f64, String)>,
}

impl Report {
    /// A report of `bench`, made by `command`.
    pub fn new(bench: &str, command: &str, about: &str) -> Report {
        Report {
            bench: bench.into(),
            command: command.into(),
            about: about.into(),
            tables: Vec::new(),
            plots: Vec::new(),
        }
    }

    /// Prints a table (Markdown) and keeps it.
    pub fn table(&mut self, title: &str, header: &[&str], rows: Vec<Vec<String>>) {
        println!("\n{title}:\n");
        println!("| {} |", header.join(" | "));
        let align: Vec<&str> = (0..header.len()).map(|i| if i == 0 { "---" } else { "---:" }).collect();
        println!("|{}|", align.join("|"));
        for r in &rows {
            println!("| {} |", r.join(" | "));
        }
        self.tables.push(Table {
            title: title.into(),
            header: header.iter().map(|h| (*h).to_owned()).collect(),
            rows,
        });
    }

    /// Keeps a plot.
    pub fn plot(&mut self, p: Plot) {
        self.plots.push(p);
    }

    /// Writes the report under `target/bench-results/`.
    pub fn save(&self) {
        let dir = results_dir();
        let _ = fs::create_dir_all(&dir);
        let path = dir.join(format!("{}.json", self.bench));
        match serde_json::to_vec_pretty(self) {
            Ok(b) => {
                if let Err(e) = fs::write(&path, b) {
                    eprintln!("{}: {e}", path.display());
                }
            }
            Err(e) => eprintln!("{}: {e}", self.bench),
        }
    }
}

/// Where reports are kept: the workspace's `target/bench-results`.
pub fn results_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench-results")
}
