//! Model objects (`model/<provider>/<model>` with `.d/driver`, `.d/id`) and the aliases
//! `model/main` and `model/helper`, and how a launch resolves an agent's model and its key.
//!
//! Models are installed through the object store like tools and agents; an alias is a
//! symlink whose target is `PROVIDER/MODEL`, replaced by a rename. No vendor is built in.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use policy::controls::ObjectClass;
use policy::model::{self, Driver};
use policy::v0::{Class, Permission, Policy, Query};
use ringfs::object::publish::{self, Tier};

use super::{Error, Result, secrets};

fn invalid(msg: impl Into<String>) -> Error {
    Error::Invalid(msg.into())
}

/// What a model object holds.
#[derive(Clone, Debug)]
pub struct Model {
    /// `PROVIDER/MODEL`.
    pub name: String,
    /// The route.
    pub driver: Driver,
    /// The id sent upstream (`.d/id`, or the model's name).
    pub id: String,
}

/// `model/<provider>/` of a storage (or a host mount).
fn provider_dir(root: &Path, provider: &str) -> PathBuf {
    root.join("model").join(provider)
}

/// The executable of a model object: it says how models are reached.
fn exe(name: &str) -> String {
    format!(
        "#!/bin/sh\necho \"model {name}: reached through an agent's launch profile (ctx agent start NAME --profile ...)\" >&2\nexit 69\n"
    )
}

/// Installs `model/<name>` in `storage` with `driver`, `id` (default: the model part of the
/// name) and, when given, a policy of its own. Returns what was done.
pub fn add(
    storage: &Path,
    name: &str,
    driver: &Driver,
    id: Option<&str>,
    policy: Option<&str>,
) -> Result<String> {
    publish::existing(storage)?;
    let (provider, m) = model::check_name(name).map_err(invalid)?;
    let id = id.unwrap_or(m);
    model::check_id(id).map_err(|e| invalid(format!("--id: {e}")))?;
    let mut controls: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    controls.insert("driver".into(), driver.to_text().into_bytes());
    controls.insert("id".into(), format!("{id}\n").into_bytes());
    if let Some(p) = policy {
        controls.insert("policy".into(), p.as_bytes().to_vec());
    }
    for (c, bytes) in &controls {
        policy::controls::validate(ObjectClass::Model, m, c, bytes)
            .map_err(|e| Error::Internal(format!("model/{name}.d/{c}: {e}")))?;
    }
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let stage = std::env::temp_dir().join(format!("cortexfs-model.{m}.{}.{nanos}", std::process::id()));
    let done = publish::stage_generated(ObjectClass::Model, m, exe(name).as_bytes(), &controls, &stage)
        .and_then(|c| publish::install_into(&provider_dir(storage, provider), &c));
    let _ = std::fs::remove_dir_all(&stage);
    let done = done.map_err(|e| match e {
        ringfs::Error::Conflict(_) => {
            Error::State(format!("model/{name} already exists (ctx model rm it first)"))
        }
        ringfs::Error::Unchecked(why) => Error::Internal(why),
        e => Error::Storage(e),
    })?;
    Ok(format!("installed {}", done.path.display()))
}

/// Reads `model/<name>` from `root` (a storage, or the host's /ctx).
pub fn read(root: &Path, name: &str) -> Result<Model> {
    let (provider, m) = model::check_name(name).map_err(invalid)?;
    let ctl = provider_dir(root, provider).join(format!("{m}.d"));
    if !provider_dir(root, provider).join(m).is_file() {
        return Err(Error::State(format!("no model {name} (ctx model ls)")));
    }
    let control = |c: &str| -> Result<Vec<u8>> {
        let p = ctl.join(c);
        let f = std::fs::File::open(&p).map_err(|source| Error::Control { path: p.clone(), source })?;
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut std::io::Read::take(f, model::DRIVER_MAX as u64 + 1), &mut v)
            .map_err(|source| Error::Control { path: p.clone(), source })?;
        Ok(v)
    };
    let driver =
        model::parse(&control("driver")?).map_err(|e| invalid(format!("model/{name}.d/driver: {e}")))?;
    let id = match control("id") {
        Ok(b) => String::from_utf8_lossy(&b).trim().to_owned(),
        Err(_) => m.to_owned(),
    };
    model::check_id(&id).map_err(|e| invalid(format!("model/{name}.d/id: {e}")))?;
    Ok(Model { name: name.to_owned(), driver, id })
}

/// What an alias points at, if it is set.
pub fn alias_target(root: &Path, alias: &str) -> Option<String> {
    let t = std::fs::read_link(root.join("model").join(alias)).ok()?;
    Some(t.to_string_lossy().trim_start_matches("./").to_owned())
}

/// Points `model/<alias>` (`main` or `helper`) at `target`, an installed model.
pub fn set_alias(storage: &Path, alias: &str, target: &str) -> Result<()> {
    if !model::ALIASES.contains(&alias) {
        return Err(invalid(format!("alias {alias:?} is not main or helper")));
    }
    read(storage, target)?;
    let dir = storage.join("model");
    let tmp = dir.join(format!(".{alias}.{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp)?;
    std::fs::rename(&tmp, dir.join(alias))?;
    std::fs::File::open(&dir)?.sync_all()?;
    Ok(())
}

/// Every installed model, sorted by name.
pub fn installed(storage: &Path) -> Result<Vec<Model>> {
    let mut out = Vec::new();
    let Ok(providers) = std::fs::read_dir(storage.join("model")) else { return Ok(out) };
    for p in providers.flatten() {
        let provider = p.file_name().to_string_lossy().into_owned();
        if !p.file_type().is_ok_and(|t| t.is_dir()) || policy::name::validate(&provider).is_err() {
            continue;
        }
        let Ok(models) = std::fs::read_dir(p.path()) else { continue };
        for m in models.flatten() {
            let n = m.file_name().to_string_lossy().into_owned();
            if m.file_type().is_ok_and(|t| t.is_file()) && policy::name::validate(&n).is_ok() {
                out.push(read(storage, &format!("{provider}/{n}"))?);
            }
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Removes `model/<name>`; refused while an alias points at it.
pub fn remove(storage: &Path, name: &str) -> Result<Vec<String>> {
    model::check_name(name).map_err(invalid)?;
    for a in model::ALIASES {
        if alias_target(storage, a).as_deref() == Some(name) {
            return Err(Error::State(format!(
                "model/{a} points at {name}: point it elsewhere first (ctx model alias {a} OTHER)"
            )));
        }
    }
    publish::uninstall(storage, ObjectClass::Model, name, Tier::System, false).map_err(|e| match e {
        ringfs::Error::Conflict(why) => Error::State(why),
        e => Error::Storage(e),
    })
}

/// The model a launch uses: the agent's `model` control (its first line), or `main`;
/// resolved through the host mount `ctx`. Refused (13) unless the agent's policy allows
/// `model:<name> use` for the name it refers to, and the model's own policy, when it has
/// one, allows `model:<PROVIDER/MODEL> use` for the agent's label.
pub fn for_launch(ctx: &Path, agent: &str, label: &str, policy: &Policy, named: &str) -> Result<Model> {
    let named = if named.is_empty() { "main" } else { named };
    let allows = |p: &Policy, object: &str| {
        p.allows(&Query { subject: label, class: Class::Model, object, permission: Permission::Use })
    };
    if !allows(policy, named) {
        return Err(Error::Denied(format!(
            "agent/{agent}.d/policy does not allow {label} model:{named} use (ctx agent grant {agent} model:{named} use)"
        )));
    }
    let name = if model::ALIASES.contains(&named) {
        alias_target(ctx, named).ok_or_else(|| {
            Error::State(format!(
                "model/{named} is not set (ctx model add, then ctx model alias {named} PROVIDER/MODEL)"
            ))
        })?
    } else {
        named.to_owned()
    };
    let m = read(ctx, &name)?;
    let (provider, leaf) = model::check_name(&name).map_err(invalid)?;
    let own = provider_dir(ctx, provider).join(format!("{leaf}.d/policy"));
    if let Ok(text) = std::fs::read(&own)
        && !text.is_empty()
    {
        let p = Policy::from_text(&text).map_err(|_| invalid(format!("{} does not parse", own.display())))?;
        if !allows(&p, &name) {
            return Err(Error::Denied(format!(
                "model/{name}.d/policy does not allow {label} model:{name} use"
            )));
        }
    }
    Ok(m)
}

/// The key of `m`: the first of its variables set in this process's environment, then the
/// secret store; `None` for a route that takes no key. Unavailable (69), naming both places,
/// when neither has it.
pub fn key(m: &Model) -> Result<Option<Vec<u8>>> {
    if !m.driver.needs_key {
        return Ok(None);
    }
    let vars = m.driver.key_vars();
    for v in &vars {
        if let Some(k) = std::env::var_os(v).filter(|k| !k.is_empty()) {
            return Ok(Some(std::os::unix::ffi::OsStrExt::as_bytes(k.as_os_str()).to_vec()));
        }
    }
    let provider = match &m.driver.secret {
        Some(s) => s.clone(),
        None => model::check_name(&m.name).map_err(invalid)?.0.to_owned(),
    };
    if let Some(meta) = &m.driver.oauth {
        return super::oauth::access_token(&provider, meta)?.map(Some).ok_or_else(|| {
            Error::Unavailable(format!(
                "model {}: not signed in: none of {} is set, and the secret store has no {} oauth:access \
                 (ctx model login {provider})",
                m.name,
                vars.join(" "),
                secrets::service(&provider)
            ))
        });
    }
    if let Some(k) = secrets::get(&provider, "api-key")? {
        return Ok(Some(k));
    }
    Err(Error::Unavailable(format!(
        "model {}: no key: none of {} is set, and the secret store has no {} api-key (printf %s KEY | ctx secret set {provider})",
        m.name,
        vars.join(" "),
        secrets::service(&provider)
    )))
}
