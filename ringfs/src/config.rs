//! Configuration generations: the storage's objects and their controls as a git repository,
//! and the one commit that is served (spec: "Git and activation semantics").
//!
//! The storage directory is the work tree: edits made there (by hand, through the host view
//! of `/ctx`, by `ctx` commands) are staged, never authoritative. What agents are served and
//! what launches read is the *active generation*: the tree of one commit, checked out under
//! `/run/cortexfs/generation/<storage>/generation/<commit>/` ([`generations_dir`]) and named
//! by the symlink `active` beside it,
//! which is replaced in one `rename`. A commit is the only way a generation becomes active:
//! [`commit`] (all staged changes, or only those below some paths) checks every control it
//! takes in, writes the commit, checks its tree out and then swaps `active`; a restart serves
//! the commit `HEAD` names ([`ensure`]), whatever the work tree holds.
//!
//! Versioned: every regular file and directory below `tool/`, `agent/` and `model/` but
//! dot names (staging residue), sockets and the runtime controls (`log`, `status`, `pid`):
//! append-only state never waits on a commit. Git keeps contents and the execute bit; the
//! rest of each entry's mode and its owner are kept in the tree's `.owners` file (`MODE UID
//! GID PATH` per line, directories included, so an empty directory is a generation's too).
//!
//! The repository is `<storage>/.cortexfs/config.git` (bare, root's alone); commits are
//! serialized by a lock on `<storage>/.cortexfs/config.lock`.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use gix::bstr::ByteSlice;
use policy::controls::{self, ObjectClass, Owner};

/// The directory of CortexFS's own state inside a storage (hidden from every view).
pub const DIR: &str = ".cortexfs";
const REPO: &str = "config.git";
const GENERATIONS: &str = "generation";
const LOCK: &str = "config.lock";
/// The name of the active generation's symlink in the generations directory.
pub const ACTIVE: &str = "active";
/// The tree file holding every entry's mode and owner.
pub const OWNERS: &str = ".owners";
/// The versioned class directories.
pub const CLASSES: [&str; 3] = ["tool", "agent", "model"];
/// Where package records are in the repository (`package/<name>.json`), which live at
/// [`crate::object::package::RECORDS`] in the storage, outside the root ABI.
pub const PACKAGES: &str = "package";

/// The storage path of the repository path `rel`: a package record's is below
/// [`crate::object::package::RECORDS`]; every other is the same.
pub fn storage_path(storage: &Path, rel: &str) -> PathBuf {
    match rel.strip_prefix(PACKAGES) {
        Some("") => storage.join(crate::object::package::RECORDS),
        Some(rest) if rest.starts_with('/') => storage.join(crate::object::package::RECORDS).join(&rest[1..]),
        _ => storage.join(rel),
    }
}
/// Generations kept checked out: the active one and those before it (views may still be
/// reading one they opened).
const KEPT: usize = 3;
/// How many checked-out generations there are when the oldest are removed.
const PRUNED_AT: usize = 8;

/// What went wrong with the configuration repository.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file system operation failed.
    #[error("{what}: {path}: {source}")]
    Io {
        /// The operation.
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The repository refused an operation.
    #[error("configuration repository: {0}")]
    Git(String),
    /// Staged controls that do not parse: nothing was committed.
    #[error("not committed: {}", .0.join("; "))]
    Invalid(Vec<String>),
    /// A revision that names no generation.
    #[error("no generation {0}")]
    NoRevision(String),
}

/// The result of this module's operations.
pub type Result<T> = std::result::Result<T, Error>;

fn git(e: impl std::fmt::Display) -> Error {
    Error::Git(e.to_string())
}

fn io_at<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> Error + 'a {
    move |source| Error::Io { what, path: path.to_path_buf(), source }
}

/// One versioned entry: a directory, or a file with its bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// `st_mode` (type and permission bits).
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// A file's contents; `None` for a directory.
    pub bytes: Option<Vec<u8>>,
}

/// A configuration tree: storage-relative path to entry.
pub type Tree = BTreeMap<String, Entry>;

/// A generation: one commit of the configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Generation {
    /// The commit's id (hex).
    pub id: String,
    /// When it was made (seconds since the epoch).
    pub time: i64,
    /// Who made it.
    pub who: String,
    /// What it changed, as its maker said.
    pub message: String,
}

/// One staged change against the active generation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    /// `A` added, `M` modified (contents, mode or owner), `D` deleted.
    pub kind: char,
    /// The storage-relative path.
    pub path: String,
}

/// The repository's directory.
pub fn repo_dir(storage: &Path) -> PathBuf {
    storage.join(DIR).join(REPO)
}

/// Where checked-out generations live: derived state, rebuilt from the repository whenever
/// it is missing, so it is kept in memory (`/run`) rather than written to the storage's disk
/// at every commit.
pub const GENERATIONS_ROOT: &str = "/run/cortexfs/generation";

/// The options of the generations' filesystem: root's alone, and at most a quarter of the
/// host's memory (checked-out generations share unchanged files, so this bounds roughly one
/// copy of every storage's configuration).
const GENERATIONS_OPTIONS: &std::ffi::CStr = c"mode=0700,size=25%";

/// Makes sure [`GENERATIONS_ROOT`] is a memory filesystem: where `/run` is one (as on most
/// hosts) nothing is done; where it is a disk's, root mounts a tmpfs there (mode 0700,
/// `nosuid,nodev`, at most a quarter of RAM) once, under a lock. On a disk, each directory a
/// checkout makes costs a journal transaction and often a bitmap read: a commit's checkout took
/// 4 to 10 times as long. What earlier checkouts left on the disk is hidden by the mount, then
/// removed through the directory opened before it; derived state only (a reboot loses it too):
/// every generation is checked out again from the repository when missing. Where the mount
/// fails, nothing is removed and generations stay on the disk.
pub fn prepare_generations() {
    const TMPFS_MAGIC: rustix::fs::FsWord = 0x0102_1994;
    let root = Path::new(GENERATIONS_ROOT);
    let on_tmpfs = |p: &Path| rustix::fs::statfs(p).is_ok_and(|s| s.f_type == TMPFS_MAGIC);
    if on_tmpfs(root) || !rustix::process::geteuid().is_root() {
        return;
    }
    let Some(parent) = root.parent() else { return };
    if fs::create_dir_all(parent).is_err() {
        return;
    }
    let lock = parent.join(".generation.lock");
    let Ok(f) = fs::OpenOptions::new().create(true).append(true).mode(0o600).open(&lock) else { return };
    if rustix::fs::flock(&f, rustix::fs::FlockOperation::LockExclusive).is_err() || on_tmpfs(root) {
        return;
    }
    if !root.is_dir() && fs::create_dir(root).is_err() {
        return;
    }
    // The disk's directory, still reachable once the tmpfs hides it.
    let under = crate::beneath::Tree::open(root).ok();
    use rustix::mount::MountFlags;
    match rustix::mount::mount(
        "cortexfs-generations",
        root,
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NODEV,
        GENERATIONS_OPTIONS,
    ) {
        Ok(()) => {
            tracing::info!(dir = %root.display(), "configuration generations kept in memory (tmpfs)");
            if let Some(t) = under {
                for n in t.names(1 << 16).unwrap_or_default() {
                    let _ = t.remove_all(&n);
                }
            }
        }
        Err(e) => tracing::warn!(dir = %root.display(), error = %e, "configuration generations stay on disk"),
    }
}

/// The directory holding the checked-out generations of `storage`:
/// `/run/cortexfs/generation/<the first 16 hex digits of the SHA-256 of its canonical path>`.
pub fn generations_dir(storage: &Path) -> PathBuf {
    use sha2::Digest;
    use std::os::unix::ffi::OsStrExt;
    let canonical = fs::canonicalize(storage).unwrap_or_else(|_| storage.to_path_buf());
    let digest = sha2::Sha256::digest(canonical.as_os_str().as_bytes());
    let name: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    Path::new(GENERATIONS_ROOT).join(name).join(GENERATIONS)
}

/// The active generation's directory (through its symlink), when the storage has one: where
/// configuration is read from. `None` for a storage that was never made a repository.
pub fn active(storage: &Path) -> Option<PathBuf> {
    let link = generations_dir(storage).join(ACTIVE);
    let target = fs::read_link(&link).ok()?;
    let dir = generations_dir(storage).join(target);
    dir.is_dir().then_some(dir)
}

/// Whether the storage's configuration is a repository with a commit (then agents are served
/// its active generation, and only a commit changes what they see). One being made (its first
/// commit not written yet, as while a daemon takes an existing storage in) is not one yet.
pub fn is_repository(storage: &Path) -> bool {
    let dir = repo_dir(storage);
    let Ok(head) = fs::read_to_string(dir.join("HEAD")) else { return false };
    let head = head.trim();
    match head.strip_prefix("ref: ") {
        Some(r) if r.starts_with("refs/") && !r.contains("..") => {
            dir.join(r).is_file()
                || fs::read_to_string(dir.join("packed-refs"))
                    .is_ok_and(|p| p.lines().any(|l| l.split_once(' ').is_some_and(|(_, n)| n == r)))
        }
        Some(_) => false,
        None => !head.is_empty(),
    }
}

/// Whether the storage's configuration is a repository or is becoming one (its first commit
/// under way): a command's own change then waits for it and is committed.
pub fn has_repository(storage: &Path) -> bool {
    repo_dir(storage).join("HEAD").is_file()
}

/// The active generation's commit id, when there is one.
pub fn active_id(storage: &Path) -> Option<String> {
    let link = fs::read_link(generations_dir(storage).join(ACTIVE)).ok()?;
    link.to_str().map(str::to_owned)
}

/// Where configuration at storage path `rel` is read from: the active generation when the
/// storage has one, else the storage itself.
pub fn read_root(storage: &Path) -> PathBuf {
    active(storage).unwrap_or_else(|| storage.to_path_buf())
}

/// Reads at most `max` bytes of the regular file `rel` beneath `root` (a generation, or a
/// host mount of the storage), never through a symlink and never blocking on anything but a
/// regular file. Unlike [`crate::beneath::Tree`], a file with more than one name is read: a
/// generation shares its unchanged files with the one before it by hard links, all of them
/// root's own checkout.
pub fn read_config(root: &Path, rel: &Path, max: u64) -> io::Result<Vec<u8>> {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    use std::io::Read;
    let dir = rustix::fs::open(root, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
    let fd = rustix::fs::openat2(
        &dir,
        rel,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )?;
    let f = fs::File::from(fd);
    if !f.metadata()?.is_file() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a regular file"));
    }
    let mut out = Vec::new();
    f.take(max).read_to_end(&mut out)?;
    Ok(out)
}

/// Whether an entry of a class directory named `name` is versioned (not a dot name, not a
/// socket): what makes a storage hold configuration.
pub fn tracked_name(name: &str) -> bool {
    !name.starts_with('.') && !name.ends_with(".sock")
}

/// Whether the repository path `rel` is versioned configuration: below a class directory
/// (the same path in the storage), or a package record (`package/NAME.json`, see
/// [`storage_path`]).
pub fn tracked(rel: &str) -> bool {
    if let Some(name) = rel.strip_prefix(PACKAGES).and_then(|r| r.strip_prefix('/')) {
        return !name.is_empty() && !name.contains('/') && !name.starts_with('.') && name.ends_with(".json");
    }
    if rel == PACKAGES {
        return true;
    }
    let parts: Vec<&str> = rel.split('/').collect();
    if !CLASSES.contains(&parts[0]) || parts.iter().any(|p| p.is_empty() || p.starts_with('.')) {
        return false;
    }
    let last = parts[parts.len() - 1];
    if parts.len() > 1 && last.ends_with(".sock") {
        return false;
    }
    !matches!(control_of(rel), Some((class, _, c)) if controls::classify(class, &c) == Some(Owner::Runtime))
}

/// The object class, object name and control name of a control's path
/// (`agent/x.d/policy`, `model/p/m.d/cap`, `tool/t.d/hooks/pre.d/h`).
pub fn control_of(rel: &str) -> Option<(ObjectClass, String, String)> {
    let parts: Vec<&str> = rel.split('/').collect();
    let class = ObjectClass::parse(parts[0])?;
    let i = parts.iter().position(|p| p.ends_with(".d"))?;
    if i == 0 || i + 1 >= parts.len() {
        return None;
    }
    let object = parts[1..=i].join("/");
    let object = object.strip_suffix(".d")?.to_owned();
    Some((class, object, parts[i + 1..].join("/")))
}

fn in_scope(rel: &str, scope: Option<&[String]>) -> bool {
    scope.is_none_or(|s| {
        s.iter()
            .any(|p| rel == p || (rel.starts_with(p.as_str()) && rel.as_bytes().get(p.len()) == Some(&b'/')))
    })
}

/// The work tree's configuration below `storage` (all of it, or the paths in `scope` and
/// what is below them), as it is now.
pub fn staged(storage: &Path, scope: Option<&[String]>) -> Result<Tree> {
    let mut tree = Tree::new();
    fn walk(root: &Path, rel: &str, scope: Option<&[String]>, tree: &mut Tree) -> Result<()> {
        let at = root.join(rel);
        let rd = match fs::read_dir(&at) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io_at("read directory", &at)(e)),
        };
        for e in rd {
            let e = e.map_err(io_at("read directory", &at))?;
            let Some(name) = e.file_name().to_str().map(str::to_owned) else { continue };
            let child = if rel.is_empty() { name } else { format!("{rel}/{name}") };
            if !tracked(&child) {
                continue;
            }
            let meta = fs::symlink_metadata(e.path()).map_err(io_at("stat", &e.path()))?;
            let inside = in_scope(&child, scope);
            // Directories above the scope are walked through and taken themselves, not what else is below them.
            let above =
                !inside && scope.is_some_and(|s| s.iter().any(|p| p.starts_with(&format!("{child}/"))));
            if meta.is_dir() {
                // Directories above the scope are taken too: a new object's parent (a
                // model's provider) comes with it.
                if inside || above {
                    tree.insert(
                        child.clone(),
                        Entry { mode: meta.mode(), uid: meta.uid(), gid: meta.gid(), bytes: None },
                    );
                }
                if inside || above {
                    walk(root, &child, scope, tree)?;
                }
            } else if meta.is_file() && inside {
                let bytes = read_regular(&e.path())?;
                tree.insert(
                    child,
                    Entry { mode: meta.mode(), uid: meta.uid(), gid: meta.gid(), bytes: Some(bytes) },
                );
            } else if meta.is_symlink() && inside {
                // A symlink (a model alias): its target is its contents.
                use std::os::unix::ffi::OsStrExt;
                let target = fs::read_link(e.path()).map_err(io_at("read link", &e.path()))?;
                tree.insert(
                    child,
                    Entry {
                        mode: meta.mode(),
                        uid: meta.uid(),
                        gid: meta.gid(),
                        bytes: Some(target.as_os_str().as_bytes().to_vec()),
                    },
                );
            }
        }
        Ok(())
    }
    for class in CLASSES {
        let meta = match fs::symlink_metadata(storage.join(class)) {
            Ok(m) if m.is_dir() => m,
            _ => continue,
        };
        take_top(&mut tree, class, &meta, scope);
        walk(storage, class, scope, &mut tree)?;
    }
    // Package records: `<name>.json` regular files, versioned as `package/<name>.json`.
    let records = storage.join(crate::object::package::RECORDS);
    if let Ok(meta) = fs::symlink_metadata(&records)
        && meta.is_dir()
    {
        take_top(&mut tree, PACKAGES, &meta, scope);
        for e in fs::read_dir(&records).map_err(io_at("read directory", &records))? {
            let e = e.map_err(io_at("read directory", &records))?;
            let Some(name) = e.file_name().to_str().map(str::to_owned) else { continue };
            let rel = format!("{PACKAGES}/{name}");
            if name.starts_with('.') || !name.ends_with(".json") || !in_scope(&rel, scope) {
                continue;
            }
            let meta = fs::symlink_metadata(e.path()).map_err(io_at("stat", &e.path()))?;
            if meta.is_file() {
                let bytes = read_regular(&e.path())?;
                tree.insert(
                    rel,
                    Entry { mode: meta.mode(), uid: meta.uid(), gid: meta.gid(), bytes: Some(bytes) },
                );
            }
        }
    }
    Ok(tree)
}

/// Takes the top directory `name` (a class directory, `package`) into `tree` when it is in
/// `scope` or above it: a new object's parent comes with it.
fn take_top(tree: &mut Tree, name: &str, meta: &fs::Metadata, scope: Option<&[String]>) {
    let above = scope.is_some_and(|s| s.iter().any(|p| p.starts_with(&format!("{name}/"))));
    if in_scope(name, scope) || above {
        tree.insert(name.into(), Entry { mode: meta.mode(), uid: meta.uid(), gid: meta.gid(), bytes: None });
    }
}

/// The largest object file a generation takes.
pub const FILE_MAX: u64 = 1 << 30;

/// Reads the regular file at `path`, never through a symlink, at most [`FILE_MAX`] bytes.
fn read_regular(path: &Path) -> Result<Vec<u8>> {
    use io::Read;
    let f = fs::OpenOptions::new()
        .read(true)
        .custom_flags((rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::NONBLOCK).bits() as i32)
        .open(path)
        .map_err(io_at("open", path))?;
    if !f.metadata().map_err(io_at("stat", path))?.is_file() {
        return Err(io_at("read", path)(io::Error::new(io::ErrorKind::InvalidInput, "not a regular file")));
    }
    let mut out = Vec::new();
    f.take(FILE_MAX + 1).read_to_end(&mut out).map_err(io_at("read", path))?;
    if out.len() as u64 > FILE_MAX {
        return Err(io_at("read", path)(io::Error::new(io::ErrorKind::FileTooLarge, "over 1 GiB")));
    }
    Ok(out)
}

fn is_link(mode: u32) -> bool {
    mode & libc_ifmt() == 0o120000
}

/// Every control in `tree` that does not parse, as `path: why`.
pub fn invalid(tree: &Tree) -> Vec<String> {
    let mut out = Vec::new();
    for (rel, e) in tree {
        let (Some(bytes), Some((class, object, control))) = (&e.bytes, control_of(rel)) else { continue };
        if controls::classify(class, &control).is_none() {
            continue;
        }
        // A model's own name is its last part (`model/local/m1.d/name` holds `m1`).
        let object = object.rsplit_once('/').map_or(object.as_str(), |(_, n)| n);
        if let Err(why) = controls::validate(class, object, &control, bytes) {
            out.push(format!("{rel}: {why}"));
        }
    }
    out
}

fn owners_text(tree: &Tree) -> String {
    let mut s = String::new();
    for (rel, e) in tree {
        s.push_str(&format!("{:o} {} {} {rel}\n", e.mode, e.uid, e.gid));
    }
    s
}

/// The `.owners` file's lines, by path.
fn parse_owners(text: &str) -> BTreeMap<String, (u32, u32, u32)> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let mut f = line.splitn(4, ' ');
        let (Some(m), Some(u), Some(g), Some(p)) = (f.next(), f.next(), f.next(), f.next()) else { continue };
        let (Ok(m), Ok(u), Ok(g)) = (u32::from_str_radix(m, 8), u.parse(), g.parse()) else { continue };
        if tracked(p) {
            out.insert(p.to_owned(), (m, u, g));
        }
    }
    out
}

fn open_repo(storage: &Path) -> Result<Option<gix::Repository>> {
    let dir = repo_dir(storage);
    if !dir.join("HEAD").exists() {
        return Ok(None);
    }
    gix::open(&dir).map(Some).map_err(git)
}

fn head_commit(repo: &gix::Repository) -> Option<gix::Commit<'_>> {
    repo.head_commit().ok()
}

/// The tree of commit `id`.
pub fn read_tree(storage: &Path, id: &str) -> Result<Tree> {
    let repo = open_repo(storage)?.ok_or_else(|| Error::NoRevision(id.into()))?;
    let oid = gix::ObjectId::from_hex(id.as_bytes()).map_err(|_| Error::NoRevision(id.into()))?;
    tree_of(&repo, oid)
}

fn tree_of(repo: &gix::Repository, commit: gix::ObjectId) -> Result<Tree> {
    let commit = repo.find_commit(commit).map_err(git)?;
    let tree = commit.tree().map_err(git)?;
    let mut rec = gix::traverse::tree::Recorder::default();
    tree.traverse().breadthfirst(&mut rec).map_err(git)?;
    let mut files = BTreeMap::new();
    let mut owners = BTreeMap::new();
    for r in rec.records {
        if !r.mode.is_blob_or_symlink() {
            continue;
        }
        let data = repo.find_object(r.oid).map_err(git)?.data.clone();
        let path = r.filepath.to_str_lossy().into_owned();
        if path == OWNERS {
            owners = parse_owners(&String::from_utf8_lossy(&data));
        } else if tracked(&path) {
            let mode = if r.mode.is_link() {
                0o120777
            } else if r.mode.is_executable() {
                0o100755
            } else {
                0o100644
            };
            files.insert(path, (mode, data));
        }
    }
    let mut out = Tree::new();
    for (path, (mode, uid, gid)) in owners {
        let bytes = files.remove(&path).map(|(_, b)| b);
        if (mode & libc_ifmt()) == 0o040000 || bytes.is_some() {
            out.insert(path, Entry { mode, uid, gid, bytes });
        }
    }
    // Files without an owner line: root's, mode from git.
    for (path, (mode, bytes)) in files {
        out.insert(path, Entry { mode, uid: 0, gid: 0, bytes: Some(bytes) });
    }
    Ok(out)
}

const fn libc_ifmt() -> u32 {
    0o170000
}

struct Locked {
    _file: fs::File,
}

fn lock(storage: &Path) -> Result<Locked> {
    prepare_generations();
    let dir = storage.join(DIR);
    fs::create_dir_all(&dir).map_err(io_at("create", &dir))?;
    let _ = fs::set_permissions(&dir, fs::Permissions::from_mode(0o700));
    let p = dir.join(LOCK);
    let f = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&p)
        .map_err(io_at("open", &p))?;
    rustix::fs::flock(&f, rustix::fs::FlockOperation::LockExclusive)
        .map_err(|e| io_at("lock", &p)(e.into()))?;
    Ok(Locked { _file: f })
}

/// What a commit is made of.
#[derive(Clone, Debug)]
pub struct Commit<'a> {
    /// What changed and why.
    pub message: &'a str,
    /// Who: a person (`root`, `uid 1000`) or an agent run.
    pub who: &'a str,
    /// Only the staged changes below these storage paths; `None` for all of them.
    pub only: Option<&'a [String]>,
}

/// Writes `bytes` as a blob, unless the repository has it already: hashed first, so that an
/// object it holds (an unchanged tool, the same executable under many names) is not compressed
/// and written again.
fn put_blob(repo: &gix::Repository, bytes: &[u8]) -> Result<gix::ObjectId> {
    let id = gix::objs::compute_hash(repo.object_hash(), gix::object::Kind::Blob, bytes).map_err(git)?;
    if repo.has_object(id) {
        return Ok(id);
    }
    Ok(repo.write_blob(bytes).map_err(git)?.detach())
}

fn write_commit(repo: &gix::Repository, tree: &Tree, message: &str, who: &str) -> Result<String> {
    let mut editor = repo.empty_tree().edit().map_err(git)?;
    // Files whose bytes another entry has (the core tools are one executable under many
    // names) are hashed once: compared byte for byte with the ones of the same length.
    let mut seen: HashMap<usize, Vec<(&[u8], gix::ObjectId)>> = HashMap::new();
    for (rel, e) in tree {
        let Some(bytes) = &e.bytes else { continue };
        let same = seen.get(&bytes.len()).and_then(|v| v.iter().find(|(b, _)| *b == bytes.as_slice()));
        let blob = match same {
            Some((_, id)) => *id,
            None => {
                let id = put_blob(repo, bytes)?;
                seen.entry(bytes.len()).or_default().push((bytes, id));
                id
            }
        };
        editor.upsert(rel.as_str(), kind_of(e.mode), blob).map_err(git)?;
    }
    let owners = repo.write_blob(owners_text(tree).as_bytes()).map_err(git)?.detach();
    editor.upsert(OWNERS, gix::object::tree::EntryKind::Blob, owners).map_err(git)?;
    let tree_id = editor.write().map_err(git)?.detach();
    commit_tree(repo, tree_id, message, who)
}

fn commit_tree(repo: &gix::Repository, tree_id: gix::ObjectId, message: &str, who: &str) -> Result<String> {
    let sig = gix::actor::Signature {
        name: who.into(),
        email: "cortexfs@localhost".into(),
        time: gix::date::Time::now_local_or_utc(),
    };
    let mut buf = gix::date::parse::TimeBuf::default();
    let sig = sig.to_ref(&mut buf);
    let parents: Vec<gix::ObjectId> = head_commit(repo).map(|c| c.id).into_iter().collect();
    let id = repo.commit_as(sig, sig, "HEAD", message, tree_id, parents).map_err(git)?;
    Ok(id.detach().to_hex().to_string())
}

/// Makes the staged configuration (all of it, or below `c.only`) a new generation and
/// activates it. Returns its id, or `None` when nothing staged differs from the active
/// generation. Refused, with nothing changed, when a staged control does not parse.
pub fn commit(storage: &Path, c: &Commit<'_>) -> Result<Option<String>> {
    let _lock = lock(storage)?;
    commit_locked(storage, c)
}

/// A command's own change: [`commit`] of the paths `c.only` when the storage's configuration
/// is a repository, checked once the lock is held (a first commit being made, as while a daemon
/// takes the storage in, is waited for); nothing for a storage that is not one, whose files are
/// served as they are.
pub fn commit_own(storage: &Path, c: &Commit<'_>) -> Result<Option<String>> {
    if !has_repository(storage) {
        return Ok(None);
    }
    let _lock = lock(storage)?;
    if !is_repository(storage) {
        return Ok(None);
    }
    commit_locked(storage, c)
}

fn commit_locked(storage: &Path, c: &Commit<'_>) -> Result<Option<String>> {
    let repo = match open_repo(storage)? {
        Some(r) => r,
        None => init(storage)?,
    };
    let head = head_commit(&repo).map(|c| c.id);
    // The first commit takes the whole configuration: a generation is never a part of one.
    let c = &Commit { only: c.only.filter(|_| head.is_some()), ..c.clone() };
    if let (Some(head), Some(only)) = (head, c.only) {
        return commit_some(storage, &repo, head, only, c);
    }
    let base = match head {
        Some(h) => tree_of(&repo, h)?,
        None => Tree::new(),
    };
    let taken = staged(storage, c.only)?;
    let bad = invalid(&taken);
    if !bad.is_empty() {
        return Err(Error::Invalid(bad));
    }
    let mut next: Tree =
        base.iter().filter(|(p, _)| !in_scope(p, c.only)).map(|(p, e)| (p.clone(), e.clone())).collect();
    next.extend(taken);
    if head.is_some() && next == base {
        return Ok(None);
    }
    let id = write_commit(&repo, &next, c.message, c.who)?;
    durable(storage)?;
    check_out(storage, &id, &next)?;
    Ok(Some(id))
}

/// [`commit`] of the changes below `only`: the tree edited from `head`'s, and the generation
/// checked out from the active one with only those paths written, so that the cost is that of
/// the change, not of the configuration.
fn commit_some(
    storage: &Path,
    repo: &gix::Repository,
    head: gix::ObjectId,
    only: &[String],
    c: &Commit<'_>,
) -> Result<Option<String>> {
    let taken = staged(storage, Some(only))?;
    let bad = invalid(&taken);
    if !bad.is_empty() {
        return Err(Error::Invalid(bad));
    }
    let head_tree = repo.find_commit(head).map_err(git)?.tree().map_err(git)?;
    let owners = match head_tree.lookup_entry_by_path(OWNERS).map_err(git)? {
        Some(e) => String::from_utf8_lossy(&repo.find_object(e.object_id()).map_err(git)?.data).into_owned(),
        None => String::new(),
    };
    let mut lines: BTreeMap<String, (u32, u32, u32)> =
        parse_owners(&owners).into_iter().filter(|(p, _)| !in_scope(p, Some(only))).collect();
    let mut editor = repo.edit_tree(head_tree.id).map_err(git)?;
    for p in only {
        editor.remove(p.as_str()).map_err(git)?;
    }
    for (rel, e) in &taken {
        lines.insert(rel.clone(), (e.mode, e.uid, e.gid));
        let Some(bytes) = &e.bytes else { continue };
        let blob = put_blob(repo, bytes)?;
        editor.upsert(rel.as_str(), kind_of(e.mode), blob).map_err(git)?;
    }
    let text: String = lines.iter().map(|(p, (m, u, g))| format!("{m:o} {u} {g} {p}\n")).collect();
    let blob = repo.write_blob(text.as_bytes()).map_err(git)?.detach();
    editor.upsert(OWNERS, gix::object::tree::EntryKind::Blob, blob).map_err(git)?;
    let tree_id = editor.write().map_err(git)?.detach();
    if tree_id == head_tree.id {
        return Ok(None);
    }
    let id = commit_tree(repo, tree_id, c.message, c.who)?;
    durable(storage)?;
    let gens = generations_dir(storage);
    let done = gens.join(&id);
    // Built from the active generation only when that is `head`'s: a commit written and never
    // activated (a process killed between the two, a full generations filesystem) is in this
    // one's tree, and would be missing from a generation built from the one before it.
    let head_hex = head.to_hex().to_string();
    match active(storage).filter(|_| active_id(storage).as_deref() == Some(head_hex.as_str())) {
        Some(prev) => {
            let tmp = gens.join(format!(".{id}.{}", std::process::id()));
            let _ = fs::remove_dir_all(&tmp);
            link_tree(&prev, &tmp, "", only)?;
            write_entries(&tmp, &taken, None, None)?;
            fs::rename(&tmp, &done).map_err(io_at("rename", &done))?;
        }
        None => {
            return check_out(
                storage,
                &id,
                &tree_of(repo, gix::ObjectId::from_hex(id.as_bytes()).map_err(git)?)?,
            )
            .map(|()| Some(id));
        }
    }
    activate(storage, &id)?;
    Ok(Some(id))
}

/// Recreates directory `from` at `to` (directories made with their modes and owners, files
/// linked), leaving out what is below `only`. Works from directory descriptors, each name
/// resolved in its own directory: a commit's cost is mostly this walk.
fn link_tree(from: &Path, to: &Path, rel: &str, only: &[String]) -> Result<()> {
    use rustix::fs::{Mode, OFlags};
    let open = |p: &Path| {
        rustix::fs::open(
            p,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| io_at("open", p)(e.into()))
    };
    let src = open(&from.join(rel))?;
    let st = rustix::fs::fstat(&src).map_err(|e| io_at("stat", from)(e.into()))?;
    {
        use std::os::unix::fs::DirBuilderExt;
        fs::DirBuilder::new().mode(st.st_mode & 0o7777).create(to).map_err(io_at("create", to))?;
    }
    own(to, st.st_mode, st.st_uid, st.st_gid)?;
    let dst = open(to)?;
    link_dir(&src, &dst, to, rel, only)
}

/// [`link_tree`] of the directory open as `src` into the one open as `dst` (at `to`, for
/// errors), `rel` being their storage-relative path.
fn link_dir(
    src: &std::os::fd::OwnedFd,
    dst: &std::os::fd::OwnedFd,
    to: &Path,
    rel: &str,
    only: &[String],
) -> Result<()> {
    use rustix::fs::{AtFlags, FileType, Mode, OFlags};
    use std::os::unix::ffi::OsStrExt;
    let at = |name: &std::ffi::CStr| to.join(std::ffi::OsStr::from_bytes(name.to_bytes()));
    let mut dir = rustix::fs::Dir::read_from(src).map_err(|e| io_at("read directory", to)(e.into()))?;
    let mut made: Vec<(std::ffi::CString, String)> = Vec::new();
    for e in dir.by_ref() {
        let e = e.map_err(|e| io_at("read directory", to)(e.into()))?;
        let name = e.file_name();
        if name.to_bytes() == b"." || name.to_bytes() == b".." {
            continue;
        }
        let Ok(n) = name.to_str() else { continue };
        let child = if rel.is_empty() { n.to_owned() } else { format!("{rel}/{n}") };
        if in_scope(&child, Some(only)) {
            continue;
        }
        let kind = match e.file_type() {
            FileType::Unknown => rustix::fs::statat(src, name, AtFlags::SYMLINK_NOFOLLOW)
                .map(|s| FileType::from_raw_mode(s.st_mode))
                .map_err(|err| io_at("stat", &at(name))(err.into()))?,
            k => k,
        };
        if kind == FileType::Directory {
            made.push((name.to_owned(), child));
        } else {
            rustix::fs::linkat(src, name, dst, name, AtFlags::empty())
                .map_err(|err| io_at("link", &at(name))(err.into()))?;
        }
    }
    for (name, child) in made {
        let open = |d: &std::os::fd::OwnedFd| {
            rustix::fs::openat(
                d,
                &name,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|err| io_at("open", &at(&name))(err.into()))
        };
        let sub = open(src)?;
        let st = rustix::fs::fstat(&sub).map_err(|err| io_at("stat", &at(&name))(err.into()))?;
        rustix::fs::mkdirat(dst, &name, Mode::from_raw_mode(st.st_mode & 0o7777))
            .map_err(|err| io_at("create", &at(&name))(err.into()))?;
        let new = open(dst)?;
        // Owner and mode set only where the new directory's differ (most are root's, 0755).
        let mine = rustix::fs::fstat(&new).map_err(|err| io_at("stat", &at(&name))(err.into()))?;
        if (mine.st_uid, mine.st_gid, mine.st_mode & 0o7777) != (st.st_uid, st.st_gid, st.st_mode & 0o7777) {
            rustix::fs::fchown(
                &new,
                Some(rustix::fs::Uid::from_raw(st.st_uid)),
                Some(rustix::fs::Gid::from_raw(st.st_gid)),
            )
            .map_err(|err| io_at("chown", &at(&name))(err.into()))?;
            rustix::fs::fchmod(&new, Mode::from_raw_mode(st.st_mode & 0o7777))
                .map_err(|err| io_at("chmod", &at(&name))(err.into()))?;
        }
        link_dir(&sub, &new, &at(&name), &child, only)?;
    }
    Ok(())
}

fn own(at: &Path, mode: u32, uid: u32, gid: u32) -> Result<()> {
    if is_link(mode) {
        // A symlink's own owner; it has no mode of its own.
        return rustix::fs::chownat(
            rustix::fs::CWD,
            at,
            Some(rustix::fs::Uid::from_raw(uid)),
            Some(rustix::fs::Gid::from_raw(gid)),
            rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
        )
        .map_err(|err| io_at("chown", at)(err.into()));
    }
    rustix::fs::chown(at, Some(rustix::fs::Uid::from_raw(uid)), Some(rustix::fs::Gid::from_raw(gid)))
        .map_err(|err| io_at("chown", at)(err.into()))?;
    fs::set_permissions(at, fs::Permissions::from_mode(mode & 0o7777)).map_err(io_at("chmod", at))
}

/// Writes `tree`'s entries below `dir`; a file that `prev_tree` holds identically is linked
/// from `prev` instead, and one whose bytes, mode and owner an entry written before has (the
/// core tools are one executable under many names) is linked to that one.
fn write_entries(dir: &Path, tree: &Tree, prev: Option<&Path>, prev_tree: Option<&Tree>) -> Result<()> {
    let mut written: HashMap<usize, Vec<(&Entry, PathBuf)>> = HashMap::new();
    for (rel, e) in tree {
        let at = dir.join(rel);
        match &e.bytes {
            None => match fs::create_dir(&at) {
                Ok(()) => {}
                Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {}
                Err(err) => return Err(io_at("create", &at)(err)),
            },
            Some(bytes) => {
                let same = prev_tree.and_then(|t| t.get(rel)).is_some_and(|p| p == e);
                if same && prev.is_some_and(|p| fs::hard_link(p.join(rel), &at).is_ok()) {
                    continue;
                }
                let twin = written.get(&bytes.len()).and_then(|v| v.iter().find(|(w, _)| *w == e));
                if !is_link(e.mode) && twin.is_some_and(|(_, p)| fs::hard_link(p, &at).is_ok()) {
                    continue;
                }
                if !is_link(e.mode) {
                    written.entry(bytes.len()).or_default().push((e, at.clone()));
                }
                if is_link(e.mode) {
                    use std::os::unix::ffi::OsStrExt;
                    std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(bytes), &at)
                        .map_err(io_at("link", &at))?;
                } else {
                    fs::write(&at, bytes).map_err(io_at("write", &at))?;
                }
            }
        }
        own(&at, e.mode, e.uid, e.gid)?;
    }
    Ok(())
}

fn kind_of(mode: u32) -> gix::object::tree::EntryKind {
    if is_link(mode) {
        gix::object::tree::EntryKind::Link
    } else if mode & 0o111 != 0 {
        gix::object::tree::EntryKind::BlobExecutable
    } else {
        gix::object::tree::EntryKind::Blob
    }
}

/// The file whose modification time says when the repository was last made durable.
const SYNCED: &str = "config.synced";

/// Makes the repository durable: a commit is on disk before it is activated. Every file and
/// directory of the repository changed since the last time (objects, refs, `HEAD`; those of
/// a commit that stopped before this step too) is synced. "Since" is the time of the mark the
/// last sync left, taken from the filesystem's own clock (a file made when that sync began),
/// so a file's time compares with it exactly; commits hold the lock, so nothing is written
/// between. Only the repository's files are flushed, never the rest of the storage's
/// filesystem.
fn durable(storage: &Path) -> Result<()> {
    let repo = repo_dir(storage);
    let dir = storage.join(DIR);
    let mark = dir.join(SYNCED);
    let since = fs::metadata(&mark)
        .and_then(|m| m.modified())
        .ok()
        .filter(|t| *t <= std::time::SystemTime::now())
        .unwrap_or(std::time::UNIX_EPOCH);
    // The next mark, made now: its time is the filesystem's.
    let next = dir.join(format!(".{SYNCED}.{}", std::process::id()));
    let _ = fs::remove_file(&next);
    let f = fs::OpenOptions::new()
        .create_new(true)
        .write(true)
        .mode(0o600)
        .open(&next)
        .map_err(io_at("open", &next))?;
    sync_newer(&repo, since, false)?;
    f.sync_all().map_err(io_at("sync", &next))?;
    fs::rename(&next, &mark).map_err(io_at("rename", &mark))?;
    fs::File::open(&dir).and_then(|d| d.sync_all()).map_err(io_at("sync", &dir))
}

/// Syncs the files below `dir` changed since `since`, and the directories holding them.
/// Directories are all walked (a ref renamed into `refs/heads/` changes that directory's time,
/// not `refs/`'s), but in `objects/` (`prune`), where objects are made directly in their
/// fan-out directory: one whose time is older holds no new object and is not listed.
fn sync_newer(dir: &Path, since: std::time::SystemTime, prune: bool) -> Result<bool> {
    let mut changed = false;
    for e in fs::read_dir(dir).map_err(io_at("read directory", dir))? {
        let e = e.map_err(io_at("read directory", dir))?;
        let Ok(meta) = e.metadata() else { continue };
        let new = meta.modified().map_or(true, |t| t >= since);
        if meta.is_dir() {
            if prune && !new {
                continue;
            }
            changed |= sync_newer(&e.path(), since, prune || e.file_name() == "objects")?;
        } else if meta.is_file() && new {
            fs::File::open(e.path()).and_then(|f| f.sync_all()).map_err(io_at("sync", &e.path()))?;
            changed = true;
        }
    }
    let dir_new = fs::metadata(dir).and_then(|m| m.modified()).map_or(true, |t| t >= since);
    if changed || dir_new {
        fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io_at("sync", dir))?;
    }
    Ok(changed || dir_new)
}

fn init(storage: &Path) -> Result<gix::Repository> {
    let dir = repo_dir(storage);
    fs::create_dir_all(storage.join(DIR)).map_err(io_at("create", &storage.join(DIR)))?;
    gix::init_bare(&dir).map_err(git)
}

/// Checks `tree` out as generation `id` and makes it the active one: files that the active
/// generation already holds identically are linked, not copied.
fn check_out(storage: &Path, id: &str, tree: &Tree) -> Result<()> {
    let gens = generations_dir(storage);
    fs::create_dir_all(&gens).map_err(io_at("create", &gens))?;
    if let Some(own) = gens.parent() {
        fs::set_permissions(own, fs::Permissions::from_mode(0o700)).map_err(io_at("chmod", own))?;
    }
    let done = gens.join(id);
    if !done.is_dir() {
        let prev = active(storage);
        let prev_tree =
            prev.as_ref().and_then(|_| active_id(storage)).and_then(|p| read_tree(storage, &p).ok());
        let tmp = gens.join(format!(".{id}.{}", std::process::id()));
        let _ = fs::remove_dir_all(&tmp);
        fs::create_dir(&tmp).map_err(io_at("create", &tmp))?;
        for c in CLASSES {
            let d = tmp.join(c);
            fs::create_dir(&d).map_err(io_at("create", &d))?;
        }
        write_entries(&tmp, tree, prev.as_deref(), prev_tree.as_ref())?;
        match fs::rename(&tmp, &done) {
            Ok(()) => {}
            Err(_) if done.is_dir() => {
                let _ = fs::remove_dir_all(&tmp);
            }
            Err(e) => return Err(io_at("rename", &done)(e)),
        }
    }
    activate(storage, id)
}

/// Makes generation `id` (checked out) the active one: its link replaced in one rename.
fn activate(storage: &Path, id: &str) -> Result<()> {
    let gens = generations_dir(storage);
    let link = gens.join(format!(".{ACTIVE}.{}", std::process::id()));
    let _ = fs::remove_file(&link);
    std::os::unix::fs::symlink(id, &link).map_err(io_at("link", &link))?;
    fs::rename(&link, gens.join(ACTIVE)).map_err(io_at("rename", &gens.join(ACTIVE)))?;
    prune(storage, id);
    Ok(())
}

/// Removes checked-out generations but the newest [`KEPT`] (the active one always kept), once
/// there are [`PRUNED_AT`] or more: a few commits in a row pay for one removal, not each of
/// them for one (removing a generation costs what checking one out does).
fn prune(storage: &Path, active: &str) {
    prune_to(storage, active, PRUNED_AT);
}

/// Removes checked-out generations but the newest three now: what a daemon serving the
/// storage does in the background when it sees an activation, so that commits seldom do.
pub fn prune_kept(storage: &Path) {
    if let Some(active) = active_id(storage) {
        prune_to(storage, &active, KEPT + 1);
    }
}

fn prune_to(storage: &Path, active: &str, at: usize) {
    let gens = generations_dir(storage);
    let Ok(rd) = fs::read_dir(&gens) else { return };
    let mut dirs: Vec<(std::time::SystemTime, PathBuf)> = rd
        .flatten()
        .filter(|e| {
            let n = e.file_name();
            let n = n.to_string_lossy();
            !n.starts_with('.') && n != ACTIVE && n != active
        })
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .collect();
    if dirs.len() + 1 < at {
        return;
    }
    dirs.sort();
    let drop = dirs.len().saturating_sub(KEPT - 1);
    for (_, d) in dirs.into_iter().take(drop) {
        let _ = fs::remove_dir_all(d);
    }
}

/// Makes sure the storage serves a committed generation: an existing storage without a
/// repository becomes one, its configuration as it is the first commit; a generation that is
/// not `HEAD`'s (a commit interrupted before its activation) is replaced by `HEAD`'s. Returns
/// the active generation's id.
pub fn ensure(storage: &Path) -> Result<String> {
    let _lock = lock(storage)?;
    let repo = match open_repo(storage)? {
        Some(r) => r,
        None => init(storage)?,
    };
    let id = match head_commit(&repo) {
        Some(c) => c.id.to_hex().to_string(),
        None => {
            let tree = staged(storage, None)?;
            let id = write_commit(&repo, &tree, "the storage's configuration as it was found", "cortexfs")?;
            durable(storage)?;
            id
        }
    };
    if active_id(storage).as_deref() != Some(id.as_str()) || active(storage).is_none() {
        let tree = tree_of(&repo, gix::ObjectId::from_hex(id.as_bytes()).map_err(git)?)?;
        check_out(storage, &id, &tree)?;
    }
    Ok(id)
}

/// Which of the storage files `files` (`agent/x.d/policy`) differ in the work tree from `HEAD`:
/// staged changes a command that commits its own change would otherwise carry with it. Empty
/// for a storage that is not a repository.
pub fn staged_in(storage: &Path, files: &[String]) -> Result<Vec<String>> {
    let Some(repo) = open_repo(storage)? else { return Ok(Vec::new()) };
    let Some(head) = head_commit(&repo) else { return Ok(Vec::new()) };
    let tree = head.tree().map_err(git)?;
    let mut out = Vec::new();
    for f in files {
        let committed = match tree.lookup_entry_by_path(f.as_str()).map_err(git)? {
            Some(e) => Some(repo.find_object(e.object_id()).map_err(git)?.data.clone()),
            None => None,
        };
        let at = storage_path(storage, f);
        let work = match fs::symlink_metadata(&at) {
            Ok(m) if m.is_file() => Some(read_regular(&at)?),
            Ok(_) => Some(Vec::new()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(io_at("stat", &at)(e)),
        };
        if work != committed {
            out.push(f.clone());
        }
    }
    Ok(out)
}

/// The generations, newest first (`HEAD` and its first parents), at most `max`.
pub fn log(storage: &Path, max: usize) -> Result<Vec<Generation>> {
    let Some(repo) = open_repo(storage)? else { return Ok(Vec::new()) };
    let mut out = Vec::new();
    let mut at = head_commit(&repo).map(|c| c.id);
    while let Some(id) = at {
        if out.len() == max {
            break;
        }
        let c = repo.find_commit(id).map_err(git)?;
        let author = c.author().map_err(git)?;
        let time = author.time().map(|t| t.seconds).unwrap_or(0);
        out.push(Generation {
            id: id.to_hex().to_string(),
            time,
            who: author.name.to_str_lossy().into_owned(),
            message: c.message_raw_sloppy().to_str_lossy().trim_end().to_owned(),
        });
        at = c.parent_ids().next().map(|p| p.detach());
    }
    Ok(out)
}

/// The generation `rev` names: a commit id or a prefix of one (at least 4 hex digits) among
/// the generations, or `HEAD~N`.
pub fn resolve(storage: &Path, rev: &str) -> Result<Generation> {
    let all = log(storage, usize::MAX)?;
    if let Some(n) = rev.strip_prefix("HEAD~").or_else(|| (rev == "HEAD").then_some("0")) {
        let n: usize = n.parse().map_err(|_| Error::NoRevision(rev.into()))?;
        return all.into_iter().nth(n).ok_or_else(|| Error::NoRevision(rev.into()));
    }
    if rev.len() < 4 || !rev.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(Error::NoRevision(rev.into()));
    }
    let mut hits = all.into_iter().filter(|g| g.id.starts_with(&rev.to_ascii_lowercase()));
    match (hits.next(), hits.next()) {
        (Some(g), None) => Ok(g),
        _ => Err(Error::NoRevision(rev.into())),
    }
}

/// The staged changes against the active generation.
pub fn status(storage: &Path) -> Result<Vec<Change>> {
    let base = match active_id(storage) {
        Some(id) => read_tree(storage, &id)?,
        None => Tree::new(),
    };
    let work = staged(storage, None)?;
    let mut out = Vec::new();
    for (p, e) in &work {
        match base.get(p) {
            None => out.push(Change { kind: 'A', path: p.clone() }),
            Some(b) if b != e => out.push(Change { kind: 'M', path: p.clone() }),
            _ => {}
        }
    }
    for p in base.keys().filter(|p| !work.contains_key(*p)) {
        out.push(Change { kind: 'D', path: p.clone() });
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

/// The staged changes as a diff: for each changed file, its active lines `-`, its staged
/// lines `+` (a control is a few lines; binary files are named, not shown).
pub fn diff(storage: &Path) -> Result<String> {
    let base = match active_id(storage) {
        Some(id) => read_tree(storage, &id)?,
        None => Tree::new(),
    };
    let work = staged(storage, None)?;
    let mut out = String::new();
    for ch in status(storage)? {
        let (old, new) = (base.get(&ch.path), work.get(&ch.path));
        out.push_str(&format!("--- a/{}\n+++ b/{}\n", ch.path, ch.path));
        let mode = |e: Option<&Entry>| e.map(|e| format!("{:o} {}:{}", e.mode, e.uid, e.gid));
        if mode(old) != mode(new) {
            out.push_str(&format!(
                "mode {} -> {}\n",
                mode(old).unwrap_or_else(|| "-".into()),
                mode(new).unwrap_or_else(|| "-".into())
            ));
        }
        fn text(e: Option<&Entry>) -> Option<Option<&str>> {
            e.and_then(|e| e.bytes.as_ref()).map(|b| std::str::from_utf8(b).ok())
        }
        match (text(old), text(new)) {
            (Some(None), _) | (_, Some(None)) => out.push_str("binary contents differ\n"),
            (o, n) => {
                let (o, n) = (o.flatten().unwrap_or(""), n.flatten().unwrap_or(""));
                if o != n {
                    o.lines().for_each(|l| out.push_str(&format!("-{l}\n")));
                    n.lines().for_each(|l| out.push_str(&format!("+{l}\n")));
                }
            }
        }
    }
    Ok(out)
}

/// Activates the tree of generation `rev` as a new commit, and makes the work tree's
/// configuration that tree (staged edits are replaced). Returns the new generation's id.
pub fn rollback(storage: &Path, rev: &str, who: &str) -> Result<String> {
    let target = resolve(storage, rev)?;
    let tree = read_tree(storage, &target.id)?;
    let _lock = lock(storage)?;
    let repo = open_repo(storage)?.ok_or_else(|| Error::NoRevision(rev.into()))?;
    let short = &target.id[..12];
    let message = format!("rollback to {short}: {}", target.message.lines().next().unwrap_or(""));
    let id = write_commit(&repo, &tree, &message, who)?;
    durable(storage)?;
    write_work_tree(storage, &tree)?;
    check_out(storage, &id, &tree)?;
    Ok(id)
}

/// Makes the work tree's configuration `tree`: changed files rewritten in place (through a
/// temporary name and a rename), files and directories it does not hold removed.
fn write_work_tree(storage: &Path, tree: &Tree) -> Result<()> {
    let work = staged(storage, None)?;
    for (rel, e) in tree {
        if work.get(rel) == Some(e) {
            continue;
        }
        let at = storage_path(storage, rel);
        match &e.bytes {
            None => {
                let _ = fs::create_dir_all(&at);
            }
            Some(bytes) => {
                let tmp = at.with_file_name(format!(
                    ".{}.rollback",
                    at.file_name().and_then(|n| n.to_str()).unwrap_or("f")
                ));
                // A fresh name, never through whatever was left there.
                let _ = fs::remove_file(&tmp);
                if is_link(e.mode) {
                    use std::os::unix::ffi::OsStrExt;
                    std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(bytes), &tmp)
                        .map_err(io_at("link", &tmp))?;
                } else {
                    use io::Write;
                    fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
                        .mode(0o600)
                        .open(&tmp)
                        .and_then(|mut f| f.write_all(bytes))
                        .map_err(io_at("write", &tmp))?;
                }
                own(&tmp, e.mode, e.uid, e.gid)?;
                fs::rename(&tmp, &at).map_err(io_at("rename", &at))?;
            }
        }
    }
    let mut gone: Vec<&String> = work.keys().filter(|p| !tree.contains_key(*p)).collect();
    gone.reverse(); // children before their directories
    for rel in gone {
        let at = storage_path(storage, rel);
        if work[rel].bytes.is_some() {
            let _ = fs::remove_file(&at);
        } else {
            let _ = fs::remove_dir(&at);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A temporary storage; its checked-out generations go with it.
    struct Store(tempfile::TempDir);

    impl Store {
        fn path(&self) -> &Path {
            self.0.path()
        }
    }

    impl Drop for Store {
        fn drop(&mut self) {
            if let Some(g) = generations_dir(self.path()).parent() {
                let _ = fs::remove_dir_all(g);
            }
        }
    }

    fn storage() -> Store {
        let d = tempfile::tempdir().unwrap();
        for c in CLASSES {
            fs::create_dir(d.path().join(c)).unwrap();
        }
        fs::create_dir(d.path().join("agent/a.d")).unwrap();
        fs::write(d.path().join("agent/a"), b"#!/bin/sh\n").unwrap();
        fs::set_permissions(d.path().join("agent/a"), fs::Permissions::from_mode(0o755)).unwrap();
        fs::write(d.path().join("agent/a.d/label"), b"a\n").unwrap();
        fs::write(d.path().join("agent/a.d/policy"), b"allow a tool:x execute\n").unwrap();
        fs::write(d.path().join("agent/a.d/log"), b"{}\n").unwrap();
        Store(d)
    }

    #[test]
    fn a_model_alias_is_versioned_as_a_symlink() {
        let d = storage();
        let s = d.path();
        fs::create_dir_all(s.join("model/p")).unwrap();
        fs::write(s.join("model/p/m"), b"m").unwrap();
        fs::write(s.join("model/p/n"), b"n").unwrap();
        std::os::unix::fs::symlink("p/m", s.join("model/main")).unwrap();
        ensure(s).unwrap();
        assert_eq!(fs::read_link(active(s).unwrap().join("model/main")).unwrap(), Path::new("p/m"));
        fs::remove_file(s.join("model/main")).unwrap();
        std::os::unix::fs::symlink("p/n", s.join("model/main")).unwrap();
        assert_eq!(status(s).unwrap(), vec![Change { kind: 'M', path: "model/main".into() }]);
        commit(s, &Commit { message: "main is n", who: "root", only: None }).unwrap().unwrap();
        assert_eq!(fs::read_link(active(s).unwrap().join("model/main")).unwrap(), Path::new("p/n"));
        rollback(s, "HEAD~1", "root").unwrap();
        assert_eq!(fs::read_link(active(s).unwrap().join("model/main")).unwrap(), Path::new("p/m"));
        assert_eq!(fs::read_link(s.join("model/main")).unwrap(), Path::new("p/m"), "the work tree follows");
        assert!(status(s).unwrap().is_empty());
    }

    #[test]
    fn a_storage_becomes_a_repository_and_edits_wait_for_a_commit() {
        let d = storage();
        let s = d.path();
        let first = ensure(s).unwrap();
        let generation = active(s).unwrap();
        assert_eq!(fs::read(generation.join("agent/a.d/policy")).unwrap(), b"allow a tool:x execute\n");
        assert!(!generation.join("agent/a.d/log").exists(), "logs are never versioned");
        assert_eq!(fs::metadata(generation.join("agent/a")).unwrap().mode() & 0o777, 0o755);
        // An edit is staged: the generation is unchanged.
        fs::write(s.join("agent/a.d/policy"), b"allow a tool:y execute\n").unwrap();
        assert_eq!(status(s).unwrap(), vec![Change { kind: 'M', path: "agent/a.d/policy".into() }]);
        assert!(diff(s).unwrap().contains("-allow a tool:x execute\n+allow a tool:y execute\n"));
        assert_eq!(
            fs::read(active(s).unwrap().join("agent/a.d/policy")).unwrap(),
            b"allow a tool:x execute\n"
        );
        // A restart serves the commit, whatever the work tree holds.
        assert_eq!(ensure(s).unwrap(), first);
        let c = Commit { message: "grant y", who: "root", only: None };
        let second = commit(s, &c).unwrap().unwrap();
        assert_eq!(
            fs::read(active(s).unwrap().join("agent/a.d/policy")).unwrap(),
            b"allow a tool:y execute\n"
        );
        assert!(status(s).unwrap().is_empty());
        assert_eq!(commit(s, &c).unwrap(), None, "nothing staged, nothing committed");
        let log = log(s, 10).unwrap();
        assert_eq!(log.iter().map(|g| g.id.as_str()).collect::<Vec<_>>(), [second.as_str(), first.as_str()]);
        assert_eq!((log[0].who.as_str(), log[0].message.as_str()), ("root", "grant y"));
        // Rollback: a new commit with the old tree, and the work tree follows.
        let third = rollback(s, &first[..8], "root").unwrap();
        assert_eq!(active_id(s).unwrap(), third);
        assert_eq!(fs::read(s.join("agent/a.d/policy")).unwrap(), b"allow a tool:x execute\n");
        assert_eq!(
            fs::read(active(s).unwrap().join("agent/a.d/policy")).unwrap(),
            b"allow a tool:x execute\n"
        );
        assert!(status(s).unwrap().is_empty());
    }

    #[test]
    fn a_control_that_does_not_parse_is_never_committed() {
        let d = storage();
        let s = d.path();
        let first = ensure(s).unwrap();
        fs::write(s.join("agent/a.d/policy"), b"allow a tool:").unwrap();
        let e = commit(s, &Commit { message: "torn", who: "root", only: None }).unwrap_err();
        assert!(matches!(e, Error::Invalid(_)), "{e}");
        assert_eq!(active_id(s).unwrap(), first);
    }

    #[test]
    fn a_commit_of_some_paths_leaves_the_other_staged_edits_staged() {
        let d = storage();
        let s = d.path();
        ensure(s).unwrap();
        fs::create_dir(s.join("agent/b.d")).unwrap();
        fs::write(s.join("agent/b"), b"b").unwrap();
        fs::write(s.join("agent/b.d/label"), b"b\n").unwrap();
        fs::write(s.join("agent/a.d/policy"), b"allow a tool:z execute\n").unwrap();
        let only = ["agent/b".to_string(), "agent/b.d".to_string()];
        commit(s, &Commit { message: "new agent b", who: "root", only: Some(&only) }).unwrap().unwrap();
        let generation = active(s).unwrap();
        assert!(generation.join("agent/b.d/label").exists());
        assert_eq!(fs::read(generation.join("agent/a.d/policy")).unwrap(), b"allow a tool:x execute\n");
        assert_eq!(status(s).unwrap(), vec![Change { kind: 'M', path: "agent/a.d/policy".into() }]);
    }

    /// A package record is versioned as `package/NAME.json`: committed whole and by path,
    /// nothing left staged after, and a rollback puts the record back where packages keep it.
    #[test]
    fn package_records_are_committed_and_rolled_back_with_the_objects() {
        let d = storage();
        let s = d.path();
        let records = s.join(crate::object::package::RECORDS);
        fs::create_dir_all(&records).unwrap();
        fs::write(records.join("kit.json"), b"{\"v\":1}").unwrap();
        let first = ensure(s).unwrap();
        assert!(active(s).unwrap().join("package/kit.json").is_file());
        assert_eq!(status(s).unwrap(), vec![], "nothing staged after the first commit");
        let all = Commit { message: "again", who: "root", only: None };
        assert_eq!(commit(s, &all).unwrap(), None, "a commit of nothing new makes none");
        fs::write(records.join("kit.json"), b"{\"v\":2}").unwrap();
        fs::write(records.join("other.json"), b"{}").unwrap();
        assert_eq!(
            status(s).unwrap(),
            vec![
                Change { kind: 'M', path: "package/kit.json".into() },
                Change { kind: 'A', path: "package/other.json".into() }
            ]
        );
        let only = ["package/kit.json".to_string()];
        commit(s, &Commit { message: "kit 2", who: "root", only: Some(&only) }).unwrap().unwrap();
        assert_eq!(fs::read(active(s).unwrap().join("package/kit.json")).unwrap(), b"{\"v\":2}");
        assert_eq!(status(s).unwrap(), vec![Change { kind: 'A', path: "package/other.json".into() }]);
        fs::remove_file(records.join("other.json")).unwrap();
        rollback(s, &first, "root").unwrap();
        assert_eq!(fs::read(records.join("kit.json")).unwrap(), b"{\"v\":1}", "the record is back");
        assert_eq!(status(s).unwrap(), vec![]);
    }

    #[test]
    fn what_is_versioned() {
        assert!(tracked("agent/a.d/policy"));
        assert!(tracked("model/p/m.d/cap"));
        assert!(!tracked("agent/a.d/log"));
        assert!(!tracked("tool/t.d/status"));
        assert!(!tracked("agent/a.sock"));
        assert!(!tracked("agent/.cortexfs-stage.x"));
        assert!(!tracked("home/0/x"));
        assert!(tracked("package") && tracked("package/kit.json"));
        assert!(!tracked("package/.kit.json.tmp") && !tracked("package/a/b.json") && !tracked("package/x"));
        assert_eq!(control_of("model/p/m.d/cap"), Some((ObjectClass::Model, "p/m".into(), "cap".into())));
    }
}
