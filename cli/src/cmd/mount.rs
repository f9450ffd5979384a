//! `ctx mount`: serve `/ctx` in the foreground, as a FUSE mount or (`--virtiofs`) to a virtual
//! machine.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use crate::cmd::object::DEFAULT_STORAGE;
use crate::exit::{self, Exit};

/// Arguments of `ctx mount`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The storage directory (created with the empty root layout when missing).
    #[arg(long, default_value = DEFAULT_STORAGE)]
    source: PathBuf,
    /// Where to mount.
    #[arg(default_value = "/ctx")]
    mountpoint: PathBuf,
    /// Mount even when the mount point is not empty.
    #[arg(long)]
    nonempty: bool,
    /// Threads serving requests (default: one per core); with --virtiofs, the most request
    /// queues a VM may use, one thread each.
    #[arg(long)]
    threads: Option<usize>,
    /// Seconds the kernel keeps storage entries and attributes (the host's `home/` and
    /// `shared/` data, objects, agent views' entries) before asking again: how long a change
    /// made in the storage directory behind the daemon's back may take to show. Changes made
    /// through the daemon, and in agent views any change to the objects, show at once.
    #[arg(long, value_name = "SECONDS", default_value_t = 1, value_parser = clap::value_parser!(u64).range(0..=3600))]
    cache_timeout: u64,
    /// The root-only control socket through which `ctx view` manages agent views.
    #[arg(long, default_value = server::control::DEFAULT_SOCKET)]
    control: PathBuf,
    /// Serve one view to one virtual machine over vhost-user virtio-fs on this socket (mode
    /// 0600) instead of mounting: the VMM connects to it (QEMU `vhost-user-fs-pci`); the next VM
    /// may connect once the last one is gone.
    #[arg(long, value_name = "SOCKET", conflicts_with_all = ["mountpoint", "nonempty", "control"])]
    virtiofs: Option<PathBuf>,
    /// With --virtiofs: serve this agent's view instead of the host view.
    #[arg(long, value_name = "NAME", requires_all = ["virtiofs", "session"])]
    agent: Option<String>,
    /// With --agent: the session of the agent's view.
    #[arg(long, value_name = "S", requires = "agent")]
    session: Option<String>,
}

/// True when `path` is the mount point of a mount whose server is gone. (`statfs` always
/// reaches the server; a `stat` of the root may be answered from the kernel's cache.)
fn dead_mount(path: &Path) -> bool {
    matches!(rustix::fs::statfs(path), Err(rustix::io::Errno::NOTCONN))
}

fn is_mount_point(path: &Path) -> bool {
    let Ok(canon) = path.canonicalize() else { return false };
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else { return false };
    info.lines().any(|l| l.split(' ').nth(4).is_some_and(|m| Path::new(m) == canon))
}

/// `bin/` entries: this `ctx`, and `tsh` and `ctxterm` when installed beside it.
fn bins() -> Vec<(String, PathBuf)> {
    let mut out = Vec::new();
    if let Ok(me) = std::env::current_exe() {
        for name in ["tsh", "ctxterm"] {
            let p = me.with_file_name(name);
            if p.is_file() {
                out.push((name.to_owned(), p));
            }
        }
        out.insert(0, ("ctx".to_owned(), me));
    }
    out
}

/// Serves one view over vhost-user virtio-fs on `socket` until SIGINT or SIGTERM.
fn run_virtiofs(a: &Args, socket: &Path) -> anyhow::Result<()> {
    let view = match (&a.agent, &a.session) {
        (Some(agent), Some(session)) => {
            policy::name::validate(agent)
                .map_err(|e| Exit::new(exit::INVALID, format!("invalid agent name {agent:?}: {e}")))?;
            policy::name::validate(session)
                .map_err(|e| Exit::new(exit::INVALID, format!("invalid session name {session:?}: {e}")))?;
            let object = a.source.join("agent").join(agent);
            if !object.is_file() {
                return Err(Exit::new(
                    exit::INVALID,
                    format!("no agent {agent}: {} is not an installed agent object", object.display()),
                )
                .into());
            }
            Some(server::ViewSpec {
                agent: agent.clone(),
                session: session.clone(),
                workspace: None,
                session_of: None,
                records_only: false,
            })
        }
        _ => None,
    };
    let queues = a
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()))
        .clamp(1, server::transport::virtiofs::MAX_REQUEST_QUEUES);
    let config = server::Config {
        view,
        cache_timeout: std::time::Duration::from_secs(a.cache_timeout),
        ..server::Config::new(a.source.clone(), bins())
    };
    let mut signals = Signals::new([SIGINT, SIGTERM])?;
    let daemon = server::transport::virtiofs::Daemon::bind(socket, config, queues).map_err(|e| {
        let code = match e.kind() {
            std::io::ErrorKind::AddrInUse => exit::UNAVAILABLE,
            std::io::ErrorKind::AlreadyExists | std::io::ErrorKind::NotFound => exit::INVALID,
            std::io::ErrorKind::PermissionDenied => exit::DENIED,
            _ => exit::FAILURE,
        };
        Exit::new(code, format!("cannot serve virtio-fs on {}: {e}", socket.display()))
    })?;
    let stopper = daemon.stopper();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                tracing::info!(signal = sig, "stopping");
            }
            stopper.stop();
        })
        .map_err(|e| Exit::new(exit::INTERNAL, format!("cannot start the signal thread: {e}")))?;
    let who = match (&a.agent, &a.session) {
        (Some(agent), Some(session)) => format!("agent {agent} session {session}"),
        _ => "the host view".to_owned(),
    };
    tracing::info!(storage = %a.source.display(), socket = %socket.display(), queues, "serving virtio-fs");
    eprintln!("ctx: serving {} ({who}) over virtio-fs at {}", a.source.display(), socket.display());
    daemon
        .serve()
        .map_err(|e| Exit::new(exit::FAILURE, format!("serving virtio-fs on {}: {e}", socket.display())))?;
    Ok(())
}

/// Runs the command: mounts, serves until SIGINT or SIGTERM, unmounts.
pub fn run(a: Args) -> anyhow::Result<()> {
    if let Some(socket) = a.virtiofs.clone() {
        return run_virtiofs(&a, &socket);
    }
    let mp = &a.mountpoint;
    if dead_mount(mp) {
        tracing::warn!(mountpoint = %mp.display(), "recovering a dead mount left by a crashed server");
        rustix::mount::unmount(mp, rustix::mount::UnmountFlags::DETACH).map_err(|e| {
            Exit::new(exit::FAILURE, format!("cannot detach the dead mount at {}: {e}", mp.display()))
        })?;
    }
    if !mp.exists() {
        std::fs::create_dir_all(mp).map_err(|e| Exit::io(format!("cannot create {}", mp.display()), &e))?;
    }
    if is_mount_point(mp) {
        return Err(Exit::new(exit::FAILURE, format!("{} is already a mount point", mp.display())).into());
    }
    let nonempty = std::fs::read_dir(mp)
        .map_err(|e| Exit::io(format!("cannot read {}", mp.display()), &e))?
        .next()
        .is_some();
    if nonempty && !a.nonempty {
        return Err(Exit::new(
            exit::INVALID,
            format!(
                "{} is not empty: refusing to hide its contents (use --nonempty to mount anyway)",
                mp.display()
            ),
        )
        .into());
    }
    let config = server::Config {
        cache_timeout: std::time::Duration::from_secs(a.cache_timeout),
        ..server::Config::new(a.source.clone(), bins())
    };
    let fs = server::CtxFs::new(config.clone())
        .map_err(|e| Exit::io(format!("cannot open storage {}", a.source.display()), &e))?;
    let data = fs.data().map_err(|e| Exit::io(format!("cannot open storage {}", a.source.display()), &e))?;
    let threads = a.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
    let mut signals = Signals::new([SIGINT, SIGTERM])?;
    let pool = Arc::new(
        server::transport::pool::Pool::new(threads)
            .map_err(|e| Exit::new(exit::INTERNAL, format!("cannot start serving threads: {e}")))?,
    );
    let mount = pool
        .mount_host(Arc::new(fs), Arc::new(data), mp)
        .map_err(|e| Exit::new(exit::UNAVAILABLE, format!("cannot mount {}: {e}", mp.display())))?;
    let dead = server::control::clean_dead_views();
    if !dead.is_empty() {
        let shown: Vec<String> = dead.iter().map(|d| d.display().to_string()).collect();
        tracing::warn!(count = dead.len(), "removed the dead views of a previous daemon");
        eprintln!("ctx: removed {} dead view(s) of a previous daemon: {}", dead.len(), shown.join(" "));
    }
    let views = Arc::new(server::control::Views::new(config, Arc::clone(&pool)));
    views.watch().map_err(|e| Exit::new(exit::INTERNAL, format!("cannot start the view notifier: {e}")))?;
    server::control::listen(&a.control, Arc::clone(&views)).map_err(|e| {
        Exit::new(exit::UNAVAILABLE, format!("cannot listen on {}: {e}", a.control.display()))
    })?;
    tracing::info!(storage = %a.source.display(), mountpoint = %mp.display(), threads, "serving /ctx");
    eprintln!("ctx: serving {} at {}", a.source.display(), mp.display());
    if let Some(sig) = signals.forever().next() {
        tracing::info!(signal = sig, "stopping");
    }
    views.shutdown();
    let _ = std::fs::remove_file(&a.control);
    let unmounted = pool.unmount_host(mount);
    drop(views);
    if let Ok(pool) = Arc::try_unwrap(pool) {
        pool.shutdown();
    }
    unmounted.map_err(|e| Exit::new(exit::FAILURE, format!("unmounting {}: {e}", mp.display())))?;
    Ok(())
}
