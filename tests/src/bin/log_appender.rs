//! Test helper: appends records to a ringfs log from N threads and prints `ack ROUND T I` on
//! stdout after each append is acknowledged. The crash tests kill it at random moments.
//!
//! Usage: log-appender PATH ROUND THREADS [portable|uring]

use std::io::Write;
use std::sync::Arc;

use ringfs::log::{AppendLog, Engine, Options};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, path, round, threads, rest @ ..] = &args[..] else {
        eprintln!("usage: log-appender PATH ROUND THREADS [portable|uring]");
        std::process::exit(2);
    };
    let engine = match rest.first().map(String::as_str) {
        Some("uring") => Engine::Uring,
        _ => Engine::Portable,
    };
    let round: u64 = round.parse().expect("round");
    let threads: u64 = threads.parse().expect("threads");
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
                    // Vary the length so torn writes land anywhere in a line.
                    let pad = "x".repeat(((i * 7 + t * 13) % 150) as usize);
                    let rec = format!("{{\"r\":{round},\"t\":{t},\"i\":{i},\"pad\":\"{pad}\"}}\n");
                    match log.append(rec.as_bytes()) {
                        Ok(_) => {
                            let mut out = std::io::stdout().lock();
                            if writeln!(out, "ack {round} {t} {i}").and_then(|()| out.flush()).is_err() {
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
