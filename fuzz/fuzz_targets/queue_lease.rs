//! The queue: a lease file holds whatever another host (or a crash) left in it. Recovering the
//! queue and resuming the claim read it; any bytes give a decision or an error, never a panic,
//! and a lease that is not a lease record never lets a worker resume.
#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use ringfs::queue::{Policy, Queue};

fuzz_target!(|data: &[u8]| {
    let dir = std::env::temp_dir().join(format!("cortexfs-fuzz-lease.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let q = Queue::open(&dir, Duration::from_millis(1)).expect("queue");
    q.publish("j.req.json", b"{}").expect("publish");
    let claim = q.claim("w", false).expect("claim").expect("a job to claim");
    drop(claim);
    std::fs::write(dir.join("lease/j.req.json/worker"), data).expect("lease file");
    let resumed = q.resume("j.req.json", "w");
    if serde_json::from_slice::<serde_json::Value>(data).is_err() {
        assert!(resumed.is_err(), "no lease record, no resume");
    }
    let _ = q.recover(Policy::Requeue);
    let _ = q.list();
});
