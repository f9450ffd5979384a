//! The receipt socket's messages: what the lifecycle tools inside a sandbox send to the run's
//! supervisor outside it, one JSON line each, and the reply.
//!
//! A request is checked whole against these types before anything runs: an unknown operation,
//! an unknown or misspelt field, a field of the wrong type, a mount that is not exactly
//! `[source, target, mode]`: each is refused (exit code 2) and nothing happens. A request never
//! names its caller: the socket it arrives on is the caller.
//!
//! `agent.create` takes the seed's spelling (`{"name","label","model":[...],"tools":[...],
//! "shared":{"project-a":["read"]},"mount":[[src,tgt,"ro"]]}`) and this project's earlier one
//! (`models`, `shared` as `["NAME:read"]`, `mounts`) alike.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Most bytes of one request line.
pub const REQUEST_MAX: usize = 256 * 1024;
/// The controls an agent may replace in itself through `agent.update`.
pub const SELF_UPDATABLE: &[&str] = crate::controls::AGENT_SELF;
/// Most bytes `agent.update` accepts.
pub const UPDATE_MAX: usize = 8 * 1024;

/// The reply to a request, one JSON line: `{"ok":true,"message":..}` or
/// `{"ok":false,"code":N,"error":..}` (codes: 2 invalid, 13 refused, 1 failed, 69 unavailable).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reply {
    /// Whether it was done.
    pub ok: bool,
    /// What was done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The exit code of a refusal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<i32>,
    /// Why it was refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Reply {
    /// Done, saying what.
    pub fn done(message: impl Into<String>) -> Reply {
        Reply { ok: true, message: Some(message.into()), ..Reply::default() }
    }

    /// Refused with an exit code and why.
    pub fn refused(code: i32, error: impl Into<String>) -> Reply {
        Reply { ok: false, code: Some(code), error: Some(error.into()), ..Reply::default() }
    }
}

/// A request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", content = "input", deny_unknown_fields)]
pub enum Request {
    /// Create a child agent.
    #[serde(rename = "agent.create")]
    Create(Create),
    /// Start an owned child.
    #[serde(rename = "agent.start")]
    Start(StartChild),
    /// Stop an owned child.
    #[serde(rename = "agent.stop")]
    Stop(StopChild),
    /// Replace one of the caller's self-updatable controls.
    #[serde(rename = "agent.update")]
    Update(Update),
}

impl Request {
    /// The lifecycle tool the request is for.
    pub fn tool(&self) -> &'static str {
        match self {
            Request::Create(_) => "agent.create",
            Request::Start(_) => "agent.start",
            Request::Stop(_) => "agent.stop",
            Request::Update(_) => "agent.update",
        }
    }

    /// Parses one request line; the error says what is wrong with it.
    pub fn parse(line: &[u8]) -> Result<Request, String> {
        if line.len() > REQUEST_MAX {
            return Err(format!("a request is at most {REQUEST_MAX} bytes"));
        }
        serde_json::from_slice(line).map_err(|e| format!("invalid request: {e}"))
    }
}

/// `agent.create`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Create {
    /// The child's name.
    pub name: String,
    /// Its label (default: derived from the name).
    #[serde(default)]
    pub label: Option<String>,
    /// Tools granted.
    #[serde(default)]
    pub tools: Vec<String>,
    /// Models granted; the first is the child's model.
    #[serde(default, alias = "model")]
    pub models: Vec<String>,
    /// Shared spaces granted.
    #[serde(default)]
    pub shared: SharedGrants,
    /// The child's mount table.
    #[serde(default, alias = "mount")]
    pub mounts: Vec<[String; 3]>,
    /// Supplementary groups.
    #[serde(default)]
    pub groups: Vec<u32>,
}

/// Shared-space grants, in either spelling.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum SharedGrants {
    /// `["NAME:read", "NAME:write"]`.
    List(Vec<String>),
    /// `{"NAME": ["read", "write"]}`.
    Map(BTreeMap<String, Vec<String>>),
}

impl Default for SharedGrants {
    fn default() -> SharedGrants {
        SharedGrants::List(Vec::new())
    }
}

impl SharedGrants {
    /// Each space with whether it is granted for writing; an unknown permission is an error.
    pub fn spaces(&self) -> Result<Vec<(String, bool)>, String> {
        let mode = |name: &str, perm: &str| match perm {
            "read" => Ok(false),
            "write" => Ok(true),
            p => Err(format!("shared {name}: {p:?} is not read or write")),
        };
        match self {
            SharedGrants::List(l) => l
                .iter()
                .map(|s| {
                    let (n, p) =
                        s.split_once(':').ok_or_else(|| format!("shared {s:?}: expected NAME:read|write"))?;
                    Ok((n.to_owned(), mode(n, p)?))
                })
                .collect(),
            SharedGrants::Map(m) => m
                .iter()
                .map(|(n, perms)| {
                    let mut write = false;
                    for p in perms {
                        write |= mode(n, p)?;
                    }
                    Ok((n.clone(), write))
                })
                .collect(),
        }
    }
}

/// `agent.start`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartChild {
    /// The child.
    pub name: String,
    /// Its session (default: `<caller>.<caller's session>`).
    #[serde(default)]
    pub session: Option<String>,
    /// What the child is handed (`handoff.md` of its record).
    #[serde(default)]
    pub handoff: Option<String>,
    /// The child's command (default: tsh).
    #[serde(default)]
    pub cmd: Vec<String>,
}

/// `agent.stop`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StopChild {
    /// The child.
    pub name: String,
    /// One of its sessions (default: all that this run started).
    #[serde(default)]
    pub session: Option<String>,
}

/// `agent.update`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Update {
    /// `system.md` or `prompt.template.md`.
    pub control: String,
    /// The new content.
    pub content: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seeds_create_request_is_taken_as_written() {
        let r = Request::parse(
            br#"{"op":"agent.create","input":{"name":"kid","label":"kid_t","model":["p/m"],"tools":["fs.read"],"shared":{"project-a":["read"]},"mount":[["/src","/mnt/src","ro"]]}}"#,
        )
        .unwrap();
        let Request::Create(c) = r else { panic!("not a create") };
        assert_eq!(c.models, ["p/m"]);
        assert_eq!(c.mounts, [["/src".to_owned(), "/mnt/src".to_owned(), "ro".to_owned()]]);
        assert_eq!(c.shared.spaces().unwrap(), [("project-a".to_owned(), false)]);
        let old = Request::parse(
            br#"{"op":"agent.create","input":{"name":"kid","models":["p/m"],"shared":["x:write"],"mounts":[["/a","/b","rw"]]}}"#,
        )
        .unwrap();
        let Request::Create(c) = old else { panic!("not a create") };
        assert_eq!(c.shared.spaces().unwrap(), [("x".to_owned(), true)]);
    }

    #[test]
    fn anything_off_schema_is_refused_whole() {
        for bad in [
            &br#"{"op":"agent.create","input":{"name":"k","mounts":[["/a","/b","ro","--uid"]]}}"#[..],
            br#"{"op":"agent.create","input":{"name":"k","mounts":[["/a","/b"]]}}"#,
            br#"{"op":"agent.create","input":{"name":"k","agent":"other"}}"#,
            br#"{"op":"agent.create","input":{"name":7}}"#,
            br#"{"op":"agent.create","input":{"name":"k","groups":[-1]}}"#,
            br#"{"op":"agent.update","input":{"control":"system.md","content":"x","agent":"w"}}"#,
            br#"{"op":"agent.start","input":{"name":"k","cmd":"sh"}}"#,
            br#"{"op":"agent.delete","input":{"name":"k"}}"#,
            br#"{"op":"agent.stop"}"#,
            br#"{"op":"agent.stop","input":{"name":"k"},"as":"root"}"#,
            b"not json",
        ] {
            assert!(Request::parse(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        let bad_shared =
            Request::parse(br#"{"op":"agent.create","input":{"name":"k","shared":{"x":["own"]}}}"#);
        let Ok(Request::Create(c)) = bad_shared else { panic!("parses") };
        assert!(c.shared.spaces().is_err());
    }
}
