//! ctxmcp: MCP servers as a source of ordinary CortexFS tools (spec §9).
//!
//! - [`config`]: the `mcpServers` config file and the one stdio server chosen from it.
//! - [`jsonrpc`]: JSON-RPC 2.0 messages, one per line (the stdio framing of MCP).
//! - [`client`]: an MCP client over a server's stdio: version negotiation, paginated
//!   `tools/list`, `tools/call`, timeouts with `notifications/cancelled`, shutdown.
//! - [`project`]: `cortexfs.object/v2` manifest candidates, one per remote tool.
//! - [`call`]: the installed tool: its `.d/mcp` locator, its JSON input, how a result prints.
//!
//! Only the `ctxmcp` binary depends on this crate. It writes no policy and nothing under `/ctx`.

#![forbid(unsafe_code)]

pub mod call;
pub mod client;
pub mod config;
pub mod jsonrpc;
pub mod project;

use std::io;
use std::path::PathBuf;

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The config file or the chosen server entry is not usable.
    #[error("{path}: {message}")]
    Config {
        /// The config file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// Arguments, a locator or the JSON input are not valid.
    #[error("{0}")]
    Invalid(String),
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The server's command could not be started.
    #[error("cannot start {command:?}: {source}")]
    Spawn {
        /// The command of the config entry.
        command: String,
        /// Why.
        source: io::Error,
    },
    /// The server went away before it answered.
    #[error("{method}: the server {how}")]
    Gone {
        /// The request that was waiting.
        method: String,
        /// `exited with exit status: 3`, `closed its output`, ...
        how: String,
    },
    /// The server printed a line that is not a JSON-RPC message.
    #[error("the server printed something that is not JSON-RPC ({why}): {line:?}")]
    Garbage {
        /// The first bytes of the line.
        line: String,
        /// What the parser said.
        why: String,
    },
    /// A request got no answer in time (and was cancelled).
    #[error("{method}: no answer after {secs} s (request cancelled)")]
    Timeout {
        /// The request.
        method: String,
        /// The timeout.
        secs: f64,
    },
    /// The server speaks a protocol version this client refuses.
    #[error("{0}")]
    Version(String),
    /// The server broke the protocol in another way.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The server answered a request with a JSON-RPC error.
    #[error("{method}: the server answered error {code}: {message}")]
    Remote {
        /// The request.
        method: String,
        /// The JSON-RPC error code.
        code: i64,
        /// Its message.
        message: String,
    },
    /// A bug: something ctxmcp made is not what it should be.
    #[error("internal error: {0}")]
    Internal(String),
}

/// Exit codes of the `ctxmcp` binary and of the tools it serves: the shared ones. 1: the tool
/// reported an error or the server answered with one; 2: arguments, JSON input, config file or
/// locator; 13: a file could not be read; 69: the server would not start, died, timed out,
/// printed garbage or speaks a refused protocol version.
pub use policy::exit;

impl Error {
    /// The exit code this error ends `ctxmcp` with.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Config { .. } | Error::Invalid(_) => exit::INVALID,
            Error::Io { source, .. } => match source.kind() {
                io::ErrorKind::PermissionDenied => exit::DENIED,
                io::ErrorKind::NotFound | io::ErrorKind::IsADirectory => exit::INVALID,
                _ => exit::FAILURE,
            },
            Error::Spawn { .. }
            | Error::Gone { .. }
            | Error::Garbage { .. }
            | Error::Timeout { .. }
            | Error::Version(_)
            | Error::Protocol(_) => exit::UNAVAILABLE,
            Error::Remote { .. } => exit::FAILURE,
            Error::Internal(_) => exit::INTERNAL,
        }
    }

    fn io(path: impl Into<PathBuf>, source: io::Error) -> Error {
        Error::Io { path: path.into(), source }
    }
}

/// The result type of this crate.
pub type Result<T> = std::result::Result<T, Error>;

/// Reads at most `max` bytes of a file; a longer file is invalid input.
fn read_small(path: &std::path::Path, max: usize) -> Result<Vec<u8>> {
    use std::io::Read;
    let f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut bytes = Vec::new();
    f.take(max as u64 + 1).read_to_end(&mut bytes).map_err(|e| Error::io(path, e))?;
    if bytes.len() > max {
        return Err(Error::Invalid(format!("{}: larger than {max} bytes", path.display())));
    }
    Ok(bytes)
}
