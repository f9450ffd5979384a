//! ringfs: any bytes read as a journal (as found on disk, and as a ring behind a valid
//! superblock at any tail) give records or an error, never a panic; what is read is the
//! consecutive run of records from the tail, within one ring's length.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringfs::log::format::{BLOCK, RING_START, SB_SIZE, Super, scan};

fuzz_target!(|data: &[u8]| {
    let _ = scan(data);
    let Some((head, ring)) = data.split_at_checked(16) else { return };
    let cap = 64 * 1024;
    let tail = u64::from_le_bytes(head[..8].try_into().unwrap()) % (4 * cap) & !7;
    let tail_seq = u64::from_le_bytes(head[8..].try_into().unwrap()) >> 1;
    let sup = Super { cap, generation: 1, tail, tail_seq };
    let mut img = vec![0u8; (RING_START + cap) as usize];
    img[BLOCK as usize..BLOCK as usize + SB_SIZE].copy_from_slice(&sup.encode());
    for (i, b) in ring.iter().take(cap as usize).enumerate() {
        img[(RING_START + (tail + i as u64) % cap) as usize] = *b;
    }
    let s = scan(&img).expect("a valid superblock");
    assert_eq!(s.sup, sup);
    for (i, r) in s.records.iter().enumerate() {
        assert_eq!(r.seq, tail_seq + i as u64);
        assert!(!r.path.is_empty() && !r.data.is_empty());
    }
    assert_eq!(s.next_seq, tail_seq + s.records.len() as u64);
    assert!(s.head >= tail && s.head - tail <= cap);
});
