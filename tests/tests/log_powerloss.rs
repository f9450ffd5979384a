//! Power-loss tests of the ringfs append log, on `powerloss-fs` (a FUSE filesystem that forgets
//! everything not fsynced when told to; see `tests/src/bin/powerloss_fs.rs`).
//!
//! kill -9 cannot find a missing fsync (the page cache survives it); a simulated power loss can.
//! Each round starts `log-appender` (16 threads), kills it with SIGKILL at a random moment after
//! it opened the log, cuts the power, then opens the log (which recovers it) and checks that every
//! record acknowledged in any round so far is present exactly once, that the file parses as
//! JSONL and that no torn line is visible.
//!
//! - 100 rounds with clean power losses (only synced state survives), with the portable engine
//!   and again with the io_uring engine;
//! - 100 rounds with torn power losses (part of the unsynced appends and xattrs survive too),
//!   which exercise recovery's torn-tail cut;
//! - a negative control: an appender that acknowledges before syncing must fail the same check
//!   within 20 rounds, while passing it when there is no power loss;
//! - the filesystem model itself: what survives a power loss and what does not.
//!
//! These tests need FUSE and root; without /dev/fuse they fail (they never skip).

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use ringfs::log::evidence::{Evidence, XATTR};
use ringfs::log::{AppendLog, Options, torn_path};
use tests::appender::{Appender, Record, check_records};
use tests::powerloss::PowerlossMount;

const THREADS: u64 = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Loss {
    /// No power loss: kill -9 only.
    None,
    /// Only synced state survives.
    Clean,
    /// Part of the unsynced appends and xattrs survive as well.
    Torn,
}

/// Counts over a run of rounds.
#[derive(Debug, Default)]
struct Stats {
    rounds: u64,
    /// Rounds in which the power loss shrank the file (unsynced bytes were lost).
    shrunk: u64,
    /// Bytes the power losses removed, in all.
    lost_bytes: u64,
    /// Rounds in which the power loss reverted the commit evidence (an unsynced xattr was lost).
    evidence_reverted: u64,
    /// Rounds in which recovery cut a torn tail.
    torn_cut: u64,
    /// Rounds in which opening the journal replayed records.
    replays: u64,
}

/// One log file, the records acknowledged for it so far, and counts.
struct Run<'a> {
    mnt: &'a PowerlossMount,
    path: PathBuf,
    mode: &'static str,
    acked: HashSet<Record>,
    rng: StdRng,
    stats: Stats,
}

fn len_of(path: &Path) -> u64 {
    match fs::metadata(path) {
        Ok(m) => m.len(),
        Err(e) if e.kind() == ErrorKind::NotFound => 0,
        Err(e) => panic!("stat {}: {e}", path.display()),
    }
}

/// Waits until nothing holds the log's lock. A killed process's io_uring requests may still
/// run until the kernel tears its ring down, and the ring holds the file and its lock until
/// then: cutting the power earlier would let writes land after the power loss.
fn wait_unlocked(path: &Path) {
    let Ok(f) = File::open(path) else { return };
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        match rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return,
            Err(rustix::io::Errno::WOULDBLOCK) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => panic!("{} is still locked after the appender died: {e}", path.display()),
        }
    }
}

fn evidence_of(path: &Path) -> Option<Vec<u8>> {
    let f = File::open(path).ok()?;
    let mut buf = [0u8; 64];
    let n = rustix::fs::fgetxattr(&f, XATTR, &mut buf).ok()?;
    Some(buf[..n].to_vec())
}

fn describe(ev: &Option<Vec<u8>>) -> String {
    match ev.as_deref().map(Evidence::decode) {
        None => "none".into(),
        Some(Ok(e)) => format!("prev {}/{:08x} cur {}/{:08x}", e.prev.end, e.prev.crc, e.cur.end, e.cur.crc),
        Some(Err(reason)) => format!("undecodable ({reason})"),
    }
}

impl<'a> Run<'a> {
    fn new(mnt: &'a PowerlossMount, name: &str, mode: &'static str, seed: u64) -> Run<'a> {
        Run {
            mnt,
            path: mnt.path().join(name),
            mode,
            acked: HashSet::new(),
            rng: StdRng::seed_from_u64(seed),
            stats: Stats::default(),
        }
    }

    /// One round; an error describes what failed, with the evidence.
    fn round(&mut self, round: u64, loss: Loss) -> Result<(), String> {
        let appender = Appender::spawn(&self.path, round, THREADS, self.mode);
        if !appender.wait_ready(Duration::from_secs(10)) {
            let why = appender.kill().err().unwrap_or_else(|| "not within 10 s".into());
            return Err(format!(
                "round {round}: log-appender did not open the log ({why}; see its stderr above)"
            ));
        }
        std::thread::sleep(Duration::from_millis(self.rng.random_range(5..40)));
        let acks = appender.kill()?;
        let this_round = acks.len();
        self.acked.extend(acks);

        wait_unlocked(&self.path);
        let (before, ev_before) = (len_of(&self.path), evidence_of(&self.path));
        match loss {
            Loss::None => {}
            Loss::Clean => self.mnt.power_loss(),
            Loss::Torn => self.mnt.torn_power_loss(),
        }
        let (after, ev_after) = (len_of(&self.path), evidence_of(&self.path));
        let context = || {
            format!(
                "round {round} ({loss:?} power loss, {this_round} acks this round, {} in all): file {before} \
                 bytes before the power loss, {after} after; evidence before [{}], after [{}]",
                self.acked.len(),
                describe(&ev_before),
                describe(&ev_after),
            )
        };
        self.stats.rounds += 1;
        if after < before {
            self.stats.shrunk += 1;
            self.stats.lost_bytes += before - after;
        }
        if ev_after != ev_before {
            self.stats.evidence_reverted += 1;
        }

        if self.mode == "journal" {
            // Replayed by opening the journal; both files hold the records.
            let j = ringfs::log::Journal::open(self.mnt.path(), 256 * 1024)
                .map_err(|e| format!("{}: replaying the journal failed: {e}", context()))?;
            let replayed = j.stats().replayed;
            j.close().map_err(|e| format!("{}: closing the journal failed: {e}", context()))?;
            drop(j);
            self.stats.replays += u64::from(replayed > 0);
            let mut bytes = fs::read(&self.path).map_err(|e| format!("{}: read failed: {e}", context()))?;
            let b =
                self.path.with_file_name(format!("{}.b", self.path.file_name().unwrap().to_string_lossy()));
            bytes.extend(fs::read(&b).map_err(|e| format!("{}: read failed: {e}", context()))?);
            return check_records(&bytes, &self.acked).map(drop).map_err(|e| format!("{}: {e}", context()));
        }
        let (log, rec) = AppendLog::open(&self.path, Options::default())
            .map_err(|e| format!("{}: recovery failed: {e}", context()))?;
        if rec.torn.is_some() {
            self.stats.torn_cut += 1;
        }
        log.close().map_err(|e| format!("{}: close failed: {e}", context()))?;
        let bytes = fs::read(&self.path).map_err(|e| format!("{}: read failed: {e}", context()))?;
        check_records(&bytes, &self.acked)
            .map(drop)
            .map_err(|e| format!("{}; recovery kept {:?}, cut {:?}: {e}", context(), rec.mark, rec.torn))
    }
}

/// Runs `rounds` rounds and checks that more than `1 / min_share_inv` of them lost unsynced bytes.
fn power_loss_rounds(engine: &'static str, loss: Loss, rounds: u64, seed: u64, min_share_inv: u64) {
    let mnt = PowerlossMount::start(seed);
    let mut run = Run::new(&mnt, "messages.jsonl", engine, seed);
    for round in 0..rounds {
        if let Err(e) = run.round(round, loss) {
            panic!("the append log lost acknowledged data on power loss: {e}");
        }
    }
    let s = &run.stats;
    eprintln!(
        "{engine}, {loss:?} power loss: {} rounds, {} acknowledged records, file {} bytes; the power loss removed \
         unsynced bytes in {} rounds ({} bytes) and reverted the commit evidence in {}; recovery cut a \
         torn tail in {}",
        s.rounds,
        run.acked.len(),
        len_of(&run.path),
        s.shrunk,
        s.lost_bytes,
        s.evidence_reverted,
        s.torn_cut,
    );
    assert!(run.acked.len() as u64 > 10 * rounds, "the appender acknowledged too little to test anything");
    // A power loss that found nothing unsynced proves nothing: a good share of rounds must lose
    // bytes. With the portable engine about three quarters do (a commit is nearly always in
    // flight); with io_uring fewer, as the killed process's last linked write-xattr-fsync chain
    // usually completes before its ring is torn down.
    assert!(
        s.shrunk * min_share_inv > rounds,
        "the power loss removed unsynced bytes in only {} of {rounds} rounds",
        s.shrunk
    );
    if engine == "journal" {
        assert!(
            s.replays * 3 > rounds,
            "opening the journal replayed records in only {} of {rounds} rounds",
            s.replays
        );
    } else if loss == Loss::Torn {
        assert!(
            s.torn_cut * 5 > rounds,
            "recovery cut a torn tail in only {} of {rounds} rounds",
            s.torn_cut
        );
    }
}

#[test]
fn log_survives_power_loss_100_rounds() {
    power_loss_rounds("portable", Loss::Clean, 100, 1, 3);
}

#[test]
fn log_survives_power_loss_uring_100_rounds() {
    if let Err(reason) = ringfs::log::uring_available() {
        panic!("io_uring is unavailable here ({reason}); this machine kind has it");
    }
    power_loss_rounds("uring", Loss::Clean, 100, 6, 6);
}

#[test]
fn log_survives_torn_power_loss_100_rounds() {
    power_loss_rounds("portable", Loss::Torn, 100, 2, 3);
}

/// Two logs appended through one journal whose 256 KiB ring is reused (checkpointed) within
/// each round: after each power loss, replaying the journal leaves every acknowledged record
/// in its file exactly once.
#[test]
fn journaled_logs_survive_power_loss_100_rounds() {
    power_loss_rounds("journal", Loss::Clean, 100, 11, 3);
}

#[test]
fn journaled_logs_survive_torn_power_loss_100_rounds() {
    power_loss_rounds("journal", Loss::Torn, 100, 12, 3);
}

/// An appender that acknowledges before syncing must fail the check: otherwise the test could
/// not tell a durable log from one that merely survives kill -9.
#[test]
fn acknowledging_before_sync_fails_the_check_negative_control() {
    let mnt = PowerlossMount::start(3);

    // Without power loss the control passes: its acknowledgements are honest and the check
    // accepts a file it did not write. (One round only: recovery adopts the file as complete
    // JSONL once, and would cut later unlogged appends as an unacknowledged tail.)
    let mut honest = Run::new(&mnt, "kill-only.jsonl", "nosync", 30);
    honest.round(0, Loss::None).unwrap();
    assert!(!honest.acked.is_empty(), "the control acknowledged nothing");

    // With power loss it fails, and not because recovery cut anything: the file is created
    // durably beforehand, without commit evidence, so only the power loss can remove records.
    let mut run = Run::new(&mnt, "nosync.jsonl", "nosync", 31);
    File::create(&run.path).unwrap().sync_all().unwrap();
    File::open(mnt.path()).unwrap().sync_all().unwrap();
    for round in 0..20 {
        match run.round(round, Loss::Clean) {
            Ok(()) => continue,
            Err(e) => {
                eprintln!("negative control failed the check in round {round}, as it must: {e}");
                assert!(e.contains("acknowledged records lost"), "failed for another reason: {e}");
                assert_eq!(
                    run.stats.torn_cut, 0,
                    "recovery cut a tail; the loss must come from the power loss"
                );
                return;
            }
        }
    }
    panic!("acknowledging before sync passed 20 power-loss rounds: the power loss simulation does nothing");
}

fn sync_dir(dir: &Path) {
    File::open(dir).unwrap().sync_all().unwrap();
}

fn read(path: &Path) -> Option<Vec<u8>> {
    match fs::read(path) {
        Ok(b) => Some(b),
        Err(e) if e.kind() == ErrorKind::NotFound => None,
        Err(e) => panic!("read {}: {e}", path.display()),
    }
}

fn xattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    let f = File::open(path).unwrap();
    let mut buf = [0u8; 256];
    match rustix::fs::fgetxattr(&f, name, &mut buf) {
        Ok(n) => Some(buf[..n].to_vec()),
        Err(rustix::io::Errno::NODATA) => None,
        Err(e) => panic!("getxattr {name} on {}: {e}", path.display()),
    }
}

fn set_xattr(f: &File, name: &str, value: &[u8]) {
    rustix::fs::fsetxattr(f, name, value, rustix::fs::XattrFlags::empty()).unwrap();
}

/// The model: fsync keeps data and xattrs, fdatasync keeps data only, unsynced writes and
/// directory entries of unsynced directories are gone; open handles see the durable state.
#[test]
fn powerloss_fs_keeps_exactly_what_was_synced() {
    let mnt = PowerlossMount::start(4);
    let root = mnt.path();
    let p = |name: &str| root.join(name);

    // Large enough to span several of the filesystem's copy-on-write blocks.
    let mut rng = StdRng::seed_from_u64(4);
    let big: Vec<u8> = (0..300_000).map(|_| rng.random()).collect();
    let mut f = File::create(p("synced")).unwrap();
    f.write_all(&big).unwrap();
    f.sync_all().unwrap();
    drop(f);

    let mut f = OpenOptions::new().read(true).write(true).create_new(true).open(p("unsynced")).unwrap();
    f.sync_all().unwrap();
    f.write_all(b"never synced").unwrap();
    let kept_open = f;

    let f = File::create(p("fdatasynced-xattr")).unwrap();
    set_xattr(&f, "user.a", b"1");
    f.sync_data().unwrap();
    drop(f);
    let f = File::create(p("fsynced-xattr")).unwrap();
    set_xattr(&f, "user.b", b"2");
    f.sync_all().unwrap();
    drop(f);

    fs::create_dir(p("dir")).unwrap();
    sync_dir(root);
    // After the directory fsync: entries that must not survive.
    let mut f = File::create(p("dir/not-in-synced-dir")).unwrap();
    f.write_all(b"x").unwrap();
    f.sync_all().unwrap();
    fs::create_dir(p("unsynced-dir")).unwrap();
    fs::rename(p("synced"), p("renamed")).unwrap();
    // Synced data, then a change the power loss reverts.
    let f = OpenOptions::new().write(true).open(p("renamed")).unwrap();
    f.write_all_at(b"overwritten", 1000).unwrap();
    f.set_len(5000).unwrap();
    drop(f);
    assert_eq!(fs::metadata(p("renamed")).unwrap().len(), 5000);

    mnt.power_loss();

    assert_eq!(read(&p("synced")).as_deref(), Some(&big[..]), "write + fsync survives, rename reverted");
    assert_eq!(read(&p("renamed")), None, "rename without directory fsync is gone");
    assert_eq!(read(&p("unsynced")).as_deref(), Some(&b""[..]), "write without fsync is gone");
    let mut back = [0u8; 16];
    assert_eq!(kept_open.read_at(&mut back, 0).unwrap(), 0, "an open handle sees the durable state");
    assert_eq!(kept_open.metadata().unwrap().len(), 0, "and its size");
    assert_eq!(xattr(&p("fdatasynced-xattr"), "user.a"), None, "fdatasync does not keep xattrs");
    assert_eq!(xattr(&p("fsynced-xattr"), "user.b").as_deref(), Some(&b"2"[..]), "fsync keeps xattrs");
    assert_eq!(
        read(&p("dir/not-in-synced-dir")),
        None,
        "a file created without fsyncing its directory is gone"
    );
    assert!(p("dir").is_dir(), "mkdir then fsync of the parent survives");
    assert!(!p("unsynced-dir").exists(), "mkdir without fsync of the parent is gone");
    let mut names: Vec<String> =
        fs::read_dir(root).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["dir", "fdatasynced-xattr", "fsynced-xattr", "synced", "unsynced"]);

    // Torn power loss: the durable prefix always survives, and at most the unsynced tail.
    let f = OpenOptions::new().append(true).open(p("synced")).unwrap();
    f.sync_all().unwrap();
    (&f).write_all(&[7u8; 100_000]).unwrap();
    mnt.torn_power_loss();
    let after = read(&p("synced")).unwrap();
    assert!(after.len() >= big.len() && after.len() <= big.len() + 100_000, "len {}", after.len());
    assert_eq!(&after[..big.len()], &big[..]);
    assert!(after[big.len()..].iter().all(|&b| b == 7 || b == 0));
}

/// The sidecar a torn-tail cut writes lives beside the log; on this filesystem it, too, must
/// survive power loss once recovery returned (recovery fsyncs it and, when new, its directory).
#[test]
fn torn_tail_sidecar_survives_power_loss() {
    let mnt = PowerlossMount::start(5);
    let path = mnt.path().join("log");
    let (log, _) = AppendLog::open(&path, Options::default()).unwrap();
    log.append(b"{\"a\":1}\n").unwrap();
    drop(log);
    // An unacknowledged tail, made durable so that the power loss keeps it.
    let f = OpenOptions::new().append(true).open(&path).unwrap();
    (&f).write_all(b"{\"torn\":").unwrap();
    f.sync_data().unwrap();
    drop(f);
    mnt.power_loss();
    let (log, rec) = AppendLog::open(&path, Options::default()).unwrap();
    assert_eq!(rec.torn, Some((8, 8)));
    drop(log);
    mnt.power_loss();
    assert_eq!(fs::read(&path).unwrap(), b"{\"a\":1}\n");
    let side = fs::read(torn_path(&path)).unwrap();
    assert!(side.ends_with(b"{\"torn\":\n"), "sidecar: {:?}", String::from_utf8_lossy(&side));
}
