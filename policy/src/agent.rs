//! Agent objects as they are generated: the controls of a new agent, its default label, and the
//! check that a child (`agent.create`, `ctx agent new --parent`) only narrows its parent. `ctx
//! agent new` and the receipt server's `agent.create` both build an agent with these functions,
//! so an agent made either way is the same object.
//!
//! Defaults, chosen so that an agent holds nothing it was not given:
//! - `label` is the name with `.`, `-` and `+` turned into `_`, plus `_t` (`my-bot` -> `my_bot_t`);
//! - `policy` grants exactly what the spec asks: `tool:T execute` per tool, `model:M use` per
//!   model, `shared:N read` (and `write`) per shared space, and `mount:TARGET read` (and `write`
//!   for `rw`) per mount, so each mount in the table is also authorized;
//! - a mount whose mode names no options is `nosuid,nodev`;
//! - `cwd` is `/workspace`; `path` is `/ctx/tool:/ctx/home/<uid>/tool`; `life` `owned`; `iso`
//!   `bwrap`; `abi` `1`; `approval` `never`; `env` empty; `model` the first model (or empty).

use std::collections::{BTreeMap, BTreeSet};

use crate::attenuate::{self, Widening};
use crate::authority::Ids;
use crate::controls::{self, ObjectClass, Owner};
use crate::mount::{Mount, MountMode, MountOptions};
use crate::v0::{self, Class, Policy};

/// The uid and gid of `nobody`.
pub const NOBODY: u32 = 65534;
/// The options of a mount whose mode names none.
pub const DEFAULT_MOUNT_OPTIONS: MountOptions = MountOptions { nosuid: true, nodev: true, noexec: false };

/// What a new agent is made of.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Spec {
    /// Its name.
    pub name: String,
    /// Its policy subject; [`default_label`] when none.
    pub label: Option<String>,
    /// Models it may use; the first is its model.
    pub models: Vec<String>,
    /// Tools it may execute.
    pub tools: Vec<String>,
    /// Shared spaces it may read (and write, when `true`).
    pub shared: Vec<(String, bool)>,
    /// Its mount table.
    pub mounts: Vec<Mount>,
    /// Its uid ([`NOBODY`] when none; the agent store gives an agent of its own one first).
    pub uid: Option<u32>,
    /// Its primary gid (like the uid when none).
    pub gid: Option<u32>,
    /// Its supplementary groups.
    pub groups: Vec<u32>,
    /// The agent that created it, for a child.
    pub parent: Option<String>,
    /// The uid of whoever made it.
    pub owner: u32,
}

impl Spec {
    /// The uid its controls name.
    pub fn uid(&self) -> u32 {
        self.uid.unwrap_or(NOBODY)
    }

    /// The gid its controls name.
    pub fn gid(&self) -> u32 {
        self.gid.or(self.uid).unwrap_or(NOBODY)
    }
}

/// The label an agent gets when none is named.
pub fn default_label(name: &str) -> String {
    let base: String = name.chars().map(|c| if matches!(c, '.' | '-' | '+') { '_' } else { c }).collect();
    format!("{base}_t")
}

/// The agent's label: the one named, checked, or the default.
pub fn label_of(spec: &Spec) -> Result<String, String> {
    match &spec.label {
        Some(l) => v0::check_subject(l).map(|()| l.clone()),
        None => {
            let l = default_label(&spec.name);
            v0::check_subject(&l).map_err(|e| format!("default label: {e}; name one with --label"))?;
            Ok(l)
        }
    }
}

/// Checks a model name as a policy object.
pub fn check_model(s: &str) -> Result<(), String> {
    Class::Model.check_object(s)
}

/// Parses a shared-space grant `NAME:read` or `NAME:write`: (name, write).
pub fn parse_shared(s: &str) -> Result<(String, bool), String> {
    let (name, access) = s.rsplit_once(':').ok_or_else(|| format!("{s:?} is not NAME:read or NAME:write"))?;
    crate::name::validate(name).map_err(|e| format!("shared space {name:?}: {e}"))?;
    let write = match access {
        "read" => false,
        "write" => true,
        _ => return Err(format!("access {access:?} is not read or write")),
    };
    Ok((name.to_owned(), write))
}

/// Parses one mount `SOURCE TARGET MODE`, MODE being `ro` or `rw`, optionally with options
/// (`rw,noexec`, `ro,-` for none; default nosuid,nodev).
pub fn parse_mount(source: &str, target: &str, mode: &str) -> Result<Mount, String> {
    crate::path::check_absolute(source).map_err(|e| format!("source: {e}"))?;
    crate::mount::check_target(target)?;
    if target.contains(char::is_whitespace) {
        return Err(format!("target {target:?} contains whitespace, which a policy line cannot name"));
    }
    let (mode, options) = match mode.split_once(',') {
        Some((m, o)) => (m, MountOptions::parse(o)?),
        None => (mode, DEFAULT_MOUNT_OPTIONS),
    };
    let mode = MountMode::parse(mode).ok_or_else(|| format!("mode {mode:?} is not ro or rw"))?;
    let m = Mount { source: source.to_owned(), target: target.to_owned(), mode, options };
    crate::mount::parse_line(&m.to_string())
}

/// The policy lines that grant exactly what `spec` asks, for `label`.
pub fn grants(spec: &Spec, label: &str) -> Vec<String> {
    let mut policy = Vec::new();
    let mut seen = BTreeSet::new();
    let mut grant = |line: String| {
        if seen.insert(line.clone()) {
            policy.push(line);
        }
    };
    for t in &spec.tools {
        grant(format!("allow {label} tool:{t} execute"));
    }
    for m in &spec.models {
        grant(format!("allow {label} model:{m} use"));
    }
    for (s, write) in &spec.shared {
        grant(format!("allow {label} shared:{s} read"));
        if *write {
            grant(format!("allow {label} shared:{s} write"));
        }
    }
    for m in spec.mounts.iter().filter(|m| m.mode != MountMode::Hide) {
        grant(format!("allow {label} mount:{} read", m.target));
        if m.mode == MountMode::Rw {
            grant(format!("allow {label} mount:{} write", m.target));
        }
    }
    policy
}

/// Every control of the new agent, by name.
pub fn controls(spec: &Spec, label: &str) -> BTreeMap<String, Vec<u8>> {
    let lines =
        |v: &[String]| -> Vec<u8> { v.iter().map(|l| format!("{l}\n")).collect::<String>().into_bytes() };
    let mount_lines: Vec<String> = spec.mounts.iter().map(ToString::to_string).collect();
    let groups: Vec<String> = spec.groups.iter().map(u32::to_string).collect();
    let groups = if groups.is_empty() { String::new() } else { format!("{}\n", groups.join(" ")) };
    let model = spec.models.first().map(|m| format!("{m}\n")).unwrap_or_default();
    let meta = serde_json::json!({"label": label, "created_by": "ctx agent new"});
    let name = &spec.name;
    let mut c: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut put = |k: &str, v: String| {
        c.insert(k.to_owned(), v.into_bytes());
    };
    put("label", format!("{label}\n"));
    put("uid", format!("{}\n", spec.uid()));
    put("gid", format!("{}\n", spec.gid()));
    if let Some(p) = &spec.parent {
        put("parent", format!("{p}\n"));
    }
    put("groups", groups);
    put("owner", format!("{}\n", spec.owner));
    put("model", model);
    put("cwd", "/workspace\n".into());
    put("path", format!("/ctx/tool:/ctx/home/{}/tool\n", spec.uid()));
    put("env", String::new());
    put("life", "owned\n".into());
    put("iso", "bwrap\n".into());
    put("abi", "1\n".into());
    put("approval", "never\n".into());
    put("meta.json", format!("{meta}\n"));
    put(
        "system.md",
        format!(
            "You are {name}, an agent on a CortexFS host. Your tools are the executables on \
             CTX_PATH; run them through tsh. Your working directory is /workspace.\n"
        ),
    );
    put("prompt.template.md", "{{message}}\n".into());
    c.insert("policy".into(), lines(&grants(spec, label)));
    c.insert("mount".into(), lines(&mount_lines));
    c
}

/// Checks every generated control against its format; the error names the first bad one.
pub fn validate(name: &str, controls: &BTreeMap<String, Vec<u8>>) -> Result<(), String> {
    for (control, bytes) in controls {
        match controls::classify(ObjectClass::Agent, control) {
            Some(Owner::Host | Owner::SelfUpdatable) => {}
            _ => return Err(format!("agents have no control {control:?}")),
        }
        controls::validate(ObjectClass::Agent, name, control, bytes)
            .map_err(|e| format!("agent/{name}: control {control}: {e}"))?;
    }
    Ok(())
}

/// The agent executable: a launcher for `ctx agent start NAME`.
pub fn executable(name: &str) -> String {
    format!("#!/bin/sh\nexec /ctx/bin/ctx agent start {name} \"$@\"\n")
}

/// An installed agent's authority, as a child is checked against it.
#[derive(Debug)]
pub struct Authority {
    /// Its label.
    pub label: String,
    /// Its policy.
    pub policy: Policy,
    /// Its mount table.
    pub mounts: Vec<Mount>,
    /// Its identity.
    pub ids: Ids,
}

impl Authority {
    /// Reads an agent's authority from its controls' contents (`control` returns one, empty
    /// when missing); the error names the control that is wrong.
    pub fn from_controls(name: &str, control: impl Fn(&str) -> String) -> Result<Authority, String> {
        let num = |c: &str| {
            control(c).trim().parse::<u32>().map_err(|_| format!("agent/{name}.d/{c} is not a number"))
        };
        let policy = Policy::from_text(control("policy").as_bytes())
            .map_err(|_| format!("agent/{name}.d/policy does not parse"))?;
        let mounts = crate::mount::parse(control("mount").as_bytes())
            .map_err(|_| format!("agent/{name}.d/mount does not parse"))?;
        let groups = control("groups").split_whitespace().filter_map(|g| g.parse().ok()).collect();
        Ok(Authority {
            label: control("label").trim().to_owned(),
            policy,
            mounts,
            ids: Ids { uid: num("uid")?, gid: num("gid")?, groups },
        })
    }
}

/// Checks that the child `spec` (with `label` and its generated `controls`) only narrows
/// `parent`: every widening, with its reason.
pub fn check_child(
    parent: &Authority,
    spec: &Spec,
    label: &str,
    controls: &BTreeMap<String, Vec<u8>>,
) -> Result<(), Vec<Widening>> {
    let rules = v0::parse(controls.get("policy").map_or(&[][..], Vec::as_slice))
        .map_err(|_| vec![Widening::InvalidName("the generated policy does not parse".into())])?;
    let ids = Ids { uid: spec.uid(), gid: spec.gid(), groups: spec.groups.clone() };
    attenuate::check_create(
        &attenuate::Parent {
            subject: &parent.label,
            policy: &parent.policy,
            mounts: &parent.mounts,
            ids: &parent.ids,
        },
        &attenuate::Child {
            name: &spec.name,
            subject: label,
            rules: &rules,
            mounts: &spec.mounts,
            ids: &ids,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_labels() {
        assert_eq!(default_label("my-bot"), "my_bot_t");
        assert_eq!(default_label("a.b+c"), "a_b_c_t");
    }

    #[test]
    fn shared_specs() {
        assert_eq!(parse_shared("p:read"), Ok(("p".into(), false)));
        assert_eq!(parse_shared("p:write"), Ok(("p".into(), true)));
        assert!(parse_shared("p").is_err());
        assert!(parse_shared("p:exec").is_err());
    }

    #[test]
    fn mount_specs() {
        let m = parse_mount("/src", "/data", "ro").expect("parses");
        assert!(m.options.nosuid && m.options.nodev && !m.options.noexec);
        let m = parse_mount("/src", "/data", "rw,noexec").expect("parses");
        assert!(m.options.noexec && m.mode == MountMode::Rw);
        assert!(parse_mount("rel", "/data", "ro").is_err());
        assert!(parse_mount("/src", "/da ta", "ro").is_err());
        assert!(parse_mount("/src", "/data", "rx").is_err());
    }

    #[test]
    fn a_new_agent_is_granted_what_it_asks_and_its_controls_are_valid() {
        let spec = Spec {
            name: "coder".into(),
            tools: vec!["fs.read".into(), "fs.read".into()],
            shared: vec![("p".into(), true)],
            mounts: vec![parse_mount("/src", "/data", "rw").expect("parses")],
            uid: Some(1879113728),
            ..Spec::default()
        };
        let label = label_of(&spec).expect("label");
        let c = controls(&spec, &label);
        let policy = String::from_utf8(c["policy"].clone()).expect("utf-8");
        assert_eq!(
            policy,
            "allow coder_t tool:fs.read execute\nallow coder_t shared:p read\nallow coder_t shared:p write\n\
             allow coder_t mount:/data read\nallow coder_t mount:/data write\n"
        );
        validate("coder", &c).expect("valid controls");
    }
}
