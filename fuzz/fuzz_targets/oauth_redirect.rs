//! The redirect `ctx model login` takes on its loopback port comes from whatever connects
//! there: any request target is decoded or skipped, never a panic, and nothing decoded is
//! longer than what came in.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let target = String::from_utf8_lossy(data);
    let params = ctxterm::launch::oauth::query(&target);
    let decoded: usize = params.iter().map(|(k, v)| k.len() + v.len()).sum();
    assert!(decoded <= target.len() * 3, "{decoded} decoded from {}", target.len());
});
