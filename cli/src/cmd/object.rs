//! `ctx object ...`: the object lifecycle.

use std::path::{Path, PathBuf};

use clap::{Subcommand, ValueEnum};
use policy::controls::ObjectClass;
use ringfs::object::publish::{self, Tier};

use crate::exit::{self, Exit};
use crate::out;

/// The default storage.
pub const DEFAULT_STORAGE: &str = "/var/lib/cortexfs/storage/current";

/// Object manifests and installs.
#[derive(Debug, Subcommand)]
pub enum Cmd {
    /// Check a cortexfs.object/v2 manifest and every file it names.
    ///
    /// Prints `MANIFEST: FIELD: PROBLEM` for every problem and exits 2 if there is any;
    /// prints `ok CLASS/NAME VERSION` and exits 0 otherwise.
    Check {
        /// The manifest file.
        manifest: PathBuf,
    },
    /// Install a checked object; the name must be absent. Grants no authority.
    ///
    /// Stages on the storage's filesystem, verifies every digest, publishes the controls and
    /// then the executable, never replacing. Any problem: exit 2 and nothing written.
    Install {
        #[command(flatten)]
        at: Where,
        /// The manifest file.
        manifest: PathBuf,
    },
    /// Replace an installed object with a new version, keeping the old one for rollback.
    /// Shows the plan unless --yes.
    Replace {
        #[command(flatten)]
        at: Where,
        /// The manifest of the new version.
        manifest: PathBuf,
        /// Do it (without this, only print the plan).
        #[arg(long)]
        yes: bool,
    },
    /// Swap back to the version kept by the last replace. Shows the plan unless --yes.
    Rollback {
        #[command(flatten)]
        at: Where,
        /// The object, as CLASS/NAME (tool/hello).
        object: String,
        /// Do it (without this, only print the plan).
        #[arg(long)]
        yes: bool,
    },
    /// Remove an object: its executable first, then its controls. Shows the plan unless --yes.
    Uninstall {
        #[command(flatten)]
        at: Where,
        /// The object, as CLASS/NAME (tool/hello).
        object: String,
        /// Do it (without this, only print the plan).
        #[arg(long)]
        yes: bool,
    },
    /// Describe an installed object: controls, previous version, residue.
    Inspect {
        #[command(flatten)]
        at: Where,
        /// The object, as CLASS/NAME (tool/hello).
        object: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Storage and tier.
#[derive(Debug, clap::Args)]
pub struct Where {
    /// The storage directory.
    #[arg(long, default_value = DEFAULT_STORAGE)]
    source: PathBuf,
    /// system: <storage>/<class>/; user: <storage>/home/<uid>/tool/ (tools only).
    #[arg(long, value_enum, default_value_t = TierArg::System)]
    tier: TierArg,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum TierArg {
    System,
    User,
}

impl Where {
    fn tier(&self) -> Tier {
        match self.tier {
            TierArg::System => Tier::System,
            TierArg::User => Tier::User { uid: rustix::process::getuid().as_raw() },
        }
    }
}

fn parse_object(s: &str) -> Result<(ObjectClass, &str), Exit> {
    let bad = || Exit::new(exit::INVALID, format!("invalid object {s:?}: expected tool/NAME or agent/NAME"));
    let (class, name) = s.split_once('/').ok_or_else(bad)?;
    let class = ObjectClass::parse(class).ok_or_else(bad)?;
    policy::name::validate(name)
        .map_err(|e| Exit::new(exit::INVALID, format!("invalid object {s:?}: {e}")))?;
    Ok((class, name))
}

/// Maps a storage error to an exit.
pub(crate) fn fail(e: ringfs::Error) -> Exit {
    let code = match &e {
        ringfs::Error::Io { source, .. } if source.kind() == std::io::ErrorKind::PermissionDenied => {
            exit::DENIED
        }
        ringfs::Error::Invalid(_) | ringfs::Error::NoStorage { .. } => exit::INVALID,
        _ => exit::FAILURE,
    };
    Exit::new(code, e.to_string())
}

/// Prints `SHOWN: FIELD: PROBLEM` for each problem; the exit (2) that sums them up.
pub(crate) fn problems(shown: &Path, problems: &[policy::manifest::Problem], writing: bool) -> Exit {
    for p in problems {
        let _ = if p.field.is_empty() {
            out::line(format_args!("{}: {}", shown.display(), p.message))
        } else {
            out::line(format_args!("{}: {}: {}", shown.display(), p.field, p.message))
        };
    }
    let tail = if writing { "; nothing was written" } else { "" };
    Exit::new(exit::INVALID, format!("{}: {} problem(s){tail}", shown.display(), problems.len()))
}

fn checked(manifest: &Path, writing: bool) -> anyhow::Result<ringfs::object::Checked> {
    ringfs::object::check(manifest).map_err(|p| problems(manifest, &p, writing).into())
}

/// Prints a plan's steps (`would ...` unless `yes`) and, for a dry run, how to do it.
pub(crate) fn plan(steps: &[String], yes: bool) -> anyhow::Result<()> {
    for s in steps {
        out::line(format_args!("{}{s}", if yes { "" } else { "would " }))?;
    }
    if !yes {
        out::line("dry run: nothing changed; re-run with --yes to do it")?;
    }
    Ok(())
}

/// A change of the system tier's object `object`, made (`yes`), committed as its own.
fn committed(at: &Where, yes: bool, object: &str, what: &str) -> anyhow::Result<()> {
    if yes && at.tier() == Tier::System {
        crate::cmd::config::own_objects(
            &at.source,
            &[object.to_owned()],
            &format!("object {what} {object}"),
        )?;
    }
    Ok(())
}

/// Runs the command.
pub fn run(cmd: Cmd) -> anyhow::Result<()> {
    match cmd {
        Cmd::Check { manifest } => {
            let c = checked(&manifest, false)?;
            out::line(format_args!(
                "ok {}/{} {}",
                c.manifest.class.as_str(),
                c.manifest.name,
                c.manifest.version
            ))
        }
        Cmd::Install { at, manifest } => {
            let c = checked(&manifest, true)?;
            let done = publish::install(&at.source, &c, at.tier()).map_err(fail)?;
            if at.tier() == Tier::System {
                let o = format!("{}/{}", c.manifest.class.as_str(), c.manifest.name);
                crate::cmd::config::own_objects(
                    &at.source,
                    std::slice::from_ref(&o),
                    &format!("object install {o}"),
                )?;
            }
            for p in &done.cleared {
                out::line(format_args!("cleared residue {}", p.display()))?;
            }
            out::line(format_args!(
                "installed {}/{} {} at {}",
                c.manifest.class.as_str(),
                c.manifest.name,
                c.manifest.version,
                done.path.display()
            ))
        }
        Cmd::Replace { at, manifest, yes } => {
            let c = checked(&manifest, true)?;
            let steps = publish::replace(&at.source, &c, at.tier(), !yes).map_err(fail)?;
            let o = format!("{}/{}", c.manifest.class.as_str(), c.manifest.name);
            committed(&at, yes, &o, "replace")?;
            plan(&steps, yes)
        }
        Cmd::Rollback { at, object, yes } => {
            let (class, name) = parse_object(&object)?;
            let steps = publish::rollback(&at.source, class, name, at.tier(), !yes).map_err(fail)?;
            committed(&at, yes, &object, "rollback")?;
            plan(&steps, yes)
        }
        Cmd::Uninstall { at, object, yes } => {
            let (class, name) = parse_object(&object)?;
            let steps = publish::uninstall(&at.source, class, name, at.tier(), !yes).map_err(fail)?;
            committed(&at, yes, &object, "uninstall")?;
            plan(&steps, yes)
        }
        Cmd::Inspect { at, object, json } => {
            let (class, name) = parse_object(&object)?;
            let i = publish::inspect(&at.source, class, name, at.tier()).map_err(fail)?;
            if json {
                let v = serde_json::json!({
                    "object": object,
                    "path": i.path,
                    "installed": i.installed,
                    "controls": i.controls,
                    "previous": i.has_previous,
                    "residue": i.residue,
                });
                out::line(v)?;
            } else if !i.installed {
                return Err(
                    Exit::new(exit::FAILURE, format!("no {object} in {}", at.source.display())).into()
                );
            } else {
                out::line(format_args!("{object}: installed"))?;
                out::line(format_args!("path: {}", i.path.display()))?;
                out::line(format_args!("controls: {}", i.controls.join(" ")))?;
                out::line(format_args!("previous version: {}", if i.has_previous { "yes" } else { "no" }))?;
                for r in &i.residue {
                    out::line(format_args!("residue: {}", r.display()))?;
                }
            }
            if i.installed { Ok(()) } else { Err(Exit::quiet(exit::FAILURE).into()) }
        }
    }
}
