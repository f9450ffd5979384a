//! The terminal socket's `turn` request line (`{"argv":[...],"cwd":DIR}`) comes from root or
//! the agent's uid. Any bytes give a request or an error, never a panic; a request has a
//! program, an absolute directory and no NUL.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = ctxterm::term::parse_turn(data) {
        assert!(!r.argv.is_empty() && !r.argv[0].is_empty());
        assert!(r.cwd.starts_with('/'));
        assert!(r.argv.iter().all(|a| !a.contains('\0')));
    }
});
