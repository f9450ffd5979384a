//! The `mcpServers` config file shared with other MCP clients:
//!
//! ```json
//! { "mcpServers": { "fs": { "command": "/usr/bin/node", "args": ["server.js", "/srv"],
//!                           "env": { "TOKEN": "..." }, "cwd": "/srv" } } }
//! ```
//!
//! Only the chosen entry is read closely: `command` (required), `args`, `env`, `cwd`. Fields other
//! clients use (`disabled`, `autoApprove`, ...) are ignored; an entry with a `url` or a `type`
//! other than `stdio` is refused, because ctxmcp speaks stdio only. Env values are handed to the
//! server and never written anywhere.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use crate::{Error, Result};

/// The largest config file read, in bytes.
pub const CONFIG_MAX: usize = 1024 * 1024;

/// How to start one stdio server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerConfig {
    /// Its name in the config, which is also the first part of every projected tool name.
    pub name: String,
    /// The program.
    pub command: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Variables added to its environment.
    pub env: BTreeMap<String, String>,
    /// Its working directory, if not the caller's.
    pub cwd: Option<String>,
}

/// Checks that `server` can name projected tools `<server>.<tool>`.
pub fn check_server_name(server: &str) -> std::result::Result<(), String> {
    policy::Name::mcp(server, "x").map(drop).map_err(|e| format!("server name {server:?}: {e}"))
}

/// Reads the config file at `path` and picks `server` from it.
pub fn load(path: &Path, server: &str) -> Result<ServerConfig> {
    let bytes = crate::read_small(path, CONFIG_MAX)?;
    parse(&bytes, server).map_err(|message| Error::Config { path: path.to_path_buf(), message })
}

/// Parses a config and picks `server` from it.
pub fn parse(bytes: &[u8], server: &str) -> std::result::Result<ServerConfig, String> {
    check_server_name(server)?;
    let root: Value = serde_json::from_slice(bytes).map_err(|e| format!("invalid JSON: {e}"))?;
    let servers = match root.get("mcpServers") {
        Some(Value::Object(m)) => m,
        Some(_) => return Err("mcpServers must be an object".into()),
        None => return Err("no mcpServers object".into()),
    };
    let Some(entry) = servers.get(server) else {
        let names: Vec<&str> = servers.keys().map(String::as_str).collect();
        return Err(format!("no server {server:?} in mcpServers (it has: {})", names.join(", ")));
    };
    let Value::Object(entry) = entry else {
        return Err(format!("mcpServers.{server} must be an object"));
    };
    let at = |k: &str| format!("mcpServers.{server}.{k}");
    if entry.contains_key("url") {
        return Err(format!("{} is set: ctxmcp speaks to stdio servers only", at("url")));
    }
    match entry.get("type") {
        None => {}
        Some(Value::String(t)) if t == "stdio" => {}
        Some(t) => return Err(format!("{} is {t}: ctxmcp speaks to stdio servers only", at("type"))),
    }
    let string = |k: &str, v: &Value| match v {
        Value::String(s) => Ok(s.clone()),
        _ => Err(format!("{} must be a string", at(k))),
    };
    let command = match entry.get("command") {
        Some(v) => string("command", v)?,
        None => return Err(format!("{} is missing", at("command"))),
    };
    if command.is_empty() {
        return Err(format!("{} is empty", at("command")));
    }
    let args = match entry.get("args") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => {
            a.iter().map(|v| string("args", v)).collect::<std::result::Result<_, _>>()?
        }
        Some(_) => return Err(format!("{} must be an array of strings", at("args"))),
    };
    let env = match entry.get("env") {
        None | Some(Value::Null) => BTreeMap::new(),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| Ok((k.clone(), string("env", v)?)))
            .collect::<std::result::Result<_, String>>()?,
        Some(_) => return Err(format!("{} must be an object of strings", at("env"))),
    };
    if let Some(k) = env.keys().find(|k| k.is_empty() || k.contains(['=', '\0'])) {
        return Err(format!("{}: {k:?} is not a variable name", at("env")));
    }
    let cwd = entry.get("cwd").map(|v| string("cwd", v)).transpose()?;
    Ok(ServerConfig { name: server.to_owned(), command, args, env, cwd })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_named_server() {
        let c = br#"{"mcpServers":{"fs":{"command":"/usr/bin/node","args":["a","b"],"env":{"K":"v"},
            "autoApprove":[]},"other":{"url":"http://x"}}}"#;
        let s = parse(c, "fs").unwrap();
        assert_eq!((s.command.as_str(), s.args.len(), s.env["K"].as_str()), ("/usr/bin/node", 2, "v"));
        assert!(parse(c, "other").unwrap_err().contains("stdio servers only"));
        assert!(parse(c, "nope").unwrap_err().contains("it has: fs, other"));
    }

    #[test]
    fn refuses_bad_entries() {
        for (bad, why) in [
            (&br#"[]"#[..], "no mcpServers"),
            (br#"{"mcpServers":{"s":{}}}"#, "command is missing"),
            (br#"{"mcpServers":{"s":{"command":""}}}"#, "is empty"),
            (br#"{"mcpServers":{"s":{"command":"x","args":"a"}}}"#, "array of strings"),
            (br#"{"mcpServers":{"s":{"command":"x","args":[1]}}}"#, "must be a string"),
            (br#"{"mcpServers":{"s":{"command":"x","env":{"A=B":"1"}}}}"#, "not a variable name"),
            (br#"{"mcpServers":{"s":{"command":"x","type":"sse"}}}"#, "stdio servers only"),
            (b"{", "invalid JSON"),
        ] {
            let e = parse(bad, "s").unwrap_err();
            assert!(e.contains(why), "{e}");
        }
        let dotted = br#"{"mcpServers":{"a.b":{"command":"x"}}}"#;
        assert!(parse(dotted, "a.b").unwrap_err().contains("may not contain '.'"));
    }
}
