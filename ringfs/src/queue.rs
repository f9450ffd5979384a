//! The shared-space job queue (spec §8): file-native state, no daemon.
//!
//! ```text
//! queue/inbox/    publish temp files
//! queue/pending/J          published, waiting
//! queue/claimed/J/J        claimed (mkdir claimed/J is the exclusive arbiter)
//! queue/lease/J/worker     the claimer's lease (JSON: worker, pid, claim identity, time)
//! queue/done/J + J.result  finished
//! queue/failed/J + J.result
//! ```
//! Jobs are named `*.req.json` and must be valid object names; anything else in `pending/`
//! (other names, symlinks, non-regular files) is reported and never treated as a job.
//!
//! - publish: write a temp file in `inbox/`, fsync, rename to `pending/J` without replacing.
//! - claim: `mkdir claimed/J` (the winner is the only one to move the request), rename
//!   `pending/J` to `claimed/J/J`; then lease: create and sync `lease/J/worker`. A job runs only
//!   after both are durable.
//! - finish: the result is written and synced inside the claim directory and renamed to
//!   `J.result` there without replacing; it lands first, as `done/J.result` (or
//!   `failed/J.result`), by a hard link made through the name `claimed/J` (a rename where the
//!   filesystem has no links; never replacing; a fenced claim has no result under that name),
//!   synced; then the request is moved beside it
//!   (`done/J`), the commit: it is done through the claim directory's descriptor, and only one
//!   rename of that entry can win; the claim's own name of the result goes after it. A result
//!   without its request beside it was never committed:
//!   the worker that landed it removes its own when its commit is refused, and recovery one
//!   that is a fenced claim's own landing, or once no claim of the job is left; a finish that
//!   finds one in its way fails and leaves it to recovery.
//! - recover: a claim whose lease has expired is fenced first (its claim directory is renamed
//!   away), then its request goes back to `pending/` (policy `requeue`) or to `failed/` with a
//!   result saying so (policy `fail`). A stalled worker that wakes afterwards finds its request
//!   gone from its claim directory and cannot commit. A live worker may hold a lock on its lease
//!   file; a locked lease is never recovered, expired or not. A claim that never got its lease
//!   (its claimer died between the two) is an incomplete pair: recovery reports it and leaves it;
//!   an explicit reconciliation (`Queue::reconcile`, `ctx queue recover --reconcile`) settles it
//!   once it is older than the lease time, as an expired claim.
//! - Every rename and removal is followed by an fsync of each affected directory.
//!
//! "Without replacing" is `RENAME_NOREPLACE`; where the filesystem refuses it (GlusterFS),
//! publish and requeue link and unlink, and the other moves rename after checking that the
//! destination is free (`Queue::move_new`). No step is decided by a lookup.
//!
//! Execution is at least once; commit is exactly once.

use std::fs::{self, File};
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use rustix::fs::{AtFlags, FlockOperation, Mode, OFlags, RenameFlags};
use rustix::io::Errno;

use crate::error::{Error, Result};

/// The queue's subdirectories.
pub const DIRS: [&str; 6] = ["inbox", "pending", "lease", "claimed", "done", "failed"];
const INBOX: usize = 0;
const PENDING: usize = 1;
const LEASE: usize = 2;
const CLAIMED: usize = 3;
const DONE: usize = 4;
const FAILED: usize = 5;

/// The most a request may hold.
pub const REQUEST_MAX: u64 = 16 << 20;

/// The default lease time.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(60);

/// What to do with a recovered job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// Back to `pending/`, to run again.
    Requeue,
    /// To `failed/`, with a result saying it was recovered.
    Fail,
}

/// Checks a job name: a valid object name ending in `.req.json`.
pub fn check_job_name(name: &str) -> std::result::Result<(), String> {
    policy::name::validate(name).map_err(|e| format!("{name:?}: {e}"))?;
    if !name.ends_with(".req.json") || name.len() == ".req.json".len() {
        return Err(format!("{name:?}: job names end in .req.json"));
    }
    Ok(())
}

/// An open queue.
#[derive(Debug)]
pub struct Queue {
    root: PathBuf,
    dirs: Vec<OwnedFd>,
    lease: Duration,
    syncs: AtomicU64,
    /// The filesystem refused `RENAME_NOREPLACE` (GlusterFS answers EINVAL): moves check that
    /// the destination is free and rename, and publish links (see [`Queue::move_new`]).
    plain: AtomicBool,
    /// The filesystem refused a hard link (EPERM, EOPNOTSUPP): a result lands by a rename.
    no_links: AtomicBool,
    /// Runs right after a requeue, to put another claim's commit there in a test.
    #[cfg(test)]
    after_requeue: std::sync::Mutex<Option<fn(&Queue)>>,
    /// Runs when a finish has landed its result, before its commit.
    #[cfg(test)]
    after_land: std::sync::Mutex<Option<fn(&Queue)>>,
}

fn errno(op: &'static str, path: PathBuf) -> impl FnOnce(Errno) -> Error {
    move |e| Error::io(op, path, e.into())
}

fn open_dir_at<Fd: AsFd>(dir: Fd, name: &str, shown: &Path) -> Result<OwnedFd> {
    rustix::fs::openat(
        dir,
        name,
        OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::RDONLY,
        Mode::empty(),
    )
    .map_err(errno("open directory", shown.to_path_buf()))
}

/// A claimed job, leased to a worker.
#[derive(Debug)]
pub struct Claim {
    /// The job name.
    pub job: String,
    /// The worker holding it.
    pub worker: String,
    claim: OwnedFd,
    lease_file: Option<File>,
}

/// The outcome of finishing a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// The result and the request are in `done/` (or `failed/`).
    Committed,
    /// The claim was recovered while the worker stalled; nothing was committed.
    Fenced,
}

/// What `ls` sees.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Listing {
    /// Jobs per state, sorted: pending, claimed, done, failed.
    pub pending: Vec<String>,
    /// Claimed jobs.
    pub claimed: Vec<String>,
    /// Finished jobs.
    pub done: Vec<String>,
    /// Failed jobs.
    pub failed: Vec<String>,
    /// Entries that are not jobs, with the reason.
    pub problems: Vec<(PathBuf, String)>,
}

/// What recovery did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recovered {
    /// Jobs put back in `pending/`.
    pub requeued: Vec<String>,
    /// Jobs moved to `failed/`.
    pub failed: Vec<String>,
    /// Partial states completed (a result moved beside its request, stale leases removed...).
    pub reconciled: Vec<String>,
    /// Claims left alone: lease live (locked or not expired).
    pub live: Vec<String>,
    /// Conflicts that need a person (never overwritten).
    pub conflicts: Vec<String>,
    /// Fenced claims kept for the next recovery, with the reason.
    pub deferred: Vec<String>,
    /// Claims without their lease, expired, left for an explicit reconciliation.
    pub incomplete: Vec<String>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct LeaseRecord {
    worker: String,
    pid: u32,
    claim: u64,
    at_ms: u128,
}

fn now_ms() -> u128 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_millis())
}

impl Queue {
    /// Opens the queue at `root`, creating it (and its subdirectories) when missing.
    pub fn open(root: impl AsRef<Path>, lease: Duration) -> Result<Queue> {
        let root = root.as_ref().to_path_buf();
        let created = !root.exists();
        fs::create_dir_all(&root).map_err(|e| Error::io("create directory", &root, e))?;
        let rfd =
            rustix::fs::open(&root, OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::RDONLY, Mode::empty())
                .map_err(errno("open directory", root.clone()))?;
        let mut made = false;
        for d in DIRS {
            match rustix::fs::mkdirat(&rfd, d, Mode::from_raw_mode(0o775)) {
                Ok(()) => made = true,
                Err(Errno::EXIST) => {}
                Err(e) => return Err(Error::io("create directory", root.join(d), e.into())),
            }
        }
        let q = Queue {
            dirs: DIRS.iter().map(|d| open_dir_at(&rfd, d, &root.join(d))).collect::<Result<_>>()?,
            root,
            lease,
            syncs: AtomicU64::new(0),
            plain: AtomicBool::new(false),
            no_links: AtomicBool::new(false),
            #[cfg(test)]
            after_requeue: std::sync::Mutex::new(None),
            #[cfg(test)]
            after_land: std::sync::Mutex::new(None),
        };
        q.probe();
        if made {
            q.fsync(&rfd, &q.root)?;
        }
        if created {
            let parent = q.root.parent().unwrap_or(Path::new("/")).to_path_buf();
            let pfd = rustix::fs::open(
                &parent,
                OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(errno("open directory", parent.clone()))?;
            q.fsync(&pfd, &parent)?;
        }
        Ok(q)
    }

    /// Learns whether this filesystem has `RENAME_NOREPLACE`, with a file of its own in
    /// `inbox/`, so that every decision is made the right way from the first. A caller that may
    /// not write there learns it at its first move.
    fn probe(&self) {
        let name = format!(".probe.{}.{}", std::process::id(), now_ms());
        let made = rustix::fs::openat(
            &self.dirs[INBOX],
            name.as_str(),
            OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        );
        if made.is_err() {
            return;
        }
        let moved = format!("{name}.moved");
        let gone = match rustix::fs::renameat_with(
            &self.dirs[INBOX],
            name.as_str(),
            &self.dirs[INBOX],
            moved.as_str(),
            RenameFlags::NOREPLACE,
        ) {
            Ok(()) => moved,
            Err(e) => {
                if e == Errno::INVAL {
                    self.plain.store(true, Ordering::Relaxed);
                }
                name
            }
        };
        let _ = rustix::fs::unlinkat(&self.dirs[INBOX], gone.as_str(), AtFlags::empty());
    }

    /// The queue's root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Number of fsyncs this handle has issued (each file and directory sync counts one).
    pub fn syncs(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed)
    }

    fn path(&self, dir: usize, name: &str) -> PathBuf {
        self.root.join(DIRS[dir]).join(name)
    }

    fn fsync<Fd: AsFd>(&self, fd: Fd, shown: &Path) -> Result<()> {
        self.syncs.fetch_add(1, Ordering::Relaxed);
        rustix::fs::fsync(fd).map_err(errno("sync", shown.to_path_buf()))
    }

    fn sync_dir(&self, dir: usize) -> Result<()> {
        self.fsync(&self.dirs[dir], &self.root.join(DIRS[dir]))
    }

    /// Moves `from` in `fdir` to `to` in `tdir`, never replacing: EEXIST when `to` exists.
    ///
    /// With `RENAME_NOREPLACE` where the filesystem has it. Where it does not (GlusterFS answers
    /// EINVAL), by a check that `to` is free and a rename: every move of the protocol goes to a
    /// name that only this move can make (a job's name is published once, and its request moves
    /// out of a claim once, since a rename of one source entry succeeds once), so the check
    /// guards against a broken invariant, as NOREPLACE does, and the rename's atomicity does the
    /// rest.
    fn move_new<F: AsFd, T: AsFd>(&self, fdir: F, from: &str, tdir: T, to: &str) -> rustix::io::Result<()> {
        if !self.plain.load(Ordering::Relaxed) {
            match rustix::fs::renameat_with(&fdir, from, &tdir, to, RenameFlags::NOREPLACE) {
                Err(Errno::INVAL) => self.plain.store(true, Ordering::Relaxed),
                r => return r,
            }
        }
        // As NOREPLACE answers: a source gone first (another move won), then a taken name.
        rustix::fs::statat(&fdir, from, AtFlags::SYMLINK_NOFOLLOW)?;
        match rustix::fs::statat(&tdir, to, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(_) => return Err(Errno::EXIST),
            Err(Errno::NOENT) => {}
            Err(e) => return Err(e),
        }
        rustix::fs::renameat(&fdir, from, &tdir, to)
    }

    /// Publishes the synced temp file `tmp` of `inbox/` as `pending/name`, exclusively: a job's
    /// name is published once. Without `RENAME_NOREPLACE`, by a hard link (EEXIST on a taken
    /// name, decided by the filesystem) and the temp name's removal.
    fn publish_new(&self, tmp: &str, name: &str) -> rustix::io::Result<()> {
        if !self.plain.load(Ordering::Relaxed) {
            match rustix::fs::renameat_with(
                &self.dirs[INBOX],
                tmp,
                &self.dirs[PENDING],
                name,
                RenameFlags::NOREPLACE,
            ) {
                Err(Errno::INVAL) => self.plain.store(true, Ordering::Relaxed),
                r => return r,
            }
        }
        rustix::fs::linkat(&self.dirs[INBOX], tmp, &self.dirs[PENDING], name, AtFlags::empty())?;
        rustix::fs::unlinkat(&self.dirs[INBOX], tmp, AtFlags::empty())
    }

    /// Moves the request `job` out of the fenced claim `fd` back to `pending/`; EEXIST when
    /// `pending/` holds it already (a copy a crash left). Without `RENAME_NOREPLACE`, by a hard
    /// link (EEXIST decided by the filesystem, not by a client's cached lookup) and the claim's
    /// name's removal: the fenced claim is recovery's alone, so only a recovery that dies between
    /// the two leaves both names, and the next one finds the job pending and drops the copy.
    fn requeue(&self, fd: &OwnedFd, job: &str) -> rustix::io::Result<()> {
        if !self.without_noreplace() {
            match rustix::fs::renameat_with(fd, job, &self.dirs[PENDING], job, RenameFlags::NOREPLACE) {
                Err(Errno::INVAL) => self.plain.store(true, Ordering::Relaxed),
                r => return r,
            }
        }
        rustix::fs::linkat(fd, job, &self.dirs[PENDING], job, AtFlags::empty())?;
        rustix::fs::unlinkat(fd, job, AtFlags::empty())
    }

    /// Whether a listing of `pending/` shows `job`.
    fn listed_pending(&self, job: &str) -> bool {
        self.pending().is_ok_and(|names| names.iter().any(|n| n == job))
    }

    /// Whether `pending/` lists `job` and it holds the same bytes as `job` in the claim
    /// directory `fd` (each read up to 1 MiB, a bound no request reaches): then it is a second
    /// copy. A name that opens but is not listed is not: a network filesystem's client can
    /// still resolve a file under the name it was just moved from (GlusterFS does, with the
    /// same inode, the name missing from the directory's listing), and that name leads to the
    /// claim's copy itself.
    fn same_request(&self, fd: &OwnedFd, job: &str) -> bool {
        const BOUND: u64 = 1 << 20;
        let read = |dir: &OwnedFd| -> Option<Vec<u8>> {
            let f = rustix::fs::openat(
                dir,
                job,
                OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .ok()?;
            let mut v = Vec::new();
            File::from(f).take(BOUND).read_to_end(&mut v).ok()?;
            Some(v)
        };
        self.listed_pending(job)
            && matches!((read(fd), read(&self.dirs[PENDING])), (Some(a), Some(b)) if a == b)
    }

    /// Whether this filesystem refused `RENAME_NOREPLACE`, so that moves check and rename
    /// (`Queue::move_new`); known from the probe at open, or after the first move.
    pub fn without_noreplace(&self) -> bool {
        self.plain.load(Ordering::Relaxed)
    }

    /// Creates `name` in `dir` exclusively with `bytes`, synced.
    fn write_new<Fd: AsFd>(&self, dir: Fd, name: &str, bytes: &[u8], shown: &Path) -> Result<File> {
        let fd = rustix::fs::openat(
            dir,
            name,
            OFlags::CREATE | OFlags::EXCL | OFlags::RDWR | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o644),
        )
        .map_err(|e| {
            if e == Errno::EXIST {
                Error::Conflict(format!("{} exists", shown.display()))
            } else {
                Error::io("create", shown, e.into())
            }
        })?;
        let mut f = File::from(fd);
        f.write_all(bytes).map_err(|e| Error::io("write", shown, e))?;
        self.fsync(&f, shown)?;
        Ok(f)
    }

    /// Publishes a request under `name` (which must end in `.req.json`); the name must be free
    /// in every state.
    pub fn publish(&self, name: &str, bytes: &[u8]) -> Result<()> {
        check_job_name(name).map_err(Error::Invalid)?;
        for d in [CLAIMED, DONE, FAILED] {
            if rustix::fs::statat(&self.dirs[d], name, AtFlags::SYMLINK_NOFOLLOW).is_ok() {
                return Err(Error::Conflict(format!("job {name} already exists in {}/", DIRS[d])));
            }
        }
        let tmp = format!(".{name}.{}.{}", std::process::id(), now_ms());
        self.write_new(&self.dirs[INBOX], &tmp, bytes, &self.path(INBOX, &tmp))?;
        if let Err(e) = self.publish_new(&tmp, name) {
            let _ = rustix::fs::unlinkat(&self.dirs[INBOX], &tmp, AtFlags::empty());
            return Err(if e == Errno::EXIST {
                Error::Conflict(format!("job {name} is already pending"))
            } else {
                Error::io("rename", self.path(PENDING, name), e.into())
            });
        }
        self.sync_dir(PENDING)?;
        self.sync_dir(INBOX)
    }

    /// Lists the jobs in every state and the entries that are not jobs.
    pub fn list(&self) -> Result<Listing> {
        let mut l = Listing::default();
        for (d, out) in [(PENDING, 0), (CLAIMED, 1), (DONE, 2), (FAILED, 3)] {
            let dir = self.root.join(DIRS[d]);
            let entries = fs::read_dir(&dir).map_err(|e| Error::io("list", &dir, e))?;
            let mut names = Vec::new();
            for e in entries {
                let e = e.map_err(|e| Error::io("list", &dir, e))?;
                let n = e.file_name().to_string_lossy().into_owned();
                let ft = e.file_type().map_err(|e| Error::io("stat", e_path(&dir, &n), e))?;
                if (d == DONE || d == FAILED) && n.ends_with(".req.json.result") {
                    continue;
                }
                if d == CLAIMED && n.starts_with(".fenced.") {
                    continue;
                }
                let why = match check_job_name(&n) {
                    Err(why) => Some(why),
                    Ok(()) if ft.is_symlink() => Some(format!("{n:?} is a symlink")),
                    Ok(()) if d == CLAIMED && !ft.is_dir() => Some(format!("{n:?} is not a claim directory")),
                    Ok(()) if d != CLAIMED && !ft.is_file() => Some(format!("{n:?} is not a regular file")),
                    Ok(()) => None,
                };
                match why {
                    Some(w) => l.problems.push((dir.join(&n), w)),
                    None => names.push(n),
                }
            }
            names.sort();
            *match out {
                0 => &mut l.pending,
                1 => &mut l.claimed,
                2 => &mut l.done,
                _ => &mut l.failed,
            } = names;
        }
        Ok(l)
    }

    /// The jobs in `pending/`, sorted: regular files with job names (what [`Queue::list`] shows
    /// as pending), read from that directory alone, however many jobs are finished.
    fn pending(&self) -> Result<Vec<String>> {
        let dir = self.root.join(DIRS[PENDING]);
        let mut names = Vec::new();
        for e in fs::read_dir(&dir).map_err(|e| Error::io("list", &dir, e))? {
            let e = e.map_err(|e| Error::io("list", &dir, e))?;
            let n = e.file_name().to_string_lossy().into_owned();
            if check_job_name(&n).is_ok() && e.file_type().is_ok_and(|t| t.is_file()) {
                names.push(n);
            }
        }
        names.sort();
        Ok(names)
    }

    /// Claims the first pending job for `worker` and leases it; `None` when nothing is pending.
    /// With `hold_lock`, the lease file stays locked while the [`Claim`] lives, so the job is
    /// never recovered from under a live worker.
    pub fn claim(&self, worker: &str, hold_lock: bool) -> Result<Option<Claim>> {
        policy::name::validate(worker)
            .map_err(|e| Error::Invalid(format!("invalid worker name {worker:?}: {e}")))?;
        for job in self.pending()? {
            match rustix::fs::mkdirat(&self.dirs[CLAIMED], job.as_str(), Mode::from_raw_mode(0o755)) {
                Ok(()) => {}
                Err(Errno::EXIST) => continue,
                Err(e) => return Err(Error::io("claim", self.path(CLAIMED, &job), e.into())),
            }
            self.sync_dir(CLAIMED)?;
            let claim = open_dir_at(&self.dirs[CLAIMED], &job, &self.path(CLAIMED, &job))?;
            match self.move_new(&self.dirs[PENDING], job.as_str(), &claim, job.as_str()) {
                Ok(()) => {}
                Err(Errno::NOENT) => {
                    // Gone meanwhile (recovered to failed, or a stale claim race): release.
                    let _ = rustix::fs::unlinkat(&self.dirs[CLAIMED], job.as_str(), AtFlags::REMOVEDIR);
                    self.sync_dir(CLAIMED)?;
                    continue;
                }
                // This claim directory was reconciled away meanwhile (recovery took it for a
                // dead claimer's) and its name may be another worker's now: not ours to release.
                Err(Errno::STALE) => continue,
                Err(e) => return Err(Error::io("claim", self.path(CLAIMED, &job), e.into())),
            }
            self.fsync(&claim, &self.path(CLAIMED, &job))?;
            self.sync_dir(PENDING)?;
            let ino = rustix::fs::fstat(&claim).map_err(errno("stat", self.path(CLAIMED, &job)))?.st_ino;
            let lease_file = match self.lease(&job, worker, ino) {
                Ok(f) => f,
                Err(e) => {
                    // No lease, no run: give the request back and release the claim.
                    if self.move_new(&claim, job.as_str(), &self.dirs[PENDING], job.as_str()).is_ok() {
                        let _ = rustix::fs::unlinkat(&self.dirs[CLAIMED], job.as_str(), AtFlags::REMOVEDIR);
                        self.sync_dir(PENDING)?;
                        self.sync_dir(CLAIMED)?;
                    }
                    return Err(e);
                }
            };
            let lease_file = if hold_lock {
                rustix::fs::flock(&lease_file, FlockOperation::NonBlockingLockExclusive)
                    .map_err(errno("lock", self.path(LEASE, &job)))?;
                Some(lease_file)
            } else {
                None
            };
            return Ok(Some(Claim { job, worker: worker.to_owned(), claim, lease_file }));
        }
        Ok(None)
    }

    fn lease(&self, job: &str, worker: &str, claim: u64) -> Result<File> {
        let dir = self.path(LEASE, job);
        match rustix::fs::mkdirat(&self.dirs[LEASE], job, Mode::from_raw_mode(0o755)) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(e) => return Err(Error::io("lease", &dir, e.into())),
        }
        let ldir = open_dir_at(&self.dirs[LEASE], job, &dir)?;
        let rec = LeaseRecord { worker: worker.to_owned(), pid: std::process::id(), claim, at_ms: now_ms() };
        let bytes = serde_json::to_vec(&rec).map_err(|e| Error::Invalid(e.to_string()))?;
        let f = self.write_new(&ldir, "worker", &bytes, &dir.join("worker"))?;
        self.fsync(&ldir, &dir)?;
        self.sync_dir(LEASE)?;
        Ok(f)
    }

    /// Re-opens a claim made by an earlier process (the CLI claims and finishes in separate
    /// runs): the lease must name `worker` and the claim directory must be the one it leased.
    pub fn resume(&self, job: &str, worker: &str) -> Result<Claim> {
        check_job_name(job).map_err(Error::Invalid)?;
        let lease =
            self.read_lease(job)?.ok_or_else(|| Error::Conflict(format!("job {job} has no lease")))?;
        if lease.worker != worker {
            return Err(Error::Conflict(format!("job {job} is leased to {}, not {worker}", lease.worker)));
        }
        let claim = open_dir_at(&self.dirs[CLAIMED], job, &self.path(CLAIMED, job))
            .map_err(|_| Error::Conflict(format!("job {job} is not claimed (recovered?)")))?;
        let ino = rustix::fs::fstat(&claim).map_err(errno("stat", self.path(CLAIMED, job)))?.st_ino;
        if ino != lease.claim {
            return Err(Error::Conflict(format!(
                "job {job} was recovered and claimed again; {worker} is fenced"
            )));
        }
        Ok(Claim { job: job.to_owned(), worker: worker.to_owned(), claim, lease_file: None })
    }

    fn read_lease(&self, job: &str) -> Result<Option<LeaseRecord>> {
        let p = self.path(LEASE, job).join("worker");
        let mut s = Vec::new();
        match File::open(&p) {
            // A lease record is a few dozen bytes; anything longer is not one.
            Ok(f) => match f.take(4096).read_to_end(&mut s) {
                Ok(_) => {}
                // Released between the open and the read, and this filesystem reaches files by
                // name (a FUSE mount whose opens send nothing, NFS): as good as no lease.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(Error::io("read", &p, e)),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::io("open", &p, e)),
        };
        // A lease torn by a crash while it was written (any bytes at all) is as good as none.
        Ok(serde_json::from_slice(&s).ok())
    }

    /// Reads a claimed job's request (at most [`REQUEST_MAX`] bytes: a request describes work,
    /// it does not carry its data).
    pub fn request(&self, c: &Claim) -> Result<Vec<u8>> {
        let fd = rustix::fs::openat(
            &c.claim,
            c.job.as_str(),
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(errno("open", self.path(CLAIMED, &c.job)))?;
        let mut v = Vec::new();
        File::from(fd)
            .take(REQUEST_MAX + 1)
            .read_to_end(&mut v)
            .map_err(|e| Error::io("read", self.path(CLAIMED, &c.job), e))?;
        if v.len() as u64 > REQUEST_MAX {
            return Err(Error::Invalid(format!(
                "{}: over {REQUEST_MAX} bytes",
                self.path(CLAIMED, &c.job).display()
            )));
        }
        Ok(v)
    }

    /// Finishes a claimed job with `result`, into `done/` or (with `failed`) `failed/`: the
    /// result lands first, then the request beside it (the commit).
    pub fn finish(&self, c: Claim, result: &[u8], failed: bool) -> Result<Finish> {
        let job = c.job.as_str();
        let shown = self.path(CLAIMED, job);
        let result_name = format!("{job}.result");
        // A result an earlier finish of this claim left (it stopped before its landing) is
        // this worker's own: this one takes its place.
        let _ = rustix::fs::unlinkat(&c.claim, result_name.as_str(), AtFlags::empty());
        let mut held = Vec::new();
        let mut mine = match self.result_in_claim(&c, result) {
            Ok((ino, f)) => {
                held.push(f);
                ino
            }
            // Recovery removed the (fenced) claim directory while the worker stalled, or (on a
            // filesystem that reaches a directory by its path: FUSE, NFS) moved it away.
            Err(Error::Io { source, .. }) if gone(&source) => return Ok(Finish::Fenced),
            Err(Error::Conflict(_)) => return Ok(Finish::Fenced),
            Err(e) => return Err(e),
        };
        let dest = if failed { FAILED } else { DONE };
        match self.land(&c, dest, result, &mut mine, &mut held)? {
            Landed::Mine => {}
            Landed::Fenced => return Ok(Finish::Fenced),
            // Committed by the job's next claim after this one was fenced: no conflict of this
            // worker's.
            Landed::Committed if !self.holds(&c) => return Ok(Finish::Fenced),
            Landed::Committed => {
                return Err(Error::Conflict(format!(
                    "{} already exists; never overwritten",
                    self.path(dest, job).display()
                )));
            }
        }
        self.sync_dir(dest)?;
        #[cfg(test)]
        {
            let hook = *self.after_land.lock().unwrap();
            if let Some(f) = hook {
                f(self);
            }
        }
        // The commit: only one rename of the request out of this claim directory can win.
        match self.move_new(&c.claim, job, &self.dirs[dest], job) {
            Ok(()) => {}
            Err(Errno::NOENT | Errno::STALE) => {
                // Recovery moved the request away since the result landed: that result was
                // never committed. Recovery removes it (it matches the claim's own link of it);
                // a worker that removed it by name could remove a later claim's by then.
                return Ok(Finish::Fenced);
            }
            // The job was committed by its next claim. A claim fenced since its landing (its
            // request still in the directory recovery renamed away, or, through a FUSE mount,
            // the kernel's cached entry of it) gets EEXIST before ENOENT: it is fenced, not in
            // conflict. Only a claim that still holds the job has a second commit refused.
            Err(Errno::EXIST) if !self.holds(&c) => return Ok(Finish::Fenced),
            Err(Errno::EXIST) => {
                return Err(Error::Conflict(format!(
                    "{} already exists; never overwritten",
                    self.path(dest, job).display()
                )));
            }
            Err(e) => return Err(Error::io("rename", self.path(dest, job), e.into())),
        }
        // Committed. A recovery that put the job back just before this claim took it, or a
        // claim fenced since that took this result for an unpaired one, may have removed it:
        // it lands again.
        let relinked = !self.is_mine(&self.dirs[dest], &result_name, mine)
            && rustix::fs::linkat(
                &c.claim,
                result_name.as_str(),
                &self.dirs[dest],
                result_name.as_str(),
                AtFlags::empty(),
            )
            .is_ok();
        if !relinked && !self.is_mine(&self.dirs[dest], &result_name, mine) {
            let tmp = format!(".{result_name}.tmp");
            let _ = rustix::fs::unlinkat(&c.claim, tmp.as_str(), AtFlags::empty());
            self.write_new(&c.claim, &tmp, result, &shown.join(&tmp))?;
            self.move_new(&c.claim, tmp.as_str(), &self.dirs[dest], result_name.as_str()).map_err(|e| {
                if e == Errno::EXIST {
                    Error::Conflict(format!(
                        "{}: another result is beside the request this claim committed",
                        self.path(dest, &result_name).display()
                    ))
                } else {
                    Error::io("rename", self.path(dest, &result_name), e.into())
                }
            })?;
        }
        self.sync_dir(dest)?;
        // The claim's own name of the result (a link) goes once the one beside is durable.
        let _ = rustix::fs::unlinkat(&c.claim, result_name.as_str(), AtFlags::empty());
        match self.fsync(&c.claim, &shown) {
            // Fenced since the commit: recovery syncs the claim it moved, and releases it.
            Err(Error::Io { source, .. }) if gone(&source) => return Ok(Finish::Committed),
            r => r?,
        }
        self.release(job, &c)?;
        Ok(Finish::Committed)
    }

    /// Writes `result` (synced) as `J.result` in the claim directory, without replacing; its
    /// inode.
    fn result_in_claim(&self, c: &Claim, result: &[u8]) -> Result<(u64, File)> {
        let shown = self.path(CLAIMED, &c.job);
        let name = format!("{}.result", c.job);
        let tmp = format!(".{name}.tmp");
        let _ = rustix::fs::unlinkat(&c.claim, tmp.as_str(), AtFlags::empty());
        let f = self.write_new(&c.claim, &tmp, result, &shown.join(&tmp))?;
        let ino = rustix::fs::fstat(&f).map_err(errno("stat", shown.join(&tmp)))?.st_ino;
        match self.move_new(&c.claim, tmp.as_str(), &c.claim, name.as_str()) {
            // Kept open by the finish: its inode number is not another file's while it compares.
            Ok(()) => Ok((ino, f)),
            Err(e) => Err(Error::io("rename", shown.join(&name), e.into())),
        }
    }

    /// Lands the result of claim `c` (inode `mine`, named `J.result` in the claim) as
    /// `J.result` in `dest`, never replacing, through the claim's name `claimed/J`: a claim
    /// fenced since (its directory renamed away by recovery) has no result under that name.
    /// By a hard link, so that the claim keeps its own name of the result until its commit is
    /// done: a result removed from beside the request meanwhile lands again from it, and a
    /// worker that dies after its commit leaves it for recovery to put beside the request.
    /// Where the filesystem has no hard links, by a rename. A result found there already is
    /// the job's committed one (its request is beside it), or one that was never committed (a
    /// worker fenced or killed between its landing and its commit): while this claim holds the
    /// job, the finish fails (a conflict) and leaves it to recovery.
    fn land(
        &self,
        c: &Claim,
        dest: usize,
        result: &[u8],
        mine: &mut u64,
        held: &mut Vec<File>,
    ) -> Result<Landed> {
        let job = c.job.as_str();
        let name = format!("{job}.result");
        let through = format!("{job}/{name}");
        for _ in 0..3 {
            if !self.holds(c) {
                let _ = rustix::fs::unlinkat(&c.claim, name.as_str(), AtFlags::empty());
                return Ok(Landed::Fenced);
            }
            if !self.is_mine(&c.claim, &name, *mine) {
                // Taken by a fenced claim's landing through this claim's name: written again.
                let (ino, f) = self.result_in_claim(c, result)?;
                *mine = ino;
                held.push(f);
            }
            let (claimed, to) = (&self.dirs[CLAIMED], &self.dirs[dest]);
            let mut landed = Err(Errno::PERM);
            if !self.no_links.load(Ordering::Relaxed) {
                landed = rustix::fs::linkat(claimed, through.as_str(), to, name.as_str(), AtFlags::empty());
                if matches!(landed, Err(Errno::PERM | Errno::OPNOTSUPP)) {
                    self.no_links.store(true, Ordering::Relaxed);
                }
            }
            if self.no_links.load(Ordering::Relaxed) {
                landed = self.move_new(claimed, through.as_str(), to, name.as_str());
            }
            match landed {
                Ok(()) if self.is_mine(to, &name, *mine) => return Ok(Landed::Mine),
                Ok(()) => {
                    // Another claim's result, through the name this claim had: this claim is
                    // fenced. A link of it is that claim's landing already; a rename goes back.
                    if self.no_links.load(Ordering::Relaxed) {
                        let _ = self.move_new(to, name.as_str(), claimed, through.as_str());
                    }
                    return Ok(Landed::Fenced);
                }
                Err(Errno::NOENT | Errno::STALE) => continue,
                Err(Errno::EXIST) => {
                    if self.is_mine(to, &name, *mine) {
                        return Ok(Landed::Mine);
                    }
                    if rustix::fs::statat(to, job, AtFlags::SYMLINK_NOFOLLOW).is_ok() {
                        return Ok(Landed::Committed);
                    }
                    // A result never committed, another worker's: never removed by a worker
                    // (a name a network filesystem's client still resolves could make any
                    // worker believe it holds the job). Recovery removes it once no claim of
                    // the job is left (`Queue::drop_uncommitted`); the job stays claimed here
                    // until its lease runs out.
                    let _ = rustix::fs::unlinkat(&c.claim, name.as_str(), AtFlags::empty());
                    return Err(Error::Conflict(format!(
                        "{}: a result without its request is in the way (a worker's that lost the job); \
                         recovery removes it",
                        self.path(dest, &name).display()
                    )));
                }
                Err(e) => return Err(Error::io("land", self.path(dest, &name), e.into())),
            }
        }
        Ok(Landed::Fenced)
    }

    /// Whether `name` in `dir` is the file `ino`.
    fn is_mine<Fd: AsFd>(&self, dir: Fd, name: &str, ino: u64) -> bool {
        rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).is_ok_and(|s| s.st_ino == ino)
    }

    /// Whether claim `c` still holds its job: its directory is `claimed/J` and the request is in it.
    fn holds(&self, c: &Claim) -> bool {
        let ours = rustix::fs::fstat(&c.claim).map(|s| s.st_ino);
        ours.is_ok_and(|ino| self.is_mine(&self.dirs[CLAIMED], &c.job, ino))
            && rustix::fs::statat(&c.claim, c.job.as_str(), AtFlags::SYMLINK_NOFOLLOW).is_ok()
    }

    /// Removes the lease and the (now empty) claim directory of a committed job.
    fn release(&self, job: &str, c: &Claim) -> Result<()> {
        let ino = match rustix::fs::fstat(&c.claim) {
            Ok(st) => st.st_ino,
            // Fenced meanwhile: recovery releases what is left.
            Err(Errno::NOENT | Errno::STALE) => return Ok(()),
            Err(e) => return Err(Error::io("stat", self.path(CLAIMED, job), e.into())),
        };
        if self.read_lease(job)?.is_some_and(|l| l.claim == ino && l.worker == c.worker) {
            let ldir = open_dir_at(&self.dirs[LEASE], job, &self.path(LEASE, job))?;
            let _ = rustix::fs::unlinkat(&ldir, "worker", AtFlags::empty());
            let _ = rustix::fs::unlinkat(&self.dirs[LEASE], job, AtFlags::REMOVEDIR);
            self.sync_dir(LEASE)?;
        }
        // Remove the claim directory only if it is still ours under its name.
        if rustix::fs::statat(&self.dirs[CLAIMED], job, AtFlags::SYMLINK_NOFOLLOW)
            .is_ok_and(|s| s.st_ino == ino)
        {
            let _ = rustix::fs::unlinkat(&self.dirs[CLAIMED], job, AtFlags::REMOVEDIR);
            self.sync_dir(CLAIMED)?;
        }
        Ok(())
    }

    /// Recovers unfinished claims whose lease has expired, and reconciles partial states.
    /// A claim that never got its lease is left alone and reported as incomplete
    /// ([`Queue::reconcile`] settles it).
    pub fn recover(&self, policy: Policy) -> Result<Recovered> {
        self.recover_with(policy, false)
    }

    /// Recovery that also settles the incomplete pairs recovery leaves alone: a claim whose
    /// claimer died before it made its lease, once the claim is older than the lease time, is
    /// fenced and settled by `policy` as an expired claim would be.
    pub fn reconcile(&self, policy: Policy) -> Result<Recovered> {
        self.recover_with(policy, true)
    }

    fn recover_with(&self, policy: Policy, reconcile: bool) -> Result<Recovered> {
        let mut r = Recovered::default();
        let claimed_dir = self.root.join(DIRS[CLAIMED]);
        let mut names: Vec<String> = fs::read_dir(&claimed_dir)
            .map_err(|e| Error::io("list", &claimed_dir, e))?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        for n in names {
            if let Some(rest) = n.strip_prefix(".fenced.") {
                // An earlier recovery stopped after fencing: finish its work.
                let job = rest.rsplit_once('.').map_or(rest, |(j, _)| j).to_owned();
                self.settle_fenced(&n, &job, policy, &mut r)?;
                continue;
            }
            if check_job_name(&n).is_err() {
                r.conflicts.push(format!("claimed/{n}: not a job; left alone"));
                continue;
            }
            let claim_path = claimed_dir.join(&n);
            let Ok(meta) = fs::symlink_metadata(&claim_path) else { continue };
            if !meta.is_dir() {
                r.conflicts.push(format!("claimed/{n}: not a claim directory; left alone"));
                continue;
            }
            let lease = self.read_lease(&n)?;
            let lease_path = self.path(LEASE, &n).join("worker");
            let locked = match File::open(&lease_path) {
                Ok(f) => match rustix::fs::flock(&f, FlockOperation::NonBlockingLockShared) {
                    Ok(()) => false,
                    Err(Errno::WOULDBLOCK) => true,
                    // Released since the open (a network filesystem says ESTALE): no lock.
                    Err(Errno::STALE | Errno::NOENT) => false,
                    Err(e) => return Err(Error::io("lock", &lease_path, e.into())),
                },
                Err(_) => false,
            };
            if locked {
                r.live.push(n);
                continue;
            }
            let leased = lease.as_ref().is_some_and(|l| l.claim == meta.ino());
            let age_from = if leased {
                lease_path.metadata().and_then(|m| m.modified()).ok()
            } else {
                // No lease (or one from an older claim): a partial pair, aged by the claim itself.
                meta.modified().ok()
            };
            let expired = age_from
                .and_then(|t| SystemTime::now().duration_since(t).ok())
                .is_some_and(|age| age >= self.lease);
            if !expired {
                r.live.push(n);
                continue;
            }
            if rustix::fs::statat(&self.dirs[CLAIMED], format!("{n}/{n}").as_str(), AtFlags::SYMLINK_NOFOLLOW)
                .is_err()
            {
                // Committed, but the worker died before releasing: finish the cleanup.
                self.reconcile_committed(&n, &mut r)?;
                continue;
            }
            if !leased && !reconcile {
                // A claim without its lease (its claimer died between the two): an incomplete
                // pair, settled only by an explicit reconciliation.
                r.incomplete.push(n);
                continue;
            }
            // Fence: rename the claim directory away before touching the request.
            let Some(fenced) = self.fence(&n)? else { continue };
            if !leased {
                r.reconciled.push(format!("{n}: claimed, never leased; settled as an expired claim"));
            }
            self.settle_fenced(&fenced, &n, policy, &mut r)?;
        }
        // Probe files of processes killed while they probed.
        let inbox = self.root.join(DIRS[INBOX]);
        for e in fs::read_dir(&inbox).map_err(|e| Error::io("list", &inbox, e))?.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            let old = e
                .metadata()
                .ok()
                .and_then(|m| m.modified().ok())
                .and_then(|t| SystemTime::now().duration_since(t).ok())
                .is_some_and(|a| a >= self.lease);
            if n.starts_with(".probe.") && old {
                let _ = rustix::fs::unlinkat(&self.dirs[INBOX], n.as_str(), AtFlags::empty());
            }
        }
        // Leases without a claim: the job committed or was recovered; drop them when unlocked.
        let lease_dir = self.root.join(DIRS[LEASE]);
        for e in fs::read_dir(&lease_dir).map_err(|e| Error::io("list", &lease_dir, e))?.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if rustix::fs::statat(&self.dirs[CLAIMED], n.as_str(), AtFlags::SYMLINK_NOFOLLOW).is_ok() {
                continue;
            }
            let lp = lease_dir.join(&n).join("worker");
            let locked = File::open(&lp).ok().is_some_and(|f| {
                rustix::fs::flock(&f, FlockOperation::NonBlockingLockShared) == Err(Errno::WOULDBLOCK)
            });
            let age = e
                .metadata()
                .ok()
                .and_then(|m| m.modified().ok())
                .and_then(|t| SystemTime::now().duration_since(t).ok());
            if locked || age.is_none_or(|a| a < self.lease) {
                continue;
            }
            // Gone meanwhile: its worker released it.
            let Ok(ldir) = open_dir_at(&self.dirs[LEASE], &n, &lease_dir.join(&n)) else { continue };
            let _ = rustix::fs::unlinkat(&ldir, "worker", AtFlags::empty());
            let _ = rustix::fs::unlinkat(&self.dirs[LEASE], n.as_str(), AtFlags::REMOVEDIR);
            self.sync_dir(LEASE)?;
            r.reconciled.push(format!("{n}: removed a stale lease"));
        }
        Ok(r)
    }

    /// Renames the claim directory of `job` away (the fence); `None` when it is gone already (its
    /// worker finished and released it since the listing: nothing to recover).
    fn fence(&self, job: &str) -> Result<Option<String>> {
        let fenced = format!(".fenced.{job}.{}", now_ms());
        match self.move_new(&self.dirs[CLAIMED], job, &self.dirs[CLAIMED], fenced.as_str()) {
            Ok(()) => {}
            Err(Errno::NOENT) => return Ok(None),
            Err(e) => return Err(Error::io("fence", self.path(CLAIMED, job), e.into())),
        }
        self.sync_dir(CLAIMED)?;
        Ok(Some(fenced))
    }

    /// A committed job whose claim directory and lease were left behind (or whose worker is
    /// releasing them right now: a directory gone meanwhile is no error).
    fn reconcile_committed(&self, job: &str, r: &mut Recovered) -> Result<()> {
        let claim = match open_dir_at(&self.dirs[CLAIMED], job, &self.path(CLAIMED, job)) {
            Ok(fd) => fd,
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        if let Some(d) = self.committed_to(job)
            && self.result_beside(&claim, job, d, r)? == Beside::Two
        {
            r.conflicts.push(format!("{job}: two results; the one in claimed/ is kept"));
            return Ok(());
        }
        // Remove leftovers: the temp result and the empty directory.
        let _ = rustix::fs::unlinkat(&claim, format!(".{job}.result.tmp").as_str(), AtFlags::empty());
        match rustix::fs::unlinkat(&self.dirs[CLAIMED], job, AtFlags::REMOVEDIR) {
            Ok(()) => {
                self.sync_dir(CLAIMED)?;
                if let Ok(ldir) = open_dir_at(&self.dirs[LEASE], job, &self.path(LEASE, job)) {
                    let _ = rustix::fs::unlinkat(&ldir, "worker", AtFlags::empty());
                    let _ = rustix::fs::unlinkat(&self.dirs[LEASE], job, AtFlags::REMOVEDIR);
                    self.sync_dir(LEASE)?;
                }
                r.reconciled.push(format!("{job}: removed the claim of a finished job"));
            }
            Err(_) => r.conflicts.push(format!("{job}: claim directory holds unexpected files; left alone")),
        }
        Ok(())
    }

    /// Moves the request out of a fenced claim directory per `policy`, then cleans up.
    fn settle_fenced(&self, fenced: &str, job: &str, policy: Policy, r: &mut Recovered) -> Result<()> {
        let fpath = self.path(CLAIMED, fenced);
        let fd = open_dir_at(&self.dirs[CLAIMED], fenced, &fpath)?;
        // The lease goes before the request leaves, so a new claim of the job can lease it.
        self.drop_lease(job)?;
        // A recovery that stopped while it failed the job left the request under its own name.
        let aside = format!(".{job}.recovering");
        if rustix::fs::statat(&fd, aside.as_str(), AtFlags::SYMLINK_NOFOLLOW).is_ok() {
            let _ = self.move_new(&fd, aside.as_str(), &fd, job);
        }
        let has_request = rustix::fs::statat(&fd, job, AtFlags::SYMLINK_NOFOLLOW).is_ok();
        if has_request {
            let terminal = [DONE, FAILED]
                .into_iter()
                .any(|d| rustix::fs::statat(&self.dirs[d], job, AtFlags::SYMLINK_NOFOLLOW).is_ok());
            // Whether pending/ holds the job too is decided by the requeue itself (EEXIST), never
            // by a lookup: a network filesystem's client may still show a request under the
            // name it was just claimed from (GlusterFS does), and the claim's copy is the job.
            let pending = policy == Policy::Fail
                && !self.without_noreplace()
                && rustix::fs::statat(&self.dirs[PENDING], job, AtFlags::SYMLINK_NOFOLLOW).is_ok();
            let stale = |r: &mut Recovered| -> Result<()> {
                // A move across directories that a crash left half durable: the copy in
                // pending/ or done/ (failed/) is the job; the claim's copy is stale.
                rustix::fs::unlinkat(&fd, job, AtFlags::empty()).map_err(errno("remove", fpath.join(job)))?;
                r.reconciled.push(format!("{job}: dropped a stale copy left in its claim"));
                Ok(())
            };
            if terminal || pending {
                stale(r)?;
            }
            // Whether the request this claim held now lives elsewhere by this recovery's doing
            // (requeued, failed, or its pending copy kept): then a result in the claim is an
            // uncommitted worker's, and a commit of the job found in done/ is another claim's.
            let mut moved_out = pending;
            match policy {
                _ if terminal || pending => {}
                Policy::Requeue => {
                    let mut requeued = self.requeue(&fd, job);
                    if requeued == Err(Errno::EXIST) && !self.listed_pending(job) {
                        // A name the filesystem resolves but does not list: a network
                        // filesystem's client can go on resolving the name a request was moved
                        // from to the request itself, under its new name (GlusterFS does, for
                        // as long as the file lives, which here is the claim's copy). Removing
                        // the name clears it (the volume has no such name: ENOENT); then the
                        // requeue can take it.
                        let _ = rustix::fs::unlinkat(&self.dirs[PENDING], job, AtFlags::empty());
                        requeued = self.requeue(&fd, job);
                    }
                    match requeued {
                        Ok(()) => {
                            r.requeued.push(job.to_owned());
                            moved_out = true;
                            #[cfg(test)]
                            if let Some(f) = *self.after_requeue.lock().unwrap() {
                                f(self);
                            }
                        }
                        // pending/ lists the job too, with the same request: it is the job, and
                        // the claim's copy is the stale one (a crash between a move's two names,
                        // or a power cut that kept one directory's change and not the other's).
                        Err(Errno::EXIST) if self.same_request(&fd, job) => {
                            stale(r)?;
                            moved_out = true;
                        }
                        // Anything else: the claim's copy may be the only one, so it is kept,
                        // and the next recovery tries again.
                        Err(Errno::EXIST) => {
                            r.deferred.push(format!("{job}: pending/ shows it too; claimed/{fenced} kept"));
                            return Ok(());
                        }
                        Err(Errno::NOENT) => {} // the stalled worker committed first
                        Err(e) => return Err(Error::io("requeue", self.path(PENDING, job), e.into())),
                    }
                    self.sync_dir(PENDING)?;
                }
                Policy::Fail => {
                    // First the request out of the worker's reach (a name only recovery uses):
                    // the stalled worker's commit then finds nothing, or has won already.
                    match self.move_new(&fd, job, &fd, aside.as_str()) {
                        Ok(()) => {}
                        Err(Errno::NOENT) => {} // the stalled worker committed first
                        Err(e) => return Err(Error::io("fence", fpath.join(job), e.into())),
                    }
                    if rustix::fs::statat(&fd, aside.as_str(), AtFlags::SYMLINK_NOFOLLOW).is_ok() {
                        // Its uncommitted landing goes, then the note lands, then the request.
                        self.drop_uncommitted(&fd, job, r)?;
                        let result = format!("{job}.result");
                        let note = br#"{"status":"error","error":"recovered after its lease expired"}"#;
                        let _ = rustix::fs::unlinkat(&fd, result.as_str(), AtFlags::empty());
                        self.write_new(&fd, &result, note, &fpath.join(&result))?;
                        match self.move_new(&fd, result.as_str(), &self.dirs[FAILED], result.as_str()) {
                            Ok(()) => {}
                            Err(Errno::EXIST) => {
                                let _ = self.move_new(&fd, aside.as_str(), &fd, job);
                                r.deferred.push(format!(
                                    "{job}: failed/ holds a result for it already; claimed/{fenced} kept"
                                ));
                                return Ok(());
                            }
                            Err(e) => return Err(Error::io("rename", self.path(FAILED, &result), e.into())),
                        }
                        self.sync_dir(FAILED)?;
                        self.move_new(&fd, aside.as_str(), &self.dirs[FAILED], job)
                            .map_err(errno("fail", self.path(FAILED, job)))?;
                        r.failed.push(job.to_owned());
                        moved_out = true;
                        self.sync_dir(FAILED)?;
                    }
                }
            }
            self.fsync(&fd, &fpath)?;
            if moved_out {
                self.drop_uncommitted(&fd, job, r)?;
                self.clear_fenced(fenced, &fd, job, r)?;
                return Ok(());
            }
        }
        // A worker that committed between recovery's look and its fence still holds its result
        // here (it moves it through its descriptor of this directory): it goes beside the
        // request, never away with the leftovers.
        if let Some(d) = self.committed_to(job)
            && self.result_beside(&fd, job, d, r)? == Beside::Two
        {
            if has_request {
                // A second run of a job committed already (from a copy): kept for a person.
                r.conflicts.push(format!("{job}: two results; the one in claimed/ is kept"));
                return Ok(());
            }
            // The commit's own result is beside its request (a result lands before its
            // request moves); this one is a worker's that lost its claim before its landing.
            let result = format!("{job}.result");
            rustix::fs::unlinkat(&fd, result.as_str(), AtFlags::empty())
                .map_err(errno("remove", fpath.join(&result)))?;
            r.reconciled.push(format!("{job}: dropped a result its fenced claim held, never committed"));
        }
        self.clear_fenced(fenced, &fd, job, r)
    }

    /// Empties what is left of the fenced claim `fenced` (a stalled worker's uncommitted result)
    /// and removes it.
    fn clear_fenced(&self, fenced: &str, fd: &OwnedFd, job: &str, r: &mut Recovered) -> Result<()> {
        let fpath = self.path(CLAIMED, fenced);
        if let Ok(entries) = fs::read_dir(&fpath) {
            for e in entries.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if n.starts_with('.') && n.ends_with(".tmp")
                    || n == format!("{job}.result")
                    || n.starts_with(".uncommitted.")
                {
                    let _ = rustix::fs::unlinkat(fd, n.as_str(), AtFlags::empty());
                }
            }
        }
        match rustix::fs::unlinkat(&self.dirs[CLAIMED], fenced, AtFlags::REMOVEDIR) {
            Ok(()) => self.sync_dir(CLAIMED)?,
            Err(_) => r.conflicts.push(format!("claimed/{fenced}: not empty; left for inspection")),
        }
        Ok(())
    }

    /// Removes a result of `job` that landed and was never committed (its request is not
    /// beside it), when it is the fenced claim's own (recovery has just put the request
    /// elsewhere: the run will be made again) or no claim of the job is left.
    fn drop_uncommitted(&self, fenced: &OwnedFd, job: &str, r: &mut Recovered) -> Result<()> {
        let result = format!("{job}.result");
        // Whose it is: this fenced claim's own landing (a link of the result it still holds),
        // or, once no claim of the job is left, nobody's that could still commit.
        let unclaimed = rustix::fs::statat(&self.dirs[CLAIMED], job, AtFlags::SYMLINK_NOFOLLOW).is_err();
        for d in [DONE, FAILED] {
            let ours = unclaimed || self.same_file(fenced, &self.dirs[d], &result);
            if !ours || rustix::fs::statat(&self.dirs[d], job, AtFlags::SYMLINK_NOFOLLOW).is_ok() {
                continue;
            }
            // Taken into the fenced claim first, then looked at again: a claim that committed
            // meanwhile gets it back; never removed by name after a look.
            let aside = format!(".uncommitted.{result}.{}", DIRS[d]);
            let _ = rustix::fs::unlinkat(fenced, aside.as_str(), AtFlags::empty());
            if self.move_new(&self.dirs[d], result.as_str(), fenced, aside.as_str()).is_err() {
                continue;
            }
            if rustix::fs::statat(&self.dirs[d], job, AtFlags::SYMLINK_NOFOLLOW).is_ok() {
                match self.move_new(fenced, aside.as_str(), &self.dirs[d], result.as_str()) {
                    // The committer lands its own again when this was not it (it keeps a name of
                    // it until its commit is done); either way the job has its result.
                    Ok(()) => {}
                    Err(Errno::EXIST) => {
                        let _ = rustix::fs::unlinkat(fenced, aside.as_str(), AtFlags::empty());
                    }
                    Err(e) => return Err(Error::io("rename", self.path(d, &result), e.into())),
                }
                self.sync_dir(d)?;
                continue;
            }
            let _ = rustix::fs::unlinkat(fenced, aside.as_str(), AtFlags::empty());
            self.sync_dir(d)?;
            r.reconciled.push(format!("{job}: removed a result that was never committed from {}/", DIRS[d]));
        }
        Ok(())
    }

    /// `done/` or `failed/`, whichever holds the request `job`: it was committed.
    fn committed_to(&self, job: &str) -> Option<usize> {
        [DONE, FAILED]
            .into_iter()
            .find(|&d| rustix::fs::statat(&self.dirs[d], job, AtFlags::SYMLINK_NOFOLLOW).is_ok())
    }

    /// Moves the result of committed `job` out of the claim directory `claim` (live or fenced)
    /// beside its request in `dest`, never replacing one already there.
    fn result_beside(&self, claim: &OwnedFd, job: &str, dest: usize, r: &mut Recovered) -> Result<Beside> {
        let result = format!("{job}.result");
        let mut moved = self.move_new(claim, result.as_str(), &self.dirs[dest], result.as_str());
        if moved == Err(Errno::EXIST) && !lists(&self.dirs[dest], &result) {
            // A name the client resolves that the volume does not have (without NOREPLACE a
            // move looks first): cleared (the volume answers ENOENT), then the move again.
            let _ = rustix::fs::unlinkat(&self.dirs[dest], result.as_str(), AtFlags::empty());
            moved = self.move_new(claim, result.as_str(), &self.dirs[dest], result.as_str());
        }
        match moved {
            Ok(()) => {
                self.sync_dir(dest)?;
                self.fsync(claim, &self.path(CLAIMED, job))?;
                r.reconciled.push(format!("{job}: moved its result beside the request in {}/", DIRS[dest]));
                Ok(Beside::Moved)
            }
            Err(Errno::NOENT) => Ok(Beside::Absent),
            // A result the claim only seems to hold: the one beside the request under a name it
            // was moved from (a network filesystem's client can resolve a moved file under its
            // old name, GlusterFS for as long as the file lives), or a name the claim does not
            // list. The job has its result.
            Err(Errno::EXIST)
                if self.same_file(claim, &self.dirs[dest], &result) || !lists(claim, &result) =>
            {
                // The claim's name goes (a second link its worker had not removed yet; for a
                // name the claim does not list, the volume answers ENOENT).
                let _ = rustix::fs::unlinkat(claim, result.as_str(), AtFlags::empty());
                Ok(Beside::Absent)
            }
            // Two results: the caller says what becomes of the claim's.
            Err(Errno::EXIST) => Ok(Beside::Two),
            Err(e) => Err(Error::io("rename", self.path(dest, &result), e.into())),
        }
    }

    /// Whether `name` in `a` and `name` in `b` are one file.
    fn same_file(&self, a: &OwnedFd, b: &OwnedFd, name: &str) -> bool {
        let id = |d: &OwnedFd| {
            rustix::fs::statat(d, name, AtFlags::SYMLINK_NOFOLLOW).ok().map(|s| (s.st_dev, s.st_ino))
        };
        id(a).is_some_and(|x| Some(x) == id(b))
    }

    /// Removes `lease/J` (the fenced worker's lease) so that a new claim can lease the job.
    fn drop_lease(&self, job: &str) -> Result<()> {
        if let Ok(ldir) = open_dir_at(&self.dirs[LEASE], job, &self.path(LEASE, job)) {
            let _ = rustix::fs::unlinkat(&ldir, "worker", AtFlags::empty());
            let _ = rustix::fs::unlinkat(&self.dirs[LEASE], job, AtFlags::REMOVEDIR);
            self.sync_dir(LEASE)?;
        }
        Ok(())
    }
}

impl Claim {
    /// True when this claim holds its lease lock.
    pub fn holds_lock(&self) -> bool {
        self.lease_file.is_some()
    }
}

/// Where [`Queue::land`] put a claim's result.
#[derive(Debug, PartialEq, Eq)]
enum Landed {
    /// Beside where the request goes.
    Mine,
    /// Nowhere: the claim was fenced.
    Fenced,
    /// Nowhere: the job is committed already.
    Committed,
}

/// What [`Queue::result_beside`] did.
#[derive(Debug, PartialEq, Eq)]
enum Beside {
    Moved,
    /// No result in the claim: its worker moved it, or never wrote it.
    Absent,
    /// A result is beside the request already: the claim's is left for inspection.
    Two,
}

/// Whether the directory `dir` lists `name`: a listing, which a network filesystem's client
/// answers from the volume, not a lookup, which it may answer from a name it still remembers.
/// When the listing fails, as if it did (nothing is dropped on a guess).
fn lists(dir: &OwnedFd, name: &str) -> bool {
    let Ok(entries) = rustix::fs::Dir::read_from(dir) else { return true };
    let mut failed = false;
    let found = entries
        .filter_map(|e| e.map_err(|_| failed = true).ok())
        .any(|e| e.file_name().to_bytes() == name.as_bytes());
    found || failed
}

/// The claim directory is gone from under its worker: removed (`ENOENT`), or moved away on a
/// filesystem that reaches a directory by its path (`ESTALE`).
fn gone(e: &std::io::Error) -> bool {
    matches!(Errno::from_io_error(e), Some(Errno::NOENT | Errno::STALE))
}

fn e_path(dir: &Path, n: &str) -> PathBuf {
    dir.join(n)
}

#[cfg(test)]
mod tests {
    /// The lease record's format, field for field: leases written by one version are read by
    /// the next (other hosts may run another).
    #[test]
    fn golden_lease_record_of_version_1() {
        let golden = include_str!("../fixtures/lease-v1.json");
        let rec: super::LeaseRecord = serde_json::from_str(golden).unwrap();
        assert_eq!(
            (rec.worker.as_str(), rec.pid, rec.claim, rec.at_ms),
            ("w1", 4242, 123_456_789, 1_796_160_000_000)
        );
        assert_eq!(serde_json::to_string(&rec).unwrap(), golden);
    }

    use super::*;

    fn q(lease: Duration) -> (tempfile::TempDir, Queue) {
        let d = tempfile::tempdir().unwrap();
        let q = Queue::open(d.path().join("queue"), lease).unwrap();
        (d, q)
    }

    #[test]
    fn full_cycle_and_its_fsyncs() {
        let (_d, q) = q(DEFAULT_LEASE);
        let s0 = q.syncs();
        q.publish("a.req.json", b"{\"n\":1}").unwrap();
        assert_eq!(q.syncs() - s0, 3, "publish: temp file, pending/, inbox/");
        let s1 = q.syncs();
        let c = q.claim("w1", false).unwrap().unwrap();
        assert_eq!(q.syncs() - s1, 6, "claim: claimed/, claim dir, pending/; lease: file, lease/J, lease/");
        assert_eq!(q.request(&c).unwrap(), b"{\"n\":1}");
        let s2 = q.syncs();
        assert_eq!(q.finish(c, b"{\"ok\":true}", false).unwrap(), Finish::Committed);
        assert_eq!(
            q.syncs() - s2,
            6,
            "finish: result file, done/ (the result), done/ (the request), claim dir; release: lease/, claimed/"
        );
        let root = q.root().to_path_buf();
        assert_eq!(fs::read(root.join("done/a.req.json")).unwrap(), b"{\"n\":1}");
        assert_eq!(fs::read(root.join("done/a.req.json.result")).unwrap(), b"{\"ok\":true}");
        for d in ["inbox", "pending", "lease", "claimed"] {
            assert_eq!(fs::read_dir(root.join(d)).unwrap().count(), 0, "{d} empty");
        }
        assert!(q.claim("w1", false).unwrap().is_none());
        let l = q.list().unwrap();
        assert_eq!(l.done, ["a.req.json"]);
        assert!(matches!(q.publish("a.req.json", b"{}"), Err(Error::Conflict(_))));
    }

    #[test]
    fn illegal_entries_are_not_jobs() {
        let (_d, q) = q(DEFAULT_LEASE);
        let root = q.root().to_path_buf();
        fs::write(root.join("pending/notes.txt"), b"x").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", root.join("pending/evil.req.json")).unwrap();
        fs::create_dir(root.join("pending/dir.req.json")).unwrap();
        fs::write(root.join("pending/.hidden.req.json"), b"x").unwrap();
        let l = q.list().unwrap();
        assert!(l.pending.is_empty());
        assert_eq!(l.problems.len(), 4, "{:?}", l.problems);
        assert!(q.claim("w", false).unwrap().is_none());
        assert!(matches!(q.publish("../x.req.json", b"{}"), Err(Error::Invalid(_))));
        assert!(matches!(q.publish("x.json", b"{}"), Err(Error::Invalid(_))));
    }

    #[test]
    fn stalled_worker_is_fenced_after_recovery() {
        let (_d, q) = q(Duration::ZERO);
        q.publish("j.req.json", b"{}").unwrap();
        let stalled = q.claim("w1", false).unwrap().unwrap();
        let r = q.recover(Policy::Requeue).unwrap();
        assert_eq!(r.requeued, ["j.req.json"]);
        let fresh = q.claim("w2", false).unwrap().unwrap();
        // The stalled worker wakes and tries to commit: fenced.
        assert_eq!(q.finish(stalled, b"{\"stale\":1}", false).unwrap(), Finish::Fenced);
        assert_eq!(q.finish(fresh, b"{\"fresh\":1}", false).unwrap(), Finish::Committed);
        let root = q.root().to_path_buf();
        assert_eq!(fs::read(root.join("done/j.req.json.result")).unwrap(), b"{\"fresh\":1}");
        let left: Vec<_> =
            fs::read_dir(root.join("claimed")).unwrap().flatten().map(|e| e.file_name()).collect();
        assert!(left.len() <= 1, "at most the stalled worker's fenced directory: {left:?}");
        q.recover(Policy::Requeue).unwrap();
    }

    #[test]
    fn locked_lease_is_never_recovered() {
        let (_d, q) = q(Duration::ZERO);
        q.publish("j.req.json", b"{}").unwrap();
        let c = q.claim("w1", true).unwrap().unwrap();
        assert!(c.holds_lock());
        let r = q.recover(Policy::Requeue).unwrap();
        assert_eq!(r.live, ["j.req.json"]);
        assert!(r.requeued.is_empty());
        assert_eq!(q.finish(c, b"{}", false).unwrap(), Finish::Committed);
    }

    #[test]
    fn unexpired_lease_is_left_alone_and_fail_policy() {
        let (_d, q) = q(Duration::from_secs(3600));
        q.publish("j.req.json", b"{}").unwrap();
        let _c = q.claim("w1", false).unwrap().unwrap();
        assert_eq!(q.recover(Policy::Requeue).unwrap().live, ["j.req.json"]);
        let q2 = Queue::open(q.root(), Duration::ZERO).unwrap();
        let r = q2.recover(Policy::Fail).unwrap();
        assert_eq!(r.failed, ["j.req.json"]);
        assert!(q.root().join("failed/j.req.json.result").exists());
    }

    #[test]
    fn resume_checks_the_lease() {
        let (_d, q) = q(Duration::ZERO);
        q.publish("j.req.json", b"{}").unwrap();
        drop(q.claim("w1", false).unwrap().unwrap());
        assert!(matches!(q.resume("j.req.json", "w2"), Err(Error::Conflict(_))));
        let c = q.resume("j.req.json", "w1").unwrap();
        q.recover(Policy::Requeue).unwrap();
        let _c2 = q.claim("w2", false).unwrap().unwrap();
        assert!(matches!(q.resume("j.req.json", "w1"), Err(Error::Conflict(_))), "fenced by identity");
        assert_eq!(q.finish(c, b"{}", false).unwrap(), Finish::Fenced, "fenced by its descriptor");
    }

    /// Commit once, whatever copies a crash left: a job already in `done/` whose request is
    /// back in `pending/` (a move by link and unlink stopped between the two, then requeued)
    /// is run again by the next worker, whose commit is refused and never replaces the first
    /// one's request or result.
    #[test]
    fn a_second_commit_of_one_job_never_replaces_the_first() {
        let (_d, q) = q(Duration::from_secs(60));
        let root = q.root().to_path_buf();
        q.publish("j.req.json", b"{\"first\":1}").unwrap();
        let a = q.claim("a", false).unwrap().unwrap();
        assert_eq!(q.finish(a, b"A's result", false).unwrap(), Finish::Committed);
        // The copy a crash left, back in pending/.
        fs::write(root.join("pending/j.req.json"), b"{\"copy\":1}").unwrap();
        let b = q.claim("b", false).unwrap().unwrap();
        let second = q.finish(b, b"B's result", false);
        assert!(matches!(second, Err(Error::Conflict(_))), "{second:?}");
        assert_eq!(fs::read(root.join("done/j.req.json")).unwrap(), b"{\"first\":1}");
        assert_eq!(fs::read(root.join("done/j.req.json.result")).unwrap(), b"A's result");
    }

    #[test]
    fn committed_but_unreleased_is_reconciled() {
        let (_d, q) = q(Duration::ZERO);
        q.publish("j.req.json", b"{}").unwrap();
        let c = q.claim("w1", false).unwrap().unwrap();
        // Simulate a crash right after the commit rename: result still in the claim dir.
        let root = q.root().to_path_buf();
        fs::write(root.join("claimed/j.req.json/j.req.json.result"), b"{\"r\":1}").unwrap();
        fs::rename(root.join("claimed/j.req.json/j.req.json"), root.join("done/j.req.json")).unwrap();
        drop(c);
        let r = q.recover(Policy::Requeue).unwrap();
        assert!(r.requeued.is_empty());
        assert_eq!(fs::read(root.join("done/j.req.json.result")).unwrap(), b"{\"r\":1}");
        for d in ["lease", "claimed", "pending"] {
            assert_eq!(fs::read_dir(root.join(d)).unwrap().count(), 0, "{d} empty");
        }
    }

    /// Seen in a race under load: recovery looked at `claimed/J/J`, a worker whose lease had run
    /// out committed, and then recovery fenced the claim and threw the worker's result (still in
    /// the claim directory, moved there next through the worker's descriptor) away with the
    /// leftovers: `done/J` without its result.
    #[test]
    fn a_commit_between_recoverys_look_and_its_fence_keeps_its_result() {
        let (_d, q) = q(Duration::ZERO);
        q.publish("j.req.json", b"{}").unwrap();
        let c = q.claim("w1", false).unwrap().unwrap();
        let root = q.root().to_path_buf();
        // The worker's commit, stopped after its request moved: the result is in the claim.
        fs::write(root.join("claimed/j.req.json/j.req.json.result"), b"{\"r\":1}").unwrap();
        fs::rename(root.join("claimed/j.req.json/j.req.json"), root.join("done/j.req.json")).unwrap();
        // Recovery had looked before that commit: it fences and settles.
        let fenced = q.fence("j.req.json").unwrap().unwrap();
        let mut r = Recovered::default();
        q.settle_fenced(&fenced, "j.req.json", Policy::Requeue, &mut r).unwrap();
        assert_eq!(fs::read(root.join("done/j.req.json.result")).unwrap(), b"{\"r\":1}", "{r:?}");
        // The worker goes on with its commit: its result is where it belongs already.
        drop(c);
        assert!(q.recover(Policy::Requeue).unwrap().conflicts.is_empty());
        for d in ["lease", "claimed", "pending"] {
            assert_eq!(fs::read_dir(root.join(d)).unwrap().count(), 0, "{d} empty");
        }
    }

    /// Seen in the race through `/ctx`: a worker wrote its result and stalled; recovery requeued
    /// the job, another worker claimed and committed it at once, and recovery, finding `done/J`,
    /// took the stalled worker's result for the commit's: "two results" on every later recovery.
    #[test]
    fn a_result_left_by_a_requeued_claim_is_never_taken_for_another_claims_commit() {
        let (_d, q) = q(Duration::ZERO);
        q.publish("j.req.json", b"{}").unwrap();
        let stalled = q.claim("w1", false).unwrap().unwrap();
        let root = q.root().to_path_buf();
        fs::write(root.join("claimed/j.req.json/j.req.json.result"), b"{\"stale\":1}").unwrap();
        *q.after_requeue.lock().unwrap() = Some(|q| {
            let fresh = q.claim("w2", false).unwrap().unwrap();
            assert_eq!(q.finish(fresh, b"{\"fresh\":1}", false).unwrap(), Finish::Committed);
        });
        let r = q.recover(Policy::Requeue).unwrap();
        assert_eq!(r.requeued, ["j.req.json"]);
        assert!(r.conflicts.is_empty(), "{r:?}");
        *q.after_requeue.lock().unwrap() = None;
        assert_eq!(fs::read(root.join("done/j.req.json.result")).unwrap(), b"{\"fresh\":1}");
        assert_eq!(q.finish(stalled, b"{\"stale\":2}", false).unwrap(), Finish::Fenced);
        assert!(q.recover(Policy::Requeue).unwrap().conflicts.is_empty());
        for d in ["lease", "claimed", "pending"] {
            assert_eq!(fs::read_dir(root.join(d)).unwrap().count(), 0, "{d} empty");
        }
    }

    /// Seen in the race of two daemons on GlusterFS: a committed job's claim still showed its
    /// result under the name it had been moved from (the client resolves a moved file by its
    /// old name), and recovery reported "two results" for one. A result the claim shows that is
    /// the file beside the request, or that the claim does not list, is no second result.
    #[test]
    fn a_result_the_claim_only_seems_to_hold_is_no_second_result() {
        let (_d, q) = q(Duration::ZERO);
        let root = q.root().to_path_buf();
        fs::create_dir(root.join("claimed/j.req.json")).unwrap();
        fs::write(root.join("done/j.req.json"), b"{}").unwrap();
        fs::write(root.join("done/j.req.json.result"), b"{\"r\":1}").unwrap();
        // The old name, standing for the moved file: here a second link to it.
        fs::hard_link(root.join("done/j.req.json.result"), root.join("claimed/j.req.json/j.req.json.result"))
            .unwrap();
        let claim = open_dir_at(&q.dirs[CLAIMED], "j.req.json", &root.join("claimed/j.req.json")).unwrap();
        let mut r = Recovered::default();
        assert_eq!(q.result_beside(&claim, "j.req.json", DONE, &mut r).unwrap(), Beside::Absent);
        assert!(r.conflicts.is_empty(), "{r:?}");
        assert!(!root.join("claimed/j.req.json/j.req.json.result").exists(), "the second name goes");
        // A different file there is a second result, kept for a person.
        fs::write(root.join("claimed/j.req.json/j.req.json.result"), b"{\"r\":2}").unwrap();
        assert_eq!(q.result_beside(&claim, "j.req.json", DONE, &mut r).unwrap(), Beside::Two);
        assert_eq!(fs::read(root.join("done/j.req.json.result")).unwrap(), b"{\"r\":1}");
    }

    /// The spec's finish order: the result is in `done/` before the request moves beside it,
    /// and a reader of `done/` never takes a result without its request for a finished job.
    #[test]
    fn the_result_lands_before_its_request() {
        let (_d, q) = q(DEFAULT_LEASE);
        q.publish("j.req.json", b"{}").unwrap();
        let c = q.claim("w1", false).unwrap().unwrap();
        *q.after_land.lock().unwrap() = Some(|q| {
            let done = q.root().join("done");
            assert_eq!(fs::read(done.join("j.req.json.result")).unwrap(), b"{\"r\":1}", "the result first");
            assert!(!done.join("j.req.json").exists(), "then the request");
            assert!(q.list().unwrap().done.is_empty(), "a result alone is no finished job");
        });
        assert_eq!(q.finish(c, b"{\"r\":1}", false).unwrap(), Finish::Committed);
        *q.after_land.lock().unwrap() = None;
        assert_eq!(q.list().unwrap().done, ["j.req.json"]);
        let claim_left = fs::read_dir(q.root().join("claimed")).unwrap().count();
        assert_eq!(claim_left, 0, "the claim's own name of the result goes with the claim");
    }

    /// A worker killed between its result's landing and its commit: the result, never
    /// committed, is removed when recovery requeues the job, and the next run's result lands.
    #[test]
    fn a_result_that_landed_without_its_commit_is_removed_when_the_job_is_requeued() {
        let (_d, q) = q(Duration::ZERO);
        let root = q.root().to_path_buf();
        q.publish("j.req.json", b"{}").unwrap();
        let c = q.claim("w1", false).unwrap().unwrap();
        fs::write(root.join("claimed/j.req.json/j.req.json.result"), b"{\"dead\":1}").unwrap();
        fs::hard_link(root.join("claimed/j.req.json/j.req.json.result"), root.join("done/j.req.json.result"))
            .unwrap();
        drop(c);
        let r = q.recover(Policy::Requeue).unwrap();
        assert_eq!(r.requeued, ["j.req.json"], "{r:?}");
        assert!(r.reconciled.iter().any(|l| l.contains("never committed")), "{r:?}");
        assert!(!root.join("done/j.req.json.result").exists());
        let c = q.claim("w2", false).unwrap().unwrap();
        assert_eq!(q.finish(c, b"{\"live\":1}", false).unwrap(), Finish::Committed);
        assert_eq!(fs::read(root.join("done/j.req.json.result")).unwrap(), b"{\"live\":1}");
        assert_eq!(q.recover(Policy::Requeue).unwrap(), Recovered::default());
    }

    /// A result without its request in the way of the claim that holds the job (left by a
    /// worker fenced or killed before its commit) is no commit, and no worker removes it (a
    /// name a network filesystem's client still resolves could make any worker think it holds
    /// the job): the finish fails, and recovery, once no claim of the job is left, removes it.
    #[test]
    fn an_unpaired_result_is_no_commit_and_only_recovery_removes_it() {
        let (_d, q) = q(Duration::ZERO);
        let root = q.root().to_path_buf();
        q.publish("j.req.json", b"{}").unwrap();
        fs::write(root.join("done/j.req.json.result"), b"{\"stale\":1}").unwrap();
        let c = q.claim("w1", false).unwrap().unwrap();
        assert!(matches!(q.finish(c, b"{\"live\":1}", false), Err(Error::Conflict(_))));
        assert_eq!(fs::read(root.join("done/j.req.json.result")).unwrap(), b"{\"stale\":1}", "left alone");
        let r = q.recover(Policy::Requeue).unwrap();
        assert_eq!(r.requeued, ["j.req.json"], "{r:?}");
        assert!(!root.join("done/j.req.json.result").exists(), "removed once no claim is left: {r:?}");
        let c = q.claim("w2", false).unwrap().unwrap();
        assert_eq!(q.finish(c, b"{\"live\":1}", false).unwrap(), Finish::Committed);
        assert_eq!(fs::read(root.join("done/j.req.json.result")).unwrap(), b"{\"live\":1}");
    }

    /// A worker killed after its commit, before the claim's own name of its result went: the
    /// result is beside the request, and recovery removes the claim without a conflict; if the
    /// one beside had gone, recovery puts the claim's beside the request.
    #[test]
    fn a_worker_killed_after_its_commit_leaves_its_result_where_recovery_finds_it() {
        let (_d, q) = q(Duration::ZERO);
        let root = q.root().to_path_buf();
        q.publish("j.req.json", b"{}").unwrap();
        let c = q.claim("w1", false).unwrap().unwrap();
        // As a commit leaves it before its last step: both names of the result, the request moved.
        fs::write(root.join("claimed/j.req.json/j.req.json.result"), b"{\"r\":1}").unwrap();
        fs::hard_link(root.join("claimed/j.req.json/j.req.json.result"), root.join("done/j.req.json.result"))
            .unwrap();
        fs::rename(root.join("claimed/j.req.json/j.req.json"), root.join("done/j.req.json")).unwrap();
        drop(c);
        let r = q.recover(Policy::Requeue).unwrap();
        assert!(r.conflicts.is_empty() && r.requeued.is_empty(), "{r:?}");
        assert_eq!(fs::read(root.join("done/j.req.json.result")).unwrap(), b"{\"r\":1}");
        assert_eq!(fs::read_dir(root.join("claimed")).unwrap().count(), 0);
    }

    /// A worker fenced after its result landed (recovery requeued the job meanwhile and the job's
    /// next claim committed) never leaves its result in the place of the committed one.
    #[test]
    fn a_worker_fenced_after_its_landing_leaves_the_next_claims_commit_alone() {
        let (_d, q) = q(Duration::ZERO);
        let root = q.root().to_path_buf();
        q.publish("j.req.json", b"{}").unwrap();
        let stalled = q.claim("w1", false).unwrap().unwrap();
        *q.after_land.lock().unwrap() = Some(|q| {
            *q.after_land.lock().unwrap() = None;
            let r = q.recover(Policy::Requeue).unwrap();
            assert_eq!(r.requeued, ["j.req.json"], "{r:?}");
            let fresh = q.claim("w2", false).unwrap().unwrap();
            assert_eq!(q.finish(fresh, b"{\"fresh\":1}", false).unwrap(), Finish::Committed);
        });
        assert_eq!(q.finish(stalled, b"{\"stale\":1}", false).unwrap(), Finish::Fenced);
        assert_eq!(fs::read(root.join("done/j.req.json.result")).unwrap(), b"{\"fresh\":1}");
        assert_eq!(fs::read_dir(root.join("claimed")).unwrap().count(), 0);
        assert_eq!(q.recover(Policy::Requeue).unwrap(), Recovered::default());
    }

    /// A worker fenced after its landing whose commit finds the job committed by another claim
    /// (the rename answers EEXIST: its request is still in the directory recovery renamed away,
    /// as through a FUSE mount whose kernel still has the entry cached) is fenced, not in
    /// conflict: a second commit is refused as a conflict only to a claim that holds the job.
    #[test]
    fn a_fenced_claim_whose_commit_finds_the_job_committed_is_fenced_not_a_conflict() {
        let (_d, q) = q(DEFAULT_LEASE);
        let root = q.root().to_path_buf();
        q.publish("j.req.json", b"{}").unwrap();
        let stalled = q.claim("w1", false).unwrap().unwrap();
        *q.after_land.lock().unwrap() = Some(|q| {
            *q.after_land.lock().unwrap() = None;
            let root = q.root();
            // Fenced by a recovery that has not settled the claim yet; the job committed since.
            fs::rename(root.join("claimed/j.req.json"), root.join("claimed/.fenced.j.req.json.1")).unwrap();
            fs::remove_file(root.join("done/j.req.json.result")).unwrap();
            fs::write(root.join("done/j.req.json.result"), b"{\"next\":1}").unwrap();
            fs::write(root.join("done/j.req.json"), b"{}").unwrap();
        });
        assert_eq!(q.finish(stalled, b"{\"stale\":1}", false).unwrap(), Finish::Fenced);
        assert_eq!(fs::read(root.join("done/j.req.json.result")).unwrap(), b"{\"next\":1}");
        assert!(root.join("claimed/.fenced.j.req.json.1/j.req.json").exists(), "left to recovery");
    }

    /// A claim whose claimer died before it leased the job is an incomplete pair: recovery
    /// reports it and never moves it; an explicit reconciliation settles it.
    #[test]
    fn a_claim_without_its_lease_is_settled_only_by_an_explicit_reconciliation() {
        let (_d, q) = q(Duration::ZERO);
        let root = q.root().to_path_buf();
        q.publish("j.req.json", b"{}").unwrap();
        fs::create_dir(root.join("claimed/j.req.json")).unwrap();
        fs::rename(root.join("pending/j.req.json"), root.join("claimed/j.req.json/j.req.json")).unwrap();
        let r = q.recover(Policy::Requeue).unwrap();
        assert_eq!(r.incomplete, ["j.req.json"], "{r:?}");
        assert!(r.requeued.is_empty() && r.reconciled.is_empty(), "{r:?}");
        assert!(root.join("claimed/j.req.json/j.req.json").exists(), "left as it was");
        let r = q.reconcile(Policy::Requeue).unwrap();
        assert_eq!(r.requeued, ["j.req.json"], "{r:?}");
        assert!(r.reconciled.iter().any(|l| l.contains("never leased")), "{r:?}");
        assert_eq!(q.list().unwrap().pending, ["j.req.json"]);
    }

    /// Where the filesystem refuses `RENAME_NOREPLACE` (GlusterFS), every step still never
    /// replaces: publish by link, moves by a checked rename.
    #[test]
    fn without_noreplace_nothing_is_replaced() {
        let (_d, q) = q(Duration::ZERO);
        q.plain.store(true, Ordering::Relaxed);
        q.publish("j.req.json", b"{}").unwrap();
        assert!(matches!(q.publish("j.req.json", b"{}"), Err(Error::Conflict(_))));
        let root = q.root().to_path_buf();
        assert_eq!(fs::read_dir(root.join("inbox")).unwrap().count(), 0, "the temp name is gone");
        let stalled = q.claim("w1", false).unwrap().unwrap();
        assert_eq!(q.recover(Policy::Requeue).unwrap().requeued, ["j.req.json"]);
        let fresh = q.claim("w2", false).unwrap().unwrap();
        assert_eq!(q.finish(stalled, b"{\"stale\":1}", false).unwrap(), Finish::Fenced);
        assert_eq!(q.finish(fresh, b"{\"fresh\":1}", false).unwrap(), Finish::Committed);
        assert_eq!(fs::read(root.join("done/j.req.json.result")).unwrap(), b"{\"fresh\":1}");
        // A move to a name that is taken fails, as with NOREPLACE.
        fs::write(root.join("pending/x"), b"x").unwrap();
        let (p, d) = (&q.dirs[PENDING], &q.dirs[DONE]);
        assert_eq!(q.move_new(p, "x", d, "j.req.json"), Err(Errno::EXIST));
        assert_eq!(fs::read(root.join("done/j.req.json")).unwrap(), b"{}");
    }

    /// Seen through `/ctx` with a short lease: a worker released its claim between recovery's
    /// listing and its look at the claim, and `recover` failed whole with ENOENT. A claim that
    /// is gone by then is finished, not an error, at both places recovery meets it.
    #[test]
    fn a_claim_released_while_recovery_looks_is_no_error() {
        let (_d, q) = q(Duration::ZERO);
        let mut r = Recovered::default();
        q.reconcile_committed("gone.req.json", &mut r).unwrap();
        assert_eq!(q.fence("gone.req.json").unwrap(), None);
        assert!(r.conflicts.is_empty() && r.reconciled.is_empty());
    }
}
