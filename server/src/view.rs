//! Agent views: what one agent's `/ctx` shows.
//!
//! A view is bound to its connection (its own FUSE mount), never to a claimed uid or pid. It is
//! computed from the agent object in storage each time it is asked, so a change to the agent's
//! `policy`, its label, or a tool's own `.d/policy` takes effect in a live view without
//! remounting; compiled policies are cached by the identity and change time of their file.
//!
//! In a view:
//! - `tool/<n>` exists iff `allow <label> tool:<n> execute` is in the agent's policy and in the
//!   tool's own policy (spec §3: only tools that pass the check are listed); `tool/<n>.d/` exists
//!   iff the agent's policy grants it, so a refusal by the tool's own policy can be explained;
//! - `model/<n>` iff the agent holds `model:<n> use` (and the model's own policy, when it has
//!   one, agrees); `agent/<n>` for the agent itself and agents it holds `agent:<n> read` on;
//! - `home/` shows only `home/<uid>/` of the agent's uid;
//! - `shared/<n>` exists with `shared:<n> read`; writing needs `shared:<n> write` (EACCES);
//! - when the agent object is gone, the view is empty and refuses.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use policy::v0::{Class, Permission, Policy, Query};

use crate::storage::Storage;

/// Which agent (and session) a view serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ViewSpec {
    /// The agent's name.
    pub agent: String,
    /// The session.
    pub session: String,
}

/// Access to a shared space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SharedAccess {
    /// Invisible.
    None,
    /// Visible, read-only.
    Read,
    /// Visible and writable.
    Write,
}

#[derive(Debug)]
struct Cached {
    key: (u64, i64, i64, i64),
    policy: Option<std::sync::Arc<Policy>>,
}

/// Evaluates a view's authority against storage.
#[derive(Debug)]
pub struct Authority {
    spec: ViewSpec,
    cache: Mutex<HashMap<PathBuf, Cached>>,
    texts: Mutex<HashMap<PathBuf, TextEntry>>,
}

/// A cached small control: its stat key and its text.
type TextEntry = ((u64, i64, i64, i64), Option<std::sync::Arc<str>>);

impl Authority {
    /// The authority of `spec`.
    pub fn new(spec: ViewSpec) -> Authority {
        Authority { spec, cache: Mutex::new(HashMap::new()), texts: Mutex::new(HashMap::new()) }
    }

    /// The view's spec.
    pub fn spec(&self) -> &ViewSpec {
        &self.spec
    }

    fn agent_dir(&self) -> PathBuf {
        PathBuf::from("agent").join(format!("{}.d", self.spec.agent))
    }

    /// True while the agent object exists.
    pub fn alive(&self, storage: &Storage) -> bool {
        storage.stat(&Path::new("agent").join(&self.spec.agent)).is_ok()
    }

    fn read_small(storage: &Storage, rel: &Path) -> Option<String> {
        use std::io::Read;
        let fd = storage.open_rel(rel, rustix::fs::OFlags::RDONLY, 0).ok()?;
        let mut s = String::new();
        std::fs::File::from(fd).take(policy::controls::CONTROL_MAX as u64).read_to_string(&mut s).ok()?;
        Some(s)
    }

    /// A small control's text, cached by identity and change time like the policies.
    fn text(&self, storage: &Storage, rel: &Path) -> Option<std::sync::Arc<str>> {
        let st = storage.stat(rel).ok()?;
        let key = (st.st_ino, st.st_ctime, st.st_ctime_nsec as i64, st.st_size);
        let mut cache = self.texts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((k, t)) = cache.get(rel)
            && *k == key
        {
            return t.clone();
        }
        let t: Option<std::sync::Arc<str>> = Self::read_small(storage, rel).map(Into::into);
        cache.insert(rel.to_path_buf(), (key, t.clone()));
        t
    }

    /// The agent's label (policy subject), if it has a valid one.
    pub fn label(&self, storage: &Storage) -> Option<String> {
        let l = self.text(storage, &self.agent_dir().join("label"))?;
        let l = l.trim_end_matches('\n').to_owned();
        policy::v0::check_subject(&l).ok().map(|()| l)
    }

    /// The agent's uid (from `uid`), if valid.
    pub fn uid(&self, storage: &Storage) -> Option<u32> {
        self.text(storage, &self.agent_dir().join("uid"))?.trim().parse().ok()
    }

    /// A compiled policy file, cached by identity and change time; `None` when missing or
    /// invalid (which denies everything).
    fn policy(&self, storage: &Storage, rel: &Path) -> Option<std::sync::Arc<Policy>> {
        let st = storage.stat(rel).ok()?;
        let key = (st.st_ino, st.st_ctime, st.st_ctime_nsec as i64, st.st_size);
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = cache.get(rel)
            && c.key == key
        {
            return c.policy.clone();
        }
        let text = Self::read_small(storage, rel)?;
        let policy = Policy::from_text(text.as_bytes()).ok().map(std::sync::Arc::new);
        if policy.is_none() {
            tracing::warn!(policy = %rel.display(), "invalid policy: denying everything it would grant");
        }
        cache.insert(rel.to_path_buf(), Cached { key, policy: policy.clone() });
        policy
    }

    fn agent_allows(&self, storage: &Storage, class: Class, object: &str, permission: Permission) -> bool {
        let Some(label) = self.label(storage) else { return false };
        let Some(p) = self.policy(storage, &self.agent_dir().join("policy")) else { return false };
        p.allows(&Query { subject: &label, class, object, permission })
    }

    /// Whether the agent's own policy grants `tool:<name> execute`. Such a tool's controls
    /// (`tool/<name>.d/`) are visible even when the tool's own policy refuses, so that tsh can
    /// say which side refused; the executable needs both ([`Authority::tool`]).
    pub fn tool_granted(&self, storage: &Storage, name: &str) -> bool {
        self.agent_allows(storage, Class::Tool, name, Permission::Execute)
    }

    /// Whether the agent may execute (and so see) `tool/<name>`: both policies must allow it.
    pub fn tool(&self, storage: &Storage, name: &str) -> bool {
        if !self.agent_allows(storage, Class::Tool, name, Permission::Execute) {
            return false;
        }
        let Some(label) = self.label(storage) else { return false };
        let own = PathBuf::from("tool").join(format!("{name}.d")).join("policy");
        self.policy(storage, &own).is_some_and(|p| {
            p.allows(&Query {
                subject: &label,
                class: Class::Tool,
                object: name,
                permission: Permission::Execute,
            })
        })
    }

    /// Whether the agent may use (and so see) the model at `model/<path>`.
    pub fn model(&self, storage: &Storage, name: &str) -> bool {
        self.agent_allows(storage, Class::Model, name, Permission::Use)
    }

    /// Whether the agent sees `agent/<name>`.
    pub fn agent(&self, storage: &Storage, name: &str) -> bool {
        name == self.spec.agent || self.agent_allows(storage, Class::Agent, name, Permission::Read)
    }

    /// The agent's access to `shared/<name>`.
    pub fn shared(&self, storage: &Storage, name: &str) -> SharedAccess {
        if self.agent_allows(storage, Class::Shared, name, Permission::Write) {
            SharedAccess::Write
        } else if self.agent_allows(storage, Class::Shared, name, Permission::Read) {
            SharedAccess::Read
        } else {
            SharedAccess::None
        }
    }
}
