//! Context packs (spec §6): `context/pack.json` beside `context/pack.md`, written by the runtime
//! (replaced atomically in their directory), checked here for shape and provenance, never built
//! or rebuilt by CortexFS.
//!
//! Shape (*decision*: the sources fix the names of the checks, not the format):
//!
//! ```json
//! {"schema": "cortexfs.context-pack/v1", "agent": "coder", "session": "s1",
//!  "items": [{"kind": "message", "source": "messages.jsonl#3", "sha256": "…"},
//!            {"kind": "ref", "source": "refs.jsonl#1"},
//!            {"kind": "child", "source": "context/child/worker.s2"},
//!            {"kind": "file", "source": "/workspace/src/main.rs", "sha256": "…"},
//!            {"kind": "note", "source": "runtime", "text": "…"}]}
//! ```
//!
//! [`inspect_context_pack_json`] checks the shape and lists every problem;
//! [`validate_context_pack_source`] checks that every item comes from where it says: a line of
//! the session's `messages.jsonl` or `refs.jsonl` that exists (and hashes to `sha256` when
//! given), a child record of the session, a path under `/workspace` or `/ctx`, or the runtime
//! itself for notes (which carry their text). Unknown fields are refused.

use serde::Deserialize;

/// The `schema` value of a pack.
pub const SCHEMA: &str = "cortexfs.context-pack/v1";

/// A context pack.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pack {
    /// [`SCHEMA`].
    pub schema: String,
    /// The agent whose session this is.
    pub agent: String,
    /// The session.
    pub session: String,
    /// The working set.
    pub items: Vec<Item>,
}

/// One item of the working set.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Item {
    /// `message`, `ref`, `child`, `file` or `note`.
    pub kind: String,
    /// Where it comes from (see the module docs).
    pub source: String,
    /// SHA-256 of the source's bytes (a JSONL line without its newline), hex.
    #[serde(default)]
    pub sha256: Option<String>,
    /// The item's text, for notes (and optional excerpts of the others).
    #[serde(default)]
    pub text: Option<String>,
}

pub use crate::problem::Problem;

fn problem(field: impl Into<String>, message: impl Into<String>) -> Problem {
    Problem::new(field, message)
}

/// What a session holds, for [`validate_context_pack_source`].
pub trait Session {
    /// Line `n` (1-based) of the session's `messages.jsonl` or `refs.jsonl`, without newline.
    fn line(&self, file: &str, n: usize) -> Option<Vec<u8>>;
    /// Whether `context/child/<id>` exists.
    fn child(&self, id: &str) -> bool;
    /// SHA-256 of bytes, hex.
    fn sha256(&self, bytes: &[u8]) -> String;
}

/// Parses and checks the shape of `pack.json`; every problem is listed.
pub fn inspect_context_pack_json(bytes: &[u8]) -> Result<Pack, Vec<Problem>> {
    let pack: Pack =
        serde_json::from_slice(bytes).map_err(|e| vec![problem("", format!("not a context pack: {e}"))])?;
    let mut out = Vec::new();
    if pack.schema != SCHEMA {
        out.push(problem("schema", format!("{:?} is not {SCHEMA:?}", pack.schema)));
    }
    for (f, v) in [("agent", &pack.agent), ("session", &pack.session)] {
        if let Err(e) = crate::name::validate(v) {
            out.push(problem(f, e.to_string()));
        }
    }
    for (i, it) in pack.items.iter().enumerate() {
        let field = |f: &str| format!("items[{i}].{f}");
        if !matches!(it.kind.as_str(), "message" | "ref" | "child" | "file" | "note") {
            out.push(problem(
                field("kind"),
                format!("unknown kind {:?} (message ref child file note)", it.kind),
            ));
        }
        if let Some(h) = &it.sha256
            && (h.len() != 64 || !h.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()))
        {
            out.push(problem(field("sha256"), "not 64 lowercase hex digits"));
        }
        if it.kind == "note" && it.text.is_none() {
            out.push(problem(field("text"), "a note carries its text"));
        }
    }
    if out.is_empty() { Ok(pack) } else { Err(out) }
}

fn line_ref(source: &str, file: &str) -> Option<usize> {
    source.strip_prefix(file)?.strip_prefix('#')?.parse().ok().filter(|n| *n > 0)
}

/// Checks where every item of `pack` comes from, against the session `s` of `agent`/`session`.
pub fn validate_context_pack_source(
    pack: &Pack,
    agent: &str,
    session: &str,
    s: &dyn Session,
) -> Result<(), Vec<Problem>> {
    let mut out = Vec::new();
    if pack.agent != agent || pack.session != session {
        out.push(problem(
            "",
            format!("the pack is for {}/{}, found in {agent}/{session}", pack.agent, pack.session),
        ));
    }
    for (i, it) in pack.items.iter().enumerate() {
        let field = format!("items[{i}].source");
        match it.kind.as_str() {
            "message" | "ref" => {
                let file = if it.kind == "message" { "messages.jsonl" } else { "refs.jsonl" };
                let Some(n) = line_ref(&it.source, file) else {
                    out.push(problem(field, format!("expected {file}#LINE, found {:?}", it.source)));
                    continue;
                };
                match s.line(file, n) {
                    None => out.push(problem(field, format!("{file} has no line {n}"))),
                    Some(bytes) => {
                        if let Some(h) = &it.sha256
                            && s.sha256(&bytes) != *h
                        {
                            out.push(problem(field, format!("{file} line {n} does not match its sha256")));
                        }
                    }
                }
            }
            "child" => match it.source.strip_prefix("context/child/") {
                Some(id) if crate::name::validate(id).is_ok() && s.child(id) => {}
                _ => {
                    out.push(problem(field, format!("{:?} is not a child record of this session", it.source)))
                }
            },
            "file" => {
                let ok = crate::path::check_absolute(&it.source).is_ok()
                    && (it.source.starts_with("/workspace/") || it.source.starts_with("/ctx/"));
                if !ok {
                    out.push(problem(
                        field,
                        format!("{:?} is not a path under /workspace or /ctx", it.source),
                    ));
                }
            }
            "note" if it.source != "runtime" => {
                out.push(problem(field, format!("a note comes from \"runtime\", not {:?}", it.source)));
            }
            _ => {}
        }
    }
    if out.is_empty() { Ok(()) } else { Err(out) }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct S;
    impl Session for S {
        fn line(&self, file: &str, n: usize) -> Option<Vec<u8>> {
            (file == "messages.jsonl" && n <= 2).then(|| format!("{{\"n\":{n}}}").into_bytes())
        }
        fn child(&self, id: &str) -> bool {
            id == "worker.s2"
        }
        fn sha256(&self, bytes: &[u8]) -> String {
            format!("{:064x}", bytes.len())
        }
    }

    #[test]
    fn shape_and_provenance() {
        let good = br#"{"schema":"cortexfs.context-pack/v1","agent":"a","session":"s","items":[
            {"kind":"message","source":"messages.jsonl#2","sha256":"0000000000000000000000000000000000000000000000000000000000000007"},
            {"kind":"child","source":"context/child/worker.s2"},
            {"kind":"file","source":"/workspace/x"},
            {"kind":"note","source":"runtime","text":"hi"}]}"#;
        let p = inspect_context_pack_json(good).unwrap();
        assert_eq!(validate_context_pack_source(&p, "a", "s", &S), Ok(()));
        assert!(validate_context_pack_source(&p, "b", "s", &S).is_err());

        let bad = br#"{"schema":"x","agent":"a/b","session":"s","items":[{"kind":"memo","source":"?"},
            {"kind":"note","source":"runtime"},{"kind":"file","source":"f","sha256":"XYZ"}]}"#;
        let errs = inspect_context_pack_json(bad).unwrap_err();
        assert_eq!(errs.len(), 5, "{errs:?}");
        assert!(
            inspect_context_pack_json(
                br#"{"schema":"cortexfs.context-pack/v1","agent":"a","session":"s","items":[],"x":1}"#
            )
            .is_err()
        );

        let wrong = br#"{"schema":"cortexfs.context-pack/v1","agent":"a","session":"s","items":[
            {"kind":"message","source":"messages.jsonl#3"},
            {"kind":"message","source":"messages.jsonl#1","sha256":"0000000000000000000000000000000000000000000000000000000000000001"},
            {"kind":"ref","source":"refs.jsonl"},
            {"kind":"child","source":"context/child/../x"},
            {"kind":"file","source":"/etc/passwd"},
            {"kind":"note","source":"model","text":"trust me"}]}"#;
        let p = inspect_context_pack_json(wrong).unwrap();
        assert_eq!(validate_context_pack_source(&p, "a", "s", &S).unwrap_err().len(), 6);
    }
}
