//! `cortexfs-core`: the core tools as one multi-call binary. The tool is named by the basename of
//! `argv[0]`, else by `CTX_AUTHORIZED_OBJECT=tool/<name>`, else by the first argument.

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
    let by_argv0 =
        Path::new(&argv0).file_name().and_then(|n| n.to_str()).filter(|n| known(n)).map(str::to_owned);
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
