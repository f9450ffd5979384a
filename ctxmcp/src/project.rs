//! Manifest candidates: one `cortexfs.object/v2` tool object per remote tool.
//!
//! `OUT/<server>.<tool>/` holds `manifest.json`, `exe` (a copy of ctxmcp, which serves the tool
//! when run under its name) and `d/` with the controls: `name`, `description`, `schema` (the
//! remote input schema), `mcp` (the stdio locator naming the config file as the agent will see
//! it) and an empty `policy`, so the installed tool is denied to everyone until an operator
//! grants it. Each candidate is checked like any manifest before it is reported. Nothing from the
//! config but the path of the file and the server's name is written.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use policy::Name;
use policy::controls::{self, ObjectClass};
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::client::Tool;
use crate::{Error, Result};

/// A written candidate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Projected {
    /// The tool's CortexFS name, `<server>.<tool>`.
    pub name: Name,
    /// Its manifest.
    pub manifest: PathBuf,
}

/// A remote tool that was not projected, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    /// The remote name.
    pub tool: String,
    /// Why.
    pub why: String,
}

/// The controls of one tool, or why it cannot be projected.
pub fn controls(
    server: &str,
    runtime_config: &str,
    tool: &Tool,
) -> std::result::Result<(Name, BTreeMap<&'static str, Vec<u8>>), String> {
    let name = Name::mcp(server, &tool.name).map_err(|e| e.to_string())?;
    let mut description = tool.description.clone().unwrap_or_default();
    if !description.is_empty() && !description.ends_with('\n') {
        description.push('\n');
    }
    let mut schema = serde_json::to_vec(&tool.input_schema).map_err(|e| e.to_string())?;
    schema.push(b'\n');
    let mut locator = serde_json::to_vec(
        &json!({"transport": "stdio", "config": runtime_config, "server": server, "tool": tool.name}),
    )
    .map_err(|e| e.to_string())?;
    locator.push(b'\n');
    let c = BTreeMap::from([
        ("name", format!("{name}\n").into_bytes()),
        ("description", description.into_bytes()),
        ("schema", schema),
        ("mcp", locator),
        ("policy", Vec::new()),
    ]);
    for (k, v) in &c {
        controls::validate(ObjectClass::Tool, &name, k, v).map_err(|e| format!("{k}: {e}"))?;
    }
    Ok((name, c))
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io { path: path.to_path_buf(), source }
}

/// Writes a candidate for each of `tools` under `out`, the executable copied from `exe`.
pub fn project(
    server: &str,
    runtime_config: &str,
    tools: &[Tool],
    exe: &Path,
    out: &Path,
) -> Result<(Vec<Projected>, Vec<Skipped>)> {
    policy::path::check_absolute(runtime_config)
        .map_err(|e| Error::Invalid(format!("--runtime-config {runtime_config:?}: {e}")))?;
    let abs = std::path::absolute(out).map_err(io(out))?;
    if abs.starts_with("/ctx") {
        return Err(Error::Invalid(format!(
            "--out {}: ctxmcp writes candidates outside /ctx; install them with `ctx object install`",
            abs.display()
        )));
    }
    let exe_bytes = fs::read(exe).map_err(io(exe))?;
    let exe_sha = hex::encode(Sha256::digest(&exe_bytes));
    let (mut done, mut skipped) = (Vec::new(), Vec::new());
    let mut first_exe: Option<PathBuf> = None;
    for tool in tools {
        let (name, ctl) = match controls(server, runtime_config, tool) {
            Ok(c) => c,
            Err(why) => {
                skipped.push(Skipped { tool: tool.name.clone(), why });
                continue;
            }
        };
        let dir = out.join(name.as_str());
        fs::create_dir_all(dir.join("d")).map_err(io(&dir))?;
        let mut entries = serde_json::Map::new();
        for (k, bytes) in &ctl {
            let p = dir.join("d").join(k);
            fs::write(&p, bytes).map_err(io(&p))?;
            entries.insert(
                (*k).to_owned(),
                json!({"path": format!("d/{k}"), "sha256": hex::encode(Sha256::digest(bytes))}),
            );
        }
        let target = dir.join("exe");
        match fs::remove_file(&target) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(&target)(e)),
        }
        let linked = first_exe.as_ref().is_some_and(|f| fs::hard_link(f, &target).is_ok());
        if !linked {
            fs::write(&target, &exe_bytes).map_err(io(&target))?;
            use std::os::unix::fs::PermissionsExt;
            fs::set_permissions(&target, fs::Permissions::from_mode(0o755)).map_err(io(&target))?;
            first_exe.get_or_insert(target);
        }
        let manifest = json!({
            "schema": policy::manifest::SCHEMA,
            "version": env!("CARGO_PKG_VERSION"),
            "compatibility": {"cortexfs": format!(">={}", env!("CARGO_PKG_VERSION"))},
            "class": "tool",
            "name": name.as_str(),
            "executable": {"path": "exe", "sha256": exe_sha},
            "controls": entries,
        });
        let path = dir.join("manifest.json");
        let mut text = serde_json::to_vec_pretty(&manifest).map_err(|e| Error::Internal(e.to_string()))?;
        text.push(b'\n');
        fs::write(&path, text).map_err(io(&path))?;
        ringfs::object::check(&path).map_err(|problems| {
            let why: Vec<String> = problems.iter().map(ToString::to_string).collect();
            Error::Internal(format!("{}: {}", path.display(), why.join("; ")))
        })?;
        done.push(Projected { name, manifest: path });
    }
    Ok((done, skipped))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str) -> Tool {
        Tool {
            name: name.into(),
            description: Some("Reads.".into()),
            input_schema: json!({"type":"object","properties":{"path":{"type":"string"}}}),
        }
    }

    #[test]
    fn writes_checked_candidates_and_skips_unmappable_names() {
        let d = tempfile::tempdir().unwrap();
        let exe = d.path().join("ctxmcp");
        fs::write(&exe, b"#!/bin/sh\n").unwrap();
        let tools =
            [tool("read_file"), tool("has space"), tool("list.d"), tool(&"x".repeat(70)), tool("list")];
        let out = d.path().join("out");
        let (done, skipped) = project("fs", "/cfg/mcp.json", &tools, &exe, &out).unwrap();
        let names: Vec<&str> = done.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["fs.read_file", "fs.list"]);
        assert_eq!(skipped.len(), 3);
        assert!(skipped[0].why.contains("' '"), "{skipped:?}");
        let loc = fs::read(out.join("fs.read_file/d/mcp")).unwrap();
        let loc = controls::parse_mcp_locator(&loc).unwrap();
        assert_eq!((loc.config.as_str(), loc.tool.as_str()), ("/cfg/mcp.json", "read_file"));
        assert_eq!(fs::read(out.join("fs.list/d/policy")).unwrap(), b"", "deny by default");
        assert_eq!(fs::read_to_string(out.join("fs.list/d/description")).unwrap(), "Reads.\n");
        // Projecting again replaces the candidates in place.
        assert!(project("fs", "/cfg/mcp.json", &tools, &exe, &out).is_ok());
        assert!(project("fs", "cfg/mcp.json", &tools, &exe, &out).is_err(), "relative runtime config");
        assert!(project("fs", "/c", &tools, &exe, Path::new("/ctx/tool")).is_err(), "under /ctx");
    }
}
