//! `ctx doctor`: what this host needs for CortexFS, checked the way `ctx agent start` and `ctx
//! mount` need it, each failure with what to do about it.

use std::path::{Path, PathBuf};

use policy::runtime::{self, ControlRequest};
use serde::Serialize;

use super::{agents, cgroups, contract, rundir, view};
use crate::beneath::Tree;

/// One check.
#[derive(Clone, Debug, Serialize)]
pub struct Check {
    /// What was checked.
    pub name: &'static str,
    /// Whether it holds.
    pub ok: bool,
    /// What was found.
    pub detail: String,
    /// What to do, when it does not hold.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

fn check(name: &'static str, r: Result<String, (String, String)>) -> Check {
    match r {
        Ok(detail) => Check { name, ok: true, detail, fix: None },
        Err((detail, fix)) => Check { name, ok: false, detail, fix: Some(fix) },
    }
}

/// Where the checks look.
#[derive(Debug)]
pub struct Host<'a> {
    /// The storage.
    pub storage: &'a Path,
    /// The host's /ctx mount.
    pub ctx: &'a Path,
    /// The daemon's control socket.
    pub control: &'a Path,
}

/// Runs every check.
pub fn run(h: &Host<'_>) -> Vec<Check> {
    let mut out = vec![
        check("sandboxes", contract::preflight().map(|()| "bwrap, /dev/fuse and user namespaces".into()).map_err(|why| (why, "see the message".into()))),
        check(
            "network",
            // pasta runs as the agent: /dev/net/tun must be open to any agent's uid.
            contract::network_ready(policy::agent::NOBODY)
                .map(|()| "pasta and /dev/net/tun, for agents granted network:default connect".into())
                .map_err(|why| (why, "scripts/host-setup; without it, runs granted a network start without one".into())),
        ),
        check(
            "ceilings",
            cgroups::plan(&policy::limits::Limits::default()).map(|c| format!("cgroup controllers for the default ceilings: {}", c.join(" "))).map_err(|e| {
                (e.to_string(), "mount the controllers (cgroup v2, or v1 memory and pids), or start agents with --no-ceilings".into())
            }),
        ),
        uring(),
        storage(h.storage),
        daemon(h.control),
        mount(h.ctx),
        dead_views(h.control),
        labels(h.storage),
        runs(h.control),
    ];
    out.retain(|c| !c.detail.is_empty() || !c.ok);
    out
}

fn uring() -> Check {
    let p = "/sys/module/fuse/parameters/enable_uring";
    let v = std::fs::read_to_string(p).unwrap_or_default(); // root's: /sys
    // Informational: without it `ctx mount --transport auto` serves /dev/fuse.
    let (detail, fix) = match v.trim() {
        "Y" => ("FUSE over io_uring is enabled in the kernel: ctx mount serves over it".to_owned(), None),
        "" => ("this kernel has no FUSE over io_uring: ctx mount serves /dev/fuse".to_owned(), None),
        _ => (
            format!("FUSE over io_uring is off ({p} = N): ctx mount serves /dev/fuse"),
            Some(format!("echo Y > {p}, then restart ctx mount")),
        ),
    };
    Check { name: "io_uring", ok: true, detail, fix }
}

fn storage(s: &Path) -> Check {
    let top = |d: &&str| !s.join(d).is_dir(); // root's: the storage's top levels
    let missing: Vec<&str> = ["tool", "agent", "model", "home", "shared"].into_iter().filter(top).collect();
    check(
        "storage",
        // root's: the storage
        if !s.is_dir() {
            Err((format!("{} does not exist", s.display()), format!("ctx bootstrap {}", s.display())))
        } else if !missing.is_empty() {
            Err((
                format!("{} lacks {}", s.display(), missing.join(" ")),
                format!("ctx bootstrap {}", s.display()),
            ))
        } else {
            Ok(format!("{}", s.display()))
        },
    )
}

fn daemon(control: &Path) -> Check {
    check(
        "daemon",
        match view::request(control, &ControlRequest::Ls {}) {
            Ok(r) if r.ok => {
                Ok(format!("answers on {} ({} views)", control.display(), r.views.map_or(0, |v| v.len())))
            }
            Ok(r) => Err((r.error.unwrap_or_default(), "run ctx doctor as root".into())),
            Err(e) => Err((
                format!("{}: {e}", control.display()),
                "start it: ctx mount (or mount -t fuse.cortexfs STORAGE /ctx)".into(),
            )),
        },
    )
}

fn mount(ctx: &Path) -> Check {
    check(
        "mount",
        match rustix::fs::statfs(ctx) {
            Err(rustix::io::Errno::NOTCONN | rustix::io::Errno::CONNABORTED) => Err((
                format!("{} is a dead mount (its daemon is gone)", ctx.display()),
                format!("umount -l {0}; then ctx mount {0}", ctx.display()),
            )),
            _ => match Tree::open(ctx).and_then(|t| t.read_string("status", 64 << 10)) {
                Ok(s) if policy::status::field(&s, "view") == Some("host") => {
                    Ok(format!("{} serves the host view", ctx.display()))
                }
                _ => Err((
                    format!("{} is not a CortexFS mount", ctx.display()),
                    format!("ctx mount {}", ctx.display()),
                )),
            },
        },
    )
}

fn dead_views(control: &Path) -> Check {
    let root = runtime::views_root(control);
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default(); // root's: /proc
    let dead: Vec<String> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| Path::new(m).starts_with(&root))
        .filter(|m| {
            matches!(rustix::fs::statfs(*m), Err(rustix::io::Errno::NOTCONN | rustix::io::Errno::CONNABORTED))
        })
        .map(str::to_owned)
        .collect();
    check(
        "views",
        if dead.is_empty() {
            Ok(String::new())
        } else {
            Err((
                format!("dead views: {}", dead.join(" ")),
                "the next ctx mount detaches them, or umount -l each".into(),
            ))
        },
    )
}

fn labels(storage: &Path) -> Check {
    let Ok(installed) = agents::installed(storage) else { return check("labels", Ok(String::new())) };
    let held: Vec<String> = installed.into_iter().filter_map(|a| a.label).collect();
    let dangling = agents::lines_not_held(storage, &held);
    check(
        "labels",
        if dangling.is_empty() {
            Ok(String::new())
        } else {
            let shown: Vec<String> = dangling
                .iter()
                .map(|(f, n, l)| format!("{}:{n}: {l}", f.strip_prefix(storage).unwrap_or(f).display()))
                .collect();
            Err((
                format!(
                    "policy lines grant labels no agent holds (the next agent to take one gets them):\n  {}",
                    shown.join("\n  ")
                ),
                "remove the lines, or create the agent they were written for".into(),
            ))
        },
    )
}

/// The run directories of the daemon of `control` whose supervisor is gone: a `pid` file and
/// no such process, or no `pid` file and unchanged for a minute (an ended run an older daemon
/// kept, a retired run whose removal was cut short; a run being prepared is younger).
pub fn stale_runs(control: &Path) -> Vec<PathBuf> {
    let mut left: Vec<PathBuf> = Vec::new();
    let runs = runtime::runs_root(control);
    let Ok(root) = Tree::open(&runs) else { return left };
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    for a in root.names(usize::MAX).unwrap_or_default() {
        let Ok(agent) = root.sub(&a) else { continue };
        for s in agent.names(usize::MAX).unwrap_or_default() {
            let d = runs.join(&a).join(&s);
            let old = agent.stat(&s).is_ok_and(|st| {
                st.st_mode & libc::S_IFMT == libc::S_IFDIR
                    && now.saturating_sub(u64::try_from(st.st_mtime).unwrap_or(0)) > 60
            });
            let gone =
                if agent.exists(Path::new(&s).join("pid")) { rundir::supervisor(&d).is_none() } else { old };
            if gone {
                left.push(d);
            }
        }
    }
    left.sort();
    left
}

/// Removes the run state of supervisors that are gone: each run's mounts (its workspace, its
/// pins) are detached first, and the removal never follows a link or crosses a mount.
/// Returns what was removed, and what could not be with why.
pub fn fix_runs(control: &Path) -> Vec<(PathBuf, Result<(), String>)> {
    stale_runs(control)
        .into_iter()
        .map(|d| {
            // The run's view goes first (the daemon unmounts it; a dead daemon's is detached).
            if let (Some(session), Some(agent)) = (d.file_name(), d.parent().and_then(Path::file_name)) {
                super::view::remove(control, &runtime::views_root(control).join(agent).join(session));
            }
            rundir::unmount_below(&d);
            let r = rundir::remove(&d).map_err(|e| e.to_string());
            (d, r)
        })
        .collect()
}

fn runs(control: &Path) -> Check {
    let left = stale_runs(control);
    check(
        "runs",
        if left.is_empty() {
            Ok(String::new())
        } else {
            let shown: Vec<String> = left.iter().map(|p| p.display().to_string()).collect();
            Err((
                format!("run state of supervisors that are gone: {}", shown.join(" ")),
                "ctx doctor --fix-runs (detaches each run's mounts first and never removes across one; \
                 the session's own record stays in /ctx)"
                    .into(),
            ))
        },
    )
}
