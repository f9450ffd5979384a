//! The manuals (spec §8): the pages of `docs/spec/`, built into the binary, installed by `ctx
//! bootstrap` as `shared/cortexfs-docs/{README.md,man/ctx.<topic>.md}` and read by `ctx man`.
//!
//! The built-in copy is the source: [`PAGES`] includes each file of `docs/spec/` at build time,
//! so the binary and the repository's pages cannot differ; an installed tree can, and
//! [`plan`] says how (missing, outdated, or a page this version does not have).

use std::path::{Path, PathBuf};

/// One manual page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Page {
    /// The topic, and the installed file's name `ctx.<topic>.md` (`README.md` for the index).
    pub topic: &'static str,
    /// Its file under `docs/spec/`.
    pub source: &'static str,
    /// Other names `ctx man` takes for it.
    pub aliases: &'static [&'static str],
    /// The text.
    pub text: &'static str,
}

macro_rules! page {
    ($topic:literal, $file:literal, [$($alias:literal),*]) => {
        Page {
            topic: $topic,
            source: $file,
            aliases: &[$($alias),*],
            text: include_str!(concat!("../../docs/spec/", $file)),
        }
    };
}

/// Every page, the index first.
pub const PAGES: &[Page] = &[
    page!("README", "README.md", ["index", "cortexfs"]),
    page!("root-abi", "root-abi.md", ["root"]),
    page!("object-abi", "object-abi.md", ["object", "agent", "tool", "package", "install"]),
    page!("model-abi", "model-abi.md", ["model", "provider", "secret"]),
    page!("session-abi", "session-abi.md", ["session", "log", "events", "terminal"]),
    page!("tool-policy-abi", "tool-policy-abi.md", ["tool-policy", "policy", "tsh", "shared", "queue"]),
    page!("coreutils", "ctx-coreutils.md", ["ctx-coreutils", "core"]),
    page!("agent-socket", "agent-socket.md", ["socket", "send"]),
];

/// The shared space that holds the installed manuals.
pub const SPACE: &str = "cortexfs-docs";

/// The page a topic or alias names.
pub fn find(topic: &str) -> Option<&'static Page> {
    let t = topic.strip_prefix("ctx.").unwrap_or(topic);
    let t = t.strip_suffix(".md").unwrap_or(t);
    PAGES
        .iter()
        .find(|p| p.topic.eq_ignore_ascii_case(t) || p.aliases.iter().any(|a| a.eq_ignore_ascii_case(t)))
}

impl Page {
    /// The page's path inside the docs space.
    pub fn installed(&self) -> PathBuf {
        if self.topic == "README" {
            PathBuf::from("README.md")
        } else {
            Path::new("man").join(format!("ctx.{}.md", self.topic))
        }
    }
}

/// How an installed tree differs from the built-in pages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Drift {
    /// A page is not installed.
    Missing(&'static Page),
    /// An installed page differs from the built-in one.
    Outdated(&'static Page),
    /// An installed `man/` file this version has no page for.
    Stale(String),
}

impl std::fmt::Display for Drift {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Drift::Missing(p) => write!(f, "missing {}", p.installed().display()),
            Drift::Outdated(p) => write!(f, "outdated {}", p.installed().display()),
            Drift::Stale(n) => write!(f, "stale man/{n}"),
        }
    }
}

/// How the tree at `dir` (a `shared/cortexfs-docs`) differs from the built-in pages.
pub fn plan(dir: &Path) -> Vec<Drift> {
    let mut out = Vec::new();
    for p in PAGES {
        match std::fs::read(dir.join(p.installed())) {
            Ok(b) if b == p.text.as_bytes() => {}
            Ok(_) => out.push(Drift::Outdated(p)),
            Err(_) => out.push(Drift::Missing(p)),
        }
    }
    if let Ok(entries) = std::fs::read_dir(dir.join("man")) {
        let mut extra: Vec<String> = entries
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| !PAGES.iter().any(|p| p.installed() == Path::new("man").join(n)))
            .collect();
        extra.sort();
        out.extend(extra.into_iter().map(Drift::Stale));
    }
    out
}

/// Brings the tree at `dir` in line with the built-in pages: each page written beside its place
/// and renamed over it (a reader sees the old page or the new one), stale pages removed.
pub fn apply(dir: &Path, drift: &[Drift]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    for d in [dir.to_path_buf(), dir.join("man")] {
        if !d.is_dir() {
            std::fs::DirBuilder::new().mode(0o755).recursive(true).create(&d)?;
        }
    }
    for d in drift {
        match d {
            Drift::Missing(p) | Drift::Outdated(p) => {
                let to = dir.join(p.installed());
                let tmp = to.with_extension(format!("md.{}.tmp", std::process::id()));
                let _ = std::fs::remove_file(&tmp);
                let mut f =
                    std::fs::OpenOptions::new().write(true).create_new(true).mode(0o644).open(&tmp)?;
                f.write_all(p.text.as_bytes())?;
                f.sync_all()?;
                std::fs::rename(&tmp, &to)?;
            }
            Drift::Stale(n) => std::fs::remove_file(dir.join("man").join(n))?,
        }
    }
    for d in [dir.join("man"), dir.to_path_buf()] {
        std::fs::File::open(&d)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every page of `docs/spec/` is built in, and every built-in page is a file there: a page
    /// added or removed on one side only fails here.
    #[test]
    fn every_page_of_docs_spec_is_built_in() {
        let spec = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/spec");
        let mut files: Vec<String> = std::fs::read_dir(&spec)
            .unwrap()
            .flatten()
            .filter(|e| e.file_type().unwrap().is_file())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".md"))
            .collect();
        files.sort();
        let mut built: Vec<String> = PAGES.iter().map(|p| p.source.to_owned()).collect();
        built.sort();
        assert_eq!(files, built);
        for p in PAGES {
            assert_eq!(std::fs::read_to_string(spec.join(p.source)).unwrap(), p.text, "{}", p.source);
        }
    }

    #[test]
    fn topics_and_aliases_are_unique_and_found() {
        let mut names: Vec<&str> =
            PAGES.iter().flat_map(|p| std::iter::once(p.topic).chain(p.aliases.iter().copied())).collect();
        let n = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), n, "a name is used twice");
        assert_eq!(find("model").map(|p| p.topic), Some("model-abi"));
        assert_eq!(find("ctx.coreutils.md").map(|p| p.topic), Some("coreutils"));
        assert!(find("nope").is_none());
    }

    #[test]
    fn apply_then_plan_is_clean_and_drift_is_found() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(plan(d.path()).len(), PAGES.len());
        apply(d.path(), &plan(d.path())).unwrap();
        assert!(plan(d.path()).is_empty());
        std::fs::write(d.path().join("man/ctx.root-abi.md"), "old\n").unwrap();
        std::fs::write(d.path().join("man/ctx.gone.md"), "old\n").unwrap();
        let drift: Vec<String> = plan(d.path()).iter().map(ToString::to_string).collect();
        assert_eq!(drift, ["outdated man/ctx.root-abi.md", "stale man/ctx.gone.md"]);
        apply(d.path(), &plan(d.path())).unwrap();
        assert!(plan(d.path()).is_empty());
    }
}
