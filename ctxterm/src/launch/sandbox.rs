//! The sandbox command line: a child that moves itself into the run's cgroups and becomes the
//! agent (its uid, gid and groups; `crate::sys::become_agent`), then `pasta` when the policy
//! grants a network, `bwrap` with the [`seccomp`](super::seccomp) filter on descriptor 3 (handed
//! over by a shell only where pasta or the key's FIFO needs one), the binds and the
//! environment of the contract, running `ctxterm` on the terminal socket.
//!
//! Binds bwrap cannot flag are prepared first in the run directory ([`binds`]):
//! the operator's workspace as it is (never idmapped: ownership is never lent) when the agent has an identity of its
//! own, and each bind of the mount table with its `nosuid`, `nodev`, `noexec` and read-only
//! flags. [`release`] undoes them.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use policy::runtime;

use super::binds::{self, Attrs};
use super::{Contract, Error, Result, SANDBOX_UMASK};

/// `/etc/profile.d/zz-cortexfs.sh` in a sandbox.
const PATH_SH: &str =
    "case \":$PATH:\" in *:/ctx/bin:*) ;; *) PATH=\"/ctx/bin:$PATH\"; export PATH ;; esac\n";

/// Where the run directory keeps the idmapped workspace.
fn idmapped(c: &Contract) -> PathBuf {
    c.runtime.join("workspace")
}

/// Where the run directory keeps the prepared binds of the mount table.
fn prepared(c: &Contract) -> PathBuf {
    c.runtime.join("mounts")
}

fn run_io(path: &Path) -> impl Fn(std::io::Error) -> Error + '_ {
    move |source| Error::RunDir { path: path.to_path_buf(), source }
}

/// The workspace as the sandbox binds it.
fn workspace(c: &Contract) -> Result<Option<PathBuf>> {
    // Bound as it is, always: ownership is never lent. The agent has what its uid, its groups
    // and the mode bits give it; what it makes there is its own (bwrap binds nosuid, and the
    // seccomp filter refuses setuid and setgid modes). A workspace of root's or of another
    // account is read (or written) only as its modes let others.
    Ok(c.workspace.clone())
}

/// One line of the mount table as bwrap is given it.
enum Cover {
    /// A prepared bind: (prepared path, target, rw).
    Bind(PathBuf, PathBuf, bool),
    /// A hidden directory: an empty read-only tmpfs over it.
    Dir(PathBuf),
    /// A hidden file (or anything else not a directory): the empty file `.0` bound read-only
    /// over it.
    File(PathBuf, PathBuf),
}

/// Where the sandbox's `target` comes from on the host, as (a tree, the path beneath it): the
/// last bind of the table above it, else the workspace, else the host's own path (`/usr`,
/// `/etc` are bound where they are).
fn host_of<'a>(c: &'a Contract, target: &'a Path) -> (&'a Path, &'a Path) {
    for b in c.mounts.iter().rev().filter(|b| !b.hide) {
        if let Ok(rest) = target.strip_prefix(&b.target) {
            return (&b.source, rest);
        }
    }
    match (&c.workspace, target.strip_prefix(super::contract::WORKSPACE)) {
        (Some(w), Ok(rest)) => (w, rest),
        _ => (Path::new("/"), target.strip_prefix("/").unwrap_or(target)),
    }
}

/// Whether the sandbox's `target` is a directory on the host (`None` when it is not there):
/// looked at beneath the tree it comes from (the operator's path, its own symlinks resolved),
/// never through a symlink of the agent's. Anything but "not there" refuses the start: a hide
/// line is never dropped without a word.
fn is_dir_on_host(c: &Contract, target: &Path) -> Result<Option<bool>> {
    let (base, rest) = host_of(c, target);
    let refused = |e: std::io::Error| Error::Bind { target: target.to_path_buf(), why: format!("hide: {e}") };
    // root's: the workspace's or a bind's own path, the operator's
    let base = std::fs::canonicalize(base).map_err(refused)?;
    let tree = crate::beneath::Tree::open(&base).map_err(refused)?;
    let st = match (rest.parent(), rest.file_name()) {
        (Some(parent), Some(name)) if !parent.as_os_str().is_empty() => {
            tree.sub(parent).and_then(|t| t.stat(name))
        }
        (_, Some(name)) => tree.stat(name),
        _ => tree.stat(""),
    };
    match st {
        Ok(st) => {
            Ok(Some(rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Directory))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(refused(e)),
    }
}

/// The mount table's binds, prepared with their flags, and its hidden targets.
fn table(c: &Contract) -> Result<Vec<Cover>> {
    let dir = prepared(c);
    let mut out = Vec::new();
    for (i, b) in c.mounts.iter().enumerate() {
        let at = dir.join(i.to_string());
        // root's: the run directory's prepared binds
        std::fs::create_dir_all(&dir).map_err(run_io(&dir))?;
        if b.hide {
            // What the sandbox covers, by its type; a target that is not there has nothing to hide.
            match is_dir_on_host(c, &b.target)? {
                Some(true) => out.push(Cover::Dir(b.target.clone())),
                Some(false) => {
                    let empty = dir.join(".0");
                    // root's: the run directory's prepared binds
                    std::fs::write(&empty, b"").map_err(run_io(&empty))?;
                    out.push(Cover::File(empty, b.target.clone()));
                }
                None => {}
            }
            continue;
        }
        // root's: a mount table source, the operator's
        if b.source.is_dir() {
            // root's: the run directory's prepared binds
            std::fs::create_dir_all(&at).map_err(run_io(&at))?;
        } else {
            // root's: the run directory's prepared binds
            std::fs::File::create(&at).map_err(run_io(&at))?;
        }
        let attrs = Attrs { nosuid: b.nosuid, nodev: b.nodev, noexec: b.noexec, rdonly: !b.rw, idmap: None };
        binds::bind(&b.source, &at, &attrs)
            .map_err(|e| Error::Bind { target: b.target.clone(), why: e.to_string() })?;
        out.push(Cover::Bind(at, b.target.clone(), b.rw));
    }
    Ok(out)
}

/// The command that starts the sandbox of `c` inside the cgroups whose `cgroup.procs` files are
/// `procs`. Prepares the binds and the seccomp filter in the run directory; sets the umask
/// the sandbox inherits.
pub fn command(c: &Contract, procs: &[PathBuf]) -> Result<Command> {
    // The groups' `cgroup.procs`, opened here: the child writes itself into them before it
    // execs anything, so the sandbox starts inside its groups.
    let procs = procs
        .iter()
        .map(|p| {
            // root's: the host's cgroup files of this run
            let f = std::fs::OpenOptions::new().write(true).open(p);
            f.map(std::os::fd::OwnedFd::from).map_err(|e| Error::Cgroups(format!("{}: {e}", p.display())))
        })
        .collect::<Result<Vec<_>>>()?;
    let workspace = workspace(c)?;
    let filter = c.runtime.join("seccomp.bpf");
    let program = super::seccomp::program().map_err(|e| Error::Seccomp(e.to_string()))?;
    // root's: the run directory
    std::fs::write(&filter, program).map_err(run_io(&filter))?;
    // The child becomes the agent itself (no shell, no setpriv). No no_new_privs here: pasta
    // needs to map its namespace first; bwrap sets no_new_privs for everything in the sandbox
    // (checked by the tests). pasta closes the descriptors it inherits, and the key's FIFO is
    // opened only when the supervisor writes it: then a shell after pasta opens the filter as
    // descriptor 3 and the FIFO as 4 right before it execs bwrap; otherwise the filter is
    // descriptor 3 from the start, and bwrap is the first program.
    let pasta = c.network || c.egress.is_some();
    let direct = !pasta && c.key_env.is_none();
    let mut cmd = Command::new(if pasta {
        "pasta"
    } else if direct {
        "bwrap"
    } else {
        "/bin/sh"
    });
    if c.network {
        cmd.args(["--config-net", "--quiet", "--"]);
    } else if let Some(port) = c.egress {
        // No network but the model: a namespace with only loopback, where pasta splices this
        // one port to the host's loopback (and nothing else: no address, no route, no other
        // forwarded port).
        cmd.args(["--quiet", "-t", "none", "-u", "none", "-U", "none", "-T"]).arg(port.to_string());
        cmd.arg("--");
    }
    let mut filter_fd = None;
    if direct {
        // root's: the run directory
        let f = std::fs::File::open(&filter).map_err(run_io(&filter))?;
        filter_fd = Some(std::os::fd::OwnedFd::from(f));
    } else {
        if pasta {
            cmd.arg("/bin/sh");
        }
        if c.key_env.is_some() {
            // The key's FIFO (the supervisor writes the key once, when this opens it) becomes
            // descriptor 4, which bwrap passes on to ctxterm.
            cmd.args(["-c", "f=$0 k=$1; shift; exec \"$@\" 3<\"$f\" 4<\"$k\""]).arg(&filter).arg(key_fifo(c));
        } else {
            cmd.args(["-c", "exec \"$@\" 3<\"$0\""]).arg(&filter);
        }
        cmd.arg("bwrap");
    }
    crate::sys::become_agent(&mut cmd, procs, (c.uid, c.gid, &c.groups), filter_fd);
    cmd.args([
        "--seccomp",
        "3",
        "--disable-userns",
        "--die-with-parent",
        "--unshare-user",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
    ]);
    // The agent's ids inside too (under pasta, the process starting bwrap is its namespace's root).
    cmd.arg("--uid").arg(c.uid.to_string()).arg("--gid").arg(c.gid.to_string());
    if !c.network && c.egress.is_none() {
        cmd.arg("--unshare-net");
    }
    cmd.args(["--ro-bind", "/usr", "/usr"]);
    for (link, target) in
        [("usr/bin", "/bin"), ("usr/sbin", "/sbin"), ("usr/lib", "/lib"), ("usr/lib64", "/lib64")]
    {
        if Path::new(target).is_symlink() {
            cmd.args(["--symlink", link, target]);
        // root's: the host's /usr and its links
        } else if Path::new(target).exists() {
            cmd.args(["--ro-bind", target, target]);
        }
    }
    cmd.args(["--ro-bind", "/etc", "/etc", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]);
    // Login shells (the CLIs run commands through `bash -lc`) rebuild PATH from /etc/profile:
    // the host's profile.d, plus one file that puts /ctx/bin (tsh) back in front.
    let path_sh = c.runtime.join("path.sh");
    // root's: the run directory
    std::fs::write(&path_sh, PATH_SH).map_err(run_io(&path_sh))?;
    cmd.args(["--tmpfs", "/etc/profile.d"]);
    // root's: /etc
    if let Ok(entries) = std::fs::read_dir("/etc/profile.d") {
        for e in entries.flatten() {
            let p = e.path();
            cmd.arg("--ro-bind").arg(&p).arg(&p);
        }
    }
    cmd.arg("--ro-bind").arg(&path_sh).arg("/etc/profile.d/zz-cortexfs.sh");
    cmd.args(["--remount-ro", "/etc/profile.d"]);
    match &c.home {
        Some(h) => cmd.arg("--bind").arg(h).arg("/home/agent"),
        None => cmd.args(["--dir", "/home/agent"]),
    };
    cmd.args(["--hostname", &c.agent]);
    cmd.arg("--bind").arg(&c.view).arg(runtime::SANDBOX_CTX);
    cmd.arg("--bind").arg(c.runtime.join("term")).arg(runtime::SANDBOX_TERMINAL);
    cmd.arg("--bind").arg(c.runtime.join("receipt")).arg(runtime::SANDBOX_RECEIPT);
    if let Some(w) = &workspace {
        cmd.arg("--bind").arg(w).arg("/workspace");
    }
    cmd.arg("--chdir").arg(&c.cwd);
    // The mount table, each bind prepared with its flags (bwrap's own binds cannot say noexec).
    // Binds and covers parents first (a cover is never bound over by a bind of a directory
    // above it, the operator's read-only workspace included), in table order otherwise; the
    // hidden directories are made read-only last, so that a bind below one finds its mount
    // point.
    let mut covers = table(c)?;
    let target_of = |c: &Cover| match c {
        Cover::Bind(_, t, _) | Cover::Dir(t) | Cover::File(_, t) => t.components().count(),
    };
    covers.sort_by_key(target_of);
    for cover in &covers {
        match cover {
            Cover::Bind(at, target, rw) => {
                cmd.arg(if *rw { "--bind" } else { "--ro-bind" }).arg(at).arg(target)
            }
            Cover::Dir(target) => cmd.arg("--tmpfs").arg(target),
            Cover::File(empty, target) => cmd.arg("--ro-bind").arg(empty).arg(target),
        };
    }
    for cover in &covers {
        if let Cover::Dir(target) = cover {
            cmd.arg("--remount-ro").arg(target);
        }
    }
    cmd.arg("--clearenv");
    for (k, v) in &c.env {
        cmd.args(["--setenv", k, v]);
    }
    cmd.args(["--new-session", "--", "/ctx/bin/ctxterm"]);
    if c.headless {
        cmd.arg("--headless");
    } else {
        cmd.args(["--socket", runtime::SANDBOX_TERMINAL_SOCKET]);
    }
    if c.wait_client && !c.headless {
        cmd.arg("--wait-client");
    }
    // The terminal's output, kept in the session (the agent's, as the terminal is) for
    // `ctx agent logs` after the run; a run that may write nothing but its records keeps none.
    if !c.headless && !c.records_only {
        cmd.arg("--keep-output")
            .arg(c.session_dir(Path::new(runtime::SANDBOX_CTX)).join(runtime::TERMINAL_LOG));
    }
    if let Some(k) = &c.key_env {
        cmd.args(["--key-fd", "4", "--key-env", k]);
    }
    cmd.arg("--");
    cmd.args(&c.cmd);
    cmd.env_clear().env("PATH", "/usr/bin:/bin").stdin(Stdio::null());
    // Inherited through setpriv and bwrap by everything in the sandbox.
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(SANDBOX_UMASK));
    Ok(cmd)
}

/// The FIFO the run's key passes through: in the run directory, the agent's, mode 0600; it
/// holds no bytes at rest.
pub fn key_fifo(c: &Contract) -> PathBuf {
    c.runtime.join("key")
}

/// Undoes what [`command`] prepared: the idmapped workspace, the prepared binds, the filter.
pub fn release(c: &Contract) {
    let idmapped = idmapped(c);
    // root's: the run directory
    if idmapped.exists() {
        let _ = rustix::mount::unmount(&idmapped, rustix::mount::UnmountFlags::DETACH);
        // root's: the run directory
        let _ = std::fs::remove_dir(&idmapped);
    }
    // The prepared binds are detached, then their directory removed beneath the run's, never
    // across a mount: a bind still there stops the removal and keeps what it shows.
    let prepared = prepared(c);
    super::rundir::unmount_below(&prepared);
    if let Err(e) = super::rundir::remove(&prepared) {
        eprintln!("agent {} session {}: {e}", c.agent, c.session);
    }
    // root's: the run directory
    let _ = std::fs::remove_file(c.runtime.join("seccomp.bpf"));
    // root's: the run directory
    let _ = std::fs::remove_file(key_fifo(c));
    // root's: the run directory
    let _ = std::fs::remove_file(c.runtime.join("path.sh"));
}
