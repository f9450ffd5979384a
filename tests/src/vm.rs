//! A throwaway virtual machine for the virtio-fs tests and benchmark: the host's Debian cloud
//! kernel (`linux-image-cloud-amd64`), a busybox initramfs built on the fly with the kernel's
//! virtio-fs modules and a guest script, and QEMU with software emulation (`-accel tcg`; nested
//! KVM is not available everywhere). The guest reports on its serial console, read here line by
//! line.
//!
//! Needs only `std` and `tempfile`, so that the benchmark crate can include it by path.

use std::fs;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The guest kernel modules virtio-fs needs, in load order.
pub const MODULES: [&str; 7] = [
    "virtio_ring",
    "virtio",
    "virtio_pci_legacy_dev",
    "virtio_pci_modern_dev",
    "virtio_pci",
    "fuse",
    "virtiofs",
];

/// Printed by the guest's init before it runs the guest script, and after it.
pub const READY: &str = "VM-READY";
/// See [`READY`].
pub const DONE: &str = "VM-DONE";

const QEMU: &str = "qemu-system-x86_64";
const BUSYBOX: &str = "/bin/busybox";

/// The guest's `/init`: mounts the pseudo filesystems, loads the modules, runs `/guest.sh`,
/// powers off (a failing script or a missing module is reported, never hidden).
const INIT: &str = r#"#!/bin/sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for m in MODULES; do
  insmod /lib/modules/$m.ko || echo "VM-ERROR insmod $m"
done
echo VM-READY
sh /guest.sh
echo "VM-DONE rc=$?"
poweroff -f
"#;

/// What the host needs to boot a guest, or why it cannot.
pub fn unmet() -> Option<String> {
    let mut why = Vec::new();
    if Command::new(QEMU).arg("--version").output().map(|o| !o.status.success()).unwrap_or(true) {
        why.push(format!("{QEMU} (Debian qemu-system-x86)"));
    }
    if !Path::new(BUSYBOX).exists() {
        why.push(format!("{BUSYBOX} (Debian busybox-static)"));
    }
    if Command::new("cpio").arg("--version").output().is_err() {
        why.push("cpio (Debian cpio)".to_owned());
    }
    if cloud_kernel().is_none() {
        why.push("/boot/vmlinuz-*-cloud-amd64 and its modules (Debian linux-image-cloud-amd64)".to_owned());
    }
    if why.is_empty() {
        None
    } else {
        Some(format!("missing {}; `scripts/install-deps test` installs them", why.join(", ")))
    }
}

/// The newest installed cloud kernel whose modules are present: (kernel image, modules dir).
pub fn cloud_kernel() -> Option<(PathBuf, PathBuf)> {
    let mut found: Vec<(String, PathBuf, PathBuf)> = fs::read_dir("/boot")
        .ok()?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let version = name.strip_prefix("vmlinuz-")?.to_owned();
            if !version.ends_with("-cloud-amd64") {
                return None;
            }
            let modules = Path::new("/lib/modules").join(&version);
            modules.join("kernel/fs/fuse").is_dir().then(|| (version, e.path(), modules))
        })
        .collect();
    found.sort_by(|a, b| a.0.cmp(&b.0));
    found.pop().map(|(_, k, m)| (k, m))
}

/// Finds `name.ko` (or `.ko.xz`, `.ko.zst`) under `modules` and returns it uncompressed.
fn module(modules: &Path, name: &str) -> Result<Vec<u8>, String> {
    fn find(dir: &Path, names: &[String]) -> Option<PathBuf> {
        for e in fs::read_dir(dir).ok()?.flatten() {
            let p = e.path();
            if p.is_dir() {
                if let Some(f) = find(&p, names) {
                    return Some(f);
                }
            } else if names.iter().any(|n| e.file_name().to_string_lossy() == *n) {
                return Some(p);
            }
        }
        None
    }
    let names: Vec<String> = ["ko", "ko.xz", "ko.zst"].iter().map(|x| format!("{name}.{x}")).collect();
    let p = find(&modules.join("kernel"), &names)
        .ok_or_else(|| format!("module {name} not found under {}", modules.display()))?;
    let tool = match p.extension().and_then(|e| e.to_str()) {
        Some("xz") => Some("xz"),
        Some("zst") => Some("zstd"),
        _ => None,
    };
    match tool {
        None => fs::read(&p).map_err(|e| format!("{}: {e}", p.display())),
        Some(t) => {
            let out = Command::new(t).arg("-dc").arg(&p).output().map_err(|e| format!("{t}: {e}"))?;
            if !out.status.success() {
                return Err(format!("{t} -dc {}: {}", p.display(), String::from_utf8_lossy(&out.stderr)));
            }
            Ok(out.stdout)
        }
    }
}

/// A bootable guest: kernel and initramfs.
#[derive(Debug)]
pub struct Kit {
    /// The kernel image.
    pub kernel: PathBuf,
    /// The initramfs (newc cpio).
    pub initrd: PathBuf,
}

impl Kit {
    /// Builds an initramfs in `work` holding busybox, the virtio-fs modules, `guest_script` as
    /// `/guest.sh` and `files` (guest path, host file to copy, mode).
    pub fn build(work: &Path, guest_script: &str, files: &[(&str, &Path, u32)]) -> Result<Kit, String> {
        if let Some(why) = unmet() {
            return Err(why);
        }
        let (kernel, modules) = cloud_kernel().ok_or("no cloud kernel")?;
        let root = work.join("initramfs");
        let e = |what: &str, err: std::io::Error| format!("{what}: {err}");
        for d in ["bin", "proc", "sys", "dev", "lib/modules", "tmp"] {
            fs::create_dir_all(root.join(d)).map_err(|x| e(d, x))?;
        }
        fs::copy(BUSYBOX, root.join("bin/busybox")).map_err(|x| e(BUSYBOX, x))?;
        symlink("busybox", root.join("bin/sh")).map_err(|x| e("bin/sh", x))?;
        for m in MODULES {
            fs::write(root.join("lib/modules").join(format!("{m}.ko")), module(&modules, m)?)
                .map_err(|x| e(m, x))?;
        }
        let write = |rel: &str, body: &[u8], mode: u32| -> Result<(), String> {
            let p = root.join(rel.trim_start_matches('/'));
            if let Some(d) = p.parent() {
                fs::create_dir_all(d).map_err(|x| e(rel, x))?;
            }
            fs::write(&p, body).map_err(|x| e(rel, x))?;
            fs::set_permissions(&p, fs::Permissions::from_mode(mode)).map_err(|x| e(rel, x))
        };
        write("init", INIT.replace("MODULES", &MODULES.join(" ")).as_bytes(), 0o755)?;
        write("guest.sh", guest_script.as_bytes(), 0o755)?;
        for (guest, host, mode) in files {
            write(guest, &fs::read(host).map_err(|x| e(&host.to_string_lossy(), x))?, *mode)?;
        }
        let initrd = work.join("initrd.cpio");
        let out = Command::new("sh")
            .arg("-c")
            .arg("find . | LC_ALL=C sort | cpio --quiet -o -H newc --owner=0:0 > \"$1\"")
            .arg("sh")
            .arg(&initrd)
            .current_dir(&root)
            .output()
            .map_err(|x| e("cpio", x))?;
        if !out.status.success() {
            return Err(format!("building the initramfs: {}", String::from_utf8_lossy(&out.stderr)));
        }
        Ok(Kit { kernel, initrd })
    }
}

/// A running guest.
#[derive(Debug)]
pub struct Vm {
    child: Option<Child>,
    lines: Receiver<String>,
    transcript: Arc<Mutex<String>>,
}

/// A virtio-fs device of a guest: the vhost-user socket and the mount tag.
#[derive(Clone, Copy, Debug)]
pub struct Device<'a> {
    /// The daemon's socket.
    pub socket: &'a Path,
    /// The tag the guest mounts (`mount -t virtiofs TAG DIR`).
    pub tag: &'a str,
}

impl Vm {
    /// Boots `kit` with `devices`, 1 GiB of shared memory, `cpus` vCPUs and extra kernel
    /// arguments. With `reboot` false, a guest reboot ends QEMU like a power-off.
    pub fn boot(
        kit: &Kit,
        devices: &[Device<'_>],
        cpus: u32,
        append: &str,
        reboot: bool,
    ) -> Result<Vm, String> {
        let mut c = Command::new(QEMU);
        c.args(["-accel", "tcg", "-m", "1024", "-smp", &cpus.to_string(), "-nodefaults", "-nographic"])
            .args(["-serial", "stdio", "-no-user-config"])
            .arg("-kernel")
            .arg(&kit.kernel)
            .arg("-initrd")
            .arg(&kit.initrd)
            .args(["-object", "memory-backend-memfd,id=mem,size=1024M,share=on", "-numa", "node,memdev=mem"])
            .args(["-append", &format!("console=ttyS0 panic=-1 quiet loglevel=1 {append}")]);
        if !reboot {
            c.arg("-no-reboot");
        }
        for (i, d) in devices.iter().enumerate() {
            c.arg("-chardev").arg(format!("socket,id=vfs{i},path={}", d.socket.display()));
            c.arg("-device").arg(format!("vhost-user-fs-pci,chardev=vfs{i},tag={}", d.tag));
        }
        let mut child = c
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("{QEMU}: {e}"))?;
        let transcript = Arc::new(Mutex::new(String::new()));
        let (tx, lines) = channel();
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let stderr = child.stderr.take().ok_or("no stderr")?;
        let t = Arc::clone(&transcript);
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).split(b'\n').map_while(Result::ok) {
                let line = String::from_utf8_lossy(&line).trim_end_matches('\r').to_owned();
                if let Ok(mut t) = t.lock() {
                    t.push_str(&line);
                    t.push('\n');
                }
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let t = Arc::clone(&transcript);
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = BufReader::new(stderr).read_to_string(&mut s);
            if !s.is_empty()
                && let Ok(mut t) = t.lock()
            {
                t.push_str(&format!("[qemu stderr] {s}"));
            }
        });
        Ok(Vm { child: Some(child), lines, transcript })
    }

    /// Waits up to `timeout` for a console line containing `marker`; returns the line.
    pub fn expect(&self, marker: &str, timeout: Duration) -> Result<String, String> {
        let end = Instant::now() + timeout;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.contains(marker) => return Ok(l),
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => {
                    return Err(format!("no {marker:?} within {timeout:?}\n{}", self.transcript()));
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(format!("the guest ended before {marker:?}\n{}", self.transcript()));
                }
            }
        }
    }

    /// Everything the guest printed so far.
    pub fn transcript(&self) -> String {
        self.transcript.lock().map(|t| t.clone()).unwrap_or_default()
    }

    /// Waits up to `timeout` for QEMU to exit.
    pub fn wait(&mut self, timeout: Duration) -> Result<ExitStatus, String> {
        let end = Instant::now() + timeout;
        let child = self.child.as_mut().ok_or("already waited for")?;
        loop {
            if let Some(st) = child.try_wait().map_err(|e| e.to_string())? {
                self.child = None;
                return Ok(st);
            }
            if Instant::now() > end {
                return Err(format!("QEMU still running after {timeout:?}\n{}", self.transcript()));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
