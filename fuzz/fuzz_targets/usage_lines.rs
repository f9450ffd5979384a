//! The lines a tool's or a model's log takes come from agents (tsh appends as the agent), and
//! the daemon counts them for the object's `status`: any bytes are counted or skipped, never a
//! panic, and the status stays `key value` lines that name the object.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use policy::usage::Usage;

fuzz_target!(|data: &[u8]| {
    let u = Usage::default();
    for (log, object) in [("tool/t.d/log", "tool/t"), ("model/p/m.d/log", "model/p/m")] {
        u.note(Path::new(log), data);
        let s = String::from_utf8(u.render(object)).expect("the status is text");
        assert!(s.starts_with(&format!("object {object}\n")));
        assert!(s.lines().all(|l| l.split_once(' ').is_some()), "{s}");
    }
});
