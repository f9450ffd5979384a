//! An MCP client over one server's stdio.
//!
//! [`Client::start`] spawns the server in its own process group with a small environment
//! (`HOME LOGNAME PATH SHELL TERM USER` from ours, plus the config's `env`), its stderr passed
//! through to ours, and negotiates: it advertises [`LATEST`] and accepts only a version in
//! [`SUPPORTED`], then sends `notifications/initialized`. Every request has a deadline; one that
//! passes sends `notifications/cancelled` (never for `initialize`). The server's `ping` is
//! answered, its other requests get "method not found" (no capabilities are offered), its
//! notifications are ignored.
//!
//! The client never sends a JSON-RPC batch, which every protocol version permits. It accepts a
//! batch from the server only under `2025-03-26`, the one version that has them.
//!
//! [`Client::shutdown`] (and drop) closes the server's stdin, waits, then sends SIGTERM, waits,
//! then SIGKILL to its process group.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tracing::{debug, trace};

use crate::config::ServerConfig;
use crate::jsonrpc::{self, Frame, LINE_MAX, Message, RpcError};
use crate::{Error, Result};

/// The protocol version advertised in `initialize`.
pub const LATEST: &str = "2025-11-25";

/// The protocol versions accepted from a server, newest first.
pub const SUPPORTED: &[&str] = &["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];

/// Variables of our environment a server inherits.
const INHERITED: &[&str] = &["HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER"];

/// Checks the `protocolVersion` of an `initialize` result.
pub fn negotiate(v: Option<&Value>) -> Result<&'static str> {
    let s = match v {
        Some(Value::String(s)) => s,
        Some(other) => {
            return Err(Error::Version(format!("the server answered protocolVersion {other}, not a string")));
        }
        None => return Err(Error::Version("the server's initialize result names no protocolVersion".into())),
    };
    SUPPORTED.iter().copied().find(|&v| v == s).ok_or_else(|| {
        Error::Version(format!(
            "the server speaks MCP protocol version {s:?}; ctxmcp accepts only {}",
            SUPPORTED.join(", ")
        ))
    })
}

/// Whether a protocol version has JSON-RPC batches (added in 2025-03-26, removed in 2025-06-18).
pub fn allows_batch(version: &str) -> bool {
    version == "2025-03-26"
}

/// Timeouts.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// How long one request may take.
    pub timeout: Duration,
    /// How long shutdown waits after closing stdin, and again after SIGTERM.
    pub grace: Duration,
}

impl Default for Options {
    fn default() -> Options {
        Options { timeout: Duration::from_secs(60), grace: Duration::from_secs(2) }
    }
}

/// A tool as `tools/list` describes it.
#[derive(Clone, Debug, PartialEq)]
pub struct Tool {
    /// The remote name.
    pub name: String,
    /// Its description, if any.
    pub description: Option<String>,
    /// Its input JSON Schema (an object).
    pub input_schema: Value,
}

impl Tool {
    fn from_value(v: &Value) -> Result<Tool> {
        let name = v.get("name").and_then(Value::as_str);
        let Some(name) = name else { return Err(Error::Protocol("a tool in tools/list has no name".into())) };
        let input_schema = match v.get("inputSchema") {
            None => json!({"type": "object"}),
            Some(s @ Value::Object(_)) => s.clone(),
            Some(_) => return Err(Error::Protocol(format!("tool {name:?}: inputSchema is not an object"))),
        };
        let description = v.get("description").and_then(Value::as_str).map(str::to_owned);
        Ok(Tool { name: name.to_owned(), description, input_schema })
    }
}

/// The result of `tools/call`.
#[derive(Clone, Debug, PartialEq)]
pub struct CallResult {
    /// Content items (`{"type":"text","text":...}` and others).
    pub content: Vec<Value>,
    /// `structuredContent`, if the tool returned any.
    pub structured: Option<Value>,
    /// The tool reports an error.
    pub is_error: bool,
}

impl CallResult {
    fn from_value(v: &Value) -> Result<CallResult> {
        let content = match v.get("content") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(a)) => a.clone(),
            Some(_) => return Err(Error::Protocol("tools/call: content is not an array".into())),
        };
        let structured = v.get("structuredContent").filter(|s| !s.is_null()).cloned();
        let is_error = v.get("isError").and_then(Value::as_bool).unwrap_or(false);
        Ok(CallResult { content, structured, is_error })
    }
}

#[derive(Debug)]
enum Incoming {
    Frame(Frame),
    Garbage { line: String, why: String },
    Eof,
    Failed(std::io::Error),
}

/// A running, initialized server.
#[derive(Debug)]
pub struct Client {
    child: Child,
    stdin: Option<ChildStdin>,
    rx: Receiver<Incoming>,
    next_id: u64,
    version: Option<&'static str>,
    opts: Options,
    done: bool,
}

fn preview(b: &[u8]) -> String {
    String::from_utf8_lossy(&b[..b.len().min(200)]).into_owned()
}

fn read_frames(out: ChildStdout, tx: Sender<Incoming>) {
    let mut r = BufReader::with_capacity(64 * 1024, out);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        let incoming = match (&mut r).take(LINE_MAX as u64 + 1).read_until(b'\n', &mut buf) {
            Ok(0) => Incoming::Eof,
            Err(e) => Incoming::Failed(e),
            Ok(_) if buf.len() > LINE_MAX => {
                Incoming::Garbage { line: preview(&buf), why: format!("a line over {LINE_MAX} bytes") }
            }
            Ok(_) => {
                let line = buf.strip_suffix(b"\n").unwrap_or(&buf);
                let line = line.strip_suffix(b"\r").unwrap_or(line);
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                match jsonrpc::parse_frame(line) {
                    Ok(f) => Incoming::Frame(f),
                    Err(why) => Incoming::Garbage { line: preview(line), why },
                }
            }
        };
        let last = !matches!(incoming, Incoming::Frame(_));
        if tx.send(incoming).is_err() || last {
            return;
        }
    }
}

/// Waits up to `d` for `child` to exit.
fn wait_for(child: &mut Child, d: Duration) -> Option<ExitStatus> {
    let until = Instant::now() + d;
    let mut nap = Duration::from_millis(1);
    loop {
        match child.try_wait() {
            Ok(Some(st)) => return Some(st),
            Ok(None) if Instant::now() < until => {
                std::thread::sleep(nap.min(until.saturating_duration_since(Instant::now())));
                nap = (nap * 2).min(Duration::from_millis(20));
            }
            _ => return None,
        }
    }
}

impl Client {
    /// Starts the server of `cfg` and negotiates.
    pub fn start(cfg: &ServerConfig, opts: Options) -> Result<Client> {
        use std::os::unix::process::CommandExt;
        let mut cmd = Command::new(&cfg.command);
        cmd.args(&cfg.args).env_clear();
        for k in INHERITED {
            if let Some(v) = std::env::var_os(k) {
                cmd.env(k, v);
            }
        }
        cmd.envs(&cfg.env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .process_group(0);
        if let Some(d) = &cfg.cwd {
            cmd.current_dir(d);
        }
        let mut child =
            cmd.spawn().map_err(|source| Error::Spawn { command: cfg.command.clone(), source })?;
        debug!(server = cfg.name, pid = child.id(), "started");
        let stdout = child.stdout.take().expect("stdout is piped");
        let stdin = child.stdin.take();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || read_frames(stdout, tx));
        let mut c = Client { child, stdin, rx, next_id: 1, version: None, opts, done: false };
        c.initialize()?;
        Ok(c)
    }

    /// The negotiated protocol version.
    pub fn version(&self) -> &'static str {
        self.version.unwrap_or(LATEST)
    }

    fn initialize(&mut self) -> Result<()> {
        let params = json!({
            "protocolVersion": LATEST,
            "capabilities": {},
            "clientInfo": {"name": "ctxmcp", "version": env!("CARGO_PKG_VERSION")},
        });
        let r = self.request("initialize", params)?;
        let v = negotiate(r.get("protocolVersion"))?;
        debug!(version = v, "negotiated");
        self.version = Some(v);
        self.send("notifications/initialized", &jsonrpc::notification("notifications/initialized", None))
    }

    /// Every tool, following `nextCursor` page by page.
    pub fn list_tools(&mut self) -> Result<Vec<Tool>> {
        let mut tools = Vec::new();
        let mut cursor: Option<String> = None;
        let mut seen = std::collections::HashSet::new();
        loop {
            let params = cursor.as_ref().map_or_else(|| json!({}), |c| json!({"cursor": c}));
            let page = self.request("tools/list", params)?;
            let Some(list) = page.get("tools").and_then(Value::as_array) else {
                return Err(Error::Protocol("the tools/list result has no tools array".into()));
            };
            for t in list {
                tools.push(Tool::from_value(t)?);
            }
            match page.get("nextCursor") {
                None | Some(Value::Null) => return Ok(tools),
                Some(Value::String(c)) if seen.insert(c.clone()) => cursor = Some(c.clone()),
                Some(Value::String(c)) => {
                    return Err(Error::Protocol(format!("tools/list returned cursor {c:?} twice")));
                }
                Some(_) => return Err(Error::Protocol("tools/list: nextCursor is not a string".into())),
            }
        }
    }

    /// Calls `tool` with `arguments` (a JSON object).
    pub fn call_tool(&mut self, tool: &str, arguments: Value) -> Result<CallResult> {
        let r = self.request("tools/call", json!({"name": tool, "arguments": arguments}))?;
        CallResult::from_value(&r)
    }

    fn send(&mut self, waiting: &str, line: &[u8]) -> Result<()> {
        let Some(stdin) = self.stdin.as_mut() else {
            return Err(Error::Gone { method: waiting.into(), how: "was shut down".into() });
        };
        match stdin.write_all(line).and_then(|()| stdin.flush()) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(self.gone(waiting)),
            Err(e) => {
                Err(Error::Gone { method: waiting.into(), how: format!("could not be written to: {e}") })
            }
        }
    }

    fn gone(&mut self, method: &str) -> Error {
        let how = match wait_for(&mut self.child, Duration::from_millis(500)) {
            Some(st) => format!("exited ({st}) before answering"),
            None => "closed its output before answering".into(),
        };
        Error::Gone { method: method.into(), how }
    }

    fn request(&mut self, method: &str, params: Value) -> Result<Value> {
        let id = self.next_id;
        self.next_id += 1;
        trace!(id, method, "request");
        self.send(method, &jsonrpc::request(id, method, params))?;
        let deadline = Instant::now() + self.opts.timeout;
        loop {
            let incoming = match self.rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(i) => i,
                Err(RecvTimeoutError::Disconnected) => Incoming::Eof,
                Err(RecvTimeoutError::Timeout) => {
                    if method != "initialize" {
                        let reason = format!("no answer after {} s", self.opts.timeout.as_secs_f64());
                        let cancel = json!({"requestId": id, "reason": reason});
                        let _ = self
                            .send(method, &jsonrpc::notification("notifications/cancelled", Some(cancel)));
                    }
                    return Err(Error::Timeout {
                        method: method.into(),
                        secs: self.opts.timeout.as_secs_f64(),
                    });
                }
            };
            let messages = match incoming {
                Incoming::Frame(Frame::One(m)) => vec![m],
                Incoming::Frame(Frame::Batch(ms)) => match self.version {
                    Some(v) if allows_batch(v) => ms,
                    Some(v) => {
                        return Err(Error::Protocol(format!(
                            "the server sent a JSON-RPC batch, which protocol version {v} does not allow"
                        )));
                    }
                    None => {
                        return Err(Error::Protocol(
                            "the server sent a JSON-RPC batch before initialize".into(),
                        ));
                    }
                },
                Incoming::Garbage { line, why } => return Err(Error::Garbage { line, why }),
                Incoming::Eof => return Err(self.gone(method)),
                Incoming::Failed(e) => {
                    return Err(Error::Gone {
                        method: method.into(),
                        how: format!("could not be read: {e}"),
                    });
                }
            };
            let mut answer = None;
            for m in messages {
                match m {
                    Message::Response { id: rid, outcome } if rid == json!(id) || rid.is_null() => {
                        answer = Some(outcome);
                    }
                    Message::Response { id, .. } => trace!(%id, "stale response"),
                    Message::Request { id, method: asked } => self.answer(method, &id, &asked)?,
                    Message::Notification { method: n } => trace!(n, "notification"),
                }
            }
            if let Some(outcome) = answer {
                return outcome.map_err(|e| Error::Remote {
                    method: method.into(),
                    code: e.code,
                    message: e.message,
                });
            }
        }
    }

    fn answer(&mut self, waiting: &str, id: &Value, asked: &str) -> Result<()> {
        let outcome = if asked == "ping" {
            Ok(json!({}))
        } else {
            Err(RpcError { code: -32601, message: format!("ctxmcp does not offer {asked}") })
        };
        self.send(waiting, &jsonrpc::response(id, outcome))
    }

    /// Stops the server: closes its stdin and waits, then SIGTERM and waits, then SIGKILL.
    pub fn shutdown(&mut self) -> Option<ExitStatus> {
        use rustix::process::{Pid, Signal, kill_process_group};
        self.done = true;
        drop(self.stdin.take());
        if let Some(st) = wait_for(&mut self.child, self.opts.grace) {
            return Some(st);
        }
        let group = Pid::from_child(&self.child);
        debug!(pid = self.child.id(), "SIGTERM");
        let _ = kill_process_group(group, Signal::TERM);
        if let Some(st) = wait_for(&mut self.child, self.opts.grace) {
            return Some(st);
        }
        debug!(pid = self.child.id(), "SIGKILL");
        let _ = kill_process_group(group, Signal::KILL);
        self.child.wait().ok()
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        if !self.done {
            self.shutdown();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_only_known_versions() {
        for v in SUPPORTED {
            assert_eq!(negotiate(Some(&json!(v))).unwrap(), *v);
        }
        for bad in [json!("2099-01-01"), json!("DRAFT-2026-v1"), json!("2024-10-07"), json!(20250618)] {
            assert!(matches!(negotiate(Some(&bad)), Err(Error::Version(_))), "{bad}");
        }
        assert!(matches!(negotiate(None), Err(Error::Version(_))));
        assert!(allows_batch("2025-03-26"));
        assert!(["2025-11-25", "2025-06-18", "2024-11-05"].iter().all(|v| !allows_batch(v)));
    }

    #[test]
    fn call_results() {
        let r =
            CallResult::from_value(&json!({"content":[{"type":"text","text":"x"}],"isError":true})).unwrap();
        assert!(r.is_error && r.structured.is_none() && r.content.len() == 1);
        assert!(CallResult::from_value(&json!({"content": 3})).is_err());
        let t = Tool::from_value(&json!({"name":"a"})).unwrap();
        assert_eq!(t.input_schema, json!({"type":"object"}));
        assert!(Tool::from_value(&json!({"name":"a","inputSchema":[]})).is_err());
    }
}
