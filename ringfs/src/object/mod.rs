//! The object store (spec §9): checking manifests against the files they name, and hash-bound
//! atomic publish of tool and agent objects into storage.
//!
//! [`check`] reads a `cortexfs.object/v2` manifest, then every file it names: each must be a
//! regular file reached without symlinks inside the manifest's directory, match its SHA-256,
//! and (the executable and hooks) carry an execute bit; control files must hold valid contents
//! (a `.d/program` declaration is validated as a JSON object and never executed). Every problem
//! is reported. The bytes that were hashed are the bytes that get installed: they are kept in
//! [`Checked`], never read twice.
//!
//! [`publish`] installs, replaces, rolls back and uninstalls checked objects.

pub mod package;
pub mod publish;

use std::fs;
use std::io::Read;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use policy::controls;
use policy::manifest::{self, ControlSource, FileRef, Manifest, Problem};
use sha2::{Digest, Sha256};

/// A manifest whose files all check out, with the verified bytes.
#[derive(Debug)]
pub struct Checked {
    /// The parsed manifest.
    pub manifest: Manifest,
    /// The directory its relative paths are resolved against.
    pub base: PathBuf,
    /// The executable's bytes (hash verified).
    pub executable: Vec<u8>,
    /// Every control's bytes, inline or from its verified file.
    pub controls: std::collections::BTreeMap<String, Vec<u8>>,
}

fn problem(field: impl Into<String>, message: impl Into<String>) -> Problem {
    Problem { field: field.into(), message: message.into() }
}

/// Reads a file named by a manifest, refusing symlinks on the way and non-regular files.
pub(crate) fn read_ref(base: &Path, rel: &str) -> Result<(Vec<u8>, u32), String> {
    let mut at = base.to_path_buf();
    for c in Path::new(rel).components() {
        let Component::Normal(part) = c else {
            return Err("path leaves the manifest directory".into());
        };
        at.push(part);
        let meta = fs::symlink_metadata(&at).map_err(|e| format!("{}: {e}", at.display()))?;
        if meta.file_type().is_symlink() {
            return Err(format!("{} is a symlink; symlinks are refused", at.display()));
        }
    }
    // Open without following a symlink swapped in since the walk, then judge the opened file.
    let mut f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(&at)
        .map_err(|e| format!("{}: {e}", at.display()))?;
    let meta = f.metadata().map_err(|e| format!("{}: {e}", at.display()))?;
    if !meta.is_file() {
        return Err(format!("{} is not a regular file", at.display()));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    f.read_to_end(&mut bytes).map_err(|e| format!("{}: {e}", at.display()))?;
    Ok((bytes, meta.permissions().mode()))
}

fn verify(
    base: &Path,
    field: &str,
    r: &FileRef,
    executable: bool,
    out: &mut Vec<Problem>,
) -> Option<Vec<u8>> {
    match read_ref(base, &r.path) {
        Err(e) => {
            out.push(problem(field, e));
            None
        }
        Ok((bytes, mode)) => {
            let digest: [u8; 32] = Sha256::digest(&bytes).into();
            if digest != r.sha256 {
                out.push(problem(format!("{field}.sha256"), format!("{} does not match its digest", r.path)));
                return None;
            }
            if executable && mode & 0o111 == 0 {
                out.push(problem(field, format!("{} is not executable", r.path)));
                return None;
            }
            Some(bytes)
        }
    }
}

/// Checks the manifest at `path` and every file it names.
pub fn check(path: &Path) -> Result<Checked, Vec<Problem>> {
    let bytes =
        fs::read(path).map_err(|e| vec![problem("", format!("cannot read {}: {e}", path.display()))])?;
    let manifest = manifest::parse(&bytes, &policy::cortexfs_version())?;
    let base = path.parent().map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    let base = if base.as_os_str().is_empty() { PathBuf::from(".") } else { base };
    let mut out = Vec::new();
    let executable = verify(&base, "executable", &manifest.executable, true, &mut out);
    let mut contents = std::collections::BTreeMap::new();
    for (name, source) in &manifest.controls {
        let field = format!("controls.{name}");
        match source {
            ControlSource::Text(t) => {
                contents.insert(name.clone(), t.clone().into_bytes());
            }
            ControlSource::File(r) => {
                if let Some(bytes) = verify(&base, &field, r, controls::is_hook(name), &mut out) {
                    match controls::validate(manifest.class, &manifest.name, name, &bytes) {
                        Ok(()) => {
                            contents.insert(name.clone(), bytes);
                        }
                        Err(e) => out.push(problem(field, e)),
                    }
                }
            }
        }
    }
    match executable {
        Some(executable) if out.is_empty() => Ok(Checked { manifest, base, executable, controls: contents }),
        _ => Err(out),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn sha(bytes: &[u8]) -> String {
        Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
    }

    fn write_exec(p: &Path, bytes: &[u8]) {
        fs::write(p, bytes).unwrap();
        fs::set_permissions(p, fs::Permissions::from_mode(0o755)).unwrap();
    }

    fn manifest(exe: &str, policy_sha: &str) -> String {
        format!(
            r#"{{"schema":"cortexfs.object/v2","version":"1.0.0","compatibility":{{"cortexfs":"*"}},
            "class":"tool","name":"hello","executable":{{"path":"bin/hello","sha256":"{exe}"}},
            "controls":{{"policy":{{"path":"hello.policy","sha256":"{policy_sha}"}}}}}}"#
        )
    }

    #[test]
    fn good_and_bad_files() {
        let d = tempfile::tempdir().unwrap();
        fs::create_dir(d.path().join("bin")).unwrap();
        let exe = b"#!/bin/sh\necho hi\n";
        write_exec(&d.path().join("bin/hello"), exe);
        let pol = b"allow a_t tool:hello execute\n";
        fs::write(d.path().join("hello.policy"), pol).unwrap();
        let m = d.path().join("m.json");
        fs::write(&m, manifest(&sha(exe), &sha(pol))).unwrap();
        let c = check(&m).unwrap();
        assert_eq!(c.manifest.name.as_str(), "hello");

        // Digest mismatch and a bad policy are both reported.
        fs::write(d.path().join("hello.policy"), b"allow a_t agent:* create\n").unwrap();
        fs::write(&m, manifest(&sha(b"other"), &sha(b"allow a_t agent:* create\n"))).unwrap();
        let e = check(&m).unwrap_err();
        assert_eq!(e.len(), 2, "{e:?}");

        // Not executable.
        fs::set_permissions(d.path().join("bin/hello"), fs::Permissions::from_mode(0o644)).unwrap();
        fs::write(d.path().join("hello.policy"), pol).unwrap();
        fs::write(&m, manifest(&sha(exe), &sha(pol))).unwrap();
        assert!(check(&m).unwrap_err()[0].message.contains("not executable"));

        // A symlinked directory on the way is refused.
        fs::rename(d.path().join("bin"), d.path().join("real")).unwrap();
        symlink(d.path().join("real"), d.path().join("bin")).unwrap();
        assert!(check(&m).unwrap_err()[0].message.contains("symlink"));
    }
}
