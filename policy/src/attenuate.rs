//! `agent.create` attenuation (spec §5): a child agent may only narrow its parent's world.
//!
//! - the parent holds `agent:<child> create` (grants are per child name, nothing is inherited);
//! - the child name is a valid object name;
//! - every child rule is written for the child's subject and is held by the parent (the same
//!   class, object and permission under the parent's subject);
//! - every child mount lies inside a parent mount, `rw` only where the parent's is `rw`, and keeps
//!   at least the parent's restricting options (rw->ro and visible->hidden, never the reverse);
//! - the child's uid is the parent's, its gid and groups are among the parent's groups.
//!
//! [`check_create`] reports every widening, not just the first.

use std::fmt;

use crate::authority::Ids;
use crate::mount::{Mount, MountMode};
use crate::name;
use crate::path;
use crate::v0::{Class, Permission, Policy, Query, Rule};

/// The parent's authority.
#[derive(Clone, Copy, Debug)]
pub struct Parent<'a> {
    /// The parent's policy subject (label).
    pub subject: &'a str,
    /// The parent's compiled policy.
    pub policy: &'a Policy,
    /// The parent's mount table.
    pub mounts: &'a [Mount],
    /// The parent's identity.
    pub ids: &'a Ids,
}

/// What the child would get.
#[derive(Clone, Copy, Debug)]
pub struct Child<'a> {
    /// The child's name.
    pub name: &'a str,
    /// The child's policy subject (label).
    pub subject: &'a str,
    /// The child's policy rules.
    pub rules: &'a [Rule],
    /// The child's mount table.
    pub mounts: &'a [Mount],
    /// The child's identity.
    pub ids: &'a Ids,
}

/// One way a child would be wider than its parent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Widening {
    /// The child name is invalid.
    InvalidName(String),
    /// The parent lacks `agent:<child> create`.
    NoCreateGrant,
    /// A child rule names another subject than the child's.
    ForeignSubject(Rule),
    /// A child rule the parent does not hold.
    NotHeld(Rule),
    /// A child mount outside every parent mount (hidden -> visible).
    MountNotVisible(Mount),
    /// A child mount `rw` where the parent's is `ro`.
    MountReadWrite(Mount),
    /// A child mount that drops a restricting option of the parent's mount.
    MountOptionsDropped(Mount),
    /// The child's uid differs from the parent's.
    Uid(u32),
    /// A gid or group of the child the parent does not have.
    Group(u32),
}

impl fmt::Display for Widening {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Widening::InvalidName(why) => write!(f, "invalid child name: {why}"),
            Widening::NoCreateGrant => f.write_str("the parent does not hold agent:<child> create"),
            Widening::ForeignSubject(r) => {
                write!(f, "line {}: rule `{r}` is not written for the child's subject", r.line)
            }
            Widening::NotHeld(r) => write!(
                f,
                "line {}: the parent does not hold {}:{} {}",
                r.line, r.class, r.object, r.permission
            ),
            Widening::MountNotVisible(m) => {
                write!(
                    f,
                    "mount {} -> {} is not inside any parent mount (hidden -> visible)",
                    m.source, m.target
                )
            }
            Widening::MountReadWrite(m) => {
                write!(f, "mount {} -> {} is rw but the parent's is ro (ro -> rw)", m.source, m.target)
            }
            Widening::MountOptionsDropped(m) => {
                write!(f, "mount {} -> {} drops options of the parent's mount", m.source, m.target)
            }
            Widening::Uid(uid) => write!(f, "uid {uid} is not the parent's uid"),
            Widening::Group(gid) => write!(f, "group {gid} is not one of the parent's groups"),
        }
    }
}

/// Checks a child against its parent; returns every widening.
pub fn check_create(parent: &Parent<'_>, child: &Child<'_>) -> Result<(), Vec<Widening>> {
    let mut out = Vec::new();
    if let Err(e) = name::validate(child.name) {
        out.push(Widening::InvalidName(e.to_string()));
    } else {
        let q = Query {
            subject: parent.subject,
            class: Class::Agent,
            object: child.name,
            permission: Permission::Create,
        };
        if !parent.policy.allows(&q) {
            out.push(Widening::NoCreateGrant);
        }
    }
    for rule in child.rules {
        if *rule.subject != *child.subject {
            out.push(Widening::ForeignSubject(rule.clone()));
            continue;
        }
        let q = Query {
            subject: parent.subject,
            class: rule.class,
            object: &rule.object,
            permission: rule.permission,
        };
        if !parent.policy.allows(&q) {
            out.push(Widening::NotHeld(rule.clone()));
        }
    }
    for m in child.mounts {
        // Hiding narrows: never a widening.
        if m.mode == MountMode::Hide {
            continue;
        }
        let inside: Vec<&Mount> =
            parent.mounts.iter().filter(|p| path::is_within(&m.source, &p.source)).collect();
        if inside.is_empty() {
            out.push(Widening::MountNotVisible(m.clone()));
        } else if m.mode == MountMode::Rw && !inside.iter().any(|p| p.mode == MountMode::Rw) {
            out.push(Widening::MountReadWrite(m.clone()));
        } else if !inside
            .iter()
            .any(|p| (m.mode == MountMode::Ro || p.mode == MountMode::Rw) && m.options.at_least(p.options))
        {
            out.push(Widening::MountOptionsDropped(m.clone()));
        }
    }
    if child.ids.uid != parent.ids.uid {
        out.push(Widening::Uid(child.ids.uid));
    }
    let parent_has = |g: u32| parent.ids.gid == g || parent.ids.groups.contains(&g);
    for g in std::iter::once(child.ids.gid).chain(child.ids.groups.iter().copied()) {
        if !parent_has(g) && !out.contains(&Widening::Group(g)) {
            out.push(Widening::Group(g));
        }
    }
    if out.is_empty() { Ok(()) } else { Err(out) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mount;
    use crate::v0;

    const PARENT_POLICY: &[u8] = b"allow coder_t tool:agent.create execute
allow coder_t agent:review-1 create
allow coder_t agent:review-1 start
allow coder_t tool:fs.read execute
allow coder_t shared:project-a read
allow coder_t shared:project-a write
";

    struct Fixture {
        policy: Policy,
        mounts: Vec<Mount>,
        ids: Ids,
    }

    fn fixture() -> Fixture {
        Fixture {
            policy: Policy::from_text(PARENT_POLICY).unwrap(),
            mounts: mount::parse(b"/work\t/work\trw\t-\n/data\t/data\tro\tnoexec\n").unwrap(),
            ids: Ids { uid: 1000, gid: 1000, groups: vec![50, 60] },
        }
    }

    fn parent(f: &Fixture) -> Parent<'_> {
        Parent { subject: "coder_t", policy: &f.policy, mounts: &f.mounts, ids: &f.ids }
    }

    fn check(f: &Fixture, name: &str, rules: &str, mounts: &str, ids: Ids) -> Result<(), Vec<Widening>> {
        let rules = v0::parse(rules.as_bytes()).unwrap();
        let mounts = mount::parse(mounts.as_bytes()).unwrap();
        let child = Child { name, subject: "review-1_t", rules: &rules, mounts: &mounts, ids: &ids };
        check_create(&parent(f), &child)
    }

    fn same_ids() -> Ids {
        Ids { uid: 1000, gid: 1000, groups: vec![50] }
    }

    #[test]
    fn narrower_child_allowed() {
        let f = fixture();
        let r = check(
            &f,
            "review-1",
            "allow review-1_t tool:fs.read execute\nallow review-1_t shared:project-a read\n",
            "/work/src\t/work\tro\t-\n/data\t/data\tro\tnoexec,nodev\n",
            same_ids(),
        );
        assert_eq!(r, Ok(()));
    }

    #[test]
    fn rw_to_ro_allowed_and_ro_to_rw_refused() {
        let f = fixture();
        assert_eq!(check(&f, "review-1", "", "/work\t/w\tro\t-\n", same_ids()), Ok(()));
        assert_eq!(check(&f, "review-1", "", "/work\t/w\trw\t-\n", same_ids()), Ok(()));
        let e = check(&f, "review-1", "", "/data\t/data\trw\tnoexec\n", same_ids()).unwrap_err();
        assert!(matches!(e[..], [Widening::MountReadWrite(_)]), "{e:?}");
    }

    #[test]
    fn hidden_to_visible_refused() {
        let f = fixture();
        let e = check(&f, "review-1", "", "/etc\t/etc\tro\t-\n", same_ids()).unwrap_err();
        assert!(matches!(e[..], [Widening::MountNotVisible(_)]), "{e:?}");
        let e = check(&f, "review-1", "", "/workshop\t/w\tro\t-\n", same_ids()).unwrap_err();
        assert!(matches!(e[..], [Widening::MountNotVisible(_)]), "{e:?}");
    }

    #[test]
    fn dropping_noexec_refused() {
        let f = fixture();
        let e = check(&f, "review-1", "", "/data\t/data\tro\t-\n", same_ids()).unwrap_err();
        assert!(matches!(e[..], [Widening::MountOptionsDropped(_)]), "{e:?}");
    }

    #[test]
    fn permission_the_parent_lacks_refused() {
        let f = fixture();
        let e = check(
            &f,
            "review-1",
            "allow review-1_t tool:shell.exec execute\nallow review-1_t tool:fs.read execute\nallow review-1_t network:default connect\n",
            "",
            same_ids(),
        )
        .unwrap_err();
        let lines: Vec<u32> = e
            .iter()
            .map(|w| match w {
                Widening::NotHeld(r) => r.line,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(lines, vec![1, 3]);
        assert!(e[0].to_string().contains("tool:shell.exec execute"));
    }

    #[test]
    fn grants_are_per_child_name() {
        let f = fixture();
        let e = check(&f, "review-2", "", "", same_ids()).unwrap_err();
        assert_eq!(e, vec![Widening::NoCreateGrant]);
        let e = check(&f, "../evil", "", "", same_ids()).unwrap_err();
        assert!(matches!(e[..], [Widening::InvalidName(_)]));
    }

    #[test]
    fn rules_must_use_the_childs_subject() {
        let f = fixture();
        let e = check(&f, "review-1", "allow coder_t tool:fs.read execute\n", "", same_ids()).unwrap_err();
        assert!(matches!(e[..], [Widening::ForeignSubject(_)]));
    }

    #[test]
    fn identity_narrows() {
        let f = fixture();
        let e = check(&f, "review-1", "", "", Ids { uid: 0, gid: 0, groups: vec![50, 70] }).unwrap_err();
        assert_eq!(e, vec![Widening::Uid(0), Widening::Group(0), Widening::Group(70)]);
        assert_eq!(check(&f, "review-1", "", "", Ids { uid: 1000, gid: 60, groups: vec![] }), Ok(()));
    }
}
