//! `ctx mount`: serve `/ctx` in the foreground, as a FUSE mount or (`--virtiofs`) to a virtual
//! machine; and the `mount(8)` helper (`ctx` installed as `/sbin/mount.fuse.cortexfs`), so that
//! `mount -t fuse.cortexfs STORAGE DIR` and an fstab line start a daemon in the background.
//! The daemon stops when its mount is unmounted from outside (`umount DIR`).

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
    /// How requests reach the daemon: `uring` (FUSE over io_uring), `dev` (read and write on
    /// /dev/fuse), or `auto`: io_uring when the kernel offers it
    /// (/sys/module/fuse/parameters/enable_uring is Y), else /dev/fuse, saying so. `status`
    /// shows each connection's.
    #[arg(long, env = "CTX_TRANSPORT", default_value = "auto", value_parser = clap::builder::ValueParser::new(str::parse::<server::transport::Transport>))]
    transport: server::transport::Transport,
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
/// reaches the server; a `stat` of the root may be answered from the kernel's cache.) A
/// connection being torn down answers ECONNABORTED until it is gone, and ENOTCONN after; any
/// other failure is asked again for a second before the mount is taken as alive.
fn dead_mount(path: &Path) -> bool {
    use rustix::io::Errno;
    let until = std::time::Instant::now() + std::time::Duration::from_secs(1);
    loop {
        match rustix::fs::statfs(path) {
            Err(Errno::NOTCONN | Errno::CONNABORTED) => return true,
            Ok(_) | Err(Errno::NOENT | Errno::NOTDIR | Errno::ACCESS) => return false,
            Err(_) if std::time::Instant::now() >= until => return false,
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(50)),
        }
    }
}

fn is_mount_point(path: &Path) -> bool {
    let Ok(canon) = path.canonicalize() else { return false };
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else { return false };
    info.lines().any(|l| l.split(' ').nth(4).is_some_and(|m| Path::new(m) == canon))
}

/// Stops the daemon (as SIGTERM does) once `mp` is no longer mounted: `umount` from outside.
/// The mount table's changes wake a poll on `/proc/self/mountinfo`.
fn stop_when_unmounted(mp: PathBuf) -> std::io::Result<()> {
    use std::io::{Read, Seek};
    let mut info = std::fs::File::open("/proc/self/mountinfo")?;
    std::thread::Builder::new().name("unmount".into()).spawn(move || {
        let mut text = Vec::new();
        loop {
            text.clear();
            if info.rewind().is_err() || info.read_to_end(&mut text).is_err() {
                return;
            }
            if !is_mount_point(&mp) {
                tracing::info!(mountpoint = %mp.display(), "unmounted from outside: stopping");
                let _ = signal_hook::low_level::raise(SIGTERM);
                return;
            }
            let mut fds = [rustix::event::PollFd::new(&info, rustix::event::PollFlags::PRI)];
            if rustix::event::poll(&mut fds, None).is_err() {
                std::thread::sleep(std::time::Duration::from_secs(1));
            }
        }
    })?;
    Ok(())
}

/// Tells the service manager how the daemon is (`READY=1`, `STOPPING=1`), when it runs under
/// one that asked (`NOTIFY_SOCKET`, systemd's `Type=notify`); nothing otherwise.
fn notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else { return };
    let Ok(sock) = std::os::unix::net::UnixDatagram::unbound() else { return };
    let bytes = path.as_encoded_bytes();
    let sent = match bytes.strip_prefix(b"@") {
        // An abstract socket.
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            std::os::unix::net::SocketAddr::from_abstract_name(name)
                .and_then(|a| sock.send_to_addr(state.as_bytes(), &a))
        }
        None => sock.send_to(state.as_bytes(), Path::new(&path)),
    };
    if let Err(e) = sent {
        tracing::warn!(error = %e, "cannot notify the service manager");
    }
}

/// Options `mount(8)` passes that concern the mount table, not the daemon.
const GENERIC_OPTIONS: &[&str] = &[
    "defaults", "rw", "auto", "noauto", "nofail", "user", "users", "nouser", "_netdev", "relatime", "noatime",
];

/// Runs as `mount.fuse.cortexfs STORAGE DIR [-sfnv] [-o OPTIONS]` (what `mount -t
/// fuse.cortexfs` and fstab run): starts `ctx mount --source STORAGE DIR` in the background,
/// its output in `/run/cortexfs/mount.<DIR>.log`, and returns once the mount answers (or with
/// the daemon's own status when it could not start). Options: `cache_timeout=N`, `threads=N`,
/// `transport=auto|uring|dev`, `control=SOCKET`, `nonempty`; the mount table's own (`defaults`, `nofail`, `x-*`, ...) are
/// ignored; `ro` is refused (a read-only host view is not offered).
pub fn helper(args: &[String]) -> anyhow::Result<()> {
    let usage = || Exit::new(exit::INVALID, "usage: mount.fuse.cortexfs STORAGE DIR [-sfnv] [-o OPTIONS]");
    let mut positional = Vec::new();
    let mut options = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "-o" => options.extend(it.next().ok_or_else(usage)?.split(',').map(str::to_owned)),
            "-t" | "-N" => {
                it.next().ok_or_else(usage)?;
            }
            "-s" | "-f" | "-n" | "-v" => {}
            o if o.starts_with('-') => return Err(usage().into()),
            p => positional.push(p.to_owned()),
        }
    }
    let [source, dir] = positional.as_slice() else { return Err(usage().into()) };
    let mut daemon = vec!["mount".to_owned(), "--source".to_owned(), source.clone()];
    let mut control = None;
    let mut area = None;
    for o in options.iter().filter(|o| !o.is_empty()) {
        let (k, v) = o.split_once('=').map_or((o.as_str(), None), |(k, v)| (k, Some(v)));
        match (k, v) {
            ("control", Some(v)) => {
                control = Some(PathBuf::from(v));
                daemon.extend(["--control".to_owned(), v.to_owned()]);
            }
            ("area", Some(v)) => area = Some(v.to_owned()),
            ("cache_timeout" | "threads" | "transport", Some(v)) => {
                daemon.push(format!("--{}", k.replace('_', "-")));
                daemon.push(v.to_owned());
            }
            ("nonempty", None) => daemon.push("--nonempty".to_owned()),
            ("ro", None) => {
                return Err(Exit::new(exit::INVALID, "-o ro: a read-only /ctx is not offered").into());
            }
            (k, _) if GENERIC_OPTIONS.contains(&k) || k.starts_with("x-") || k == "comment" => {}
            _ => return Err(Exit::new(exit::INVALID, format!("-o {o}: not an option of cortexfs")).into()),
        }
    }
    if let Some(area) = area {
        return mount_area(source, Path::new(dir), &area, daemon, control);
    }
    daemon.push(dir.clone());
    start_daemon(
        &daemon,
        Path::new(dir),
        &control.unwrap_or_else(|| PathBuf::from(server::control::DEFAULT_SOCKET)),
    )
}

/// `-o area=REL`: the data area `REL` of STORAGE (`home/<uid>[/...]` or `shared/<space>[/...]`)
/// mounted at `dir` as a mount of its own, writable at its root, for a program (a test suite)
/// that mounts its own instance: a bind of that directory of the daemon that serves STORAGE,
/// so that every such mount of one storage is served by one daemon. Where no daemon serves it,
/// one is started on a mount point of its own under `/run/cortexfs/storage/` (it stops when
/// that is unmounted). `umount dir` takes the area away and leaves the daemon.
fn mount_area(
    source: &str,
    dir: &Path,
    area: &str,
    mut daemon: Vec<String>,
    control: Option<PathBuf>,
) -> anyhow::Result<()> {
    let bad = |why: String| Exit::new(exit::INVALID, format!("-o area={area}: {why}"));
    let parts: Vec<&str> = area.split('/').collect();
    if policy::path::check_relative(area).is_err()
        || parts.len() < 2
        || !["home", "shared"].contains(&parts[0])
    {
        return Err(
            bad("a data area is home/<uid> or shared/<space>, or a directory below one".into()).into()
        );
    }
    let storage = std::fs::canonicalize(source)
        .map_err(|e| Exit::new(exit::INVALID, format!("storage {source}: {e}")))?;
    let served = served_at(&storage);
    let root = match served {
        Some(m) => m,
        None => {
            // One name per storage: the first 16 hex digits of its path's SHA-256.
            let name = {
                use sha2::Digest;
                let h = sha2::Sha256::digest(storage.as_os_str().as_encoded_bytes());
                h.iter().take(8).map(|b| format!("{b:02x}")).collect::<String>()
            };
            let base = Path::new(policy::runtime::RUN_ROOT).join("storage");
            let mp = base.join(&name);
            std::fs::create_dir_all(&mp)?;
            let control = control.unwrap_or_else(|| base.join(format!("{name}.sock")));
            if !daemon.iter().any(|a| a == "--control") {
                daemon.extend(["--control".to_owned(), control.display().to_string()]);
            }
            daemon.push(mp.display().to_string());
            start_daemon(&daemon, &mp, &control)?;
            mp
        }
    };
    // The area is what the daemon serves beneath its root, reached without following any
    // symlink (a user's home may hold one), and bound from that very directory (its
    // descriptor's magic link), never from a path looked up again. A bind keeps the data
    // mount's flags (nosuid, nodev, noatime).
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    let no = |e: rustix::io::Errno| {
        Exit::new(exit::FAILURE, format!("-o area={area}: no such directory in {}: {e}", storage.display()))
    };
    let top = rustix::fs::open(&root, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
        .map_err(no)?;
    let how = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
    let fd = rustix::fs::openat2(
        &top,
        area,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        how,
    )
    .map_err(no)?;
    let from = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd));
    rustix::mount::mount_bind(from.as_str(), dir)
        .map_err(|e| Exit::new(exit::FAILURE, format!("cannot mount {area} at {}: {e}", dir.display())))?;
    Ok(())
}

/// The mount point of the daemon that serves `storage` (its host view's root), if one does: a
/// `fuse.cortexfs` mount of that source made by root (`user_id=0`: anyone may make a FUSE
/// mount named so) whose `status` says it is the host view (not an agent's).
fn served_at(storage: &Path) -> Option<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|l| {
        let (head, tail) = l.split_once(" - ")?;
        let mut t = tail.split(' ');
        let (kind, source, opts) = (t.next()?, t.next()?, t.next().unwrap_or(""));
        let at = PathBuf::from(head.split(' ').nth(4)?);
        let by_root = opts.split(',').any(|o| o == "user_id=0");
        let host =
            || std::fs::read_to_string(at.join("status")).is_ok_and(|s| s.lines().any(|l| l == "view host"));
        (kind == "fuse.cortexfs" && Path::new(source) == storage && by_root && host()).then_some(at)
    })
}

/// Starts `ctx ARGS` (a daemon serving `mp`, its control socket `control`) in the background,
/// its output in `/run/cortexfs/mount.<mp>.log`, and returns once the mount answers.
fn start_daemon(daemon: &[String], mp: &Path, control: &Path) -> anyhow::Result<()> {
    let dir = mp.to_string_lossy();
    let name: String = dir.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
    std::fs::create_dir_all(policy::runtime::RUN_ROOT)?;
    let log_path = Path::new(policy::runtime::RUN_ROOT).join(format!("mount.{name}.log"));
    let log = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new().create(true).append(true).mode(0o600).open(&log_path)?
    };
    let mut child = std::process::Command::new("setsid")
        .arg(std::env::current_exe()?)
        .args(daemon)
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .map_err(|e| Exit::new(exit::UNAVAILABLE, format!("setsid: {e}")))?;
    let t = std::time::Instant::now();
    loop {
        // Up: serving the mount and listening on its control socket (bound after the mount).
        if is_mount_point(mp) && std::fs::read_to_string(mp.join("status")).is_ok() && control.exists() {
            return Ok(());
        }
        if let Some(st) = child.try_wait()? {
            let said = std::fs::read_to_string(&log_path).unwrap_or_default();
            let last = said.lines().rfind(|l| l.starts_with("ctx: ")).unwrap_or("").to_owned();
            let code = st.code().and_then(|c| u8::try_from(c).ok()).unwrap_or(exit::FAILURE);
            return Err(Exit::new(
                code.max(1),
                format!("the daemon ended: {}", last.trim_start_matches("ctx: ")),
            )
            .into());
        }
        if t.elapsed() > std::time::Duration::from_secs(15) {
            return Err(Exit::new(
                exit::UNAVAILABLE,
                format!("{} did not answer (see {})", mp.display(), log_path.display()),
            )
            .into());
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
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
                space: None,
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
        ..server::Config::committed(a.source.clone(), bins()).map_err(|e| {
            Exit::io(format!("cannot activate the configuration of {}", a.source.display()), &e)
        })?
    };
    let logs = Arc::clone(&config.logs);
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
    let served = daemon
        .serve()
        .map_err(|e| Exit::new(exit::FAILURE, format!("serving virtio-fs on {}: {e}", socket.display())));
    logs.close();
    served?;
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
        ..server::Config::committed(a.source.clone(), bins()).map_err(|e| {
            Exit::io(format!("cannot activate the configuration of {}", a.source.display()), &e)
        })?
    };
    let logs = Arc::clone(&config.logs);
    let fs = server::CtxFs::new(config.clone())
        .map_err(|e| Exit::io(format!("cannot open storage {}", a.source.display()), &e))?;
    let data = fs.data().map_err(|e| Exit::io(format!("cannot open storage {}", a.source.display()), &e))?;
    let threads = a.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
    let mut signals = Signals::new([SIGINT, SIGTERM])?;
    let pool =
        Arc::new(server::transport::pool::Pool::with_transport(threads, a.transport).map_err(|e| {
            if e.kind() == std::io::ErrorKind::Unsupported {
                Exit::new(exit::UNAVAILABLE, format!("cannot serve over io_uring: {e}"))
            } else {
                Exit::new(exit::INTERNAL, format!("cannot start serving threads: {e}"))
            }
        })?);
    let transport = pool.transport().name();
    let fs = Arc::new(fs);
    let mount = pool
        .mount_host(Arc::clone(&fs), Arc::new(data), mp)
        .map_err(|e| Exit::new(exit::UNAVAILABLE, format!("cannot mount {}: {e}", mp.display())))?;
    // Agents start inside cgroups: moving their sandboxes there should not wait for the kernel.
    match ctxterm::launch::cgroups::favor_migrations() {
        Ok(true) => tracing::info!("cgroup moves favoured (favordynmods)"),
        Ok(false) => {}
        Err(e) => tracing::warn!(error = %e, "cgroup moves stay slow: favordynmods refused"),
    }
    let dead = server::control::clean_dead_views(&policy::runtime::views_root(&a.control));
    if !dead.is_empty() {
        let shown: Vec<String> = dead.iter().map(|d| d.display().to_string()).collect();
        tracing::warn!(count = dead.len(), "removed the dead views of a previous daemon");
        eprintln!("ctx: removed {} dead view(s) of a previous daemon: {}", dead.len(), shown.join(" "));
    }
    let views = Arc::new(server::control::Views::new(
        config,
        Arc::clone(&pool),
        policy::runtime::views_root(&a.control),
    ));
    views.serve_host(mount.token(), fs);
    views.watch().map_err(|e| Exit::new(exit::INTERNAL, format!("cannot start the view notifier: {e}")))?;
    // Agent sockets first: a daemon is up once its control socket is.
    let storage = std::fs::canonicalize(&a.source).unwrap_or_else(|_| a.source.clone());
    ctxterm::launch::asock::spawn(mp, &storage, &a.control).map_err(|e| {
        Exit::new(
            exit::UNAVAILABLE,
            format!("cannot serve agent sockets beside {}: {e}", a.control.display()),
        )
    })?;
    server::control::listen(&a.control, Arc::clone(&views)).map_err(|e| {
        Exit::new(exit::UNAVAILABLE, format!("cannot listen on {}: {e}", a.control.display()))
    })?;
    stop_when_unmounted(mp.clone())
        .map_err(|e| Exit::new(exit::INTERNAL, format!("cannot watch the mount table: {e}")))?;
    tracing::info!(storage = %a.source.display(), mountpoint = %mp.display(), threads, transport, "serving /ctx");
    eprintln!("ctx: serving {} at {} ({transport})", a.source.display(), mp.display());
    notify("READY=1");
    if let Some(sig) = signals.forever().next() {
        tracing::info!(signal = sig, "stopping");
    }
    notify("STOPPING=1");
    views.shutdown();
    ctxterm::launch::asock::remove_all(&storage, &a.control);
    let _ = std::fs::remove_file(&a.control);
    // Unmounted from outside already (`umount -R`): nothing is left to unmount.
    let outside = !is_mount_point(mp);
    let unmounted = pool.unmount_host(mount).or_else(|e| if outside { Ok(()) } else { Err(e) });
    drop(views);
    if let Ok(pool) = Arc::try_unwrap(pool) {
        pool.shutdown();
    }
    // The last checkpoint: every log durable in its file, the journal empty.
    logs.close();
    unmounted.map_err(|e| Exit::new(exit::FAILURE, format!("unmounting {}: {e}", mp.display())))?;
    Ok(())
}
