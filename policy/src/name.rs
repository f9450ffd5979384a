//! Object names (spec §2): `[A-Za-z0-9][A-Za-z0-9._+-]{0,63}`, never `.`, `..`, or a name ending in
//! `.sock` or `.d` (those spell the object's socket and control directory).
//!
//! [`Name`] can only hold a valid name; MCP-projected tools are named `<server>.<remote_tool>` and
//! are ordinary names ([`Name::mcp`]).

use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;

use serde::{Deserialize, Serialize};

/// The longest valid name in bytes.
pub const NAME_MAX: usize = 64;

/// Why a string is not a valid object name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// The string is empty.
    #[error("name is empty")]
    Empty,
    /// Longer than [`NAME_MAX`] bytes.
    #[error("name is {0} bytes long; the limit is 64")]
    TooLong(usize),
    /// The first character is not an ASCII letter or digit.
    #[error("name must start with an ASCII letter or digit")]
    BadStart,
    /// A character outside `[A-Za-z0-9._+-]`.
    #[error("name contains {0:?}; allowed are ASCII letters, digits and . _ + -")]
    BadChar(char),
    /// Ends in `.sock` or `.d`, which spell an object's socket or control directory.
    #[error("name may not end in {0:?}: that suffix names an object's socket or controls")]
    ReservedSuffix(&'static str),
    /// An MCP server part that contains `.` (the first `.` separates server from tool).
    #[error("mcp server name {0:?} may not contain '.'")]
    McpServerDot(String),
    /// An MCP tool part that is empty.
    #[error("mcp tool name is empty")]
    McpToolEmpty,
}

/// A valid object name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Name(Box<str>);

impl Name {
    /// Validates `s` as an object name.
    pub fn new(s: &str) -> Result<Name, NameError> {
        validate(s)?;
        Ok(Name(s.into()))
    }

    /// The MCP projection name `<server>.<tool>`: the server part may not contain `.`, and the
    /// whole must be a valid name.
    pub fn mcp(server: &str, tool: &str) -> Result<Name, NameError> {
        validate(server)?;
        if server.contains('.') {
            return Err(NameError::McpServerDot(server.to_owned()));
        }
        if tool.is_empty() {
            return Err(NameError::McpToolEmpty);
        }
        Name::new(&format!("{server}.{tool}"))
    }

    /// Splits an MCP-style name at its first `.` into server and tool, if it has one.
    pub fn split_mcp(&self) -> Option<(&str, &str)> {
        self.0.split_once('.').filter(|(_, t)| !t.is_empty())
    }

    /// The name as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Checks `s` against the name grammar without allocating.
pub fn validate(s: &str) -> Result<(), NameError> {
    let bytes = s.as_bytes();
    let Some(&first) = bytes.first() else {
        return Err(NameError::Empty);
    };
    if bytes.len() > NAME_MAX {
        return Err(NameError::TooLong(bytes.len()));
    }
    if !first.is_ascii_alphanumeric() {
        return Err(NameError::BadStart);
    }
    if let Some(c) = s.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '+' | '-'))) {
        return Err(NameError::BadChar(c));
    }
    for suffix in [".sock", ".d"] {
        if s.ends_with(suffix) {
            return Err(NameError::ReservedSuffix(suffix));
        }
    }
    Ok(())
}

impl Deref for Name {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for Name {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for Name {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for Name {
    type Error = NameError;
    fn try_from(s: String) -> Result<Name, NameError> {
        validate(&s)?;
        Ok(Name(s.into_boxed_str()))
    }
}

impl TryFrom<&str> for Name {
    type Error = NameError;
    fn try_from(s: &str) -> Result<Name, NameError> {
        Name::new(s)
    }
}

impl From<Name> for String {
    fn from(n: Name) -> String {
        n.0.into_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_names() {
        for s in ["fs.read", "a", "A9", "tsh", "shell.exec", "x+y_z-1", &"a".repeat(64), "0", "a.dx"] {
            assert!(Name::new(s).is_ok(), "{s}");
        }
    }

    #[test]
    fn invalid_names() {
        let cases: &[(&str, NameError)] = &[
            ("", NameError::Empty),
            (".", NameError::BadStart),
            ("..", NameError::BadStart),
            (".hidden", NameError::BadStart),
            ("-x", NameError::BadStart),
            ("a/b", NameError::BadChar('/')),
            ("a b", NameError::BadChar(' ')),
            ("a\0b", NameError::BadChar('\0')),
            ("a\nb", NameError::BadChar('\n')),
            ("a\u{7f}", NameError::BadChar('\u{7f}')),
            ("é", NameError::BadStart),
            ("aé", NameError::BadChar('é')),
            ("agent.sock", NameError::ReservedSuffix(".sock")),
            ("tool.d", NameError::ReservedSuffix(".d")),
            ("a*", NameError::BadChar('*')),
        ];
        for (s, e) in cases {
            assert_eq!(Name::new(s).unwrap_err(), *e, "{s:?}");
        }
        assert_eq!(Name::new(&"a".repeat(65)).unwrap_err(), NameError::TooLong(65));
    }

    #[test]
    fn mcp_names() {
        let n = Name::mcp("github", "search_issues").unwrap();
        assert_eq!(n.as_str(), "github.search_issues");
        assert_eq!(n.split_mcp(), Some(("github", "search_issues")));
        assert_eq!(Name::mcp("git.hub", "x").unwrap_err(), NameError::McpServerDot("git.hub".into()));
        assert_eq!(Name::mcp("github", "").unwrap_err(), NameError::McpToolEmpty);
        assert!(matches!(Name::mcp("github", "has space"), Err(NameError::BadChar(' '))));
        assert!(matches!(Name::mcp("g", &"t".repeat(63)), Err(NameError::TooLong(65))));
        assert!(matches!(Name::mcp("s", "sock.d"), Err(NameError::ReservedSuffix(".d"))));
    }

    #[test]
    fn serde_refuses_invalid() {
        assert!(serde_json::from_str::<Name>("\"fs.read\"").is_ok());
        assert!(serde_json::from_str::<Name>("\"../x\"").is_err());
    }
}
