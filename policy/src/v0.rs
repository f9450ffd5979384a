//! Policy v0 (spec §4): `allow <subject_type> <object_class>:<object_name> <permission>`.
//!
//! Default deny; no deny rules, globs, priorities, inheritance, variables or path matching.
//! Blank (or whitespace-only) lines are skipped. There is no comment syntax: like upstream, a line
//! starting with `#` is a parse error (EINVAL), so a commented-out grant can never be mistaken
//! for a live one by a reader who assumes otherwise.
//!
//! [`parse`] reports every bad line with its number, the field at fault and an errno name.
//! [`Policy::compile`] turns rules into a hash table keyed by (subject, class, object) holding a
//! permission bit set, so [`Policy::check`] is one hash probe whatever the number of rules.

use std::fmt;
use std::hash::{Hash, Hasher};

use hashbrown::{Equivalent, HashMap};

use crate::errno::Errno;
use crate::name;
use crate::path;

/// An object class and its fixed permission set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Class {
    /// `tool:<name> execute`
    Tool,
    /// `model:<name> use`
    Model,
    /// `shared:<name> read|write`
    Shared,
    /// `session:<agent>/<session> read|write|resume`
    Session,
    /// `mount:<path> read|write`
    Mount,
    /// `agent:<name> create|start|stop|read|write`
    Agent,
    /// `network:default connect`
    Network,
    /// `record:turns|tool-args write`: what is recorded in full (without it, facts only)
    Record,
}

impl Class {
    /// Every class, in table order.
    pub const ALL: [Class; 8] = [
        Class::Tool,
        Class::Model,
        Class::Shared,
        Class::Session,
        Class::Mount,
        Class::Agent,
        Class::Network,
        Class::Record,
    ];

    /// Parses a class keyword.
    pub fn parse(s: &str) -> Option<Class> {
        Class::ALL.into_iter().find(|c| c.as_str() == s)
    }

    /// The keyword.
    pub fn as_str(self) -> &'static str {
        match self {
            Class::Tool => "tool",
            Class::Model => "model",
            Class::Shared => "shared",
            Class::Session => "session",
            Class::Mount => "mount",
            Class::Agent => "agent",
            Class::Network => "network",
            Class::Record => "record",
        }
    }

    /// The permissions this class defines.
    pub fn permissions(self) -> &'static [Permission] {
        use Permission::*;
        match self {
            Class::Tool => &[Execute],
            Class::Model => &[Use],
            Class::Shared => &[Read, Write],
            Class::Session => &[Read, Write, Resume],
            Class::Mount => &[Read, Write],
            Class::Agent => &[Create, Start, Stop, Read, Write],
            Class::Network => &[Connect],
            Class::Record => &[Write],
        }
    }

    /// True when `p` belongs to this class.
    pub fn allows_permission(self, p: Permission) -> bool {
        self.permissions().contains(&p)
    }

    /// Checks an object name for this class. Tool, agent and shared objects are object names;
    /// session objects are `<agent>/<session>` (the session of that agent); model objects are
    /// `main`, `<name>` or `<provider>/<model>`; mount objects are
    /// absolute normalized paths (the mount target); the only network object is `default`.
    pub fn check_object(self, object: &str) -> Result<(), String> {
        if object.contains('*') {
            return Err(format!(
                "{}:{object} is invalid: policy v0 has no globs; name each object",
                self.as_str()
            ));
        }
        match self {
            Class::Tool | Class::Agent | Class::Shared => {
                name::validate(object).map_err(|e| format!("invalid {} name {object:?}: {e}", self.as_str()))
            }
            // A session is named by its agent: `<agent>/<session>`.
            Class::Session => match object.split_once('/') {
                Some((agent, session)) => name::validate(agent)
                    .and_then(|()| name::validate(session))
                    .map_err(|e| format!("invalid session name {object:?}: {e}")),
                None => Err(format!("invalid session name {object:?}: expected AGENT/SESSION")),
            },
            Class::Model => {
                let mut parts = object.split('/');
                let n = parts.clone().count();
                if n > 2 {
                    return Err(format!("invalid model name {object:?}: expected NAME or PROVIDER/MODEL"));
                }
                parts.try_for_each(|p| {
                    name::validate(p).map_err(|e| format!("invalid model name {object:?}: {e}"))
                })
            }
            Class::Mount => path::check_absolute(object)
                .map_err(|e| format!("invalid mount object: {e} (mount objects are absolute target paths)")),
            Class::Record => match object {
                "turns" | "tool-args" => Ok(()),
                _ => {
                    Err(format!("record:{object} is invalid: the record objects are `turns` and `tool-args`"))
                }
            },
            Class::Network => {
                if object == "default" {
                    Ok(())
                } else {
                    Err(format!("network:{object} is invalid: the only network object is `default`"))
                }
            }
        }
    }
}

impl fmt::Display for Class {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A permission keyword.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Permission {
    /// tool
    Execute,
    /// model
    Use,
    /// shared, session, mount, agent
    Read,
    /// shared, session, mount, agent, record
    Write,
    /// session
    Resume,
    /// agent
    Create,
    /// agent
    Start,
    /// agent
    Stop,
    /// network
    Connect,
}

impl Permission {
    /// Every permission.
    pub const ALL: [Permission; 9] = [
        Permission::Execute,
        Permission::Use,
        Permission::Read,
        Permission::Write,
        Permission::Resume,
        Permission::Create,
        Permission::Start,
        Permission::Stop,
        Permission::Connect,
    ];

    /// Parses a permission keyword.
    pub fn parse(s: &str) -> Option<Permission> {
        Permission::ALL.into_iter().find(|p| p.as_str() == s)
    }

    /// The keyword.
    pub fn as_str(self) -> &'static str {
        match self {
            Permission::Execute => "execute",
            Permission::Use => "use",
            Permission::Read => "read",
            Permission::Write => "write",
            Permission::Resume => "resume",
            Permission::Create => "create",
            Permission::Start => "start",
            Permission::Stop => "stop",
            Permission::Connect => "connect",
        }
    }

    fn bit(self) -> u16 {
        1 << (self as u16)
    }
}

impl fmt::Display for Permission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The longest subject type in bytes.
pub const SUBJECT_MAX: usize = 64;

/// Checks a subject type: 1 to 64 bytes of `[A-Za-z0-9._+-]`, starting with a letter or digit.
pub fn check_subject(s: &str) -> Result<(), String> {
    if s.contains('*') {
        return Err(format!("subject {s:?} is invalid: policy v0 has no globs"));
    }
    let ok = !s.is_empty()
        && s.len() <= SUBJECT_MAX
        && s.as_bytes()[0].is_ascii_alphanumeric()
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'+' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "invalid subject type {s:?}: expected 1 to 64 of [A-Za-z0-9._+-], starting with a letter or digit"
        ))
    }
}

/// One parsed rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// 1-based line number in the source text.
    pub line: u32,
    /// The subject type, e.g. `coder_t`.
    pub subject: Box<str>,
    /// The object class.
    pub class: Class,
    /// The object name.
    pub object: Box<str>,
    /// The permission.
    pub permission: Permission,
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "allow {} {}:{} {}", self.subject, self.class, self.object, self.permission)
    }
}

/// The field of a line a parse error is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    /// The line as a whole (field count, encoding, control characters, `#`).
    Line,
    /// The first word, which must be `allow`.
    Keyword,
    /// The subject type.
    Subject,
    /// The object class.
    Class,
    /// The object name.
    Object,
    /// The permission.
    Permission,
}

impl Field {
    /// The field's name as printed.
    pub fn as_str(self) -> &'static str {
        match self {
            Field::Line => "line",
            Field::Keyword => "keyword",
            Field::Subject => "subject",
            Field::Class => "class",
            Field::Object => "object",
            Field::Permission => "permission",
        }
    }
}

/// A bad line.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {field}: {message} ({errno})", field = field.as_str())]
pub struct ParseError {
    /// 1-based line number.
    pub line: u32,
    /// The field at fault.
    pub field: Field,
    /// The errno the failure maps to (always EINVAL in v0).
    pub errno: Errno,
    /// What is wrong, for people.
    pub message: String,
}

fn bad(line: u32, field: Field, message: String) -> ParseError {
    ParseError { line, field, errno: Errno::Einval, message }
}

/// Parses policy text. Returns every rule, or every bad line.
pub fn parse(text: &[u8]) -> Result<Vec<Rule>, Vec<ParseError>> {
    let mut rules = Vec::new();
    let mut errors = Vec::new();
    for (i, raw) in text.split(|&b| b == b'\n').enumerate() {
        let line = u32::try_from(i + 1).unwrap_or(u32::MAX);
        match parse_line(raw, line) {
            Ok(Some(rule)) => rules.push(rule),
            Ok(None) => {}
            Err(e) => errors.push(e),
        }
    }
    if errors.is_empty() { Ok(rules) } else { Err(errors) }
}

/// The lines of policy `text` whose subject is `subject`: (line number, the line). Lines that
/// do not parse name no one.
pub fn lines_naming(text: &[u8], subject: &str) -> Vec<(u32, String)> {
    text.split(|&b| b == b'\n')
        .enumerate()
        .filter_map(|(i, raw)| {
            let line = u32::try_from(i + 1).unwrap_or(u32::MAX);
            match parse_line(raw, line) {
                Ok(Some(rule)) if &*rule.subject == subject => {
                    Some((line, String::from_utf8_lossy(raw).into_owned()))
                }
                _ => None,
            }
        })
        .collect()
}

/// Policy `text` without the lines whose subject is `subject`; every other line is kept as it
/// was.
pub fn without_subject(text: &[u8], subject: &str) -> Vec<u8> {
    let naming: Vec<u32> = lines_naming(text, subject).into_iter().map(|(l, _)| l).collect();
    let mut out = Vec::with_capacity(text.len());
    for (i, raw) in text.split_inclusive(|&b| b == b'\n').enumerate() {
        if !naming.contains(&u32::try_from(i + 1).unwrap_or(u32::MAX)) {
            out.extend_from_slice(raw);
        }
    }
    out
}

/// Parses one line; `Ok(None)` for a blank line.
pub fn parse_line(raw: &[u8], line: u32) -> Result<Option<Rule>, ParseError> {
    let Ok(text) = std::str::from_utf8(raw) else {
        return Err(bad(line, Field::Line, "line is not valid UTF-8".into()));
    };
    if text.trim_matches([' ', '\t']).is_empty() {
        return Ok(None);
    }
    if let Some(c) = text.chars().find(|&c| c.is_control() && c != '\t') {
        let why = if c == '\r' { " (CRLF line endings are not accepted)" } else { "" };
        return Err(bad(line, Field::Line, format!("line contains control character {c:?}{why}")));
    }
    if text.trim_start().starts_with('#') {
        return Err(bad(
            line,
            Field::Line,
            "policy v0 has no comment syntax; a '#' line is a parse error".into(),
        ));
    }
    let fields: Vec<&str> = text.split([' ', '\t']).filter(|f| !f.is_empty()).collect();
    let [keyword, subject, target, perm] = fields[..] else {
        return Err(bad(
            line,
            Field::Line,
            format!("expected 4 fields `allow SUBJECT CLASS:NAME PERMISSION`, found {}", fields.len()),
        ));
    };
    if keyword != "allow" {
        let hint = if keyword == "deny" { ": policy v0 has no deny rules (default deny)" } else { "" };
        return Err(bad(
            line,
            Field::Keyword,
            format!("unknown keyword {keyword:?}, expected `allow`{hint}"),
        ));
    }
    check_subject(subject).map_err(|m| bad(line, Field::Subject, m))?;
    let Some((class, object)) = target.split_once(':') else {
        return Err(bad(line, Field::Class, format!("expected CLASS:NAME, found {target:?}")));
    };
    let Some(class) = Class::parse(class) else {
        return Err(bad(
            line,
            Field::Class,
            format!("unknown class {class:?} (known: tool model shared session mount agent network)"),
        ));
    };
    class.check_object(object).map_err(|m| bad(line, Field::Object, m))?;
    let permission = Permission::parse(perm).filter(|p| class.allows_permission(*p)).ok_or_else(|| {
        let known: Vec<&str> = class.permissions().iter().map(|p| p.as_str()).collect();
        bad(
            line,
            Field::Permission,
            format!("unknown permission {perm:?} for class {class} (known: {})", known.join(" ")),
        )
    })?;
    Ok(Some(Rule { line, subject: subject.into(), class, object: object.into(), permission }))
}

/// The owned hash key of a grant: `subject`, a NUL, the class byte, then `object`, in one
/// allocation so that a probe touches one heap line besides the bucket.
#[derive(Debug, PartialEq, Eq)]
struct Key(Box<[u8]>);

impl Key {
    fn new(subject: &str, class: Class, object: &str) -> Key {
        let mut v = Vec::with_capacity(subject.len() + 2 + object.len());
        v.extend_from_slice(subject.as_bytes());
        v.extend_from_slice(&[0, class as u8]);
        v.extend_from_slice(object.as_bytes());
        Key(v.into_boxed_slice())
    }

    /// Splits the key back into its parts. Subjects never contain NUL.
    fn parts(&self) -> (&[u8], u8, &[u8]) {
        let nul = self.0.iter().position(|&b| b == 0).expect("keys hold a NUL separator");
        (&self.0[..nul], self.0[nul + 1], &self.0[nul + 2..])
    }
}

/// A borrowed key, probed without allocating.
#[derive(Debug)]
struct KeyRef<'a> {
    subject: &'a str,
    class: Class,
    object: &'a str,
}

fn hash_parts<H: Hasher>(h: &mut H, subject: &[u8], class: u8, object: &[u8]) {
    h.write(subject);
    h.write(&[0, class]);
    h.write(object);
}

impl Hash for Key {
    fn hash<H: Hasher>(&self, h: &mut H) {
        let (s, c, o) = self.parts();
        hash_parts(h, s, c, o);
    }
}

impl Hash for KeyRef<'_> {
    fn hash<H: Hasher>(&self, h: &mut H) {
        hash_parts(h, self.subject.as_bytes(), self.class as u8, self.object.as_bytes());
    }
}

impl Equivalent<Key> for KeyRef<'_> {
    fn equivalent(&self, k: &Key) -> bool {
        let (s, o) = (self.subject.as_bytes(), self.object.as_bytes());
        k.0.len() == s.len() + 2 + o.len()
            && k.0[s.len()..s.len() + 2] == [0, self.class as u8]
            && k.0[..s.len()] == *s
            && k.0[s.len() + 2..] == *o
    }
}

/// The permissions granted on one (subject, class, object), with the line of the first rule that
/// granted each (indexed by the permission's position in its class).
#[derive(Clone, Copy, Debug, Default)]
struct Grant {
    mask: u16,
    lines: [u32; 5],
}

fn slot(class: Class, p: Permission) -> usize {
    class.permissions().iter().position(|&q| q == p).expect("permission belongs to the class")
}

/// A question to a policy: may `subject` have `permission` on `class:object`?
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Query<'a> {
    /// Subject type.
    pub subject: &'a str,
    /// Object class.
    pub class: Class,
    /// Object name.
    pub object: &'a str,
    /// Permission asked for.
    pub permission: Permission,
}

impl<'a> Query<'a> {
    /// Builds a query from text, checking each part as the parser would.
    pub fn parse(subject: &'a str, target: &'a str, permission: &str) -> Result<Query<'a>, ParseError> {
        match parse_line(format!("allow {subject} {target} {permission}").as_bytes(), 0)? {
            Some(_) => {}
            None => return Err(bad(0, Field::Line, "empty query".into())),
        }
        let (class, object) = target.split_once(':').expect("checked by parse_line");
        Ok(Query {
            subject,
            class: Class::parse(class).expect("checked by parse_line"),
            object,
            permission: Permission::parse(permission).expect("checked by parse_line"),
        })
    }
}

impl fmt::Display for Query<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}:{} {}", self.subject, self.class, self.object, self.permission)
    }
}

/// The outcome of a check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Allowed by the rule on this line.
    Allow {
        /// Line of the first rule granting it.
        line: u32,
    },
    /// Denied; the reason says which.
    Deny(DenyReason),
}

impl Decision {
    /// True for [`Decision::Allow`].
    pub fn is_allow(self) -> bool {
        matches!(self, Decision::Allow { .. })
    }
}

/// Why a query was denied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DenyReason {
    /// The permission does not belong to the class: such a query can never be allowed.
    InvalidPermission,
    /// No rule names this subject, class and object.
    NoRule,
    /// Rules name the object, but not with this permission; `granted` is the permission bit set
    /// they do grant.
    OtherPermissions {
        /// Bit set of granted permissions (bit = `Permission as u16`).
        granted: u16,
    },
}

/// A [`DenyReason`] with its query, ready to print.
#[derive(Debug)]
pub struct Denial<'a> {
    /// The query denied.
    pub query: Query<'a>,
    /// Why.
    pub reason: DenyReason,
}

impl fmt::Display for Denial<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let q = &self.query;
        match self.reason {
            DenyReason::InvalidPermission => {
                write!(f, "permission {} is not defined for class {} (EINVAL)", q.permission, q.class)
            }
            DenyReason::NoRule => write!(
                f,
                "no rule grants {} {}:{} {} (default deny)",
                q.subject, q.class, q.object, q.permission
            ),
            DenyReason::OtherPermissions { granted } => {
                let held: Vec<&str> =
                    Permission::ALL.iter().filter(|p| granted & p.bit() != 0).map(|p| p.as_str()).collect();
                write!(
                    f,
                    "no rule grants {} {}:{} {}; rules grant only {}",
                    q.subject,
                    q.class,
                    q.object,
                    q.permission,
                    held.join(" ")
                )
            }
        }
    }
}

/// A compiled policy: one hash probe per check.
#[derive(Debug, Default)]
pub struct Policy {
    grants: HashMap<Key, Grant>,
    rules: usize,
}

impl Policy {
    /// Compiles parsed rules. Duplicate rules are harmless; the first line is kept.
    pub fn compile(rules: &[Rule]) -> Policy {
        let mut grants: HashMap<Key, Grant> = HashMap::with_capacity(rules.len());
        for r in rules {
            let g = grants.entry(Key::new(&r.subject, r.class, &r.object)).or_default();
            if g.mask & r.permission.bit() == 0 {
                g.mask |= r.permission.bit();
                g.lines[slot(r.class, r.permission)] = r.line;
            }
        }
        Policy { grants, rules: rules.len() }
    }

    /// Parses and compiles policy text.
    pub fn from_text(text: &[u8]) -> Result<Policy, Vec<ParseError>> {
        parse(text).map(|rules| Policy::compile(&rules))
    }

    /// Number of rules compiled (duplicates included).
    pub fn rule_count(&self) -> usize {
        self.rules
    }

    /// Evaluates a query.
    #[inline]
    pub fn check(&self, q: &Query<'_>) -> Decision {
        if !q.class.allows_permission(q.permission) {
            return Decision::Deny(DenyReason::InvalidPermission);
        }
        let key = KeyRef { subject: q.subject, class: q.class, object: q.object };
        match self.grants.get(&key) {
            None => Decision::Deny(DenyReason::NoRule),
            Some(g) if g.mask & q.permission.bit() != 0 => {
                Decision::Allow { line: g.lines[slot(q.class, q.permission)] }
            }
            Some(g) => Decision::Deny(DenyReason::OtherPermissions { granted: g.mask }),
        }
    }

    /// True when the query is allowed.
    #[inline]
    pub fn allows(&self, q: &Query<'_>) -> bool {
        self.check(q).is_allow()
    }

    /// The objects of `class` on which some rule grants `subject` a permission (a walk over
    /// every grant: for listings, not for the hot path).
    pub fn objects(&self, subject: &str, class: Class) -> Vec<String> {
        let mut head = Vec::with_capacity(subject.len() + 2);
        head.extend_from_slice(subject.as_bytes());
        head.extend_from_slice(&[0, class as u8]);
        let mut out: Vec<String> = self
            .grants
            .iter()
            .filter(|(k, g)| g.mask != 0 && k.0.starts_with(&head))
            .filter_map(|(k, _)| std::str::from_utf8(&k.0[head.len()..]).ok().map(str::to_owned))
            .collect();
        out.sort();
        out
    }

    /// True when some rule grants `subject` any permission on an object of `class` whose name
    /// starts with `prefix` (a walk over every grant: for listings, not for the hot path).
    pub fn grants_under(&self, subject: &str, class: Class, prefix: &str) -> bool {
        let mut head = Vec::with_capacity(subject.len() + 2 + prefix.len());
        head.extend_from_slice(subject.as_bytes());
        head.extend_from_slice(&[0, class as u8]);
        head.extend_from_slice(prefix.as_bytes());
        self.grants.iter().any(|(k, g)| g.mask != 0 && k.0.starts_with(&head))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_are_named_by_their_agent_and_grants_can_be_listed() {
        let p = Policy::from_text(
            b"allow a_t session:bee/s1 read\nallow a_t agent:bee read\nallow b_t agent:cow read\n",
        )
        .unwrap();
        assert_eq!(p.objects("a_t", Class::Session), ["bee/s1"]);
        assert_eq!(p.objects("a_t", Class::Agent), ["bee"]);
        assert!(p.grants_under("a_t", Class::Session, "bee/"));
        assert!(!p.grants_under("a_t", Class::Session, "cow/"));
        for bad in
            ["allow a_t session:s1 read", "allow a_t session:bee/ read", "allow a_t session:bee/s/x read"]
        {
            assert!(Policy::from_text(bad.as_bytes()).is_err(), "{bad}");
        }
    }

    #[test]
    fn lines_naming_a_subject_and_removing_them() {
        let text = b"allow a_t tool:x execute\nallow ghost_t tool:y execute\n\nallow a_t tool:y execute\nallow ghost_t agent:z read\n";
        let n = lines_naming(text, "ghost_t");
        assert_eq!(n.iter().map(|(l, _)| *l).collect::<Vec<_>>(), [2, 5]);
        assert_eq!(n[0].1, "allow ghost_t tool:y execute");
        assert_eq!(
            without_subject(text, "ghost_t"),
            b"allow a_t tool:x execute\n\nallow a_t tool:y execute\n".to_vec()
        );
        assert!(lines_naming(text, "nobody_t").is_empty());
    }

    fn errs(text: &str) -> Vec<ParseError> {
        parse(text.as_bytes()).unwrap_err()
    }

    fn one_err(text: &str) -> ParseError {
        let mut e = errs(text);
        assert_eq!(e.len(), 1, "{e:?}");
        e.remove(0)
    }

    #[test]
    fn every_row_of_the_class_table_parses_and_checks() {
        let table: &[(&str, &str, &[&str])] = &[
            ("tool", "fs.read", &["execute"]),
            ("model", "openai/gpt-5.6", &["use"]),
            ("shared", "project-a", &["read", "write"]),
            ("session", "reviewer/default", &["read", "write", "resume"]),
            ("mount", "/work", &["read", "write"]),
            ("agent", "reviewer", &["create", "start", "stop", "read", "write"]),
            ("network", "default", &["connect"]),
        ];
        for (class, object, perms) in table {
            for perm in *perms {
                let text = format!("allow coder_t {class}:{object} {perm}\n");
                let p = Policy::from_text(text.as_bytes()).unwrap();
                let target = format!("{class}:{object}");
                let q = Query::parse("coder_t", &target, perm).unwrap();
                assert_eq!(p.check(&q), Decision::Allow { line: 1 }, "{text}");
                let other = Query { subject: "other_t", ..q };
                assert_eq!(p.check(&other), Decision::Deny(DenyReason::NoRule));
            }
            // Every permission outside the class's set is refused with EINVAL.
            for perm in Permission::ALL {
                if perms.contains(&perm.as_str()) {
                    continue;
                }
                let e = one_err(&format!("allow coder_t {class}:{object} {perm}"));
                assert_eq!((e.field, e.errno), (Field::Permission, Errno::Einval), "{class} {perm}");
            }
        }
    }

    #[test]
    fn each_error_kind() {
        let cases: &[(&str, Field)] = &[
            ("allow coder_t tool:fs.read", Field::Line),
            ("allow coder_t tool:fs.read execute extra", Field::Line),
            ("deny coder_t tool:fs.read execute", Field::Keyword),
            ("Allow coder_t tool:fs.read execute", Field::Keyword),
            ("allow coder* tool:fs.read execute", Field::Subject),
            ("allow -x tool:fs.read execute", Field::Subject),
            ("allow coder_t toolfs.read execute", Field::Class),
            ("allow coder_t widget:fs.read execute", Field::Class),
            ("allow coder_t tool:../x execute", Field::Object),
            ("allow coder_t tool: execute", Field::Object),
            ("allow coder_t agent:* create", Field::Object),
            ("allow coder_t tool:fs.* execute", Field::Object),
            ("allow coder_t network:foo connect", Field::Object),
            ("allow coder_t mount:work read", Field::Object),
            ("allow coder_t model:a/b/c use", Field::Object),
            ("allow coder_t tool:fs.read run", Field::Permission),
            ("allow coder_t tool:fs.read read", Field::Permission),
            ("# allow coder_t tool:fs.read execute", Field::Line),
            ("allow coder_t tool:fs.read execute\r", Field::Line),
        ];
        for (text, field) in cases {
            let e = one_err(text);
            assert_eq!(e.field, *field, "{text}: {e}");
            assert_eq!(e.errno, Errno::Einval, "{text}");
            assert_eq!(e.line, 1);
        }
        let e = parse(b"allow a_t tool:x \xff execute").unwrap_err();
        assert_eq!(e[0].field, Field::Line);
    }

    #[test]
    fn agent_star_and_network_foo_are_invalid() {
        assert!(one_err("allow coder_t agent:* create").message.contains("no globs"));
        assert!(one_err("allow coder_t network:foo connect").message.contains("only network object"));
    }

    #[test]
    fn every_bad_line_reported_with_its_number() {
        let text =
            "allow a_t tool:x execute\n\nbogus\nallow a_t tool:y execute\n# no\nallow a_t agent:* create\n";
        let e = errs(text);
        assert_eq!(e.iter().map(|e| e.line).collect::<Vec<_>>(), vec![3, 5, 6]);
    }

    #[test]
    fn blank_lines_and_spacing() {
        let p = Policy::from_text(b"\n   \n\tallow  a_t\ttool:x   execute  \n\n").unwrap();
        assert_eq!(p.rule_count(), 1);
        let q = Query::parse("a_t", "tool:x", "execute").unwrap();
        assert_eq!(p.check(&q), Decision::Allow { line: 3 });
    }

    #[test]
    fn deny_reasons() {
        let p =
            Policy::from_text(b"allow a_t agent:r create\nallow a_t agent:r create\nallow a_t agent:r start")
                .unwrap();
        let q = Query::parse("a_t", "agent:r", "create").unwrap();
        assert_eq!(p.check(&q), Decision::Allow { line: 1 });
        let q = Query::parse("a_t", "agent:r", "stop").unwrap();
        let Decision::Deny(reason) = p.check(&q) else { panic!() };
        let text = Denial { query: q, reason }.to_string();
        assert!(text.contains("rules grant only create start"), "{text}");
        let bad = Query { subject: "a_t", class: Class::Tool, object: "x", permission: Permission::Use };
        assert_eq!(p.check(&bad), Decision::Deny(DenyReason::InvalidPermission));
    }

    #[test]
    fn query_parse_refuses_invalid() {
        assert!(Query::parse("a_t", "agent:*", "create").is_err());
        assert!(Query::parse("a_t", "tool:x", "use").is_err());
        assert!(Query::parse("a_t", "x", "use").is_err());
        assert!(Query::parse("a b", "tool:x", "execute").is_err());
    }
}
