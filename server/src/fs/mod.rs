//! `CtxFs`: the `/ctx` projection as a fuse-backend-rs `FileSystem`.
//!
//! The root is exactly `status bin model agent tool home shared`. `status` and `bin/` are
//! synthesized; the rest is storage, shown through the ABI rules of [`crate::area`]:
//! objects are read-only executables, controls are replaced whole and atomically on close
//! (policies are parsed first), runtime controls are read-only, session logs take whole JSON
//! lines at their end through the ringfs group commit, and `home/`/`shared/` data behaves as
//! POSIX files owned by the caller. Mode bits are checked by the kernel (`default_permissions`).
//!
//! Caching: storage entries and attributes time out after [`Config::cache_timeout`] (1 s by
//! default; in agent views only when their entries are dropped on every change of what they
//! show, see [`CtxFs::cache_entries`], 0 otherwise). Plain files are opened without FLUSH at
//! close, and a read-only open of a file unchanged in storage since the last open keeps the
//! kernel's pages (KEEP_CACHE); in the host view directory listings are cached and kept the
//! same way (CACHE_DIR). OPEN itself stays on a connection that serves controls, `status` or
//! session logs: they need their handles and DIRECT_IO. The host's `home/` and `shared/` are
//! served by a connection of their own without OPEN, FLUSH or RELEASE ([`CtxFs::data`]).

mod inodes;
pub mod quota;
mod sync_io;
#[cfg(test)]
mod tests;

use inodes::{Access, Inodes, Node, Paths, stamp_of};

use std::borrow::Cow;
use std::collections::HashMap;
use std::ffi::CStr;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use fuse_backend_rs::abi::fuse_abi::{Attr, CreateIn, stat64};
use fuse_backend_rs::api::filesystem::{
    Context, DirEntry, Entry, FileSystem, FsOptions, GetxattrReply, ListxattrReply, OpenOptions,
    SetattrValid, ZeroCopyReader, ZeroCopyWriter,
};
use policy::controls::{self, ObjectClass, Owner};
use ringfs::log::AppendLog;
use rustix::fs::{AtFlags, Mode, OFlags, RenameFlags, Timespec, Timestamps};

use crate::area::{Area, classify};
use crate::storage::{LAYOUT, Storage, component};
use crate::view::{Authority, Epoch, SharedAccess, ViewSpec};

const ROOT: u64 = 1;
const STATUS: u64 = 2;
const BIN: u64 = 3;
/// `bin/` entries are `BIN_FIRST + i`.
const BIN_FIRST: u64 = 4;
/// The layout directories are `LAYOUT_FIRST + i`.
const LAYOUT_FIRST: u64 = 10;
/// Storage inodes are numbered from here.
const DYNAMIC_FIRST: u64 = 100;

/// Immutable entries (root, bin) are cached for a long time.
const LONG: Duration = Duration::from_secs(3600);
/// How long storage entries and attributes are kept by default: they may change behind the
/// server's back (installs, edits in the storage directory).
pub const DEFAULT_CACHE_TIMEOUT: Duration = Duration::from_secs(1);

/// The root entries, in listing order.
pub const ROOT_NAMES: [&str; 7] = ["status", "bin", "model", "agent", "tool", "home", "shared"];

const KIND_XATTR: &[u8] = b"user.cortexfs.kind";

/// `FOPEN_NOFLUSH`: the kernel sends no FLUSH when a descriptor of this open file is closed.
/// fuse-backend-rs 0.14's `OpenOptions` (bitflags 1) does not declare it.
#[allow(unsafe_code)]
fn noflush() -> OpenOptions {
    // SAFETY: `OpenOptions` is a plain `u32` copied into the open reply; bitflags 1 marks
    // `from_bits_unchecked` unsafe only because the bit is not one it declares. The kernel
    // defines bit 5 of `open_flags` as FOPEN_NOFLUSH (protocol 7.31, negotiated 7.33 here).
    unsafe { OpenOptions::from_bits_unchecked(1 << 5) }
}

use crate::errno::{Why, err, passed};

/// Server configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// The storage directory.
    pub storage: PathBuf,
    /// `bin/` entries: name and host path.
    pub bins: Vec<(String, PathBuf)>,
    /// The agent view this filesystem serves; `None` for the host view.
    pub view: Option<ViewSpec>,
    /// The daemon's count of agent views, shown in `status`.
    pub view_count: Arc<AtomicU64>,
    /// The open append logs, shared by the host view and every agent view of a daemon: a log
    /// is opened (and locked) once, whichever view appends to it.
    pub logs: SharedLogs,
    /// Where the connections of a daemon report what they changed, for the connections whose
    /// kernels cache it.
    pub changes: Changes,
    /// How long kernels keep storage entries and attributes, for changes made behind the
    /// daemon's back ([`DEFAULT_CACHE_TIMEOUT`]); changes made through the daemon drop them
    /// at once.
    pub cache_timeout: Duration,
    /// The agents' disk accounts, shared by every view of a daemon.
    pub quotas: Arc<quota::Quotas>,
    /// The storage's active configuration generation, which agent views serve objects and
    /// controls from; `None` serves them from the storage itself.
    pub active: Option<Arc<crate::storage::Active>>,
}

impl Config {
    /// The host view of `storage` with `bins` as `bin/`, for a daemon of its own: no views yet,
    /// its own logs and change hooks, the default cache timeout.
    pub fn new(storage: PathBuf, bins: Vec<(String, PathBuf)>) -> Config {
        Config {
            storage,
            bins,
            view: None,
            view_count: Arc::default(),
            logs: SharedLogs::default(),
            changes: Changes::default(),
            cache_timeout: DEFAULT_CACHE_TIMEOUT,
            quotas: Arc::default(),
            active: None,
        }
    }

    /// [`Config::new`], serving the storage's active configuration generation to agent
    /// views once its configuration is a repository: a generation left unactivated by an
    /// interrupted commit is activated first ([`ringfs::config::ensure`]), and the first
    /// commit of a storage that is not one yet is taken in when it is made. A storage that
    /// holds configuration and is not a repository becomes one at this first start, its files
    /// as they are the first commit, before anything is served: agents are never served its
    /// files as they are and then, mid-run, a generation.
    pub fn committed(storage: PathBuf, bins: Vec<(String, PathBuf)>) -> io::Result<Config> {
        ringfs::config::prepare_generations();
        std::fs::create_dir_all(ringfs::config::generations_dir(&storage))?;
        let holds_config = || {
            ringfs::config::CLASSES.iter().any(|c| {
                std::fs::read_dir(storage.join(c)).is_ok_and(|mut d| {
                    d.any(|e| {
                        e.is_ok_and(|e| e.file_name().to_str().is_some_and(ringfs::config::tracked_name))
                    })
                })
            })
        };
        if ringfs::config::is_repository(&storage) {
            ringfs::config::ensure(&storage).map_err(io::Error::other)?;
        } else if holds_config() {
            // The root layout the daemon makes anyway, made first: in the first commit.
            for d in crate::storage::LAYOUT {
                let _ = std::fs::create_dir(storage.join(d));
            }
            let t = std::time::Instant::now();
            match ringfs::config::ensure(&storage) {
                Ok(id) => tracing::info!(
                    generation = %id,
                    ms = t.elapsed().as_millis() as u64,
                    "the storage's configuration is a repository now: its files as they were, the first commit"
                ),
                Err(e) => {
                    tracing::warn!(error = %e, "the storage's configuration stays as it is, not a repository")
                }
            }
        }
        let active = crate::storage::Active::open(&storage);
        Ok(Config { active: Some(active), ..Config::new(storage, bins) })
    }
}

/// The append logs of one daemon, shared between its views: the open logs by storage path,
/// and the storage's journal, through which every log appends (opened with the first view).
#[derive(Debug, Default)]
pub struct Logs {
    open: Mutex<HashMap<PathBuf, Arc<AppendLog>>>,
    journal: std::sync::OnceLock<Option<Arc<ringfs::log::Journal>>>,
    /// Held while the journal is opened: one open, however many views start at once.
    opening: Mutex<()>,
    /// Each tool's and model's use, from the lines their logs take (served as their `status`).
    usage: policy::usage::Usage,
}

/// [`Logs`], shared.
pub type SharedLogs = Arc<Logs>;

impl Logs {
    /// The journal of `storage`, opened (and replayed) on first use. A storage where no journal
    /// is and none can be made (a read-only or full filesystem), or whose journal another daemon
    /// holds, leaves each log committing on its own, which is said once (a log its journal holds
    /// is then refused: its length counts only once that journal is replayed). A journal that is
    /// there and cannot be read or replayed is an error.
    fn journal(&self, storage: &Path) -> io::Result<Option<Arc<ringfs::log::Journal>>> {
        let _one = lock(&self.opening);
        if let Some(j) = self.journal.get() {
            return Ok(j.clone());
        }
        let existed = storage.join(ringfs::log::journal::FILE_NAME).exists();
        let opened = match ringfs::log::Journal::open(storage, ringfs::log::journal::DEFAULT_CAP) {
            Ok(j) => Some(j),
            Err(e) if existed && !matches!(e, ringfs::Error::Busy { .. }) => {
                return Err(io::Error::other(e.to_string()));
            }
            Err(e) => {
                tracing::warn!(storage = %storage.display(), error = %e, "no journal: each log commits on its own");
                None
            }
        };
        Ok(self.journal.get_or_init(|| opened).clone())
    }

    /// What the journal did, when there is one.
    pub fn journal_stats(&self) -> Option<ringfs::log::journal::Stats> {
        self.journal.get().and_then(|j| j.as_ref().map(|j| j.stats()))
    }

    /// Closes every open log and then the journal (a last checkpoint): called once the daemon
    /// serves no more requests.
    pub fn close(&self) {
        lock(&self.open).clear();
        if let Some(Some(j)) = self.journal.get()
            && let Err(e) = j.close()
        {
            tracing::error!(error = %e, "closing the journal failed");
        }
    }

    /// Closes the logs no open file holds any more. The journal holds the logs written since
    /// its last checkpoint until the next: one is made, so that their files close now.
    pub fn close_idle(&self) {
        if !lock(&self.open).is_empty()
            && let Some(Some(j)) = self.journal.get()
            && let Err(e) = j.checkpoint()
        {
            tracing::warn!(error = %e, "a checkpoint of the journal failed");
        }
        lock(&self.open).retain(|_, log| Arc::strong_count(log) > 1);
    }
}

/// A hook called with the storage path of a data file whose contents changed.
pub type OnData = Arc<dyn Fn(&Path) + Send + Sync>;
/// A hook called when what agent views may see may have changed.
pub type OnAuthority = Arc<dyn Fn() + Send + Sync>;

#[derive(Default)]
struct Hooks {
    data: Option<OnData>,
    authority: Option<OnAuthority>,
}

/// Changes made through one connection of a daemon, reported to the connections whose kernels
/// cache what they change:
/// - data written through a view, to the host's data connection (see [`CtxFs::data`]), which
///   keeps pages across opens and drops them at once instead of at its next attribute refresh;
/// - a control published (a policy, a label...), to every agent view, whose kernels keep
///   entries for a while and must look them up again, since what a view shows follows the
///   policies (see [`control::Views::watch`](crate::control::Views::watch), which also reports
///   changes made in the storage directory by other means).
#[derive(Clone, Default)]
pub struct Changes(Arc<Mutex<Hooks>>, Arc<Epoch>);

impl std::fmt::Debug for Changes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Changes")
    }
}

impl Changes {
    /// Sets the data hook.
    pub fn on_data(&self, hook: OnData) {
        lock(&self.0).data = Some(hook);
    }

    /// Sets the authority hook.
    pub fn on_authority(&self, hook: OnAuthority) {
        lock(&self.0).authority = Some(hook);
    }

    /// Reports that the data file `rel` changed.
    pub fn data(&self, rel: &Path) {
        let hook = lock(&self.0).data.clone();
        if let Some(hook) = hook {
            hook(rel);
        }
    }

    /// When what agent views' authority is read from may have changed.
    pub fn epoch(&self) -> &Arc<Epoch> {
        &self.1
    }

    /// Reports that what agent views may see may have changed.
    pub fn authority(&self) {
        self.1.bump();
        let hook = lock(&self.0).authority.clone();
        if let Some(hook) = hook {
            hook();
        }
    }
}

/// An open file or directory.
#[derive(Debug)]
enum Handle {
    /// A storage file.
    File(File),
    /// A control being rewritten: the new contents, published on flush by the process that
    /// wrote them (`writer`, 0 before any write), else at release.
    Control { rel: PathBuf, buf: Vec<u8>, dirty: bool, file: Option<File>, writer: i32 },
    /// A session log.
    Log(Arc<AppendLog>),
    /// A snapshot (status).
    Bytes(Vec<u8>),
    /// A directory listing snapshot, taken at the first READDIR, so that an open whose listing
    /// the kernel already caches costs no listing at all.
    Dir(Listing),
}

/// A directory's entries: the names one after another, and for each entry where its name ends,
/// its inode hint and its type. A closed directory's buffers serve the next one opened, so a
/// listing allocates nothing once they have grown.
#[derive(Debug, Default)]
pub(crate) struct Listing {
    names: Vec<u8>,
    entries: Vec<(usize, u64, u32)>,
    taken: bool,
}

impl Listing {
    fn clear(&mut self) {
        self.names.clear();
        self.entries.clear();
        self.taken = false;
    }

    fn push(&mut self, name: &[u8], ino: u64, t: u32) {
        self.names.extend_from_slice(name);
        self.entries.push((self.names.len(), ino, t));
    }

    /// The entries from the `skip`th: name, inode hint, type.
    fn from(&self, skip: usize) -> impl Iterator<Item = (&[u8], u64, u32)> {
        let start = |i: usize| if i == 0 { 0 } else { self.entries[i - 1].0 };
        self.entries
            .iter()
            .enumerate()
            .skip(skip)
            .map(move |(i, &(end, ino, t))| (&self.names[start(i)..end], ino, t))
    }
}

/// Buffers of appended log pieces kept for reuse, at most.
const PIECE_BUFS: usize = 8;

/// Handles of closed directories kept for reuse, at most.
const SPARE_DIRS: usize = 64;
/// The most room a kept listing keeps: bytes of names, and entries.
const LISTING_NAMES_KEPT: usize = 64 << 10;
const LISTING_ENTRIES_KEPT: usize = 2048;

/// Directory handles closed, with their listings' buffers, for the next opens of any
/// connection. Made with room for directories opened at once (a close's RELEASEDIR comes after
/// the close returns, so the next open may come first) with listings of up to 512 entries, so
/// that opening, listing and closing allocates nothing even when more are open at once than
/// before.
fn spare_dirs() -> &'static Mutex<Vec<Arc<Mutex<Handle>>>> {
    static SPARE: std::sync::OnceLock<Mutex<Vec<Arc<Mutex<Handle>>>>> = std::sync::OnceLock::new();
    SPARE.get_or_init(|| {
        let mut v = Vec::with_capacity(SPARE_DIRS);
        for _ in 0..8 {
            let l = Listing {
                names: Vec::with_capacity(16 << 10),
                entries: Vec::with_capacity(512),
                taken: false,
            };
            v.push(Arc::new(Mutex::new(Handle::Dir(l))));
        }
        Mutex::new(v)
    })
}

/// An open handle: the inode it was opened on, and its state.
type Opened = (u64, Arc<Mutex<Handle>>);

/// Request counters by operation.
#[derive(Debug, Default)]
struct Stats {
    ops: [AtomicU64; OPS.len()],
}

const OPS: [&str; 16] = [
    "lookup", "getattr", "setattr", "readdir", "open", "read", "write", "create", "mkdir", "unlink",
    "rename", "flush", "release", "fsync", "xattr", "other",
];

impl Stats {
    fn count(&self, op: &str) {
        let i = OPS.iter().position(|o| *o == op).unwrap_or(OPS.len() - 1);
        self.ops[i].fetch_add(1, Ordering::Relaxed);
    }
}

/// The `/ctx` filesystem.
#[derive(Debug)]
pub struct CtxFs {
    storage: Storage,
    bins: Vec<(String, PathBuf)>,
    inodes: Mutex<Inodes>,
    handles: Mutex<HashMap<u64, Opened>>,
    next_handle: AtomicU64,
    logs: SharedLogs,
    /// Shared with the host's data connection, whose requests the host's `status` counts.
    stats: Arc<Stats>,
    /// How the connection serving this filesystem is served (shared with the host's data
    /// connection, as the counters are).
    wire: Arc<crate::transport::Wire>,
    started: Instant,
    /// The active configuration generation, shown in `status`.
    active: Option<Arc<crate::storage::Active>>,
    view: Option<Authority>,
    view_count: Arc<AtomicU64>,
    changes: Changes,
    /// [`Config::cache_timeout`].
    ttl: Duration,
    /// Entry and attribute timeout of storage entries in an agent view: zero unless the view's
    /// kernel is told when to drop them (see [`CtxFs::cache_entries`]).
    view_timeout: Duration,
    /// Serves data without OPEN, FLUSH and RELEASE (see [`CtxFs::data`]).
    zero_open: bool,
    /// On the data connection, the first pieces of a session-log write that the kernel split
    /// at a page boundary, by inode, with the offset the next piece must come at (see
    /// [`CtxFs::log_piece`]).
    pieces: Mutex<HashMap<u64, (u64, Vec<u8>)>>,
    /// Buffers of pieces appended, for the next pieces held (see [`CtxFs::log_piece`]).
    piece_bufs: Mutex<Vec<Vec<u8>>>,
    /// The daemon's disk accounts, and the one of the agent this view serves, when its
    /// limits name a disk ceiling.
    quotas: Arc<quota::Quotas>,
    quota: Option<Arc<quota::Account>>,
    /// POSIX ACLs negotiated with the kernel (`FUSE_POSIX_ACL`, `FUSE_DONT_MASK`): the kernel
    /// enforces them and leaves the umask to the server (see [`CtxFs::creation_mode`]).
    acls: std::sync::atomic::AtomicBool,
}

/// The most bytes of one line of a session or object log written through any connection,
/// its newline included: the least a view's kernel sends of a longer write in one request, so
/// a line this long or shorter reaches a view's daemon whole, and a longer one is refused at
/// its first piece (see `CtxFs::log_piece`).
pub const LINE_MAX: usize = (1 << 20) - 4096;

/// What becomes of one piece of a log write (see [`CtxFs::log_piece`]).
enum Piece<'a> {
    /// Acknowledged whole and held for the rest of its write.
    Held,
    /// `bytes` to append at `start`; `ack` bytes of the request acknowledged once they are.
    Append { start: u64, bytes: Cow<'a, [u8]>, ack: usize },
    /// Refused with this errno: nothing of it stored.
    Refused(i32),
}

/// Most bytes of one extended attribute's value, or of a list of names (the kernel's limit).
const XATTR_MAX: usize = 64 * 1024;

/// Whether data may carry the attribute `name`: EPERM for CortexFS's own namespace,
/// EOPNOTSUPP for ACLs and namespaces the backing filesystem's users have no use for here.
/// CortexFS's computed attributes: read by name, never listed (a copy does not carry them).
const SIZE_XATTR: &[u8] = b"user.cortexfs.size";
const TOKENS_XATTR: &[u8] = b"user.cortexfs.tokens";
const ORIGIN_XATTR: &[u8] = b"user.cortexfs.origin";

/// Where the file at `rel` comes from, as `user.cortexfs.origin` says: `session:<agent>/<session>`
/// for a session's files (in a home or a shared space), `home:<uid>`, `shared:<space>`,
/// `<class>:<name>` for an object and its controls (`model:<provider>/<model>`).
fn origin_of(rel: &Path) -> Option<String> {
    let c: Vec<&str> = rel.iter().filter_map(|c| c.to_str()).collect();
    let object = |n: &str| n.strip_suffix(".d").or_else(|| n.strip_suffix(".sock")).unwrap_or(n).to_owned();
    Some(match c.as_slice() {
        ["home" | "shared", _, "agent", a, "session", s, ..] => format!("session:{a}/{s}"),
        ["home", uid, ..] => format!("home:{uid}"),
        ["shared", space, ..] => format!("shared:{space}"),
        [class @ ("tool" | "agent"), n, ..] => format!("{class}:{}", object(n)),
        ["model", p, m, ..] => format!("model:{p}/{}", object(m)),
        _ => return None,
    })
}

/// POSIX ACLs as extended attributes: the access ACL, and a directory's default one.
const ACL_XATTRS: [&[u8]; 2] = [b"system.posix_acl_access", b"system.posix_acl_default"];

fn data_xattr(name: &[u8]) -> io::Result<()> {
    if name.starts_with(b"user.cortexfs.") {
        Err(err(Why::Object))
    } else if [&b"user."[..], b"security.", b"trusted."].iter().any(|p| name.starts_with(p))
        || ACL_XATTRS.contains(&name)
    {
        Ok(())
    } else {
        Err(err(Why::Unsupported))
    }
}

/// The magic link through which a path descriptor's inode takes xattr calls.
fn proc_fd(fd: &Backing) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// A new open file description of the inode `f` holds (whatever its names are now), through
/// its /proc/self/fd magic link, never following a symlink into another file.
fn reopen(f: &File, flags: OFlags) -> io::Result<OwnedFd> {
    if f.metadata()?.file_type().is_symlink() {
        return Err(err(Why::Loop));
    }
    let link = format!("/proc/self/fd/{}", f.as_raw_fd());
    rustix::fs::open(link.as_str(), flags | OFlags::CLOEXEC, Mode::empty()).map_err(ioerr)
}

/// A data inode's backing file, for its extended attributes: the one kept open for the inode
/// when there is one (the kernel asks for `security.capability` before every write), else one
/// opened for the call.
enum Backing {
    Kept(Arc<File>),
    Opened(OwnedFd),
}

impl AsRawFd for Backing {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        match self {
            Backing::Kept(f) => f.as_raw_fd(),
            Backing::Opened(fd) => fd.as_raw_fd(),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The `st_ino` shown for a backed file: its backing inode number, mixed with its device's
/// number when it is on another filesystem than the storage's (a shared space on its own
/// mount), so that `d_ino` in a listing and `st_ino` agree without an inode being remembered
/// for every entry listed. Below 2^63: the numbers of CortexFS's own entries are above.
pub(crate) fn shown_ino(dev: u64, ino: u64, storage_dev: u64) -> u64 {
    let mixed = if dev == storage_dev { ino } else { ino ^ dev.rotate_left(40) };
    mixed & !VIRTUAL_INO
}

/// The `st_ino` of CortexFS's own entries (the root, `status`, `bin/`): `VIRTUAL_INO | ino`.
pub(crate) const VIRTUAL_INO: u64 = 1 << 63;

/// The attributes of a backed file whose `lstat` is `st`, on a storage on device
/// `storage_dev` (see [`shown_ino`]).
fn attr_of(st: &rustix::fs::Stat, storage_dev: u64) -> stat64 {
    Attr {
        ino: shown_ino(st.st_dev, st.st_ino, storage_dev),
        size: st.st_size as u64,
        blocks: st.st_blocks as u64,
        atime: st.st_atime as u64,
        mtime: st.st_mtime as u64,
        ctime: st.st_ctime as u64,
        atimensec: st.st_atime_nsec as u32,
        mtimensec: st.st_mtime_nsec as u32,
        ctimensec: st.st_ctime_nsec as u32,
        mode: st.st_mode,
        nlink: st.st_nlink as u32,
        uid: st.st_uid,
        gid: st.st_gid,
        rdev: st.st_rdev as u32,
        blksize: st.st_blksize as u32,
        flags: 0,
    }
    .into()
}

fn synthetic(ino: u64, mode: u32, size: u64) -> stat64 {
    let now = started_secs();
    Attr {
        ino: VIRTUAL_INO | ino,
        size,
        atime: now,
        mtime: now,
        ctime: now,
        blocks: size.div_ceil(512),
        mode,
        nlink: if mode & libc::S_IFDIR != 0 { 2 } else { 1 },
        blksize: 4096,
        ..Attr::default()
    }
    .into()
}

/// The server's start time, as the times of synthesized entries.
fn started_secs() -> u64 {
    static START: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *START.get_or_init(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
    })
}

fn ioerr(e: rustix::io::Errno) -> io::Error {
    e.into()
}

/// Appends `data` to a log. A descriptor opened with `O_APPEND` appends at the log's end as
/// the daemon knows it, whatever offset its kernel sent: each connection's kernel computes that
/// offset from its own idea of the file's size, stale as soon as another connection (another
/// view, the host) appended. Without `O_APPEND` the offset must be the end.
fn append(log: &AppendLog, flags: u32, offset: u64, data: &[u8]) -> io::Result<()> {
    let r = if flags & libc::O_APPEND as u32 != 0 { log.append(data) } else { log.append_at(offset, data) };
    r.map(drop).map_err(|e| ringfs_errno(&e))
}

/// Whom a deferred WRITE's reply goes to: the bytes taken, or the error.
pub enum WriteDone {
    /// A call with the reply.
    Call(Box<dyn FnOnce(io::Result<usize>) + Send>),
    /// A transport's receiver of replies, shared by the writes it serves, told
    /// `[tag[0], tag[1], bytes taken]` and the log's outcome (its errno on a failure): a write
    /// that waits this way allocates nothing.
    Tell(Arc<dyn ringfs::log::Tell>, [u64; 2]),
}

impl std::fmt::Debug for WriteDone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WriteDone::Call(_) => f.write_str("WriteDone::Call"),
            WriteDone::Tell(_, tag) => f.debug_tuple("WriteDone::Tell").field(tag).finish(),
        }
    }
}

impl WriteDone {
    /// Replies now.
    fn reply(self, r: io::Result<usize>) {
        match self {
            WriteDone::Call(f) => f(r),
            WriteDone::Tell(to, [a, b]) => match r {
                Ok(n) => to.tell([a, b, n as u64], Ok(0)),
                Err(e) => to.tell([a, b, 0], Err(ringfs::Error::io("write", PathBuf::new(), e))),
            },
        }
    }
}

thread_local! {
    /// Path buffers of this thread, reused by the requests it serves.
    static SCRATCH: std::cell::RefCell<Vec<PathBuf>> = const { std::cell::RefCell::new(Vec::new()) };
    /// A byte buffer of this thread, reused by the reads it serves.
    static BYTES: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Gives the calling thread, about to serve requests, the buffers its requests reuse at their
/// full size, so that none of its requests allocates for them, the first ones included: path
/// buffers of `PATH_MAX` and a read buffer of the largest read.
pub fn prepare_thread() {
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        s.reserve(4);
        while s.len() < 2 {
            s.push(PathBuf::with_capacity(libc::PATH_MAX as usize));
        }
    });
    let mut b = BYTES.take();
    b.reserve(READ_MAX);
    BYTES.set(b);
}

/// The largest read a request makes (the `max_pages` the connections are set up with).
const READ_MAX: usize = 1 << 20;

/// Runs `f` with `len` zeroed bytes of a buffer of this thread's that later requests reuse:
/// once it has grown to the largest read, a read allocates nothing.
pub(crate) fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
    let mut b = BYTES.take();
    b.clear();
    b.resize(len, 0);
    let r = f(&mut b);
    BYTES.set(b);
    r
}

/// Runs `f` with `dir` joined with `name`, made in a buffer of this thread's that later
/// requests reuse: once it has grown, a join allocates nothing.
pub(crate) fn joined<R>(dir: &Path, name: &std::ffi::OsStr, f: impl FnOnce(&Path) -> R) -> R {
    let mut p = SCRATCH.with(|s| s.borrow_mut().pop()).unwrap_or_default();
    p.as_mut_os_string().clear();
    p.push(dir);
    p.push(name);
    let r = f(&p);
    SCRATCH.with(|s| s.borrow_mut().push(p));
    r
}

/// Appends `data` to `log` as [`append`] does, without waiting: `done` gets the reply once the
/// bytes are durable (then `changed`, the connection's note that a session log changed, is
/// given first), or the error.
fn append_then(
    log: &Arc<AppendLog>,
    flags: u32,
    offset: u64,
    data: &[u8],
    size: usize,
    changed: Option<(Changes, Arc<Path>)>,
    done: WriteDone,
) {
    let at = (flags & libc::O_APPEND as u32 == 0).then_some(offset);
    let done = match (done, changed) {
        (WriteDone::Tell(to, [a, b]), None) => ringfs::log::Done::Tell(to, [a, b, size as u64]),
        (done, changed) => ringfs::log::Done::Call(Box::new(move |r| match r {
            Ok(_) => {
                if let Some((c, rel)) = changed {
                    c.data(&rel);
                }
                done.reply(Ok(size));
            }
            Err(e) => done.reply(Err(ringfs_errno(&e))),
        })),
    };
    log.append_then(at, data, done);
}

/// Maps a ringfs error to the errno the client sees.
fn ringfs_errno(e: &ringfs::Error) -> io::Error {
    tracing::debug!(error = %e, "storage refused");
    passed(e.errno())
}

impl CtxFs {
    /// Opens the storage (creating the root layout when missing).
    pub fn new(config: Config) -> io::Result<CtxFs> {
        let storage = match (&config.view, &config.active) {
            (Some(_), Some(active)) => Storage::open_serving(&config.storage, Arc::clone(active))?,
            _ => Storage::open(&config.storage)?,
        };
        // Replayed before anything of the storage is served.
        config.logs.journal(storage.path())?;
        let mut inodes = Inodes {
            nodes: HashMap::new(),
            by_path: HashMap::new(),
            by_key: HashMap::new(),
            next: DYNAMIC_FIRST,
        };
        for (i, d) in LAYOUT.iter().enumerate() {
            let node = Node {
                paths: Paths::one(Arc::from(Path::new(d))),
                dir: true,
                lookups: 1,
                key: None,
                stamp: None,
                fd: None,
            };
            inodes.nodes.insert(LAYOUT_FIRST + i as u64, node);
            inodes.by_path.insert(Arc::from(Path::new(d)), LAYOUT_FIRST + i as u64);
        }
        let quota = config.view.as_ref().and_then(|v| quota::for_view(&config.quotas, &storage, &v.agent));
        Ok(CtxFs {
            storage,
            bins: config.bins,
            inodes: Mutex::new(inodes),
            handles: Mutex::new(HashMap::new()),
            next_handle: AtomicU64::new(1),
            logs: config.logs,
            stats: Arc::default(),
            wire: Arc::default(),
            started: Instant::now(),
            active: config.active.clone(),
            quota,
            quotas: config.quotas,
            view: config.view.map(|v| Authority::new(v, Arc::clone(config.changes.epoch()))),
            view_count: config.view_count,
            changes: config.changes,
            ttl: config.cache_timeout,
            view_timeout: Duration::ZERO,
            zero_open: false,
            acls: std::sync::atomic::AtomicBool::new(false),
            pieces: Mutex::default(),
            piece_bufs: Mutex::new(Vec::with_capacity(PIECE_BUFS)),
        })
    }

    /// The host's data connection: the same projection, serving only what lies beneath `home/`
    /// and `shared/` (bound there over the host view, see
    /// [`Pool::mount_host`](crate::transport::pool::Pool::mount_host)), with zero-message open:
    /// OPEN and FLUSH answer ENOSYS once, after which the kernel sends neither (nor RELEASE)
    /// on this connection, so a cached open + read + close costs no request at all. Reads and
    /// writes then come without a handle: data is reached through a backing file kept open per
    /// inode (an unlinked file stays reachable while the kernel knows it), session logs through
    /// their append log. Nothing here needs a handle: data has no close-time work, and session
    /// logs take each write whole. The kernel keeps pages across opens and drops them when a
    /// refreshed attribute shows a change (AUTO_INVAL_DATA).
    ///
    /// Called on the host view's filesystem; the two count their requests together.
    pub fn data(&self) -> io::Result<CtxFs> {
        let mut fs = CtxFs::new(Config {
            storage: self.storage.path().to_path_buf(),
            bins: self.bins.clone(),
            view: None,
            view_count: Arc::clone(&self.view_count),
            logs: Arc::clone(&self.logs),
            changes: self.changes.clone(),
            cache_timeout: self.ttl,
            quotas: Arc::clone(&self.quotas),
            active: self.active.clone(),
        })?;
        fs.stats = Arc::clone(&self.stats);
        fs.wire = Arc::clone(&self.wire);
        fs.zero_open = true;
        Ok(fs)
    }

    /// Whether the view may see the storage path `rel` (always, in the host view).
    fn permitted(&self, rel: &Path) -> bool {
        let Some(a) = &self.view else { return true };
        if !a.alive(&self.storage) {
            return false;
        }
        let n: Vec<&str> = rel.iter().filter_map(|c| c.to_str()).collect();
        let object = |name: &str| -> String {
            name.strip_suffix(".d").or_else(|| name.strip_suffix(".sock")).unwrap_or(name).to_owned()
        };
        match n.as_slice() {
            [_] => true,
            ["tool", name, ..] if name.ends_with(".d") => a.tool_granted(&self.storage, &object(name)),
            ["tool", name, ..] => a.tool(&self.storage, &object(name)),
            // An agent's socket is for callers on the host (it leads to the daemon's runtime
            // directory, which no sandbox holds): views do not show it.
            ["agent", name] if name.ends_with(".sock") => false,
            ["agent", name, ..] => a.agent(&self.storage, &object(name)),
            ["model", rest @ ..] => {
                let end = rest
                    .iter()
                    .position(|c| c.ends_with(".d") || c.ends_with(".sock"))
                    .map_or(rest.len(), |i| i + 1);
                let mut parts: Vec<String> = rest[..end].iter().map(|c| (*c).to_owned()).collect();
                if let Some(last) = parts.last_mut() {
                    *last = object(last);
                }
                let is_dir =
                    self.storage.stat(rel).is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR);
                (rest.len() == 1 && is_dir && !rest[0].ends_with(".d"))
                    || a.model(&self.storage, &parts.join("/"))
            }
            ["home", uid, rest @ ..] if a.uid(&self.storage).is_some_and(|u| u.to_string() == *uid) => {
                match rest {
                    ["agent", other, "session", s, ..] => a.other_agent(&self.storage, other, Some(s), false),
                    ["agent", other, ..] => a.other_agent(&self.storage, other, None, false),
                    _ => true,
                }
            }
            // Another uid's home shows only the way to the agents granted there.
            ["home", uid, rest @ ..] => {
                let granted = a.granted_homes(&self.storage);
                let here = |o: &str| granted.iter().any(|(u, n)| u.to_string() == *uid && n == o);
                match rest {
                    [] | ["agent"] => granted.iter().any(|(u, _)| u.to_string() == *uid),
                    ["agent", other, "session", s, ..] => {
                        here(other) && a.other_agent(&self.storage, other, Some(s), false)
                    }
                    ["agent", other, ..] => here(other),
                    _ => false,
                }
            }
            ["shared", name, ..] => a.shared(&self.storage, name) != SharedAccess::None,
            _ => false,
        }
    }

    /// Whether the view may change the storage path `rel` (beyond mode bits).
    fn may_write(&self, rel: &Path) -> io::Result<()> {
        let Some(a) = &self.view else { return Ok(()) };
        if !self.permitted(rel) {
            return Err(err(Why::NotFound));
        }
        // An object's controls are the host's: an agent changes its own self-updatable ones
        // only through `agent.update`, never through its view, whatever its uid and the mode
        // bits. Objects and their directories are installed, never written.
        match classify(rel) {
            Some(Area::Control(_) | Area::ControlDir) => return Err(err(Why::NotPermitted)),
            Some(Area::Object | Area::Socket | Area::ClassDir) => return Err(err(Why::Object)),
            _ => {}
        }
        let n: Vec<&str> = rel.iter().filter_map(|c| c.to_str()).collect();
        if a.spec().records_only {
            // Read-only but for the run's records: the logs (append-only, whoever's), and
            // the run's own session.
            let spec = a.spec();
            let owner = spec.session_of.as_deref().unwrap_or(&spec.agent);
            let own_session = match &spec.space {
                None => matches!(n.as_slice(),
                    ["home", _, "agent", o, "session", s, ..] if *o == owner && *s == spec.session),
                Some(space) => matches!(n.as_slice(),
                    ["shared", sp, "agent", o, "session", s, ..]
                        if sp == space && *o == owner && *s == spec.session),
            };
            if !own_session && !matches!(classify(rel), Some(Area::SessionLog | Area::ObjectLog)) {
                return Err(err(Why::ReadOnly));
            }
        }
        match n.as_slice() {
            // Another agent's session or directory, visible through a read grant.
            ["home", _, "agent", other, "session", s, _, ..]
                if !a.other_agent(&self.storage, other, Some(s), true) =>
            {
                Err(err(Why::NotPermitted))
            }
            ["home", _, "agent", other, rest @ ..]
                if !matches!(rest, ["session", _, _, ..])
                    && !a.other_agent(&self.storage, other, None, true) =>
            {
                Err(err(Why::NotPermitted))
            }
            ["shared", name, _, ..] if a.shared(&self.storage, name) != SharedAccess::Write => {
                Err(err(Why::NotPermitted))
            }
            _ => Ok(()),
        }
    }

    /// The value of CortexFS's computed attribute `name` of `ino` (`None`: not one of them):
    /// `user.cortexfs.size`, a regular file's size in bytes; `user.cortexfs.tokens`, an estimate
    /// of its tokens (a byte count divided by four, rounded up: the usual rule of thumb for
    /// English and code under BPE tokenizers, not a tokenizer's count); `user.cortexfs.origin`
    /// ([`origin_of`]).
    fn computed_xattr(&self, ino: u64, name: &[u8]) -> io::Result<Option<Vec<u8>>> {
        if ![SIZE_XATTR, TOKENS_XATTR, ORIGIN_XATTR].contains(&name) {
            return Ok(None);
        }
        if ino < LAYOUT_FIRST {
            return Err(err(Why::NoAttribute));
        }
        let rel = self.rel(ino)?;
        if !self.permitted(&rel) {
            return Err(err(Why::NotFound));
        }
        if name == ORIGIN_XATTR {
            return origin_of(&rel).map(|o| Some(o.into_bytes())).ok_or_else(|| err(Why::NoAttribute));
        }
        let st = self.storage.stat(&rel)?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(err(Why::NoAttribute));
        }
        // The size `stat` shows (a log's is what its appends made it).
        let size = u64::try_from(self.shown_attr(&rel, &st)?.0.st_size).unwrap_or(0);
        let value = if name == SIZE_XATTR { size } else { size.div_ceil(4) };
        Ok(Some(value.to_string().into_bytes()))
    }

    /// What `user.cortexfs.kind` says an inode is.
    fn kind_of(&self, ino: u64) -> io::Result<&'static str> {
        Ok(match ino {
            ROOT => "root",
            STATUS => "status",
            BIN => "bin",
            i if (BIN_FIRST..LAYOUT_FIRST).contains(&i) => "binary",
            _ => match classify(&self.rel(ino)?) {
                Some(Area::ClassDir) => "class",
                Some(Area::Object) => "object",
                Some(Area::Socket) => "socket",
                Some(Area::ControlDir) => "controls",
                Some(Area::Control(Owner::Runtime)) => "runtime-control",
                Some(Area::Control(_)) => "control",
                Some(Area::DataRoot) => "space",
                Some(Area::Data) => "data",
                Some(Area::SessionLog) => "session-log",
                Some(Area::ObjectLog) => "object-log",
                None => return Err(err(Why::NotFound)),
            },
        })
    }

    /// A data file's backing inode, for its extended attributes: the file kept open for the
    /// inode, else opened as a path (a FIFO or a device is never opened for I/O) beneath the
    /// storage root; `None` for anything that is not data (objects, controls, logs, the
    /// synthesized tree).
    fn data_inode(&self, ino: u64) -> io::Result<Option<(Arc<Path>, Backing)>> {
        if ino < LAYOUT_FIRST {
            return Ok(None);
        }
        let rel = self.rel(ino)?;
        if classify(&rel) != Some(Area::Data) {
            return Ok(None);
        }
        if !self.permitted(&rel) {
            return Err(err(Why::NotFound));
        }
        if let Some((f, _)) = lock(&self.inodes).cached_fd(ino) {
            return Ok(Some((rel, Backing::Kept(f))));
        }
        let fd = self.storage.open_rel(&rel, rustix::fs::OFlags::PATH, 0)?;
        Ok(Some((rel, Backing::Opened(fd))))
    }

    /// Entry and attribute timeout for a storage path. In an agent view, zero unless its
    /// entries are dropped on every change that may change what it shows
    /// ([`CtxFs::cache_entries`]); then, as on the host, the cache timeout, for changes made
    /// behind the daemon's back that no watch reports. Whatever the kernel caches, every open, exec,
    /// create, write, rename and unlink is checked against the policies when it is made.
    fn timeout(&self, area: Area) -> Duration {
        if matches!(area, Area::SessionLog | Area::ObjectLog) {
            Duration::ZERO
        } else if self.view.is_some() {
            self.view_timeout
        } else {
            self.ttl
        }
    }

    /// Lets this agent view's kernel keep entries and attributes (the cache timeout), for a
    /// view whose entries are invalidated whenever what it shows may change (a control published through
    /// any connection of the daemon, a change seen in the storage's object directories).
    pub fn cache_entries(&mut self) {
        self.view_timeout = self.ttl;
    }

    /// The storage directory this filesystem serves.
    pub fn storage_path(&self) -> &Path {
        self.storage.path()
    }

    /// The entries (parent inode, name) this connection's kernel may cache, to invalidate them.
    pub fn known_entries(&self) -> Vec<(u64, std::ffi::CString)> {
        let inodes = lock(&self.inodes);
        inodes
            .by_path
            .keys()
            .filter_map(|p| {
                let (parent, name) = crate::storage::split(p)?;
                let parent_ino =
                    if parent.as_os_str().is_empty() { ROOT } else { *inodes.by_path.get(parent)? };
                Some((parent_ino, std::ffi::CString::new(name.as_os_str().as_bytes()).ok()?))
            })
            .collect()
    }

    /// Serves a WRITE to a session or object log without holding the calling thread while it
    /// becomes durable: the bytes join the log's next batch and `done` gets the reply from the
    /// thread that commits it. `false` when the write is not to a log (nothing was done, and
    /// `done` is dropped): the caller serves it as any other request. Like `write`, with the
    /// request's `ino`, `handle` (0 on the host's data connection), `offset` and open `flags`.
    pub fn write_deferred(
        &self,
        ino: u64,
        handle: u64,
        offset: u64,
        flags: u32,
        data: &[u8],
        done: WriteDone,
    ) -> bool {
        if self.zero_open && handle == 0 {
            let Ok(rel) = self.rel(ino) else { return false };
            if classify(&rel) != Some(Area::SessionLog) {
                return false;
            }
            self.stats.count("write");
            let log = match self.log(&rel) {
                Ok(l) => l,
                Err(e) => {
                    done.reply(Err(e));
                    return true;
                }
            };
            self.log_write(&log, ino, offset, flags, data, Some(rel), true, done);
            return true;
        }
        let Ok(h) = self.handle(handle) else { return false };
        let log = match &*lock(&h) {
            Handle::Log(l) => Arc::clone(l),
            _ => return false,
        };
        self.stats.count("write");
        // The host's data connection keeps pages of session logs.
        let rel = self.rel(ino).ok().filter(|rel| classify(rel) == Some(Area::SessionLog));
        self.log_write(&log, ino, offset, flags, data, rel, false, done);
        true
    }

    /// Like [`CtxFs::log_write`], waiting here for the append to be durable; returns the count
    /// acknowledged.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn log_write_now(
        &self,
        log: &Arc<AppendLog>,
        ino: u64,
        offset: u64,
        flags: u32,
        data: &[u8],
        rel: Option<Arc<Path>>,
        only_moved: bool,
    ) -> io::Result<usize> {
        match self.log_piece(ino, offset, data, log) {
            Piece::Held => Ok(data.len()),
            Piece::Refused(e) => Err(passed(e)),
            Piece::Append { start, bytes, ack } => {
                self.note_use(log, &bytes);
                let moved = log.len() != start;
                let appended = append(log, flags, start, &bytes);
                self.piece_done(bytes);
                appended?;
                if let Some(rel) = rel.filter(|_| !only_moved || moved) {
                    // Appended elsewhere than this kernel thought: its cached pages are wrong.
                    self.changes.data(&rel);
                }
                Ok(ack)
            }
        }
    }

    /// Serves one WRITE to `log` through [`CtxFs::log_piece`]: held, refused, or appended with
    /// `done` told once it is durable. `rel`, when the host's data connection keeps the log's
    /// pages: they are dropped after the append (only when it landed elsewhere than the kernel
    /// thought, if `only_moved`).
    #[allow(clippy::too_many_arguments)]
    fn log_write(
        &self,
        log: &Arc<AppendLog>,
        ino: u64,
        offset: u64,
        flags: u32,
        data: &[u8],
        rel: Option<Arc<Path>>,
        only_moved: bool,
        done: WriteDone,
    ) {
        match self.log_piece(ino, offset, data, log) {
            Piece::Held => done.reply(Ok(data.len())),
            Piece::Refused(e) => done.reply(Err(passed(e))),
            Piece::Append { start, bytes, ack } => {
                self.note_use(log, &bytes);
                // Appended elsewhere than this kernel thought: its cached pages are wrong.
                let changed =
                    rel.filter(|_| !only_moved || log.len() != start).map(|rel| (self.changes.clone(), rel));
                append_then(log, flags, start, &bytes, ack, changed, done);
                self.piece_done(bytes);
            }
        }
    }

    /// Counts the lines `bytes` appended to `log` when it is a tool's or a model's log.
    fn note_use(&self, log: &AppendLog, bytes: &[u8]) {
        if let Ok(rel) = log.path().strip_prefix(self.storage.path()) {
            self.logs.usage.note(rel, bytes);
        }
    }

    /// How the connection serving this filesystem is served.
    pub fn wire(&self) -> &Arc<crate::transport::Wire> {
        &self.wire
    }

    /// The `status` file's contents, computed now.
    pub fn status(&self) -> Vec<u8> {
        let mut s = String::new();
        let total: u64 = self.stats.ops.iter().map(|c| c.load(Ordering::Relaxed)).sum();
        s.push_str(&format!("version {}\n", env!("CARGO_PKG_VERSION")));
        s.push_str(&format!("uptime_s {}\n", self.started.elapsed().as_secs()));
        s.push_str(&format!("storage {}\n", self.storage.path().display()));
        s.push_str(&format!("views {}\n", self.view_count.load(Ordering::Relaxed)));
        if let Some(g) = self.active.as_ref().and_then(|a| a.id()) {
            s.push_str(&format!("generation {g}\n"));
        }
        match &self.view {
            None => s.push_str("view host\n"),
            Some(a) => {
                s.push_str(&format!("view agent {} session {}\n", a.spec().agent, a.spec().session));
                if let Some(w) = &a.spec().workspace {
                    s.push_str(&format!("workspace {}\n", w.display()));
                }
                if let Some(o) = &a.spec().session_of {
                    s.push_str(&format!("session_of {o}\n"));
                }
                if let Some(sp) = &a.spec().space {
                    s.push_str(&format!("session_space {sp}\n"));
                }
                s.push_str(if a.spec().records_only { "ctx records\n" } else { "ctx read-write\n" });
            }
        }
        let w = &self.wire;
        s.push_str(&format!("transport {}\n", w.transport().name()));
        s.push_str(&format!("transport.dev_requests {}\n", w.dev_requests.load(Ordering::Relaxed)));
        s.push_str(&format!("transport.ring_requests {}\n", w.ring_requests.load(Ordering::Relaxed)));
        match self.logs.journal_stats() {
            Some(j) => s.push_str(&format!(
                "journal on\njournal.records {}\njournal.flushes {}\njournal.checkpoints {}\njournal.found {}\njournal.replayed {}\njournal.skipped {}\n",
                j.records, j.flushes, j.checkpoints, j.found, j.replayed, j.skipped
            )),
            None => s.push_str("journal off\n"),
        }
        s.push_str(&format!("requests {total}\n"));
        for (op, c) in OPS.iter().zip(&self.stats.ops) {
            s.push_str(&format!("op.{op} {}\n", c.load(Ordering::Relaxed)));
        }
        s.into_bytes()
    }

    fn rel(&self, ino: u64) -> io::Result<Arc<Path>> {
        lock(&self.inodes).get(ino)
    }

    fn new_handle(&self, ino: u64, h: Handle) -> u64 {
        let id = self.next_handle.fetch_add(1, Ordering::Relaxed);
        lock(&self.handles).insert(id, (ino, Arc::new(Mutex::new(h))));
        id
    }

    fn handle(&self, id: u64) -> io::Result<Arc<Mutex<Handle>>> {
        lock(&self.handles).get(&id).map(|(_, h)| Arc::clone(h)).ok_or_else(|| err(Why::BadHandle))
    }

    /// Whether inode `ino` is a control open for rewriting, with nothing written yet.
    fn rewriting(&self, ino: u64) -> bool {
        let candidates: Vec<Arc<Mutex<Handle>>> =
            lock(&self.handles).values().filter(|(i, _)| *i == ino).map(|(_, h)| Arc::clone(h)).collect();
        candidates.iter().any(|h| matches!(&*lock(h), Handle::Control { buf, .. } if buf.is_empty()))
    }

    /// A storage file open on inode `ino`: the request's handle `fh` first, else any other open
    /// handle of the inode. An unlinked file is reached only this way.
    fn open_file(&self, ino: u64, fh: Option<u64>) -> Option<File> {
        let candidates: Vec<Arc<Mutex<Handle>>> = {
            let handles = lock(&self.handles);
            let first = fh.and_then(|id| handles.get(&id)).filter(|(i, _)| *i == ino);
            first
                .into_iter()
                .chain(handles.values().filter(|(i, _)| *i == ino))
                .map(|(_, h)| Arc::clone(h))
                .collect()
        };
        candidates
            .iter()
            .find_map(|h| match &*lock(h) {
                Handle::File(f) => f.try_clone().ok(),
                _ => None,
            })
            .or_else(|| {
                let (f, access) = lock(&self.inodes).cached_fd(ino)?;
                (access >= Access::Read).then(|| f.try_clone().ok()).flatten()
            })
    }

    /// The kept descriptor of inode `ino`, of any access (`O_PATH` included): what reaches an
    /// object whose last name is gone, for its attributes.
    fn kept(&self, ino: u64) -> Option<File> {
        let (f, _) = lock(&self.inodes).cached_fd(ino)?;
        f.try_clone().ok()
    }

    /// With zero-message open: the backing file of data inode `ino` for a request without a
    /// handle, writable when `write`; opened (and kept, within the bound) on first use.
    fn inode_file(&self, ino: u64, write: bool) -> io::Result<Arc<File>> {
        let need = if write { Access::Write } else { Access::Read };
        let cached = lock(&self.inodes).cached_fd(ino);
        if let Some((f, access)) = &cached
            && *access >= need
        {
            return Ok(Arc::clone(f));
        }
        // A descriptor kept for the inode (since a getattr, or an earlier open) names the inode
        // the kernel means even when another connection (an agent's view) has unlinked or
        // replaced its name since: reopen that one (only data inodes keep descriptors).
        if let Some((f, _)) = cached {
            let reopened = reopen(&f, OFlags::RDWR).map(|fd| (fd, Access::Write)).or_else(|e| {
                if write { Err(e) } else { reopen(&f, OFlags::RDONLY).map(|fd| (fd, Access::Read)) }
            });
            if let Ok((fd, access)) = reopened {
                let f = Arc::new(File::from(fd));
                lock(&self.inodes).keep_fd(ino, &f, access, false);
                return Ok(f);
            }
        }
        let rel = self.rel(ino)?;
        if classify(&rel) != Some(Area::Data) {
            return Err(err(Why::BadHandle));
        }
        let (fd, access) = match self.storage.open_rel(&rel, OFlags::RDWR, 0) {
            Ok(fd) => (fd, Access::Write),
            Err(_) if !write => (self.storage.open_rel(&rel, OFlags::RDONLY, 0)?, Access::Read),
            Err(e) => return Err(e),
        };
        self.is_known(ino, &rustix::fs::fstat(&fd).map_err(ioerr)?)?;
        let f = Arc::new(File::from(fd));
        lock(&self.inodes).keep_fd(ino, &f, access, false);
        Ok(f)
    }

    /// `ESTALE` unless `st` is the backing file the kernel knows as `ino`: a path reaches a
    /// file only while nothing has put another in its place behind this connection's back.
    fn is_known(&self, ino: u64, st: &rustix::fs::Stat) -> io::Result<()> {
        let known = lock(&self.inodes).nodes.get(&ino).and_then(|n| n.key);
        if known.is_some_and(|k| k != (st.st_dev, st.st_ino)) {
            return Err(err(Why::Stale));
        }
        Ok(())
    }

    /// The backing file's `lstat` for data inode `ino` reached by `rel`: from its kept file
    /// when there is one (no path walk), else through `rel`, keeping an `O_PATH` descriptor of
    /// it (within the budget) for the next time.
    fn data_stat(&self, ino: u64, rel: &Path) -> io::Result<rustix::fs::Stat> {
        if let Some((f, _)) = lock(&self.inodes).cached_fd(ino) {
            return rustix::fs::fstat(&*f).map_err(ioerr);
        }
        let fd = self.storage.open_rel(rel, OFlags::PATH, 0)?;
        let st = rustix::fs::fstat(&fd).map_err(ioerr)?;
        self.is_known(ino, &st)?;
        lock(&self.inodes).keep_fd(ino, &Arc::new(File::from(fd)), Access::Path, false);
        Ok(st)
    }

    /// Where this daemon's connections report data changes.
    pub(crate) fn changes(&self) -> &Changes {
        &self.changes
    }

    /// The kernel inode number this connection gave the storage path `rel`, if it knows it.
    pub fn known_inode(&self, rel: &Path) -> Option<u64> {
        lock(&self.inodes).by_path.get(rel).copied()
    }

    /// Reports a change to the data of inode `ino` made through this connection to the one
    /// that keeps pages across opens (nothing to report when this is that one).
    fn data_changed(&self, ino: u64) {
        if !self.zero_open
            && let Ok(rel) = self.rel(ino)
            && classify(&rel) == Some(Area::Data)
        {
            self.changes.data(&rel);
        }
    }

    /// What becomes of one WRITE request's `data` at `offset` to the log `log` (inode `ino`),
    /// on any connection: a write is stored whole or refused whole, however the kernel split
    /// it, and no count is acknowledged for bytes not stored.
    ///
    /// The kernel splits a write in two ways: through the page cache (the host's data
    /// connection), a write that starts in a page it has not read goes first alone up to that
    /// page's end; through a view, a write goes in pieces of `max_write` less its buffer's
    /// offset in its page (at least [`LINE_MAX`] bytes). Each piece waits for the reply to the
    /// one before, and no piece says how long the write is. So:
    /// - a piece that completes every line it holds is appended;
    /// - a piece that holds complete lines and the start of another has its complete lines
    ///   appended and acknowledged, the rest not (a short count the writer continues from);
    /// - a piece with no newline at all is refused (`EFBIG`) once it is [`LINE_MAX`] long;
    ///   shorter and ending at a page boundary, it is held for the rest (which must come at the
    ///   offset right after it), after the log's space for the longest line was made sure of
    ///   (`ENOSPC`/`EDQUOT` refuse it otherwise); anything else goes to the log, which refuses an
    ///   incomplete line.
    ///
    /// One case cannot be refused whole: a line longer than [`LINE_MAX`] of which the page
    /// cache sent a first page alone: that page was acknowledged before the rest showed the line
    /// too long (the writer gets a short count, and nothing of the line is stored).
    fn log_piece<'a>(&self, ino: u64, offset: u64, data: &'a [u8], log: &AppendLog) -> Piece<'a> {
        const PAGE: u64 = 4096;
        let mut pieces = lock(&self.pieces);
        let (start, whole, held): (u64, Cow<'a, [u8]>, usize) = match pieces.remove(&ino) {
            Some((start, held)) if start + held.len() as u64 == offset => {
                let n = held.len();
                let mut held = held;
                held.extend_from_slice(data);
                (start, Cow::Owned(held), n)
            }
            Some(_) => {
                tracing::warn!(ino, "dropped the first piece of a log write whose rest never came");
                (offset, Cow::Borrowed(data), 0)
            }
            None => (offset, Cow::Borrowed(data), 0),
        };
        let cut = whole.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        if whole[..cut].split_inclusive(|&b| b == b'\n').any(|l| l.len() > LINE_MAX) {
            if held > 0 {
                tracing::warn!(ino, "a line past the limit after its first page was acknowledged");
            }
            return Piece::Refused(Why::TooLarge.errno());
        }
        if cut == whole.len() {
            return Piece::Append { start, bytes: whole, ack: data.len() };
        }
        if cut > held {
            // Complete lines, then the start of another: the lines alone.
            let bytes = match whole {
                Cow::Owned(mut v) => {
                    v.truncate(cut);
                    Cow::Owned(v)
                }
                Cow::Borrowed(b) => Cow::Borrowed(&b[..cut]),
            };
            return Piece::Append { start, bytes, ack: cut - held };
        }
        if whole.len() >= LINE_MAX {
            if held > 0 {
                tracing::warn!(ino, "a line past the limit after its first page was acknowledged");
            }
            return Piece::Refused(Why::TooLarge.errno());
        }
        if !(start + whole.len() as u64).is_multiple_of(PAGE) {
            return Piece::Append { start, bytes: whole, ack: data.len() };
        }
        if held == 0
            && let Err(e) = log.hold_space(LINE_MAX as u64)
        {
            return Piece::Refused(e.raw_os_error().unwrap_or(Why::NoSpace.errno()));
        }
        let held = match whole {
            Cow::Owned(v) => v,
            Cow::Borrowed(b) => {
                let mut v = lock(&self.piece_bufs).pop().unwrap_or_default();
                v.clear();
                v.extend_from_slice(b);
                v
            }
        };
        pieces.insert(ino, (start, held));
        Piece::Held
    }

    /// The buffer of a piece now appended serves the next piece held: a write the kernel splits
    /// at a page boundary allocates nothing once the buffers have grown.
    fn piece_done(&self, whole: Cow<'_, [u8]>) {
        if let Cow::Owned(v) = whole {
            let mut bufs = lock(&self.piece_bufs);
            if bufs.len() < PIECE_BUFS {
                bufs.push(v);
            }
        }
    }

    /// With zero-message open, before `rel` stops naming its file (unlink, rename over it):
    /// keeps the file open for its inode if the kernel knows it, since an open descriptor may
    /// still use it and no handle would otherwise reach it.
    fn keep_reachable(&self, rel: &Path) {
        if !self.zero_open {
            return;
        }
        let Some(ino) = lock(&self.inodes).by_path.get(rel).copied() else { return };
        let Ok(st) = self.storage.stat(rel) else { return };
        // A regular file for reading and writing through it; anything else (a directory, a
        // FIFO, a socket, a device, a symlink) for its attributes, as the kernel keeps it.
        let opened = if st.st_mode & libc::S_IFMT == libc::S_IFREG {
            self.storage
                .open_rel(rel, OFlags::RDWR, 0)
                .map(|fd| (fd, Access::Write))
                .or_else(|_| self.storage.open_rel(rel, OFlags::RDONLY, 0).map(|fd| (fd, Access::Read)))
        } else {
            self.storage.open_rel(rel, OFlags::PATH | OFlags::NOFOLLOW, 0).map(|fd| (fd, Access::Path))
        };
        if let Ok((fd, access)) = opened {
            lock(&self.inodes).keep_fd(ino, &Arc::new(File::from(fd)), access, true);
        }
    }

    /// The open log of a session file, opening (and recovering) it on first use.
    fn log(&self, rel: &Path) -> io::Result<Arc<AppendLog>> {
        let mut logs = lock(&self.logs.open);
        if let Some(l) = logs.get(rel) {
            // The path may name another file since (an object replaced or reinstalled): then
            // the log is opened anew; handles on the old file keep their own.
            let now = self.storage.stat(rel).ok().map(|st| (st.st_dev, st.st_ino));
            if now.is_some() && l.identity().ok() == now {
                return Ok(Arc::clone(l));
            }
            logs.remove(rel);
        }
        let opts = ringfs::log::Options::default();
        let (log, rec) = match self.logs.journal(self.storage.path())? {
            Some(j) => AppendLog::open_journaled(&j, rel, opts),
            None => AppendLog::open(self.storage.path().join(rel), opts).map(|(l, r)| (Arc::new(l), r)),
        }
        .map_err(|e| ringfs_errno(&e))?;
        if let Some((at, len)) = rec.torn {
            tracing::warn!(log = %rel.display(), at, len, "cut a torn tail");
        }
        logs.insert(rel.to_path_buf(), Arc::clone(&log));
        Ok(log)
    }

    /// Attributes of a storage path as the projection shows them.
    fn backed_attr(&self, rel: &Path) -> io::Result<(stat64, Area)> {
        classify(rel).ok_or_else(|| err(Why::NotFound))?;
        let st = self.storage.stat(rel)?;
        self.shown_attr(rel, &st)
    }

    /// Attributes of the storage path `rel`, whose `lstat` is `st`, as the projection shows them.
    fn shown_attr(&self, rel: &Path, st: &rustix::fs::Stat) -> io::Result<(stat64, Area)> {
        let area = classify(rel).ok_or_else(|| err(Why::NotFound))?;
        let mut attr = attr_of(st, self.storage.dev());
        match area {
            Area::Object | Area::Control(Owner::Runtime) => attr.st_mode &= !0o222,
            Area::SessionLog if st.st_mode & libc::S_IFMT == libc::S_IFREG => {
                attr.st_size = self.log(rel)?.len() as i64;
            }
            Area::ObjectLog if st.st_mode & libc::S_IFMT == libc::S_IFREG => {
                attr.st_size = self.log(rel)?.len() as i64;
                // Runtime-written: on the host only root appends; in a view the agent appends
                // (tsh records its calls) but does not read other agents' records.
                attr.st_mode = (attr.st_mode & !0o7777) | if self.view.is_some() { 0o622 } else { 0o644 };
            }
            _ => {}
        }
        Ok((attr, area))
    }

    /// Whether `name` in storage directory `dir` (area `dir_area`) is shown at all.
    fn visible(&self, dir: &Path, name: &[u8]) -> bool {
        joined(dir, std::ffi::OsStr::from_bytes(name), |child| self.visible_as(dir, name, child))
    }

    /// [`CtxFs::visible`], given `child`, the path of `name` in `dir`.
    fn visible_as(&self, dir: &Path, name: &[u8], child: &Path) -> bool {
        let area = classify(child);
        // Dot names are staging residue among objects and controls; in `home/` and `shared/`
        // they are ordinary data (`.tshrc`, a queue's temporary files, `.git`).
        if name.first() == Some(&b'.') && area != Some(Area::Data) {
            return false;
        }
        if area.is_none() || !self.permitted(child) {
            return false;
        }
        // Controls without their executable are residue of an interrupted install.
        if matches!(classify(dir), Some(Area::ClassDir))
            && let Some(obj) = name.strip_suffix(b".d")
        {
            return joined(dir, std::ffi::OsStr::from_bytes(obj), |o| self.storage.stat(o).is_ok());
        }
        true
    }

    fn entry(&self, ino: u64, attr: stat64, timeout: Duration) -> Entry {
        Entry {
            inode: ino,
            generation: 0,
            attr,
            attr_flags: 0,
            attr_timeout: timeout,
            entry_timeout: timeout,
        }
    }

    /// The entry of `rel`; `from`, the inode of its directory when the kernel asked by it.
    fn lookup_backed(&self, rel: &Path, from: Option<u64>) -> io::Result<Entry> {
        let (parent, name) = crate::storage::split(rel).ok_or_else(|| err(Why::NotFound))?;
        if !self.visible_as(parent, name.as_os_str().as_bytes(), rel) {
            return Err(err(Why::NotFound));
        }
        // Stat before remembering, so a missing file leaves no inode behind.
        classify(rel).ok_or_else(|| err(Why::NotFound))?;
        let st = match from {
            Some(dir) => {
                let (dir, leaf) = self.dir_of(dir, rel)?;
                rustix::fs::statat(&dir, leaf, AtFlags::SYMLINK_NOFOLLOW).map_err(ioerr)?
            }
            None => self.storage.stat(rel)?,
        };
        let (attr, area) = self.shown_attr(rel, &st)?;
        // Hard links share the inode of their file, once its known path is checked to still name
        // it (a backing inode number is reused after a change behind the server's back).
        let key = (st.st_dev, st.st_ino);
        let known = if st.st_mode & libc::S_IFMT != libc::S_IFDIR && st.st_nlink > 1 {
            lock(&self.inodes).path_of_key(key)
        } else {
            None
        };
        let linked = known
            .is_some_and(|p| *p == *rel || self.storage.stat(&p).is_ok_and(|s| (s.st_dev, s.st_ino) == key));
        let ino = lock(&self.inodes).remember(rel, &st, linked);
        Ok(self.entry(ino, attr, self.timeout(area)))
    }

    fn is_write(flags: u32) -> bool {
        let acc = flags as i32 & libc::O_ACCMODE;
        acc == libc::O_WRONLY || acc == libc::O_RDWR || flags as i32 & libc::O_TRUNC != 0
    }

    /// The class and object name of a control path (`tool/<n>.d/...`).
    fn control_owner(rel: &Path) -> Option<(ObjectClass, String, String)> {
        let mut it = rel.iter();
        let class = ObjectClass::parse(it.next()?.to_str()?)?;
        let obj = it.next()?.to_str()?.strip_suffix(".d")?.to_owned();
        let control: Vec<&str> = it.filter_map(|c| c.to_str()).collect();
        Some((class, obj, control.join("/")))
    }

    /// Publishes a rewritten control: validated, then written to a temp file beside it, synced,
    /// renamed over the old one, and the directory synced.
    fn publish_control(&self, rel: &Path, bytes: &[u8]) -> io::Result<()> {
        if let Some((class, obj, control)) = Self::control_owner(rel) {
            controls::validate(class, &obj, &control, bytes).map_err(|why| {
                tracing::info!(control = %rel.display(), %why, "control write refused");
                err(Why::Invalid)
            })?;
        } else if bytes.len() > controls::CONTROL_MAX {
            return Err(err(Why::TooLarge));
        }
        let (dir, name) = self.storage.parent_of(rel)?;
        let old = rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW).ok();
        let tmp = format!(".{}.{}.tmp", name.display(), std::process::id());
        let fd = rustix::fs::openat(
            &dir,
            tmp.as_str(),
            OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(old.as_ref().map_or(0o644, |s| s.st_mode & 0o7777)),
        )
        .map_err(ioerr)?;
        let mut f = File::from(fd);
        let written = (|| {
            f.write_all(bytes)?;
            if let Some(s) = &old {
                rustix::fs::fchown(
                    &f,
                    Some(rustix::fs::Uid::from_raw(s.st_uid)),
                    Some(rustix::fs::Gid::from_raw(s.st_gid)),
                )?;
                rustix::fs::fchmod(&f, Mode::from_raw_mode(s.st_mode & 0o7777))?;
            }
            f.sync_all()?;
            rustix::fs::renameat(&dir, tmp.as_str(), &dir, name)?;
            rustix::fs::fsync(&dir)?;
            Ok::<(), io::Error>(())
        })();
        if written.is_err() {
            let _ = rustix::fs::unlinkat(&dir, tmp.as_str(), AtFlags::empty());
        } else {
            self.changes.authority();
        }
        written
    }

    /// Open options for a storage file opened on `ino` as `fd`: no FLUSH at close (nothing to
    /// do for a plain file: writes are written through, and published controls and session
    /// logs have handles of their own), and, for a read-only open of a file unchanged since
    /// the kernel last filled its page cache, KEEP_CACHE. Writes through this mount keep that
    /// cache current; writes elsewhere change the stamp, and the next open drops the cache.
    fn file_options(&self, ino: u64, fd: &OwnedFd, write: bool) -> io::Result<OpenOptions> {
        let stamp = if write { None } else { Some(stamp_of(&rustix::fs::fstat(fd).map_err(ioerr)?)) };
        let keep = lock(&self.inodes).restamp(ino, stamp);
        Ok(noflush() | if keep { OpenOptions::KEEP_CACHE } else { OpenOptions::empty() })
    }

    fn open_backed(&self, ino: u64, rel: &Path, flags: u32) -> io::Result<(Handle, OpenOptions)> {
        let area = classify(rel).ok_or_else(|| err(Why::NotFound))?;
        let write = Self::is_write(flags);
        if !self.permitted(rel) {
            return Err(err(Why::NotFound));
        }
        if write {
            self.may_write(rel)?;
        }
        let read_flags = OFlags::RDONLY;
        match area {
            Area::Object | Area::Socket if write => Err(err(Why::Object)),
            Area::Control(Owner::Runtime) if write => Err(err(Why::NotPermitted)),
            Area::Control(_) if write => {
                let file = self.storage.open_rel(rel, read_flags, 0).ok().map(File::from);
                Ok((
                    Handle::Control {
                        rel: rel.to_path_buf(),
                        buf: Vec::new(),
                        dirty: false,
                        file,
                        writer: 0,
                    },
                    OpenOptions::DIRECT_IO,
                ))
            }
            Area::SessionLog | Area::ObjectLog => {
                if flags as i32 & libc::O_TRUNC != 0 {
                    return Err(err(Why::Object));
                }
                // Nothing to do at close: each write is durable when it returns.
                Ok((Handle::Log(self.log(rel)?), OpenOptions::DIRECT_IO | noflush()))
            }
            Area::ClassDir | Area::DataRoot | Area::ControlDir => Err(err(Why::IsDirectory)),
            // A tool's or model's `status`: its counters, from memory.
            Area::Control(_) if let Some(object) = policy::usage::status_of(rel) => {
                Ok((Handle::Bytes(self.logs.usage.render(&object)), OpenOptions::DIRECT_IO | noflush()))
            }
            Area::Object | Area::Socket | Area::Control(_) => {
                let fd = self.storage.open_rel(rel, read_flags, 0)?;
                let opts = self.file_options(ino, &fd, false)?;
                Ok((Handle::File(File::from(fd)), opts))
            }
            Area::Data => {
                let keep = OFlags::from_bits_retain(flags)
                    & (OFlags::ACCMODE | OFlags::TRUNC | OFlags::APPEND | OFlags::SYNC | OFlags::DSYNC);
                // Truncated only once it is known to be the file the kernel means.
                let later = keep.contains(OFlags::TRUNC) && keep & OFlags::ACCMODE != OFlags::RDONLY;
                let fd = self.storage.open_rel(rel, if later { keep - OFlags::TRUNC } else { keep }, 0)?;
                self.is_known(ino, &rustix::fs::fstat(&fd).map_err(ioerr)?)?;
                if later {
                    rustix::fs::ftruncate(&fd, 0).map_err(ioerr)?;
                }
                let opts = self.file_options(ino, &fd, write)?;
                Ok((Handle::File(File::from(fd)), opts))
            }
        }
    }

    fn chown_to_caller(fd: &OwnedFd, ctx: &Context) -> io::Result<()> {
        let (uid, gid) = caller(ctx)?;
        rustix::fs::fchown(fd, Some(uid), Some(gid)).map_err(ioerr)
    }

    /// The storage path of a new entry `name` in directory `parent`, with the area it would
    /// have. Creating is refused at the root (EROFS) and among objects (EPERM).
    /// The directory that holds `rel`, a name in the directory of inode `parent`, opened for
    /// `*at` calls, and the name. The directory is the one the kernel knows as `parent`, or
    /// `ESTALE`: a path reaches a directory only as long as nothing moved it behind this
    /// connection's back (another connection, another host, storage directly), and the
    /// directory that took its name is another one, never to be changed in its place.
    fn dir_of<'a>(&self, parent: u64, rel: &'a Path) -> io::Result<(OwnedFd, &'a Path)> {
        let (dir, leaf) = self.storage.parent_of(rel)?;
        if lock(&self.inodes).nodes.get(&parent).is_some_and(|n| n.key.is_some()) {
            self.is_known(parent, &rustix::fs::fstat(&dir).map_err(ioerr)?)?;
        }
        Ok((dir, leaf))
    }

    /// The mode a new entry of `dir` is made with, and whether a default ACL decides it: the
    /// caller's `mode` less its `umask`, unless ACLs are negotiated and `dir` has a default ACL,
    /// which then applies in place of the umask (the backing filesystem makes the entry's ACL
    /// from it and `mode`, as POSIX.1e says).
    fn creation_mode(&self, dir: &OwnedFd, mode: u32, umask: u32) -> (u32, bool) {
        let mut acl = [0u8; 256];
        let inherits = self.acls.load(Ordering::Relaxed)
            && match rustix::fs::fgetxattr(dir, "system.posix_acl_default", &mut acl[..]) {
                Ok(n) => n > 0,
                Err(e) => e == rustix::io::Errno::RANGE,
            };
        if inherits { (mode & 0o7777, true) } else { (mode & !umask & 0o7777, false) }
    }

    /// The mode to hand a new entry over with (see [`give_to_caller`]): `mode`, or the one the
    /// backing filesystem made from a default ACL (set again unchanged, so the ACL stays).
    fn made_mode(
        mode: u32,
        inherits: bool,
        made: impl FnOnce() -> io::Result<rustix::fs::Stat>,
    ) -> io::Result<u32> {
        if inherits { Ok(made()?.st_mode & 0o7777) } else { Ok(mode) }
    }

    fn new_child(&self, parent: u64, name: &CStr) -> io::Result<(PathBuf, Area)> {
        if parent == ROOT || parent == BIN {
            return Err(err(Why::ReadOnly));
        }
        let dir = self.rel(parent)?;
        let name = component(name)?;
        let rel = dir.join(name);
        let area = classify(&rel).ok_or_else(|| err(Why::Object))?;
        self.may_write(&rel)?;
        match (classify(&dir), area) {
            (_, Area::Data | Area::SessionLog) => Ok((rel, area)),
            (Some(Area::ControlDir), Area::ObjectLog) => Ok((rel, area)),
            (Some(Area::ControlDir), Area::Control(Owner::Host | Owner::SelfUpdatable)) => Ok((rel, area)),
            (Some(Area::DataRoot), _) => Ok((rel, Area::Data)),
            _ => Err(err(Why::Object)),
        }
    }

    /// `unlink` and `rmdir`: only data can be removed through the mount (objects and controls
    /// leave with `ctx object uninstall`; session logs are append-only).
    fn remove(&self, parent: u64, name: &CStr, flags: AtFlags) -> io::Result<()> {
        self.stats.count("unlink");
        if parent == ROOT || parent == BIN {
            return Err(err(Why::ReadOnly));
        }
        let rel = self.rel(parent)?.join(component(name)?);
        self.may_write(&rel)?;
        match classify(&rel) {
            Some(Area::Data) => {}
            Some(_) => return Err(err(Why::Object)),
            None => return Err(err(Why::NotFound)),
        }
        let (dir, leaf) = self.dir_of(parent, &rel)?;
        // An open descriptor (a file, a directory someone is in) still reaches it after.
        self.keep_reachable(&rel);
        let was =
            self.quota.as_ref().and_then(|_| rustix::fs::statat(&dir, leaf, AtFlags::SYMLINK_NOFOLLOW).ok());
        rustix::fs::unlinkat(&dir, leaf, flags).map_err(ioerr)?;
        if let Some(st) = &was {
            self.credit_removal(st);
        }
        lock(&self.inodes).detach(&rel);
        Ok(())
    }

    /// Lists directory `ino` into `out`: `.`, `..`, then what is shown of it.
    fn list_dir(&self, ino: u64, out: &mut Listing) -> io::Result<()> {
        let listed = self.list_dir_into(ino, out);
        // A listing that failed partway is never served: the next READDIR lists again.
        out.taken = listed.is_ok();
        if listed.is_err() {
            out.clear();
        }
        listed
    }

    /// Each entry's `d_ino` is the `st_ino` its `stat` shows ([`shown_ino`]; CortexFS's own
    /// entries `VIRTUAL_INO | ino`), its `d_type` the backing filesystem's.
    fn list_dir_into(&self, ino: u64, out: &mut Listing) -> io::Result<()> {
        let dev = self.storage.dev();
        let layout = |name: &str| {
            self.storage.stat(Path::new(name)).map_or(0, |st| shown_ino(st.st_dev, st.st_ino, dev))
        };
        out.clear();
        match ino {
            ROOT | BIN | STATUS => out.push(b".", VIRTUAL_INO | ino, libc::DT_DIR as u32),
            _ => {}
        }
        match ino {
            ROOT if self.view.as_ref().is_some_and(|a| !a.alive(&self.storage)) => {
                out.push(b"..", VIRTUAL_INO | ROOT, libc::DT_DIR as u32);
            }
            ROOT => {
                out.push(b"..", VIRTUAL_INO | ROOT, libc::DT_DIR as u32);
                for (i, n) in ROOT_NAMES.iter().enumerate() {
                    let (t, shown) = match i {
                        0 => (libc::DT_REG, VIRTUAL_INO | STATUS),
                        1 => (libc::DT_DIR, VIRTUAL_INO | BIN),
                        _ => (libc::DT_DIR, layout(n)),
                    };
                    out.push(n.as_bytes(), shown, t as u32);
                }
            }
            BIN => {
                out.push(b"..", VIRTUAL_INO | ROOT, libc::DT_DIR as u32);
                for (i, (n, _)) in self.bins.iter().enumerate() {
                    out.push(n.as_bytes(), VIRTUAL_INO | (BIN_FIRST + i as u64), libc::DT_REG as u32);
                }
            }
            STATUS => return Err(err(Why::NotDirectory)),
            _ => {
                let rel = self.rel(ino)?;
                let fd = self.storage.dir(&rel)?;
                let here = rustix::fs::fstat(&fd).map_err(ioerr)?;
                out.push(b".", shown_ino(here.st_dev, here.st_ino, dev), libc::DT_DIR as u32);
                let up = match rel.parent() {
                    Some(p) if !p.as_os_str().is_empty() => rustix::fs::statat(&fd, "..", AtFlags::empty())
                        .map_or(0, |st| shown_ino(st.st_dev, st.st_ino, dev)),
                    _ => VIRTUAL_INO | ROOT,
                };
                out.push(b"..", up, libc::DT_DIR as u32);
                let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 8192];
                let mut dir = rustix::fs::RawDir::new(&fd, &mut buf);
                while let Some(e) = dir.next() {
                    let e = e.map_err(ioerr)?;
                    let name = e.file_name().to_bytes();
                    if name == b"." || name == b".." || !self.visible(&rel, name) {
                        continue;
                    }
                    let t = match e.file_type() {
                        rustix::fs::FileType::Directory => libc::DT_DIR,
                        rustix::fs::FileType::Symlink => libc::DT_LNK,
                        rustix::fs::FileType::Socket => libc::DT_SOCK,
                        rustix::fs::FileType::Fifo => libc::DT_FIFO,
                        rustix::fs::FileType::CharacterDevice => libc::DT_CHR,
                        rustix::fs::FileType::BlockDevice => libc::DT_BLK,
                        rustix::fs::FileType::RegularFile => libc::DT_REG,
                        rustix::fs::FileType::Unknown => libc::DT_UNKNOWN,
                    };
                    // An entry that is a mount point shows its own device's number; the
                    // directory's is the best known without a stat per entry.
                    out.push(name, shown_ino(here.st_dev, e.ino(), dev), t as u32);
                }
                if self.storage.from_generation(&rel) {
                    self.list_runtime(&rel, out)?;
                }
            }
        }
        Ok(())
    }

    /// Lists the runtime entries (sockets, logs, `status`, `pid`) of configuration directory
    /// `rel` served from the active generation: they live in the storage beside it.
    fn list_runtime(&self, rel: &Path, out: &mut Listing) -> io::Result<()> {
        let Ok(fd) = self.storage.work_dir(rel) else { return Ok(()) };
        let dev = self.storage.dev();
        let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 8192];
        let mut dir = rustix::fs::RawDir::new(&fd, &mut buf);
        while let Some(e) = dir.next() {
            let e = e.map_err(ioerr)?;
            let name = e.file_name().to_bytes();
            let runtime = joined(rel, std::ffi::OsStr::from_bytes(name), |child| {
                !self.storage.from_generation(child) && self.visible_as(rel, name, child)
            });
            if name.first() == Some(&b'.') || !runtime {
                continue;
            }
            let t = match e.file_type() {
                rustix::fs::FileType::Symlink => libc::DT_LNK,
                rustix::fs::FileType::Socket => libc::DT_SOCK,
                _ => libc::DT_REG,
            };
            out.push(name, shown_ino(dev, e.ino(), dev), t as u32);
        }
        Ok(())
    }

    /// A directory handle for `ino`: a closed one's, with its buffers, or a new one.
    fn dir_handle(&self) -> Arc<Mutex<Handle>> {
        lock(spare_dirs()).pop().unwrap_or_else(|| Arc::new(Mutex::new(Handle::Dir(Listing::default()))))
    }

    /// Keeps the handle of a closed directory for the next open, when nothing else holds it.
    fn spare_dir(&self, h: Arc<Mutex<Handle>>) {
        if Arc::strong_count(&h) != 1 {
            return;
        }
        if let Handle::Dir(l) = &mut *lock(&h) {
            l.clear();
            // A huge directory's buffers are not kept for the life of the process.
            l.names.shrink_to(LISTING_NAMES_KEPT);
            l.entries.shrink_to(LISTING_ENTRIES_KEPT);
        } else {
            return;
        }
        let mut spare = lock(spare_dirs());
        if spare.len() < SPARE_DIRS {
            spare.push(h);
        }
    }
}

/// Hands a new entry `leaf` of `dir` (open as `file`, if it is) to the caller: its uid, and its
/// gid unless `dir` is set-group-ID (then the entry keeps the directory's group, and a new
/// directory the bit). Then exactly `mode` (`None` for a symlink): set last, since chown clears
/// set-ID bits, and explicitly, so that the server's own umask never applies.
fn give_to_caller(
    ctx: &Context,
    dir: &OwnedFd,
    leaf: &Path,
    file: Option<&OwnedFd>,
    mode: Option<u32>,
) -> io::Result<()> {
    let setgid = rustix::fs::fstat(dir).map_err(ioerr)?.st_mode & libc::S_ISGID != 0;
    let (uid, gid) = caller(ctx)?;
    let (uid, gid) = (Some(uid), (!setgid).then_some(gid));
    match file {
        Some(fd) => rustix::fs::fchown(fd, uid, gid),
        None => rustix::fs::chownat(dir, leaf, uid, gid, AtFlags::SYMLINK_NOFOLLOW),
    }
    .map_err(ioerr)?;
    let Some(mode) = mode else { return Ok(()) };
    match file {
        Some(fd) => rustix::fs::fchmod(fd, Mode::from_raw_mode(mode)).map_err(ioerr),
        None => {
            let fd = rustix::fs::openat(
                dir,
                leaf,
                OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(ioerr)?;
            let is_dir = rustix::fs::fstat(&fd).map_err(ioerr)?.st_mode & libc::S_IFMT == libc::S_IFDIR;
            chmod_unfollowed(&fd, if is_dir && setgid { mode | libc::S_ISGID } else { mode })
        }
    }
}

/// chmod(2) of the file `fd` was opened on with `O_PATH | O_NOFOLLOW`, through its /proc/self/fd
/// link, so that a symlink swapped in is never followed. A symlink's mode cannot be changed.
fn chmod_unfollowed(fd: &OwnedFd, mode: u32) -> io::Result<()> {
    if rustix::fs::fstat(fd).map_err(ioerr)?.st_mode & libc::S_IFMT == libc::S_IFLNK {
        return Err(err(Why::Unsupported));
    }
    let link = format!("/proc/self/fd/{}", fd.as_raw_fd());
    rustix::fs::chmod(link.as_str(), Mode::from_raw_mode(mode)).map_err(ioerr)
}

/// Opens an existing file `leaf` of `dir` with `flags` for the caller, checking its mode bits
/// as the kernel would have (the caller's uid and gid; supplementary groups are not known here,
/// so this may refuse where the kernel would allow), and truncating only once allowed.
fn open_existing(dir: &OwnedFd, leaf: &Path, flags: OFlags, ctx: &Context) -> io::Result<OwnedFd> {
    let fd = rustix::fs::openat(
        dir,
        leaf,
        (flags - OFlags::TRUNC) | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(ioerr)?;
    let st = rustix::fs::fstat(&fd).map_err(ioerr)?;
    let acc = flags & OFlags::ACCMODE;
    let want = match acc {
        a if a == OFlags::WRONLY => 0o2,
        a if a == OFlags::RDWR => 0o6,
        _ if flags.contains(OFlags::TRUNC) => 0o6,
        _ => 0o4,
    };
    let bits = if ctx.uid == st.st_uid {
        st.st_mode >> 6
    } else if ctx.gid == st.st_gid {
        st.st_mode >> 3
    } else {
        st.st_mode
    };
    if ctx.uid != 0 && bits & want != want {
        return Err(err(Why::NotPermitted));
    }
    // A file with an access ACL answers another user by its entries, which are not evaluated
    // here: only its owner (or root) opens it on this path (the kernel's own check, on a fresh
    // lookup, decides for the others).
    let mut acl = [0u8; 4];
    let has_acl = match rustix::fs::fgetxattr(&fd, "system.posix_acl_access", &mut acl[..]) {
        Ok(n) => n > 0,
        Err(e) => e == rustix::io::Errno::RANGE,
    };
    if has_acl && ctx.uid != 0 && ctx.uid != st.st_uid {
        return Err(err(Why::NotPermitted));
    }
    if flags.contains(OFlags::TRUNC) {
        rustix::fs::ftruncate(&fd, 0).map_err(ioerr)?;
    }
    // Back to blocking I/O, as the caller asked.
    rustix::fs::fcntl_setfl(&fd, flags & (OFlags::APPEND | OFlags::SYNC | OFlags::DSYNC)).map_err(ioerr)?;
    Ok(fd)
}

/// The owner and group a SETATTR asks for.
type Owner2 = (Option<rustix::fs::Uid>, Option<rustix::fs::Gid>);

/// The owner a SETATTR asks for. An id of -1 ("no change" to chown(2), never a real owner)
/// is refused: the kernel never sends one, and no request makes the server act on it.
fn owner_of(attr: &stat64, valid: SetattrValid) -> io::Result<Owner2> {
    if (valid.contains(SetattrValid::UID) && attr.st_uid == u32::MAX)
        || (valid.contains(SetattrValid::GID) && attr.st_gid == u32::MAX)
    {
        return Err(err(Why::Invalid));
    }
    Ok((
        valid.contains(SetattrValid::UID).then(|| rustix::fs::Uid::from_raw(attr.st_uid)),
        valid.contains(SetattrValid::GID).then(|| rustix::fs::Gid::from_raw(attr.st_gid)),
    ))
}

/// The caller's uid and gid, as a new entry's owner: an id of -1 (no user at all) is refused
/// before anything is made.
pub(crate) fn caller(ctx: &Context) -> io::Result<(rustix::fs::Uid, rustix::fs::Gid)> {
    if ctx.uid == u32::MAX || ctx.gid == u32::MAX {
        return Err(err(Why::Invalid));
    }
    Ok((rustix::fs::Uid::from_raw(ctx.uid), rustix::fs::Gid::from_raw(ctx.gid)))
}

/// The access and modification times a SETATTR asks for.
fn times_of(attr: &stat64, valid: SetattrValid) -> Timestamps {
    let pick = |set: bool, now: bool, sec: i64, nsec: i64| {
        if !set {
            Timespec { tv_sec: 0, tv_nsec: libc::UTIME_OMIT }
        } else if now {
            Timespec { tv_sec: 0, tv_nsec: libc::UTIME_NOW }
        } else {
            Timespec { tv_sec: sec, tv_nsec: nsec }
        }
    };
    Timestamps {
        last_access: pick(
            valid.contains(SetattrValid::ATIME),
            valid.contains(SetattrValid::ATIME_NOW),
            attr.st_atime,
            attr.st_atime_nsec,
        ),
        last_modification: pick(
            valid.contains(SetattrValid::MTIME),
            valid.contains(SetattrValid::MTIME_NOW),
            attr.st_mtime,
            attr.st_mtime_nsec,
        ),
    }
}

/// Applies a SETATTR to an open file.
fn set_file_attr(f: &File, attr: &stat64, valid: SetattrValid) -> io::Result<()> {
    // A descriptor kept with `O_PATH` (a directory, a FIFO, whatever has no name left) takes
    // its changes through /proc/self/fd, which reaches the object it is open on.
    if rustix::fs::fcntl_getfl(f).map_err(ioerr)?.contains(OFlags::PATH) {
        let fd: OwnedFd = f.try_clone()?.into();
        let at = ringfs::beneath::through(&fd);
        if valid.contains(SetattrValid::MODE) {
            chmod_unfollowed(&fd, attr.st_mode & 0o7777)?;
        }
        if valid.intersects(SetattrValid::UID | SetattrValid::GID) {
            let (uid, gid) = owner_of(attr, valid)?;
            rustix::fs::chownat(&fd, "", uid, gid, AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW)
                .map_err(ioerr)?;
        }
        if valid.contains(SetattrValid::SIZE) {
            let w = rustix::fs::open(at.as_str(), OFlags::WRONLY | OFlags::CLOEXEC, Mode::empty())
                .map_err(ioerr)?;
            rustix::fs::ftruncate(&w, attr.st_size as u64).map_err(ioerr)?;
        }
        if valid.intersects(SetattrValid::ATIME | SetattrValid::MTIME) {
            rustix::fs::utimensat(rustix::fs::CWD, at.as_str(), &times_of(attr, valid), AtFlags::empty())
                .map_err(ioerr)?;
        }
        return Ok(());
    }
    if valid.contains(SetattrValid::MODE) {
        rustix::fs::fchmod(f, Mode::from_raw_mode(attr.st_mode & 0o7777)).map_err(ioerr)?;
    }
    if valid.intersects(SetattrValid::UID | SetattrValid::GID) {
        let (uid, gid) = owner_of(attr, valid)?;
        rustix::fs::fchown(f, uid, gid).map_err(ioerr)?;
    }
    if valid.contains(SetattrValid::SIZE) {
        rustix::fs::ftruncate(f, attr.st_size as u64).map_err(ioerr)?;
    }
    if valid.intersects(SetattrValid::ATIME | SetattrValid::MTIME) {
        rustix::fs::futimens(f, &times_of(attr, valid)).map_err(ioerr)?;
    }
    Ok(())
}

/// Checks the complete lines of `new` (bytes appended to a control being rewritten) for the
/// controls that are line-structured: `policy` and `mount`.
fn check_lines(rel: &Path, new: &[u8]) -> Result<(), String> {
    let control = rel.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let Some(end) = new.iter().rposition(|&b| b == b'\n') else { return Ok(()) };
    for line in new[..end].split(|&b| b == b'\n') {
        match control {
            "policy" => {
                policy::v0::parse_line(line, 0).map_err(|e| e.message)?;
            }
            "mount" => {
                let text = std::str::from_utf8(line).map_err(|_| "line is not UTF-8".to_owned())?;
                if !text.trim().is_empty() {
                    policy::mount::parse_line(text)?;
                }
            }
            _ => return Ok(()),
        }
    }
    Ok(())
}
