//! Absolute, normalized host or view paths as they appear in control files (mount tables,
//! `CTX_PATH`, MCP locators, `mount:` policy objects).

/// The longest path accepted, in bytes (Linux `PATH_MAX`).
pub const PATH_MAX: usize = 4096;

/// Why a string is not an absolute, normalized path.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// Empty string.
    #[error("path is empty")]
    Empty,
    /// Does not start with `/`.
    #[error("path {0:?} is not absolute")]
    Relative(String),
    /// Over [`PATH_MAX`] bytes.
    #[error("path is {0} bytes long; the limit is 4096")]
    TooLong(usize),
    /// Contains a NUL or another control character.
    #[error("path contains control character {0:?}")]
    Control(char),
    /// Has an empty, `.` or `..` component, or a trailing `/`.
    #[error("path {0:?} is not normalized (no empty, '.' or '..' components, no trailing '/')")]
    NotNormalized(String),
}

/// Checks that `s` is an absolute, normalized path.
pub fn check_absolute(s: &str) -> Result<(), PathError> {
    if s.is_empty() {
        return Err(PathError::Empty);
    }
    if s.len() > PATH_MAX {
        return Err(PathError::TooLong(s.len()));
    }
    if let Some(c) = s.chars().find(|c| c.is_control()) {
        return Err(PathError::Control(c));
    }
    let Some(rest) = s.strip_prefix('/') else {
        return Err(PathError::Relative(s.to_owned()));
    };
    if rest.is_empty() {
        return Ok(());
    }
    if rest.split('/').any(|c| c.is_empty() || c == "." || c == "..") {
        return Err(PathError::NotNormalized(s.to_owned()));
    }
    Ok(())
}

/// Checks that `s` is a relative path that stays inside its base: no leading `/`, no empty, `.`
/// or `..` components, no control characters.
pub fn check_relative(s: &str) -> Result<(), PathError> {
    if s.is_empty() {
        return Err(PathError::Empty);
    }
    if s.len() > PATH_MAX {
        return Err(PathError::TooLong(s.len()));
    }
    if let Some(c) = s.chars().find(|c| c.is_control()) {
        return Err(PathError::Control(c));
    }
    if s.starts_with('/') || s.split('/').any(|c| c.is_empty() || c == "." || c == "..") {
        return Err(PathError::NotNormalized(s.to_owned()));
    }
    Ok(())
}

/// True when `path` is `base` or lies below it. Both must be normalized absolute paths.
pub fn is_within(path: &str, base: &str) -> bool {
    if base == "/" {
        return true;
    }
    path == base || path.strip_prefix(base).is_some_and(|r| r.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absolute_paths() {
        for ok in ["/", "/ctx", "/ctx/tool", "/a b/c"] {
            assert!(check_absolute(ok).is_ok(), "{ok}");
        }
        for bad in ["", "ctx", "/ctx/", "//ctx", "/a/./b", "/a/../b", "/a\0", "/a\nb"] {
            assert!(check_absolute(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn relative_paths() {
        assert!(check_relative("bin/tool").is_ok());
        for bad in ["", "/bin", "../x", "a/../b", "a//b", "a/"] {
            assert!(check_relative(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn within() {
        assert!(is_within("/work", "/work"));
        assert!(is_within("/work/a", "/work"));
        assert!(!is_within("/workshop", "/work"));
        assert!(is_within("/x", "/"));
    }
}
