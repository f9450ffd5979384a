//! Tool lookup through `CTX_PATH` (spec §3): left to right, the first *executable* regular file
//! of that name wins, non-executable files are not hits, and the tool's `.d/` is taken from the
//! directory that held the hit. The host `PATH` is never consulted.
//!
//! Hits are kept in the W-TinyLFU [`cache`](crate::cache), like a shell's command hash: a cached
//! hit is used while it is still an executable file; a tool installed earlier in `CTX_PATH` after
//! that is seen once the entry leaves the cache (`tsh unload NAME` drops it at once). Authority is
//! never cached: every run checks both policies again.

use std::path::{Path, PathBuf};

use rustix::fs::Access;

use crate::cache::WTinyLfu;

/// A resolved tool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hit {
    /// The tool's name.
    pub name: String,
    /// The `CTX_PATH` directory that held it.
    pub dir: PathBuf,
    /// The executable.
    pub path: PathBuf,
}

impl Hit {
    /// The tool's control directory, `<dir>/<name>.d`.
    pub fn controls(&self) -> PathBuf {
        self.dir.join(format!("{}.d", self.name))
    }
}

/// Why a name did not resolve.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Miss {
    /// Directories that hold the tool's `.d/` but no executable the caller may run: in an
    /// agent's view, the sign that the tool's own policy refused it.
    pub controls_only: Vec<PathBuf>,
    /// Directories where a file of that name exists but is not executable.
    pub not_executable: Vec<PathBuf>,
}

/// Whether `path` is a regular file the caller may execute.
pub fn executable(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file()) && rustix::fs::access(path, Access::EXEC_OK).is_ok()
}

/// Resolves tool names through `CTX_PATH`.
#[derive(Debug)]
pub struct Resolver {
    dirs: Vec<PathBuf>,
    cache: WTinyLfu<String, Hit>,
}

impl Resolver {
    /// A resolver over `dirs` with a cache configured by `config`.
    pub fn new(dirs: Vec<PathBuf>, config: &policy::tshconf::TshConfig) -> Resolver {
        Resolver { dirs, cache: WTinyLfu::new(config, 0x7473_6800) }
    }

    /// The directories searched.
    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    /// The cache, for its sketch and pins.
    pub fn cache(&self) -> &WTinyLfu<String, Hit> {
        &self.cache
    }

    /// Walks `CTX_PATH` without the cache.
    pub fn walk(&self, name: &str) -> Result<Hit, Miss> {
        let mut miss = Miss { controls_only: Vec::new(), not_executable: Vec::new() };
        for dir in &self.dirs {
            let path = dir.join(name);
            if executable(&path) {
                return Ok(Hit { name: name.to_owned(), dir: dir.clone(), path });
            }
            if path.exists() {
                miss.not_executable.push(dir.clone());
            } else if dir.join(format!("{name}.d")).is_dir() {
                miss.controls_only.push(dir.clone());
            }
        }
        Err(miss)
    }

    /// Resolves `name`, through the cache. Returns the hit and the tool the cache evicted to make
    /// room for it, if any.
    pub fn resolve(&mut self, name: &str) -> Result<(Hit, Option<String>), Miss> {
        if policy::name::validate(name).is_err() {
            return Err(Miss { controls_only: Vec::new(), not_executable: Vec::new() });
        }
        if let Some(hit) = self.cache.get(name) {
            if executable(&hit.path) {
                return Ok((hit.clone(), None));
            }
            self.cache.remove(name);
        }
        let hit = self.walk(name)?;
        let evicted = if self.cache.is_pinned(name) {
            self.cache.pin(name.to_owned(), hit.clone());
            None
        } else {
            self.cache.insert(name.to_owned(), hit.clone()).map(|(k, _)| k)
        };
        Ok((hit, evicted))
    }

    /// Pins `name`'s resolution: never evicted until unpinned.
    pub fn pin(&mut self, hit: Hit) {
        self.cache.pin(hit.name.clone(), hit);
    }

    /// Returns `name` to the cache's policy; names what that evicted.
    pub fn unpin(&mut self, name: &str) -> Option<String> {
        self.cache.unpin(name).map(|(k, _)| k)
    }

    /// Drops `name` from the cache, pinned or not.
    pub fn forget(&mut self, name: &str) {
        self.cache.remove(name);
    }

    /// Every tool name that resolves, sorted, each with its hit (first directory wins).
    pub fn all(&self) -> Vec<Hit> {
        let mut seen = std::collections::BTreeMap::new();
        for dir in &self.dirs {
            let Ok(entries) = std::fs::read_dir(dir) else { continue };
            for e in entries.flatten() {
                let Some(name) = e.file_name().to_str().map(str::to_owned) else { continue };
                if seen.contains_key(&name) || policy::name::validate(&name).is_err() {
                    continue;
                }
                let path = dir.join(&name);
                if executable(&path) {
                    seen.insert(name.clone(), Hit { name, dir: dir.clone(), path });
                }
            }
        }
        seen.into_values().collect()
    }
}
