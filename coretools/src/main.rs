//! `cortexfs-core`: the core tools as one multi-call binary. A tool is the object it was
//! executed as: the basename of the file the kernel executed (`/proc/self/exe`, as
//! `/ctx/tool/fs.read`), else of the path given to `execve` (`AT_EXECFN`). Neither `argv[0]`
//! nor the environment can make one object run another's code (`exec -a /ctx/tool/shell.exec
//! /ctx/tool/fs.read` runs `fs.read`). Only the binary executed under its own name
//! (`cortexfs-core`) is named by `argv[0]`, else by `CTX_AUTHORIZED_OBJECT=tool/<name>`, else
//! by the first argument.

use std::env;
use std::ffi::OsString;
use std::io::{self, Write};
use std::path::Path;
use std::process::ExitCode;

fn known(name: &str) -> bool {
    coretools::TOOLS.iter().any(|t| t.name == name)
}

fn main() -> ExitCode {
    let mut args = env::args_os();
    let argv0 = args.next().unwrap_or_default();
    let mut args: Vec<OsString> = args.collect();
    let base = |p: &Path| p.file_name().and_then(|n| n.to_str()).filter(|n| known(n)).map(str::to_owned);
    // The object executed, as the kernel has it: this names the tool whatever argv[0] says.
    let executed = std::fs::read_link("/proc/self/exe").ok().and_then(|p| base(&p)).or_else(|| {
        let execfn = rustix::param::linux_execfn().to_str().ok()?;
        base(Path::new(execfn))
    });
    if let Some(name) = executed {
        return ExitCode::from(u8::try_from(coretools::run(&name, args)).unwrap_or(70));
    }
    let by_argv0 = base(Path::new(&argv0));
    let by_env = || {
        env::var("CTX_AUTHORIZED_OBJECT")
            .ok()
            .and_then(|o| o.strip_prefix("tool/").map(str::to_owned))
            .filter(|n| known(n))
    };
    if by_argv0.is_none() && args.first().is_some_and(|a| a == "--version" || a == "-V") {
        println!("cortexfs-core {}", env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    let name = match by_argv0.or_else(by_env) {
        Some(name) => name,
        None if args.is_empty() || args[0] == "--help" || args[0] == "-h" => {
            let help = !args.is_empty();
            let mut text = String::from("usage: cortexfs-core TOOL [ARG...]   (TOOL --help for more)\n");
            for tool in coretools::TOOLS {
                text.push_str(&format!("\n{}\n    {}", tool.name, tool.description));
            }
            if !help {
                eprint!("cortexfs-core: {text}");
                return ExitCode::from(2);
            }
            let _ = io::stdout().write_all(text.as_bytes());
            return ExitCode::SUCCESS;
        }
        None => args.remove(0).to_string_lossy().into_owned(),
    };
    ExitCode::from(u8::try_from(coretools::run(&name, args)).unwrap_or(70))
}
