//! `ctx man [TOPIC]`: the manuals, read from `/ctx/shared/cortexfs-docs/` where `ctx bootstrap`
//! installed them, or from the copy built into this binary when they are not there.

use std::io::Read;
use std::path::PathBuf;

use coretools::docs::{self, PAGES};

use crate::exit::{self, Exit};
use crate::out;

/// The most bytes of an installed page read.
const MAX_PAGE: u64 = 1 << 20;

/// Arguments of `ctx man`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The topic (or an alias: agent, tool, model, session, policy, queue...); none lists them.
    topic: Option<String>,
    /// The host's /ctx mount, where the installed manuals are read.
    #[arg(long, default_value = "/ctx")]
    ctx: PathBuf,
    /// Read the copy built into this binary, not the installed one.
    #[arg(long)]
    builtin: bool,
    /// With no topic: print a JSON array of {"topic","title","aliases"}.
    #[arg(long)]
    json: bool,
}

fn installed(a: &Args, page: &docs::Page) -> Option<String> {
    let p = a.ctx.join("shared").join(docs::SPACE).join(page.installed());
    let f = std::fs::File::open(p).ok()?;
    let mut text = String::new();
    f.take(MAX_PAGE).read_to_string(&mut text).ok()?;
    Some(text)
}

/// Runs `ctx man`.
pub fn run(a: Args) -> anyhow::Result<()> {
    let Some(topic) = &a.topic else {
        let title = |p: &docs::Page| p.text.lines().next().unwrap_or("").trim_start_matches("# ").to_owned();
        if a.json {
            let v: Vec<serde_json::Value> = PAGES
                .iter()
                .map(|p| serde_json::json!({"topic": p.topic, "title": title(p), "aliases": p.aliases}))
                .collect();
            return out::line(serde_json::Value::Array(v));
        }
        let mut list = out::Listing::new("TOPIC\tTITLE\tALIASES");
        for p in PAGES {
            let aliases = if p.aliases.is_empty() { "-".to_owned() } else { p.aliases.join(",") };
            list.row(format_args!("{}\t{}\t{aliases}", p.topic, title(p)))?;
        }
        return Ok(());
    };
    let page = docs::find(topic).ok_or_else(|| {
        let topics: Vec<&str> = PAGES.iter().map(|p| p.topic).collect();
        Exit::new(exit::INVALID, format!("no manual for {topic:?}: the topics are {}", topics.join(" ")))
    })?;
    let text = match (a.builtin, installed(&a, page)) {
        (false, Some(t)) => {
            if t != page.text {
                eprintln!(
                    "ctx: note: the installed {} differs from this ctx's copy (ctx bootstrap --check; ctx man --builtin)",
                    page.installed().display()
                );
            }
            t
        }
        _ => page.text.to_owned(),
    };
    if std::io::IsTerminal::is_terminal(&std::io::stdout()) && paged(text.trim_end()) {
        return Ok(());
    }
    out::line(text.trim_end())
}

/// Shows `text` through `$PAGER` (default `less -FRX`: it leaves a page that fits on the
/// screen at once); false when no pager could be started, and the text is then printed.
fn paged(text: &str) -> bool {
    use std::io::Write;
    let pager =
        std::env::var("PAGER").ok().filter(|p| !p.trim().is_empty()).unwrap_or_else(|| "less -FRX".into());
    // As a shell command, as git and man run it (quoting in $PAGER works).
    let Ok(mut child) =
        std::process::Command::new("sh").args(["-c", &pager]).stdin(std::process::Stdio::piped()).spawn()
    else {
        return false;
    };
    if let Some(mut i) = child.stdin.take() {
        // A pager quit early closes its input: nothing more to show.
        let _ = writeln!(i, "{text}");
    }
    let _ = child.wait();
    true
}
