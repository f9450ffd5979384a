//! ctxmcp: an `mcpServers` config and a tool's JSON input never panic their parsers.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ctxmcp::config::parse(data, "s");
    let _ = ctxmcp::call::parse_input(data);
});
