//! `ctxterm`: own a PTY, run a child on it (tsh by default), serve watch/attach clients on the
//! session socket, exit with the child's status. `ctxterm supervise CONTRACT` is the supervisor
//! of one agent run, outside its sandbox (started by `ctx agent start`, see
//! `ctxterm::launch::supervise`).
//!
//! Exit codes: the child's status (128 + signal when it was killed); 2 usage; 69 when the
//! command cannot be started; 70 internal error.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use ctxterm::term::{self, Options};

/// Own a terminal: run CMD (default: tsh) on a new PTY and serve it on SOCKET.
///
/// Clients connect to SOCKET and send one line: `watch` (output only) or `attach` (output and
/// input). Late clients get the recent scrollback first.
#[derive(Debug, Parser)]
#[command(
    name = "ctxterm",
    version,
    about,
    subcommand_negates_reqs = true,
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    run: Option<Run>,
    /// The session socket to listen on (created with mode 0600).
    #[arg(long, required_unless_present = "headless")]
    socket: Option<PathBuf>,
    /// Scrollback kept for late clients, in bytes.
    #[arg(long, default_value_t = term::DEFAULT_SCROLLBACK)]
    scrollback: usize,
    /// Initial window size as COLSxROWS.
    #[arg(long, value_parser = parse_size)]
    size: Option<(u16, u16)>,
    /// Start the command only once the first client has connected (it then sees all output).
    #[arg(long)]
    wait_client: bool,
    /// Keep the terminal's output (its last MiB at most) in this file and `<file>.1`, for
    /// after the run.
    #[arg(long, value_name = "FILE", conflicts_with = "headless")]
    keep_output: Option<PathBuf>,
    /// Run the command on ctxterm's own standard streams, without a PTY or a socket, and
    /// exit with its status.
    #[arg(long)]
    headless: bool,
    /// Read a secret from this descriptor (to its end, at most 64 KiB) and give it to the
    /// command, and only to it, as the variable --key-env names.
    #[arg(long, requires = "key_env", value_name = "FD")]
    key_fd: Option<i32>,
    /// The variable --key-fd's secret is given in.
    #[arg(long, requires = "key_fd", value_name = "NAME")]
    key_env: Option<String>,
    /// The command to run.
    #[arg(last = true)]
    command: Vec<String>,
}

/// Other things ctxterm does.
#[derive(Debug, clap::Subcommand)]
enum Run {
    /// Supervise one agent run from its launch contract (started by `ctx agent start`).
    #[command(hide = true)]
    Supervise {
        /// The launch contract.
        contract: PathBuf,
        /// A descriptor holding the run's model key (read to its end, then closed).
        #[arg(long, value_name = "FD")]
        key_fd: Option<i32>,
    },
}

fn parse_size(s: &str) -> Result<(u16, u16), String> {
    let (c, r) = s.split_once('x').ok_or("expected COLSxROWS")?;
    Ok((c.parse().map_err(|_| "bad columns")?, r.parse().map_err(|_| "bad rows")?))
}

fn main() -> ExitCode {
    // Before anything else (a key it reads, the caller's streams, the PTY's master, the terminal
    // socket), in every mode, headless too: processes of the same uid (the agent's) may neither
    // trace this one, read or write its memory through /proc, nor take its descriptors with
    // pidfd_getfd. The child, once it execs, is dumpable again.
    if let Err(e) = rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable) {
        eprintln!("ctxterm: cannot make itself undumpable: {e}");
        return ExitCode::from(70);
    }
    // Usage errors say who is speaking, like every other error, and exit 2.
    let cli = Cli::try_parse().unwrap_or_else(|e| {
        if !e.use_stderr() {
            e.exit();
        }
        let shown = e.render().to_string();
        eprint!("ctxterm: {}", shown.strip_prefix("error: ").unwrap_or(&shown));
        std::process::exit(2);
    });
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    if let Some(Run::Supervise { contract, key_fd }) = &cli.run {
        return match ctxterm::launch::supervise(contract, *key_fd) {
            // The run's status is the supervisor's.
            Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
            Err(e) => {
                eprintln!("ctxterm: {e}");
                ExitCode::from(e.code())
            }
        };
    }
    let mut env = Vec::new();
    if let (Some(fd), Some(name)) = (cli.key_fd, &cli.key_env) {
        match term::read_secret_fd(fd) {
            Ok(key) => env.push((name.clone().into(), std::os::unix::ffi::OsStringExt::from_vec(key))),
            Err(e) => {
                eprintln!("ctxterm: --key-fd {fd}: {e}");
                return ExitCode::from(69);
            }
        }
    }
    if cli.headless {
        let command = if cli.command.is_empty() { vec!["tsh".to_owned()] } else { cli.command };
        return match term::headless(&command, &env) {
            Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
            Err(e) => {
                eprintln!("ctxterm: cannot run {}: {e}", command[0]);
                ExitCode::from(69)
            }
        };
    }
    let Some(socket) = cli.socket else {
        eprintln!("ctxterm: --socket is required");
        return ExitCode::from(2);
    };
    let command = if cli.command.is_empty() { vec!["tsh".to_owned()] } else { cli.command };
    let opts = Options {
        socket,
        command,
        scrollback: cli.scrollback,
        size: cli.size,
        wait_client: cli.wait_client,
        env,
        keep: cli.keep_output,
    };
    match term::run(&opts) {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(term::RunError::Spawn(e)) => {
            eprintln!("ctxterm: cannot run {}: {e}", opts.command[0]);
            ExitCode::from(69)
        }
        Err(term::RunError::Io(e)) => {
            eprintln!("ctxterm: {e}");
            ExitCode::from(1)
        }
    }
}
