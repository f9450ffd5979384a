//! Commit evidence: a 36-byte record in the extended attribute `user.cortexfs.commit` of each log
//! file. It never changes the JSONL bytes, which belong to the clients.
//!
//! It holds two marks, each an end offset and the CRC-32 of every byte before it: `cur`, the
//! batch being committed, and `prev`, the last acknowledged one. The record is set before the
//! `fsync` that makes a batch durable; the inode's size and its extended attributes are
//! journaled together, so after a crash either `cur` describes complete bytes on disk (the batch
//! is durable) or `prev` does (the batch was never acknowledged, and what follows `prev` is a torn
//! tail). When neither matches, acknowledged data was damaged: that is reported, never cut.

use zerocopy::byteorder::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// The extended attribute that holds the evidence.
pub const XATTR: &str = "user.cortexfs.commit";

const MAGIC: [u8; 4] = *b"CFSC";
const VERSION: u32 = 1;

/// An end offset and the CRC-32 of every byte before it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mark {
    /// End offset.
    pub end: u64,
    /// CRC-32 (IEEE) of bytes `[0, end)`.
    pub crc: u32,
}

/// The two marks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Evidence {
    /// The last acknowledged state.
    pub prev: Mark,
    /// The state being committed (equal to `prev` when nothing is in flight).
    pub cur: Mark,
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct Raw {
    magic: [u8; 4],
    version: U32,
    prev_end: U64,
    prev_crc: U32,
    cur_end: U64,
    cur_crc: U32,
    check: U32,
}

/// Encoded size in bytes.
pub const SIZE: usize = size_of::<Raw>();

impl Evidence {
    /// Evidence of a settled state: nothing in flight.
    pub fn settled(m: Mark) -> Evidence {
        Evidence { prev: m, cur: m }
    }

    /// Encodes the record.
    pub fn encode(&self) -> [u8; SIZE] {
        let mut raw = Raw {
            magic: MAGIC,
            version: U32::new(VERSION),
            prev_end: U64::new(self.prev.end),
            prev_crc: U32::new(self.prev.crc),
            cur_end: U64::new(self.cur.end),
            cur_crc: U32::new(self.cur.crc),
            check: U32::new(0),
        };
        raw.check = U32::new(crc32fast::hash(&raw.as_bytes()[..SIZE - 4]));
        let mut out = [0u8; SIZE];
        out.copy_from_slice(raw.as_bytes());
        out
    }

    /// Decodes a record, refusing anything that is not exactly a valid one.
    pub fn decode(bytes: &[u8]) -> Result<Evidence, String> {
        let raw = Raw::read_from_bytes(bytes)
            .map_err(|_| format!("commit evidence is {} bytes, expected {SIZE}", bytes.len()))?;
        if raw.magic != MAGIC {
            return Err("commit evidence has a bad magic number".into());
        }
        if raw.version.get() != VERSION {
            return Err(format!("commit evidence version {} is not supported", raw.version.get()));
        }
        if raw.check.get() != crc32fast::hash(&bytes[..SIZE - 4]) {
            return Err("commit evidence fails its own checksum".into());
        }
        let e = Evidence {
            prev: Mark { end: raw.prev_end.get(), crc: raw.prev_crc.get() },
            cur: Mark { end: raw.cur_end.get(), crc: raw.cur_crc.get() },
        };
        if e.cur.end < e.prev.end {
            return Err("commit evidence ends before its previous mark".into());
        }
        Ok(e)
    }
}

/// Extends a running CRC-32 over more bytes.
pub fn extend(crc: u32, bytes: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new_with_initial(crc);
    h.update(bytes);
    h.finalize()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The on-disk format, byte for byte: a log written by one version is read by the next.
    #[test]
    fn golden_bytes_of_version_1() {
        let golden = include_bytes!("../../fixtures/evidence-v1.bin");
        let e = Evidence { prev: Mark { end: 8, crc: 0x1122_3344 }, cur: Mark { end: 16, crc: 0x5566_7788 } };
        assert_eq!(&e.encode()[..], &golden[..]);
        assert_eq!(Evidence::decode(golden), Ok(e));
    }

    #[test]
    fn roundtrip_and_refusals() {
        let e = Evidence { prev: Mark { end: 10, crc: 7 }, cur: Mark { end: 20, crc: 9 } };
        let b = e.encode();
        assert_eq!(Evidence::decode(&b), Ok(e));
        for i in 0..SIZE {
            let mut bad = b;
            bad[i] ^= 1;
            assert!(Evidence::decode(&bad).is_err(), "flip at {i}");
        }
        assert!(Evidence::decode(&b[..SIZE - 1]).is_err());
        let back = Evidence { prev: Mark { end: 20, crc: 0 }, cur: Mark { end: 10, crc: 0 } };
        assert!(Evidence::decode(&back.encode()).is_err());
    }

    #[test]
    fn running_crc_matches_whole() {
        let a = b"{\"a\":1}\n";
        let b = b"{\"b\":2}\n";
        let whole = [&a[..], &b[..]].concat();
        assert_eq!(extend(extend(0, a), b), crc32fast::hash(&whole));
    }
}
