//! Hash-bound atomic publish (spec §9).
//!
//! An object `<class>/<name>` exists when its executable exists. Installing stages the
//! executable and the whole `<name>.d/` in a hidden directory on the destination filesystem,
//! fsyncs every file and directory, then publishes `<name>.d/` and the executable last, each with
//! `renameat2(RENAME_NOREPLACE)` and a directory fsync after it. A crash at any step leaves either
//! no executable (the object is absent; a staged directory or an orphan `<name>.d/` may remain as
//! residue, hidden from `/ctx` and cleared by the next install of that name) or the complete
//! object. Installing never grants authority and never replaces: the name must be absent.
//!
//! Uninstall removes the executable first (the object vanishes atomically), then its controls.
//! Replace keeps the previous version under `.cortexfs-prev.<name>/` and swaps each part with
//! `renameat2(RENAME_EXCHANGE)`, controls first and the executable last; rollback swaps back.
//!
//! Tiers: `system` objects live in `<storage>/<class>/`; `user` tools in
//! `<storage>/home/<uid>/tool/` (on `CTX_PATH` by default). Agents are system objects only:
//! `home/<uid>/agent/` holds sessions.

use std::fs::{self, File};
use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use policy::controls::{self, ObjectClass};
use rustix::fs::{AtFlags, Mode, OFlags, RenameFlags};
use rustix::io::Errno;

use super::Checked;
use crate::error::{Error, Result};

/// Where an object is installed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tier {
    /// `<storage>/<class>/`
    System,
    /// `<storage>/home/<uid>/tool/`
    User {
        /// The owner's uid.
        uid: u32,
    },
}

/// The prefix of staging directories.
pub const STAGE_PREFIX: &str = ".cortexfs-stage.";
/// The prefix of the directory holding an object's previous version.
pub const PREV_PREFIX: &str = ".cortexfs-prev.";
const TRASH_PREFIX: &str = ".cortexfs-trash.";

/// Refuses a storage that does not exist: installs create class directories, never a storage.
pub fn existing(storage: &Path) -> Result<()> {
    if storage.is_dir() { Ok(()) } else { Err(Error::NoStorage { path: storage.to_path_buf() }) }
}

/// The directory objects of `class` live in, for `tier`.
pub fn class_dir(storage: &Path, class: ObjectClass, tier: Tier) -> Result<PathBuf> {
    match (class, tier) {
        (_, Tier::System) => Ok(storage.join(class.as_str())),
        (ObjectClass::Tool, Tier::User { uid }) => {
            Ok(storage.join("home").join(uid.to_string()).join("tool"))
        }
        (ObjectClass::Agent, Tier::User { .. }) => Err(Error::Conflict(
            "agents are installed in the system tier only (home/<uid>/agent/ holds sessions)".into(),
        )),
        (ObjectClass::Model, Tier::User { .. }) => {
            Err(Error::Conflict("models are installed in the system tier only".into()))
        }
    }
}

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(Errno) -> Error + 'a {
    move |e| Error::io(op, path, e.into())
}

fn open_dir(path: &Path) -> Result<OwnedFd> {
    rustix::fs::open(
        path,
        OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::RDONLY,
        Mode::empty(),
    )
    .map_err(io("open directory", path))
}

fn open_dir_at(dir: &OwnedFd, name: &str, shown: &Path) -> Result<OwnedFd> {
    rustix::fs::openat(
        dir,
        name,
        OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::RDONLY,
        Mode::empty(),
    )
    .map_err(io("open directory", shown))
}

fn sync(fd: &OwnedFd, shown: &Path) -> Result<()> {
    rustix::fs::fsync(fd).map_err(io("sync", shown))
}

/// Creates `path` and missing parents, fsyncing each parent whose entries changed.
fn ensure_dir(path: &Path) -> Result<()> {
    if path.is_dir() {
        return Ok(());
    }
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        ensure_dir(parent)?;
    }
    match fs::create_dir(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(()),
        Err(e) => return Err(Error::io("create directory", path, e)),
    }
    let parent = match path.parent() {
        Some(p) if p.as_os_str().is_empty() => Path::new("."),
        Some(p) => p,
        None => Path::new("/"),
    };
    sync(&open_dir(parent)?, parent)
}

fn exists_at(dir: &OwnedFd, name: &str, shown: &Path) -> Result<bool> {
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(_) => Ok(true),
        Err(Errno::NOENT) => Ok(false),
        Err(e) => Err(Error::io("stat", shown.join(name), e.into())),
    }
}

fn write_file_at(dir: &OwnedFd, name: &str, bytes: &[u8], mode: u32, shown: &Path) -> Result<()> {
    let path = shown.join(name);
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(mode),
    )
    .map_err(io("create", &path))?;
    let mut f = File::from(fd);
    f.write_all(bytes).map_err(|e| Error::io("write", &path, e))?;
    // The umask may have narrowed the mode given to open.
    f.set_permissions(fs::Permissions::from_mode(mode)).map_err(|e| Error::io("chmod", &path, e))?;
    f.sync_all().map_err(|e| Error::io("sync", &path, e))
}

/// Stages the object in a fresh hidden directory of `dir`; returns its name.
fn stage(dir: &OwnedFd, shown: &Path, checked: &Checked) -> Result<String> {
    let name = checked.manifest.name.as_str();
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let stage_name = format!("{STAGE_PREFIX}{name}.{}.{nanos}", std::process::id());
    let stage_path = shown.join(&stage_name);
    rustix::fs::mkdirat(dir, &stage_name, Mode::from_raw_mode(0o700))
        .map_err(io("create directory", &stage_path))?;
    let sfd = open_dir_at(dir, &stage_name, &stage_path)?;
    write_file_at(&sfd, name, &checked.executable, 0o755, &stage_path)?;
    let ctl = format!("{name}.d");
    let ctl_path = stage_path.join(&ctl);
    rustix::fs::mkdirat(&sfd, &ctl, Mode::from_raw_mode(0o755)).map_err(io("create directory", &ctl_path))?;
    let cfd = open_dir_at(&sfd, &ctl, &ctl_path)?;
    let class = checked.manifest.class;
    let mut files: Vec<(String, Vec<u8>)> =
        checked.controls.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    if !checked.controls.contains_key("name") {
        files.push(("name".into(), format!("{name}\n").into_bytes()));
    }
    // Runtime controls start empty; the runtime writes them.
    let runtime: &[&str] = match class {
        ObjectClass::Tool | ObjectClass::Model => &["status", "log"],
        ObjectClass::Agent => &["status", "log", "pid"],
    };
    for r in runtime {
        files.push(((*r).into(), Vec::new()));
    }
    let mut subdirs: Vec<(OwnedFd, PathBuf)> = Vec::new();
    for sub in ["hooks", "hooks/pre.d", "hooks/post.d"] {
        let p = ctl_path.join(sub);
        rustix::fs::mkdirat(&cfd, sub, Mode::from_raw_mode(0o755)).map_err(io("create directory", &p))?;
        subdirs.push((open_dir_at(&cfd, sub, &p)?, p));
    }
    for (control, bytes) in &files {
        let (dir_index, leaf) = match control.rsplit_once('/') {
            Some(("hooks/pre.d", leaf)) => (Some(1), leaf),
            Some(("hooks/post.d", leaf)) => (Some(2), leaf),
            Some(_) => return Err(Error::Invalid(format!("control {control:?} cannot be installed"))),
            None => (None, control.as_str()),
        };
        let mode = if controls::is_hook(control) { 0o755 } else { 0o644 };
        match dir_index {
            Some(i) => write_file_at(&subdirs[i].0, leaf, bytes, mode, &subdirs[i].1)?,
            None => write_file_at(&cfd, leaf, bytes, mode, &ctl_path)?,
        }
    }
    for (fd, p) in subdirs.iter().rev() {
        sync(fd, p)?;
    }
    sync(&cfd, &ctl_path)?;
    sync(&sfd, &stage_path)?;
    sync(dir, shown)?;
    Ok(stage_name)
}

fn rename_noreplace(from_dir: &OwnedFd, from: &str, to_dir: &OwnedFd, to: &str, shown: &Path) -> Result<()> {
    rustix::fs::renameat_with(from_dir, from, to_dir, to, RenameFlags::NOREPLACE).map_err(|e| {
        if e == Errno::EXIST {
            Error::Conflict(format!("{} already exists", shown.join(to).display()))
        } else {
            Error::io("rename", shown.join(to), e.into())
        }
    })
}

/// Removes a hidden staging tree of `dir`. Returns it when it could not be removed.
fn remove_tree(dir: &Path, name: &str) -> Option<PathBuf> {
    let p = dir.join(name);
    match fs::remove_dir_all(&p) {
        Ok(()) => None,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(_) => Some(p),
    }
}

/// Moves `name` of `dir` out of sight (to a trash name), then deletes it.
fn discard(dir_fd: &OwnedFd, dir: &Path, name: &str) -> Result<()> {
    let trash = format!("{TRASH_PREFIX}{name}.{}", std::process::id());
    rename_noreplace(dir_fd, name, dir_fd, &trash, dir)?;
    sync(dir_fd, dir)?;
    let p = dir.join(&trash);
    let removed = if p.symlink_metadata().is_ok_and(|m| m.is_dir()) {
        fs::remove_dir_all(&p)
    } else {
        fs::remove_file(&p)
    };
    removed.map_err(|e| Error::io("remove", &p, e))?;
    sync(dir_fd, dir)
}

/// What an install did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Installed {
    /// The executable's path in storage.
    pub path: PathBuf,
    /// Residue of an earlier interrupted install or uninstall that was cleared first.
    pub cleared: Vec<PathBuf>,
}

/// Installs a checked object. The name must be absent (an orphan `<name>.d/` left by an
/// interrupted install or uninstall is residue and is cleared first).
pub fn install(storage: &Path, checked: &Checked, tier: Tier) -> Result<Installed> {
    existing(storage)?;
    let dir = class_dir(storage, checked.manifest.class, tier)?;
    install_into(&dir, checked)
}

/// Installs a checked object into `dir` (made when missing), as [`install`] does into its
/// class's directory: a model goes into `model/<provider>/`.
pub fn install_into(dir: &Path, checked: &Checked) -> Result<Installed> {
    let class = checked.manifest.class;
    let name = checked.manifest.name.as_str();
    let dir = dir.to_path_buf();
    ensure_dir(&dir)?;
    let dfd = open_dir(&dir)?;
    let ctl = format!("{name}.d");
    if exists_at(&dfd, name, &dir)? {
        return Err(Error::Conflict(format!(
            "{}/{name} is already installed in {}; use replace to change it",
            class.as_str(),
            dir.display()
        )));
    }
    let mut cleared = stale_stages(&dir, name);
    if exists_at(&dfd, &ctl, &dir)? {
        discard(&dfd, &dir, &ctl)?;
        cleared.push(dir.join(&ctl));
    }
    let stage_name = match stage(&dfd, &dir, checked) {
        Ok(s) => s,
        Err(e) => {
            clean_stages(&dir, name);
            return Err(e);
        }
    };
    let sfd = open_dir_at(&dfd, &stage_name, &dir.join(&stage_name))?;
    let published = rename_noreplace(&sfd, &ctl, &dfd, &ctl, &dir)
        .and_then(|()| sync(&dfd, &dir))
        .and_then(|()| rename_noreplace(&sfd, name, &dfd, name, &dir))
        .and_then(|()| sync(&dfd, &dir));
    if let Err(e) = published {
        // Take the controls back if they went out; the executable never did.
        if !exists_at(&dfd, name, &dir).unwrap_or(true) && exists_at(&sfd, &ctl, &dir).ok() == Some(false) {
            let _ = rename_noreplace(&dfd, &ctl, &sfd, &ctl, &dir);
        }
        clean_stages(&dir, name);
        let _ = sync(&dfd, &dir);
        return Err(e);
    }
    rustix::fs::unlinkat(&dfd, &stage_name, AtFlags::REMOVEDIR)
        .map_err(io("remove", &dir.join(&stage_name)))?;
    sync(&dfd, &dir)?;
    Ok(Installed { path: dir.join(name), cleared })
}

/// Removes staging directories of `name` left in `dir` by this or an earlier process.
fn clean_stages(dir: &Path, name: &str) -> Vec<PathBuf> {
    let prefix = format!("{STAGE_PREFIX}{name}.");
    let mut left = Vec::new();
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if n.starts_with(&prefix)
                && let Some(p) = remove_tree(dir, &n)
            {
                left.push(p);
            }
        }
    }
    left
}

/// The object a hidden staging or trash entry belongs to, and the pid that made it.
fn hidden_owner(entry: &str) -> Option<(&str, Option<i32>)> {
    if let Some(rest) = entry.strip_prefix(STAGE_PREFIX) {
        // <name>.<pid>.<nanos>
        let (front, _nanos) = rest.rsplit_once('.')?;
        let (name, pid) = front.rsplit_once('.')?;
        return Some((name, pid.parse().ok()));
    }
    let rest = entry.strip_prefix(TRASH_PREFIX)?;
    // <name>.<pid> or <name>.d.<pid>
    let (name, pid) = rest.rsplit_once('.')?;
    Some((name.strip_suffix(".d").unwrap_or(name), pid.parse().ok()))
}

/// Removes staging and trash entries of `name` whose process is gone; returns them.
fn stale_stages(dir: &Path, name: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = fs::read_dir(dir) else { return out };
    for e in entries.flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        let Some((owner, pid)) = hidden_owner(&n) else { continue };
        if owner != name {
            continue;
        }
        let alive = pid
            .and_then(rustix::process::Pid::from_raw)
            .is_some_and(|p| rustix::process::test_kill_process(p) != Err(Errno::SRCH));
        if alive {
            continue;
        }
        let p = dir.join(&n);
        let removed = if e.file_type().is_ok_and(|t| t.is_dir()) {
            fs::remove_dir_all(&p)
        } else {
            fs::remove_file(&p)
        };
        if removed.is_ok() {
            out.push(p);
        }
    }
    if !out.is_empty()
        && let Ok(fd) = open_dir(dir)
    {
        let _ = sync(&fd, dir);
    }
    out
}

/// Residue in a class directory: staging and trash directories, and controls without an
/// executable.
pub fn residue(storage: &Path, class: ObjectClass, tier: Tier) -> Result<Vec<PathBuf>> {
    let dir = class_dir(storage, class, tier)?;
    let mut out = Vec::new();
    let Ok(entries) = fs::read_dir(&dir) else { return Ok(out) };
    for e in entries.flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        if n.starts_with(STAGE_PREFIX) || n.starts_with(TRASH_PREFIX) {
            out.push(dir.join(&n));
        } else if let Some(obj) = n.strip_suffix(".d")
            && !dir.join(obj).exists()
        {
            out.push(dir.join(&n));
        }
    }
    out.sort();
    Ok(out)
}

/// Checks `name` and opens the directory its class lives in.
/// The directory holding `class/name`, open, and the object's name in it. A model is named
/// `PROVIDER/MODEL` and lives in `model/<provider>/`.
fn object_dir<'n>(
    storage: &Path,
    class: ObjectClass,
    name: &'n str,
    tier: Tier,
) -> Result<(PathBuf, OwnedFd, &'n str)> {
    let (dir, name) = if class == ObjectClass::Model {
        let (provider, model) = policy::model::check_name(name).map_err(Error::Invalid)?;
        (class_dir(storage, class, tier)?.join(provider), model)
    } else {
        policy::name::validate(name).map_err(|e| Error::Invalid(format!("invalid name {name:?}: {e}")))?;
        (class_dir(storage, class, tier)?, name)
    };
    let dfd = open_dir(&dir)?;
    Ok((dir, dfd, name))
}

/// One step of a plan, as shown by a dry run.
pub type Step = String;

/// Uninstalls `class/name`: the executable first, then its controls. With `dry_run`, only
/// returns the steps.
pub fn uninstall(
    storage: &Path,
    class: ObjectClass,
    name: &str,
    tier: Tier,
    dry_run: bool,
) -> Result<Vec<Step>> {
    let (dir, dfd, name) = object_dir(storage, class, name, tier)?;
    let ctl = format!("{name}.d");
    let has_exe = exists_at(&dfd, name, &dir)?;
    let has_ctl = exists_at(&dfd, &ctl, &dir)?;
    if !dry_run {
        stale_stages(&dir, name);
    }
    if !has_exe && !has_ctl {
        return Err(Error::Conflict(format!(
            "{}/{name} is not installed in {}",
            class.as_str(),
            dir.display()
        )));
    }
    let mut steps = Vec::new();
    if has_exe {
        steps.push(format!("remove {}", dir.join(name).display()));
    }
    if has_ctl {
        steps.push(format!("remove {}/", dir.join(&ctl).display()));
    }
    if dry_run {
        return Ok(steps);
    }
    if has_exe {
        discard(&dfd, &dir, name)?;
    }
    if has_ctl {
        discard(&dfd, &dir, &ctl)?;
    }
    Ok(steps)
}

/// Replaces an installed object with a checked new version, keeping the old one for
/// [`rollback`]. Controls are swapped first, the executable last, each atomically.
pub fn replace(storage: &Path, checked: &Checked, tier: Tier, dry_run: bool) -> Result<Vec<Step>> {
    let class = checked.manifest.class;
    let name = checked.manifest.name.as_str();
    let dir = class_dir(storage, class, tier)?;
    let dfd = open_dir(&dir)?;
    let ctl = format!("{name}.d");
    if !exists_at(&dfd, name, &dir)? || !exists_at(&dfd, &ctl, &dir)? {
        return Err(Error::Conflict(format!("{}/{name} is not installed; use install", class.as_str())));
    }
    let prev = format!("{PREV_PREFIX}{name}");
    let steps = vec![
        format!("stage {} {} on the destination filesystem", class.as_str(), name),
        format!("swap {}/ with the staged controls", dir.join(&ctl).display()),
        format!("swap {} with the staged executable", dir.join(name).display()),
        format!("keep the previous version in {}/", dir.join(&prev).display()),
    ];
    if dry_run {
        return Ok(steps);
    }
    if exists_at(&dfd, &prev, &dir)? {
        discard(&dfd, &dir, &prev)?;
    }
    let stage_name = stage(&dfd, &dir, checked).inspect_err(|_| {
        clean_stages(&dir, name);
    })?;
    let sfd = open_dir_at(&dfd, &stage_name, &dir.join(&stage_name))?;
    // The object's log is its history, not part of a version: it moves to the new controls
    // (the same file, so appends in flight land in it) and back if the swap fails.
    carry_log(&dfd, &sfd, &ctl, &dir)?;
    if let Err(e) = exchange(&sfd, &dfd, &ctl, &dir).and_then(|()| sync(&dfd, &dir)) {
        let _ = carry_log(&sfd, &dfd, &ctl, &dir);
        clean_stages(&dir, name);
        return Err(e);
    }
    if let Err(e) = exchange(&sfd, &dfd, name, &dir).and_then(|()| sync(&dfd, &dir)) {
        // Put the old controls back.
        let _ = exchange(&sfd, &dfd, &ctl, &dir);
        let _ = carry_log(&sfd, &dfd, &ctl, &dir);
        let _ = sync(&dfd, &dir);
        clean_stages(&dir, name);
        return Err(e);
    }
    rename_noreplace(&dfd, &stage_name, &dfd, &prev, &dir)?;
    sync(&dfd, &dir)?;
    Ok(steps)
}

/// Moves the runtime `log` of `<from>/<ctl>/` over the one in `<to>/<ctl>/` (a missing log is
/// left alone) and syncs both directories.
fn carry_log(from: &OwnedFd, to: &OwnedFd, ctl: &str, shown: &Path) -> Result<()> {
    let src = open_dir_at(from, ctl, &shown.join(ctl))?;
    let dst = open_dir_at(to, ctl, &shown.join(ctl))?;
    match rustix::fs::renameat(&src, "log", &dst, "log") {
        Ok(()) => {}
        Err(Errno::NOENT) => return Ok(()),
        Err(e) => return Err(io("move the log of", &shown.join(ctl))(e)),
    }
    sync(&dst, &shown.join(ctl))?;
    sync(&src, &shown.join(ctl))
}

fn exchange(a_dir: &OwnedFd, b_dir: &OwnedFd, name: &str, shown: &Path) -> Result<()> {
    rustix::fs::renameat_with(a_dir, name, b_dir, name, RenameFlags::EXCHANGE)
        .map_err(io("exchange", &shown.join(name)))
}

/// Swaps back to the version kept by the last [`replace`].
pub fn rollback(
    storage: &Path,
    class: ObjectClass,
    name: &str,
    tier: Tier,
    dry_run: bool,
) -> Result<Vec<Step>> {
    let (dir, dfd, name) = object_dir(storage, class, name, tier)?;
    let prev = format!("{PREV_PREFIX}{name}");
    let ctl = format!("{name}.d");
    if !exists_at(&dfd, &prev, &dir)? {
        return Err(Error::Conflict(format!(
            "{}/{name} has no previous version to roll back to",
            class.as_str()
        )));
    }
    let steps = vec![
        format!("swap {}/ with the previous controls", dir.join(&ctl).display()),
        format!("swap {} with the previous executable", dir.join(name).display()),
    ];
    if dry_run {
        return Ok(steps);
    }
    let pfd = open_dir_at(&dfd, &prev, &dir.join(&prev))?;
    carry_log(&dfd, &pfd, &ctl, &dir)?;
    exchange(&pfd, &dfd, &ctl, &dir)?;
    sync(&dfd, &dir)?;
    exchange(&pfd, &dfd, name, &dir)?;
    sync(&dfd, &dir)?;
    Ok(steps)
}

/// What `inspect` reports of an object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inspection {
    /// The executable's path.
    pub path: PathBuf,
    /// Whether the object exists (its executable does).
    pub installed: bool,
    /// Control names under `<name>.d/`, relative, sorted.
    pub controls: Vec<String>,
    /// A previous version is kept for rollback.
    pub has_previous: bool,
    /// Residue that concerns this name.
    pub residue: Vec<PathBuf>,
}

/// Describes `class/name` in storage.
pub fn inspect(storage: &Path, class: ObjectClass, name: &str, tier: Tier) -> Result<Inspection> {
    policy::name::validate(name).map_err(|e| Error::Invalid(format!("invalid name {name:?}: {e}")))?;
    let dir = class_dir(storage, class, tier)?;
    let path = dir.join(name);
    let installed = fs::symlink_metadata(&path).is_ok();
    let mut controls = Vec::new();
    let ctl = dir.join(format!("{name}.d"));
    let mut stack = vec![(ctl.clone(), String::new())];
    while let Some((d, rel)) = stack.pop() {
        let Ok(entries) = fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            let r = if rel.is_empty() { n.clone() } else { format!("{rel}/{n}") };
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push((d.join(&n), r));
            } else {
                controls.push(r);
            }
        }
    }
    controls.sort();
    let has_previous = dir.join(format!("{PREV_PREFIX}{name}")).exists();
    let residue = residue(storage, class, tier)?
        .into_iter()
        .filter(|p| {
            let n = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            n == format!("{name}.d") || hidden_owner(&n).is_some_and(|(owner, _)| owner == name)
        })
        .collect();
    Ok(Inspection { path, installed, controls, has_previous, residue })
}

/// Stages a generated object (`exe` and `controls`) with its `cortexfs.object/v2` manifest in
/// the new directory `stage` (0700), and checks it, digests included, as an install would.
pub fn stage_generated(
    class: ObjectClass,
    name: &str,
    exe: &[u8],
    controls: &std::collections::BTreeMap<String, Vec<u8>>,
    stage: &Path,
) -> Result<Checked> {
    use sha2::{Digest, Sha256};
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let hex = |b: &[u8]| format!("{:x}", Sha256::digest(b));
    fs::DirBuilder::new().mode(0o700).create(stage).map_err(|e| Error::io("mkdir", stage, e))?;
    let write = |rel: &str, bytes: &[u8], mode: u32| -> Result<()> {
        let p = stage.join(rel);
        fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&p)
            .and_then(|mut f| {
                f.write_all(bytes)?;
                f.set_permissions(fs::Permissions::from_mode(mode))
            })
            .map_err(|e| Error::io("write", &p, e))
    };
    write("exe", exe, 0o755)?;
    let d = stage.join("d");
    fs::DirBuilder::new().mode(0o700).create(&d).map_err(|e| Error::io("mkdir", &d, e))?;
    let mut manifest_controls = serde_json::Map::new();
    for (control, bytes) in controls {
        write(&format!("d/{control}"), bytes, 0o644)?;
        manifest_controls.insert(
            control.clone(),
            serde_json::json!({"path": format!("d/{control}"), "sha256": hex(bytes)}),
        );
    }
    let manifest = serde_json::json!({
        "schema": policy::manifest::SCHEMA,
        "version": env!("CARGO_PKG_VERSION"),
        "compatibility": {"cortexfs": format!(">={}", env!("CARGO_PKG_VERSION"))},
        "class": class.as_str(),
        "name": name,
        "executable": {"path": "exe", "sha256": hex(exe)},
        "controls": manifest_controls,
    });
    let bytes = serde_json::to_vec_pretty(&manifest).map_err(|e| Error::Unchecked(e.to_string()))?;
    write("manifest.json", &bytes, 0o644)?;
    super::check(&stage.join("manifest.json")).map_err(|problems| {
        let why: Vec<String> = problems.iter().map(ToString::to_string).collect();
        Error::Unchecked(format!("{}/{name}: generated manifest: {}", class.as_str(), why.join("; ")))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};

    fn hex(b: &[u8]) -> String {
        Sha256::digest(b).iter().map(|x| format!("{x:02x}")).collect()
    }

    /// Writes a package directory with a manifest for `name` at `version`; returns the manifest.
    fn package(dir: &Path, name: &str, version: &str, body: &str) -> PathBuf {
        fs::create_dir_all(dir.join("bin")).unwrap();
        let exe = format!("#!/bin/sh\necho {body}\n");
        fs::write(dir.join("bin/tool"), &exe).unwrap();
        fs::set_permissions(dir.join("bin/tool"), fs::Permissions::from_mode(0o755)).unwrap();
        let hook = b"#!/bin/sh\nexit 0\n";
        fs::write(dir.join("hook"), hook).unwrap();
        fs::set_permissions(dir.join("hook"), fs::Permissions::from_mode(0o755)).unwrap();
        let m = format!(
            r#"{{"schema":"cortexfs.object/v2","version":"{version}","compatibility":{{"cortexfs":"*"}},
            "class":"tool","name":"{name}","executable":{{"path":"bin/tool","sha256":"{}"}},
            "controls":{{"description":{{"text":"{body}\n"}},"policy":{{"text":"allow a_t tool:{name} execute\n"}},
            "hooks/pre.d/10-check":{{"path":"hook","sha256":"{}"}}}}}}"#,
            hex(exe.as_bytes()),
            hex(hook)
        );
        let p = dir.join(format!("{name}.manifest.json"));
        fs::write(&p, m).unwrap();
        p
    }

    #[test]
    fn install_uninstall_cycle() {
        let d = tempfile::tempdir().unwrap();
        let storage = d.path().join("storage");
        let m = package(&d.path().join("pkg"), "hello", "1.0.0", "one");
        let checked = super::super::check(&m).unwrap();
        assert!(matches!(install(&storage, &checked, Tier::System), Err(Error::NoStorage { .. })));
        assert!(!storage.exists(), "an install never creates a storage");
        fs::create_dir(&storage).unwrap();
        let done = install(&storage, &checked, Tier::System).unwrap();
        assert_eq!(done.path, storage.join("tool/hello"));
        let mode = fs::metadata(&done.path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o755);
        assert_eq!(fs::read_to_string(storage.join("tool/hello.d/name")).unwrap(), "hello\n");
        assert_eq!(fs::read_to_string(storage.join("tool/hello.d/description")).unwrap(), "one\n");
        let hook = fs::metadata(storage.join("tool/hello.d/hooks/pre.d/10-check")).unwrap();
        assert_eq!(hook.permissions().mode() & 0o777, 0o755);
        let i = inspect(&storage, ObjectClass::Tool, "hello", Tier::System).unwrap();
        assert!(i.installed && i.residue.is_empty());
        assert_eq!(i.controls, ["description", "hooks/pre.d/10-check", "log", "name", "policy", "status"]);
        // Never replaces.
        assert!(matches!(install(&storage, &checked, Tier::System), Err(Error::Conflict(_))));
        // Dry run changes nothing.
        let steps = uninstall(&storage, ObjectClass::Tool, "hello", Tier::System, true).unwrap();
        assert_eq!(steps.len(), 2);
        assert!(storage.join("tool/hello").exists());
        uninstall(&storage, ObjectClass::Tool, "hello", Tier::System, false).unwrap();
        assert!(!storage.join("tool/hello").exists() && !storage.join("tool/hello.d").exists());
        assert_eq!(fs::read_dir(storage.join("tool")).unwrap().count(), 0, "nothing left behind");
        assert!(matches!(
            uninstall(&storage, ObjectClass::Tool, "hello", Tier::System, false),
            Err(Error::Conflict(_))
        ));
    }

    #[test]
    fn orphan_controls_are_cleared_by_the_next_install() {
        let d = tempfile::tempdir().unwrap();
        let storage = d.path().join("storage");
        fs::create_dir_all(storage.join("tool/hello.d")).unwrap();
        fs::write(storage.join("tool/hello.d/junk"), b"x").unwrap();
        assert_eq!(
            residue(&storage, ObjectClass::Tool, Tier::System).unwrap(),
            [storage.join("tool/hello.d")]
        );
        let m = package(&d.path().join("pkg"), "hello", "1.0.0", "one");
        let done = install(&storage, &super::super::check(&m).unwrap(), Tier::System).unwrap();
        assert_eq!(done.cleared, [storage.join("tool/hello.d")]);
        assert!(!storage.join("tool/hello.d/junk").exists());
    }

    #[test]
    fn replace_and_rollback() {
        let d = tempfile::tempdir().unwrap();
        let storage = d.path().join("storage");
        fs::create_dir(&storage).unwrap();
        let v1 = super::super::check(&package(&d.path().join("v1"), "hello", "1.0.0", "one")).unwrap();
        let v2 = super::super::check(&package(&d.path().join("v2"), "hello", "2.0.0", "two")).unwrap();
        assert!(replace(&storage, &v2, Tier::System, false).is_err());
        install(&storage, &v1, Tier::System).unwrap();
        replace(&storage, &v2, Tier::System, true).unwrap();
        assert_eq!(fs::read_to_string(storage.join("tool/hello.d/description")).unwrap(), "one\n");
        // The log is the object's history: the same file stays in place across versions.
        fs::write(storage.join("tool/hello.d/log"), "{\"n\":1}\n").unwrap();
        let ino = |p: &Path| std::os::unix::fs::MetadataExt::ino(&fs::metadata(p).unwrap());
        let log_ino = ino(&storage.join("tool/hello.d/log"));
        replace(&storage, &v2, Tier::System, false).unwrap();
        assert_eq!(fs::read_to_string(storage.join("tool/hello.d/description")).unwrap(), "two\n");
        assert!(fs::read_to_string(storage.join("tool/hello")).unwrap().contains("two"));
        assert_eq!(fs::read_to_string(storage.join("tool/hello.d/log")).unwrap(), "{\"n\":1}\n");
        assert_eq!(ino(&storage.join("tool/hello.d/log")), log_ino);
        rollback(&storage, ObjectClass::Tool, "hello", Tier::System, false).unwrap();
        assert_eq!(fs::read_to_string(storage.join("tool/hello.d/description")).unwrap(), "one\n");
        assert!(fs::read_to_string(storage.join("tool/hello")).unwrap().contains("one"));
        assert_eq!(ino(&storage.join("tool/hello.d/log")), log_ino);
    }

    #[test]
    fn tiers() {
        let s = Path::new("/s");
        assert_eq!(
            class_dir(s, ObjectClass::Tool, Tier::User { uid: 1000 }).unwrap(),
            Path::new("/s/home/1000/tool")
        );
        assert_eq!(class_dir(s, ObjectClass::Agent, Tier::System).unwrap(), Path::new("/s/agent"));
        assert!(class_dir(s, ObjectClass::Agent, Tier::User { uid: 1 }).is_err());
    }
}
