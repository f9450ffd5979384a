//! The installed tool: a copy of `ctxmcp` run by tsh under the tool's name.
//!
//! tsh names the tool it authorized in `CTX_AUTHORIZED_OBJECT` (relative to `CTX_ROOT`); its
//! `.d/mcp` locator names the config file, the server and the remote tool. Each call starts the
//! server, negotiates, sends one `tools/call` and shuts the server down: no server outlives the
//! call, so nothing is shared between sessions or agents.

use std::ffi::OsString;
use std::io::{self, IsTerminal, Read, Write};
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::client::{CallResult, Client, Options};
use crate::{Error, Result, config};

/// The largest JSON input read from stdin, in bytes.
pub const INPUT_MAX: usize = 1024 * 1024;

/// What an installed tool calls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The config file, as this process sees it.
    pub config: PathBuf,
    /// The server in it.
    pub server: String,
    /// The remote tool.
    pub tool: String,
}

/// Reads the `.d/mcp` locator of `object` (a tool path, relative to `root` or absolute).
pub fn locate(root: &Path, object: &str) -> Result<Target> {
    let obj = root.join(object);
    let (Some(dir), Some(name)) = (obj.parent(), obj.file_name()) else {
        return Err(Error::Invalid(format!("{object:?} does not name a tool")));
    };
    let mut controls = name.to_os_string();
    controls.push(".d");
    let path = dir.join(controls).join("mcp");
    let bytes = crate::read_small(&path, policy::controls::CONTROL_MAX)?;
    let loc = policy::controls::parse_mcp_locator(&bytes)
        .map_err(|e| Error::Invalid(format!("{}: {e}", path.display())))?;
    Ok(Target { config: loc.config.into(), server: loc.server, tool: loc.tool })
}

/// Parses a JSON input: blank means `{}`; anything else must be a JSON object.
pub fn parse_input(bytes: &[u8]) -> Result<Value> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(json!({}));
    }
    match serde_json::from_slice(bytes) {
        Ok(v @ Value::Object(_)) => Ok(v),
        Ok(_) => Err(Error::Invalid("the input must be a JSON object".into())),
        Err(e) => Err(Error::Invalid(format!("the input is not JSON: {e}"))),
    }
}

/// The JSON input of a call: one argument that starts with `{`, else stdin when it is not a
/// terminal, else `{}`.
pub fn read_input(args: &[OsString]) -> Result<Value> {
    match args {
        [] => {
            let stdin = io::stdin();
            if stdin.is_terminal() {
                return Ok(json!({}));
            }
            let mut bytes = Vec::new();
            stdin
                .lock()
                .take(INPUT_MAX as u64 + 1)
                .read_to_end(&mut bytes)
                .map_err(|e| Error::Io { path: "stdin".into(), source: e })?;
            if bytes.len() > INPUT_MAX {
                return Err(Error::Invalid(format!("the input is over {INPUT_MAX} bytes")));
            }
            parse_input(&bytes)
        }
        [a] if a.as_encoded_bytes().first() == Some(&b'{') => parse_input(a.as_encoded_bytes()),
        _ => Err(Error::Invalid("expects its input as one JSON object argument, or as JSON on stdin".into())),
    }
}

/// Starts the target's server, calls its tool with `input` and stops the server.
pub fn call(target: &Target, input: Value, opts: Options) -> Result<CallResult> {
    let cfg = config::load(&target.config, &target.server)?;
    let mut client = Client::start(&cfg, opts)?;
    let r = client.call_tool(&target.tool, input);
    client.shutdown();
    r
}

fn text_of(item: &Value) -> Option<&str> {
    match item.get("type")?.as_str()? {
        "text" => item.get("text")?.as_str(),
        "resource" => item.get("resource")?.get("text")?.as_str(),
        _ => None,
    }
}

/// Writes a result. Text items print as text and other items as one JSON line each;
/// `structuredContent` prints as one JSON line instead of the items when `structured` (native
/// mode) or when there are no items (it usually repeats what the text items say).
pub fn render(r: &CallResult, structured: bool, out: &mut impl Write) -> io::Result<()> {
    if let Some(s) = &r.structured
        && (structured || r.content.is_empty())
    {
        return writeln!(out, "{s}");
    }
    for item in &r.content {
        match text_of(item) {
            Some(t) if t.ends_with('\n') => out.write_all(t.as_bytes())?,
            Some(t) => writeln!(out, "{t}")?,
            None => writeln!(out, "{item}")?,
        }
    }
    out.flush()
}

/// The message of an `isError` result: its text items.
pub fn error_message(r: &CallResult) -> String {
    let texts: Vec<&str> = r.content.iter().filter_map(text_of).map(str::trim_end).collect();
    match (&r.structured, texts.is_empty()) {
        (_, false) => texts.join("\n"),
        (Some(s), true) => s.to_string(),
        (None, true) => "the tool reported an error and said nothing more".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rendered(r: &CallResult, structured: bool) -> String {
        let mut out = Vec::new();
        render(r, structured, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn renders_text_and_structured_content() {
        let r = CallResult {
            content: vec![
                json!({"type":"text","text":"a"}),
                json!({"type":"text","text":"b\n"}),
                json!({"type":"image","data":"AA==","mimeType":"image/png"}),
            ],
            structured: Some(json!({"k": [1, 2]})),
            is_error: false,
        };
        assert_eq!(
            rendered(&r, false),
            "a\nb\n{\"data\":\"AA==\",\"mimeType\":\"image/png\",\"type\":\"image\"}\n"
        );
        assert_eq!(rendered(&r, true), "{\"k\":[1,2]}\n");
        let only = CallResult { content: vec![], structured: Some(json!({"x": 1})), is_error: false };
        assert_eq!(rendered(&only, false), "{\"x\":1}\n");
        let err = CallResult {
            content: vec![json!({"type":"text","text":"bad\n"})],
            structured: None,
            is_error: true,
        };
        assert_eq!(error_message(&err), "bad");
    }

    #[test]
    fn inputs() {
        assert_eq!(parse_input(b" \n").unwrap(), json!({}));
        assert_eq!(parse_input(br#"{"a":1}"#).unwrap(), json!({"a":1}));
        assert!(parse_input(b"[1]").is_err());
        assert!(parse_input(b"{").is_err());
        assert!(read_input(&["a".into(), "b".into()]).is_err());
        assert_eq!(read_input(&[r#"{"p":"x"}"#.into()]).unwrap(), json!({"p":"x"}));
        assert!(read_input(&["path".into()]).is_err());
    }

    #[test]
    fn locates_the_locator_beside_the_tool() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("tool/fs.read_text_file.d")).unwrap();
        std::fs::write(
            d.path().join("tool/fs.read_text_file.d/mcp"),
            r#"{"transport":"stdio","config":"/etc/mcp.json","server":"fs","tool":"read_text_file"}"#,
        )
        .unwrap();
        let t = locate(d.path(), "tool/fs.read_text_file").unwrap();
        assert_eq!(
            (t.config.to_str(), t.server.as_str(), t.tool.as_str()),
            (Some("/etc/mcp.json"), "fs", "read_text_file")
        );
        assert_eq!(locate(d.path(), "tool/other").unwrap_err().exit_code(), crate::exit::INVALID);
    }
}
