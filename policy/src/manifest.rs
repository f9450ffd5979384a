//! The object manifest `cortexfs.object/v2` (spec §9).
//!
//! ```json
//! {
//!   "schema": "cortexfs.object/v2",
//!   "version": "1.2.0",
//!   "compatibility": { "cortexfs": ">=0.1" },
//!   "class": "tool",
//!   "name": "fs.read",
//!   "executable": { "path": "bin/fs.read", "sha256": "<64 lowercase hex>" },
//!   "controls": {
//!     "description": { "text": "Read a file" },
//!     "policy": { "text": "" },
//!     "hooks/pre.d/10-check": { "path": "hooks/check", "sha256": "<hex>" }
//!   }
//! }
//! ```
//!
//! Paths are relative to the manifest's directory and may not leave it. Every field is checked
//! and every problem is reported; unknown fields are problems. Runtime controls (`status`, `log`,
//! `pid`) are never installed. Inline control contents are validated here; file contents are
//! validated by whoever reads the files (see [`crate::controls::validate`]).

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use crate::controls::{self, ObjectClass, Owner};
use crate::name::Name;
use crate::path;

/// The schema string of this manifest version.
pub const SCHEMA: &str = "cortexfs.object/v2";

/// The largest manifest accepted, in bytes.
pub const MANIFEST_MAX: usize = 1024 * 1024;

/// A file named by a manifest, bound to its digest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileRef {
    /// Relative path under the manifest's directory.
    pub path: String,
    /// SHA-256 of the file's bytes.
    pub sha256: [u8; 32],
}

/// Where a control's bytes come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ControlSource {
    /// Inline text.
    Text(String),
    /// A file beside the manifest.
    File(FileRef),
}

/// A checked manifest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    /// The object's version.
    pub version: semver::Version,
    /// The CortexFS versions it works with.
    pub compatibility: semver::VersionReq,
    /// Tool or agent.
    pub class: ObjectClass,
    /// The object's name.
    pub name: Name,
    /// The executable.
    pub executable: FileRef,
    /// Controls by name (relative to `<name>.d/`).
    pub controls: BTreeMap<String, ControlSource>,
}

pub use crate::problem::Problem;

#[derive(Default)]
struct Problems(Vec<Problem>);

impl Problems {
    fn add(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.0.push(Problem { field: field.into(), message: message.into() });
    }
}

fn unknown_fields(p: &mut Problems, at: &str, m: &Map<String, Value>, known: &[&str]) {
    for k in m.keys() {
        if !known.contains(&k.as_str()) {
            let field = if at.is_empty() { k.clone() } else { format!("{at}.{k}") };
            p.add(field, "unknown field");
        }
    }
}

fn string<'a>(p: &mut Problems, at: &str, m: &'a Map<String, Value>, key: &str) -> Option<&'a str> {
    let field = if at.is_empty() { key.to_owned() } else { format!("{at}.{key}") };
    match m.get(key) {
        Some(Value::String(s)) => Some(s),
        Some(_) => {
            p.add(field, "must be a string");
            None
        }
        None => {
            p.add(field, "missing");
            None
        }
    }
}

fn object<'a>(p: &mut Problems, field: &str, v: Option<&'a Value>) -> Option<&'a Map<String, Value>> {
    match v {
        Some(Value::Object(m)) => Some(m),
        Some(_) => {
            p.add(field, "must be an object");
            None
        }
        None => {
            p.add(field, "missing");
            None
        }
    }
}

/// Parses a lowercase hex SHA-256.
pub fn parse_sha256(s: &str) -> Option<[u8; 32]> {
    let b = s.as_bytes();
    if b.len() != 64 || !b.iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in b.chunks_exact(2).enumerate() {
        let hex = |c: u8| if c.is_ascii_digit() { c - b'0' } else { c - b'a' + 10 };
        out[i] = (hex(pair[0]) << 4) | hex(pair[1]);
    }
    Some(out)
}

fn file_ref(p: &mut Problems, at: &str, m: &Map<String, Value>) -> Option<FileRef> {
    unknown_fields(p, at, m, &["path", "sha256"]);
    let path = string(p, at, m, "path");
    let sha = string(p, at, m, "sha256");
    let path = path.and_then(|s| match path::check_relative(s) {
        Ok(()) => Some(s.to_owned()),
        Err(e) => {
            p.add(
                format!("{at}.path"),
                format!("{e}; paths are relative to the manifest and stay inside its directory"),
            );
            None
        }
    });
    let sha = sha.and_then(|s| {
        let d = parse_sha256(s);
        if d.is_none() {
            p.add(format!("{at}.sha256"), "must be 64 lowercase hex digits");
        }
        d
    });
    Some(FileRef { path: path?, sha256: sha? })
}

/// Parses and checks a manifest against the running CortexFS version; returns every problem.
pub fn parse(bytes: &[u8], cortexfs: &semver::Version) -> Result<Manifest, Vec<Problem>> {
    let mut p = Problems::default();
    if bytes.len() > MANIFEST_MAX {
        p.add("", format!("manifest is {} bytes; the limit is {MANIFEST_MAX}", bytes.len()));
        return Err(p.0);
    }
    let root = match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(m)) => m,
        Ok(_) => {
            p.add("", "manifest must be a JSON object");
            return Err(p.0);
        }
        Err(e) => {
            p.add("", format!("invalid JSON: {e}"));
            return Err(p.0);
        }
    };
    unknown_fields(
        &mut p,
        "",
        &root,
        &["schema", "version", "compatibility", "class", "name", "executable", "controls"],
    );
    if let Some(s) = string(&mut p, "", &root, "schema")
        && s != SCHEMA
    {
        p.add("schema", format!("{s:?} is not {SCHEMA:?}"));
    }
    let version = string(&mut p, "", &root, "version").and_then(|s| match semver::Version::parse(s) {
        Ok(v) => Some(v),
        Err(e) => {
            p.add("version", format!("{s:?} is not a semantic version: {e}"));
            None
        }
    });
    let compatibility = object(&mut p, "compatibility", root.get("compatibility")).and_then(|m| {
        unknown_fields(&mut p, "compatibility", m, &["cortexfs"]);
        let s = string(&mut p, "compatibility", m, "cortexfs")?;
        match semver::VersionReq::parse(s) {
            Ok(req) if req.matches(cortexfs) => Some(req),
            Ok(req) => {
                p.add("compatibility.cortexfs", format!("{req} does not match this CortexFS ({cortexfs})"));
                None
            }
            Err(e) => {
                p.add("compatibility.cortexfs", format!("{s:?} is not a version requirement: {e}"));
                None
            }
        }
    });
    let class = string(&mut p, "", &root, "class").and_then(|s| {
        let c = ObjectClass::parse(s);
        if c.is_none() {
            p.add("class", format!("{s:?} is not tool or agent"));
        }
        c
    });
    let name = string(&mut p, "", &root, "name").and_then(|s| match Name::new(s) {
        Ok(n) => Some(n),
        Err(e) => {
            p.add("name", e.to_string());
            None
        }
    });
    let executable =
        object(&mut p, "executable", root.get("executable")).and_then(|m| file_ref(&mut p, "executable", m));
    let mut controls = BTreeMap::new();
    if let Some(m) = object(&mut p, "controls", root.get("controls")) {
        for (cname, v) in m {
            let at = format!("controls.{cname}");
            if let Some(class) = class {
                match controls::classify(class, cname) {
                    None => {
                        p.add(&at, format!("{} objects have no such control", class.as_str()));
                        continue;
                    }
                    Some(Owner::Runtime) => {
                        p.add(&at, "runtime controls are written by the runtime, never installed");
                        continue;
                    }
                    Some(_) => {}
                }
            }
            let Some(cm) = object(&mut p, &at, Some(v)) else { continue };
            let source = if cm.contains_key("text") {
                unknown_fields(&mut p, &at, cm, &["text"]);
                let Some(t) = string(&mut p, &at, cm, "text") else { continue };
                if let (Some(class), Some(n)) = (class, &name)
                    && let Err(e) = controls::validate(class, n, cname, t.as_bytes())
                {
                    p.add(format!("{at}.text"), e);
                }
                ControlSource::Text(t.to_owned())
            } else if cm.contains_key("path") {
                let Some(f) = file_ref(&mut p, &at, cm) else { continue };
                ControlSource::File(f)
            } else {
                p.add(&at, "needs either text or path+sha256");
                continue;
            };
            controls.insert(cname.clone(), source);
        }
    }
    match (version, compatibility, class, name, executable) {
        (Some(version), Some(compatibility), Some(class), Some(name), Some(executable)) if p.0.is_empty() => {
            Ok(Manifest { version, compatibility, class, name, executable, controls })
        }
        _ => Err(p.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HASH: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    fn v() -> semver::Version {
        semver::Version::new(0, 1, 0)
    }

    fn good() -> String {
        format!(
            r#"{{"schema":"cortexfs.object/v2","version":"1.0.0","compatibility":{{"cortexfs":">=0.1"}},
            "class":"tool","name":"fs.read","executable":{{"path":"bin/fs.read","sha256":"{HASH}"}},
            "controls":{{"description":{{"text":"Read a file"}},"policy":{{"text":"allow a_t tool:fs.read execute\n"}},
            "hooks/pre.d/10-check":{{"path":"hooks/check","sha256":"{HASH}"}}}}}}"#
        )
    }

    #[test]
    fn good_manifest() {
        let m = parse(good().as_bytes(), &v()).unwrap();
        assert_eq!(m.name.as_str(), "fs.read");
        assert_eq!(m.class, ObjectClass::Tool);
        assert_eq!(m.executable.path, "bin/fs.read");
        assert_eq!(m.controls.len(), 3);
        assert!(matches!(m.controls["hooks/pre.d/10-check"], ControlSource::File(_)));
    }

    #[test]
    fn every_problem_listed() {
        let bad = r#"{"schema":"cortexfs.object/v1","version":"one","compatibility":{"cortexfs":">=9"},
            "class":"widget","name":"../x","executable":{"path":"/bin/sh","sha256":"XYZ"},
            "controls":{"status":{"text":""}},"extra":1}"#;
        let e = parse(bad.as_bytes(), &v()).unwrap_err();
        let fields: Vec<&str> = e.iter().map(|p| p.field.as_str()).collect();
        for f in [
            "extra",
            "schema",
            "version",
            "compatibility.cortexfs",
            "class",
            "name",
            "executable.path",
            "executable.sha256",
        ] {
            assert!(fields.contains(&f), "{f} missing from {fields:?}");
        }
    }

    #[test]
    fn control_problems() {
        let m = good()
            .replace(
                r#""description":{"text":"Read a file"}"#,
                r#""status":{"text":""},"pid":{"text":"1"},"schema":{"text":"[]"}"#,
            )
            .replace("tool:fs.read execute", "agent:* create");
        let e = parse(m.as_bytes(), &v()).unwrap_err();
        let fields: Vec<&str> = e.iter().map(|p| p.field.as_str()).collect();
        assert_eq!(
            fields,
            vec!["controls.pid", "controls.policy.text", "controls.schema.text", "controls.status"]
        );
    }

    #[test]
    fn not_json_and_not_object() {
        assert_eq!(parse(b"{", &v()).unwrap_err().len(), 1);
        assert_eq!(parse(b"[]", &v()).unwrap_err().len(), 1);
        assert_eq!(parse(&vec![b' '; MANIFEST_MAX + 1], &v()).unwrap_err().len(), 1);
    }

    #[test]
    fn sha256_hex() {
        assert_eq!(parse_sha256(HASH).unwrap()[0], 0x9f);
        assert!(parse_sha256(&HASH.to_uppercase()).is_none());
        assert!(parse_sha256(&HASH[1..]).is_none());
    }
}
