//! The authority intersection (spec §4): every access is checked by six layers in a fixed order,
//! and the first refusal refuses.
//!
//! 1. credentials: the peer's identity is known and is the identity the view is bound to;
//! 2. mode bits: POSIX owner/group/other permission bits against uid, gid and groups;
//! 3. mount visibility: the object lies in a visible mount that permits the access;
//! 4. agent label: the subject has a label, and the object (if it restricts labels) accepts it;
//! 5. object policy: the agent's policy grants the permission on the object;
//! 6. tool/model policy: the object's own `.d/policy` grants it too.
//!
//! [`intersect`] is a pure function over plain facts gathered by the caller; it performs no I/O.

use std::fmt;

use crate::errno::Errno;
use crate::v0::{Decision, Denial, Policy, Query};

/// A numeric Linux identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ids {
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
}

impl Ids {
    fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }
}

/// The access asked for, as `rwx` bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access {
    /// Read.
    pub read: bool,
    /// Write.
    pub write: bool,
    /// Execute (or search, for directories).
    pub exec: bool,
}

impl Access {
    /// Read only.
    pub const READ: Access = Access { read: true, write: false, exec: false };
    /// Write only.
    pub const WRITE: Access = Access { read: false, write: true, exec: false };
    /// Execute only.
    pub const EXEC: Access = Access { read: false, write: false, exec: true };

    fn bits(self) -> u32 {
        (u32::from(self.read) << 2) | (u32::from(self.write) << 1) | u32::from(self.exec)
    }
}

/// The file facts the mode-bit layer needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileFacts {
    /// Owner uid.
    pub uid: u32,
    /// Owner gid.
    pub gid: u32,
    /// Permission bits (`st_mode & 0o7777`).
    pub mode: u32,
}

/// What the mount table says about the object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MountFacts {
    /// The object is not under any mount visible to the subject.
    Hidden,
    /// Visible through a mount.
    Visible {
        /// The mount is read-only.
        read_only: bool,
        /// The mount is `noexec`.
        noexec: bool,
    },
}

/// What the label layer needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LabelFacts<'a> {
    /// The subject's label (its policy subject type); `None` when the agent has none.
    pub subject: Option<&'a str>,
    /// Labels the object admits; `None` when the object does not restrict labels.
    pub admits: Option<&'a [&'a str]>,
}

/// The object's own policy (`tool/<n>.d/policy`, `model/<n>.d/policy`).
#[derive(Clone, Copy, Debug)]
pub enum ObjectPolicy<'a> {
    /// The object kind has no own policy layer (shared spaces, sessions, mounts...).
    NotApplicable,
    /// The object should have a policy but it is missing or invalid: deny.
    Missing,
    /// The compiled policy.
    Present(&'a Policy),
}

/// Every fact the intersection looks at.
#[derive(Clone, Debug)]
pub struct Request<'a> {
    /// The peer's credentials as the kernel reported them; `None` when unknown.
    pub peer: Option<&'a Ids>,
    /// The identity the connection (view) is bound to; `None` for the host view, where the
    /// request's own credentials decide.
    pub bound: Option<&'a Ids>,
    /// The file's owner and mode.
    pub file: FileFacts,
    /// The access wanted.
    pub access: Access,
    /// Mount visibility.
    pub mount: MountFacts,
    /// Label facts; `None` skips the layer (host requests, which carry no agent label).
    pub label: Option<LabelFacts<'a>>,
    /// The agent's policy and the query asked of it; `None` skips the layer (host requests).
    pub agent_policy: Option<(&'a Policy, Query<'a>)>,
    /// The object's own policy.
    pub object_policy: ObjectPolicy<'a>,
}

/// The layers, in check order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Layer {
    /// Peer credentials.
    Credentials,
    /// Mode bits.
    ModeBits,
    /// Mount visibility.
    Mount,
    /// Agent label.
    Label,
    /// The agent's policy.
    ObjectPolicy,
    /// The tool's or model's own policy.
    ToolPolicy,
}

impl Layer {
    /// The layer's name as printed.
    pub fn as_str(self) -> &'static str {
        match self {
            Layer::Credentials => "credentials",
            Layer::ModeBits => "mode bits",
            Layer::Mount => "mount",
            Layer::Label => "label",
            Layer::ObjectPolicy => "agent policy",
            Layer::ToolPolicy => "object policy",
        }
    }
}

/// The first refusal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// Which layer refused.
    pub layer: Layer,
    /// The errno to return.
    pub errno: Errno,
    /// Why, for people and logs.
    pub reason: String,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} ({})", self.layer.as_str(), self.reason, self.errno)
    }
}

fn refuse(layer: Layer, errno: Errno, reason: String) -> Result<(), Refusal> {
    Err(Refusal { layer, errno, reason })
}

/// POSIX permission check: root may read and write anything and execute anything with at least
/// one x bit; everyone else gets exactly one class of bits (owner, else group, else other).
pub fn mode_allows(ids: &Ids, file: FileFacts, access: Access) -> bool {
    let want = access.bits();
    if ids.uid == 0 {
        return !access.exec || file.mode & 0o111 != 0;
    }
    let have = if ids.uid == file.uid {
        (file.mode >> 6) & 7
    } else if ids.in_group(file.gid) {
        (file.mode >> 3) & 7
    } else {
        file.mode & 7
    };
    have & want == want
}

/// Runs the six layers in order and returns the first refusal.
pub fn intersect(r: &Request<'_>) -> Result<(), Refusal> {
    // 1. Credentials.
    let Some(peer) = r.peer else {
        return refuse(Layer::Credentials, Errno::Eacces, "peer credentials unknown".into());
    };
    if let Some(bound) = r.bound
        && (peer.uid != bound.uid || peer.gid != bound.gid)
    {
        return refuse(
            Layer::Credentials,
            Errno::Eacces,
            format!(
                "peer {}:{} is not the identity {}:{} this view is bound to",
                peer.uid, peer.gid, bound.uid, bound.gid
            ),
        );
    }
    // 2. Mode bits.
    if !mode_allows(peer, r.file, r.access) {
        return refuse(
            Layer::ModeBits,
            Errno::Eacces,
            format!(
                "mode {:04o} owner {}:{} does not give uid {} {}",
                r.file.mode & 0o7777,
                r.file.uid,
                r.file.gid,
                peer.uid,
                access_word(r.access)
            ),
        );
    }
    // 3. Mount visibility.
    match r.mount {
        MountFacts::Hidden => {
            return refuse(Layer::Mount, Errno::Enoent, "not under any visible mount".into());
        }
        MountFacts::Visible { read_only: true, .. } if r.access.write => {
            return refuse(Layer::Mount, Errno::Erofs, "the mount is read-only".into());
        }
        MountFacts::Visible { noexec: true, .. } if r.access.exec => {
            return refuse(Layer::Mount, Errno::Eacces, "the mount is noexec".into());
        }
        MountFacts::Visible { .. } => {}
    }
    // 4. Label.
    if let Some(label) = r.label {
        let Some(subject) = label.subject else {
            return refuse(Layer::Label, Errno::Eacces, "the agent has no label".into());
        };
        if let Some(admits) = label.admits
            && !admits.contains(&subject)
        {
            return refuse(Layer::Label, Errno::Eacces, format!("the object does not admit label {subject}"));
        }
    }
    // 5. The agent's policy for the object.
    if let Some((policy, query)) = r.agent_policy
        && let Decision::Deny(reason) = policy.check(&query)
    {
        return refuse(Layer::ObjectPolicy, Errno::Eacces, Denial { query, reason }.to_string());
    }
    // 6. The tool's or model's own policy, asked the same question.
    match r.object_policy {
        ObjectPolicy::NotApplicable => Ok(()),
        ObjectPolicy::Missing => {
            refuse(Layer::ToolPolicy, Errno::Eacces, "the object has no valid policy".into())
        }
        ObjectPolicy::Present(policy) => {
            let Some((_, query)) = r.agent_policy else {
                return Ok(());
            };
            match policy.check(&query) {
                Decision::Allow { .. } => Ok(()),
                Decision::Deny(reason) => {
                    refuse(Layer::ToolPolicy, Errno::Eacces, Denial { query, reason }.to_string())
                }
            }
        }
    }
}

fn access_word(a: Access) -> String {
    let mut s = String::new();
    for (on, c) in [(a.read, 'r'), (a.write, 'w'), (a.exec, 'x')] {
        if on {
            s.push(c);
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(uid: u32, gid: u32, groups: &[u32]) -> Ids {
        Ids { uid, gid, groups: groups.to_vec() }
    }

    struct World {
        agent: Ids,
        other: Ids,
        allow_all: Policy,
        deny_all: Policy,
    }

    fn world() -> World {
        World {
            agent: ids(1000, 1000, &[50]),
            other: ids(1001, 1001, &[]),
            allow_all: Policy::from_text(b"allow coder_t tool:fs.read execute").unwrap(),
            deny_all: Policy::from_text(b"allow someone_else_t tool:fs.read execute").unwrap(),
        }
    }

    fn query() -> Query<'static> {
        Query::parse("coder_t", "tool:fs.read", "execute").unwrap()
    }

    /// A request every layer allows.
    fn allowed(w: &World) -> Request<'_> {
        Request {
            peer: Some(&w.agent),
            bound: Some(&w.agent),
            file: FileFacts { uid: 0, gid: 0, mode: 0o755 },
            access: Access::EXEC,
            mount: MountFacts::Visible { read_only: false, noexec: false },
            label: Some(LabelFacts { subject: Some("coder_t"), admits: None }),
            agent_policy: Some((&w.allow_all, query())),
            object_policy: ObjectPolicy::Present(&w.allow_all),
        }
    }

    #[test]
    fn all_layers_allow() {
        let w = world();
        assert_eq!(intersect(&allowed(&w)), Ok(()));
    }

    #[test]
    fn each_layer_refuses_alone() {
        let w = world();
        let admits: &[&str] = &["reviewer_t"];
        let cases: Vec<(Layer, Errno, Request<'_>)> = vec![
            (Layer::Credentials, Errno::Eacces, Request { peer: None, ..allowed(&w) }),
            (Layer::Credentials, Errno::Eacces, Request { peer: Some(&w.other), ..allowed(&w) }),
            (
                Layer::ModeBits,
                Errno::Eacces,
                Request { file: FileFacts { uid: 0, gid: 0, mode: 0o750 }, ..allowed(&w) },
            ),
            (Layer::Mount, Errno::Enoent, Request { mount: MountFacts::Hidden, ..allowed(&w) }),
            (
                Layer::Mount,
                Errno::Eacces,
                Request { mount: MountFacts::Visible { read_only: false, noexec: true }, ..allowed(&w) },
            ),
            (
                Layer::Label,
                Errno::Eacces,
                Request { label: Some(LabelFacts { subject: None, admits: None }), ..allowed(&w) },
            ),
            (
                Layer::Label,
                Errno::Eacces,
                Request {
                    label: Some(LabelFacts { subject: Some("coder_t"), admits: Some(admits) }),
                    ..allowed(&w)
                },
            ),
            (
                Layer::ObjectPolicy,
                Errno::Eacces,
                Request { agent_policy: Some((&w.deny_all, query())), ..allowed(&w) },
            ),
            (
                Layer::ToolPolicy,
                Errno::Eacces,
                Request { object_policy: ObjectPolicy::Present(&w.deny_all), ..allowed(&w) },
            ),
            (
                Layer::ToolPolicy,
                Errno::Eacces,
                Request { object_policy: ObjectPolicy::Missing, ..allowed(&w) },
            ),
        ];
        for (layer, errno, req) in cases {
            let r = intersect(&req).unwrap_err();
            assert_eq!((r.layer, r.errno), (layer, errno), "{r}");
        }
    }

    #[test]
    fn first_refusal_wins() {
        let w = world();
        // Every layer refuses: credentials is reported.
        let req = Request {
            peer: Some(&w.other),
            file: FileFacts { uid: 0, gid: 0, mode: 0 },
            mount: MountFacts::Hidden,
            label: Some(LabelFacts { subject: None, admits: None }),
            agent_policy: Some((&w.deny_all, query())),
            object_policy: ObjectPolicy::Missing,
            ..allowed(&w)
        };
        assert_eq!(intersect(&req).unwrap_err().layer, Layer::Credentials);
        // Peel layers off one by one: each next layer is reported.
        let req = Request { peer: Some(&w.agent), ..req };
        assert_eq!(intersect(&req).unwrap_err().layer, Layer::ModeBits);
        let req = Request { file: FileFacts { uid: 0, gid: 0, mode: 0o755 }, ..req };
        assert_eq!(intersect(&req).unwrap_err().layer, Layer::Mount);
        let req = Request { mount: MountFacts::Visible { read_only: true, noexec: false }, ..req };
        assert_eq!(intersect(&req).unwrap_err().layer, Layer::Label);
        let req = Request { label: None, ..req };
        assert_eq!(intersect(&req).unwrap_err().layer, Layer::ObjectPolicy);
        let req = Request { agent_policy: Some((&w.allow_all, query())), ..req };
        assert_eq!(intersect(&req).unwrap_err().layer, Layer::ToolPolicy);
    }

    #[test]
    fn read_only_mount_refuses_writes_with_erofs() {
        let w = world();
        let req = Request {
            access: Access::WRITE,
            file: FileFacts { uid: 1000, gid: 1000, mode: 0o644 },
            mount: MountFacts::Visible { read_only: true, noexec: false },
            ..allowed(&w)
        };
        assert_eq!(intersect(&req).unwrap_err().errno, Errno::Erofs);
    }

    #[test]
    fn mode_bits() {
        let f = |uid, gid, mode| FileFacts { uid, gid, mode };
        let user = ids(1000, 100, &[50]);
        assert!(mode_allows(&user, f(1000, 0, 0o600), Access::READ));
        assert!(!mode_allows(&user, f(1000, 0, 0o077), Access::READ), "owner class only");
        assert!(mode_allows(&user, f(0, 50, 0o040), Access::READ), "supplementary group");
        assert!(mode_allows(&user, f(0, 100, 0o020), Access::WRITE), "primary group");
        assert!(mode_allows(&user, f(0, 0, 0o001), Access::EXEC));
        assert!(!mode_allows(&user, f(0, 0, 0o006), Access::EXEC));
        let root = ids(0, 0, &[]);
        assert!(mode_allows(&root, f(5, 5, 0), Access::READ));
        assert!(mode_allows(&root, f(5, 5, 0), Access::WRITE));
        assert!(!mode_allows(&root, f(5, 5, 0o644), Access::EXEC));
        assert!(mode_allows(&root, f(5, 5, 0o100), Access::EXEC));
    }

    #[test]
    fn host_requests_skip_agent_layers() {
        let w = world();
        let req = Request {
            bound: None,
            label: None,
            agent_policy: None,
            object_policy: ObjectPolicy::Present(&w.deny_all),
            ..allowed(&w)
        };
        assert_eq!(intersect(&req), Ok(()));
    }
}
