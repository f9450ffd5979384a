//! ringfs: opening a log recovers whatever a crash (or anyone) left: any content with any
//! evidence attribute opens or is refused with an error, never a panic, and what it keeps is
//! whole lines.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringfs::log::{AppendLog, Options, evidence};

fuzz_target!(|data: &[u8]| {
    let (ev, content) = data.split_at(data.len().min(evidence::SIZE));
    let dir = std::env::temp_dir().join(format!("cortexfs-fuzz-recovery.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("fuzz directory");
    let path = dir.join("events.jsonl");
    std::fs::write(&path, content).expect("log file");
    if ev.len() == evidence::SIZE {
        let _ = rustix::fs::setxattr(&path, evidence::XATTR, ev, rustix::fs::XattrFlags::empty());
    }
    if let Ok((log, _)) = AppendLog::open(&path, Options::default()) {
        let mut kept = vec![0u8; log.len() as usize];
        let n = log.read_at(&mut kept, 0).expect("read what was kept");
        assert!(n == 0 || kept[n - 1] == b'\n', "recovery keeps whole lines");
    }
});
