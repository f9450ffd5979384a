//! `ctx queue ...`: the file-native job queue of a shared space.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use clap::{Subcommand, ValueEnum};
use ringfs::queue::{self, Finish, Policy, Queue};

use crate::exit::{self, Exit};
use crate::out;

/// Queue commands.
#[derive(Debug, Subcommand)]
pub enum Cmd {
    /// Publish FILE as a job (its name must end in .req.json).
    Publish {
        /// The queue directory.
        dir: PathBuf,
        /// The request file; the job takes its file name.
        file: PathBuf,
    },
    /// Claim and lease the next pending job; prints its name (nothing, exit 0, when empty).
    Claim {
        /// The queue directory.
        dir: PathBuf,
        /// The worker's name.
        #[arg(long)]
        worker: String,
        /// Print `{"job": NAME, "request": PATH}`.
        #[arg(long)]
        json: bool,
    },
    /// Finish a claimed job with a result file.
    Finish {
        /// The queue directory.
        dir: PathBuf,
        /// The job name.
        job: String,
        /// The worker that claimed it.
        #[arg(long)]
        worker: String,
        /// The result file.
        #[arg(long)]
        result: PathBuf,
        /// File it under failed/ instead of done/.
        #[arg(long)]
        failed: bool,
    },
    /// Recover claims whose lease expired (fencing the stalled worker) and reconcile partial states.
    Recover {
        /// The queue directory.
        dir: PathBuf,
        /// requeue: back to pending/; fail: to failed/ with a result saying so.
        #[arg(long, value_enum, default_value_t = PolicyArg::Requeue)]
        policy: PolicyArg,
        /// Lease time in milliseconds.
        #[arg(long, default_value_t = 60_000)]
        lease_ms: u64,
        /// Also settle incomplete pairs: claims whose claimer died before leasing them, once older
        /// than the lease time, as expired claims.
        #[arg(long)]
        reconcile: bool,
        /// Print one JSON object:
        /// {"requeued","failed","reconciled","live","deferred","incomplete","conflicts"}.
        #[arg(long)]
        json: bool,
    },
    /// List jobs by state, and entries that are not jobs.
    Ls {
        /// The queue directory.
        dir: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Work the queue: claim a job, run CMD with the request on stdin, finish with its stdout
    /// (failed/ when it exits non-zero); until the queue is empty.
    Work {
        /// The queue directory.
        dir: PathBuf,
        /// The worker's name.
        #[arg(long)]
        worker: String,
        /// Do not hold a lock on the lease while the job runs: rely on lease expiry only.
        #[arg(long)]
        no_lock: bool,
        /// The command to run for each job.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum PolicyArg {
    Requeue,
    Fail,
}

/// Opens the queue at `dir`, which must be one: only a publish makes a queue (a typo in a
/// worker's or a reader's path is an error, not a new queue).
fn open(dir: &PathBuf, lease: Duration) -> Result<Queue, Exit> {
    if !dir.join("pending").is_dir() {
        return Err(Exit::new(exit::INVALID, format!("{}: no queue there", dir.display())));
    }
    Queue::open(dir, lease).map_err(fail)
}

/// Opens the queue at `dir`, made when missing (a publish).
fn open_or_make(dir: &PathBuf, lease: Duration) -> Result<Queue, Exit> {
    Queue::open(dir, lease).map_err(fail)
}

fn fail(e: ringfs::Error) -> Exit {
    let code = match &e {
        ringfs::Error::Invalid(_) => exit::INVALID,
        ringfs::Error::Io { source, .. } if source.kind() == std::io::ErrorKind::PermissionDenied => {
            exit::DENIED
        }
        ringfs::Error::Unsupported { .. } => exit::UNAVAILABLE,
        _ => exit::FAILURE,
    };
    Exit::new(code, e.to_string())
}

/// Runs the command.
pub fn run(cmd: Cmd) -> anyhow::Result<()> {
    match cmd {
        Cmd::Publish { dir, file } => {
            let name = file
                .file_name()
                .and_then(|n| n.to_str())
                .ok_or_else(|| Exit::new(exit::INVALID, format!("{}: no file name", file.display())))?
                .to_owned();
            queue::check_job_name(&name)
                .map_err(|e| Exit::new(exit::INVALID, format!("invalid job name: {e}")))?;
            let bytes =
                std::fs::read(&file).map_err(|e| Exit::io(format!("cannot read {}", file.display()), &e))?;
            open_or_make(&dir, queue::DEFAULT_LEASE)?.publish(&name, &bytes).map_err(fail)?;
            out::line(format_args!("published {name}"))
        }
        Cmd::Claim { dir, worker, json } => {
            let q = open(&dir, queue::DEFAULT_LEASE)?;
            let Some(c) = q.claim(&worker, false).map_err(fail)? else { return Ok(()) };
            if json {
                let request = dir.join("claimed").join(&c.job).join(&c.job);
                out::line(serde_json::json!({"job": c.job, "worker": worker, "request": request}))
            } else {
                out::line(&c.job)
            }
        }
        Cmd::Finish { dir, job, worker, result, failed } => {
            let bytes = std::fs::read(&result)
                .map_err(|e| Exit::io(format!("cannot read {}", result.display()), &e))?;
            let q = open(&dir, queue::DEFAULT_LEASE)?;
            let c = q.resume(&job, &worker).map_err(fail)?;
            match q.finish(c, &bytes, failed).map_err(fail)? {
                Finish::Committed => {
                    out::line(format_args!("{} {job}", if failed { "failed" } else { "done" }))
                }
                Finish::Fenced => Err(Exit::new(
                    exit::FAILURE,
                    format!("{job}: fenced: the claim was recovered; nothing committed"),
                )
                .into()),
            }
        }
        Cmd::Recover { dir, policy, lease_ms, reconcile, json } => {
            let q = open(&dir, Duration::from_millis(lease_ms))?;
            let p = match policy {
                PolicyArg::Requeue => Policy::Requeue,
                PolicyArg::Fail => Policy::Fail,
            };
            let r = if reconcile { q.reconcile(p) } else { q.recover(p) }.map_err(fail)?;
            if json {
                out::line(serde_json::json!({"requeued": r.requeued, "failed": r.failed,
                    "reconciled": r.reconciled, "live": r.live, "deferred": r.deferred,
                    "incomplete": r.incomplete, "conflicts": r.conflicts}))?;
                return if r.conflicts.is_empty() { Ok(()) } else { Err(Exit::quiet(exit::FAILURE).into()) };
            }
            for j in &r.requeued {
                out::line(format_args!("requeued {j}"))?;
            }
            for j in &r.failed {
                out::line(format_args!("failed {j}"))?;
            }
            for j in &r.reconciled {
                out::line(format_args!("reconciled {j}"))?;
            }
            for j in &r.live {
                out::line(format_args!("live {j}"))?;
            }
            for j in &r.deferred {
                out::line(format_args!("deferred {j}"))?;
            }
            for j in &r.incomplete {
                out::line(format_args!("incomplete {j}: claimed, never leased; --reconcile settles it"))?;
            }
            for j in &r.conflicts {
                out::line(format_args!("conflict {j}"))?;
            }
            if r.conflicts.is_empty() { Ok(()) } else { Err(Exit::quiet(exit::FAILURE).into()) }
        }
        Cmd::Ls { dir, json } => {
            let l = open(&dir, queue::DEFAULT_LEASE)?.list().map_err(fail)?;
            if json {
                let problems: Vec<_> =
                    l.problems.iter().map(|(p, w)| serde_json::json!({"path": p, "problem": w})).collect();
                out::line(serde_json::json!({
                    "pending": l.pending, "claimed": l.claimed, "done": l.done, "failed": l.failed,
                    "problems": problems,
                }))
            } else {
                let mut list = out::Listing::new("STATE\tJOB\tPROBLEM");
                for (state, names) in [
                    ("pending", &l.pending),
                    ("claimed", &l.claimed),
                    ("done", &l.done),
                    ("failed", &l.failed),
                ] {
                    for n in names {
                        list.row(format_args!("{state}\t{n}\t-"))?;
                    }
                }
                for (p, w) in &l.problems {
                    list.row(format_args!("not-a-job\t{}\t{w}", p.display()))?;
                }
                Ok(())
            }
        }
        Cmd::Work { dir, worker, no_lock, command } => {
            let q = open(&dir, queue::DEFAULT_LEASE)?;
            loop {
                let Some(c) = q.claim(&worker, !no_lock).map_err(fail)? else { return Ok(()) };
                let request = q.request(&c).map_err(fail)?;
                let mut child = Command::new(&command[0])
                    .args(&command[1..])
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .spawn()
                    .map_err(|e| Exit::new(exit::UNAVAILABLE, format!("cannot run {}: {e}", command[0])))?;
                if let Some(mut stdin) = child.stdin.take() {
                    // A command that does not read its input is not an error.
                    let _ = stdin.write_all(&request);
                }
                let output = child
                    .wait_with_output()
                    .map_err(|e| Exit::new(exit::FAILURE, format!("{}: {e}", command[0])))?;
                let job = c.job.clone();
                match q.finish(c, &output.stdout, !output.status.success()).map_err(fail)? {
                    Finish::Committed => out::line(format_args!(
                        "{} {job}",
                        if output.status.success() { "done" } else { "failed" }
                    ))?,
                    Finish::Fenced => out::line(format_args!("fenced {job}"))?,
                }
            }
        }
    }
}
