//! The job queue of a shared space on a GlusterFS volume (replica 2, this machine), worked from
//! one "host" and from two: cycles/s in total and per host, through CortexFS (each host a daemon
//! of its own whose storage binds its own client mount of the volume as `shared/gq`) and, as the
//! baseline in the same run, on the client mounts directly.
//!
//! Each round publishes JOBS fresh jobs on a queue of its own, then starts two `ctx queue work
//! ... -- /bin/cat` per host used and times until the queue is empty; per host is the jobs its
//! workers committed (`done` lines) over the round's time.
//!
//! Needs root, /dev/fuse, Debian's glusterfs-server and the release binaries (`make bench`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ringfs::queue::Queue;
use tests::gluster::{Bind, Gluster};
use tests::served::Served;

const JOBS: usize = 300;
const PER_HOST: usize = 2;

/// Works `qdirs` (one per host) with PER_HOST workers each until the queue is empty: seconds,
/// and jobs committed per host.
fn round(qdirs: &[PathBuf]) -> (f64, Vec<usize>) {
    let ctx = bench::bin_dir().join("ctx");
    let t = Instant::now();
    let workers: Vec<(usize, std::process::Child)> = qdirs
        .iter()
        .enumerate()
        .flat_map(|(h, q)| (0..PER_HOST).map(move |w| (h, q, w)))
        .map(|(h, q, w)| {
            let c = Command::new(&ctx)
                .args(["queue", "work"])
                .arg(q)
                .args(["--worker", &format!("h{h}w{w}"), "--no-lock", "--", "/bin/cat"])
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .expect("ctx queue work");
            (h, c)
        })
        .collect();
    let mut per = vec![0; qdirs.len()];
    for (h, c) in workers {
        let out = c.wait_with_output().expect("wait");
        per[h] += String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.starts_with("done ")).count();
    }
    (t.elapsed().as_secs_f64(), per)
}

fn publish(dir: &Path) {
    let q = Queue::open(dir, Duration::from_secs(60)).expect("queue");
    for i in 0..JOBS {
        q.publish(&format!("job-{i:05}.req.json"), format!("{{\"job\":{i}}}").as_bytes()).expect("publish");
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list" || a == "--test") {
        return;
    }
    if let Some(why) = bench::unmet(&["ctx"]) {
        println!("queue_hosts: not run ({why})");
        return;
    }
    if !Path::new("/usr/sbin/glusterd").exists() {
        println!("queue_hosts: not run (glusterfs-server missing)");
        return;
    }
    let g = Gluster::start();
    let hosts: Vec<(Bind, Served)> = g.hosts("gq");
    println!("| where | hosts | workers | jobs | s | cycles/s | per host |");
    println!("|---|---:|---:|---:|---:|---:|---|");
    let mut n = 0;
    for through_ctx in [false, true] {
        for used in [1, 2] {
            n += 1;
            let name = format!("queue{n}");
            publish(&g.mounts[0].join(&name));
            let qdirs: Vec<PathBuf> = (0..used)
                .map(|h| {
                    if through_ctx {
                        hosts[h].1.p(&format!("shared/gq/{name}"))
                    } else {
                        g.mounts[h].join(&name)
                    }
                })
                .collect();
            let (secs, per) = round(&qdirs);
            let done: usize = per.iter().sum();
            assert_eq!(done, JOBS, "every job committed once");
            let per: Vec<String> = per.iter().map(|c| format!("{:.1}", *c as f64 / secs)).collect();
            println!(
                "| {} | {used} | {} | {JOBS} | {secs:.1} | {:.1} | {} |",
                if through_ctx { "CortexFS /ctx" } else { "GlusterFS client" },
                used * PER_HOST,
                JOBS as f64 / secs,
                per.join(", ")
            );
        }
    }
}
