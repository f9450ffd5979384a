//! The agent mount table (`agent/<name>.d/mount`): one mount per line,
//! `SOURCE<TAB>TARGET<TAB>ro|rw|hide<TAB>OPTIONS`.
//!
//! SOURCE and TARGET are absolute normalized paths; TARGET may not be `/`, `/ctx` or lie under
//! `/ctx` (the view is bound there). OPTIONS is `-` for none or a comma-separated set of `nosuid`,
//! `nodev`, `noexec`. Blank lines are skipped; there are no comments; a target may appear once.
//!
//! `hide` binds nothing: the SOURCE is `-` and TARGET (a subtree of the workspace, such as
//! `/workspace/.git`, or of any other bind) is covered in the sandbox by an empty read-only
//! directory, or an empty file for a file. It narrows what the agent sees, so no grant is
//! needed for it; a later line may bind something of its own below it.

use std::fmt;

use crate::path;

/// Read-only or read-write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MountMode {
    /// `ro`
    Ro,
    /// `rw`
    Rw,
    /// `hide`: nothing is bound; the target is covered by an empty read-only one.
    Hide,
}

impl MountMode {
    /// Parses `ro` or `rw`.
    pub fn parse(s: &str) -> Option<MountMode> {
        match s {
            "ro" => Some(MountMode::Ro),
            "rw" => Some(MountMode::Rw),
            "hide" => Some(MountMode::Hide),
            _ => None,
        }
    }

    /// The keyword.
    pub fn as_str(self) -> &'static str {
        match self {
            MountMode::Ro => "ro",
            MountMode::Rw => "rw",
            MountMode::Hide => "hide",
        }
    }
}

/// Mount options.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MountOptions {
    /// `nosuid`
    pub nosuid: bool,
    /// `nodev`
    pub nodev: bool,
    /// `noexec`
    pub noexec: bool,
}

impl MountOptions {
    /// Parses `-` or a comma-separated option list.
    pub fn parse(s: &str) -> Result<MountOptions, String> {
        let mut o = MountOptions::default();
        if s == "-" {
            return Ok(o);
        }
        for word in s.split(',') {
            let flag = match word {
                "nosuid" => &mut o.nosuid,
                "nodev" => &mut o.nodev,
                "noexec" => &mut o.noexec,
                _ => return Err(format!("unknown mount option {word:?} (known: nosuid nodev noexec, or -)")),
            };
            if *flag {
                return Err(format!("mount option {word:?} given twice"));
            }
            *flag = true;
        }
        Ok(o)
    }

    /// True when `self` restricts at least as much as `other`.
    pub fn at_least(self, other: MountOptions) -> bool {
        (self.nosuid || !other.nosuid) && (self.nodev || !other.nodev) && (self.noexec || !other.noexec)
    }
}

impl fmt::Display for MountOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let words: Vec<&str> = [(self.nosuid, "nosuid"), (self.nodev, "nodev"), (self.noexec, "noexec")]
            .into_iter()
            .filter_map(|(on, w)| on.then_some(w))
            .collect();
        if words.is_empty() { f.write_str("-") } else { f.write_str(&words.join(",")) }
    }
}

/// One mount.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Mount {
    /// Host path (`-` for `hide`).
    pub source: String,
    /// Path inside the sandbox.
    pub target: String,
    /// `ro` or `rw`.
    pub mode: MountMode,
    /// Options.
    pub options: MountOptions,
}

impl fmt::Display for Mount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}\t{}\t{}\t{}", self.source, self.target, self.mode.as_str(), self.options)
    }
}

/// A bad mount line.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct MountError {
    /// 1-based line number.
    pub line: u32,
    /// What is wrong.
    pub message: String,
}

/// Checks a mount target: absolute, normalized, not `/` and not `/ctx` or below it.
pub fn check_target(target: &str) -> Result<(), String> {
    path::check_absolute(target).map_err(|e| format!("target: {e}"))?;
    if target == "/" {
        return Err("target may not be /".into());
    }
    if path::is_within(target, "/ctx") {
        return Err(format!("target {target} may not replace or shadow /ctx"));
    }
    Ok(())
}

/// Parses one mount line (`SOURCE TAB TARGET TAB ro|rw|hide TAB OPTIONS`).
pub fn parse_line(text: &str) -> Result<Mount, String> {
    let fields: Vec<&str> = text.split('\t').collect();
    let [source, target, mode, options] = fields[..] else {
        return Err(format!(
            "expected 4 tab-separated fields SOURCE TARGET ro|rw|hide OPTIONS, found {}",
            fields.len()
        ));
    };
    check_target(target)?;
    let mode = MountMode::parse(mode).ok_or_else(|| format!("mode {mode:?} is not ro, rw or hide"))?;
    if mode == MountMode::Hide {
        if source != "-" {
            return Err(format!("a hide line binds nothing: its source is -, not {source:?}"));
        }
    } else {
        path::check_absolute(source).map_err(|e| format!("source: {e}"))?;
    }
    let options = MountOptions::parse(options)?;
    Ok(Mount { source: source.into(), target: target.into(), mode, options })
}

/// Parses a whole mount table; reports every bad line.
pub fn parse(text: &[u8]) -> Result<Vec<Mount>, Vec<MountError>> {
    let mut mounts: Vec<Mount> = Vec::new();
    let mut errors = Vec::new();
    for (i, raw) in text.split(|&b| b == b'\n').enumerate() {
        let line = u32::try_from(i + 1).unwrap_or(u32::MAX);
        let result = match std::str::from_utf8(raw) {
            Err(_) => Err("line is not valid UTF-8".to_owned()),
            Ok(t) if t.trim().is_empty() => continue,
            Ok(t) => parse_line(t).and_then(|m| {
                if mounts.iter().any(|o| o.target == m.target) {
                    Err(format!("target {} is mounted twice", m.target))
                } else {
                    Ok(m)
                }
            }),
        };
        match result {
            Ok(m) => mounts.push(m),
            Err(message) => errors.push(MountError { line, message }),
        }
    }
    if errors.is_empty() { Ok(mounts) } else { Err(errors) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good_table() {
        let t = b"/work\t/work\tro\t-\n\n/srv/a\t/data\trw\tnosuid,noexec\n";
        let m = parse(t).unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(m[1].mode, MountMode::Rw);
        assert!(m[1].options.noexec && m[1].options.nosuid && !m[1].options.nodev);
        assert_eq!(m[1].to_string(), "/srv/a\t/data\trw\tnosuid,noexec");
    }

    #[test]
    fn a_hide_line_binds_nothing() {
        let m = parse(b"-\t/workspace/.git\thide\t-\n").unwrap();
        assert_eq!(m[0].mode, MountMode::Hide);
        assert_eq!(m[0].to_string(), "-\t/workspace/.git\thide\t-");
        let e = parse(b"/srv\t/workspace/.git\thide\t-\n-\t/x\tro\t-\n").unwrap_err();
        assert_eq!(e.iter().map(|e| e.line).collect::<Vec<_>>(), vec![1, 2]);
    }

    #[test]
    fn bad_lines_all_reported() {
        let t = "/a\t/\tro\t-\n/a\t/ctx\tro\t-\n/a\t/ctx/tool\tro\t-\nrel\t/x\tro\t-\n/a\t/x\trx\t-\n/a\t/y\tro\tbogus\n/a /z ro -\n/a\t/w\tro\t-\n/b\t/w\tro\t-\n/a\t/v\tro\tnodev,nodev\n/a\t/u\tro\n";
        let e = parse(t.as_bytes()).unwrap_err();
        assert_eq!(e.iter().map(|e| e.line).collect::<Vec<_>>(), vec![1, 2, 3, 4, 5, 6, 7, 9, 10, 11]);
    }
}
