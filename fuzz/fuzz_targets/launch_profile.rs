//! A launch profile (`NAME.toml`): parse never panics on any bytes, and the templates of one
//! that reads expand without panicking.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = policy::profile::parse("f", data) {
        let vars = [("prompt", "p"), ("session", "s")];
        for t in p.turn.new.iter().chain(&p.turn.resume) {
            let _ = policy::profile::expand(t, &vars);
        }
        for f in p.model.iter().flat_map(|m| &m.files) {
            if let Some(j) = &f.json {
                let _ = policy::profile::json_of(j, &[("url", "u"), ("model", "m"), ("api", "a"), ("key_env", "K"), ("key", "K")]);
            }
        }
    }
});
