//! Control files of tool and agent objects: which names exist, who owns them, and what their
//! contents must look like. Used by object install, the FUSE control-write path and manifests.

use crate::name;
use crate::path;
use crate::v0;

/// The largest control file in bytes (a control write replaces at most 64 KiB).
pub const CONTROL_MAX: usize = 64 * 1024;

/// The object kinds that have manifests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ObjectClass {
    /// `tool/<name>`
    Tool,
    /// `agent/<name>`
    Agent,
    /// `model/<provider>/<name>`: installed into its provider's directory.
    Model,
}

impl ObjectClass {
    /// Parses `tool` or `agent`.
    pub fn parse(s: &str) -> Option<ObjectClass> {
        match s {
            "tool" => Some(ObjectClass::Tool),
            "agent" => Some(ObjectClass::Agent),
            "model" => Some(ObjectClass::Model),
            _ => None,
        }
    }

    /// The keyword, which is also the directory under `/ctx`.
    pub fn as_str(self) -> &'static str {
        match self {
            ObjectClass::Tool => "tool",
            ObjectClass::Agent => "agent",
            ObjectClass::Model => "model",
        }
    }
}

/// Who may write a control.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Owner {
    /// Written by the object's owner or root (and by install).
    Host,
    /// An agent may replace its own copy through `agent.update`.
    SelfUpdatable,
    /// Written by the runtime only; read-only to clients and never installed.
    Runtime,
}

const TOOL_HOST: &[&str] =
    &["name", "description", "schema", "cap", "policy", "mcp", "program", "origin", "config"];
const AGENT_HOST: &[&str] = &[
    "owner",
    "uid",
    "gid",
    "groups",
    "iso",
    "perm",
    "label",
    "parent",
    "life",
    "root",
    "cwd",
    "env",
    "path",
    "mount",
    "model",
    "window",
    "policy",
    "tools",
    "abi",
    "approval",
    "meta.json",
    // CortexFS's own: the run's resource ceilings (see crate::limits) and its timeout in
    // seconds (one number; empty for none).
    "limits",
    "timeout",
    // The hosted CLI that runs the turns sent to the agent's socket (codex, claude, pi), or
    // empty for the agent's own executable.
    "profile",
];
const MODEL_HOST: &[&str] =
    &["name", "id", "driver", "default", "fallback", "cap", "effort", "session", "policy", "description"];
/// The controls an agent may replace in itself (`agent.update`).
pub const AGENT_SELF: &[&str] = &["system.md", "prompt.template.md"];
const RUNTIME: &[&str] = &["status", "log", "pid"];

/// Classifies a control name (relative to `<name>.d/`), or `None` if the class has no such
/// control. Hooks are `hooks/pre.d/<NAME>` and `hooks/post.d/<NAME>`.
pub fn classify(class: ObjectClass, control: &str) -> Option<Owner> {
    if let Some(hook) = control.strip_prefix("hooks/pre.d/").or_else(|| control.strip_prefix("hooks/post.d/"))
    {
        return name::validate(hook).ok().map(|()| Owner::Host);
    }
    let runtime = match class {
        ObjectClass::Tool | ObjectClass::Model => &RUNTIME[..2],
        ObjectClass::Agent => RUNTIME,
    };
    if runtime.contains(&control) {
        return Some(Owner::Runtime);
    }
    match class {
        ObjectClass::Tool => TOOL_HOST.contains(&control).then_some(Owner::Host),
        ObjectClass::Model => MODEL_HOST.contains(&control).then_some(Owner::Host),
        ObjectClass::Agent => {
            if AGENT_HOST.contains(&control) {
                Some(Owner::Host)
            } else if AGENT_SELF.contains(&control) {
                Some(Owner::SelfUpdatable)
            } else {
                None
            }
        }
    }
}

/// True for hook controls, which are installed executable.
pub fn is_hook(control: &str) -> bool {
    control.starts_with("hooks/")
}

fn json_object(bytes: &[u8]) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    match serde_json::from_slice::<serde_json::Value>(bytes) {
        Ok(serde_json::Value::Object(m)) => Ok(m),
        Ok(_) => Err("must be a JSON object".into()),
        Err(e) => Err(format!("invalid JSON: {e}")),
    }
}

/// A JSON Schema (`.d/program`): a JSON object that compiles as a schema of a draft the
/// `jsonschema` crate knows (2020-12 unless `$schema` names another), checked against its
/// meta-schema; references outside the document are not followed (and refused).
fn json_schema(bytes: &[u8]) -> Result<(), String> {
    let m = json_object(bytes)?;
    jsonschema::validator_for(&serde_json::Value::Object(m))
        .map(drop)
        .map_err(|e| format!("not a valid JSON Schema: {e}"))
}

/// The `.d/mcp` stdio locator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct McpLocator {
    /// Always `stdio`.
    pub transport: String,
    /// Absolute path of the MCP config file, as visible to the agent.
    pub config: String,
    /// Server name in the config.
    pub server: String,
    /// Remote tool name.
    pub tool: String,
}

/// Parses the `.d/mcp` locator: a JSON object with exactly `transport` (`stdio`), `config`
/// (absolute path), `server` (a name without `.`) and `tool` (non-empty, at most 64 bytes).
pub fn parse_mcp_locator(bytes: &[u8]) -> Result<McpLocator, String> {
    let m = json_object(bytes)?;
    for k in m.keys() {
        if !matches!(k.as_str(), "transport" | "config" | "server" | "tool") {
            return Err(format!("unknown field {k:?}"));
        }
    }
    let field = |k: &str| -> Result<String, String> {
        match m.get(k) {
            Some(serde_json::Value::String(s)) => Ok(s.clone()),
            Some(_) => Err(format!("{k} must be a string")),
            None => Err(format!("missing field {k}")),
        }
    };
    let loc = McpLocator {
        transport: field("transport")?,
        config: field("config")?,
        server: field("server")?,
        tool: field("tool")?,
    };
    if loc.transport != "stdio" {
        return Err(format!("transport {:?} is not supported (only stdio)", loc.transport));
    }
    path::check_absolute(&loc.config).map_err(|e| format!("config: {e}"))?;
    name::Name::mcp(&loc.server, &loc.tool).map_err(|e| format!("server/tool: {e}"))?;
    Ok(loc)
}

fn text(bytes: &[u8]) -> Result<&str, String> {
    std::str::from_utf8(bytes).map_err(|_| "must be UTF-8 text".to_owned())
}

fn one_line(bytes: &[u8]) -> Result<&str, String> {
    let t = text(bytes)?;
    let t = t.strip_suffix('\n').unwrap_or(t);
    if t.contains('\n') { Err("must be a single line".into()) } else { Ok(t) }
}

/// Validates the contents of a control about to be installed or written. `object` is the
/// object's name (the `name` control must repeat it).
pub fn validate(class: ObjectClass, object: &str, control: &str, bytes: &[u8]) -> Result<(), String> {
    if classify(class, control).is_none() {
        return Err(format!("{} objects have no control {control:?}", class.as_str()));
    }
    if bytes.len() > CONTROL_MAX {
        return Err(format!("{} bytes is over the 64 KiB control limit", bytes.len()));
    }
    if is_hook(control) {
        return Ok(());
    }
    match control {
        "policy" => v0::parse(bytes).map(drop).map_err(|errs| {
            let lines: Vec<String> = errs.iter().map(ToString::to_string).collect();
            lines.join("; ")
        }),
        "schema" | "meta.json" => json_object(bytes).map(drop),
        "program" => json_schema(bytes),
        "mcp" => parse_mcp_locator(bytes).map(drop),
        "config" if object == "tsh" => crate::tshconf::parse_config(bytes).map(drop).map_err(|errs| {
            let lines: Vec<String> = errs.iter().map(ToString::to_string).collect();
            lines.join("; ")
        }),
        "config" => Err(format!("only tsh has a config control, not {object:?}")),
        "mount" => crate::mount::parse(bytes).map(drop).map_err(|errs| {
            let lines: Vec<String> = errs.iter().map(ToString::to_string).collect();
            lines.join("; ")
        }),
        "name" => {
            let n = one_line(bytes)?;
            if n == object { Ok(()) } else { Err(format!("{n:?} is not the object's name {object:?}")) }
        }
        "uid" | "gid" => {
            let n = one_line(bytes)?;
            n.parse::<u32>().map(drop).map_err(|_| format!("{n:?} is not a numeric id"))
        }
        "groups" => text(bytes)?.split_ascii_whitespace().try_for_each(|g| {
            g.parse::<u32>().map(drop).map_err(|_| format!("{g:?} is not a numeric group id"))
        }),
        "label" => v0::check_subject(one_line(bytes)?),
        "driver" => crate::model::parse(bytes).map(drop),
        "id" => crate::model::check_id(one_line(bytes)?),
        "limits" => crate::limits::parse(bytes).map(drop),
        "timeout" => match text(bytes)?.trim() {
            "" => Ok(()),
            t => t
                .parse::<u64>()
                .ok()
                .filter(|&t| t > 0)
                .map(drop)
                .ok_or_else(|| format!("{t:?} is not a number of seconds")),
        },
        _ => text(bytes).map(drop),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classify_controls() {
        use ObjectClass::*;
        assert_eq!(classify(Tool, "policy"), Some(Owner::Host));
        assert_eq!(classify(Tool, "status"), Some(Owner::Runtime));
        assert_eq!(classify(Tool, "pid"), None);
        assert_eq!(classify(Tool, "system.md"), None);
        assert_eq!(classify(Agent, "system.md"), Some(Owner::SelfUpdatable));
        assert_eq!(classify(Agent, "pid"), Some(Owner::Runtime));
        assert_eq!(classify(Agent, "mount"), Some(Owner::Host));
        assert_eq!(classify(Agent, "tool"), None, "there is no agent/<n>.d/tool");
        assert_eq!(classify(Tool, "hooks/pre.d/10-check"), Some(Owner::Host));
        assert_eq!(classify(Tool, "hooks/pre.d/../x"), None);
        assert_eq!(classify(Tool, "hooks/other/x"), None);
    }

    #[test]
    fn validate_contents() {
        use ObjectClass::*;
        assert!(validate(Tool, "fs.read", "policy", b"allow a_t tool:fs.read execute\n").is_ok());
        assert!(validate(Tool, "fs.read", "policy", b"allow a_t agent:* create\n").is_err());
        assert!(validate(Tool, "fs.read", "schema", b"{\"type\":\"object\"}").is_ok());
        assert!(validate(Tool, "fs.read", "schema", b"[1]").is_err());
        assert!(validate(Tool, "fs.read", "program", b"nope").is_err());
        let program = br#"{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object","properties":{"n":{"type":"integer","minimum":0}},"required":["n"]}"#;
        assert_eq!(validate(Tool, "fs.read", "program", program), Ok(()));
        // JSON objects that are no JSON Schema: a type that does not exist, a bad pattern, a
        // reference that leads nowhere, a draft nobody knows.
        for bad in [
            &br#"{"type":"integr"}"#[..],
            br#"{"type":"string","pattern":"(unclosed"}"#,
            br#"{"$ref":"https://example.invalid/s.json"}"#,
            br#"{"properties":{"n":{"minimum":"zero"}}}"#,
        ] {
            let r = validate(Tool, "fs.read", "program", bad);
            assert!(
                r.as_ref().is_err_and(|e| e.contains("not a valid JSON Schema")),
                "{}: {r:?}",
                String::from_utf8_lossy(bad)
            );
        }
        assert!(validate(Tool, "fs.read", "name", b"fs.read\n").is_ok());
        assert!(validate(Tool, "fs.read", "name", b"fs.write\n").is_err());
        assert!(validate(Agent, "a", "uid", b"1000\n").is_ok());
        assert!(validate(Agent, "a", "uid", b"-1\n").is_err());
        assert!(validate(Agent, "a", "groups", b"1 2\n3\n").is_ok());
        assert!(validate(Agent, "a", "label", b"a_t\n").is_ok());
        assert!(validate(Agent, "a", "label", b"a t\n").is_err());
        assert!(validate(Tool, "x", "description", &vec![b'a'; CONTROL_MAX + 1]).is_err());
        assert!(validate(Tool, "x", "status", b"").is_ok());
        assert!(validate(Tool, "tsh", "config", b"# tsh\ncache_capacity=64\n").is_ok());
        assert!(validate(Tool, "tsh", "config", b"cache_capacity=0\n").is_err());
        assert!(validate(Tool, "fs.read", "config", b"cache_capacity=64\n").is_err());
    }

    #[test]
    fn mcp_locator() {
        let ok = br#"{"transport":"stdio","config":"/workspace/.mcp.json","server":"github","tool":"search_issues"}"#;
        let l = parse_mcp_locator(ok).unwrap();
        assert_eq!(l.server, "github");
        for bad in [
            &br#"{"transport":"http","config":"/c","server":"s","tool":"t"}"#[..],
            br#"{"transport":"stdio","config":"rel","server":"s","tool":"t"}"#,
            br#"{"transport":"stdio","config":"/c","server":"s.x","tool":"t"}"#,
            br#"{"transport":"stdio","config":"/c","server":"s","tool":"t","env":{}}"#,
            br#"{"transport":"stdio","config":"/c","server":"s"}"#,
            br#"{"transport":"stdio","config":"/c","server":"s","tool":3}"#,
        ] {
            assert!(parse_mcp_locator(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }
}
