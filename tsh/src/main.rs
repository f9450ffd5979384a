//! `tsh`: the CortexFS tool shell.

use std::ffi::OsString;
use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;

use tsh::Fail;
use tsh::context::Context;
use tsh::run::Mode;
use tsh::shell::Shell;

fn exit(code: i32) -> ExitCode {
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

fn report(f: &Fail, what: &str) -> i32 {
    if what.is_empty() {
        eprintln!("tsh: {}", f.message());
    } else {
        eprintln!("tsh: {what}: {}", f.message());
    }
    f.code()
}

/// Reads commands one line at a time: with a prompt on a terminal, silently from a script.
fn repl(sh: &mut Shell) -> i32 {
    let prompt = std::io::stdin().is_terminal();
    let mut last = 0;
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        if prompt {
            let who = sh.context().agent.as_ref().map_or("tsh".to_owned(), |a| a.name.clone());
            print!("{who}$ ");
            let _ = std::io::stdout().flush();
        }
        let Some(line) = lines.next() else { break };
        let Ok(line) = line else { break };
        let Some(words) = shlex::split(&line) else {
            eprintln!("tsh: unbalanced quotes");
            last = 2;
            continue;
        };
        if words.first().is_some_and(|w| w == "exit") {
            return words.get(1).and_then(|c| c.parse().ok()).unwrap_or(last);
        }
        let argv: Vec<OsString> = words.into_iter().map(OsString::from).collect();
        let name = argv.first().map(|a| a.to_string_lossy().into_owned()).unwrap_or_default();
        last = match sh.command(&argv, Mode::Cli, &mut std::io::stdout()) {
            Ok(c) => c,
            Err(f) => report(&f, &name),
        };
    }
    last
}

fn main() -> ExitCode {
    // The terminal's SIGINT reaches the tool in the foreground; tsh itself stays.
    let interrupted = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGQUIT] {
        let _ = signal_hook::flag::register(sig, std::sync::Arc::clone(&interrupted));
    }
    let mut args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let mut mode = Mode::Cli;
    let mut worker = false;
    while let Some(a) = args.first().and_then(|a| a.to_str()) {
        match a {
            "--json" => mode = Mode::Native,
            // The worker `submit` starts.
            "--async-worker" => worker = true,
            "-h" | "--help" => args[0] = "help".into(),
            "-V" | "--version" => {
                println!("tsh {}", env!("CARGO_PKG_VERSION"));
                return ExitCode::SUCCESS;
            }
            "--" => {
                args.remove(0);
                break;
            }
            _ if a.starts_with('-') => {
                eprintln!("tsh: unknown option {a} (try tsh help)");
                return exit(2);
            }
            _ => break,
        }
        if args[0] == "help" {
            break;
        }
        args.remove(0);
    }
    let ctx = match Context::from_env() {
        Ok(c) => c,
        Err(f) => return exit(report(&f, "")),
    };
    let mut sh = Shell::new(ctx);
    if worker {
        return match sh.work() {
            Ok(code) => exit(code),
            Err(f) => exit(report(&f, "async worker")),
        };
    }
    if args.is_empty() {
        if mode == Mode::Native {
            eprintln!("tsh: --json needs a tool name");
            return exit(2);
        }
        return exit(repl(&mut sh));
    }
    let name = args[0].to_string_lossy().into_owned();
    let mut out = std::io::stdout();
    match sh.command(&args, mode, &mut out) {
        Ok(code) => exit(code),
        Err(f) => exit(report(&f, &name)),
    }
}
