//! `ctx bootstrap [SOURCE]`: the default layout, the core tools and tsh, installed into storage
//! through the object store.
//!
//! Each core tool (`fs.read fs.list fs.stat fs.write shell.exec tsh.config`) is an object whose
//! executable is the multi-call `cortexfs-core`; `tool/tsh` is tsh itself, with its `config`.
//! Every object is staged with a generated `cortexfs.object/v2` manifest, checked (digests
//! included) and published atomically. Installed tools grant nothing: their `policy` is empty
//! (deny by default) until the operator adds `allow LABEL tool:NAME execute` lines; a later
//! bootstrap keeps those lines (and tsh's `config`) and replaces only what changed.
//!
//! Idempotent: an object whose executable and controls already match is left alone. `--check`
//! reports what is missing or outdated (exit 1 if anything is); `--dry-run` says what a
//! bootstrap would do.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use policy::controls::ObjectClass;
use ringfs::object::publish::{self, Tier};
use sha2::{Digest, Sha256};

use crate::cmd::object::DEFAULT_STORAGE;
use crate::exit::{self, Exit};

/// Arguments of `ctx bootstrap`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The storage directory.
    #[arg(default_value = DEFAULT_STORAGE)]
    source: PathBuf,
    /// Where `cortexfs-core` and `tsh` are (default: beside ctx).
    #[arg(long)]
    bin: Option<PathBuf>,
    /// Only report what is missing or outdated; exit 1 if anything is.
    #[arg(long, conflicts_with = "dry_run")]
    check: bool,
    /// Say what would change, change nothing.
    #[arg(long)]
    dry_run: bool,
}

const LAYOUT: &[&str] = &["tool", "agent", "model", "home", "shared"];

const TSH_DESCRIPTION: &str = "The CortexFS tool shell: finds tools through CTX_PATH and runs them \
with both policies checked and every call recorded.\n";
const TSH_CONFIG: &str = "# tsh configuration (spec §3): change it with tsh.config\n";
/// Controls an operator owns after the first bootstrap; later bootstraps keep them.
const KEPT: &[&str] = &["policy", "config"];

/// One object bootstrap installs.
struct Want {
    name: String,
    exe: PathBuf,
    controls: BTreeMap<String, Vec<u8>>,
}

enum Action {
    Same,
    Install,
    Replace(Vec<String>),
}

fn wants(bin: &Path) -> Vec<Want> {
    let mut out = Vec::new();
    for t in coretools::TOOLS {
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
fn checked(storage: &Path, w: &Want, exe: &[u8], stage: &Path) -> anyhow::Result<ringfs::object::Checked> {
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
    std::fs::create_dir_all(stage)?;
    Ok(ringfs::object::publish::stage_generated(
        ObjectClass::Tool,
        &w.name,
        exe,
        &controls,
        &stage.join(&w.name),
    )?)
}

/// Runs `ctx bootstrap`.
pub fn run(a: Args) -> anyhow::Result<()> {
    let bin = match a.bin {
        Some(b) => b,
        None => std::env::current_exe()?.parent().map(Path::to_path_buf).unwrap_or_default(),
    };
    let storage = &a.source;
    let mut changes = 0;
    for d in LAYOUT {
        if !storage.join(d).is_dir() {
            changes += 1;
            println!("{} {}/", if a.check { "missing" } else { "create" }, storage.join(d).display());
            if !a.check && !a.dry_run {
                std::fs::create_dir_all(storage.join(d))
                    .map_err(|e| Exit::io(storage.join(d).display(), &e))?;
            }
        }
    }
    let stage = std::env::temp_dir().join(format!("cortexfs-bootstrap.{}", std::process::id()));
    let result = (|| -> anyhow::Result<()> {
        for w in wants(&bin) {
            let exe = std::fs::read(&w.exe).map_err(|e| {
                Exit::new(
                    exit::UNAVAILABLE,
                    format!("{}: {e} (build it, or name its directory with --bin)", w.exe.display()),
                )
            })?;
            let action = plan(storage, &w, &exe);
            let what = match &action {
                Action::Same => continue,
                Action::Install if a.check => format!("missing tool/{}", w.name),
                Action::Install => format!("install tool/{}", w.name),
                Action::Replace(c) if a.check => format!("outdated tool/{} ({})", w.name, c.join(", ")),
                Action::Replace(c) => format!("replace tool/{} ({})", w.name, c.join(", ")),
            };
            changes += 1;
            println!("{what}");
            if a.check || a.dry_run {
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
    if changes == 0 {
        println!("up to date: {}", storage.display());
    } else if a.check {
        return Err(Exit::quiet(exit::FAILURE).into());
    }
    Ok(())
}
