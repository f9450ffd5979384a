//! `agent.create`, `agent.start`, `agent.stop`, `agent.update`: requests to the run's receipt
//! socket.
//!
//! The socket (`/run/cortexfs/receipt/main.sock` inside an agent's sandbox, or `CTX_RECEIPT`) is
//! served by the supervisor of the agent's run, outside the sandbox. A request carries no agent
//! name of its own: the socket binds it to the caller's agent, session and run, so an agent
//! cannot act as another. The supervisor checks authority (attenuation for `agent.create`,
//! `agent:<child> start|stop`, the two self-updatable controls for `agent.update`) and answers
//! `{"ok":true,"message":...}` or `{"ok":false,"code":N,"error":...}`.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;

use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::input::{self, Input, non_null};
use crate::{Error, Result, Tool, ToolInfo};

/// The receipt socket inside a sandbox.
pub const RECEIPT: &str = "/run/cortexfs/receipt/main.sock";
pub use policy::receipt::UPDATE_MAX;

/// A draft 2020-12 object schema with the given members (from `"properties"` on).
macro_rules! object_schema {
    ($members:literal) => {
        concat!(
            "{\n  \"$schema\": \"https://json-schema.org/draft/2020-12/schema\",\n  \"type\": \"object\",",
            $members
        )
    };
}

pub(crate) const CREATE: Tool = Tool {
    info: ToolInfo {
        name: "agent.create",
        description: "Creates a child agent that may only narrow the caller's world: every rule, \
                      mount and group must be the caller's own (mounts rw->ro and visible->hidden \
                      only), and the caller must hold agent:<child> create. Every widening is \
                      refused with its reason.\n",
        schema: object_schema!(
            r#"
  "properties": {
    "name": {"type": "string"},
    "label": {"type": "string"},
    "tools": {"type": "array", "items": {"type": "string"}},
    "model": {"type": "array", "items": {"type": "string"}, "description": "models granted; the first is the child's model"},
    "models": {"type": "array", "items": {"type": "string"}, "description": "another spelling of model"},
    "shared": {"type": "object", "additionalProperties": {"type": "array", "items": {"type": "string", "enum": ["read", "write"]}},
               "description": "{\"NAME\": [\"read\"]} or [\"read\", \"write\"]; a list [\"NAME:read\", \"NAME:write\"] also"},
    "mount": {"type": "array", "items": {"type": "array", "items": {"type": "string"}, "minItems": 3, "maxItems": 3},
              "description": "[source, target, ro|rw] each"},
    "mounts": {"type": "array", "items": {"type": "array", "items": {"type": "string"}, "minItems": 3, "maxItems": 3},
               "description": "another spelling of mount"},
    "groups": {"type": "array", "items": {"type": "integer", "minimum": 0}}
  },
  "required": ["name"],
  "additionalProperties": false
}
"#
        ),
    },
    usage: "agent.create NAME",
    run: create,
};

pub(crate) const START: Tool = Tool {
    info: ToolInfo {
        name: "agent.start",
        description: "Starts an owned child agent in a sandbox of its own (the caller must hold \
                      agent:<child> start); the child is recorded under the caller's session \
                      (context/child/<id>/) and cancelled when the caller stops.\n",
        schema: object_schema!(
            r#"
  "properties": {
    "name": {"type": "string"},
    "session": {"type": "string"},
    "handoff": {"type": "string"},
    "cmd": {"type": "array", "items": {"type": "string"}}
  },
  "required": ["name"],
  "additionalProperties": false
}
"#
        ),
    },
    usage: "agent.start NAME",
    run: start,
};

pub(crate) const STOP: Tool = Tool {
    info: ToolInfo {
        name: "agent.stop",
        description: "Stops a child agent the caller started (the caller must hold agent:<child> \
                      stop): SIGTERM, a grace period, SIGKILL. Its history stays readable.\n",
        schema: object_schema!(
            r#"
  "properties": {
    "name": {"type": "string"},
    "session": {"type": "string"}
  },
  "required": ["name"],
  "additionalProperties": false
}
"#
        ),
    },
    usage: "agent.stop NAME",
    run: stop,
};

pub(crate) const UPDATE: Tool = Tool {
    info: ToolInfo {
        name: "agent.update",
        description: "Replaces the caller's own system.md or prompt.template.md (at most 8 KiB), \
                      atomically; any other control, or another agent, is refused. It takes \
                      effect at the next run's prompt.\n",
        schema: object_schema!(
            r#"
  "properties": {
    "control": {"type": "string", "enum": ["system.md", "prompt.template.md"]},
    "content": {"type": "string", "maxLength": 8192}
  },
  "required": ["control", "content"],
  "additionalProperties": false
}
"#
        ),
    },
    usage: "agent.update CONTROL   (the content on stdin)",
    run: update,
};

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateInput {
    name: String,
    #[serde(default, deserialize_with = "non_null", skip_serializing_if = "Option::is_none")]
    label: Option<String>,
    #[serde(default, deserialize_with = "non_null", skip_serializing_if = "Option::is_none")]
    tools: Option<Vec<String>>,
    // The seed's spelling (`model`, `mount`, `shared` as a map) and this project's earlier one
    // (`models`, `mounts`, `shared` as a list) alike: the receipt server takes either
    // (policy::receipt::Create) and refuses both at once.
    #[serde(default, deserialize_with = "non_null", skip_serializing_if = "Option::is_none")]
    model: Option<Vec<String>>,
    #[serde(default, deserialize_with = "non_null", skip_serializing_if = "Option::is_none")]
    models: Option<Vec<String>>,
    #[serde(default, deserialize_with = "non_null", skip_serializing_if = "Option::is_none")]
    shared: Option<policy::receipt::SharedGrants>,
    #[serde(default, deserialize_with = "non_null", skip_serializing_if = "Option::is_none")]
    mount: Option<Vec<[String; 3]>>,
    #[serde(default, deserialize_with = "non_null", skip_serializing_if = "Option::is_none")]
    mounts: Option<Vec<[String; 3]>>,
    #[serde(default, deserialize_with = "non_null", skip_serializing_if = "Option::is_none")]
    groups: Option<Vec<u32>>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StartInput {
    name: String,
    #[serde(default, deserialize_with = "non_null", skip_serializing_if = "Option::is_none")]
    session: Option<String>,
    #[serde(default, deserialize_with = "non_null", skip_serializing_if = "Option::is_none")]
    handoff: Option<String>,
    #[serde(default, deserialize_with = "non_null", skip_serializing_if = "Option::is_none")]
    cmd: Option<Vec<String>>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StopInput {
    name: String,
    #[serde(default, deserialize_with = "non_null", skip_serializing_if = "Option::is_none")]
    session: Option<String>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct UpdateInput {
    control: String,
    content: String,
}

/// Sends one request and prints the answer; the exit code is the supervisor's.
fn ask(op: &str, input: serde_json::Value) -> Result<i32> {
    let path = std::env::var("CTX_RECEIPT").unwrap_or_else(|_| RECEIPT.to_owned());
    let mut s = UnixStream::connect(&path)
        .map_err(|e| Error::io(format!("{path} (no receipt socket: not in an agent run?)"), e))?;
    let mut line = json!({"op": op, "input": input}).to_string();
    line.push('\n');
    s.write_all(line.as_bytes()).map_err(|e| Error::io(&path, e))?;
    let mut reply = String::new();
    BufReader::new(s.take(1 << 20)).read_line(&mut reply).map_err(|e| Error::io(&path, e))?;
    let v: policy::receipt::Reply = serde_json::from_str(&reply)
        .map_err(|_| Error::Invalid(format!("{path}: unreadable answer {reply:?}")))?;
    if v.ok {
        let msg = v.message.as_deref().unwrap_or("");
        if !msg.is_empty() {
            println!("{msg}");
        }
        Ok(0)
    } else {
        eprintln!("{op}: {}", v.error.as_deref().unwrap_or("refused"));
        Ok(v.code.unwrap_or(1))
    }
}

fn name_only(input: Input, usage: &str) -> Result<String> {
    match input {
        Input::Args(args) if args.len() == 1 => Ok(args[0].to_string_lossy().into_owned()),
        _ => Err(Error::Invalid(format!("usage: {usage}, or JSON"))),
    }
}

fn create(input: Input) -> Result<i32> {
    let v = match input {
        Input::Json(j) => input::json::<CreateInput>(&j)?,
        other => CreateInput {
            name: name_only(other, CREATE.usage)?,
            label: None,
            tools: None,
            model: None,
            models: None,
            shared: None,
            mount: None,
            mounts: None,
            groups: None,
        },
    };
    ask("agent.create", serde_json::to_value(v).map_err(|e| Error::Invalid(e.to_string()))?)
}

fn start(input: Input) -> Result<i32> {
    let v = match input {
        Input::Json(j) => input::json::<StartInput>(&j)?,
        other => StartInput { name: name_only(other, START.usage)?, session: None, handoff: None, cmd: None },
    };
    ask("agent.start", serde_json::to_value(v).map_err(|e| Error::Invalid(e.to_string()))?)
}

fn stop(input: Input) -> Result<i32> {
    let v = match input {
        Input::Json(j) => input::json::<StopInput>(&j)?,
        other => StopInput { name: name_only(other, STOP.usage)?, session: None },
    };
    ask("agent.stop", serde_json::to_value(v).map_err(|e| Error::Invalid(e.to_string()))?)
}

fn update(input: Input) -> Result<i32> {
    let v = match input {
        Input::Json(j) => input::json::<UpdateInput>(&j)?,
        other => {
            let control = name_only(other, UPDATE.usage)?;
            let mut content = String::new();
            std::io::stdin()
                .take(UPDATE_MAX as u64 + 1)
                .read_to_string(&mut content)
                .map_err(|e| Error::io("stdin", e))?;
            UpdateInput { control, content }
        }
    };
    ask("agent.update", serde_json::to_value(v).map_err(|e| Error::Invalid(e.to_string()))?)
}
