//! The CortexFS core tools (spec §3): `fs.read`, `fs.list`, `fs.stat`, `fs.write`, `shell.exec`
//! and `tsh.config`, built as one multi-call binary, `cortexfs-core`.
//!
//! - [`TOOLS`]: each tool's name, description and input JSON Schema, for whoever installs them as
//!   `tool/<name>` with its `tool/<name>.d/`;
//! - [`run`]: runs one tool and returns its exit status (`main.rs` only picks the tool);
//! - [`tsh_config`]: the core of `tsh.config`, shared with `ctx tool tsh.config`.
//!
//! Inside: `input` (argv, or JSON checked strictly against the schema), `workspace` (paths
//! resolved beneath the workspace with `openat2(RESOLVE_BENEATH)`), the tools in `fs`, `shell`
//! and `tsh`, and `sys` (the one raw call).
//!
//! Exit statuses: 0 ok, 1 failure, 2 invalid input or usage, 13 refused (the path leaves the
//! workspace, or permission denied), 70 internal. `shell.exec` exits with the command's status
//! (128+signal), 124 on timeout, 126 when the command cannot be started, 127 when it is not found.
//!
//! Any crate may depend on this one; of the workspace crates it depends only on `policy`.

pub mod agent;
pub mod bootstrap;
pub mod docs;
mod fs;
mod input;
mod shell;
mod sys;
mod tsh;
mod workspace;

use std::ffi::OsString;
use std::io::{self, Write};
use std::path::PathBuf;

use policy::tshconf::ConfError;

pub use tsh::tsh_config;

/// What a tool is, as installed: `tool/<name>` and its `.d/name`, `.d/description`, `.d/schema`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ToolInfo {
    /// The tool's name, e.g. `fs.read`.
    pub name: &'static str,
    /// One paragraph, ending with a newline.
    pub description: &'static str,
    /// The input JSON Schema (draft 2020-12), ending with a newline.
    pub schema: &'static str,
}

/// The core tools, in the order they are listed.
pub const TOOLS: &[ToolInfo] = &[
    TABLE[0].info,
    TABLE[1].info,
    TABLE[2].info,
    TABLE[3].info,
    TABLE[4].info,
    TABLE[5].info,
    TABLE[6].info,
    TABLE[7].info,
    TABLE[8].info,
    TABLE[9].info,
];

const TABLE: [Tool; 10] = [
    fs::READ,
    fs::LIST,
    fs::STAT,
    fs::WRITE,
    shell::EXEC,
    tsh::CONFIG,
    agent::CREATE,
    agent::START,
    agent::STOP,
    agent::UPDATE,
];

/// A tool's description, CLI synopsis and entry point.
struct Tool {
    info: ToolInfo,
    usage: &'static str,
    run: fn(input::Input) -> Result<i32>,
}

/// Why a tool failed; [`Error::exit_code`] gives its exit status.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The input is malformed, fails the tool's schema or holds a bad value (exit 2).
    #[error("{0}")]
    Invalid(String),
    /// The path resolves outside the workspace (exit 13).
    #[error("{0}: refused: leaves the workspace")]
    Escape(String),
    /// A system call on `what` failed (exit 13 when permission is denied, else 1).
    #[error("{what}")]
    Io {
        /// The path or object the call was about.
        what: String,
        /// What the system said.
        #[source]
        source: io::Error,
    },
    /// Writing to stdout failed (exit 0, silently, when the reader has gone; else 1).
    #[error("stdout")]
    Stdout(#[source] io::Error),
    /// The tsh config file is malformed (exit 1).
    #[error("{}: {}", .path.display(), join(.errors))]
    Config {
        /// The config file.
        path: PathBuf,
        /// Every bad line.
        errors: Vec<ConfError>,
    },
    /// The command could not be started (exit 127 when it is not found, else 126).
    #[error("{what}")]
    Spawn {
        /// The program.
        what: String,
        /// What the system said.
        #[source]
        source: io::Error,
    },
    /// The command ran out of time and was killed (exit 124).
    #[error("timed out after {0} ms")]
    Timeout(u64),
    /// What the tool needs is not there, e.g. a run without a workspace (exit 69).
    #[error("{0}")]
    Unavailable(String),
    /// Something that should not fail did (exit 70).
    #[error("{0}")]
    Internal(String),
}

/// The result of a tool.
pub type Result<T, E = Error> = std::result::Result<T, E>;

fn join(errors: &[ConfError]) -> String {
    errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
}

impl Error {
    /// The exit status this error stands for.
    pub fn exit_code(&self) -> i32 {
        use policy::exit::{DENIED, FAILURE, INTERNAL, INVALID, OK, UNAVAILABLE};
        match self {
            Error::Invalid(_) => INVALID.into(),
            Error::Escape(_) => DENIED.into(),
            Error::Io { source, .. } if source.kind() == io::ErrorKind::PermissionDenied => DENIED.into(),
            Error::Stdout(e) if e.kind() == io::ErrorKind::BrokenPipe => OK.into(),
            Error::Io { .. } | Error::Stdout(_) | Error::Config { .. } => FAILURE.into(),
            // shell.exec follows timeout(1) and the shells here.
            Error::Spawn { source, .. } if source.kind() == io::ErrorKind::NotFound => 127,
            Error::Spawn { .. } => 126,
            Error::Timeout(_) => 124,
            Error::Unavailable(_) => UNAVAILABLE.into(),
            Error::Internal(_) => INTERNAL.into(),
        }
    }

    pub(crate) fn io(what: impl Into<String>, source: impl Into<io::Error>) -> Error {
        Error::Io { what: what.into(), source: source.into() }
    }

    fn usage(tool: &Tool) -> Error {
        Error::Invalid(format!("usage: {} (or JSON input; see --help)", tool.usage))
    }
}

/// Runs the tool `name` with its arguments (argv without the tool name), reporting errors on
/// stderr as `<tool>: <what>: <why>`, and returns its exit status.
pub fn run(name: &str, args: Vec<OsString>) -> i32 {
    let Some(tool) = TABLE.iter().find(|t| t.info.name == name) else {
        let names: Vec<&str> = TOOLS.iter().map(|t| t.name).collect();
        eprintln!("cortexfs-core: unknown tool {name:?}: expected one of {}", names.join(", "));
        return 2;
    };
    if let [arg] = args.as_slice()
        && (arg == "--help" || arg == "-h")
    {
        let _ = io::stdout().write_all(help(tool).as_bytes());
        return 0;
    }
    match input::read(args).and_then(tool.run) {
        Ok(code) => code,
        Err(e) => {
            let code = e.exit_code();
            if code != 0 {
                eprintln!("{name}: {}", chain(&e));
            }
            code
        }
    }
}

fn help(tool: &Tool) -> String {
    format!(
        "usage: {}\n       {name} JSON    (JSON as the only argument, or on stdin)\n\n{}\n\
         exit: 0 ok, 1 failure, 2 invalid input, 13 refused, 70 internal{}\n\ninput schema:\n{}",
        tool.usage,
        tool.info.description,
        if tool.info.name == "shell.exec" { "; else the command's status, 124 timed out" } else { "" },
        tool.info.schema,
        name = tool.info.name,
    )
}

fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(e) = next {
        out.push_str(": ");
        out.push_str(&e.to_string());
        next = e.source();
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests fail loudly by design

    use super::*;
    use serde::de::{self, DeserializeOwned, Visitor};
    use serde_json::{Map, Value, json};

    /// The field names a derived `Deserialize` struct accepts, as serde itself lists them.
    fn fields<T: DeserializeOwned>() -> Vec<&'static str> {
        struct Probe<'a>(&'a mut &'static [&'static str]);
        impl<'de> de::Deserializer<'de> for Probe<'_> {
            type Error = de::value::Error;
            fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
                Err(de::Error::custom("not a struct"))
            }
            fn deserialize_struct<V: Visitor<'de>>(
                self,
                _: &'static str,
                fields: &'static [&'static str],
                _: V,
            ) -> Result<V::Value, Self::Error> {
                *self.0 = fields;
                Err(de::Error::custom("probed"))
            }
            serde::forward_to_deserialize_any! {
                bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
                option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
                ignored_any
            }
        }
        let mut out: &'static [&'static str] = &[];
        let _ = T::deserialize(Probe(&mut out));
        let mut out = out.to_vec();
        out.sort_unstable();
        out
    }

    fn example(schema: &Value) -> Value {
        if let Some(first) = schema.get("enum").and_then(|e| e.get(0)) {
            return first.clone();
        }
        match schema["type"].as_str().unwrap() {
            "string" => json!("x"),
            "integer" => schema.get("minimum").cloned().unwrap_or(json!(0)),
            "array" => {
                let n = schema.get("minItems").and_then(Value::as_u64).unwrap_or(1);
                Value::Array((0..n).map(|_| example(&schema["items"])).collect())
            }
            "object" => match schema.get("properties") {
                Some(p) => Value::Object(
                    p.as_object().unwrap().iter().map(|(k, v)| (k.clone(), example(v))).collect(),
                ),
                // A map: one entry of its values' kind.
                None => json!({"x": example(&schema["additionalProperties"])}),
            },
            other => panic!("no example for type {other}"),
        }
    }

    fn parses<T: DeserializeOwned>(v: &Map<String, Value>) -> bool {
        input::json::<T>(serde_json::to_string(v).unwrap().as_bytes()).is_ok()
    }

    /// Checks that an object schema and the serde struct `T` accept the same input.
    fn same_input<T: DeserializeOwned>(schema: &Value) {
        assert_eq!(schema["type"], "object");
        assert_eq!(schema["additionalProperties"], false);
        let props = schema["properties"].as_object().unwrap();
        let mut keys: Vec<&str> = props.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(keys, fields::<T>());
        let required: Vec<&str> = schema
            .get("required")
            .map_or(vec![], |r| r.as_array().unwrap().iter().map(|k| k.as_str().unwrap()).collect());
        assert!(required.iter().all(|k| props.contains_key(*k)));

        let full = example(schema).as_object().unwrap().clone();
        assert!(parses::<T>(&full), "a full example parses");
        for key in props.keys() {
            let mut without = full.clone();
            without.remove(key);
            assert_eq!(parses::<T>(&without), !required.contains(&key.as_str()), "without {key}");
            let mut null = full.clone();
            null.insert(key.clone(), Value::Null);
            assert!(!parses::<T>(&null), "{key}: null is refused");
        }
        let mut unknown = full;
        unknown.insert("unknown".into(), json!(1));
        assert!(!parses::<T>(&unknown), "an unknown field is refused");
    }

    fn schema(name: &str) -> Value {
        let tool = TOOLS.iter().find(|t| t.name == name).unwrap();
        serde_json::from_str(tool.schema).unwrap()
    }

    #[test]
    fn schemas_match_inputs() {
        for tool in TOOLS {
            assert!(tool.schema.ends_with('\n') && tool.description.ends_with('\n'), "{}", tool.name);
            let s = schema(tool.name);
            assert_eq!(s["$schema"], "https://json-schema.org/draft/2020-12/schema");
        }
        same_input::<fs::ReadInput>(&schema("fs.read"));
        same_input::<fs::ListInput>(&schema("fs.list"));
        same_input::<fs::StatInput>(&schema("fs.stat"));
        same_input::<fs::WriteInput>(&schema("fs.write"));
        same_input::<shell::ExecInput>(&schema("shell.exec"));
        same_input::<tsh::ConfigInput>(&schema("tsh.config"));
        same_input::<tsh::Settings>(&schema("tsh.config")["properties"]["set"]);
        same_input::<agent::CreateInput>(&schema("agent.create"));
        same_input::<agent::StartInput>(&schema("agent.start"));
        same_input::<agent::StopInput>(&schema("agent.stop"));
        same_input::<agent::UpdateInput>(&schema("agent.update"));
    }

    #[test]
    fn the_update_schema_says_what_layer_0_allows() {
        let s = schema("agent.update");
        let allowed: Vec<&str> =
            s["properties"]["control"]["enum"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
        assert_eq!(allowed, policy::receipt::SELF_UPDATABLE);
        assert_eq!(s["properties"]["content"]["maxLength"], json!(policy::receipt::UPDATE_MAX));
    }

    #[test]
    fn tsh_config_schema_ranges_are_the_parsers() {
        let set = &schema("tsh.config")["properties"]["set"]["properties"];
        for (key, range) in set.as_object().unwrap() {
            let (lo, hi) = (range["minimum"].as_u64().unwrap(), range["maximum"].as_u64().unwrap());
            let mut cfg = policy::tshconf::TshConfig::default();
            for (v, ok) in [(lo - 1, false), (lo, true), (hi, true), (hi + 1, false)] {
                assert_eq!(cfg.set(key, &v.to_string()).is_ok(), ok, "{key}={v}");
            }
        }
    }

    #[test]
    fn write_modes_are_the_schema_enum() {
        let modes = &schema("fs.write")["properties"]["mode"]["enum"];
        for mode in modes.as_array().unwrap() {
            let input = json!({"path": "x", "content": "", "mode": mode}).to_string();
            assert!(input::json::<fs::WriteInput>(input.as_bytes()).is_ok(), "{mode}");
        }
        let bad = json!({"path": "x", "content": "", "mode": "truncate"}).to_string();
        assert!(input::json::<fs::WriteInput>(bad.as_bytes()).is_err());
    }

    #[test]
    fn errors_map_to_exit_codes() {
        let os = |code| io::Error::from_raw_os_error(code);
        assert_eq!(Error::io("x", os(2)).exit_code(), 1);
        assert_eq!(Error::io("x", os(13)).exit_code(), 13);
        assert_eq!(Error::io("x", os(1)).exit_code(), 13);
        assert_eq!(Error::Stdout(os(32)).exit_code(), 0);
        assert_eq!(Error::Escape("x".into()).to_string(), "x: refused: leaves the workspace");
        assert_eq!(chain(&Error::io("x", os(2))), "x: No such file or directory (os error 2)");
    }
}
