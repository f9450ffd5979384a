//! `ctx policy check` and `ctx policy test`.

use std::path::PathBuf;

use clap::Subcommand;
use policy::v0::{self, Decision, Denial, Policy, Query};

use crate::exit::{self, Exit};
use crate::out;

/// Policy v0 tooling.
#[derive(Debug, Subcommand)]
pub enum Cmd {
    /// Check policy files; print `FILE:LINE: error: MESSAGE (ERRNO)` for every bad line.
    ///
    /// Exit 0 when every file is valid, 2 when any line is bad.
    Check {
        /// Policy files to check.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Print a JSON array of {"file","line","field","message","errno"}, one per bad line.
        #[arg(long)]
        json: bool,
    },
    /// Ask a policy file whether SUBJECT has PERM on CLASS:NAME.
    ///
    /// Prints `allow` (exit 0) or `deny: REASON` (exit 13). An invalid file or query exits 2.
    Test {
        /// The policy file.
        file: PathBuf,
        /// The subject type, e.g. coder_t.
        subject: String,
        /// The object, e.g. tool:fs.read.
        object: String,
        /// The permission, e.g. execute.
        perm: String,
    },
}

/// Reads a policy file: a control, so at most [`policy::controls::CONTROL_MAX`] bytes.
fn read(file: &PathBuf) -> anyhow::Result<Vec<u8>> {
    use std::io::Read;
    let max = policy::controls::CONTROL_MAX;
    let mut bytes = Vec::new();
    std::fs::File::open(file)
        .and_then(|f| f.take(max as u64 + 1).read_to_end(&mut bytes))
        .map_err(|e| Exit::io(format!("cannot read {}", file.display()), &e))?;
    if bytes.len() > max {
        return Err(Exit::new(
            exit::INVALID,
            format!("{}: larger than {max} bytes, the most a policy holds", file.display()),
        )
        .into());
    }
    Ok(bytes)
}

/// Runs the command.
pub fn run(cmd: Cmd) -> anyhow::Result<()> {
    match cmd {
        Cmd::Check { files, json } => {
            let mut bad = false;
            let mut all = Vec::new();
            for file in &files {
                let text = read(file)?;
                if let Err(errors) = v0::parse(&text) {
                    bad = true;
                    for e in errors {
                        if json {
                            all.push(
                                serde_json::json!({"file": file, "line": e.line, "field": e.field.as_str(),
                                "message": e.message, "errno": e.errno.to_string()}),
                            );
                            continue;
                        }
                        out::line(format_args!(
                            "{}:{}: error: {}: {} ({})",
                            file.display(),
                            e.line,
                            e.field.as_str(),
                            e.message,
                            e.errno
                        ))?;
                    }
                }
            }
            if json {
                out::line(serde_json::Value::Array(all))?;
            }
            if bad { Err(Exit::quiet(exit::INVALID).into()) } else { Ok(()) }
        }
        Cmd::Test { file, subject, object, perm } => {
            let text = read(&file)?;
            let policy = Policy::from_text(&text).map_err(|errors| {
                let first = &errors[0];
                Exit::new(
                    exit::INVALID,
                    format!(
                        "{} is not a valid policy ({} bad lines; first: line {}: {} ({})); run `ctx policy check`",
                        file.display(),
                        errors.len(),
                        first.line,
                        first.message,
                        first.errno
                    ),
                )
            })?;
            let query = Query::parse(&subject, &object, &perm).map_err(|e| {
                Exit::new(
                    exit::INVALID,
                    format!("invalid query: {}: {} ({})", e.field.as_str(), e.message, e.errno),
                )
            })?;
            match policy.check(&query) {
                Decision::Allow { line } => out::line(format_args!("allow (line {line})")),
                Decision::Deny(reason) => {
                    out::line(format_args!("deny: {}", Denial { query, reason }))?;
                    Err(Exit::quiet(exit::DENIED).into())
                }
            }
        }
    }
}
