//! Test helper: appends records to a ringfs log from N threads and prints `ack ROUND T I` on
//! stdout after each append is acknowledged. The crash tests kill it at random moments.
//!
//! Usage: log-appender PATH ROUND THREADS [portable|uring|nosync|journal]
//!
//! `journal` appends through the journal of PATH's directory (a ring of [`JOURNAL_CAP`]
//! bytes, so that it is reused within a round), even threads to PATH, odd ones to PATH`.b`.
//!
//! `nosync` is the negative control of the power-loss tests: it does not use the log at all,
//! but appends each record with one plain `write` to a file opened with `O_APPEND` and
//! acknowledges it at once, without any fsync or commit evidence.

use std::fs::File;
use std::io::Write;
use std::sync::Arc;

use ringfs::log::{AppendLog, Engine, Journal, Options};

/// The ring of the journal mode: small, so that checkpoints and reuse happen every round.
pub const JOURNAL_CAP: u64 = 256 * 1024;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, path, round, threads, rest @ ..] = &args[..] else {
        eprintln!("usage: log-appender PATH ROUND THREADS [portable|uring|nosync]");
        std::process::exit(2);
    };
    let round: u64 = round.parse().expect("round");
    let threads: u64 = threads.parse().expect("threads");
    let engine = match rest.first().map(String::as_str) {
        Some("uring") => Engine::Uring,
        Some("nosync") => return nosync(path, round, threads),
        Some("journal") => return journaled(path, round, threads),
        _ => Engine::Portable,
    };
    let log = match AppendLog::open(path, Options { engine, ..Options::default() }) {
        Ok((log, _)) => Arc::new(log),
        Err(e) => {
            eprintln!("log-appender: {e}");
            std::process::exit(1);
        }
    };
    println!("ready");
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let log = Arc::clone(&log);
            std::thread::spawn(move || {
                for i in 0u64.. {
                    match log.append(record(round, t, i).as_bytes()) {
                        Ok(_) => {
                            if !ack(round, t, i) {
                                return;
                            }
                        }
                        Err(e) => {
                            eprintln!("log-appender: {e}");
                            std::process::exit(1);
                        }
                    }
                }
            })
        })
        .collect();
    for h in handles {
        let _ = h.join();
    }
}

/// One JSONL record; the length varies so torn writes land anywhere in a line.
fn record(round: u64, t: u64, i: u64) -> String {
    let pad = "x".repeat(((i * 7 + t * 13) % 150) as usize);
    format!("{{\"r\":{round},\"t\":{t},\"i\":{i},\"pad\":\"{pad}\"}}\n")
}

/// Prints the acknowledgement; false once stdout is gone.
fn ack(round: u64, t: u64, i: u64) -> bool {
    let mut out = std::io::stdout().lock();
    writeln!(out, "ack {round} {t} {i}").and_then(|()| out.flush()).is_ok()
}

/// Appends through a journal, to two files.
fn journaled(path: &str, round: u64, threads: u64) {
    let path = std::path::Path::new(path);
    let fail = |e: &dyn std::fmt::Display| -> ! {
        eprintln!("log-appender: {e}");
        std::process::exit(1);
    };
    let dir = path.parent().unwrap_or_else(|| fail(&"PATH has no directory"));
    let journal = Journal::open(dir, JOURNAL_CAP).unwrap_or_else(|e| fail(&e));
    let name = path.file_name().unwrap_or_else(|| fail(&"PATH has no file name"));
    let second = format!("{}.b", name.to_string_lossy());
    let logs: Vec<Arc<AppendLog>> = [std::path::Path::new(name), std::path::Path::new(&second)]
        .iter()
        .map(|rel| {
            AppendLog::open_journaled(&journal, rel, Options::default()).unwrap_or_else(|e| fail(&e)).0
        })
        .collect();
    if !logs.iter().all(|l| l.journaled()) {
        fail(&"the logs are not journaled");
    }
    println!("ready");
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let log = Arc::clone(&logs[(t % 2) as usize]);
            std::thread::spawn(move || {
                for i in 0u64.. {
                    match log.append(record(round, t, i).as_bytes()) {
                        Ok(_) if ack(round, t, i) => {}
                        Ok(_) => return,
                        Err(e) => fail(&e),
                    }
                }
            })
        })
        .collect();
    for h in handles {
        let _ = h.join();
    }
}

/// The negative control: plain appends, acknowledged before anything is durable.
fn nosync(path: &str, round: u64, threads: u64) {
    let file = match File::options().append(true).create(true).open(path) {
        Ok(f) => Arc::new(f),
        Err(e) => {
            eprintln!("log-appender: {path}: {e}");
            std::process::exit(1);
        }
    };
    println!("ready");
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let file = Arc::clone(&file);
            std::thread::spawn(move || {
                for i in 0u64.. {
                    // One write per record: O_APPEND keeps concurrent records whole.
                    let rec = record(round, t, i);
                    match (&*file).write(rec.as_bytes()) {
                        Ok(n) if n == rec.len() => {}
                        Ok(n) => {
                            eprintln!("log-appender: short write of {n} bytes");
                            std::process::exit(1);
                        }
                        Err(e) => {
                            eprintln!("log-appender: {e}");
                            std::process::exit(1);
                        }
                    }
                    if !ack(round, t, i) {
                        return;
                    }
                }
            })
        })
        .collect();
    for h in handles {
        let _ = h.join();
    }
}
