//! A package record in storage: parse never panics on any bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ringfs::object::package::parse_record(data);
});
