//! The append log: durable, group-committed JSONL appends (spec §6).
//!
//! - [`AppendLog::append`] takes one or more complete JSON lines and returns only when they are
//!   durable. Concurrent appenders share syncs: while one batch is being made durable, new
//!   appends queue; when that sync completes, the next leader writes everything queued as one
//!   write plus one fsync. No timer decides when a batch closes.
//! - Input that is not complete, valid JSON lines (or longer than the line limit, or not at the
//!   end of the log) is refused whole; nothing partial is ever written.
//! - A failed sync stops the log: that batch and every later append fail, and nothing is
//!   acknowledged until the log is reopened (and recovered). A failure is never retried into a
//!   success. The exception is a full disk or quota (ENOSPC, EDQUOT): the failed batch is cut
//!   back to the last acknowledged end (file, evidence, sync), its appenders get that error as
//!   itself, and the log goes on taking appends as soon as there is space.
//! - [`AppendLog::len`] and [`AppendLog::read_at`] expose only acknowledged bytes.
//! - Opening recovers: commit evidence (see [`evidence`]) tells a torn, unacknowledged tail, which
//!   is cut and kept in a `<file>.torn` sidecar, from damage inside acknowledged data, which is an
//!   error.
//!
//! The commit itself has two twins: `portable.rs` (pwrite, fsetxattr, fsync) and `uring.rs`
//! (the same three as one linked io_uring submission), chosen by [`Engine`].

pub mod evidence;
pub mod format;
pub mod journal;
mod portable;
mod recover;
#[allow(unsafe_code)]
mod uring;

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, Thread};

use serde::de::IgnoredAny;

use crate::error::{Error, Result};
use evidence::{Evidence, Mark};
pub use journal::Journal;
pub use recover::{Recovery, TORN_SUFFIX, torn_path, verify};

/// The extended attribute that marks a log whose appends go through a journal: its length is
/// what was acknowledged (the journal's replay saw to it), with no commit evidence of its own.
pub const JOURNALED_XATTR: &str = "user.cortexfs.journaled";

/// The default longest line: 1 MiB.
pub const DEFAULT_MAX_LINE: usize = 1 << 20;

/// Which commit path to use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Engine {
    /// The measured default for this machine kind: the portable path, which io_uring does not
    /// beat across the board (level at 64 appenders, behind alone; see `bench/README.md`).
    #[default]
    Auto,
    /// pwrite + fsetxattr + fsync.
    Portable,
    /// One linked io_uring submission; fails to open when io_uring is unavailable.
    Uring,
}

/// The engine actually in use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineKind {
    /// pwrite + fsetxattr + fsync.
    Portable,
    /// One linked io_uring submission.
    Uring,
}

impl Engine {
    /// Resolves the preference against what this process can do.
    pub fn resolve(self) -> std::result::Result<EngineKind, String> {
        match self {
            Engine::Auto | Engine::Portable => Ok(EngineKind::Portable),
            Engine::Uring => uring::probe().map(|()| EngineKind::Uring),
        }
    }
}

/// Whether io_uring can be used here; the reason when not.
pub fn uring_available() -> std::result::Result<(), String> {
    uring::probe()
}

/// Log options.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Longest accepted line in bytes, newline excluded.
    pub max_line: usize,
    /// Commit path.
    pub engine: Engine,
}

impl Default for Options {
    fn default() -> Options {
        Options { max_line: DEFAULT_MAX_LINE, engine: Engine::Auto }
    }
}

/// Checks that `bytes` is one or more complete, valid JSON lines; returns the number of lines.
pub fn validate(bytes: &[u8], max_line: usize) -> Result<usize> {
    if bytes.is_empty() {
        return Err(Error::Invalid("empty append".into()));
    }
    let Some(body) = bytes.strip_suffix(b"\n") else {
        return Err(Error::Invalid("the last line is incomplete (no trailing newline)".into()));
    };
    let mut n = 0;
    for (i, line) in body.split(|&b| b == b'\n').enumerate() {
        if line.len() > max_line {
            return Err(Error::Invalid(format!(
                "line {} is {} bytes; the limit is {max_line}",
                i + 1,
                line.len()
            )));
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            return Err(Error::Invalid(format!("line {} is blank", i + 1)));
        }
        if let Err(e) = serde_json::from_slice::<IgnoredAny>(line) {
            return Err(Error::Invalid(format!("line {} is not valid JSON: {e}", i + 1)));
        }
        n += 1;
    }
    Ok(n)
}

#[derive(Debug)]
struct State {
    /// Bytes queued for the open batch.
    pending: Vec<u8>,
    /// A spare buffer, swapped with `pending` to keep its allocation.
    spare: Vec<u8>,
    /// Appenders waiting for the open batch.
    waiters: Vec<Arc<Waiter>>,
    /// Appenders of the open batch that wait on no thread: each is told when it is durable.
    deferred: Vec<Deferred>,
    /// Spare buffers for `deferred`, so that batches in flight (one committing, the next
    /// filling) keep their allocations.
    spare_deferred: Vec<Vec<Deferred>>,
    /// Sequence number of the open batch.
    open_seq: u64,
    /// A leader is writing and syncing a batch.
    leading: bool,
    /// The acknowledged state.
    acked: Mark,
    /// Acknowledged plus in-flight plus queued bytes.
    logical_end: u64,
    /// Set by the first failed commit; the log is stopped from then on.
    stopped: Option<String>,
    /// Batches committed, for statistics.
    batches: u64,
    /// The evidence on disk says `prev == cur == acked` (nothing in flight).
    settled: bool,
    /// Disk space is reserved (without changing the size) up to here.
    reserved: u64,
}

/// An appender parked until its batch is durable, or until it is asked to lead.
#[derive(Debug)]
struct Waiter {
    thread: Thread,
    lead: AtomicBool,
    /// The errno of a failure that failed this appender's batch without stopping the log
    /// (a full disk), 0 while none did. Checked before the durable sequence number, which a
    /// later batch may pass.
    failed: AtomicI32,
}

/// Whom [`AppendLog::append_then`] tells, once, that an append is durable (with the log's end
/// after it) or has failed.
pub enum Done {
    /// A call.
    Call(Box<dyn FnOnce(Result<u64>) + Send>),
    /// `to.tell(tag, outcome)`: a receiver that many appends share, each with a tag of its own,
    /// so that an append allocates nothing.
    Tell(Arc<dyn Tell>, [u64; 3]),
}

/// A receiver of the outcomes of appends made with [`Done::Tell`].
pub trait Tell: Send + Sync {
    /// The append tagged `tag` is durable (`Ok`, the log's end after it) or failed.
    fn tell(&self, tag: [u64; 3], outcome: Result<u64>);
}

impl std::fmt::Debug for Done {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Done::Call(_) => f.write_str("Done::Call"),
            Done::Tell(_, tag) => f.debug_tuple("Done::Tell").field(tag).finish(),
        }
    }
}

impl Done {
    fn finish(self, outcome: Result<u64>) {
        match self {
            Done::Call(f) => f(outcome),
            Done::Tell(to, tag) => to.tell(tag, outcome),
        }
    }
}

/// Spare buffers of deferred appends kept, at most.
const SPARE_DEFERRED: usize = 4;

/// An append that waits on no thread: the end offset after it, and whom to tell.
struct Deferred {
    end: u64,
    done: Done,
}

impl std::fmt::Debug for Deferred {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deferred").field("end", &self.end).finish()
    }
}

/// The threads that commit batches no appender thread leads (batches of
/// [`AppendLog::append_then`] alone), and the logs waiting for them. A queue that keeps its
/// buffer, so that handing a log over allocates nothing once it has grown.
struct Committer {
    logs: Mutex<std::collections::VecDeque<Arc<AppendLog>>>,
    ready: std::sync::Condvar,
    /// Threads running; none (they could not start) means a log is committed where it is.
    threads: AtomicU64,
}

fn committer() -> &'static Committer {
    static C: std::sync::OnceLock<Committer> = std::sync::OnceLock::new();
    static STARTED: std::sync::Once = std::sync::Once::new();
    let c = C.get_or_init(|| Committer {
        logs: Mutex::new(std::collections::VecDeque::with_capacity(64)),
        ready: std::sync::Condvar::new(),
        threads: AtomicU64::new(0),
    });
    STARTED.call_once(|| {
        // Two, so that a slow disk under one log does not hold up another log's batch.
        for i in 0..2 {
            let spawned = thread::Builder::new().name(format!("log-commit-{i}")).spawn(move || {
                loop {
                    let log = {
                        let mut logs = c.logs.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                        loop {
                            if let Some(l) = logs.pop_front() {
                                break l;
                            }
                            logs = c.ready.wait(logs).unwrap_or_else(std::sync::PoisonError::into_inner);
                        }
                    };
                    // The leadership was taken for this thread when the log was handed over.
                    // A panic in a receiver it tells ends that commit's telling, never this
                    // thread: the logs queued behind it still get committed.
                    let led = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        let st = log.lock();
                        let seq = st.open_seq;
                        let _ = log.lead(st, seq);
                    }));
                    if led.is_err() {
                        tracing::error!(path = %log.path.display(), "a log commit's receiver panicked");
                    }
                }
            });
            match spawned {
                Ok(_) => {
                    c.threads.fetch_add(1, Ordering::Release);
                }
                Err(e) => tracing::error!(error = %e, "cannot start a log committer"),
            }
        }
    });
    c
}

/// A group-committed JSONL append log. Share it between threads by reference or `Arc`.
///
/// An appender that finds no commit in flight leads: it takes everything queued as one batch
/// and commits it. Appenders that arrive meanwhile queue their bytes and park. When the commit
/// completes, the leader publishes the new durable sequence number, unparks exactly the
/// appenders of its batch (who check an atomic and return, without touching the lock), and asks
/// one appender of the next batch to lead it.
#[derive(Debug)]
pub struct AppendLog {
    path: PathBuf,
    file: File,
    opts: Options,
    engine: EngineKind,
    state: Mutex<State>,
    /// Highest batch sequence number made durable.
    done_seq: AtomicU64,
    /// Set once a commit failed.
    stopped: AtomicBool,
    /// The log itself, once [`append_then`](Self::append_then) was called on its `Arc`: what
    /// a commit that finds deferred appends queued behind it hands to the committer.
    me: std::sync::OnceLock<std::sync::Weak<AppendLog>>,
    /// Set when the log's appends go through a storage's journal.
    journaled: Option<journal::Journaled>,
}

impl AppendLog {
    /// Opens (creating if missing) and recovers the log at `path`. Takes an exclusive lock on the
    /// file: one process owns a log at a time.
    pub fn open(path: impl AsRef<Path>, opts: Options) -> Result<(AppendLog, Recovery)> {
        let path = path.as_ref().to_path_buf();
        let engine =
            opts.engine.resolve().map_err(|reason| Error::Unsupported { path: path.clone(), reason })?;
        let (file, created) = open_or_create(&path)?;
        lock_exclusive(&path, &file)?;
        // A log whose appends went through a journal: its length says what was acknowledged
        // only once that journal is replayed, which only opening it through the journal does.
        let mut probe = [0u8; 64];
        if rustix::fs::fgetxattr(&file, JOURNALED_XATTR, &mut probe).is_ok()
            && rustix::fs::fgetxattr(&file, evidence::XATTR, &mut probe).is_err()
        {
            return Err(Error::Busy { path });
        }
        let recovery = recover::recover(&path, &file, created)?;
        Ok((AppendLog::assemble(path, file, opts, engine, recovery.mark, 0, None), recovery))
    }

    /// A log over its open, locked and recovered `file`, acknowledged up to `mark`, with space
    /// reserved up to `reserved`.
    fn assemble(
        path: PathBuf,
        file: File,
        opts: Options,
        engine: EngineKind,
        mark: Mark,
        reserved: u64,
        journaled: Option<journal::Journaled>,
    ) -> AppendLog {
        let state = State {
            pending: Vec::new(),
            spare: Vec::new(),
            waiters: Vec::new(),
            deferred: Vec::new(),
            spare_deferred: Vec::with_capacity(SPARE_DEFERRED),
            open_seq: 1,
            leading: false,
            acked: mark,
            logical_end: mark.end,
            stopped: None,
            batches: 0,
            settled: true,
            reserved,
        };
        AppendLog {
            path,
            file,
            opts,
            engine,
            state: Mutex::new(state),
            done_seq: AtomicU64::new(0),
            stopped: AtomicBool::new(false),
            me: std::sync::OnceLock::new(),
            journaled,
        }
    }

    /// Opens (creating if missing) the log at `rel` below `journal`'s storage, its appends
    /// going through `journal`: acknowledged once the journal's batch holding them is durable,
    /// one flush for any number of logs. A log the journal cannot take (on another filesystem,
    /// or one that cannot reserve space ahead) is opened as [`open`](Self::open) opens it, with
    /// a commit of its own per batch; [`journaled`](Self::journaled) tells which.
    pub fn open_journaled(
        journal: &Arc<Journal>,
        rel: &Path,
        opts: Options,
    ) -> Result<(Arc<AppendLog>, Recovery)> {
        let path = journal.root().join(rel);
        let (file, created) = open_or_create(&path)?;
        let eligible = file.metadata().ok().map(|m| std::os::unix::fs::MetadataExt::dev(&m))
            == journal.device()
            && rustix::fs::fallocate(&file, rustix::fs::FallocateFlags::KEEP_SIZE, 0, 1).is_ok()
            && rel.as_os_str().len() <= format::MAX_PATH
            && !rel.as_os_str().is_empty();
        if !eligible {
            drop(file);
            let (log, rec) = AppendLog::open(&path, opts)?;
            return Ok((Arc::new(log), rec));
        }
        let engine =
            opts.engine.resolve().map_err(|reason| Error::Unsupported { path: path.clone(), reason })?;
        lock_exclusive(&path, &file)?;
        let mut marker = [0u8; 8];
        let marked = rustix::fs::fgetxattr(&file, JOURNALED_XATTR, &mut marker).is_ok();
        let mut probe = [0u8; 64];
        let evidence = rustix::fs::fgetxattr(&file, evidence::XATTR, &mut probe).is_ok();
        let recovery = if marked && !evidence {
            let end = file.metadata().map_err(|e| Error::io("stat", &path, e))?.len();
            Recovery { mark: Mark { end, crc: 0 }, created: false, adopted: false, torn: None }
        } else {
            // A log that had commits of its own (or none at all): recovered by its evidence
            // once, then marked as the journal's.
            let rec = recover::recover(&path, &file, created)?;
            match rustix::fs::fremovexattr(&file, evidence::XATTR) {
                Ok(()) | Err(rustix::io::Errno::NODATA) => {}
                Err(e) => return Err(Error::io("remove evidence", &path, e.into())),
            }
            rustix::fs::fsetxattr(&file, JOURNALED_XATTR, b"1", rustix::fs::XattrFlags::empty())
                .map_err(|e| Error::io("mark journaled", &path, e.into()))?;
            file.sync_all().map_err(|e| Error::io("sync", &path, e))?;
            rec
        };
        let (ino, born) = journal::identity(&file).map_err(|e| Error::io("stat", &path, e))?;
        let journaled = journal::Journaled {
            journal: Arc::clone(journal),
            rel: rel.to_path_buf(),
            ino,
            born,
            dirty: AtomicBool::new(false),
        };
        let mark = recovery.mark;
        let log = AppendLog::assemble(path, file, opts, engine, mark, mark.end, Some(journaled));
        let log = Arc::new(log);
        log.me.get_or_init(|| Arc::downgrade(&log));
        Ok((log, recovery))
    }

    /// Whether the log's appends go through a journal.
    pub fn journaled(&self) -> bool {
        self.journaled.is_some()
    }

    /// Whether an append may join the log now: not stopped, and (with `at`) the log ends at
    /// `at`, acknowledged plus queued bytes.
    fn admit(&self, st: &State, at: Option<u64>) -> Result<()> {
        if let Some(reason) = &st.stopped {
            return Err(self.stopped(reason));
        }
        match at {
            Some(offset) if offset != st.logical_end => Err(Error::NotAtEnd { offset, end: st.logical_end }),
            _ => Ok(()),
        }
    }

    /// A journaled append: space reserved in the file, then the record queued in the journal,
    /// both under the log's lock so that records are queued in offset order.
    fn submit(self: &Arc<Self>, j: &Journal, at: Option<u64>, bytes: &[u8], done: Done) {
        if let Err(e) = validate(bytes, self.opts.max_line) {
            return done.finish(Err(e));
        }
        let mut st = self.lock();
        if let Err(e) = self.admit(&st, at) {
            drop(st);
            return done.finish(Err(e));
        }
        let fits = self.journaled.as_ref().is_some_and(|jd| {
            bytes.len() <= format::MAX_DATA
                && format::record_len(jd.rel.as_os_str().len(), bytes.len()) as u64 <= j.capacity() / 2
        });
        if !fits {
            drop(st);
            return done.finish(Err(Error::io(
                "append",
                &self.path,
                std::io::Error::from_raw_os_error(rustix::io::Errno::FBIG.raw_os_error()),
            )));
        }
        let offset = st.logical_end;
        let end = offset + bytes.len() as u64;
        if end > st.reserved {
            match self.reserve_strict(st.reserved, end) {
                Ok(to) => st.reserved = to,
                Err(e) => {
                    drop(st);
                    return done.finish(Err(Error::io("append", &self.path, e)));
                }
            }
        }
        match j.submit(self, offset, bytes, end, done) {
            Ok(lead) => {
                st.logical_end = end;
                drop(st);
                if lead {
                    j.lead_if_idle();
                }
            }
            Err((e, done)) => {
                drop(st);
                done.finish(Err(e));
            }
        }
    }

    /// Reserves space up past `need` (from `from`), failing with what the filesystem said
    /// when it cannot: nothing is journaled that its file might not take.
    fn reserve_strict(&self, from: u64, need: u64) -> std::io::Result<u64> {
        const STEP: u64 = 1 << 20;
        let to = need.div_ceil(STEP) * STEP + STEP;
        let start = from.max(need.saturating_sub(1) / STEP * STEP);
        let keep = rustix::fs::FallocateFlags::KEEP_SIZE;
        match rustix::fs::fallocate(&self.file, keep, start, to - start) {
            Ok(()) => Ok(to),
            // Short of a step ahead: exactly what this append needs, if that is there.
            Err(e) if is_full(&e.into()) => {
                rustix::fs::fallocate(&self.file, keep, from, need - from)?;
                Ok(need)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Writes a journaled record's bytes into the file (its journal batch is durable) and
    /// acknowledges them; a failure stops the log.
    fn apply(&self, offset: u64, data: &[u8], end: u64) -> Result<()> {
        if let Some(reason) = self.lock().stopped.clone() {
            // An earlier record of this log did not reach the file: none after it does.
            return Err(self.stopped(&reason));
        }
        let written = self.file.write_all_at(data, offset);
        let mut st = self.lock();
        match written {
            Ok(()) => {
                st.acked = Mark { end: st.acked.end.max(end), crc: 0 };
                st.settled = false;
                st.batches += 1;
                Ok(())
            }
            Err(e) => {
                tracing::error!(path = %self.path.display(), error = %e, "writing a journaled record into its log failed; log stopped");
                let reason = e.to_string();
                if st.stopped.is_none() {
                    st.stopped = Some(reason.clone());
                }
                self.stopped.store(true, Ordering::Release);
                Err(self.stopped(&reason))
            }
        }
    }

    /// Stops the log: its journal stopped.
    fn stop(&self, reason: &str) {
        let mut st = self.lock();
        if st.stopped.is_none() {
            st.stopped = Some(reason.to_owned());
        }
        self.stopped.store(true, Ordering::Release);
    }

    /// The log's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The device and inode of the open file, to tell whether its path still names it.
    pub fn identity(&self) -> std::io::Result<(u64, u64)> {
        use std::os::unix::fs::MetadataExt;
        let m = self.file.metadata()?;
        Ok((m.dev(), m.ino()))
    }

    /// The commit path in use.
    pub fn engine(&self) -> EngineKind {
        self.engine
    }

    /// Acknowledged length in bytes.
    pub fn len(&self) -> u64 {
        self.lock().acked.end
    }

    /// True when nothing has been acknowledged.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of batches committed since open.
    pub fn batches(&self) -> u64 {
        self.lock().batches
    }

    /// Reads acknowledged bytes at `offset`; never returns bytes past the acknowledged end.
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        let end = self.len();
        if offset >= end {
            return Ok(0);
        }
        let n = usize::try_from(end - offset).unwrap_or(usize::MAX).min(buf.len());
        self.file.read_exact_at(&mut buf[..n], offset).map_err(|e| Error::io("read", &self.path, e))?;
        Ok(n)
    }

    /// Appends complete JSON lines; returns the log's end offset after them once they are
    /// durable.
    pub fn append(&self, bytes: &[u8]) -> Result<u64> {
        self.append_inner(None, bytes)
    }

    /// Like [`append`](Self::append), but only if the log currently ends at `offset`
    /// (acknowledged plus queued bytes); otherwise nothing is written.
    pub fn append_at(&self, offset: u64, bytes: &[u8]) -> Result<u64> {
        self.append_inner(Some(offset), bytes)
    }

    /// Appends complete JSON lines without waiting: `done` is called once, from the thread
    /// that commits the batch holding them, when they are durable (with the log's end after
    /// them) or have failed. With `at`, only if the log currently ends there. An append refused
    /// at once (not whole lines, not at the end, the log stopped) is told so at once, from this
    /// thread. A batch that no appender thread leads is committed by a committer thread, so the
    /// caller's thread goes back to its work at once.
    pub fn append_then(self: &Arc<Self>, at: Option<u64>, bytes: &[u8], done: Done) {
        if let Some(j) = &self.journaled {
            return self.submit(&j.journal, at, bytes, done);
        }
        if let Err(e) = validate(bytes, self.opts.max_line) {
            return done.finish(Err(e));
        }
        self.me.get_or_init(|| Arc::downgrade(self));
        let mut st = self.lock();
        if let Err(e) = self.admit(&st, at) {
            drop(st);
            return done.finish(Err(e));
        }
        st.pending.extend_from_slice(bytes);
        st.logical_end += bytes.len() as u64;
        let end = st.logical_end;
        st.deferred.push(Deferred { end, done });
        if !st.leading {
            // Taken for the committer, which leads the open batch.
            st.leading = true;
            drop(st);
            self.hand_to_committer();
        }
    }

    /// Hands the open batch, whose leadership is taken, to the committer.
    fn hand_on(&self) {
        match self.me.get().and_then(std::sync::Weak::upgrade) {
            Some(me) => me.hand_to_committer(),
            None => {
                let st = self.lock();
                let seq = st.open_seq;
                let _ = self.lead(st, seq);
            }
        }
    }

    fn hand_to_committer(self: &Arc<Self>) {
        let c = committer();
        let sent = c.threads.load(Ordering::Acquire) > 0
            && c.logs.lock().map(|mut logs| logs.push_back(Arc::clone(self))).is_ok();
        if sent {
            c.ready.notify_one();
        } else {
            // No committer: lead here.
            let st = self.lock();
            let seq = st.open_seq;
            let _ = self.lead(st, seq);
        }
    }

    /// Closes the log cleanly: settles the evidence (`prev` = `cur`), so that even the last
    /// batch is covered as acknowledged data and damage to it is reported rather than taken for
    /// a torn tail. Dropping the log does the same, ignoring errors.
    pub fn close(self) -> Result<()> {
        self.settle()
    }

    /// Makes sure the `bytes` after the acknowledged end have disk space, without changing the
    /// file size: a write whose first piece is taken before its rest arrives cannot then run out
    /// of space. `ENOSPC`/`EDQUOT` when the space is not there; filesystems that cannot reserve
    /// space answer `Ok` (they allocate as they write).
    pub fn hold_space(&self, bytes: u64) -> std::io::Result<()> {
        let end = self.len();
        match rustix::fs::fallocate(&self.file, rustix::fs::FallocateFlags::KEEP_SIZE, end, bytes.max(1)) {
            Ok(()) => Ok(()),
            Err(e) if is_full(&e.into()) => Err(e.into()),
            Err(_) => Ok(()),
        }
    }

    /// Reserves disk space past `need` without changing the file size; returns the new reserved
    /// end. Filesystems that cannot reserve simply allocate as they write.
    fn reserve(&self, from: u64, need: u64) -> u64 {
        const STEP: u64 = 1 << 20;
        let to = need.div_ceil(STEP) * STEP + STEP;
        let start = from.max(need.saturating_sub(1) / STEP * STEP);
        match rustix::fs::fallocate(&self.file, rustix::fs::FallocateFlags::KEEP_SIZE, start, to - start) {
            Ok(()) => to,
            // Try again with the next batch: space may come back.
            Err(e) if is_full(&e.into()) => from,
            Err(e) => {
                tracing::trace!(error = %e, "space reservation unavailable");
                u64::MAX
            }
        }
    }

    /// Drops the log without settling its evidence, leaving the file as a crash would.
    #[cfg(test)]
    fn crash(self) {
        self.lock().settled = true;
    }

    fn settle(&self) -> Result<()> {
        let mut st = self.lock();
        if self.journaled.is_some() {
            // The journal makes the bytes durable; only the space reserved past them goes.
            if st.reserved > st.acked.end && st.stopped.is_none() {
                self.file.set_len(st.acked.end).map_err(|e| Error::io("trim", &self.path, e))?;
                st.reserved = st.acked.end;
            }
            return Ok(());
        }
        if st.settled || st.stopped.is_some() {
            return Ok(());
        }
        // Trimming to the acknowledged size also releases the space reserved past it.
        self.file
            .set_len(st.acked.end)
            .and_then(|()| portable::set_evidence(&self.file, &Evidence::settled(st.acked).encode()))
            .and_then(|()| self.file.sync_all())
            .map_err(|e| Error::io("settle evidence", &self.path, e))?;
        st.settled = true;
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Returns the file to the acknowledged mark `prev` after a refused batch: its bytes cut,
    /// synced. The evidence on disk names `prev` either way (as `cur` when the batch's evidence
    /// was never set, as `prev` when it was), so a crash at any point leaves `prev` valid; it is
    /// settled on `prev` too where the disk still allows (on a full disk replacing an extended
    /// attribute may itself need space). Returns whether it was.
    fn cut_back(&self, prev: Mark) -> std::io::Result<bool> {
        self.file.set_len(prev.end)?;
        let settled = portable::set_evidence(&self.file, &Evidence::settled(prev).encode()).is_ok();
        self.file.sync_all()?;
        Ok(settled)
    }

    fn stopped(&self, reason: &str) -> Error {
        Error::Stopped { path: self.path.clone(), reason: reason.to_owned() }
    }

    fn append_inner(&self, at: Option<u64>, bytes: &[u8]) -> Result<u64> {
        if let Some(j) = &self.journaled {
            // Waits on the journal's committer.
            let me = self
                .me
                .get()
                .and_then(std::sync::Weak::upgrade)
                .ok_or_else(|| Error::Invalid("a journaled log is used through its Arc".into()))?;
            let slot = Arc::new((Mutex::new(None::<Result<u64>>), std::sync::Condvar::new()));
            let told = Arc::clone(&slot);
            me.submit(
                &j.journal,
                at,
                bytes,
                Done::Call(Box::new(move |r| {
                    *told.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(r);
                    told.1.notify_one();
                })),
            );
            let mut got = slot.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            loop {
                if let Some(r) = got.take() {
                    return r;
                }
                got = slot.1.wait(got).unwrap_or_else(std::sync::PoisonError::into_inner);
            }
        }
        validate(bytes, self.opts.max_line)?;
        let mut st = self.lock();
        self.admit(&st, at)?;
        st.pending.extend_from_slice(bytes);
        st.logical_end += bytes.len() as u64;
        let my_seq = st.open_seq;
        let my_end = st.logical_end;
        if !st.leading {
            return self.lead(st, my_seq).map(|()| my_end);
        }
        let me = Arc::new(Waiter {
            thread: thread::current(),
            lead: AtomicBool::new(false),
            failed: AtomicI32::new(0),
        });
        st.waiters.push(Arc::clone(&me));
        drop(st);
        loop {
            thread::park();
            let failed = me.failed.load(Ordering::Acquire);
            if failed != 0 {
                return Err(Error::io("append", &self.path, std::io::Error::from_raw_os_error(failed)));
            }
            if self.done_seq.load(Ordering::Acquire) >= my_seq {
                return Ok(my_end);
            }
            if self.stopped.load(Ordering::Acquire) {
                let st = self.lock();
                return Err(self.stopped(st.stopped.as_deref().unwrap_or("unknown")));
            }
            if me.lead.swap(false, Ordering::AcqRel) {
                let st = self.lock();
                let failed = me.failed.load(Ordering::Acquire);
                if failed != 0 {
                    return Err(Error::io("append", &self.path, std::io::Error::from_raw_os_error(failed)));
                }
                if self.done_seq.load(Ordering::Acquire) >= my_seq {
                    return Ok(my_end);
                }
                // The batch holding our bytes may have been taken by an appender that arrived
                // while we were waking, and have failed: then it is never ours to commit.
                if let Some(reason) = &st.stopped {
                    return Err(self.stopped(reason));
                }
                if !st.leading && st.open_seq == my_seq {
                    // Our bytes are still queued: commit them (and everyone else's).
                    return self.lead(st, my_seq).map(|()| my_end);
                }
                // Someone else took the lead (and our bytes with it); keep waiting.
            }
        }
    }

    /// Commits everything queued, with the lock held on entry. Returns when batch `my_seq` (the
    /// one taken here) is durable or has failed.
    fn lead(&self, mut st: MutexGuard<'_, State>, my_seq: u64) -> Result<()> {
        st.leading = true;
        let seq = st.open_seq;
        debug_assert_eq!(seq, my_seq);
        st.open_seq += 1;
        let spare = std::mem::take(&mut st.spare);
        let batch = std::mem::replace(&mut st.pending, spare);
        let waiters = std::mem::take(&mut st.waiters);
        let spare = st.spare_deferred.pop().unwrap_or_default();
        let deferred = std::mem::replace(&mut st.deferred, spare);
        let prev = st.acked;
        let reserve_from = (prev.end + batch.len() as u64 > st.reserved).then_some(st.reserved);
        drop(st);

        // Appends into space reserved ahead of time sync in about two thirds of the time of
        // appends that allocate (measured: bench/README.md).
        let reserved = reserve_from.map(|from| self.reserve(from, prev.end + batch.len() as u64));
        let cur = Mark { end: prev.end + batch.len() as u64, crc: evidence::extend(prev.crc, &batch) };
        let ev = Evidence { prev, cur }.encode();
        let result = match self.engine {
            EngineKind::Portable => portable::commit(&self.file, prev.end, &batch, &ev),
            EngineKind::Uring => uring::commit(&self.file, prev.end, &batch, &ev),
        };
        // Out of space: nothing of this batch was acknowledged, so it is cut back (still
        // leading, so no other commit runs) and the log goes on; any other failure stops it.
        let full = match &result {
            Err(e) if is_full(e) => match self.cut_back(prev) {
                Ok(settled) => {
                    Some((e.raw_os_error().unwrap_or(rustix::io::Errno::NOSPC.raw_os_error()), settled))
                }
                Err(cut) => {
                    tracing::error!(path = %self.path.display(), error = %cut, "cutting back a batch that found no space failed");
                    None
                }
            },
            _ => None,
        };

        let mut st = self.lock();
        st.leading = false;
        if let Some(r) = reserved {
            st.reserved = r;
        }
        let outcome = match result {
            Ok(()) => {
                st.acked = cur;
                st.batches += 1;
                st.settled = false;
                let mut batch = batch;
                batch.clear();
                st.spare = batch;
                self.done_seq.store(seq, Ordering::Release);
                Ok(())
            }
            Err(e) if full.is_some() => {
                tracing::warn!(path = %self.path.display(), error = %e, "log commit found no space; batch refused");
                // What was queued behind the refused batch follows the acknowledged end now.
                st.logical_end = prev.end + st.pending.len() as u64;
                st.settled = full.is_some_and(|(_, settled)| settled);
                st.reserved = 0;
                let mut batch = batch;
                batch.clear();
                st.spare = batch;
                for w in &waiters {
                    let errno = full.map_or(rustix::io::Errno::NOSPC.raw_os_error(), |(errno, _)| errno);
                    w.failed.store(errno, Ordering::Release);
                }
                Err(Error::io("append", &self.path, e))
            }
            Err(e) => {
                tracing::error!(path = %self.path.display(), error = %e, "log commit failed; log stopped");
                let reason = e.to_string();
                st.stopped = Some(reason.clone());
                self.stopped.store(true, Ordering::Release);
                Err(self.stopped(&reason))
            }
        };
        // Wake the next batch's leader first (its commit is the critical path), then this
        // batch's appenders; after a failure, wake every queued appender.
        let next: Vec<Arc<Waiter>> = if outcome.is_err() {
            std::mem::take(&mut st.waiters)
        } else {
            st.waiters.first().cloned().into_iter().collect()
        };
        // What the deferred appenders of this batch are told; after a stop, the ones queued
        // behind it too.
        let failed: Option<(Option<i32>, Option<String>)> = match &outcome {
            Ok(()) => None,
            Err(_) if st.stopped.is_some() => Some((None, st.stopped.clone())),
            Err(_) => {
                Some((Some(full.map_or(rustix::io::Errno::NOSPC.raw_os_error(), |(errno, _)| errno)), None))
            }
        };
        let mut told = deferred;
        if st.stopped.is_some() {
            told.append(&mut st.deferred);
        }
        // Deferred appenders queued meanwhile with no appender thread to lead them: the
        // committer leads their batch.
        let hand_on = st.stopped.is_none() && next.is_empty() && !st.deferred.is_empty();
        if hand_on {
            st.leading = true;
        }
        drop(st);
        for w in next {
            w.lead.store(true, Ordering::Release);
            w.thread.unpark();
        }
        for w in &waiters {
            w.thread.unpark();
        }
        for d in told.drain(..) {
            let r = match &failed {
                None => Ok(d.end),
                Some((Some(errno), _)) => {
                    Err(Error::io("append", &self.path, std::io::Error::from_raw_os_error(*errno)))
                }
                Some((None, reason)) => Err(self.stopped(reason.as_deref().unwrap_or("unknown"))),
            };
            // Every appender of the batch is told, even when telling one of them panics.
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| d.done.finish(r))).is_err() {
                tracing::error!(path = %self.path.display(), "an append's receiver panicked");
            }
        }
        // The emptied buffer serves a later batch.
        if told.capacity() > 0 {
            let mut st = self.lock();
            if st.spare_deferred.len() < SPARE_DEFERRED {
                st.spare_deferred.push(told);
            }
        }
        if hand_on {
            self.hand_on();
        }
        outcome
    }
}

/// A failure that only says the disk (or a quota) is full.
fn is_full(e: &std::io::Error) -> bool {
    use rustix::io::Errno;
    e.raw_os_error().is_some_and(|n| n == Errno::NOSPC.raw_os_error() || n == Errno::DQUOT.raw_os_error())
}

impl Drop for AppendLog {
    fn drop(&mut self) {
        if let Err(e) = self.settle() {
            tracing::warn!(error = %e, "could not settle log evidence on close");
        }
    }
}

/// Takes the exclusive lock on a log. A process that died with io_uring requests in flight keeps
/// its files (and their locks) for a short while after it exits, until the kernel tears its ring
/// down; so a held lock is retried for up to two seconds before the log is reported busy.
fn lock_exclusive(path: &Path, file: &File) -> Result<()> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        match rustix::fs::flock(file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return Ok(()),
            Err(rustix::io::Errno::WOULDBLOCK) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(rustix::io::Errno::WOULDBLOCK) => return Err(Error::Busy { path: path.to_path_buf() }),
            Err(e) => return Err(Error::io("lock", path, e.into())),
        }
    }
}

fn open_or_create(path: &Path) -> Result<(File, bool)> {
    let flags = rustix::fs::OFlags::NOFOLLOW.bits() as i32;
    match OpenOptions::new().read(true).write(true).custom_flags(flags).open(path) {
        Ok(f) => {
            let meta = f.metadata().map_err(|e| Error::io("stat", path, e))?;
            if !meta.is_file() {
                return Err(Error::Invalid(format!("{} is not a regular file", path.display())));
            }
            Ok((f, false))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let f = OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .custom_flags(flags)
                .mode(0o644)
                .open(path)
                .map_err(|e| Error::io("create", path, e))?;
            Ok((f, true))
        }
        Err(e) => Err(Error::io("open", path, e)),
    }
}

/// Fsyncs the directory that holds `path`.
pub(crate) fn sync_parent(path: &Path) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| Error::io("sync directory", dir, e))
}

#[cfg(test)]
mod tests;
