//! The PTY, the child, and the session socket.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc::{SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustix::pty::{OpenptFlags, grantpt, openpt, ptsname, unlockpt};
use rustix::termios::Winsize;

use crate::ring::Ring;

/// Most clients at once.
pub const MAX_CLIENTS: usize = 16;
/// Default scrollback in bytes.
pub const DEFAULT_SCROLLBACK: usize = 64 * 1024;
/// Chunks queued for one client before it is dropped as too slow.
const CLIENT_QUEUE: usize = 1024;

/// What to run and where to listen.
#[derive(Clone, Debug)]
pub struct Options {
    /// The session socket.
    pub socket: PathBuf,
    /// The command; the first word is the program.
    pub command: Vec<String>,
    /// Scrollback kept for late clients, in bytes.
    pub scrollback: usize,
    /// Initial window size (columns, rows).
    pub size: Option<(u16, u16)>,
    /// Start the command only once the first client has connected, so that it sees all output.
    pub wait_client: bool,
    /// Variables given to the command only (a key read from a descriptor).
    pub env: Vec<(std::ffi::OsString, std::ffi::OsString)>,
    /// Where the terminal's output is kept for after the run (see [`Keeper`]).
    pub keep: Option<PathBuf>,
}

/// The most of a run's terminal output that is kept: the file's previous half goes to
/// `<file>.1` when the file would pass half of this, so the two hold the last half to all of it.
pub const KEPT_OUTPUT: u64 = 1 << 20;

/// Keeps a terminal's output in a file (and its previous half in `<file>.1`), for when the run
/// has ended. A write that fails stops the keeping, never the terminal.
#[derive(Debug)]
pub struct Keeper {
    path: PathBuf,
    file: Option<File>,
    len: u64,
}

impl Keeper {
    /// Starts keeping at `path`, afresh: the previous run's output goes, and the file is a new
    /// one (a follower of the old one sees it replaced).
    pub fn new(path: PathBuf) -> Keeper {
        let mut k = Keeper { path, file: None, len: 0 };
        let _ = std::fs::remove_file(k.previous());
        let _ = std::fs::remove_file(&k.path);
        k.file = k.create();
        k
    }

    fn previous(&self) -> PathBuf {
        let mut p = self.path.clone().into_os_string();
        p.push(".1");
        PathBuf::from(p)
    }

    fn create(&self) -> Option<File> {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&self.path)
            .ok()
    }

    /// Keeps `bytes`.
    pub fn write(&mut self, bytes: &[u8]) {
        if self.file.is_none() {
            return;
        }
        if self.len + bytes.len() as u64 > KEPT_OUTPUT / 2 && self.len > 0 {
            self.file = std::fs::rename(&self.path, self.previous()).ok().and_then(|()| self.create());
            self.len = 0;
        }
        let Some(f) = self.file.as_mut() else { return };
        match f.write_all(bytes) {
            Ok(()) => self.len += bytes.len() as u64,
            Err(_) => self.file = None,
        }
    }
}

/// Runs `command` on this process's standard streams, with `env` added, and returns its exit
/// code (128 + the signal that ended it).
pub fn headless(command: &[String], env: &[(std::ffi::OsString, std::ffi::OsString)]) -> io::Result<i32> {
    use std::os::unix::process::ExitStatusExt;
    let program = command.first().ok_or_else(|| io::Error::other("no command"))?;
    let status = Command::new(program).args(&command[1..]).envs(env.iter().map(|(k, v)| (k, v))).status()?;
    Ok(status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0)))
}

/// The terminal's size until a client says its own: columns, rows.
pub const DEFAULT_SIZE: (u16, u16) = (80, 24);

/// Client modes: the first line a client sends is `watch`, `attach`, `attach COLSxROWS` (the
/// client's window size, applied to the PTY), `resize COLSxROWS` (a connection that only
/// changes the size, as an attached client does on SIGWINCH, and closes), or `turn` (one
/// command run beside the terminal's, in the same sandbox, on the client's descriptors: see
/// [`parse_turn`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Output only.
    Watch,
    /// Output and input.
    Attach,
    /// Only a new window size.
    Resize,
    /// One command beside the terminal's.
    Turn,
}

#[derive(Debug)]
struct State {
    ring: Ring,
    clients: Vec<(u64, SyncSender<Arc<[u8]>>)>,
    next: u64,
    closed: bool,
}

/// Why ctxterm could not run.
#[derive(Debug)]
pub enum RunError {
    /// The command could not be started.
    Spawn(io::Error),
    /// Anything else (PTY, socket).
    Io(io::Error),
}

impl From<io::Error> for RunError {
    fn from(e: io::Error) -> RunError {
        RunError::Io(e)
    }
}

impl From<rustix::io::Errno> for RunError {
    fn from(e: rustix::io::Errno) -> RunError {
        RunError::Io(e.into())
    }
}

/// Runs the child on a new PTY and serves the socket until the child exits; returns the exit
/// code to use (the child's, or 128 + its signal).
pub fn run(opts: &Options) -> Result<i32, RunError> {
    rustix::process::set_child_subreaper(Some(rustix::process::getpid()))?;
    // Kept output is there (begun afresh) before the terminal answers anyone.
    let keep = opts.keep.clone().map(Keeper::new);
    let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)?;
    grantpt(&master)?;
    unlockpt(&master)?;
    let name = ptsname(&master, Vec::new())?;
    // Close-on-exec: the command gets it as its three streams only, not a fourth time.
    let slave = rustix::fs::open(
        name.as_c_str(),
        rustix::fs::OFlags::RDWR | rustix::fs::OFlags::NOCTTY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?;
    // A sane size before the first client says its own (a 0x0 terminal shows CLIs nothing).
    let (cols, rows) = opts.size.unwrap_or(DEFAULT_SIZE);
    rustix::termios::tcsetwinsize(
        &master,
        Winsize { ws_row: rows, ws_col: cols, ws_xpixel: 0, ws_ypixel: 0 },
    )?;
    // The socket exists before the command runs.
    let _ = std::fs::remove_file(&opts.socket);
    let listener = UnixListener::bind(&opts.socket)?;
    std::fs::set_permissions(&opts.socket, std::fs::Permissions::from_mode(0o600))?;
    let env: Env = Arc::new(opts.env.clone());
    let state = Arc::new(Mutex::new(State {
        ring: Ring::new(opts.scrollback),
        clients: Vec::new(),
        next: 0,
        closed: false,
    }));
    // The first client, with --wait-client, is registered before the command starts: it gets
    // all of the output, however much comes before it would otherwise have joined.
    let first = if opts.wait_client {
        let (stream, _) = listener.accept()?;
        join(stream, &state, &File::from(master.try_clone()?), &env, true)
    } else {
        None
    };
    let program = opts.command.first().ok_or_else(|| RunError::Spawn(io::Error::other("no command")))?;
    let mut cmd = Command::new(program);
    cmd.args(&opts.command[1..])
        .envs(opts.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::from(File::from(slave.try_clone()?)))
        .stdout(Stdio::from(File::from(slave.try_clone()?)))
        .stderr(Stdio::from(File::from(slave.try_clone()?)));
    crate::sys::controlling_tty(&mut cmd, &slave);
    // A command that cannot start says why on the terminal, where its clients (`ctx agent start
    // --wait` among them) read; the run then ends as a command that exited 69.
    let mut child = match cmd.spawn() {
        Ok(child) => Some(child),
        Err(e) => {
            let why = format!("ctxterm: cannot run {program}: {e}\n");
            eprint!("{why}");
            io::Write::write_all(&mut File::from(slave.try_clone()?), why.as_bytes())?;
            None
        }
    };
    // The command holds our copies of the slave side; the PTY reports end of output only when
    // every copy is closed.
    drop(cmd);
    drop(slave);
    let pid = child.as_ref().map(rustix::process::Pid::from_child);

    let master = File::from(master);

    let reader = {
        let (mut m, state) = (master.try_clone()?, Arc::clone(&state));
        std::thread::Builder::new().name("pty".into()).spawn(move || pump(&mut m, &state, keep))?
    };
    // Held by every client's writer while it runs: the terminal's last output reaches the
    // clients before ctxterm exits.
    let writing = Arc::new(());
    if let Some(joined) = first {
        let (m, w) = (master.try_clone()?, Arc::clone(&writing));
        std::thread::Builder::new().name("client".into()).spawn(move || serve_joined(joined, m, w))?;
    }
    {
        let (m, state, writing) = (master.try_clone()?, Arc::clone(&state), Arc::clone(&writing));
        let env = Arc::clone(&env);
        std::thread::Builder::new().name("accept".into()).spawn(move || {
            for stream in listener.incoming().flatten() {
                let (m, state, w) = (m.try_clone(), Arc::clone(&state), Arc::clone(&writing));
                let Ok(m) = m else { continue };
                let env = Arc::clone(&env);
                let _ = std::thread::Builder::new()
                    .name("client".into())
                    .spawn(move || serve(stream, m, &state, w, &env));
            }
        })?;
    }
    let code = match (&mut child, pid) {
        (Some(child), Some(pid)) => {
            forward_signals(pid, master.try_clone()?)?;
            let status = child.wait()?;
            // No orphans: whatever the child left in its session goes too, then every
            // descendant reparented to us is reaped.
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
            while let Ok(Some(_)) = rustix::process::wait(rustix::process::WaitOptions::empty()) {}
            match (status.code(), std::os::unix::process::ExitStatusExt::signal(&status)) {
                (Some(c), _) => c,
                (None, Some(s)) => 128 + s,
                (None, None) => 1,
            }
        }
        _ => 69,
    };
    let _ = reader.join();
    if let Ok(mut st) = state.lock() {
        st.closed = true;
        st.clients.clear(); // dropping the senders ends the writer threads after they flush
    }
    let _ = std::fs::remove_file(&opts.socket);
    // Every writer ends once it has sent what it was given (or its client stopped reading for
    // WRITE_TIMEOUT); the accept thread keeps one token.
    let t = std::time::Instant::now();
    while Arc::strong_count(&writing) > 2 && t.elapsed() < WRITE_TIMEOUT + Duration::from_secs(1) {
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(code)
}

/// Copies PTY output into the scrollback and to every client, until the PTY closes.
fn pump(master: &mut File, state: &Mutex<State>, mut keep: Option<Keeper>) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match master.read(&mut buf) {
            Ok(0) | Err(_) => return, // EIO: every holder of the slave side is gone
            Ok(n) => n,
        };
        if let Some(k) = keep.as_mut() {
            k.write(&buf[..n]);
        }
        let chunk: Arc<[u8]> = Arc::from(&buf[..n]);
        let Ok(mut st) = state.lock() else { return };
        st.ring.push(&chunk);
        // A client that cannot keep up is dropped rather than stalling the terminal.
        st.clients.retain(|(_, tx)| match tx.try_send(Arc::clone(&chunk)) {
            Ok(()) => true,
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => false,
        });
    }
}

/// Reads the mode line (see [`Mode`]): the mode and the size it names, if any.
fn mode(stream: &mut UnixStream) -> io::Result<(Mode, Option<(u16, u16)>)> {
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while line.len() < 32 {
        stream.read_exact(&mut b)?;
        if b[0] == b'\n' {
            stream.set_read_timeout(None)?;
            return parse_mode(&line);
        }
        line.push(b[0]);
    }
    Err(io::Error::new(io::ErrorKind::InvalidInput, "mode line too long"))
}

/// Parses a mode line without its newline.
pub fn parse_mode(line: &[u8]) -> io::Result<(Mode, Option<(u16, u16)>)> {
    let bad = |why: &str| io::Error::new(io::ErrorKind::InvalidInput, why.to_owned());
    let line = std::str::from_utf8(line).map_err(|_| bad("unknown mode (watch, attach or resize)"))?;
    let (word, size) = match line.split_once(' ') {
        Some((w, s)) => (w, Some(s)),
        None => (line, None),
    };
    let size = match size {
        None => None,
        Some(s) => {
            let (c, r) = s.split_once('x').ok_or_else(|| bad("a size is COLSxROWS"))?;
            match (c.parse::<u16>(), r.parse::<u16>()) {
                (Ok(c), Ok(r)) if c > 0 && r > 0 => Some((c, r)),
                _ => return Err(bad("a size is COLSxROWS, each 1 to 65535")),
            }
        }
    };
    match (word, size) {
        ("watch", None) => Ok((Mode::Watch, None)),
        ("attach", size) => Ok((Mode::Attach, size)),
        ("resize", Some(size)) => Ok((Mode::Resize, Some(size))),
        ("turn", None) => Ok((Mode::Turn, None)),
        _ => Err(bad("unknown mode (watch, attach [COLSxROWS], resize COLSxROWS or turn)")),
    }
}

/// Sets the PTY's window size (the kernel tells the foreground process group: SIGWINCH).
fn resize(master: &File, (cols, rows): (u16, u16)) {
    let _ = rustix::termios::tcsetwinsize(
        master,
        Winsize { ws_row: rows, ws_col: cols, ws_xpixel: 0, ws_ypixel: 0 },
    );
}

/// How long a client may leave its output unread before it is dropped.
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);

/// A client that has said its mode and is registered: from now on it gets every chunk.
struct Joined {
    stream: UnixStream,
    mode: Mode,
    rx: std::sync::mpsc::Receiver<Arc<[u8]>>,
    snapshot: Vec<u8>,
}

/// Reads a client's mode line and registers it; `None` (the client told why) when it cannot be
/// served.
fn join(
    mut stream: UnixStream,
    state: &Mutex<State>,
    master: &File,
    env: &Env,
    first: bool,
) -> Option<Joined> {
    let (mode, size) = match self::mode(&mut stream) {
        Ok(m) => m,
        Err(e) => {
            let _ = writeln!(stream, "ctxterm: {e}");
            return None;
        }
    };
    if mode == Mode::Turn {
        if first {
            // The client the terminal waits for is its watcher: a turn joins a running one.
            let _ = writeln!(stream, "ctxterm: the terminal has not started yet");
        } else {
            turn(stream, env);
        }
        return None;
    }
    if let Some(size) = size {
        resize(master, size);
    }
    if mode == Mode::Resize {
        return None;
    }
    let (tx, rx) = sync_channel::<Arc<[u8]>>(CLIENT_QUEUE);
    let snapshot = {
        let Ok(mut st) = state.lock() else { return None };
        if st.closed {
            let _ = writeln!(stream, "ctxterm: the terminal has exited");
            return None;
        }
        if st.clients.len() >= MAX_CLIENTS {
            let _ = writeln!(stream, "ctxterm: too many clients ({MAX_CLIENTS})");
            return None;
        }
        let id = st.next;
        st.next += 1;
        st.clients.push((id, tx));
        st.ring.snapshot()
    };
    Some(Joined { stream, mode, rx, snapshot })
}

fn serve(stream: UnixStream, master: File, state: &Mutex<State>, writing: Arc<()>, env: &Env) {
    if let Some(j) = join(stream, state, &master, env, false) {
        serve_joined(j, master, writing);
    }
}

fn serve_joined(j: Joined, mut master: File, writing: Arc<()>) {
    let Joined { mut stream, mode: m, rx, snapshot } = j;
    let Ok(mut out) = stream.try_clone() else { return };
    let _ = out.set_write_timeout(Some(WRITE_TIMEOUT));
    let writer = std::thread::spawn(move || {
        let _writing = writing;
        if out.write_all(&snapshot).is_err() {
            return;
        }
        for chunk in rx {
            if out.write_all(&chunk).is_err() {
                return;
            }
        }
        let _ = out.shutdown(std::net::Shutdown::Write);
    });
    match m {
        Mode::Attach => {
            // Input goes to the PTY as it comes.
            let mut buf = [0u8; 4096];
            loop {
                match stream.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if master.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                }
            }
        }
        Mode::Watch | Mode::Resize | Mode::Turn => {
            // A watcher cannot type: its input is read and discarded.
            let mut sink = [0u8; 4096];
            while matches!(stream.read(&mut sink), Ok(n) if n > 0) {}
        }
    }
    let _ = writer.join();
}

/// The variables the terminal's command was given (a key read from a descriptor), which a
/// turn's command gets too.
type Env = Arc<Vec<(std::ffi::OsString, std::ffi::OsString)>>;

/// Most bytes of a turn's request line.
pub const TURN_REQUEST_MAX: usize = 64 * 1024;
/// Most arguments of a turn's command.
const TURN_ARGS_MAX: usize = 256;
/// Most turns running at once beside one terminal.
pub const TURNS_MAX: usize = 4;
/// How long a cancelled turn's command has between SIGTERM and SIGKILL.
const TURN_GRACE: Duration = Duration::from_secs(5);
/// Turns running now.
static TURNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// What a `turn` client asks for: a command and the directory it runs in.
#[derive(Debug, PartialEq, Eq)]
pub struct TurnRequest {
    /// The program and its arguments.
    pub argv: Vec<String>,
    /// An absolute directory in the sandbox.
    pub cwd: String,
}

/// Parses a turn's request line (without its newline): one JSON object
/// `{"argv":[PROGRAM, ARG...],"cwd":DIR}`, nothing else; at most [`TURN_REQUEST_MAX`] bytes and
/// 256 arguments, none with a NUL.
pub fn parse_turn(line: &[u8]) -> io::Result<TurnRequest> {
    let bad = |why: String| io::Error::new(io::ErrorKind::InvalidInput, why);
    if line.len() > TURN_REQUEST_MAX {
        return Err(bad(format!("a turn's request is at most {TURN_REQUEST_MAX} bytes")));
    }
    let v: serde_json::Value =
        serde_json::from_slice(line).map_err(|e| bad(format!("a turn's request: {e}")))?;
    let obj = v.as_object().ok_or_else(|| bad("a turn's request is a JSON object".into()))?;
    if let Some(k) = obj.keys().find(|k| !matches!(k.as_str(), "argv" | "cwd")) {
        return Err(bad(format!("a turn's request has no field {k:?} (argv, cwd)")));
    }
    let argv: Vec<String> = obj
        .get("argv")
        .and_then(|a| a.as_array())
        .ok_or_else(|| bad("argv: an array of strings".into()))?
        .iter()
        .map(|a| a.as_str().map(str::to_owned))
        .collect::<Option<_>>()
        .ok_or_else(|| bad("argv: an array of strings".into()))?;
    if argv.is_empty() || argv.len() > TURN_ARGS_MAX || argv[0].is_empty() {
        return Err(bad(format!("argv: a program and at most {} arguments", TURN_ARGS_MAX - 1)));
    }
    let cwd = obj.get("cwd").and_then(|c| c.as_str()).ok_or_else(|| bad("cwd: a string".into()))?.to_owned();
    if !cwd.starts_with('/') {
        return Err(bad("cwd: an absolute directory".into()));
    }
    if argv.iter().chain([&cwd]).any(|a| a.contains('\0')) {
        return Err(bad("a NUL in argv or cwd".into()));
    }
    Ok(TurnRequest { argv, cwd })
}

/// Serves a `turn` client: runs its command on the three descriptors it sent and answers
/// `exit N` (N: the exit code, or 128 + the signal) when it ends, or `ctxterm: WHY` when it
/// cannot run. The client closing its end first ends the command (SIGTERM to its group).
fn turn(mut stream: UnixStream, env: &Env) {
    struct Slot;
    impl Drop for Slot {
        fn drop(&mut self) {
            TURNS.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
    if TURNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) >= TURNS_MAX {
        TURNS.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        let _ = writeln!(stream, "ctxterm: {TURNS_MAX} turns run already");
        return;
    }
    let _slot = Slot;
    let _ = match run_turn(&mut stream, env) {
        Ok(code) => writeln!(stream, "exit {code}"),
        Err(e) => writeln!(stream, "ctxterm: {e}"),
    };
}

fn run_turn(stream: &mut UnixStream, env: &Env) -> io::Result<i32> {
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    use rustix::process::{Pid, Signal, WaitId, WaitIdOptions};
    use std::mem::MaybeUninit;
    use std::os::fd::OwnedFd;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    // One message: the request line, and the command's standard input, output and error.
    let mut buf = vec![0u8; TURN_REQUEST_MAX + 1];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(3))];
    let mut anc = RecvAncillaryBuffer::new(&mut space);
    let got = rustix::net::recvmsg(
        &*stream,
        &mut [io::IoSliceMut::new(&mut buf)],
        &mut anc,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    let mut fds: Vec<OwnedFd> = Vec::new();
    for m in anc.drain() {
        if let RecvAncillaryMessage::ScmRights(r) = m {
            fds.extend(r);
        }
    }
    // A long request may come in more than one piece: the rest follows without descriptors.
    let mut n = got.bytes;
    while n > 0 && buf[n - 1] != b'\n' && n < buf.len() {
        match stream.read(&mut buf[n..])? {
            0 => break,
            more => n += more,
        }
    }
    let line = buf[..n].strip_suffix(b"\n").ok_or_else(|| {
        io::Error::new(io::ErrorKind::InvalidInput, "a turn's request is one line of at most 64 KiB")
    })?;
    let req = parse_turn(line)?;
    let [stdin, stdout, stderr]: [OwnedFd; 3] = fds
        .try_into()
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a turn brings three descriptors"))?;
    stream.set_read_timeout(None)?;
    let mut cmd = Command::new(&req.argv[0]);
    cmd.args(&req.argv[1..])
        .current_dir(&req.cwd)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::from(stdin))
        .stdout(Stdio::from(stdout))
        .stderr(Stdio::from(stderr));
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child =
        cmd.spawn().map_err(|e| io::Error::new(e.kind(), format!("cannot run {}: {e}", req.argv[0])))?;
    drop(cmd);
    let pid = Pid::from_child(&child);
    // Its group is signalled only while the leader is not reaped (a zombie keeps the group's
    // id from being given again): `ended` is set under the lock before it is.
    let ended = Arc::new(Mutex::new(false));
    {
        let (mut watch, ended) = (stream.try_clone()?, Arc::clone(&ended));
        std::thread::Builder::new().name("turn".into()).spawn(move || {
            let mut sink = [0u8; 64];
            while matches!(watch.read(&mut sink), Ok(n) if n > 0) {}
            // SIGTERM, then SIGKILL after the grace period to what did not end.
            for signal in [Signal::TERM, Signal::KILL] {
                {
                    // Signalled under the lock: the leader is not reaped meanwhile.
                    let e = ended.lock().unwrap_or_else(|e| e.into_inner());
                    if *e {
                        return;
                    }
                    let _ = rustix::process::kill_process_group(pid, signal);
                }
                let t = std::time::Instant::now();
                while t.elapsed() < TURN_GRACE && !*ended.lock().unwrap_or_else(|e| e.into_inner()) {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        })?;
    }
    let _ = rustix::process::waitid(WaitId::Pid(pid), WaitIdOptions::EXITED | WaitIdOptions::NOWAIT);
    {
        let mut e = ended.lock().unwrap_or_else(|e| e.into_inner());
        *e = true;
        // No orphans: what the command left in its group goes with it.
        let _ = rustix::process::kill_process_group(pid, Signal::KILL);
    }
    let status = child.wait()?;
    Ok(match (status.code(), std::os::unix::process::ExitStatusExt::signal(&status)) {
        (Some(c), _) => c,
        (None, Some(s)) => 128 + s,
        (None, None) => 1,
    })
}

/// Forwards termination and job-control signals to the child's process group, and the window
/// size of ctxterm's own terminal (when it has one) to the PTY.
fn forward_signals(pid: rustix::process::Pid, master: File) -> io::Result<()> {
    use signal_hook::consts::*;
    let mut signals =
        signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGWINCH])?;
    std::thread::Builder::new().name("signals".into()).spawn(move || {
        for sig in signals.forever() {
            if sig == SIGWINCH {
                if let Ok(ws) = rustix::termios::tcgetwinsize(std::io::stdin()) {
                    let _ = rustix::termios::tcsetwinsize(&master, ws);
                }
                continue;
            }
            if let Some(s) = rustix::process::Signal::from_named_raw(sig) {
                let _ = rustix::process::kill_process_group(pid, s);
            }
        }
    })?;
    Ok(())
}

/// Reads a secret from the inherited descriptor `fd` to its end (at most 64 KiB) and closes
/// it, so that nothing started later inherits it.
pub fn read_secret_fd(fd: i32) -> io::Result<Vec<u8>> {
    use std::io::Read;
    use std::os::fd::FromRawFd;
    if fd < 3 {
        return Err(io::Error::other("a secret's descriptor is 3 or above"));
    }
    // Take ownership only of a descriptor that is open.
    rustix::io::fcntl_getfd(unsafe_borrow(fd)).map_err(io::Error::from)?;
    #[allow(unsafe_code)]
    // SAFETY: `fd` is open (checked above) and was handed to this process to consume; nothing
    // else in it uses that number.
    let f = unsafe { File::from_raw_fd(fd) };
    let mut v = Vec::new();
    f.take(64 * 1024 + 1).read_to_end(&mut v)?;
    if v.len() > 64 * 1024 {
        return Err(io::Error::other("over 64 KiB"));
    }
    if v.last() == Some(&b'\n') {
        v.pop();
    }
    Ok(v)
}

fn unsafe_borrow(fd: i32) -> std::os::fd::BorrowedFd<'static> {
    #[allow(unsafe_code)]
    // SAFETY: used only for one fcntl(F_GETFD) right away, which fails cleanly on a closed number.
    unsafe {
        std::os::fd::BorrowedFd::borrow_raw(fd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mode_lines_name_a_mode_and_maybe_a_size() {
        assert_eq!(parse_mode(b"watch").unwrap(), (Mode::Watch, None));
        assert_eq!(parse_mode(b"attach").unwrap(), (Mode::Attach, None));
        assert_eq!(parse_mode(b"attach 120x40").unwrap(), (Mode::Attach, Some((120, 40))));
        assert_eq!(parse_mode(b"resize 80x24").unwrap(), (Mode::Resize, Some((80, 24))));
        for bad in
            [&b"resize"[..], b"watch 80x24", b"attach 0x10", b"attach 80x", b"attach x", b"type", b"\xff"]
        {
            assert!(parse_mode(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
