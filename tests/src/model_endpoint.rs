//! A scripted model endpoint on this host's loopback, speaking the real wire formats over SSE:
//! OpenAI Responses (`POST /v1/responses`), Anthropic Messages (`POST /v1/messages`) and
//! Google's Gemini API (`POST /v1beta/models/{id}:streamGenerateContent?alt=sse`).
//!
//! It stands in for a model (the one thing tests cannot have here). Each turn of a
//! conversation goes the same way: while the request carries no tool result, the model calls
//! the CLI's shell tool with the command it was started with; once it does, it answers with
//! its answer followed by the tool's output. Every request is kept, with the key it
//! carried, for the test to look at.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

/// One request the endpoint answered.
#[derive(Clone, Debug)]
pub struct Seen {
    /// The path.
    pub path: String,
    /// The key it carried (`Authorization: Bearer`, `x-api-key` or `x-goog-api-key`).
    pub key: Option<String>,
    /// The body.
    pub body: Value,
}

/// The endpoint.
#[derive(Debug)]
pub struct Endpoint {
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// Every request, in order.
    pub seen: Arc<Mutex<Vec<Seen>>>,
}

struct Script {
    command: String,
    answer: String,
    ids: AtomicU64,
}

/// The largest request body read.
const BODY_MAX: usize = 16 << 20;

impl Endpoint {
    /// Listens on 127.0.0.1; the model runs `command` (where `{PORT}` is the endpoint's port)
    /// through the shell tool, then answers `answer` and the command's output.
    pub fn start(command: &str, answer: &str) -> Endpoint {
        Endpoint::on(TcpListener::bind("127.0.0.1:0").expect("bind"), command, answer)
    }

    /// The same endpoint on the listener `l`.
    pub fn on(l: TcpListener, command: &str, answer: &str) -> Endpoint {
        let port = l.local_addr().expect("addr").port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let script = Arc::new(Script {
            command: command.replace("{PORT}", &port.to_string()),
            answer: answer.to_owned(),
            ids: AtomicU64::new(1),
        });
        let s2 = Arc::clone(&seen);
        std::thread::spawn(move || {
            for c in l.incoming().flatten() {
                let (seen, script) = (Arc::clone(&s2), Arc::clone(&script));
                std::thread::spawn(move || {
                    let _ = serve(c, &seen, &script);
                });
            }
        });
        Endpoint { port, seen }
    }

    /// The requests seen so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

fn serve(c: TcpStream, seen: &Mutex<Vec<Seen>>, script: &Script) -> std::io::Result<()> {
    // One request per connection: every answer closes it.
    let mut r = BufReader::new(c.try_clone()?);
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Ok(());
    }
    let target = line.split_whitespace().nth(1).unwrap_or("");
    let path = target.split('?').next().unwrap_or("").to_owned();
    let (mut len, mut key, mut chunked) = (0usize, None, false);
    loop {
        let mut h = String::new();
        r.read_line(&mut h)?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':').unwrap_or((h, ""));
        let (k, v) = (k.to_ascii_lowercase(), v.trim());
        match k.as_str() {
            "content-length" => len = v.parse().unwrap_or(0).min(BODY_MAX),
            "authorization" => key = v.strip_prefix("Bearer ").map(str::to_owned),
            "x-api-key" | "x-goog-api-key" => key = Some(v.to_owned()),
            "transfer-encoding" => chunked = v.eq_ignore_ascii_case("chunked"),
            _ => {}
        }
    }
    let mut body = Vec::new();
    if chunked {
        loop {
            let mut size = String::new();
            r.read_line(&mut size)?;
            let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
            if n == 0 || body.len() + n > BODY_MAX {
                let mut end = String::new();
                r.read_line(&mut end)?;
                break;
            }
            let mut chunk = vec![0; n + 2];
            r.read_exact(&mut chunk)?;
            body.extend_from_slice(&chunk[..n]);
        }
    } else {
        body.resize(len, 0);
        r.read_exact(&mut body)?;
    }
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    seen.lock().unwrap_or_else(|p| p.into_inner()).push(Seen { path: path.clone(), key, body: body.clone() });
    let mut w = c.try_clone()?;
    let id = script.ids.fetch_add(1, Ordering::Relaxed);
    if path.ends_with("/responses") {
        sse(&mut w, &responses(&body, script, id))?;
    } else if path.ends_with(":streamGenerateContent") {
        sse(&mut w, &[gemini(&body, script)])?;
    } else if path.ends_with(":generateContent") {
        json_reply(&mut w, &gemini(&body, script))?;
    } else if path.ends_with(":countTokens") {
        json_reply(&mut w, &json!({"totalTokens": 10}))?;
    } else if path.ends_with("/messages/count_tokens") {
        json_reply(&mut w, &json!({"input_tokens": 10}))?;
    } else if path.ends_with("/messages") {
        let events = messages(&body, script, id);
        if body["stream"] == json!(true) {
            sse(&mut w, &events)?;
        } else {
            json_reply(&mut w, &message_whole(&events))?;
        }
    } else {
        w.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")?;
    }
    Ok(())
}

fn sse(w: &mut TcpStream, events: &[Value]) -> std::io::Result<()> {
    w.write_all(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n",
    )?;
    for e in events {
        // OpenAI's and Anthropic's events are named; Gemini's are data alone.
        match e["type"].as_str() {
            Some(kind) => w.write_all(format!("event: {kind}\ndata: {e}\n\n").as_bytes())?,
            None => w.write_all(format!("data: {e}\r\n\r\n").as_bytes())?,
        }
    }
    w.flush()
}

fn json_reply(w: &mut TcpStream, v: &Value) -> std::io::Result<()> {
    let b = v.to_string();
    w.write_all(
        format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{b}",
            b.len()
        )
        .as_bytes(),
    )
}

/// The text of the last tool result in `body`, if the conversation has one.
fn tool_output(body: &Value) -> Option<String> {
    let text = |v: &Value| -> String {
        match v {
            Value::String(s) => s.clone(),
            Value::Array(parts) => {
                parts.iter().filter_map(|p| p["text"].as_str()).collect::<Vec<_>>().join("")
            }
            v => v.to_string(),
        }
    };
    // Responses: input items of type function_call_output (or custom_tool_call_output).
    if let Some(items) = body["input"].as_array() {
        let last_user = items.iter().rposition(|i| i["role"] == "user");
        return items
            .iter()
            .enumerate()
            .filter(|(n, _)| last_user.is_none_or(|u| *n > u))
            .filter(|(_, i)| i["type"].as_str().is_some_and(|t| t.ends_with("call_output")))
            .map(|(_, i)| text(&i["output"]))
            .next_back();
    }
    // Gemini: the last user content holding a functionResponse.
    if let Some(contents) = body["contents"].as_array() {
        let last = contents.iter().rev().find(|c| c["role"] == "user")?;
        return last["parts"]
            .as_array()?
            .iter()
            .filter_map(|p| p.get("functionResponse"))
            .map(|r| {
                r["response"]["output"].as_str().map_or_else(|| r["response"].to_string(), str::to_owned)
            })
            .next_back();
    }
    // Messages: the last user message holding a tool_result.
    let last = body["messages"].as_array()?.last()?;
    last["content"]
        .as_array()?
        .iter()
        .filter(|b| b["type"] == "tool_result")
        .map(|b| text(&b["content"]))
        .next_back()
}

fn responses(body: &Value, s: &Script, id: u64) -> Vec<Value> {
    let created = json!({"type": "response.created", "response": {"id": format!("resp_{id}")}});
    let usage = json!({"input_tokens": 10, "input_tokens_details": null, "output_tokens": 5,
        "output_tokens_details": null, "total_tokens": 15});
    let completed =
        json!({"type": "response.completed", "response": {"id": format!("resp_{id}"), "usage": usage}});
    let item = match tool_output(body) {
        Some(out) => {
            let text = format!("{} {}", s.answer, out.trim());
            json!({"type": "message", "role": "assistant", "id": format!("msg_{id}"),
                "content": [{"type": "output_text", "text": text, "annotations": []}]})
        }
        None => {
            let tools: Vec<&str> = body["tools"]
                .as_array()
                .map(|t| t.iter().filter_map(|t| t["name"].as_str().or(t["type"].as_str())).collect())
                .unwrap_or_default();
            let call = format!("call_{id}");
            if tools.contains(&"bash") {
                json!({"type": "function_call", "id": format!("fc_{id}"), "call_id": call, "name": "bash",
                    "arguments": json!({"command": s.command}).to_string()})
            } else if tools.contains(&"shell_command") {
                json!({"type": "function_call", "id": format!("fc_{id}"), "call_id": call, "name": "shell_command",
                    "arguments": json!({"command": s.command}).to_string()})
            } else if tools.contains(&"exec_command") {
                json!({"type": "function_call", "id": format!("fc_{id}"), "call_id": call, "name": "exec_command",
                    "arguments": json!({"cmd": s.command}).to_string()})
            } else {
                json!({"type": "function_call", "id": format!("fc_{id}"), "call_id": call, "name": "shell",
                    "arguments": json!({"command": ["bash", "-lc", s.command]}).to_string()})
            }
        }
    };
    // Each item is opened, filled in, and done, as the API streams it.
    let mut events = vec![created];
    let mut open = item.clone();
    if item["type"] == "message" {
        open["content"] = json!([]);
        events.push(json!({"type": "response.output_item.added", "output_index": 0, "item": open}));
        events.push(json!({"type": "response.output_text.delta", "delta": item["content"][0]["text"],
            "item_id": item["id"], "output_index": 0, "content_index": 0}));
    } else {
        open["arguments"] = json!("");
        events.push(json!({"type": "response.output_item.added", "output_index": 0, "item": open}));
        events.push(json!({"type": "response.function_call_arguments.delta", "delta": item["arguments"],
            "item_id": item["id"], "output_index": 0}));
        events.push(json!({"type": "response.function_call_arguments.done", "arguments": item["arguments"],
            "item_id": item["id"], "output_index": 0}));
    }
    events.push(json!({"type": "response.output_item.done", "output_index": 0, "item": item}));
    events.push(completed);
    events
}

fn messages(body: &Value, s: &Script, id: u64) -> Vec<Value> {
    let model = body["model"].clone();
    let start = json!({"type": "message_start", "message": {"id": format!("msg_{id}"), "type": "message",
        "role": "assistant", "model": model, "content": [], "stop_reason": null, "stop_sequence": null,
        "usage": {"input_tokens": 10, "output_tokens": 1}}});
    let bash = body["tools"]
        .as_array()
        .and_then(|t| t.iter().filter_map(|t| t["name"].as_str()).find(|n| n.eq_ignore_ascii_case("bash")))
        .map(str::to_owned);
    let (block, delta, stop) = match tool_output(body) {
        None if bash.is_some() => (
            json!({"type": "tool_use", "id": format!("toolu_{id}"), "name": bash, "input": {}}),
            json!({"type": "input_json_delta",
                "partial_json": json!({"command": s.command, "description": "Run the command"}).to_string()}),
            "tool_use",
        ),
        out => {
            let text = match out {
                Some(o) => format!("{} {}", s.answer, o.trim()),
                None => s.answer.clone(),
            };
            (json!({"type": "text", "text": ""}), json!({"type": "text_delta", "text": text}), "end_turn")
        }
    };
    vec![
        start,
        json!({"type": "content_block_start", "index": 0, "content_block": block}),
        json!({"type": "content_block_delta", "index": 0, "delta": delta}),
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null},
            "usage": {"output_tokens": 5}}),
        json!({"type": "message_stop"}),
    ]
}

/// A Gemini answer (one streamed chunk, or the whole of a `generateContent`): the shell tool
/// called while there is no tool result, then the text.
fn gemini(body: &Value, s: &Script) -> Value {
    let shell = body["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["functionDeclarations"].as_array())
        .flatten()
        .filter_map(|f| f["name"].as_str())
        .find(|n| n.contains("shell"))
        .map(str::to_owned);
    let part = match (tool_output(body), shell) {
        (None, Some(name)) => json!({"functionCall": {"name": name, "args": {"command": s.command}}}),
        (Some(o), _) => json!({"text": format!("{} {}", s.answer, o.trim())}),
        (None, None) => json!({"text": s.answer}),
    };
    json!({"candidates": [{"content": {"role": "model", "parts": [part]}, "finishReason": "STOP", "index": 0}],
        "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15},
        "modelVersion": body["model"].as_str().unwrap_or("m")})
}

/// The message the events of [`messages`] stream, whole (for a request without `stream`).
fn message_whole(events: &[Value]) -> Value {
    let mut m = events[0]["message"].clone();
    let mut block = events[1]["content_block"].clone();
    let d = &events[2]["delta"];
    if let Some(t) = d["text"].as_str() {
        block["text"] = json!(t);
    } else if let Some(p) = d["partial_json"].as_str() {
        block["input"] = serde_json::from_str(p).unwrap_or(json!({}));
    }
    m["content"] = json!([block]);
    m["stop_reason"] = events[4]["delta"]["stop_reason"].clone();
    m
}
