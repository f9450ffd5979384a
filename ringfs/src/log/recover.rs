//! Recovery of an append log on open, and a read-only [`verify`].
//!
//! The evidence's `cur` mark is kept when the file holds it completely and its checksum
//! matches; else the `prev` mark (the last acknowledged batch) when it matches; anything past
//! the kept mark is a torn tail, copied to `<file>.torn` and then cut. When neither mark matches,
//! or the file is shorter than what was acknowledged, the log is damaged: that is an error and
//! nothing is changed.
//!
//! A file without evidence (written by something else) is adopted when it is complete, valid
//! JSONL, and refused otherwise: there is nothing to tell acknowledged bytes from torn ones.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::evidence::{self, Evidence, Mark, XATTR};
use super::{portable, sync_parent, validate};
use crate::error::{Error, Result};

/// Suffix of the sidecar that keeps cut torn tails.
pub const TORN_SUFFIX: &str = ".torn";

const CHUNK: usize = 64 * 1024;

/// What opening a log found and did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recovery {
    /// The acknowledged state after recovery.
    pub mark: Mark,
    /// The file was created by this open.
    pub created: bool,
    /// The file had no evidence and was adopted as complete JSONL.
    pub adopted: bool,
    /// Where a torn tail was cut, and how many bytes it held.
    pub torn: Option<(u64, u64)>,
}

struct Plan {
    keep: Mark,
    len: u64,
    evidence: Option<Evidence>,
}

fn read_evidence(path: &Path, file: &File) -> Result<Option<Evidence>> {
    let mut buf = [0u8; 64];
    match rustix::fs::fgetxattr(file, XATTR, &mut buf) {
        Ok(n) => Evidence::decode(&buf[..n])
            .map(Some)
            .map_err(|reason| Error::Damaged { path: path.to_path_buf(), reason }),
        Err(rustix::io::Errno::NODATA) => Ok(None),
        Err(rustix::io::Errno::NOTSUP) => Err(Error::Unsupported {
            path: path.to_path_buf(),
            reason: "the filesystem does not support user extended attributes".into(),
        }),
        Err(rustix::io::Errno::RANGE) => Err(Error::Damaged {
            path: path.to_path_buf(),
            reason: "commit evidence is larger than any valid record".into(),
        }),
        Err(e) => Err(Error::io("read evidence", path, e.into())),
    }
}

fn analyze(path: &Path, file: &File) -> Result<Plan> {
    let len = file.metadata().map_err(|e| Error::io("stat", path, e))?.len();
    let damaged = |reason: String| Error::Damaged { path: path.to_path_buf(), reason };
    let Some(ev) = read_evidence(path, file)? else {
        if len == 0 {
            return Ok(Plan { keep: Mark::default(), len, evidence: None });
        }
        let mut all = vec![0u8; usize::try_from(len).map_err(|_| damaged("file too large".into()))?];
        file.read_exact_at(&mut all, 0).map_err(|e| Error::io("read", path, e))?;
        validate(&all, usize::MAX).map_err(|e| {
            damaged(format!(
                "no commit evidence, and the content is not complete JSONL ({e}); refusing to guess what was acknowledged"
            ))
        })?;
        return Ok(Plan { keep: Mark { end: len, crc: crc32fast::hash(&all) }, len, evidence: None });
    };
    // One pass over [0, min(len, cur.end)), noting the CRC at prev.end on the way.
    let stop = len.min(ev.cur.end);
    let mut crc = 0u32;
    let mut at_prev = (ev.prev.end == 0).then_some(0u32);
    let mut buf = vec![0u8; CHUNK];
    let mut off = 0u64;
    while off < stop {
        let mut n = usize::try_from(stop - off).unwrap_or(CHUNK).min(CHUNK);
        if off < ev.prev.end && off + n as u64 > ev.prev.end {
            n = usize::try_from(ev.prev.end - off).expect("less than CHUNK");
        }
        file.read_exact_at(&mut buf[..n], off).map_err(|e| Error::io("read", path, e))?;
        crc = evidence::extend(crc, &buf[..n]);
        off += n as u64;
        if off == ev.prev.end {
            at_prev = Some(crc);
        }
    }
    let keep = if len >= ev.cur.end && crc == ev.cur.crc {
        ev.cur
    } else if len >= ev.prev.end && at_prev == Some(ev.prev.crc) {
        ev.prev
    } else if len < ev.prev.end {
        return Err(damaged(format!("the file holds {len} bytes but {} were acknowledged", ev.prev.end)));
    } else {
        return Err(damaged(format!(
            "acknowledged bytes [0, {}) do not match their checksum; refusing to cut or repair",
            ev.prev.end
        )));
    };
    if keep.end > 0 {
        let mut last = [0u8; 1];
        file.read_exact_at(&mut last, keep.end - 1).map_err(|e| Error::io("read", path, e))?;
        if last[0] != b'\n' {
            return Err(damaged(format!("acknowledged data does not end with a newline at {}", keep.end)));
        }
    }
    Ok(Plan { keep, len, evidence: Some(ev) })
}

/// The path of the torn-tail sidecar of `path`.
pub fn torn_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(TORN_SUFFIX);
    PathBuf::from(s)
}

/// Appends `[from, to)` of `file` to the sidecar: a JSON header line, the raw bytes, a newline.
fn keep_torn(path: &Path, file: &File, from: u64, to: u64) -> Result<()> {
    let side = torn_path(path);
    let existed = side.exists();
    let mut out = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(&side)
        .map_err(|e| Error::io("open", &side, e))?;
    let header = format!("{{\"torn_at\":{from},\"len\":{}}}\n", to - from);
    out.write_all(header.as_bytes()).map_err(|e| Error::io("write", &side, e))?;
    let mut buf = vec![0u8; CHUNK];
    let mut off = from;
    while off < to {
        let n = usize::try_from(to - off).unwrap_or(CHUNK).min(CHUNK);
        file.read_exact_at(&mut buf[..n], off).map_err(|e| Error::io("read", path, e))?;
        out.write_all(&buf[..n]).map_err(|e| Error::io("write", &side, e))?;
        off += n as u64;
    }
    out.write_all(b"\n").map_err(|e| Error::io("write", &side, e))?;
    out.sync_all().map_err(|e| Error::io("sync", &side, e))?;
    if !existed {
        sync_parent(&side)?;
    }
    Ok(())
}

pub(super) fn recover(path: &Path, file: &File, created: bool) -> Result<Recovery> {
    let plan = analyze(path, file)?;
    let mut torn = None;
    if plan.len > plan.keep.end {
        keep_torn(path, file, plan.keep.end, plan.len)?;
        file.set_len(plan.keep.end).map_err(|e| Error::io("truncate", path, e))?;
        torn = Some((plan.keep.end, plan.len - plan.keep.end));
        tracing::warn!(path = %path.display(), at = plan.keep.end, len = plan.len - plan.keep.end, "cut a torn tail");
    }
    let settled = Evidence::settled(plan.keep);
    if plan.evidence != Some(settled) {
        portable::set_evidence(file, &settled.encode()).map_err(|e| {
            if e.raw_os_error() == Some(rustix::io::Errno::NOTSUP.raw_os_error()) {
                Error::Unsupported {
                    path: path.to_path_buf(),
                    reason: "the filesystem does not support user extended attributes".into(),
                }
            } else {
                Error::io("write evidence", path, e)
            }
        })?;
    }
    if created || torn.is_some() || plan.evidence != Some(settled) {
        file.sync_all().map_err(|e| Error::io("sync", path, e))?;
    }
    if created {
        sync_parent(path)?;
    }
    let adopted = plan.evidence.is_none() && plan.len > 0;
    Ok(Recovery { mark: plan.keep, created, adopted, torn })
}

/// What recovery would keep, without changing anything: the acknowledged mark and the number of
/// torn bytes past it. Damage is an error, as in recovery.
pub fn verify(path: impl AsRef<Path>) -> Result<(Mark, u64)> {
    let path = path.as_ref();
    let file = File::open(path).map_err(|e| Error::io("open", path, e))?;
    let plan = analyze(path, &file)?;
    Ok((plan.keep, plan.len - plan.keep.end))
}
