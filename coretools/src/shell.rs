//! `shell.exec`: runs a command in the workspace with inherited stdio and the environment as
//! received, and exits with its status.

use std::num::NonZeroU64;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use rustix::process::{Pid, Signal, WaitId, WaitIdOptions};
use serde::Deserialize;

use crate::input::{self, Input, non_null};
use crate::workspace::Workspace;
use crate::{Error, Result, Tool, ToolInfo};

/// How long a timed-out command has between SIGTERM and SIGKILL.
const GRACE: Duration = Duration::from_secs(2);

pub(crate) const EXEC: Tool = Tool {
    info: ToolInfo {
        name: "shell.exec",
        description: "Runs a command in the workspace with inherited stdio and exits with its \
                      status (128+signal when killed by one). JSON `cmd` runs under `/bin/sh -c`; \
                      command-line arguments are executed directly, without a shell. After \
                      `timeout_ms` the command's process group gets SIGTERM, then SIGKILL 2 s \
                      later, and the tool exits 124.\n",
        schema: r#"{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "properties": {
    "cmd": {"type": "string", "description": "The command line, run by /bin/sh -c in the workspace."},
    "timeout_ms": {"type": "integer", "minimum": 1, "description": "Kill the command after this many milliseconds (default: no limit)."}
  },
  "required": ["cmd"],
  "additionalProperties": false
}
"#,
    },
    usage: "shell.exec CMD [ARG...]",
    run: exec,
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ExecInput {
    cmd: String,
    #[serde(default, deserialize_with = "non_null")]
    timeout_ms: Option<NonZeroU64>,
}

fn exec(input: Input) -> Result<i32> {
    let (mut cmd, program, timeout) = match input {
        Input::Json(json) => {
            let req: ExecInput = input::json(&json)?;
            let mut cmd = Command::new("/bin/sh");
            cmd.arg("-c").arg(req.cmd);
            (cmd, "/bin/sh".to_owned(), req.timeout_ms.map(NonZeroU64::get))
        }
        Input::Args(args) => {
            let mut args = args.into_iter();
            let program = args.next().ok_or_else(|| Error::usage(&EXEC))?;
            let mut cmd = Command::new(&program);
            cmd.args(args);
            (cmd, program.to_string_lossy().into_owned(), None)
        }
    };
    // Opening the workspace proves it is there, so a failed spawn is about the command.
    cmd.current_dir(Workspace::open()?.path());
    if timeout.is_some() {
        cmd.process_group(0);
    }
    let child = cmd.spawn().map_err(|source| Error::Spawn { what: program, source })?;
    match timeout {
        None => wait(child),
        Some(ms) => wait_for(child, ms),
    }
}

fn wait(mut child: Child) -> Result<i32> {
    let status = child.wait().map_err(|e| Error::Internal(format!("wait: {e}")))?;
    Ok(status_code(status))
}

/// Waits at most `ms`, then kills the child's process group. The child is not reaped before the
/// group is killed, so its id cannot name another group meanwhile.
fn wait_for(child: Child, ms: u64) -> Result<i32> {
    let pid = Pid::from_child(&child);
    let (tx, exited) = mpsc::channel();
    thread::spawn(move || {
        let _ = rustix::process::waitid(WaitId::Pid(pid), WaitIdOptions::EXITED | WaitIdOptions::NOWAIT);
        let _ = tx.send(());
    });
    if exited.recv_timeout(Duration::from_millis(ms)).is_ok() {
        return wait(child);
    }
    let _ = rustix::process::kill_process_group(pid, Signal::TERM);
    let _ = exited.recv_timeout(GRACE);
    let _ = rustix::process::kill_process_group(pid, Signal::KILL);
    wait(child)?;
    Err(Error::Timeout(ms))
}

fn status_code(status: ExitStatus) -> i32 {
    status.code().or_else(|| status.signal().map(|s| 128 + s)).unwrap_or(70)
}
