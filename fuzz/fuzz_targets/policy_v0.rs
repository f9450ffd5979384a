//! Policy v0: parse never panics; every accepted rule renders to a line that parses back to the
//! same rule, and the compiled policy allows exactly what was parsed.
#![no_main]

use libfuzzer_sys::fuzz_target;
use policy::v0::{self, Policy, Query};

fuzz_target!(|data: &[u8]| {
    let Ok(rules) = v0::parse(data) else { return };
    let policy = Policy::compile(&rules);
    for r in &rules {
        let again = v0::parse_line(r.to_string().as_bytes(), r.line).expect("rendered rule parses");
        assert_eq!(again.as_ref(), Some(r));
        let q = Query { subject: &r.subject, class: r.class, object: &r.object, permission: r.permission };
        assert!(policy.allows(&q));
    }
});
