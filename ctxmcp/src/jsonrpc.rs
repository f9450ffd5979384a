//! JSON-RPC 2.0 messages over stdio: one message (or, where the protocol version allows it, one
//! batch) per line, UTF-8, no embedded newlines. Outgoing messages are compact
//! `serde_json` output, which escapes every newline.

use serde_json::{Map, Value, json};

/// The longest line accepted from a server, in bytes.
pub const LINE_MAX: usize = 64 * 1024 * 1024;

/// A JSON-RPC error object.
#[derive(Clone, Debug, PartialEq)]
pub struct RpcError {
    /// The error code.
    pub code: i64,
    /// The message.
    pub message: String,
}

/// One JSON-RPC message.
#[derive(Clone, Debug, PartialEq)]
pub enum Message {
    /// A request, which wants a response with the same id.
    Request {
        /// A string or an integer.
        id: Value,
        /// The method.
        method: String,
    },
    /// A notification: no id, no response.
    Notification {
        /// The method.
        method: String,
    },
    /// A response to a request.
    Response {
        /// The request's id (`null` only in an error about an unreadable request).
        id: Value,
        /// The result or the error.
        outcome: Result<Value, RpcError>,
    },
}

/// One line: a message or a batch of them.
#[derive(Clone, Debug, PartialEq)]
pub enum Frame {
    /// A single message.
    One(Message),
    /// A batch (a JSON array of messages).
    Batch(Vec<Message>),
}

fn is_id(v: &Value) -> bool {
    v.is_string() || v.as_i64().is_some() || v.as_u64().is_some()
}

fn message(v: &Value) -> Result<Message, String> {
    let Value::Object(m) = v else { return Err("a message must be a JSON object".into()) };
    if m.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err("\"jsonrpc\" is not \"2.0\"".into());
    }
    let id = m.get("id");
    if let Some(method) = m.get("method") {
        let Some(method) = method.as_str() else { return Err("\"method\" must be a string".into()) };
        if m.contains_key("result") || m.contains_key("error") {
            return Err("a request cannot carry a result or an error".into());
        }
        return match id {
            None => Ok(Message::Notification { method: method.to_owned() }),
            Some(id) if is_id(id) => Ok(Message::Request { id: id.clone(), method: method.to_owned() }),
            Some(_) => Err("a request id must be a string or an integer".into()),
        };
    }
    let id = match id {
        Some(id) if is_id(id) || id.is_null() => id.clone(),
        Some(_) => return Err("a response id must be a string or an integer".into()),
        None => return Err("neither a request nor a response (no method, no id)".into()),
    };
    let outcome = match (m.get("result"), m.get("error")) {
        (Some(r), None) if !id.is_null() => Ok(r.clone()),
        (None, Some(Value::Object(e))) => Err(rpc_error(e)?),
        (Some(_), Some(_)) => return Err("a response cannot carry both a result and an error".into()),
        (None, None) => return Err("a response needs a result or an error".into()),
        (Some(_), None) => return Err("a result needs a request id".into()),
        (None, Some(_)) => return Err("\"error\" must be an object".into()),
    };
    Ok(Message::Response { id, outcome })
}

fn rpc_error(e: &Map<String, Value>) -> Result<RpcError, String> {
    let code = e.get("code").and_then(Value::as_i64).ok_or("an error needs an integer code")?;
    let message = e.get("message").and_then(Value::as_str).ok_or("an error needs a string message")?;
    Ok(RpcError { code, message: message.to_owned() })
}

/// Parses one line (without its newline) from a server.
pub fn parse_frame(line: &[u8]) -> Result<Frame, String> {
    let v: Value = serde_json::from_slice(line).map_err(|e| format!("invalid JSON: {e}"))?;
    match &v {
        Value::Array(items) if items.is_empty() => Err("an empty batch".into()),
        Value::Array(items) => items.iter().map(message).collect::<Result<_, _>>().map(Frame::Batch),
        _ => message(&v).map(Frame::One),
    }
}

/// A request line.
pub fn request(id: u64, method: &str, params: Value) -> Vec<u8> {
    line(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
}

/// A notification line; `params` are left out when `None`.
pub fn notification(method: &str, params: Option<Value>) -> Vec<u8> {
    match params {
        Some(p) => line(&json!({"jsonrpc": "2.0", "method": method, "params": p})),
        None => line(&json!({"jsonrpc": "2.0", "method": method})),
    }
}

/// A response line.
pub fn response(id: &Value, outcome: Result<Value, RpcError>) -> Vec<u8> {
    match outcome {
        Ok(r) => line(&json!({"jsonrpc": "2.0", "id": id, "result": r})),
        Err(e) => line(&json!({"jsonrpc": "2.0", "id": id, "error": {"code": e.code, "message": e.message}})),
    }
}

fn line(v: &Value) -> Vec<u8> {
    let mut out = serde_json::to_vec(v).expect("a serde_json::Value always serializes");
    out.push(b'\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(s: &str) -> Message {
        match parse_frame(s.as_bytes()).unwrap() {
            Frame::One(m) => m,
            Frame::Batch(_) => panic!("batch"),
        }
    }

    #[test]
    fn parses_each_kind() {
        assert_eq!(
            one(r#"{"jsonrpc":"2.0","id":1,"result":{"a":1}}"#),
            Message::Response { id: json!(1), outcome: Ok(json!({"a":1})) }
        );
        assert_eq!(
            one(r#"{"jsonrpc":"2.0","id":"x","error":{"code":-32601,"message":"no","data":3}}"#),
            Message::Response {
                id: json!("x"),
                outcome: Err(RpcError { code: -32601, message: "no".into() })
            }
        );
        assert_eq!(
            one(r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"parse"}}"#),
            Message::Response {
                id: Value::Null,
                outcome: Err(RpcError { code: -32700, message: "parse".into() })
            }
        );
        assert_eq!(
            one(r#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#),
            Message::Request { id: json!(7), method: "ping".into() }
        );
        assert_eq!(
            one(r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{}}"#),
            Message::Notification { method: "notifications/progress".into() }
        );
        let b = parse_frame(br#"[{"jsonrpc":"2.0","method":"a"},{"jsonrpc":"2.0","id":1,"result":{}}]"#);
        assert!(matches!(b, Ok(Frame::Batch(v)) if v.len() == 2));
    }

    #[test]
    fn refuses_what_is_not_json_rpc() {
        for bad in [
            "hello",
            "",
            "[]",
            "3",
            r#"{"id":1,"result":{}}"#,
            r#"{"jsonrpc":"1.0","id":1,"result":{}}"#,
            r#"{"jsonrpc":"2.0","id":1.5,"result":{}}"#,
            r#"{"jsonrpc":"2.0","id":null,"result":{}}"#,
            r#"{"jsonrpc":"2.0","id":1,"result":{},"error":{"code":1,"message":"x"}}"#,
            r#"{"jsonrpc":"2.0","id":1}"#,
            r#"{"jsonrpc":"2.0","id":1,"error":{"code":"x","message":"y"}}"#,
            r#"{"jsonrpc":"2.0","method":3}"#,
            r#"{"jsonrpc":"2.0","id":{},"method":"x"}"#,
            r#"{"jsonrpc":"2.0"}"#,
            r#"[{"jsonrpc":"2.0","method":"a"},1]"#,
        ] {
            assert!(parse_frame(bad.as_bytes()).is_err(), "{bad}");
        }
    }

    #[test]
    fn lines_are_single_lines() {
        let l = request(1, "tools/call", json!({"arguments": {"text": "a\nb"}}));
        assert_eq!(l.iter().filter(|&&b| b == b'\n').count(), 1);
        assert_eq!(l.last(), Some(&b'\n'));
        assert_eq!(
            notification("notifications/initialized", None),
            b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n"
        );
    }
}
