//! Context packs: the shape and provenance checks never panic, whatever the bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

struct Lines<'a>(&'a [u8]);

impl policy::pack::Session for Lines<'_> {
    fn line(&self, _file: &str, n: usize) -> Option<Vec<u8>> {
        self.0.split(|b| *b == b'\n').nth(n.checked_sub(1)?).map(<[u8]>::to_vec)
    }
    fn child(&self, id: &str) -> bool {
        id.len() % 2 == 0
    }
    fn sha256(&self, bytes: &[u8]) -> String {
        format!("{:064x}", bytes.len())
    }
}

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = policy::pack::inspect_context_pack_json(data) {
        let _ = policy::pack::validate_context_pack_source(&p, &p.agent, &p.session, &Lines(data));
    }
});
