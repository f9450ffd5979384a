//! `ctx validate-name`.

use policy::Name;

use crate::exit::{self, Exit};
use crate::out;

/// Checks NAME against the object name grammar; with `mcp`, also that it splits as
/// `<server>.<tool>`.
pub fn run(name: &str, mcp: bool) -> anyhow::Result<()> {
    let valid =
        Name::new(name).map_err(|e| Exit::new(exit::INVALID, format!("invalid name {name:?}: {e}")))?;
    if mcp {
        let Some((server, tool)) = valid.split_mcp() else {
            return Err(Exit::new(
                exit::INVALID,
                format!("invalid mcp name {name:?}: expected <server>.<tool>"),
            )
            .into());
        };
        Name::mcp(server, tool)
            .map_err(|e| Exit::new(exit::INVALID, format!("invalid mcp name {name:?}: {e}")))?;
    }
    out::line(format_args!("valid {valid}"))
}
