//! `ctx`: the CortexFS front end. It parses arguments, installs logging, calls the libraries and
//! maps errors to exit codes (see [`exit`]).
// The arguments' doc comments are `--help` text, where <storage>-style placeholders are
// words, not HTML.
#![allow(rustdoc::invalid_html_tags)]

mod cmd;
mod exit;
mod out;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// CortexFS: the filesystem agents run on.
#[derive(Debug, Parser)]
#[command(name = "ctx", version, about, long_about = None, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve /ctx from a storage directory, in the foreground, until SIGINT or SIGTERM.
    Mount(cmd::mount::Args),
    /// Check and test policy v0 files.
    #[command(subcommand)]
    Policy(cmd::policy::Cmd),
    /// The configuration's generations: what is staged, what is active, who committed what,
    /// and rollback. Only a commit changes what agents are served.
    #[command(subcommand)]
    Config(cmd::config::Cmd),
    /// Create, list, inspect and remove agent objects.
    #[command(subcommand)]
    Agent(cmd::agent::Cmd),
    /// Install, list, inspect and remove models, and set the aliases main and helper.
    #[command(subcommand)]
    Model(cmd::model::Cmd),
    /// Store, list and remove secrets (model keys) in root's secret store; values come from stdin.
    #[command(subcommand)]
    Secret(cmd::model::SecretCmd),
    /// Check and install objects.
    #[command(subcommand)]
    Object(cmd::object::Cmd),
    /// Install a package (a directory with cortexfs.toml): its tools and agents, all or nothing.
    ///
    /// Every file is checked before anything is written; the objects are published through the
    /// object store; if one fails, the ones already published are removed again. Changes no other object's policy.
    Install(cmd::package::InstallArgs),
    /// Remove an installed package's objects (those not replaced since). Shows the plan unless --yes.
    Uninstall(cmd::package::UninstallArgs),
    /// Publish, claim, finish and recover jobs of a file-native queue.
    #[command(subcommand)]
    Queue(cmd::queue::Cmd),
    /// Create, list and remove shared spaces (tool/, data/, queue/, agent/ with an owner,
    /// group and mode).
    #[command(subcommand)]
    Shared(cmd::shared::Cmd),
    /// Create, list and remove agent views (root; through the daemon's control socket).
    #[command(subcommand)]
    View(cmd::view::Cmd),
    /// Send a user turn to an agent through its socket (agent/NAME.sock); --wait prints the
    /// answer, --json the frames.
    Send(cmd::send::Args),
    /// Cancel a run started through an agent's socket: by its id, or every run of a session.
    Cancel(cmd::send::CancelArgs),
    /// Install the default layout, the core tools and tsh into storage (idempotent).
    Bootstrap(cmd::bootstrap::Args),
    /// Read a manual: the installed copy under /ctx/shared/cortexfs-docs, else the built-in one.
    Man(cmd::man::Args),
    /// Write man pages or shell completions of ctx (for packaging; `make install` runs it).
    #[command(hide = true)]
    Generate(cmd::generate::Args),
    /// Print the completion script of a shell (bash, zsh, fish): commands, flags, and agent
    /// and session names as /ctx serves them. `source <(ctx completions bash)`.
    Completions(cmd::complete::Args),
    /// Check what this host needs for CortexFS; each failure says what to do (exit 1).
    Doctor(cmd::doctor::Args),
    /// Print where something is under /ctx (a shared space, a tool, an agent, a session).
    #[command(subcommand)]
    Path(cmd::path::Kind),
    /// Every running agent at a glance, live, the most recently active first (q quits).
    Top(cmd::top::Args),
    /// Print the daemon's status (its `status` file), readably or as JSON.
    Status {
        /// The host's /ctx mount.
        #[arg(long, default_value = "/ctx")]
        ctx: std::path::PathBuf,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Run a safe core CLI (tsh.config); every other tool runs through tsh.
    Tool {
        /// The tool.
        name: String,
        /// Its arguments.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// Check a name against the object name grammar.
    ValidateName {
        /// The name.
        name: String,
        /// Also require the MCP form `<server>.<tool>`.
        #[arg(long)]
        mcp: bool,
    },
}

fn main() -> ExitCode {
    // A panic is a bug: report it and exit 70, never 101.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default_hook(info);
        std::process::exit(i32::from(exit::INTERNAL));
    }));
    // Installed as mount(8)'s helper for the type fuse.cortexfs.
    // Arguments are read as the kernel gave them: one that is not UTF-8 is a usage error (2),
    // said by clap below or here, never a panic.
    let argv0 = std::env::args_os().next();
    if argv0
        .as_deref()
        .and_then(|a| std::path::Path::new(a).file_name())
        .is_some_and(|n| n == "mount.fuse.cortexfs")
    {
        let argv: Result<Vec<String>, _> = std::env::args_os().skip(1).map(|a| a.into_string()).collect();
        return match argv {
            Ok(argv) => report(cmd::mount::helper(&argv)),
            Err(bad) => report(Err(exit::Exit::new(
                exit::INVALID,
                format!("an argument is not UTF-8: {}", bad.to_string_lossy()),
            )
            .into())),
        };
    }
    // A shell asking for completions (`COMPLETE=bash ctx -- WORDS`, from the script `ctx
    // completions` prints) is answered here, and nothing else runs.
    clap_complete::CompleteEnv::with_factory(<Cli as clap::CommandFactory>::command)
        .var(cmd::complete::VAR)
        .bin("ctx")
        .completer("ctx")
        .complete();
    // Usage errors say who is speaking, like every other error, and exit 2.
    let cli = Cli::try_parse().unwrap_or_else(|e| {
        if !e.use_stderr() {
            e.exit();
        }
        let shown = e.render().to_string();
        eprint!("ctx: {}", shown.strip_prefix("error: ").unwrap_or(&shown));
        std::process::exit(2);
    });
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let result = match cli.command {
        Command::Mount(a) => cmd::mount::run(a),
        Command::Policy(c) => cmd::policy::run(c),
        Command::Agent(c) => cmd::agent::run(c),
        Command::Config(c) => cmd::config::run(c),
        Command::Object(c) => cmd::object::run(c),
        Command::Model(c) => cmd::model::run(c),
        Command::Secret(c) => cmd::model::secret(c),
        Command::Install(a) => cmd::package::install(a),
        Command::Uninstall(a) => cmd::package::uninstall(a),
        Command::Queue(c) => cmd::queue::run(c),
        Command::Shared(c) => cmd::shared::run(c),
        Command::View(c) => cmd::view::run(c),
        Command::Send(a) => cmd::send::run(a),
        Command::Cancel(a) => cmd::send::cancel(a),
        Command::Bootstrap(a) => cmd::bootstrap::run(a),
        Command::Doctor(a) => cmd::doctor::run(a),
        Command::Man(a) => cmd::man::run(a),
        Command::Completions(a) => cmd::complete::run(a),
        Command::Generate(a) => cmd::generate::run(a, <Cli as clap::CommandFactory>::command()),
        Command::Path(k) => cmd::path::run(k),
        Command::Top(a) => cmd::top::run(a),
        Command::Status { ctx, json } => cmd::path::status(&ctx, json),
        Command::Tool { name, args } => cmd::tool::run(&name, &args),
        Command::ValidateName { name, mcp } => cmd::name::run(&name, mcp),
    };
    report(result)
}

/// The exit of a command's result, its message on stderr.
fn report(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::from(exit::OK),
        Err(e) => match e.downcast_ref::<exit::Exit>() {
            Some(x) => {
                if let Some(m) = &x.message {
                    eprintln!("ctx: {m}");
                }
                ExitCode::from(x.code)
            }
            None => {
                eprintln!("ctx: {e:#}");
                ExitCode::from(exit::FAILURE)
            }
        },
    }
}
