//! The journal's on-disk format, pure: encoding and the reader [`scan`] (no I/O; fuzzed).
//!
//! A journal file is two superblock slots of [`BLOCK`] bytes, then a ring of `cap` bytes:
//!
//! ```text
//! [0, 4096)        superblock slot 0  } the valid slot with the higher generation is current
//! [4096, 8192)     superblock slot 1  }
//! [8192, 8192+cap) the ring: records, each 8-byte aligned, at logical positions (ever growing);
//!                  logical position L is at 8192 + L % cap
//! ```
//!
//! A superblock (little-endian, [`SB_SIZE`] bytes, then zeros): magic `CFSJ`, version, the
//! ring's capacity, the checkpoint generation, `tail` (the logical position of the first record
//! not yet known to be in its file on disk) and `tail_seq` (that record's sequence number),
//! then a CRC-32 of the bytes before it.
//!
//! A record ([`HEADER`] bytes, then the file's path relative to the storage, then the data,
//! then zeros to the next multiple of 8): magic `CFJR`, kind (1 an append, 2 a pad: the rest of
//! the ring's lap is unused and the next record is at the start of the ring), three zero bytes,
//! the sequence number (each append one more than the one before; a pad carries the number of
//! the append after it), the file's inode number and birth time (nanoseconds, 0 when the
//! filesystem keeps none), the offset in the file where the data goes, the path's length (u16),
//! two zero bytes, the data's length (u32), a CRC-32 of the header (this field as zero), path
//! and data, and four zero bytes. When less than a header is left in a lap, the next record is
//! at the start of the ring with no pad.
//!
//! Reading starts at `tail` expecting `tail_seq` and stops at the first record that is not
//! exactly the next one (a bad magic, kind, checksum, length or sequence number): what follows
//! was never acknowledged, or belongs to an earlier lap.

use zerocopy::byteorder::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// Size of a superblock slot, and of the area before the ring.
pub const BLOCK: u64 = 4096;
/// Where the ring starts in the file.
pub const RING_START: u64 = 2 * BLOCK;
/// The longest path a record holds.
pub const MAX_PATH: usize = 4096;
/// The longest data a record holds: a log's longest batch of lines.
pub const MAX_DATA: usize = 16 << 20;

const SB_MAGIC: [u8; 4] = *b"CFSJ";
const RECORD_MAGIC: [u8; 4] = *b"CFJR";
const VERSION: u32 = 1;
/// Record kinds.
const APPEND: u8 = 1;
const PAD: u8 = 2;

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct RawSuper {
    magic: [u8; 4],
    version: U32,
    cap: U64,
    generation: U64,
    tail: U64,
    tail_seq: U64,
    crc: U32,
}

/// Encoded size of a superblock.
pub const SB_SIZE: usize = size_of::<RawSuper>();

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct RawHeader {
    magic: [u8; 4],
    kind: u8,
    zero: [u8; 3],
    seq: U64,
    ino: U64,
    born: U64,
    offset: U64,
    path_len: U16,
    zero2: [u8; 2],
    data_len: U32,
    crc: U32,
    zero3: [u8; 4],
}

/// Size of a record header.
pub const HEADER: usize = size_of::<RawHeader>();

/// A superblock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Super {
    /// The ring's capacity in bytes.
    pub cap: u64,
    /// Checkpoints written so far; the slot is `generation % 2`.
    pub generation: u64,
    /// Logical position of the first record to replay.
    pub tail: u64,
    /// Its sequence number.
    pub tail_seq: u64,
}

impl Super {
    /// Encodes the superblock.
    pub fn encode(&self) -> [u8; SB_SIZE] {
        let mut raw = RawSuper {
            magic: SB_MAGIC,
            version: U32::new(VERSION),
            cap: U64::new(self.cap),
            generation: U64::new(self.generation),
            tail: U64::new(self.tail),
            tail_seq: U64::new(self.tail_seq),
            crc: U32::new(0),
        };
        raw.crc = U32::new(crc32fast::hash(&raw.as_bytes()[..SB_SIZE - 4]));
        let mut out = [0u8; SB_SIZE];
        out.copy_from_slice(raw.as_bytes());
        out
    }

    /// Decodes a superblock slot; `None` unless it is exactly a valid one.
    pub fn decode(bytes: &[u8]) -> Option<Super> {
        let raw = RawSuper::read_from_prefix(bytes).ok()?.0;
        if raw.magic != SB_MAGIC
            || raw.version.get() != VERSION
            || raw.crc.get() != crc32fast::hash(&bytes[..SB_SIZE - 4])
        {
            return None;
        }
        let s = Super {
            cap: raw.cap.get(),
            generation: raw.generation.get(),
            tail: raw.tail.get(),
            tail_seq: raw.tail_seq.get(),
        };
        (s.cap >= 64 * 1024 && s.cap.is_multiple_of(8)).then_some(s)
    }
}

/// One append as the journal holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record<'a> {
    /// Sequence number.
    pub seq: u64,
    /// The file's path relative to the storage.
    pub path: &'a [u8],
    /// The file's inode number.
    pub ino: u64,
    /// The file's birth time in nanoseconds, 0 when unknown.
    pub born: u64,
    /// Where the data goes in the file.
    pub offset: u64,
    /// The data.
    pub data: &'a [u8],
}

/// The encoded length of a record with a path of `path` and data of `data` bytes.
pub fn record_len(path: usize, data: usize) -> usize {
    (HEADER + path + data).next_multiple_of(8)
}

impl Record<'_> {
    /// Appends the encoded record to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        let start = out.len();
        let raw = RawHeader {
            magic: RECORD_MAGIC,
            kind: APPEND,
            zero: [0; 3],
            seq: U64::new(self.seq),
            ino: U64::new(self.ino),
            born: U64::new(self.born),
            offset: U64::new(self.offset),
            path_len: U16::new(u16::try_from(self.path.len()).expect("a path of at most 4 KiB")),
            zero2: [0; 2],
            data_len: U32::new(u32::try_from(self.data.len()).expect("data of at most 16 MiB")),
            crc: U32::new(0),
            zero3: [0; 4],
        };
        out.extend_from_slice(raw.as_bytes());
        out.extend_from_slice(self.path);
        out.extend_from_slice(self.data);
        let crc = crc32fast::hash(&out[start..]);
        out[start + HEADER - 8..start + HEADER - 4].copy_from_slice(&crc.to_le_bytes());
        out.resize(start + record_len(self.path.len(), self.data.len()), 0);
    }
}

/// A pad header carrying `seq`, the number of the append after it.
pub fn pad(seq: u64) -> [u8; HEADER] {
    let mut raw = RawHeader {
        magic: RECORD_MAGIC,
        kind: PAD,
        zero: [0; 3],
        seq: U64::new(seq),
        ino: U64::new(0),
        born: U64::new(0),
        offset: U64::new(0),
        path_len: U16::new(0),
        zero2: [0; 2],
        data_len: U32::new(0),
        crc: U32::new(0),
        zero3: [0; 4],
    };
    raw.crc = U32::new(crc32fast::hash(raw.as_bytes()));
    let mut out = [0u8; HEADER];
    out.copy_from_slice(raw.as_bytes());
    out
}

/// Where a record of `len` bytes that would start at logical position `pos` starts: `pos`, or
/// the start of the next lap when it does not fit in this one. The second value says whether
/// a pad header is written at `pos` (there is room for one).
pub fn place(pos: u64, len: u64, cap: u64) -> (u64, bool) {
    let left = cap - pos % cap;
    if len <= left { (pos, false) } else { (pos + left, left >= HEADER as u64) }
}

/// What [`scan`] found.
#[derive(Debug, PartialEq, Eq)]
pub struct Scan<'a> {
    /// The current superblock.
    pub sup: Super,
    /// The records from the tail, in order.
    pub records: Vec<Record<'a>>,
    /// The logical position after the last record.
    pub head: u64,
    /// The sequence number the next record gets.
    pub next_seq: u64,
}

/// Reads a journal image (the whole file): the current superblock and every record from its
/// tail. `Err` when neither superblock slot is valid or the image is shorter than its ring.
pub fn scan(image: &[u8]) -> Result<Scan<'_>, String> {
    let slot = |i: u64| image.get((i * BLOCK) as usize..((i + 1) * BLOCK) as usize).and_then(Super::decode);
    let sup = match (slot(0), slot(1)) {
        (Some(a), Some(b)) => {
            if a.generation >= b.generation {
                a
            } else {
                b
            }
        }
        (Some(a), None) => a,
        (None, Some(b)) => b,
        (None, None) => return Err("no valid superblock".into()),
    };
    let cap = sup.cap;
    let ring = usize::try_from(RING_START + cap)
        .ok()
        .and_then(|end| image.get(RING_START as usize..end))
        .ok_or_else(|| format!("the journal is shorter than its ring of {cap} bytes"))?;
    let mut records = Vec::new();
    let (mut pos, mut seq) = (sup.tail, sup.tail_seq);
    if !pos.is_multiple_of(8) {
        return Err("the superblock's tail is not 8-byte aligned".into());
    }
    loop {
        let left = cap - pos % cap;
        if left < HEADER as u64 {
            match pos.checked_add(left) {
                Some(p) if p - sup.tail < cap => pos = p,
                _ => break,
            }
            continue;
        }
        let at = (pos % cap) as usize;
        let Ok((raw, _)) = RawHeader::read_from_prefix(&ring[at..]) else { break };
        if raw.magic != RECORD_MAGIC || raw.seq.get() != seq || raw.zero != [0; 3] {
            break;
        }
        if raw.kind == PAD {
            let mut check = [0u8; HEADER];
            check.copy_from_slice(&ring[at..at + HEADER]);
            check[HEADER - 8..HEADER - 4].fill(0);
            if raw.crc.get() != crc32fast::hash(&check) {
                break;
            }
            match pos.checked_add(left) {
                Some(p) if p - sup.tail < cap => pos = p,
                _ => break,
            }
            continue;
        }
        if raw.kind != APPEND {
            break;
        }
        let (plen, dlen) = (raw.path_len.get() as usize, raw.data_len.get() as usize);
        if plen == 0 || plen > MAX_PATH || dlen == 0 || dlen > MAX_DATA {
            break;
        }
        let len = record_len(plen, dlen);
        if len as u64 > left || (pos + len as u64) - sup.tail > cap {
            break;
        }
        let body = &ring[at..at + HEADER + plen + dlen];
        let mut h = crc32fast::Hasher::new();
        h.update(&body[..HEADER - 8]);
        h.update(&[0; 4]);
        h.update(&body[HEADER - 4..]);
        if raw.crc.get() != h.finalize() {
            break;
        }
        records.push(Record {
            seq,
            path: &body[HEADER..HEADER + plen],
            ino: raw.ino.get(),
            born: raw.born.get(),
            offset: raw.offset.get(),
            data: &body[HEADER + plen..],
        });
        pos += len as u64;
        seq += 1;
    }
    Ok(Scan { sup, records, head: pos, next_seq: seq })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(cap: u64, sup: Super, at: u64, bytes: &[u8]) -> Vec<u8> {
        let mut img = vec![0u8; (RING_START + cap) as usize];
        img[..SB_SIZE].copy_from_slice(&sup.encode());
        let off = (RING_START + at % cap) as usize;
        img[off..off + bytes.len()].copy_from_slice(bytes);
        img
    }

    #[test]
    fn records_round_trip_and_stop_at_the_first_wrong_one() {
        let cap = 64 * 1024;
        let mut bytes = Vec::new();
        for seq in 5..8 {
            Record { seq, path: b"home/0/x", ino: 7, born: 9, offset: seq * 10, data: b"{\"a\":1}\n" }
                .encode_into(&mut bytes);
        }
        // A stale record of an earlier lap: its sequence number is not the next one.
        Record { seq: 2, path: b"home/0/x", ino: 7, born: 9, offset: 0, data: b"{}\n" }
            .encode_into(&mut bytes);
        let sup = Super { cap, generation: 1, tail: 64, tail_seq: 5 };
        let img = image(cap, sup, 64, &bytes);
        let s = scan(&img).unwrap();
        assert_eq!(s.records.len(), 3);
        assert_eq!(s.records[2].offset, 70);
        assert_eq!(s.next_seq, 8);
        assert_eq!(s.head, 64 + 3 * record_len(8, 8) as u64);
        // One flipped bit in the second record's data ends the scan before it.
        let mut bad = img.clone();
        let second = (RING_START + 64) as usize + record_len(8, 8) + HEADER + 9;
        bad[second] ^= 1;
        assert_eq!(scan(&bad).unwrap().records.len(), 1);
    }

    #[test]
    fn a_pad_or_a_short_rest_of_the_lap_moves_to_the_ring_start() {
        let cap = 64 * 1024;
        let rec = |seq| {
            let mut b = Vec::new();
            Record { seq, path: b"p", ino: 1, born: 0, offset: 0, data: b"{}\n" }.encode_into(&mut b);
            b
        };
        let len = rec(1).len() as u64;
        // A pad 200 bytes before the lap's end.
        let at = cap - 200;
        let mut img = image(cap, Super { cap, generation: 3, tail: cap + at, tail_seq: 10 }, at, &pad(10));
        let r = rec(10);
        img[RING_START as usize..RING_START as usize + r.len()].copy_from_slice(&r);
        let s = scan(&img).unwrap();
        assert_eq!((s.records.len(), s.head), (1, 2 * cap + len));
        // Fewer bytes than a header left: no pad needed.
        let at = cap - 16;
        let mut img = image(cap, Super { cap, generation: 3, tail: at, tail_seq: 4 }, 0, &rec(4));
        img[(RING_START + at) as usize..][..16].fill(0xff);
        assert_eq!(scan(&img).unwrap().records.len(), 1);
        assert_eq!(place(at, len, cap), (cap, false));
        assert_eq!(place(cap - 200, len.max(201), cap), (cap, true));
    }

    /// What the fuzz target checks, over damaged copies of a real ring: never a panic, the
    /// records read consecutive from the tail and within one ring.
    #[test]
    fn damaged_rings_read_as_a_consecutive_prefix() {
        let cap = 64 * 1024;
        let mut bytes = Vec::new();
        for seq in 0..400u64 {
            let data = format!("{{\"n\":{seq}}}\n");
            Record { seq: 100 + seq, path: b"a/b", ino: 1, born: 2, offset: seq, data: data.as_bytes() }
                .encode_into(&mut bytes);
        }
        let sup = Super { cap, generation: 1, tail: 0, tail_seq: 100 };
        let clean = image(cap, sup, 0, &bytes[..(cap as usize).min(bytes.len())]);
        assert_eq!(scan(&clean).unwrap().records.len(), 400);
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..2000 {
            let mut img = clean.clone();
            for _ in 0..4 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let at = RING_START as usize + (x as usize) % bytes.len();
                img[at] = (x >> 32) as u8;
            }
            let s = scan(&img).unwrap();
            for (i, r) in s.records.iter().enumerate() {
                assert_eq!(r.seq, 100 + i as u64);
                assert_eq!(r.data, format!("{{\"n\":{i}}}\n").as_bytes(), "a damaged record was read");
            }
            assert!(s.head <= cap);
        }
    }

    #[test]
    fn the_newer_valid_superblock_is_current() {
        let cap = 64 * 1024;
        let a = Super { cap, generation: 4, tail: 0, tail_seq: 1 };
        let b = Super { cap, generation: 5, tail: 8, tail_seq: 1 };
        let mut img = vec![0u8; (RING_START + cap) as usize];
        img[..SB_SIZE].copy_from_slice(&a.encode());
        img[BLOCK as usize..BLOCK as usize + SB_SIZE].copy_from_slice(&b.encode());
        assert_eq!(scan(&img).unwrap().sup, b);
        img[BLOCK as usize + 3] ^= 1;
        assert_eq!(scan(&img).unwrap().sup, a);
        img[3] ^= 1;
        assert!(scan(&img).is_err());
    }
}
