//! The terminal socket: the first line a client sends (`watch`, `attach [COLSxROWS]`,
//! `resize COLSxROWS`) comes from root or the agent's uid. Any bytes give a mode or an error,
//! never a panic, and a size is never zero.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((_, Some((c, r)))) = ctxterm::term::parse_mode(data) {
        assert!(c > 0 && r > 0);
    }
});
