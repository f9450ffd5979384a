//! The daemon's control socket: any line parses to a typed request or an error, never a panic;
//! a request that parses says the same thing once serialized again.
#![no_main]

use libfuzzer_sys::fuzz_target;
use policy::runtime::ControlRequest;

fuzz_target!(|data: &[u8]| {
    if let Ok(req) = ControlRequest::parse(data) {
        let again = serde_json::to_vec(&req).expect("a request serializes");
        assert_eq!(ControlRequest::parse(&again), Ok(req));
    }
});
