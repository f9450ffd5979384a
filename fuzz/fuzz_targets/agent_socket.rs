//! The agent socket: any request line a client sends gives a request or a refusal with a
//! stable code, never a panic, and a parsed request holds only checked names and paths.
#![no_main]

use libfuzzer_sys::fuzz_target;
use policy::asock::{Request, parse};

fuzz_target!(|data: &[u8]| {
    match parse(data) {
        Ok(Request::Send(s)) => {
            assert!(policy::name::validate(&s.session).is_ok());
            assert!(!s.id.is_empty() && s.id.len() <= policy::asock::ID_MAX);
            assert!(s.cwd.iter().chain(&s.files).all(|p| p.starts_with('/')));
        }
        Ok(_) => {}
        Err(r) => assert!(["EINVAL", "EMSGSIZE"].contains(&r.code)),
    }
});
