//! Model routes: `model/<p>/<m>.d/driver` is written by whoever installs a model and read by
//! every launch. Any bytes give a driver or an error, never a panic; a driver that parses
//! writes back to text that parses to the same driver, and its URL is never one with a user,
//! query or fragment.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(d) = policy::model::parse(data) {
        let again = policy::model::parse(d.to_text().as_bytes()).expect("a driver's own text parses");
        assert_eq!(again, d);
        let url = d.base_url.to_string();
        assert!(!url.contains(['@', '?', '#']), "{url}");
        assert_eq!(policy::model::Url::parse(&url).as_ref(), Ok(&d.base_url));
    }
});
