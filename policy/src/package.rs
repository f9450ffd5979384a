//! The package file `cortexfs.toml` (seed: extending CortexFS): one directory describing tools and
//! executable agents, installed by `ctx install ./package` through the same hash-bound publish as
//! manifests.
//!
//! ```toml
//! [package]
//! name = "review-kit"
//! version = "0.3.0"
//! cortexfs = ">=0.1"          # optional; defaults to any version
//!
//! [[tool]]
//! name = "lint.run"
//! executable = "bin/lint-run"
//! description = "Run the linter"
//! [tool.controls]              # control name -> file in the package
//! schema = "schemas/lint.json"
//! policy = "policy/lint.policy"
//!
//! [[agent]]
//! name = "reviewer"
//! executable = "bin/reviewer"
//! [agent.controls]
//! "system.md" = "agents/reviewer/system.md"
//! ```
//!
//! Unknown keys are errors; names, paths and control names are checked, and every problem is
//! reported.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::controls::{self, ObjectClass, Owner};
use crate::manifest::Problem;
use crate::name::Name;
use crate::path;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPackage {
    package: RawMeta,
    #[serde(default)]
    tool: Vec<RawObject>,
    #[serde(default)]
    agent: Vec<RawObject>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMeta {
    name: String,
    version: String,
    cortexfs: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawObject {
    name: String,
    executable: String,
    description: Option<String>,
    #[serde(default)]
    controls: BTreeMap<String, String>,
}

/// One object in a package.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackageObject {
    /// Tool or agent.
    pub class: ObjectClass,
    /// Object name.
    pub name: Name,
    /// Executable path relative to the package directory.
    pub executable: String,
    /// Inline description, if given.
    pub description: Option<String>,
    /// Control name -> file relative to the package directory.
    pub controls: BTreeMap<String, String>,
}

/// A checked package.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Package {
    /// Package name.
    pub name: Name,
    /// Package version.
    pub version: semver::Version,
    /// Compatible CortexFS versions.
    pub compatibility: semver::VersionReq,
    /// Tools, then agents, in file order.
    pub objects: Vec<PackageObject>,
}

/// Parses and checks `cortexfs.toml`.
pub fn parse(text: &[u8], cortexfs: &semver::Version) -> Result<Package, Vec<Problem>> {
    let mut problems = Vec::new();
    let mut add = |field: String, message: String| problems.push(Problem { field, message });
    let text = match std::str::from_utf8(text) {
        Ok(t) => t,
        Err(_) => {
            add(String::new(), "cortexfs.toml is not valid UTF-8".into());
            return Err(problems);
        }
    };
    let raw: RawPackage = match toml::from_str(text) {
        Ok(r) => r,
        Err(e) => {
            add(String::new(), e.to_string().trim_end().to_owned());
            return Err(problems);
        }
    };
    let name = Name::new(&raw.package.name).map_err(|e| add("package.name".into(), e.to_string())).ok();
    let version = semver::Version::parse(&raw.package.version)
        .map_err(|e| add("package.version".into(), e.to_string()))
        .ok();
    let compatibility = match semver::VersionReq::parse(raw.package.cortexfs.as_deref().unwrap_or("*")) {
        Ok(req) if req.matches(cortexfs) => Some(req),
        Ok(req) => {
            add("package.cortexfs".into(), format!("{req} does not match this CortexFS ({cortexfs})"));
            None
        }
        Err(e) => {
            add("package.cortexfs".into(), e.to_string());
            None
        }
    };
    let mut objects = Vec::new();
    let mut seen: Vec<(ObjectClass, String)> = Vec::new();
    let all = raw
        .tool
        .into_iter()
        .map(|o| (ObjectClass::Tool, o))
        .chain(raw.agent.into_iter().map(|o| (ObjectClass::Agent, o)));
    for (i, (class, o)) in all.enumerate() {
        let at = format!("{}[{}]", class.as_str(), i);
        let oname = match Name::new(&o.name) {
            Ok(n) => Some(n),
            Err(e) => {
                add(format!("{at}.name"), e.to_string());
                None
            }
        };
        if seen.contains(&(class, o.name.clone())) {
            add(format!("{at}.name"), format!("{} {} is listed twice", class.as_str(), o.name));
        }
        seen.push((class, o.name.clone()));
        if let Err(e) = path::check_relative(&o.executable) {
            add(format!("{at}.executable"), e.to_string());
        }
        if let (Some(n), Some(d)) = (&oname, &o.description)
            && let Err(e) = controls::validate(class, n, "description", d.as_bytes())
        {
            add(format!("{at}.description"), e);
        }
        for (c, file) in &o.controls {
            match controls::classify(class, c) {
                None => add(
                    format!("{at}.controls.{c}"),
                    format!("{} objects have no such control", class.as_str()),
                ),
                Some(Owner::Runtime) => {
                    add(format!("{at}.controls.{c}"), "runtime controls are never installed".into())
                }
                Some(_) => {}
            }
            if let Err(e) = path::check_relative(file) {
                add(format!("{at}.controls.{c}"), e.to_string());
            }
        }
        if let Some(name) = oname {
            objects.push(PackageObject {
                class,
                name,
                executable: o.executable,
                description: o.description,
                controls: o.controls,
            });
        }
    }
    match (name, version, compatibility) {
        (Some(name), Some(version), Some(compatibility)) if problems.is_empty() => {
            Ok(Package { name, version, compatibility, objects })
        }
        _ => Err(problems),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v() -> semver::Version {
        semver::Version::new(0, 1, 0)
    }

    #[test]
    fn good_package() {
        let t = br#"
[package]
name = "review-kit"
version = "0.3.0"
cortexfs = ">=0.1"

[[tool]]
name = "lint.run"
executable = "bin/lint-run"
description = "Run the linter"
[tool.controls]
schema = "schemas/lint.json"

[[agent]]
name = "reviewer"
executable = "bin/reviewer"
[agent.controls]
"system.md" = "agents/reviewer/system.md"
"#;
        let p = parse(t, &v()).unwrap();
        assert_eq!(p.objects.len(), 2);
        assert_eq!(p.objects[1].class, ObjectClass::Agent);
    }

    #[test]
    fn problems_reported() {
        let t = br#"
[package]
name = ".bad"
version = "x"

[[tool]]
name = "a"
executable = "../escape"
[tool.controls]
status = "s"
bogus = "b"
policy = "/etc/passwd"

[[tool]]
name = "a"
executable = "bin/a"
"#;
        let e = parse(t, &v()).unwrap_err();
        assert_eq!(e.len(), 7, "{e:?}");
        assert!(parse(b"[package]\nname='a'\nversion='1.0.0'\nextra=1\n", &v()).is_err());
        assert!(parse(b"\xff", &v()).is_err());
        assert!(parse(b"[package]\nname='a'\nversion='1.0.0'\ncortexfs='>=7'\n", &v()).is_err());
    }
}
