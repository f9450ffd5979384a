//! Object packages for the `ctx object` tests: writes a tool package with its manifest, and
//! judges what an install left in storage (absent, or complete with every control intact).
//!
//! Digests are computed with the system's `sha256sum`, which keeps these checks independent of
//! the code under test.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The schema control every package carries as a file.
const SCHEMA: &str = r#"{"type":"object","properties":{"path":{"type":"string"}}}"#;

/// A tool package written by [`package`].
#[derive(Clone, Debug)]
pub struct Package {
    /// The manifest file.
    pub manifest: PathBuf,
    /// The tool's name.
    pub name: String,
    /// Its version.
    pub version: String,
    /// The executable's bytes.
    pub executable: Vec<u8>,
}

/// The SHA-256 of `bytes` in hex, from `sha256sum`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    let d = tempfile::tempdir().expect("temporary directory");
    let p = d.path().join("f");
    fs::write(&p, bytes).expect("write a file to hash");
    let out = Command::new("sha256sum").arg(&p).output().expect("run sha256sum");
    assert!(out.status.success(), "sha256sum failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).expect("sha256sum prints ASCII");
    let hex = text.split_whitespace().next().expect("sha256sum prints a digest");
    assert_eq!(hex.len(), 64, "sha256sum printed {text:?}");
    hex.to_owned()
}

/// Writes a tool package in `dir`: an executable of at least `size` bytes that prints
/// `NAME VERSION`, inline `description` and `policy` controls and a `schema` control file.
pub fn package(dir: &Path, name: &str, version: &str, size: usize) -> Package {
    fs::create_dir_all(dir.join("bin")).expect("package directory");
    let mut exe = format!("#!/bin/sh\necho {name} {version}\nexit 0\n# ").into_bytes();
    exe.resize(size.max(exe.len()), b'#');
    exe.push(b'\n');
    fs::write(dir.join("bin/t"), &exe).expect("write the executable");
    fs::set_permissions(dir.join("bin/t"), fs::Permissions::from_mode(0o755)).expect("chmod");
    fs::write(dir.join("schema.json"), SCHEMA).expect("write the schema");
    let m = format!(
        r#"{{"schema":"cortexfs.object/v2","version":"{version}","compatibility":{{"cortexfs":">=0.1"}},
        "class":"tool","name":"{name}","executable":{{"path":"bin/t","sha256":"{}"}},
        "controls":{{"description":{{"text":"{name} {version}\n"}},"policy":{{"text":"allow a_t tool:{name} execute\n"}},
        "schema":{{"path":"schema.json","sha256":"{}"}}}}}}"#,
        sha256_hex(&exe),
        sha256_hex(SCHEMA.as_bytes())
    );
    let manifest = dir.join("m.json");
    fs::write(&manifest, m).expect("write the manifest");
    Package { manifest, name: name.to_owned(), version: version.to_owned(), executable: exe }
}

impl Package {
    /// The manifest's path as a command-line argument.
    pub fn manifest_arg(&self) -> &str {
        self.manifest.to_str().expect("UTF-8 path")
    }

    /// Whether `storage/tool/NAME` is absent (`Ok(false)`) or complete (`Ok(true)`): the
    /// executable with its bytes and execute bits, and exactly the controls an install writes,
    /// each with its contents. Anything in between is an error saying what is wrong.
    pub fn absent_or_complete(&self, storage: &Path) -> Result<bool, String> {
        let name = &self.name;
        let exe = storage.join("tool").join(name);
        match fs::symlink_metadata(&exe) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(format!("{name}: stat {}: {e}", exe.display())),
            Ok(m) if !m.is_file() => return Err(format!("{name}: the executable is not a regular file")),
            Ok(m) if m.permissions().mode() & 0o111 == 0 => {
                return Err(format!("{name}: the executable lost its execute bits"));
            }
            Ok(_) => {}
        }
        match fs::read(&exe) {
            Ok(b) if b == self.executable => {}
            Ok(b) => {
                return Err(format!(
                    "{name}: the executable holds {} bytes that differ from the package's {}",
                    b.len(),
                    self.executable.len()
                ));
            }
            Err(e) => return Err(format!("{name}: read {}: {e}", exe.display())),
        }
        let ctl = storage.join("tool").join(format!("{name}.d"));
        let want = [
            ("description", format!("{name} {}\n", self.version)),
            ("log", String::new()),
            ("name", format!("{name}\n")),
            ("policy", format!("allow a_t tool:{name} execute\n")),
            ("schema", SCHEMA.to_owned()),
            ("status", String::new()),
        ];
        for (c, body) in &want {
            let got = fs::read_to_string(ctl.join(c)).map_err(|e| format!("{name}: control {c}: {e}"))?;
            if &got != body {
                return Err(format!("{name}: control {c} holds {got:?}, expected {body:?}"));
            }
        }
        let mut found = Vec::new();
        walk(&ctl, "", &mut found).map_err(|e| format!("{name}: listing {}: {e}", ctl.display()))?;
        found.sort();
        let mut expected: Vec<String> = want.iter().map(|(c, _)| (*c).to_owned()).collect();
        expected.extend(["hooks/", "hooks/post.d/", "hooks/pre.d/"].map(String::from));
        expected.sort();
        if found != expected {
            return Err(format!("{name}: controls are {found:?}, expected {expected:?}"));
        }
        Ok(true)
    }
}

/// Lists `dir` recursively: files as `a/b`, directories as `a/`.
fn walk(dir: &Path, rel: &str, out: &mut Vec<String>) -> std::io::Result<()> {
    for e in fs::read_dir(dir)? {
        let e = e?;
        let n = e.file_name().to_string_lossy().into_owned();
        let r = format!("{rel}{n}");
        if e.file_type()?.is_dir() {
            out.push(format!("{r}/"));
            walk(&dir.join(&n), &format!("{r}/"), out)?;
        } else {
            out.push(r);
        }
    }
    Ok(())
}
