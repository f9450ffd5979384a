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
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use policy::v0::{Class, Permission, Policy, Query};

use crate::storage::Storage;

/// Which agent (and session) a view serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ViewSpec {
    /// The agent's name.
    pub agent: String,
    /// The session.
    pub session: String,
    /// The run's workspace as its sandbox sees it (`workspace` in `status`), if it has one.
    pub workspace: Option<PathBuf>,
    /// The agent whose session the run resumes (`session_of` in `status`), when it is not
    /// the run's own; that session is the run's own to write.
    pub session_of: Option<String>,
    /// The shared space the run's session is in (`session_space` in `status`):
    /// `shared/<space>/agent/<agent>/session/<s>/` rather than a home's.
    pub space: Option<String>,
    /// The view is read-only (EROFS) but for the run's records: appends to session and object
    /// logs, and the run's own session directory (`ctx records` in `status`).
    pub records_only: bool,
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

/// What a file was when it was read: identity, change time and size; `None` when missing.
type Key = Option<(u64, i64, i64, i64)>;

/// A file read by the authority, and what was made of it.
#[derive(Debug)]
struct Cached<T> {
    key: Key,
    /// The stable [`Epoch`] number under which `key` was last found current, if there was one.
    epoch: Option<u64>,
    value: Option<T>,
}

/// Whether anything the views' authority is read from may have changed: a counter that the
/// daemon bumps when it publishes a control, and that the storage watch makes odd while it
/// takes in events. A number is stable when it is even and no event waits in the watch's queue
/// (the kernel queues an event before the system call that made the change returns). While a
/// number stays stable, what was read under it still holds, and a view decides without looking
/// at its policies' files again. Without a watch, nothing is ever stable.
#[derive(Debug, Default)]
pub struct Epoch {
    seq: AtomicU64,
    watch: OnceLock<OwnedFd>,
    /// Set for good when the watch may have missed a change (a directory it could not watch,
    /// the watch ended): from then on nothing is stable.
    blind: std::sync::atomic::AtomicBool,
}

impl Epoch {
    /// The current number, if it is stable.
    pub fn stable(&self) -> Option<u64> {
        let fd = self.watch.get()?;
        if self.blind.load(Ordering::Acquire) {
            return None;
        }
        let s = self.seq.load(Ordering::Acquire);
        if s % 2 == 1 || rustix::io::ioctl_fionread(fd).map_or(true, |n| n > 0) {
            return None;
        }
        (self.seq.load(Ordering::Acquire) == s).then_some(s)
    }

    /// Something changed: every number taken before is stale.
    pub fn bump(&self) {
        self.seq.fetch_add(2, Ordering::AcqRel);
    }

    /// The watch starts taking in events: no number is stable until [`Epoch::settled`].
    pub(crate) fn unsettled(&self) {
        self.seq.fetch_add(1, Ordering::AcqRel);
    }

    /// The watch may have missed a change: views look at their files on every decision from
    /// now on.
    pub(crate) fn blind(&self) {
        self.blind.store(true, Ordering::Release);
    }

    /// The watch took its events in.
    pub(crate) fn settled(&self) {
        self.seq.fetch_add(1, Ordering::AcqRel);
    }

    /// The watch's inotify descriptor, once every directory is watched: from then on numbers
    /// can be stable. Returns it for the watch to go on with.
    pub(crate) fn watching(&self, fd: OwnedFd) -> Option<&OwnedFd> {
        let _ = self.watch.set(fd);
        self.watch.get()
    }
}

/// Evaluates a view's authority against storage.
#[derive(Debug)]
pub struct Authority {
    spec: ViewSpec,
    epoch: Arc<Epoch>,
    cache: Mutex<HashMap<PathBuf, Cached<Arc<Policy>>>>,
    texts: Mutex<HashMap<PathBuf, Cached<Arc<str>>>>,
    /// Whether the agent object exists, and the stable epoch number it was seen under.
    alive: Mutex<Option<(u64, bool)>>,
}

impl Authority {
    /// The authority of `spec`; `epoch` says when what it read may be stale.
    pub fn new(spec: ViewSpec, epoch: Arc<Epoch>) -> Authority {
        Authority {
            spec,
            epoch,
            cache: Mutex::new(HashMap::new()),
            texts: Mutex::new(HashMap::new()),
            alive: Mutex::new(None),
        }
    }

    /// `rel` as it is now, read (and made into a value by `make`) only when it changed since
    /// it was last read; not even looked at while the epoch stays stable.
    fn current<T: Clone>(
        &self,
        cache: &Mutex<HashMap<PathBuf, Cached<T>>>,
        storage: &Storage,
        rel: &Path,
        epoch: Option<u64>,
        make: impl FnOnce(Option<String>) -> Option<T>,
    ) -> Option<T> {
        let mut cache = cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = cache.get(rel)
            && epoch.is_some()
            && c.epoch == epoch
        {
            return c.value.clone();
        }
        let key: Key =
            storage.stat(rel).ok().map(|st| (st.st_ino, st.st_ctime, st.st_ctime_nsec as i64, st.st_size));
        if let Some(c) = cache.get_mut(rel)
            && c.key == key
        {
            c.epoch = epoch;
            return c.value.clone();
        }
        let value = make(key.and_then(|_| Self::read_small(storage, rel)));
        cache.insert(rel.to_path_buf(), Cached { key, epoch, value: value.clone() });
        value
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
        let epoch = self.epoch.stable();
        let mut seen = self.alive.lock().unwrap_or_else(|p| p.into_inner());
        if let (Some(e), Some((at, alive))) = (epoch, *seen)
            && at == e
        {
            return alive;
        }
        let alive = storage.stat(&Path::new("agent").join(&self.spec.agent)).is_ok();
        *seen = epoch.map(|e| (e, alive));
        alive
    }

    fn read_small(storage: &Storage, rel: &Path) -> Option<String> {
        use std::io::Read;
        let fd = storage.open_rel(rel, rustix::fs::OFlags::RDONLY, 0).ok()?;
        let mut s = String::new();
        std::fs::File::from(fd).take(policy::controls::CONTROL_MAX as u64).read_to_string(&mut s).ok()?;
        Some(s)
    }

    /// A small control's text, cached by identity and change time like the policies.
    fn text(&self, storage: &Storage, rel: &Path, epoch: Option<u64>) -> Option<Arc<str>> {
        self.current(&self.texts, storage, rel, epoch, |t| t.map(Into::into))
    }

    /// The agent's label (policy subject), if it has a valid one.
    pub fn label(&self, storage: &Storage) -> Option<String> {
        self.label_at(storage, self.epoch.stable())
    }

    fn label_at(&self, storage: &Storage, epoch: Option<u64>) -> Option<String> {
        let l = self.text(storage, &self.agent_dir().join("label"), epoch)?;
        let l = l.trim_end_matches('\n').to_owned();
        policy::v0::check_subject(&l).ok().map(|()| l)
    }

    /// The agent's uid (from `uid`), if valid.
    pub fn uid(&self, storage: &Storage) -> Option<u32> {
        self.text(storage, &self.agent_dir().join("uid"), self.epoch.stable())?.trim().parse().ok()
    }

    /// A compiled policy file, cached by identity and change time; `None` when missing or
    /// invalid (which denies everything).
    fn policy(&self, storage: &Storage, rel: &Path, epoch: Option<u64>) -> Option<Arc<Policy>> {
        self.current(&self.cache, storage, rel, epoch, |text| {
            let text = text?;
            let policy = Policy::from_text(text.as_bytes()).ok().map(Arc::new);
            if policy.is_none() {
                tracing::warn!(policy = %rel.display(), "invalid policy: denying everything it would grant");
            }
            policy
        })
    }

    fn agent_allows(&self, storage: &Storage, class: Class, object: &str, permission: Permission) -> bool {
        self.agent_allows_at(storage, self.epoch.stable(), class, object, permission)
    }

    fn agent_allows_at(
        &self,
        storage: &Storage,
        epoch: Option<u64>,
        class: Class,
        object: &str,
        permission: Permission,
    ) -> bool {
        let Some(label) = self.label_at(storage, epoch) else { return false };
        let Some(p) = self.policy(storage, &self.agent_dir().join("policy"), epoch) else { return false };
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
        let epoch = self.epoch.stable();
        if !self.agent_allows_at(storage, epoch, Class::Tool, name, Permission::Execute) {
            return false;
        }
        let Some(label) = self.label_at(storage, epoch) else { return false };
        let own = PathBuf::from("tool").join(format!("{name}.d")).join("policy");
        self.policy(storage, &own, epoch).is_some_and(|p| {
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

    /// Whether the agent may see (`write` false) or change (`write` true) what another
    /// agent, `other`, keeps in their home (`home/<uid>/agent/<other>/`), at a path inside
    /// its session `session` (`None`: outside any one session, e.g. the directory itself or
    /// its `session/` list). An agent's own directory is its own; another's takes a grant:
    /// - `agent:<other> read`: sees all of it; `agent:<other> write`: may change all of it;
    /// - `session:<other>/<s> read` or `resume`: sees that session; `write`: may change it;
    ///   any session grant also shows the way to it (the directory and `session/`, listing
    ///   only what may be seen).
    pub fn other_agent(&self, storage: &Storage, other: &str, session: Option<&str>, write: bool) -> bool {
        if other == self.spec.agent {
            return true;
        }
        if self.spec.session_of.as_deref() == Some(other) && session == Some(self.spec.session.as_str()) {
            return true;
        }
        let epoch = self.epoch.stable();
        let agent = |p| self.agent_allows_at(storage, epoch, Class::Agent, other, p);
        if agent(Permission::Write) || (!write && agent(Permission::Read)) {
            return true;
        }
        match session {
            Some(s) => {
                let object = format!("{other}/{s}");
                let sess = |p| self.agent_allows_at(storage, epoch, Class::Session, &object, p);
                sess(Permission::Write) || (!write && (sess(Permission::Read) || sess(Permission::Resume)))
            }
            None if write => false,
            None => {
                let Some(label) = self.label_at(storage, epoch) else { return false };
                self.policy(storage, &self.agent_dir().join("policy"), epoch)
                    .is_some_and(|p| p.grants_under(&label, Class::Session, &format!("{other}/")))
            }
        }
    }

    /// The uids of the homes that hold another agent this one has a grant on (`agent:<x>
    /// read|write` or a `session:<x>/<s>` grant), with those agents' names: the only other
    /// homes a view shows, and in them only those agents.
    pub fn granted_homes(&self, storage: &Storage) -> Vec<(u32, String)> {
        let epoch = self.epoch.stable();
        let Some(label) = self.label_at(storage, epoch) else { return Vec::new() };
        let Some(p) = self.policy(storage, &self.agent_dir().join("policy"), epoch) else {
            return Vec::new();
        };
        let mut names: Vec<String> = p.objects(&label, Class::Agent);
        names.extend(
            p.objects(&label, Class::Session)
                .into_iter()
                .filter_map(|o| Some(o.split_once('/')?.0.to_owned())),
        );
        names.sort();
        names.dedup();
        names
            .into_iter()
            .filter(|n| n != &self.spec.agent && self.other_agent(storage, n, None, false))
            .filter_map(|n| {
                let uid = PathBuf::from("agent").join(format!("{n}.d")).join("uid");
                let uid = self.text(storage, &uid, epoch)?.trim().parse().ok()?;
                Some((uid, n))
            })
            .collect()
    }

    /// The agent's access to `shared/<name>`.
    pub fn shared(&self, storage: &Storage, name: &str) -> SharedAccess {
        let epoch = self.epoch.stable();
        if self.agent_allows_at(storage, epoch, Class::Shared, name, Permission::Write) {
            SharedAccess::Write
        } else if self.agent_allows_at(storage, epoch, Class::Shared, name, Permission::Read) {
            SharedAccess::Read
        } else {
            SharedAccess::None
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests fail loudly by design

    use super::*;
    use rustix::fs::inotify::{self, CreateFlags, WatchFlags};

    #[test]
    fn an_epoch_is_stable_only_while_nothing_may_have_changed() {
        let dir = tempfile::tempdir().unwrap();
        let e = Epoch::default();
        assert_eq!(e.stable(), None, "without a watch nothing is stable");
        let fd = inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK).unwrap();
        inotify::add_watch(&fd, dir.path(), WatchFlags::CREATE | WatchFlags::CLOSE_WRITE).unwrap();
        let fd = e.watching(fd).unwrap();
        let first = e.stable().unwrap();

        // A change queues an event before the call that made it returns: not stable until the
        // watch has taken it in, and then under another number.
        std::fs::write(dir.path().join("policy"), "x").unwrap();
        assert_eq!(e.stable(), None, "an event is waiting");
        e.unsettled();
        let mut buf = vec![std::mem::MaybeUninit::<u8>::uninit(); 4096];
        let mut r = inotify::Reader::new(fd, &mut buf);
        while r.next().is_ok() {}
        assert_eq!(e.stable(), None, "taken in, not settled");
        e.settled();
        let second = e.stable().unwrap();
        assert_ne!(first, second);

        // A control published through the daemon.
        e.bump();
        assert_ne!(e.stable().unwrap(), second);

        // A watch that may have missed something is never trusted again.
        e.blind();
        assert_eq!(e.stable(), None);
    }
}
