//! Embeds every launch profile in `profiles/` (one TOML file per CLI): a profile added there is
//! built in without a change to the code.

use std::io::Write;
use std::path::{Path, PathBuf};

fn main() -> std::io::Result<()> {
    let var = |k: &str| std::env::var(k).map_err(|e| std::io::Error::other(format!("{k}: {e}")));
    let dir = Path::new(&var("CARGO_MANIFEST_DIR")?).join("profiles");
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    let mut f = std::fs::File::create(Path::new(&var("OUT_DIR")?).join("profiles.rs"))?;
    writeln!(f, "&[")?;
    for p in files {
        println!("cargo:rerun-if-changed={}", p.display());
        let stem = p.file_stem().and_then(|s| s.to_str()).unwrap_or_default();
        writeln!(f, "    ({stem:?}, include_str!({:?})),", p.display().to_string())?;
    }
    writeln!(f, "]")
}
