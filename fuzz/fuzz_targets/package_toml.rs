//! cortexfs.toml: parse never panics on any bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = policy::package::parse(data, &policy::cortexfs_version());
});
