//! cortexfs.object/v2 manifests: parse never panics on any bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let v = policy::cortexfs_version();
    if let Ok(m) = policy::manifest::parse(data, &v) {
        assert!(policy::name::validate(&m.name).is_ok());
    }
});
