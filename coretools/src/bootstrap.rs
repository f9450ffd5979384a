//! Bootstrap: the default layout, the core tools and tsh, installed into a storage through the
//! object store (`ctx bootstrap`), and the manuals ([`crate::docs`]) in `shared/cortexfs-docs/`.
//!
//! Each core tool is an object whose executable is the multi-call `cortexfs-core`; `tool/tsh`
//! is tsh itself, with its `config`. Every object is staged with a generated
//! `cortexfs.object/v2` manifest, checked (digests included) and published atomically.
//! Installed tools grant nothing: their `policy` is empty (deny by default) until the operator
//! adds `allow LABEL tool:NAME execute` lines; a later bootstrap keeps those lines (and tsh's
//! `config`) and replaces only what changed. An object whose executable and controls already
//! match is left alone.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use policy::controls::ObjectClass;
use ringfs::object::publish::{self, Tier};
use sha2::{Digest, Sha256};

/// What a bootstrap does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Change the storage.
    Apply,
    /// Say what would change.
    DryRun,
    /// Say what is missing or outdated.
    Check,
}

/// Why a bootstrap stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A binary to install is missing (69).
    #[error("{path}: {source} (build it, or name its directory with --bin)")]
    Missing {
        /// The binary.
        path: PathBuf,
        /// Why it cannot be read.
        source: std::io::Error,
    },
    /// The storage refused it.
    #[error(transparent)]
    Storage(#[from] ringfs::Error),
}

const LAYOUT: &[&str] = &["tool", "agent", "model", "home", "shared"];

const TSH_DESCRIPTION: &str = "The CortexFS tool shell: finds tools through CTX_PATH and runs them \
with both policies checked and every call recorded.\n";
const TSH_CONFIG: &str = "# tsh configuration (spec §3): change it with tsh.config\n";
/// Controls an operator owns after the first bootstrap; later bootstraps keep them.
const KEPT: &[&str] = &["policy", "config"];

/// One object bootstrap installs.
pub(crate) struct Want {
    name: String,
    exe: PathBuf,
    controls: BTreeMap<String, Vec<u8>>,
}

pub(crate) enum Action {
    Same,
    Install,
    Replace(Vec<String>),
}

fn wants(bin: &Path) -> Vec<Want> {
    let mut out = Vec::new();
    for t in crate::TOOLS {
        let mut c = BTreeMap::new();
        c.insert("name".to_owned(), format!("{}\n", t.name).into_bytes());
        c.insert("description".to_owned(), t.description.as_bytes().to_vec());
        c.insert("schema".to_owned(), t.schema.as_bytes().to_vec());
        c.insert("policy".to_owned(), Vec::new());
        out.push(Want { name: t.name.to_owned(), exe: bin.join("cortexfs-core"), controls: c });
    }
    let mut c = BTreeMap::new();
    c.insert("name".to_owned(), b"tsh\n".to_vec());
    c.insert("description".to_owned(), TSH_DESCRIPTION.as_bytes().to_vec());
    c.insert("schema".to_owned(), b"{\"type\":\"object\"}\n".to_vec());
    c.insert("policy".to_owned(), Vec::new());
    c.insert(
        "config".to_owned(),
        format!("{TSH_CONFIG}{}", policy::tshconf::TshConfig::default().render()).into_bytes(),
    );
    out.push(Want { name: "tsh".to_owned(), exe: bin.join("tsh"), controls: c });
    out
}

fn plan(storage: &Path, w: &Want, exe: &[u8]) -> Action {
    let dir = storage.join("tool");
    let Ok(current) = std::fs::read(dir.join(&w.name)) else { return Action::Install };
    let mut changed = Vec::new();
    if Sha256::digest(&current) != Sha256::digest(exe) {
        changed.push("executable".to_owned());
    }
    let ctl = dir.join(format!("{}.d", w.name));
    for (name, bytes) in &w.controls {
        let have = std::fs::read(ctl.join(name));
        let same = match &have {
            Ok(h) => KEPT.contains(&name.as_str()) || h == bytes,
            Err(_) => false,
        };
        if !same {
            changed.push(name.clone());
        }
    }
    if changed.is_empty() { Action::Same } else { Action::Replace(changed) }
}

/// Stages `w` in `stage` (under which it gets a directory of its own) and checks it.
fn checked(storage: &Path, w: &Want, exe: &[u8], stage: &Path) -> ringfs::Result<ringfs::object::Checked> {
    let controls: BTreeMap<String, Vec<u8>> = w
        .controls
        .iter()
        .map(|(name, bytes)| {
            // An operator's policy and config survive: the installed copy replaces the default.
            let ctl = storage.join("tool").join(format!("{}.d", w.name)).join(name);
            let bytes = match std::fs::read(&ctl) {
                Ok(kept) if KEPT.contains(&name.as_str()) => kept,
                _ => bytes.clone(),
            };
            (name.clone(), bytes)
        })
        .collect();
    std::fs::create_dir_all(stage).map_err(|e| ringfs::Error::io("mkdir", stage, e))?;
    ringfs::object::publish::stage_generated(ObjectClass::Tool, &w.name, exe, &controls, &stage.join(&w.name))
}

/// Bootstraps `storage` with the binaries in `bin`; returns what it did (or would do, or
/// finds missing), a line each, and whether anything is (or was) to change.
pub fn run(storage: &Path, bin: &Path, mode: Mode) -> Result<(Vec<String>, bool), Error> {
    let mut said = Vec::new();
    for d in LAYOUT {
        let dir = storage.join(d);
        if !dir.is_dir() {
            said.push(format!(
                "{} {}/",
                if mode == Mode::Check { "missing" } else { "create" },
                dir.display()
            ));
            if mode == Mode::Apply {
                std::fs::create_dir_all(&dir).map_err(|e| ringfs::Error::io("mkdir", &dir, e))?;
            }
        }
    }
    let stage = std::env::temp_dir().join(format!("cortexfs-bootstrap.{}", std::process::id()));
    let result = (|| -> Result<(), Error> {
        for w in wants(bin) {
            let exe =
                std::fs::read(&w.exe).map_err(|source| Error::Missing { path: w.exe.clone(), source })?;
            let action = plan(storage, &w, &exe);
            let check = mode == Mode::Check;
            said.push(match &action {
                Action::Same => continue,
                Action::Install if check => format!("missing tool/{}", w.name),
                Action::Install => format!("install tool/{}", w.name),
                Action::Replace(c) if check => format!("outdated tool/{} ({})", w.name, c.join(", ")),
                Action::Replace(c) => format!("replace tool/{} ({})", w.name, c.join(", ")),
            });
            if mode != Mode::Apply {
                continue;
            }
            let c = checked(storage, &w, &exe, &stage)?;
            match action {
                Action::Install => {
                    publish::install(storage, &c, Tier::System)?;
                }
                Action::Replace(_) => {
                    publish::replace(storage, &c, Tier::System, false)?;
                }
                Action::Same => {}
            }
        }
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&stage);
    result?;
    // The manuals, in the shared space everyone may read.
    let docs = storage.join("shared").join(crate::docs::SPACE);
    let drift = crate::docs::plan(&docs);
    for d in &drift {
        said.push(match (mode, d) {
            (Mode::Check, _) => format!("docs: {d}"),
            (_, crate::docs::Drift::Stale(n)) => format!("docs: remove stale man/{n}"),
            (_, crate::docs::Drift::Missing(p)) => format!("docs: install {}", p.installed().display()),
            (_, crate::docs::Drift::Outdated(p)) => format!("docs: update {}", p.installed().display()),
        });
    }
    if mode == Mode::Apply && !drift.is_empty() {
        crate::docs::apply(&docs, &drift).map_err(|e| ringfs::Error::io("install manuals in", &docs, e))?;
    }
    let changed = !said.is_empty();
    Ok((said, changed))
}
