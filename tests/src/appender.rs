//! Crash-test plumbing for the append log: runs the `log-appender` helper, kills it, collects what
//! it acknowledged, and checks a log file against those acknowledgements.
//!
//! Checks return `Result` rather than panicking, so that negative controls can assert that a
//! check fails.

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::Duration;

/// One record written by `log-appender`: (round, thread, index).
pub type Record = (u64, u64, u64);

/// A running `log-appender` process. Dropping it kills the process.
#[derive(Debug)]
pub struct Appender {
    child: Option<Child>,
    ready: Receiver<()>,
    acks: Option<JoinHandle<Vec<Record>>>,
}

impl Appender {
    /// Starts `log-appender PATH ROUND THREADS MODE` (`portable`, `uring` or `nosync`).
    pub fn spawn(path: &Path, round: u64, threads: u64, mode: &str) -> Appender {
        let mut child = Command::new(crate::bin("log-appender"))
            .arg(path)
            .args([&round.to_string(), &threads.to_string(), mode])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn log-appender");
        let out = child.stdout.take().expect("stdout is piped");
        let (tx, ready) = mpsc::channel();
        let acks = std::thread::spawn(move || {
            let mut got = Vec::new();
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                let f: Vec<&str> = line.split(' ').collect();
                match f[..] {
                    ["ready"] => {
                        let _ = tx.send(());
                    }
                    ["ack", r, t, i] => got.push((
                        r.parse().expect("ack round"),
                        t.parse().expect("ack thread"),
                        i.parse().expect("ack index"),
                    )),
                    _ => panic!("log-appender printed {line:?}"),
                }
            }
            got
        });
        Appender { child: Some(child), ready, acks: Some(acks) }
    }

    /// Waits until the appender has opened its file; false if it exited or `timeout` passed.
    pub fn wait_ready(&self, timeout: Duration) -> bool {
        match self.ready.recv_timeout(timeout) {
            Ok(()) => true,
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => false,
        }
    }

    /// Kills the appender with SIGKILL, waits for it, and returns every record it acknowledged.
    /// An error when it had exited by itself before the kill.
    pub fn kill(mut self) -> Result<Vec<Record>, String> {
        let mut child = self.child.take().expect("killed once");
        let pid = rustix::process::Pid::from_child(&child);
        rustix::process::kill_process(pid, rustix::process::Signal::KILL).expect("kill -9 log-appender");
        let status = child.wait().expect("wait for log-appender");
        let acks = self.acks.take().expect("joined once").join().expect("ack reader");
        match status.code() {
            None => Ok(acks),
            Some(_) => Err(format!("log-appender exited by itself: {status}")),
        }
    }
}

impl Drop for Appender {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Parses a log written by `log-appender`: complete JSON lines, each with its record's ids.
pub fn parse_records(bytes: &[u8]) -> Result<Vec<Record>, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| format!("the log is not UTF-8: {e}"))?;
    if !text.is_empty() && !text.ends_with('\n') {
        let tail = &text[text.rfind('\n').map_or(0, |i| i + 1)..];
        return Err(format!("torn line visible at the end: {:?}", tail.get(..80).unwrap_or(tail)));
    }
    text.lines()
        .enumerate()
        .map(|(n, l)| {
            let v: serde_json::Value =
                serde_json::from_str(l).map_err(|e| format!("line {} is not JSON ({e}): {l:?}", n + 1))?;
            let field = |k: &str| v[k].as_u64().ok_or_else(|| format!("line {} has no {k:?}: {l:?}", n + 1));
            Ok((field("r")?, field("t")?, field("i")?))
        })
        .collect()
}

/// Checks a log's bytes against what was acknowledged: it parses, no record appears twice, and
/// every acknowledged record is present. Returns the number of records in the log.
pub fn check_records(bytes: &[u8], acked: &HashSet<Record>) -> Result<usize, String> {
    let records = parse_records(bytes)?;
    let set: HashSet<Record> = records.iter().copied().collect();
    if set.len() != records.len() {
        return Err(format!("{} records appear more than once", records.len() - set.len()));
    }
    let mut missing: Vec<&Record> = acked.difference(&set).collect();
    if !missing.is_empty() {
        missing.sort_unstable();
        let n = missing.len();
        missing.truncate(5);
        return Err(format!("{n} acknowledged records lost, for example {missing:?}"));
    }
    Ok(records.len())
}
