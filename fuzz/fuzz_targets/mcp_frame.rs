//! ctxmcp: a JSON-RPC frame from an MCP server never panics the parser, whatever the bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ctxmcp::jsonrpc::parse_frame(data);
});
