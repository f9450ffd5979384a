//! The storage's one journal: every durable append of every log opened with
//! [`AppendLog::open_journaled`] is written here first, and a batch from any number of files
//! costs one flush.
//!
//! - An append is queued as a record (its file, offset and bytes; see the format module,
//!   [`super::format`]). The
//!   appender that finds the journal idle commits the batch in its own thread; while a batch is
//!   committed, records queue, and the committer thread takes everything queued as the next
//!   batch. A batch is written into the journal's ring (a file
//!   preallocated and zero-filled at creation, so overwriting it allocates nothing and its flush
//!   commits no filesystem metadata) and flushed once (`fdatasync`); then each record's
//!   bytes are written into its file (the page cache), and only then are they acknowledged. A log file
//!   never holds bytes whose record is not durable.
//! - Files are made durable at checkpoints, by a thread of their own, when half the ring is in
//!   use and when the journal closes: every file written since the last checkpoint is synced,
//!   then the superblock's tail moves past their records, whose space is reused.
//! - Opening replays the records after the tail into their files (at their offsets, so a
//!   record already there is written again unchanged), then checkpoints. A record whose file is
//!   gone or is another file now (inode number and birth time) is skipped.
//! - Space in a log file is reserved before its record is queued: a full disk refuses the
//!   append (ENOSPC or EDQUOT, as itself) before anything is journaled. A failed journal write or
//!   flush stops the journal (every append then fails, until it is opened again and replayed);
//!   a failed write into a log file stops that log.

use std::fs::{File, OpenOptions};
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use super::format::{self, HEADER, RING_START, Record, Super};
use super::{AppendLog, Done};
use crate::error::{Error, Result};

/// The journal's file name in the storage directory.
pub const FILE_NAME: &str = ".journal";
/// The default ring capacity.
pub const DEFAULT_CAP: u64 = 16 << 20;

/// What the journal did, for `ctx status` and benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Flushes (one per batch).
    pub flushes: u64,
    /// Records written.
    pub records: u64,
    /// Checkpoints completed.
    pub checkpoints: u64,
    /// Records found after the tail at open (acknowledged or not, in their files or not).
    pub found: u64,
    /// Records written again at open: their files lacked them.
    pub replayed: u64,
    /// Records skipped at open (their file gone or another one).
    pub skipped: u64,
}

/// An append waiting in the open batch.
struct Entry {
    log: Arc<AppendLog>,
    offset: u64,
    /// The record's bytes in the batch buffer, and the data's within them.
    rec: std::ops::Range<usize>,
    data: std::ops::Range<usize>,
    end: u64,
    done: Done,
}

struct State {
    buf: Vec<u8>,
    entries: Vec<Entry>,
    spare_buf: Vec<u8>,
    spare_entries: Vec<Entry>,
    next_seq: u64,
    /// Logical position after the last record written (and applied: the committer applies a
    /// batch before it takes the next).
    head: u64,
    /// The sequence number of the record at `head`.
    head_seq: u64,
    /// The superblock's tail.
    tail: u64,
    generation: u64,
    /// Logs written since the last checkpoint began.
    dirty: Vec<Arc<AppendLog>>,
    checkpoint_wanted: bool,
    /// The committer holds a batch.
    busy: bool,
    /// Closing: no more appends are taken.
    refusing: bool,
    /// Checkpoints begun and completed.
    begun: u64,
    completed: u64,
    closing: bool,
    stopped: Option<String>,
    stats: Stats,
}

/// The journal of one storage. Open it with [`Journal::open`], close it with
/// [`Journal::close`].
pub struct Journal {
    path: PathBuf,
    root: PathBuf,
    file: File,
    cap: u64,
    state: Mutex<State>,
    /// The committer waits here for records; appenders for a stopped or closing journal.
    work: Condvar,
    /// The committer waits here for space, `close` for checkpoints.
    space: Condvar,
    /// The checkpoint thread waits here.
    checkpoint: Condvar,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal").field("path", &self.path).field("cap", &self.cap).finish()
    }
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The inode number and birth time (ns, 0 when unknown) of an open file.
pub(super) fn identity(file: &File) -> std::io::Result<(u64, u64)> {
    use rustix::fs::{AtFlags, StatxFlags};
    let st = rustix::fs::statx(file.as_fd(), "", AtFlags::EMPTY_PATH, StatxFlags::INO | StatxFlags::BTIME)?;
    let born = if st.stx_mask & StatxFlags::BTIME.bits() != 0 {
        (st.stx_btime.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(u64::from(st.stx_btime.tv_nsec))
    } else {
        0
    };
    Ok((st.stx_ino, born))
}

impl Journal {
    /// Opens the journal of the storage directory `root` (creating it, with a ring of `cap`
    /// bytes, when missing), replays it into the logs there, and starts its threads. Takes an
    /// exclusive lock: one process journals a storage at a time ([`Error::Busy`] otherwise).
    pub fn open(root: &Path, cap: u64) -> Result<Arc<Journal>> {
        let path = root.join(FILE_NAME);
        let (file, created) = open_file(&path, cap)?;
        lock_journal(&path, &file)?;
        let len = file.metadata().map_err(|e| Error::io("stat", &path, e))?.len();
        let mut image =
            vec![0u8; usize::try_from(len).map_err(|_| Error::Invalid("journal too large".into()))?];
        file.read_exact_at(&mut image, 0).map_err(|e| Error::io("read", &path, e))?;
        let scan = format::scan(&image).map_err(|reason| Error::Damaged { path: path.clone(), reason })?;
        let (replayed, skipped) = replay(root, &scan.records)?;
        if !scan.records.is_empty() {
            tracing::info!(journal = %path.display(), found = scan.records.len(), replayed, skipped, "replayed the journal");
        }
        let sup = scan.sup;
        let j = Arc::new(Journal {
            path,
            root: root.to_path_buf(),
            file,
            cap: sup.cap,
            state: Mutex::new(State {
                buf: Vec::new(),
                entries: Vec::new(),
                spare_buf: Vec::new(),
                spare_entries: Vec::new(),
                next_seq: scan.next_seq,
                head: scan.head,
                head_seq: scan.next_seq,
                tail: sup.tail,
                generation: sup.generation,
                dirty: Vec::new(),
                checkpoint_wanted: false,
                busy: false,
                refusing: false,
                begun: 0,
                completed: 0,
                closing: false,
                stopped: None,
                stats: Stats { found: scan.records.len() as u64, replayed, skipped, ..Stats::default() },
            }),
            work: Condvar::new(),
            space: Condvar::new(),
            checkpoint: Condvar::new(),
            threads: Mutex::new(Vec::new()),
        });
        // What was replayed is durable in its files (`replay` synced them): the tail moves past
        // it. Sequence numbers go on from past any record a ring can hold, so that intact
        // records of a batch torn before them (behind the scan's stop) are never read as this
        // run's.
        let next_seq = scan.next_seq + sup.cap / 8;
        j.write_super(Super {
            cap: sup.cap,
            generation: sup.generation + 1,
            tail: scan.head,
            tail_seq: next_seq,
        })?;
        {
            let mut st = lock(&j.state);
            st.generation += 1;
            st.tail = scan.head;
            st.next_seq = next_seq;
            st.head_seq = next_seq;
        }
        let _ = created;
        let commit = Arc::clone(&j);
        let ckpt = Arc::clone(&j);
        let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(name.into())
                .spawn(f)
                .map_err(|e| Error::io("start thread", &j.path, e))
        };
        let a = spawn("journal-commit", Box::new(move || commit.commit_loop()))?;
        let b = spawn("journal-checkpoint", Box::new(move || ckpt.checkpoint_loop()))?;
        j.threads.lock().unwrap_or_else(std::sync::PoisonError::into_inner).extend([a, b]);
        Ok(j)
    }

    /// The storage directory whose logs this journal takes.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The device of the journal's file: logs on it are journaled.
    pub fn device(&self) -> Option<u64> {
        use std::os::unix::fs::MetadataExt;
        self.file.metadata().ok().map(|m| m.dev())
    }

    /// The ring's capacity in bytes.
    pub fn capacity(&self) -> u64 {
        self.cap
    }

    /// What the journal did so far.
    pub fn stats(&self) -> Stats {
        lock(&self.state).stats
    }

    /// Asks for a checkpoint and returns once one begun after this call has completed: every
    /// record acknowledged before the call is then in its file on disk.
    pub fn checkpoint(&self) -> Result<()> {
        let mut st = lock(&self.state);
        let target = st.begun + 1;
        st.checkpoint_wanted = true;
        self.checkpoint.notify_one();
        while st.completed < target && st.stopped.is_none() {
            st = self.space.wait(st).unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        match &st.stopped {
            Some(reason) => Err(self.stopped(reason)),
            None => Ok(()),
        }
    }

    /// Commits what is queued, checkpoints, and stops the journal's threads. Appends after
    /// this fail.
    pub fn close(&self) -> Result<()> {
        {
            let mut st = lock(&self.state);
            st.refusing = true;
            while (!st.entries.is_empty() || st.busy) && st.stopped.is_none() {
                st = self.space.wait(st).unwrap_or_else(std::sync::PoisonError::into_inner);
            }
        }
        let done = self.checkpoint();
        {
            let mut st = lock(&self.state);
            st.closing = true;
            self.work.notify_all();
            self.checkpoint.notify_all();
        }
        let threads =
            std::mem::take(&mut *self.threads.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        let me = std::thread::current().id();
        for t in threads {
            if t.thread().id() != me {
                let _ = t.join();
            }
        }
        // The logs it held (written since the last checkpoint, or queued when it stopped) hold
        // the journal in turn: let both go. Nothing waits on its threads from now on.
        let mut st = lock(&self.state);
        st.dirty.clear();
        st.entries.clear();
        if st.stopped.is_none() {
            st.stopped = Some("the journal is closed".into());
        }
        self.space.notify_all();
        done
    }

    /// Stops the journal's threads with no checkpoint, leaving the journal as a crash would.
    #[cfg(test)]
    pub(crate) fn crash(&self) {
        {
            let mut st = lock(&self.state);
            st.closing = true;
            st.checkpoint_wanted = false;
            st.dirty.clear();
            self.work.notify_all();
            self.checkpoint.notify_all();
        }
        let threads =
            std::mem::take(&mut *self.threads.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        for t in threads {
            let _ = t.join();
        }
    }

    fn stopped(&self, reason: &str) -> Error {
        Error::Stopped { path: self.path.clone(), reason: reason.to_owned() }
    }

    /// Queues the record of `bytes` at `offset` of `log` (whose end after it is `end`). Called
    /// with the log's lock held, so that each log's records are queued in offset order. Gives
    /// `done` back when the journal is stopped or closing. `Ok(true)`: the journal is idle, and
    /// the caller commits the batch ([`lead_if_idle`](Self::lead_if_idle)) once it has let go
    /// of the log.
    pub(super) fn submit(
        &self,
        log: &Arc<AppendLog>,
        offset: u64,
        bytes: &[u8],
        end: u64,
        done: Done,
    ) -> std::result::Result<bool, (Error, Done)> {
        let Some(j) = &log.journaled else { unreachable!("a journaled log") };
        let mut st = lock(&self.state);
        if let Some(reason) = &st.stopped {
            return Err((self.stopped(reason), done));
        }
        if st.closing || st.refusing {
            return Err((self.stopped("the journal is closed"), done));
        }
        let seq = st.next_seq;
        st.next_seq += 1;
        let start = st.buf.len();
        Record { seq, path: j.rel.as_os_str().as_bytes(), ino: j.ino, born: j.born, offset, data: bytes }
            .encode_into(&mut st.buf);
        let data_start = start + HEADER + j.rel.as_os_str().len();
        let rec = start..st.buf.len();
        st.entries.push(Entry {
            log: Arc::clone(log),
            offset,
            rec,
            data: data_start..data_start + bytes.len(),
            end,
            done,
        });
        // A batch being committed: whoever commits it hands this one to the committer after.
        Ok(st.entries.len() == 1 && !st.busy)
    }

    fn commit_loop(self: Arc<Self>) {
        // Kept across batches, so that a batch allocates nothing once they have grown.
        let mut scratch = Scratch::default();
        loop {
            let mut st = lock(&self.state);
            while (st.entries.is_empty() || st.busy) && !st.closing {
                st = self.work.wait(st).unwrap_or_else(std::sync::PoisonError::into_inner);
            }
            if st.entries.is_empty() || st.busy {
                return;
            }
            self.commit_batch(st, &mut scratch);
        }
    }

    /// Commits the queued batch in the calling thread when no batch is being committed: an
    /// append that finds the journal idle is flushed by its own thread, with no hand-off to the
    /// committer (which takes the batches queued meanwhile).
    pub(super) fn lead_if_idle(&self) {
        thread_local! {
            static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::default();
        }
        let st = lock(&self.state);
        if st.busy || st.entries.is_empty() || st.closing {
            return;
        }
        SCRATCH.with(|s| match s.try_borrow_mut() {
            Ok(mut s) => self.commit_batch(st, &mut s),
            // Called again from a receiver told by this thread's commit: the committer takes it.
            Err(_) => self.work.notify_one(),
        });
    }

    /// Takes the queued batch (there is one, and none is being committed), writes it, flushes,
    /// applies it to its files and tells its appenders.
    fn commit_batch(&self, mut st: MutexGuard<'_, State>, scratch: &mut Scratch) {
        let Scratch { told, writes } = scratch;
        let (buf, mut entries) = take_batch(&mut st, usize::try_from(self.cap / 2).unwrap_or(usize::MAX));
        st.busy = true;
        let first_seq = st.head_seq;
        // Where each record goes, and the writes that put them there.
        let head = layout(st.head, self.cap, &entries, first_seq, writes);
        while head - st.tail > self.cap && st.stopped.is_none() {
            st.checkpoint_wanted = true;
            self.checkpoint.notify_one();
            st = self.space.wait(st).unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        let stopped = st.stopped.clone();
        drop(st);
        let written = match stopped {
            Some(reason) => Err(reason),
            None => self.write_batch(&buf, writes).map_err(|e| {
                tracing::error!(journal = %self.path.display(), error = %e, "journal write failed; journal stopped");
                e.to_string()
            }),
        };
        let mut st = lock(&self.state);
        match &written {
            Ok(()) => {
                drop(st);
                for e in entries.drain(..) {
                    let r = e.log.apply(e.offset, &buf[e.data.clone()], e.end);
                    told.push((e.done, r.map(|()| e.end), Some(e.log)));
                }
                st = lock(&self.state);
                st.head = head;
                st.head_seq = first_seq + told.len() as u64;
                st.stats.flushes += 1;
                st.stats.records += told.len() as u64;
                for (_, _, log) in told.iter_mut() {
                    if let Some(l) = log.take()
                        && let Some(j) = &l.journaled
                        && !j.dirty.swap(true, Ordering::AcqRel)
                    {
                        st.dirty.push(l);
                    }
                }
                if (head - st.tail) * 2 > self.cap && !st.checkpoint_wanted {
                    st.checkpoint_wanted = true;
                    self.checkpoint.notify_one();
                }
            }
            Err(reason) => {
                if st.stopped.is_none() {
                    st.stopped = Some(reason.clone());
                }
                // Everything queued behind fails too: the journal takes nothing more.
                let rest = std::mem::take(&mut st.entries);
                st.buf.clear();
                // Stopped once the journal's lock is let go (a log's lock comes first).
                for e in entries.drain(..).chain(rest) {
                    told.push((e.done, Err(self.stopped(reason)), Some(e.log)));
                }
                self.space.notify_all();
            }
        }
        let mut buf = buf;
        buf.clear();
        st.spare_buf = buf;
        if st.spare_entries.capacity() < entries.capacity() {
            st.spare_entries = entries;
        }
        st.busy = false;
        if st.entries.is_empty() {
            // `close` waits for the queue to drain.
            self.space.notify_all();
        } else {
            // Queued meanwhile: the committer takes it.
            self.work.notify_one();
        }
        drop(st);
        if let Err(reason) = &written {
            for (_, _, log) in told.iter() {
                if let Some(l) = log {
                    l.stop(reason);
                }
            }
        }
        for (done, r, _) in told.drain(..) {
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| done.finish(r))).is_err() {
                tracing::error!(journal = %self.path.display(), "an append's receiver panicked");
            }
        }
    }

    fn write_batch(&self, buf: &[u8], writes: &[(u64, Piece)]) -> std::io::Result<()> {
        for (at, piece) in writes {
            let bytes: &[u8] = match piece {
                Piece::Buf(r) => &buf[r.clone()],
                Piece::Pad(p) => p,
            };
            self.file.write_all_at(bytes, RING_START + at)?;
        }
        self.file.sync_data()
    }

    fn checkpoint_loop(self: Arc<Self>) {
        loop {
            let mut st = lock(&self.state);
            while !st.checkpoint_wanted && !st.closing {
                st = self.checkpoint.wait(st).unwrap_or_else(std::sync::PoisonError::into_inner);
            }
            if !st.checkpoint_wanted {
                return;
            }
            st.checkpoint_wanted = false;
            st.begun += 1;
            let (tail, tail_seq) = (st.head, st.head_seq);
            let dirty = std::mem::take(&mut st.dirty);
            for l in &dirty {
                if let Some(j) = &l.journaled {
                    j.dirty.store(false, Ordering::Release);
                }
            }
            let generation = st.generation + 1;
            let skip = st.stopped.is_some();
            drop(st);
            let synced = if skip {
                Ok(())
            } else {
                dirty
                    .iter()
                    .try_for_each(|l| l.file.sync_data().map_err(|e| Error::io("sync", &l.path, e)))
                    .and_then(|()| self.write_super(Super { cap: self.cap, generation, tail, tail_seq }))
            };
            // Let go of the logs before saying the checkpoint is done: a caller then closes
            // the ones nothing else holds.
            drop(dirty);
            let mut st = lock(&self.state);
            match synced {
                Ok(()) => {
                    st.generation = generation;
                    st.tail = tail;
                    st.stats.checkpoints += 1;
                }
                Err(e) => {
                    tracing::error!(journal = %self.path.display(), error = %e, "checkpoint failed; journal stopped");
                    if st.stopped.is_none() {
                        st.stopped = Some(e.to_string());
                    }
                }
            }
            st.completed = st.begun;
            self.space.notify_all();
        }
    }

    fn write_super(&self, sup: Super) -> Result<()> {
        let mut block = vec![0u8; format::BLOCK as usize];
        block[..format::SB_SIZE].copy_from_slice(&sup.encode());
        self.file
            .write_all_at(&block, (sup.generation % 2) * format::BLOCK)
            .and_then(|()| self.file.sync_data())
            .map_err(|e| Error::io("write superblock", &self.path, e))
    }
}

/// Takes the queued records as a batch: all of them, or as many as `max` bytes hold (at least
/// one), the rest staying queued.
fn take_batch(st: &mut State, max: usize) -> (Vec<u8>, Vec<Entry>) {
    let spare = std::mem::take(&mut st.spare_buf);
    let mut buf = std::mem::replace(&mut st.buf, spare);
    let spare = std::mem::take(&mut st.spare_entries);
    let mut entries = std::mem::replace(&mut st.entries, spare);
    if buf.len() > max {
        let k = entries.iter().position(|e| e.rec.end > max).unwrap_or(entries.len()).max(1);
        let cut = entries[k - 1].rec.end;
        st.buf.extend_from_slice(&buf[cut..]);
        buf.truncate(cut);
        st.entries.extend(entries.drain(k..).map(|mut e| {
            e.rec = e.rec.start - cut..e.rec.end - cut;
            e.data = e.data.start - cut..e.data.end - cut;
            e
        }));
    }
    (buf, entries)
}

/// What committing a batch reuses from one batch to the next.
#[derive(Default)]
struct Scratch {
    told: Vec<(Done, Result<u64>, Option<Arc<AppendLog>>)>,
    writes: Vec<(u64, Piece)>,
}

/// A piece of a batch's writes.
enum Piece {
    Buf(std::ops::Range<usize>),
    Pad([u8; HEADER]),
}

/// Lays the records of a batch out from logical position `head`: the writes (ring offset and
/// bytes) into `writes`; returns the position after the last record.
fn layout(head: u64, cap: u64, entries: &[Entry], first_seq: u64, writes: &mut Vec<(u64, Piece)>) -> u64 {
    writes.clear();
    let mut pos = head;
    for (i, e) in entries.iter().enumerate() {
        let len = e.rec.len() as u64;
        let (at, pad) = format::place(pos, len, cap);
        if pad {
            writes.push((pos % cap, Piece::Pad(format::pad(first_seq + i as u64))));
        }
        match writes.last_mut() {
            Some((w, Piece::Buf(r)))
                if at == pos && *w + r.len() as u64 == at % cap && r.end == e.rec.start =>
            {
                r.end = e.rec.end;
            }
            _ => writes.push((at % cap, Piece::Buf(e.rec.clone()))),
        }
        pos = at + len;
    }
    pos
}

/// The file beside the journal naming the process that holds it.
const OWNER_SUFFIX: &str = "owner";

/// Takes the journal's exclusive lock. Held by a live process: [`Error::Busy`] after the
/// usual two seconds. Held by one that is gone (killed with io_uring requests in flight, its
/// files stay held until the kernel tears its ring down): waited for, up to 30 seconds, since
/// the journal must be replayed before its logs are served.
fn lock_journal(path: &Path, file: &File) -> Result<()> {
    let owner = path.with_extension(OWNER_SUFFIX);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        match super::lock_exclusive(path, file) {
            Ok(()) => {
                // Root's own file beside root's journal.
                let _ = std::fs::write(&owner, std::process::id().to_string());
                return Ok(());
            }
            Err(Error::Busy { .. }) if std::time::Instant::now() < deadline => {
                let holder = std::fs::read_to_string(&owner).ok().and_then(|p| p.trim().parse::<i32>().ok());
                let alive = holder.is_some_and(|pid| {
                    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|st| {
                        st.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with(['Z', 'X']))
                    })
                });
                if alive {
                    return Err(Error::Busy { path: path.to_path_buf() });
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// Opens the journal file, creating it (zero-filled, with an empty superblock) when missing.
fn open_file(path: &Path, cap: u64) -> Result<(File, bool)> {
    let flags = rustix::fs::OFlags::NOFOLLOW.bits() as i32;
    match OpenOptions::new().read(true).write(true).custom_flags(flags).open(path) {
        Ok(f) => {
            if !f.metadata().map_err(|e| Error::io("stat", path, e))?.is_file() {
                return Err(Error::Invalid(format!("{} is not a regular file", path.display())));
            }
            return Ok((f, false));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io("open", path, e)),
    }
    let cap = cap.max(64 * 1024).next_multiple_of(8);
    // Made under a temporary name of this process and put in place once complete and durable,
    // never over a journal another process made meanwhile (that one is opened instead).
    let tmp = path.with_extension(format!("new.{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .custom_flags(flags)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| Error::io("create", &tmp, e))?;
    let zeros = vec![0u8; 1 << 20];
    let total = RING_START + cap;
    let mut at = 0;
    let made = (|| {
        while at < total {
            let n = (total - at).min(zeros.len() as u64) as usize;
            f.write_all_at(&zeros[..n], at)?;
            at += n as u64;
        }
        let mut block = vec![0u8; format::BLOCK as usize];
        block[..format::SB_SIZE]
            .copy_from_slice(&Super { cap, generation: 0, tail: 0, tail_seq: 1 }.encode());
        f.write_all_at(&block, 0)?;
        f.sync_all()?;
        rustix::fs::renameat_with(
            rustix::fs::CWD,
            &tmp,
            rustix::fs::CWD,
            path,
            rustix::fs::RenameFlags::NOREPLACE,
        )
        .map_err(std::io::Error::from)
    })();
    match made {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(rustix::io::Errno::EXIST.raw_os_error()) => {
            let _ = std::fs::remove_file(&tmp);
            return open_file(path, cap);
        }
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(Error::io("create", path, e));
        }
    }
    super::sync_parent(path)?;
    Ok((f, true))
}

/// Writes each record's data into its file (beneath `root`, no symlink followed) at its
/// offset where the file lacks it, then syncs the files written. Returns how many records were
/// written and how many skipped.
fn replay(root: &Path, records: &[Record<'_>]) -> Result<(u64, u64)> {
    if records.is_empty() {
        return Ok((0, 0));
    }
    let tree = crate::beneath::Tree::open(root).map_err(|e| Error::io("open", root, e))?;
    let mut files: std::collections::HashMap<&[u8], Option<File>> = std::collections::HashMap::new();
    let (mut replayed, mut skipped) = (0, 0);
    for r in records {
        let f = files.entry(r.path).or_insert_with(|| {
            let rel = Path::new(std::ffi::OsStr::from_bytes(r.path));
            match tree.open_regular(rel, rustix::fs::OFlags::RDWR) {
                Ok(f) => Some(f),
                Err(e) => {
                    tracing::warn!(file = %rel.display(), error = %e, "a journaled file is gone; its records are skipped");
                    None
                }
            }
        });
        let Some(file) = f else {
            skipped += 1;
            continue;
        };
        let (ino, born) = identity(file)
            .map_err(|e| Error::io("stat", root.join(std::ffi::OsStr::from_bytes(r.path)), e))?;
        let len = file.metadata().map_err(|e| Error::io("stat", root, e))?.len();
        if ino != r.ino || (born != 0 && r.born != 0 && born != r.born) || len < r.offset {
            tracing::warn!(file = %String::from_utf8_lossy(r.path), "a journaled file is another file now; its record is skipped");
            skipped += 1;
            continue;
        }
        let path = root.join(std::ffi::OsStr::from_bytes(r.path));
        // What the file holds where the record goes: the record itself (nothing to do), zeros
        // or nothing (lost with the page cache: written again), or other lines (another writer
        // appended there since, without this journal: never written over).
        let held = usize::try_from(len.min(r.offset + r.data.len() as u64) - r.offset).unwrap_or(0);
        let mut there = vec![0u8; held];
        file.read_exact_at(&mut there, r.offset).map_err(|e| Error::io("replay", &path, e))?;
        if held == r.data.len() && there == r.data {
            continue;
        }
        if there.iter().zip(r.data).any(|(a, b)| *a != 0 && a != b) {
            tracing::warn!(file = %path.display(), offset = r.offset, "a journaled record's place holds other lines; it is skipped");
            skipped += 1;
            continue;
        }
        file.write_all_at(r.data, r.offset).map_err(|e| Error::io("replay", &path, e))?;
        replayed += 1;
    }
    for (p, f) in files {
        if let Some(f) = f {
            f.sync_data().map_err(|e| Error::io("sync", root.join(std::ffi::OsStr::from_bytes(p)), e))?;
        }
    }
    Ok((replayed, skipped))
}

/// The journal's part of a log opened with [`AppendLog::open_journaled`].
#[derive(Debug)]
pub(super) struct Journaled {
    pub(super) journal: Arc<Journal>,
    /// The file's path relative to the storage.
    pub(super) rel: PathBuf,
    pub(super) ino: u64,
    pub(super) born: u64,
    /// Written since the last checkpoint began (listed in the journal's `dirty`).
    pub(super) dirty: AtomicBool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::Options;

    fn libc_efbig() -> i32 {
        rustix::io::Errno::FBIG.raw_os_error()
    }

    fn line(w: usize, i: usize) -> Vec<u8> {
        format!("{{\"w\":{w},\"i\":{i},\"pad\":\"{}\"}}\n", "x".repeat((w * 7 + i) % 50)).into_bytes()
    }

    /// The golden fixture: a journal of a 64 KiB ring with three records, a pad at the end of
    /// the first lap and one record after it, as `format` encodes them.
    fn golden() -> Vec<u8> {
        let cap = 64 * 1024;
        let mut img = vec![0u8; (RING_START + cap) as usize];
        let sup = Super { cap, generation: 7, tail: cap - 2 * 104 - 88 - 96, tail_seq: 41 };
        img[(sup.generation % 2 * format::BLOCK) as usize..][..format::SB_SIZE]
            .copy_from_slice(&sup.encode());
        let mut pos = sup.tail;
        let put = |img: &mut Vec<u8>, pos: &mut u64, bytes: &[u8]| {
            let at = (RING_START + *pos % cap) as usize;
            img[at..at + bytes.len()].copy_from_slice(bytes);
            *pos += bytes.len() as u64;
        };
        for (seq, path, offset, data) in [
            (41, &b"home/0/agent/a/session/s/events.jsonl"[..], 0, &b"{\"n\":1}\n"[..]),
            (42, b"home/0/agent/a/session/s/events.jsonl", 8, b"{\"n\":2}\n"),
            (43, b"agent/a.d/log", 100, b"{\"run\":\"r\"}\n"),
        ] {
            let mut b = Vec::new();
            Record { seq, path, ino: 1000 + seq, born: 5, offset, data }.encode_into(&mut b);
            put(&mut img, &mut pos, &b);
        }
        put(&mut img, &mut pos, &format::pad(44));
        let mut b = Vec::new();
        Record { seq: 44, path: b"home/0/x.jsonl", ino: 9, born: 0, offset: 16, data: b"{}\n" }
            .encode_into(&mut b);
        let mut at = pos.next_multiple_of(cap);
        put(&mut img, &mut at, &b);
        img
    }

    #[test]
    fn the_golden_journal_reads_as_documented() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/journal-v1.bin");
        let made = golden();
        if std::env::var_os("CORTEXFS_BLESS").is_some() {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &made).unwrap();
        }
        let fixture = std::fs::read(&path).expect("the golden journal (CORTEXFS_BLESS=1 makes it)");
        assert_eq!(fixture, made, "the encoder no longer writes the documented format");
        let s = format::scan(&fixture).unwrap();
        let got: Vec<(u64, &[u8], u64, &[u8])> =
            s.records.iter().map(|r| (r.seq, r.path, r.offset, r.data)).collect();
        assert_eq!(got.len(), 4);
        assert_eq!(got[2], (43, &b"agent/a.d/log"[..], 100, &b"{\"run\":\"r\"}\n"[..]));
        assert_eq!(got[3], (44, &b"home/0/x.jsonl"[..], 16, &b"{}\n"[..]));
        assert_eq!(s.next_seq, 45);
    }

    #[test]
    fn many_logs_share_flushes_and_hold_exactly_what_was_acknowledged() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(dir.path(), 256 * 1024).unwrap();
        let logs: Vec<_> = (0..16)
            .map(|w| {
                AppendLog::open_journaled(&j, Path::new(&format!("s{w}.jsonl")), Options::default())
                    .unwrap()
                    .0
            })
            .collect();
        assert!(logs.iter().all(|l| l.journaled()));
        std::thread::scope(|s| {
            for (w, l) in logs.iter().enumerate() {
                s.spawn(move || {
                    for i in 0..300 {
                        l.append(&line(w, i)).unwrap();
                    }
                });
            }
        });
        let st = j.stats();
        assert_eq!(st.records, 16 * 300);
        assert!(st.flushes < st.records, "{st:?}");
        // The 256 KiB ring was reused: checkpoints moved its tail.
        assert!(st.checkpoints > 0, "{st:?}");
        for (w, l) in logs.iter().enumerate() {
            let want: Vec<u8> = (0..300).flat_map(|i| line(w, i)).collect();
            assert_eq!(std::fs::read(dir.path().join(format!("s{w}.jsonl"))).unwrap(), want);
            assert_eq!(l.len(), want.len() as u64);
        }
        drop(logs);
        j.close().unwrap();
    }

    #[test]
    fn replay_restores_what_the_files_lost_and_nothing_twice() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(dir.path(), 1 << 20).unwrap();
        let (a, _) = AppendLog::open_journaled(&j, Path::new("a.jsonl"), Options::default()).unwrap();
        let (b, _) = AppendLog::open_journaled(&j, Path::new("b.jsonl"), Options::default()).unwrap();
        for i in 0..10 {
            a.append(&line(0, i)).unwrap();
        }
        j.checkpoint().unwrap();
        for i in 10..40 {
            a.append(&line(0, i)).unwrap();
            b.append(&line(1, i)).unwrap();
        }
        // A power cut: the journal is as flushed (no checkpoint since), and what the page
        // cache held of the files since the checkpoint is lost (cut short, one mid-line).
        j.crash();
        drop((a, b, j));
        let copy = dir;
        let a_at_checkpoint: u64 = (0..10).map(|i| line(0, i).len() as u64).sum();
        std::fs::OpenOptions::new()
            .write(true)
            .open(copy.path().join("a.jsonl"))
            .unwrap()
            .set_len(a_at_checkpoint)
            .unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(copy.path().join("b.jsonl"))
            .unwrap()
            .set_len(5)
            .unwrap();
        let j2 = Journal::open(copy.path(), 1 << 20).unwrap();
        // Records were replayed and the files lacked nothing the copy's metadata still named.
        assert!(j2.stats().replayed >= 60, "{:?}", j2.stats());
        let want_a: Vec<u8> = (0..40).flat_map(|i| line(0, i)).collect();
        let want_b: Vec<u8> = (10..40).flat_map(|i| line(1, i)).collect();
        assert_eq!(std::fs::read(copy.path().join("a.jsonl")).unwrap(), want_a);
        assert_eq!(std::fs::read(copy.path().join("b.jsonl")).unwrap(), want_b);
        // Opening again replays nothing more (the open checkpointed) and appends go on.
        j2.close().unwrap();
        drop(j2);
        let j3 = Journal::open(copy.path(), 1 << 20).unwrap();
        assert_eq!(j3.stats().replayed, 0);
        let (a3, _) = AppendLog::open_journaled(&j3, Path::new("a.jsonl"), Options::default()).unwrap();
        assert_eq!(a3.len(), want_a.len() as u64);
        a3.append(&line(0, 40)).unwrap();
        drop(a3);
        j3.close().unwrap();
    }

    /// A record whose place in its file holds other lines (written there since without the
    /// journal) is never written over; zeros where it goes (lost data) are.
    #[test]
    fn replay_never_writes_over_other_lines() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(dir.path(), 1 << 20).unwrap();
        let (a, _) = AppendLog::open_journaled(&j, Path::new("a.jsonl"), Options::default()).unwrap();
        let (b, _) = AppendLog::open_journaled(&j, Path::new("b.jsonl"), Options::default()).unwrap();
        a.append(b"{\"a\":1}\n").unwrap();
        b.append(b"{\"b\":1}\n").unwrap();
        j.crash();
        drop((a, b, j));
        std::fs::write(dir.path().join("a.jsonl"), b"{\"x\":9}\n").unwrap();
        let f = std::fs::OpenOptions::new().write(true).open(dir.path().join("b.jsonl")).unwrap();
        f.write_all_at(&[0u8; 8], 0).unwrap();
        let j = Journal::open(dir.path(), 1 << 20).unwrap();
        assert_eq!((j.stats().found, j.stats().replayed, j.stats().skipped), (2, 1, 1));
        assert_eq!(std::fs::read(dir.path().join("a.jsonl")).unwrap(), b"{\"x\":9}\n");
        assert_eq!(std::fs::read(dir.path().join("b.jsonl")).unwrap(), b"{\"b\":1}\n");
        j.close().unwrap();
    }

    #[test]
    fn a_log_with_commits_of_its_own_is_taken_over_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.jsonl");
        {
            let (log, _) = AppendLog::open(&path, Options::default()).unwrap();
            log.append(b"{\"old\":1}\n").unwrap();
        }
        let j = Journal::open(dir.path(), 1 << 20).unwrap();
        let (log, rec) = AppendLog::open_journaled(&j, Path::new("old.jsonl"), Options::default()).unwrap();
        assert!(log.journaled());
        assert_eq!(rec.mark.end, 10);
        log.append(b"{\"new\":2}\n").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"{\"old\":1}\n{\"new\":2}\n");
        let mut buf = [0u8; 64];
        assert!(rustix::fs::getxattr(&path, crate::log::evidence::XATTR, &mut buf).is_err());
        drop(log);
        j.close().unwrap();
    }

    #[test]
    fn refused_appends_journal_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(dir.path(), 1 << 20).unwrap();
        let (log, _) = AppendLog::open_journaled(&j, Path::new("x.jsonl"), Options::default()).unwrap();
        assert!(log.append(b"{\"a\":1}").is_err());
        assert!(log.append(b"not json\n").is_err());
        assert!(log.append_at(3, b"{}\n").is_err());
        assert_eq!(log.append(b"{}\n").unwrap(), 3);
        assert_eq!(j.stats().records, 1);
        drop(log);
        j.close().unwrap();
        drop(j);
        // A record larger than half the ring could never be written: refused as too big.
        let small = tempfile::tempdir().unwrap();
        let j = Journal::open(small.path(), 64 << 10).unwrap();
        let (log, _) = AppendLog::open_journaled(&j, Path::new("y.jsonl"), Options::default()).unwrap();
        let big = format!("{{\"pad\":\"{}\"}}\n", "x".repeat(40 << 10));
        assert_eq!(log.append(big.as_bytes()).unwrap_err().errno(), libc_efbig());
        assert_eq!(log.append(b"{}\n").unwrap(), 3);
        drop(log);
        j.close().unwrap();
        // Closed: appends are refused, and a checkpoint asked after says so rather than wait.
        assert!(j.checkpoint().is_err());
    }
}
