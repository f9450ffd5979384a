//! The egress proxy: a request head comes from the agent's sandbox. Any bytes give a head or
//! none, a method and a target, and a yes or no for the model's `host:port`, never a panic; a
//! target that passes names the model's host and port.
#![no_main]

use ctxterm::launch::egress::{Allowed, head_end, request_line};
use libfuzzer_sys::fuzz_target;
use policy::model::Url;

fuzz_target!(|data: &[u8]| {
    let end = head_end(data).unwrap_or(data.len());
    assert!(end <= data.len());
    let (_, target) = request_line(&data[..end]);
    for base in ["https://api.example.com/v1", "http://10.0.0.2:8080"] {
        let a = Allowed { url: Url::parse(base).unwrap() };
        if a.connect(&target) {
            assert!(target.to_ascii_lowercase().contains(&a.url.host.to_ascii_lowercase()));
        }
        let _ = a.plain(&target);
    }
});
