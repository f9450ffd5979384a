//! Packages (spec §9, seed "One-file Extensions"): a directory whose `cortexfs.toml` names tools
//! and executable agents, installed object by object through the same hash-bound publish as
//! [`super::publish::install`].
//!
//! All or nothing: every file of every object is read and checked before anything is written;
//! then a record of the package is made durable under `<storage>/.cortexfs/package/<name>.json`
//! (outside the root ABI, so never shown under `/ctx`), stating each object it is about to
//! publish; then the objects are published in file order. If one fails, the ones already
//! published are uninstalled again, newest first, and the record goes; what could not be
//! removed is named in the error. A crash part way leaves the record saying `installing`, and
//! `ctx uninstall NAME` removes what it lists. Uninstall removes only objects whose executable
//! is still the one the package installed (an object replaced since is left, and said so).
//!
//! Tools get an `origin` control `package:<name>@<version>` (diagnostic, as the spec has it).

use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use policy::controls::{self, ObjectClass};
use policy::manifest::{ControlSource, FileRef, Manifest, Problem};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::publish::{self, Step, Tier};
use super::{Checked, read_ref};
use crate::error::{Error, Result};

/// The package file's name.
pub const FILE: &str = "cortexfs.toml";
/// The most bytes of `cortexfs.toml` (and of a record) read.
pub const MAX_FILE: u64 = 1 << 20;
/// Where package records live in a storage.
pub const RECORDS: &str = ".cortexfs/package";

/// A package whose every file checks out.
#[derive(Debug)]
pub struct CheckedPackage {
    /// The package's name.
    pub name: String,
    /// Its version.
    pub version: String,
    /// Its objects, tools first, in file order.
    pub objects: Vec<Checked>,
}

fn problem(field: impl Into<String>, message: impl Into<String>) -> Problem {
    Problem { field: field.into(), message: message.into() }
}

fn read_bounded(path: &Path) -> std::result::Result<Vec<u8>, String> {
    let f = fs::File::open(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut bytes = Vec::new();
    f.take(MAX_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if bytes.len() as u64 > MAX_FILE {
        return Err(format!("{} is larger than {MAX_FILE} bytes", path.display()));
    }
    Ok(bytes)
}

/// Reads a file a package names, with its digest; a problem goes to `out`.
fn read_file(
    dir: &Path,
    out: &mut Vec<Problem>,
    field: String,
    rel: &str,
    executable: bool,
) -> Option<(FileRef, Vec<u8>)> {
    match read_ref(dir, rel) {
        Err(e) => {
            out.push(problem(field, e));
            None
        }
        Ok((_, mode)) if executable && mode & 0o111 == 0 => {
            out.push(problem(field, format!("{rel} is not executable")));
            None
        }
        Ok((bytes, _)) => {
            let sha256 = Sha256::digest(&bytes).into();
            Some((FileRef { path: rel.to_owned(), sha256 }, bytes))
        }
    }
}

/// Reads `<dir>/cortexfs.toml` and every file it names; reports every problem.
pub fn check(dir: &Path) -> std::result::Result<CheckedPackage, Vec<Problem>> {
    let text = read_bounded(&dir.join(FILE)).map_err(|e| vec![problem("", e)])?;
    let pkg = policy::package::parse(&text, &policy::cortexfs_version())?;
    let origin = format!("package:{}@{}\n", pkg.name, pkg.version);
    let mut out = Vec::new();
    let mut objects = Vec::new();
    for (i, o) in pkg.objects.iter().enumerate() {
        let at = format!("{}[{i}]", o.class.as_str());
        let mut ok = true;
        let mut refs = BTreeMap::new();
        let mut contents = BTreeMap::new();
        let exe = read_file(dir, &mut out, format!("{at}.executable"), &o.executable, true);
        for (control, rel) in &o.controls {
            let field = format!("{at}.controls.{control}");
            // An identity is the host's to give: a package naming one could take another
            // agent's uid (or root's) and with it that agent's files and grants.
            if o.class == ObjectClass::Agent && matches!(control.as_str(), "uid" | "gid" | "groups" | "owner")
            {
                out.push(problem(
                    field,
                    format!("a package never names an agent's {control}: the host gives it (ctx agent new)"),
                ));
                ok = false;
                continue;
            }
            let Some((r, bytes)) = read_file(dir, &mut out, field.clone(), rel, controls::is_hook(control))
            else {
                ok = false;
                continue;
            };
            if let Err(e) = controls::validate(o.class, &o.name, control, &bytes) {
                out.push(problem(field, e));
                ok = false;
                continue;
            }
            refs.insert(control.clone(), ControlSource::File(r));
            contents.insert(control.clone(), bytes);
        }
        let mut inline = |control: &str, text: String| {
            if !refs.contains_key(control) {
                contents.insert(control.to_owned(), text.clone().into_bytes());
                refs.insert(control.to_owned(), ControlSource::Text(text));
            }
        };
        if let Some(d) = &o.description {
            inline("description", format!("{}\n", d.trim_end()));
        }
        if o.class == ObjectClass::Tool {
            inline("origin", origin.clone());
        }
        let Some((executable, exe_bytes)) = exe else { continue };
        if !ok {
            continue;
        }
        let manifest = Manifest {
            version: pkg.version.clone(),
            compatibility: pkg.compatibility.clone(),
            class: o.class,
            name: o.name.clone(),
            executable,
            controls: refs,
        };
        objects.push(Checked {
            manifest,
            base: dir.to_path_buf(),
            executable: exe_bytes,
            controls: contents,
        });
    }
    if !out.is_empty() {
        return Err(out);
    }
    Ok(CheckedPackage { name: pkg.name.to_string(), version: pkg.version.to_string(), objects })
}

/// What a record says of one object.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RecordObject {
    /// `tool` or `agent`.
    pub class: String,
    /// The object's name.
    pub name: String,
    /// The executable's SHA-256, hex.
    pub sha256: String,
}

/// The record of an installed (or installing) package.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Record {
    /// The package's name.
    pub name: String,
    /// Its version.
    pub version: String,
    /// `installing` until every object is published, then `installed`.
    pub state: String,
    /// `system`, or the uid of the user tier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// The objects, in the order they are published.
    pub objects: Vec<RecordObject>,
}

impl Record {
    fn tier(&self) -> Tier {
        self.uid.map_or(Tier::System, |uid| Tier::User { uid })
    }
}

fn records(storage: &Path) -> PathBuf {
    storage.join(RECORDS)
}

fn record_path(storage: &Path, name: &str) -> Result<PathBuf> {
    policy::name::validate(name)
        .map_err(|e| Error::Invalid(format!("invalid package name {name:?}: {e}")))?;
    Ok(records(storage).join(format!("{name}.json")))
}

fn sync_dir(dir: &Path) -> Result<()> {
    fs::File::open(dir).and_then(|f| f.sync_all()).map_err(|e| Error::io("sync", dir, e))
}

/// Writes `record` durably: a new record must be absent (`fresh`), an existing one is replaced
/// by rename.
fn write_record(storage: &Path, record: &Record, fresh: bool) -> Result<()> {
    let path = record_path(storage, &record.name)?;
    let dir = records(storage);
    if !dir.is_dir() {
        fs::create_dir_all(&dir).map_err(|e| Error::io("create directory", &dir, e))?;
        for d in [storage.join(".cortexfs").as_path(), storage] {
            sync_dir(d)?;
        }
    }
    let bytes = serde_json::to_vec_pretty(record).map_err(|e| Error::Unchecked(e.to_string()))?;
    let tmp = dir.join(format!(".{}.{}.tmp", record.name, std::process::id()));
    let write = |p: &Path| -> std::io::Result<()> {
        let mut f = fs::OpenOptions::new().write(true).create_new(true).mode(0o644).open(p)?;
        f.write_all(&bytes)?;
        f.write_all(b"\n")?;
        f.sync_all()
    };
    if fresh {
        write(&path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                Error::Conflict(format!(
                    "package {} is already installed (or being installed); ctx uninstall {} first",
                    record.name, record.name
                ))
            } else {
                Error::io("write", &path, e)
            }
        })?;
    } else {
        let _ = fs::remove_file(&tmp);
        write(&tmp).map_err(|e| Error::io("write", &tmp, e))?;
        fs::rename(&tmp, &path).map_err(|e| Error::io("rename", &path, e))?;
    }
    sync_dir(&dir)
}

/// Reads the record of package `name`.
pub fn record(storage: &Path, name: &str) -> Result<Record> {
    let path = record_path(storage, name)?;
    if !path.exists() {
        return Err(Error::Conflict(format!("package {name} is not installed in {}", storage.display())));
    }
    let bytes = read_bounded(&path).map_err(|e| Error::Damaged { path: path.clone(), reason: e })?;
    parse_record(&bytes).map_err(|reason| Error::Damaged { path, reason })
}

/// Parses a package record: JSON with exactly the fields a [`Record`] has, every name valid.
pub fn parse_record(bytes: &[u8]) -> std::result::Result<Record, String> {
    let r: Record = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    policy::name::validate(&r.name).map_err(|e| format!("package name {:?}: {e}", r.name))?;
    for o in &r.objects {
        packaged(&o.class).ok_or_else(|| format!("unknown object class {:?}", o.class))?;
        policy::name::validate(&o.name).map_err(|e| format!("object name {:?}: {e}", o.name))?;
    }
    Ok(r)
}

/// The records of every package in `storage`, by name.
pub fn list(storage: &Path) -> Result<Vec<Record>> {
    let dir = records(storage);
    let Ok(entries) = fs::read_dir(&dir) else { return Ok(Vec::new()) };
    let mut out = Vec::new();
    for e in entries.flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        if let Some(name) = n.strip_suffix(".json")
            && !n.starts_with('.')
        {
            out.push(record(storage, name)?);
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

fn hex(b: &[u8; 32]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The classes a package holds: tools and agents (models are installed with `ctx model add`).
fn packaged(s: &str) -> Option<ObjectClass> {
    ObjectClass::parse(s).filter(|c| *c != ObjectClass::Model)
}

fn class_of(s: &str) -> Result<ObjectClass> {
    packaged(s).ok_or_else(|| Error::Invalid(format!("unknown object class {s:?} in a package record")))
}

/// Installs `pkg` into `storage`, all or nothing. With `dry_run`, only checks that every name is
/// free and returns the steps.
pub fn install(storage: &Path, pkg: &CheckedPackage, tier: Tier, dry_run: bool) -> Result<Vec<Step>> {
    publish::existing(storage)?;
    let rec_path = record_path(storage, &pkg.name)?;
    if rec_path.exists() {
        let r = record(storage, &pkg.name)?;
        return Err(Error::Conflict(format!(
            "package {} {} is already installed ({}); ctx uninstall {} first",
            r.name, r.version, r.state, r.name
        )));
    }
    let mut steps = Vec::new();
    let mut taken = Vec::new();
    for c in &pkg.objects {
        let class = c.manifest.class;
        let name = c.manifest.name.as_str();
        let dir = publish::class_dir(storage, class, tier)?;
        if dir.join(name).symlink_metadata().is_ok() {
            taken.push(format!("{}/{name} ({})", class.as_str(), dir.join(name).display()));
        }
        steps.push(format!(
            "install {}/{name} {} at {}",
            class.as_str(),
            c.manifest.version,
            dir.join(name).display()
        ));
    }
    if !taken.is_empty() {
        return Err(Error::Conflict(format!(
            "package {}: already installed: {}; nothing was written",
            pkg.name,
            taken.join(", ")
        )));
    }
    if dry_run {
        return Ok(steps);
    }
    let mut rec = Record {
        name: pkg.name.clone(),
        version: pkg.version.clone(),
        state: "installing".into(),
        uid: match tier {
            Tier::System => None,
            Tier::User { uid } => Some(uid),
        },
        objects: pkg
            .objects
            .iter()
            .map(|c| RecordObject {
                class: c.manifest.class.as_str().to_owned(),
                name: c.manifest.name.to_string(),
                sha256: hex(&c.manifest.executable.sha256),
            })
            .collect(),
    };
    write_record(storage, &rec, true)?;
    let mut done: Vec<&Checked> = Vec::new();
    for c in &pkg.objects {
        if let Err(e) = publish::install(storage, c, tier) {
            let mut left = Vec::new();
            for d in done.iter().rev() {
                let (class, name) = (d.manifest.class, d.manifest.name.as_str());
                if let Err(u) = publish::uninstall(storage, class, name, tier, false) {
                    left.push(format!("{}/{name} ({u})", class.as_str()));
                }
            }
            let what = format!("{}/{}", c.manifest.class.as_str(), c.manifest.name);
            if left.is_empty() {
                let _ =
                    fs::remove_file(&rec_path).and_then(|()| fs::File::open(records(storage))?.sync_all());
                return Err(Error::Conflict(format!(
                    "package {}: installing {what} failed: {e}; nothing of the package is left",
                    pkg.name
                )));
            }
            return Err(Error::Conflict(format!(
                "package {}: installing {what} failed: {e}; still installed, remove with ctx uninstall {}: {}",
                pkg.name,
                pkg.name,
                left.join(", ")
            )));
        }
        done.push(c);
    }
    rec.state = "installed".into();
    write_record(storage, &rec, false)?;
    Ok(steps)
}

/// Uninstalls package `name`: its objects newest first, then its record. With `dry_run`, only
/// returns the steps. An object replaced since the install (another executable) is left.
pub fn uninstall(storage: &Path, name: &str, dry_run: bool) -> Result<Vec<Step>> {
    let rec = record(storage, name)?;
    let tier = rec.tier();
    let mut steps = Vec::new();
    let mut remove = Vec::new();
    for o in rec.objects.iter().rev() {
        let class = class_of(&o.class)?;
        policy::name::validate(&o.name).map_err(|e| {
            Error::Invalid(format!("invalid object name {:?} in a package record: {e}", o.name))
        })?;
        let dir = publish::class_dir(storage, class, tier)?;
        let exe = dir.join(&o.name);
        match fs::read(&exe) {
            Ok(bytes) if hex(&Sha256::digest(&bytes).into()) == o.sha256 => {
                steps.push(format!("remove {}/{} ({})", o.class, o.name, exe.display()));
                remove.push((class, o.name.as_str()));
            }
            Ok(_) => {
                steps.push(format!("leave {}/{}: replaced since the package installed it", o.class, o.name))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if dir.join(format!("{}.d", o.name)).exists() {
                    steps
                        .push(format!("remove {}/{} (controls left without an executable)", o.class, o.name));
                    remove.push((class, o.name.as_str()));
                } else {
                    steps.push(format!("skip {}/{}: not installed", o.class, o.name));
                }
            }
            Err(e) => return Err(Error::io("read", exe, e)),
        }
    }
    steps.push(format!("forget package {} {}", rec.name, rec.version));
    if dry_run {
        return Ok(steps);
    }
    for (class, n) in remove {
        publish::uninstall(storage, class, n, tier, false)?;
    }
    let path = record_path(storage, name)?;
    fs::remove_file(&path).map_err(|e| Error::io("remove", &path, e))?;
    sync_dir(&records(storage))?;
    Ok(steps)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn exec(p: &Path, bytes: &[u8]) {
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, bytes).unwrap();
        fs::set_permissions(p, fs::Permissions::from_mode(0o755)).unwrap();
    }

    fn package(dir: &Path) {
        exec(&dir.join("bin/a"), b"#!/bin/sh\necho a\n");
        exec(&dir.join("bin/b"), b"#!/bin/sh\necho b\n");
        exec(&dir.join("bin/agent"), b"#!/bin/sh\nexec tsh\n");
        fs::create_dir_all(dir.join("policy")).unwrap();
        fs::write(dir.join("policy/a"), b"allow kit_t tool:kit.a execute\n").unwrap();
        fs::write(dir.join("system.md"), b"You review.\n").unwrap();
        fs::write(
            dir.join(FILE),
            br#"
[package]
name = "kit"
version = "1.2.0"

[[tool]]
name = "kit.a"
executable = "bin/a"
description = "Tool A"
[tool.controls]
policy = "policy/a"

[[tool]]
name = "kit.b"
executable = "bin/b"

[[agent]]
name = "kit-agent"
executable = "bin/agent"
[agent.controls]
"system.md" = "system.md"
"#,
        )
        .unwrap();
    }

    #[test]
    fn install_and_uninstall_round_trip() {
        let d = tempfile::tempdir().unwrap();
        let (src, st) = (d.path().join("pkg"), d.path().join("storage"));
        package(&src);
        fs::create_dir(&st).unwrap();
        let p = check(&src).unwrap();
        assert_eq!(p.objects.len(), 3);
        let plan = install(&st, &p, Tier::System, true).unwrap();
        assert_eq!(plan.len(), 3);
        assert!(!st.join("tool").exists(), "a dry run writes nothing");
        install(&st, &p, Tier::System, false).unwrap();
        assert_eq!(fs::read(st.join("tool/kit.a.d/origin")).unwrap(), b"package:kit@1.2.0\n");
        assert_eq!(fs::read(st.join("tool/kit.a.d/description")).unwrap(), b"Tool A\n");
        assert_eq!(fs::read(st.join("agent/kit-agent.d/system.md")).unwrap(), b"You review.\n");
        assert_eq!(record(&st, "kit").unwrap().state, "installed");
        assert!(matches!(install(&st, &p, Tier::System, false), Err(Error::Conflict(_))));
        uninstall(&st, "kit", false).unwrap();
        for p in ["tool/kit.a", "tool/kit.a.d", "tool/kit.b", "agent/kit-agent", "agent/kit-agent.d"] {
            assert!(!st.join(p).exists(), "{p} is left");
        }
        assert!(list(&st).unwrap().is_empty());
    }

    #[test]
    fn a_taken_name_writes_nothing() {
        let d = tempfile::tempdir().unwrap();
        let (src, st) = (d.path().join("pkg"), d.path().join("storage"));
        package(&src);
        fs::create_dir(&st).unwrap();
        exec(&st.join("tool/kit.b"), b"other");
        let e = install(&st, &check(&src).unwrap(), Tier::System, false).unwrap_err();
        assert!(e.to_string().contains("tool/kit.b"), "{e}");
        assert!(!st.join("tool/kit.a").exists());
        assert!(!st.join(RECORDS).join("kit.json").exists());
    }

    #[test]
    fn problems_of_every_object_are_reported() {
        let d = tempfile::tempdir().unwrap();
        package(d.path());
        fs::set_permissions(d.path().join("bin/b"), fs::Permissions::from_mode(0o644)).unwrap();
        fs::write(d.path().join("policy/a"), b"allow kit_t agent:* create\n").unwrap();
        fs::remove_file(d.path().join("system.md")).unwrap();
        let e = check(d.path()).unwrap_err();
        assert_eq!(e.len(), 3, "{e:?}");
    }

    #[test]
    fn a_replaced_object_is_left_by_uninstall() {
        let d = tempfile::tempdir().unwrap();
        let (src, st) = (d.path().join("pkg"), d.path().join("storage"));
        package(&src);
        fs::create_dir(&st).unwrap();
        install(&st, &check(&src).unwrap(), Tier::System, false).unwrap();
        fs::write(st.join("tool/kit.b"), b"#!/bin/sh\necho replaced\n").unwrap();
        let steps = uninstall(&st, "kit", false).unwrap();
        assert!(steps.iter().any(|s| s.starts_with("leave tool/kit.b")), "{steps:?}");
        assert!(st.join("tool/kit.b").exists());
        assert!(!st.join("tool/kit.a").exists());
    }

    #[test]
    fn records_are_checked_when_read() {
        let good = br#"{"name":"kit","version":"1.0.0","state":"installed","objects":[{"class":"tool","name":"kit.a","sha256":"00"}]}"#;
        assert_eq!(parse_record(good).unwrap().objects.len(), 1);
        for bad in [
            &br#"{"name":"../x","version":"1","state":"installed","objects":[]}"#[..],
            br#"{"name":"kit","version":"1","state":"installed","objects":[{"class":"model","name":"m","sha256":""}]}"#,
            br#"{"name":"kit","version":"1","state":"installed","objects":[{"class":"tool","name":"../../etc","sha256":""}]}"#,
            br#"{"name":"kit","version":"1","state":"installed","objects":[],"extra":1}"#,
            b"\xff",
        ] {
            assert!(parse_record(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }
}
