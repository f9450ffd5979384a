//! The agent socket's protocol (`agent/<name>.sock`, spec §11a): JSONL requests from a client,
//! JSONL frames back. Parsed here, whole and bounded, before the server acts on anything.
//!
//! The first frame a server writes on every connection is [`hello`], which names the
//! protocol's version ([`PROTOCOL`]). Requests are one JSON object per line; unknown fields
//! are ignored and an unknown `op` is `EINVAL`.

use serde_json::{Value, json};

/// The protocol and its version, in the first frame of every connection.
pub const PROTOCOL: &str = "cortexfs.agent/1";
/// Most bytes of one frame, in either direction (spec: 1 MiB, else `EMSGSIZE`).
pub const FRAME_MAX: usize = 1 << 20;
/// Most bytes of a client's run `id`.
pub const ID_MAX: usize = 128;
/// Most file references in one `send`.
pub const FILES_MAX: usize = 64;

/// Where a `send` runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// The agent's own session (`home/<uid>/agent/<agent>/session/<s>/`).
    Private,
    /// A session in a shared space (`shared/<space>/agent/<agent>/session/<s>/`).
    Shared,
    /// A session of its own that is removed when the run ends.
    Temp,
}

/// A user turn.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Send {
    /// The client's id of the run: the same id is the same run.
    pub id: String,
    /// The session (a name).
    pub session: String,
    /// Where the session lives.
    pub scope: Scope,
    /// The shared space, for `scope: shared`.
    pub space: Option<String>,
    /// The directory bound at `/workspace` (absolute, on the host), or none.
    pub cwd: Option<String>,
    /// The caller's own directory: bound at `/workspace` when `cwd` is not given and the turn
    /// joins no run (a directory the caller may not give then gives no workspace).
    pub here: Option<String>,
    /// The text of the turn.
    pub input: String,
    /// Files the turn refers to, by absolute path as the agent sees them.
    pub files: Vec<String>,
}

/// A request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// Start a run (a user turn), or follow the run with this id if it exists.
    Send(Send),
    /// The session's records after record `after` (0: all), then the live run, if any.
    Resume {
        /// The session.
        session: String,
        /// The shared space the session is in, if it is not the agent's private one.
        space: Option<String>,
        /// How many records of `messages.jsonl` the client already has.
        after: u64,
    },
    /// Cancel the run with this id.
    Cancel {
        /// The run.
        id: String,
    },
    /// Liveness: answered with `pong`.
    Ping,
    /// The agent's runs through this socket, or one run's state.
    Status {
        /// One run, or all.
        id: Option<String>,
    },
}

/// A refusal: its stable code (an errno name) and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// `EINVAL`, `EMSGSIZE`, ...
    pub code: &'static str,
    /// Why, for people.
    pub message: String,
}

fn refuse(code: &'static str, message: impl Into<String>) -> Refusal {
    Refusal { code, message: message.into() }
}

fn string<'a>(v: &'a Value, field: &str) -> Result<Option<&'a str>, Refusal> {
    match v.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(refuse("EINVAL", format!("{field} is not a string"))),
    }
}

/// Checks a run id: 1 to [`ID_MAX`] printable ASCII bytes.
pub fn check_id(id: &str) -> Result<(), Refusal> {
    if id.is_empty() || id.len() > ID_MAX || !id.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(refuse("EINVAL", format!("id must be 1 to {ID_MAX} printable ASCII characters")));
    }
    Ok(())
}

fn name(v: &Value, field: &str, default: &str) -> Result<String, Refusal> {
    let s = string(v, field)?.unwrap_or(default);
    crate::name::validate(s).map_err(|e| refuse("EINVAL", format!("{field} {s:?}: {e}")))?;
    Ok(s.to_owned())
}

/// The absolute path in `field`, if there is one.
fn absolute(v: &Value, field: &str) -> Result<Option<String>, Refusal> {
    match string(v, field)? {
        Some(c) => {
            crate::path::check_absolute(c).map_err(|e| refuse("EINVAL", format!("{field} {c:?}: {e}")))?;
            Ok(Some(c.to_owned()))
        }
        None => Ok(None),
    }
}

/// Parses one request line (without its newline).
pub fn parse(line: &[u8]) -> Result<Request, Refusal> {
    if line.len() > FRAME_MAX {
        return Err(refuse("EMSGSIZE", format!("a frame is at most {FRAME_MAX} bytes")));
    }
    let v: Value =
        serde_json::from_slice(line).map_err(|e| refuse("EINVAL", format!("not a JSON object: {e}")))?;
    if !v.is_object() {
        return Err(refuse("EINVAL", "a request is a JSON object"));
    }
    let op = string(&v, "op")?.ok_or_else(|| refuse("EINVAL", "a request has an op"))?;
    match op {
        "send" => {
            let id = string(&v, "id")?.ok_or_else(|| refuse("EINVAL", "send needs an id"))?;
            check_id(id)?;
            let scope = match string(&v, "scope")?.unwrap_or("private") {
                "private" => Scope::Private,
                "shared" => Scope::Shared,
                "temp" => Scope::Temp,
                s => return Err(refuse("EINVAL", format!("scope {s:?} is private, shared or temp"))),
            };
            let space = match string(&v, "space")? {
                Some(_) => Some(name(&v, "space", "")?),
                None => None,
            };
            if (scope == Scope::Shared) != space.is_some() {
                return Err(refuse("EINVAL", "scope shared takes a space, and only it does"));
            }
            let (cwd, here) = (absolute(&v, "cwd")?, absolute(&v, "here")?);
            let input = string(&v, "input")?.ok_or_else(|| refuse("EINVAL", "send needs an input"))?;
            if input.trim().is_empty() {
                return Err(refuse("EINVAL", "the input is empty"));
            }
            let files = match v.get("files") {
                None | Some(Value::Null) => Vec::new(),
                Some(Value::Array(a)) if a.len() <= FILES_MAX => a
                    .iter()
                    .map(|f| {
                        let f = f.as_str().ok_or_else(|| refuse("EINVAL", "files are paths (strings)"))?;
                        crate::path::check_absolute(f)
                            .map_err(|e| refuse("EINVAL", format!("file {f:?}: {e}")))?;
                        Ok(f.to_owned())
                    })
                    .collect::<Result<_, Refusal>>()?,
                Some(_) => {
                    return Err(refuse("EINVAL", format!("files is a list of at most {FILES_MAX} paths")));
                }
            };
            Ok(Request::Send(Send {
                id: id.to_owned(),
                session: name(&v, "session", "default")?,
                scope,
                space,
                cwd,
                here,
                input: input.to_owned(),
                files,
            }))
        }
        "resume" => {
            let after = match v.get("after") {
                None | Some(Value::Null) => 0,
                Some(a) => a.as_u64().ok_or_else(|| refuse("EINVAL", "after is a record count"))?,
            };
            let space = match string(&v, "space")? {
                Some(_) => Some(name(&v, "space", "")?),
                None => None,
            };
            Ok(Request::Resume { session: name(&v, "session", "default")?, space, after })
        }
        "cancel" => {
            let id = string(&v, "id")?.ok_or_else(|| refuse("EINVAL", "cancel needs an id"))?;
            check_id(id)?;
            Ok(Request::Cancel { id: id.to_owned() })
        }
        "ping" => Ok(Request::Ping),
        "status" => {
            let id = string(&v, "id")?;
            if let Some(id) = id {
                check_id(id)?;
            }
            Ok(Request::Status { id: id.map(str::to_owned) })
        }
        op => Err(refuse("EINVAL", format!("unknown op {op:?} (send, resume, cancel, ping, status)"))),
    }
}

/// The first frame of a connection: the protocol, the agent, the ops it serves.
pub fn hello(agent: &str) -> Value {
    json!({"type": "hello", "protocol": PROTOCOL, "agent": agent,
        "ops": ["send", "resume", "cancel", "ping", "status"]})
}

/// An `error` frame (`id` when the request named a run).
pub fn error(id: Option<&str>, r: &Refusal) -> Value {
    let mut v = json!({"type": "error", "code": r.code, "message": r.message});
    if let Some(id) = id {
        v["id"] = json!(id);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse_whole_and_refuse_with_stable_codes() {
        let r = parse(br#"{"op":"send","id":"r1","input":"hi","extra":1}"#).unwrap();
        let Request::Send(s) = r else { panic!("{r:?}") };
        assert_eq!((s.session.as_str(), s.scope, s.cwd, s.files.len()), ("default", Scope::Private, None, 0));
        assert_eq!(parse(br#"{"op":"ping"}"#).unwrap(), Request::Ping);
        assert_eq!(
            parse(br#"{"op":"resume","session":"s","after":3}"#).unwrap(),
            Request::Resume { session: "s".into(), space: None, after: 3 }
        );
        let code = |l: &[u8]| parse(l).unwrap_err().code;
        assert_eq!(code(br#"{"op":"fly"}"#), "EINVAL");
        assert_eq!(code(b"[1]"), "EINVAL");
        assert_eq!(code(br#"{"op":"send","id":"r","input":"x","cwd":"rel"}"#), "EINVAL");
        assert_eq!(code(br#"{"op":"send","id":"r","input":"x","session":"../x"}"#), "EINVAL");
        assert_eq!(code(br#"{"op":"send","id":"r","input":"x","scope":"shared"}"#), "EINVAL");
        assert_eq!(code(br#"{"op":"send","id":"","input":"x"}"#), "EINVAL");
        assert_eq!(code(&vec![b' '; FRAME_MAX + 1]), "EMSGSIZE");
    }
}
