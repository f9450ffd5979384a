//! Resource ceilings for one sandbox, through cgroup v2 where the host's unified hierarchy has
//! the controller, else through the cgroup v1 hierarchy that has it (hybrid hosts such as
//! this project's test machines mount `memory`, `pids` and `cpu` as v1).
//!
//! Each run gets a group `cortexfs/<agent>.<session>` in every hierarchy that applies one of
//! its ceilings. The launcher places its sandbox there before it starts (a shell writes its own
//! pid into each `cgroup.procs`, then execs the sandbox), so nothing in the sandbox ever runs
//! outside it; the groups go when the run ends.
//!
//! | ceiling | cgroup v2 | cgroup v1 |
//! |---|---|---|
//! | memory | `memory.max`, `memory.swap.max` = 0 | `memory.limit_in_bytes`, `memory.memsw.limit_in_bytes` (when swap accounting is on) |
//! | pids | `pids.max` | `pids.max` |
//! | cpu | `cpu.max` = `QUOTA 100000` | `cpu.cfs_period_us` = 100000, `cpu.cfs_quota_us` = QUOTA |

use std::path::{Path, PathBuf};

use policy::limits::Limits;

/// Why a ceiling cannot be applied.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No hierarchy here has the controller.
    #[error("no cgroup hierarchy here has the {0} controller (neither cgroup v2 nor v1)")]
    Missing(&'static str),
    /// Writing a cgroup file failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io { path: path.to_path_buf(), source }
}

/// A controller as the kernel names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Controller {
    Memory,
    Pids,
    Cpu,
}

impl Controller {
    fn name(self) -> &'static str {
        match self {
            Controller::Memory => "memory",
            Controller::Pids => "pids",
            Controller::Cpu => "cpu",
        }
    }
}

/// Where a controller lives: the v2 unified root, or a v1 hierarchy's root.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Place {
    V2(PathBuf),
    V1(PathBuf),
}

/// The cgroup mounts of this host: (mount point, is v2, v1 controllers).
fn mounts() -> Vec<(PathBuf, bool, Vec<String>)> {
    let Ok(text) = std::fs::read_to_string("/proc/self/mounts") else { return Vec::new() };
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let [_, dir, kind, opts, ..] = f.as_slice() else { return None };
            match *kind {
                "cgroup2" => Some((PathBuf::from(dir), true, Vec::new())),
                "cgroup" => Some((PathBuf::from(dir), false, opts.split(',').map(str::to_owned).collect())),
                _ => None,
            }
        })
        .collect()
}

fn place(c: Controller) -> Option<Place> {
    let all = mounts();
    // v2 first, when its root offers the controller.
    for (dir, v2, _) in &all {
        if *v2
            && std::fs::read_to_string(dir.join("cgroup.controllers"))
                .is_ok_and(|t| t.split_whitespace().any(|x| x == c.name()))
        {
            return Some(Place::V2(dir.clone()));
        }
    }
    all.into_iter()
        .find(|(_, v2, opts)| !v2 && opts.iter().any(|o| o == c.name()))
        .map(|(d, _, _)| Place::V1(d))
}

/// Makes moving a process into a group cheap on this host, and says whether it did.
///
/// Every move into a group takes the kernel's cgroup threadgroup lock for writing, which by
/// default waits for an RCU grace period first: 8 to 20 ms on this machine kind for a sandbox
/// joining its `memory` and `pids` groups, when a bare sandbox starts in about 6 ms. The
/// kernel's `favordynmods` (a cgroup v2 mount option that applies to the whole host, v1
/// hierarchies included, and stays set once given) moves that cost to forks and exits, where
/// it is too small to measure here (`bench/README.md`, agent start). Where no v2 hierarchy is
/// mounted (a v1 host), a cgroup2 superblock is created with the option (the mount API's
/// `fsopen`, `fsconfig`; attached nowhere, so no path is involved); where one is, it is left
/// as its owner mounted it (`mount -o remount,favordynmods` there is the operator's choice).
pub fn favor_migrations() -> std::io::Result<bool> {
    if mounts().iter().any(|(_, v2, _)| *v2) {
        return Ok(false);
    }
    let fs = rustix::mount::fsopen("cgroup2", rustix::mount::FsOpenFlags::FSOPEN_CLOEXEC)?;
    rustix::mount::fsconfig_set_flag(&fs, "favordynmods")?;
    rustix::mount::fsconfig_create(&fs)?;
    Ok(true)
}

/// What the groups of a run say it uses (each `None` where the run has no group of that
/// controller: no ceiling of that kind).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Memory charged to it, in bytes.
    pub memory: Option<u64>,
    /// CPU time it used, in nanoseconds.
    pub cpu_ns: Option<u64>,
    /// Its processes.
    pub pids: Option<u64>,
}

/// What the groups of the run `name` (as [`create`] names them) say it uses.
pub fn usage(name: &str) -> Usage {
    let number = |p: PathBuf| std::fs::read_to_string(p).ok().and_then(|s| s.trim().parse::<u64>().ok());
    let group = |c: Controller| match place(c)? {
        Place::V2(r) => Some((r.join("cortexfs").join(name), true)),
        Place::V1(r) => Some((r.join("cortexfs").join(name), false)),
    };
    let existing = |c: Controller| group(c).filter(|(d, _)| d.is_dir());
    let memory = existing(Controller::Memory)
        .and_then(|(d, v2)| number(d.join(if v2 { "memory.current" } else { "memory.usage_in_bytes" })));
    let pids = existing(Controller::Pids).and_then(|(d, _)| number(d.join("pids.current")));
    let cpu_ns = existing(Controller::Cpu).and_then(|(d, v2)| {
        if v2 {
            let stat = std::fs::read_to_string(d.join("cpu.stat")).ok()?;
            let us = stat.lines().find_map(|l| l.strip_prefix("usage_usec "))?.trim().parse::<u64>().ok()?;
            Some(us * 1000)
        } else {
            // cpuacct shares the cpu hierarchy where the host mounts them together.
            number(d.join("cpuacct.usage"))
        }
    });
    Usage { memory, cpu_ns, pids }
}

/// The ceilings a run asks for, each with where it can be applied; an error names the first
/// that cannot be.
pub fn plan(l: &Limits) -> Result<Vec<String>, Error> {
    let mut out = Vec::new();
    for (c, want) in [(Controller::Memory, l.memory), (Controller::Pids, l.pids), (Controller::Cpu, l.cpu)] {
        let Some(v) = want else { continue };
        match place(c).ok_or(Error::Missing(c.name()))? {
            Place::V2(_) => out.push(format!("{}={v} (cgroup v2)", c.name())),
            Place::V1(_) => out.push(format!("{}={v} (cgroup v1)", c.name())),
        }
    }
    Ok(out)
}

/// The groups of one run, made and filled with its ceilings.
#[derive(Debug, Default)]
pub struct Groups {
    /// Each group's directory.
    pub dirs: Vec<PathBuf>,
}

impl Groups {
    /// The `cgroup.procs` files a process joins to be under every ceiling.
    pub fn procs(&self) -> Vec<PathBuf> {
        self.dirs.iter().map(|d| d.join("cgroup.procs")).collect()
    }

    /// Removes the groups once their processes are gone (waiting a little for the last ones).
    pub fn remove(&self) {
        for d in &self.dirs {
            for _ in 0..50 {
                if std::fs::remove_dir(d).is_ok() || !d.exists() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
    }
}

fn write(path: &Path, value: &str) -> Result<(), Error> {
    std::fs::write(path, value).map_err(io(path))
}

/// Makes the groups of the run `name` with the ceilings `l`; when a ceiling is refused, the
/// groups made so far are removed.
pub fn create(name: &str, l: &Limits) -> Result<Groups, Error> {
    let mut groups = Groups::default();
    let made = create_into(name, l, &mut groups);
    if made.is_err() {
        groups.remove();
    }
    made.map(|()| groups)
}

fn create_into(name: &str, l: &Limits, groups: &mut Groups) -> Result<(), Error> {
    let mut made = |root: &Path, v2: bool, c: Controller| -> Result<PathBuf, Error> {
        let parent = root.join("cortexfs");
        if !parent.exists() {
            std::fs::create_dir_all(&parent).map_err(io(&parent))?;
        }
        if v2 {
            // Controllers reach a group only through every subtree_control above it.
            let enable = format!("+{}", c.name());
            let _ = std::fs::write(root.join("cgroup.subtree_control"), &enable);
            write(&parent.join("cgroup.subtree_control"), &enable)?;
        }
        let dir = parent.join(name);
        if !dir.exists() {
            std::fs::create_dir(&dir).map_err(io(&dir))?;
        }
        if !groups.dirs.contains(&dir) {
            groups.dirs.push(dir.clone());
        }
        Ok(dir)
    };
    if let Some(bytes) = l.memory {
        match place(Controller::Memory).ok_or(Error::Missing("memory"))? {
            Place::V2(root) => {
                let d = made(&root, true, Controller::Memory)?;
                write(&d.join("memory.max"), &bytes.to_string())?;
                if d.join("memory.swap.max").exists() {
                    write(&d.join("memory.swap.max"), "0")?;
                }
            }
            Place::V1(root) => {
                let d = made(&root, false, Controller::Memory)?;
                write(&d.join("memory.limit_in_bytes"), &bytes.to_string())?;
                if d.join("memory.memsw.limit_in_bytes").exists() {
                    write(&d.join("memory.memsw.limit_in_bytes"), &bytes.to_string())?;
                }
            }
        }
    }
    if let Some(n) = l.pids {
        let (root, v2) = match place(Controller::Pids).ok_or(Error::Missing("pids"))? {
            Place::V2(r) => (r, true),
            Place::V1(r) => (r, false),
        };
        let d = made(&root, v2, Controller::Pids)?;
        write(&d.join("pids.max"), &n.to_string())?;
    }
    if let Some(pct) = l.cpu {
        let quota = pct * 1000;
        match place(Controller::Cpu).ok_or(Error::Missing("cpu"))? {
            Place::V2(root) => {
                let d = made(&root, true, Controller::Cpu)?;
                write(&d.join("cpu.max"), &format!("{quota} 100000"))?;
            }
            Place::V1(root) => {
                let d = made(&root, false, Controller::Cpu)?;
                write(&d.join("cpu.cfs_period_us"), "100000")?;
                write(&d.join("cpu.cfs_quota_us"), &quota.to_string())?;
            }
        }
    }
    Ok(())
}
