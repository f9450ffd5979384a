//! A storage path from names the kernel sent: `classify` places any bytes (or refuses them),
//! never panics, and places a path the same way twice.
#![no_main]

use std::os::unix::ffi::OsStrExt;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let p = std::path::Path::new(std::ffi::OsStr::from_bytes(data));
    assert_eq!(server::area::classify(p), server::area::classify(p));
});
