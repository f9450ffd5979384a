//! `ctxmcp`: lists the tools of one stdio MCP server, writes `cortexfs.object/v2` candidates for
//! them, and, run under a projected tool's name (by tsh, from the installed copy), serves that
//! tool: JSON input in, the result's content out.
//!
//! | code | meaning |
//! |---|---|
//! | 0 | ok |
//! | 1 | the tool reported an error (`isError`), or the server answered with a JSON-RPC error |
//! | 2 | usage or invalid input: arguments, JSON input, config file, locator |
//! | 13 | a file could not be read for lack of permission |
//! | 69 | the server cannot be used: it would not start, died, timed out, printed garbage, or speaks a refused protocol version |
//! | 70 | internal error |

use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use ctxmcp::call::{self, Target};
use ctxmcp::client::{CallResult, Client, Options};
use ctxmcp::{Error, config, exit, project};

/// Project the tools of an MCP server into ordinary CortexFS tools.
#[derive(Debug, Parser)]
#[command(name = "ctxmcp", version, about, long_about = None, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

/// The server to speak to.
#[derive(Debug, Args)]
struct Server {
    /// The MCP config file (`{"mcpServers": {NAME: {"command", "args", "env"}}}`).
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    /// The server's name in it.
    #[arg(long, value_name = "NAME")]
    server: String,
    /// How long each request may take, in seconds.
    #[arg(long, value_name = "SECS", default_value = "60", value_parser = seconds)]
    timeout: Duration,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Start the server and print its tools, one `server.tool<TAB>description` line each.
    List {
        #[command(flatten)]
        server: Server,
        /// Print one JSON array of {name, tool, description, schema}.
        #[arg(long)]
        json: bool,
    },
    /// Write a manifest candidate per tool under DIR (install with `ctx object install`).
    ///
    /// Prints the path of each manifest written; tools whose names cannot be mapped are
    /// reported on stderr and skipped. Candidates grant nothing: their policy is empty.
    Project {
        #[command(flatten)]
        server: Server,
        /// The config file's absolute path as the agent will see it (written into `.d/mcp`).
        #[arg(long, value_name = "FILE")]
        runtime_config: String,
        /// Where the candidates go (never under /ctx).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
    /// Call one tool of the server and print its result.
    Call {
        #[command(flatten)]
        server: Server,
        /// Print `structuredContent` as one JSON line when the tool returns it.
        #[arg(long)]
        structured: bool,
        /// The remote tool.
        tool: String,
        /// Its input, a JSON object (default: stdin when it is not a terminal, else `{}`).
        input: Option<OsString>,
    },
}

fn seconds(s: &str) -> Result<Duration, String> {
    let f: f64 = s.parse().map_err(|_| format!("{s:?} is not a number of seconds"))?;
    Duration::try_from_secs_f64(f)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| format!("{s:?} is not positive"))
}

fn options(s: &Server) -> Options {
    Options { timeout: s.timeout, ..Options::default() }
}

fn start(s: &Server) -> anyhow::Result<Client> {
    let cfg = config::load(&s.config, &s.server)?;
    Client::start(&cfg, options(s)).with_context(|| format!("server {:?}", s.server))
}

/// Writes to stdout; a closed pipe is not an error.
fn out(f: impl FnOnce(&mut std::io::StdoutLock) -> std::io::Result<()>) -> anyhow::Result<()> {
    match f(&mut std::io::stdout().lock()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e).context("writing the output"),
        _ => Ok(()),
    }
}

fn list(s: &Server, json: bool) -> anyhow::Result<u8> {
    let mut c = start(s)?;
    let tools = c.list_tools().with_context(|| format!("server {:?}", s.server))?;
    c.shutdown();
    let mut rows = Vec::new();
    for t in &tools {
        match policy::Name::mcp(&s.server, &t.name) {
            Ok(name) => rows.push((name, t)),
            Err(e) => eprintln!("ctxmcp: tool {:?} cannot be projected: {e}", t.name),
        }
    }
    out(|w| {
        if json {
            let v: Vec<serde_json::Value> = rows
                .iter()
                .map(|(n, t)| {
                    serde_json::json!({"name": n.as_str(), "tool": t.name, "description": t.description,
                        "schema": t.input_schema})
                })
                .collect();
            return writeln!(w, "{}", serde_json::Value::Array(v));
        }
        for (n, t) in &rows {
            let d = t.description.as_deref().unwrap_or("").lines().next().unwrap_or("");
            writeln!(w, "{n}\t{}", d.trim().replace('\t', " "))?;
        }
        Ok(())
    })?;
    Ok(exit::OK)
}

fn project(s: &Server, runtime_config: &str, dir: &Path) -> anyhow::Result<u8> {
    let mut c = start(s)?;
    let tools = c.list_tools().with_context(|| format!("server {:?}", s.server))?;
    c.shutdown();
    let exe = std::env::current_exe().context("finding the ctxmcp executable")?;
    let (done, skipped) = project::project(&s.server, runtime_config, &tools, &exe, dir)?;
    for k in &skipped {
        eprintln!("ctxmcp: skipping tool {:?}: {}", k.tool, k.why);
    }
    out(|w| done.iter().try_for_each(|p| writeln!(w, "{}", p.manifest.display())))?;
    if done.is_empty() && !skipped.is_empty() {
        eprintln!("ctxmcp: no tool of server {:?} could be projected", s.server);
        return Ok(exit::FAILURE);
    }
    Ok(exit::OK)
}

/// Prints a result; an `isError` result goes to stderr and exits 1.
fn finish(tool: &str, r: &CallResult, structured: bool) -> anyhow::Result<u8> {
    if r.is_error {
        eprintln!("ctxmcp: {tool}: {}", call::error_message(r));
        return Ok(exit::FAILURE);
    }
    out(|w| call::render(r, structured, w))?;
    Ok(exit::OK)
}

fn call_cmd(s: &Server, tool: &str, input: Option<OsString>, structured: bool) -> anyhow::Result<u8> {
    let input = call::read_input(input.as_slice())?;
    let target = Target { config: s.config.clone(), server: s.server.clone(), tool: tool.to_owned() };
    let r = call::call(&target, input, options(s)).with_context(|| format!("server {:?}", s.server))?;
    finish(tool, &r, structured)
}

/// Serves the installed tool tsh authorized, run under its name.
fn serve(name: &OsStr, args: &[OsString]) -> anyhow::Result<u8> {
    let name = name.to_string_lossy();
    let Some(object) = std::env::var_os("CTX_AUTHORIZED_OBJECT") else {
        return Err(Error::Invalid(format!(
            "{name}: CTX_AUTHORIZED_OBJECT is not set: run the tool through tsh, or use `ctxmcp call`"
        ))
        .into());
    };
    let root = std::env::var_os("CTX_ROOT").map_or_else(|| PathBuf::from("/ctx"), PathBuf::from);
    let target = call::locate(&root, &object.to_string_lossy())?;
    let input = call::read_input(args)?;
    let native = std::env::var_os("CTX_TOOL_MODE").is_some_and(|m| m == "native");
    let r = call::call(&target, input, Options::default()).with_context(|| format!("{name}"))?;
    finish(&name, &r, native)
}

fn run() -> anyhow::Result<u8> {
    let mut argv: Vec<OsString> = std::env::args_os().collect();
    let arg0 = if argv.is_empty() { OsString::new() } else { argv.remove(0) };
    let name = Path::new(&arg0).file_name().unwrap_or_default().to_owned();
    if !name.is_empty() && name != "ctxmcp" {
        return serve(&name, &argv);
    }
    // Usage errors say who is speaking, like every other error, and exit 2.
    let cli = Cli::try_parse().unwrap_or_else(|e| {
        if !e.use_stderr() {
            e.exit();
        }
        let shown = e.render().to_string();
        eprint!("ctxmcp: {}", shown.strip_prefix("error: ").unwrap_or(&shown));
        std::process::exit(2);
    });
    match cli.command {
        Cmd::List { server, json } => list(&server, json),
        Cmd::Project { server, runtime_config, out } => project(&server, &runtime_config, &out),
        Cmd::Call { server, structured, tool, input } => call_cmd(&server, &tool, input, structured),
    }
}

fn main() -> ExitCode {
    // A panic is a bug: report it and exit 70, never 101.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default_hook(info);
        std::process::exit(i32::from(exit::INTERNAL));
    }));
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    match run() {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("ctxmcp: {e:#}");
            let code =
                e.chain().find_map(|c| c.downcast_ref::<Error>()).map_or(exit::FAILURE, Error::exit_code);
            ExitCode::from(code)
        }
    }
}
