//! ringfs: any bytes in a log's commit-evidence attribute decode to valid evidence or an
//! error, never a panic; what decodes encodes back to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringfs::log::evidence::Evidence;

fuzz_target!(|data: &[u8]| {
    if let Ok(e) = Evidence::decode(data) {
        assert_eq!(&e.encode()[..], data);
    }
});
