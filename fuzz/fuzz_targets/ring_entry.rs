//! A FUSE-over-io_uring ring entry (headers, then the payload buffer), as the kernel fills one:
//! the server's decoder answers or refuses any bytes, never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = server::transport::uring::serve_entry_bytes(data);
});
