//! Fault injection on `powerloss-fs` (see `tests/src/bin/powerloss_fs.rs`): syncs that fail
//! with EIO, and the power cut right after each sync of a multi-step durable operation in turn.
//!
//! - The append log under EIO, with both commit engines: appends acknowledged before the fault
//!   stay acknowledged; the append whose sync failed gets a clear error ("Input/output error")
//!   and every later append `Error::Stopped`, never Ok. After the fault clears and the log is
//!   reopened (with no power loss, a clean one or a torn one), every acknowledged record is
//!   there exactly once and no torn line is visible. Closing and creating a log under EIO fail
//!   as clearly and lose nothing.
//! - Log recovery cut at every sync: a closed log with a durable torn tail is opened with the
//!   power cut after its 1st, 2nd, ... sync until an open completes uncut. After each cut the
//!   acknowledged prefix is intact and the torn bytes are still in the log or in the `.torn`
//!   sidecar, never lost; the next open leaves exactly the acknowledged records.
//! - `ctx object install` cut at every sync, from empty storage and over the residue of an
//!   interrupted install, and `ctx object uninstall` cut at every sync: the object is absent or
//!   complete (and what the command reported as done is done); `inspect` agrees and shows what
//!   residue is left; the next install or uninstall leaves a clean state.
//! - One queue cycle (publish, claim, finish) cut at every sync: `Queue::recover` with a zero
//!   lease plus finishing the cycle leaves the job in done/ exactly once with its result beside
//!   it; a job that was published is never lost, and no copy of it is left anywhere else.
//! - The fault injection itself: EIO fails every kind of sync and keeps nothing, a cut comes
//!   exactly after the armed sync and fails everything until the restart.
//!
//! A cut-at-every-sync loop arms the cut after sync 1, 2, 3, ... and ends at the first run that
//! is not cut, checking that the operation then made exactly one sync fewer (so every sync was a
//! cut point). The install and queue tests check every cut point and then fail once, naming every
//! broken one. Each test prints how many cut points it covered and how long it took. They need
//! FUSE and root; without /dev/fuse they fail (they never skip).

use std::collections::HashSet;
use std::fs::{self, OpenOptions};
use std::io::{ErrorKind, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ringfs::log::evidence::{self, Evidence, Mark};
use ringfs::log::{AppendLog, Engine, Options, torn_path};
use ringfs::queue::{Finish, Policy, Queue, Recovered};
use tests::appender::{Record, check_records, parse_records};
use tests::object::{Package, package};
use tests::powerloss::{Cut, PowerlossMount};

/// More syncs than any operation here makes: a loop that reaches it never found the end.
const MAX_STEPS: u64 = 200;

/// One JSONL record in the `log-appender` format (round 0), so the appender checks apply.
fn record(t: u64, i: u64) -> Vec<u8> {
    let pad = "p".repeat(((i * 7 + t * 13) % 90) as usize);
    format!("{{\"r\":0,\"t\":{t},\"i\":{i},\"pad\":\"{pad}\"}}\n").into_bytes()
}

/// Whether an error (or its chain) says the storage failed with EIO.
fn says_eio(e: &dyn std::error::Error) -> bool {
    let mut msg = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        msg.push_str(&s.to_string());
        src = s.source();
    }
    msg.contains("Input/output error")
}

// ---------------------------------------------------------------------------------------------
// The append log under EIO.

/// What happens between the fault and the reopen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Then {
    /// Nothing: the fault clears and the log is reopened.
    Reopen,
    /// A power loss: only synced state survives.
    PowerLoss,
    /// A torn power loss: part of the unsynced appends and xattrs survive too.
    TornPowerLoss,
}

/// What one appending thread saw.
struct Outcome {
    acked: Vec<Record>,
    /// When the last acknowledged append was called.
    last_ok_called: Option<Instant>,
    /// When the first failed append returned.
    failed_at: Instant,
    /// The error of the first append that failed.
    first: ringfs::Error,
    /// The errors of the appends tried after it.
    later: Vec<ringfs::Error>,
}

const THREADS: u64 = 4;

/// Appends until an append fails, then tries three more, which must all fail.
fn append_until_failure(log: &AppendLog, t: u64, acks: &AtomicU64) -> Outcome {
    let mut acked = Vec::new();
    let mut last_ok_called = None;
    let mut i = 0;
    let first = loop {
        let called = Instant::now();
        match log.append(&record(t, i)) {
            Ok(_) => {
                acked.push((0, t, i));
                last_ok_called = Some(called);
                acks.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => break e,
        }
        i += 1;
        assert!(i < 1_000_000, "thread {t}: a million appends and none failed: EIO mode does nothing");
    };
    let failed_at = Instant::now();
    let later = (1..=3)
        .map(|k| match log.append(&record(t, i + k)) {
            Ok(end) => panic!("thread {t}: an append after a failed one was acknowledged (log end {end})"),
            Err(e) => e,
        })
        .collect();
    Outcome { acked, last_ok_called, failed_at, first, later }
}

/// Four threads append until syncs start failing, then `then` happens, the fault clears and
/// the log is reopened and checked.
fn log_under_eio(engine: Engine, then: Then, seed: u64) {
    log_under_eio_in(engine, then, seed, false);
}

/// [`log_under_eio`], the log appending through a journal when `journaled`.
fn log_under_eio_in(engine: Engine, then: Then, seed: u64, journaled: bool) {
    const CAP: u64 = 256 << 10;
    let started = Instant::now();
    let mnt = PowerlossMount::start(seed);
    let path = mnt.path().join("events.jsonl");
    let journal = journaled.then(|| ringfs::log::Journal::open(mnt.path(), CAP).unwrap());
    let log = match &journal {
        Some(j) => {
            let (log, _) =
                AppendLog::open_journaled(j, Path::new("events.jsonl"), Options::default()).unwrap();
            assert!(log.journaled());
            log
        }
        None => {
            std::sync::Arc::new(AppendLog::open(&path, Options { engine, ..Options::default() }).unwrap().0)
        }
    };
    let acks = AtomicU64::new(0);
    let outcomes: Vec<Outcome> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (log, acks) = (&*log, &acks);
                s.spawn(move || append_until_failure(log, t, acks))
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(10);
        while acks.load(Ordering::Relaxed) < 200 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        // Turned on even after the deadline, so that the threads end and the check below speaks.
        mnt.set_eio(true);
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let acked: HashSet<Record> = outcomes.iter().flat_map(|o| o.acked.iter().copied()).collect();
    assert!(acked.len() >= 200, "only {} appends acknowledged before the fault", acked.len());

    for (t, o) in outcomes.iter().enumerate() {
        assert!(says_eio(&o.first), "thread {t}: the failed append does not say why: {}", o.first);
        for e in &o.later {
            assert!(
                matches!(e, ringfs::Error::Stopped { .. }),
                "thread {t}: a later append failed otherwise: {e}"
            );
            assert!(says_eio(e), "thread {t}: the stopped log does not say why: {e}");
        }
    }
    // Once any append has failed, no append called later (on any thread) is acknowledged.
    let first_failure = outcomes.iter().map(|o| o.failed_at).min().unwrap();
    for (t, o) in outcomes.iter().enumerate() {
        assert!(
            o.last_ok_called.is_none_or(|c| c < first_failure),
            "thread {t}: an append called after another had failed was acknowledged"
        );
    }
    match log.append(&record(THREADS, 0)) {
        Err(ringfs::Error::Stopped { .. }) => {}
        other => panic!("a fresh append on the stopped log returned {other:?}"),
    }
    let first_error = outcomes[0].first.to_string();
    let later_error = outcomes[0].later[0].to_string();
    // Dropping a stopped log does not try to settle it.
    drop(log);
    if let Some(j) = journal {
        assert!(j.close().is_err(), "closing a stopped journal says it stopped");
    }
    let len_at_fault = fs::metadata(&path).unwrap().len();

    match then {
        Then::Reopen => {}
        Then::PowerLoss => mnt.power_loss(),
        Then::TornPowerLoss => mnt.torn_power_loss(),
    }
    mnt.set_eio(false);
    let (log, rec) = if journaled {
        // Replayed: what the journal made durable is written again into the log.
        let j = ringfs::log::Journal::open(mnt.path(), CAP).unwrap();
        let (log, rec) =
            AppendLog::open_journaled(&j, Path::new("events.jsonl"), Options::default()).unwrap();
        drop(log);
        j.close().unwrap();
        (None, rec)
    } else {
        let (log, rec) = AppendLog::open(&path, Options::default()).unwrap();
        (Some(log), rec)
    };
    if let Some(log) = log {
        log.close().unwrap();
    }
    let bytes = fs::read(&path).unwrap();
    let present = check_records(&bytes, &acked).unwrap_or_else(|e| {
        panic!("{engine:?}, {then:?}: after EIO and reopen, the log lost acknowledged data: {e}")
    });
    eprintln!(
        "log under EIO ({engine:?}, then {then:?}): {} appends acknowledged before the fault, {THREADS} failed \
         with EIO, every later one stopped; the file held {len_at_fault} bytes, recovery kept {} and cut {:?}; \
         {} records present, {} of them from appends that failed; {:.2?}\n  failed append: {first_error}\n  \
         later append: {later_error}",
        acked.len(),
        rec.mark.end,
        rec.torn,
        present,
        present - acked.len(),
        started.elapsed(),
    );
    // Nothing was made durable under EIO: only acknowledged records survive a clean power loss.
    // (Without one, or with a torn one, a batch whose sync failed may be found whole, evidence
    // included, and is kept: its outcome was never reported as a success or as a loss.)
    if then == Then::PowerLoss {
        assert_eq!(present, acked.len(), "a record whose sync failed survived a power loss");
    }
}

#[test]
fn log_under_eio_stops_and_loses_nothing() {
    log_under_eio(Engine::Portable, Then::Reopen, 101);
    log_under_eio(Engine::Portable, Then::PowerLoss, 102);
    log_under_eio(Engine::Portable, Then::TornPowerLoss, 103);
}

/// Through a journal: the journal's failed flush stops it (and every log with it), and after
/// the fault clears and the journal is replayed, nothing acknowledged is lost; after a clean
/// power loss nothing whose flush failed is there either.
#[test]
fn journaled_log_under_eio_stops_and_loses_nothing() {
    log_under_eio_in(Engine::Portable, Then::Reopen, 121, true);
    log_under_eio_in(Engine::Portable, Then::PowerLoss, 122, true);
    log_under_eio_in(Engine::Portable, Then::TornPowerLoss, 123, true);
}

#[test]
fn log_under_eio_stops_and_loses_nothing_uring() {
    if let Err(reason) = ringfs::log::uring_available() {
        panic!("io_uring is unavailable here ({reason}); this machine kind has it");
    }
    log_under_eio(Engine::Uring, Then::Reopen, 111);
    log_under_eio(Engine::Uring, Then::PowerLoss, 112);
    log_under_eio(Engine::Uring, Then::TornPowerLoss, 113);
}

/// Closing settles the evidence with a sync, and creating a log syncs it and its directory: under
/// EIO both fail with a clear error, and nothing acknowledged is lost.
#[test]
fn log_close_and_create_under_eio_fail_clearly() {
    let started = Instant::now();
    let mnt = PowerlossMount::start(120);
    let path = mnt.path().join("a.jsonl");
    let (log, _) = AppendLog::open(&path, Options::default()).unwrap();
    log.append(&record(0, 0)).unwrap();
    log.append(&record(0, 1)).unwrap();
    mnt.set_eio(true);
    let e = log.close().unwrap_err();
    assert!(says_eio(&e), "close under EIO: {e}");
    let e2 = AppendLog::open(mnt.path().join("new.jsonl"), Options::default()).unwrap_err();
    assert!(says_eio(&e2), "create under EIO: {e2}");
    mnt.power_loss();
    mnt.set_eio(false);
    assert_eq!(fs::read(&path).unwrap(), [record(0, 0), record(0, 1)].concat(), "acknowledged records kept");
    let (log, rec) = AppendLog::open(&path, Options::default()).unwrap();
    assert_eq!(rec.torn, None);
    log.close().unwrap();
    // The log that could not be created is absent or empty, and opens cleanly now.
    let (log, rec) = AppendLog::open(mnt.path().join("new.jsonl"), Options::default()).unwrap();
    assert_eq!(rec.mark.end, 0);
    log.close().unwrap();
    eprintln!("close under EIO: {e}\ncreate under EIO: {e2}\n({:.2?})", started.elapsed());
}

// ---------------------------------------------------------------------------------------------
// Log recovery cut at every sync.

/// Checks the end of a cut-at-every-sync loop, at the first `n` that was not cut: the operation
/// made exactly `n - 1` syncs, so each of them was a cut point in turn (its syncs are the same
/// on every run), and at least `min` of them, so the cuts did happen.
fn assert_every_sync_was_cut(at: &str, n: u64, cut: Cut, min: u64) {
    assert_eq!(cut.syncs, n - 1, "{at}: the operation's syncs differ from run to run");
    assert!(n > min, "{at}: only {} syncs, expected at least {min}", n - 1);
}

/// The records of a `.torn` sidecar: (offset, bytes) of each cut tail. Strict: anything that is
/// not a sequence of header, bytes, newline is an error.
fn sidecar(path: &Path) -> Result<Vec<(u64, Vec<u8>)>, String> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("read {}: {e}", path.display())),
    };
    let mut out = Vec::new();
    let mut rest = &bytes[..];
    while !rest.is_empty() {
        let nl = rest.iter().position(|&b| b == b'\n').ok_or("a header without a newline")?;
        let h: serde_json::Value =
            serde_json::from_slice(&rest[..nl]).map_err(|e| format!("a header that is not JSON: {e}"))?;
        let (at, len) = (h["torn_at"].as_u64(), h["len"].as_u64());
        let (Some(at), Some(len)) = (at, len) else {
            return Err(format!("a header without torn_at and len: {h}"));
        };
        let len = usize::try_from(len).map_err(|e| e.to_string())?;
        rest = &rest[nl + 1..];
        if rest.len() < len + 1 || rest[len] != b'\n' {
            return Err(format!("a record of {len} bytes is cut short"));
        }
        out.push((at, rest[..len].to_vec()));
        rest = &rest[len + 1..];
    }
    Ok(out)
}

/// How the torn tail came to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tail {
    /// Garbage appended past the end of a cleanly closed log (settled evidence).
    AfterClose,
    /// A commit torn mid-flight: the evidence names a batch that reached the disk only in part,
    /// damaged.
    MidCommit,
}

/// Opens a log with a durable torn tail, with the power cut after each sync of the open in turn.
fn recovery_cut_at_every_sync(tail: Tail, seed: u64) {
    const TORN: &[u8] = b"{\"r\":0,\"t\":9,\"i\":9,\"pad\":\"half a line\0\0\0";
    let started = Instant::now();
    let mnt = PowerlossMount::start(seed);
    let records: Vec<Vec<u8>> = (0..5).map(|i| record(0, i)).collect();
    let acked = records.concat();
    let end = acked.len() as u64;
    let (mut cuts, mut failed_opens, mut kept_in_log, mut two_copies) = (0, 0, 0, 0);
    for n in 1..=MAX_STEPS {
        // A closed log of five acknowledged records, then a torn line past its end, made durable.
        let path = mnt.path().join(format!("log-{n}.jsonl"));
        let side = torn_path(&path);
        let (log, _) = AppendLog::open(&path, Options::default()).unwrap();
        for r in &records {
            log.append(r).unwrap();
        }
        log.close().unwrap();
        let f = OpenOptions::new().append(true).open(&path).unwrap();
        (&f).write_all(TORN).unwrap();
        if tail == Tail::MidCommit {
            let prev = Mark { end, crc: evidence::extend(0, &acked) };
            let batch = record(9, 9);
            let cur = Mark { end: end + batch.len() as u64, crc: evidence::extend(prev.crc, &batch) };
            let ev = Evidence { prev, cur }.encode();
            rustix::fs::fsetxattr(&f, evidence::XATTR, &ev, rustix::fs::XattrFlags::empty()).unwrap();
        }
        f.sync_all().unwrap();
        drop(f);

        let (opened, cut) = mnt.cut_after(n, || {
            AppendLog::open(&path, Options::default()).and_then(|(log, rec)| log.close().map(|()| rec))
        });
        let at = format!("{tail:?}: recovery cut after sync {n}");
        if !cut.happened {
            // Cutting a torn tail syncs at least the sidecar and the truncated log.
            assert_every_sync_was_cut(&at, n, cut, 2);
            let rec = opened.unwrap_or_else(|e| panic!("recovery without a cut failed: {e}"));
            assert_eq!(rec.torn, Some((end, TORN.len() as u64)), "{at}");
            assert_eq!(fs::read(&path).unwrap(), acked, "{at}");
            assert_eq!(sidecar(&side).unwrap(), [(end, TORN.to_vec())], "{at}");
            eprintln!(
                "log recovery ({tail:?}): {cuts} cut points (the power cut after each sync of an open that cuts a \
                 torn tail), {failed_opens} opens failed with EIO, the tail was still in the log after \
                 {kept_in_log} cuts and kept twice in the sidecar after {two_copies}; nothing lost; {:.2?}",
                started.elapsed()
            );
            return;
        }
        assert_eq!(cut.syncs, n, "{at}");
        cuts += 1;
        if let Err(e) = &opened {
            assert!(says_eio(e), "{at}: the open failed for another reason: {e}");
            failed_opens += 1;
        }

        // What survived the cut: the acknowledged prefix, and the torn bytes in the log or beside it.
        let bytes = fs::read(&path).unwrap();
        assert!(bytes.starts_with(&acked), "{at}: the acknowledged prefix is damaged: {bytes:?}");
        let tail_kept = match &bytes[acked.len()..] {
            [] => false,
            t if t == TORN => true,
            t => panic!("{at}: the log ends with {t:?}, neither nothing nor the torn tail"),
        };
        let copies = sidecar(&side).unwrap_or_else(|e| panic!("{at}: the sidecar is damaged: {e}"));
        assert!(copies.iter().all(|c| c == &(end, TORN.to_vec())), "{at}: the sidecar holds {copies:?}");
        assert!(
            tail_kept || !copies.is_empty(),
            "{at}: the torn bytes are neither in the log nor in {}",
            side.display()
        );
        let (mark, torn) =
            ringfs::log::verify(&path).unwrap_or_else(|e| panic!("{at}: the log is damaged: {e}"));
        assert_eq!((mark.end, torn), (end, if tail_kept { TORN.len() as u64 } else { 0 }), "{at}");
        kept_in_log += usize::from(tail_kept);

        // A clean open finishes the job.
        let (log, rec) =
            AppendLog::open(&path, Options::default()).unwrap_or_else(|e| panic!("{at}: reopen: {e}"));
        log.close().unwrap();
        assert_eq!(rec.mark.end, end, "{at}");
        let bytes = fs::read(&path).unwrap();
        assert_eq!(bytes, acked, "{at}: after the reopen");
        parse_records(&bytes).unwrap();
        let after = sidecar(&side).unwrap();
        assert_eq!(after.len(), copies.len() + usize::from(tail_kept), "{at}: sidecar after the reopen");
        assert!(after.iter().all(|c| c == &(end, TORN.to_vec())), "{at}: the sidecar holds {after:?}");
        if after.len() > 1 {
            two_copies += 1;
        }
    }
    panic!("log recovery made more than {MAX_STEPS} syncs");
}

#[test]
fn log_recovery_cut_at_every_sync_loses_no_torn_byte() {
    recovery_cut_at_every_sync(Tail::AfterClose, 130);
    recovery_cut_at_every_sync(Tail::MidCommit, 131);
}

// ---------------------------------------------------------------------------------------------
// `ctx object install` (and uninstall) and a queue cycle cut at every sync. Each cut point is
// checked in full and what it breaks is collected, so that one failure names every broken cut
// point.

/// Problems found at one cut point.
#[derive(Debug, Default)]
struct Findings(Vec<String>);

impl Findings {
    fn check(&mut self, ok: bool, what: impl FnOnce() -> String) {
        if !ok {
            self.0.push(what());
        }
    }
}

fn ctx(args: &[&str]) -> Output {
    Command::new(tests::bin("ctx")).args(args).output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Entries of `dir`, sorted; empty when it does not exist.
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = match fs::read_dir(dir) {
        Ok(rd) => rd.map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect(),
        Err(e) if e.kind() == ErrorKind::NotFound => Vec::new(),
        Err(e) => panic!("list {}: {e}", dir.display()),
    };
    v.sort();
    v
}

/// Fsyncs a file or directory.
fn sync(p: &Path) {
    fs::File::open(p).unwrap().sync_all().unwrap();
}

/// The `ctx object` command cut by the power.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ObjectOp {
    Install,
    Uninstall,
}

impl ObjectOp {
    fn run(self, storage: &str, pkg: &Package) -> Output {
        match self {
            ObjectOp::Install => ctx(&["object", "install", "--source", storage, pkg.manifest_arg()]),
            ObjectOp::Uninstall => {
                ctx(&["object", "uninstall", "--source", storage, &format!("tool/{}", pkg.name), "--yes"])
            }
        }
    }
}

/// Counts over the cut points of one `ctx object` scenario.
#[derive(Debug, Default)]
struct ObjectStats {
    cuts: u64,
    absent: u64,
    complete: u64,
    /// Cuts after which the command had reported success (its outcome must have survived).
    acknowledged: u64,
    /// Cuts after which `ctx object inspect` reported residue of the name.
    residue: u64,
}

/// Checks what `op` cut by the power left in `storage`, then cleans up with the next install or
/// uninstall.
fn check_object_cut(
    op: ObjectOp,
    storage: &Path,
    pkg: &Package,
    out: &Output,
    st: &mut ObjectStats,
) -> Findings {
    let mut f = Findings::default();
    let s = storage.to_str().unwrap();
    let tool = storage.join("tool");
    let object = format!("tool/{}", pkg.name);
    let only_object = vec![pkg.name.clone(), format!("{}.d", pkg.name)];
    match out.status.code() {
        Some(0) => st.acknowledged += 1,
        Some(1) => {
            let err = text(&out.stderr);
            f.check(err.starts_with("ctx: ") && err.contains("Input/output error"), || {
                format!("the cut {op:?}'s error does not say why: {err:?}")
            });
        }
        other => f.0.push(format!("the cut {op:?} exited {other:?}: {}", text(&out.stderr))),
    }
    let left_by_cut = names(&tool);
    let complete = match pkg.absent_or_complete(storage) {
        Ok(complete) => complete,
        Err(why) => {
            f.0.push(format!("half-installed object: {why}; the class directory holds {left_by_cut:?}"));
            return f;
        }
    };
    f.check(!out.status.success() || complete == (op == ObjectOp::Install), || {
        format!("{op:?} reported success but the object is {}", if complete { "installed" } else { "absent" })
    });
    st.complete += u64::from(complete);
    st.absent += u64::from(!complete);

    // `inspect` agrees; it exits 1 for an object that is not installed.
    let insp = ctx(&["object", "inspect", "--source", s, &object, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&insp.stdout).unwrap_or_default();
    f.check(insp.status.code() == Some(if complete { 0 } else { 1 }) && v["installed"] == complete, || {
        format!("inspect exited {:?} and says {v}", insp.status.code())
    });
    let shown: Vec<String> = v["residue"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| Some(Path::new(p.as_str()?).file_name()?.to_string_lossy().into_owned()))
        .collect();
    st.residue += u64::from(!shown.is_empty());
    let hidden: Vec<&String> = left_by_cut
        .iter()
        .filter(|n| !(shown.contains(n) || (complete && only_object.contains(n))))
        .collect();
    f.check(hidden.is_empty(), || {
        format!("the cut left {left_by_cut:?}; inspect shows residue {shown:?}, not {hidden:?}")
    });

    // Whatever the cut left, the next install or uninstall brings the name to a clean state.
    if !complete {
        let out = ObjectOp::Install.run(s, pkg);
        if out.status.code() != Some(0) {
            f.0.push(format!("the next install failed: {}", text(&out.stderr)));
            return f;
        }
        f.check(pkg.absent_or_complete(storage) == Ok(true), || "the next install is not complete".into());
        let now = names(&tool);
        f.check(now == only_object, || {
            format!("the cut left {left_by_cut:?}; after the next install the class directory holds {now:?}")
        });
    }
    let out = ObjectOp::Uninstall.run(s, pkg);
    f.check(out.status.code() == Some(0), || format!("uninstall failed: {}", text(&out.stderr)));
    let now = names(&tool);
    f.check(now.is_empty(), || {
        format!("the cut left {left_by_cut:?}; after the next uninstall the class directory holds {now:?}")
    });
    f
}

/// Runs `op` on fresh storage prepared by `prepare`, with the power cut after each sync in turn,
/// until it completes uncut; prints what the cuts left and returns the broken cut points.
/// Creates the directory `d` (a storage) and syncs its parent, so no cut takes it away.
fn durable_dir(d: &Path) {
    fs::create_dir_all(d).unwrap();
    fs::File::open(d.parent().unwrap()).unwrap().sync_all().unwrap();
}

fn object_op_cut_at_every_sync(
    mnt: &PowerlossMount,
    op: ObjectOp,
    label: &str,
    pkg: &Package,
    prepare: impl Fn(&Path),
) -> Scenario {
    let started = Instant::now();
    let mut st = ObjectStats::default();
    let mut broken = Vec::new();
    for n in 1..=MAX_STEPS {
        let storage = mnt.path().join(format!("{label}-{n}"));
        prepare(&storage);
        let (out, cut) = mnt.cut_after(n, || op.run(storage.to_str().unwrap(), pkg));
        if cut.happened {
            assert_eq!(cut.syncs, n, "{label}: {op:?} cut after sync {n}");
            st.cuts += 1;
            let f = check_object_cut(op, &storage, pkg, &out, &mut st);
            if !f.0.is_empty() {
                broken.push((n, f));
            }
            continue;
        }
        let at = format!("{label}: {op:?} with the cut armed after sync {n}, which never came");
        // Removing a file and a directory syncs at least twice each; installing, more.
        assert_every_sync_was_cut(&at, n, cut, 4);
        assert_eq!(out.status.code(), Some(0), "{at}: {}", text(&out.stderr));
        let left = names(&storage.join("tool"));
        match op {
            ObjectOp::Install => {
                assert_eq!(pkg.absent_or_complete(&storage), Ok(true), "{at}");
                assert_eq!(left, [pkg.name.clone(), format!("{}.d", pkg.name)], "{at}");
            }
            ObjectOp::Uninstall => assert!(left.is_empty(), "{at}: left {left:?}"),
        }
        eprintln!(
            "object {op:?} ({label}): {} cut points; after them {} absent, {} complete ({} acknowledged by \
             exit 0), {} with residue shown by inspect; {} broken; {:.2?}",
            st.cuts,
            st.absent,
            st.complete,
            st.acknowledged,
            st.residue,
            broken.len(),
            started.elapsed()
        );
        return Scenario { label: format!("{op:?} ({label})"), cuts: st.cuts, broken };
    }
    panic!("{label}: {op:?} made more than {MAX_STEPS} syncs");
}

/// The cut points of one scenario, and what broke at each broken one.
#[derive(Debug)]
struct Scenario {
    label: String,
    cuts: u64,
    broken: Vec<(u64, Findings)>,
}

/// Fails with the broken cut points of every scenario.
fn assert_scenarios(what: &str, scenarios: &[Scenario]) {
    let mut report = Vec::new();
    for Scenario { label, cuts, broken } in scenarios {
        if !broken.is_empty() {
            let list: Vec<String> = broken
                .iter()
                .map(|(n, f)| format!("  cut after sync {n}:\n    {}", f.0.join("\n    ")))
                .collect();
            report.push(format!(
                "{label}: {} of {cuts} cut points broke it:\n{}",
                broken.len(),
                list.join("\n")
            ));
        }
    }
    assert!(report.is_empty(), "{what}:\n{}", report.join("\n"));
}

/// Writes the durable residue of an interrupted install into `storage`: an orphan `hello.d/` and
/// a staging directory of process `dead_pid`, which is gone.
fn interrupted_install(mnt: &PowerlossMount, storage: &Path, dead_pid: u32) {
    let tool = storage.join("tool");
    let stage = tool.join(format!(".cortexfs-stage.hello.{dead_pid}.1"));
    fs::create_dir_all(tool.join("hello.d")).unwrap();
    fs::create_dir_all(&stage).unwrap();
    for p in [tool.join("hello.d/junk"), stage.join("hello")] {
        fs::write(&p, b"left by an interrupted install\n").unwrap();
        sync(&p);
    }
    for d in [tool.join("hello.d"), stage, tool, storage.to_path_buf(), mnt.path().to_path_buf()] {
        sync(&d);
    }
}

/// The pid of a process that has exited.
fn dead_pid() -> u32 {
    let mut gone = Command::new("true").spawn().unwrap();
    let pid = gone.id();
    gone.wait().unwrap();
    pid
}

#[test]
fn object_install_cut_at_every_sync_is_absent_or_complete() {
    let mnt = PowerlossMount::start(140);
    let pkgdir = tempfile::tempdir().unwrap();
    let pkg = package(pkgdir.path(), "hello", "1.0.0", 3000);
    let dead = dead_pid();
    let scenarios = [
        // From an empty storage: even the class directories are created under the cut.
        object_op_cut_at_every_sync(&mnt, ObjectOp::Install, "empty", &pkg, durable_dir),
        // Over the residue of an interrupted install, which it clears first.
        object_op_cut_at_every_sync(&mnt, ObjectOp::Install, "residue", &pkg, |s| {
            interrupted_install(&mnt, s, dead)
        }),
    ];
    assert_scenarios("object install cut by the power", &scenarios);
}

#[test]
fn object_uninstall_cut_at_every_sync_is_absent_or_complete() {
    let mnt = PowerlossMount::start(141);
    let pkgdir = tempfile::tempdir().unwrap();
    let pkg = package(pkgdir.path(), "hello", "1.0.0", 3000);
    let installed = |storage: &Path| {
        durable_dir(storage);
        let out = ObjectOp::Install.run(storage.to_str().unwrap(), &pkg);
        assert_eq!(out.status.code(), Some(0), "install: {}", text(&out.stderr));
    };
    let scenario = object_op_cut_at_every_sync(&mnt, ObjectOp::Uninstall, "installed", &pkg, installed);
    assert_scenarios("object uninstall cut by the power", &[scenario]);
}

const JOB: &str = "j.req.json";
const REQUEST: &[u8] = b"{\"n\":1}";
const RESULT: &[u8] = b"{\"ok\":true}";

/// How far a cycle got before the cut.
#[derive(Debug, Default)]
struct Cycle {
    published: bool,
    claimed: bool,
    committed: bool,
}

/// Publishes (unless `published`), claims and finishes the job, noting each step that returned.
fn cycle(q: &Queue, c: &mut Cycle) -> ringfs::Result<()> {
    if !c.published {
        q.publish(JOB, REQUEST)?;
        c.published = true;
    }
    let claim = q.claim("w1", false)?.ok_or_else(|| ringfs::Error::Conflict("nothing to claim".into()))?;
    c.claimed = true;
    assert_eq!(q.request(&claim)?, REQUEST);
    match q.finish(claim, RESULT, false)? {
        Finish::Committed => c.committed = true,
        Finish::Fenced => panic!("a lone worker was fenced"),
    }
    Ok(())
}

/// Every place under the queue holding a file named like the job or its result, relative.
fn copies(root: &Path) -> Vec<String> {
    fn walk(dir: &Path, rel: &str, out: &mut Vec<String>) {
        for n in names(dir) {
            let p = dir.join(&n);
            let r = format!("{rel}{n}");
            if p.symlink_metadata().unwrap().is_dir() {
                walk(&p, &format!("{r}/"), out);
            } else if n == JOB || n == format!("{JOB}.result") {
                out.push(r);
            }
        }
    }
    let mut out = Vec::new();
    walk(root, "", &mut out);
    out
}

/// Counts over the cut points of the queue cycle.
#[derive(Debug, Default)]
struct QueueStats {
    cuts: u64,
    requeued: usize,
    reconciled: usize,
    /// Cuts after which the job was already in done/ once recovered.
    done_at_cut: u64,
    /// Cuts after which a publish temp file was left in inbox/.
    inbox_residue: u64,
}

/// Recovers the queue after a cut, as a restarted service would, then finishes the cycle.
fn check_queue_cut(root: &Path, c: &Cycle, res: &ringfs::Result<()>, st: &mut QueueStats) -> Findings {
    let mut f = Findings::default();
    if let Err(e) = res {
        f.check(says_eio(e), || format!("the cut cycle failed for another reason: {e}"));
    }
    let found = copies(root);
    let done = vec![format!("done/{JOB}"), format!("done/{JOB}.result")];
    let q = Queue::open(root, Duration::ZERO).unwrap();
    // A restarted service reconciles explicitly: a cut between a claim and its lease leaves an
    // incomplete pair.
    let r = match q.reconcile(Policy::Requeue) {
        Ok(r) => r,
        Err(e) => {
            f.0.push(format!("recover failed: {e} (the cut left {found:?})"));
            return f;
        }
    };
    f.check(r.conflicts.is_empty(), || {
        format!("the cut left {found:?}; recovery reports conflicts {:?}", r.conflicts)
    });
    st.requeued += r.requeued.len();
    st.reconciled += r.reconciled.len();
    let recovered = copies(root);
    let in_done = recovered.contains(&done[0]);
    let in_pending = recovered.contains(&format!("pending/{JOB}"));
    if in_done {
        st.done_at_cut += 1;
        f.check(recovered.contains(&done[1]), || {
            format!("the job is in done/ without its result: {recovered:?}")
        });
    } else if in_pending {
        f.check(!c.committed, || format!("the commit was acknowledged but the job is back at {recovered:?}"));
    } else {
        f.check(!c.published, || {
            format!("the published job is lost: the cut left {found:?}, recovery {recovered:?}")
        });
    }
    let strays: Vec<&String> =
        recovered.iter().filter(|p| !done.contains(p) && !p.starts_with("pending/")).collect();
    f.check(strays.is_empty() && !(in_done && in_pending), || {
        format!("the cut left {found:?}; after recovery the job is at {recovered:?}: more than one copy")
    });
    if !in_done {
        let mut again = Cycle { published: in_pending, ..Cycle::default() };
        if let Err(e) = cycle(&q, &mut again) {
            f.0.push(format!(
                "finishing the cycle failed: {e} (after recovery the job was at {recovered:?})"
            ));
            return f;
        }
    }
    let end = copies(root);
    f.check(end == done, || {
        format!(
            "the cut left {found:?}, recovery {recovered:?}; after finishing the cycle the job is at {end:?}"
        )
    });
    f.check(fs::read(root.join("done").join(JOB)).ok().as_deref() == Some(REQUEST), || {
        "done/ holds another request".into()
    });
    let result = fs::read(root.join("done").join(format!("{JOB}.result"))).ok();
    f.check(result.as_deref() == Some(RESULT), || format!("the result beside the request is {result:?}"));
    for d in ["pending", "claimed", "lease", "failed"] {
        let left = names(&root.join(d));
        f.check(left.is_empty(), || format!("{d}/ holds {left:?} at the end (the cut left {found:?})"));
    }
    if !names(&root.join("inbox")).is_empty() {
        st.inbox_residue += 1;
    }
    // A later recovery finds nothing more to do.
    match q.recover(Policy::Requeue) {
        Ok(r) => f.check(r == Recovered::default(), || {
            format!("a second recovery, after the cycle finished: {r:?}")
        }),
        Err(e) => f.0.push(format!("a second recovery failed: {e}")),
    }
    f
}

#[test]
fn queue_cycle_cut_at_every_sync_commits_once() {
    let started = Instant::now();
    let mnt = PowerlossMount::start(150);
    let mut st = QueueStats::default();
    let mut broken = Vec::new();
    for n in 1..=MAX_STEPS {
        let root: PathBuf = mnt.path().join(format!("q{n}"));
        drop(Queue::open(&root, Duration::ZERO).unwrap());
        let mut c = Cycle::default();
        let (res, cut) = mnt.cut_after(n, || {
            let q = Queue::open(&root, Duration::ZERO)?;
            cycle(&q, &mut c)
        });
        if cut.happened {
            assert_eq!(cut.syncs, n, "queue cycle cut after sync {n}");
            st.cuts += 1;
            let f = check_queue_cut(&root, &c, &res, &mut st);
            if !f.0.is_empty() {
                broken.push((n, f));
            }
            continue;
        }
        let at = format!("a cycle with the cut armed after sync {n}, which never came");
        // Publish, claim and finish sync at least twice each.
        assert_every_sync_was_cut(&at, n, cut, 6);
        res.unwrap_or_else(|e| panic!("{at}: {e}"));
        assert_eq!(copies(&root), [format!("done/{JOB}"), format!("done/{JOB}.result")]);
        eprintln!(
            "queue cycle: {} cut points; recovery requeued {} claims and reconciled {} partial states, the job \
             was already done after {} cuts; publish temp files left in inbox/ after {} cuts; {} broken; {:.2?}",
            st.cuts,
            st.requeued,
            st.reconciled,
            st.done_at_cut,
            st.inbox_residue,
            broken.len(),
            started.elapsed()
        );
        let label = "publish, claim, finish".to_owned();
        assert_scenarios("queue cycle cut by the power", &[Scenario { label, cuts: st.cuts, broken }]);
        return;
    }
    panic!("a queue cycle made more than {MAX_STEPS} syncs");
}

/// A result its worker moved beside the request, whose old name in the claim a network
/// filesystem's client answers once more (GlusterFS, until a listing or a lookup reaches it):
/// recovery's move of the result fails on the taken name, the claim then has no such file and
/// does not list it. One result, not two; the finished claim is removed.
#[test]
fn a_result_the_claim_only_seems_to_hold_is_no_second_result() {
    let mnt = PowerlossMount::start(170);
    let root = mnt.path().join("q");
    let q = Queue::open(&root, Duration::ZERO).unwrap();
    fs::create_dir(root.join("claimed").join(JOB)).unwrap();
    fs::write(root.join("done").join(JOB), b"{}").unwrap();
    let result = format!("{JOB}.result");
    fs::write(root.join("claimed").join(JOB).join(&result), b"{\"r\":1}").unwrap();
    mnt.set_ghosts(true);
    fs::rename(root.join("claimed").join(JOB).join(&result), root.join("done").join(&result)).unwrap();
    let r = q.recover(ringfs::queue::Policy::Requeue).unwrap();
    mnt.set_ghosts(false);
    assert!(r.conflicts.is_empty(), "one result was taken for two: {r:?}");
    assert_eq!(copies(&root), [format!("done/{JOB}"), format!("done/{JOB}.result")], "{r:?}");
    assert_eq!(fs::read(root.join("done").join(&result)).unwrap(), b"{\"r\":1}");
}

// ---------------------------------------------------------------------------------------------
// The fault injection itself: a fault that did nothing would make every test above pass vacuously.

const EIO: Option<i32> = Some(libc::EIO);

#[test]
fn powerloss_fs_faults_do_what_they_say() {
    let mnt = PowerlossMount::start(160);
    let root = mnt.path();
    let p = |name: &str| root.join(name);
    let rw = |name: &str| OpenOptions::new().read(true).write(true).open(p(name)).unwrap();

    // EIO mode: every sync fails and makes nothing durable; writes and reads still work.
    fs::File::create(p("a")).unwrap().sync_all().unwrap();
    sync(root);
    let before = mnt.status();
    assert!(!before.down && !before.eio && before.armed == 0, "{before:?}");
    mnt.set_eio(true);
    let f = rw("a");
    (&f).write_all(b"written").unwrap();
    assert_eq!(f.sync_all().unwrap_err().raw_os_error(), EIO, "fsync");
    assert_eq!(f.sync_data().unwrap_err().raw_os_error(), EIO, "fdatasync");
    assert_eq!(
        fs::File::open(root).unwrap().sync_all().unwrap_err().raw_os_error(),
        EIO,
        "fsync of a directory"
    );
    let dsync = OpenOptions::new().write(true).custom_flags(libc::O_DSYNC).open(p("a")).unwrap();
    assert_eq!(dsync.write_at(b"W", 0).unwrap_err().raw_os_error(), EIO, "an O_DSYNC write");
    assert_eq!(fs::read(p("a")).unwrap(), b"Written", "what failed to sync is still read back");
    let during = mnt.status();
    assert!(during.eio && during.syncs == before.syncs, "failed syncs are not counted: {during:?}");
    mnt.set_eio(false);
    mnt.power_loss();
    assert_eq!(fs::read(p("a")).unwrap(), b"", "nothing written under EIO was durable");

    // A cut: the armed sync completes, then every operation fails until the restart.
    mnt.arm_cut(2);
    let f = rw("a");
    (&f).write_all(b"one").unwrap();
    f.sync_all().unwrap();
    (&f).write_all(b"two").unwrap();
    f.sync_data().unwrap();
    let down = mnt.status();
    assert!(down.down && down.armed == 0 && down.syncs == before.syncs + 2, "{down:?}");
    assert_eq!((&f).write(b"three").unwrap_err().raw_os_error(), EIO, "write after the cut");
    assert_eq!(fs::metadata(p("a")).unwrap_err().raw_os_error(), EIO, "stat after the cut");
    assert_eq!(fs::read_dir(root).map(drop).unwrap_err().raw_os_error(), EIO, "readdir after the cut");
    assert_eq!(fs::File::create(p("b")).unwrap_err().raw_os_error(), EIO, "create after the cut");
    mnt.restart();
    assert_eq!(fs::read(p("a")).unwrap(), b"onetwo", "the state at the cut survives");
    assert_eq!(names(root), ["a"]);

    // An O_SYNC write is a sync too; a disarmed cut never comes.
    let (r, cut) = mnt.cut_after(1, || {
        let sync_w = OpenOptions::new().write(true).custom_flags(libc::O_SYNC).open(p("a")).unwrap();
        sync_w.write_at(b"O", 0).unwrap();
        fs::read(p("a"))
    });
    assert_eq!((r.unwrap_err().raw_os_error(), cut), (EIO, Cut { happened: true, syncs: 1 }));
    assert_eq!(fs::read(p("a")).unwrap(), b"Onetwo");
    mnt.arm_cut(1);
    mnt.disarm();
    f.sync_all().unwrap();
    assert!(!mnt.status().down);
    let (r, cut) = mnt.cut_after(3, || f.sync_all().and_then(|()| f.sync_all()));
    assert_eq!((r.unwrap(), cut), ((), Cut { happened: false, syncs: 2 }));

    // Ghosts: a moved file's old name answers one lookup with the moved file, then ENOENT, and
    // is never listed; without ghosts a move leaves none.
    use std::os::unix::fs::MetadataExt;
    fs::create_dir(p("g")).unwrap();
    fs::write(p("g/x"), b"x").unwrap();
    fs::rename(p("g/x"), p("g/y")).unwrap();
    assert_eq!(fs::metadata(p("g/x")).unwrap_err().raw_os_error(), Some(libc::ENOENT), "no ghost when off");
    mnt.set_ghosts(true);
    fs::rename(p("g/y"), p("g/x")).unwrap();
    assert_eq!(names(&p("g")), ["x"]);
    assert_eq!(fs::metadata(p("g/y")).unwrap().ino(), fs::metadata(p("g/x")).unwrap().ino(), "the ghost");
    assert_eq!(fs::metadata(p("g/y")).unwrap_err().raw_os_error(), Some(libc::ENOENT), "once");
    mnt.set_ghosts(false);
}
