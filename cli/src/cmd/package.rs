//! `ctx install DIR` and `ctx uninstall NAME`: packages (a directory with `cortexfs.toml`)
//! installed through the object store, all or nothing; see `ringfs::object::package`.

use std::path::PathBuf;

use clap::ValueEnum;
use ringfs::object::package;
use ringfs::object::publish::Tier;

use crate::cmd::object::{DEFAULT_STORAGE, fail, plan, problems};
use crate::exit::{self, Exit};
use crate::out;

#[derive(Clone, Copy, Debug, ValueEnum)]
enum TierArg {
    System,
    User,
}

/// Arguments of `ctx install`.
#[derive(Debug, clap::Args)]
pub struct InstallArgs {
    /// The package directory (holding cortexfs.toml).
    #[arg(required_unless_present = "list")]
    package: Option<PathBuf>,
    /// The storage directory.
    #[arg(long, default_value = DEFAULT_STORAGE)]
    source: PathBuf,
    /// system: <storage>/<class>/; user: <storage>/home/<uid>/tool/ (packages of tools only).
    #[arg(long, value_enum, default_value_t = TierArg::System)]
    tier: TierArg,
    /// The user of the user tier (default: the caller).
    #[arg(long)]
    uid: Option<u32>,
    /// Check the package and say what would be installed; write nothing.
    #[arg(long)]
    dry_run: bool,
    /// List the packages installed in the storage instead.
    #[arg(long, conflicts_with_all = ["dry_run", "uid"])]
    list: bool,
    /// With --list: print a JSON array of {"package","version","state","uid","objects"}.
    #[arg(long, requires = "list")]
    json: bool,
}

/// Arguments of `ctx uninstall`.
#[derive(Debug, clap::Args)]
pub struct UninstallArgs {
    /// The package's name.
    name: String,
    /// The storage directory.
    #[arg(long, default_value = DEFAULT_STORAGE)]
    source: PathBuf,
    /// Do it (without this, only print the plan).
    #[arg(long)]
    yes: bool,
}

/// Runs `ctx install`.
pub fn install(a: InstallArgs) -> anyhow::Result<()> {
    if a.list {
        let all = package::list(&a.source).map_err(fail)?;
        if a.json {
            let v: Vec<serde_json::Value> = all
                .iter()
                .map(|r| {
                    let objects: Vec<String> =
                        r.objects.iter().map(|o| format!("{}/{}", o.class, o.name)).collect();
                    serde_json::json!({"package": r.name, "version": r.version, "state": r.state.to_string(),
                        "uid": r.uid, "objects": objects})
                })
                .collect();
            return out::line(serde_json::Value::Array(v));
        }
        let mut list = out::Listing::new("PACKAGE\tVERSION\tSTATE\tTIER\tOBJECTS");
        for r in all {
            let tier = r.uid.map_or("system".to_owned(), |u| format!("user:{u}"));
            let objects: Vec<String> = r.objects.iter().map(|o| format!("{}/{}", o.class, o.name)).collect();
            list.row(format_args!("{}\t{}\t{}\t{tier}\t{}", r.name, r.version, r.state, objects.join(",")))?;
        }
        return Ok(());
    }
    let tier = match a.tier {
        TierArg::System if a.uid.is_some() => {
            return Err(Exit::new(exit::INVALID, "--uid goes with --tier user").into());
        }
        TierArg::System => Tier::System,
        TierArg::User => Tier::User { uid: a.uid.unwrap_or_else(|| rustix::process::getuid().as_raw()) },
    };
    let Some(dir) = &a.package else {
        return Err(Exit::new(exit::INVALID, "no package directory given").into());
    };
    let pkg = package::check(dir).map_err(|p| problems(dir, &p, true))?;
    // A label belongs to one agent, however the agent is made.
    for o in pkg.objects.iter().filter(|o| o.manifest.class == policy::controls::ObjectClass::Agent) {
        let Some(label) = o.controls.get("label").map(|b| String::from_utf8_lossy(b).trim().to_owned())
        else {
            continue;
        };
        let name = o.manifest.name.to_string();
        if let Some(why) =
            ctxterm::launch::agents::label_taken(&a.source, &name, &label).map_err(exit::launch)?
        {
            return Err(Exit::new(exit::INVALID, format!("agent/{name}: {why}")).into());
        }
    }
    let steps = package::install(&a.source, &pkg, tier, a.dry_run).map_err(fail)?;
    for s in &steps {
        out::line(format_args!("{}{s}", if a.dry_run { "would " } else { "" }))?;
    }
    if !a.dry_run {
        for o in pkg.objects.iter().filter(|o| o.manifest.class == policy::controls::ObjectClass::Agent) {
            let name = o.manifest.name.to_string();
            if let Some(id) =
                ctxterm::launch::agents::give_identity(&a.source, &name).map_err(exit::launch)?
            {
                out::line(format_args!("agent/{name}: uid and gid {id}, its own"))?;
            }
        }
    }
    if !a.dry_run && tier == Tier::System {
        let objects: Vec<String> = pkg
            .objects
            .iter()
            .map(|o| format!("{}/{}", o.manifest.class.as_str(), o.manifest.name))
            .collect();
        crate::cmd::config::own_objects_and(
            &a.source,
            &objects,
            &[format!("{}/{}.json", ringfs::config::PACKAGES, pkg.name)],
            &format!("install package {} {}", pkg.name, pkg.version),
        )?;
    } else if !a.dry_run {
        // A user tier's objects are that user's files, not configuration; the record is.
        crate::cmd::config::own_change(
            &a.source,
            &[format!("{}/{}.json", ringfs::config::PACKAGES, pkg.name)],
            &format!("install package {} {} ({})", pkg.name, pkg.version, "user tier"),
        )?;
    }
    if a.dry_run {
        out::line(format_args!("dry run: package {} {} checks out; nothing written", pkg.name, pkg.version))
    } else {
        out::line(format_args!("installed package {} {}", pkg.name, pkg.version))
    }
}

/// Runs `ctx uninstall`.
pub fn uninstall(a: UninstallArgs) -> anyhow::Result<()> {
    let record = package::list(&a.source).map_err(fail)?.into_iter().find(|r| r.name == a.name);
    let steps = package::uninstall(&a.source, &a.name, !a.yes).map_err(fail)?;
    let rec = vec![format!("{}/{}.json", ringfs::config::PACKAGES, a.name)];
    if a.yes && record.as_ref().is_some_and(|r| r.uid.is_some()) {
        crate::cmd::config::own_change(
            &a.source,
            &rec,
            &format!("uninstall package {} (user tier)", a.name),
        )?;
    }
    if a.yes
        && let Some(r) = record.filter(|r| r.uid.is_none())
    {
        let objects: Vec<String> = r.objects.iter().map(|o| format!("{}/{}", o.class, o.name)).collect();
        crate::cmd::config::own_objects_and(
            &a.source,
            &objects,
            &rec,
            &format!("uninstall package {}", a.name),
        )?;
    }
    plan(&steps, a.yes)
}
