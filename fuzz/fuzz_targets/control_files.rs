//! The small control-file parsers: mount tables, tsh config, .tshrc, CTX_PATH, the MCP locator
//! and control content validation. None may panic; accepted mount tables render and re-parse.
#![no_main]

use libfuzzer_sys::fuzz_target;
use policy::controls::{self, ObjectClass};

fuzz_target!(|data: &[u8]| {
    if let Ok(mounts) = policy::mount::parse(data) {
        let text: String = mounts.iter().map(|m| format!("{m}\n")).collect();
        assert_eq!(policy::mount::parse(text.as_bytes()).expect("re-parse"), mounts);
    }
    if let Ok(cfg) = policy::tshconf::parse_config(data) {
        assert!(cfg.window() >= 1 && cfg.window() <= cfg.cache_capacity);
        assert_eq!(policy::tshconf::parse_config(cfg.render().as_bytes()).expect("re-parse"), cfg);
    }
    let _ = policy::tshconf::parse_tshrc(data);
    if let Ok(s) = std::str::from_utf8(data) {
        let _ = policy::tshconf::parse_ctx_path(s);
    }
    let _ = controls::parse_mcp_locator(data);
    for c in ["policy", "schema", "mount", "name", "groups", "label", "uid", "description"] {
        let _ = controls::validate(ObjectClass::Agent, "a", c, data);
    }
});
