//! `ctx tool NAME [ARG...]`: the safe core CLIs implemented inside ctx (spec §3).
//!
//! Only `tsh.config` runs here. NAME must still resolve through `CTX_PATH` (as tsh would find
//! it). Ordinary tools and authority-bearing core tools (`fs.write`, `shell.exec`, ...) are
//! refused: running them from here would bypass the agent and tool policies that tsh checks in
//! an agent terminal.

use std::ffi::OsString;

use crate::exit::{self, Exit};

/// The core CLIs `ctx tool` runs.
pub const SAFE: &[&str] = &["tsh.config"];

/// Runs `ctx tool`.
pub fn run(name: &str, args: &[OsString]) -> anyhow::Result<()> {
    if !SAFE.contains(&name) {
        return Err(Exit::new(
            exit::DENIED,
            format!(
                "tool {name}: refused: ctx tool runs only the safe core CLIs ({}); run other tools \
                 with tsh in an agent terminal",
                SAFE.join(", ")
            ),
        )
        .into());
    }
    let ctx = tsh::context::Context::from_env()
        .map_err(|f| Exit::new(u8::try_from(f.code()).unwrap_or(exit::FAILURE), f.message()))?;
    let resolver = tsh::resolve::Resolver::new(ctx.path.clone(), &policy::tshconf::TshConfig::default());
    resolver.walk(name).map_err(|_| {
        Exit::new(exit::FAILURE, format!("tool {name}: not found in CTX_PATH ({})", ctx.path_string()))
    })?;
    let mut sets = Vec::new();
    for a in args {
        let a = a
            .to_str()
            .ok_or_else(|| Exit::new(exit::INVALID, "tool tsh.config: arguments must be KEY=VALUE"))?;
        let (k, v) = a.split_once('=').ok_or_else(|| {
            Exit::new(exit::INVALID, format!("tool tsh.config: expected KEY=VALUE, found {a:?}"))
        })?;
        sets.push((k.to_owned(), v.to_owned()));
    }
    let config = coretools::tsh_config(&ctx.root, &sets).map_err(|e| {
        let mut why = e.to_string();
        let mut src = std::error::Error::source(&e);
        while let Some(s) = src {
            why.push_str(&format!(": {s}"));
            src = s.source();
        }
        Exit::new(u8::try_from(e.exit_code()).unwrap_or(exit::FAILURE), format!("tool tsh.config: {why}"))
    })?;
    print!("{}", config.render());
    Ok(())
}
