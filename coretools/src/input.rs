//! A tool's input: CLI arguments, or one JSON object (the only argument, or stdin when there are
//! no arguments and stdin is not a terminal) parsed into the tool's serde struct. The structs deny
//! unknown fields and nulls, so parsing is the check against the published schema.

use std::ffi::OsString;
use std::io::{self, IsTerminal, Read};
use std::os::unix::ffi::OsStringExt;

use serde::de::{Deserialize, DeserializeOwned, Deserializer};

use crate::{Error, Result};

/// The most JSON read from stdin.
const MAX_JSON: u64 = 1 << 20;

/// What a tool was given.
#[derive(Debug)]
pub(crate) enum Input {
    /// A JSON document, not yet parsed.
    Json(Vec<u8>),
    /// CLI arguments.
    Args(Vec<OsString>),
}

/// Takes the arguments as JSON or argv, reading stdin for JSON when there are no arguments and
/// stdin is not a terminal; an empty stdin means no input.
pub(crate) fn read(args: Vec<OsString>) -> Result<Input> {
    if let [arg] = args.as_slice()
        && arg.as_encoded_bytes().starts_with(b"{")
    {
        return Ok(Input::Json(args.into_iter().flat_map(OsStringExt::into_vec).collect()));
    }
    let stdin = io::stdin();
    if !args.is_empty() || stdin.is_terminal() {
        return Ok(Input::Args(args));
    }
    let mut buf = Vec::new();
    stdin.lock().take(MAX_JSON + 1).read_to_end(&mut buf).map_err(|e| Error::io("stdin", e))?;
    if buf.len() as u64 > MAX_JSON {
        return Err(Error::Invalid("stdin: JSON input is larger than 1 MiB".into()));
    }
    match buf.trim_ascii_start().first() {
        None => Ok(Input::Args(args)),
        Some(b'{') => Ok(Input::Json(buf)),
        Some(_) => Err(Error::Invalid("stdin: input must be a JSON object".into())),
    }
}

/// Parses JSON input into a tool's input struct.
pub(crate) fn json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| Error::Invalid(format!("input: {e}")))
}

/// For `#[serde(default, deserialize_with = "non_null")]`: an optional field may be left out,
/// but not given as `null`, which its schema does not allow.
pub(crate) fn non_null<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}
