//! The receipt socket: any line from a sandbox parses to a typed request or an error, never a
//! panic; a parsed request's grants are checked without panicking either.
#![no_main]

use libfuzzer_sys::fuzz_target;
use policy::receipt::Request;

fuzz_target!(|data: &[u8]| {
    if let Ok(Request::Create(c)) = Request::parse(data) {
        let _ = c.shared.spaces();
    }
});
