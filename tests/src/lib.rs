//! Helpers for the black-box integration tests in `tests/tests/`. The tests treat CortexFS as
//! users do, through its commands and files.
//!
//! - this module: locating the built binaries and running them;
//! - [`appender`]: driving the `log-appender` helper and checking the log it leaves;
//! - [`gluster`]: a GlusterFS volume served from a network namespace, mounted twice;
//! - [`object`]: writing object packages and judging what an install left in storage;
//! - [`powerloss`]: mounting the `powerloss-fs` helper, simulating power loss and injecting
//!   faults;
//! - [`race`]: queue workers raced while being killed and stalled;
//! - [`served`]: a real `ctx mount` on temporary storage;
//! - [`vm`]: a QEMU guest with a busybox initramfs, for the virtio-fs tests.
//!
//! Only the test targets of this crate depend on it.

pub mod appender;
pub mod elsewhere;
pub mod gluster;
pub mod model_endpoint;
pub mod oauth_endpoint;
pub mod object;
pub mod powerloss;
pub mod pty;
pub mod race;
pub mod served;
pub mod vm;

use std::path::PathBuf;
use std::process::{Command, Output};

/// The directory holding the workspace's built binaries (`target/debug` or the profile in use).
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    // target/<profile>/deps/<test-binary>
    exe.parent().and_then(|d| d.parent()).expect("target/<profile>").to_path_buf()
}

/// The path of a workspace binary; panics with a clear message when it was not built.
pub fn bin(name: &str) -> PathBuf {
    let p = bin_dir().join(name);
    assert!(
        p.exists(),
        "{} is missing: run `cargo build --workspace --bins` first (make test does)",
        p.display()
    );
    p
}

/// Runs a workspace binary with arguments and returns its output.
pub fn run(name: &str, args: &[&str]) -> Output {
    Command::new(bin(name)).args(args).output().expect("spawn")
}

/// A finished process's status and output, for assertion messages.
pub fn shown(o: &Output) -> String {
    format!(
        "status {:?}\nstdout {}\nstderr {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Held by tests that start sandboxes with a network, or that change what the host offers
/// them (`/dev/net/tun`): those must not run side by side.
pub static NETWORK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A name no other test of this run uses: `tag`, this process, and a counter (a name that
/// must be apart from other tests', such as a cgroup's, which is host-wide).
pub fn unique(tag: &str) -> String {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{tag}{}x{n}", std::process::id())
}
